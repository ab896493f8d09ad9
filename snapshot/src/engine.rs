//! Apply, undo and recovery: one journaled mechanism.
//!
//! Every operation is a list of *targets* (path → wanted state, with the state
//! expected to be there now) run through [`run`]:
//!
//! 1. take the journal lock; refuse if an entry of this workspace is pending;
//! 2. capture: read every target path's current state through the boundary
//!    guard, keeping each current file's content (the pre-images: a small
//!    one in memory, to ride in the entry; a larger one in a temporary of
//!    the blob store), and compare with the expected state: a difference is
//!    a conflict (apply) or a refusal (undo without force), and nothing is
//!    touched;
//! 3. preflight: every new path's parent exists or is created, every
//!    removed directory holds only entries the operation removes;
//! 4. write the journal entry (`pending`, fsync'd) naming every pre-image,
//!    while the larger pre-images are made durable in the store on a
//!    thread (ADRs 0407, 0408); both finish before anything is touched;
//! 5. [`transition`] the workspace to the targets, crash-safely;
//! 6. mark the entry `complete`.
//!
//! If step 5 fails, the same [`transition`] is run back to the pre-images and
//! the entry is marked `rolled_back`. After a crash, [`recover`] does that for
//! every pending entry (roll-back rule, ADR 0201); an entry with a pre-image
//! neither stored nor carried never reached step 5, and is closed as rolled
//! back without touching anything.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::changeset::Changeset;
use crate::error::{Error, Mismatch, Result};
use crate::fsx::{self, Root};
use crate::hash::Hash;
use crate::journal::{
    new_id, now_ms, Entry, EntryState, Journal, Op, Raced, Step, JOURNAL_VERSION,
};
use crate::kept::{self, Keep};
use crate::manifest::Manifest;
use crate::node::Node;
use crate::relpath::RelPath;
use crate::store::Store;
use crate::tree::{self, FileRule, Way, Whole};

/// The real workspace, held open by a directory fd. All access beneath it
/// goes through the boundary guard.
#[derive(Debug)]
pub struct Workspace {
    root: Root,
}

impl Workspace {
    /// Opens the workspace at `path` (canonicalized; the path itself may
    /// contain symlinks, nothing beneath it may be crossed).
    pub fn open(path: &Path) -> Result<Workspace> {
        let canon = std::fs::canonicalize(path).map_err(|e| Error::io("canonicalize", path, e))?;
        Ok(Workspace {
            root: Root::open(&canon)?,
        })
    }

    /// The canonical workspace path.
    pub fn path(&self) -> &Path {
        self.root.path()
    }

    /// Give every path `entry` created or rewrote to `uid:gid` (without
    /// following symlinks, through the boundary guard). For a root caller
    /// acting for the workspace's owner: apply writes through temp files,
    /// which a root process would otherwise leave owned by root.
    pub fn chown_written(&self, entry: &Entry, uid: u32, gid: u32) -> Result<()> {
        for step in &entry.steps {
            if step.after.is_none() {
                continue;
            }
            let parent = self
                .root
                .open_parent(&step.path)
                .map_err(|e| Error::at("open parent", &step.path, e))?;
            rustix::fs::chownat(
                &parent,
                step.path.file_name(),
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| Error::at("chown", &step.path, e))?;
        }
        Ok(())
    }

    /// The current state of `path` in the workspace (content hashed, not
    /// stored).
    pub fn node(&self, path: &RelPath) -> Result<Option<Node>> {
        fsx::read_path(&self.root, path, None)
    }

    /// Reads up to `limit` bytes of regular file `path` through the
    /// boundary guard (no component may be a symlink, `..` or absolute);
    /// returns the bytes and the file's full size. A symlink anywhere on the
    /// way is [`Error::Boundary`]; a directory or special file is refused.
    pub fn read_file(&self, path: &RelPath, limit: u64) -> Result<(Vec<u8>, u64)> {
        use std::io::Read;
        let dir = self
            .root
            .open_parent(path)
            .map_err(|e| Error::at("open parent of", path, e))?;
        let fd = fsx::open_file_at(dir.as_fd(), path.file_name())
            .map_err(|e| Error::at("open", path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::at("fstat", path, e))?;
        if fsx::ftype(&st) != FileType::RegularFile {
            return Err(Error::SpecialFile {
                path: path.clone(),
                what: fsx::special_name(fsx::ftype(&st)).unwrap_or("directory"),
            });
        }
        let mut out = Vec::new();
        File::from(fd)
            .take(limit)
            .read_to_end(&mut out)
            .map_err(|e| Error::io("read", path.as_str(), e))?;
        Ok((out, u64::try_from(st.st_size).unwrap_or(0)))
    }

    /// The entries of directory `dir` (`None`: the root) through the
    /// boundary guard, sorted by name: `(name, node)` where a file's node
    /// carries its size (hash left zero: not read) and a symlink's its
    /// target. Names that are not valid workspace paths are skipped.
    pub fn list_dir(&self, dir: Option<&RelPath>) -> Result<Vec<(RelPath, DirEntryKind)>> {
        let fd = self.root.open_dir(dir).map_err(|e| match dir {
            Some(d) => Error::at("open directory", d, e),
            None => Error::io("open directory", self.path(), e.into()),
        })?;
        let mut out = Vec::new();
        for name in
            fsx::list_dir(fd.as_fd()).map_err(|e| Error::io("list", self.path(), e.into()))?
        {
            let Ok(rel) = RelPath::child(dir, &name) else {
                continue;
            };
            let kind = match fsx::lstat_at(fd.as_fd(), rel.file_name()) {
                Ok(Some(st)) => match fsx::ftype(&st) {
                    FileType::RegularFile => DirEntryKind::File {
                        size: u64::try_from(st.st_size).unwrap_or(0),
                    },
                    FileType::Directory => DirEntryKind::Dir,
                    FileType::Symlink => DirEntryKind::Symlink,
                    _ => DirEntryKind::Special,
                },
                _ => continue,
            };
            out.push((rel, kind));
        }
        Ok(out)
    }
}

/// What [`Workspace::list_dir`] found at a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirEntryKind {
    /// A regular file of this many bytes.
    File {
        /// Its size.
        size: u64,
    },
    /// A directory.
    Dir,
    /// A symlink (never followed).
    Symlink,
    /// A fifo, socket or device.
    Special,
}

/// Options for [`apply`].
#[derive(Debug, Clone, Default)]
pub struct ApplyOptions {
    /// Also apply the changeset's blocked changes (`.git/hooks`, protected
    /// paths, ...). Refused entries are never applied.
    pub allow_blocked: bool,
    /// The layer is done with once applied: the layer's names of the
    /// files hard-linked into the workspace are removed after the apply
    /// (ADR 0208), so the changeset cannot be applied from it again.
    /// Off, the layer is left whole (a changeset applied to several
    /// copies of a workspace, as the tests do).
    pub consume_layer: bool,
    /// The manifest of this apply ([`Manifest::of_changeset`]) the ledger
    /// names (ADR 0209): stored in the blob store with the pre-images, and
    /// named by the journal entry.
    pub manifest: Option<Manifest>,
}

/// Options for [`undo`].
#[derive(Debug, Clone, Default)]
pub struct UndoOptions {
    /// Undo even paths edited since the entry was applied (their current
    /// content is kept as the undo's pre-image, so undoing the undo brings
    /// the edit back).
    pub force: bool,
    /// The manifest of this undo ([`Manifest::of_undo`]) the ledger names
    /// (ADR 0209), stored as [`ApplyOptions::manifest`] is.
    pub manifest: Option<Manifest>,
}

/// What [`recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryReport {
    /// Pending entries of this workspace rolled back to their pre-images.
    pub rolled_back: Vec<String>,
    /// Pending entries that belong to another workspace (left alone).
    pub other_workspaces: Vec<String>,
}

/// Applies `cs` to the workspace: every affected path must still hold the
/// changeset's base (else [`Error::Conflict`] and nothing is touched); the
/// pre-images are stored, the journal entry written, then each change made
/// crash-safely. Returns the complete journal entry; its id is `cs.id`.
pub fn apply(
    cs: &Changeset,
    ws: &Workspace,
    store: &Store,
    journal: &Journal,
    opts: &ApplyOptions,
) -> Result<Entry> {
    apply_inner(cs, ws, store, journal, opts, None)
}

/// [`apply`], running `alongside` on another thread while the pre-images
/// and the pending journal entry are made durable, and touching the
/// workspace only once it has returned `true` (the chokepoint records the
/// changeset in the ledger there: two durable writes that need not wait
/// for each other, both done before anything changes). `false` marks the
/// entry rolled back, touches nothing and returns [`Error::NotRecorded`].
/// `alongside` runs exactly once, even when the apply is refused first
/// (a conflict): it must not assume the apply happens.
pub fn apply_alongside(
    cs: &Changeset,
    ws: &Workspace,
    store: &Store,
    journal: &Journal,
    opts: &ApplyOptions,
    alongside: impl FnOnce() -> bool + Send,
) -> Result<Entry> {
    apply_inner(cs, ws, store, journal, opts, Some(Box::new(alongside)))
}

