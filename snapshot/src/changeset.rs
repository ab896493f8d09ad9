//! Computing a changeset from an overlay upper layer.
//!
//! The upper layer is walked (never the whole lower), so the cost grows with
//! what the command changed, not with the workspace. For each upper entry the
//! lower counterpart is looked up:
//!
//! - a char device 0:0 is a whiteout: the lower entry (and, for a directory,
//!   its whole subtree) is deleted;
//! - a directory carrying `user.overlay.opaque="y"` (or
//!   `trusted.overlay.opaque`), or one that replaces a lower non-directory,
//!   lists its complete content: lower entries missing from it are deleted;
//! - a non-opaque directory over a lower directory is merged: only its
//!   entries changed, plus possibly its mode;
//! - files and symlinks are compared by content hash and mode; a copy-up with
//!   no difference is not a change;
//! - fifos, sockets, devices other than 0:0 and entries with overlay
//!   metacopy/redirect xattrs are refused and reported, never applied.
//!
//! Renames appear as delete + create (overlay with `userxattr` has no
//! redirects). Code-running plants (the table in [`crate::plants`]: git
//! hooks and config wherever a git dir is, `.envrc`, editors' auto-run
//! files, setuid/setgid files and directories, a home directory's start-up
//! files) and caller-protected paths are reported as blocked.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::FileType;
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fsx::{self, Root};
use crate::journal::new_id;
use crate::node::Node;
use crate::plants::{self, Plant};
use crate::relpath::RelPath;

/// How one path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Absent before, present now.
    Created,
    /// Same kind, different content or target (mode may differ too).
    Modified,
    /// Present before, absent now.
    Deleted,
    /// Same kind and content, different permission bits.
    ModeChanged,
    /// A different kind (file, symlink, directory) now.
    TypeChanged,
}

/// One changed path: the base the command saw (the lower) and the new state
/// (the upper). Hashes are blake3 of content (files) or target (symlinks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Workspace-relative path.
    pub path: RelPath,
    /// How it changed.
    pub kind: ChangeKind,
    /// The lower's version (`None`: absent).
    pub base: Option<Node>,
    /// The new version (`None`: deleted).
    pub new: Option<Node>,
}

impl Change {
    fn new(path: RelPath, base: Option<Node>, new: Option<Node>) -> Option<Change> {
        let kind = match (&base, &new) {
            (None, None) => return None,
            (None, Some(_)) => ChangeKind::Created,
            (Some(_), None) => ChangeKind::Deleted,
            (Some(b), Some(n)) if b == n => return None,
            (Some(b), Some(n)) if b.kind_name() != n.kind_name() => ChangeKind::TypeChanged,
            (Some(b), Some(n)) if b.hash() == n.hash() => ChangeKind::ModeChanged,
            (Some(_), Some(_)) => ChangeKind::Modified,
        };
        Some(Change {
            path,
            kind,
            base,
            new,
        })
    }

    /// blake3 of the base content, if the base is a file or symlink.
    pub fn base_hash(&self) -> Option<crate::Hash> {
        self.base.as_ref().and_then(Node::hash)
    }

    /// blake3 of the new content, if the new state is a file or symlink.
    pub fn new_hash(&self) -> Option<crate::Hash> {
        self.new.as_ref().and_then(Node::hash)
    }
}

/// Why a change is blocked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockReason {
    /// A code-running plant: something outside the sandbox would run it
    /// later. Carries the name of the [`crate::PLANTS`] entry it matches
    /// (see [`BlockReason::plant`] for the entry and its reason).
    Plant(String),
    /// A caller-protected path (ledger, state files).
    Protected,
    /// Depends on another blocked change (a parent's creation, or a
    /// directory removal whose entries are blocked).
    DependsOnBlocked,
}

impl BlockReason {
    /// The plants-table entry, for [`BlockReason::Plant`].
    pub fn plant(&self) -> Option<&'static Plant> {
        match self {
            BlockReason::Plant(name) => plants::plant(name),
            _ => None,
        }
    }
}

impl std::fmt::Display for BlockReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockReason::Plant(name) => match plants::plant(name) {
                Some(p) => write!(f, "{name}: {}", p.reason),
                None => write!(f, "{name}"),
            },
            BlockReason::Protected => f.write_str("protected path"),
            BlockReason::DependsOnBlocked => f.write_str("depends on a blocked change"),
        }
    }
}

/// A change that is applied only with [`crate::ApplyOptions::allow_blocked`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// The change.
    pub change: Change,
    /// Why it is blocked.
    pub reason: BlockReason,
}

/// Why an upper entry is refused (never applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseReason {
    /// A fifo.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device other than a 0:0 whiteout.
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// A block device.
    BlockDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
    /// A name that is not a valid relative UTF-8 path component.
    InvalidName {
        /// What is wrong.
        reason: String,
    },
    /// An overlay feature this crate does not interpret (metacopy,
    /// redirect): the upper does not hold the full state.
    OverlayFeature {
        /// The xattr found.
        xattr: String,
    },
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefuseReason::Fifo => f.write_str("a fifo: only files, directories and symlinks are applied"),
            RefuseReason::Socket => f.write_str("a socket: only files, directories and symlinks are applied"),
            RefuseReason::CharDevice { major, minor } => write!(f, "a character device {major}:{minor}: devices are never applied"),
            RefuseReason::BlockDevice { major, minor } => write!(f, "a block device {major}:{minor}: devices are never applied"),
            RefuseReason::InvalidName { reason } => write!(f, "a name retie cannot record: {reason}; rename it in the sandbox to apply it"),
            RefuseReason::OverlayFeature { xattr } => write!(f, "an overlayfs {xattr} mark, which retie does not interpret: the layer does not hold this entry whole"),
        }
    }
}

