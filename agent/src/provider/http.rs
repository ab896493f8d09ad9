//! What every HTTP provider shares: the client, retries with capped
//! backoff, the classification of HTTP errors, and lenient line, SSE and
//! NDJSON readers over a streamed body.

use std::time::Duration;

use retie_dispatch::display::visible;
use serde_json::Value;

use crate::model::ProviderError;

/// How long to wait and how often to retry when the provider is rate
/// limited (429) or overloaded (503, 529).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// The first backoff when the server gives no Retry-After; doubled
    /// each retry.
    pub base_delay: Duration,
    /// No single wait is longer than this, whatever Retry-After says.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `attempt` (0-based), honouring the
    /// server's Retry-After when it gave one, capped at `max_delay`.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let backoff = self
            .base_delay
            .saturating_mul(1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX));
        retry_after.unwrap_or(backoff).min(self.max_delay)
    }
}

/// The longest server-provided error text shown to a person.
const MAX_MESSAGE: usize = 600;

/// A reqwest client with the retry policy every provider shares.
#[derive(Debug, Clone)]
pub struct Http {
    client: reqwest::Client,
    pub retry: RetryPolicy,
}

impl Http {
    pub fn new() -> Result<Http, ProviderError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| ProviderError::Transport(format!("cannot build the HTTP client: {e}")))?;
        Ok(Http {
            client,
            retry: RetryPolicy::default(),
        })
    }

    /// POST `body` as JSON to `url` with `headers`; retry 429/503/529 per
    /// the policy; return the response once its status is a success.
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut attempt = 0u32;
        loop {
            let mut rb = self.client.post(url).json(body);
            for (k, v) in headers {
                rb = rb.header(*k, v.as_str());
            }
            let resp = rb.send().await.map_err(|e| {
                ProviderError::Transport(visible(&format!("{url}: {}", error_chain(&e))))
            })?;
            let status = resp.status().as_u16();
            if resp.status().is_success() {
                return Ok(resp);
            }
            let retry_after = retry_after(resp.headers());
            let text = resp.text().await.unwrap_or_default();
            let message = error_message(status, &text);
            match classify(status, &text) {
                Failure::Permanent => return Err(ProviderError::Permanent(message)),
                Failure::Retry if attempt < self.retry.max_retries => {
                    tokio::time::sleep(self.retry.delay(attempt, retry_after)).await;
                    attempt += 1;
                }
                Failure::Retry => {
                    return Err(ProviderError::Unavailable(format!(
                        "{message} (after {} retries)",
                        self.retry.max_retries
                    )))
                }
            }
        }
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

enum Failure {
    Permanent,
    Retry,
}

fn classify(status: u16, body: &str) -> Failure {
    match status {
        429 if is_quota(body) => Failure::Permanent,
        // 408 timeout, 409 conflict (lock), 429 rate limit, 5xx server
        // trouble including 529 overloaded: worth waiting for.
        408 | 409 | 429 | 500 | 502 | 503 | 504 | 529 => Failure::Retry,
        // 400, 401, 403, 404 (model not found), 413, 422...: retrying
        // the same request cannot help.
        _ => Failure::Permanent,
    }
}

/// A 429 that means the account is out of money, not that it is too fast.
fn is_quota(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    lower.contains("insufficient_quota")
        || lower.contains("exceeded your current quota")
        || lower.contains("billing")
}

/// `Retry-After` in seconds (integer or decimal), or OpenAI's
/// `retry-after-ms`. An HTTP date is ignored (the backoff applies).
fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms.min(86_400_000.0) / 1000.0));
        }
    }
    let secs = get("retry-after")?.parse::<f64>().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
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
                    return Err(ProviderError::Malformed(plain(&format!(
                        "the stream broke off before its end: {}",
                        error_chain(&e)
                    ))))
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
    fn delay_honours_retry_after_and_caps() {
        let p = RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        };
        assert_eq!(p.delay(0, None), Duration::from_millis(100));
        assert_eq!(p.delay(2, None), Duration::from_millis(400));
        assert_eq!(p.delay(30, None), Duration::from_secs(2));
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(60))),
            Duration::from_secs(2)
        );
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
        assert!(matches!(
            classify(429, r#"{"error":{"code":"insufficient_quota"}}"#),
            Failure::Permanent
        ));
        assert!(matches!(
            classify(429, r#"{"error":{"code":"rate_limit_exceeded"}}"#),
            Failure::Retry
        ));
        assert!(matches!(classify(529, ""), Failure::Retry));
        assert!(matches!(classify(401, ""), Failure::Permanent));
        assert!(matches!(classify(404, ""), Failure::Permanent));
    }
}
