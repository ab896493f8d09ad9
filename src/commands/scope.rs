//! Which workspace `undo`, `undo-all`, `log`, `replay`, `sessions` and
//! `changes list` look at: by default the workspace of the current
//! directory (the recorded workspace that is it or its nearest ancestor;
//! else the directory itself), said on stderr; `--all` for every
//! workspace in the ledger.

use std::path::{Path, PathBuf};

/// The workspace a ledger command acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every workspace (`--all`).
    All,
    /// One workspace, canonical.
    Workspace(PathBuf),
}

impl Scope {
    /// `--all`, or the workspace of the current directory among the
    /// `known` (recorded) workspaces. Said on stderr.
    pub fn of_cwd<'a>(all: bool, known: impl IntoIterator<Item = &'a str>) -> Scope {
        if all {
            return Scope::All;
        }
        let cwd = std::env::current_dir()
            .and_then(std::fs::canonicalize)
            .unwrap_or_else(|_| PathBuf::from("/nonexistent-cwd"));
        let s = Scope::Workspace(Self::nearest(&cwd, known));
        s.say();
        s
    }

    /// The workspace `ws` (an explicit one, e.g. a session's), said.
    pub fn of(ws: &Path) -> Scope {
        let s = Scope::Workspace(std::fs::canonicalize(ws).unwrap_or_else(|_| ws.to_path_buf()));
        s.say();
        s
    }

    /// The longest recorded workspace that `dir` is in, else `dir`.
    fn nearest<'a>(dir: &Path, known: impl IntoIterator<Item = &'a str>) -> PathBuf {
        known
            .into_iter()
            .map(Path::new)
            .filter(|k| dir.starts_with(k) && k.is_absolute())
            .max_by_key(|k| k.as_os_str().len())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| dir.to_path_buf())
    }

    fn say(&self) {
        if let Scope::Workspace(w) = self {
            eprintln!(
                "retie: workspace {} (--all for every workspace)",
                crate::ui::visible(&w.display().to_string())
            );
        }
    }

    /// Whether something recorded for workspace `ws` is in scope.
    pub fn holds(&self, ws: Option<&str>) -> bool {
        match self {
            Scope::All => true,
            Scope::Workspace(w) => ws.is_some_and(|x| Path::new(x) == w),
        }
    }

    /// "in workspace X" or "in the ledger", for messages.
    pub fn place(&self) -> String {
        match self {
            Scope::All => "in the ledger".into(),
            Scope::Workspace(w) => format!(
                "in workspace {} (--all for every workspace)",
                crate::ui::visible(&w.display().to_string())
            ),
        }
    }
}

/// The list flags `retie sessions` and `retie log` share: which kind of
/// session, how many, and whether the sessions whose provider failed
/// before their first turn are listed one by one (ADR 0525).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ListArgs {
    /// Only sessions of this kind: exec (`retie sandbox exec`), agent
    /// (`retie run`), retest, undo, apply (`retie changes apply`), probe.
    #[arg(long, value_enum)]
    pub kind: Option<KindArg>,
    /// Only the N newest sessions (after the other filters).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// List, one by one, the agent sessions whose provider failed before
    /// their first turn (otherwise one line counts them).
    #[arg(long)]
    pub unstarted: bool,
}

/// A kind of session (`retie_ledger::model::session_kind`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindArg {
    Exec,
    Agent,
    Retest,
    Undo,
    Apply,
    Probe,
}

impl KindArg {
    fn name(self) -> &'static str {
        match self {
            KindArg::Exec => "exec",
            KindArg::Agent => "agent",
            KindArg::Retest => "retest",
            KindArg::Undo => "undo",
            KindArg::Apply => "apply",
            KindArg::Probe => "probe",
        }
    }
}

/// What [`ListArgs::select`] kept.
pub struct Selected<T> {
    pub items: Vec<T>,
    /// Sessions whose provider failed before their first turn, left out
    /// (the newest last).
    pub unstarted: Vec<T>,
    /// Sessions left out by `--limit`.
    pub older: usize,
}

impl ListArgs {
    /// The sessions to list, in their order (oldest first): those of the
    /// kind asked, without the ones that failed before their first turn
    /// (unless `--unstarted`), the newest N.
    pub fn select<T>(
        &self,
        items: Vec<T>,
        kind: impl Fn(&T) -> &str,
        unstarted: impl Fn(&T) -> bool,
    ) -> Selected<T> {
        let mut keep = Vec::new();
        let mut folded = Vec::new();
        for it in items {
            if self.kind.is_some_and(|k| k.name() != kind(&it)) {
                continue;
            }
            if !self.unstarted && unstarted(&it) {
                folded.push(it);
            } else {
                keep.push(it);
            }
        }
        let mut older = 0;
        if let Some(n) = self.limit {
            older = keep.len().saturating_sub(n);
            keep.drain(..older);
        }
        Selected {
            items: keep,
            unstarted: folded,
            older,
        }
    }

    /// The header line: how many of what are listed, of which kind,
    /// where.
    pub fn header(&self, what: &str, scope: &Scope, shown: usize) -> String {
        format!(
            "{shown} {what}{}{} {}{}",
            if shown == 1 { "" } else { "s" },
            self.kind
                .map(|k| format!(" of kind {}", k.name()))
                .unwrap_or_default(),
            scope.place(),
            self.limit
                .map(|n| format!(", the newest {n} at most"))
                .unwrap_or_default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_recorded_workspace_wins() {
        let known = ["/p", "/p/sub", "/q"];
        assert_eq!(
            Scope::nearest(Path::new("/p/sub/x"), known),
            PathBuf::from("/p/sub")
        );
        assert_eq!(
            Scope::nearest(Path::new("/p/x"), known),
            PathBuf::from("/p")
        );
        assert_eq!(
            Scope::nearest(Path::new("/pq"), known),
            PathBuf::from("/pq")
        );
    }
}
