//! Packs: the small blobs of one batch in one file (ADR 0214).
//!
//! Ten thousand distinct pre-images of 1 KiB each cost the loose store ten
//! thousand temporaries created and written, a sync, ten thousand renames
//! into their shards and a second sync: most of a big modified or deleted
//! apply. A batch now appends each small content (at most
//! [`PACK_BLOB_MAX`] bytes) to one temporary instead, and its commit
//! syncs that one file and renames it into `packs/` under the hash of its
//! index. A crash before the rename leaves a temporary (removed by
//! recovery, as a loose blob's is); after it, the whole pack is there,
//! synced: a pack is never seen half written.
//!
//! The layout, every number little-endian:
//!
//! ```text
//! the contents, one after the other
//! the index: per blob its blake3 (32 bytes), offset (8), length (8)
//! the trailer: the number of blobs (8), the blake3 of the index (32),
//!              the magic b"RETIEPK1" (8)
//! ```
//!
//! A reader checks the magic, the index's hash and that every range lies
//! within the contents; a blob read back is checked against its hash by
//! whoever reads it, as a loose blob is.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::hash::Hash;

/// The largest content a batch packs; a bigger one is a loose blob of its
/// own (a pack is kept or rewritten whole by `gc`: a big file in it would
/// hold, or be copied with, every small one).
pub(crate) const PACK_BLOB_MAX: usize = 64 * 1024;

const MAGIC: &[u8; 8] = b"RETIEPK1";
const ENTRY: usize = 32 + 8 + 8;
const TRAILER: usize = 8 + 32 + 8;

/// Where one packed blob lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) off: u64,
    pub(crate) len: u64,
}

/// A pack's index: each blob's hash and where it lies.
pub(crate) type Index = Vec<(Hash, Range)>;

/// A pack being written: a temporary of the store.
pub(crate) struct Writer {
    out: BufWriter<File>,
    pub(crate) tmp: PathBuf,
    entries: Vec<(Hash, Range)>,
    off: u64,
}

impl Writer {
    /// Starts a pack in the new file `file`, at `tmp`.
    pub(crate) fn new(file: File, tmp: PathBuf) -> Writer {
        Writer {
            out: BufWriter::with_capacity(256 * 1024, file),
            tmp,
            entries: Vec::new(),
            off: 0,
        }
    }

    /// Appends content `bytes`, whose hash is `hash`.
    pub(crate) fn push(&mut self, hash: Hash, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        let len = bytes.len() as u64;
        self.entries.push((hash, Range { off: self.off, len }));
        self.off += len;
        Ok(())
    }

    /// Writes the index and trailer; returns the file (not synced), the
    /// pack's name and its entries.
    pub(crate) fn finish(mut self) -> io::Result<(File, String, Index)> {
        let mut index = Vec::with_capacity(self.entries.len() * ENTRY);
        for (h, r) in &self.entries {
            index.extend_from_slice(&h.0);
            index.extend_from_slice(&r.off.to_le_bytes());
            index.extend_from_slice(&r.len.to_le_bytes());
        }
        let ih = Hash::of(&index);
        self.out.write_all(&index)?;
        self.out
            .write_all(&(self.entries.len() as u64).to_le_bytes())?;
        self.out.write_all(&ih.0)?;
        self.out.write_all(MAGIC)?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        Ok((file, format!("{}.pack", ih.to_hex()), self.entries))
    }
}