/// An upper entry that is never applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// Path in the upper layer (lossy UTF-8 for invalid names).
    pub path: String,
    /// Why.
    pub reason: RefuseReason,
}

/// Options for [`Changeset::compute_with`].
#[derive(Debug, Clone, Default)]
pub struct ComputeOptions {
    /// Paths (and everything beneath them) whose changes are blocked, e.g.
    /// the ledger and state files when they live inside the workspace.
    pub protected: Vec<RelPath>,
    /// The workspace is a home directory: the [`crate::PLANTS`] entries of
    /// scope [`crate::Scope::Home`] (shell start-up files, `.ssh`, ...)
    /// apply too. The caller decides (e.g. workspace == the invoking
    /// user's `$HOME`).
    pub home_workspace: bool,
    /// The home directory lies at this path inside the workspace (a
    /// workspace that holds `$HOME`): the [`crate::Scope::Home`] entries
    /// apply beneath it, relative to it.
    pub home_dir: Option<RelPath>,
}

impl ComputeOptions {
    /// Where the home directory is in the workspace, as the plant table
    /// reads it: `Some("")` for a home workspace, `None` for no home.
    fn home(&self) -> Option<&str> {
        if self.home_workspace {
            Some("")
        } else {
            self.home_dir.as_ref().map(RelPath::as_str)
        }
    }
}

/// Everything a command changed in the workspace, computed from the upper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changeset {
    /// A fresh id; the journal entry of an apply carries it, and undo takes it.
    pub id: String,
    /// The lower (real workspace) the changeset was computed against.
    pub lower: PathBuf,
    /// The upper layer holding the new content (read again by apply).
    pub upper: PathBuf,
    /// Applicable changes, in path order.
    pub changes: Vec<Change>,
    /// Changes applied only with an explicit allow flag, in path order.
    pub blocked: Vec<Blocked>,
    /// Upper entries never applied.
    pub refused: Vec<Refused>,
    /// Paths the command removed or moved away (a whiteout in the upper)
    /// that are gone from the workspace too: removed there since the
    /// command removed them. Not a change; the conflict check of an overlay
    /// run reads them (a content the command moved may live on under
    /// another name). In path order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vanished: Vec<RelPath>,
}

impl Changeset {
    /// The changes an apply with `allow_blocked` would make, in order:
    /// the applicable ones, then (if allowed) the blocked ones.
    pub fn to_apply(&self, allow_blocked: bool) -> impl Iterator<Item = &Change> {
        self.changes.iter().chain(
            self.blocked
                .iter()
                .filter(move |_| allow_blocked)
                .map(|b| &b.change),
        )
    }

    /// Computes the changeset of `upper` over `lower` with no protected paths.
    pub fn compute(lower: &Path, upper: &Path) -> Result<Changeset> {
        Changeset::compute_with(lower, upper, &ComputeOptions::default())
    }

    /// Computes the changeset of `upper` (an unmounted overlay upper dir)
    /// over `lower` (the real workspace).
    pub fn compute_with(lower: &Path, upper: &Path, opts: &ComputeOptions) -> Result<Changeset> {
        let lower_root = Root::open(lower)?;
        let upper_root = Root::open(upper)?;
        let mut w = Walker {
            changes: Vec::new(),
            refused: Vec::new(),
            vanished: Vec::new(),
        };
        let ufd = upper_root
            .open_dir(None)
            .map_err(|e| Error::io("open", upper, e.into()))?;
        let lfd = lower_root
            .open_dir(None)
            .map_err(|e| Error::io("open", lower, e.into()))?;
        w.walk(ufd.as_fd(), Some(lfd.as_fd()), None, false)?;
        w.changes.sort_by(|a, b| a.path.cmp(&b.path));
        // Only a run that changed something needs the repository's config.
        let named = if w.changes.is_empty() {
            Vec::new()
        } else {
            named_by_git_config(lower)?
        };
        let (changes, blocked) = classify(w.changes, opts, &named, &mut |dir, name| {
            lower_has(&lower_root, dir, name)
        });
        Ok(Changeset {
            id: new_id(),
            lower: lower.to_path_buf(),
            upper: upper.to_path_buf(),
            changes,
            blocked,
            refused: w.refused,
            vanished: {
                w.vanished.sort();
                w.vanished
            },
        })
    }

    /// Whether there is nothing to apply, block or refuse.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.blocked.is_empty() && self.refused.is_empty()
    }
}

struct Walker {
    changes: Vec<Change>,
    refused: Vec<Refused>,
    vanished: Vec<RelPath>,
}

const OPAQUE_XATTRS: [&str; 2] = ["user.overlay.opaque", "trusted.overlay.opaque"];
const UNSUPPORTED_XATTRS: [&str; 4] = [
    "user.overlay.metacopy",
    "trusted.overlay.metacopy",
    "user.overlay.redirect",
    "trusted.overlay.redirect",
];

