//! What a provider serves (its model catalogue, with the size and the
//! context length where the provider says them), one-token probes of
//! what this account may call, and the standing each probe leaves
//! (issue 29, ADR 0530). Wire formats only: nothing here executes
//! anything, and nothing here touches a file (the CLI keeps the cache).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::model::{Message, ProviderError, TurnRequest};
use crate::provider::http::{plain, Http};
use crate::provider::{AnyProvider, Provider};

/// One model a provider serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub id: String,
    /// Parameters, in billions, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_b: Option<f64>,
    /// Where the size came from: `provider` (a field of the catalogue:
    /// Ollama's `details.parameter_size`, llama.cpp's `meta.n_params`)
    /// or `name` (the size the model's own name states, `gpt-oss:20b`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_from: Option<String>,
    /// Context length in tokens, when the provider says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u64>,
}

/// The catalogue of `kind` (`openai`, `ollama`, `anthropic`) at
/// `base_url`: OpenAI-compatible and Anthropic `GET /models`, Ollama
/// `GET /api/tags` then `POST /api/show` per model for its context
/// length (a failed show leaves it unknown). One request for the list:
/// a failure is the provider's, classified as for a turn.
pub async fn list(
    kind: &str,
    base_url: &str,
    api_key: Option<&str>,
) -> Result<Vec<ModelInfo>, ProviderError> {
    let http = Http::new()?;
    let base = base_url.trim_end_matches('/');
    let mut headers = Vec::new();
    match (kind, api_key) {
        ("anthropic", key) => {
            headers.push(("anthropic-version", "2023-06-01".to_string()));
            if let Some(k) = key {
                headers.push(("x-api-key", k.to_string()));
            }
        }
        (_, Some(k)) => headers.push(("authorization", format!("Bearer {k}"))),
        (_, None) => {}
    }
    match kind {
        "ollama" => {
            let v = http.get_json(&format!("{base}/api/tags"), &headers).await?;
            let mut out = parse_ollama_tags(&v)?;
            for m in &mut out {
                let body = json!({ "model": m.id });
                if let Ok(resp) = http
                    .post_json(&format!("{base}/api/show"), &headers, &body)
                    .await
                {
                    if let Ok(show) = resp.json::<Value>().await {
                        m.context = ollama_context(&show);
                    }
                }
            }
            Ok(out)
        }
        "openai" | "anthropic" => {
            let v = http.get_json(&format!("{base}/models"), &headers).await?;
            parse_models_list(&v)
        }
        other => Err(ProviderError::Permanent(format!(
            "the {} provider has no catalogue (openai, anthropic and ollama do)",
            plain(other)
        ))),
    }
}

