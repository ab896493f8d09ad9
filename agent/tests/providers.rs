//! The providers against local HTTP servers (127.0.0.1, port 0) that
//! speak each wire format, written from the documented formats with the
//! quirks of the field notes. Nothing here reaches beyond loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use retie_agent::provider::{
    from_config, AnthropicProvider, AnyProvider, OllamaProvider, OpenAiProvider, ScriptProvider,
};
use retie_agent::{
    Cause, Message, Provider, ProviderError, StreamEvent, ToolCall, ToolSpec, Transient, Turn,
    TurnRequest,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------- server

#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// Transfer-Encoding: chunked, properly ended.
    Chunked,
    /// No length: the body ends when the connection closes.
    Close,
    /// Chunked, but the connection closes before the final chunk.
    ChunkedAbort,
}

struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    chunks: Vec<String>,
    framing: Framing,
}

/// A streamed 200 whose body is `body` cut into pieces of `size` bytes.
fn stream(content_type: &str, body: &str, size: usize, framing: Framing) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type", content_type.to_string())],
        chunks: pieces(body, size),
        framing,
    }
}

fn sse_reply(body: &str) -> Reply {
    stream("text/event-stream", body, 7, Framing::Chunked)
}

fn ndjson_reply(body: &str) -> Reply {
    stream("application/x-ndjson", body, 9, Framing::Chunked)
}

fn error_reply(status: u16, headers: Vec<(&'static str, String)>, body: Value) -> Reply {
    let mut h = vec![("content-type", "application/json".to_string())];
    h.extend(headers);
    Reply {
        status,
        headers: h,
        chunks: vec![body.to_string()],
        framing: Framing::Close,
    }
}

fn pieces(s: &str, size: usize) -> Vec<String> {
    let bytes = s.as_bytes();
    bytes
        .chunks(size.max(1))
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Server {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

/// Serve `replies` in order, one per connection; record each request.
async fn serve(replies: Vec<Reply>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut replies = replies.into_iter();
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let reply = replies.next().unwrap_or(Reply {
                status: 500,
                headers: vec![],
                chunks: vec!["the test server has no more replies".into()],
                framing: Framing::Close,
            });
            let log = log.clone();
            tokio::spawn(async move {
                handle(sock, reply, log).await;
            });
        }
    });
    Server {
        base: format!("http://{addr}"),
        seen,
    }
}

async fn handle(mut sock: TcpStream, reply: Reply, log: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("");
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match sock.read(&mut tmp).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    log.lock().expect("lock").push(Seen {
        path,
        headers,
        body,
    });

    let mut out = format!("HTTP/1.1 {} Test\r\nconnection: close\r\n", reply.status);
    for (k, v) in &reply.headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if reply.framing != Framing::Close {
        out.push_str("transfer-encoding: chunked\r\n");
    }
    out.push_str("\r\n");
    if sock.write_all(out.as_bytes()).await.is_err() {
        return;
    }
    for c in &reply.chunks {
        let data = if reply.framing == Framing::Close {
            c.clone()
        } else {
            format!("{:x}\r\n{c}\r\n", c.len())
        };
        if sock.write_all(data.as_bytes()).await.is_err() {
            return;
        }
        let _ = sock.flush().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if reply.framing == Framing::Chunked {
        let _ = sock.write_all(b"0\r\n\r\n").await;
    }
    let _ = sock.shutdown().await;
}

// ---------------------------------------------------------------- helpers

/// The transient failure `r` must be, with its cause.
fn transient(r: Result<Turn, ProviderError>, cause: Cause) -> Transient {
    match r {
        Err(ProviderError::Transient(t)) if t.cause == cause => t,
        other => panic!("expected a transient failure ({cause:?}), got {other:?}"),
    }
}

fn read_tool() -> ToolSpec {
    ToolSpec {
        name: "read".into(),
        description: "Read a file of the workspace".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": false,
        }),
    }
}

fn request() -> TurnRequest {
    TurnRequest {
        model: "test-model".into(),
        messages: vec![
            Message::system("You are a careful agent."),
            Message::user("Fix the bug."),
        ],
        tools: vec![read_tool()],
        max_tokens: Some(512),
    }
}

async fn run<P: Provider>(
    p: &mut P,
    req: &TurnRequest,
) -> (Result<Turn, ProviderError>, Vec<StreamEvent>) {
    let mut events = Vec::new();
    let r = p.turn(req, &mut |e| events.push(e)).await;
    (r, events)
}

fn ok(r: Result<Turn, ProviderError>) -> Turn {
    match r {
        Ok(t) => t,
        Err(e) => panic!("the turn failed: {e}"),
    }
}

fn args(c: &ToolCall) -> Value {
    match &c.arguments {
        Ok(m) => Value::Object(m.clone()),
        Err(e) => panic!("call {} has unusable arguments: {e}", c.name),
    }
}

fn assert_refused(c: &ToolCall) {
    assert!(
        c.arguments.is_err(),
        "call {} must not be usable: {:?}",
        c.name,
        c.arguments
    );
}

/// A history with one usable call, one refused call and their results.
fn second_turn_request() -> TurnRequest {
    let good = ToolCall {
        id: "call_a".into(),
        name: "read".into(),
        arguments: Ok(json!({"path": "src/lib.rs"})
            .as_object()
            .cloned()
            .unwrap_or_default()),
        raw_arguments: r#"{"path": "src/lib.rs"}"#.into(),
    };
    let bad = ToolCall {
        id: "call_b".into(),
        name: "read".into(),
        arguments: Err("the arguments are incomplete JSON".into()),
        raw_arguments: r#"{"path": "sr"#.into(),
    };
    let mut req = request();
    req.messages.push(Message::assistant(
        "Let me look.",
        vec![good.clone(), bad.clone()],
    ));
    req.messages.push(Message::tool_result(
        &good,
        "pub fn add(a: i32) -> i32 { a - 1 }",
    ));
    req.messages.push(Message::tool_result(
        &bad,
        "error: the arguments are incomplete JSON",
    ));
    req
}

fn sse(events: &[Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

fn named_sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            let name = e.get("type").and_then(Value::as_str).unwrap_or("unknown");
            format!("event: {name}\ndata: {e}\n\n")
        })
        .collect()
}

// ---------------------------------------------------------------- OpenAI

fn openai(server: &Server) -> OpenAiProvider {
    OpenAiProvider::new(Some(&format!("{}/v1", server.base)), Some("sk-test".into()))
        .expect("provider")
}

fn oa_chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "test-model",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

