//! What real providers do, end to end (issues 29 and 35): a mid-stream
//! error event, a 5xx, a 429 with Retry-After, a cut stream and a dropped
//! connection are retried (the turn asked again, what the failed attempt
//! streamed dropped, each attempt in the ledger with its cause); N
//! failures in a row suspend the session (exit 5) and `--resume` against
//! a healthy server finishes it; 400/401/403/404 stop at once (exit 4)
//! after one request. Local loopback servers play each wire format.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

/// One reply: status, headers, body; `drop` closes the connection before
/// the body's announced length was sent (a dropped connection).
#[derive(Clone)]
pub(crate) struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    drop: bool,
}

pub(crate) fn ok(content_type: &str, body: String) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type", content_type.to_string())],
        body,
        drop: false,
    }
}

fn status(code: u16, headers: Vec<(&'static str, String)>, body: Value) -> Reply {
    let mut h = vec![("content-type", "application/json".to_string())];
    h.extend(headers);
    Reply {
        status: code,
        headers: h,
        body: body.to_string(),
        drop: false,
    }
}

/// Each request seen: when, and its body.
pub(crate) type Seen = Arc<Mutex<Vec<(Instant, String)>>>;

/// A loopback server answering the n-th request with the n-th reply (a
/// 500 once they run out).
pub(crate) fn server(replies: Vec<Reply>) -> (String, Seen) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (i, conn) in l.incoming().enumerate() {
            let Ok(mut c) = conn else { return };
            let mut r = BufReader::new(c.try_clone().expect("clone"));
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            log.lock()
                .expect("lock")
                .push((Instant::now(), String::from_utf8_lossy(&body).into_owned()));
            let reply = replies.get(i).cloned().unwrap_or_else(|| {
                status(
                    500,
                    vec![],
                    json!({"error": "the test server has no more replies"}),
                )
            });
            let mut head = format!("HTTP/1.1 {} Test\r\nconnection: close\r\n", reply.status);
            for (k, v) in &reply.headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            if reply.drop {
                head.push_str(&format!("content-length: {}\r\n", reply.body.len() + 4096));
            }
            head.push_str("\r\n");
            let _ = c.write_all(head.as_bytes());
            let _ = c.write_all(reply.body.as_bytes());
            let _ = c.flush();
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    });
    (format!("http://{addr}"), seen)
}

// ------------------------------------------------------------ wire formats

/// OpenAI: SSE chunks; `done` adds the end marker.
pub(crate) fn oa(chunks: &[Value], done: bool) -> String {
    let mut s: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    if done {
        s.push_str("data: [DONE]\n\n");
    }
    s
}

pub(crate) fn oa_text(t: &str) -> Value {
    json!({"choices":[{"index":0,"delta":{"content":t}}]})
}

pub(crate) fn oa_call(id: &str, name: &str, args: &str) -> Value {
    json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":id,"type":"function","function":{"name":name,"arguments":args}}]}}]})
}

pub(crate) fn oa_finish(reason: &str) -> Value {
    json!({"choices":[{"index":0,"delta":{},"finish_reason":reason}],"usage":{"prompt_tokens":30,"completion_tokens":5}})
}

/// Anthropic: named SSE events.
fn an(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "event: {}\ndata: {e}\n\n",
                e["type"].as_str().unwrap_or("unknown")
            )
        })
        .collect()
}