/// An OpenAI-compatible or Anthropic `{"data": [{"id": ...}]}`, with
/// what hosts add: llama.cpp's `meta.n_params`/`n_ctx_train`,
/// OpenRouter's `context_length`, vLLM's `max_model_len`, Anthropic's
/// `max_input_tokens`.
pub fn parse_models_list(v: &Value) -> Result<Vec<ModelInfo>, ProviderError> {
    let data = v
        .get("data")
        .or_else(|| v.get("models"))
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ProviderError::Malformed(plain(&format!("the model list has no `data` array: {v}")))
        })?;
    let mut out = Vec::new();
    for m in data {
        let Some(id) = m
            .get("id")
            .or_else(|| m.get("name"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let stated = m
            .pointer("/meta/n_params")
            .and_then(Value::as_f64)
            .map(|n| n / 1e9)
            .or_else(|| {
                m.get("parameter_size")
                    .or_else(|| m.pointer("/details/parameter_size"))
                    .and_then(Value::as_str)
                    .and_then(parse_size)
            });
        let context = [
            "/context_length",
            "/context_window",
            "/max_model_len",
            "/max_input_tokens",
            "/meta/n_ctx_train",
        ]
        .iter()
        .find_map(|p| m.pointer(p).and_then(Value::as_u64));
        out.push(sized(id, stated, context));
    }
    Ok(out)
}

/// Ollama's `{"models": [{"name", "details": {"parameter_size": "8.0B"}}]}`.
pub fn parse_ollama_tags(v: &Value) -> Result<Vec<ModelInfo>, ProviderError> {
    let models = v.get("models").and_then(Value::as_array).ok_or_else(|| {
        ProviderError::Malformed(plain(&format!("the tag list has no `models` array: {v}")))
    })?;
    Ok(models
        .iter()
        .filter_map(|m| {
            let id = m.get("name").or_else(|| m.get("model"))?.as_str()?;
            let stated = m
                .pointer("/details/parameter_size")
                .and_then(Value::as_str)
                .and_then(parse_size);
            Some(sized(id, stated, None))
        })
        .collect())
}

/// The context length in Ollama's `/api/show` answer
/// (`model_info["<arch>.context_length"]`).
pub fn ollama_context(show: &Value) -> Option<u64> {
    show.get("model_info")?
        .as_object()?
        .iter()
        .find(|(k, _)| k.ends_with(".context_length"))
        .and_then(|(_, v)| v.as_u64())
}

fn sized(id: &str, stated: Option<f64>, context: Option<u64>) -> ModelInfo {
    let (params_b, size_from) = match stated {
        Some(p) => (Some(p), Some("provider".to_string())),
        None => match size_in_name(id) {
            Some(p) => (Some(p), Some("name".to_string())),
            None => (None, None),
        },
    };
    ModelInfo {
        id: id.to_string(),
        params_b,
        size_from,
        context,
    }
}

/// A size as providers print it: `8.0B`, `70B`, `500M`, `1.2T`.
pub fn parse_size(s: &str) -> Option<f64> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = num.trim().parse().ok()?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "t" => 1000.0,
        "b" => 1.0,
        "m" => 0.001,
        "k" => 0.000_001,
        _ => return None,
    };
    (n.is_finite() && n > 0.0).then_some(n * scale)
}

/// The size a model's name states (`gpt-oss:20b`, `llama-3.1-70b-instruct`,
/// `mixtral-8x7b`): a part of the name, between `:`, `-`, `_`, `/` or `.`
/// boundaries, that is a number and `b`/`m`/`t`. A name that states none
/// has no size (and no tier).
pub fn size_in_name(id: &str) -> Option<f64> {
    id.rsplit([':', '-', '_', '/']).find_map(|part| {
        let p = part.to_ascii_lowercase();
        if let Some((experts, each)) = p.split_once('x') {
            let e: f64 = experts.parse().ok()?;
            return parse_size(each).map(|s| s * e);
        }
        if !p.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        parse_size(&p)
    })
}

/// What one probe (or a model's last answer) says about this account and
/// that model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// It answered.
    Callable,
    /// 403 (entitlement) or 404 (not served): dropped until re-probed.
    Refused,
    /// A timeout, a 5xx, a 429, a malformed answer: nothing known; never
    /// a refusal.
    Inconclusive,
    /// Never probed.
    Untested,
}

impl Standing {
    pub fn name(self) -> &'static str {
        match self {
            Standing::Callable => "callable",
            Standing::Refused => "refused",
            Standing::Inconclusive => "inconclusive",
            Standing::Untested => "untested",
        }
    }
}

/// One model's cached standing: what the last probe (or a session's
/// refusal) saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probed {
    pub status: Standing,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// The HTTP status, when the answer was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// Why (the provider's message, or `answered`).
    pub cause: String,
    /// A 429's Retry-After, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Who saw it: `probe` or `session SESSION`.
    #[serde(default)]
    pub by: String,
}

/// The probe cache: per endpoint (`KIND BASE_URL`), per model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cache {
    pub version: u32,
    #[serde(default)]
    pub endpoints: BTreeMap<String, BTreeMap<String, Probed>>,
}

impl Cache {
    /// The key of an endpoint: its wire format and URL (an account is
    /// what its key reaches there).
    pub fn key(kind: &str, base_url: &str) -> String {
        format!("{kind} {}", base_url.trim_end_matches('/'))
    }