#[tokio::test]
async fn openai_text_and_a_tool_call_split_across_many_chunks() {
    let mut body = sse(&[
        oa_chunk(json!({"role": "assistant", "content": ""}), None),
        oa_chunk(json!({"content": "Hel"}), None),
        oa_chunk(json!({"content": "lo."}), None),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                   "function": {"name": "read", "arguments": ""}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "th\": \"src/"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "lib.rs\"}"}}]}),
            None,
        ),
        oa_chunk(json!({}), Some("tool_calls")),
        json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}}),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let (r, events) = run(&mut openai(&server), &request()).await;
    let turn = ok(r);
    assert_eq!(turn.text, "Hello.");
    assert_eq!(turn.tool_calls.len(), 1);
    let c = &turn.tool_calls[0];
    assert_eq!((c.id.as_str(), c.name.as_str()), ("call_1", "read"));
    assert_eq!(args(c), json!({"path": "src/lib.rs"}));
    assert_eq!(turn.usage.input_tokens, 31);
    assert_eq!(turn.usage.output_tokens, 9);
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
    assert!(!turn.truncated);
    assert_eq!(turn.raw.len(), 10, "every event kept raw");
    assert_eq!(
        events,
        vec![
            StreamEvent::Text("Hel".into()),
            StreamEvent::Text("lo.".into()),
            StreamEvent::ToolCall(c.clone())
        ]
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-test"));
    let b = &seen[0].body;
    assert_eq!(b["model"], "test-model");
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["max_tokens"], 512);
    assert_eq!(
        b["messages"][0],
        json!({"role": "system", "content": "You are a careful agent."})
    );
    assert_eq!(b["tools"][0]["type"], "function");
    assert_eq!(b["tools"][0]["function"]["name"], "read");
    assert_eq!(
        b["tools"][0]["function"]["parameters"]["required"],
        json!(["path"])
    );
}

#[tokio::test]
async fn openai_two_parallel_calls_by_index() {
    let mut body = sse(&[
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "read", "arguments": "{\"path\":"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "read", "arguments": "{\"path\":"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": " \"a.rs\"}"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 1, "function": {"arguments": " \"b.rs\"}"}}]}),
            None,
        ),
        oa_chunk(json!({}), Some("tool_calls")),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let turn = ok(run(&mut openai(&server), &request()).await.0);
    let got: Vec<(String, Value)> = turn
        .tool_calls
        .iter()
        .map(|c| (c.id.clone(), args(c)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("call_a".to_string(), json!({"path": "a.rs"})),
            ("call_b".to_string(), json!({"path": "b.rs"}))
        ]
    );
}

#[tokio::test]
async fn openai_quirks_missing_index_first_chunk_without_arguments_empty_usage_shared_index() {
    // Two parallel calls, both on index 0, told apart by id; the first
    // fragment of each without `arguments`; `usage: {}` on content chunks;
    // a third call with neither index nor id (fragments continue it);
    // the usage in a final chunk with empty choices.
    let mut body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": null}], "usage": {}}),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_x", "function": {"name": "read"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": \"x\"}"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_y", "function": {"name": "glob"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pattern\": "}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"*.rs\"}"}}]}),
            None,
        ),
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"name": "grep", "arguments": "{\"q\""}}]}}], "usage": null}),
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": ": \"fn\"}"}}]}}]}),
        json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "usage": {}}),
        json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let turn = ok(run(&mut openai(&server), &request()).await.0);
    assert_eq!(turn.text, "ok");
    let calls = &turn.tool_calls;
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(
        (calls[0].id.as_str(), calls[0].name.as_str()),
        ("call_x", "read")
    );
    assert_eq!(args(&calls[0]), json!({"path": "x"}));
    assert_eq!(
        (calls[1].id.as_str(), calls[1].name.as_str()),
        ("call_y", "glob")
    );
    assert_eq!(args(&calls[1]), json!({"pattern": "*.rs"}));
    assert_eq!(calls[2].name, "grep");
    assert_eq!(args(&calls[2]), json!({"q": "fn"}));
    assert!(!calls[2].id.is_empty(), "a missing id is made up");
    assert_ne!(calls[2].id, calls[0].id);
    assert_eq!((turn.usage.input_tokens, turn.usage.output_tokens), (7, 3));
}

#[tokio::test]
async fn openai_a_server_that_repeats_name_and_index_in_every_fragment_makes_one_call() {
    let mut body = sse(&[
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "read", "arguments": "{\"path\""}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "read", "arguments": ": \"a.rs\"}"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "read", "arguments": ""}}]}),
            None,
        ),
        oa_chunk(json!({}), Some("tool_calls")),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let turn = ok(run(&mut openai(&server), &request()).await.0);
    assert_eq!(turn.tool_calls.len(), 1, "{:?}", turn.tool_calls);
    assert_eq!(turn.tool_calls[0].name, "read");
    assert_eq!(args(&turn.tool_calls[0]), json!({"path": "a.rs"}));
}

#[tokio::test]
async fn openai_a_call_without_arguments_is_an_empty_object_and_non_objects_are_refused() {
    let mut body = sse(&[
        oa_chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "status"}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "read", "arguments": "\"src/lib.rs\""}}]}),
            None,
        ),
        oa_chunk(
            json!({"tool_calls": [{"index": 2, "id": "c3", "function": {"name": "read", "arguments": "{path: x}"}}]}),
            None,
        ),
        oa_chunk(json!({}), Some("tool_calls")),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let turn = ok(run(&mut openai(&server), &request()).await.0);
    assert_eq!(args(&turn.tool_calls[0]), json!({}));
    assert_refused(&turn.tool_calls[1]);
    assert_refused(&turn.tool_calls[2]);
    assert_eq!(turn.tool_calls[2].raw_arguments, "{path: x}");
}

