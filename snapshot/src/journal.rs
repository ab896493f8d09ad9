//! The journal: one JSON file per apply, undo or file-tool write.
//!
//! Layout under the state dir: `journal/open/<id>.pending.json` while an
//! entry is pending, `journal/<id>.json` once it is complete or rolled
//! back, `journal/seq` (last sequence number) and `journal/lock`. An entry
//! is written (temp in `open/` + fsync + rename + fsync of the directory it
//! lands in) as pending before the workspace is touched. It is completed by
//! giving that pending file, as it is, the name `journal/<id>.json` (a hard
//! link and one sync of `journal/`, then the pending name removed: the
//! content was synced when it was written), so an entry in `journal/` whose
//! content still says `pending` is complete: the final name is the mark
//! ([`Journal::complete`], ADR 0407). When both names exist, the one with
//! the higher `seq` stands, the final one on a tie. A rolled-back or
//! expired entry is written in full, the same way as the pending one, and
//! its pending file removed.
//! Finding pending entries and leftover temporaries lists `open/` only
//! (empty but for a crash), so the recovery check every run makes does not
//! grow with the journal. A journal of the older layout (pending files and
//! temporaries in `journal/` itself) is moved over once, under the lock,
//! when it is first opened. Every operation that changes the workspace
//! holds an exclusive `flock` on `journal/lock`.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::node::Node;
use crate::relpath::RelPath;
use crate::store::{fsync_dir, mkdir_p, nanos};

/// The journal format version written by this crate.
pub const JOURNAL_VERSION: u32 = 1;

/// What an entry did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Applied a changeset computed from an overlay upper layer.
    Apply {
        /// The upper layer the new content was read from.
        upper: PathBuf,
    },
    /// Undid another entry (undoing an undo is a redo).
    Undo {
        /// The entry undone.
        of: String,
    },
    /// A file-tool write of an older retie (file tools now apply a
    /// changeset); kept so old journals still read and undo.
    FileWrite,
}

/// Where an entry is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryState {
    /// Written before the workspace was touched; not yet finished. Recovery
    /// rolls it back.
    Pending,
    /// Every step applied and durable.
    Complete,
    /// Failed or interrupted and restored to the pre-images.
    RolledBack,
    /// Complete once, but `gc` has since removed its pre-images (it was
    /// older than what the state is kept for): it can no longer be undone.
    Expired,
}

impl EntryState {
    /// "pending", "complete", "rolled_back", "expired".
    pub fn name(self) -> &'static str {
        match self {
            EntryState::Pending => "pending",
            EntryState::Complete => "complete",
            EntryState::RolledBack => "rolled_back",
            EntryState::Expired => "expired",
        }
    }
}

/// One path changed by an entry: its pre-image and what it was set to.
/// The content of every `File` pre-image is in the blob store, or, for a
/// small file, in the step itself (`before_content`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Workspace-relative path.
    pub path: RelPath,
    /// The pre-image (what the workspace held before); `None`: absent.
    pub before: Option<Node>,
    /// What the entry set it to; `None`: removed.
    pub after: Option<Node>,
    /// The pre-image's content, carried in the entry when the file was
    /// small (ADR 0408), on the first step whose pre-image it is: it is
    /// durable with the pending entry, so the blob store need not be synced
    /// before the workspace is touched. It goes into the store when
    /// something reads it back (an undo, a roll-back).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "base64_bytes"
    )]
    pub before_content: Option<Vec<u8>>,
}

/// `Option<Vec<u8>>` as a base64 string (standard alphabet, padded).
mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| {
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Format version ([`JOURNAL_VERSION`]).
    pub version: u32,
    /// Entry id (for an apply, the changeset id).
    pub id: String,
    /// Order of entries in this journal, from 1.
    pub seq: u64,
    /// The workspace the entry changed (canonical path).
    pub workspace: PathBuf,
    /// What it did.
    #[serde(flatten)]
    pub op: Op,
    /// Its state.
    pub state: EntryState,
    /// When it was created, milliseconds since the epoch.
    pub created_unix_ms: u64,
    /// The steps in path order (each directory before its descendants).
    pub steps: Vec<Step>,
    /// Paths where someone else changed the workspace between the check
    /// and the change (issue 26 item 6): their version was kept in place
    /// and this entry's change was not made there (no step names them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raced: Vec<Raced>,
    /// The blob holding the manifest of this entry's change (ADR 0209),
    /// for a change too large for the ledger to list path by path: kept
    /// by `gc` while the entry is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<crate::Hash>,
}

