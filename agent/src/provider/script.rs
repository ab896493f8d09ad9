//! A model that replays a JSON file of turns, for the demo and the
//! tests. The file is `{"turns": [...]}` or a bare array of turns:
//!
//! ```json
//! {"turns": [
//!   {"reasoning": "look first", "text": "Reading.",
//!    "tool_calls": [{"name": "read", "arguments": {"path": "src/lib.rs"}}],
//!    "usage": {"input_tokens": 120, "output_tokens": 12}},
//!   {"expect": ["fn add"],
//!    "tool_calls": [{"name": "edit", "raw_arguments": "{\"path\": \"src/li"}]},
//!   {"text": "Done.", "truncated": false}
//! ]}
//! ```
//!
//! `arguments` is any JSON value (a non-object is refused like a real
//! model's); `raw_arguments` is the text as a model would stream it
//! (malformed or truncated calls). `expect` lists substrings the last
//! tool result in the request must contain, or the turn fails with
//! `Malformed` (the agent did not tell the model what it should);
//! `expect_user` the same for the last user message. After
//! the last turn every turn is "(script ended)" with no calls. Usage not
//! given is estimated (four characters a token).

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::http::plain;
use super::{emit_calls, last_tool_result, parse_arguments, refuse_truncated, Provider};
use crate::model::{ProviderError, StreamEvent, ToolCall, Turn, TurnRequest, Usage};

/// The text of the turn after the script's last.
pub const SCRIPT_ENDED: &str = "(script ended)";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub reasoning: String,
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub expect: Vec<String>,
    /// Substrings the last person's (user) message in the request must
    /// contain (a retest operator's steering, with their outputs).
    #[serde(default)]
    pub expect_user: Vec<String>,
    /// Fail the turn with this provider error instead: `permanent:MSG`,
    /// `unavailable:MSG` or `transient:MSG` (the session retries: the
    /// script's next turn answers), anything else a malformed answer.
    #[serde(default)]
    pub error: Option<String>,
    /// Answer only after this long (a slow model, for the tests of a
    /// person cancelling while the model answers).
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub raw_arguments: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ScriptFile {
    Wrapped { turns: Vec<ScriptTurn> },
    Bare(Vec<ScriptTurn>),
}

#[derive(Debug, Clone)]
pub struct ScriptProvider {
    turns: Vec<ScriptTurn>,
    next: usize,
    /// A resumed session: continue at the turn the request's history has
    /// reached (one assistant message per turn taken).
    resumed: bool,
}

impl ScriptProvider {
    pub fn new(turns: Vec<ScriptTurn>) -> ScriptProvider {
        ScriptProvider {
            turns,
            next: 0,
            resumed: false,
        }
    }

    pub fn from_json(text: &str) -> Result<ScriptProvider, ProviderError> {
        match serde_json::from_str::<ScriptFile>(text) {
            Ok(ScriptFile::Wrapped { turns }) | Ok(ScriptFile::Bare(turns)) => {
                Ok(ScriptProvider::new(turns))
            }
            // The untagged error says nothing useful: retry each shape
            // for a message that points at the mistake.
            Err(_) => {
                let e = match serde_json::from_str::<Value>(text) {
                    Ok(Value::Array(_)) => serde_json::from_str::<Vec<ScriptTurn>>(text)
                        .err()
                        .map(|e| e.to_string()),
                    Ok(Value::Object(o)) => match o.get("turns") {
                        Some(t) => serde_json::from_value::<Vec<ScriptTurn>>(t.clone())
                            .err()
                            .map(|e| e.to_string()),
                        None => Some("no \"turns\" array".to_string()),
                    },
                    Ok(_) => Some("neither an array of turns nor {\"turns\": [...]}".into()),
                    Err(e) => Some(e.to_string()),
                };
                Err(ProviderError::Permanent(format!(
                    "the script is not valid: {}",
                    plain(&e.unwrap_or_default())
                )))
            }
        }
    }

    pub fn from_file(path: &Path) -> Result<ScriptProvider, ProviderError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ProviderError::Permanent(plain(&format!(
                "cannot read the script {}: {e}",
                path.display()
            )))
        })?;
        ScriptProvider::from_json(&text).map_err(|e| match e {
            ProviderError::Permanent(m) => {
                ProviderError::Permanent(format!("{}: {m}", plain(&path.display().to_string())))
            }
            other => other,
        })
    }

    /// For a resumed session: each turn continues at the script's turn
    /// matching the history in the request (its assistant messages), so a
    /// session resumed from the ledger picks up where it stopped.
    pub fn resuming(mut self) -> ScriptProvider {
        self.resumed = true;
        self
    }

    /// Turns not yet replayed.
    pub fn remaining(&self) -> usize {
        self.turns.len().saturating_sub(self.next)
    }
}

