//! What every HTTP provider shares: the client, the classification of
//! failures (HTTP statuses, error events in a stream, cut streams) into
//! transient and permanent, and lenient line, SSE and NDJSON readers
//! over a streamed body. Retrying is the session's (one loop for every
//! provider): a provider asks once.

use std::time::Duration;

use retie_display::visible;
use serde_json::Value;

use crate::model::{Cause, ProviderError, Transient};

/// The longest wait read from a header, seconds (8 days: a weekly cap's
/// reset still reads as what it is).
const MAX_WAIT_S: f64 = 8.0 * 86_400.0;

/// The longest server-provided error text shown to a person.
const MAX_MESSAGE: usize = 600;

/// A reqwest client every provider shares.
#[derive(Debug, Clone)]
pub struct Http {
    client: reqwest::Client,
}

impl Http {
    pub fn new() -> Result<Http, ProviderError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| ProviderError::Permanent(format!("cannot build the HTTP client: {e}")))?;
        Ok(Http { client })
    }

    /// POST `body` as JSON to `url` with `headers`, once; the response
    /// once its status is a success, else the failure classified
    /// ([`classify_status`]).
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut rb = self.client.post(url).json(body);
        for (k, v) in headers {
            rb = rb.header(*k, v.as_str());
        }
        let resp = rb.send().await.map_err(|e| {
            ProviderError::transient(
                Cause::Connection,
                plain(&format!("{url}: {}", error_chain(&e))),
            )
        })?;
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            return Ok(resp);
        }
        let wait = retry_after(resp.headers());
        let text = resp.text().await.unwrap_or_default();
        Err(classify_status(status, &text, wait))
    }

    /// GET `url` with `headers`, once, and read its JSON body (a
    /// catalogue); a failure classified as for [`post_json`](Self::post_json).
    pub async fn get_json(
        &self,
        url: &str,
        headers: &[(&str, String)],
    ) -> Result<Value, ProviderError> {
        let mut rb = self.client.get(url);
        for (k, v) in headers {
            rb = rb.header(*k, v.as_str());
        }
        let resp = rb.send().await.map_err(|e| {
            ProviderError::transient(
                Cause::Connection,
                plain(&format!("{url}: {}", error_chain(&e))),
            )
        })?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            let wait = retry_after(resp.headers());
            let text = resp.text().await.unwrap_or_default();
            return Err(classify_status(status, &text, wait));
        }
        let text = resp.text().await.map_err(|e| {
            ProviderError::transient(
                Cause::Connection,
                plain(&format!("{url}: the answer broke off: {}", error_chain(&e))),
            )
        })?;
        serde_json::from_str(&text).map_err(|e| {
            ProviderError::Malformed(plain(&format!("{url} did not answer JSON ({e}): {text}")))
        })
    }
}

/// How a provider sends its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `authorization: Bearer KEY` (OpenAI's format, Ollama).
    Bearer,
    /// `x-api-key: KEY` (Anthropic).
    XApiKey,
}

/// A provider's endpoint: the shared client, the base URL (no trailing
/// slash) and the key, if any. Every HTTP provider's request preamble,
/// once.
#[derive(Debug, Clone)]
pub struct Endpoint {
    http: Http,
    base_url: String,
    api_key: Option<String>,
    key_header: KeyHeader,
}

impl Endpoint {
    /// `base_url` (else `default`) without its trailing slash; an empty
    /// key is no key.
    pub fn new(
        base_url: Option<&str>,
        default: &str,
        api_key: Option<String>,
        key_header: KeyHeader,
    ) -> Result<Endpoint, ProviderError> {
        Ok(Endpoint {
            http: Http::new()?,
            base_url: base_url
                .unwrap_or(default)
                .trim_end_matches('/')
                .to_string(),
            api_key: api_key.filter(|k| !k.is_empty()),
            key_header,
        })
    }

