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
    fn review(
        &mut self,
        cs: &Changeset,
        ws: &Path,
        upper: &Path,
        allow_blocked: bool,
    ) -> Option<bool> {
        print_review(cs, ws, upper, allow_blocked);
        ask("Apply these changes to the workspace? [y/N] ")
    }
}

impl overlay::ChangesHooks for Terminal {
    fn say(&mut self, line: &str) {
        JobUi::say(self, line);
    }
    fn review(
        &mut self,
        cs: &Changeset,
        ws: &Path,
        upper: &Path,
        allow_blocked: bool,
    ) -> Option<bool> {
        JobUi::review(self, cs, ws, upper, allow_blocked)
    }
    fn before_apply<'s>(&'s mut self, _cs: &Changeset) -> overlay::Recording<'s> {
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

/// Summary and unified diff of the text files, on stderr.
pub(crate) fn print_review(cs: &Changeset, ws: &Path, upper: &Path, allow_blocked: bool) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "retie: changes made by the command:");
    let all: Vec<&Change> = cs.to_apply(allow_blocked).collect();
    for c in &all {
        let _ = writeln!(err, "  {} {}", sigil(&c.kind), visible(c.path.as_str()));
    }
    for c in &all {
        let old = text_of(c.base.as_ref(), &ws.join(c.path.as_str()));
        let new = text_of(c.new.as_ref(), &upper.join(c.path.as_str()));
        if let (Some(old), Some(new)) = (old, new) {
            // Every line of the diff, headers included, is shown with its
            // control characters escaped: file content must not move the
            // cursor or erase what the person is reading.
            let diff = similar::TextDiff::from_lines(&old, &new);
            let name = visible(c.path.as_str());
            let text = diff
                .unified_diff()
                .context_radius(3)
                .header(&format!("a/{name}"), &format!("b/{name}"))
                .to_string();
            for line in text.lines() {
                let _ = writeln!(err, "{}", visible_line(line));
            }
        }
    }
}

/// The text of a file node (empty for an absent one); `None` for binary,
/// large or non-file nodes.
fn text_of(node: Option<&Node>, path: &Path) -> Option<String> {
    match node {
        None => Some(String::new()),
        Some(Node::File { size, .. }) if *size <= 1 << 20 => {
            let bytes = std::fs::read(path).ok()?;
            if bytes.contains(&0) {
                return None;
            }
            String::from_utf8(bytes).ok()
        }
        _ => None,
    }
}

/// Ask on the controlling terminal; `None` when there is none.
fn ask(prompt: &str) -> Option<bool> {
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
    Some(matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}
