//! Issue 31, what a person sees: one command-line rendering on every
//! screen, previews with their whitespace, the diff of every edit and
//! write (after it, and in its approval prompt), `/diff`, and the status
//! line. Driven in a pseudo-terminal against the scripted model, like
//! `tty.rs`; every wait is for expected output, nothing asserts a time.

use std::process::Stdio;

use crate::harness::*;
use crate::tty::{end_with_ctrl_d, read, script, session};

/// The live line, `/replay` and `retie replay` show a bash call as the
/// same quoted command line (issue 31: the live line showed
/// `sh -c echo one   two`, replay `sh -c 'echo one   two'`); a read's
/// preview shows the file's tab as spaces, not `\t`.
#[test]
fn one_command_line_everywhere_and_previews_keep_their_tabs() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "calc.py", "def add(a, b):\n\treturn a + b\n");
        let sc = script(
            &s,
            serde_json::json!([
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo one   two > out.txt"}}]},
                {"tool_calls": [{"name": "read", "arguments": {"path": "calc.py"}}]},
                {"text": "Read it."},
            ]),
        );
        let mut t = session(&s, &sc, &[]);
        t.expect("retie> ");
        t.line("go");
        t.expect("Read it.");
        t.expect("retie> ");
        t.line("/replay");
        t.expect("outcome: ran");
        end_with_ctrl_d(&s, &mut t);
        let line = "sh -c 'echo one   two > out.txt'";
        let out = t.output();
        assert!(
            out.contains(&format!("{line} applied")),
            "{leg:?}: the live line:\n{out}"
        );
        assert!(
            out.matches(line).count() >= 2,
            "{leg:?}: the live line and /replay show the same command line:\n{out}"
        );
        assert!(
            out.contains("read calc.py ran — 1   def add(a, b):")
                || out.contains("read calc.py ran —     1   def add(a, b):"),
            "{leg:?}: the read's preview shows its tab as spaces:\n{out}"
        );
        assert!(
            !out.contains(r"1\tdef"),
            "{leg:?}: a tab shown as \\t:\n{out}"
        );
        assert_eq!(read(&s, "out.txt"), "one two\n");
        let o = s
            .retie()
            .args(["replay", "--all"])
            .stdin(Stdio::null())
            .output()
            .expect("replay");
        assert!(
            stdout(&o).contains(line),
            "{leg:?}: retie replay:\n{}",
            stdout(&o)
        );
    }
}

/// An edit prints the diff of the change it made; a command that changed
/// files prints each with its `+added -removed`; a line of the file
/// carrying an escape sequence or a bidi override is shown escaped; with
/// `NO_COLOR` nothing is coloured, on a terminal without it the diff's
/// lines are (green `+`, red `-`).
#[test]
fn an_edit_prints_its_diff_and_a_command_its_changed_files() {
    for leg in legs() {
        for no_color in [true, false] {
            let s = Scratch::new(leg);
            write(
                &s,
                "calc.py",
                "def add(a, b):\n\treturn a - b\n\nprint(add(1, 2))\n",
            );
            let sc = script(
                &s,
                serde_json::json!([
                    {"tool_calls": [{"name": "edit", "arguments": {
                        "path": "calc.py", "old_string": "\treturn a - b\n",
                        "new_string": "\treturn a + b\n# \u{1b}[2K\u{202e}evil\n"}}]},
                    {"tool_calls": [{"name": "bash", "arguments": {
                        "command": "printf 'x\\ny\\n' > two.txt; sed -i 's/print/echo/' calc.py"}}]},
                    {"text": "Fixed."},
                ]),
            );
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
            let mut t = crate::pty::Pty::spawn(c);
            t.expect("retie> ");
            t.line("fix it");
            t.expect("Fixed.");
            end_with_ctrl_d(&s, &mut t);
            let out = t.output();
            let raw = t.bytes();
            let plain = strip_sgr(&out);
            for want in [
                "@@ -1,4 +1,5 @@",
                " def add(a, b):",
                "-        return a - b",
                "+        return a + b",
                r"+# \e[2K\u{202e}evil",
                "two.txt  +2 -0 (new)",
                "calc.py  +1 -1",
                "shows the diff",
            ] {
                assert!(
                    plain.contains(want),
                    "{leg:?} {no_color}: no {want:?} in\n{out}"
                );
            }
            assert!(
                !raw.windows(4).any(|w| w == b"\x1b[2K") && !out.contains('\u{202e}'),
                "{leg:?}: the file's escape sequence or bidi override reached the terminal"
            );
            let coloured = out.contains("\x1b[32m+        return a + b");
            assert_eq!(coloured, !no_color, "{leg:?} NO_COLOR={no_color}:\n{out}");
            if no_color {
                assert!(sgr_free(&raw), "{leg:?}: NO_COLOR, yet colours:\n{out}");
            }
        }
    }
}