fn lossy(parent: Option<&RelPath>, name: &[u8]) -> String {
    let n = String::from_utf8_lossy(name);
    match parent {
        Some(p) => format!("{p}/{n}"),
        None => n.into_owned(),
    }
}

impl Walker {
    /// Walks upper directory `udir` (workspace path `rel`) against lower
    /// directory `ldir` (`None`: no lower counterpart). `complete`: `udir`
    /// lists its full content (opaque, or replacing a non-directory), so
    /// lower entries it lacks are deleted.
    fn walk(
        &mut self,
        udir: BorrowedFd<'_>,
        ldir: Option<BorrowedFd<'_>>,
        rel: Option<&RelPath>,
        complete: bool,
    ) -> Result<()> {
        let here = || PathBuf::from(rel.map(RelPath::as_str).unwrap_or("."));
        let names =
            fsx::list_dir(udir).map_err(|e| Error::io("read upper dir", here(), e.into()))?;
        let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();
        for name in names {
            seen.insert(name.clone());
            let path = match RelPath::child(rel, &name) {
                Ok(p) => p,
                Err(e) => {
                    self.refused.push(Refused {
                        path: lossy(rel, &name),
                        reason: RefuseReason::InvalidName {
                            reason: match e {
                                Error::InvalidPath { reason, .. } => reason.to_owned(),
                                other => other.to_string(),
                            },
                        },
                    });
                    continue;
                }
            };
            self.entry(udir, ldir, &path, complete)?;
        }
        if complete {
            if let Some(ldir) = ldir {
                let lnames = fsx::list_dir(ldir)
                    .map_err(|e| Error::io("read lower dir", here(), e.into()))?;
                for name in lnames.into_iter().filter(|n| !seen.contains(n)) {
                    // A lower name that is invalid cannot be represented;
                    // fail rather than silently keep it.
                    let path = RelPath::child(rel, &name)?;
                    self.delete_lower(ldir, &path)?;
                }
            }
        }
        Ok(())
    }

    fn entry(
        &mut self,
        udir: BorrowedFd<'_>,
        ldir: Option<BorrowedFd<'_>>,
        path: &RelPath,
        complete: bool,
    ) -> Result<()> {
        let name = path.file_name();
        let ust = fsx::lstat_at(udir, name)
            .map_err(|e| Error::at("stat upper", path, e))?
            .ok_or_else(|| Error::io("stat upper", path.as_str(), Errno::NOENT.into()))?;
        let lower = match ldir {
            Some(l) => fsx::read_node(l, name, path, None).or_else(|e| match e {
                // A lower special file: treat as absent base; applying over
                // it will then conflict.
                Error::SpecialFile { .. } => Ok(None),
                e => Err(e),
            })?,
            None => None,
        };
        let t = fsx::ftype(&ust);
        match t {
            FileType::CharacterDevice
                if rustix::fs::major(ust.st_rdev) == 0 && rustix::fs::minor(ust.st_rdev) == 0 =>
            {
                if let (Some(l), Some(_)) = (ldir, &lower) {
                    self.delete_lower(l, path)?;
                } else {
                    self.vanished.push(path.clone());
                }
            }
            FileType::RegularFile => {
                let fd =
                    fsx::open_file_at(udir, name).map_err(|e| Error::at("open upper", path, e))?;
                if let Some(x) = self.unsupported(&fd, path) {
                    self.refused.push(x);
                    return Ok(());
                }
                // Hashed through the descriptor just checked.
                let new = fsx::file_node(fd, path, None)?;
                self.replace(ldir, path, lower, Some(new))?;
            }
            FileType::Symlink => {
                let new = fsx::read_node(udir, name, path, None)?;
                self.replace(ldir, path, lower, new)?;
            }
            FileType::Directory => {
                let sub =
                    fsx::open_subdir(udir, name).map_err(|e| Error::at("open upper", path, e))?;
                if let Some(x) = self.unsupported(&sub, path) {
                    self.refused.push(x);
                    return Ok(());
                }
                let listed = fsx::xattr_names(sub.as_fd());
                let opaque = OPAQUE_XATTRS
                    .iter()
                    .filter(|x| {
                        listed
                            .as_ref()
                            .is_none_or(|l| l.iter().any(|n| n == x.as_bytes()))
                    })
                    .any(|x| fsx::get_xattr(sub.as_fd(), x).as_deref() == Some(b"y"));
                let new = Node::Dir {
                    mode: fsx::perm(&ust),
                };
                match (&lower, ldir) {
                    (Some(Node::Dir { .. }), Some(l)) => {
                        // Merged (or opaque replacement of) a lower directory.
                        if let Some(c) = Change::new(path.clone(), lower.clone(), Some(new)) {
                            self.changes.push(c);
                        }
                        let lsub = fsx::open_subdir(l, name)
                            .map_err(|e| Error::at("open lower", path, e))?;
                        // Beneath an opaque directory nothing is merged.
                        self.walk(
                            sub.as_fd(),
                            Some(lsub.as_fd()),
                            Some(path),
                            opaque || complete,
                        )?;
                    }
                    _ => {
                        if let Some(c) = Change::new(path.clone(), lower, Some(new)) {
                            self.changes.push(c);
                        }
                        self.walk(sub.as_fd(), None, Some(path), true)?;
                    }
                }
            }
            FileType::Fifo => self.refuse(path, RefuseReason::Fifo),
            FileType::Socket => self.refuse(path, RefuseReason::Socket),
            FileType::CharacterDevice => self.refuse(
                path,
                RefuseReason::CharDevice {
                    major: rustix::fs::major(ust.st_rdev),
                    minor: rustix::fs::minor(ust.st_rdev),
                },
            ),
            FileType::BlockDevice | FileType::Unknown => self.refuse(
                path,
                RefuseReason::BlockDevice {
                    major: rustix::fs::major(ust.st_rdev),
                    minor: rustix::fs::minor(ust.st_rdev),
                },
            ),
        }
        Ok(())
    }