    /// POST `body` to `BASE_URL{path}` with the key's header and `extra`
    /// headers ([`Http::post_json`]).
    pub async fn post(
        &self,
        path: &str,
        extra: &[(&str, String)],
        body: &Value,
    ) -> Result<reqwest::Response, ProviderError> {
        let url = format!("{}{path}", self.base_url);
        let mut headers: Vec<(&str, String)> = extra.to_vec();
        if let Some(k) = &self.api_key {
            headers.push(match self.key_header {
                KeyHeader::Bearer => ("authorization", format!("Bearer {k}")),
                KeyHeader::XApiKey => ("x-api-key", k.clone()),
            });
        }
        self.http.post_json(&url, &headers, body).await
    }
}

/// The error and its sources, in one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

/// An HTTP error status as a typed failure. 429 is a rate limit
/// (transient, `wait` honoured) unless its body says the quota or a
/// weekly/monthly cap is exhausted; 408, 409 and 5xx (529 overloaded)
/// are transient; 400, 401, 403 (entitlement), 404 (model), 413,
/// 422... are permanent: the same request cannot succeed.
pub fn classify_status(status: u16, body: &str, wait: Option<Duration>) -> ProviderError {
    let message = error_message(status, body);
    let cause = match status {
        429 if is_quota(body) => {
            // A cap says when it resets when the provider says so.
            return ProviderError::Permanent(match wait {
                Some(w) => format!("{message} (the provider says it resets in {})", human(w)),
                None => message,
            });
        }
        429 => Cause::RateLimited,
        408 | 409 | 500..=599 => Cause::ServerError,
        _ => return ProviderError::Permanent(message),
    };
    ProviderError::Transient(Transient {
        cause,
        status: Some(status),
        message,
        retry_after: wait,
    })
}

/// A duration for a person: `3 d 4 h`, `2 h 5 min`, `40 s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// An error object (or Ollama's error line) inside an answer that began
/// with HTTP 200: transient (overloaded, api_error, server_error...)
/// unless its type says the request itself is refused.
pub fn classify_error_event(v: &Value, raw: &str) -> ProviderError {
    let msg = plain(&json_error_text(v).unwrap_or_else(|| raw.to_string()));
    let kind = v
        .get("error")
        .and_then(|e| e.get("type").or_else(|| e.get("code")))
        .and_then(Value::as_str)
        .unwrap_or("");
    let permanent = matches!(
        kind,
        "invalid_request_error"
            | "authentication_error"
            | "permission_error"
            | "not_found_error"
            | "insufficient_quota"
            | "billing_error"
    ) || is_quota(&msg);
    if permanent {
        ProviderError::Permanent(msg)
    } else {
        ProviderError::transient(Cause::ErrorEvent, msg)
    }
}

/// A stream that ended without its end marker (`what`).
pub fn cut_off(what: &str) -> ProviderError {
    ProviderError::transient(
        Cause::CutOff,
        format!("the stream ended before its end marker ({what})"),
    )
}

/// One event's or line's JSON. Incomplete JSON is a stream cut inside
/// it (transient); anything else that is not JSON is malformed.
pub fn parse_json(data: &str, what: &str) -> Result<Value, ProviderError> {
    serde_json::from_str(data).map_err(|e| {
        if e.is_eof() {
            ProviderError::transient(
                Cause::CutOff,
                plain(&format!("the stream broke off inside {what}: {data}")),
            )
        } else {
            ProviderError::Malformed(plain(&format!("{what} is not JSON ({e}): {data}")))
        }
    })
}

/// A 429 that means the account is out of money or over a long cap
/// (weekly, monthly), not that it is too fast: asking again within the
/// session cannot help.
pub fn is_quota(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    lower.contains("insufficient_quota")
        || lower.contains("exceeded your current quota")
        || lower.contains("billing")
        || lower.contains("weekly")
        || lower.contains("monthly")
}

/// How long the server asks to wait: `retry-after-ms` (OpenAI),
/// `Retry-After` in seconds (integer or decimal), else the soonest of
/// the rate-limit reset headers (`x-ratelimit-reset-requests`/`-tokens`
/// as durations like `6m0s`, `1.5s`, `20ms`). An HTTP date is ignored
/// (the backoff applies).
pub fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let secs =
        |s: f64| (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(MAX_WAIT_S)));
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if let Some(d) = secs(ms / 1000.0) {
            return Some(d);
        }
    }
    if let Some(d) = get("retry-after")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(secs)
    {
        return Some(d);
    }
    [
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-reset",
    ]
    .iter()
    .filter_map(|n| get(n).and_then(go_duration))
    .min()
}

