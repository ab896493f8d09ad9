//! The state of one path: a regular file, a symlink or a directory.

use serde::{Deserialize, Serialize};

use crate::hash::Hash;

/// What one path holds. Absence is `Option::<Node>::None`. Modes are the
/// permission bits (`st_mode & 0o7777`). Owners and timestamps are not
/// tracked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Node {
    /// A regular file; its content is the blob `hash`.
    File {
        /// Permission bits.
        mode: u32,
        /// Size in bytes.
        size: u64,
        /// blake3 of the content.
        hash: Hash,
    },
    /// A symbolic link (never followed).
    Symlink {
        /// The link target, verbatim.
        target: String,
        /// blake3 of the target bytes.
        hash: Hash,
    },
    /// A directory; its entries are separate paths.
    Dir {
        /// Permission bits.
        mode: u32,
    },
}

impl Node {
    /// A symlink node for `target`.
    pub fn symlink(target: String) -> Node {
        let hash = Hash::of(target.as_bytes());
        Node::Symlink { target, hash }
    }

    /// "file", "symlink" or "dir".
    pub fn kind_name(&self) -> &'static str {
        match self {
            Node::File { .. } => "file",
            Node::Symlink { .. } => "symlink",
            Node::Dir { .. } => "dir",
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self, Node::Dir { .. })
    }

    /// Content hash (files, symlinks); `None` for directories.
    pub fn hash(&self) -> Option<Hash> {
        match self {
            Node::File { hash, .. } | Node::Symlink { hash, .. } => Some(*hash),
            Node::Dir { .. } => None,
        }
    }

    /// Size in bytes: file length, target length, 0 for directories.
    pub fn size(&self) -> u64 {
        match self {
            Node::File { size, .. } => *size,
            Node::Symlink { target, .. } => target.len() as u64,
            Node::Dir { .. } => 0,
        }
    }

    /// Permission bits (symlinks: 0o777).
    pub fn mode(&self) -> u32 {
        match self {
            Node::File { mode, .. } | Node::Dir { mode } => *mode,
            Node::Symlink { .. } => 0o777,
        }
    }
}