type Alongside<'a> = Option<Box<dyn FnOnce() -> bool + Send + 'a>>;

fn apply_inner(
    cs: &Changeset,
    ws: &Workspace,
    store: &Store,
    journal: &Journal,
    opts: &ApplyOptions,
    alongside: Alongside<'_>,
) -> Result<Entry> {
    if journal.exists(&cs.id) {
        let e = journal.get(&cs.id)?;
        if e.state != EntryState::RolledBack {
            return Err(Error::EntryState {
                id: e.id,
                state: e.state.name(),
                what: "a changeset is applied once",
            });
        }
    }
    let mut changes: Vec<_> = cs.changes.iter().collect();
    if opts.allow_blocked {
        changes.extend(cs.blocked.iter().map(|b| &b.change));
    }
    let targets = changes
        .into_iter()
        .map(|c| Target {
            path: c.path.clone(),
            expected: Some(c.base.clone()),
            target: c.new.clone(),
        })
        .collect();
    let upper = Root::open(&cs.upper)?;
    let entry = run(
        ws,
        store,
        journal,
        cs.id.clone(),
        Op::Apply {
            upper: cs.upper.clone(),
        },
        targets,
        &Source::Upper {
            root: &upper,
            consume: opts.consume_layer,
            rest: !cs.refused.is_empty() || !(opts.allow_blocked || cs.blocked.is_empty()),
        },
        Check::Base,
        opts.manifest.as_ref(),
        alongside,
    )?;
    Ok(entry)
}

/// After an apply, the layer's name of every file hard-linked into the
/// workspace is removed (ADR 0208): the workspace's file is then its own,
/// and nothing retie later does to the layer touches a workspace inode.
/// (The layer went to the trash, swept while the next command runs; each
/// unlink there would change the inode's ctime, which the next run's
/// conflict check reads as the person's edit.) Best effort: a name left
/// behind costs only that.
/// `moved`: paths whose layer file moved in itself (ADR 0213), no longer
/// linked from the layer.
fn release_links(
    upper: &Root,
    ws: &Workspace,
    entry: &Entry,
    moved: &std::collections::HashSet<&RelPath>,
) {
    // A directory moved in whole (ADR 0211) is no longer in the layer: its
    // parent there does not open, and its files are skipped.
    let (ups, wss) = (fsx::Parents::new(upper), fsx::Parents::new(&ws.root));
    // The parent that did not open, not asked again for each of its files.
    let mut failed: Option<Option<RelPath>> = None;
    for s in &entry.steps {
        if !matches!(s.after, Some(Node::File { .. })) || moved.contains(&s.path) {
            continue;
        }
        if failed.as_ref() == Some(&s.path.parent()) {
            continue;
        }
        let (Ok(ud), Ok(wd)) = (ups.open(&s.path), wss.open(&s.path)) else {
            failed = Some(s.path.parent());
            continue;
        };
        let name = s.path.file_name();
        if let (Ok(Some(a)), Ok(Some(b))) = (
            fsx::lstat_at(ud.as_fd(), name),
            fsx::lstat_at(wd.as_fd(), name),
        ) {
            if a.st_dev == b.st_dev && a.st_ino == b.st_ino {
                let _ = rustix::fs::unlinkat(&*ud, name, AtFlags::empty());
            }
        }
    }
}

/// Undoes journal entry `id` (an apply, a file write or an undo: undoing an
/// undo is a redo). Refuses with [`Error::UndoRefused`], listing the paths,
/// when a path no longer holds what the entry left, unless `force`. The undo
/// is itself a journal entry, returned.
pub fn undo(
    id: &str,
    ws: &Workspace,
    store: &Store,
    journal: &Journal,
    opts: &UndoOptions,
) -> Result<Entry> {
    let e = undoable(journal, id)?;
    if e.workspace != ws.path() {
        return Err(Error::EntryState {
            id: e.id,
            state: e.state.name(),
            what: "it belongs to another workspace",
        });
    }
    let targets = e
        .steps
        .iter()
        .map(|s| Target {
            path: s.path.clone(),
            expected: Some(s.after.clone()),
            target: s.before.clone(),
        })
        .collect();
    run(
        ws,
        store,
        journal,
        new_id(),
        Op::Undo { of: e.id.clone() },
        targets,
        // The files the undone entry took out, kept (ADR 0210): taken
        // back where they are still what the entry found.
        &Source::Kept(&Keep::taking(store, &e.id)),
        Check::Undo {
            of: &e.id,
            force: opts.force,
        },
        opts.manifest.as_ref(),
        None,
    )
}

/// Recovery, to run at start-up before anything else: every pending entry
/// of this workspace is rolled back to its pre-images (ADR 0201) and marked
/// `rolled_back`; stray temp files are removed. Idempotent: a crash during
/// recovery is recovered by running it again.
pub fn recover(ws: &Workspace, store: &Store, journal: &Journal) -> Result<RecoveryReport> {
    // Nothing open and no temporaries: nothing to roll back or clean, and
    // no lock to wait for. An apply writes its blobs and pending entry
    // under the lock before it touches the workspace, so whatever is seen
    // under way here sends this call the long way, to wait for it.
    if journal.nothing_open() && store.no_temps() {
        return Ok(RecoveryReport::default());
    }
    let _lock = journal.lock()?;
    journal.clean_temps()?;
    store.clean_temps()?;
    let mut report = RecoveryReport::default();
    for mut e in journal.pending()? {
        if e.workspace != ws.path() {
            report.other_workspaces.push(e.id);
            continue;
        }
        remove_temps(ws, &e);
        if !pre_images_complete(store, &e.steps) {
            // A pre-image that is neither stored nor carried: the crash came
            // before the pre-images were durable, so before anything was
            // touched. Nothing to restore (and the files may have been
            // edited since).
            e.state = EntryState::RolledBack;
            journal.write(&e)?;
            report.rolled_back.push(e.id);
            continue;
        }
        store_carried(store, &e.steps)?;
        let back: Vec<_> = e
            .steps
            .iter()
            .map(|s| (s.path.clone(), s.before.clone()))
            .collect();
        transition(
            ws,
            store,
            &Source::Store,
            &e.id,
            &back,
            None,
            None,
            &no_trees(),
        )
        .map_err(|(path, err)| Error::RollbackFailed {
            id: e.id.clone(),
            path,
            source: Box::new(err),
        })?;
        remove_temps(ws, &e);
        e.state = EntryState::RolledBack;
        journal.write(&e)?;
        kept::retire(store, &e.id);
        report.rolled_back.push(e.id);
    }
    Ok(report)
}

/// How much small files' pre-image content one journal entry carries
/// itself (ADR 0408); past that, pre-images go to the blob store only.
const INLINE_ENTRY_MAX: usize = 256 * 1024;

/// Puts the pre-images `steps` carry into the blob store, durably, where
/// it does not hold them yet: before anything reads them back from it (an
/// undo, a roll-back). A carried content that does not hash to its step's
/// pre-image (a damaged journal) is refused.
fn store_carried(store: &Store, steps: &[Step]) -> Result<()> {
    // One batch, one commit (ADR 0212): a blob each with a sync of its own
    // cost an undo of 250 carried pre-images some 500 syncs.
    let mut batch = store.batch();
    for s in steps {
        let (Some(bytes), Some(Node::File { hash, .. })) = (&s.before_content, &s.before) else {
            continue;
        };
        if store.contains(hash) {
            continue;
        }
        if Hash::of(bytes) != *hash {
            return Err(Error::SourceChanged {
                path: s.path.to_string(),
                expected: hash.to_hex(),
            });
        }
        batch.put_blob(bytes)?;
    }
    if batch.is_empty() {
        return Ok(());
    }
    batch.commit()
}

/// Entry `id`, if it can be undone (it is complete).
fn undoable(journal: &Journal, id: &str) -> Result<Entry> {
    let e = journal.get(id)?;
    if e.state != EntryState::Complete {
        return Err(Error::EntryState {
            id: e.id,
            state: e.state.name(),
            what: "only a complete entry can be undone",
        });
    }
    Ok(e)
}

/// Whether every `File` pre-image of `steps` is in the store or carried
/// by one of them. Pre-images are durable before the workspace is touched
/// (and `gc` keeps a pending entry's blobs), so an entry for which this is
/// false never touched the workspace.
fn pre_images_complete(store: &Store, steps: &[Step]) -> bool {
    let carried: Vec<Hash> = steps
        .iter()
        .filter(|s| s.before_content.is_some())
        .filter_map(|s| s.before.as_ref().and_then(Node::hash))
        .collect();
    steps
        .iter()
        .filter_map(|s| match &s.before {
            Some(Node::File { hash, .. }) => Some(hash),
            _ => None,
        })
        .all(|h| carried.contains(h) || store.contains(h))
}

