//! The interactive terminal (`retie run` with no `-p`), driven in a
//! pseudo-terminal (`pty.rs`) against the scripted model: a task typed,
//! its answer streamed, approvals answered yes, no with a reason, edit
//! and always; Ctrl-C in the middle of a command; `/undo`; Ctrl-D.
//! Every wait is for expected output with a generous deadline; nothing
//! asserts a time.

use std::path::PathBuf;
use std::process::Stdio;

use crate::harness::*;
use crate::pty::Pty;

pub(crate) fn script(s: &Scratch, turns: serde_json::Value) -> PathBuf {
    let p = s.root.path().join("script.json");
    std::fs::write(&p, serde_json::json!({ "turns": turns }).to_string()).expect("script");
    s.give(&p);
    p
}

/// `retie run WS --provider script --script FILE [extra]` on a terminal.
pub(crate) fn session(s: &Scratch, script: &std::path::Path, extra: &[&str]) -> Pty {
    let mut c = s.retie();
    c.arg("run")
        .arg(&s.ws)
        .args(["--provider", "script", "--script"])
        .arg(script)
        .args(extra)
        .env_remove("RETIE_PROVIDER")
        // Plain text to match against (the colours have their own test).
        .env("NO_COLOR", "1");
    Pty::spawn(c)
}

fn entries(s: &Scratch) -> Vec<(String, serde_json::Value)> {
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

fn verify(s: &Scratch) {
    let mut c = s.retie();
    c.arg("verify").stdin(Stdio::null());
    let o = c.output().expect("verify");
    assert_code(&o, 0, "retie verify after the session");
}

pub(crate) fn read(s: &Scratch, rel: &str) -> String {
    std::fs::read_to_string(s.ws.join(rel)).unwrap_or_default()
}

/// Ctrl-D ends the session: closed in the ledger, which verifies.
#[track_caller]
pub(crate) fn end_with_ctrl_d(s: &Scratch, t: &mut Pty) {
    t.expect("retie> ");
    t.type_("\x04");
    t.expect("closed");
    let st = t.wait();
    assert!(st.success(), "Ctrl-D ends cleanly: {st}\n{}", t.output());
    verify(s);
    assert!(
        entries(s).iter().any(|(k, _)| k == "session_closed"),
        "the session is closed in the ledger"
    );
}

#[test]
fn a_task_streams_its_answer_and_the_approvals_decide_what_runs() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let sc = script(
            &s,
            serde_json::json!([
                // yes
                {"reasoning": "plan the first file", "text": "Writing one.",
                 "tool_calls": [{"name": "bash", "arguments": {"command": "echo one > one.txt"}}]},
                {"expect": ["exit code 0"], "text": "Done with one."},
                // no, with a reason the model must get
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo two > two.txt"}}]},
                {"expect": ["the person said no: not that file"], "text": "Understood, not two."},
                // edit: the person's version runs instead
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo wrong > e.txt"}}]},
                {"expect": ["exit code 0"], "text": "Edited one ran."},
                // always: the same prefix again runs unasked, another asks
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo a >> g.txt"}}]},
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo a >> g.txt"}}]},
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo b >> g.txt"}}]},
                {"text": "Granted ones done."},
            ]),
        );
        let mut t = session(&s, &sc, &["--autonomy", "manual"]);
        t.expect("retie> ");
        t.line("write one");
        t.expect("plan the first file");
        t.expect("Writing one.");
        t.expect("retie asks:");
        t.expect("runs: echo one >one.txt");
        t.expect("class: reversible");
        t.expect("asks because:");
        t.expect("approve?");
        t.line("y");
        t.expect("Done with one.");
        assert_eq!(read(&s, "one.txt"), "one\n", "approved: it ran");

        t.expect("retie> ");
        t.line("write two");
        t.expect("runs: echo two >two.txt");
        t.expect("approve?");
        t.line("n not that file");
        // The script fails the turn unless the request carries the reason.
        t.expect("Understood, not two.");
        assert!(!s.ws.join("two.txt").exists(), "refused: nothing ran");

        t.expect("retie> ");
        t.line("write e");
        t.expect("runs: echo wrong >e.txt");
        t.expect("approve?");
        t.line("e");
        t.expect("edit> ");
        // Ctrl-U clears the pre-filled line (the original command).
        t.type_("\x15");
        t.line("echo right > e.txt");
        t.expect("Edited one ran.");
        assert_eq!(read(&s, "e.txt"), "right\n", "the edited command ran");

        t.expect("retie> ");
        t.line("append");
        t.expect("runs: echo a >>g.txt");
        t.expect("approve?");
        t.line("a");
        t.expect("granted for this session");
        t.expect("runs: echo b >>g.txt");
        t.expect("approve?");
        t.line("y");
        t.expect("Granted ones done.");
        assert_eq!(read(&s, "g.txt"), "a\na\nb\n");
        let asks = t.output().matches("retie asks:").count();
        assert_eq!(
            asks,
            5,
            "one, two, wrong, the first a, b: the second a ran unasked\n{}",
            t.output()
        );

        t.expect("retie> ");
        t.line("/approvals");
        t.expect("1. always: echo a >>g.txt");
        t.expect("retie> ");
        t.line("/approvals revoke 1");
        t.expect("revoked: bash:echo a >>g.txt");

        // /undo: the last action (the b append) is undone.
        t.expect("retie> ");
        t.line("/undo");
        t.expect("undone");
        assert_eq!(read(&s, "g.txt"), "a\na\n");

        t.expect("retie> ");
        t.line("/diff");
        t.expect("one.txt");
        t.expect("(undone)");
        t.expect("retie> ");
        t.line("/cost");
        // The usage table of `retie usage`, over this session's records.
        t.expect("REQUESTS");
        t.expect("tokens in");
        t.expect("retie> ");
        t.line("/autonomy auto");
        t.expect("autonomy auto from the next task on");
        t.expect("retie> ");
        t.line("/model other-model");
        t.expect("model other-model from the next task on");
        t.expect("retie> ");
        t.line("/help");
        t.expect("/undo-all");

        end_with_ctrl_d(&s, &mut t);
        let e = entries(&s);
        for (name, value) in [("autonomy", "auto"), ("model", "other-model")] {
            assert!(
                e.iter()
                    .any(|(k, p)| k == "note" && p["setting"] == name && p["value"] == value),
                "{leg:?}: the {name} change is recorded"
            );
        }
        assert!(
            e.iter()
                .any(|(_, p)| p.to_string().contains("the person said no: not that file")),
            "the refusal and its reason are in the ledger"
        );
        let all: String = e.iter().map(|(k, p)| format!("{k} {p}\n")).collect();
        assert!(
            all.contains("echo wrong > e.txt") && all.contains("echo right > e.txt"),
            "the ledger holds the proposal and the edit"
        );
        assert!(
            all.contains("edit_of"),
            "the edit is recorded as an edit of the proposal"
        );
    }
}

