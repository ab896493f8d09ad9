//! What happens to a sandboxed command's changes in overlay mode: the
//! changeset is computed from the overlay's upper layer, then applied to
//! the real workspace (crash-safe, with pre-images kept for undo),
//! reviewed first, or discarded; or kept for later (`RunMeta`).
//!
//! Nothing here prints or asks: what a person must see and answer goes
//! through [`ChangesHooks`], which the caller renders.

use std::os::unix::fs::{chown, DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use retie_snapshot::{
    apply_alongside, recover, ApplyOptions, BlockReason, Change, ChangeKind, Changeset,
    ComputeOptions, Error as SnapError, Journal, Manifest, Node, RelPath, Store, Workspace,
    BATCH_SYNC_FROM,
};
use serde_json::json;
use sha2::Digest;

use crate::display::{visible, visible_again};
use crate::Error;

/// What the person sees and answers while changes are handled (the CLI
/// prints and asks on the terminal; the agent keeps the lines for the
/// model; tests answer directly).
pub trait JobUi {
    /// A line for the person (already escaped where it quotes a path).
    fn say(&mut self, line: &str);
    /// Show the changes and ask; `None` when there is no one to ask.
    fn review(&mut self, r: &Review<'_>) -> Option<bool>;
}

/// The changes a [`JobUi::review`] shows: the changeset, the workspace
/// and the run's upper layer (where the new contents are).
pub struct Review<'a> {
    pub cs: &'a Changeset,
    pub ws: &'a Path,
    pub upper: &'a Path,
    /// Whether the changes a sandbox may not make unasked are applied too.
    pub allow_blocked: bool,
}

/// What the caller renders, answers and records while changes are
/// handled: the person's side ([`JobUi`]) and the recording.
pub trait ChangesHooks: JobUi {
    /// Before the changes reach the workspace: the recording of the exact
    /// changeset and its undo plan (the ledger's durable point 2). It runs
    /// on another thread while the pre-images and the journal entry are
    /// made durable, and the workspace is touched only after it returned
    /// `Ok` (`retie_snapshot::apply_alongside`). If it fails, nothing is
    /// applied and the changes are kept. `manifest`: the change's
    /// manifest when it is too large to list path by path (ADR 0209).
    fn before_apply<'s>(&'s mut self, cs: &Changeset, manifest: Option<&Manifest>)
        -> Recording<'s>;
}

/// The recording [`ChangesHooks::before_apply`] hands the apply.
pub type Recording<'s> = Box<dyn FnOnce() -> Result<(), Error> + Send + 's>;

/// What to do with the changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangesMode {
    /// Apply them to the workspace (pre-images kept for undo).
    Apply,
    /// Throw them away.
    Discard,
    /// Show a summary and a diff, then ask on the terminal.
    Review,
}

/// What to do when the workspace changed, during the run, at paths the
/// command also changed (`retie changes apply RUN --theirs|--ours`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnConflict {
    /// Apply nothing, keep the run and show both sides and the choices.
    #[default]
    Refuse,
    /// Keep the workspace's version of every conflicting path; apply the
    /// rest.
    Theirs,
    /// Take the command's version everywhere; the workspace's version of
    /// a conflicting path becomes the apply's pre-image, so undo brings it
    /// back.
    Ours,
}

/// One overlay run's scratch space: `STATE/runs/ID/{upper,work}`, and
/// `run.json` ([`RunMeta`]) so a kept run can be listed, shown, applied or
/// discarded later (`retie changes`).
pub struct OverlayRun {
    pub id: String,
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    keep: bool,
    /// The sandbox that used the directories ran in this process (its
    /// init can be waited for): only then may they become a spare.
    pub in_process: bool,
    /// Who the directories belong to when retie runs as root for
    /// someone else's workspace (a spare is reused for the same owner).
    owner: Option<(u32, u32)>,
    /// Held while the run is in use (see [`RunLock`]).
    _lock: Option<RunLock>,
}

/// An exclusive `flock` on a run's directory, held by the process that
/// runs it or applies it (and, inherited, by the sandbox's init while it
/// lives), so `retie gc` never removes a run that is still going and two
/// `retie changes` never work on one kept run at once. Released when the
/// last holder closes it, a killed process included.
pub struct RunLock {
    _file: std::fs::File,
}

impl RunLock {
    /// Take it without waiting; `None` if someone holds it (or the
    /// directory cannot be opened).
    pub fn take(dir: &Path) -> Option<RunLock> {
        let f = std::fs::File::open(dir).ok()?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
        Some(RunLock { _file: f })
    }
}

/// What `retie changes` needs to know about a run it did not start.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunMeta {
    pub workspace: PathBuf,
    pub command: Vec<String>,
    /// When the sandbox started, from [`run_start`]: the base the
    /// command saw, for the conflict check of a later apply.
    pub started_ns: u128,
    pub created_ms: u128,
    /// Why it was kept, once it is.
    pub kept: Option<String>,
}

impl RunMeta {
    pub fn started(&self) -> SystemTime {
        let secs = u64::try_from(self.started_ns / 1_000_000_000).unwrap_or(0);
        let nanos = u32::try_from(self.started_ns % 1_000_000_000).unwrap_or(0);
        UNIX_EPOCH + Duration::new(secs, nanos)
    }
}

impl OverlayRun {
    /// Create the directories. When retie runs as root for a workspace
    /// owned by someone else, they belong to that owner, so the sandbox
    /// (which sees the owner's files as its own) can write them.
    pub fn create(state: &Path, owner: Option<(u32, u32)>) -> Result<OverlayRun, Error> {
        let id = retie_snapshot::new_id();
        let runs = state.join("runs");
        let dir = runs.join(&id);
        let upper = dir.join("upper");
        let work = dir.join("work");
        // A spare left by an earlier run that changed nothing: one rename
        // instead of three mkdirs now and four removals later.
        if !claim_spare(state, owner, &dir) {
            // Three mkdirs: `runs` exists after the first run (the
            // recursive builder tried every ancestor first, seven calls
            // more).
            if let Err(e) = make_dir(&dir) {
                if runs.is_dir() {
                    return Err(Error::io(format!("creating {}", dir.display()), e));
                }
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            }
            make_layers(&dir, owner)
                .map_err(|e| Error::io(format!("creating the layers in {}", dir.display()), e))?;
        }
        // A spare whose last init is still exiting may hold the lock for
        // a moment: the run goes on, and gc sees it held all the same.
        let lock = RunLock::take(&dir);
        Ok(OverlayRun {
            id,
            dir,
            upper,
            work,
            keep: false,
            in_process: false,
            owner,
            _lock: lock,
        })
    }