#[tokio::test]
async fn openai_reasoning_goes_to_reasoning_not_text() {
    let mut body = sse(&[
        oa_chunk(json!({"reasoning_content": "The test "}), None),
        oa_chunk(json!({"reasoning": "fails."}), None),
        oa_chunk(json!({"content": "Fixed."}), None),
        oa_chunk(json!({}), Some("stop")),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let (r, events) = run(&mut openai(&server), &request()).await;
    let turn = ok(r);
    assert_eq!(turn.text, "Fixed.");
    assert_eq!(turn.reasoning, "The test fails.");
    assert_eq!(
        events,
        vec![
            StreamEvent::Reasoning("The test ".into()),
            StreamEvent::Reasoning("fails.".into()),
            StreamEvent::Text("Fixed.".into())
        ]
    );
    // Reasoning is never sent back as assistant text.
    let mut req = request();
    req.messages
        .push(Message::assistant(turn.text.clone(), vec![]));
    req.messages.push(Message::user("Thanks."));
    let body2 = format!(
        "{}data: [DONE]\n\n",
        sse(&[oa_chunk(json!({"content": "ok"}), Some("stop"))])
    );
    let server2 = serve(vec![sse_reply(&body2)]).await;
    ok(run(&mut openai(&server2), &req).await.0);
    let sent = server2.seen()[0].body.to_string();
    assert!(!sent.contains("fails."), "{sent}");
}

#[tokio::test]
async fn openai_error_mid_stream_after_200_is_transient() {
    let body = sse(&[
        oa_chunk(json!({"content": "Working"}), None),
        json!({"error": {"message": "The server had an error\u{1b}[2J while processing", "type": "server_error"}}),
    ]);
    let server = serve(vec![sse_reply(&body)]).await;
    let (r, events) = run(&mut openai(&server), &request()).await;
    let t = transient(r, Cause::ErrorEvent);
    assert!(t.message.contains("server_error"), "{}", t.message);
    assert!(
        !t.message.contains('\u{1b}'),
        "control characters escaped: {}",
        t.message
    );
    assert!(
        !events.iter().any(|e| matches!(e, StreamEvent::ToolCall(_))),
        "no call reported from a failed stream"
    );
    assert_eq!(
        server.seen().len(),
        1,
        "the provider asks once; the session retries"
    );
    // One whose type says the request is refused is permanent.
    let body = sse(&[json!({"error": {"message": "bad", "type": "invalid_request_error"}})]);
    let server = serve(vec![sse_reply(&body)]).await;
    assert!(matches!(
        run(&mut openai(&server), &request()).await.0,
        Err(ProviderError::Permanent(_))
    ));
}

#[tokio::test]
async fn openai_stream_that_ends_without_done_is_cut_off() {
    let body = sse(&[
        oa_chunk(
            json!({"content": "Half", "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}}]}),
            None,
        ),
        oa_chunk(json!({}), Some("tool_calls")),
    ]);
    for framing in [Framing::Close, Framing::Chunked, Framing::ChunkedAbort] {
        let server = serve(vec![stream("text/event-stream", &body, 5, framing)]).await;
        let (r, events) = run(&mut openai(&server), &request()).await;
        match r {
            Err(ProviderError::Transient(t))
                if matches!(t.cause, Cause::CutOff | Cause::Connection) => {}
            other => panic!("expected a cut stream, got {other:?}"),
        }
        // The call was complete in the stream, but the stream was not:
        // it is never reported.
        assert!(
            !events.iter().any(|e| matches!(e, StreamEvent::ToolCall(_))),
            "{framing:?}: no call reported from a cut stream"
        );
    }
    // Cut inside an event's JSON: a cut stream too, not garbage.
    let cut = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Ha";
    let server = serve(vec![stream("text/event-stream", cut, 5, Framing::Close)]).await;
    transient(run(&mut openai(&server), &request()).await.0, Cause::CutOff);
}

#[tokio::test]
async fn openai_truncated_tool_json_is_never_ok() {
    // Cut off by the length limit, and the server's `finish_reason:
    // tool_calls` on a call cut off all the same.
    for finish in ["length", "tool_calls"] {
        let body = format!(
            "{}data: [DONE]\n\n",
            sse(&[
                oa_chunk(
                    json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "write", "arguments": "{\"path\": \"a\", \"content\": \"fn ma"}}]}),
                    None
                ),
                oa_chunk(json!({}), Some(finish)),
            ])
        );
        let server = serve(vec![sse_reply(&body)]).await;
        let turn = ok(run(&mut openai(&server), &request()).await.0);
        assert_eq!(turn.truncated, finish == "length");
        assert_eq!(turn.tool_calls.len(), 1);
        assert_refused(&turn.tool_calls[0]);
        assert!(turn.tool_calls[0].raw_arguments.ends_with("fn ma"));
    }
    // A call that happens to parse in a truncated turn is refused too.
    let body = format!(
        "{}data: [DONE]\n\n",
        sse(&[
            oa_chunk(
                json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}}]}),
                None
            ),
            oa_chunk(json!({}), Some("length")),
        ])
    );
    let server = serve(vec![sse_reply(&body)]).await;
    let turn = ok(run(&mut openai(&server), &request()).await.0);
    assert_refused(&turn.tool_calls[0]);
}

#[tokio::test]
async fn openai_429_is_transient_with_the_wait_asked_and_5xx_too() {
    let server = serve(vec![error_reply(
        429,
        vec![("retry-after", "1".into())],
        json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}),
    )])
    .await;
    let t = transient(
        run(&mut openai(&server), &request()).await.0,
        Cause::RateLimited,
    );
    assert_eq!(t.retry_after, Some(Duration::from_secs(1)));
    assert_eq!(t.status, Some(429));
    assert!(t.message.contains("Rate limit reached"), "{}", t.message);
    assert_eq!(server.seen().len(), 1, "the provider asks once");

    // The reset headers when there is no Retry-After.
    let server = serve(vec![error_reply(
        429,
        vec![
            ("x-ratelimit-reset-requests", "6m0s".into()),
            ("x-ratelimit-reset-tokens", "1.5s".into()),
        ],
        json!({"error": {"message": "slow down", "code": "rate_limit_exceeded"}}),
    )])
    .await;
    let t = transient(
        run(&mut openai(&server), &request()).await.0,
        Cause::RateLimited,
    );
    assert_eq!(t.retry_after, Some(Duration::from_millis(1500)));

    for status in [500, 502, 503] {
        let server = serve(vec![error_reply(status, vec![], json!({"error": "busy"}))]).await;
        let t = transient(
            run(&mut openai(&server), &request()).await.0,
            Cause::ServerError,
        );
        assert_eq!(t.status, Some(status));
    }
}

#[tokio::test]
async fn openai_401_is_permanent_at_once() {
    let server = serve(vec![error_reply(
        401,
        vec![],
        json!({"error": {"message": "Incorrect API key provided: sk-te***\u{7}", "type": "invalid_request_error", "code": "invalid_api_key"}}),
    )])
    .await;
    match run(&mut openai(&server), &request()).await.0 {
        Err(ProviderError::Permanent(m)) => {
            assert!(m.contains("Incorrect API key"), "{m}");
            assert!(m.contains("401"), "{m}");
            assert!(!m.contains('\u{7}'), "{m}");
        }
        other => panic!("expected Permanent, got {other:?}"),
    }
    assert_eq!(server.seen().len(), 1, "no retry");
}

#[tokio::test]
async fn openai_429_insufficient_quota_and_404_model_are_permanent() {
    let server = serve(vec![error_reply(
        429,
        vec![("retry-after", "1".into())],
        json!({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}}),
    )])
    .await;
    match run(&mut openai(&server), &request()).await.0 {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("quota"), "{m}"),
        other => panic!("expected Permanent, got {other:?}"),
    }
    assert_eq!(server.seen().len(), 1);

    // A weekly cap is not a rate limit: waiting seconds cannot help.
    let server = serve(vec![error_reply(
        429,
        vec![("retry-after", "1".into())],
        json!({"error": "you have reached your weekly usage limit"}),
    )])
    .await;
    match run(&mut openai(&server), &request()).await.0 {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("weekly"), "{m}"),
        other => panic!("expected Permanent, got {other:?}"),
    }
    assert_eq!(server.seen().len(), 1);

    let server = serve(vec![error_reply(
        404,
        vec![],
        json!({"error": {"message": "The model `nope` does not exist", "type": "invalid_request_error", "code": "model_not_found"}}),
    )])
    .await;
    match run(&mut openai(&server), &request()).await.0 {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("does not exist"), "{m}"),
        other => panic!("expected Permanent, got {other:?}"),
    }
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn openai_second_turn_sends_calls_and_results_back_in_shape() {
    let body = format!(
        "{}data: [DONE]\n\n",
        sse(&[oa_chunk(json!({"content": "ok"}), Some("stop"))])
    );
    let server = serve(vec![sse_reply(&body)]).await;
    ok(run(&mut openai(&server), &second_turn_request()).await.0);
    let m = &server.seen()[0].body["messages"];
    assert_eq!(m[2]["role"], "assistant");
    assert_eq!(m[2]["content"], "Let me look.");
    let calls = &m[2]["tool_calls"];
    assert_eq!(calls[0]["id"], "call_a");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "read");
    let a = calls[0]["function"]["arguments"]
        .as_str()
        .expect("arguments is a string");
    assert_eq!(
        serde_json::from_str::<Value>(a).ok(),
        Some(json!({"path": "src/lib.rs"}))
    );
    // The refused call goes back with valid JSON; its result says why.
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "call_a", "content": "pub fn add(a: i32) -> i32 { a - 1 }"})
    );
    assert_eq!(m[4]["role"], "tool");
    assert_eq!(m[4]["tool_call_id"], "call_b");
    assert_eq!(m.as_array().map(Vec::len), Some(5));
}