fn an_start() -> Value {
    json!({"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"usage":{"input_tokens":30,"output_tokens":1}}})
}

fn an_text(t: &str) -> Vec<Value> {
    vec![
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":t}}),
        json!({"type":"content_block_stop","index":0}),
    ]
}

fn an_tool(index: u64, id: &str, name: &str, args: &str) -> Vec<Value> {
    vec![
        json!({"type":"content_block_start","index":index,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}}),
        json!({"type":"content_block_delta","index":index,"delta":{"type":"input_json_delta","partial_json":args}}),
        json!({"type":"content_block_stop","index":index}),
    ]
}

fn an_end(reason: &str) -> Vec<Value> {
    vec![
        json!({"type":"message_delta","delta":{"stop_reason":reason},"usage":{"output_tokens":5}}),
        json!({"type":"message_stop"}),
    ]
}

/// Ollama: NDJSON lines.
fn ol(lines: &[Value]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn ol_msg(content: &str, calls: Value) -> Value {
    json!({"message":{"role":"assistant","content":content,"tool_calls":calls},"done":false})
}

fn ol_done() -> Value {
    json!({"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":30,"eval_count":5})
}

/// One provider's script for the mid-stream error test: attempt 1 of
/// turn 1 streams text and a whole call writing bad.txt, then an error
/// event; attempt 2 writes hello.txt; turn 2 answers "All done.".
struct Format {
    provider: &'static str,
    content_type: &'static str,
    suffix: &'static str,
    failing: String,
    write_hello: String,
    done: String,
}

fn formats() -> Vec<Format> {
    let bad = r#"{"path": "bad.txt", "content": "from a failed attempt\n"}"#;
    let hello = r#"{"path": "hello.txt", "content": "hi\n"}"#;
    vec![
        Format {
            provider: "openai",
            content_type: "text/event-stream",
            suffix: "/v1",
            failing: oa(
                &[
                    oa_text("Partial answer"),
                    oa_call("c0", "write", bad),
                    json!({"error":{"message":"The server had an error while processing your request","type":"server_error"}}),
                ],
                false,
            ),
            write_hello: oa(&[oa_call("c1", "write", hello), oa_finish("tool_calls")], true),
            done: oa(&[oa_text("All done."), oa_finish("stop")], true),
        },
        Format {
            provider: "anthropic",
            content_type: "text/event-stream",
            suffix: "/v1",
            failing: an(&[
                vec![an_start()],
                an_text("Partial answer"),
                an_tool(1, "tu0", "write", bad),
                vec![json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})],
            ]
            .concat()),
            write_hello: an(&[
                vec![an_start()],
                an_tool(0, "tu1", "write", hello),
                an_end("tool_use"),
            ]
            .concat()),
            done: an(&[vec![an_start()], an_text("All done."), an_end("end_turn")].concat()),
        },
        Format {
            provider: "ollama",
            content_type: "application/x-ndjson",
            suffix: "",
            failing: ol(&[
                ol_msg(
                    "Partial answer",
                    json!([{"function":{"name":"write","arguments":serde_json::from_str::<Value>(bad).unwrap_or_default()}}]),
                ),
                json!({"error":"an error was encountered while running the model: unexpected EOF"}),
            ]),
            write_hello: ol(&[
                ol_msg(
                    "",
                    json!([{"function":{"name":"write","arguments":serde_json::from_str::<Value>(hello).unwrap_or_default()}}]),
                ),
                ol_done(),
            ]),
            done: ol(&[ol_msg("All done.", json!([])), ol_done()]),
        },
    ]
}

// ------------------------------------------------------------ helpers

fn run(s: &Scratch, provider: &str, url: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = s.agent("run", provider, "test-model", url);
    c.args(["--autonomy", "auto", "--json"])
        .args(extra)
        .env("ANTHROPIC_API_KEY", "test-key-not-real");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run retie")
}

fn report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\n{}", stdout(o), stderr(o)))
}

/// (kind, payload) of every entry.
fn entries(s: &Scratch) -> Vec<(String, Value)> {
    let db = rusqlite::Connection::open(s.home.join(".local/state/retie/ledger.db"))
        .expect("open the ledger");
    let mut st = db
        .prepare("SELECT kind, payload FROM entries ORDER BY seq")
        .expect("query");
    st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            serde_json::from_str(&r.get::<_, String>(1)?).unwrap_or_default(),
        ))
    })
    .expect("rows")
    .map(|r| r.expect("row"))
    .collect()
}

fn attempts(s: &Scratch) -> Vec<Value> {
    entries(s)
        .into_iter()
        .filter(|(k, _)| k == "provider_attempt")
        .map(|(_, p)| p)
        .collect()
}

fn verify(s: &Scratch) {
    let o = s.retie().arg("verify").output().expect("verify");
    assert_code(&o, 0, "retie verify");
}

fn bodies(seen: &Seen) -> Vec<String> {
    seen.lock()
        .expect("lock")
        .iter()
        .map(|(_, b)| b.clone())
        .collect()
}

// ------------------------------------------------------------ tests