    /// Open a run another invocation kept.
    pub fn open_kept(state: &Path, id: &str) -> Result<(OverlayRun, RunMeta), Error> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Error::Invalid(format!(
                "{}: not a run id (see `retie changes list`)",
                visible(id)
            )));
        }
        let dir = state.join("runs").join(id);
        let meta: RunMeta = std::fs::read(dir.join("run.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| {
                Error::Invalid(format!("no kept run {id} (see `retie changes list`)"))
            })?;
        let Some(lock) = RunLock::take(&dir) else {
            return Err(Error::Invalid(format!(
                "run {id} is in use by another retie (still running, or being applied or discarded)"
            )));
        };
        let run = OverlayRun {
            id: id.to_string(),
            upper: dir.join("upper"),
            work: dir.join("work"),
            dir,
            keep: true,
            in_process: false,
            owner: None,
            _lock: Some(lock),
        };
        Ok((run, meta))
    }

    /// Record what the run is (before it starts).
    pub fn write_meta(&self, meta: &RunMeta) -> Result<(), Error> {
        let p = self.dir.join("run.json");
        let bytes = serde_json::to_vec(meta).map_err(|e| Error::Invalid(e.to_string()))?;
        // Overwritten in place, then cut to length: a reused directory's
        // old run.json is not truncated to nothing first (freeing its
        // block costs a discard on a filesystem mounted with `discard`).
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, &bytes)?;
                f.set_len(bytes.len() as u64)
            })
            .map_err(|e| Error::io(format!("writing {}", p.display()), e))
    }

    fn set_kept(&self, why: &str) {
        let p = self.dir.join("run.json");
        if let Some(mut m) = std::fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice::<RunMeta>(&b).ok())
        {
            m.kept = Some(why.to_string());
            if let Ok(b) = serde_json::to_vec(&m) {
                let _ = std::fs::write(&p, b);
            }
        }
    }

    /// Was the run kept?
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// Let the run's directories go when this is dropped (a kept run that
    /// was applied or discarded).
    pub fn release(&mut self) {
        self.keep = false;
    }

    /// Did the command write anything into the upper layer?
    pub fn has_writes(&self) -> bool {
        std::fs::read_dir(&self.upper).is_ok_and(|mut d| d.next().is_some())
    }

    /// Keep the run's directories (the changes were not applied), saying
    /// why in its `run.json`.
    pub fn keep_because(&mut self, why: &str) {
        self.keep = true;
        self.set_kept(why);
        // The overlay is volatile (no sync at its unmount): what the
        // command left in a kept run is made durable here, so it can be
        // applied after a crash (one syncfs, on this rare path only).
        if let Ok(f) = std::fs::File::open(&self.upper) {
            let _ = rustix::fs::syncfs(&f);
        }
    }

    /// Keep the run's directories (the changes were not applied).
    pub fn keep(&mut self) {
        self.keep_because("not applied");
    }
}

impl Drop for OverlayRun {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // Nothing in the upper layer: the directories are as good as new
        // (overlayfs empties `work` itself at every mount).
        // A spare is named after the init of the sandbox that used it
        // (which this process started), and mounted again only once that
        // is gone (see `spare_ready`).
        let empty = std::fs::read_dir(&self.upper).is_ok_and(|mut d| d.next().is_none());
        if empty && self.in_process && put_spare(&self.dir, self.owner) {
            return;
        }
        // One rename now; the removal (a handful of unlinks, each a
        // journaled metadata change) waits for the next run, which does
        // it while its command runs (`sweep_trash`), or for `retie gc`.
        let trash = self
            .dir
            .parent()
            .and_then(Path::parent)
            .map(|state| state.join(TRASH));
        if let Some(trash) = trash {
            let to = trash.join(&self.id);
            let moved = std::fs::rename(&self.dir, &to).is_ok()
                || (shared_dir(&trash) && std::fs::rename(&self.dir, &to).is_ok());
            if moved {
                return;
            }
        }
        remove_run_dir(&self.dir);
    }
}

/// Where finished runs' directories wait to be removed, in the state
/// directory (same filesystem as `runs`, so moving one there is a rename).
pub const TRASH: &str = "trash";

/// A change of more paths than this is recorded in the ledger by its
/// manifest, not path by path (ADR 0209).
pub const LISTED_PATHS_MAX: usize = 64;

/// Where the directories of runs that changed nothing wait to be reused,
/// in the state directory: `SPARE/OWNER.N`, at most [`SPARE_SLOTS`] per
/// owner. Creating and removing directories is what an overlay run spent
/// most of its file-system time on: on ext4 each new inode is searched
/// for past the recently deleted ones.
pub const SPARE: &str = "spare";
/// At most this many spares per owner.
const SPARE_SLOTS: usize = 4;

/// A spare's name: `OWNER.RUN.PID`, PID the init of the sandbox that last
/// mounted it (0: already reaped). The spare may be mounted again once
/// that process is gone: its mount namespace, and the overlay on these
/// directories with it, are gone then (overlayfs warns, and calls it
/// undefined, when an upper or work directory is still another mount's).
fn spare_prefix(owner: Option<(u32, u32)>) -> String {
    match owner {
        None => "self.".into(),
        Some((uid, gid)) => format!("{uid}-{gid}."),
    }
}

