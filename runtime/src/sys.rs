//! Thin, documented wrappers over the system calls that libc exposes only as
//! raw numbers (the new mount API, pivot_root, close_range, pidfds, clone
//! with namespace flags). Each returns `io::Result` and nothing more: the
//! policy of when to call them lives in the set-up steps.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
pub const AT_RECURSIVE: libc::c_uint = 0x8000;
pub const OPEN_TREE_CLONE: libc::c_uint = 1;
pub const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;

/// `struct mount_attr` from <linux/mount.h> (MOUNT_ATTR_SIZE_VER0 = 32).
#[repr(C)]
#[derive(Default)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A kernel-returned fd or pid (an int) out of a syscall's long.
pub fn to_int(v: libc::c_long) -> io::Result<libc::c_int> {
    libc::c_int::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `mount_setattr(dirfd, path, flags, {attr_set, userns_fd})`.
pub fn mount_setattr(
    dirfd: RawFd,
    path: &CStr,
    flags: libc::c_uint,
    attr_set: u64,
    userns_fd: Option<RawFd>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        // An fd that is not one (negative) becomes one the kernel refuses.
        userns_fd: userns_fd.map_or(0, |fd| u64::try_from(fd).unwrap_or(u64::MAX)),
        ..MountAttr::default()
    };
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the
    // call; `attr` is a live, correctly sized `struct mount_attr` the kernel
    // only reads; the size argument matches the struct.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(ret).map(drop)
}

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | AT_RECURSIVE | CLOEXEC)`:
/// a detached copy of the mount tree at `path`, owned by the returned fd.
pub fn open_tree_clone(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid C string; the call only returns a new fd.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    let fd: RawFd = to_int(check(ret)?)?;
    // SAFETY: the kernel just returned this fd to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a
/// detached tree at `target`.
pub fn move_mount_fd(fd: RawFd, target: &CStr) -> io::Result<()> {
    // SAFETY: both strings are valid C strings; `fd` is an open mount fd
    // owned by the caller for the duration of the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(ret).map(drop)
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: both arguments are valid C strings for the call's duration.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    check(ret).map(drop)
}

/// Mark every fd from `first` upwards close-on-exec.
pub fn cloexec_from(first: libc::c_uint) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on fds
    // of this process; it touches no memory.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    check(ret).map(drop)
}

/// The result of [`clone_namespaces`] as seen by the caller.
pub enum Forked {
    /// In the parent: the child's pid and a pidfd referring to it.
    Parent { pid: libc::pid_t, pidfd: OwnedFd },
    /// In the child.
    Child,
}

/// `clone(flags | CLONE_PIDFD | SIGCHLD)` with a NULL stack, i.e. fork(2)
/// that also creates namespaces and hands back a pidfd.
///
/// # Safety
/// The calling process must be single-threaded: the child is a copy of the
/// calling thread only, and must not rely on locks other threads held.
/// glibc's fork handlers do not run (the child must not use glibc's cached
/// state that those handlers reset; retie's child does not).
pub unsafe fn clone_namespaces(flags: libc::c_int) -> io::Result<Forked> {
    let mut pidfd: RawFd = -1;
    // SAFETY: a NULL stack makes clone behave like fork (the child continues
    // on a copy of this stack); the caller guarantees a single thread. The
    // pidfd out-pointer is valid for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_ulong::from((flags | libc::CLONE_PIDFD | libc::SIGCHLD).cast_unsigned()),
            std::ptr::null_mut::<libc::c_void>(),
            &mut pidfd as *mut RawFd,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    let pid = to_int(check(ret)?)?;
    if pid == 0 {
        return Ok(Forked::Child);
    }
    // SAFETY: CLONE_PIDFD stored a fresh fd referring to the child.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Forked::Parent { pid, pidfd })
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`.
pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: the pidfd is owned and open; a NULL siginfo is allowed.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null_mut::<libc::c_void>(),
            0,
        )
    };
    check(ret).map(drop)
}

/// The Landlock ABI version the running kernel offers; `Err` when Landlock
/// is not built in (ENOSYS) or not enabled at boot (EOPNOTSUPP).
pub fn landlock_abi() -> io::Result<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the call only
    // returns a number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    check(ret).and_then(to_int)
}

/// A pipe whose both ends are close-on-exec.
pub fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid two-element array for the kernel to fill.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh fds that we now own exclusively.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Write all of `buf` to `fd`, retrying on EINTR.
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid slice for `buf.len()` bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n.unsigned_abs()..];
    }
    Ok(())
}

/// Read from `fd` until EOF, retrying on EINTR.
pub fn read_to_end(fd: RawFd, out: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: `chunk` is a valid writable buffer of its length.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        out.extend_from_slice(&chunk[..n.unsigned_abs()]);
    }
}

/// Number of threads of the calling process, from /proc/self/status.
pub fn thread_count() -> io::Result<usize> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no Threads: line"))
}
