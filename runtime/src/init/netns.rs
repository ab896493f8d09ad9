//! The sandbox's own network namespace, when no lab network was wired for
//! it: made by a helper task beside init's set-up, entered before the
//! capabilities drop.
//!
//! Creating a network namespace costs about 0.27 ms of kernel time on the
//! project's VM, most of what a sandbox's clone cost, and the clone blocks
//! the supervisor (ADR 0415). So the supervisor clones init without
//! `CLONE_NEWNET`, and init's first act is to start a small task in its
//! own memory and descriptor table (`clone(CLONE_VM | CLONE_FILES)`, like
//! the command's spawn) whose one job is `unshare(CLONE_NEWNET)` and to
//! open its new namespace (`/proc/thread-self/ns/net`, through a `/proc`
//! descriptor init opened before the clone, so init's pivot cannot race
//! it). The task then exits. init mounts the sandbox's tree meanwhile, then
//! [`Pending::join`]s: reaps the task and `setns`es into the namespace by
//! that descriptor. Both hold every capability in the sandbox's user
//! namespace from the clone on, so neither needs an id map, and the
//! namespace belongs to that user namespace.
//!
//! Nothing touches the network before the join: init opens no socket
//! during set-up, and the command starts long after it. Any failure (the
//! task's start, its unshare or open, the `setns`) is a set-up failure
//! like any other, reported with the step's name: the command never starts
//! in the caller's network namespace.

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, Ordering};

use super::{SetupError, StepResult};

const STEP: &str = "network namespace";

/// The task's stack: a few frames of raw system calls.
const STACK_SIZE: usize = 32 * 1024;

/// The task's result before it stores one: it died first.
const NO_RESULT: i32 = i32::MIN;

/// Shared with the task (CLONE_VM).
struct Shared {
    /// `/proc` (init's, opened before the clone; the descriptor table is
    /// shared, so the number is the task's too).
    proc: i32,
    /// Set by the task before it exits: the descriptor of its new network
    /// namespace (>= 0), or minus the errno of what failed; [`NO_RESULT`]
    /// until then.
    result: AtomicI32,
}

/// A network namespace being made; [`Pending::join`] enters it. Dropped
/// unjoined (a set-up step failed first), the task is reaped and its
/// namespace closed.
pub struct Pending {
    pid: libc::pid_t,
    /// Kept open until the task is reaped.
    proc: OwnedFd,
    /// The task's stack, until it is reaped (`None` after).
    stack: Option<crate::sys::ChildStack>,
    /// Read and written by the task: a raw allocation (`Box::leak`) that
    /// no Rust reference owns while the task may use it, freed in `Drop`
    /// after the task is reaped.
    shared: NonNull<Shared>,
}

fn error(what: &str, e: &std::io::Error) -> SetupError {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSPC) => {
            "the user's limit on network namespaces is reached (/proc/sys/user/max_net_namespaces)"
        }
        Some(libc::EPERM) => {
            "network namespaces are refused here (a container or security policy forbids them)"
        }
        Some(libc::EINVAL) => "the kernel lacks network namespaces (CONFIG_NET_NS)",
        _ => "the kernel must allow network namespaces in user namespaces",
    };
    SetupError {
        step: STEP,
        message: format!("{what}: {e}"),
        hint: Some(hint.into()),
    }
}

