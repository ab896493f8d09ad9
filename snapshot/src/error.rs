//! The crate's one error type. Every variant that concerns a file names it.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::node::Node;
use crate::relpath::RelPath;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One path whose current state is not the one an operation expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The workspace-relative path.
    pub path: RelPath,
    /// What the operation expected to find (`None`: nothing).
    pub expected: Option<Node>,
    /// What is there now (`None`: nothing).
    pub found: Option<Node>,
}

/// Why something under the workspace or state dir could not be done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on a path failed.
    #[error("{op} {}", Shown(&path.to_string_lossy()))]
    Io {
        /// What was being done ("open", "rename", ...).
        op: &'static str,
        /// The path, absolute or relative to the workspace.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Resolving a workspace path would cross a symlink, a magic link or
    /// leave the workspace (openat2 answered ELOOP or EXDEV).
    #[error(
        "refusing to resolve {} inside the workspace: a component is a symlink or leaves it",
        Shown(path.as_str())
    )]
    Boundary {
        /// The workspace-relative path.
        path: RelPath,
        /// The OS error (ELOOP, EXDEV).
        #[source]
        source: io::Error,
    },
    /// A name is not a valid normalized relative path.
    #[error("invalid path {name:?}: {reason}")]
    InvalidPath {
        /// The name as given (lossy).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A path in the workspace holds a fifo, socket or device node where a
    /// file, symlink or directory was expected.
    #[error("{} is a special file ({what}); refusing to touch it", Shown(path.as_str()))]
    SpecialFile {
        /// The workspace-relative path.
        path: RelPath,
        /// "fifo", "socket", "char device", "block device".
        what: &'static str,
    },
    /// The real workspace changed after the changeset's base was taken;
    /// nothing was applied.
    #[error("the workspace changed since the changeset was computed; nothing applied; conflicting paths: {}", PathList(.paths))]
    Conflict {
        /// Each conflicting path with what was expected and found.
        paths: Vec<Mismatch>,
    },
    /// Undo refused: these paths were edited after the entry was applied.
    #[error("undo of {id} refused (use force to override); edited since: {}", PathList(.paths))]
    UndoRefused {
        /// The journal entry that was to be undone.
        id: String,
        /// Each edited path with what the entry left and what is there now.
        paths: Vec<Mismatch>,
    },
    /// A change needs a parent directory that will not exist, or removes a
    /// directory that holds entries outside the changeset.
    #[error("cannot apply {}: {reason}; nothing applied", Shown(path.as_str()))]
    Unapplicable {
        /// The workspace-relative path.
        path: RelPath,
        /// Why.
        reason: &'static str,
    },
    /// The content source (upper layer or blob) no longer has the content the
    /// changeset recorded.
    #[error(
        "content of {} changed since it was hashed (expected blake3 {expected})",
        Shown(path)
    )]
    SourceChanged {
        /// The path (workspace-relative for the upper, blob path for the store).
        path: String,
        /// The hash that was recorded.
        expected: String,
    },
    /// A blob is missing from the store.
    #[error("blob {hash} is missing from the store")]
    MissingBlob {
        /// The blake3 hash in hex.
        hash: String,
    },
    /// A blob is not found and a file of the store's `packs/` cannot be
    /// read as a pack (it may have held it).
    #[error("blob {hash} is missing from the store, and {} is not a readable pack ({why}); it may have held the blob: restore the file from a backup, or move it aside to undo what needs no blob of it", path.display())]
    DamagedPack {
        /// The damaged pack.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        why: String,
        /// The blob looked for.
        hash: String,
    },
    /// No journal entry with this id.
    #[error("no journal entry {id}")]
    UnknownEntry {
        /// The id asked for.
        id: String,
    },
    /// The entry is not in a state the operation accepts.
    #[error("journal entry {id} is {state}; {what}")]
    EntryState {
        /// The entry id.
        id: String,
        /// Its current state.
        state: &'static str,
        /// What was expected.
        what: &'static str,
    },
    /// Incomplete journal entries exist: run `recover` before anything else.
    #[error("incomplete journal entries need recovery first: {}", .ids.join(", "))]
    RecoveryNeeded {
        /// The pending entry ids.
        ids: Vec<String>,
    },
    /// A journal file could not be read or written as JSON.
    #[error("journal file {}", Shown(&path.to_string_lossy()))]
    Journal {
        /// The journal file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// What had to be recorded before the workspace was touched was not
    /// (see [`crate::apply_alongside`]): nothing was applied.
    #[error("applying {id}: the changes could not be recorded first; nothing was applied")]
    NotRecorded {
        /// The journal entry id (rolled back).
        id: String,
    },
    /// Applying failed part-way; the entry was rolled back to its pre-images.
    #[error(
        "applying {id} failed at {}; rolled back, nothing applied",
        Shown(path)
    )]
    RolledBack {
        /// The journal entry id.
        id: String,
        /// The path being changed when it failed.
        path: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// Applying failed and rolling back failed too: the entry stays pending
    /// and `recover` must be run.
    #[error(
        "applying {id} failed and rollback failed at {}; run recovery",
        Shown(path)
    )]
    RollbackFailed {
        /// The journal entry id.
        id: String,
        /// The path being restored when rollback failed.
        path: String,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Wraps an OS error with the operation and path.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Wraps a rustix errno for a workspace-relative path; ELOOP and EXDEV
    /// from openat2 are boundary refusals.
    pub(crate) fn at(op: &'static str, path: &RelPath, e: rustix::io::Errno) -> Error {
        if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::XDEV {
            Error::Boundary {
                path: path.clone(),
                source: e.into(),
            }
        } else {
            Error::Io {
                op,
                path: PathBuf::from(path.as_str()),
                source: e.into(),
            }
        }
    }

    /// The paths listed by a conflict or undo refusal, else empty.
    pub fn mismatched_paths(&self) -> Vec<&RelPath> {
        match self {
            Error::Conflict { paths } | Error::UndoRefused { paths, .. } => {
                paths.iter().map(|m| &m.path).collect()
            }
            _ => Vec::new(),
        }
    }
}

struct PathList<'a>(&'a [Mismatch]);

impl fmt::Display for PathList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", Shown(m.path.as_str()))?;
        }
        Ok(())
    }
}

/// A name from the workspace (which a sandboxed command chose) as it may
/// reach a terminal in an error message: `retie_display::visible`, so that
/// a file name cannot move the cursor, set a window title or fake a line
/// of retie's output.
pub struct Shown<'a>(pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&retie_display::visible(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_errors_cannot_drive_the_terminal() {
        let name = "x\u{1b}]0;PWNED\u{7}\u{1b}[2K\rretie: undo complete\n\u{202e}\\";
        let e = Error::SpecialFile {
            path: RelPath::new(name).expect("a valid relative path"),
            what: "fifo",
        };
        let shown = e.to_string();
        assert!(
            !shown.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{shown:?}"
        );
        assert!(
            shown.starts_with(r"x\e]0;PWNED\x07\e[2K\rretie: undo complete\n\u{202e}\\ is"),
            "{shown}"
        );
    }
}
