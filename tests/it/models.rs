//! The catalogue, the probe, the ladder and usage (issue 29), end to
//! end against a loopback server playing an OpenAI-compatible host whose
//! catalogue is mostly not callable on this account: 403 for some
//! models, 429 with Retry-After, a 429 whose body says weekly cap, a
//! model that never answers, a 401 for a wrong key. The server counts
//! every request, per model, so "one request" is asserted where it
//! arrives.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::*;

/// What the server answers one chat request for a model.
#[derive(Clone)]
enum Answer {
    /// A streamed text answer (the model finishes).
    Done,
    /// An HTTP error: status, headers, body.
    Status(u16, Vec<(&'static str, String)>, Value),
    /// No answer for this long (a cold model), then a text answer.
    Sleep(Duration),
    /// This event stream.
    Stream(String),
}

/// `(path, model)` of each request seen.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback OpenAI-compatible host: `GET /v1/models` lists `models`
/// (id, with llama.cpp's `meta.n_params` when a size is given), `POST
/// /v1/chat/completions` answers by the body's model with `answer`.
fn host(models: &[(&str, Option<u64>)], answer: fn(&str, usize) -> Answer) -> (String, Seen) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let list = json!({"object": "list", "data": models.iter().map(|(id, n)| match n {
        Some(n) => json!({"id": id, "object": "model", "meta": {"n_params": n}}),
        None => json!({"id": id, "object": "model"}),
    }).collect::<Vec<_>>()});
    // Requests per (path, model) since the start, never cleared (the
    // answer's `n`).
    let counts: Arc<Mutex<BTreeMap<(String, String), usize>>> = Arc::default();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { return };
            let log = log.clone();
            let list = list.clone();
            let counts = counts.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(c.try_clone().expect("clone"));
                let mut first = String::new();
                let _ = r.read_line(&mut first);
                let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
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
                let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                let model = body["model"].as_str().unwrap_or("").to_string();
                log.lock()
                    .expect("lock")
                    .push((path.clone(), model.clone()));
                let n = {
                    let mut g = counts.lock().expect("lock");
                    let e = g.entry((path.clone(), model.clone())).or_insert(0);
                    *e += 1;
                    *e
                };
                let (status, headers, text, ct) = if path.ends_with("/models") {
                    (200, vec![], list.to_string(), "application/json")
                } else {
                    match answer(&model, n) {
                        Answer::Done => (200, vec![], done(), "text/event-stream"),
                        Answer::Sleep(d) => {
                            std::thread::sleep(d);
                            (200, vec![], done(), "text/event-stream")
                        }
                        Answer::Status(s, h, b) => (s, h, b.to_string(), "application/json"),
                        Answer::Stream(t) => (200, vec![], t, "text/event-stream"),
                    }
                };
                let mut head = format!(
                    "HTTP/1.1 {status} Test\r\nconnection: close\r\ncontent-type: {ct}\r\ncontent-length: {}\r\n",
                    text.len()
                );
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = c.write_all(head.as_bytes());
                let _ = c.write_all(text.as_bytes());
                let _ = c.flush();
            });
        }
    });
    (format!("http://{addr}/v1"), seen)
}