/// Start the task that makes the namespace.
///
/// # Safety
/// The calling process must be single-threaded (init is): the task shares
/// its memory and descriptor table and writes `Shared` while init goes on,
/// so init must not free or move anything the task uses before the task
/// is reaped ([`Pending`] owns all of it).
pub unsafe fn start() -> StepResult<Pending> {
    let proc = rustix::fs::open(
        "/proc",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| error("opening /proc", &e.into()))?;
    let stack = crate::sys::ChildStack::new(STACK_SIZE)
        .map_err(|e| error("mapping the network task's stack", &e))?;
    let shared = NonNull::from(Box::leak(Box::new(Shared {
        proc: proc.as_raw_fd(),
        result: AtomicI32::new(NO_RESULT),
    })));
    // The task starts with every signal blocked (it inherits the mask),
    // so no handler of init's ever runs on its stack and no terminal stop
    // signal reaches it; init's own mask is restored at once.
    // SAFETY: sigfillset writes a valid full set into `all`.
    let all = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        all
    };
    let old = block(&all);
    // SAFETY: `task` runs on the top of `stack` and uses only `*shared`, a leaked
    // allocation the returned `Pending` frees only after the task is
    // reaped, as it unmaps the stack and closes `proc` only then.
    // CLONE_FILES: the descriptor it opens is init's too. No CLONE_FS (its
    // root and working directory are its own copies; it resolves nothing
    // by path but under `proc`), no CLONE_SIGHAND (its dispositions are a
    // copy, and every signal is blocked), no CLONE_THREAD. The caller
    // guarantees a single thread.
    let pid = unsafe {
        libc::clone(
            task,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_FILES | libc::SIGCHLD,
            shared.as_ptr().cast::<c_void>(),
        )
    };
    let cloned = std::io::Error::last_os_error();
    block(&old);
    if pid < 0 {
        // SAFETY: no task uses `shared` (the clone failed); it was made
        // above and nothing else references it. `stack` drops unused.
        drop(unsafe { Box::from_raw(shared.as_ptr()) });
        return Err(error("starting the network task", &cloned));
    }
    Ok(Pending {
        pid,
        proc,
        stack: Some(stack),
        shared,
    })
}

/// Set the signal mask to `set`, returning the one before.
fn block(set: &libc::sigset_t) -> libc::sigset_t {
    // SAFETY: `set` and `old` are valid sigsets; pthread_sigmask only
    // reads the one and writes the other.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, set, &mut old);
        old
    }
}

impl Pending {
    /// Wait for the task, then enter its network namespace, after checking
    /// it is not the one init is in.
    pub fn join(mut self) -> StepResult {
        self.reap();
        // SAFETY: the task is reaped: nothing else reads or writes `shared`.
        let r = unsafe { self.shared.as_ref() }
            .result
            .swap(NO_RESULT, Ordering::SeqCst);
        if r == NO_RESULT {
            return Err(error(
                "the network task died before it made a namespace",
                &std::io::Error::from_raw_os_error(libc::ECHILD),
            ));
        }
        if r < 0 {
            return Err(error(
                "cannot create the sandbox's network namespace",
                &std::io::Error::from_raw_os_error(-r),
            ));
        }
        // SAFETY: the task opened this descriptor in the table we share and
        // is gone; nothing else owns it (the swap above took it).
        let ns = unsafe { OwnedFd::from_raw_fd(r) };
        let new =
            rustix::fs::fstat(&ns).map_err(|e| error("reading the new namespace", &e.into()))?;
        let ours = rustix::fs::statat(
            &self.proc,
            c"thread-self/ns/net",
            rustix::fs::AtFlags::empty(),
        )
        .map_err(|e| error("reading init's network namespace", &e.into()))?;
        if (new.st_dev, new.st_ino) == (ours.st_dev, ours.st_ino) {
            return Err(error(
                "the network task returned the namespace init is already in",
                &std::io::Error::from_raw_os_error(libc::EEXIST),
            ));
        }
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| error("entering the sandbox's network namespace", &e.into()))
    }

    /// Wait for the task's end (once), then free its stack.
    fn reap(&mut self) {
        let Some(stack) = self.stack.take() else {
            return;
        };
        if let Some(pid) = crate::sys::pid(self.pid) {
            while let Err(rustix::io::Errno::INTR) =
                rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
            {
            }
        }
        // The task that ran on it is dead and reaped.
        drop(stack);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.reap();
        // SAFETY: the task is reaped, so nothing else uses `shared`, which
        // came from `Box::leak` in `start` and is freed here only.
        let shared = unsafe { Box::from_raw(self.shared.as_ptr()) };
        let r = shared.result.load(Ordering::SeqCst);
        if r >= 0 {
            // SAFETY: the namespace descriptor the task opened, never
            // taken by `join` (which resets the value when it takes it).
            drop(unsafe { OwnedFd::from_raw_fd(r) });
        }
    }
}