/// Reads and checks the index of the pack `file` (at `path`, for the
/// message). `Err`: why it is not a pack.
pub(crate) fn read_index(file: &File, path: &Path) -> Result<Index, String> {
    let size = file
        .metadata()
        .map_err(|e| format!("stat {}: {e}", path.display()))?
        .len();
    if size < TRAILER as u64 {
        return Err(format!(
            "{} is {size} bytes, shorter than a pack's trailer",
            path.display()
        ));
    }
    let mut trailer = [0u8; TRAILER];
    file.read_exact_at(&mut trailer, size - TRAILER as u64)
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    if &trailer[40..] != MAGIC {
        return Err(format!("{} does not end in a pack's magic", path.display()));
    }
    let mut n8 = [0u8; 8];
    n8.copy_from_slice(&trailer[..8]);
    let n = u64::from_le_bytes(n8);
    let index_len = n
        .checked_mul(ENTRY as u64)
        .filter(|l| l.checked_add(TRAILER as u64).is_some_and(|t| t <= size))
        .ok_or_else(|| format!("{} names {n} blobs, more than it can hold", path.display()))?;
    let data_end = size - TRAILER as u64 - index_len;
    let mut index = vec![0u8; index_len as usize];
    file.read_exact_at(&mut index, data_end)
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    if Hash::of(&index).0 != trailer[8..40] {
        return Err(format!(
            "the index of {} does not match its hash",
            path.display()
        ));
    }
    let mut out = Vec::with_capacity(n as usize);
    for e in index.chunks_exact(ENTRY) {
        let mut h = [0u8; 32];
        h.copy_from_slice(&e[..32]);
        n8.copy_from_slice(&e[32..40]);
        let off = u64::from_le_bytes(n8);
        n8.copy_from_slice(&e[40..48]);
        let len = u64::from_le_bytes(n8);
        if off.checked_add(len).is_none_or(|end| end > data_end) || len > PACK_BLOB_MAX as u64 {
            return Err(format!(
                "{} names a blob outside its contents",
                path.display()
            ));
        }
        out.push((Hash(h), Range { off, len }));
    }
    Ok(out)
}

/// Reads the blob at `r` of the pack `file`.
pub(crate) fn read_at(file: &File, r: Range) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; r.len as usize];
    file.read_exact_at(&mut buf, r.off)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack_of(blobs: &[&[u8]]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("p");
        let mut w = Writer::new(File::create(&p).expect("create"), p.clone());
        for b in blobs {
            w.push(Hash::of(b), b).expect("push");
        }
        w.finish().expect("finish");
        (d, p)
    }

    fn index(p: &Path) -> Result<Index, String> {
        read_index(&File::open(p).expect("open"), p)
    }

    #[test]
    fn a_pack_reads_back_what_was_pushed() {
        let (_d, p) = pack_of(&[b"one", b"", b"three"]);
        let idx = index(&p).expect("index");
        let f = File::open(&p).expect("open");
        for (want, (h, r)) in [&b"one"[..], b"", b"three"].iter().zip(&idx) {
            assert_eq!(*h, Hash::of(want));
            assert_eq!(read_at(&f, *r).expect("read"), *want);
        }
    }

    /// Every damaged or hostile pack is refused with a reason, never a
    /// panic or an allocation of what a header claims.
    #[test]
    fn a_damaged_or_hostile_pack_is_refused() {
        let (_d, p) = pack_of(&[b"one", b"two"]);
        let good = std::fs::read(&p).expect("read");
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("cut short", good[..good.len() - 1].to_vec()),
            ("bad magic", {
                let mut b = good.clone();
                let n = b.len();
                b[n - 1] ^= 1;
                b
            }),
            ("index changed", {
                let mut b = good.clone();
                b[6] ^= 1; // the first entry's hash (contents are 6 bytes)
                b
            }),
            ("a count past the file", {
                let mut b = good.clone();
                let n = b.len();
                b[n - TRAILER..n - TRAILER + 8].copy_from_slice(&u64::MAX.to_le_bytes());
                b
            }),
            ("a count whose index ends past u64", {
                let mut b = good.clone();
                let n = b.len();
                let count = u64::MAX / ENTRY as u64; // its index fits, index + trailer does not
                b[n - TRAILER..n - TRAILER + 8].copy_from_slice(&count.to_le_bytes());
                b
            }),
            ("a range past the contents", {
                // A valid trailer over an index naming bytes that are not there.
                let mut index = Vec::new();
                index.extend_from_slice(&Hash::of(b"x").0);
                index.extend_from_slice(&0u64.to_le_bytes());
                index.extend_from_slice(&1000u64.to_le_bytes());
                let mut b = b"abc".to_vec();
                b.extend_from_slice(&index);
                b.extend_from_slice(&1u64.to_le_bytes());
                b.extend_from_slice(&Hash::of(&index).0);
                b.extend_from_slice(MAGIC);
                b
            }),
        ];
        for (what, bytes) in cases {
            std::fs::write(&p, &bytes).expect("write");
            let e = index(&p).expect_err(what);
            assert!(e.contains(&p.display().to_string()), "{what}: {e}");
        }
    }
}