/// A path an operation found changed by someone else at the moment it was
/// to replace or remove it (after the conflict check): the other version
/// stays in the workspace, the operation's change is not made there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Raced {
    /// The path; the other version is there.
    pub path: RelPath,
    /// A yet later version, found where the operation's own file was put
    /// back, saved beside under this name (in the same directory) rather
    /// than removed; almost always `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_as: Option<String>,
}

/// The journal of one state directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
    /// `dir/open`: pending entries and temporaries.
    open: PathBuf,
}

/// An exclusive lock on the journal, released on drop.
#[derive(Debug)]
pub struct JournalLock {
    _file: File,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh 16-hex-digit id: the time, the process and a counter, mixed
/// by SipHash under a key from the OS (std's `RandomState`). Unique, not
/// secret; blake3 here probed the CPU at every process's first id (a
/// handful of `cpuid`s, each an exit to the hypervisor on a VM).
pub fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u128(nanos());
    h.write_u32(std::process::id());
    h.write_u64(n);
    format!("{:016x}", h.finish())
}

/// Ids are file names: accept only `[0-9A-Za-z_-]{1,64}`.
pub(crate) fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidPath {
            name: id.to_owned(),
            reason: "not a journal id",
        })
    }
}

impl Journal {
    /// Opens (creating if needed) the journal under `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Journal> {
        let dir = state_dir.join("journal");
        let open = dir.join("open");
        let j = Journal { dir, open };
        if !j.open.is_dir() {
            mkdir_p(&j.dir)?;
            j.adopt_older_layout()?;
        }
        Ok(j)
    }

    /// Move a journal of the older layout over (once, under the lock):
    /// its pending files into `open/`, its temporaries removed. `open/`
    /// appears only when that is done, so a process that sees it never
    /// misses a pending entry.
    fn adopt_older_layout(&self) -> Result<()> {
        let _lock = self.lock()?;
        if self.open.is_dir() {
            return Ok(());
        }
        let staging = self.dir.join(format!(".open.{}", std::process::id()));
        let _ = fs::remove_dir_all(&staging);
        fs::create_dir(&staging).map_err(|e| Error::io("mkdir", &staging, e))?;
        let all = names(&self.dir)?;
        for name in all.iter().filter(|n| n.ends_with(".json.tmp")) {
            let p = self.dir.join(name);
            fs::remove_file(&p).map_err(|e| Error::io("remove", &p, e))?;
        }
        for id in ids_named(&all, ".pending.json") {
            let name = format!("{id}.pending.json");
            let to = staging.join(&name);
            fs::rename(self.dir.join(&name), &to).map_err(|e| Error::io("rename", &to, e))?;
        }
        fsync_dir(&staging)?;
        fs::rename(&staging, &self.open).map_err(|e| Error::io("rename", &self.open, e))?;
        fsync_dir(&self.dir)
    }

    /// The journal directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the exclusive journal lock (blocking).
    pub fn lock(&self) -> Result<JournalLock> {
        let p = self.dir.join("lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&p)
            .map_err(|e| Error::io("open", &p, e))?;
        rustix::fs::flock(f.as_fd(), rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::io("flock", &p, e.into()))?;
        Ok(JournalLock { _file: f })
    }

    fn final_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn pending_path(&self, id: &str) -> PathBuf {
        self.open.join(format!("{id}.pending.json"))
    }

    /// The ids of the pending files in `open/`.
    fn scan_open(&self) -> Result<Vec<String>> {
        Ok(ids_named(&names(&self.open)?, ".pending.json"))
    }

    /// Every id: (id, has final file, has pending file).
    fn scan(&self) -> Result<BTreeMap<String, (bool, bool)>> {
        let mut ids: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for id in ids_named(&names(&self.dir)?, ".json") {
            ids.entry(id).or_default().0 = true;
        }
        for id in self.scan_open()? {
            ids.entry(id).or_default().1 = true;
        }
        Ok(ids)
    }

    /// Every entry, in `seq` order.
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for (id, (fin, pend)) in self.scan()? {
            out.push(self.newest(&id, fin, pend)?);
        }
        out.sort_by_key(|e| (e.seq, e.created_unix_ms));
        Ok(out)
    }

    /// The entry `id` as it stands: when both a final and a pending file
    /// exist, the one with the higher `seq`, the final one on a tie. A tie
    /// is a crash that left both names of one entry (the final one wins);
    /// a pending file with a higher `seq` is a re-apply of a changeset
    /// whose earlier apply was rolled back, cut short (it must be
    /// recovered, not hidden by the earlier entry).
    fn newest(&self, id: &str, fin: bool, pend: bool) -> Result<Entry> {
        match (fin, pend) {
            (true, true) => {
                let f = self.read_path(&self.final_path(id))?;
                let p = self.read_path(&self.pending_path(id))?;
                Ok(if p.seq > f.seq { p } else { f })
            }
            (true, false) => self.read_path(&self.final_path(id)),
            (false, true) => self.read_path(&self.pending_path(id)),
            (false, false) => Err(Error::UnknownEntry { id: id.to_owned() }),
        }
    }

    /// Nothing in `open/`: no entry pending and no temporary, so nothing
    /// for [`crate::recover`] to do (an apply writes its pending entry
    /// before it touches the workspace).
    pub fn nothing_open(&self) -> bool {
        fs::read_dir(&self.open).is_ok_and(|mut d| d.next().is_none())
    }

    /// The pending entries (cheap: only pending files are read, and a
    /// final file of the same id only when there is one).
    pub fn pending(&self) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        for id in self.scan_open()? {
            let e = self.newest(&id, self.final_path(&id).exists(), true)?;
            if e.state == EntryState::Pending {
                out.push(e);
            }
        }
        out.sort_by_key(|e| (e.seq, e.created_unix_ms));
        Ok(out)
    }

    /// The entry `id`.
    pub fn get(&self, id: &str) -> Result<Entry> {
        check_id(id)?;
        self.newest(
            id,
            self.final_path(id).exists(),
            self.pending_path(id).exists(),
        )
    }

    /// Whether an entry `id` exists.
    pub fn exists(&self, id: &str) -> bool {
        check_id(id).is_ok() && (self.final_path(id).exists() || self.pending_path(id).exists())
    }

    fn read_path(&self, p: &Path) -> Result<Entry> {
        let bytes = fs::read(p).map_err(|e| Error::io("read", p, e))?;
        let mut e: Entry = serde_json::from_slice(&bytes).map_err(|e| Error::Journal {
            path: p.to_path_buf(),
            source: e,
        })?;
        // A pending file moved out of `open/` was completed by the move.
        if e.state == EntryState::Pending && p.parent() == Some(self.dir.as_path()) {
            e.state = EntryState::Complete;
        }
        Ok(e)
    }

    /// Marks a pending entry complete: its pending file, synced when it was
    /// written, is given the entry's final name, `journal/` synced, and the
    /// pending name removed (one sync, where writing the entry again took
    /// two). Readers take a pending entry under its final name as complete.
    /// A crash before the final name is durable leaves the entry pending,
    /// and recovery rolls it back (ADR 0201); one that leaves both names
    /// reads as complete, and recovery removes the pending one.
    pub(crate) fn complete(&self, entry: &mut Entry) -> Result<()> {
        check_id(&entry.id)?;
        if entry.state != EntryState::Pending {
            return Err(Error::EntryState {
                id: entry.id.clone(),
                state: entry.state.name(),
                what: "only a pending entry is completed",
            });
        }
        // An undo names what it undid by a marker, made before the entry
        // is given its final name and durable with it (ADR 0212), so that
        // "is it undone?" is one `readlink`, not a read of every entry.
        // A crash that leaves the marker without the final name leaves
        // the undo pending: recovery rolls it back, and the marker then
        // names an entry that is not complete, which answers no.
        if let Op::Undo { of } = &entry.op {
            self.mark_undone(of, &entry.id)?;
        }
        let from = self.pending_path(&entry.id);
        let to = self.final_path(&entry.id);
        // A second name first, synced, then the pending name dropped: on a
        // filesystem without a journal, a move between two directories can
        // lose both names if only one directory reaches the disk. Both
        // names read as one complete entry (same `seq`). An earlier final
        // entry of this id (a re-apply of a rolled-back changeset) is
        // replaced in one rename instead.
        match fs::hard_link(&from, &to) {
            Ok(()) => {
                fsync_dir(&self.dir)?;
                fs::remove_file(&from).map_err(|e| Error::io("remove", &from, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                fs::rename(&from, &to).map_err(|e| Error::io("rename", &to, e))?;
                fsync_dir(&self.dir)?;
            }
            Err(e) => return Err(Error::io("link", &to, e)),
        }
        entry.state = EntryState::Complete;
        Ok(())
    }

    fn undone_path(&self, of: &str) -> PathBuf {
        self.dir.join(format!("{of}.undone"))
    }

    /// Points the marker of entry `of` at undo entry `by`: a symlink (its
    /// target held in the inode, made whole or not at all), put in place
    /// by a rename. Synced by the caller's sync of `journal/`.
    fn mark_undone(&self, of: &str, by: &str) -> Result<()> {
        check_id(of)?;
        check_id(by)?;
        let tmp = self.dir.join(format!(".{of}.undone.{by}.tmp"));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(by, &tmp).map_err(|e| Error::io("symlink", &tmp, e))?;
        let to = self.undone_path(of);
        fs::rename(&tmp, &to).map_err(|e| Error::io("rename", &to, e))
    }

    /// The complete undo of entry `of`, if its marker names one: in one
    /// `readlink` and one read of that entry, however long the journal.
    /// An undo completed before markers were kept (an older journal) is
    /// not found here; undoing its entry again is then refused by the
    /// engine's check, as the workspace no longer holds what it left.
    pub fn undone_by(&self, of: &str) -> Option<Entry> {
        check_id(of).ok()?;
        let by = fs::read_link(self.undone_path(of)).ok()?;
        let by = by.to_str()?;
        check_id(by).ok()?;
        let u = self.get(by).ok()?;
        (u.state == EntryState::Complete && matches!(&u.op, Op::Undo { of: o } if o == of))
            .then_some(u)
    }

    /// Drops the marker of entry `of` (it expired).
    pub(crate) fn forget_undone(&self, of: &str) {
        if check_id(of).is_ok() {
            let _ = fs::remove_file(self.undone_path(of));
        }
    }

    /// The next sequence number (call with the lock held). Kept in
    /// `journal/seq`; rebuilt from the entries if that file is missing or
    /// unreadable. The number is written in place, fixed-width, in one
    /// `pwrite` of 21 bytes: replacing the file by a rename freed a block
    /// at every apply, which costs a synchronous discard on a filesystem
    /// mounted with `discard`.
    pub(crate) fn next_seq(&self) -> Result<u64> {
        let p = self.dir.join("seq");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&p)
            .map_err(|e| Error::io("open", &p, e))?;
        let mut buf = [0u8; 32];
        let n = f
            .read_at(&mut buf, 0)
            .map_err(|e| Error::io("read", &p, e))?;
        let last = match std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
        {
            Some(n) => n,
            None => self.entries()?.iter().map(|e| e.seq).max().unwrap_or(0),
        };
        let next = last + 1;
        let text = format!("{next:020}\n");
        f.write_all_at(text.as_bytes(), 0)
            .map_err(|e| Error::io("write", &p, e))?;
        Ok(next)
    }

    /// Writes `entry` durably and atomically (temp, fsync, rename, fsync
    /// dir). A pending entry lives in `<id>.pending.json`; a finished one in
    /// `<id>.json`, after which the pending file is removed (if both exist
    /// after a crash, the finished one wins).
    pub(crate) fn write(&self, entry: &Entry) -> Result<()> {
        check_id(&entry.id)?;
        let pending = entry.state == EntryState::Pending;
        let dest = if pending {
            self.pending_path(&entry.id)
        } else {
            self.final_path(&entry.id)
        };
        let tmp = self.open.join(format!(".{}.json.tmp", entry.id));
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        // Compact (an entry of 10,000 steps is 3.1 MB so, 4.4 MB indented,
        // written and synced twice: pending, then final), and streamed to
        // the file: never held whole in memory (200,000 created files: 37
        // MB at the peak of the apply, and again of its undo). A failure
        // part-way leaves only the temporary, which nothing reads.
        let mut w = std::io::BufWriter::with_capacity(1 << 18, f);
        serde_json::to_writer(&mut w, entry).map_err(|e| match e.io_error_kind() {
            Some(kind) => Error::io("write", &tmp, std::io::Error::new(kind, e)),
            None => Error::Journal {
                path: dest.clone(),
                source: e,
            },
        })?;
        let f = w
            .into_inner()
            .map_err(|e| Error::io("write", &tmp, e.into_error()))?;
        f.sync_all().map_err(|e| Error::io("write", &tmp, e))?;
        drop(f);
        fs::rename(&tmp, &dest).map_err(|e| Error::io("rename", &dest, e))?;
        if !pending {
            let pp = self.pending_path(&entry.id);
            match fs::remove_file(&pp) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", &pp, e)),
            }
        }
        fsync_dir(if pending { &self.open } else { &self.dir })
    }

    /// Removes temp files left by an interrupted [`Journal::write`], and
    /// pending files superseded by a finished entry.
    pub(crate) fn clean_temps(&self) -> Result<()> {
        for name in names(&self.open)? {
            let superseded = match name.strip_suffix(".pending.json") {
                Some(id) if check_id(id).is_ok() && self.final_path(id).exists() => {
                    self.newest(id, true, true)?.state != EntryState::Pending
                }
                _ => false,
            };
            if superseded || name.ends_with(".json.tmp") {
                let p = self.open.join(&name);
                fs::remove_file(&p).map_err(|e| Error::io("remove", &p, e))?;
            }
        }
        Ok(())
    }
}