impl Source<'_> {
    /// The tree whose files a batch moves in themselves: a consumed layer
    /// (ADR 0213), or the layer an undone entry kept whole (ADR 0215).
    fn moving_from(&self) -> Option<&Root> {
        match self {
            Source::Upper {
                root,
                consume: true,
                ..
            } => Some(root),
            Source::Kept(k) => k.layer(),
            _ => None,
        }
    }
}

/// Where the content of a target file comes from.
enum Source<'a> {
    /// The overlay upper layer (apply); `consume`: the run is over once
    /// applied, and a directory it created may be moved out of it whole
    /// (ADR 0211). `rest`: it holds what the apply does not take
    /// (blocked or refused entries), so it is never kept whole (ADR 0215).
    Upper {
        root: &'a Root,
        consume: bool,
        rest: bool,
    },
    /// The blob store (file writes, rollback, recovery).
    Store,
    /// The blob store, after the files the undone entry kept (ADR 0210):
    /// an undo.
    Kept(&'a Keep),
}

struct Target {
    path: RelPath,
    /// The state that must be there now (`None`: no check).
    expected: Option<Option<Node>>,
    target: Option<Node>,
}

enum Check<'a> {
    Base,
    Undo { of: &'a str, force: bool },
}

#[allow(clippy::too_many_arguments)]
fn run(
    ws: &Workspace,
    store: &Store,
    journal: &Journal,
    id: String,
    op: Op,
    targets: Vec<Target>,
    src: &Source<'_>,
    check: Check<'_>,
    manifest: Option<&Manifest>,
    alongside: Alongside<'_>,
) -> Result<Entry> {
    let _lock = journal.lock()?;
    let Some(alongside) = alongside else {
        return run_locked(
            ws,
            store,
            journal,
            id,
            op,
            targets,
            src,
            check,
            manifest,
            &mut || true,
        );
    };
    std::thread::scope(|sc| {
        let side = sc.spawn(alongside);
        // Joined before the workspace is touched, and on every early
        // return (a conflict) too: it runs exactly once either way.
        let mut side = Some(side);
        let mut join = move || side.take().is_none_or(|h| h.join().unwrap_or(false));
        let r = run_locked(
            ws, store, journal, id, op, targets, src, check, manifest, &mut join,
        );
        join();
        r
    })
}

#[allow(clippy::too_many_arguments)]
fn run_locked(
    ws: &Workspace,
    store: &Store,
    journal: &Journal,
    id: String,
    op: Op,
    mut targets: Vec<Target>,
    src: &Source<'_>,
    check: Check<'_>,
    manifest: Option<&Manifest>,
    join_alongside: &mut dyn FnMut() -> bool,
) -> Result<Entry> {
    let pending: Vec<String> = journal
        .pending()?
        .into_iter()
        .filter(|e| e.workspace == ws.path())
        .map(|e| e.id)
        .collect();
    if !pending.is_empty() {
        return Err(Error::RecoveryNeeded { ids: pending });
    }
    // An undo reads the undone entry again under the lock (a `gc` may have
    // expired it since), and puts the pre-images it carries in the store
    // here, where no recovery can sweep the temporaries away mid-way.
    if let Check::Undo { of, .. } = check {
        let e = undoable(journal, of)?;
        store_carried(store, &e.steps)?;
    }
    targets.sort_by(|a, b| a.path.cmp(&b.path));
    targets.dedup_by(|a, b| a.path == b.path);

    // Capture the pre-images (content into the store, made durable below,
    // alongside the pending entry) and check them.
    let mut blobs = store.batch().inline_up_to(INLINE_ENTRY_MAX);
    let mut steps = Vec::with_capacity(targets.len());
    let mut mismatches = Vec::new();
    let parents = fsx::Parents::new(&ws.root);
    for t in &targets {
        let cur = fsx::read_path_via(&parents, &t.path, Some(&mut blobs))?;
        if let Some(exp) = &t.expected {
            if *exp != cur {
                mismatches.push(Mismatch {
                    path: t.path.clone(),
                    expected: exp.clone(),
                    found: cur.clone(),
                });
            }
        }
        steps.push(Step {
            path: t.path.clone(),
            before: cur,
            after: t.target.clone(),
            before_content: None,
        });
    }
    if !mismatches.is_empty() {
        match check {
            Check::Base => return Err(Error::Conflict { paths: mismatches }),
            Check::Undo { of, force: false } => {
                return Err(Error::UndoRefused {
                    id: of.to_owned(),
                    paths: mismatches,
                })
            }
            Check::Undo { force: true, .. } => {}
        }
    }
    preflight(ws, &steps)?;
    // Small pre-images ride in the entry itself, durable with it.
    // Each content once, on the first step it is the pre-image of: the
    // others find it in the store, where `store_carried` puts it before
    // anything reads it back.
    for (hash, bytes) in blobs.take_inline() {
        if let Some(s) = steps
            .iter_mut()
            .find(|s| matches!(&s.before, Some(Node::File { hash: h, .. }) if *h == hash))
        {
            s.before_content = Some(bytes);
        }
    }

    // The manifest the ledger names rides in the same batch: durable
    // before the workspace is touched, at no sync of its own.
    let manifest = match manifest {
        Some(m) => Some(blobs.put_blob(&m.bytes)?),
        None => None,
    };
    let mut entry = Entry {
        manifest,
        version: JOURNAL_VERSION,
        id,
        seq: journal.next_seq()?,
        workspace: ws.path().to_path_buf(),
        op,
        state: EntryState::Pending,
        created_unix_ms: now_ms(),
        steps,
        raced: Vec::new(),
    };
    // The pre-images and the pending entry that names them must both be
    // durable before the workspace is touched, and neither needs the
    // other first: a crash between leaves the workspace as it was, which
    // the entry's roll-back then finds without reading a blob. So their
    // syncs run side by side.
    if blobs.is_empty() {
        journal.write(&entry)?;
    } else {
        let (written, committed) = std::thread::scope(|sc| {
            let committing = sc.spawn(move || blobs.commit());
            let written = journal.write(&entry);
            let committed = committing.join().unwrap_or_else(|_| {
                Err(Error::io(
                    "store",
                    store.blobs_dir(),
                    std::io::Error::other("the thread storing the pre-images panicked"),
                ))
            });
            (written, committed)
        });
        written?;
        if let Err(e) = committed {
            // Nothing was touched: the entry is closed as rolled back now,
            // not left pending for the next recovery.
            entry.state = EntryState::RolledBack;
            journal.write(&entry)?;
            return Err(e);
        }
    }
    if !join_alongside() {
        entry.state = EntryState::RolledBack;
        journal.write(&entry)?;
        return Err(Error::NotRecorded { id: entry.id });
    }

    let forward: Vec<_> = entry
        .steps
        .iter()
        .map(|s| (s.path.clone(), s.after.clone()))
        .collect();
    // Up to each rename, the workspace may change under the check made
    // above (a person's editor saving): what is replaced or removed must
    // still be what was captured, judged atomically at the rename.
    let captured: Vec<Option<Node>> = entry.steps.iter().map(|s| s.before.clone()).collect();
    let as_captured =
        |i: usize, found: Option<&Node>| captured.get(i).is_some_and(|c| c.as_ref() == found);
    // What comes out of the workspace is kept for this entry's undo
    // (ADR 0210): a cache beside the store, which holds every pre-image.
    let keep = Keep::putting(store, &entry.id);
    // Directories created or removed whole move by one rename each
    // (ADR 0211): in from a consumed layer or the undone entry's kept
    // files, out into this entry's kept files.
    let mut whole = Vec::new();
    if entry.steps.len() >= BATCH_SYNC_FROM {
        if matches!(src, Source::Upper { consume: true, .. } | Source::Kept(_)) {
            whole.extend(tree::plan(&entry.steps, Way::In, &|_| true));
        }
        whole.extend(tree::plan(
            &entry.steps,
            Way::Out,
            &|s| !matches!(s.before, Some(Node::File { size, .. }) if size > kept::KEEP_FILE_MAX),
        ));
    }
    let pos: BTreeMap<&RelPath, usize> = if whole.is_empty() {
        BTreeMap::new()
    } else {
        forward
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p, i))
            .collect()
    };
    let now = |p: &RelPath| pos.get(p).and_then(|&i| captured.get(i).cloned().flatten());
    let trees = Trees {
        whole,
        now: &now,
        moved: RefCell::new(Vec::new()),
        files: RefCell::new(Vec::new()),
    };
    let went = transition(
        ws,
        store,
        src,
        &entry.id,
        &forward,
        Some(&as_captured),
        Some(&keep),
        &trees,
    );
    if let Ok(raced) = &went {
        if !raced.is_empty() {
            // Someone else's version stays at each raced path: this entry
            // did not change it, so its undo must not either. The steps
            // that go may carry a pre-image other steps share: into the
            // store first. Then the entry is written again, still pending.
            store_carried(store, &entry.steps)?;
            entry
                .steps
                .retain(|s| !raced.iter().any(|r| r.path == s.path));
            entry.raced = raced.clone();
            journal.write(&entry)?;
        }
    }
    if let Err((path, err)) = went {
        // The trees moved go back where they came from first, whole: a
        // layer kept after a failed apply still holds all it made.
        for w in trees.moved.take().iter().rev() {
            move_back(ws, src, &keep, w);
        }
        if let Some(up) = src.moving_from() {
            for m in trees.files.take().iter().rev() {
                move_file_back(ws, up, m);
            }
        }
        if let Err(rerr) = store_carried(store, &entry.steps) {
            return Err(Error::RollbackFailed {
                id: entry.id,
                path,
                source: Box::new(rerr),
            });
        }
        let back: Vec<_> = entry
            .steps
            .iter()
            .map(|s| (s.path.clone(), s.before.clone()))
            .collect();
        // What a roll-back may replace: the forward run's result or the
        // pre-image (steps it had not reached); anything else is someone
        // else's, kept.
        let ours = |i: usize, found: Option<&Node>| {
            entry
                .steps
                .get(i)
                .is_some_and(|s| s.after.as_ref() == found || s.before.as_ref() == found)
        };
        if let Err((rpath, rerr)) = transition(
            ws,
            store,
            &Source::Store,
            &entry.id,
            &back,
            Some(&ours),
            None,
            &no_trees(),
        ) {
            return Err(Error::RollbackFailed {
                id: entry.id,
                path: rpath,
                source: Box::new(rerr),
            });
        }
        remove_temps(ws, &entry);
        entry.state = EntryState::RolledBack;
        journal.write(&entry)?;
        kept::retire(store, &entry.id);
        return Err(Error::RolledBack {
            id: entry.id,
            path,
            source: Box::new(err),
        });
    }
    journal.complete(&mut entry)?;
    // What the moved files replaced and left in the layer: the layer
    // becomes the entry's kept files (ADR 0215).
    if let Some(up) = src.moving_from() {
        let files = trees.files.take();
        if let Source::Upper { .. } = src {
            let moved: std::collections::HashSet<&RelPath> =
                files.iter().map(|m| &m.path).collect();
            release_links(up, ws, &entry, &moved);
        }
        let left: Vec<RelPath> = files
            .iter()
            .filter(|m| m.out_left)
            .map(|m| m.path.clone())
            .collect();
        if !left.is_empty() {
            // Whole only where it holds nothing but what the entry left:
            // no path raced (the layer stays a run) and nothing blocked
            // or refused stays in it (kept for the entry's life, it would
            // hold the command's leftovers that long).
            let rest = matches!(src, Source::Upper { rest: true, .. });
            keep.adopt_layer(up, &left, entry.raced.is_empty() && !rest);
        }
    }
    // The undone entry's kept files are back in the workspace, or no
    // longer what it left: nothing can use the rest.
    if let Op::Undo { of } = &entry.op {
        kept::retire(store, of);
    }
    Ok(entry)
}