/// A duration as Go prints it (`6m0s`, `1.5s`, `20ms`, `1h2m`), or
/// plain seconds.
fn go_duration(s: &str) -> Option<Duration> {
    if let Ok(n) = s.parse::<f64>() {
        return (n.is_finite() && n >= 0.0).then(|| Duration::from_secs_f64(n.min(MAX_WAIT_S)));
    }
    let mut total = 0f64;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    (any && num.is_empty() && total.is_finite())
        .then(|| Duration::from_secs_f64(total.min(MAX_WAIT_S)))
}

/// The server's error, as plain text for a person: the `message` of an
/// OpenAI/Anthropic error object, Ollama's `{"error": "text"}`, or the
/// start of the body.
pub fn error_message(status: u16, body: &str) -> String {
    let detail = match serde_json::from_str::<Value>(body) {
        Ok(v) => json_error_text(&v).unwrap_or_else(|| body.to_string()),
        Err(_) => body.to_string(),
    };
    let detail = detail.trim();
    if detail.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {}", plain(detail))
    }
}

/// The message of an error object in any of the formats, if `v` is one.
pub fn json_error_text(v: &Value) -> Option<String> {
    let err = v.get("error")?;
    match err {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => {
            let message = o.get("message").and_then(Value::as_str).unwrap_or("");
            let kind = o
                .get("type")
                .or_else(|| o.get("code"))
                .and_then(Value::as_str)
                .unwrap_or("");
            Some(match (kind.is_empty(), message.is_empty()) {
                (false, false) => format!("{kind}: {message}"),
                (true, false) => message.to_string(),
                (false, true) => kind.to_string(),
                (true, true) => err.to_string(),
            })
        }
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// Server-provided text made safe to show: control characters escaped,
/// length capped.
pub fn plain(s: &str) -> String {
    let mut out = visible(s);
    if out.chars().count() > MAX_MESSAGE {
        out = out.chars().take(MAX_MESSAGE).collect();
        out.push('…');
    }
    out
}

/// Longest line (and server-sent event) taken from a stream. A longer one
/// is a malformed answer, said at once, never waited out: an 8 MiB line
/// took 3.5 s and a 64 MiB one over two minutes when every chunk was
/// scanned from the line's start again.
pub const LINE_MAX: usize = 16 << 20;

/// Splits a streamed body into lines (`\n` or `\r\n`), tolerating a
/// last line without its newline. Linear: each byte is scanned for the
/// newline once, and a consumed line is not moved again.
pub struct Lines {
    resp: reqwest::Response,
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    start: usize,
    /// How far past `start` is known to hold no newline.
    scanned: usize,
    eof: bool,
}

impl Lines {
    pub fn new(resp: reqwest::Response) -> Lines {
        Lines {
            resp,
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            eof: false,
        }
    }

    /// The next line, `Ok(None)` at the end of the body. A body that
    /// breaks off (connection reset, bad chunking) or a line longer than
    /// [`LINE_MAX`] is `Malformed`: the answer is incomplete or not one.
    pub async fn next_line(&mut self) -> Result<Option<String>, ProviderError> {
        loop {
            if let Some(line) = self.take_line() {
                return Ok(Some(line));
            }
            if self.buf.len() - self.start > LINE_MAX {
                return Err(ProviderError::Malformed(format!(
                    "a line of the stream is longer than {LINE_MAX} bytes; the answer was not read"
                )));
            }
            if self.eof {
                if self.start == self.buf.len() {
                    return Ok(None);
                }
                let line = String::from_utf8_lossy(&self.buf[self.start..]).into_owned();
                self.buf.clear();
                self.start = 0;
                self.scanned = 0;
                return Ok(Some(line));
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.push(&bytes),
                Ok(None) => self.eof = true,
                Err(e) => {
                    return Err(ProviderError::transient(
                        Cause::Connection,
                        plain(&format!(
                            "the stream broke off before its end: {}",
                            error_chain(&e)
                        )),
                    ))
                }
            }
        }
    }

    /// Append a chunk, first dropping the lines already taken when they
    /// are most of the buffer (so each byte moves at most once more).
    fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// A whole line from the buffer, if one is there.
    fn take_line(&mut self) -> Option<String> {
        let from = self.start + self.scanned;
        match self.buf[from..].iter().position(|&b| b == b'\n') {
            Some(i) => {
                let end = from + i;
                let mut line = &self.buf[self.start..end];
                if line.last() == Some(&b'\r') {
                    line = &line[..line.len() - 1];
                }
                let line = String::from_utf8_lossy(line).into_owned();
                self.start = end + 1;
                self.scanned = 0;
                Some(line)
            }
            None => {
                self.scanned = self.buf.len() - self.start;
                None
            }
        }
    }
}

/// One server-sent event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Server-sent events over a streamed body, parsed leniently: comments
/// and unknown fields ignored, an event pending at the end of the body
/// still delivered.
pub struct Sse {
    lines: Lines,
}

impl Sse {
    pub fn new(resp: reqwest::Response) -> Sse {
        Sse {
            lines: Lines::new(resp),
        }
    }

    pub async fn next_event(&mut self) -> Result<Option<SseEvent>, ProviderError> {
        let mut ev = SseEvent::default();
        let mut has_data = false;
        loop {
            let Some(line) = self.lines.next_line().await? else {
                return Ok(has_data.then_some(ev));
            };
            if line.is_empty() {
                if has_data {
                    return Ok(Some(ev));
                }
                ev = SseEvent::default();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            match field {
                "event" => ev.event = Some(value.to_string()),
                "data" => {
                    if has_data {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(value);
                    has_data = true;
                    if ev.data.len() > LINE_MAX {
                        return Err(ProviderError::Malformed(format!(
                            "an event of the stream is longer than {LINE_MAX} bytes; the answer was not read"
                        )));
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_headers_are_durations() {
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(go_duration("1h2m"), Some(Duration::from_secs(3720)));
        assert_eq!(go_duration("2"), Some(Duration::from_secs(2)));
        assert_eq!(go_duration("soon"), None);
        assert_eq!(go_duration("5x"), None);
    }

    #[test]
    fn error_messages_are_plain_text() {
        let m = error_message(
            401,
            r#"{"error":{"message":"bad key\u001b[31m","type":"invalid_request_error"}}"#,
        );
        assert!(m.starts_with("HTTP 401: invalid_request_error: bad key"));
        assert!(!m.contains('\u{1b}'));
        assert_eq!(
            error_message(404, r#"{"error":"model 'x' not found"}"#),
            "HTTP 404: model 'x' not found"
        );
        assert_eq!(error_message(500, ""), "HTTP 500");
    }

    #[test]
    fn quota_is_permanent_rate_limit_is_not() {
        let transient = |e: ProviderError| matches!(e, ProviderError::Transient(_));
        assert!(!transient(classify_status(
            429,
            r#"{"error":{"code":"insufficient_quota"}}"#,
            None
        )));
        assert!(!transient(classify_status(
            429,
            r#"{"error":"you have reached your weekly usage limit"}"#,
            None
        )));
        assert!(transient(classify_status(
            429,
            r#"{"error":{"code":"rate_limit_exceeded"}}"#,
            None
        )));
        assert!(transient(classify_status(529, "", None)));
        assert!(transient(classify_status(500, "", None)));
        for s in [400, 401, 403, 404] {
            assert!(!transient(classify_status(s, "", None)), "{s}");
        }
        let ev = |v: Value| classify_error_event(&v, "");
        assert!(transient(ev(
            serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})
        )));
        assert!(transient(ev(serde_json::json!({"error":"model is busy"}))));
        assert!(!transient(ev(
            serde_json::json!({"error":{"type":"invalid_request_error","message":"bad"}})
        )));
    }
}
