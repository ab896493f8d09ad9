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
