//! Providers: one thin client per wire format. They turn a
//! [`TurnRequest`] into HTTP (or a script), parse the answer leniently,
//! report [`StreamEvent`]s as they arrive, and return the [`Turn`]. They
//! never execute anything.

use crate::model::{ProviderError, StreamEvent, Turn, TurnRequest};

/// A model behind a wire format.
#[allow(async_fn_in_trait)]
pub trait Provider {
    /// A short name for the ledger (`openai`, `ollama`, `anthropic`, `script`).
    fn name(&self) -> &str;
    /// Run one turn; `on_event` sees text, reasoning and completed tool
    /// calls as they stream.
    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError>;
}

pub mod anthropic;
pub mod http;
pub mod ollama;
pub mod openai;
pub mod script;

pub use anthropic::AnthropicProvider;
pub use ollama::OllamaProvider;
pub use openai::OpenAiProvider;
pub use script::ScriptProvider;

use serde_json::{Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// Every provider the agent can use, dispatching [`Provider`] to the
/// one chosen (the trait has async fns, so it is not object safe).
#[derive(Debug)]
pub enum AnyProvider {
    OpenAi(OpenAiProvider),
    Ollama(OllamaProvider),
    Anthropic(AnthropicProvider),
    Script(ScriptProvider),
}

impl Provider for AnyProvider {
    fn name(&self) -> &str {
        match self {
            AnyProvider::OpenAi(p) => p.name(),
            AnyProvider::Ollama(p) => p.name(),
            AnyProvider::Anthropic(p) => p.name(),
            AnyProvider::Script(p) => p.name(),
        }
    }

    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError> {
        match self {
            AnyProvider::OpenAi(p) => p.turn(req, on_event).await,
            AnyProvider::Ollama(p) => p.turn(req, on_event).await,
            AnyProvider::Anthropic(p) => p.turn(req, on_event).await,
            AnyProvider::Script(p) => p.turn(req, on_event).await,
        }
    }
}

/// The provider kinds [`from_config`] knows.
pub const KINDS: &[&str] = &["openai", "anthropic", "ollama", "script"];

/// The provider for `kind` (`openai`, `anthropic`, `ollama`, `script`).
///
/// `base_url` overrides the default endpoint (OpenAI
/// `https://api.openai.com/v1`, Anthropic `https://api.anthropic.com/v1`,
/// Ollama `http://localhost:11434`); `api_key` is optional (local
/// servers need none; a hosted one answers 401, which is permanent).
/// For `script`, `model` is the path of the script file and `base_url`
/// and `api_key` are ignored. An unknown kind or an unreadable script is
/// `Permanent`.
pub fn from_config(
    kind: &str,
    model: &str,
    base_url: Option<&str>,
    api_key: Option<String>,
) -> Result<AnyProvider, ProviderError> {
    match kind {
        "openai" => Ok(AnyProvider::OpenAi(OpenAiProvider::new(base_url, api_key)?)),
        "anthropic" => Ok(AnyProvider::Anthropic(AnthropicProvider::new(
            base_url, api_key,
        )?)),
        "ollama" => Ok(AnyProvider::Ollama(OllamaProvider::new(base_url, api_key)?)),
        "script" => Ok(AnyProvider::Script(ScriptProvider::from_file(
            std::path::Path::new(model),
        )?)),
        other => Err(ProviderError::Permanent(format!(
            "unknown provider '{}' (known: {})",
            http::plain(other),
            KINDS.join(", ")
        ))),
    }
}

/// Parse a tool call's complete argument text leniently: `Ok` only for a
/// JSON object (empty text counts as `{}`, a call without arguments);
/// anything else is `Err` with the reason, for the model.
pub fn parse_arguments(raw: &str) -> Result<Map<String, Value>, String> {
    let t = raw.trim();
    if t.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(t) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(format!(
            "the arguments are not a JSON object (got {})",
            json_kind(&other)
        )),
        Err(e) if e.is_eof() => Err(format!(
            "the arguments are incomplete JSON (cut off at {} bytes)",
            t.len()
        )),
        Err(e) => Err(format!("the arguments are not valid JSON: {e}")),
    }
}

/// Why a call in a turn cut off by a length limit is refused.
pub const TRUNCATED_CALL: &str =
    "the turn was cut off by the length limit, so this call may be incomplete; it was not run";

/// Refuse every call of a truncated turn (they may be incomplete even
/// when their text happens to parse).
pub(crate) fn refuse_truncated(calls: &mut [crate::model::ToolCall]) {
    for c in calls {
        c.arguments = Err(match &c.arguments {
            Err(e) => format!("{TRUNCATED_CALL} ({e})"),
            Ok(_) => TRUNCATED_CALL.to_string(),
        });
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An id for a call the provider sent without one, unique in this
/// process.
pub fn make_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    format!("call_retie_{pid:x}_{n}")
}

/// The text of the last tool result in `messages`, if any.
pub(crate) fn last_tool_result(messages: &[crate::model::Message]) -> Option<&str> {
    messages
        .iter()
        .rev()
        .find(|m| m.role == crate::model::Role::Tool)
        .map(|m| m.text.as_str())
}

/// Finish the turn's calls and report them, in order.
pub(crate) fn emit_calls(
    calls: &[crate::model::ToolCall],
    on_event: &mut (dyn FnMut(StreamEvent) + Send),
) {
    for c in calls {
        on_event(StreamEvent::ToolCall(c.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_objects_or_reasons() {
        assert_eq!(parse_arguments("").map(|m| m.len()), Ok(0));
        assert!(parse_arguments(r#"{"path":"a"}"#).is_ok());
        assert!(parse_arguments(r#""{\"path\":\"a\"}""#).is_err());
        assert!(parse_arguments("[1]").is_err());
        let e = parse_arguments(r#"{"path":"a"#).err().unwrap_or_default();
        assert!(e.contains("incomplete"), "{e}");
        assert!(parse_arguments("{nope}").is_err());
    }

    #[test]
    fn made_up_ids_differ() {
        assert_ne!(make_call_id(), make_call_id());
    }
}
