//! The files a transition takes out of the workspace, kept for its undo
//! (ADR 0210).
//!
//! An apply that replaces or removes a file, and an undo that does, used to
//! unlink the version that came out; the undo then made a new inode for
//! each restored file and copied the pre-image from the blob store into it.
//! On ext4 both are the slow part of a big change (an unlink frees blocks
//! and an inode in the journal; a new inode is allocated and written), and
//! the undo paid the second for every file the apply had paid the first.
//!
//! Now a small file that comes out of the workspace (a plain file of one
//! link, at most [`KEEP_FILE_MAX`] bytes) is renamed into
//! `<state>/kept/<entry id>/<blake3 of its path>` instead: same filesystem
//! as the workspace, or the rename fails with `EXDEV` and the file is
//! unlinked as before. The undo of that entry renames the file back into
//! the workspace's temporary name, checks it (a plain file of one link
//! whose content hashes to the pre-image; anything else is removed and the
//! pre-image copied from the store, as before), sets its modification time
//! to now (as a copy would have it: a build tool must see the file changed)
//! and puts it in place by the same checked rename as any other.
//!
//! What is kept is a cache, never the pre-image itself: the blob store and
//! the journal entry hold every pre-image, durable before the workspace is
//! touched, exactly as before. Recovery and roll-back read the store only.
//! A kept directory goes when its entry can no longer use it: renamed to
//! `.done-…` at the end of the entry's undo, when the entry is rolled back,
//! or by `gc` when it expires, and removed by [`sweep_kept`] off the
//! caller's path (while the next command runs, or by `retie gc`).

use std::cell::{Cell, OnceCell};
use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::fsx;
use crate::hash::Hash;
use crate::relpath::RelPath;
use crate::store::{nanos, Store};

/// The largest file kept: past it, the cost of a copy is its bytes, which
/// the apply's own pre-image copy pays too, and keeping it would hold that
/// much disk until the entry is undone or expires.
pub(crate) const KEEP_FILE_MAX: u64 = 64 * 1024;

/// The kept files of one journal entry: where its transition puts the
/// files it takes out ([`Keep::put`]), and where its undo takes them back
/// from ([`Keep::take`]).
#[derive(Debug)]
pub(crate) struct Keep {
    path: PathBuf,
    /// Made on first use when putting; only opened when taking.
    create: bool,
    fd: OnceCell<Option<OwnedFd>>,
    /// Set at the first `EXDEV`: the state directory is on another
    /// filesystem, nothing more is tried.
    off: Cell<bool>,
    /// The layer kept whole, when taking (ADR 0215).
    layer: OnceCell<Option<crate::fsx::Root>>,
}

/// The name the layer of an apply is kept under, beside the files kept by
/// key (ADR 0215). A key is 64 hex digits and a tree's starts `t-`: no
/// file is kept under this name.
const LAYER: &str = "layer";

/// A plain file of one link, small enough to keep.
fn keepable(st: &rustix::fs::Stat) -> bool {
    fsx::ftype(st) == FileType::RegularFile
        && st.st_nlink == 1
        && u64::try_from(st.st_size).is_ok_and(|n| n <= KEEP_FILE_MAX)
}

impl Keep {
    /// Where entry `id`'s transition keeps what it takes out.
    pub(crate) fn putting(store: &Store, id: &str) -> Keep {
        Keep {
            path: store.kept_dir().join(id),
            create: true,
            fd: OnceCell::new(),
            off: Cell::new(false),
            layer: OnceCell::new(),
        }
    }

    /// What entry `id`'s transition kept, for its undo.
    pub(crate) fn taking(store: &Store, id: &str) -> Keep {
        Keep {
            create: false,
            ..Keep::putting(store, id)
        }
    }