/// Checks, before anything is touched, that the steps can be carried out:
/// each new path's parent is a directory that stays or is created, and each
/// directory being removed holds only entries removed by the steps.
fn preflight(ws: &Workspace, steps: &[Step]) -> Result<()> {
    let plan: BTreeMap<&RelPath, &Option<Node>> =
        steps.iter().map(|s| (&s.path, &s.after)).collect();
    let mut parent_ok: BTreeMap<RelPath, bool> = BTreeMap::new();
    for s in steps {
        if s.after.is_some() {
            if let Some(parent) = s.path.parent() {
                let ok = match plan.get(&parent) {
                    Some(t) => t.as_ref().is_some_and(Node::is_dir),
                    None => match parent_ok.get(&parent) {
                        Some(ok) => *ok,
                        None => {
                            let ok = match ws.root.open_dir(Some(&parent)) {
                                Ok(_) => true,
                                Err(Errno::NOENT) | Err(Errno::NOTDIR) => false,
                                // A symlinked ancestor: a boundary refusal.
                                Err(e) => return Err(Error::at("open parent of", &s.path, e)),
                            };
                            parent_ok.insert(parent.clone(), ok);
                            ok
                        }
                    },
                };
                if !ok {
                    return Err(Error::Unapplicable {
                        path: s.path.clone(),
                        reason: "its parent directory is missing or not kept",
                    });
                }
            }
        }
        let removes_dir = s.before.as_ref().is_some_and(Node::is_dir)
            && !s.after.as_ref().is_some_and(Node::is_dir);
        if removes_dir {
            let dir = ws
                .root
                .open_dir(Some(&s.path))
                .map_err(|e| Error::at("open", &s.path, e))?;
            let names =
                fsx::list_dir(dir.as_fd()).map_err(|e| Error::at("read dir", &s.path, e))?;
            for name in names {
                let child = RelPath::child(Some(&s.path), &name)?;
                if !matches!(plan.get(&child), Some(None)) {
                    return Err(Error::Unapplicable {
                        path: child,
                        reason: "it lies in a directory being removed but is not removed itself",
                    });
                }
            }
        }
    }
    Ok(())
}

/// From this many paths on, a transition syncs once, by filesystem,
/// instead of once per file and directory (ADR 0208). Below it the
/// per-file syncs are cheaper than a whole-filesystem sync that may carry
/// other programs' dirty data.
pub const BATCH_SYNC_FROM: usize = 64;

fn tmp_name(id: &str, idx: usize) -> String {
    format!(".retie-tmp-{id}-{idx}")
}

/// Removes the temp files an interrupted transition of `e` may have left.
fn remove_temps(ws: &Workspace, e: &Entry) {
    for (idx, s) in e.steps.iter().enumerate() {
        if let Ok(dir) = ws.root.open_parent(&s.path) {
            let _ = rustix::fs::unlinkat(&dir, tmp_name(&e.id, idx).as_str(), AtFlags::empty());
        }
    }
}

type StepResult<T> = std::result::Result<T, (String, Error)>;

