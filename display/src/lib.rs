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

mod diff;
pub use diff::{content_line, file_diff, line_counts, DiffStyle, DEFAULT_DIFF_LINES};

/// Columns of a tab stop when a tab is shown as spaces (a preview, a diff
/// line): 8, as a terminal, `expand(1)` and `less` show them, so a file
/// reads with the layout it has in the person's own pager (ADR 0540).
pub const TAB: usize = 8;

/// An error's line with the causes that line leaves out (the OS error of
/// a failed `open`: "open upper x: Permission denied (os error 13)"),
/// each once: a cause whose text the line already holds is not repeated,
/// and each on the line (its own line breaks become " / ": a cause may
/// carry a tool's output, `git config`'s stderr read from the workspace's
/// files, which must not start a line of its own on the terminal).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let t = s
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" / ");
        if !t.is_empty() && !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
        src = s.source();
    }
    msg
}

/// `s` with every tab replaced by spaces up to the next multiple of
/// `width` columns (counted in characters from the start of `s`; a line
/// break starts the count again). Nothing else changes: escape after.
pub fn expand_tabs(s: &str, width: usize) -> String {
    if !s.contains('\t') {
        return s.to_string();
    }
    let width = width.max(1);
    let mut out = String::with_capacity(s.len() + 16);
    let mut col = 0usize;
    for c in s.chars() {
        match c {
            '\t' => {
                let n = width - col % width;
                out.extend(std::iter::repeat(' ').take(n));
                col += n;
            }
            '\n' => {
                out.push(c);
                col = 0;
            }
            c => {
                out.push(c);
                col += 1;
            }
        }
    }
    out
}

/// One line of a tool's result shown to a person (the preview after a
/// call): tabs as spaces ([`expand_tabs`] to [`TAB`]), every control
/// character, escape sequence and bidi character escaped ([`visible`]).
pub fn preview(s: &str) -> String {
    visible(&expand_tabs(s, TAB))
}

/// Text made of parts already made visible (a [`shell_line`], a message
/// holding [`visible`] names) for a terminal: whatever could still act
/// on the terminal is escaped like [`visible`] does, but a backslash is
/// left alone (the parts' own escapes are not doubled). Line breaks are
/// kept when `keep_newline`, else escaped.
pub fn visible_again(s: &str, keep_newline: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' || (keep_newline && c == '\n') || !needs_escape(c) {
            out.push(c);
        } else {
            out.push_str(&escape(c.encode_utf8(&mut [0u8; 4]), false));
        }
    }
    out
}

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

/// Whether a terminal would act on `c`, or a person could not see it:
/// the one table of such characters for every crate (the policy crate's
/// gate question uses it too, with its own rendering). C0 and C1 controls
/// and DEL; the soft hyphen; zero-width spaces, joiners and direction
/// marks; line and paragraph separators; bidirectional embeddings,
/// overrides and isolates; word joiner, invisible operators and the
/// deprecated format characters; the byte-order mark; interlinear
/// annotation characters.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{ad}'
            | '\u{200b}'..='\u{200f}'
            // separators, then bidirectional embeddings and overrides
            | '\u{2028}'..='\u{202e}'
            // word joiner ... isolates ... deprecated format characters
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}')
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

    /// Issue 31: a preview shows a file's tabs as the layout they are,
    /// and still shows every control, escape sequence and bidi character
    /// as an escape.
    /// One table for every crate: each character either escaper caught
    /// before they shared it (the policy's soft hyphen, word joiner,
    /// invisible operators and annotation characters were missing here)
    /// is escaped by `visible`, `visible_line` and `shell_line`.
    #[test]
    fn every_invisible_character_is_escaped_everywhere() {
        let chars = (0u32..0x20)
            .chain(0x7f..=0x9f)
            .chain([0xad, 0xfeff])
            .chain(0x200b..=0x200f)
            .chain(0x2028..=0x202e)
            .chain(0x2060..=0x206f)
            .chain(0xfff9..=0xfffb)
            .filter_map(char::from_u32)
            .filter(|&c| c != '\t');
        for c in chars {
            let s = format!("a{c}b");
            for shown in [visible(&s), visible_line(&s), shell_line(&["echo", &s])] {
                assert!(!shown.contains(c), "U+{:04X} passed: {shown:?}", c as u32);
            }
        }
        assert_eq!(visible("caf\u{e9} \u{2713}"), "caf\u{e9} \u{2713}");
    }

    #[test]
    fn previews_keep_whitespace_and_escape_the_rest() {
        assert_eq!(
            expand_tabs("1\tdef add(a, b):", 8),
            "1       def add(a, b):"
        );
        assert_eq!(expand_tabs("\tx\n12\ty", 4), "    x\n12  y");
        assert_eq!(preview("1\tdef add(a, b):"), "1       def add(a, b):");
        let p = preview("7\tx = 1\u{1b}[2K\r\u{202e}\u{7}");
        assert_eq!(p, r"7       x = 1\e[2K\r\u{202e}\x07");
        assert!(!p.chars().any(needs_escape), "{p:?}");
    }

    #[test]
    fn visible_again_escapes_what_acts_and_keeps_escapes_made() {
        let line = shell_line(&["sh", "-c", "printf 'a\tb'\n"]);
        assert_eq!(visible_again(&line, false), line);
        assert_eq!(visible_again("a\u{1b}[2J\nb", false), r"a\e[2J\nb");
        assert_eq!(visible_again("a\u{1b}[2J\nb", true), "a\\e[2J\nb");
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

#[cfg(test)]
mod cause_tests {
    use super::with_causes;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn causes_are_added_once_and_on_one_line() {
        let e = E(
            "open upper secret",
            Some(Box::new(E("Permission denied (os error 13)", None))),
        );
        assert_eq!(
            with_causes(&e),
            "open upper secret: Permission denied (os error 13)"
        );
        // A cause the line already holds is not repeated.
        let e = E("reading x: gone", Some(Box::new(E("gone", None))));
        assert_eq!(with_causes(&e), "reading x: gone");
        // A cause's own line breaks (a tool's stderr) stay on the line.
        let e = E(
            "git config failed",
            Some(Box::new(E(
                "error: bad\nretie: applied 3 change(s)\n",
                None,
            ))),
        );
        let t = with_causes(&e);
        assert!(!t.contains('\n'), "{t:?}");
        assert_eq!(
            t,
            "git config failed: error: bad / retie: applied 3 change(s)"
        );
    }
}
