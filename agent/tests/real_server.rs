//! The OpenAI-compatible provider against a real server on this machine
//! (see `docs/real-server.md`: llama.cpp's `llama-server` with a small
//! GGUF model that a registry package ships).
//!
//! Every test here is `#[ignore]`d: run them with
//!
//! ```text
//! RETIE_REAL_SERVER_URL=http://127.0.0.1:8091/v1 \
//!   cargo test -p retie-agent --test real_server -- --ignored --nocapture --test-threads 1
//! ```
//!
//! They fail loudly, never skip: asked for with `--ignored` and without
//! `RETIE_REAL_SERVER_URL`, or with a server that does not answer, they
//! fail. `RETIE_REAL_SERVER_MODEL` names the model (default
//! `smollm2-135m`; llama-server serves the one it loaded whatever the
//! name). Each test prints what came back (events, text, calls, usage,
//! stop reason, the raw stream) for the notes in the doc.
//!
//! The tool-call tests pass against Qwen2.5-Coder-0.5B-Instruct served
//! with the chat template that writes calls as a ```` ```json ```` block
//! (the form that model writes them in); see docs/real-server.md,
//! "Session 21".

use retie_agent::provider::{from_config, AnyProvider};
use retie_agent::{Message, Provider, StreamEvent, ToolCall, ToolSpec, Turn, TurnRequest};
use serde_json::json;

fn base_url() -> String {
    match std::env::var("RETIE_REAL_SERVER_URL") {
        Ok(u) if !u.trim().is_empty() => u,
        _ => panic!(
            "RETIE_REAL_SERVER_URL is not set: these tests talk to a real \
             OpenAI-compatible server (e.g. http://127.0.0.1:8091/v1); see docs/real-server.md"
        ),
    }
}

fn model() -> String {
    std::env::var("RETIE_REAL_SERVER_MODEL").unwrap_or_else(|_| "smollm2-135m".into())
}

fn provider() -> AnyProvider {
    let url = base_url();
    from_config("openai", &model(), Some(&url), None)
        .unwrap_or_else(|e| panic!("from_config(openai, {url}): {e}"))
}

fn read_tool() -> ToolSpec {
    ToolSpec {
        name: "read".into(),
        description: "Read a file of the workspace and return its text".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "the file's path"}},
            "required": ["path"],
            "additionalProperties": false,
        }),
    }
}

async fn run(p: &mut AnyProvider, req: &TurnRequest, label: &str) -> (Turn, Vec<StreamEvent>) {
    let mut events = Vec::new();
    let started = std::time::Instant::now();
    let r = p.turn(req, &mut |e| events.push(e)).await;
    let took = started.elapsed();
    let turn = match r {
        Ok(t) => t,
        Err(e) => panic!("[{label}] the real server's turn failed: {e}"),
    };
    eprintln!("==== {label} ({took:.2?})");
    let texts = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::Text(_)))
        .count();
    eprintln!("text events: {texts}");
    for e in &events {
        if !matches!(e, StreamEvent::Text(_)) {
            eprintln!("event: {e:?}");
        }
    }
    eprintln!("text: {:?}", turn.text);
    eprintln!("reasoning: {:?}", turn.reasoning);
    for c in &turn.tool_calls {
        eprintln!(
            "call: id={:?} name={:?} arguments={:?} raw={:?}",
            c.id, c.name, c.arguments, c.raw_arguments
        );
    }
    eprintln!("usage: {:?}", turn.usage);
    eprintln!(
        "stop_reason: {:?} truncated: {}",
        turn.stop_reason, turn.truncated
    );
    eprintln!("raw events: {}", turn.raw.len());
    for r in &turn.raw {
        eprintln!("raw: {r}");
    }
    (turn, events)
}

/// What every finished turn from a working server has.
fn assert_sane(turn: &Turn, events: &[StreamEvent], label: &str) {
    assert!(
        turn.stop_reason.is_some(),
        "[{label}] no finish_reason arrived"
    );
    assert!(
        turn.usage.input_tokens > 0 && turn.usage.output_tokens > 0,
        "[{label}] no usage arrived: {:?}",
        turn.usage
    );
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, turn.text, "[{label}] streamed text != turn text");
    let calls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls, turn.tool_calls,
        "[{label}] call events != turn calls"
    );
}

#[tokio::test]
#[ignore = "needs a real OpenAI-compatible server: RETIE_REAL_SERVER_URL"]
async fn real_server_plain_text_turn() {
    let mut p = provider();
    let req = TurnRequest {
        model: model(),
        messages: vec![
            Message::system("You are a helpful assistant. Answer briefly."),
            Message::user("What is the capital of France? Answer in one short sentence."),
        ],
        tools: vec![],
        max_tokens: Some(48),
    };
    let (turn, events) = run(&mut p, &req, "plain text, streamed").await;
    assert_sane(&turn, &events, "plain text");
    assert!(!turn.text.trim().is_empty(), "no text came back");
    assert!(turn.tool_calls.is_empty());
    assert!(
        turn.stop_reason.as_deref() == Some("stop")
            || (turn.stop_reason.as_deref() == Some("length") && turn.truncated),
        "unexpected stop reason {:?}",
        turn.stop_reason
    );
}

