//! Overlay changes on the terminal: the review (the list and a diff, with
//! every control character escaped) and its question. The handling itself
//! (compute, conflicts, apply, keep) lives in `retie_dispatch::overlay`.

use std::io::{BufRead, Write};
use std::path::Path;

use retie_dispatch::overlay;
pub use retie_dispatch::overlay::{root_owner, Handled, OverlayRun, RunMeta, Snapshots};
use retie_dispatch::sandbox::JobUi;
use retie_snapshot::{Change, ChangeKind, Changeset, Node};

use crate::ui::{visible, visible_line};

/// What to do with the changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChangesMode {
    /// Apply them to the workspace (pre-images kept for undo).
    Apply,
    /// Throw them away.
    Discard,
    /// Show a summary and a diff, then ask on the terminal.
    Review,
}

impl From<ChangesMode> for overlay::ChangesMode {
    fn from(m: ChangesMode) -> Self {
        match m {
            ChangesMode::Apply => overlay::ChangesMode::Apply,
            ChangesMode::Discard => overlay::ChangesMode::Discard,
            ChangesMode::Review => overlay::ChangesMode::Review,
        }
    }
}

/// The terminal: lines on stderr, the review asked on `/dev/tty`.
pub struct Terminal;

impl JobUi for Terminal {
    fn say(&mut self, line: &str) {
        crate::ui::say_error(&line);
    }
    fn review(&mut self, r: &overlay::Review<'_>) -> Option<bool> {
        let full = print_review(r.cs, r.ws, r.upper, r.allow_blocked, false);
        if full {
            return ask("Apply these changes to the workspace? [y/N] ").map(|a| a == Answer::Yes);
        }
        match ask("Apply these changes to the workspace? [y/N/a: show all] ")? {
            Answer::All => {
                print_review(r.cs, r.ws, r.upper, r.allow_blocked, true);
                ask("Apply these changes to the workspace? [y/N] ").map(|a| a == Answer::Yes)
            }
            a => Some(a == Answer::Yes),
        }
    }
}

/// The terminal with nothing to record (`retie changes` outside an action).
impl overlay::ChangesHooks for Terminal {
    fn before_apply<'s>(
        &'s mut self,
        _cs: &Changeset,
        _manifest: Option<&retie_snapshot::Manifest>,
    ) -> overlay::Recording<'s> {
        Box::new(|| Ok(()))
    }
}

/// Say which interrupted changesets opening the snapshots rolled back.
pub fn report_recovery(snaps: &Snapshots) {
    for id in &snaps.rolled_back {
        eprintln!("retie: changeset {id} was interrupted by a crash and has been rolled back");
    }
}

fn sigil(k: &ChangeKind) -> char {
    match k {
        ChangeKind::Created => '+',
        ChangeKind::Deleted => '-',
        ChangeKind::Modified => '~',
        ChangeKind::ModeChanged => 'm',
        ChangeKind::TypeChanged => 't',
    }
}

/// A set larger than this is summarised per top directory unless the
/// person asks for all of it (issue 30: 50,000 lines help nobody).
pub(crate) const REVIEW_LIST_MAX: usize = 200;

/// Summary and unified diff of the text files, on stderr. A set of more
/// than [`REVIEW_LIST_MAX`] changes is summarised per top directory
/// unless `full`; returns whether everything was shown.
pub(crate) fn print_review(
    cs: &Changeset,
    ws: &Path,
    upper: &Path,
    allow_blocked: bool,
    full: bool,
) -> bool {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "retie: changes made by the command:");
    let all: Vec<&Change> = cs.to_apply(allow_blocked).collect();
    if !full && all.len() > REVIEW_LIST_MAX {
        let _ = write!(err, "{}", summary(&all));
        let _ = writeln!(
            err,
            "  {} changes: the paths and diffs are not listed one by one (`a` at the question, or `retie changes show RUN --all`)",
            all.len()
        );
        return false;
    }
    for c in &all {
        let _ = writeln!(err, "  {} {}", sigil(&c.kind), visible(c.path.as_str()));
    }
    for c in &all {
        let name = visible(c.path.as_str());
        // Whatever is not shown as a diff is said, never left out: the
        // review is what a person approves.
        for note in notes(c.base.as_ref(), c.new.as_ref()) {
            let _ = writeln!(err, "--- {name}: {note}");
        }
        let old = text_of(c.base.as_ref(), &ws.join(c.path.as_str()));
        let new = text_of(c.new.as_ref(), &upper.join(c.path.as_str()));
        // A file in place of a symlink or directory (or the reverse) is
        // diffed against nothing: its content is shown, not only the
        // type change.
        let none = || Content::Text(String::new(), false);
        let (old, new) = match (old, new) {
            (Content::Other, n @ Content::Text(..)) => (none(), n),
            (o @ Content::Text(..), Content::Other) => (o, none()),
            pair => pair,
        };
        match (old, new) {
            (Content::Text(old, old_lossy), Content::Text(new, new_lossy)) => {
                if old_lossy || new_lossy {
                    let _ = writeln!(
                        err,
                        "--- {name}: not UTF-8; each invalid byte is shown as U+FFFD"
                    );
                }
                // Every line of the diff, headers included, is shown with
                // its control characters escaped: file content must not
                // move the cursor or erase what the person is reading.
                let diff = similar::TextDiff::from_lines(&old, &new);
                let text = diff
                    .unified_diff()
                    .context_radius(3)
                    .header(&format!("a/{name}"), &format!("b/{name}"))
                    .to_string();
                for line in text.lines() {
                    let _ = writeln!(err, "{}", visible_line(line));
                }
            }
            (old, new) => {
                for (side, c) in [("old", old), ("new", new)] {
                    if let Content::Hidden(why) = c {
                        let _ = writeln!(err, "--- {name}: {side} content not shown: {why}");
                    }
                }
            }
        }
    }
    true
}