/// Brings every path to its target state. Idempotent, and correct from any
/// intermediate state another run of it left, so that a failed or
/// interrupted forward run is undone by running it with the pre-images.
///
/// Passes: (0) make directories in the set writable for ourselves; (A) in
/// reverse path order (children first), remove what must go: entries whose
/// target is absent and entries whose kind changes between directory and
/// non-directory; (B) in path order (parents first), create directories and
/// write files and symlinks, each through a temp file in the same directory,
/// fsync'd, renamed over the old entry; (C) children first, set directory
/// modes; (D) fsync every directory touched.
/// With `check` (apply, undo, a file write, a roll-back; not recovery),
/// nothing is replaced or removed unless `check(index, found)` accepts what
/// is there at the moment it goes: a file is put in place by an atomic
/// exchange (`RENAME_EXCHANGE`) and what came out is compared; a removed
/// entry is first moved aside (`RENAME_NOREPLACE`) and compared; a new
/// entry is renamed in only where none appeared (`RENAME_NOREPLACE`).
/// Anything else found (a person's edit made after the conflict check) is
/// put back in place and the path is returned as [`Raced`]: both versions
/// kept, the caller told.
#[allow(clippy::too_many_arguments)]
fn transition(
    ws: &Workspace,
    store: &Store,
    src: &Source<'_>,
    id: &str,
    targets: &[(RelPath, Option<Node>)],
    check: Option<&Accept<'_>>,
    keep: Option<&Keep>,
    trees: &Trees<'_>,
) -> StepResult<Vec<Raced>> {
    let mut raced: Vec<Raced> = Vec::new();
    let root = &ws.root;
    // Durability by batch for a large set (ADR 0208): no sync per file or
    // per directory, one `syncfs` of the workspace's filesystem at the end,
    // before the caller marks the entry complete. A crash before that
    // point leaves the entry pending, and recovery rolls every path back.
    let batch = targets.len() >= BATCH_SYNC_FROM;
    let wrap = |p: &RelPath| {
        let p = p.to_string();
        move |e: Error| (p, e)
    };
    // Whole trees (ADR 0211), in a batch only (its one sync covers what
    // they moved): first out, into the kept files; then, in pass (B), in.
    let whole: &[Whole] = if batch { &trees.whole } else { &[] };
    let gone = |p: &RelPath| tree::beneath_any(p, &trees.moved.borrow());
    if let Some(keep) = keep {
        for w in whole.iter().filter(|w| w.way == Way::Out) {
            if take_out_tree(root, keep, w, trees.now)? {
                trees.moved.borrow_mut().push(w.clone());
            }
        }
    }
    let wanted: BTreeMap<&RelPath, &Node> = if whole.iter().any(|w| w.way == Way::In) {
        targets
            .iter()
            .filter_map(|(p, t)| t.as_ref().map(|t| (p, t)))
            .collect()
    } else {
        BTreeMap::new()
    };
    let want = |p: &RelPath| wanted.get(p).map(|n| (*n).clone());
    // Each pass opens a parent directory once for a run of paths in it
    // (ADR 0212); none asks again beneath a directory it removed.
    let parents = fsx::Parents::new(root);
    let upper_parents = match src {
        Source::Upper { root: upper, .. } => Some(fsx::Parents::new(upper)),
        _ => None,
    };
    // In a checked batch, the tree whose files move in themselves; a kept
    // file's modification time is set to now as it goes (as a copy's).
    let moving = match (batch, check, src.moving_from()) {
        (true, Some(_), Some(t)) => Some((fsx::Parents::new(t), matches!(src, Source::Kept(_)))),
        _ => None,
    };
    // (0)
    for (path, _) in targets {
        if gone(path)
            || whole
                .iter()
                .any(|w| w.way == Way::In && path.starts_with(&w.path))
        {
            continue;
        }
        let Ok(dir) = parents.open(path) else {
            continue;
        };
        if let Ok(Some(st)) = fsx::lstat_at(dir.as_fd(), path.file_name()) {
            if fsx::ftype(&st) == FileType::Directory && fsx::perm(&st) & 0o300 != 0o300 {
                let sub = fsx::open_subdir(dir.as_fd(), path.file_name())
                    .map_err(|e| (path.to_string(), Error::at("open", path, e)))?;
                rustix::fs::fchmod(&sub, Mode::from_raw_mode(fsx::perm(&st) | 0o300))
                    .map_err(|e| (path.to_string(), Error::at("chmod", path, e)))?;
            }
        }
    }
    // (A)
    let parents = fsx::Parents::new(root);
    for (idx, (path, target)) in targets.iter().enumerate().rev() {
        if gone(path) {
            continue;
        }
        let dir = match parents.open(path) {
            Ok(d) => d,
            // Nothing beneath a missing, non-directory or symlinked
            // ancestor is in the workspace: nothing to remove.
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => continue,
            Err(e) => return Err((path.to_string(), Error::at("open parent of", path, e))),
        };
        let name = path.file_name();
        let Some(st) = fsx::lstat_at(dir.as_fd(), name)
            .map_err(|e| (path.to_string(), Error::at("stat", path, e)))?
        else {
            continue;
        };
        let is_dir = fsx::ftype(&st) == FileType::Directory;
        let remove = match target {
            None => true,
            Some(t) => t.is_dir() != is_dir,
        };
        if !remove {
            continue;
        }
        match (is_dir, check) {
            (true, _) => match rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
                Ok(()) => {}
                // Preflight found only entries the steps remove: what is
                // there now was added since (or kept as raced), and stays.
                Err(Errno::NOTEMPTY) if check.is_some() => raced.push(Raced {
                    path: path.clone(),
                    saved_as: None,
                }),
                Err(e) => return Err((path.to_string(), Error::at("remove", path, e))),
            },
            (false, None) => rustix::fs::unlinkat(&dir, name, AtFlags::empty())
                .map_err(|e| (path.to_string(), Error::at("remove", path, e)))?,
            (false, Some(ok)) => {
                if let Some(r) =
                    remove_checked(dir.as_fd(), path, &tmp_name(id, idx), id, keep, |f| {
                        ok(idx, f)
                    })
                    .map_err(wrap(path))?
                {
                    raced.push(r);
                }
            }
        }
    }
    // (B)
    let parents = fsx::Parents::new(root);
    let mut touched: BTreeSet<Option<RelPath>> = BTreeSet::new();
    for (idx, (path, target)) in targets.iter().enumerate() {
        if gone(path) {
            continue;
        }
        touched.insert(path.parent());
        let Some(target) = target else { continue };
        if raced.iter().any(|r| r.path == *path) {
            continue;
        }
        if let Some(w) = whole.iter().find(|w| w.way == Way::In && w.path == *path) {
            if bring_in_tree(root, src, w, &want)? {
                trees.moved.borrow_mut().push(w.clone());
                touched.insert(Some(path.clone()));
                continue;
            }
        }
        let place = |dir: BorrowedFd<'_>, tmp: &str| -> Result<Option<Raced>> {
            match check {
                None => rustix::fs::renameat(dir, tmp, dir, path.file_name())
                    .map(|()| None)
                    .map_err(|e| Error::at("rename", path, e)),
                Some(ok) => place_checked(dir, path, tmp, id, target, keep, |f| ok(idx, f)),
            }
        };
        let dir = parents
            .open(path)
            .map_err(|e| (path.to_string(), Error::at("open parent of", path, e)))?;
        let name = path.file_name();
        let cur = fsx::lstat_at(dir.as_fd(), name)
            .map_err(|e| (path.to_string(), Error::at("stat", path, e)))?;
        match target {
            Node::Dir { .. } => {
                touched.insert(Some(path.clone()));
                if cur.is_none() {
                    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700))
                        .map_err(|e| (path.to_string(), Error::at("mkdir", path, e)))?;
                }
            }
            Node::File { mode, size, hash } => {
                // Whether the file there may already hold the target's
                // content: always in a recovery; in a checked transition
                // only where what it may find is that content (a change
                // of mode alone). Else it is not read here: the exchange
                // below judges what comes out.
                let same_content_allowed = |st: &rustix::fs::Stat| {
                    check.is_none_or(|ok| {
                        ok(
                            idx,
                            Some(&Node::File {
                                mode: fsx::perm(st),
                                size: *size,
                                hash: *hash,
                            }),
                        )
                    })
                };
                if let Some(st) = cur.filter(|st| {
                    fsx::ftype(st) == FileType::RegularFile
                        && st.st_size as u64 == *size
                        && same_content_allowed(st)
                }) {
                    let fd = fsx::open_file_at(dir.as_fd(), name)
                        .map_err(|e| (path.to_string(), Error::at("open", path, e)))?;
                    let mut f = File::from(fd);
                    let (h, _) = fsx::hash_stream(&mut fsx::ToEnd::new(&mut f, &st), None)
                        .map_err(|e| (path.to_string(), Error::io("read", path.as_str(), e)))?;
                    // Same content: only the mode may change, in place.
                    // Not on an inode with other links: one may be outside
                    // the workspace (a hard-linked package store, a local
                    // clone's objects), and a chmod here would change it
                    // there too. Such a file gets a new inode below, as a
                    // changed file does.
                    if h == *hash && (fsx::perm(&st) == *mode || st.st_nlink <= 1) {
                        if fsx::perm(&st) != *mode {
                            rustix::fs::fchmod(&f, Mode::from_raw_mode(*mode))
                                .map_err(|e| (path.to_string(), Error::at("chmod", path, e)))?;
                        }
                        continue;
                    }
                }
                // From a consumed layer, or a layer kept whole, in a
                // batch: the file itself moves in (ADRs 0213, 0215), no
                // link, temp or unlink.
                if let (Some((from, touch)), Some(ok)) = (moving.as_ref(), check) {
                    let moved = move_from_upper(
                        from,
                        dir.as_fd(),
                        path,
                        (*mode, *hash, *touch),
                        keep,
                        |f| ok(idx, f),
                        &trees.files,
                    );
                    if let Some(r) = moved {
                        if let Some(rc) = r.map_err(wrap(path))? {
                            raced.push(rc);
                        }
                        continue;
                    }
                }
                let tmp = tmp_name(id, idx);
                write_file(
                    store,
                    src,
                    upper_parents.as_ref(),
                    dir.as_fd(),
                    path,
                    &tmp,
                    *mode,
                    *hash,
                    batch,
                )
                .map_err(wrap(path))?;
                match place(dir.as_fd(), &tmp) {
                    Ok(Some(r)) => raced.push(r),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
                        return Err((path.to_string(), e));
                    }
                }
            }
            Node::Symlink { target, .. } => {
                if cur.is_some_and(|st| fsx::ftype(&st) == FileType::Symlink)
                    && fsx::readlink_at(dir.as_fd(), name).ok().as_deref()
                        == Some(target.as_bytes())
                {
                    continue;
                }
                let tmp = tmp_name(id, idx);
                let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
                rustix::fs::symlinkat(target.as_str(), &dir, tmp.as_str())
                    .map_err(|e| (path.to_string(), Error::at("symlink", path, e)))?;
                match place(dir.as_fd(), &tmp) {
                    Ok(Some(r)) => raced.push(r),
                    Ok(None) => {}
                    Err(e) => {
                        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
                        return Err((path.to_string(), e));
                    }
                }
            }
        }
    }
    // (C)
    for (path, target) in targets.iter().rev() {
        let Some(Node::Dir { mode }) = target else {
            continue;
        };
        if gone(path) {
            continue;
        }
        let sub = root
            .open_dir(Some(path))
            .map_err(|e| (path.to_string(), Error::at("open", path, e)))?;
        let st =
            rustix::fs::fstat(&sub).map_err(|e| (path.to_string(), Error::at("stat", path, e)))?;
        if fsx::perm(&st) != *mode {
            rustix::fs::fchmod(&sub, Mode::from_raw_mode(*mode))
                .map_err(|e| (path.to_string(), Error::at("chmod", path, e)))?;
        }
    }
    // (D)
    if batch {
        rustix::fs::syncfs(root.fd())
            .map_err(|e| (".".to_owned(), Error::io("syncfs", ".", e.into())))?;
        return Ok(raced);
    }
    for d in touched {
        let shown = d.as_ref().map_or_else(|| ".".to_owned(), |p| p.to_string());
        let fd = match root.open_dir(d.as_ref()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => continue,
            Err(e) => return Err((shown.clone(), Error::io("open", shown, e.into()))),
        };
        rustix::fs::fsync(&fd)
            .map_err(|e| (shown.clone(), Error::io("fsync", shown.clone(), e.into())))?;
    }
    Ok(raced)
}

