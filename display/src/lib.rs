//! retie's text for a terminal, one copy for every crate that shows
//! something (the ledger's read model, dispatch, the snapshot's error
//! messages, the CLI): a leaf crate, so none of them depends upward for it.
//!
//! Text that came from a sandboxed command, a changeset, a model or the
//! ledger is shown to a person on a terminal. None of it may reach the
//! terminal as a control sequence: a `\e[1A\e[2K` after a diff line, or a
//! file name holding `\n` or `\r`, would rewrite what the person reads.
//! Everything such text holds that is not plainly visible is shown as an
//! escape instead.

use std::fmt::Write;

/// `s` with every control character (C0 including `\n` and `\t`, DEL,
/// C1), bidirectional override and invisible format character shown as
/// an escape (`\n`, `\r`, `\t`, `\e`, `\x7f`, `\u{202e}`), and the
/// backslash doubled so an escape cannot be faked. For names, paths and
/// one-line fields.
pub fn visible(s: &str) -> String {
    escape(s, false)
}

/// Like [`visible`] but keeps tabs: for a line of file content (a diff
/// line), where a tab is layout.
pub fn visible_line(s: &str) -> String {
    escape(s, true)
}

fn escape(s: &str, keep_tab: bool) -> String {
    if !s.chars().any(|c| needs_escape(c) || c == '\\') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' if keep_tab => out.push('\t'),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x1b' => out.push_str("\\e"),
            c if (c as u32) < 0x100 && needs_escape(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // bidirectional embeddings, overrides and isolates
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            // zero-width and direction marks, line/paragraph separators,
            // the byte-order mark
            | '\u{200b}'..='\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{feff}')
}

/// A command line as a shell would read it back: each argument quoted
/// when it needs to be, so `sh -c 'echo 1 > f1'` shows as typed. An
/// argument holding anything invisible is written in bash's `$'…'` form,
/// escapes visible.
pub fn shell_line(args: &[&str]) -> String {
    args.iter()
        .map(|a| shell_word(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_word(a: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c);
    if !a.is_empty() && a.chars().all(plain) {
        return a.to_string();
    }
    if a.chars().any(needs_escape) {
        let mut out = String::from("$'");
        for c in a.chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\x1b' => out.push_str("\\E"),
                c if needs_escape(c) && (c as u32) < 0x100 => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if needs_escape(c) => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        out.push('\'');
        return out;
    }
    format!("'{}'", a.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_sequences_never_pass() {
        let hostile = "ok\u{1b}[1A\u{1b}[2K\rclean\nfake\u{7}\u{9b}31m\u{202e}txt.exe\u{0}";
        for shown in [visible(hostile), visible_line(hostile)] {
            assert!(!shown.chars().any(needs_escape), "{shown:?}");
        }
        assert_eq!(visible("a\nb\\n"), "a\\nb\\\\n");
        assert_eq!(visible_line("\tx\u{1b}"), "\tx\\e");
        assert_eq!(visible("plain/ünïcode.txt"), "plain/ünïcode.txt");
    }

    #[test]
    fn command_lines_read_back_as_typed() {
        assert_eq!(
            shell_line(&["sh", "-c", "echo 1 > f1"]),
            "sh -c 'echo 1 > f1'"
        );
        assert_eq!(shell_line(&["echo", "it's"]), r"echo 'it'\''s'");
        assert_eq!(shell_line(&["printf", ""]), "printf ''");
        let l = shell_line(&["cat", "a\u{1b}[2Kb\n"]);
        assert_eq!(l, r"cat $'a\E[2Kb\n'");
        assert!(!l.chars().any(needs_escape));
    }

    #[test]
    fn bash_reads_the_quoted_line_back_to_the_same_arguments() {
        let args = [
            "x y",
            "it's",
            "a\nb",
            "\u{1b}[1A",
            "$(rm -rf /)",
            "`id`",
            "*",
            "~",
        ];
        let line = shell_line(&args);
        let Ok(o) = std::process::Command::new("bash")
            .args(["-c", &format!("printf '%s\\0' {line}")])
            .output()
        else {
            panic!("bash is needed for this test");
        };
        let got: Vec<String> = o
            .stdout
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        assert_eq!(got, args);
    }
}
