//! Whole trees (ADR 0211): a directory a transition creates or removes
//! together with everything beneath it is moved by one rename, not path by
//! path.
//!
//! Three moves, each between two places on one filesystem:
//! - *in from the layer*: a directory an apply creates, with all beneath
//!   it, renamed from the upper layer into the workspace (the run is over
//!   and its layer is consumed);
//! - *out to the kept files*: a directory an apply or an undo removes,
//!   with all beneath it, renamed into `<state>/kept/<entry>/` (ADR 0210's
//!   cache, a tree instead of one file);
//! - *in from the kept files*: the undo of that entry renames the tree back.
//!
//! Every move is checked where the tree lands, before anything else counts
//! on it: the tree must hold exactly the nodes the steps name (names,
//! kinds, modes, sizes, content hashes, symlink targets), every file a
//! plain file of one link, no directory carrying an overlay attribute. A
//! tree that does not match is moved back and the paths beneath it go the
//! per-path way, which judges each one. Only a batch transition (ADR 0208)
//! moves trees: its single `syncfs` makes the moved entries durable before
//! the journal's commit point, as it does every other path's.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{FileType, RenameFlags};
use rustix::io::Errno;

use crate::fsx;
use crate::journal::Step;
use crate::node::Node;
use crate::relpath::RelPath;

/// Which way a tree goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// Absent before, present after: moved in.
    In,
    /// Present before, absent after: moved out.
    Out,
}

/// A directory moved whole, and how many paths lie beneath it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Whole {
    pub(crate) path: RelPath,
    pub(crate) beneath: usize,
    pub(crate) way: Way,
}

/// The top-most directories of `steps` that go `way` whole: the directory
/// and every step beneath it go that way, and no other step lies beneath
/// it, and each step beneath it `fits`. (Every path beneath such a directory in the workspace or its source
/// is then a step of this transition, which the check after the move
/// confirms.)
pub(crate) fn plan(steps: &[Step], way: Way, fits: &dyn Fn(&Step) -> bool) -> Vec<Whole> {
    let goes = |s: &Step| match way {
        Way::In => s.before.is_none() && s.after.is_some(),
        Way::Out => s.before.is_some() && s.after.is_none(),
    };
    let is_top = |s: &Step| {
        goes(s)
            && match way {
                Way::In => matches!(s.after, Some(Node::Dir { .. })),
                Way::Out => matches!(s.before, Some(Node::Dir { .. })),
            }
    };
    // Candidate directory → (paths beneath, all of them go the same way).
    let mut cand: BTreeMap<&RelPath, (usize, bool)> = steps
        .iter()
        .filter(|s| is_top(s))
        .map(|s| (&s.path, (0, true)))
        .collect();
    if cand.is_empty() {
        return Vec::new();
    }
    for s in steps {
        let ok = goes(s) && fits(s);
        let mut up = s.path.parent();
        while let Some(a) = up {
            if let Some(c) = cand.get_mut(&a) {
                c.0 += 1;
                c.1 &= ok;
            }
            up = a.parent();
        }
    }
    let good: Vec<&RelPath> = cand
        .iter()
        .filter(|(_, (n, ok))| *ok && *n > 0)
        .map(|(p, _)| *p)
        .collect();
    good.iter()
        // Top-most only: a good directory beneath another moves with it.
        .filter(|p| !good.iter().any(|q| *q != **p && p.starts_with(q)))
        .map(|p| Whole {
            path: (*p).clone(),
            beneath: cand.get(*p).map_or(0, |c| c.0),
            way,
        })
        .collect()
}

/// Whether `path` lies strictly beneath one of `moved`.
pub(crate) fn beneath_any(path: &RelPath, moved: &[Whole]) -> bool {
    moved
        .iter()
        .any(|m| m.path != *path && path.starts_with(&m.path))
}

/// What a check after a move asks of each file besides its node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileRule {
    /// Files larger than this do not match (the kept files' bound).
    pub(crate) max_size: Option<u64>,
    /// Set each file's modification time to now once it matched (a tree
    /// taken back from the kept files stands for a copy of the
    /// pre-images, and a build tool must see the files changed).
    pub(crate) touch: bool,
}