/// The spares of `owner` (names).
fn spares(state: &Path, owner: Option<(u32, u32)>) -> Vec<String> {
    let prefix = spare_prefix(owner);
    std::fs::read_dir(state.join(SPARE))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the process a spare waits for has exited: its /proc entry is
/// gone, or it is a zombie (which it stays until whoever inherited it
/// reaps it; its namespaces went before that). A pid reused since by a
/// live process only makes the spare wait longer.
fn spare_ready(name: &str) -> bool {
    match name.rsplit('.').next().and_then(|p| p.parse::<u32>().ok()) {
        Some(0) => true,
        Some(pid) => match std::fs::read(format!("/proc/{pid}/stat")) {
            // "PID (COMM) STATE ...": the state follows the last ')'.
            Ok(stat) => stat
                .iter()
                .rposition(|&b| b == b')')
                .and_then(|i| stat.get(i + 2))
                .is_some_and(|s| matches!(s, b'Z' | b'X')),
            Err(_) => true,
        },
        None => false,
    }
}

/// Move a ready spare for `owner` to `to` (which must not exist). A spare
/// another process claimed first is simply gone.
fn claim_spare(state: &Path, owner: Option<(u32, u32)>, to: &Path) -> bool {
    let spare = state.join(SPARE);
    spares(state, owner)
        .iter()
        .filter(|n| spare_ready(n))
        .any(|n| {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                spare.join(n),
                rustix::fs::CWD,
                to,
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .is_ok()
        })
}

/// Keep a finished run's directory as a spare, if there are fewer than
/// [`SPARE_SLOTS`].
fn put_spare(dir: &Path, owner: Option<(u32, u32)>) -> bool {
    let (Some(state), Some(id)) = (
        dir.parent().and_then(Path::parent),
        dir.file_name().map(|n| n.to_string_lossy().into_owned()),
    ) else {
        return false;
    };
    if spares(state, owner).len() >= SPARE_SLOTS {
        return false;
    }
    let spare = state.join(SPARE);
    // overlayfs removes and recreates `work/work` at every mount: removed
    // by the kernel, it costs the next run's set-up a directory removal
    // (and, on a filesystem mounted with `discard`, a synchronous discard).
    // Moved to the trash now (two calls), it is removed while the next
    // run's command runs.
    // It also holds the mark of the volatile mount (`incompat/volatile`),
    // which refuses the next mount of this work directory: a directory
    // whose `work/work` cannot be moved away is no spare.
    let ww = dir.join("work").join("work");
    if std::fs::symlink_metadata(&ww).is_ok() {
        // Moving a directory to another parent rewrites its `..`: it must
        // be writable (overlayfs makes it with mode 0).
        let _ = std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o700));
        let to = state.join(TRASH).join(format!("{id}-work"));
        let moved = std::fs::rename(&ww, &to).is_ok()
            || (shared_dir(&state.join(TRASH)) && std::fs::rename(&ww, &to).is_ok());
        if !moved {
            return false;
        }
    }
    let init = retie_runtime::earlier_runs().last().copied().unwrap_or(0);
    let to = spare.join(format!("{}{id}.{init}", spare_prefix(owner)));
    let rename = || {
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            dir,
            rustix::fs::CWD,
            &to,
            rustix::fs::RenameFlags::NOREPLACE,
        )
    };
    match rename() {
        Ok(()) => true,
        Err(rustix::io::Errno::NOENT) => {
            // The first spare: make the directory, then try once more.
            shared_dir(&spare) && rename().is_ok()
        }
        Err(_) => false,
    }
}

/// Spares kept ready beyond the one a run puts back.
const SPARE_READY: usize = 2;

/// Housekeeping for while a command runs: remove the trash, then make a
/// spare if fewer than [`SPARE_READY`] are there for `owner` (a run that
/// writes takes a spare and does not give it back; the next run that
/// changes nothing then finds one made here instead of making its own).
pub fn tidy(state: &Path, owner: Option<(u32, u32)>) {
    sweep_trash(state);
    if spares(state, owner).len() >= SPARE_READY {
        return;
    }
    let id = retie_snapshot::new_id();
    let spare = state.join(SPARE);
    let tmp = spare.join(format!(".new-{id}"));
    let made = (|| -> std::io::Result<()> {
        if let Err(e) = make_dir(&tmp) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e);
            }
            if !shared_dir(&spare) {
                return Err(std::io::Error::other("no spare directory"));
            }
            make_dir(&tmp)?;
        }
        make_layers(&tmp, owner)?;
        std::fs::rename(&tmp, spare.join(format!("{}{id}.0", spare_prefix(owner))))
    })();
    if made.is_err() {
        remove_run_dir(&tmp);
    }
}

/// Make one of the state's shared directories (`spare`, `trash`), which
/// another thread or process may be making at the same moment (the run's
/// housekeeping thread makes `spare` while the run puts its directory
/// back there): true if it is a directory now, made here or there, never
/// a symlink.
fn shared_dir(d: &Path) -> bool {
    match std::fs::DirBuilder::new().mode(0o700).create(d) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir())
        }
        Err(_) => false,
    }
}

/// One directory of a run, private to its owner.
fn make_dir(d: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(d)
}

