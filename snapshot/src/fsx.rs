//! The boundary guard: every path operation under a workspace (or an upper
//! layer) goes through here.
//!
//! A tree is held as a directory file descriptor ([`Root`]). A path inside it
//! is reached in two steps: its parent directory is opened with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, so that no
//! component may be a symlink, a `/proc` magic link, `..` above the root or an
//! absolute path; then the last component, a single name without `/`, is
//! operated on with an `*at` call relative to that directory fd, never
//! following a symlink (`AT_SYMLINK_NOFOLLOW`, `O_NOFOLLOW`, `unlinkat`,
//! `renameat`, `symlinkat`, `mkdirat`). A symlinked directory in the lower, a
//! symlink swapped in for a directory while we work, or a symlink pointing
//! outside therefore make the call fail with `ELOOP` (reported as
//! [`Error::Boundary`]) instead of resolving outside.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::hash::Hash;
use crate::node::Node;
use crate::relpath::RelPath;
use crate::store::Batch;

/// The resolve flags used for every open under a tree.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// A directory tree held by an fd; all access to it is relative to the fd.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

impl Root {
    /// Opens the tree's root directory. The root path itself is trusted (it
    /// is the caller's choice); nothing beneath it is.
    pub fn open(path: &Path) -> Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io("open directory", path, e.into()))?;
        Ok(Root {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The root fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The path the root was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens directory `rel` (`None`: the root itself) beneath the root.
    pub fn open_dir(&self, rel: Option<&RelPath>) -> Result<OwnedFd, Errno> {
        match rel {
            None => rustix::fs::openat2(
                self.fd(),
                c".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ),
            // No O_NOFOLLOW: with it a trailing symlink gives ENOTDIR
            // (indistinguishable from a file); without it RESOLVE_NO_SYMLINKS
            // refuses the trailing symlink too, with ELOOP.
            Some(rel) => rustix::fs::openat2(
                self.fd(),
                rel.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ),
        }
    }

    /// Opens the directory that holds `rel`.
    pub fn open_parent(&self, rel: &RelPath) -> Result<OwnedFd, Errno> {
        self.open_dir(rel.parent().as_ref())
    }
}

/// The parent directories of a run of paths under one [`Root`], each
/// opened once for consecutive paths in the same directory (ADR 0212):
/// a pass over sorted paths opens a directory of 100 files once, not 100
/// times. Opened as [`Root::open_parent`] opens it; only a successful
/// open is remembered. A pass that removes or replaces a directory must
/// not ask again for a path beneath it (the passes of a transition never
/// do: a directory is removed after everything beneath it, and created
/// before).
pub(crate) struct Parents<'r> {
    root: &'r Root,
    last: std::cell::RefCell<Option<(Option<RelPath>, std::rc::Rc<OwnedFd>)>>,
}

impl<'r> Parents<'r> {
    pub(crate) fn new(root: &'r Root) -> Parents<'r> {
        Parents {
            root,
            last: std::cell::RefCell::new(None),
        }
    }

    /// The directory that holds `rel`.
    pub(crate) fn open(&self, rel: &RelPath) -> Result<std::rc::Rc<OwnedFd>, Errno> {
        let parent = rel.parent();
        if let Some((p, fd)) = &*self.last.borrow() {
            if *p == parent {
                return Ok(fd.clone());
            }
        }
        let fd = std::rc::Rc::new(self.root.open_dir(parent.as_ref())?);
        *self.last.borrow_mut() = Some((parent, fd.clone()));
        Ok(fd)
    }
}

/// A regular file read to its end without the last read of zero bytes (a
/// system call a file): once at least the size `fstat` gave has been read,
/// a read shorter than asked is taken as the end, as a regular file's is.
/// A short read before that size (a network or FUSE filesystem may give
/// one) goes on reading; a file that grows while read is a changed file
/// either way, caught by the hash comparisons that follow.
pub(crate) struct ToEnd<'f> {
    file: &'f mut File,
    size: u64,
    read: u64,
    done: bool,
}

impl<'f> ToEnd<'f> {
    pub(crate) fn new(file: &'f mut File, st: &rustix::fs::Stat) -> ToEnd<'f> {
        ToEnd {
            file,
            size: u64::try_from(st.st_size).unwrap_or(u64::MAX),
            read: 0,
            done: false,
        }
    }
}

impl Read for ToEnd<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        let n = self.file.read(buf)?;
        self.read += n as u64;
        if n < buf.len() && self.read >= self.size {
            self.done = true;
        }
        Ok(n)
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` when absent.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &str) -> Result<Option<rustix::fs::Stat>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens a single entry of `dir` for reading without following a symlink and
/// without blocking on a fifo; the caller checks the type with `fstat`.
pub(crate) fn open_file_at(dir: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )
}

/// Opens a subdirectory of `dir` without following a symlink.
pub(crate) fn open_subdir(dir: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )
}

/// Creates `name` in `dir` exclusively for writing, mode 0600.
pub(crate) fn create_at(dir: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
        RESOLVE,
    )
}

/// The target of symlink `name` in `dir`.
pub(crate) fn readlink_at(dir: BorrowedFd<'_>, name: &str) -> Result<Vec<u8>, Errno> {
    rustix::fs::readlinkat(dir, name, Vec::new()).map(|c| c.into_bytes())
}

/// The names in a directory, without `.` and `..`, sorted.
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> Result<Vec<Vec<u8>>, Errno> {
    let mut out = Vec::new();
    for ent in rustix::fs::Dir::read_from(dir)? {
        let ent = ent?;
        let name: &CStr = ent.file_name();
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            out.push(b.to_vec());
        }
    }
    out.sort();
    Ok(out)
}

/// The value of xattr `name` on `fd`, `None` when unset or unsupported.
pub(crate) fn get_xattr(fd: BorrowedFd<'_>, name: &str) -> Option<Vec<u8>> {
    let mut buf = [0u8; 256];
    match rustix::fs::fgetxattr(fd, name, &mut buf[..]) {
        Ok(n) => Some(buf[..n.min(buf.len())].to_vec()),
        Err(_) => None,
    }
}

/// The names of the xattrs on `fd` (empty where the filesystem has none),
/// in one call; `None` when they cannot be listed (the caller asks for
/// each name it needs instead).
pub(crate) fn xattr_names(fd: BorrowedFd<'_>) -> Option<Vec<Vec<u8>>> {
    let mut buf = [0u8; 1024];
    let list = match rustix::fs::flistxattr(fd, &mut buf[..]) {
        Ok(n) => buf[..n.min(buf.len())].to_vec(),
        Err(Errno::NOTSUP) => return Some(Vec::new()),
        Err(Errno::RANGE) => {
            let n = rustix::fs::flistxattr(fd, &mut [0u8; 0][..]).ok()?;
            let mut big = vec![0u8; n];
            let n = rustix::fs::flistxattr(fd, &mut big[..]).ok()?;
            big.truncate(n);
            big
        }
        Err(_) => return None,
    };
    Some(
        list.split(|b| *b == 0)
            .filter(|x| !x.is_empty())
            .map(<[u8]>::to_vec)
            .collect(),
    )
}

/// Permission bits of a stat.
pub(crate) fn perm(st: &rustix::fs::Stat) -> u32 {
    st.st_mode & 0o7777
}

/// The file type of a stat.
pub(crate) fn ftype(st: &rustix::fs::Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// A name for a special file type, `None` for file, symlink, directory.
pub(crate) fn special_name(t: FileType) -> Option<&'static str> {
    match t {
        FileType::RegularFile | FileType::Symlink | FileType::Directory => None,
        FileType::Fifo => Some("fifo"),
        FileType::Socket => Some("socket"),
        FileType::CharacterDevice => Some("char device"),
        FileType::BlockDevice => Some("block device"),
        FileType::Unknown => Some("unknown file type"),
    }
}

/// Streams `r` into blake3 and, if given, into `sink`. Returns the hash and
/// the number of bytes.
pub(crate) fn hash_stream(
    r: &mut impl Read,
    sink: Option<&mut dyn Write>,
) -> io::Result<(Hash, u64)> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => {
            // One buffer per thread, not one zeroed allocation per file.
            if buf.is_empty() {
                buf.resize(128 * 1024, 0);
            }
            hash_with(r, sink, &mut buf)
        }
        Err(_) => hash_with(r, sink, &mut vec![0u8; 128 * 1024]),
    })
}

fn hash_with(
    r: &mut impl Read,
    mut sink: Option<&mut dyn Write>,
    buf: &mut [u8],
) -> io::Result<(Hash, u64)> {
    let mut hasher = blake3::Hasher::new();
    let mut total = 0u64;
    loop {
        let n = match r.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        if let Some(s) = sink.as_mut() {
            s.write_all(&buf[..n])?;
        }
        total += n as u64;
    }
    Ok((hasher.finalize().into(), total))
}

/// Reads the state of entry `name` of `dir` (workspace path `rel`). A file's
/// content is hashed and, when `store` is given, stored as a blob. Fifos,
/// sockets and devices are [`Error::SpecialFile`].
pub(crate) fn read_node(
    dir: BorrowedFd<'_>,
    name: &str,
    rel: &RelPath,
    store: Option<&mut Batch<'_>>,
) -> Result<Option<Node>> {
    let Some(st) = lstat_at(dir, name).map_err(|e| Error::at("stat", rel, e))? else {
        return Ok(None);
    };
    match ftype(&st) {
        FileType::RegularFile => {
            let fd = open_file_at(dir, name).map_err(|e| Error::at("open", rel, e))?;
            file_node(fd, rel, store).map(Some)
        }
        FileType::Symlink => {
            let t = readlink_at(dir, name).map_err(|e| Error::at("readlink", rel, e))?;
            let target = String::from_utf8(t).map_err(|_| Error::InvalidPath {
                name: format!("symlink target of {rel}"),
                reason: "not UTF-8",
            })?;
            Ok(Some(Node::symlink(target)))
        }
        FileType::Directory => Ok(Some(Node::Dir { mode: perm(&st) })),
        t => Err(Error::SpecialFile {
            path: rel.clone(),
            what: special_name(t).unwrap_or("special file"),
        }),
    }
}

/// The state of the file open at `fd` (workspace path `rel`), opened by
/// [`open_file_at`]: its content hashed and, when `store` is given, stored.
/// Anything but a regular file is [`Error::SpecialFile`].
pub(crate) fn file_node(fd: OwnedFd, rel: &RelPath, store: Option<&mut Batch<'_>>) -> Result<Node> {
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::at("fstat", rel, e))?;
    if ftype(&st) != FileType::RegularFile {
        return Err(Error::SpecialFile {
            path: rel.clone(),
            what: special_name(ftype(&st)).unwrap_or("non-file"),
        });
    }
    let mut f = File::from(fd);
    let mut r = ToEnd::new(&mut f, &st);
    let (hash, size) = match store {
        Some(blobs) => blobs.put_reader(&mut r)?,
        None => hash_stream(&mut r, None).map_err(|e| Error::io("read", rel.as_str(), e))?,
    };
    Ok(Node::File {
        mode: perm(&st),
        size,
        hash,
    })
}

/// Reads the state of workspace path `rel` in the no-follow view: absent
/// when an ancestor is missing, is not a directory, or is a symlink (nothing
/// beneath a symlink is inside the workspace). Writes never get this far:
/// preflight and the write path refuse a symlinked ancestor with
/// [`Error::Boundary`].
pub(crate) fn read_path(
    root: &Root,
    rel: &RelPath,
    store: Option<&mut Batch<'_>>,
) -> Result<Option<Node>> {
    read_path_via(&Parents::new(root), rel, store)
}

/// [`read_path`] through parent directories opened once for a run of
/// paths in one directory.
pub(crate) fn read_path_via(
    parents: &Parents<'_>,
    rel: &RelPath,
    store: Option<&mut Batch<'_>>,
) -> Result<Option<Node>> {
    let dir = match parents.open(rel) {
        Ok(d) => d,
        Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => return Ok(None),
        Err(e) => return Err(Error::at("open parent of", rel, e)),
    };
    read_node(dir.as_fd(), rel.file_name(), rel, store)
}
