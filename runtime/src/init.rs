//! The sandbox's init: PID 1 of the new pid namespace.
//!
//! [`main`] is the whole set-up as one recipe, top to bottom in the order
//! the steps run. Then init forks the command, forwards signals to it,
//! reaps everything, and exits with the command's status. When init exits
//! the kernel kills whatever is left in the namespace: nothing outlives the
//! command.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::outcome::EXIT_SANDBOX_FAILED;
use crate::protocol::Report;
use crate::setup::{self, exec::StdioFds, SetupError, StepResult};
use crate::spec::SandboxSpec;

/// Signals the supervisor forwards and init passes on to the command.
pub const FORWARDED: &[libc::c_int] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// Everything init inherits from the supervisor.
pub struct InitArgs<'a> {
    pub spec: &'a SandboxSpec,
    pub kernel_abi: i32,
    pub go: OwnedFd,
    pub status: OwnedFd,
    pub stdio: StdioFds,
    pub idmapped: Option<setup::workspace::IdmapTrees>,
    /// Detached trees for the extra read-only binds, opened by a root
    /// supervisor (the sandbox user may not be able to walk to them).
    pub ro_trees: Vec<OwnedFd>,
    /// Detached trees for the layered binds (same rule as `ro_trees`).
    pub layered_trees: Vec<OwnedFd>,
}

/// Run as PID 1 and never return.
pub fn main(args: InitArgs<'_>) -> ! {
    let status = args.status.as_raw_fd();
    match setup_and_wait(&args) {
        Ok(enforced) => {
            let ready = Report::Ready {
                landlock_abi: enforced.abi,
                landlock_enforced: enforced.fully,
                seccomp: true,
            };
            let _ = crate::sys::write_all(status, &ready.to_line());
        }
        Err(e) => {
            let report = Report::SetupFailed {
                step: e.step.to_string(),
                message: e.message,
                hint: e.hint,
            };
            let _ = crate::sys::write_all(status, &report.to_line());
            exit(EXIT_SANDBOX_FAILED);
        }
    }
    drop(args.idmapped);
    drop(args.ro_trees);
    drop(args.layered_trees);
    drop(args.go);
    // SAFETY: single-threaded; the child only execs or _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let report = Report::SetupFailed {
            step: "spawn".into(),
            message: format!("fork: {}", std::io::Error::last_os_error()),
            hint: None,
        };
        let _ = crate::sys::write_all(status, &report.to_line());
        exit(EXIT_SANDBOX_FAILED);
    }
    if pid == 0 {
        setup::exec::exec_command(&args.spec.argv, &args.spec.env, args.stdio, status);
    }
    // The child makes itself a group leader too; doing it here as well
    // closes the race where a forwarded signal arrives before the child
    // got that far (a signal to a group that does not exist yet is lost).
    // SAFETY: setpgid on our own child, integer arguments only.
    unsafe { libc::setpgid(pid, pid) };
    reap(pid, status)
}

/// The set-up recipe. Each line is one step, in the order it must run.
fn setup_and_wait(args: &InitArgs<'_>) -> StepResult<setup::landlock::Enforced> {
    let spec = args.spec;
    // A dying supervisor takes the sandbox with it.
    arm_parent_death()?;
    // The supervisor writes our id maps (and idmaps the workspace) first;
    // it needs us dumpable for that (our /proc entries stay ours).
    wait_for_go(args.go.as_raw_fd())?;
    // From here on nothing in the sandbox may read or open anything of
    // ours through /proc: not our memory (a copy of the caller's, with its
    // environment), not our status pipe. Non-dumpable makes every
    // /proc/1/{environ,mem,fd,...} access need CAP_SYS_PTRACE over the
    // caller's namespace, which nothing inside has. The caller's
    // environment is scrubbed from our copy as well.
    make_undumpable()?;
    scrub_environment();
    // Become the sandbox user before touching the filesystem: files created
    // from here on need a mapped owner, and a root-invoked sandbox must not
    // act as host root even during set-up. The namespace capabilities stay
    // (securebits) until the drop below. The uid change clears the
    // parent-death signal, so arm it again and make sure the supervisor did
    // not die in between.
    setup::identity::become_user(&spec.identity)?;
    // A credential change resets dumpability to fs.suid_dumpable.
    make_undumpable()?;
    arm_parent_death()?;
    check_parent_alive(args.go.as_raw_fd())?;

    // Filesystem: private tree, tmpfs root, host reachable at /oldroot.
    setup::rootfs::pivot_into_tmpfs()?;
    // Read-only system view and the synthesized /etc files.
    setup::system::bind_system(spec, &args.ro_trees)?;
    setup::system::synthesize_etc(spec)?;
    // /proc needs the host's proc still attached (see procfs).
    setup::procfs::mount_proc()?;
    setup::dev::populate()?;
    // Scratch tmpfs (home, /tmp) before the workspace, which may live
    // under one of them.
    setup::workspace::mount_scratch(spec)?;
    // Toolchain binds and their hides: under the scratch (they may live in
    // a home or /tmp), under the workspace (which may live inside one).
    setup::layered::mount_layered(spec, &args.layered_trees)?;
    setup::workspace::mount_workspace(spec, args.idmapped.as_ref())?;
    // retie's own ledger or state, if they live in the workspace.
    setup::workspace::mask_dirs(spec)?;
    // From here on the host's tree is unreachable.
    setup::rootfs::detach_old_root()?;
    setup::rootfs::seal_root()?;
    std::env::set_current_dir(&spec.workspace)
        .map_err(|e| SetupError::io("workspace", "chdir into the workspace", e))?;

    setup::session::detach(&spec.hostname)?;
    // Network: with NetMode::None the namespace's `lo` stays down, since
    // seccomp refuses every non-unix socket anyway. In the lab modes the
    // network was wired before this process existed (setup::net_lab, run
    // by the supervisor's net stage); init has no capability over it.
    setup::rlimits::apply(&spec.limits)?;
    // Compile the filter while allocation and failure are still cheap.
    let filters = setup::seccomp::compile_all(&spec.net)?;
    setup::caps::drop_all()?;
    let enforced = setup::landlock::restrict(spec, args.kernel_abi)?;
    setup::fds::cloexec_all()?;
    // Last: the seccomp filter (it also sets NO_NEW_PRIVS).
    setup::seccomp::install(&filters)?;
    // Checked, not assumed: the command is forked from us next.
    make_undumpable()?;
    Ok(enforced)
}