#[tokio::test]
async fn openai_without_a_key_sends_no_authorization() {
    let body = format!(
        "{}data: [DONE]\n\n",
        sse(&[oa_chunk(json!({"content": "ok"}), Some("stop"))])
    );
    let server = serve(vec![sse_reply(&body)]).await;
    let mut p = OpenAiProvider::new(Some(&format!("{}/v1/", server.base)), None).expect("provider");
    ok(run(&mut p, &request()).await.0);
    let seen = server.seen();
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].header("authorization"), None);
}

#[tokio::test]
async fn openai_without_streaming_reads_one_json_answer() {
    let answer = json!({
        "id": "chatcmpl-2", "object": "chat.completion", "model": "qwen3",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "", "reasoning_content": "think",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a.rs\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"b.rs\"}"}}]}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}
    });
    let server = serve(vec![error_reply(200, vec![], answer)]).await;
    let mut p = openai(&server).with_stream(false);
    let turn = ok(run(&mut p, &request()).await.0);
    assert_eq!(turn.reasoning, "think");
    assert_eq!(turn.text, "");
    assert_eq!(turn.tool_calls.len(), 2);
    assert_eq!(turn.tool_calls[1].id, "call_2");
    assert_eq!(args(&turn.tool_calls[1]), json!({"path": "b.rs"}));
    assert_eq!(
        (turn.usage.input_tokens, turn.usage.output_tokens),
        (50, 20)
    );
    let b = &server.seen()[0].body;
    assert_eq!(b["stream"], false);
    assert!(b.get("stream_options").is_none());
}

/// The stream llama.cpp's llama-server (b11434) sent for a plain text
/// turn, as recorded in docs/real-server.md: a first delta whose content
/// is null, the finish reason alone with an empty delta, the usage in a
/// last chunk with no choices and an extra `timings` object.
#[tokio::test]
async fn openai_llama_server_stream_as_recorded() {
    let base = json!({"created": 1796060189, "id": "chatcmpl-jAmX", "model": "smollm2-135m",
                      "system_fingerprint": "b0-unknown", "object": "chat.completion.chunk"});
    let with = |extra: Value| {
        let mut v = base.clone();
        if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    };
    let delta = |d: Value, f: Value| {
        with(json!({"choices": [{"finish_reason": f, "index": 0, "delta": d}]}))
    };
    let mut body = sse(&[
        delta(json!({"role": "assistant", "content": null}), Value::Null),
        delta(json!({"content": "The"}), Value::Null),
        delta(
            json!({"content": " capital of France is Paris."}),
            Value::Null,
        ),
        delta(json!({}), json!("stop")),
        with(
            json!({"choices": [], "usage": {"completion_tokens": 8, "prompt_tokens": 36,
            "total_tokens": 44, "prompt_tokens_details": {"cached_tokens": 0}},
            "timings": {"cache_n": 0, "prompt_n": 36, "prompt_ms": 318.4, "predicted_n": 8,
                        "predicted_ms": 240.1, "predicted_per_second": 33.3}}),
        ),
    ]);
    body.push_str("data: [DONE]\n\n");
    let server = serve(vec![sse_reply(&body)]).await;
    let mut p = openai(&server);
    let (r, events) = run(&mut p, &request()).await;
    let turn = ok(r);
    assert_eq!(turn.text, "The capital of France is Paris.");
    assert_eq!(
        events,
        vec![
            StreamEvent::Text("The".into()),
            StreamEvent::Text(" capital of France is Paris.".into())
        ]
    );
    assert!(turn.tool_calls.is_empty());
    assert_eq!(turn.stop_reason.as_deref(), Some("stop"));
    assert!(!turn.truncated);
    assert_eq!((turn.usage.input_tokens, turn.usage.output_tokens), (36, 8));
}

/// A streamed tool call as llama.cpp's llama-server (b11434) sent it to
/// this client, recorded byte for byte (docs/real-server.md, "Session
/// 21": Qwen2.5-Coder-0.5B-Instruct with a chat template that writes
/// calls as a json code block): the id, the type and the whole name only
/// in the call's first fragment, which also starts the arguments; then
/// argument fragments with only `index`, keeping the model's own
/// whitespace; `finish_reason: tool_calls` alone with an empty delta;
/// the usage in a last chunk with no choices. Then the second turn: the
/// call goes back with the server's id and its result, and the server's
/// recorded answer to that (another call) is read the same way.
#[tokio::test]
async fn openai_llama_server_tool_call_stream_as_recorded() {
    let first = include_str!("recorded/llama-server-b11434-qwen2.5-coder-0.5b-tool-call.sse");
    let second = include_str!("recorded/llama-server-b11434-qwen2.5-coder-0.5b-after-result.sse");
    let server = serve(vec![sse_reply(first), sse_reply(second)]).await;
    let mut p = openai(&server);
    let mut req = request();
    let (r, events) = run(&mut p, &req).await;
    let turn = ok(r);
    assert_eq!(turn.text, "");
    assert_eq!(turn.tool_calls.len(), 1, "{:?}", turn.tool_calls);
    let c = &turn.tool_calls[0];
    assert_eq!(c.id, "PGFKTFsAPYa4gEHbEusLcVTD9K8zTGoj");
    assert_eq!(c.name, "read");
    assert_eq!(
        c.raw_arguments,
        "{\n    \"path\": \"/home/user/src/lib.rs\"\n  }"
    );
    assert_eq!(args(c), json!({"path": "/home/user/src/lib.rs"}));
    assert_eq!(events, vec![StreamEvent::ToolCall(c.clone())]);
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
    assert!(!turn.truncated);
    assert_eq!(
        (turn.usage.input_tokens, turn.usage.output_tokens),
        (193, 32)
    );
    // 15 chunks (12 of them call fragments) and the end marker, as sent.
    assert_eq!(turn.raw.len(), 16);

    req.messages.push(Message::assistant(
        turn.text.clone(),
        turn.tool_calls.clone(),
    ));
    req.messages.push(Message::tool_result(
        c,
        "pub fn add(a: i32, b: i32) -> i32 { a + b }",
    ));
    let turn2 = ok(run(&mut p, &req).await.0);
    assert_eq!(turn2.tool_calls.len(), 1);
    assert_eq!(turn2.tool_calls[0].id, "GynXPMsbq0rx5CB1ZBMqCEgAjRWeqYfC");
    assert_eq!(
        args(&turn2.tool_calls[0]),
        json!({"path": "/home/user/src/lib.rs"})
    );
    assert_eq!(
        (turn2.usage.input_tokens, turn2.usage.output_tokens),
        (258, 24)
    );

    // What the second request carried: the call with the server's id and
    // arguments re-serialised as JSON text, the result under that id.
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].body.get("tool_choice").is_none());
    let msgs = seen[1].body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let n = msgs.len();
    assert!(n >= 2, "{msgs:?}");
    let call = &msgs[n - 2]["tool_calls"][0];
    assert_eq!(call["id"], "PGFKTFsAPYa4gEHbEusLcVTD9K8zTGoj");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "read");
    let sent: Value = call["function"]["arguments"]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or(Value::Null);
    assert_eq!(sent, json!({"path": "/home/user/src/lib.rs"}));
    assert_eq!(msgs[n - 1]["role"], "tool");
    assert_eq!(
        msgs[n - 1]["tool_call_id"],
        "PGFKTFsAPYa4gEHbEusLcVTD9K8zTGoj"
    );
}

