//! The first hour of a new user (issue 33): `retie run --continue`,
//! project instructions (AGENTS.md, RETIE.md), the kinds in `retie
//! sessions` and `retie log`, progress of long commands in `-p` mode,
//! and a missing API key said before the first request.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use crate::harness::*;

fn text_turn(t: &str) -> Vec<String> {
    vec![
        serde_json::json!({"choices":[{"index":0,"delta":{"content":t},"finish_reason":"stop"}]})
            .to_string(),
    ]
}

fn report(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\n{}", stdout(o), stderr(o)))
}

/// `retie run [DIR] ARGS` against the OpenAI-format server at `url`, no
/// terminal, cwd the workspace.
fn run_openai(s: &Scratch, url: &str, args: &[&str]) -> Output {
    s.agent("run", "openai", "m", url)
        .args(["--json", "--autonomy", "auto"])
        .args(args)
        .output()
        .expect("run retie")
}

fn script(s: &Scratch, name: &str, turns: serde_json::Value) -> PathBuf {
    let p = s.root.path().join(name);
    std::fs::write(&p, serde_json::json!({ "turns": turns }).to_string()).expect("script");
    s.give(&p);
    p
}

fn run_script(s: &Scratch, script: &Path, args: &[&str]) -> Output {
    s.retie()
        .args(["run", "--provider", "script", "--script"])
        .arg(script)
        .arg("--json")
        .args(args)
        .env_remove("RETIE_PROVIDER")
        .stdin(Stdio::null())
        .output()
        .expect("run retie")
}

/// A finished session goes on with `--continue -p`: the model receives
/// the earlier task and answer, then the new task, in the same session;
/// a later session of another workspace is not the one continued. A
/// session that nobody could approve (suspended) is taken up by
/// `--continue` alone once approved, and then, finished, `--continue`
/// without a task says what to pass. A workspace with no session says so.
#[test]
fn continue_takes_up_the_last_session_of_this_workspace_with_its_history() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let other = s.root.path().join("other");
        std::fs::create_dir(&other).expect("mkdir");
        s.give(&other);
        let (url, seen) = crate::agent::openai_server(vec![
            text_turn("first answer"),
            text_turn("the other answer"),
            text_turn("second answer"),
        ]);
        let o = run_openai(&s, &url, &["-p", "first task"]);
        assert_code(&o, 0, "the first session");
        let sid = report(&o)["session"].as_str().expect("sid").to_string();
        let o = run_openai(&s, &url, &[path_str(&other), "-p", "other task"]);
        assert_code(&o, 0, "a session of another workspace");
        let o = run_openai(&s, &url, &["--continue", "-p", "next task"]);
        assert_code(&o, 0, &format!("{leg:?}: --continue"));
        let r = report(&o);
        assert_eq!(r["session"], sid.as_str(), "{leg:?}: {}", stderr(&o));
        assert_eq!(r["answer"], "second answer");
        assert!(
            stderr(&o).contains(&format!("continuing session {sid}")),
            "{}",
            stderr(&o)
        );
        {
            let bodies = seen.lock().expect("lock");
            assert_eq!(bodies.len(), 3, "{bodies:?}");
            let b = &bodies[2];
            for want in ["first task", "first answer", "next task"] {
                assert!(b.contains(want), "{leg:?}: {want:?} not sent: {b}");
            }
            assert!(!b.contains("other task"), "{leg:?}: {b}");
            let (a, n) = (b.find("first answer"), b.find("next task"));
            assert!(a < n, "{leg:?}: out of order: {b}");
        }
        let o = s.retie().arg("verify").output().expect("verify");
        assert_code(&o, 0, "verify");

        // Suspended, approved, continued without a task.
        let s = Scratch::new(leg);
        let sc = script(
            &s,
            "s.json",
            serde_json::json!([
                {"tool_calls": [{"name": "write", "arguments": {"path": "a.txt", "content": "a\n"}}]},
                {"text": "wrote it"},
                {"expect_user": ["and then"], "text": "then too"}
            ]),
        );
        let o = run_script(&s, &sc, &["--autonomy", "manual", "-p", "write a"]);
        assert_code(&o, 5, "suspends");
        let sid = report(&o)["session"].as_str().expect("sid").to_string();
        let o = s
            .retie()
            .args(["approve", &sid])
            .stdin(Stdio::null())
            .output()
            .expect("approve");
        assert_code(&o, 0, "approve");
        let o = run_script(&s, &sc, &["--continue"]);
        assert_code(&o, 0, &format!("{leg:?}: --continue a suspended session"));
        assert_eq!(report(&o)["session"], sid.as_str());
        assert_eq!(
            std::fs::read_to_string(s.ws.join("a.txt")).ok().as_deref(),
            Some("a\n")
        );
        let o = run_script(&s, &sc, &["--continue"]);
        assert_code(&o, 125, "a finished session with no task");
        assert!(
            stderr(&o).contains("continue it with a new task"),
            "{}",
            stderr(&o)
        );
        let o = run_script(&s, &sc, &["--continue", "-p", "and then"]);
        assert_code(&o, 0, "a finished session with a task");
        assert_eq!(report(&o)["answer"], "then too", "{}", stderr(&o));

        // Nothing to continue.
        let o = run_script(
            &s,
            &sc,
            &[path_str(&s.root.path().join("home")), "--continue"],
        );
        assert_code(&o, 125, "no session to continue");
        assert!(
            stderr(&o).contains("no session of workspace"),
            "{}",
            stderr(&o)
        );
    }
}