/// Whether the directory `name` of `dir`, standing for workspace path
/// `top`, holds exactly what `want` gives for `top` and each path beneath
/// it, `beneath` paths in all; each file a plain file of one link, under
/// `rule`; no directory with an overlay attribute. Any error reading it is
/// a mismatch.
pub(crate) fn holds(
    dir: BorrowedFd<'_>,
    name: &str,
    top: &RelPath,
    want: &dyn Fn(&RelPath) -> Option<Node>,
    beneath: usize,
    rule: FileRule,
) -> bool {
    let Ok(Some(st)) = fsx::lstat_at(dir, name) else {
        return false;
    };
    if fsx::ftype(&st) != FileType::Directory
        || want(top)
            != Some(Node::Dir {
                mode: fsx::perm(&st),
            })
    {
        return false;
    }
    let Ok(sub) = fsx::open_subdir(dir, name) else {
        return false;
    };
    let mut seen = 0usize;
    walk(sub.as_fd(), top, want, rule, &mut seen) && seen == beneath
}

fn walk(
    dir: BorrowedFd<'_>,
    rel: &RelPath,
    want: &dyn Fn(&RelPath) -> Option<Node>,
    rule: FileRule,
    seen: &mut usize,
) -> bool {
    if overlay_attr(dir) {
        return false;
    }
    let Ok(names) = fsx::list_dir(dir) else {
        return false;
    };
    for raw in names {
        let Ok(path) = RelPath::child(Some(rel), &raw) else {
            return false;
        };
        let Some(w) = want(&path) else {
            return false;
        };
        *seen += 1;
        let name = path.file_name();
        let ok = match &w {
            Node::Dir { mode } => match (fsx::lstat_at(dir, name), fsx::open_subdir(dir, name)) {
                (Ok(Some(st)), Ok(sub)) => {
                    fsx::ftype(&st) == FileType::Directory
                        && fsx::perm(&st) == *mode
                        && walk(sub.as_fd(), &path, want, rule, seen)
                }
                _ => false,
            },
            Node::File { mode, size, hash } => {
                if rule.max_size.is_some_and(|m| *size > m) {
                    return false;
                }
                file_holds(dir, name, *mode, *size, hash, rule.touch)
            }
            Node::Symlink { .. } => {
                fsx::read_node(dir, name, &path, None)
                    .ok()
                    .flatten()
                    .as_ref()
                    == Some(&w)
            }
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether `name` of `dir` is a plain file of one link with this mode,
/// size and content.
fn file_holds(
    dir: BorrowedFd<'_>,
    name: &str,
    mode: u32,
    size: u64,
    hash: &crate::Hash,
    touch: bool,
) -> bool {
    let Ok(fd) = fsx::open_file_at(dir, name) else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(&fd) else {
        return false;
    };
    if fsx::ftype(&st) != FileType::RegularFile
        || st.st_nlink != 1
        || fsx::perm(&st) != mode
        || u64::try_from(st.st_size).ok() != Some(size)
    {
        return false;
    }
    let mut f = File::from(fd);
    match fsx::hash_stream(&mut fsx::ToEnd::new(&mut f, &st), None) {
        Ok((h, n)) if h == *hash && n == size => {}
        _ => return false,
    }
    !touch || crate::kept::touch(f.as_fd()).is_ok()
}

/// Whether directory `dir` carries an attribute of overlayfs (which,
/// moved into the workspace, the next sandbox's overlay would read).
fn overlay_attr(dir: BorrowedFd<'_>) -> bool {
    match fsx::xattr_names(dir) {
        Some(names) => names
            .iter()
            .any(|x| x.starts_with(b"trusted.overlay.") || x.starts_with(b"user.overlay.")),
        // Unreadable: not moved whole.
        None => true,
    }
}

/// Renames `from_name` of `from` to `to_name` of `to`, never replacing.
pub(crate) fn rename(
    from: BorrowedFd<'_>,
    from_name: &str,
    to: BorrowedFd<'_>,
    to_name: &str,
) -> Result<(), Errno> {
    rustix::fs::renameat_with(from, from_name, to, to_name, RenameFlags::NOREPLACE)
}