/// What a checked [`transition`] accepts to find at target `index` when it
/// replaces or removes it.
type Accept<'a> = dyn Fn(usize, Option<&Node>) -> bool + 'a;

/// The directories a [`transition`] may move whole (ADR 0211), what the
/// workspace held at each path as captured (checked where a tree taken
/// out lands), and the ones it moved.
struct Trees<'a> {
    whole: Vec<Whole>,
    now: &'a dyn Fn(&RelPath) -> Option<Node>,
    moved: RefCell<Vec<Whole>>,
    /// The files moved in from a consumed layer one by one (ADR 0213).
    files: RefCell<Vec<MovedFile>>,
}

/// A file [`move_from_upper`] moved into the workspace: its inode, and
/// where what it replaced went.
struct MovedFile {
    path: RelPath,
    dev: u64,
    ino: u64,
    /// What it replaced stayed in the layer under its name, to be this
    /// entry's kept file with the rest of the layer (ADR 0215).
    out_left: bool,
}

fn nothing(_: &RelPath) -> Option<Node> {
    None
}

/// No tree moved whole: every path its own way.
fn no_trees() -> Trees<'static> {
    Trees {
        whole: Vec::new(),
        now: &nothing,
        moved: RefCell::new(Vec::new()),
        files: RefCell::new(Vec::new()),
    }
}

/// Moves tree `w` out of the workspace into `keep` whole and checks it
/// there against what was captured. `false`: not moved (another
/// filesystem, no kept files), or moved and back in place because it did
/// not match; its paths then go their own way.
fn take_out_tree(
    root: &Root,
    keep: &Keep,
    w: &Whole,
    now: &dyn Fn(&RelPath) -> Option<Node>,
) -> StepResult<bool> {
    let Some(kd) = keep.tree_dir() else {
        return Ok(false);
    };
    let Ok(dir) = root.open_parent(&w.path) else {
        return Ok(false);
    };
    let (name, key) = (w.path.file_name(), kept::tree_key(&w.path));
    match tree::rename(dir.as_fd(), name, kd, &key) {
        Ok(()) => {}
        Err(Errno::XDEV) => {
            keep.off();
            return Ok(false);
        }
        Err(_) => return Ok(false),
    }
    let rule = FileRule {
        max_size: Some(kept::KEEP_FILE_MAX),
        touch: false,
    };
    if tree::holds(kd, &key, &w.path, now, w.beneath, rule) {
        return Ok(true);
    }
    tree::rename(kd, &key, dir.as_fd(), name)
        .map_err(|e| (w.path.to_string(), Error::at("put back", &w.path, e)))?;
    Ok(false)
}

/// Moves tree `w` into the workspace whole, from the consumed layer or the
/// kept files of the entry being undone, and checks it where it landed
/// against the targets. `false`: not moved, or moved and back where it
/// came from because it did not match; its paths then go their own way.
fn bring_in_tree(
    root: &Root,
    src: &Source<'_>,
    w: &Whole,
    want: &dyn Fn(&RelPath) -> Option<Node>,
) -> StepResult<bool> {
    let Ok(dir) = root.open_parent(&w.path) else {
        return Ok(false);
    };
    let name = w.path.file_name();
    let upper_dir;
    let (from, from_name, touch) = match src {
        Source::Upper {
            root: up,
            consume: true,
            ..
        } => {
            let Ok(d) = up.open_parent(&w.path) else {
                return Ok(false);
            };
            upper_dir = d;
            (upper_dir.as_fd(), name.to_owned(), false)
        }
        Source::Kept(k) => {
            let Some(kd) = k.tree_dir() else {
                return Ok(false);
            };
            (kd, kept::tree_key(&w.path), true)
        }
        _ => return Ok(false),
    };
    if tree::rename(from, &from_name, dir.as_fd(), name).is_err() {
        return Ok(false);
    }
    let rule = FileRule {
        max_size: None,
        touch,
    };
    if tree::holds(dir.as_fd(), name, &w.path, want, w.beneath, rule) {
        return Ok(true);
    }
    tree::rename(dir.as_fd(), name, from, &from_name)
        .map_err(|e| (w.path.to_string(), Error::at("put back", &w.path, e)))?;
    Ok(false)
}

/// After a failed transition, tree `w` goes back where it came from,
/// whole. Best effort: what stays is undone path by path.
fn move_back(ws: &Workspace, src: &Source<'_>, keep: &Keep, w: &Whole) {
    let Ok(dir) = ws.root.open_parent(&w.path) else {
        return;
    };
    let name = w.path.file_name();
    let key = kept::tree_key(&w.path);
    let _ = match (w.way, src) {
        (Way::In, Source::Upper { root: up, .. }) => match up.open_parent(&w.path) {
            Ok(u) => tree::rename(dir.as_fd(), name, u.as_fd(), name),
            Err(e) => Err(e),
        },
        (Way::In, Source::Kept(k)) => match k.tree_dir() {
            Some(kd) => tree::rename(dir.as_fd(), name, kd, &key),
            None => Err(Errno::NOENT),
        },
        (Way::Out, _) => match keep.tree_dir() {
            Some(kd) => tree::rename(kd, &key, dir.as_fd(), name),
            None => Err(Errno::NOENT),
        },
        (Way::In, Source::Store) => Err(Errno::NOENT),
    };
}

