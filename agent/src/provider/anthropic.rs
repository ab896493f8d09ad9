//! Anthropic Messages, streamed (SSE): `message_start` →
//! `content_block_start` → `content_block_delta` (`text_delta`,
//! `input_json_delta`, `thinking_delta`) → `content_block_stop` →
//! `message_delta` (stop reason, cumulative usage) → `message_stop`;
//! `ping` anywhere; `error` possible mid-stream after HTTP 200.
//! A tool_use block's `partial_json` pieces are joined and parsed at its
//! `content_block_stop`.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::http::{classify_error_event, cut_off, parse_json, Endpoint, KeyHeader, Sse};
use super::{emit_calls, make_call_id, parse_arguments, refuse_truncated, Provider};
use crate::model::{
    Message, ProviderError, Role, StreamEvent, ToolCall, ToolSpec, Turn, TurnRequest, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com/v1";
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API; used when the request has none.
pub const DEFAULT_MAX_TOKENS: u64 = 8192;

#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    endpoint: Endpoint,
}

impl AnthropicProvider {
    pub fn new(base_url: Option<&str>, api_key: Option<String>) -> Result<Self, ProviderError> {
        Ok(AnthropicProvider {
            endpoint: Endpoint::new(base_url, DEFAULT_BASE_URL, api_key, KeyHeader::XApiKey)?,
        })
    }
}

/// The request body: system prompt at the top level, tool results as
/// `tool_result` blocks in a user message.
pub fn request_body(req: &TurnRequest) -> Value {
    let system: Vec<&str> = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.text.as_str())
        .collect();
    let mut messages: Vec<Value> = Vec::new();
    for m in req.messages.iter().filter(|m| m.role != Role::System) {
        let (role, blocks) = blocks(m);
        if blocks.is_empty() {
            continue;
        }
        // Consecutive messages of one role become one message (the API
        // wants user and assistant to alternate; all tool results of a
        // turn go in one user message).
        if let Some(last) = messages.last_mut() {
            if last["role"] == role {
                if let Some(arr) = last["content"].as_array_mut() {
                    arr.extend(blocks);
                    continue;
                }
            }
        }
        messages.push(json!({"role": role, "content": blocks}));
    }
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages,
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(req.tools.iter().map(tool).collect());
    }
    body
}

fn tool(t: &ToolSpec) -> Value {
    json!({"name": t.name, "description": t.description, "input_schema": t.parameters})
}

fn blocks(m: &Message) -> (&'static str, Vec<Value>) {
    match m.role {
        Role::System | Role::User => {
            let b = if m.text.is_empty() {
                vec![]
            } else {
                vec![json!({"type": "text", "text": m.text})]
            };
            ("user", b)
        }
        Role::Assistant => {
            let mut b = Vec::new();
            if !m.text.is_empty() {
                b.push(json!({"type": "text", "text": m.text}));
            }
            for c in &m.tool_calls {
                let input = match &c.arguments {
                    Ok(map) => Value::Object(map.clone()),
                    Err(_) => json!({}),
                };
                b.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
            }
            ("assistant", b)
        }
        Role::Tool => (
            "user",
            vec![json!({
                "type": "tool_result",
                "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
                "content": m.text,
            })],
        ),
    }
}

#[derive(Debug)]
enum Block {
    Text,
    Thinking,
    Tool {
        id: String,
        name: String,
        json: String,
        /// The `input` of the start event (normally `{}`).
        initial: Option<Map<String, Value>>,
        done: bool,
    },
    Other,
}

impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
    }

    async fn turn(
        &mut self,
        req: &TurnRequest,
        on_event: &mut (dyn FnMut(StreamEvent) + Send),
    ) -> Result<Turn, ProviderError> {
        let version = [("anthropic-version", API_VERSION.to_string())];
        let resp = self
            .endpoint
            .post("/messages", &version, &request_body(req))
            .await?;
        let mut sse = Sse::new(resp);
        let mut turn = Turn::default();
        // Blocks by index, in index order.
        let mut blocks_by_index: BTreeMap<u64, Block> = BTreeMap::new();
        let mut done = false;
        while let Some(ev) = sse.next_event().await? {
            turn.raw.push(match &ev.event {
                Some(name) => format!("event: {name}\ndata: {}", ev.data),
                None => ev.data.clone(),
            });
            let data = ev.data.trim();
            if data.is_empty() {
                continue;
            }
            let v = parse_json(data, "an event")?;
            let kind = v
                .get("type")
                .and_then(Value::as_str)
                .or(ev.event.as_deref())
                .unwrap_or("");
            let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
            match kind {
                "message_start" => {
                    if let Some(u) = v.pointer("/message/usage").and_then(Value::as_object) {
                        read_usage(u, &mut turn.usage);
                    }
                }
                "content_block_start" => {
                    let cb = v.get("content_block").unwrap_or(&Value::Null);
                    let block = match cb.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            if let Some(t) = cb.get("text").and_then(Value::as_str) {
                                push_text(&mut turn, t, on_event);
                            }
                            Block::Text
                        }
                        Some("thinking") => {
                            if let Some(t) = cb.get("thinking").and_then(Value::as_str) {
                                push_reasoning(&mut turn, t, on_event);
                            }
                            Block::Thinking
                        }
                        Some("tool_use") => Block::Tool {
                            id: cb
                                .get("id")
                                .and_then(Value::as_str)
                                .filter(|s| !s.is_empty())
                                .map(str::to_string)
                                .unwrap_or_else(make_call_id),
                            name: cb
                                .get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            json: String::new(),
                            initial: cb
                                .get("input")
                                .and_then(Value::as_object)
                                .filter(|m| !m.is_empty())
                                .cloned(),
                            done: false,
                        },
                        _ => Block::Other,
                    };
                    blocks_by_index.insert(index, block);
                }
                "content_block_delta" => {
                    let d = v.get("delta").unwrap_or(&Value::Null);
                    let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("");
                    match d.get("type").and_then(Value::as_str).unwrap_or("") {
                        "text_delta" => push_text(&mut turn, s("text"), on_event),
                        "thinking_delta" => push_reasoning(&mut turn, s("thinking"), on_event),
                        "input_json_delta" => {
                            if let Some(Block::Tool { json, .. }) = blocks_by_index.get_mut(&index)
                            {
                                json.push_str(s("partial_json"));
                            }
                        }
                        // signature_delta, citations...: nothing to show.
                        _ => {}
                    }
                }
                "content_block_stop" => {
                    if let Some(Block::Tool { done, .. }) = blocks_by_index.get_mut(&index) {
                        *done = true;
                    }
                }
                "message_delta" => {
                    if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                        turn.stop_reason = Some(r.to_string());
                    }
                    if let Some(u) = v.get("usage").and_then(Value::as_object) {
                        read_usage(u, &mut turn.usage);
                    }
                }
                "message_stop" => {
                    done = true;
                    break;
                }
                "error" => return Err(classify_error_event(&v, data)),
                // ping, and event types added later.
                _ => {}
            }
        }
        if !done {
            return Err(cut_off("message_stop"));
        }
        for block in blocks_by_index.into_values() {
            if let Block::Tool {
                id,
                name,
                json,
                initial,
                done,
            } = block
            {
                let arguments = if !done {
                    Err("the call's block never ended; it may be incomplete".to_string())
                } else if json.trim().is_empty() {
                    Ok(initial.unwrap_or_default())
                } else {
                    parse_arguments(&json)
                };
                turn.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                    raw_arguments: json,
                });
            }
        }
        turn.truncated = turn.stop_reason.as_deref() == Some("max_tokens");
        if turn.truncated {
            refuse_truncated(&mut turn.tool_calls);
        }
        emit_calls(&turn.tool_calls, on_event);
        Ok(turn)
    }
}

fn push_text(turn: &mut Turn, t: &str, on_event: &mut (dyn FnMut(StreamEvent) + Send)) {
    if !t.is_empty() {
        turn.text.push_str(t);
        on_event(StreamEvent::Text(t.to_string()));
    }
}

fn push_reasoning(turn: &mut Turn, t: &str, on_event: &mut (dyn FnMut(StreamEvent) + Send)) {
    if !t.is_empty() {
        turn.reasoning.push_str(t);
        on_event(StreamEvent::Reasoning(t.to_string()));
    }
}

/// Input tokens (plus cache reads and writes, which are input too) and
/// output tokens (cumulative in `message_delta`).
fn read_usage(u: &Map<String, Value>, usage: &mut Usage) {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(i) = n("input_tokens") {
        usage.input_tokens = i
            + n("cache_creation_input_tokens").unwrap_or(0)
            + n("cache_read_input_tokens").unwrap_or(0);
    }
    if let Some(o) = n("output_tokens") {
        usage.output_tokens = o;
    }
}