/// The overlay's `upper` and `work` in run directory `dir` (which
/// exists), all three given to `owner` when retie runs as root for
/// someone else's workspace.
fn make_layers(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let (upper, work) = (dir.join("upper"), dir.join("work"));
    make_dir(&upper)?;
    make_dir(&work)?;
    if let Some((uid, gid)) = owner {
        for d in [&upper, &work, dir] {
            chown(d, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

/// Remove every spare (`retie gc`).
pub fn remove_spares(state: &Path) {
    let Ok(entries) = std::fs::read_dir(state.join(SPARE)) else {
        return;
    };
    for e in entries.flatten() {
        remove_run_dir(&e.path());
    }
}

/// Remove a run directory (overlay leaves `work/work` with mode 000).
pub fn remove_run_dir(dir: &Path) {
    // overlayfs makes its work directories with mode 0 (`work/work`, and
    // `incompat/volatile` in it): opened up, then removed. Only overlay's
    // own tree is walked, never `upper`: what the sandboxed command made
    // is not chmod-ed by path (a command still running could swap a
    // directory for a symlink to anywhere between the check and the
    // chmod).
    let own = if dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with("-work"))
    {
        dir.to_path_buf() // a run's `work/work`, moved to the trash alone
    } else {
        dir.join("work")
    };
    open_up(&own);
    let _ = std::fs::remove_dir_all(dir);
}

/// Give every directory in the tree at `dir` (not following symlinks)
/// mode 0700, so its owner can empty it. Only for overlayfs's work
/// directories, which no sandboxed command can reach.
fn open_up(dir: &Path) {
    let Ok(m) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            open_up(&e.path());
        }
    }
}

/// Remove the run directories finished runs left in the trash, and the
/// kept files of undone changes (ADR 0210). Best
/// effort: another process sweeping at the same time, or a directory that
/// will not go, is left for the next sweep or `retie gc`.
pub fn sweep_trash(state: &Path) {
    // The files undone or rolled-back changes had kept for their undo
    // (ADR 0210): their unlinks are this housekeeping's too.
    retie_snapshot::sweep_kept(&state.join("snapshots"));
    let Ok(entries) = std::fs::read_dir(state.join(TRASH)) else {
        return;
    };
    for e in entries.flatten() {
        remove_run_dir(&e.path());
    }
}

/// The snapshot store and journal of the state directory.
pub struct Snapshots {
    pub store: Store,
    pub journal: Journal,
    pub ws: Workspace,
    /// Changesets a crash had interrupted, rolled back by this open.
    pub rolled_back: Vec<String>,
}

impl Snapshots {
    /// Open them and roll back anything a crash left half-applied.
    pub fn open(state: &Path, workspace: &Path) -> Result<Snapshots, Error> {
        let dir = state.join("snapshots");
        let store = Store::open(&dir).map_err(snap)?;
        let journal = Journal::open(&dir).map_err(snap)?;
        let ws = Workspace::open(workspace).map_err(snap)?;
        let report = recover(&ws, &store, &journal).map_err(snap)?;
        Ok(Snapshots {
            store,
            journal,
            ws,
            rolled_back: report.rolled_back,
        })
    }
}

fn snap(e: SnapError) -> Error {
    Error::Snapshot(e)
}

/// How the changes ended, for the user and `--json`.
#[derive(Debug)]
pub struct Handled {
    pub json: serde_json::Value,
    /// Set when retie could not do what was asked (nothing applied).
    pub failure: Option<String>,
}

/// Paths of the changeset the command worked on an older version of: the
/// real workspace changed there after `since` (the lower is read-only to
/// the command, so only someone else changed it). Each path is judged on
/// its own (issue 33 item 4), never by its directory's time: an unrelated
/// file added beside a path the command created is no conflict.
/// O(changes).
///
/// - A path that exists now: its own ctime tells (modified, deleted or
///   created on both sides since the start).
/// - A path that is absent now, which the command made: it is a conflict
///   only if it existed when the command started, i.e. the person removed
///   it since. overlayfs marks every entry it copied up from the workspace
///   with an `overlay.origin` xattr in `upper`; an entry the command made
///   from nothing has none, and is no conflict. An entry with the mark was
///   either removed by the person after the command copied it up, or
///   renamed by the command (`mv a b`, `git mv`: the copy-up keeps the mark
///   under the new name, and in a user namespace the mark is empty, so it
///   cannot name where it came from). Both are told apart as on a
///   filesystem where overlayfs records no origins (anything but ext4,
///   xfs, btrfs): the nearest ancestor still in the workspace decides by
///   its change time, since a removal changes the directory it was made
///   in (conservative: an entry added beside is a conflict there, never a
///   missed removal).
/// - A path the command removed or moved away that the person removed too
///   ([`Changeset::vanished`]): a conflict, and with it every copied-up
///   path its directory alone cleared. A move across directories changes
///   the source's directory, not the destination's, and nothing pairs the
///   two: without this the content the person removed came back under
///   its new name.
///
/// `since` must come from [`run_start`], read before the sandbox starts:
/// every change made after it carries a time at or after it.
pub fn changed_during_run(
    ws: &Path,
    upper: &Path,
    cs: &Changeset,
    since: SystemTime,
) -> Vec<String> {
    let origins = records_origins(ws);
    // Directories of the change absent from the workspace now: what lies
    // beneath them is absent too, and is not looked up (a created tree of
    // 10,000 files: one `lstat` each saved). One made there since is the
    // apply's to find (it places nothing over an existing path).
    let mut absent: std::collections::HashSet<&str> = std::collections::HashSet::new();
    // Of those, the directories the command made (no origin mark). What
    // lies beneath one was made there too, or moved in from elsewhere;
    // while nothing vanished (below), no source of such a move was removed
    // by the person, so nothing beneath is looked up at all (two path
    // lookups a created file: 0.1-0.2 s of a 50,000-file apply).
    let mut made: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let quiet = cs.vanished.is_empty();
    // Copied-up paths absent from the workspace: moved here by the command,
    // or removed there by the person (see `vanished` below).
    let mut moved_here: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for c in cs
        .changes
        .iter()
        .chain(cs.blocked.iter().map(|b| &b.change))
    {
        let path = c.path.as_str();
        let is_dir = matches!(c.new, Some(Node::Dir { .. }));
        let parent = path.rfind('/').map(|i| &path[..i]);
        if origins && quiet && parent.is_some_and(|d| made.contains(d)) {
            if is_dir {
                made.insert(path);
            }
            continue;
        }
        let p = ws.join(path);
        let under_absent = parent.is_some_and(|d| absent.contains(d));
        let now = if under_absent { None } else { change_time(&p) };
        if now.is_none() && is_dir {
            absent.insert(path);
        }
        let changed = match now {
            Some(t) => t >= since,
            None if origins && !copied_up(&upper.join(path)) => {
                if is_dir {
                    made.insert(path);
                }
                false
            }
            None => {
                if origins {
                    moved_here.push(path);
                }
                p.ancestors()
                    .skip(1)
                    .take_while(|a| a.starts_with(ws))
                    .find_map(change_time)
                    // The workspace itself is gone: nothing can be applied.
                    .map_or(true, |t| t >= since)
            }
        };
        if changed {
            out.push(c.path.to_string());
        }
    }
    // What the command removed or moved away and the person removed too.
    // Where the command moved it, its content lives on under another name
    // (a copied-up entry, or a plain copy and a removal across
    // directories), and the directory time above judged the new name, not
    // the removal: each such path is a conflict, and with them every
    // copied-up path that only its directory cleared (no mark pairs a
    // moved file with where it came from).
    if !cs.vanished.is_empty() {
        out.extend(cs.vanished.iter().map(|p| p.to_string()));
        out.extend(moved_here.iter().map(|p| (*p).to_string()));
        out.sort();
        out.dedup();
    }
    out
}

/// Whether overlayfs records an `overlay.origin` on every entry it copies
/// up from the workspace: it does where the lower filesystem can decode
/// file handles and has a UUID (ext4, xfs, btrfs).
fn records_origins(ws: &Path) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    // `f_type` is a C long on some targets and not on others.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(ws).is_ok_and(|s| [EXT4, XFS, BTRFS].contains(&(s.f_type as i64)))
}

/// Whether the upper-layer entry at `p` was copied up from the workspace
/// (it existed there when the command first changed it), not made by the
/// command: overlayfs's origin mark (`user.` with `userxattr`, as retie
/// mounts it; `trusted.` otherwise). An entry that cannot be read counts
/// as copied up (conservative).
fn copied_up(p: &Path) -> bool {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::llistxattr(p, buf.as_mut_slice()) {
        Ok(n) => buf[..n.min(buf.len())]
            .split(|b| *b == 0)
            .any(|name| name == b"user.overlay.origin" || name == b"trusted.overlay.origin"),
        Err(rustix::io::Errno::NOENT) => false,
        Err(_) => true,
    }
}

/// Return once the coarse clock reads later than the change times of
/// `dirs`: after retie itself changed the workspace (creating a directory
/// to mask, which changes its parent), so that change does not look like
/// one made during the run. The change times are read back, not guessed
/// from the clock: a directory whose times were read since its last change
/// gets a fine-grained time on the next (Linux 6.13's multigrain
/// timestamps), which this machine saw run up to 6 ms ahead of the coarse
/// clock, more than one tick.
pub fn wait_past_changes_of(dirs: &[PathBuf]) {
    let latest = dirs.iter().filter_map(|d| change_time(d)).max();
    wait_past(latest.unwrap_or_else(coarse_now));
}