/// The names in `dir` (those that are not UTF-8 are no journal's).
fn names(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for ent in fs::read_dir(dir).map_err(|e| Error::io("read dir", dir, e))? {
        let ent = ent.map_err(|e| Error::io("read dir", dir, e))?;
        if let Ok(name) = ent.file_name().into_string() {
            out.push(name);
        }
    }
    Ok(out)
}

/// The valid ids among `names` that end in `suffix`.
fn ids_named(names: &[String], suffix: &str) -> Vec<String> {
    names
        .iter()
        .filter_map(|n| n.strip_suffix(suffix))
        .filter(|id| check_id(id).is_ok())
        .map(str::to_owned)
        .collect()
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    u64::try_from(nanos() / 1_000_000).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequence number is kept in place: each call counts on from the
    /// last, a number in the older, unpadded form is continued, and a
    /// missing or unreadable file is rebuilt from the entries.
    #[test]
    fn sequence_numbers_count_on_from_the_file_or_the_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Journal::open(dir.path()).expect("open");
        let seq = j.dir.join("seq");
        assert_eq!(j.next_seq().expect("1"), 1);
        assert_eq!(j.next_seq().expect("2"), 2);
        use std::os::unix::fs::MetadataExt;
        let ino = fs::metadata(&seq).expect("seq").ino();
        assert_eq!(j.next_seq().expect("3"), 3);
        assert_eq!(
            fs::metadata(&seq).expect("seq").ino(),
            ino,
            "rewritten in place"
        );
        fs::write(&seq, "41").expect("older form");
        assert_eq!(j.next_seq().expect("42"), 42);
        assert_eq!(j.next_seq().expect("43"), 43);

        let mut e = Entry {
            manifest: None,
            version: JOURNAL_VERSION,
            id: "0123456789abcdef".into(),
            seq: 77,
            workspace: dir.path().to_path_buf(),
            op: Op::FileWrite,
            state: EntryState::Pending,
            created_unix_ms: 0,
            steps: Vec::new(),
            raced: Vec::new(),
        };
        j.write(&e).expect("pending");
        j.complete(&mut e).expect("complete");
        fs::write(&seq, "not a number").expect("garbage");
        assert_eq!(j.next_seq().expect("from entries"), 78);
        fs::remove_file(&seq).expect("rm");
        assert_eq!(j.next_seq().expect("from entries"), 78);
    }
}