/// Moves the consumed layer's file for `path` into the workspace (`dir`,
/// its parent there) as it is, in a batch (ADR 0213): by a rename that
/// replaces nothing where the check expects nothing, else by an exchange
/// across the two directories, after which what came out (now in the
/// layer) is judged by `ok` as [`place_checked`] judges it, and kept for
/// the undo or removed. `None`: nothing was moved (not a plain file of one
/// link holding the target, another filesystem, no `renameat2` flags):
/// the caller goes the way of a link and a temp, which judges the same.
#[allow(clippy::too_many_arguments)]
fn move_from_upper(
    up: &fsx::Parents<'_>,
    dir: BorrowedFd<'_>,
    path: &RelPath,
    (mode, hash, touch): (u32, crate::Hash, bool),
    keep: Option<&Keep>,
    ok: impl Fn(Option<&Node>) -> bool,
    files: &RefCell<Vec<MovedFile>>,
) -> Option<Result<Option<Raced>>> {
    use rustix::fs::{renameat_with, RenameFlags};
    let udir = up.open(path).ok()?;
    let udir = udir.as_fd();
    let name = path.file_name();
    let fd = fsx::open_file_at(udir, name).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    if fsx::ftype(&st) != FileType::RegularFile || st.st_nlink != 1 {
        return None;
    }
    let mut f = File::from(fd);
    let (h, _) = fsx::hash_stream(&mut fsx::ToEnd::new(&mut f, &st), None).ok()?;
    if h != hash {
        return None;
    }
    if fsx::perm(&st) != mode && rustix::fs::fchmod(&f, Mode::from_raw_mode(mode)).is_err() {
        return None;
    }
    // A kept file goes back changed, to whatever reads times (ADR 0210).
    if touch && kept::touch(f.as_fd()).is_err() {
        return None;
    }
    let raced = || Raced {
        path: path.clone(),
        saved_as: None,
    };
    // What is at `path` now must be the inode read above (a name in the
    // layer swapped since is not placed).
    let placed = |exchanged: bool| -> Result<Option<Raced>> {
        let here = fsx::lstat_at(dir, name).map_err(|e| Error::at("stat", path, e))?;
        if !here.is_some_and(|h| h.st_dev == st.st_dev && h.st_ino == st.st_ino) {
            let flags = if exchanged {
                RenameFlags::EXCHANGE
            } else {
                RenameFlags::NOREPLACE
            };
            renameat_with(dir, name, udir, name, flags)
                .map_err(|e| Error::at("put back", path, e))?;
            return Err(Error::SourceChanged {
                path: path.to_string(),
                expected: hash.to_hex(),
            });
        }
        files.borrow_mut().push(MovedFile {
            path: path.clone(),
            dev: st.st_dev,
            ino: st.st_ino,
            out_left: false,
        });
        Ok(None)
    };
    let put_new = || renameat_with(udir, name, dir, name, RenameFlags::NOREPLACE);
    if ok(None) {
        match put_new() {
            Ok(()) => return Some(placed(false)),
            // Made by someone else since the check: judged as it comes
            // out of the exchange below (theirs stays).
            Err(Errno::EXIST) => {}
            Err(_) => return None,
        }
    }
    match renameat_with(udir, name, dir, name, RenameFlags::EXCHANGE) {
        Ok(()) => {}
        // Nothing there (removed since the check): the file goes in.
        Err(Errno::NOENT) => {
            return match put_new() {
                Ok(()) => Some(placed(false)),
                // Made again in between: theirs stays, ours in the layer.
                Err(Errno::EXIST) => Some(Ok(Some(raced()))),
                Err(_) => None,
            };
        }
        Err(_) => return None,
    }
    // Ours is at `path`; what was there is in the layer under its name.
    let out = fsx::read_node(udir, name, path, None).ok().flatten();
    if !ok(out.as_ref()) {
        // Someone else's version: back in place, atomically again; ours
        // back in the layer.
        return Some(
            renameat_with(udir, name, dir, name, RenameFlags::EXCHANGE)
                .map(|()| Some(raced()))
                .map_err(|e| Error::at("put back", path, e)),
        );
    }
    if let Err(e) = placed(true) {
        return Some(Err(e));
    }
    // The replaced file is kept for the undo (ADR 0210): where it is, in
    // the layer under its name, which becomes this entry's kept files
    // whole after the apply (ADR 0215). Or removed now, not left in the
    // layer: a later sweep of the layer would change the ctime of an inode
    // it shares with another workspace path, which the next run's check
    // reads as the person's edit.
    if keep.is_some_and(|k| k.may_keep(udir, name)) {
        if let Some(m) = files.borrow_mut().last_mut() {
            m.out_left = true;
        }
        return Some(Ok(None));
    }
    if let Err(e) = rustix::fs::unlinkat(udir, name, AtFlags::empty()) {
        return Some(Err(Error::at("remove the replaced", path, e)));
    }
    Some(Ok(None))
}

/// After a failed transition, a file [`move_from_upper`] moved in goes
/// back into the layer where it is still the inode moved (a run kept after
/// a failed apply still holds all it made, ADR 0211); the roll-back then
/// puts the pre-image at the path from the store. Best effort.
fn move_file_back(ws: &Workspace, up: &Root, m: &MovedFile) {
    let (Ok(dir), Ok(udir)) = (ws.root.open_parent(&m.path), up.open_parent(&m.path)) else {
        return;
    };
    let name = m.path.file_name();
    if matches!(fsx::lstat_at(dir.as_fd(), name), Ok(Some(h)) if h.st_dev == m.dev && h.st_ino == m.ino)
    {
        // Where what it replaced is still in the layer, the two change
        // places again: the workspace's file is back where it was.
        let how = if m.out_left {
            rustix::fs::RenameFlags::EXCHANGE
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        let _ = rustix::fs::renameat_with(&dir, name, &udir, name, how);
    }
}

/// Puts the prepared entry `tmp` (a file or symlink, in `dir`) at `path`,
/// replacing only what `ok` accepts: where nothing is, by a rename that
/// refuses to replace; where something is, by an atomic exchange, after
/// which what came out (now at `tmp`) is judged. Not accepted: exchanged
/// back, so the other version is at `path` again, and [`Raced`] returned.
/// On a filesystem without `renameat2` flags, what is there is judged
/// right before a plain rename (a window of one call).
fn place_checked(
    dir: BorrowedFd<'_>,
    path: &RelPath,
    tmp: &str,
    id: &str,
    target: &Node,
    keep: Option<&Keep>,
    ok: impl Fn(Option<&Node>) -> bool,
) -> Result<Option<Raced>> {
    use rustix::fs::{renameat, renameat_with, RenameFlags};
    let name = path.file_name();
    let raced = |saved_as| Raced {
        path: path.clone(),
        saved_as,
    };
    // Where nothing is there, the temp goes in by a rename that replaces
    // nothing; where something is, by an exchange. Which one is tried
    // first follows what the check expects (nothing: a created path), so
    // the common case costs one call and no `stat` (ADR 0212); the other
    // follows when the first finds the opposite.
    let put_new = || match renameat_with(dir, tmp, dir, name, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(Some(None)),
        Err(Errno::EXIST) => Ok(None),
        Err(Errno::INVAL) => place_unchecked(dir, path, tmp, &ok).map(Some),
        Err(e) => Err(Error::at("rename", path, e)),
    };
    // Made by someone else since the check (`None`): judged as it comes
    // out of the exchange below (theirs stays).
    if ok(None) {
        if let Some(done) = put_new()? {
            return Ok(done);
        }
    }
    match renameat_with(dir, tmp, dir, name, RenameFlags::EXCHANGE) {
        Ok(()) => {}
        // Nothing there (removed since the check): the temp goes in.
        Err(Errno::NOENT) => {
            return match put_new()? {
                Some(done) => Ok(done),
                // Made again in between: theirs stays.
                None => {
                    let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
                    Ok(Some(raced(None)))
                }
            };
        }
        Err(Errno::INVAL) => return place_unchecked(dir, path, tmp, ok),
        Err(e) => return Err(Error::at("rename", path, e)),
    }
    // `tmp` now holds what was at `path`.
    let out = fsx::read_node(dir, tmp, path, None).ok().flatten();
    if ok(out.as_ref()) {
        if !keep.is_some_and(|k| k.put(dir, tmp, path)) {
            rustix::fs::unlinkat(dir, tmp, AtFlags::empty())
                .map_err(|e| Error::at("remove the replaced", path, e))?;
        }
        return Ok(None);
    }
    // Someone else's version: back in place, atomically again.
    renameat_with(dir, tmp, dir, name, RenameFlags::EXCHANGE)
        .map_err(|e| Error::at("put back", path, e))?;
    // `tmp` holds ours again, unless yet another version came in between:
    // that one is saved beside, never removed.
    let back = fsx::read_node(dir, tmp, path, None).ok().flatten();
    if back.as_ref() == Some(target) {
        let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
        return Ok(Some(raced(None)));
    }
    let saved = kept_name(name, id);
    renameat(dir, tmp, dir, saved.as_str()).map_err(|e| Error::at("save beside", path, e))?;
    Ok(Some(raced(Some(saved))))
}

/// [`place_checked`] where `renameat2`'s flags are not supported: judge
/// what is there, then rename.
fn place_unchecked(
    dir: BorrowedFd<'_>,
    path: &RelPath,
    tmp: &str,
    ok: impl Fn(Option<&Node>) -> bool,
) -> Result<Option<Raced>> {
    let now = fsx::read_node(dir, path.file_name(), path, None)
        .ok()
        .flatten();
    if !ok(now.as_ref()) {
        let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
        return Ok(Some(Raced {
            path: path.clone(),
            saved_as: None,
        }));
    }
    rustix::fs::renameat(dir, tmp, dir, path.file_name())
        .map(|()| None)
        .map_err(|e| Error::at("rename", path, e))
}

/// Removes the file or symlink at `path` only if `ok` accepts it: moved
/// aside to `aside` first (atomically), judged there, then removed, or put
/// back and returned as [`Raced`].
fn remove_checked(
    dir: BorrowedFd<'_>,
    path: &RelPath,
    aside: &str,
    id: &str,
    keep: Option<&Keep>,
    ok: impl Fn(Option<&Node>) -> bool,
) -> Result<Option<Raced>> {
    use rustix::fs::{renameat_with, RenameFlags};
    let name = path.file_name();
    let _ = rustix::fs::unlinkat(dir, aside, AtFlags::empty());
    match renameat_with(dir, name, dir, aside, RenameFlags::NOREPLACE) {
        Ok(()) => {}
        // Gone already.
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::INVAL) => {
            let now = fsx::read_node(dir, name, path, None).ok().flatten();
            if !ok(now.as_ref()) {
                return Ok(Some(Raced {
                    path: path.clone(),
                    saved_as: None,
                }));
            }
            return rustix::fs::unlinkat(dir, name, AtFlags::empty())
                .map(|()| None)
                .map_err(|e| Error::at("remove", path, e));
        }
        Err(e) => return Err(Error::at("move aside", path, e)),
    }
    let out = fsx::read_node(dir, aside, path, None).ok().flatten();
    if ok(out.as_ref()) {
        if !keep.is_some_and(|k| k.put(dir, aside, path)) {
            rustix::fs::unlinkat(dir, aside, AtFlags::empty())
                .map_err(|e| Error::at("remove", path, e))?;
        }
        return Ok(None);
    }
    let saved_as = match renameat_with(dir, aside, dir, name, RenameFlags::NOREPLACE) {
        Ok(()) => None,
        // Yet another entry appeared at the path meanwhile: this one is
        // saved beside it.
        Err(_) => {
            let saved = kept_name(name, id);
            rustix::fs::renameat(dir, aside, dir, saved.as_str())
                .map_err(|e| Error::at("save beside", path, e))?;
            Some(saved)
        }
    };
    Ok(Some(Raced {
        path: path.clone(),
        saved_as,
    }))
}