/// Two parallel calls in one streamed turn, as llama-server (b11434)
/// sent them (Qwen2.5-Coder-1.5B-Instruct, the json-fence template,
/// answering the history of `real_server_accepts_a_history_with_calls_and_results`):
/// the second call starts with `index: 1` and its own id after the first
/// call's last fragment; every fragment after that carries only
/// `index: 1`.
#[tokio::test]
async fn openai_llama_server_parallel_tool_calls_as_recorded() {
    let body = include_str!("recorded/llama-server-b11434-qwen2.5-coder-1.5b-parallel-calls.sse");
    let server = serve(vec![sse_reply(body)]).await;
    let (r, events) = run(&mut openai(&server), &request()).await;
    let turn = ok(r);
    assert_eq!(turn.text, "");
    let ids: Vec<&str> = turn.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "famuSyxwxh4wD97UUWgumH8OKZiWfYKE",
            "lO9JDRTvD9qsFwSJoVP4sa6M4p5tV6SM"
        ]
    );
    for c in &turn.tool_calls {
        assert_eq!(c.name, "read");
        assert_eq!(c.raw_arguments, "{\"path\": \"src/lib.rs\"}");
        assert_eq!(args(c), json!({"path": "src/lib.rs"}));
    }
    let calls: Vec<StreamEvent> = turn
        .tool_calls
        .iter()
        .cloned()
        .map(StreamEvent::ToolCall)
        .collect();
    assert_eq!(events, calls);
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
    assert_eq!(
        (turn.usage.input_tokens, turn.usage.output_tokens),
        (303, 44)
    );
}

#[tokio::test]
async fn connection_refused_is_transient() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let mut p = OpenAiProvider::new(Some(&format!("http://{addr}/v1")), None).expect("provider");
    match run(&mut p, &request()).await.0 {
        Err(ProviderError::Transient(t)) if t.cause == Cause::Connection => {}
        other => panic!("expected a transient connection failure, got {other:?}"),
    }
}

// ---------------------------------------------------------------- Ollama

fn ollama(server: &Server) -> OllamaProvider {
    OllamaProvider::new(Some(&server.base), None).expect("provider")
}

fn nd(lines: &[Value]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn ol_msg(message: Value) -> Value {
    json!({"model": "qwen3", "created_at": "2026-11-01T00:00:00Z", "message": message, "done": false})
}

fn ol_done(reason: &str) -> Value {
    json!({"model": "qwen3", "created_at": "2026-11-01T00:00:01Z", "message": {"role": "assistant", "content": ""},
           "done": true, "done_reason": reason, "total_duration": 1000, "prompt_eval_count": 26, "eval_count": 12})
}

#[tokio::test]
async fn ollama_text_thinking_and_a_whole_tool_call_over_ndjson() {
    let body = nd(&[
        ol_msg(json!({"role": "assistant", "content": "", "thinking": "Read it "})),
        ol_msg(json!({"role": "assistant", "content": "", "thinking": "first."})),
        ol_msg(json!({"role": "assistant", "content": "Reading"})),
        ol_msg(
            json!({"role": "assistant", "content": " now.", "tool_calls": [
            {"function": {"name": "read", "arguments": {"path": "src/lib.rs"}}}]}),
        ),
        ol_done("stop"),
    ]);
    let server = serve(vec![ndjson_reply(&body)]).await;
    let (r, events) = run(&mut ollama(&server), &request()).await;
    let turn = ok(r);
    assert_eq!(turn.text, "Reading now.");
    assert_eq!(turn.reasoning, "Read it first.");
    assert_eq!(turn.tool_calls.len(), 1);
    let c = &turn.tool_calls[0];
    assert_eq!(c.name, "read");
    assert!(!c.id.is_empty(), "a missing id is made up");
    assert_eq!(args(c), json!({"path": "src/lib.rs"}));
    assert_eq!(
        (turn.usage.input_tokens, turn.usage.output_tokens),
        (26, 12)
    );
    assert_eq!(turn.raw.len(), 5);
    assert!(matches!(events.last(), Some(StreamEvent::ToolCall(_))));
    assert!(!events
        .iter()
        .any(|e| matches!(e, StreamEvent::Text(t) if t.contains("first"))));
    let seen = server.seen();
    assert_eq!(seen[0].path, "/api/chat");
    let b = &seen[0].body;
    assert_eq!(b["stream"], true);
    assert_eq!(b["options"]["num_ctx"], 16384);
    assert_eq!(b["options"]["num_predict"], 512);
    assert_eq!(b["tools"][0]["function"]["name"], "read");
    assert_eq!(b["messages"][0]["role"], "system");
}

#[tokio::test]
async fn ollama_two_parallel_calls_and_num_ctx_configurable() {
    let body = nd(&[
        ol_msg(json!({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "read", "arguments": {"path": "a.rs"}}},
            {"id": "call_7", "function": {"index": 1, "name": "read", "arguments": {"path": "b.rs"}}}]})),
        ol_done("stop"),
    ]);
    let server = serve(vec![ndjson_reply(&body)]).await;
    let mut p = ollama(&server).with_num_ctx(32768);
    let turn = ok(run(&mut p, &request()).await.0);
    assert_eq!(turn.tool_calls.len(), 2);
    assert_eq!(args(&turn.tool_calls[0]), json!({"path": "a.rs"}));
    assert_eq!(turn.tool_calls[1].id, "call_7");
    assert_eq!(args(&turn.tool_calls[1]), json!({"path": "b.rs"}));
    assert_ne!(turn.tool_calls[0].id, turn.tool_calls[1].id);
    assert_eq!(server.seen()[0].body["options"]["num_ctx"], 32768);
}