/// The start of an overlay run, for [`changed_during_run`]: a time at or
/// before that of every change made to the workspace from here on, and,
/// where the filesystem allows, later than that of every change made
/// before (so `chmod f && retie sandbox exec -- sh -c 'echo >> f'` is no
/// conflict). Call it right before the sandbox starts.
///
/// Where the workspace shares a filesystem with retie's state, the start
/// is a change time retie has the kernel stamp on a probe file there
/// ([`probe`], ADR 0409). When that time is fine-grained (Linux 6.13+) it
/// is exact and taken at once. Otherwise retie first waits until the
/// workspace's top and its own last apply lie in an earlier tick, then
/// takes a second probe's time. On another filesystem it is the coarse
/// clock after the same waits. In both fallbacks a change made beneath
/// the top in the same tick just before the start counts as made during
/// the run (conservative: a refusal, never a missed change).
pub fn run_start(state: &Path, ws: &Path) -> SystemTime {
    let same_fs = match probe(state, ws) {
        Some(Probe { t, fine: true }) => return t,
        Some(Probe { fine: false, .. }) => true,
        None => false,
    };
    wait_past_last_apply(state, ws);
    wait_past_changes_of(&[ws.to_path_buf()]);
    // On the workspace's own filesystem, a time stamped there now: cut to
    // that filesystem's granularity like every later stamp (1 s on ext4
    // with small inodes, 2 s on FAT), so none of them falls below it,
    // which the clock's own reading could.
    if same_fs {
        if let Some(p) = probe(state, ws) {
            return p.t;
        }
    }
    coarse_now()
}

/// What the probe got: the change time the kernel stamped, and whether it
/// is ahead of the coarse clock (fine-grained).
struct Probe {
    t: SystemTime,
    fine: bool,
}

/// A change time stamped now on the workspace's own filesystem, or `None`
/// when the probe file (`STATE/locks/clock`) is not a regular file there.
/// The kernel stamps a change with its coarse clock, or, when the inode's
/// times were read since a change in the same tick, with the fine clock;
/// it keeps the latest fine time it handed out as a floor under every
/// later stamp. So changing the probe twice with a `stat` between yields
/// a time at or before every change made after, and, when it is ahead of
/// the coarse clock (`fine`), later than every change made before. Any
/// such time is a safe start: the filesystem's later stamps never fall
/// below it, cut to its granularity the same way.
fn probe(state: &Path, ws: &Path) -> Option<Probe> {
    use rustix::fs::{fchmod, fstat, open, stat, FileType, Mode, OFlags};
    let dir = state.join("locks");
    let probe = dir.join("clock");
    // NONBLOCK: a FIFO planted there must not hang every run (refused
    // below, as anything but a regular file is).
    let flags =
        OFlags::CREATE | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let mode = Mode::RUSR | Mode::WUSR;
    let fd = match open(&probe, flags, mode) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .ok()?;
            open(&probe, flags, mode).ok()?
        }
        Err(_) => return None,
    };
    let st = fstat(&fd).ok()?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_dev != stat(ws).ok()?.st_dev
    {
        return None;
    }
    fchmod(&fd, mode).ok()?;
    fstat(&fd).ok()?;
    fchmod(&fd, mode).ok()?;
    let st = fstat(&fd).ok()?;
    let t = UNIX_EPOCH
        + Duration::new(
            u64::try_from(st.st_ctime).ok()?,
            u32::try_from(st.st_ctime_nsec).ok()?,
        );
    Some(Probe {
        t,
        fine: t > coarse_now(),
    })
}

/// `p`'s change time (ctime), not following a symlink.
fn change_time(p: &Path) -> Option<SystemTime> {
    std::fs::symlink_metadata(p).ok().map(|m| {
        UNIX_EPOCH
            + Duration::new(
                u64::try_from(m.ctime()).unwrap_or(0),
                u32::try_from(m.ctime_nsec()).unwrap_or(0),
            )
    })
}

/// Return once the coarse clock reads later than `t` (at most 100 ms: a
/// time stamped in the future is not waited for).
fn wait_past(t: SystemTime) {
    for _ in 0..100 {
        if coarse_now() > t {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Before a run reads its start time: when retie's own last apply on this
/// workspace happened in the coarse clock's current tick, wait for the
/// next one. The conflict check counts a change in the start's tick as
/// made during the run (it cannot tell before from after within a tick),
/// so a run started right after the previous one applied would otherwise
/// refuse its changes over the previous run's own (one `stat`; a wait of
/// at most one tick, only back to back).
pub fn wait_past_last_apply(state: &Path, ws: &Path) {
    if let Ok(last) = std::fs::metadata(ApplyLock::path(state, ws)).and_then(|m| m.modified()) {
        wait_past(last);
    }
}

/// The kernel's coarse real-time clock, the one file timestamps come from.
pub fn coarse_now() -> SystemTime {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    UNIX_EPOCH
        + Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
}

/// Serializes the conflict check and the apply of every retie process on
/// one workspace, so two runs that finish together cannot both pass the
/// check before either applies.
pub struct ApplyLock {
    _file: std::fs::File,
}

impl ApplyLock {
    fn path(state: &Path, ws: &Path) -> PathBuf {
        // SHA-256, which the ledger has already set up in this process:
        // blake3's first use probes the CPU (a handful of `cpuid`s, each
        // an exit to the hypervisor on a VM) for a 30-byte input.
        let digest = sha2::Sha256::digest(ws.as_os_str().as_encoded_bytes());
        let name = retie_ledger::hex(&digest[..16]);
        state.join("locks").join(format!("{name}.lock"))
    }

    /// After an apply: the lock file's mtime becomes the time of the
    /// change, from the clock file times come from (see
    /// [`wait_past_last_apply`]).
    pub fn stamp(&self) {
        let _ = rustix::fs::futimens(
            &self._file,
            &rustix::fs::Timestamps {
                last_access: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_OMIT,
                },
                last_modification: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_NOW,
                },
            },
        );
    }

    pub fn take(state: &Path, ws: &Path) -> Result<ApplyLock, Error> {
        let dir = state.join("locks");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let p = ApplyLock::path(state, ws);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| Error::io(format!("opening {}", p.display()), e))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::io(format!("locking {}", p.display()), e.into()))?;
        Ok(ApplyLock { _file: f })
    }
}

/// How the plant table applies to the canonical workspace `ws`: a home
/// workspace's shell start-up files, .ssh... are plants too, and so are
/// they beneath a `$HOME` the workspace holds.
pub fn plant_options(ws: &Path) -> ComputeOptions {
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    let home_workspace = home.as_deref() == Some(ws);
    let home_dir = home
        .as_ref()
        .and_then(|h| h.strip_prefix(ws).ok())
        .filter(|rel| !rel.as_os_str().is_empty())
        .and_then(|rel| RelPath::new(&rel.to_string_lossy()).ok());
    ComputeOptions {
        protected: Vec::new(),
        home_workspace,
        home_dir,
    }
}

/// A failure before anything was applied (the changes could not be read,
/// the workspace could not be locked): the command's work is kept as a
/// run, never thrown away with the run's directory, and the person is told
/// where it is.
fn kept_on_failure(run: &mut OverlayRun, hooks: &mut dyn ChangesHooks, e: Error) -> Error {
    run.keep_because("its changes could not be read or applied");
    hooks.say(&format!(
        "the command's changes were not applied and are kept as run {} (`retie changes show {}`, `discard`; the files are in {})",
        run.id,
        run.id,
        visible(&run.upper.to_string_lossy())
    ));
    e
}