    fn refuse(&mut self, path: &RelPath, reason: RefuseReason) {
        self.refused.push(Refused {
            path: path.to_string(),
            reason,
        });
    }

    fn unsupported(&self, fd: &OwnedFd, path: &RelPath) -> Option<Refused> {
        // One listing instead of a lookup per name, where it can be had.
        let listed = fsx::xattr_names(fd.as_fd());
        UNSUPPORTED_XATTRS
            .iter()
            .find(|x| match &listed {
                Some(l) => l.iter().any(|n| n == x.as_bytes()),
                None => fsx::get_xattr(fd.as_fd(), x).is_some(),
            })
            .map(|x| Refused {
                path: path.to_string(),
                reason: RefuseReason::OverlayFeature {
                    xattr: (*x).to_owned(),
                },
            })
    }

    /// A file or symlink in the upper replacing whatever the lower had.
    fn replace(
        &mut self,
        ldir: Option<BorrowedFd<'_>>,
        path: &RelPath,
        lower: Option<Node>,
        new: Option<Node>,
    ) -> Result<()> {
        if let (Some(Node::Dir { .. }), Some(l)) = (&lower, ldir) {
            // The lower directory's subtree goes away with it.
            let lsub = fsx::open_subdir(l, path.file_name())
                .map_err(|e| Error::at("open lower", path, e))?;
            self.delete_children(lsub.as_fd(), path)?;
        }
        if let Some(c) = Change::new(path.clone(), lower, new) {
            self.changes.push(c);
        }
        Ok(())
    }

    /// Deletes lower entry `path` (in `ldir`) and, for a directory, its subtree.
    fn delete_lower(&mut self, ldir: BorrowedFd<'_>, path: &RelPath) -> Result<()> {
        let name = path.file_name();
        let node = fsx::read_node(ldir, name, path, None)?;
        if let Some(Node::Dir { .. }) = node {
            let sub = fsx::open_subdir(ldir, name).map_err(|e| Error::at("open lower", path, e))?;
            self.delete_children(sub.as_fd(), path)?;
        }
        if let Some(c) = Change::new(path.clone(), node, None) {
            self.changes.push(c);
        }
        Ok(())
    }

    fn delete_children(&mut self, dir: BorrowedFd<'_>, path: &RelPath) -> Result<()> {
        let names =
            fsx::list_dir(dir).map_err(|e| Error::io("read lower dir", path.as_str(), e.into()))?;
        for name in names {
            let child = RelPath::child(Some(path), &name)?;
            self.delete_lower(dir, &child)?;
        }
        Ok(())
    }
}

/// The plant that writing one regular file at `path` in the workspace at
/// `lower` would be, by the same table and rules as a changeset's (the
/// agent's write and edit tools, which change the workspace without a
/// changeset): `None` when it is none. `opts` as for
/// [`Changeset::compute_with`] (its `protected` is not looked at).
pub fn plant_of_file_write(
    lower: &Path,
    path: &RelPath,
    size: u64,
    opts: &ComputeOptions,
) -> Result<Option<&'static crate::Plant>> {
    let root = Root::open(lower)?;
    let named = named_by_git_config(lower)?;
    if let Some((_, plant)) = named.iter().find(|(p, _)| path.starts_with(p)) {
        return Ok(crate::plants::plant(plant));
    }
    // What is there now decides whether it is created (a HEAD file new,
    // or replacing a directory, completes a git dir).
    let base_is_file =
        lower_has(&root, path.parent().as_ref(), path.file_name()) && !lower_is_dir(&root, path);
    let new = Node::File {
        mode: 0o644,
        size,
        hash: crate::Hash::of(b""),
    };
    let mut holds = |dir: Option<&RelPath>, name: &str| lower_has(&root, dir, name);
    Ok(plants::matching(path, Some(&new), !base_is_file, opts.home(), &mut holds).map(|(p, _)| p))
}

/// Whether `path` is a directory in the lower (an error counts as no).
fn lower_is_dir(root: &Root, path: &RelPath) -> bool {
    root.open_parent(path)
        .ok()
        .and_then(|fd| fsx::lstat_at(fd.as_fd(), path.file_name()).ok().flatten())
        .is_some_and(|st| fsx::ftype(&st) == rustix::fs::FileType::Directory)
}