#[tokio::test]
#[ignore = "needs a real OpenAI-compatible server: RETIE_REAL_SERVER_URL"]
async fn real_server_length_limit_is_truncated() {
    let mut p = provider();
    let req = TurnRequest {
        model: model(),
        messages: vec![Message::user(
            "Write a long story about a lighthouse keeper, at least ten sentences.",
        )],
        tools: vec![],
        max_tokens: Some(5),
    };
    let (turn, events) = run(&mut p, &req, "max_tokens 5").await;
    assert_sane(&turn, &events, "max_tokens 5");
    assert_eq!(turn.stop_reason.as_deref(), Some("length"));
    assert!(turn.truncated);
    assert!(turn.usage.output_tokens <= 5, "{:?}", turn.usage);
}

fn tool_request() -> TurnRequest {
    TurnRequest {
        model: model(),
        messages: vec![
            Message::system(
                "You are a coding agent. You can only see files by calling the read tool.",
            ),
            Message::user("Call the read tool to read the file src/lib.rs."),
        ],
        tools: vec![read_tool()],
        max_tokens: Some(256),
    }
}

#[tokio::test]
#[ignore = "needs a real OpenAI-compatible server: RETIE_REAL_SERVER_URL"]
async fn real_server_tool_call_then_result() {
    let mut p = provider();
    let mut req = tool_request();
    let (turn, events) = run(&mut p, &req, "tool turn, streamed").await;
    assert_sane(&turn, &events, "tool turn");
    assert!(
        !turn.tool_calls.is_empty(),
        "the model made no tool call (text {:?})",
        turn.text
    );
    for c in &turn.tool_calls {
        assert_eq!(c.name, "read", "{c:?}");
        // The id is the server's, not one the client made up for a call
        // that came without one.
        assert!(
            !c.id.is_empty() && !c.id.starts_with("call_retie_"),
            "{c:?}"
        );
        let args = c
            .arguments
            .as_ref()
            .unwrap_or_else(|e| panic!("arguments refused: {e} (raw {:?})", c.raw_arguments));
        assert!(args.get("path").is_some_and(|v| v.is_string()), "{args:?}");
    }
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
    // The call came as `delta.tool_calls` fragments of the stream (not
    // parsed out of text by the client, not one JSON answer).
    let fragments = turn
        .raw
        .iter()
        .filter_map(|r| serde_json::from_str::<serde_json::Value>(r).ok())
        .filter(|v| v["choices"][0]["delta"]["tool_calls"].is_array())
        .count();
    assert!(fragments >= 1, "no delta.tool_calls in the stream");
    eprintln!("delta.tool_calls chunks: {fragments}");

    // Second turn: the calls and their results go back in the history;
    // the server must accept the shape (it re-renders it with its chat
    // template) and answer.
    req.messages.push(Message::assistant(
        turn.text.clone(),
        turn.tool_calls.clone(),
    ));
    for c in &turn.tool_calls {
        req.messages.push(Message::tool_result(
            c,
            "pub fn add(a: i32, b: i32) -> i32 { a + b }",
        ));
    }
    let (turn2, events2) = run(&mut p, &req, "after the tool result, streamed").await;
    assert_sane(&turn2, &events2, "after the tool result");
    assert!(
        !turn2.text.trim().is_empty() || !turn2.tool_calls.is_empty(),
        "the second turn is empty"
    );
}

#[tokio::test]
#[ignore = "needs a real OpenAI-compatible server: RETIE_REAL_SERVER_URL"]
async fn real_server_tool_call_without_streaming() {
    let p = provider();
    let mut p = match p {
        AnyProvider::OpenAi(o) => AnyProvider::OpenAi(o.with_stream(false)),
        other => panic!("from_config(openai) gave {other:?}"),
    };
    let (turn, events) = run(&mut p, &tool_request(), "tool turn, one JSON answer").await;
    assert_sane(&turn, &events, "tool turn, not streamed");
    assert!(!turn.tool_calls.is_empty(), "no tool call: {:?}", turn.text);
    for c in &turn.tool_calls {
        assert_eq!(c.name, "read");
        assert!(c.arguments.is_ok(), "{c:?}");
    }
}

/// The history retie sends after a turn with calls (one usable, one
/// refused and sent back with `{}`), as the real server's chat template
/// renders it: the server must accept it and answer.
#[tokio::test]
#[ignore = "needs a real OpenAI-compatible server: RETIE_REAL_SERVER_URL"]
async fn real_server_accepts_a_history_with_calls_and_results() {
    let mut p = provider();
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
    let mut req = tool_request();
    req.messages
        .push(Message::assistant("", vec![good.clone(), bad.clone()]));
    req.messages.push(Message::tool_result(
        &good,
        "pub fn add(a: i32, b: i32) -> i32 { a + b }",
    ));
    req.messages.push(Message::tool_result(
        &bad,
        "error: the arguments are incomplete JSON",
    ));
    req.messages
        .push(Message::user("What does the function in src/lib.rs do?"));
    req.max_tokens = Some(64);
    let (turn, events) = run(&mut p, &req, "history with calls and results").await;
    assert_sane(&turn, &events, "history with calls and results");
    assert!(!turn.text.trim().is_empty() || !turn.tool_calls.is_empty());
}