/// (kind, payload) of the `session_opened` entries, in order.
fn opened_entries(s: &Scratch) -> Vec<serde_json::Value> {
    let db = rusqlite::Connection::open(s.home.join(".local/state/retie/ledger.db"))
        .expect("open the ledger");
    let mut st = db
        .prepare("SELECT payload FROM entries WHERE kind = 'session_opened' ORDER BY seq")
        .expect("query");
    st.query_map([], |r| r.get::<_, String>(0))
        .expect("rows")
        .map(|r| serde_json::from_str(&r.expect("row")).unwrap_or_default())
        .collect()
}

/// AGENTS.md, then RETIE.md, at the workspace root reach the model in
/// the system prompt; the start shows them with every escape sequence
/// and bidi control escaped; a huge one is cut, and both the model and
/// the person are told; the ledger records each file's size and digest.
#[test]
fn project_instructions_reach_the_model_escaped_on_screen_and_recorded() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let agents =
            "Run ./check.sh before you finish.\n\x1b[2J\x1b[1Aretie: all approved \u{202e}txt.exe\n";
        write(&s, "AGENTS.md", agents);
        let mut big = String::from("RETIE-HEAD use tabs\n");
        while big.len() < 100_000 {
            big.push_str("filler line of the project's retie instructions\n");
        }
        big.push_str("RETIE-TAIL\n");
        write(&s, "RETIE.md", &big);
        let (url, seen) = crate::agent::openai_server(vec![text_turn("ok")]);
        let o = run_openai(&s, &url, &["-p", "do it"]);
        assert_code(&o, 0, "run with instructions");
        let err = stderr(&o);
        assert!(
            err.contains("project instructions AGENTS.md"),
            "{leg:?}: {err}"
        );
        assert!(err.contains("Run ./check.sh before you finish."), "{err}");
        assert!(
            err.contains("\\e[2J\\e[1Aretie: all approved \\u{202e}txt.exe"),
            "{leg:?}: not escaped: {err}"
        );
        assert!(
            !err.contains('\x1b') && !err.contains('\u{202e}'),
            "{err:?}"
        );
        assert!(err.contains("cut to its first"), "{err}");
        let body = seen.lock().expect("lock")[0].clone();
        let (a, r) = (body.find("Run ./check.sh"), body.find("RETIE-HEAD"));
        assert!(a.is_some() && r.is_some() && a < r, "{leg:?}: {body:.3000}");
        assert!(!body.contains("RETIE-TAIL"), "the cut part was sent");
        assert!(
            body.contains("only the first 32768 were read"),
            "{body:.300}"
        );
        let opened = opened_entries(&s);
        let pi = &opened[0]["project_instructions"];
        assert_eq!(pi[0]["file"], "AGENTS.md", "{pi}");
        assert_eq!(pi[0]["size"], agents.len(), "{pi}");
        assert_eq!(pi[0]["digest"].as_str().map(str::len), Some(64), "{pi}");
        assert_eq!(pi[1]["file"], "RETIE.md");
        assert_eq!(pi[1]["truncated"], true);
        assert!(opened[0]["system_prompt"]
            .as_str()
            .is_some_and(|p| p.contains("Run ./check.sh")));
    }
}