/// The text without SGR colour sequences.
fn strip_sgr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' && it.peek() == Some(&'[') {
            let mut seq = String::from("\u{1b}[");
            it.next();
            while let Some(&d) = it.peek() {
                if d.is_ascii_digit() || d == ';' {
                    seq.push(d);
                    it.next();
                } else {
                    break;
                }
            }
            if it.peek() == Some(&'m') {
                it.next();
                continue;
            }
            out.push_str(&seq);
            continue;
        }
        out.push(c);
    }
    out
}

/// No SGR colour sequence in the output.
fn sgr_free(raw: &[u8]) -> bool {
    let s = String::from_utf8_lossy(raw);
    strip_sgr(&s) == s
}

/// A write's approval prompt shows the diff it would make against the
/// file as it is now (beside the class and the digest, which still binds
/// the frozen arguments); after `e` the edited write runs and its own
/// diff is shown. A 10,000-line write is cut with the "more lines" note.
#[test]
fn a_writes_approval_shows_its_diff_and_after_an_edit_the_new_one() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "notes.txt", "alpha\nbeta\ngamma\n");
        let big: String = (0..10_000).map(|i| format!("row {i}\n")).collect();
        let sc = script(
            &s,
            serde_json::json!([
                {"tool_calls": [{"name": "write", "arguments": {
                    "path": "notes.txt", "content": "alpha\nBETA\ngamma\n"}}]},
                {"tool_calls": [{"name": "write", "arguments": {"path": "big.txt", "content": big}}]},
                {"text": "Written."},
            ]),
        );
        let mut t = session(&s, &sc, &["--autonomy", "manual"]);
        t.expect("retie> ");
        t.line("write them");
        t.expect("retie asks:");
        t.expect("command: write notes.txt");
        t.expect("-beta");
        t.expect("+BETA");
        t.expect("class:");
        t.expect("digest ");
        t.expect("approve?");
        t.line("e");
        t.expect("edit> ");
        t.type_("\x15");
        t.line(r#"{"path": "notes.txt", "content": "alpha\nbeta\ndelta\n"}"#);
        // The edited write ran: its diff, not the proposal's.
        t.expect("-gamma");
        t.expect("+delta");
        t.expect("retie asks:");
        t.expect("command: write big.txt");
        t.expect("+row 0");
        t.expect("more lines: `e` shows the whole arguments");
        t.expect("approve?");
        t.line("y");
        t.expect("Written.");
        end_with_ctrl_d(&s, &mut t);
        let out = t.output();
        assert_eq!(read(&s, "notes.txt"), "alpha\nbeta\ndelta\n");
        assert_eq!(read(&s, "big.txt"), big);
        assert!(
            out.contains("… 9961 more lines: /diff #"),
            "{leg:?}: the 10,000-line write is cut after it ran:\n{out}"
        );
        assert!(
            !out.contains("+row 100\r\n"),
            "{leg:?}: more than the first lines shown"
        );
        assert!(
            !out.contains("│ arguments: {"),
            "{leg:?}: the prompt showed the JSON, not the diff:\n{out}"
        );
    }
}