/// The name a version found in a race is saved under, beside its path,
/// when it cannot stay at the path itself (not a temp name: recovery
/// leaves it alone).
fn kept_name(name: &str, id: &str) -> String {
    format!("{name}.retie-kept-{id}")
}

/// Prepares a file crash-safely: content into temp `tmp` in the same
/// directory (verifying its hash on the way), mode, and, unless the
/// transition syncs by `batch`, fsync; the caller then renames it over
/// `path`. A crash leaves the old entry or the new one, never a torn file.
///
/// From the upper layer, the temp is a hard link to the layer's file where
/// both lie on one filesystem (ADR 0208): no new inode, no copy. The layer
/// is retie's own scratch space, discarded after the apply, and nothing
/// writes it once the command is gone. The content is verified through
/// the temp itself, so what is checked is what is placed.
#[allow(clippy::too_many_arguments)]
fn write_file(
    store: &Store,
    src: &Source<'_>,
    upper_parents: Option<&fsx::Parents<'_>>,
    dir: BorrowedFd<'_>,
    path: &RelPath,
    tmp: &str,
    mode: u32,
    hash: crate::Hash,
    batch: bool,
) -> Result<()> {
    if let (Source::Upper { .. }, Some(up)) = (src, upper_parents) {
        if let Some(done) = link_from_upper(up, dir, path, tmp, mode, hash, batch) {
            return done;
        }
    }
    if let Source::Kept(keep) = src {
        if let Some(done) = take_kept(keep, dir, path, tmp, mode, hash, batch) {
            return done;
        }
    }
    let mut reader = open_source(store, src, path, &hash)?;
    let copied = afresh(dir, tmp, || fsx::create_at(dir, tmp))
        .map_err(|e| Error::at("create temp for", path, e))
        .and_then(|fd| {
            let mut f = File::from(fd);
            let (h, _) = fsx::hash_stream(&mut reader, Some(&mut f))
                .map_err(|e| Error::io("copy", path.as_str(), e))?;
            Ok((f, h, None))
        });
    seal_temp(dir, tmp, path, copied, mode, hash, batch)
}

/// The temp of [`write_file`] as a hard link to the upper layer's file.
/// `None`: no link could be made (another filesystem, a link limit, a
/// layer file that is not a plain single-link file): the caller copies.
fn link_from_upper(
    upper: &fsx::Parents<'_>,
    dir: BorrowedFd<'_>,
    path: &RelPath,
    tmp: &str,
    mode: u32,
    hash: crate::Hash,
    batch: bool,
) -> Option<Result<()>> {
    let udir = upper.open(path).ok()?;
    let name = path.file_name();
    // A layer file with other links would tie two workspace paths (or a
    // path and something else) to one inode: copied instead.
    let st = fsx::lstat_at(udir.as_fd(), name).ok()??;
    if fsx::ftype(&st) != FileType::RegularFile || st.st_nlink != 1 {
        return None;
    }
    afresh(dir, tmp, || {
        rustix::fs::linkat(udir.as_fd(), name, dir, tmp, AtFlags::empty())
    })
    .ok()?;
    let linked = fsx::open_file_at(dir, tmp)
        .map_err(|e| Error::at("open temp for", path, e))
        .and_then(|fd| {
            let st = rustix::fs::fstat(&fd).map_err(|e| Error::at("stat temp for", path, e))?;
            if fsx::ftype(&st) != FileType::RegularFile {
                return Err(Error::SourceChanged {
                    path: path.to_string(),
                    expected: hash.to_hex(),
                });
            }
            let mut f = File::from(fd);
            let (h, _) = fsx::hash_stream(&mut fsx::ToEnd::new(&mut f, &st), None)
                .map_err(|e| Error::io("read", path.as_str(), e))?;
            Ok((f, h, Some(fsx::perm(&st))))
        });
    Some(seal_temp(dir, tmp, path, linked, mode, hash, batch))
}

/// Makes temp `tmp` in `dir` by `make`, which fails with `EEXIST` where
/// something has the name: removed, and made again, once. The temp's name
/// holds the entry's id, so nothing is there unless a run of the same id
/// left it (an apply rolled back and tried again); looked for only then,
/// not by a system call a file.
fn afresh<T>(
    dir: BorrowedFd<'_>,
    tmp: &str,
    make: impl Fn() -> std::result::Result<T, Errno>,
) -> std::result::Result<T, Errno> {
    match make() {
        Err(Errno::EXIST) => {
            let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
            make()
        }
        r => r,
    }
}

/// The end of preparing temp `tmp` for `path`, copied or linked (`got`:
/// the open temp, the hash of what it holds, its mode where known): the
/// hash must be the target's, the mode is set, and unless the transition
/// syncs by `batch` the temp is synced. On any failure the temp goes.
fn seal_temp(
    dir: BorrowedFd<'_>,
    tmp: &str,
    path: &RelPath,
    got: Result<(File, crate::Hash, Option<u32>)>,
    mode: u32,
    hash: crate::Hash,
    batch: bool,
) -> Result<()> {
    let done = got.and_then(|(f, h, perm)| {
        if h != hash {
            return Err(Error::SourceChanged {
                path: path.to_string(),
                expected: hash.to_hex(),
            });
        }
        if perm != Some(mode) {
            rustix::fs::fchmod(&f, Mode::from_raw_mode(mode))
                .map_err(|e| Error::at("chmod", path, e))?;
        }
        if batch {
            return Ok(());
        }
        f.sync_all()
            .map_err(|e| Error::io("fsync", path.as_str(), e))
    });
    if done.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
    }
    done
}

/// The temp of [`write_file`] as the file the undone entry took out of
/// the workspace at `path` and kept (ADR 0210). `None`: none kept, or the
/// one kept is not a plain file of one link holding the pre-image (written
/// to through a descriptor held open since, say): removed, and the caller
/// copies the pre-image from the store.
fn take_kept(
    keep: &Keep,
    dir: BorrowedFd<'_>,
    path: &RelPath,
    tmp: &str,
    mode: u32,
    hash: crate::Hash,
    batch: bool,
) -> Option<Result<()>> {
    if !keep.take(path, dir, tmp) {
        return None;
    }
    let checked = (|| {
        let fd = fsx::open_file_at(dir, tmp).ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        if !kept::usable(&st) {
            return None;
        }
        let mut f = File::from(fd);
        let (h, _) = fsx::hash_stream(&mut fsx::ToEnd::new(&mut f, &st), None).ok()?;
        if h != hash {
            return None;
        }
        // Changed, to whatever reads times: as a copy would be.
        kept::touch(f.as_fd()).ok()?;
        Some((f, h, Some(fsx::perm(&st))))
    })();
    let Some(got) = checked else {
        kept::drop_at(dir, tmp);
        return None;
    };
    Some(seal_temp(dir, tmp, path, Ok(got), mode, hash, batch))
}

fn open_source(
    store: &Store,
    src: &Source<'_>,
    path: &RelPath,
    hash: &crate::Hash,
) -> Result<crate::store::Blob> {
    match src {
        Source::Store | Source::Kept(_) => store.open_blob(hash),
        Source::Upper { root: upper, .. } => {
            let dir = upper
                .open_parent(path)
                .map_err(|e| Error::at("open upper parent of", path, e))?;
            let fd = fsx::open_file_at(dir.as_fd(), path.file_name())
                .map_err(|e| Error::at("open upper", path, e))?;
            let st = rustix::fs::fstat(&fd).map_err(|e| Error::at("stat upper", path, e))?;
            if fsx::ftype(&st) != FileType::RegularFile {
                return Err(Error::SourceChanged {
                    path: path.to_string(),
                    expected: hash.to_hex(),
                });
            }
            Ok(crate::store::Blob::Loose(File::from(fd)))
        }
    }
}