/// Whether directory `dir` (`None`: the root) of the lower holds `name`
/// (a `HEAD`, a git dir's `config`...). An unexpected error counts as yes
/// (the change is blocked, not applied).
fn lower_has(root: &Root, dir: Option<&RelPath>, name: &str) -> bool {
    let Ok(entry) = RelPath::child(dir, name.as_bytes()) else {
        return false;
    };
    match root.open_parent(&entry) {
        Ok(fd) => !matches!(fsx::lstat_at(fd.as_fd(), name), Ok(None)),
        // Missing, not a directory, or beneath a symlink: nothing there.
        Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => false,
        Err(_) => true,
    }
}

/// What the workspace repository's own config (`.git/config` in the
/// lower, and every config file it includes that lies in the workspace)
/// names inside the workspace: its hooks directory (`core.hooksPath`)
/// and the files it includes (`include.path`, `includeIf.*.path`), each
/// with the plant entry it falls under. A change there is what git runs
/// or reads as config, and `.git/config` itself is blocked, so the
/// command cannot point them elsewhere.
///
/// git itself reads the files (`git config --file F --no-includes`), so
/// that its own rules (keys on the section line, comments, quotes,
/// continuation lines, other encodings) decide; a file git cannot read
/// is an error (the run is kept, never applied half-checked). Without a
/// git to run, nothing runs the hooks either; the simple reading below
/// is used then.
fn named_by_git_config(lower: &Path) -> Result<Vec<(RelPath, &'static str)>> {
    let mut out: Vec<(RelPath, &'static str)> = Vec::new();
    let mut queue: Vec<RelPath> = RelPath::new(".git/config").into_iter().collect();
    let mut seen: BTreeSet<RelPath> = BTreeSet::new();
    while let Some(file) = queue.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        // Loudly, not a silent stop: what lies past it would go unread.
        if seen.len() > 16 {
            return Err(Error::io(
                "read the repository's config (over 16 included files)",
                lower.join(file.as_str()),
                std::io::Error::other("too many included config files"),
            ));
        }
        let abs = lower.join(file.as_str());
        if !abs.is_file() {
            continue;
        }
        // Most configs name neither: then git need not be asked (a key
        // is written whole, in any case, never split or escaped).
        if let Ok(bytes) = std::fs::read(&abs) {
            let lower_bytes = bytes.to_ascii_lowercase();
            let has = |w: &[u8]| lower_bytes.windows(w.len()).any(|x| x == w);
            if !has(b"hookspath") && !has(b"include") {
                continue;
            }
        }
        // Relative include paths are relative to the including file's
        // directory; a hooks path to the working tree's root.
        let dir = file.parent().map(|d| d.to_string());
        for (key, value) in git_config_values(&abs)? {
            let (plant, base) = if key == "core.hookspath" {
                ("git_hooks_path", None)
            } else {
                ("git_config_include", dir.as_deref())
            };
            let Some(rel) = workspace_path(lower, base, &value) else {
                continue;
            };
            // husky (v9) sets `.husky/_`, whose dispatchers run the hook
            // scripts in the directory above: those are hooks too.
            if plant == "git_hooks_path" && rel.file_name() == "_" {
                if let Some(parent) = rel.parent() {
                    out.push((parent, plant));
                }
            }
            if plant == "git_config_include" {
                queue.push(rel.clone());
            }
            out.push((rel, plant));
        }
    }
    Ok(out)
}

/// `(key, value)` for `core.hooksPath`, `include.path` and
/// `includeIf.*.path` in the config file `path`, keys in lower case, as
/// git reads them.
fn git_config_values(path: &Path) -> Result<Vec<(String, String)>> {
    let run = std::process::Command::new("git")
        .args(["config", "--file"])
        .arg(path)
        .args([
            "--no-includes",
            "--null",
            "--get-regexp",
            r"^(core\.hookspath|include\.path|includeif\..*\.path)$",
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::null())
        .output();
    let out = match run {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = std::fs::read(path).unwrap_or_default();
            let text = String::from_utf8_lossy(&text);
            return Ok(git_config_entries(&text)
                .into_iter()
                .filter_map(|(section, key, value)| {
                    let key = match (section.as_str(), key.as_str()) {
                        ("core", "hookspath") => "core.hookspath".to_string(),
                        ("include", "path") => "include.path".to_string(),
                        (s, "path") if s.starts_with("includeif") => format!("{s}.path"),
                        _ => return None,
                    };
                    Some((key, value))
                })
                .collect());
        }
        Err(e) => return Err(Error::io("run git config on", path, e)),
    };
    match out.status.code() {
        Some(0) => {}
        // No such key.
        Some(1) => return Ok(Vec::new()),
        _ => {
            return Err(Error::io(
                "read with git config (so its hooks and includes are known)",
                path,
                std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            ))
        }
    }
    Ok(out
        .stdout
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let e = String::from_utf8_lossy(e);
            let (k, v) = e.split_once('\n')?;
            Some((k.to_ascii_lowercase(), v.to_string()))
        })
        .collect())
}

/// `(section, key, value)` of a git config file, section and key in lower
/// case (`includeif "gitdir:x"` keeps its subsection after the name).
fn git_config_entries(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or("");
            section = name.trim().to_ascii_lowercase();
            continue;
        }
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        out.push((
            section.clone(),
            k.trim().to_ascii_lowercase(),
            v.to_string(),
        ));
    }
    out
}

