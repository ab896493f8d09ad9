//! A file's change as a person reads it (issue 31): a compact unified
//! diff, every line escaped like any other text a file controls (a line
//! carrying `\e[2K` or U+202E is shown with the escape visible), tabs
//! expanded, coloured only when asked (green `+`, red `-`, dim context),
//! cut at a number of lines with a note naming where the rest is.
//!
//! One renderer for every screen that shows a change: the line after an
//! edit or a write, the approval prompt, `/diff` and `retie replay
//! --diff`. The diff itself is `similar`'s (Myers, ADR 0540).

use crate::{expand_tabs, visible, TAB};

/// Lines of context around each change.
const CONTEXT: usize = 2;

/// How a diff is shown.
#[derive(Debug, Clone)]
pub struct DiffStyle {
    /// SGR colours (a terminal without `NO_COLOR`).
    pub color: bool,
    /// Diff lines shown at most; the rest is counted in the note.
    pub max_lines: usize,
    /// Where the rest is, for the note: `/diff #13`. `None`: no pointer.
    pub more: Option<String>,
    /// Put before every line (an indent under the call's line).
    pub indent: &'static str,
}

impl Default for DiffStyle {
    fn default() -> Self {
        DiffStyle {
            color: false,
            max_lines: DEFAULT_DIFF_LINES,
            more: None,
            indent: "    ",
        }
    }
}

/// Diff lines shown after a change unless configured otherwise
/// (`[agent] diff_lines`, `--diff-lines`).
pub const DEFAULT_DIFF_LINES: usize = 40;

/// A side of a change as text, or why it is not text.
enum Side<'a> {
    Text(&'a str),
    Binary(usize),
}

fn side(b: Option<&[u8]>) -> Side<'_> {
    match b {
        None => Side::Text(""),
        Some(b) if b.contains(&0) => Side::Binary(b.len()),
        Some(b) => match std::str::from_utf8(b) {
            Ok(t) => Side::Text(t),
            Err(_) => Side::Binary(b.len()),
        },
    }
}

/// Lines added and removed between `old` and `new` (`None`: no file);
/// `None` when either side is binary (a NUL byte or invalid UTF-8).
pub fn line_counts(old: Option<&[u8]>, new: Option<&[u8]>) -> Option<(usize, usize)> {
    let (Side::Text(o), Side::Text(n)) = (side(old), side(new)) else {
        return None;
    };
    let d = similar::TextDiff::from_lines(o, n);
    let (mut add, mut del) = (0, 0);
    for c in d.iter_all_changes() {
        match c.tag() {
            similar::ChangeTag::Insert => add += 1,
            similar::ChangeTag::Delete => del += 1,
            similar::ChangeTag::Equal => {}
        }
    }
    Some((add, del))
}

/// The change from `old` to `new` (`None`: the file did not exist, or no
/// longer does), one string per line to print, each escaped and, with
/// `st.color`, coloured. A new file shows its first lines as added; a
/// binary side says `binary, OLD → NEW bytes`; no change says so.
pub fn file_diff(old: Option<&[u8]>, new: Option<&[u8]>, st: &DiffStyle) -> Vec<String> {
    let paint = |sgr: &str, s: &str| {
        if st.color {
            format!("{}\x1b[{sgr}m{s}\x1b[0m", st.indent)
        } else {
            format!("{}{s}", st.indent)
        }
    };
    let (o, n) = match (side(old), side(new)) {
        (Side::Text(o), Side::Text(n)) => (o, n),
        (a, b) => {
            let size = |s: Side<'_>, b: Option<&[u8]>| match (s, b) {
                (_, None) => "none".to_string(),
                (Side::Binary(n), _) => n.to_string(),
                (Side::Text(t), _) => t.len().to_string(),
            };
            return vec![paint(
                "2",
                &format!("binary, {} → {} bytes", size(a, old), size(b, new)),
            )];
        }
    };
    if o == n {
        return vec![paint("2", "(no change)")];
    }
    let diff = similar::TextDiff::from_lines(o, n);
    let mut lines: Vec<String> = Vec::new();
    for group in diff.grouped_ops(CONTEXT) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let (or, nr) = (first.old_range().start..last.old_range().end, {
            first.new_range().start..last.new_range().end
        });
        lines.push(paint(
            "36",
            &format!(
                "@@ -{} +{} @@",
                hunk_range(or.start, or.len()),
                hunk_range(nr.start, nr.len())
            ),
        ));
        for op in &group {
            for c in diff.iter_changes(op) {
                let (mark, sgr) = match c.tag() {
                    similar::ChangeTag::Delete => ('-', "31"),
                    similar::ChangeTag::Insert => ('+', "32"),
                    similar::ChangeTag::Equal => (' ', "2"),
                };
                let text = c.value();
                let text = text.strip_suffix('\n').unwrap_or(text);
                let mut shown = format!("{mark}{}", content_line(text));
                if c.missing_newline() {
                    shown.push_str("  (no newline at end)");
                }
                lines.push(paint(sgr, &shown));
            }
        }
    }
    cut(lines, st)
}

