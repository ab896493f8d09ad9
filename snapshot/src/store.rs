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
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::fsx::hash_stream;
use crate::hash::Hash;
use crate::pack::{self, Range, PACK_BLOB_MAX};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The blob store of one state directory.
#[derive(Debug, Clone)]
pub struct Store {
    blobs: PathBuf,
    tmp: PathBuf,
    kept: PathBuf,
    packs: PathBuf,
    /// The indexes of the packs read so far (ADR 0214), shared by clones.
    index: Arc<Mutex<Packs>>,
}

/// The packs of the store this process has read: each pack's index,
/// sorted by hash, newest first.
#[derive(Debug, Default)]
struct Packs {
    /// Read the directory at least once.
    listed: bool,
    /// (file name, index sorted by hash)
    packs: Vec<(String, Vec<(Hash, Range)>)>,
    /// Files of `packs/` that are not packs (name, why).
    damaged: Vec<(String, String)>,
}

impl Packs {
    fn find(&self, h: &Hash) -> Option<(&str, Range)> {
        self.packs.iter().find_map(|(name, idx)| {
            idx.binary_search_by(|(x, _)| x.cmp(h))
                .ok()
                .map(|i| (name.as_str(), idx[i].1))
        })
    }
}

/// A blob opened for reading: a loose file, or one read out of a pack.
pub(crate) enum Blob {
    Loose(File),
    Packed(io::Cursor<Vec<u8>>),
}

impl Read for Blob {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Blob::Loose(f) => f.read(buf),
            Blob::Packed(c) => c.read(buf),
        }
    }
}

/// What [`Store::collect`] kept and removed.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) kept: usize,
    pub(crate) bytes_kept: u64,
    pub(crate) removed: usize,
    pub(crate) bytes_removed: u64,
}

/// The state directory's directory of kept files (ADR 0210).
pub(crate) const KEPT: &str = "kept";