/// `/diff` shows the session's net change as diffs (each file before the
/// session against the workspace now), `/diff #ID` one action's, and
/// `retie replay --diff` the same outside the session; an undone action
/// counts for nothing.
#[test]
fn slash_diff_and_replay_diff_show_the_contents() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "a.txt", "one\ntwo\nthree\n");
        let sc = script(
            &s,
            serde_json::json!([
                {"tool_calls": [{"name": "edit", "arguments": {
                    "path": "a.txt", "old_string": "two", "new_string": "TWO"}}]},
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo new > b.txt"}}]},
                {"tool_calls": [{"name": "edit", "arguments": {
                    "path": "a.txt", "old_string": "three", "new_string": "THREE"}}]},
                {"text": "Done."},
            ]),
        );
        let mut t = session(&s, &sc, &[]);
        t.expect("retie> ");
        t.line("change them");
        t.expect("Done.");
        t.expect("retie> ");
        t.line("/diff");
        t.expect("net change");
        t.expect("a.txt  +2 -2");
        t.expect("-two");
        t.expect("-three");
        t.expect("+TWO");
        t.expect("+THREE");
        t.expect("b.txt  +1 -0 (new)");
        t.expect("+new");
        t.expect("retie> ");
        // One action's diff, though a later edit changed the file again:
        // its new side is found among the later change's pre-images.
        let first = t
            .output()
            .split("✓ #")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("the first action's id")
            .to_string();
        t.line(&format!("/diff #{first}"));
        t.expect("a.txt  +1 -1");
        t.expect("-two");
        t.expect("+TWO");
        t.expect("retie> ");
        t.line("/undo");
        t.expect("undone");
        t.expect("retie> ");
        let out_before = t.output().len();
        t.line("/diff");
        t.expect("net change");
        t.expect("+new");
        t.expect("retie> ");
        let after_undo = t.output()[out_before..].to_string();
        assert!(
            after_undo.contains("+TWO") && !after_undo.contains("+THREE"),
            "{leg:?}: the undone edit still counted:\n{after_undo}"
        );
        t.line("/diff #1");
        t.expect("no action #1");
        end_with_ctrl_d(&s, &mut t);
        let all = t.output();
        let sid = all
            .split("interactive session ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("the session's id")
            .to_string();
        let o = s
            .retie()
            .args(["replay", "--diff", &sid])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("replay --diff");
        let text = stdout(&o);
        for want in ["a.txt  +1 -1", "-two", "+TWO", "b.txt  +1 -0 (new)", "+new"] {
            assert!(
                text.contains(want),
                "{leg:?}: no {want:?} in retie replay --diff:\n{text}"
            );
        }
        assert!(!text.contains("THREE"), "{leg:?}:\n{text}");
    }
}

/// The status line before each prompt on a terminal: model, autonomy,
/// turn, tokens, the cost with a price in config, pending approvals; off
/// when stdout is not a terminal. `[agent] diff_lines` cuts a diff.
#[test]
fn the_status_line_shows_on_a_terminal_only_and_diff_lines_is_read() {
    for leg in legs() {
        let s = Scratch::new(leg);
        s.write_config("[agent]\ndiff_lines = 5\n[agent.prices.\"script\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n");
        let lines: String = (0..20).map(|i| format!("l{i}\n")).collect();
        let turns = serde_json::json!([
            {"tool_calls": [{"name": "write", "arguments": {"path": "l.txt", "content": lines}}]},
            {"text": "Wrote."},
        ]);
        let sc = script(&s, turns.clone());
        let mut t = session(&s, &sc, &[]);
        t.expect("── model script · autonomy gated · turn 0 · tokens 0 in / 0 out · $0.0000 · no approval pending");
        t.expect("retie> ");
        t.line("write");
        t.expect("+l3");
        t.expect("… 16 more lines: /diff #");
        t.expect("Wrote.");
        t.expect("── model script · autonomy gated · turn 2 · tokens ");
        end_with_ctrl_d(&s, &mut t);
        assert!(
            !t.output().contains("+l4"),
            "{leg:?}: diff_lines = 5 not honoured"
        );

        // stdout not a terminal: no status line.
        let s = Scratch::new(leg);
        let sc = script(&s, turns);
        let mut inner = s.retie();
        inner
            .arg("run")
            .arg(&s.ws)
            .args(["--provider", "script", "--script"])
            .arg(&sc);
        let mut c = std::process::Command::new("sh");
        c.arg("-c")
            .arg("\"$0\" \"$@\" | cat")
            .arg(inner.get_program())
            .args(inner.get_args());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.env_remove("RETIE_PROVIDER").env("NO_COLOR", "1");
        if let Some(d) = inner.get_current_dir() {
            c.current_dir(d);
        }
        let mut t = crate::pty::Pty::spawn(c);
        // stdout is a pipe (to cat, which shows it on the terminal).
        t.expect("retie> ");
        t.line("write");
        t.expect("Wrote.");
        t.expect("retie> ");
        t.type_("\x04");
        t.expect("closed");
        t.wait();
        assert!(
            !t.output().contains("── model"),
            "{leg:?}: a status line with stdout not a terminal:\n{}",
            t.output()
        );
    }
}