/// PR_SET_DUMPABLE 0, then read it back.
fn make_undumpable() -> StepResult {
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integer arguments and only
    // changes this process's dumpable flag.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } < 0 {
        return Err(SetupError::last_os("init", "PR_SET_DUMPABLE"));
    }
    // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
    match unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) } {
        0 => Ok(()),
        v => Err(SetupError {
            step: "init",
            message: format!("the sandbox's init is still dumpable ({v}) after PR_SET_DUMPABLE 0"),
            hint: None,
        }),
    }
}

/// Overwrite the caller's environment strings in our copy of its memory
/// (init is a clone of the supervisor, not an exec of it). The command
/// gets the spec's environment, built before the clone.
fn scrub_environment() {
    extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    // SAFETY: init is single-threaded and nothing reads the environment
    // concurrently. `environ` is a NULL-terminated array of pointers to
    // NUL-terminated strings that we own (inherited from the clone); each
    // string is zeroed within its own strlen, and the array is left in
    // place (every entry becomes the empty string).
    unsafe {
        let mut p = std::ptr::addr_of!(environ).read();
        if p.is_null() {
            return;
        }
        while !(*p).is_null() {
            let s = *p;
            std::ptr::write_bytes(s, 0, libc::strlen(s));
            p = p.add(1);
        }
    }
}

fn arm_parent_death() -> StepResult {
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(SetupError::last_os("init", "PR_SET_PDEATHSIG"));
    }
    Ok(())
}

/// Block until the supervisor says go (one byte) or dies (EOF).
fn wait_for_go(fd: RawFd) -> StepResult {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: reading one byte into a valid buffer.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        if n == 1 {
            return Ok(());
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        exit(EXIT_SANDBOX_FAILED);
    }
}

/// The supervisor keeps its end of the go pipe open while it lives.
fn check_parent_alive(fd: RawFd) -> StepResult {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
        exit(EXIT_SANDBOX_FAILED);
    }
    Ok(())
}

/// Forward signals to the command's process group, reap every child, and
/// exit with the command's status once it has ended.
fn reap(cmd: libc::pid_t, status_fd: RawFd) -> ! {
    // SAFETY: building a sigset from constants.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for s in FORWARDED {
            libc::sigaddset(&mut set, *s);
        }
        set
    };
    loop {
        // SAFETY: `set` is valid; these signals are blocked (the
        // supervisor blocked them before clone), so sigwaitinfo receives
        // them instead of their default actions.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if sig < 0 {
            continue;
        }
        if sig != libc::SIGCHLD {
            // SAFETY: signalling our own child's process group, or the
            // child alone if it has left that group.
            unsafe {
                if libc::kill(-cmd, sig) < 0 {
                    libc::kill(cmd, sig);
                }
            }
            continue;
        }
        loop {
            let mut wstatus = 0;
            // SAFETY: valid out-pointer; WNOHANG never blocks.
            let pid = unsafe { libc::waitpid(-1, &mut wstatus, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == cmd {
                let (report, code) = if libc::WIFSIGNALED(wstatus) {
                    let s = libc::WTERMSIG(wstatus);
                    (
                        Report::Exited {
                            code: None,
                            signal: Some(s),
                        },
                        128 + s,
                    )
                } else {
                    let c = libc::WEXITSTATUS(wstatus);
                    (
                        Report::Exited {
                            code: Some(c),
                            signal: None,
                        },
                        c,
                    )
                };
                let _ = crate::sys::write_all(status_fd, &report.to_line());
                exit(code);
            }
        }
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the process without running the parent's atexit
    // handlers or flushing its inherited stdio buffers.
    unsafe { libc::_exit(code) }
}