#[tokio::test]
async fn ollama_error_mid_stream_after_200_is_transient() {
    let body = nd(&[
        ol_msg(json!({"role": "assistant", "content": "Hm"})),
        json!({"error": "an error was encountered while running the model: unexpected EOF"}),
    ]);
    let server = serve(vec![ndjson_reply(&body)]).await;
    match run(&mut ollama(&server), &request()).await.0 {
        Err(ProviderError::Transient(t)) if t.cause == Cause::ErrorEvent => {
            assert!(t.message.contains("unexpected EOF"), "{}", t.message)
        }
        other => panic!("expected an error event, got {other:?}"),
    }
}

#[tokio::test]
async fn ollama_stream_that_ends_without_done_is_cut_off() {
    let body = nd(&[ol_msg(
        json!({"role": "assistant", "content": "Half", "tool_calls": [{"function": {"name": "read", "arguments": {"path": "a"}}}]}),
    )]);
    for framing in [Framing::Close, Framing::ChunkedAbort] {
        let server = serve(vec![stream("application/x-ndjson", &body, 9, framing)]).await;
        let (r, events) = run(&mut ollama(&server), &request()).await;
        match r {
            Err(ProviderError::Transient(t))
                if matches!(t.cause, Cause::CutOff | Cause::Connection) => {}
            other => panic!("expected a cut stream, got {other:?}"),
        }
        assert!(
            !events.iter().any(|e| matches!(e, StreamEvent::ToolCall(_))),
            "{framing:?}: a whole call in a cut stream is never reported"
        );
    }
    // Cut inside a line: a cut stream, not garbage.
    let server = serve(vec![stream(
        "application/x-ndjson",
        "{\"message\": {\"content\": \"Ha",
        9,
        Framing::Close,
    )])
    .await;
    transient(run(&mut ollama(&server), &request()).await.0, Cause::CutOff);
}

#[tokio::test]
async fn ollama_truncated_or_string_arguments_are_refused() {
    let body = nd(&[
        ol_msg(json!({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "write", "arguments": "{\"path\": \"a\", \"cont"}},
            {"function": {"name": "read", "arguments": ["a.rs"]}}]})),
        ol_done("stop"),
    ]);
    let server = serve(vec![ndjson_reply(&body)]).await;
    let turn = ok(run(&mut ollama(&server), &request()).await.0);
    assert_refused(&turn.tool_calls[0]);
    assert_refused(&turn.tool_calls[1]);

    let body = nd(&[
        ol_msg(json!({"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "read", "arguments": {"path": "a.rs"}}}]})),
        ol_done("length"),
    ]);
    let server = serve(vec![ndjson_reply(&body)]).await;
    let turn = ok(run(&mut ollama(&server), &request()).await.0);
    assert!(turn.truncated);
    assert_refused(&turn.tool_calls[0]);
}

#[tokio::test]
async fn ollama_404_model_not_found_is_permanent_and_503_is_transient() {
    let server = serve(vec![error_reply(
        404,
        vec![],
        json!({"error": "model \"qwen9\" not found, try pulling it first"}),
    )])
    .await;
    match run(&mut ollama(&server), &request()).await.0 {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("not found"), "{m}"),
        other => panic!("expected Permanent, got {other:?}"),
    }
    assert_eq!(server.seen().len(), 1);

    let server = serve(vec![error_reply(
        503,
        vec![],
        json!({"error": "server busy, please try again"}),
    )])
    .await;
    let t = transient(
        run(&mut ollama(&server), &request()).await.0,
        Cause::ServerError,
    );
    assert!(t.message.contains("server busy"), "{}", t.message);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn ollama_second_turn_sends_arguments_as_objects() {
    let server = serve(vec![ndjson_reply(&nd(&[ol_done("stop")]))]).await;
    ok(run(&mut ollama(&server), &second_turn_request()).await.0);
    let m = &server.seen()[0].body["messages"];
    assert_eq!(m[2]["role"], "assistant");
    assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "read");
    assert_eq!(
        m[2]["tool_calls"][0]["function"]["arguments"],
        json!({"path": "src/lib.rs"}),
        "an object, not a string"
    );
    assert_eq!(m[2]["tool_calls"][1]["function"]["arguments"], json!({}));
    assert_eq!(m[3]["role"], "tool");
    assert_eq!(m[3]["content"], "pub fn add(a: i32) -> i32 { a - 1 }");
    assert_eq!(m[3]["tool_name"], "read");
    assert_eq!(m[4]["role"], "tool");
}

// ---------------------------------------------------------------- Anthropic

fn anthropic(server: &Server) -> AnthropicProvider {
    AnthropicProvider::new(
        Some(&format!("{}/v1", server.base)),
        Some("sk-ant-test".into()),
    )
    .expect("provider")
}

fn an_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
           "content": [], "model": "claude-test", "stop_reason": null, "stop_sequence": null,
           "usage": {"input_tokens": 472, "output_tokens": 2}}})
}

fn an_block_start(index: u64, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn an_delta(index: u64, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn an_stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn an_message_delta(reason: &str, output: u64) -> Value {
    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
           "usage": {"output_tokens": output}})
}

fn an_tool(index: u64, id: &str, pieces: &[&str]) -> Vec<Value> {
    let mut v = vec![an_block_start(
        index,
        json!({"type": "tool_use", "id": id, "name": "read", "input": {}}),
    )];
    v.extend(pieces.iter().map(|p| {
        an_delta(
            index,
            json!({"type": "input_json_delta", "partial_json": p}),
        )
    }));
    v.push(an_stop(index));
    v
}