/// `value` (a path from the repository's config: absolute, or relative to
/// `base`, a workspace-relative directory, or to the workspace root) as a
/// workspace-relative path, when it lies inside the workspace at `lower`.
fn workspace_path(lower: &Path, base: Option<&str>, value: &str) -> Option<RelPath> {
    if value.starts_with('~') {
        return None;
    }
    let joined: PathBuf = if Path::new(value).is_absolute() {
        PathBuf::from(value)
    } else {
        let mut p = lower.to_path_buf();
        if let Some(b) = base {
            p.push(b);
        }
        p.push(value);
        p
    };
    // Lexically, as git does: `..` removes the component before it.
    let mut norm = PathBuf::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                norm.pop();
            }
            std::path::Component::CurDir => {}
            c => norm.push(c),
        }
    }
    let rel = norm.strip_prefix(lower).ok()?;
    RelPath::new(&rel.to_string_lossy()).ok()
}

/// Splits changes into applicable and blocked (see [`BlockReason`]).
/// `named`: what the repository's config names (see
/// [`named_by_git_config`]). `lower_has(dir, name)`: whether `dir` holds
/// `name` in the lower.
fn classify(
    changes: Vec<Change>,
    opts: &ComputeOptions,
    named: &[(RelPath, &'static str)],
    lower_has: &mut dyn FnMut(Option<&RelPath>, &str) -> bool,
) -> (Vec<Change>, Vec<Blocked>) {
    // What a directory holds after the change: created or modified by the
    // changeset, or already in the lower (asked lazily, once each).
    let made: BTreeSet<(Option<RelPath>, &str)> = changes
        .iter()
        .filter(|c| c.new.is_some())
        .map(|c| (c.path.parent(), c.path.file_name()))
        .collect();
    let mut asked: BTreeMap<(Option<RelPath>, String), bool> = BTreeMap::new();
    let mut holds = |dir: Option<&RelPath>, name: &str| {
        if made.contains(&(dir.cloned(), name)) {
            return true;
        }
        *asked
            .entry((dir.cloned(), name.to_owned()))
            .or_insert_with(|| lower_has(dir, name))
    };
    let mut reasons: BTreeMap<RelPath, BlockReason> = BTreeMap::new();
    for c in &changes {
        // At or beneath what the repository's config names; or above it
        // and no longer a directory (a symlink there would lead the named
        // path elsewhere, into what the command made).
        let by_config = named.iter().find(|(p, _)| {
            c.new
                .as_ref()
                .is_some_and(|n| c.path.starts_with(p) || (p.starts_with(&c.path) && !n.is_dir()))
        });
        // retie's own files first: never applied, even with --allow-blocked.
        let protected = opts.protected.iter().any(|p| c.path.starts_with(p));
        if let (Some((_, plant)), false) = (by_config, protected) {
            reasons.insert(c.path.clone(), BlockReason::Plant((*plant).to_owned()));
        } else if let Some(r) = block_reason(c, opts, &mut holds) {
            reasons.insert(c.path.clone(), r);
        }
    }
    // Propagate: (1) a change beneath a blocked directory creation is blocked;
    // (2) a change that removes a directory (new state not a directory) with
    // a blocked change beneath it is blocked. Repeat until stable.
    let by_path: BTreeMap<&RelPath, &Change> = changes.iter().map(|c| (&c.path, c)).collect();
    loop {
        let mut added = Vec::new();
        for c in &changes {
            if reasons.contains_key(&c.path) {
                continue;
            }
            let mut anc = c.path.parent();
            let mut hit = false;
            while let Some(a) = anc {
                if let (Some(_), Some(ac)) = (reasons.get(&a), by_path.get(&a)) {
                    if ac.new.as_ref().is_some_and(Node::is_dir)
                        && !ac.base.as_ref().is_some_and(Node::is_dir)
                    {
                        hit = true;
                        break;
                    }
                }
                anc = a.parent();
            }
            if !hit && !c.new.as_ref().is_some_and(Node::is_dir) {
                // `c.path` itself is not in `reasons` here, and its
                // descendants are not contiguous in byte order ("d-x" sorts
                // between "d" and "d/x"): look at every blocked path.
                hit = reasons
                    .keys()
                    .any(|p| p != &c.path && p.starts_with(&c.path));
            }
            if hit {
                added.push(c.path.clone());
            }
        }
        if added.is_empty() {
            break;
        }
        for p in added {
            reasons.insert(p, BlockReason::DependsOnBlocked);
        }
    }
    let mut ok = Vec::new();
    let mut blocked = Vec::new();
    for c in changes {
        match reasons.remove(&c.path) {
            Some(reason) => blocked.push(Blocked { change: c, reason }),
            None => ok.push(c),
        }
    }
    (ok, blocked)
}

fn block_reason(
    c: &Change,
    opts: &ComputeOptions,
    holds: &mut dyn FnMut(Option<&RelPath>, &str) -> bool,
) -> Option<BlockReason> {
    // Protected paths: every change, deletions included.
    if opts.protected.iter().any(|p| c.path.starts_with(p)) {
        return Some(BlockReason::Protected);
    }
    // Plants: anything but a deletion (see `plants`).
    // Created: nothing but (at most) a directory was there. A HEAD file
    // that replaces a HEAD directory completes a git dir as surely as a
    // new one (an attack pass: mkdir HEAD in one run, the file in the
    // next).
    let created = c.base.as_ref().is_none_or(Node::is_dir);
    plants::matching(&c.path, c.new.as_ref(), created, opts.home(), holds)
        .map(|(p, _)| BlockReason::Plant(p.name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Hash;

    fn file(p: &str, base: bool, new: bool) -> Change {
        let n = Node::File {
            mode: 0o644,
            size: 1,
            hash: Hash::of(p.as_bytes()),
        };
        Change::new(
            RelPath::new(p).expect("valid"),
            base.then(|| n.clone()),
            new.then(|| Node::File {
                mode: 0o644,
                size: 2,
                hash: Hash::of(b"new"),
            }),
        )
        .expect("a change")
    }

    fn dir(p: &str, base: bool, new: bool) -> Change {
        Change::new(
            RelPath::new(p).expect("valid"),
            base.then_some(Node::Dir { mode: 0o755 }),
            new.then_some(Node::Dir { mode: 0o755 }),
        )
        .expect("a change")
    }

    fn opts(protected: &[&str], home: bool) -> ComputeOptions {
        ComputeOptions {
            protected: protected
                .iter()
                .map(|p| RelPath::new(p).expect("valid"))
                .collect(),
            home_workspace: home,
            home_dir: None,
        }
    }

    fn names(blocked: &[Blocked]) -> Vec<(String, String)> {
        blocked
            .iter()
            .map(|b| (b.change.path.to_string(), b.reason.to_string()))
            .map(|(p, r)| (p, r.split(':').next().unwrap_or("").to_owned()))
            .collect()
    }

    #[test]
    fn git_hooks_config_and_protected_are_blocked() {
        let (ok, blocked) = classify(
            vec![
                file(".git/hooks/pre-commit", false, true),
                file(".git/config", true, true),
                file("sub/.git/hooks/post-checkout", false, true),
                file(".git/HEAD", true, true),
                file(".retie/ledger.db", true, true),
                file("src/main.rs", true, true),
            ],
            &opts(&[".retie"], false),
            &[],
            &mut |_, _| false,
        );
        let okp: Vec<_> = ok.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(okp, vec![".git/HEAD", "src/main.rs"]);
        let mut got = names(&blocked);
        got.sort();
        let want: Vec<(String, String)> = [
            (".git/config", "git_config"),
            (".git/hooks/pre-commit", "git_hooks"),
            (".retie/ledger.db", "protected path"),
            ("sub/.git/hooks/post-checkout", "git_hooks"),
        ]
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_config_beside_a_head_is_blocked_whether_head_is_new_or_in_the_lower() {
        // HEAD created by the changeset.
        let (ok, blocked) = classify(
            vec![
                dir("evil", false, true),
                file("evil/HEAD", false, true),
                file("evil/config", false, true),
                file("plain/config", false, true),
            ],
            &opts(&[], false),
            &[],
            &mut |_, _| false,
        );
        // The new HEAD is blocked too: a config is beside it.
        assert_eq!(
            names(&blocked),
            vec![
                ("evil/HEAD".to_owned(), "git_dir_completed".to_owned()),
                ("evil/config".to_owned(), "git_dir_anywhere".to_owned())
            ]
        );
        assert_eq!(ok.len(), 2);
        // HEAD already in the lower: asked once per directory.
        let mut asked = Vec::new();
        let (_, blocked) = classify(
            vec![
                file("old/config", true, true),
                file("old/hooks/post-update", false, true),
            ],
            &opts(&[], false),
            &[],
            &mut |d, name| {
                asked.push(d.map(|p| p.to_string()));
                name == "HEAD" && d.map(RelPath::as_str) == Some("old")
            },
        );
        assert_eq!(blocked.len(), 2, "{blocked:?}");
        assert_eq!(
            asked.iter().filter(|d| d.as_deref() == Some("old")).count(),
            1
        );
    }

    #[test]
    fn deleting_plants_is_allowed_protected_deletions_propagate() {
        // Deleting .git entirely: deletions plant nothing, all applicable.
        let (ok, blocked) = classify(
            vec![
                dir(".git", true, false),
                file(".git/HEAD", true, false),
                dir(".git/hooks", true, false),
                file(".git/hooks/x", true, false),
            ],
            &opts(&[], false),
            &[],
            &mut |_, _| true,
        );
        assert!(blocked.is_empty(), "{blocked:?}");
        assert_eq!(ok.len(), 4);
        // A protected deletion blocks the removal of its parent directory.
        let (ok, blocked) = classify(
            vec![
                dir("st", true, false),
                file("st/ledger", true, false),
                file("other", true, false),
            ],
            &opts(&["st/ledger"], false),
            &[],
            &mut |_, _| false,
        );
        assert_eq!(
            names(&blocked),
            vec![
                ("st".to_owned(), "depends on a blocked change".to_owned()),
                ("st/ledger".to_owned(), "protected path".to_owned()),
            ]
        );
        assert_eq!(ok.len(), 1);
    }

    #[test]
    fn blocking_propagates_to_children_of_a_blocked_creation() {
        let (ok, blocked) = classify(
            vec![dir("st", false, true), file("st/a", false, true)],
            &opts(&["st"], false),
            &[],
            &mut |_, _| false,
        );
        assert!(ok.is_empty());
        assert_eq!(blocked.len(), 2);
        // A new setgid directory: its content would take its group.
        let sg = Change::new(
            RelPath::new("shared").expect("valid"),
            None,
            Some(Node::Dir { mode: 0o2775 }),
        )
        .expect("a change");
        let (ok, blocked) = classify(
            vec![sg, file("shared/f", false, true)],
            &opts(&[], false),
            &[],
            &mut |_, _| false,
        );
        assert!(ok.is_empty());
        assert_eq!(
            names(&blocked),
            vec![
                ("shared".to_owned(), "setid".to_owned()),
                (
                    "shared/f".to_owned(),
                    "depends on a blocked change".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn home_entries_apply_only_to_a_home_workspace() {
        let changes = || {
            vec![
                file(".bashrc", true, true),
                file(".ssh/config", false, true),
            ]
        };
        let (ok, _) = classify(changes(), &opts(&[], false), &[], &mut |_, _| false);
        assert_eq!(ok.len(), 2);
        let (ok, blocked) = classify(changes(), &opts(&[], true), &[], &mut |_, _| false);
        assert!(ok.is_empty());
        assert_eq!(
            names(&blocked),
            vec![
                (".bashrc".to_owned(), "shell_startup".to_owned()),
                (".ssh/config".to_owned(), "ssh".to_owned()),
            ]
        );
    }
}

#[cfg(test)]
mod git_config_tests {
    use super::*;

    /// git's own reading decides (a second review found four configs the
    /// simple reading missed, and an include it did not follow).
    #[test]
    fn what_git_reads_is_what_is_named() {
        if std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipped: no git");
            return;
        }
        let ws = tempfile::tempdir().expect("tempdir");
        let lower = ws.path();
        std::fs::create_dir_all(lower.join(".git")).expect("mkdir");
        let configs = [
            "[core] hooksPath = .githooks\n",
            "[core]\n\thooksPath = .githooks # a comment\n",
            "[core]\n\thooksPath = .git\\\nhooks\n",
            "[core]\n\thooksPath = \".git\"hooks\n",
        ];
        let latin1: &[u8] = b"[user]\n\tname = Jos\xe9\n[core]\n\thooksPath = .githooks\n";
        for c in configs.iter().map(|c| c.as_bytes()).chain([latin1]) {
            std::fs::write(lower.join(".git/config"), c).expect("write config");
            let got = named_by_git_config(lower).expect("read");
            assert!(
                got.iter()
                    .any(|(p, n)| p.as_str() == ".githooks" && *n == "git_hooks_path"),
                "{}: {got:?}",
                String::from_utf8_lossy(c)
            );
        }
        // An include in the workspace is followed; what it names counts.
        std::fs::write(
            lower.join(".git/config"),
            "[include]\n\tpath = ../shared.gitconfig\n",
        )
        .expect("write config");
        std::fs::write(
            lower.join("shared.gitconfig"),
            "[core]\n\thooksPath = .husky/_\n",
        )
        .expect("write include");
        let got = named_by_git_config(lower).expect("read");
        for want in ["shared.gitconfig", ".husky/_", ".husky"] {
            assert!(
                got.iter().any(|(p, _)| p.as_str() == want),
                "{want}: {got:?}"
            );
        }
        // A config git cannot read is an error, not "nothing named".
        std::fs::write(lower.join(".git/config"), "[core\n\thooksPath = x\n").expect("write");
        assert!(named_by_git_config(lower).is_err());
    }

    #[test]
    fn the_repositorys_config_names_its_hooks_dir_and_includes() {
        let text = "[core]\n\tbare = false\n\thooksPath = \".husky/_\"\n\
                    [include]\n\tpath = ../shared.gitconfig\n\
                    [includeIf \"gitdir:~/w/\"]\n\tpath = /ws/team/git.cfg\n\
                    [include]\n\tpath = ~/.gitconfig-extra\n\
                    # path = commented\n[alias]\n\tpath = not-an-include\n";
        let got: Vec<(String, String, String)> = git_config_entries(text);
        assert!(got.contains(&("core".into(), "hookspath".into(), ".husky/_".into())));
        let lower = Path::new("/ws");
        let hooks = workspace_path(lower, None, ".husky/_").map(|p| p.to_string());
        assert_eq!(hooks.as_deref(), Some(".husky/_"));
        let inc = workspace_path(lower, Some(".git"), "../shared.gitconfig").map(|p| p.to_string());
        assert_eq!(inc.as_deref(), Some("shared.gitconfig"));
        let abs = workspace_path(lower, Some(".git"), "/ws/team/git.cfg").map(|p| p.to_string());
        assert_eq!(abs.as_deref(), Some("team/git.cfg"));
        // Outside the workspace, or in a home: nothing of the workspace's.
        assert_eq!(workspace_path(lower, None, "/etc/hooks"), None);
        assert_eq!(workspace_path(lower, Some(".git"), "../../x"), None);
        assert_eq!(workspace_path(lower, None, "~/.hooks"), None);
    }
}
