//! Content-addressed blob store.
//!
//! Layout under the state dir: `blobs/<first 2 hex>/<remaining 62 hex>`, one
//! immutable file per distinct content, named by its blake3 hash; `tmp/` for
//! blobs being written. A put streams into a temp file while hashing; if the
//! blob already exists the temp is dropped (dedup), otherwise it is fsync'd,
//! renamed into its shard and the shard directory fsync'd. A crash leaves at
//! most a stray temp file, which [`Store::clean_temps`] removes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::fsx::hash_stream;
use crate::hash::Hash;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The blob store of one state directory.
#[derive(Debug, Clone)]
pub struct Store {
    blobs: PathBuf,
    tmp: PathBuf,
    kept: PathBuf,
}

/// The state directory's directory of kept files (ADR 0210).
pub(crate) const KEPT: &str = "kept";

impl Store {
    /// Opens (creating if needed, mode 0700) the store under `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Store> {
        let blobs = state_dir.join("blobs");
        let tmp = state_dir.join("tmp");
        // Made once: two stats where making them costs six calls.
        if !(blobs.is_dir() && tmp.is_dir()) {
            for d in [state_dir, &blobs, &tmp] {
                mkdir_p(d)?;
            }
        }
        Ok(Store {
            blobs,
            tmp,
            kept: state_dir.join(KEPT),
        })
    }

    /// The state directory the store was opened in.
    pub(crate) fn state_dir(&self) -> &Path {
        self.kept.parent().unwrap_or(&self.kept)
    }

    /// Where transitions keep the files they take out (ADR 0210).
    pub(crate) fn kept_dir(&self) -> &Path {
        &self.kept
    }

    /// The directory of the blobs.
    pub(crate) fn blobs_dir(&self) -> &Path {
        &self.blobs
    }

    /// Where blob `h` lives (whether or not it exists).
    pub fn blob_path(&self, h: &Hash) -> PathBuf {
        let hex = h.to_hex();
        self.blobs.join(&hex[..2]).join(&hex[2..])
    }

    /// Whether blob `h` is present.
    pub fn contains(&self, h: &Hash) -> bool {
        self.blob_path(h).is_file()
    }

    /// Stores `bytes`, returning their hash.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Hash> {
        let mut r = bytes;
        Ok(self.put_reader(&mut r)?.0)
    }

    /// Stores the content of `r` durably and returns its hash and length
    /// (temp, fsync, rename into its shard, fsync of the shard; a blob
    /// already stored is not written again).
    pub fn put_reader(&self, r: &mut impl Read) -> Result<(Hash, u64)> {
        let mut batch = self.batch();
        let out = batch.put_reader(r)?;
        batch.commit()?;
        Ok(out)
    }

    /// A batch of blobs written and hashed now, made durable under their
    /// names together by [`Batch::commit`]: the apply commits its
    /// pre-images while the journal entry that names them is written.
    pub(crate) fn batch(&self) -> Batch<'_> {
        Batch {
            store: self,
            staged: Vec::new(),
            staged_hashes: std::collections::HashSet::new(),
            inline_left: 0,
            inline: Vec::new(),
            existing: Vec::new(),
        }
    }

    /// Opens blob `h` for reading.
    pub fn open_blob(&self, h: &Hash) -> Result<File> {
        let p = self.blob_path(h);
        File::open(&p).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                Error::MissingBlob { hash: h.to_hex() }
            } else {
                Error::io("open blob", &p, e)
            }
        })
    }

    /// Reads blob `h` whole, verifying its hash.
    pub fn read(&self, h: &Hash) -> Result<Vec<u8>> {
        let p = self.blob_path(h);
        let mut out = Vec::new();
        self.open_blob(h)?
            .read_to_end(&mut out)
            .map_err(|e| Error::io("read blob", &p, e))?;
        if Hash::of(&out) != *h {
            return Err(Error::SourceChanged {
                path: p.display().to_string(),
                expected: h.to_hex(),
            });
        }
        Ok(out)
    }

    /// Every blob in the store, with its size.
    pub fn blobs(&self) -> Result<Vec<(Hash, u64)>> {
        let mut out = Vec::new();
        let top = fs::read_dir(&self.blobs).map_err(|e| Error::io("read dir", &self.blobs, e))?;
        for d in top {
            let d = d.map_err(|e| Error::io("read dir", &self.blobs, e))?;
            let prefix = d.file_name().to_string_lossy().into_owned();
            let Ok(rd) = fs::read_dir(d.path()) else {
                continue;
            };
            for f in rd.flatten() {
                let name = format!("{prefix}{}", f.file_name().to_string_lossy());
                if let (Some(h), Ok(m)) = (Hash::from_hex(&name), f.metadata()) {
                    out.push((h, m.len()));
                }
            }
        }
        Ok(out)
    }

    /// Removes blob `h` (only `gc` does, for blobs nothing needs).
    pub fn remove(&self, h: &Hash) -> Result<()> {
        let p = self.blob_path(h);
        fs::remove_file(&p).map_err(|e| Error::io("remove", &p, e))
    }

    /// No temporaries: no write of a blob is under way or was cut off.
    pub fn no_temps(&self) -> bool {
        fs::read_dir(&self.tmp).is_ok_and(|mut d| d.next().is_none())
    }

    /// Removes temp files left by an interrupted put.
    pub fn clean_temps(&self) -> Result<()> {
        let rd = fs::read_dir(&self.tmp).map_err(|e| Error::io("read dir", &self.tmp, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| Error::io("read dir", &self.tmp, e))?;
            let p = ent.path();
            fs::remove_file(&p).map_err(|e| Error::io("remove", &p, e))?;
        }
        Ok(())
    }
}

