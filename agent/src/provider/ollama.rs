//! Ollama's native `/api/chat`: NDJSON, one JSON object per line, the
//! last one with `done: true` carrying the usage (`prompt_eval_count`,
//! `eval_count`). Tool calls arrive whole, with `arguments` as a JSON
//! object (sent back as an object: stringified it is a 400), often
//! without an id. Errors are `{"error": "text"}`. The context window is
//! sent (`options.num_ctx`): Ollama's default truncates silently.

use serde_json::{json, Value};

use super::http::{
    classify_error_event, cut_off, json_error_text, parse_json, Endpoint, KeyHeader, Lines,
};
use super::{emit_calls, make_call_id, parse_arguments, refuse_truncated, Provider};
use crate::model::{
    Message, ProviderError, Role, StreamEvent, ToolCall, ToolSpec, Turn, TurnRequest,
};

pub const DEFAULT_BASE_URL: &str = "http://localhost:11434";
pub const DEFAULT_NUM_CTX: u64 = 16384;

#[derive(Debug, Clone)]
pub struct OllamaProvider {
    endpoint: Endpoint,
    num_ctx: u64,
}

impl OllamaProvider {
    pub fn new(base_url: Option<&str>, api_key: Option<String>) -> Result<Self, ProviderError> {
        Ok(OllamaProvider {
            endpoint: Endpoint::new(base_url, DEFAULT_BASE_URL, api_key, KeyHeader::Bearer)?,
            num_ctx: DEFAULT_NUM_CTX,
        })
    }

    /// The context window to ask for (default 16384).
    pub fn with_num_ctx(mut self, num_ctx: u64) -> Self {
        self.num_ctx = num_ctx;
        self
    }

    pub fn request_body(&self, req: &TurnRequest) -> Value {
        let mut options = json!({"num_ctx": self.num_ctx});
        if let Some(n) = req.max_tokens {
            options["num_predict"] = json!(n);
        }
        let mut body = json!({
            "model": req.model,
            "messages": req.messages.iter().map(message).collect::<Vec<_>>(),
            "stream": true,
            "options": options,
        });
        if !req.tools.is_empty() {
            body["tools"] = Value::Array(req.tools.iter().map(tool).collect());
        }
        body
    }
}

fn tool(t: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    })
}

fn message(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.text}),
        Role::User => json!({"role": "user", "content": m.text}),
        Role::Assistant => {
            let mut v = json!({"role": "assistant", "content": m.text});
            if !m.tool_calls.is_empty() {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        let args = match &c.arguments {
                            Ok(map) => Value::Object(map.clone()),
                            Err(_) => json!({}),
                        };
                        json!({"function": {"name": c.name, "arguments": args}})
                    })
                    .collect();
                v["tool_calls"] = Value::Array(calls);
            }
            v
        }
        Role::Tool => {
            let mut v = json!({"role": "tool", "content": m.text});
            if let Some(n) = &m.tool_name {
                v["tool_name"] = json!(n);
            }
            v
        }
    }
}

impl Provider for OllamaProvider {
    fn name(&self) -> &str {
        "ollama"
    }

    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError> {
        let resp = self
            .endpoint
            .post("/api/chat", &[], &self.request_body(req))
            .await?;
        let mut lines = Lines::new(resp);
        let mut turn = Turn::default();
        let mut done = false;
        while let Some(line) = lines.next_line().await? {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            turn.raw.push(line.to_string());
            let v = parse_json(line, "a line")?;
            if json_error_text(&v).is_some() {
                return Err(classify_error_event(&v, line));
            }
            if let Some(m) = v.get("message") {
                if let Some(r) = m.get("thinking").and_then(Value::as_str) {
                    if !r.is_empty() {
                        turn.reasoning.push_str(r);
                        on_event(StreamEvent::Reasoning(r.to_string()));
                    }
                }
                if let Some(t) = m.get("content").and_then(Value::as_str) {
                    if !t.is_empty() {
                        turn.text.push_str(t);
                        on_event(StreamEvent::Text(t.to_string()));
                    }
                }
                if let Some(tcs) = m.get("tool_calls").and_then(Value::as_array) {
                    turn.tool_calls.extend(tcs.iter().map(call));
                }
            }
            if v.get("done").and_then(Value::as_bool) == Some(true) {
                let n = |k: &str| v.get(k).and_then(Value::as_u64);
                if let Some(i) = n("prompt_eval_count") {
                    turn.usage.input_tokens = i;
                }
                if let Some(o) = n("eval_count") {
                    turn.usage.output_tokens = o;
                }
                turn.stop_reason = v
                    .get("done_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                done = true;
                break;
            }
        }
        if !done {
            return Err(cut_off("a line with done: true"));
        }
        turn.truncated = turn.stop_reason.as_deref() == Some("length");
        if turn.truncated {
            refuse_truncated(&mut turn.tool_calls);
        }
        emit_calls(&turn.tool_calls, on_event);
        Ok(turn)
    }
}

/// A whole tool call; `arguments` is normally an object, tolerated as a
/// string of JSON.
fn call(tc: &Value) -> ToolCall {
    let f = tc.get("function").unwrap_or(&Value::Null);
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let (arguments, raw_arguments) = match f.get("arguments") {
        Some(Value::Object(m)) => (Ok(m.clone()), Value::Object(m.clone()).to_string()),
        Some(Value::String(s)) => (parse_arguments(s), s.clone()),
        None | Some(Value::Null) => (Ok(Default::default()), String::new()),
        Some(other) => (
            Err("the arguments are not a JSON object".to_string()),
            other.to_string(),
        ),
    };
    let id = tc
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(make_call_id);
    ToolCall {
        id,
        name,
        arguments,
        raw_arguments,
    }
}
