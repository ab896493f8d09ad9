//! The system calls no maintained crate wraps, and the few process-level
//! calls that cannot be made safe (fork, `_exit`). Everything else the
//! runtime asks of the kernel goes through rustix (ADR 0008).
//!
//! What stays raw here, and why:
//! - `mount_setattr`: rustix 1.1 has the flag type but no call;
//! - `close_range`: not in rustix 1.1;
//! - `clone` with `CLONE_PIDFD` and namespace flags (fork semantics that
//!   return a pidfd): no crate offers a fork-like clone with a pidfd;
//! - `fork` and `_exit`: a second copy of the process, and an exit that
//!   runs no destructor; unsafe by nature;
//! - `landlock_create_ruleset(NULL, 0, VERSION)`: the landlock crate does
//!   not expose the kernel's ABI number, which the preflight reports.
//!
//! Each wrapper returns `io::Result` and nothing more: the policy of when
//! to call them lives in the set-up steps.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub use rustix::mount::MountAttrFlags;

/// `AT_RECURSIVE` for [`mount_setattr`].
pub const AT_RECURSIVE: libc::c_uint = 0x8000;

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
fn to_int(v: libc::c_long) -> io::Result<libc::c_int> {
    libc::c_int::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `mount_setattr(dirfd, path, flags, {attr_set, userns_fd})`; `dirfd`
/// None is `AT_FDCWD`.
pub fn mount_setattr(
    dirfd: Option<BorrowedFd<'_>>,
    path: &CStr,
    flags: libc::c_uint,
    attr_set: MountAttrFlags,
    userns_fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let attr = MountAttr {
        attr_set: u64::from(attr_set.bits()),
        // A borrowed fd is open and so non-negative.
        userns_fd: userns_fd.map_or(0, |fd| u64::try_from(fd.as_raw_fd()).unwrap_or(u64::MAX)),
        ..MountAttr::default()
    };
    let dirfd = dirfd.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
    // SAFETY: the kernel reads `path` up to its NUL (a &CStr, alive for the
    // call) and exactly `size_of::<MountAttr>()` bytes of `attr`, a live
    // `struct mount_attr` of that size (VER0 layout); it writes to neither.
    // The fds are borrowed, so open for the call's duration.
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
    use rustix::mount::OpenTreeFlags as F;
    rustix::mount::open_tree(
        rustix::fs::CWD,
        path,
        F::OPEN_TREE_CLONE | F::AT_RECURSIVE | F::OPEN_TREE_CLOEXEC,
    )
    .map_err(io::Error::from)
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a
/// detached tree at `target`.
pub fn move_mount_fd(fd: impl AsFd, target: &CStr) -> io::Result<()> {
    rustix::mount::move_mount(
        fd,
        c"",
        rustix::fs::CWD,
        target,
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(io::Error::from)
}

/// Mark every fd from `first` upwards close-on-exec.
pub fn cloexec_from(first: libc::c_uint) -> io::Result<()> {
    // SAFETY: with CLOSE_RANGE_CLOEXEC the kernel only sets the
    // close-on-exec flag on this process's fds; no fd is closed, so no
    // OwnedFd anywhere is invalidated, and no memory is passed.
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

/// The result of [`clone_namespaces`] or [`fork`] as seen by the caller.
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
/// The C library's fork handlers do not run (the child must not use its
/// cached state that those handlers reset; retie's child does not). With
/// musl (ADR 0416) that state includes the thread id `raise()` and
/// `abort()` signal: in the child they name the parent's id, which
/// `CLONE_NEWPID` (every caller's) makes a number of another namespace.
/// The child never raises a signal itself; a panic there (panic = abort)
/// ends in `abort()`'s last resort, a fault the kernel delivers even to a
/// namespace's init.
pub unsafe fn clone_namespaces(flags: libc::c_int) -> io::Result<Forked> {
    let mut pidfd: RawFd = -1;
    // SAFETY: a NULL stack makes clone behave like fork (the child
    // continues on a copy of this stack); the caller guarantees a single
    // thread. The kernel writes one int through the pidfd out-pointer, a
    // live local.
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
    // SAFETY: clone succeeded with CLONE_PIDFD, so the kernel stored a
    // fresh fd referring to the child in `pidfd`; nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Forked::Parent { pid, pidfd })
}

/// fork(2). Returns the child's pid in the parent, `None` in the child.
///
/// # Safety
/// The calling process must be single-threaded (the child is a copy of
/// the calling thread only and must not wait on locks other threads held),
/// and the child must end with [`exit_now`] or exec, never by returning
/// through the caller's destructors twice.
pub unsafe fn fork() -> io::Result<Option<libc::pid_t>> {
    // SAFETY: the caller's contract above.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(pid)),
    }
}

/// `_exit(code)`: end this process without running destructors, atexit
/// handlers or flushing stdio buffers (a forked child's copies of its
/// parent's buffers must not be written twice).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an int and never returns; skipping destructors
    // leaks nothing the kernel does not reclaim at exit.
    unsafe { libc::_exit(code) }
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`.
pub fn pidfd_send_signal(pidfd: impl AsFd, sig: rustix::process::Signal) -> io::Result<()> {
    rustix::process::pidfd_send_signal(pidfd, sig).map_err(io::Error::from)
}

/// The Landlock ABI version the running kernel offers; `Err` when Landlock
/// is not built in (ENOSYS) or not enabled at boot (EOPNOTSUPP).
pub fn landlock_abi() -> io::Result<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel
    // reads no memory and creates no fd: it only returns a number.
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
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from)
}

/// The go channel between the supervisor and init: a connected pair of
/// UNIX stream sockets rather than a pipe, so the supervisor's writes can
/// refuse to raise SIGPIPE ([`send_all`]): a CLI that keeps SIGPIPE's
/// default (to end quietly in a closed pipeline) would otherwise die
/// silently when init has already failed. Init reads it like a pipe: a
/// byte, or EOF and HUP once the supervisor is gone. Its one order:
/// supervisor `G`; init's `L` (the proxy socket) and `T` (the pty's
/// master), each only in its mode, in that order; supervisor `X`.
pub fn go_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(io::Error::from)
}

/// Send descriptors (at most 2) over the UNIX socket `sock` as
/// `SCM_RIGHTS`, with the one byte `tag`, without raising SIGPIPE.
pub fn send_fds(sock: BorrowedFd<'_>, tag: u8, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if fds.len() > 2 || !anc.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
    }
    loop {
        match sendmsg(
            sock,
            &[io::IoSlice::new(&[tag])],
            &mut anc,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => return Ok(()),
        }
    }
}

/// Receive what [`send_fds`] sent (at most 2 descriptors): `Ok(None)` at
/// end of stream (the peer closed first); an error when the byte is not
/// `tag` or no descriptor came with it. Received descriptors are
/// close-on-exec.
pub fn recv_fds(sock: BorrowedFd<'_>, tag: u8) -> io::Result<Option<Vec<OwnedFd>>> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = loop {
        match recvmsg(
            sock,
            &mut [io::IoSliceMut::new(&mut byte)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(r) => break r.bytes,
        }
    };
    if got == 0 {
        return Ok(None);
    }
    let mut fds = Vec::new();
    for msg in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = msg {
            fds.extend(got);
        }
    }
    if byte[0] != tag || fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected {:?} with descriptors, got {:?} with {}",
                tag as char,
                byte[0] as char,
                fds.len()
            ),
        ));
    }
    Ok(Some(fds))
}

/// Send all of `buf` on the socket `fd` without raising SIGPIPE (a closed
/// peer is the error EPIPE), retrying on EINTR.
pub fn send_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::net::send(fd, buf, rustix::net::SendFlags::NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Write all of `buf` to `fd`, retrying on EINTR.
pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A small /proc file (such as `/proc/self/status`, about 1.5 KiB) read
/// through a 4 KiB buffer: two reads. `std::fs::read_to_string` grows its
/// buffer from 32 bytes since /proc reports no size, about eight reads,
/// each of which makes the kernel format the whole file again (issue 10).
pub fn read_proc(path: &str) -> io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut out = Vec::with_capacity(4096);
    let mut buf = [0u8; 4096];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(buf.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Number of threads of the calling process, from /proc/self/status.
pub fn thread_count() -> io::Result<usize> {
    let status = read_proc("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no Threads: line"))
}

/// A signal by number, for the ones retie forwards or sends (all named).
pub fn signal(sig: libc::c_int) -> Option<rustix::process::Signal> {
    rustix::process::Signal::from_named_raw(sig)
}

/// A pid as rustix wants it (None for 0 or negative).
pub fn pid(p: libc::pid_t) -> Option<rustix::process::Pid> {
    rustix::process::Pid::from_raw(p)
}

/// A stack for a task cloned with `CLONE_VM` (the command's spawn, the
/// network task): an anonymous mapping with an inaccessible guard page
/// below it, so an overflow faults instead of writing into the memory it
/// shares. Unmapped on drop: drop it only once no task runs on it.
pub struct ChildStack {
    base: *mut std::ffi::c_void,
    len: usize,
}

impl ChildStack {
    /// Map `size` bytes of stack plus the guard page.
    pub fn new(size: usize) -> io::Result<ChildStack> {
        use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};
        let page = rustix::param::page_size();
        let len = size + page;
        // SAFETY: a fresh anonymous private mapping at an address the
        // kernel chooses; no existing memory is touched.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::STACK,
            )
        }?;
        let stack = ChildStack { base, len };
        // SAFETY: the lowest page of the mapping just made, which nothing
        // references yet, becomes inaccessible (on failure `stack` drops
        // and unmaps it).
        unsafe { rustix::mm::mprotect(base, page, MprotectFlags::empty()) }?;
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned since the
    /// mapping is page-aligned: what `clone` takes.
    pub fn top(&self) -> *mut std::ffi::c_void {
        // SAFETY: one past the end of the mapping, which `add` may form.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; its owner drops it only once no
        // task runs on it, and no reference into it remains.
        let _ = unsafe { rustix::mm::munmap(self.base, self.len) };
    }
}