/// `start,len` of a hunk header (1-based; an empty range names the line
/// before it, as `diff -u` does).
fn hunk_range(start: usize, len: usize) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        n => format!("{},{n}", start + 1),
    }
}

/// One line of file content for a terminal: tabs expanded (to the next
/// multiple of [`TAB`], counted from the line's own start, so columns
/// line up as in the file), everything else that is not plainly visible
/// escaped ([`visible`]: controls, escape sequences, bidi).
pub fn content_line(s: &str) -> String {
    visible(&expand_tabs(s, TAB))
}

fn cut(mut lines: Vec<String>, st: &DiffStyle) -> Vec<String> {
    if lines.len() <= st.max_lines {
        return lines;
    }
    let more = lines.len() - st.max_lines;
    lines.truncate(st.max_lines);
    let note = match &st.more {
        Some(w) => format!("… {more} more lines: {w}"),
        None => format!("… {more} more lines"),
    };
    lines.push(if st.color {
        format!("{}\x1b[2m{note}\x1b[0m", st.indent)
    } else {
        format!("{}{note}", st.indent)
    });
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(max: usize) -> DiffStyle {
        DiffStyle {
            color: false,
            max_lines: max,
            more: Some("/diff #7".into()),
            indent: "",
        }
    }

    #[test]
    fn an_edit_shows_its_lines() {
        let old = b"a\nb\nc\nd\ne\nf\ng\n";
        let new = b"a\nb\nc\nD\ne\nf\ng\n";
        let d = file_diff(Some(old), Some(new), &plain(40));
        assert_eq!(d, ["@@ -2,5 +2,5 @@", " b", " c", "-d", "+D", " e", " f"]);
        assert_eq!(line_counts(Some(old), Some(new)), Some((1, 1)));
    }

    #[test]
    fn a_new_file_shows_its_first_lines_and_the_rest_is_counted() {
        let new: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
        let d = file_diff(None, Some(new.as_bytes()), &plain(40));
        assert_eq!(d.len(), 41);
        assert_eq!(d[0], "@@ -0,0 +1,10000 @@");
        assert_eq!(d[1], "+line 0");
        assert_eq!(d[40], "… 9961 more lines: /diff #7");
    }

    #[test]
    fn binary_says_so_with_sizes() {
        assert_eq!(
            file_diff(Some(b"ab\0c"), Some(b"\xff\xfe"), &plain(40)),
            ["binary, 4 → 2 bytes"]
        );
        assert_eq!(
            file_diff(None, Some(b"\0"), &plain(40)),
            ["binary, none → 1 bytes"]
        );
        assert_eq!(line_counts(None, Some(b"\0")), None);
    }

    /// A line of a file that carries an escape sequence or a bidi
    /// override reaches the terminal with the escape visible, coloured or
    /// not; the colours are the only SGR sequences in the output.
    #[test]
    fn hostile_lines_are_escaped() {
        let new = "ok\n\u{1b}[2K\u{1b}[1Afake\n\u{202e}txt.exe\nta\tb\n";
        for color in [false, true] {
            let st = DiffStyle { color, ..plain(40) };
            let d = file_diff(Some(b"ok\n"), Some(new.as_bytes()), &st);
            let all = d.join("\n");
            assert!(all.contains(r"+\e[2K\e[1Afake"), "{all:?}");
            assert!(all.contains(r"+\u{202e}txt.exe"), "{all:?}");
            assert!(all.contains("+ta      b"), "{all:?}");
            assert!(!all.contains('\u{202e}') && !all.contains('\t'), "{all:?}");
            let stripped = all
                .replace("\x1b[0m", "")
                .replace("\x1b[2m", "")
                .replace("\x1b[31m", "")
                .replace("\x1b[32m", "")
                .replace("\x1b[36m", "");
            assert!(!stripped.contains('\u{1b}'), "{all:?}");
            assert_eq!(all.contains('\u{1b}'), color);
        }
    }
}