/// The task, on its own stack in init's memory, every signal blocked:
/// raw system calls only (rustix's raw backend), no allocation, no lock,
/// no errno.
extern "C" fn task(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` that `start` passed, alive and unmoved
    // until this task is reaped; init touches it only after.
    let s = unsafe { &*arg.cast::<Shared>() };
    // SAFETY: this task has its own nsproxy (no CLONE_THREAD);
    // CLONE_NEWNET changes only which network namespace it is in.
    let made = unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) };
    let result = made.and_then(|()| {
        // SAFETY: init's /proc descriptor, open until this task is reaped.
        let proc = unsafe { BorrowedFd::borrow_raw(s.proc) };
        rustix::fs::openat(
            proc,
            c"thread-self/ns/net",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
    });
    let code = match result {
        // The descriptor now belongs to init (shared table): not closed here.
        Ok(fd) => std::mem::ManuallyDrop::new(fd).as_raw_fd(),
        Err(e) => -e.raw_os_error(),
    };
    s.result.store(code, Ordering::SeqCst);
    0
}

/// The proxied network (ADR 0310): bring the namespace's `lo` up, make a
/// TCP socket listening on 127.0.0.1:`port` in it, and send it to the
/// supervisor over the go channel (one byte, `L`, carrying the descriptor
/// as SCM_RIGHTS). The socket keeps this namespace: the proxy serving it
/// from the host's side is the only thing the sandbox can reach. init
/// closes its own copy before the command exists (nothing inside can
/// accept on it). Runs after the namespace was entered, before the
/// capabilities drop (bringing `lo` up needs CAP_NET_ADMIN here).
// The ioctl numbers (0x8913, 0x8914) and the flag bits (0x41) fit every
// type the C library declares for them.
#[allow(clippy::cast_possible_truncation)]
pub fn hand_out_proxy_socket(port: u16, go: BorrowedFd<'_>) -> StepResult {
    use rustix::net::{
        bind, listen, sendmsg, socket_with, AddressFamily, SendAncillaryBuffer,
        SendAncillaryMessage, SendFlags, SocketAddrV4, SocketFlags, SocketType,
    };
    const STEP_PROXY: &str = "proxy socket";
    let fail = |what: &str, e: std::io::Error| SetupError {
        step: STEP_PROXY,
        message: format!("{what}: {e}"),
        hint: None,
    };
    // `lo` up, by ioctl on a throwaway socket of this namespace.
    let ctl = socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| fail("socket for the interface ioctl", e.into()))?;
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into
    // the `ifreq` we own, which lives across the call.
    if unsafe { libc::ioctl(ctl.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr) } != 0 {
        return Err(fail("reading lo's flags", std::io::Error::last_os_error()));
    }
    // SAFETY: the union's flags member is what SIOCGIFFLAGS filled in.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the `ifreq` we own.
    if unsafe { libc::ioctl(ctl.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr) } != 0 {
        return Err(fail("bringing lo up", std::io::Error::last_os_error()));
    }
    drop(ctl);
    let l = socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| fail("socket", e.into()))?;
    bind(&l, &SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port))
        .map_err(|e| fail(&format!("binding 127.0.0.1:{port}"), e.into()))?;
    listen(&l, 128).map_err(|e| fail("listen", e.into()))?;
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    let fds = [l.as_fd()];
    if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(fail(
            "handing the socket out",
            std::io::Error::from_raw_os_error(libc::ENOBUFS),
        ));
    }
    sendmsg(
        go,
        &[std::io::IoSlice::new(b"L")],
        &mut anc,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| fail("handing the socket to the supervisor", e.into()))?;
    Ok(())
}
