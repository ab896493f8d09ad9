//! A minimal scripted model for the demo and the tests: it replays a JSON
//! file of turns. Each turn has `text`, `tool_calls` (each with `name` and
//! either `arguments`, any JSON, or `raw_arguments`, text parsed as a
//! provider would: only a complete object is usable), optional
//! `truncated` and `usage`. After the last turn it answers "(script
//! ended)" with no call. It speaks no wire format and executes nothing.

use serde::Deserialize;
use serde_json::Value;

use crate::model::{ProviderError, StreamEvent, ToolCall, Turn, TurnRequest, Usage};
use crate::provider::Provider;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Fail the turn with this provider error instead (`permanent:...`).
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub raw_arguments: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    turns: Vec<ScriptTurn>,
}

/// The scripted model.
pub struct ScriptModel {
    turns: std::vec::IntoIter<ScriptTurn>,
    n: usize,
}

impl ScriptModel {
    /// Read a script (`{"turns": [...]}`).
    pub fn parse(text: &str) -> Result<ScriptModel, String> {
        let f: ScriptFile =
            serde_json::from_str(text).map_err(|e| format!("not a script of turns: {e}"))?;
        Ok(ScriptModel {
            turns: f.turns.into_iter(),
            n: 0,
        })
    }
}

/// Parse raw arguments as a provider does: only a complete JSON object.
pub fn parse_arguments(raw: &str) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(format!("arguments are not an object: {other}")),
        Err(e) => Err(format!("arguments are not valid JSON: {e}")),
    }
}

impl Provider for ScriptModel {
    fn name(&self) -> &str {
        "script"
    }

    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError> {
        self.n += 1;
        let input = req.messages.iter().map(|m| m.text.len() as u64 / 4).sum();
        let Some(t) = self.turns.next() else {
            let text = "(script ended)".to_string();
            on_event(StreamEvent::Text(text.clone()));
            return Ok(Turn {
                text,
                reasoning: String::new(),
                tool_calls: Vec::new(),
                usage: Usage {
                    input_tokens: input,
                    output_tokens: 3,
                },
                stop_reason: Some("stop".into()),
                truncated: false,
                raw: Vec::new(),
            });
        };
        if let Some(e) = t.error {
            return Err(match e.split_once(':') {
                Some(("permanent", m)) => ProviderError::Permanent(m.into()),
                Some(("unavailable", m)) => ProviderError::Unavailable(m.into()),
                _ => ProviderError::Malformed(e),
            });
        }
        if !t.text.is_empty() {
            on_event(StreamEvent::Text(t.text.clone()));
        }
        let calls: Vec<ToolCall> = t
            .tool_calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let raw = match (&c.raw_arguments, &c.arguments) {
                    (Some(r), _) => r.clone(),
                    (None, Some(v)) => v.to_string(),
                    (None, None) => "{}".into(),
                };
                ToolCall {
                    id: format!("script-{}-{i}", self.n),
                    name: c.name,
                    arguments: parse_arguments(&raw),
                    raw_arguments: raw,
                }
            })
            .collect();
        for c in &calls {
            on_event(StreamEvent::ToolCall(c.clone()));
        }
        let out =
            (t.text.len() + calls.iter().map(|c| c.raw_arguments.len()).sum::<usize>()) as u64 / 4;
        Ok(Turn {
            text: t.text,
            reasoning: String::new(),
            tool_calls: calls,
            usage: t.usage.unwrap_or(Usage {
                input_tokens: input,
                output_tokens: out,
            }),
            stop_reason: Some(if t.truncated { "length" } else { "stop" }.into()),
            truncated: t.truncated,
            raw: Vec::new(),
        })
    }
}