impl Store {
    /// Opens (creating if needed, mode 0700) the store under `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Store> {
        let blobs = state_dir.join("blobs");
        let tmp = state_dir.join("tmp");
        let packs = state_dir.join("packs");
        // Made once: three stats where making them costs eight calls.
        if !(blobs.is_dir() && tmp.is_dir() && packs.is_dir()) {
            for d in [state_dir, &blobs, &tmp, &packs] {
                mkdir_p(d)?;
            }
            // A pack is durable under `packs/` once that directory is
            // synced; the directory's own name in the state directory too.
            fsync_dir(state_dir)?;
        }
        Ok(Store {
            blobs,
            tmp,
            kept: state_dir.join(KEPT),
            packs,
            index: Arc::new(Mutex::new(Packs::default())),
        })
    }

    fn packs(&self) -> MutexGuard<'_, Packs> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the indexes of packs not read yet and forgets those gone.
    fn refresh(&self) {
        let Ok(rd) = fs::read_dir(&self.packs) else {
            return;
        };
        let names: Vec<String> = rd
            .flatten()
            .filter_map(|d| d.file_name().into_string().ok())
            .filter(|n| n.ends_with(".pack"))
            .collect();
        let mut packs = self.packs();
        packs.listed = true;
        packs.packs.retain(|(n, _)| names.contains(n));
        packs.damaged.retain(|(n, _)| names.contains(n));
        for n in names {
            if packs.packs.iter().any(|(x, _)| *x == n)
                || packs.damaged.iter().any(|(x, _)| *x == n)
            {
                continue;
            }
            let path = self.packs.join(&n);
            match File::open(&path)
                .map_err(|e| format!("open {}: {e}", path.display()))
                .and_then(|f| pack::read_index(&f, &path))
            {
                Ok(mut idx) => {
                    idx.sort_by_key(|e| e.0);
                    packs.packs.insert(0, (n, idx));
                }
                Err(why) => packs.damaged.push((n, why)),
            }
        }
    }

    /// Where a packed blob `h` is: the indexes read so far, then, if it is
    /// not there, the directory again.
    fn find_packed(&self, h: &Hash) -> Option<(PathBuf, Range)> {
        {
            let packs = self.packs();
            if let Some((n, r)) = packs.find(h) {
                return Some((self.packs.join(n), r));
            }
        }
        self.refresh();
        let packs = self.packs();
        packs.find(h).map(|(n, r)| (self.packs.join(n), r))
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

    /// Whether blob `h` is present, loose or packed.
    pub fn contains(&self, h: &Hash) -> bool {
        self.blob_path(h).is_file() || self.find_packed(h).is_some()
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

    /// A new temporary of the store (mode 0600), opened for writing.
    fn new_temp(&self, what: &str) -> Result<(File, PathBuf)> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .tmp
            .join(format!("{}.{}.{}.{what}", std::process::id(), n, nanos()));
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        Ok((f, tmp))
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
            small: Vec::new(),
            pack: None,
        }
    }

    /// Opens blob `h` for reading: loose, else out of a pack (read whole:
    /// a packed blob is small).
    pub(crate) fn open_blob(&self, h: &Hash) -> Result<Blob> {
        let p = self.blob_path(h);
        match File::open(&p) {
            Ok(f) => return Ok(Blob::Loose(f)),
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(Error::io("open blob", &p, e))
            }
            Err(_) => {}
        }
        // Twice: a `gc` may have rewritten the pack this process read.
        for _ in 0..2 {
            let Some((pp, r)) = self.find_packed(h) else {
                break;
            };
            match File::open(&pp).and_then(|f| pack::read_at(&f, r)) {
                Ok(bytes) => return Ok(Blob::Packed(io::Cursor::new(bytes))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let mut packs = self.packs();
                    let name = pp.file_name().map(|n| n.to_string_lossy().into_owned());
                    packs.packs.retain(|(n, _)| Some(n) != name.as_ref());
                }
                Err(e) => return Err(Error::io("read pack", &pp, e)),
            }
        }
        // A pack that cannot be read may have held it: say so, not only
        // that the blob is missing.
        if let Some((n, why)) = self.packs().damaged.first() {
            return Err(Error::DamagedPack {
                path: self.packs.join(n),
                why: why.clone(),
                hash: h.to_hex(),
            });
        }
        Err(Error::MissingBlob { hash: h.to_hex() })
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

    /// Removes the blobs `live` does not name (only `gc` does, under the
    /// journal lock): a loose one by its name; a pack none of whose blobs
    /// is live, whole; a pack holding live and dead blobs is rewritten
    /// with the live ones only (the new pack durable before the old one
    /// goes). `dry_run`: counts only.
    pub(crate) fn collect(
        &self,
        live: &std::collections::HashSet<Hash>,
        dry_run: bool,
    ) -> Result<Collected> {
        let mut out = Collected::default();
        let top = fs::read_dir(&self.blobs).map_err(|e| Error::io("read dir", &self.blobs, e))?;
        for d in top {
            let d = d.map_err(|e| Error::io("read dir", &self.blobs, e))?;
            let prefix = d.file_name().to_string_lossy().into_owned();
            let Ok(rd) = fs::read_dir(d.path()) else {
                continue;
            };
            for f in rd.flatten() {
                let name = format!("{prefix}{}", f.file_name().to_string_lossy());
                let (Some(h), Ok(m)) = (Hash::from_hex(&name), f.metadata()) else {
                    continue;
                };
                if live.contains(&h) {
                    out.kept += 1;
                    out.bytes_kept += m.len();
                } else {
                    out.removed += 1;
                    out.bytes_removed += m.len();
                    if !dry_run {
                        let p = f.path();
                        fs::remove_file(&p).map_err(|e| Error::io("remove", &p, e))?;
                    }
                }
            }
        }
        self.refresh();
        let packs: Vec<(String, Vec<(Hash, Range)>)> = self.packs().packs.clone();
        for (name, idx) in packs {
            let (alive, dead): (Vec<_>, Vec<_>) = idx.iter().partition(|(h, _)| live.contains(h));
            out.kept += alive.len();
            out.bytes_kept += alive.iter().map(|(_, r)| r.len).sum::<u64>();
            out.removed += dead.len();
            out.bytes_removed += dead.iter().map(|(_, r)| r.len).sum::<u64>();
            if dry_run || dead.is_empty() {
                continue;
            }
            let path = self.packs.join(&name);
            if !alive.is_empty() {
                let f = File::open(&path).map_err(|e| Error::io("open pack", &path, e))?;
                let mut batch = self.batch();
                for (h, r) in alive {
                    let bytes =
                        pack::read_at(&f, r).map_err(|e| Error::io("read pack", &path, e))?;
                    if Hash::of(&bytes) != h {
                        return Err(Error::SourceChanged {
                            path: path.display().to_string(),
                            expected: h.to_hex(),
                        });
                    }
                    batch.pack_bytes(h, &bytes)?;
                }
                batch.commit()?;
            }
            fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
            self.packs().packs.retain(|(n, _)| *n != name);
        }
        Ok(out)
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
    /// The first small contents, held until [`PACK_FROM`] are: a batch
    /// of fewer stores them loose.
    small: Vec<(Hash, Vec<u8>)>,
    /// The small contents staged past that, in one pack (ADR 0214).
    pack: Option<pack::Writer>,
}

