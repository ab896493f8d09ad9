//! OpenAI-compatible chat completions, streamed (SSE ending with
//! `data: [DONE]`). Also serves Ollama's `/v1`, vLLM, llama.cpp's
//! server, LM Studio, OpenRouter.
//!
//! Tolerated deviations: tool-call deltas without `index`, parallel calls
//! all on index 0 told apart by `id`, a first fragment without
//! `arguments`, arguments sent as an object instead of a string,
//! `usage: {}` or `null`, the usage in a final chunk with empty
//! `choices`, reasoning in `reasoning` or `reasoning_content`.

use serde_json::{json, Map, Value};

use super::http::{
    classify_error_event, cut_off, json_error_text, parse_json, plain, Endpoint, KeyHeader, Sse,
};
use super::{emit_calls, make_call_id, parse_arguments, refuse_truncated, Provider};
use crate::model::{
    Message, ProviderError, Role, StreamEvent, ToolCall, ToolSpec, Turn, TurnRequest, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    endpoint: Endpoint,
    stream: bool,
}

impl OpenAiProvider {
    pub fn new(base_url: Option<&str>, api_key: Option<String>) -> Result<Self, ProviderError> {
        Ok(OpenAiProvider {
            endpoint: Endpoint::new(base_url, DEFAULT_BASE_URL, api_key, KeyHeader::Bearer)?,
            stream: true,
        })
    }

    /// Ask for one JSON answer instead of a stream (`stream: false`):
    /// for servers whose streamed tool calls are unreliable (Ollama's
    /// `/v1` in some versions). A server that answers JSON to a
    /// streamed request is read the same way.
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError> {
        let mut body = request_body(req);
        if !self.stream {
            body["stream"] = json!(false);
            if let Some(o) = body.as_object_mut() {
                o.remove("stream_options");
            }
        }
        let resp = self.endpoint.post("/chat/completions", &[], &body).await?;
        let is_json = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
        let mut acc = Accumulator::default();
        if is_json {
            let text = resp.text().await.map_err(|e| {
                ProviderError::transient(
                    crate::model::Cause::Connection,
                    plain(&format!("the answer broke off: {e}")),
                )
            })?;
            let v = parse_json(&text, "the answer")?;
            if json_error_text(&v).is_some() {
                return Err(classify_error_event(&v, &text));
            }
            acc.chunk(&v, on_event);
            let turn = acc.finish(vec![text]);
            emit_calls(&turn.tool_calls, on_event);
            return Ok(turn);
        }
        let mut sse = Sse::new(resp);
        let mut raw = Vec::new();
        let mut done = false;
        while let Some(ev) = sse.next_event().await? {
            let data = ev.data.trim();
            raw.push(ev.data.clone());
            if data == "[DONE]" {
                done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let v = parse_json(data, "an event")?;
            if ev.event.as_deref() == Some("error") || v.get("error").is_some() {
                return Err(classify_error_event(&v, data));
            }
            acc.chunk(&v, on_event);
        }
        if !done {
            return Err(cut_off("data: [DONE]"));
        }
        let turn = acc.finish(raw);
        emit_calls(&turn.tool_calls, on_event);
        Ok(turn)
    }
}

/// The request body: messages, tools, streaming with usage.
pub fn request_body(req: &TurnRequest) -> Value {
    let mut body = json!({
        "model": req.model,
        "messages": req.messages.iter().map(message).collect::<Vec<_>>(),
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(req.tools.iter().map(tool).collect());
    }
    if let Some(n) = req.max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

fn tool(t: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    })
}

/// The arguments as sent back in the assistant message: the parsed
/// object, or `{}` for a call that was refused (servers that re-parse
/// the history reject invalid JSON; the tool result says what was wrong).
pub(crate) fn arguments_text(c: &ToolCall) -> String {
    match &c.arguments {
        Ok(m) => Value::Object(m.clone()).to_string(),
        Err(_) => "{}".to_string(),
    }
}

fn message(m: &Message) -> Value {
    match m.role {
        Role::System => json!({"role": "system", "content": m.text}),
        Role::User => json!({"role": "user", "content": m.text}),
        Role::Assistant if m.tool_calls.is_empty() => {
            json!({"role": "assistant", "content": m.text})
        }
        Role::Assistant => {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments_text(c)},
                    })
                })
                .collect();
            let content = if m.text.is_empty() {
                Value::Null
            } else {
                Value::String(m.text.clone())
            };
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        }
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.clone().unwrap_or_default(),
            "content": m.text,
        }),
    }
}

#[derive(Debug, Default)]
struct Partial {
    index: Option<u64>,
    id: Option<String>,
    name: String,
    args: String,
}

#[derive(Debug, Default)]
struct Accumulator {
    text: String,
    reasoning: String,
    calls: Vec<Partial>,
    usage: Usage,
    stop_reason: Option<String>,
}