/// Starts writing out the filesystem that holds `upper`, on a thread of
/// its own that nothing joins (`syncfs` on a descriptor of `upper`).
fn early_flush(upper: &Path) {
    let Ok(dir) = rustix::fs::open(
        upper,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("flush".into())
        .spawn(move || {
            let _ = rustix::fs::syncfs(&dir);
        });
}

/// Compute the changeset of `run` and do what `mode` says. `started` is
/// when the sandbox was started. `before_apply` runs right before the
/// changes reach the workspace (the ledger writes the intent and undo plan
/// there); if it fails, nothing is applied and the changes are kept.
#[allow(clippy::too_many_arguments)]
pub fn handle(
    mode: ChangesMode,
    allow_blocked: bool,
    retie_dirs: &[PathBuf],
    state: &Path,
    snaps: &Snapshots,
    run: &mut OverlayRun,
    owner: Option<(u32, u32)>,
    started: SystemTime,
    on_conflict: OnConflict,
    hooks: &mut dyn ChangesHooks,
) -> Result<Handled, Error> {
    let ws_path = snaps.ws.path().to_path_buf();
    let protected: Vec<RelPath> = retie_dirs
        .iter()
        .map(PathBuf::as_path)
        .chain([state])
        .filter_map(|d| d.strip_prefix(&ws_path).ok())
        .filter_map(|rel| RelPath::new(&rel.to_string_lossy()).ok())
        .collect();
    let opts = ComputeOptions {
        protected,
        ..plant_options(&ws_path)
    };
    let mut cs = match Changeset::compute_with(&ws_path, &run.upper, &opts) {
        Ok(cs) => cs,
        Err(e) => return Err(kept_on_failure(run, hooks, snap(e))),
    };
    // A change big enough to be synced as one batch (ADR 0208): what the
    // command wrote into the layer starts on its way to disk now (ADR
    // 0212), while the conflict check, the pre-images and the record are
    // made, so the batch's one `syncfs` at the end waits for less. A flush
    // only: the commit point is still that last `syncfs`, and a refused
    // apply loses nothing but the writing. Not for an empty or small run:
    // its own syncs are per file, and a whole-filesystem flush may carry
    // other programs' dirty data, which the exit would wait for.
    if mode == ChangesMode::Apply && cs.changes.len() >= BATCH_SYNC_FROM {
        early_flush(&run.upper);
    }
    // retie's own files are never applied, not even with --allow-blocked.
    let (never, blocked): (Vec<_>, Vec<_>) = std::mem::take(&mut cs.blocked)
        .into_iter()
        .partition(|b| b.reason == BlockReason::Protected);
    cs.blocked = blocked;
    if !never.is_empty() {
        hooks.say("refused, never applied (retie's own keys, ledger or state):");
        for b in &never {
            hooks.say(&format!("  {}", visible(b.change.path.as_str())));
        }
    }
    report_blocked_and_refused(&cs, allow_blocked, hooks);
    let base = json!({
        "id": cs.id,
        "mode": mode_name(mode),
        "changes": listed(&cs),
        "changes_total": cs.changes.len(),
        "blocked": cs.blocked.iter().map(|b| json!({"path": b.change.path.as_str(), "reason": b.reason})).collect::<Vec<_>>(),
        "refused": cs.refused.iter().map(|r| json!({"path": r.path, "reason": r.reason}))
            .chain(never.iter().map(|b| json!({"path": b.change.path.as_str(), "reason": "retie_state"})))
            .collect::<Vec<_>>(),
    });
    let mut applicable = cs.to_apply(allow_blocked).count();
    if applicable == 0 {
        return Ok(Handled {
            json: with(base, "applied", false),
            failure: None,
        });
    }
    let _lock = match ApplyLock::take(state, &ws_path) {
        Ok(l) => l,
        Err(e) => return Err(kept_on_failure(run, hooks, e)),
    };
    let stale = changed_during_run(&ws_path, &run.upper, &cs, started);
    let mut base = base;
    if !stale.is_empty() && mode != ChangesMode::Discard {
        match on_conflict {
            OnConflict::Refuse => return Ok(conflict(run, &ws_path, &cs, base, stale)),
            OnConflict::Theirs => {
                let dropped = keep_theirs(&mut cs, &stale);
                for p in &dropped {
                    hooks.say(&format!(
                        "kept the workspace's version of {} (--theirs): the command's is not applied",
                        visible(p)
                    ));
                }
                if let Some(o) = base.as_object_mut() {
                    o.insert("changes".into(), listed(&cs));
                    o.insert("changes_total".into(), json!(cs.changes.len()));
                    o.insert("theirs".into(), json!(dropped));
                }
                if cs.to_apply(allow_blocked).count() == 0 {
                    return Ok(Handled {
                        json: with(base, "applied", false),
                        failure: None,
                    });
                }
            }
            OnConflict::Ours => {
                for p in &stale {
                    hooks.say(&format!(
                        "taking the command's version of {} (--ours): the workspace's version is kept as the pre-image (`retie undo {}` brings it back)",
                        visible(p),
                        cs.id
                    ));
                }
                base = with(base, "ours", &stale);
            }
        }
    }
    applicable = cs.to_apply(allow_blocked).count();
    let go = match mode {
        ChangesMode::Discard => {
            hooks.say(&format!("{applicable} change(s) discarded"));
            false
        }
        ChangesMode::Apply => true,
        ChangesMode::Review => match hooks.review(&Review {
            cs: &cs,
            ws: &ws_path,
            upper: &run.upper,
            allow_blocked,
        }) {
            Some(yes) => yes,
            None => {
                run.keep();
                let msg = format!(
                    "no terminal to ask on: nothing was applied; the changes are kept in {}",
                    run.upper.display()
                );
                return Ok(Handled {
                    json: with(base, "applied", false),
                    failure: Some(msg),
                });
            }
        },
    };
    if !go {
        if mode == ChangesMode::Review {
            hooks.say("changes discarded");
        }
        return Ok(Handled {
            json: with(base, "applied", false),
            failure: None,
        });
    }
    // A large change is recorded by its manifest (ADR 0209): one ledger
    // entry of constant size, the list itself stored with the pre-images.
    let manifest = (cs.to_apply(allow_blocked).nth(LISTED_PATHS_MAX).is_some())
        .then(|| Manifest::of_changeset(&cs, allow_blocked));
    let record = hooks.before_apply(&cs, manifest.as_ref());
    let mut not_recorded = None;
    let applied = apply_alongside(
        &cs,
        &snaps.ws,
        &snaps.store,
        &snaps.journal,
        &ApplyOptions {
            allow_blocked,
            // The run is over once applied: its layer goes (ADR 0208).
            consume_layer: true,
            manifest,
        },
        || match record() {
            Ok(()) => true,
            Err(e) => {
                not_recorded = Some(e);
                false
            }
        },
    );
    if let Some(e) = not_recorded {
        run.keep();
        return Err(e);
    }
    match applied {
        Ok(entry) => {
            _lock.stamp();
            if let Some((uid, gid)) = owner {
                snaps.ws.chown_written(&entry, uid, gid).map_err(snap)?;
            }
            hooks.say(&format!(
                "{} (changeset {})",
                summary(&cs, allow_blocked),
                cs.id
            ));
            let mut json = with(base, "applied", true);
            if !entry.raced.is_empty() {
                // Changed by someone else at the moment of the apply: their
                // version stayed, the command's is kept in the run.
                run.keep_because("raced: the workspace changed during the apply");
                for r in &entry.raced {
                    hooks.say(&format!(
                        "{} changed while the changes were applied: your version is kept in the workspace{}; the command's version is not applied there and is kept as run {} (`retie changes show {}`; `retie changes apply {} --ours` takes it, your version kept for undo)",
                        visible(r.path.as_str()),
                        r.saved_as.as_ref().map_or_else(String::new, |n| format!(
                            " (and a later one beside it as {})",
                            visible(n)
                        )),
                        run.id,
                        run.id,
                        run.id
                    ));
                }
                json = with(
                    json,
                    "raced",
                    entry
                        .raced
                        .iter()
                        .map(|r| json!({"path": r.path.as_str(), "saved_as": r.saved_as}))
                        .collect::<Vec<_>>(),
                );
                json = with(json, "kept", json!({"run": run.id, "why": "raced"}));
            }
            Ok(Handled {
                json,
                failure: None,
            })
        }
        Err(SnapError::Conflict { paths }) => Ok(conflict(
            run,
            &ws_path,
            &cs,
            base,
            paths.iter().map(|m| m.path.to_string()).collect(),
        )),
        Err(e) => {
            // Say why (the OS error and the path, which the error's own
            // line leaves to its sources) and where the work is: kept,
            // to be applied once the cause is fixed (issue 33 item 6).
            run.keep_because("applying failed");
            hooks.say(&format!(
                "{}\nthe command's changes were not applied and are kept as run {id}: fix the cause, then `retie changes apply {id}` (or `retie changes discard {id}`)",
                visible_again(&retie_display::with_causes(&e), false),
                id = run.id
            ));
            Err(snap(e))
        }
    }
}

fn conflict(
    run: &mut OverlayRun,
    ws: &Path,
    cs: &Changeset,
    base: serde_json::Value,
    list: Vec<String>,
) -> Handled {
    run.keep_because("conflict");
    // Both sides of each path: what the workspace holds now, what the
    // command left.
    let sides: Vec<String> = list
        .iter()
        .map(|p| {
            let theirs = match std::fs::symlink_metadata(ws.join(p)) {
                Ok(m) if m.is_dir() => "a directory".to_string(),
                Ok(m) => format!("{} bytes, changed after the command started", m.len()),
                Err(_) => "absent (removed after the command started)".to_string(),
            };
            let ours = cs
                .changes
                .iter()
                .chain(cs.blocked.iter().map(|b| &b.change))
                .find(|c| c.path.as_str() == p)
                .map_or_else(
                    || vanished_side(cs, p),
                    |c| match &c.new {
                        Some(Node::Dir { .. }) => format!("{} (a directory)", kind_name(&c.kind)),
                        Some(n) => format!("{} ({} bytes)", kind_name(&c.kind), n.size()),
                        None => kind_name(&c.kind).to_string(),
                    },
                );
            format!("\n  {}: workspace: {theirs}; command: {ours}", visible(p))
        })
        .collect();
    let msg = format!(
        "the workspace changed while the command ran, where the command also wrote; nothing was applied. Conflicting:{}\nThe command's changes are kept as run {id} (files in {}). See both sides: `retie changes show {id}`; keep the workspace's version of these and apply the rest: `retie changes apply {id} --theirs`; take the command's version (yours is kept for `retie undo`): `retie changes apply {id} --ours`",
        sides.concat(),
        run.upper.display(),
        id = run.id,
    );
    Handled {
        json: with(with(base, "applied", false), "conflicts", list),
        failure: Some(msg),
    }
}

/// The command's side of a conflicting path that is no change of its
/// own: one it removed or moved away, which the person removed too.
fn vanished_side(cs: &Changeset, p: &str) -> String {
    if cs.vanished.iter().any(|v| v.as_str() == p) {
        "removed or moved it away (where it moved, its content would come back)".to_string()
    } else {
        String::new()
    }
}

/// `--theirs`: drop the conflicting paths from `cs`, and with them the
/// removal or replacement of a directory above one (which cannot go while
/// the workspace's version stays in it). Returns the paths dropped.
fn keep_theirs(cs: &mut Changeset, stale: &[String]) -> Vec<String> {
    let keep_under = |p: &str| {
        stale
            .iter()
            .any(|s| s == p || s.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
    };
    let drop = |c: &Change| {
        let p = c.path.as_str();
        stale.iter().any(|s| s == p) || (keep_under(p) && !c.new.as_ref().is_some_and(Node::is_dir))
    };
    let mut dropped = Vec::new();
    cs.changes.retain(|c| {
        let d = drop(c);
        if d {
            dropped.push(c.path.to_string());
        }
        !d
    });
    cs.blocked.retain(|b| {
        let d = drop(&b.change);
        if d {
            dropped.push(b.change.path.to_string());
        }
        !d
    });
    dropped
}

fn with<T: serde::Serialize>(mut v: serde_json::Value, key: &str, val: T) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.into(), json!(val));
    }
    v
}