/// Per top directory (a file at the root stands for itself): how many
/// paths are created, modified, deleted or otherwise changed, and the
/// bytes the new files hold. Names escaped.
pub(crate) fn summary(all: &[&Change]) -> String {
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Row {
        created: usize,
        modified: usize,
        deleted: usize,
        other: usize,
        bytes: u64,
    }
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    for c in all {
        let p = c.path.as_str();
        let top = p.split('/').next().unwrap_or(p);
        let r = rows.entry(top).or_default();
        match c.kind {
            ChangeKind::Created => r.created += 1,
            ChangeKind::Modified => r.modified += 1,
            ChangeKind::Deleted => r.deleted += 1,
            ChangeKind::ModeChanged | ChangeKind::TypeChanged => r.other += 1,
        }
        if let Some(Node::File { size, .. }) = c.new {
            r.bytes += size;
        }
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(top, r)| {
            vec![
                visible(top),
                r.created.to_string(),
                r.modified.to_string(),
                r.deleted.to_string(),
                r.other.to_string(),
                crate::ui::human_size(r.bytes),
            ]
        })
        .collect();
    crate::ui::table(
        &[
            "top",
            "created",
            "modified",
            "deleted",
            "other",
            "new bytes",
        ],
        &body,
    )
}

/// A side of a change as the review shows it.
enum Content {
    /// Text (`true`: it was not UTF-8, invalid bytes replaced).
    Text(String, bool),
    /// Not shown, and why.
    Hidden(String),
    /// Nothing to show as content (a directory, a symlink: see [`notes`]).
    Other,
}

/// What a change does besides its content: a symlink's target, a mode
/// change, a type change.
fn notes(base: Option<&Node>, new: Option<&Node>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(Node::Symlink { target, .. }) = new {
        let was = match base {
            Some(Node::Symlink { target: t, .. }) => format!(" (was -> {})", visible(t)),
            _ => String::new(),
        };
        out.push(format!("symlink -> {}{was}", visible(target)));
    }
    let mode = |n: Option<&Node>| match n {
        Some(Node::File { mode, .. }) | Some(Node::Dir { mode }) => Some(*mode),
        _ => None,
    };
    if let (Some(b), Some(n)) = (mode(base), mode(new)) {
        if b != n {
            out.push(format!("mode {b:04o} -> {n:04o}"));
        }
    }
    if let (Some(b), Some(n)) = (base, new) {
        if b.kind_name() != n.kind_name() {
            out.push(format!("was a {}, now a {}", b.kind_name(), n.kind_name()));
        }
    }
    out
}

/// The content of a file node as a review shows it (empty text for an
/// absent node).
fn text_of(node: Option<&Node>, path: &Path) -> Content {
    match node {
        None => Content::Text(String::new(), false),
        Some(Node::File { size, .. }) if *size > 1 << 20 => {
            Content::Hidden(format!("{size} bytes, over the 1 MiB a review shows"))
        }
        Some(Node::File { size, .. }) => match std::fs::read(path) {
            Err(e) => Content::Hidden(format!("it could not be read ({e})")),
            Ok(bytes) if bytes.contains(&0) => {
                Content::Hidden(format!("binary ({size} bytes, holds a NUL byte)"))
            }
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => Content::Text(t, false),
                Err(e) => Content::Text(String::from_utf8_lossy(e.as_bytes()).into_owned(), true),
            },
        },
        Some(_) => Content::Other,
    }
}

/// An answer to the review's question.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Yes,
    No,
    /// Show every path and diff first.
    All,
}

/// Ask on the controlling terminal; `None` when there is none.
fn ask(prompt: &str) -> Option<Answer> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let mut w = tty.try_clone().ok()?;
    let _ = w.write_all(prompt.as_bytes());
    let _ = w.flush();
    let mut line = String::new();
    std::io::BufReader::new(tty).read_line(&mut line).ok()?;
    Some(match line.trim() {
        "y" | "Y" | "yes" | "YES" | "Yes" => Answer::Yes,
        "a" | "A" | "all" => Answer::All,
        _ => Answer::No,
    })
}