#[tokio::test]
async fn anthropic_thinking_text_and_a_tool_use_across_many_deltas() {
    let mut events = vec![
        an_start(),
        an_block_start(0, json!({"type": "thinking", "thinking": ""})),
        an_delta(
            0,
            json!({"type": "thinking_delta", "thinking": "The add function "}),
        ),
        json!({"type": "ping"}),
        an_delta(
            0,
            json!({"type": "thinking_delta", "thinking": "subtracts."}),
        ),
        an_delta(
            0,
            json!({"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
        ),
        an_stop(0),
        an_block_start(1, json!({"type": "text", "text": ""})),
        an_delta(1, json!({"type": "text_delta", "text": "Let me "})),
        an_delta(1, json!({"type": "text_delta", "text": "read it."})),
        an_stop(1),
    ];
    events.extend(an_tool(
        2,
        "toolu_01",
        &["", "{\"pa", "th\": \"sr", "c/lib.rs\"}"],
    ));
    events.push(an_message_delta("tool_use", 89));
    events.push(json!({"type": "ping"}));
    events.push(json!({"type": "message_stop"}));
    let server = serve(vec![sse_reply(&named_sse(&events))]).await;
    let (r, seen_events) = run(&mut anthropic(&server), &request()).await;
    let turn = ok(r);
    assert_eq!(turn.text, "Let me read it.");
    assert_eq!(turn.reasoning, "The add function subtracts.");
    assert_eq!(turn.tool_calls.len(), 1);
    assert_eq!(turn.tool_calls[0].id, "toolu_01");
    assert_eq!(args(&turn.tool_calls[0]), json!({"path": "src/lib.rs"}));
    assert_eq!(
        (turn.usage.input_tokens, turn.usage.output_tokens),
        (472, 89)
    );
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(turn.raw.len(), events.len());
    assert_eq!(
        seen_events[0],
        StreamEvent::Reasoning("The add function ".into())
    );
    assert!(!seen_events
        .iter()
        .any(|e| matches!(e, StreamEvent::Text(t) if t.contains("subtracts"))));

    let seen = server.seen();
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(seen[0].header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    let b = &seen[0].body;
    assert_eq!(b["system"], "You are a careful agent.");
    assert_eq!(b["stream"], true);
    assert_eq!(b["max_tokens"], 512);
    assert_eq!(
        b["messages"].as_array().map(Vec::len),
        Some(1),
        "no system message in messages"
    );
    assert_eq!(b["messages"][0]["role"], "user");
    assert_eq!(b["tools"][0]["name"], "read");
    assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
}

#[tokio::test]
async fn anthropic_two_parallel_tool_uses() {
    let mut events = vec![an_start()];
    events.extend(an_tool(0, "toolu_a", &["{\"path\":", " \"a.rs\"}"]));
    events.extend(an_tool(1, "toolu_b", &["{\"path\":", " \"b.rs\"}"]));
    events.push(an_message_delta("tool_use", 40));
    events.push(json!({"type": "message_stop"}));
    let server = serve(vec![sse_reply(&named_sse(&events))]).await;
    let turn = ok(run(&mut anthropic(&server), &request()).await.0);
    let ids: Vec<&str> = turn.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["toolu_a", "toolu_b"]);
    assert_eq!(args(&turn.tool_calls[1]), json!({"path": "b.rs"}));
}

#[tokio::test]
async fn anthropic_error_event_mid_stream_after_200_is_transient() {
    let events = vec![
        an_start(),
        an_block_start(0, json!({"type": "text", "text": ""})),
        an_delta(0, json!({"type": "text_delta", "text": "Hel"})),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ];
    let server = serve(vec![sse_reply(&named_sse(&events))]).await;
    match run(&mut anthropic(&server), &request()).await.0 {
        Err(ProviderError::Transient(t)) if t.cause == Cause::ErrorEvent => {
            let m = &t.message;
            assert!(
                m.contains("overloaded_error") && m.contains("Overloaded"),
                "{m}"
            )
        }
        other => panic!("expected an error event, got {other:?}"),
    }
}

#[tokio::test]
async fn anthropic_stream_without_message_stop_is_cut_off() {
    let mut events = vec![an_start()];
    events.extend(an_tool(0, "toolu_a", &["{\"path\": \"a.rs\"}"]));
    events.push(an_message_delta("tool_use", 10));
    for framing in [Framing::Close, Framing::Chunked, Framing::ChunkedAbort] {
        let server = serve(vec![stream(
            "text/event-stream",
            &named_sse(&events),
            11,
            framing,
        )])
        .await;
        let (r, events) = run(&mut anthropic(&server), &request()).await;
        match r {
            Err(ProviderError::Transient(t))
                if matches!(t.cause, Cause::CutOff | Cause::Connection) => {}
            other => panic!("expected a cut stream, got {other:?}"),
        }
        assert!(
            !events.iter().any(|e| matches!(e, StreamEvent::ToolCall(_))),
            "{framing:?}: a whole tool_use in a cut stream is never reported"
        );
    }
}

#[tokio::test]
async fn anthropic_max_tokens_in_a_tool_use_leaves_it_refused() {
    let mut events = vec![an_start()];
    events.extend(an_tool(
        0,
        "toolu_a",
        &["{\"path\": \"a.rs\", \"content\": \"fn m"],
    ));
    events.push(an_message_delta("max_tokens", 512));
    events.push(json!({"type": "message_stop"}));
    let server = serve(vec![sse_reply(&named_sse(&events))]).await;
    let turn = ok(run(&mut anthropic(&server), &request()).await.0);
    assert!(turn.truncated);
    assert_eq!(turn.tool_calls.len(), 1);
    assert_refused(&turn.tool_calls[0]);
    assert_eq!(
        turn.tool_calls[0].raw_arguments,
        "{\"path\": \"a.rs\", \"content\": \"fn m"
    );
}

#[tokio::test]
async fn anthropic_429_retry_after_and_529_overloaded_are_transient() {
    let server = serve(vec![error_reply(
        429,
        vec![("retry-after", "1".into())],
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}),
    )])
    .await;
    let t = transient(
        run(&mut anthropic(&server), &request()).await.0,
        Cause::RateLimited,
    );
    assert_eq!(t.retry_after, Some(Duration::from_secs(1)));
    let server = serve(vec![error_reply(
        529,
        vec![],
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    )])
    .await;
    let t = transient(
        run(&mut anthropic(&server), &request()).await.0,
        Cause::ServerError,
    );
    assert_eq!(t.status, Some(529));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn anthropic_401_and_403_are_permanent_at_once() {
    for (status, kind) in [(401, "authentication_error"), (403, "permission_error")] {
        let server = serve(vec![error_reply(
            status,
            vec![],
            json!({"type": "error", "error": {"type": kind, "message": "invalid x-api-key"}}),
        )])
        .await;
        match run(&mut anthropic(&server), &request()).await.0 {
            Err(ProviderError::Permanent(m)) => assert!(m.contains(kind), "{m}"),
            other => panic!("expected Permanent, got {other:?}"),
        }
        assert_eq!(server.seen().len(), 1);
    }
}

#[tokio::test]
async fn anthropic_second_turn_sends_tool_results_as_blocks_in_one_user_message() {
    let mut events = vec![an_start()];
    events.push(an_message_delta("end_turn", 1));
    events.push(json!({"type": "message_stop"}));
    let server = serve(vec![sse_reply(&named_sse(&events))]).await;
    ok(run(&mut anthropic(&server), &second_turn_request()).await.0);
    let m = &server.seen()[0].body["messages"];
    assert_eq!(m.as_array().map(Vec::len), Some(3), "{m}");
    assert_eq!(m[1]["role"], "assistant");
    assert_eq!(
        m[1]["content"][0],
        json!({"type": "text", "text": "Let me look."})
    );
    assert_eq!(
        m[1]["content"][1],
        json!({"type": "tool_use", "id": "call_a", "name": "read", "input": {"path": "src/lib.rs"}})
    );
    assert_eq!(m[1]["content"][2]["input"], json!({}));
    assert_eq!(m[2]["role"], "user");
    assert_eq!(
        m[2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "call_a", "content": "pub fn add(a: i32) -> i32 { a - 1 }"})
    );
    assert_eq!(m[2]["content"][1]["tool_use_id"], "call_b");
}

// ---------------------------------------------------------------- script

fn script_request(last_result: Option<&str>) -> TurnRequest {
    let mut req = request();
    if let Some(r) = last_result {
        let call = ToolCall {
            id: "script_1_1".into(),
            name: "bash".into(),
            arguments: Ok(Default::default()),
            raw_arguments: "{}".into(),
        };
        req.messages
            .push(Message::assistant("", vec![call.clone()]));
        req.messages.push(Message::tool_result(&call, r));
    }
    req
}