/// A mid-stream error event on each wire format (after text and a whole
/// tool call were streamed) is retried: the same conversation is asked
/// again, the session finishes as it would have without the error, and
/// nothing of the failed attempt ran, was kept or was sent back: no
/// bad.txt in the workspace, no proposal, intent or message naming it,
/// one `provider_attempt` entry with the cause, retried.
#[test]
fn a_mid_stream_error_on_each_wire_format_is_retried_and_the_session_finishes_the_same() {
    for f in formats() {
        for leg in legs() {
            let s = Scratch::new(leg);
            let label = format!("{} {:?}", f.provider, leg);
            let (addr, seen) = server(vec![
                ok(f.content_type, f.failing.clone()),
                ok(f.content_type, f.write_hello.clone()),
                ok(f.content_type, f.done.clone()),
            ]);
            let o = run(
                &s,
                f.provider,
                &format!("{addr}{}", f.suffix),
                &["-p", "write hello.txt"],
                &[],
            );
            assert_code(&o, 0, &label);
            let r = report(&o);
            assert_eq!(r["status"], "finished", "{label}: {r}");
            assert_eq!(r["answer"], "All done.", "{label}: {r}");
            assert_eq!(
                std::fs::read_to_string(s.ws.join("hello.txt"))
                    .ok()
                    .as_deref(),
                Some("hi\n"),
                "{label}"
            );
            assert!(
                !s.ws.join("bad.txt").exists(),
                "{label}: a call of the failed attempt ran"
            );
            let b = bodies(&seen);
            assert_eq!(b.len(), 3, "{label}: {b:?}");
            assert_eq!(b[0], b[1], "{label}: the retry asks the same conversation");
            assert!(
                !b[2].contains("bad.txt") && !b[2].contains("Partial answer"),
                "{label}: the failed attempt was sent back to the model: {}",
                b[2]
            );
            for (kind, p) in entries(&s) {
                if kind != "provider_attempt" {
                    assert!(
                        !p.to_string().contains("bad.txt"),
                        "{label}: a {kind} entry names the failed attempt's call: {p}"
                    );
                }
            }
            let a = attempts(&s);
            assert_eq!(a.len(), 1, "{label}: {a:?}");
            assert_eq!(a[0]["cause"], "error_event", "{label}: {a:?}");
            assert_eq!(a[0]["retried"], true, "{label}: {a:?}");
            assert_eq!(a[0]["transient"], true, "{label}: {a:?}");
            assert!(
                a[0]["dropped_text_chars"].as_u64() >= Some(1),
                "{label}: {a:?}"
            );
            assert!(
                stderr(&o).contains("retrying"),
                "{label}: the terminal says it retries:\n{}",
                stderr(&o)
            );
            verify(&s);
        }
    }
}

/// A 429 with `Retry-After: 1` is waited out: the second request comes
/// at least about a second after the first; the attempt is recorded as
/// rate limited with the wait asked.
#[test]
fn a_429_with_retry_after_waits_that_long_then_asks_again() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let (addr, seen) = server(vec![
            status(
                429,
                vec![("retry-after", "1".into())],
                json!({"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}),
            ),
            ok(
                "text/event-stream",
                oa(&[oa_text("All done."), oa_finish("stop")], true),
            ),
        ]);
        let o = run(&s, "openai", &format!("{addr}/v1"), &["-p", "say hi"], &[]);
        assert_code(&o, 0, "429 then an answer");
        let times: Vec<Instant> = seen.lock().expect("lock").iter().map(|(t, _)| *t).collect();
        assert_eq!(times.len(), 2);
        let waited = times[1].duration_since(times[0]);
        assert!(
            waited >= Duration::from_millis(950),
            "Retry-After said 1 s, the retry came after {waited:?}"
        );
        let a = attempts(&s);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0]["cause"], "rate_limited");
        assert_eq!(a[0]["status"], 429);
        assert_eq!(a[0]["retry_after_ms"], 1000);
        assert_eq!(a[0]["wait_ms"], 1000);
        verify(&s);
    }
}