/// Creates a directory (and parents) with mode 0700 if missing.
pub(crate) fn mkdir_p(d: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
        .map_err(|e| Error::io("mkdir", d, e))
}

/// Past this many shards touched, one `syncfs` of the store's filesystem
/// replaces a sync of each (ADR 0208).
const SHARD_SYNCS_MAX: usize = 16;

/// Syncs the whole filesystem that holds `d` (trusted state-dir paths
/// only).
pub(crate) fn syncfs_at(d: &Path) -> Result<()> {
    File::open(d)
        .and_then(|f| rustix::fs::syncfs(&f).map_err(Into::into))
        .map_err(|e| Error::io("syncfs", d, e))
}

/// fsyncs a directory by path (trusted state-dir paths only).
pub(crate) fn fsync_dir(d: &Path) -> Result<()> {
    File::open(d)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("fsync", d, e))
}

/// Nanoseconds since the epoch (0 if the clock is before it).
pub(crate) fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Blobs written to temporaries and hashed, not yet under their names.
/// Nothing names them until [`Batch::commit`] returns, except a pending
/// journal entry written alongside; the workspace is touched only after
/// both, so a crash in between leaves only the temporaries (removed by
/// recovery) and an entry whose roll-back finds every path as it was (it
/// reads no blob then).
pub(crate) struct Batch<'s> {
    store: &'s Store,
    /// (the temporary, still open while few are staged; its path; the
    /// blob's name)
    staged: Vec<(Option<File>, PathBuf, PathBuf)>,
    /// The contents staged, by hash (a lookup per file, not a scan of the
    /// staged list: ten thousand distinct pre-images were quadratic).
    staged_hashes: std::collections::HashSet<Hash>,
    /// Bytes that may still be kept in memory instead of staged.
    inline_left: usize,
    /// Content kept in memory (its hash, its bytes), for the caller to
    /// carry in a journal entry ([`Batch::take_inline`]).
    inline: Vec<(Hash, Vec<u8>)>,
    /// Shards of blobs found already stored, to sync at commit.
    existing: Vec<PathBuf>,
}

/// The largest file a batch keeps in memory for the journal entry to
/// carry (ADR 0408).
pub(crate) const INLINE_FILE_MAX: usize = 16 * 1024;

/// How many temporaries a batch keeps open for [`Batch::commit`] to sync;
/// past that, each is synced as it is written (a changeset of thousands of
/// replaced files must not run out of descriptors).
const OPEN_STAGED: usize = 64;

