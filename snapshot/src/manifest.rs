//! The manifest of a large change (issue 30, ADR 0209): every path it
//! touches with what was there and what it becomes (kind, mode, size,
//! blake3), one JSON object a line in path order, named by the blake3 of
//! those bytes. The ledger records the name and the counts in one entry
//! of constant size, however many paths; the bytes go into the blob store
//! in the same durable batch as the pre-images, and the journal entry
//! names them so `gc` keeps them as long as the entry can be undone.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::changeset::Changeset;
use crate::hash::Hash;
use crate::journal::Entry;
use crate::node::Node;
use crate::relpath::RelPath;

/// One path of a manifest: what the workspace held (`None`: absent) and
/// what it is set to (`None`: removed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestLine {
    /// Workspace-relative path.
    pub path: RelPath,
    /// What the path held before.
    pub before: Option<Node>,
    /// What it holds after.
    pub after: Option<Node>,
}

/// A manifest's bytes, its name and its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// blake3 of [`Manifest::bytes`]: the name the ledger records.
    pub hash: Hash,
    /// The canonical encoding: one [`ManifestLine`] as JSON a line, in
    /// path order, each line ending in `\n`.
    pub bytes: Arc<Vec<u8>>,
    /// Paths it names.
    pub paths: usize,
    /// Of which created (absent before).
    pub created: usize,
    /// Of which removed (absent after).
    pub deleted: usize,
    /// Of which changed in place (content, mode or type).
    pub modified: usize,
    /// Bytes of the files it sets (their sizes added).
    pub new_bytes: u64,
}

impl Manifest {
    /// The manifest of `lines` (sorted here by path; a path named twice
    /// keeps its first line, as the engine does).
    pub fn of(mut lines: Vec<ManifestLine>) -> Manifest {
        lines.sort_by(|a, b| a.path.cmp(&b.path));
        lines.dedup_by(|a, b| a.path == b.path);
        let mut bytes = Vec::with_capacity(lines.len() * 160);
        let (mut created, mut deleted, mut modified, mut new_bytes) = (0, 0, 0, 0u64);
        for l in &lines {
            match (&l.before, &l.after) {
                (None, Some(_)) => created += 1,
                (Some(_), None) => deleted += 1,
                _ => modified += 1,
            }
            if let Some(Node::File { size, .. }) = &l.after {
                new_bytes += size;
            }
            // A struct of strings, numbers and hex: serialising it cannot
            // fail; were it ever to, the line would be missing and the
            // count below says so against the ledger's.
            if serde_json::to_writer(&mut bytes, l).is_ok() {
                bytes.push(b'\n');
            }
        }
        Manifest {
            hash: Hash::of(&bytes),
            bytes: Arc::new(bytes),
            paths: lines.len(),
            created,
            deleted,
            modified,
            new_bytes,
        }
    }

    /// What applying `cs` does (its changes, and its blocked ones too when
    /// `allow_blocked`), judged against the base the command saw.
    pub fn of_changeset(cs: &Changeset, allow_blocked: bool) -> Manifest {
        Manifest::of(
            cs.to_apply(allow_blocked)
                .map(|c| ManifestLine {
                    path: c.path.clone(),
                    before: c.base.clone(),
                    after: c.new.clone(),
                })
                .collect(),
        )
    }

    /// What undoing `entry` does: each of its steps the other way round.
    pub fn of_undo(entry: &Entry) -> Manifest {
        Manifest::of(
            entry
                .steps
                .iter()
                .map(|s| ManifestLine {
                    path: s.path.clone(),
                    before: s.after.clone(),
                    after: s.before.clone(),
                })
                .collect(),
        )
    }

    /// Reads a manifest's bytes back, checking them against `hash` (the
    /// name the ledger recorded): `None` when they do not hash to it or a
    /// line is not a manifest line.
    pub fn parse(bytes: &[u8], hash: &Hash) -> Option<Vec<ManifestLine>> {
        if Hash::of(bytes) != *hash {
            return None;
        }
        bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: u64, b: &[u8]) -> Node {
        Node::File {
            mode: 0o644,
            size,
            hash: Hash::of(b),
        }
    }

    fn line(p: &str, before: Option<Node>, after: Option<Node>) -> ManifestLine {
        ManifestLine {
            path: RelPath::new(p).expect("path"),
            before,
            after,
        }
    }

    #[test]
    fn the_same_changes_in_any_order_give_the_same_name() {
        let a = vec![
            line("b/x", None, Some(file(3, b"abc"))),
            line("a", Some(file(1, b"a")), None),
            line("c", Some(file(1, b"a")), Some(file(2, b"bb"))),
        ];
        let mut b = a.clone();
        b.reverse();
        let (ma, mb) = (Manifest::of(a), Manifest::of(b));
        assert_eq!(ma.hash, mb.hash);
        assert_eq!(ma.bytes, mb.bytes);
        assert_eq!(
            (ma.paths, ma.created, ma.deleted, ma.modified, ma.new_bytes),
            (3, 1, 1, 1, 5)
        );
        let back = Manifest::parse(&ma.bytes, &ma.hash).expect("parses");
        assert_eq!(
            back.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(),
            ["a", "b/x", "c"]
        );
    }

    #[test]
    fn a_changed_byte_is_not_read_as_the_manifest() {
        let m = Manifest::of(vec![line("a", None, Some(file(1, b"a")))]);
        let mut bytes = m.bytes.to_vec();
        bytes[3] ^= 1;
        assert!(Manifest::parse(&bytes, &m.hash).is_none());
        // A different size is a different manifest.
        let n = Manifest::of(vec![line("a", None, Some(file(2, b"a")))]);
        assert_ne!(m.hash, n.hash);
    }
}
