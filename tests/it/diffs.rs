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