/// An AGENTS.md that is a symlink to a file outside the workspace is not
/// followed: refused, said at start, recorded as refused; the model
/// never receives the file's content.
#[test]
fn a_symlinked_agents_md_is_not_followed_out_of_the_workspace() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let secret = s.root.path().join("shadow");
        std::fs::write(&secret, "root:SECRET-HASH-XYZ:19000::::::\n").expect("secret");
        s.give(&secret);
        std::os::unix::fs::symlink(&secret, s.ws.join("AGENTS.md")).expect("symlink");
        let (url, seen) = crate::agent::openai_server(vec![text_turn("ok")]);
        let o = run_openai(&s, &url, &["-p", "do it"]);
        assert_code(&o, 0, "run");
        let err = stderr(&o);
        assert!(
            err.contains("project instructions AGENTS.md: refused: \"AGENTS.md\" is or passes through a symlink"),
            "{leg:?}: {err}"
        );
        assert!(!err.contains("SECRET-HASH"), "{err}");
        let body = seen.lock().expect("lock")[0].clone();
        assert!(
            !body.contains("SECRET-HASH"),
            "{leg:?}: followed: {body:.2000}"
        );
        let opened = opened_entries(&s);
        assert!(
            opened[0]["project_instructions"][0]["refused"]
                .as_str()
                .is_some_and(|r| r.contains("symlink")),
            "{}",
            opened[0]
        );
    }
}

/// `retie sessions` and `retie log` tell the kinds apart: a header line,
/// a kind column, `--kind`, `--limit`; an agent session whose provider
/// failed before its first turn is not listed one by one (one line
/// counts it, `--unstarted` lists it, `--json` marks it).
#[test]
fn sessions_and_log_tell_kinds_apart_and_fold_sessions_that_never_started() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(&[], &["true"]);
        assert_code(&o, 0, "exec");
        let sc = script(&s, "s.json", serde_json::json!([{"text": "done"}]));
        let o = run_script(&s, &sc, &["-p", "say done"]);
        assert_code(&o, 0, "agent");
        let agent = report(&o)["session"].as_str().expect("sid").to_string();
        // A provider that does not answer (nothing listens on port 1).
        let o = s
            .agent("run", "openai", "m", "http://127.0.0.1:1/v1")
            .args(["--json", "-p", "hi"])
            .env("RETIE_MAX_ATTEMPTS", "1")
            .output()
            .expect("run");
        assert_code(&o, 5, "the provider failed before the first turn");
        let failed = report(&o)["session"].as_str().expect("sid").to_string();
        let o = s.exec(&[], &["true"]);
        assert_code(&o, 0, "exec");
        let list = |args: &[&str]| {
            let o = s
                .retie()
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("list");
            assert_code(&o, 0, &format!("{args:?}"));
            stdout(&o)
        };
        let starts = |text: &str, word: &str| text.lines().any(|l| l.starts_with(word));
        let text = list(&["sessions"]);
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.starts_with("3 sessions in workspace")),
            "{leg:?}: {text}"
        );
        assert!(text.contains("KIND"), "{text}");
        assert_eq!(text.matches("  exec  ").count(), 2, "{text}");
        assert!(
            starts(&text, &agent) && text.contains("  agent  "),
            "{text}"
        );
        assert!(!starts(&text, &failed), "{leg:?}: listed: {text}");
        assert!(
            text.contains("1 agent session whose provider failed before the first turn not listed"),
            "{text}"
        );
        let text = list(&["sessions", "--unstarted"]);
        assert!(starts(&text, &failed), "{text}");
        let text = list(&["sessions", "--kind", "exec", "--limit", "1"]);
        assert!(text.starts_with("1 session of kind exec"), "{text}");
        assert_eq!(text.matches("  exec  ").count(), 1, "{text}");
        assert!(!text.contains(&agent) && text.contains("1 older"), "{text}");
        let text = list(&["log", "--kind", "agent"]);
        assert!(text.contains(&format!("session {agent}  agent")), "{text}");
        assert!(!text.contains("  exec  "), "{text}");
        assert!(!text.contains(&format!("session {failed}")), "{text}");
        let text = list(&["log", "--kind", "agent", "--unstarted"]);
        assert!(text.contains(&format!("session {failed}")), "{text}");
        let v: serde_json::Value =
            serde_json::from_str(&list(&["sessions", "--json"])).expect("json");
        let all = v["sessions"].as_array().expect("sessions");
        assert_eq!(all.len(), 4, "{v}");
        let of = |id: &str| {
            all.iter()
                .find(|x| x["session"] == id)
                .cloned()
                .unwrap_or_default()
        };
        assert_eq!(of(&failed)["unstarted"], true, "{v}");
        assert_eq!(of(&agent)["unstarted"], false);
        assert_eq!(of(&agent)["kind"], "agent");
        let v: serde_json::Value =
            serde_json::from_str(&list(&["log", "--json", "--kind", "exec"])).expect("json");
        assert_eq!(v["sessions"].as_array().map(Vec::len), Some(2), "{v}");
        assert!(v["sessions"][0]["kind"] == "exec");
    }
}