/// A stream cut without its end marker, a 503 and a connection dropped
/// mid-body are each retried; the fourth attempt answers.
#[test]
fn a_cut_stream_a_5xx_and_a_dropped_connection_are_retried() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let sse = "text/event-stream";
        let (addr, seen) = server(vec![
            ok(
                sse,
                oa(
                    &[
                        oa_text("Half"),
                        oa_call("c0", "write", r#"{"path": "bad.txt", "content": "x"}"#),
                        oa_finish("tool_calls"),
                    ],
                    false,
                ),
            ),
            status(
                503,
                vec![],
                json!({"error":{"message":"The engine is currently overloaded","type":"server_error"}}),
            ),
            Reply {
                drop: true,
                ..ok(sse, oa(&[oa_text("Ha")], false))
            },
            ok(sse, oa(&[oa_text("All done."), oa_finish("stop")], true)),
        ]);
        let o = run(&s, "openai", &format!("{addr}/v1"), &["-p", "say hi"], &[]);
        assert_code(&o, 0, "three transient failures, then an answer");
        assert_eq!(report(&o)["answer"], "All done.");
        assert!(!s.ws.join("bad.txt").exists(), "a call of a cut stream ran");
        assert_eq!(bodies(&seen).len(), 4);
        let causes: Vec<String> = attempts(&s)
            .iter()
            .map(|a| a["cause"].as_str().unwrap_or("?").to_string())
            .collect();
        assert_eq!(causes, ["cut_off", "server_error", "connection"]);
        verify(&s);
    }
}

/// N transient failures in a row suspend the session (exit 5) with the
/// cause, recorded: each attempt, and the suspension's reason; `retie
/// sessions` and `retie replay` say so. `--resume` against a healthy
/// server then finishes it (exit 0), and the ledger verifies.
#[test]
fn n_failures_in_a_row_suspend_with_the_cause_and_resume_finishes() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let busy = || {
            status(
                503,
                vec![],
                json!({"error":{"message":"The engine is currently overloaded","type":"server_error"}}),
            )
        };
        let (addr, seen) = server(vec![busy(), busy()]);
        let o = run(
            &s,
            "openai",
            &format!("{addr}/v1"),
            &["-p", "write hello.txt"],
            &[("RETIE_MAX_ATTEMPTS", "2")],
        );
        assert_code(&o, 5, "two failures with max_attempts 2");
        let r = report(&o);
        assert_eq!(r["status"], "suspended", "{r}");
        let m = r["message"].as_str().unwrap_or("");
        assert!(m.contains("2 times") && m.contains("overloaded"), "{m}");
        assert_eq!(bodies(&seen).len(), 2);
        let a = attempts(&s);
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(a[0]["retried"], true);
        assert_eq!(a[1]["retried"], false);
        let sid = r["session"].as_str().expect("session").to_string();
        let suspended: Vec<Value> = entries(&s)
            .into_iter()
            .filter(|(k, _)| k == "suspended")
            .map(|(_, p)| p)
            .collect();
        assert_eq!(suspended.len(), 1);
        assert_eq!(suspended[0]["outcome"], "suspended", "{suspended:?}");
        let o = s
            .retie()
            .args(["sessions", "--json"])
            .output()
            .expect("sessions");
        let list: Value = serde_json::from_slice(&o.stdout).expect("json");
        assert_eq!(list["sessions"][0]["state"], "suspended", "{list}");
        let o = s.retie().args(["replay", &sid]).output().expect("replay");
        let text = stdout(&o);
        assert!(
            text.contains("PROVIDER FAILURES")
                && text.matches("server_error (HTTP 503)").count() == 2
                && text.contains("not retried"),
            "{text}"
        );

        let (addr, _) = server(vec![
            ok(
                "text/event-stream",
                oa(
                    &[
                        oa_call("c1", "write", r#"{"path": "hello.txt", "content": "hi\n"}"#),
                        oa_finish("tool_calls"),
                    ],
                    true,
                ),
            ),
            ok(
                "text/event-stream",
                oa(&[oa_text("All done."), oa_finish("stop")], true),
            ),
        ]);
        let mut c = s.retie();
        c.args([
            "run",
            "--resume",
            &sid,
            "--base-url",
            &format!("{addr}/v1"),
            "--json",
        ])
        .env_remove("RETIE_PROVIDER")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null());
        let o = c.output().expect("resume");
        assert_code(&o, 0, "resume against a healthy server");
        assert_eq!(report(&o)["answer"], "All done.");
        assert_eq!(
            std::fs::read_to_string(s.ws.join("hello.txt"))
                .ok()
                .as_deref(),
            Some("hi\n")
        );
        let closed: Vec<Value> = entries(&s)
            .into_iter()
            .filter(|(k, _)| k == "session_closed")
            .map(|(_, p)| p)
            .collect();
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0]["outcome"], "finished", "{closed:?}");
        verify(&s);
    }
}

