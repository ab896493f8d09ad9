//! A change as the person sees it (issue 31): after an edit or a write
//! its diff, after a command the files it changed with their `+added
//! -removed` counts; the same lines in `/diff` and `retie replay --diff`.
//! The diff and every escape are the display crate's
//! ([`retie_display::file_diff`]); this only picks what to show.

use retie_dispatch::diffs::FileChange;
use retie_display::{file_diff, line_counts, DiffStyle};

use super::{visible, Style};

/// The diff of one file, indented, cut at `max` lines with a note naming
/// `more` (where the rest is: `/diff #13`).
pub fn file_lines(c: &FileChange, st: Style, max: usize, more: Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(n) = &c.note {
        out.push(format!("    {}", st.dim(&visible(n))));
    }
    let ds = DiffStyle {
        color: st.color,
        max_lines: max,
        more,
        indent: "    ",
    };
    if c.missing {
        return out;
    }
    out.extend(file_diff(c.before.as_deref(), c.after.as_deref(), &ds));
    out
}

/// One line per file: the path, `+added -removed` (or what it became:
/// new, deleted, binary with its sizes).
pub fn file_counts(changes: &[FileChange], st: Style) -> Vec<String> {
    changes
        .iter()
        .map(|c| {
            let counts = line_counts(c.before.as_deref(), c.after.as_deref());
            let what = match counts.filter(|_| !c.missing) {
                Some((a, r)) => {
                    let kind = match (&c.before, &c.after) {
                        (None, Some(_)) => " (new)",
                        (Some(_), None) => " (deleted)",
                        _ => "",
                    };
                    format!(
                        "{} {}{kind}",
                        st.green(&format!("+{a}")),
                        st.red(&format!("-{r}"))
                    )
                }
                None if c.missing => String::new(),
                None => {
                    let size = |b: &Option<Vec<u8>>| {
                        b.as_ref()
                            .map_or("none".to_string(), |b| b.len().to_string())
                    };
                    format!("binary, {} → {} bytes", size(&c.before), size(&c.after))
                }
            };
            let note = c
                .note
                .as_ref()
                .map(|n| format!(" {}", st.dim(&format!("({})", visible(n)))))
                .unwrap_or_default();
            format!("    {}  {what}{note}", visible(&c.path))
        })
        .collect()
}

/// What follows a call's line: for an edit or a write, the diff of its
/// file; for anything else that changed files (a command), the list with
/// counts and where the diff is.
pub fn after_call(
    tool: &str,
    action: Option<i64>,
    changes: &[FileChange],
    st: Style,
    max: usize,
) -> Vec<String> {
    let more = action.map(|a| format!("/diff #{a}"));
    if changes.is_empty() {
        return Vec::new();
    }
    if matches!(tool, "write" | "edit") && changes.len() == 1 {
        return file_lines(&changes[0], st, max, more);
    }
    let mut out = file_counts(changes, st);
    if let Some(m) = more {
        out.push(format!("    {}", st.dim(&format!("{m} shows the diff"))));
    }
    out
}