    pub fn standing(&self, endpoint: &str, model: &str) -> Standing {
        self.endpoints
            .get(endpoint)
            .and_then(|m| m.get(model))
            .map_or(Standing::Untested, |p| p.status)
    }

    pub fn set(&mut self, endpoint: &str, model: &str, p: Probed) {
        self.version = 1;
        self.endpoints
            .entry(endpoint.to_string())
            .or_default()
            .insert(model.to_string(), p);
    }
}

/// What probing does next after one answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeVerdict {
    /// Record this standing and go on to the next model.
    Record(Probed),
    /// Record this one and stop: the key is wrong (401) or the account's
    /// cap is reached; every other model would answer the same.
    Stop(Probed, String),
}

/// How a probe's answer reads (pure: the tests feed it each failure).
/// 403/404 refused; 401 stops the probe (the key, not the models); an
/// account cap stops it too; a 429, 5xx, timeout, dropped connection or
/// malformed answer is inconclusive, never a refusal.
pub fn judge(answer: &Result<(), ProbeFailure>, at_ms: i64) -> ProbeVerdict {
    let probed = |status, code, cause: String, retry_after_ms| Probed {
        status,
        at_ms,
        code,
        cause,
        retry_after_ms,
        by: "probe".into(),
    };
    match answer {
        Ok(()) => ProbeVerdict::Record(probed(
            Standing::Callable,
            Some(200),
            "answered".into(),
            None,
        )),
        Err(ProbeFailure::Timeout(d)) => ProbeVerdict::Record(probed(
            Standing::Inconclusive,
            None,
            format!("no answer within {} s", d.as_secs()),
            None,
        )),
        Err(ProbeFailure::Provider(e)) => {
            let code = e.http_status();
            let msg = e.message().to_string();
            if code == Some(401) || e.message().starts_with("authentication_error") {
                return ProbeVerdict::Stop(
                    probed(Standing::Inconclusive, code, msg.clone(), None),
                    format!("the provider refused the key ({msg}): no model was judged; fix the key and probe again"),
                );
            }
            if e.is_account_cap() {
                return ProbeVerdict::Stop(
                    probed(Standing::Inconclusive, code, msg.clone(), None),
                    format!("the account's cap is reached ({msg}): every model would answer the same; probe again once it resets"),
                );
            }
            if e.is_refusal() || code == Some(404) {
                return ProbeVerdict::Record(probed(Standing::Refused, code, msg, None));
            }
            let wait = match e {
                ProviderError::Transient(t) => t.retry_after.map(|d| d.as_millis() as u64),
                _ => None,
            };
            ProbeVerdict::Record(probed(
                Standing::Inconclusive,
                code,
                format!("{}: {msg}", e.cause_name()),
                wait,
            ))
        }
    }
}

/// Why a probe got no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeFailure {
    Timeout(Duration),
    Provider(ProviderError),
}