/// 400, 401, 403 (entitlement) and 404 (model) stop at once: exit 4 after
/// exactly one request, with the provider's own message; the attempt is
/// recorded, not retried; the close entry says `provider_failed`, and
/// `retie sessions` and `retie replay` say "provider failed" (issue 35:
/// it said "finished, 0 turns").
#[test]
fn permanent_refusals_stop_at_once_after_one_request() {
    let cases: Vec<(&str, &str, u16, Value, &str)> = vec![
        (
            "openai",
            "/v1",
            400,
            json!({"error":{"message":"Invalid value for 'messages'","type":"invalid_request_error"}}),
            "Invalid value",
        ),
        (
            "openai",
            "/v1",
            401,
            json!({"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}),
            "Incorrect API key",
        ),
        (
            "openai",
            "/v1",
            403,
            json!({"error":"this model requires a subscription"}),
            "requires a subscription",
        ),
        (
            "openai",
            "/v1",
            404,
            json!({"error":{"message":"The model `test-model` does not exist","code":"model_not_found"}}),
            "does not exist",
        ),
        (
            "openai",
            "/v1",
            429,
            json!({"error":{"message":"You exceeded your current quota","code":"insufficient_quota"}}),
            "current quota",
        ),
        (
            "anthropic",
            "/v1",
            401,
            json!({"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}),
            "invalid x-api-key",
        ),
        (
            "anthropic",
            "/v1",
            403,
            json!({"type":"error","error":{"type":"permission_error","message":"not allowed to use this model"}}),
            "not allowed",
        ),
        (
            "ollama",
            "",
            404,
            json!({"error":"model \"test-model\" not found, try pulling it first"}),
            "not found",
        ),
    ];
    for leg in legs() {
        for (provider, suffix, code, body, said) in &cases {
            let s = Scratch::new(leg);
            let label = format!("{provider} {code} {leg:?}");
            let (addr, seen) = server(vec![status(
                *code,
                vec![("retry-after", "1".into())],
                body.clone(),
            )]);
            let o = run(
                &s,
                provider,
                &format!("{addr}{suffix}"),
                &["-p", "say hi"],
                &[],
            );
            assert_code(&o, 4, &label);
            let r = report(&o);
            assert_eq!(r["status"], "provider_failed", "{label}: {r}");
            assert!(
                r["message"].as_str().unwrap_or("").contains(said),
                "{label}: {r}"
            );
            assert_eq!(bodies(&seen).len(), 1, "{label}: one request, no retry");
            let a = attempts(&s);
            assert_eq!(a.len(), 1, "{label}: {a:?}");
            assert_eq!(a[0]["transient"], false, "{label}");
            assert_eq!(a[0]["retried"], false, "{label}");
            let closed: Vec<Value> = entries(&s)
                .into_iter()
                .filter(|(k, _)| k == "session_closed")
                .map(|(_, p)| p)
                .collect();
            assert_eq!(closed.len(), 1, "{label}");
            assert_eq!(
                closed[0]["outcome"], "provider_failed",
                "{label}: {closed:?}"
            );
            assert!(
                closed[0]["message"].as_str().unwrap_or("").contains(said),
                "{label}: {closed:?}"
            );
            let o = s.retie().args(["sessions"]).output().expect("sessions");
            assert!(
                stdout(&o).contains("provider failed"),
                "{label}: {}",
                stdout(&o)
            );
            let o = s
                .retie()
                .args(["sessions", "--json"])
                .output()
                .expect("sessions");
            let list: Value = serde_json::from_slice(&o.stdout).expect("json");
            assert_eq!(
                list["sessions"][0]["outcome"], "provider_failed",
                "{label}: {list}"
            );
            assert_eq!(
                list["sessions"][0]["turns"], r["turns"],
                "{label}: --json and `retie sessions` count the same turns: {list} {r}"
            );
            let sid = r["session"].as_str().expect("session").to_string();
            let o = s.retie().args(["replay", &sid]).output().expect("replay");
            let text = stdout(&o);
            assert!(
                text.contains("ended: provider failed") && text.contains("not retried"),
                "{label}: {text}"
            );
            verify(&s);
        }
    }
}