#[test]
fn ctrl_c_kills_the_running_sandbox_and_the_conversation_goes_on() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        // The command ignores SIGINT: only a kill of the whole sandbox
        // ends it before its (minute-long) timeout.
        let sc = script(
            &s,
            serde_json::json!([
                {"text": "Running the slow one.",
                 "tool_calls": [{"name": "bash", "arguments": {"command": format!("trap '' INT; sleep {m} & sleep {m}; echo never > never.txt")}}]},
                {"text": "This turn was cancelled; the model is not asked again within it."},
                {"text": "Still here."},
            ]),
        );
        let mut t = session(&s, &sc, &[]);
        t.expect("retie> ");
        t.line("run the slow one");
        t.expect("Running the slow one.");
        assert!(
            wait_until(60.0, || pids_with(&m).len() >= 2),
            "the sandboxed sleeps never started\n{}",
            t.output()
        );
        t.type_("\x03");
        t.expect("cancelled");
        assert!(
            pids_with(&m).is_empty(),
            "after the cancel, processes of the sandbox are left: {:?}\n{}",
            pids_with(&m),
            t.output()
        );
        assert!(!s.ws.join("never.txt").exists());
        t.expect("retie> ");
        t.line("are you there?");
        t.expect("This turn was cancelled");
        end_with_ctrl_d(&s, &mut t);
        let e = entries(&s);
        assert!(
            e.iter()
                .any(|(k, p)| k == "outcome" && p["interrupted"] == serde_json::json!(true)),
            "the cancelled command's outcome is recorded as interrupted"
        );
    }
}