#[tokio::test]
async fn script_replays_turns_then_ends() {
    let mut p = ScriptProvider::from_json(
        r#"{"turns": [
            {"reasoning": "look first", "text": "Reading.",
             "tool_calls": [{"name": "read", "arguments": {"path": "src/lib.rs"}}],
             "usage": {"input_tokens": 120, "output_tokens": 12}},
            {"text": "Done."}
        ]}"#,
    )
    .expect("script");
    let (r, events) = run(&mut p, &script_request(None)).await;
    let t1 = ok(r);
    assert_eq!(t1.text, "Reading.");
    assert_eq!(t1.reasoning, "look first");
    assert_eq!(t1.tool_calls[0].name, "read");
    assert_eq!(t1.tool_calls[0].id, "script_1_1");
    assert_eq!(args(&t1.tool_calls[0]), json!({"path": "src/lib.rs"}));
    assert_eq!((t1.usage.input_tokens, t1.usage.output_tokens), (120, 12));
    assert_eq!(events[0], StreamEvent::Reasoning("look first".into()));
    assert_eq!(events.len(), 3);
    let t2 = ok(run(&mut p, &script_request(None)).await.0);
    assert_eq!(t2.text, "Done.");
    assert!(t2.tool_calls.is_empty());
    assert!(t2.usage.input_tokens > 0, "usage estimated when not given");
    let t3 = ok(run(&mut p, &script_request(None)).await.0);
    assert_eq!(t3.text, "(script ended)");
    assert!(t3.tool_calls.is_empty());
}

#[tokio::test]
async fn script_malformed_and_truncated_calls_are_refused() {
    let mut p = ScriptProvider::from_json(
        r#"[
            {"tool_calls": [
                {"name": "write", "raw_arguments": "{\"path\": \"a\", \"content\": \"x"},
                {"name": "read", "arguments": "src/lib.rs"},
                {"name": "read", "raw_arguments": "{\"path\": \"ok.rs\"}"}]},
            {"truncated": true, "tool_calls": [{"name": "read", "arguments": {"path": "a"}}]}
        ]"#,
    )
    .expect("script");
    let t = ok(run(&mut p, &script_request(None)).await.0);
    assert_refused(&t.tool_calls[0]);
    assert_refused(&t.tool_calls[1]);
    assert_eq!(args(&t.tool_calls[2]), json!({"path": "ok.rs"}));
    let t = ok(run(&mut p, &script_request(None)).await.0);
    assert!(t.truncated);
    assert_refused(&t.tool_calls[0]);
}

#[tokio::test]
async fn script_expect_checks_the_last_tool_result() {
    let text = r#"{"turns": [{"expect": ["test result: ok", "1 passed"], "text": "Good."}]}"#;
    let mut p = ScriptProvider::from_json(text).expect("script");
    match run(
        &mut p,
        &script_request(Some("test result: FAILED. 0 passed")),
    )
    .await
    .0
    {
        Err(ProviderError::Malformed(m)) => {
            assert!(m.contains("test result: ok") && m.contains("FAILED"), "{m}")
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
    let mut p = ScriptProvider::from_json(text).expect("script");
    match run(&mut p, &script_request(None)).await.0 {
        Err(ProviderError::Malformed(m)) => assert!(m.contains("no tool result"), "{m}"),
        other => panic!("expected Malformed, got {other:?}"),
    }
    let mut p = ScriptProvider::from_json(text).expect("script");
    let t = ok(run(
        &mut p,
        &script_request(Some("test result: ok. 1 passed; 0 failed")),
    )
    .await
    .0);
    assert_eq!(t.text, "Good.");
}

#[tokio::test]
async fn script_with_an_unknown_field_is_refused() {
    match ScriptProvider::from_json(r#"{"turns": [{"txt": "typo"}]}"#) {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("txt"), "{m}"),
        other => panic!("expected Permanent, got {other:?}"),
    }
}

// ---------------------------------------------------------------- from_config

#[tokio::test]
async fn from_config_builds_each_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.json");
    std::fs::write(&path, r#"[{"text": "hi"}]"#).expect("write");
    let mut p = from_config("script", &path.to_string_lossy(), None, None).expect("script");
    assert_eq!(p.name(), "script");
    assert_eq!(ok(run(&mut p, &request()).await.0).text, "hi");

    let body = format!(
        "{}data: [DONE]\n\n",
        sse(&[oa_chunk(json!({"content": "hey"}), Some("stop"))])
    );
    let server = serve(vec![sse_reply(&body)]).await;
    let mut p =
        from_config("openai", "m", Some(&format!("{}/v1", server.base)), None).expect("openai");
    assert!(matches!(p, AnyProvider::OpenAi(_)));
    assert_eq!(ok(run(&mut p, &request()).await.0).text, "hey");

    for kind in ["anthropic", "ollama"] {
        assert_eq!(from_config(kind, "m", None, None).expect(kind).name(), kind);
    }
    match from_config("gemini", "m", None, None) {
        Err(ProviderError::Permanent(m)) => assert!(m.contains("openai"), "{m}"),
        other => panic!("expected Permanent, got {other:?}"),
    }
    assert!(matches!(
        from_config("script", "/nonexistent/script.json", None, None),
        Err(ProviderError::Permanent(_))
    ));
}

/// The stream reader is linear and bounded: an 8 MiB line (3.5 s when
/// every chunk was scanned from the line's start again) is read whole,
/// and a 64 MiB one (over two minutes) is refused as a malformed answer,
/// not waited out. A generous timeout turns a hang into a failure.
#[tokio::test]
async fn openai_a_long_line_is_read_in_linear_time_and_an_overlong_one_refused() {
    let text = "x".repeat(8 << 20);
    let body = sse(&[oa_chunk(
        json!({"role": "assistant", "content": text}),
        Some("stop"),
    )]) + "data: [DONE]\n\n";
    let server = serve(vec![stream(
        "text/event-stream",
        &body,
        64 << 10,
        Framing::Chunked,
    )])
    .await;
    let mut p = openai(&server);
    let (r, _) = tokio::time::timeout(Duration::from_secs(60), run(&mut p, &request()))
        .await
        .expect("an 8 MiB line hung the reader");
    assert_eq!(ok(r).text.len(), 8 << 20);

    let huge = "x".repeat(64 << 20);
    let body = format!("data: {huge}\n\ndata: [DONE]\n\n");
    drop(huge);
    let server = serve(vec![stream(
        "text/event-stream",
        &body,
        256 << 10,
        Framing::Chunked,
    )])
    .await;
    drop(body);
    let mut p = openai(&server);
    let (r, _) = tokio::time::timeout(Duration::from_secs(60), run(&mut p, &request()))
        .await
        .expect("a 64 MiB line hung the reader");
    match r {
        Err(ProviderError::Malformed(m)) => assert!(m.contains("longer than"), "{m}"),
        other => panic!(
            "a 64 MiB line was not refused as malformed: {:?}",
            other.map(|t| t.text.len())
        ),
    }
}