fn mode_name(m: ChangesMode) -> &'static str {
    match m {
        ChangesMode::Apply => "apply",
        ChangesMode::Discard => "discard",
        ChangesMode::Review => "review",
    }
}

fn kind_name(k: &ChangeKind) -> &'static str {
    match k {
        ChangeKind::Created => "created",
        ChangeKind::Modified => "modified",
        ChangeKind::Deleted => "deleted",
        ChangeKind::ModeChanged => "mode_changed",
        ChangeKind::TypeChanged => "type_changed",
    }
}

/// The changes a result lists: all of them up to [`LISTED_PATHS_MAX`],
/// past that the first ones in path order, `changes_total` saying how many
/// there are (the ledger names the manifest, ADR 0209; `retie changes
/// show` summarises). A list of 200,000 paths as JSON was most of a big
/// apply's memory (session 23: 50 of 122 MiB at 50,000 files).
fn listed(cs: &Changeset) -> serde_json::Value {
    cs.changes
        .iter()
        .take(LISTED_PATHS_MAX)
        .map(change_json)
        .collect()
}

/// How many changes a handled result holds (`changes_total`, or the
/// length of its list where a result has no total).
pub fn changes_count(json: &serde_json::Value) -> usize {
    json["changes_total"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .or_else(|| json["changes"].as_array().map(Vec::len))
        .unwrap_or(0)
}

fn change_json(c: &Change) -> serde_json::Value {
    json!({
        "path": c.path.as_str(),
        "kind": kind_name(&c.kind),
        "size": c.new.as_ref().map(Node::size),
        "hash": c.new_hash().map(|h| h.to_hex()),
    })
}

fn summary(cs: &Changeset, allow_blocked: bool) -> String {
    let mut counts = std::collections::BTreeMap::new();
    let mut n = 0;
    for c in cs.to_apply(allow_blocked) {
        *counts.entry(kind_name(&c.kind)).or_insert(0) += 1;
        n += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    format!("applied {n} change(s): {}", parts.join(", "))
}

fn report_blocked_and_refused(cs: &Changeset, allow_blocked: bool, hooks: &mut dyn ChangesHooks) {
    if !cs.blocked.is_empty() && !allow_blocked {
        hooks.say(
            "blocked, not applied (a sandbox may not plant these; --allow-blocked applies them):",
        );
        for b in &cs.blocked {
            hooks.say(&format!(
                "  {} ({})",
                visible(b.change.path.as_str()),
                b.reason
            ));
        }
    }
    if !cs.refused.is_empty() {
        hooks.say("refused, never applied:");
        for r in &cs.refused {
            hooks.say(&format!(
                "  {} ({})",
                visible(&r.path.to_string()),
                r.reason
            ));
        }
    }
}

/// The owner the written files must get when retie runs as root for a
/// workspace owned by someone else.
pub fn root_owner(workspace: &Path) -> Result<Option<(u32, u32)>, Error> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let m = std::fs::metadata(workspace)
        .map_err(|e| Error::io(format!("stat {}", workspace.display()), e))?;
    // A workspace of root's own: what root writes, and what its sandbox
    // writes (mapped to root, unprivileged), is root's already, and a
    // `chown` of every path would change nothing (session 23: 50 ms of a
    // 10,000-file apply).
    if m.uid() == 0 && m.gid() == rustix::process::getegid().as_raw() {
        return Ok(None);
    }
    Ok(Some((m.uid(), m.gid())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state's shared directories may be made by two at once (the
    /// first run's housekeeping thread made `spare` while the run put its
    /// directory there, and the run sent it to the trash instead: a
    /// timing the CI hit). Made elsewhere first is as good as made here;
    /// a symlink in its place is not.
    #[test]
    fn a_shared_directory_made_by_another_is_taken_and_a_symlink_is_not() {
        let t = tempfile::tempdir().expect("tempdir");
        let d = t.path().join("spare");
        assert!(shared_dir(&d), "made here");
        assert!(shared_dir(&d), "made already (by another thread)");
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        let link = t.path().join("trash");
        std::os::unix::fs::symlink(&elsewhere, &link).expect("symlink");
        assert!(!shared_dir(&link), "a symlink is no shared directory");
        assert!(!shared_dir(&t.path().join("missing/parent")));
    }

    fn ctime(p: &Path) -> SystemTime {
        change_time(p).expect("ctime")
    }

    /// Change `p`'s inode after reading its times: the way to a
    /// fine-grained change time.
    fn change(p: &Path, i: u32) {
        let _ = std::fs::metadata(p);
        let mode = if i % 2 == 0 { 0o600 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// Anything but a regular file at the probe's place (a FIFO would
    /// block the open) sends the start to the coarse clock, at once.
    #[test]
    fn a_fifo_at_the_probe_does_not_hang_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ws, state) = (dir.path().join("ws"), dir.path().join("state"));
        std::fs::create_dir(&ws).expect("mkdir");
        std::fs::create_dir_all(state.join("locks")).expect("mkdir");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            state.join("locks").join("clock"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .expect("mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        let (s2, w2) = (state.clone(), ws.clone());
        std::thread::spawn(move || {
            let _ = tx.send((probe(&s2, &w2).is_none(), run_start(&s2, &w2)));
        });
        let (refused, _) = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("run_start hung on a FIFO");
        assert!(refused, "a FIFO was taken as the probe");
    }

    /// Every change made after a run's start carries a time at or after
    /// it (else the conflict check would miss an edit made during the
    /// run), and, where the start is fine-grained, every change made just
    /// before carries an earlier one (else it would be refused as made
    /// during the run).
    #[test]
    fn the_start_separates_changes_before_it_from_changes_after_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        let state = dir.path().join("state");
        std::fs::create_dir(&ws).expect("mkdir");
        let (before, after) = (ws.join("before"), ws.join("after"));
        std::fs::write(&before, "").expect("write");
        std::fs::write(&after, "").expect("write");
        let mut fine = 0;
        for i in 0..300 {
            change(&before, i);
            change(&after, i);
            change(&before, i + 1);
            let fine_t = probe(&state, &ws).filter(|p| p.fine).map(|p| p.t);
            let start = fine_t.unwrap_or_else(|| run_start(&state, &ws));
            change(&after, i + 1);
            assert!(
                ctime(&after) >= start,
                "{i}: a change after the start reads as made before it"
            );
            if fine_t.is_some() {
                fine += 1;
                assert!(
                    ctime(&before) < start,
                    "{i}: a change before the start reads as made after it"
                );
            }
        }
        eprintln!("fine-grained starts: {fine} of 300");
        // Linux 6.13+ on ext4, xfs, btrfs or tmpfs: the exact start must
        // be the one taken (almost always; the probe falls back when the
        // tick turns between its two changes).
        let fs = rustix::fs::statfs(&ws).expect("statfs").f_type as i64;
        let multigrain_fs = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994].contains(&fs);
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|x| x.parse::<u32>().ok());
        let kernel = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        if multigrain_fs && kernel >= (6, 13) {
            assert!(fine >= 250, "only {fine} of 300 starts were fine-grained");
        }
    }

    /// After an apply's stamp, a run's start time is read only once the
    /// coarse clock has moved past it.
    #[test]
    fn a_start_after_a_stamped_apply_is_in_a_later_tick() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("mkdir");
        for _ in 0..5 {
            let lock = ApplyLock::take(dir.path(), &ws).expect("lock");
            lock.stamp();
            drop(lock);
            wait_past_last_apply(dir.path(), &ws);
            let stamped = std::fs::metadata(ApplyLock::path(dir.path(), &ws))
                .and_then(|m| m.modified())
                .expect("mtime");
            assert!(coarse_now() > stamped);
        }
    }
}