impl Batch<'_> {
    /// Nothing staged.
    pub(crate) fn is_empty(&self) -> bool {
        self.staged.is_empty() && self.existing.is_empty()
    }

    /// Lets the batch keep up to `bytes` of small files' content in
    /// memory instead of staging them ([`Batch::take_inline`]).
    pub(crate) fn inline_up_to(mut self, bytes: usize) -> Self {
        self.inline_left = bytes;
        self
    }

    /// The content kept in memory, by hash.
    pub(crate) fn take_inline(&mut self) -> Vec<(Hash, Vec<u8>)> {
        std::mem::take(&mut self.inline)
    }

    /// Hashes the content of `r` and keeps it: in memory when it is small,
    /// the batch may still keep that much and the store does not hold it
    /// yet; else in a temporary. A blob already stored, or already in this
    /// batch, is not kept twice.
    pub(crate) fn put_reader(&mut self, r: &mut impl Read) -> Result<(Hash, u64)> {
        let cap = INLINE_FILE_MAX.min(self.inline_left);
        if cap == 0 {
            // A small content the store or this batch holds already needs
            // no temporary (an undo of thousands of files that share one
            // content made and removed one each).
            let mut head = Vec::new();
            r.take(INLINE_FILE_MAX as u64 + 1)
                .read_to_end(&mut head)
                .map_err(|e| Error::io("read a pre-image for", &self.store.tmp, e))?;
            if head.len() <= INLINE_FILE_MAX {
                let hash = Hash::of(&head);
                if self.already(&hash) {
                    return Ok((hash, head.len() as u64));
                }
            }
            return self.stage(&mut head.as_slice().chain(r));
        }
        let mut head = Vec::new();
        r.take(cap as u64 + 1)
            .read_to_end(&mut head)
            .map_err(|e| Error::io("read a pre-image for", &self.store.tmp, e))?;
        if head.len() > cap {
            return self.stage(&mut head.as_slice().chain(r));
        }
        let hash = Hash::of(&head);
        let len = head.len() as u64;
        // Carried even when the store has it: a blob just put there by a
        // process that does not hold the journal lock may not be durable
        // under its name yet.
        if !self.inline.iter().any(|(h, _)| *h == hash) {
            self.inline_left -= head.len();
            self.inline.push((hash, head));
        }
        Ok((hash, len))
    }

    /// Keeps `bytes` as a blob of the store (never carried in memory:
    /// something other than a pre-image, which nothing rolls back from).
    pub(crate) fn put_blob(&mut self, bytes: &[u8]) -> Result<Hash> {
        let mut r = bytes;
        Ok(self.stage(&mut r)?.0)
    }

    /// Writes the content of `r` to a temporary and hashes it.
    fn stage(&mut self, r: &mut impl Read) -> Result<(Hash, u64)> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .store
            .tmp
            .join(format!("{}.{}.{}", std::process::id(), n, nanos()));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        let (hash, len) = match hash_stream(r, Some(&mut f)) {
            Ok(v) => v,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(Error::io("write blob", &tmp, e));
            }
        };
        if self.already(&hash) {
            drop(f);
            fs::remove_file(&tmp).map_err(|e| Error::io("remove", &tmp, e))?;
            return Ok((hash, len));
        }
        let dest = self.store.blob_path(&hash);
        // Past the first few, the temporaries are closed unsynced and the
        // commit syncs them all by one `syncfs` (ADR 0208).
        let f = (self.staged.len() < OPEN_STAGED).then_some(f);
        self.staged.push((f, tmp, dest));
        self.staged_hashes.insert(hash);
        Ok((hash, len))
    }

    /// Whether the store or this batch holds content `hash` already. A
    /// blob already there may have been put by a process that does not
    /// hold the journal lock, its shard not synced yet: the commit syncs
    /// that shard too.
    fn already(&mut self, hash: &Hash) -> bool {
        if self.staged_hashes.contains(hash) || self.inline.iter().any(|(h, _)| h == hash) {
            return true;
        }
        let dest = self.store.blob_path(hash);
        if !dest.is_file() {
            return false;
        }
        let shard = dest.parent().unwrap_or(&self.store.blobs).to_path_buf();
        if !self.existing.contains(&shard) {
            self.existing.push(shard);
        }
        true
    }

    /// Makes every blob of the batch durable under its name: each
    /// temporary synced (before its name exists: a name never stands for
    /// unsynced content), renamed into its shard, each shard synced once.
    pub(crate) fn commit(mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        let temps: Vec<PathBuf> = staged.iter().map(|(_, t, _)| t.clone()).collect();
        let r = self.commit_staged(staged);
        if r.is_err() {
            // What was not renamed yet is removed (a renamed one is gone
            // from `tmp/` already).
            for t in temps {
                let _ = fs::remove_file(t);
            }
        }
        r
    }

    fn commit_staged(&self, staged: Vec<(Option<File>, PathBuf, PathBuf)>) -> Result<()> {
        let mut shards: Vec<PathBuf> = self.existing.clone();
        let mut new_shard = false;
        let mut renames = Vec::with_capacity(staged.len());
        // Content durable before any name stands for it: the open
        // temporaries one by one, the closed rest by a sync of the
        // store's filesystem.
        if staged.iter().any(|(f, _, _)| f.is_none()) {
            syncfs_at(&self.store.tmp)?;
        }
        for (f, tmp, dest) in staged {
            if let Some(f) = f {
                f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
            }
            let shard = dest.parent().unwrap_or(&self.store.blobs).to_path_buf();
            if !shards.contains(&shard) {
                if !shard.is_dir() {
                    match fs::DirBuilder::new().mode(0o700).create(&shard) {
                        Ok(()) => new_shard = true,
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(Error::io("mkdir", &shard, e)),
                    }
                }
                shards.push(shard);
            }
            renames.push((tmp, dest));
        }
        if new_shard {
            fsync_dir(&self.store.blobs)?;
        }
        for (tmp, dest) in renames {
            fs::rename(&tmp, &dest).map_err(|e| Error::io("rename", &dest, e))?;
        }
        if shards.len() > SHARD_SYNCS_MAX {
            return syncfs_at(&self.store.blobs);
        }
        for shard in &shards {
            fsync_dir(shard)?;
        }
        Ok(())
    }
}

impl Drop for Batch<'_> {
    /// A batch dropped uncommitted (an error, a conflict) leaves no
    /// temporaries behind.
    fn drop(&mut self) {
        for (_, tmp, _) in self.staged.drain(..) {
            let _ = fs::remove_file(tmp);
        }
    }
}