impl Accumulator {
    fn chunk(&mut self, v: &Value, on_event: &mut (dyn FnMut(StreamEvent) + Send)) {
        if let Some(u) = v.get("usage").and_then(Value::as_object) {
            read_usage(u, &mut self.usage);
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return;
        };
        // One completion is asked for; a server that sends several gets
        // its first read.
        let Some(choice) = choices.iter().find(|c| {
            c.get("index")
                .and_then(Value::as_u64)
                .map_or(true, |i| i == 0)
        }) else {
            return;
        };
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.stop_reason = Some(r.to_string());
        }
        // Some servers send the whole message instead of a delta.
        let Some(delta) = choice.get("delta").or_else(|| choice.get("message")) else {
            return;
        };
        for key in ["reasoning_content", "reasoning"] {
            if let Some(r) = delta.get(key).and_then(Value::as_str) {
                if !r.is_empty() {
                    self.reasoning.push_str(r);
                    on_event(StreamEvent::Reasoning(r.to_string()));
                }
            }
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            if !t.is_empty() {
                self.text.push_str(t);
                on_event(StreamEvent::Text(t.to_string()));
            }
        }
        if let Some(tcs) = delta.get("tool_calls").and_then(Value::as_array) {
            for tc in tcs {
                self.tool_delta(tc);
            }
        }
    }

    fn tool_delta(&mut self, tc: &Value) {
        let index = tc.get("index").and_then(Value::as_u64);
        let id = tc
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let f = tc.get("function");
        let name = f
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let has_args = match f.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Null) | None => false,
            Some(_) => true,
        };
        let slot = self.slot(index, id, name, has_args);
        let p = &mut self.calls[slot];
        if p.id.is_none() {
            p.id = id.map(str::to_string);
        }
        if p.index.is_none() {
            p.index = index;
        }
        // The name comes whole in the first fragment; a server that
        // repeats it must not double it.
        if let (true, Some(n)) = (p.name.is_empty(), name) {
            p.name = n.to_string();
        }
        match f.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => p.args.push_str(s),
            Some(Value::Null) | None => {}
            Some(other) => p.args.push_str(&other.to_string()),
        }
    }

    /// Which partial call a fragment belongs to: the one with its id;
    /// else a new one when the id is new (parallel calls sharing an
    /// index); else the last one with its index (or, without an index,
    /// the last one) unless the fragment names a function and that call
    /// is already named, differently or with complete arguments while
    /// the fragment brings more (parallel calls without ids or indexes;
    /// a server that repeats the name in every fragment stays one call).
    fn slot(
        &mut self,
        index: Option<u64>,
        id: Option<&str>,
        name: Option<&str>,
        has_args: bool,
    ) -> usize {
        let candidate = if let Some(id) = id {
            if let Some(i) = self.calls.iter().position(|p| p.id.as_deref() == Some(id)) {
                return i;
            }
            // A first fragment that carried no id, now completed by one.
            self.calls
                .iter()
                .rposition(|p| p.id.is_none() && index.is_some() && p.index == index)
        } else if index.is_some() {
            self.calls.iter().rposition(|p| p.index == index)
        } else {
            self.calls.len().checked_sub(1)
        };
        if let Some(i) = candidate {
            let p = &self.calls[i];
            let starts_another = id.is_none()
                && name.is_some_and(|n| {
                    !p.name.is_empty()
                        && (n != p.name
                            || (has_args && serde_json::from_str::<Value>(p.args.trim()).is_ok()))
                });
            if !starts_another {
                return i;
            }
        }
        self.calls.push(Partial {
            index,
            ..Partial::default()
        });
        self.calls.len() - 1
    }

    fn finish(self, raw: Vec<String>) -> Turn {
        let truncated = self.stop_reason.as_deref() == Some("length");
        let mut tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .map(|p| ToolCall {
                id: p.id.unwrap_or_else(make_call_id),
                name: p.name,
                arguments: parse_arguments(&p.args),
                raw_arguments: p.args,
            })
            .collect();
        if truncated {
            refuse_truncated(&mut tool_calls);
        }
        Turn {
            text: self.text,
            reasoning: self.reasoning,
            tool_calls,
            usage: self.usage,
            stop_reason: self.stop_reason,
            truncated,
            raw,
        }
    }
}

/// `prompt_tokens`/`completion_tokens` (or the `input_`/`output_`
/// spelling); missing fields leave the count as it was.
fn read_usage(u: &Map<String, Value>, usage: &mut Usage) {
    let n = |a: &str, b: &str| u.get(a).or_else(|| u.get(b)).and_then(Value::as_u64);
    if let Some(i) = n("prompt_tokens", "input_tokens") {
        usage.input_tokens = i;
    }
    if let Some(o) = n("completion_tokens", "output_tokens") {
        usage.output_tokens = o;
    }
}