impl Provider for ScriptProvider {
    fn name(&self) -> &str {
        "script"
    }

    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError> {
        // Resumable: continue at the turn matching the history (one
        // assistant message per turn already taken).
        if self.resumed {
            let taken = req
                .messages
                .iter()
                .filter(|m| m.role == crate::model::Role::Assistant)
                .count();
            self.next = self.next.max(taken);
        }
        let number = self.next + 1;
        let Some(st) = self.turns.get(self.next).cloned() else {
            on_event(StreamEvent::Text(SCRIPT_ENDED.to_string()));
            return Ok(Turn {
                text: SCRIPT_ENDED.to_string(),
                reasoning: String::new(),
                tool_calls: Vec::new(),
                usage: estimate(req, SCRIPT_ENDED),
                stop_reason: Some("stop".into()),
                truncated: false,
                raw: vec![format!("{{\"text\":{:?}}}", SCRIPT_ENDED)],
            });
        };
        self.next += 1;
        if let Some(ms) = st.delay_ms {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        if let Some(e) = &st.error {
            return Err(match e.split_once(':') {
                Some(("permanent", m)) => ProviderError::Permanent(plain(m)),
                // The session retries it (the script's next turn answers).
                Some(("unavailable" | "transient", m)) => {
                    ProviderError::transient(crate::model::Cause::ServerError, plain(m))
                }
                _ => ProviderError::Malformed(plain(e)),
            });
        }
        if !st.expect.is_empty() {
            let last = last_tool_result(&req.messages);
            let missing: Vec<&String> = st
                .expect
                .iter()
                .filter(|s| !last.is_some_and(|t| t.contains(s.as_str())))
                .collect();
            if !missing.is_empty() {
                return Err(ProviderError::Malformed(plain(&format!(
                    "script turn {number} expected the last tool result to contain {missing:?}; it was: {}",
                    last.unwrap_or("(no tool result)")
                ))));
            }
        }
        if !st.expect_user.is_empty() {
            let last = req
                .messages
                .iter()
                .rev()
                .find(|m| m.role == crate::model::Role::User)
                .map(|m| m.text.as_str());
            let missing: Vec<&String> = st
                .expect_user
                .iter()
                .filter(|s| !last.is_some_and(|t| t.contains(s.as_str())))
                .collect();
            if !missing.is_empty() {
                return Err(ProviderError::Malformed(plain(&format!(
                    "script turn {number} expected the last user message to contain {missing:?}; it was: {}",
                    last.unwrap_or("(no user message)")
                ))));
            }
        }
        if !st.reasoning.is_empty() {
            on_event(StreamEvent::Reasoning(st.reasoning.clone()));
        }
        if !st.text.is_empty() {
            on_event(StreamEvent::Text(st.text.clone()));
        }
        let mut tool_calls: Vec<ToolCall> = st
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let raw = match (&c.raw_arguments, &c.arguments) {
                    (Some(raw), _) => raw.clone(),
                    (None, Some(v)) => v.to_string(),
                    (None, None) => String::new(),
                };
                ToolCall {
                    id: c
                        .id
                        .clone()
                        .unwrap_or_else(|| format!("script_{number}_{}", i + 1)),
                    name: c.name.clone(),
                    arguments: parse_arguments(&raw),
                    raw_arguments: raw,
                }
            })
            .collect();
        if st.truncated {
            refuse_truncated(&mut tool_calls);
        }
        emit_calls(&tool_calls, on_event);
        let output: String = st
            .tool_calls
            .iter()
            .map(|c| c.raw_arguments.clone().unwrap_or_default())
            .chain([st.text.clone(), st.reasoning.clone()])
            .collect();
        let stop_reason = if st.truncated {
            "length"
        } else if tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(Turn {
            text: st.text.clone(),
            reasoning: st.reasoning.clone(),
            usage: st.usage.unwrap_or_else(|| estimate(req, &output)),
            stop_reason: Some(stop_reason.into()),
            truncated: st.truncated,
            raw: vec![raw_turn(&st)],
            tool_calls,
        })
    }
}

fn raw_turn(st: &ScriptTurn) -> String {
    let calls: Vec<Value> = st
        .tool_calls
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.id, "name": c.name, "arguments": c.arguments,
                "raw_arguments": c.raw_arguments,
            })
        })
        .collect();
    serde_json::json!({
        "text": st.text, "reasoning": st.reasoning, "tool_calls": calls,
        "truncated": st.truncated,
    })
    .to_string()
}

/// Four characters a token, for budgets tested with the script.
fn estimate(req: &TurnRequest, output: &str) -> Usage {
    let input: usize = req.messages.iter().map(|m| m.text.len()).sum();
    Usage {
        input_tokens: (input as u64).div_ceil(4),
        output_tokens: (output.len() as u64).div_ceil(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Message;

    /// A script read anew (a resumed session) continues at the turn the
    /// history has reached, not at its first.
    #[tokio::test]
    async fn a_new_script_provider_continues_at_the_history_s_turn() {
        let mut p = ScriptProvider::from_json(r#"[{"text": "one"}, {"text": "two"}]"#)
            .expect("script")
            .resuming();
        let req = TurnRequest {
            model: "m".into(),
            messages: vec![
                Message::system("s"),
                Message::user("u"),
                Message::assistant("one", Vec::new()),
                Message::user("again"),
            ],
            tools: Vec::new(),
            max_tokens: None,
        };
        let mut sink = |_: StreamEvent| {};
        let t = p.turn(&req, &mut sink).await.expect("turn");
        assert_eq!(t.text, "two");
    }
}