/// One one-token request to `model`: no tools, one short message,
/// `max_tokens` 1. Never retried: a probe records what it saw.
pub async fn probe(
    provider: &mut AnyProvider,
    model: &str,
    timeout: Duration,
) -> (Result<(), ProbeFailure>, crate::model::Usage) {
    let req = TurnRequest {
        model: model.to_string(),
        messages: vec![Message::user("Reply with one word: ok")],
        tools: Vec::new(),
        max_tokens: Some(1),
    };
    let mut ignore = |_| {};
    match tokio::time::timeout(timeout, provider.turn(&req, &mut ignore)).await {
        Err(_) => (Err(ProbeFailure::Timeout(timeout)), Default::default()),
        Ok(Err(e)) => (Err(ProbeFailure::Provider(e)), Default::default()),
        Ok(Ok(t)) => (Ok(()), t.usage),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cause, Transient};

    #[test]
    fn sizes_from_the_provider_or_the_name() {
        assert_eq!(parse_size("8.0B"), Some(8.0));
        assert_eq!(parse_size("135M"), Some(0.135));
        assert_eq!(parse_size("1.2T"), Some(1200.0));
        assert_eq!(parse_size("big"), None);
        assert_eq!(size_in_name("gpt-oss:20b"), Some(20.0));
        assert_eq!(size_in_name("llama-3.1-70b-instruct"), Some(70.0));
        assert_eq!(size_in_name("mixtral-8x7b"), Some(56.0));
        assert_eq!(size_in_name("qwen3.5:397b"), Some(397.0));
        assert_eq!(size_in_name("kimi-k2.7-code"), None);
        assert_eq!(size_in_name("gpt-4o"), None);
        let v = json!({"data":[
            {"id":"a","meta":{"n_params": 134515008u64, "n_ctx_train": 2048}},
            {"id":"b:8b","context_length": 131072},
            {"id":"c"}]});
        let l = parse_models_list(&v).unwrap_or_default();
        assert_eq!(l.len(), 3);
        assert!((l[0].params_b.unwrap_or(0.0) - 0.1345).abs() < 0.001);
        assert_eq!(l[0].context, Some(2048));
        assert_eq!(l[1].size_from.as_deref(), Some("name"));
        assert_eq!(l[2].params_b, None);
    }

    #[test]
    fn ollama_tags_and_show_give_size_and_context() {
        let tags = json!({"models":[
            {"name":"llama3.1:8b","details":{"parameter_size":"8.0B","family":"llama"}},
            {"name":"gpt-oss:20b-cloud","details":{"parameter_size":"20.9B"}},
            {"name":"custom","details":{}}]});
        let l = parse_ollama_tags(&tags).unwrap_or_default();
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].params_b, Some(8.0));
        assert_eq!(l[0].size_from.as_deref(), Some("provider"));
        assert_eq!(l[1].params_b, Some(20.9));
        assert_eq!(l[2].params_b, None);
        let show =
            json!({"model_info":{"general.architecture":"llama","llama.context_length":131072}});
        assert_eq!(ollama_context(&show), Some(131_072));
        assert!(parse_ollama_tags(&json!({"error":"x"})).is_err());
        assert!(parse_models_list(&json!({"object":"list"})).is_err());
    }

    #[test]
    fn a_probe_judges_403_refused_401_stops_and_the_rest_inconclusive() {
        let j = |e: ProviderError| judge(&Err(ProbeFailure::Provider(e)), 0);
        let st = |v: ProbeVerdict| match v {
            ProbeVerdict::Record(p) => (p.status, false),
            ProbeVerdict::Stop(p, _) => (p.status, true),
        };
        assert_eq!(
            st(j(ProviderError::Permanent(
                "HTTP 403: this model requires a subscription".into()
            ))),
            (Standing::Refused, false)
        );
        assert_eq!(
            st(j(ProviderError::Permanent("HTTP 401: bad key".into()))),
            (Standing::Inconclusive, true)
        );
        assert_eq!(
            st(j(ProviderError::Permanent(
                "HTTP 429: you have reached your weekly usage limit".into()
            ))),
            (Standing::Inconclusive, true)
        );
        let t = |status, cause| {
            ProviderError::Transient(Transient {
                cause,
                status,
                message: "x".into(),
                retry_after: Some(Duration::from_secs(7)),
            })
        };
        match j(t(Some(429), Cause::RateLimited)) {
            ProbeVerdict::Record(p) => {
                assert_eq!(p.status, Standing::Inconclusive);
                assert_eq!(p.retry_after_ms, Some(7000));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            st(j(t(Some(503), Cause::ServerError))),
            (Standing::Inconclusive, false)
        );
        assert_eq!(
            st(judge(
                &Err(ProbeFailure::Timeout(Duration::from_secs(3))),
                0
            )),
            (Standing::Inconclusive, false)
        );
        assert_eq!(st(judge(&Ok(()), 0)), (Standing::Callable, false));
    }
}