/// A batch with more small contents than this packs them (ADR 0214):
/// a one-file write keeps the loose store's one file a blob, and the
/// packs stay few (a lookup reads each pack's index).
pub(crate) const PACK_FROM: usize = 16;

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
        self.staged.is_empty()
            && self.existing.is_empty()
            && self.small.is_empty()
            && self.pack.is_none()
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
            return self.stage(r);
        }
        let mut head = Vec::with_capacity(cap + 1);
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

    /// Keeps the content of `r`: a small one appended to the batch's pack,
    /// a bigger one written to a temporary of its own; hashed either way.
    fn stage(&mut self, r: &mut impl Read) -> Result<(Hash, u64)> {
        let mut head = Vec::with_capacity(PACK_BLOB_MAX + 1);
        r.take(PACK_BLOB_MAX as u64 + 1)
            .read_to_end(&mut head)
            .map_err(|e| Error::io("read a blob for", &self.store.tmp, e))?;
        if head.len() <= PACK_BLOB_MAX {
            let hash = Hash::of(&head);
            self.pack_bytes(hash, &head)?;
            return Ok((hash, head.len() as u64));
        }
        self.stage_loose(&mut head.as_slice().chain(r))
    }

    /// Keeps small content `bytes`, whose hash is `hash`, unless the store
    /// or the batch holds it already: in memory while the batch has at
    /// most [`PACK_FROM`] such, then all of them in the batch's pack.
    fn pack_bytes(&mut self, hash: Hash, bytes: &[u8]) -> Result<()> {
        // Not looked for in the store: a content stored already costs a
        // few bytes in a pack, where looking cost a `stat` a file (and
        // the packs' indexes are not read, ADR 0214). A batch of few looks
        // before writing them loose.
        if self.in_batch(&hash) {
            return Ok(());
        }
        self.staged_hashes.insert(hash);
        if self.pack.is_none() {
            if self.small.len() < PACK_FROM {
                self.small.push((hash, bytes.to_vec()));
                return Ok(());
            }
            let (f, tmp) = self.store.new_temp("pack")?;
            let mut w = pack::Writer::new(f, tmp);
            for (h, b) in self.small.drain(..) {
                w.push(h, &b)
                    .map_err(|e| Error::io("write pack", &w.tmp, e))?;
            }
            self.pack = Some(w);
        }
        if let Some(w) = &mut self.pack {
            w.push(hash, bytes)
                .map_err(|e| Error::io("write pack", &w.tmp, e))?;
        }
        Ok(())
    }

    /// Writes the small contents held in memory to temporaries of their
    /// own (a batch of few).
    fn small_to_loose(&mut self) -> Result<()> {
        for (hash, bytes) in std::mem::take(&mut self.small) {
            if self.stored_loose(&hash) {
                continue;
            }
            let (mut f, tmp) = self.store.new_temp("blob")?;
            if let Err(e) = std::io::Write::write_all(&mut f, &bytes) {
                let _ = fs::remove_file(&tmp);
                return Err(Error::io("write blob", &tmp, e));
            }
            self.push_staged(f, tmp, hash);
        }
        Ok(())
    }

    /// Writes the content of `r` to a temporary of its own and hashes it.
    fn stage_loose(&mut self, r: &mut impl Read) -> Result<(Hash, u64)> {
        let (mut f, tmp) = self.store.new_temp("blob")?;
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
        self.push_staged(f, tmp, hash);
        Ok((hash, len))
    }

    /// Stages temporary `tmp` (written through `f`) as blob `hash`.
    fn push_staged(&mut self, f: File, tmp: PathBuf, hash: Hash) {
        let dest = self.store.blob_path(&hash);
        // Past the first few, the temporaries are closed unsynced and the
        // commit syncs them all by one `syncfs` (ADR 0208).
        let f = (self.staged.len() < OPEN_STAGED).then_some(f);
        self.staged.push((f, tmp, dest));
        self.staged_hashes.insert(hash);
    }

    /// Whether the store or this batch holds content `hash` already. A
    /// blob already there may have been put by a process that does not
    /// hold the journal lock, its shard not synced yet: the commit syncs
    /// that shard too.
    fn already(&mut self, hash: &Hash) -> bool {
        self.in_batch(hash) || self.stored_loose(hash)
    }

    /// Whether this batch holds content `hash` already.
    fn in_batch(&self, hash: &Hash) -> bool {
        self.staged_hashes.contains(hash) || self.inline.iter().any(|(h, _)| h == hash)
    }

    /// Whether the store holds content `hash` as a loose blob (see
    /// [`Batch::already`]).
    fn stored_loose(&mut self, hash: &Hash) -> bool {
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
        self.small_to_loose()?;
        let staged = std::mem::take(&mut self.staged);
        let mut temps: Vec<PathBuf> = staged.iter().map(|(_, t, _)| t.clone()).collect();
        let pack = self.pack.take();
        temps.extend(pack.as_ref().map(|w| w.tmp.clone()));
        let r = self.commit_staged(staged, pack);
        if r.is_err() {
            // What was not renamed yet is removed (a renamed one is gone
            // from `tmp/` already).
            for t in temps {
                let _ = fs::remove_file(t);
            }
        }
        r
    }

    fn commit_staged(
        &self,
        staged: Vec<(Option<File>, PathBuf, PathBuf)>,
        pack: Option<pack::Writer>,
    ) -> Result<()> {
        let mut shards: Vec<PathBuf> = self.existing.clone();
        let mut new_shard = false;
        let mut renames = Vec::with_capacity(staged.len() + 1);
        let pack = match pack {
            Some(w) => {
                let tmp = w.tmp.clone();
                let (f, name, entries) =
                    w.finish().map_err(|e| Error::io("write pack", &tmp, e))?;
                Some((f, tmp, name, entries))
            }
            None => None,
        };
        // Content durable before any name stands for it: the open
        // temporaries one by one, the closed rest by a sync of the
        // store's filesystem; the pack by itself where nothing else needs
        // that sync.
        if staged.iter().any(|(f, _, _)| f.is_none()) {
            syncfs_at(&self.store.tmp)?;
        } else if let Some((f, tmp, _, _)) = &pack {
            f.sync_all().map_err(|e| Error::io("fsync", tmp, e))?;
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
        let mut packed = None;
        if let Some((_, tmp, name, entries)) = pack {
            let dest = self.store.packs.join(&name);
            fs::rename(&tmp, &dest).map_err(|e| Error::io("rename", &dest, e))?;
            shards.push(self.store.packs.clone());
            packed = Some((name, entries));
        }
        if shards.len() > SHARD_SYNCS_MAX {
            syncfs_at(&self.store.blobs)?;
        } else {
            for shard in &shards {
                fsync_dir(shard)?;
            }
        }
        // This process finds the pack without reading the directory again.
        if let Some((name, mut entries)) = packed {
            entries.sort_by_key(|e| e.0);
            let mut packs = self.store.packs();
            if packs.listed && !packs.packs.iter().any(|(n, _)| *n == name) {
                packs.packs.insert(0, (name, entries));
            }
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
        if let Some(w) = self.pack.take() {
            let _ = fs::remove_file(&w.tmp);
        }
    }
}