/// Ctrl-C while the model answers (a slow provider) ends the wait at
/// once: the turn is cancelled and the conversation goes on.
#[test]
fn ctrl_c_while_the_model_answers_cancels_the_turn() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let sc = script(
            &s,
            serde_json::json!([
                {"delay_ms": 600_000, "text": "far too late"},
                {"text": "Back again."},
            ]),
        );
        let mut t = session(&s, &sc, &[]);
        t.expect("retie> ");
        t.line("think hard");
        // The request is out (the session wrote what the model reads
        // before asking it); give the wait a moment to begin.
        std::thread::sleep(std::time::Duration::from_millis(300));
        t.type_("\x03");
        t.expect("cancelled");
        t.expect("retie> ");
        t.line("still there?");
        t.expect("Back again.");
        assert!(!t.output().contains("far too late"), "{}", t.output());
        end_with_ctrl_d(&s, &mut t);
    }
}

/// A session suspended without a terminal (`-p`, exit 5) resumes on a
/// terminal into the interactive loop: the same pending action is asked
/// about (same digest), runs once approved, and the conversation goes on.
#[test]
fn a_suspended_session_resumes_into_the_interactive_loop() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let sc = script(
            &s,
            serde_json::json!([
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo once >> log.txt"}}]},
                {"expect": ["exit code 0"], "text": "Appended."},
                {"text": "Still with you."},
            ]),
        );
        let o = s
            .retie()
            .args(["run", "--provider", "script", "--script"])
            .arg(&sc)
            .args(["--json", "--autonomy", "manual", "-p", "append a line"])
            .env_remove("RETIE_PROVIDER")
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("report");
        let sid = r["session"].as_str().expect("session").to_string();
        let digest = r["pending"]["digest"].as_str().expect("digest").to_string();
        let mut c = s.retie();
        c.args(["run", "--resume", &sid, "--script"])
            .arg(&sc)
            .env_remove("RETIE_PROVIDER")
            .env("NO_COLOR", "1");
        let mut t = Pty::spawn(c);
        t.expect(&digest);
        t.expect("approve?");
        t.line("y");
        t.expect("Appended.");
        t.expect("retie> ");
        t.line("anything else?");
        t.expect("Still with you.");
        end_with_ctrl_d(&s, &mut t);
        assert_eq!(read(&s, "log.txt"), "once\n", "{leg:?}: ran exactly once");
    }
}

#[test]
fn no_color_means_no_escape_sequences_and_model_text_is_escaped() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let turns = serde_json::json!([
            {"reasoning": "dim me", "text": "evil \u{1b}]0;pwned\u{7} title \u{1b}[2J",
             "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
            {"text": "Done."},
        ]);
        for no_color in [false, true] {
            let sc = script(&s, turns.clone());
            let mut c = s.retie();
            c.arg("run")
                .arg(&s.ws)
                .args(["--provider", "script", "--script"])
                .arg(&sc)
                .env_remove("RETIE_PROVIDER");
            if no_color {
                c.env("NO_COLOR", "1");
            } else {
                c.env_remove("NO_COLOR");
            }
            let mut t = Pty::spawn(c);
            t.expect("retie> ");
            t.line("go");
            t.expect("Done.");
            t.expect("retie> ");
            t.type_("\x04");
            t.expect("closed");
            t.wait();
            let out = t.output();
            let raw = t.bytes();
            assert!(
                !raw.windows(4).any(|w| w == b"\x1b]0;"),
                "the model's OSC sequence reached the terminal"
            );
            assert!(
                out.contains(r"\e]0;pwned\x07 title \e[2J"),
                "shown escaped:\n{out}"
            );
            let sgr = regex_sgr(&raw);
            if no_color {
                assert!(
                    sgr.is_empty(),
                    "NO_COLOR, yet colour sequences: {sgr:?}\n{out}"
                );
            } else {
                assert!(!sgr.is_empty(), "on a terminal, colours are on\n{out}");
            }
        }
    }
}

/// Every SGR sequence (`ESC [ digits/; m`) in the output.
fn regex_sgr(raw: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < raw.len() {
        if raw[i] == 0x1b && raw[i + 1] == b'[' {
            let mut j = i + 2;
            while j < raw.len() && (raw[j].is_ascii_digit() || raw[j] == b';') {
                j += 1;
            }
            if j < raw.len() && raw[j] == b'm' {
                out.push(String::from_utf8_lossy(&raw[i..=j]).into_owned());
            }
        }
        i += 1;
    }
    out
}