    fn dir(&self) -> Option<BorrowedFd<'_>> {
        if self.off.get() {
            return None;
        }
        let fd = self.fd.get_or_init(|| {
            if self.create {
                for d in [self.path.parent(), Some(self.path.as_path())]
                    .into_iter()
                    .flatten()
                {
                    match fs::DirBuilder::new().mode(0o700).create(d) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(_) => return None,
                    }
                }
            }
            rustix::fs::open(
                &self.path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
        });
        fd.as_ref().map(|f| f.as_fd())
    }

    /// Moves `name` of `dir`, the version of `path` just taken out of the
    /// workspace, here, if it is a plain file of one link and at most
    /// [`KEEP_FILE_MAX`] bytes. `false`: not kept, the caller removes it.
    pub(crate) fn put(&self, dir: BorrowedFd<'_>, name: &str, path: &RelPath) -> bool {
        if self.off.get() {
            return false;
        }
        let Ok(Some(st)) = fsx::lstat_at(dir, name) else {
            return false;
        };
        if !keepable(&st) {
            return false;
        }
        let Some(kd) = self.dir() else {
            self.off.set(true);
            return false;
        };
        match rustix::fs::renameat_with(dir, name, kd, key(path).as_str(), RenameFlags::NOREPLACE) {
            Ok(()) => true,
            Err(Errno::XDEV) => {
                self.off.set(true);
                false
            }
            Err(_) => false,
        }
    }

    /// Whether `name` of `dir` may stay where it is as a kept file: a plain
    /// file of one link, at most [`KEEP_FILE_MAX`] bytes, the kept files on
    /// this filesystem as far as known. Left in the layer, it becomes a
    /// kept file with the whole layer ([`Keep::adopt_layer`], ADR 0215).
    pub(crate) fn may_keep(&self, dir: BorrowedFd<'_>, name: &str) -> bool {
        !self.off.get() && matches!(fsx::lstat_at(dir, name), Ok(Some(st)) if keepable(&st))
    }

    /// After an apply from the consumed layer `up` that left the files it
    /// replaced at `left` in that layer: the layer, renamed whole, becomes
    /// `layer` of these kept files (`whole`: nothing else needs the layer
    /// any more). Otherwise (the layer is kept as a run, raced; or it is
    /// on another filesystem) each is put here one by one, or removed.
    pub(crate) fn adopt_layer(&self, up: &crate::fsx::Root, left: &[RelPath], whole: bool) {
        if whole {
            if let Some(kd) = self.dir() {
                let moved = rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    up.path(),
                    kd,
                    LAYER,
                    RenameFlags::NOREPLACE,
                );
                if moved.is_ok() {
                    return;
                }
            }
        }
        for path in left {
            let Ok(udir) = up.open_parent(path) else {
                continue;
            };
            if !self.put(udir.as_fd(), path.file_name(), path) {
                drop_at(udir.as_fd(), path.file_name());
            }
        }
    }

    /// Moves the file kept for `path` into `dir` as `tmp` (anything already
    /// named `tmp` is removed first: a temp left by an earlier run of the
    /// same entry). `false`: none kept, or it could not be moved. The
    /// caller checks what it got before using it.
    pub(crate) fn take(&self, path: &RelPath, dir: BorrowedFd<'_>, tmp: &str) -> bool {
        let Some(kd) = self.dir() else {
            self.off.set(true);
            return false;
        };
        let key = key(path);
        let mv = |from: BorrowedFd<'_>, name: &str| {
            let go = || rustix::fs::renameat_with(from, name, dir, tmp, RenameFlags::NOREPLACE);
            match go() {
                Err(Errno::EXIST) => {
                    let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
                    go()
                }
                r => r,
            }
        };
        let moved = match mv(kd, key.as_str()) {
            // Not kept by its key: perhaps in the layer kept whole, under
            // its own path (ADR 0215).
            Err(Errno::NOENT) => match self.layer().map(|l| l.open_parent(path)) {
                Some(Ok(ld)) => mv(ld.as_fd(), path.file_name()),
                _ => Err(Errno::NOENT),
            },
            r => r,
        };
        match moved {
            Ok(()) => true,
            Err(Errno::XDEV) => {
                self.off.set(true);
                false
            }
            Err(_) => false,
        }
    }

    /// The layer kept whole (ADR 0215), opened once.
    pub(crate) fn layer(&self) -> Option<&crate::fsx::Root> {
        self.layer
            .get_or_init(|| crate::fsx::Root::open(&self.path.join(LAYER)).ok())
            .as_ref()
    }

    /// The kept files' directory, opened (made when putting), for a whole
    /// tree's move (ADR 0211). `None`: none, or on another filesystem.
    pub(crate) fn tree_dir(&self) -> Option<BorrowedFd<'_>> {
        self.dir()
    }

    /// Marks the kept files as on another filesystem than the workspace:
    /// nothing more is tried.
    pub(crate) fn off(&self) {
        self.off.set(true);
    }
}

/// The name a whole directory is kept under (ADR 0211), beside the files.
pub(crate) fn tree_key(path: &RelPath) -> String {
    format!("t-{}", key(path))
}

/// The name a path's file is kept under (fixed length, any depth).
fn key(path: &RelPath) -> String {
    Hash::of(path.as_str().as_bytes()).to_hex()
}

/// Entry `id` can no longer use what it kept (it was undone, rolled back
/// or expired): its directory is renamed for [`sweep_kept`] to remove.
/// Best effort: a directory left behind costs only its disk.
pub(crate) fn retire(store: &Store, id: &str) {
    let from = store.kept_dir().join(id);
    if fs::symlink_metadata(&from).is_ok_and(|m| m.is_dir()) {
        let _ = fs::rename(
            &from,
            store.kept_dir().join(format!(".done-{id}-{}", nanos())),
        );
    }
}

/// Removes the kept directories no entry can use any more (retired ones),
/// off the caller's path: while the next command runs, or by `retie gc`.
/// `state_dir` is the snapshot state directory ([`Store::open`]'s).
/// Best effort.
pub fn sweep_kept(state_dir: &Path) {
    let Ok(rd) = fs::read_dir(state_dir.join(crate::store::KEPT)) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(".done-")
            && e.file_type().is_ok_and(|t| t.is_dir())
        {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Whether `st` may stand for the pre-image a kept file was taken back for:
/// a plain file of one link.
pub(crate) fn usable(st: &rustix::fs::Stat) -> bool {
    fsx::ftype(st) == FileType::RegularFile && st.st_nlink == 1
}

/// Sets the modification time of the file open at `fd` to now, as a copy
/// would have it.
pub(crate) fn touch(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    use rustix::fs::{Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
    rustix::fs::futimens(
        fd,
        &Timestamps {
            last_access: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            },
            last_modification: Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_NOW,
            },
        },
    )
}

/// Unlinks `name` of `dir`, ignoring errors (a kept file found unusable).
pub(crate) fn drop_at(dir: BorrowedFd<'_>, name: &str) {
    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
}