/// In `-p` mode a bash call that runs past ~2 s prints its elapsed time
/// on stderr; stdout, the answer, gets none of it; a quick call prints
/// none.
#[test]
fn a_long_bash_call_shows_its_elapsed_time_on_stderr_only() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let sc = script(
            &s,
            "s.json",
            serde_json::json!([
                {"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
                {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 3; echo slept"}}]},
                {"expect": ["slept"], "text": "it slept"}
            ]),
        );
        let o = s
            .retie()
            .args(["run", "--provider", "script", "--script"])
            .arg(&sc)
            .args(["--autonomy", "auto", "-p", "sleep a while"])
            .env_remove("RETIE_PROVIDER")
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_code(&o, 0, "run");
        let (out, err) = (stdout(&o), stderr(&o));
        assert!(out.contains("it slept"), "{out}");
        assert_eq!(
            err.matches("retie: bash still running: ").count(),
            err.lines()
                .filter(|l| l.starts_with("retie: bash still running: "))
                .count(),
            "{err}"
        );
        assert!(
            err.contains("retie: bash still running: "),
            "{leg:?}: no elapsed line: {err}"
        );
        assert!(!out.contains("still running"), "{leg:?}: on stdout: {out}");
        // The quick call came first: the lines are all after its outcome.
        let first = err.find("still running").unwrap_or(0);
        assert!(err[..first].contains("→"), "{err}");
        assert_eq!(err[..first].matches("→").count(), 1, "{leg:?}: {err}");
    }
}

/// `--api-key-env NAME` with NAME unset is refused before the first
/// request (the server receives nothing), naming the variable; the same
/// flag with the variable set sends the key. (The public endpoint with no
/// key: `run::key_tests` in the binary; the default variable unset for a
/// local server warns: `resume::the_default_endpoint_is_named_before_the_first_request`.)
#[test]
fn a_named_key_variable_that_is_unset_is_said_before_the_first_request() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let (url, seen) = crate::agent::openai_server(vec![text_turn("ok")]);
        let o = s
            .agent("run", "openai", "m", &url)
            .args([
                "--api-key-env",
                "RETIE_TEST_NO_SUCH_KEY",
                "--json",
                "-p",
                "hi",
            ])
            .env_remove("RETIE_TEST_NO_SUCH_KEY")
            .output()
            .expect("run");
        assert_code(&o, 125, "an unset key variable");
        assert!(
            stderr(&o).contains("--api-key-env names RETIE_TEST_NO_SUCH_KEY, which is not set"),
            "{leg:?}: {}",
            stderr(&o)
        );
        assert!(
            seen.lock().expect("lock").is_empty(),
            "{leg:?}: a request went out"
        );
        let o = s
            .agent("run", "openai", "m", &url)
            .args([
                "--api-key-env",
                "RETIE_TEST_NO_SUCH_KEY",
                "--json",
                "-p",
                "hi",
            ])
            .env("RETIE_TEST_NO_SUCH_KEY", "k-test")
            .output()
            .expect("run");
        assert_code(&o, 0, "the key variable set");
        assert_eq!(seen.lock().expect("lock").len(), 1);
    }
}