/// A streamed answer that finishes: "ok", usage 30 in / 5 out.
fn done() -> String {
    [
        json!({"choices":[{"index":0,"delta":{"content":"ok"}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":5}}),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .chain(std::iter::once("data: [DONE]\n\n".to_string()))
    .collect()
}

fn err(s: u16, h: Vec<(&'static str, String)>, msg: &str) -> Answer {
    Answer::Status(s, h, json!({"error": {"message": msg}}))
}

/// Chat requests seen per model.
fn chats(seen: &Seen) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (p, m) in seen.lock().expect("lock").iter() {
        if p.ends_with("/chat/completions") {
            *out.entry(m.clone()).or_insert(0) += 1;
        }
    }
    out
}

fn retie(s: &Scratch, url: &str, args: &[&str]) -> Output {
    s.retie()
        .args(args)
        .args(["--provider", "openai", "--base-url", url])
        .env_remove("RETIE_PROVIDER")
        .env_remove("RETIE_MODEL")
        .env_remove("RETIE_MAX_ATTEMPTS")
        .env_remove("RETIE_BASE_URL")
        .env("OPENAI_API_KEY", "test-key-not-real")
        .stdin(Stdio::null())
        .output()
        .expect("run retie")
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\n{}", stdout(o), stderr(o)))
}

fn cache(s: &Scratch) -> Value {
    let t = std::fs::read_to_string(s.home.join(".local/state/retie/models.json"))
        .expect("the probe cache");
    serde_json::from_str(&t).expect("the cache is JSON")
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

fn ladder_notes(s: &Scratch) -> Vec<Value> {
    entries(s)
        .into_iter()
        .filter(|(k, p)| k == "note" && p.get("ladder").is_some())
        .map(|(_, p)| p)
        .collect()
}

const B: u64 = 1_000_000_000;

/// The catalogue of the ladder tests: tiers 1, 3 and 4 by size with the
/// default anchors (20 B tier 1, 671 B tier 4).
const LADDER: &[(&str, Option<u64>)] = &[
    ("big", Some(671 * B)),
    ("small", Some(8 * B)),
    ("mid", Some(120 * B)),
];

/// Probe the ladder's catalogue so every model is callable, then forget
/// the server's count.
fn probe_all(s: &Scratch, url: &str, seen: &Seen) {
    let o = retie(s, url, &["probe", "--json"]);
    assert_code(&o, 0, "retie probe");
    seen.lock().expect("lock").clear();
}

fn run(s: &Scratch, url: &str, extra: &[&str]) -> Output {
    let mut a = vec![
        "run",
        "-p",
        "say ok",
        "--autonomy",
        "auto",
        "--json",
        "--timeout",
        "60",
    ];
    a.extend_from_slice(extra);
    retie(s, url, &a)
}

// ------------------------------------------------------------ tests

/// `retie models` lists what the provider serves with its size, tier and
/// context; `retie probe` sends one one-token request per model and the
/// cache keeps exactly what each answer said: 403 refused, 429
/// inconclusive with its Retry-After, no answer in time inconclusive
/// (never a refusal), 503 inconclusive, 200 callable; `retie models`
/// then shows those standings. The probe run is one ledger entry.
#[test]
fn probe_caches_exactly_what_each_model_answered() {
    fn answer(model: &str, _: usize) -> Answer {
        match model {
            "open:8b" => Answer::Done,
            "paid:20b" => err(403, vec![], "this model requires a subscription"),
            "busy:70b" => err(429, vec![("retry-after", "7".into())], "rate limited"),
            "cold:120b" => Answer::Sleep(Duration::from_secs(4)),
            _ => err(503, vec![], "overloaded"),
        }
    }
    for leg in legs() {
        let s = Scratch::new(leg);
        let (url, seen) = host(
            &[
                ("open:8b", None),
                ("paid:20b", None),
                ("busy:70b", None),
                ("cold:120b", None),
                ("down", Some(30 * B)),
            ],
            answer,
        );
        let o = retie(&s, &url, &["models", "--json"]);
        assert_code(&o, 0, "retie models");
        let m = json_of(&o);
        let by: BTreeMap<String, Value> = m["models"]
            .as_array()
            .expect("models")
            .iter()
            .map(|r| (r["model"].as_str().unwrap_or("").to_string(), r.clone()))
            .collect();
        assert_eq!(by.len(), 5, "{m}");
        assert_eq!(by["open:8b"]["params_b"], json!(8.0));
        assert_eq!(by["open:8b"]["size_from"], "name");
        assert_eq!(by["down"]["size_from"], "provider");
        assert_eq!(by["cold:120b"]["tier"], 3);
        assert!(by.values().all(|r| r["standing"] == "untested"), "{m}");

        let o = retie(&s, &url, &["probe", "--json", "--timeout", "1"]);
        assert_code(&o, 0, "retie probe");
        // One request per model, no retry.
        let c = chats(&seen);
        assert_eq!(c.len(), 5, "{c:?}");
        assert!(c.values().all(|n| *n == 1), "{c:?}");
        let cache = cache(&s);
        let ep = &cache["endpoints"][format!("openai {url}")];
        let st = |m: &str| ep[m]["status"].as_str().unwrap_or("").to_string();
        assert_eq!(st("open:8b"), "callable", "{cache}");
        assert_eq!(st("paid:20b"), "refused");
        assert_eq!(ep["paid:20b"]["code"], 403);
        assert!(ep["paid:20b"]["cause"]
            .as_str()
            .unwrap_or("")
            .contains("requires a subscription"));
        assert_eq!(st("busy:70b"), "inconclusive");
        assert_eq!(ep["busy:70b"]["retry_after_ms"], 7000);
        assert_eq!(st("cold:120b"), "inconclusive");
        assert_eq!(st("down"), "inconclusive");
        assert_eq!(ep["down"]["code"], 503);

        let o = retie(&s, &url, &["models", "--json"]);
        let m = json_of(&o);
        let standing: BTreeMap<String, String> = m["models"]
            .as_array()
            .expect("models")
            .iter()
            .map(|r| {
                (
                    r["model"].as_str().unwrap_or("").to_string(),
                    r["standing"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        assert_eq!(standing["paid:20b"], "refused");
        assert_eq!(standing["open:8b"], "callable");
        // The probe run is in the ledger: one entry with every result.
        let probes: Vec<Value> = entries(&s)
            .into_iter()
            .filter(|(k, p)| k == "note" && p.get("probe").is_some())
            .map(|(_, p)| p)
            .collect();
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0]["probe"].as_array().map(Vec::len), Some(5));
        let v = s.retie().arg("verify").output().expect("verify");
        assert_code(&v, 0, "retie verify");
    }
}

/// A wrong key (401) stops the probe after one request: the key is
/// wrong, not the models, and no model is marked. A 429 whose body says
/// weekly cap stops it the same way.
#[test]
fn a_wrong_key_or_a_weekly_cap_stops_the_probe_after_one_request() {
    fn bad_key(_: &str, _: usize) -> Answer {
        err(401, vec![], "Incorrect API key provided")
    }
    fn weekly(_: &str, _: usize) -> Answer {
        err(
            429,
            vec![("retry-after", "172800".into())],
            "you have reached your weekly usage limit",
        )
    }
    for leg in legs() {
        for (answer, said) in [
            (bad_key as fn(&str, usize) -> Answer, "Incorrect API key"),
            (weekly, "resets in 2 d"),
        ] {
            let s = Scratch::new(leg);
            let (url, seen) = host(&[("a:8b", None), ("b:8b", None), ("c:8b", None)], answer);
            let o = retie(&s, &url, &["probe", "--json"]);
            assert_code(&o, 4, "retie probe");
            let c = chats(&seen);
            assert_eq!(c.values().sum::<usize>(), 1, "{c:?}");
            let r = json_of(&o);
            assert!(r["stopped"].as_str().unwrap_or("").contains(said), "{r}");
            let cache = cache(&s);
            assert!(
                cache["endpoints"][format!("openai {url}")]
                    .as_object()
                    .is_none_or(|m| m.is_empty()),
                "{cache}"
            );
        }
    }
}

/// With no model named, `retie run` starts on the lowest tier among the
/// callable models, climbs to the next tier on a session limit (a 429
/// that resets within hours), records the switch with its reason, and
/// never asks the model above; `retie usage` counts exactly the requests
/// the server logged, per model.
#[test]
fn the_ladder_starts_lowest_and_climbs_on_a_session_limit() {
    fn answer(model: &str, n: usize) -> Answer {
        match model {
            // The probe's request answers; the session's is limited.
            "small" if n > 1 => err(
                429,
                vec![("retry-after", "3600".into())],
                "session usage limit reached",
            ),
            _ => Answer::Done,
        }
    }
    for leg in legs() {
        let s = Scratch::new(leg);
        let (url, seen) = host(LADDER, answer);
        probe_all(&s, &url, &seen);
        let o = run(&s, &url, &[]);
        assert_code(&o, 0, "retie run on the ladder");
        let c = chats(&seen);
        assert_eq!(c.get("small"), Some(&1), "{c:?}");
        assert_eq!(c.get("mid"), Some(&1), "{c:?}");
        assert_eq!(c.get("big"), None, "{c:?}");
        let notes = ladder_notes(&s);
        assert_eq!(notes[0]["ladder"], "start", "{notes:?}");
        assert_eq!(notes[0]["model"], "small");
        assert_eq!(notes[0]["tier"], 1);
        let sw: Vec<&Value> = notes.iter().filter(|n| n["ladder"] == "switch").collect();
        assert_eq!(sw.len(), 1, "{notes:?}");
        assert_eq!(sw[0]["from"], "small");
        assert_eq!(sw[0]["to"], "mid");
        assert_eq!(sw[0]["to_tier"], 3);
        assert_eq!(sw[0]["reason"], "session_limit");

        // usage: every chat request the server saw, probes included.
        let all_chats = {
            // The probe's three were cleared from `seen`; add them back.
            chats(&seen).values().sum::<usize>() + 3
        };
        let u = s.retie().args(["usage", "--json"]).output().expect("usage");
        assert_code(&u, 0, "retie usage");
        let u = json_of(&u);
        assert_eq!(u["total"]["requests"], all_chats as u64, "{u}");
        let by: BTreeMap<String, Value> = u["by_model"]
            .as_array()
            .expect("by_model")
            .iter()
            .map(|r| {
                (
                    format!("{}@{}", r["model"].as_str().unwrap_or(""), r["tier"]),
                    r.clone(),
                )
            })
            .collect();
        // The session's answered turn on mid at tier 3: 30 in, 5 out.
        assert_eq!(by["mid@3"]["tokens_in"], 30, "{u}");
        assert_eq!(by["mid@3"]["tokens_out"], 5, "{u}");
        assert_eq!(by["small@1"]["failed"], 1, "{u}");
        let v = s.retie().arg("verify").output().expect("verify");
        assert_code(&v, 0, "retie verify");
    }
}

/// A weekly cap stops the session at once with one request (not one per
/// model), saying when it resets; a refusal mid-session drops the model
/// for the session and in the cache; `--max-tier` is never exceeded.
#[test]
fn a_weekly_cap_stops_at_once_a_refusal_is_remembered_and_max_tier_holds() {
    fn weekly(_: &str, _: usize) -> Answer {
        err(
            429,
            vec![("retry-after", "259200".into())],
            "you have reached your weekly usage limit",
        )
    }
    fn refuses_small(model: &str, n: usize) -> Answer {
        match (model, n) {
            // The probe's request answers; the session's is refused.
            ("small", 1) => Answer::Done,
            ("small", _) => err(403, vec![], "this model requires a subscription"),
            _ => Answer::Done,
        }
    }
    fn limited(_: &str, _: usize) -> Answer {
        err(
            429,
            vec![("retry-after", "600".into())],
            "session usage limit",
        )
    }
    for leg in legs() {
        // The weekly cap: exit 4 after one request, the reset said.
        let s = Scratch::new(leg);
        let (url, seen) = host(
            LADDER,
            |m, n| if n == 1 { Answer::Done } else { weekly(m, n) },
        );
        probe_all(&s, &url, &seen);
        let o = run(&s, &url, &[]);
        assert_code(&o, 4, "a weekly cap");
        assert_eq!(
            chats(&seen).values().sum::<usize>(),
            1,
            "{:?}",
            chats(&seen)
        );
        let r = json_of(&o);
        let m = r["message"].as_str().unwrap_or("");
        assert!(m.contains("resets in 3 d"), "{r}");
        assert!(m.contains("no other was tried"), "{r}");
        assert!(!m.contains("does not say"), "{r}");

        // A refusal: the next model answers; the cache drops small.
        let s = Scratch::new(leg);
        let (url, seen) = host(LADDER, refuses_small);
        probe_all(&s, &url, &seen);
        let o = run(&s, &url, &[]);
        assert_code(&o, 0, "a refusal climbs");
        let c = chats(&seen);
        assert_eq!(c.get("small"), Some(&1), "{c:?}");
        assert_eq!(c.get("mid"), Some(&1), "{c:?}");
        let cache = cache(&s);
        let small = &cache["endpoints"][format!("openai {url}")]["small"];
        assert_eq!(small["status"], "refused", "{cache}");
        assert!(
            small["by"].as_str().unwrap_or("").starts_with("session "),
            "{cache}"
        );
        // The next run starts above it, with no request to it.
        seen.lock().expect("lock").clear();
        let o = run(&s, &url, &[]);
        assert_code(&o, 0, "after the refusal");
        assert_eq!(chats(&seen).get("small"), None);

        // --max-tier 1: the session limit on the only tier-1 model stops
        // the session; nothing above tier 1 is asked.
        let s = Scratch::new(leg);
        let (url, seen) = host(
            LADDER,
            |m, n| if n == 1 { Answer::Done } else { limited(m, n) },
        );
        probe_all(&s, &url, &seen);
        let o = run(&s, &url, &["--max-tier", "1"]);
        assert_code(&o, 4, "max tier 1");
        let c = chats(&seen);
        assert_eq!(c.keys().collect::<Vec<_>>(), vec!["small"], "{c:?}");
        let r = json_of(&o);
        assert!(
            r["message"]
                .as_str()
                .unwrap_or("")
                .contains("no model is left"),
            "{r}"
        );
        // --model bypasses the ladder: no ladder entry, that model asked.
        seen.lock().expect("lock").clear();
        let o = run(&s, &url, &["--model", "big"]);
        // (a wait longer than retie waits, off the ladder: suspended)
        assert_code(&o, 5, "--model big, limited");
        assert_eq!(chats(&seen).keys().collect::<Vec<_>>(), vec!["big"]);
    }
}

/// A model that breaks the tool protocol turn after turn (calls to a
/// tool that does not exist) is left for the next tier after three such
/// turns in a row (the default), and the switch says why.
#[test]
fn a_model_that_breaks_the_tool_protocol_is_climbed_past() {
    fn answer(model: &str, n: usize) -> Answer {
        match model {
            "small" if n > 1 => Answer::Stream(
                [
                    json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":format!("c{n}"),"type":"function","function":{"name":"no_such_tool","arguments":"{}"}}]}}]}),
                    json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":2}}),
                ]
                .iter()
                .map(|c| format!("data: {c}\n\n"))
                .chain(std::iter::once("data: [DONE]\n\n".to_string()))
                .collect(),
            ),
            _ => Answer::Done,
        }
    }
    for leg in legs() {
        let s = Scratch::new(leg);
        let (url, seen) = host(LADDER, answer);
        probe_all(&s, &url, &seen);
        let o = run(&s, &url, &[]);
        assert_code(&o, 0, "retie run on the ladder");
        let c = chats(&seen);
        assert_eq!(c.get("small"), Some(&3), "{c:?}");
        assert_eq!(c.get("mid"), Some(&1), "{c:?}");
        let notes = ladder_notes(&s);
        let sw: Vec<&Value> = notes.iter().filter(|n| n["ladder"] == "switch").collect();
        assert_eq!(sw.len(), 1, "{notes:?}");
        assert_eq!(sw[0]["reason"], "broke_tool_protocol");
    }
}