#[test]
fn without_a_terminal_and_without_a_prompt_run_is_a_usage_error() {
    let s = Scratch::new(Leg::Invoker);
    let mut c = s.retie();
    c.args(["run", "--provider", "script", "--script", "/nonexistent"])
        .stdin(Stdio::null());
    let o = c.output().expect("run");
    assert_code(&o, 125, "no terminal, no -p");
    assert!(stderr(&o).contains("needs -p PROMPT"), "{}", stderr(&o));
}

#[test]
fn the_history_is_kept_in_the_state_directory_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    for leg in legs() {
        let s = Scratch::new(leg);
        let sc = script(&s, serde_json::json!([{"text": "Hello."}]));
        let mut t = session(&s, &sc, &[]);
        t.expect("retie> ");
        // A trailing backslash continues the input on the next line.
        t.line("remember this line \\");
        t.line("and this one");
        t.expect("Hello.");
        // Ctrl-C twice at the prompt ends the session.
        t.expect("retie> ");
        t.type_("\x03");
        t.expect("Ctrl-C again");
        t.type_("\x03");
        t.expect("closed");
        assert!(t.wait().success());
        verify(&s);
        let all: String = entries(&s).iter().map(|(_, p)| p.to_string()).collect();
        assert!(
            all.contains("remember this line \\nand this one"),
            "the two lines are one message to the model"
        );
        let h = s.home.join(".local/state/retie/history");
        let text = std::fs::read_to_string(&h).expect("the history file");
        assert!(text.contains("remember this line"), "{text}");
        let mode = std::fs::metadata(&h).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "history mode {mode:o}");
    }
}

/// Issue 33.2: `/autonomy gated` takes effect on the next tasks (they no
/// longer ask "because: manual tier"); `/autonomy` and `/model` with no
/// argument show the current value.
#[test]
fn slash_autonomy_takes_effect_and_shows_the_current_values() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let sc = script(
            &s,
            serde_json::json!([
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo one > one.txt"}}]},
                {"expect": ["exit code 0"], "text": "First done."},
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo two > two.txt"}}]},
                {"expect": ["exit code 0"], "text": "Second done."},
            ]),
        );
        let mut t = session(&s, &sc, &["--autonomy", "manual"]);
        t.expect("retie> ");
        t.line("/autonomy");
        t.expect("autonomy manual");
        t.expect("retie> ");
        t.line("/model");
        t.expect("model script");
        t.expect("retie> ");
        t.line("/autonomy gated");
        t.expect("autonomy gated from the next task on");
        t.expect("retie> ");
        t.line("write one");
        t.expect("First done.");
        t.expect("retie> ");
        t.line("write two");
        t.expect("Second done.");
        t.expect("retie> ");
        t.line("/autonomy");
        t.expect("autonomy gated (");
        end_with_ctrl_d(&s, &mut t);
        let out = t.output();
        assert!(
            !out.contains("approve?") && !out.contains("unknown command"),
            "{leg:?}: after /autonomy gated a reversible command still asked, or a bare command was unknown:\n{out}"
        );
        assert_eq!(read(&s, "one.txt"), "one\n");
        assert_eq!(read(&s, "two.txt"), "two\n");
    }
}

#[test]
fn slash_quit_and_slash_exit_end_the_session() {
    for leg in legs() {
        for word in ["/quit", "/exit"] {
            let s = Scratch::new(leg);
            let sc = script(&s, serde_json::json!([{"text": "Hello."}]));
            let mut t = session(&s, &sc, &[]);
            t.expect("retie> ");
            t.line("hi");
            t.expect("Hello.");
            t.expect("retie> ");
            t.line(word);
            t.expect("closed");
            let st = t.wait();
            assert!(
                st.success(),
                "{leg:?} {word}: ends cleanly: {st}\n{}",
                t.output()
            );
            assert!(
                !t.output().contains("unknown command"),
                "{leg:?} {word}:\n{}",
                t.output()
            );
            verify(&s);
            assert!(
                entries(&s).iter().any(|(k, _)| k == "session_closed"),
                "{leg:?} {word}: the session is closed in the ledger"
            );
        }
    }
}
