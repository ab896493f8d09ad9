//! The sandbox's init: PID 1 of the new pid namespace.
//!
//! [`main`] is the whole set-up as one recipe, top to bottom in the order
//! the steps run, one submodule per step (everything in this module and
//! below runs in init). Then init forks the command (`crate::command`),
//! forwards signals to it, reaps everything, and exits with the command's
//! status. When init exits the kernel kills whatever is left in the
//! namespace: nothing outlives the command.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::process::{DumpableBehavior, Signal, WaitOptions};

use crate::outcome::EXIT_SANDBOX_FAILED;
use crate::protocol::{Message, Report};
pub mod caps;
pub mod dev;
pub mod fds;
pub mod identity;
pub mod landlock;
pub mod layered;
pub mod netns;
pub mod procfs;
pub mod rlimits;
pub mod rootfs;
pub mod seccomp;
pub mod session;
mod step;
pub mod system;
pub mod terminal;
pub mod workspace;

pub(crate) use step::{
    bind, cpath, make_readonly, mount, mountpoint, owned_tmpfs, MountFlags, SetupError, StepResult,
};

use crate::command::StdioFds;
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
    pub idmapped: Option<crate::host::idmap::IdmapTrees>,
    /// Detached trees for the extra read-only binds, opened by a root
    /// supervisor (the sandbox user may not be able to walk to them).
    pub ro_trees: Vec<OwnedFd>,
    /// Detached trees for the layered binds (same rule as `ro_trees`).
    pub layered_trees: Vec<OwnedFd>,
    /// Cloned without a network namespace: init creates its own first
    /// ([`netns`]). False in the lab modes, whose namespace was wired.
    pub own_network: bool,
    /// The caller's CPUs, when the supervisor started init away from its
    /// own: put back once released (host::placement).
    pub placement: Option<crate::host::placement::Placement>,
}

/// Run as PID 1 and never return.
pub fn main(args: InitArgs<'_>) -> ! {
    let status = args.status.as_fd();
    // First: a task that makes our own network namespace beside the
    // set-up (see netns), joined before the capabilities drop. A failure
    // is reported by set-up.
    let network = if args.own_network {
        // SAFETY: init is single-threaded; the `Pending` it returns owns
        // everything the task reads until it is reaped.
        unsafe { netns::start() }.map(Some)
    } else {
        Ok(None)
    };
    // While the supervisor writes our id maps (init has nothing else to do
    // until then), the work that needs neither them nor the new root: the
    // seccomp filter compiled, and everything the command's child will
    // need built (it shares our memory until it execs and must not
    // allocate), with the signals it must reset (see
    // command::dispositions_to_reset). All of it was on the path from the
    // supervisor's go to the command (issue 10).
    let filters = seccomp::compile_all(&args.spec.net);
    let reset = crate::command::dispositions_to_reset();
    // The slave of the command's pty (Stdio::Terminal), made during set-up;
    // declared first so that it outlives `spawn`, which borrows it.
    let terminal: Option<OwnedFd>;
    let mut spawn =
        crate::command::Spawn::prepare(&args.spec.argv, &args.spec.env, &args.stdio, reset);
    match network.and_then(|net| setup_and_wait(&args, filters, net)) {
        Ok((enforced, tty)) => {
            terminal = tty;
            if let Some(slave) = &terminal {
                spawn.on_terminal(slave, args.stdio.terminal_stderr);
            }
            let ready = Report::Ready {
                landlock_abi: enforced.abi,
                landlock_enforced: enforced.fully,
                seccomp: true,
            };
            let _ = crate::sys::write_all(status, &ready.to_line());
            // The command starts only when the supervisor says so (its
            // caller may still be recording the intent); EOF means the
            // run was called off, and nothing runs.
            if wait_for_go(args.go.as_fd()).is_err() {
                exit(EXIT_SANDBOX_FAILED);
            }
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
    // SAFETY: init is single-threaded. We sleep until the child has exec'd
    // or exited (CLONE_VFORK); it has made itself a group leader by then.
    let pid = match unsafe { spawn.spawn() } {
        Ok((pid, None)) => pid,
        Ok((pid, Some(errno))) => {
            let report = Report::ExecFailed {
                program: spawn.program.clone(),
                errno,
            };
            let _ = crate::sys::write_all(status, &report.to_line());
            pid
        }
        Err(e) => {
            // After Ready the channel's one legal failure is ExecFailed (a
            // SetupFailed here would read as a forged report).
            let report = Report::ExecFailed {
                program: spawn.program.clone(),
                errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
            };
            let _ = crate::sys::write_all(status, &report.to_line());
            exit(EXIT_SANDBOX_FAILED);
        }
    };
    drop(spawn);
    // No slave may stay open in init: the pty's master reads EOF once the
    // sandbox's last process has gone.
    drop(terminal);
    drop(args.stdio);
    reap(pid, status)
}

/// The set-up recipe. Each line is one step, in the order it must run.
fn setup_and_wait(
    args: &InitArgs<'_>,
    filters: StepResult<seccomp::Filters>,
    network: Option<netns::Pending>,
) -> StepResult<(landlock::Enforced, Option<OwnedFd>)> {
    let spec = args.spec;
    // A dying supervisor takes the sandbox with it.
    arm_parent_death()?;
    // The supervisor writes our id maps (and idmaps the workspace) first;
    // it needs us dumpable for that (our /proc entries stay ours).
    wait_for_go(args.go.as_fd())?;
    // The supervisor narrowed our CPUs before that go; everything we
    // start from here on gets the caller's own.
    if let Some(p) = &args.placement {
        p.restore()
            .map_err(|e| SetupError::io("init", "restoring the caller's CPU affinity", e))?;
    }
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
    identity::become_user(&spec.identity)?;
    // A credential change resets dumpability to fs.suid_dumpable.
    make_undumpable()?;
    arm_parent_death()?;
    check_parent_alive(args.go.as_fd())?;

    // Filesystem: private tree, tmpfs root, host reachable at /oldroot.
    rootfs::pivot_into_tmpfs()?;
    // Read-only system view and the synthesized /etc files.
    system::bind_system(spec, &args.ro_trees)?;
    system::synthesize_etc(spec)?;
    // /proc needs the host's proc still attached (see procfs).
    procfs::mount_proc()?;
    dev::populate(&spec.profile.filesystem.shm_size())?;
    // Scratch tmpfs (home, /tmp) before the workspace, which may live
    // under one of them.
    workspace::mount_scratch(spec)?;
    // Toolchain binds and their hides: under the scratch (they may live in
    // a home or /tmp), under the workspace (which may live inside one).
    layered::mount_layered(spec, &args.layered_trees)?;
    workspace::mount_workspace(spec, args.idmapped.as_ref())?;
    // retie's own ledger or state, if they live in the workspace.
    workspace::mask_dirs(spec)?;
    // From here on the host's tree is unreachable.
    rootfs::detach_old_root()?;
    rootfs::seal_root()?;
    std::env::set_current_dir(&spec.workspace)
        .map_err(|e| SetupError::io("workspace", "chdir into the workspace", e))?;

    session::detach(&spec.hostname)?;
    // Network: with NetMode::None the namespace's `lo` stays down, since
    // seccomp refuses every non-unix socket anyway. In the lab modes the
    // network was wired before this process existed (host::net_stage, run
    // by the supervisor's net stage); init has no capability over it.
    rlimits::apply(&spec.limits)?;
    // Made beside the set-up (see `main`): entered while init still has
    // the capability to.
    if let Some(net) = network {
        net.join()?;
    }
    // A proxied network: `lo` up and the proxy's listening socket, made in
    // the namespace just entered and handed to the supervisor (ADR 0310).
    if let crate::spec::NetMode::Proxy(p) = &spec.net {
        netns::hand_out_proxy_socket(p.port, args.go.as_fd())?;
    }
    // Stdio::Terminal: a pty of our own devpts, its master handed to the
    // supervisor (after the proxy socket: the channel's one order) and
    // closed here (ADR 0550). Opened before Landlock and seccomp.
    let terminal = if args.stdio.terminal {
        Some(terminal::hand_out(args.go.as_fd())?)
    } else {
        None
    };
    // Compiled before set-up began (see `main`); a failure is this step's.
    let filters = filters?;
    caps::drop_all()?;
    let enforced = landlock::restrict(spec, args.kernel_abi)?;
    fds::cloexec_all()?;
    // Last: the seccomp filter (it also sets NO_NEW_PRIVS).
    seccomp::install(&filters)?;
    // Checked, not assumed: the command is forked from us next.
    make_undumpable()?;
    Ok((enforced, terminal))
}

/// PR_SET_DUMPABLE 0, then read it back.
fn make_undumpable() -> StepResult {
    rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|e| SetupError::io("init", "PR_SET_DUMPABLE", e.into()))?;
    match rustix::process::dumpable_behavior() {
        Ok(DumpableBehavior::NotDumpable) => Ok(()),
        v => Err(SetupError {
            step: "init",
            message: format!(
                "the sandbox's init is still dumpable ({v:?}) after PR_SET_DUMPABLE 0"
            ),
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
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| SetupError::io("init", "PR_SET_PDEATHSIG", e.into()))
}

/// Block until the supervisor says go (one byte) or dies or calls the run
/// off (EOF): then exit, never returning.
fn wait_for_go(fd: BorrowedFd<'_>) -> StepResult {
    let mut b = [0u8; 1];
    loop {
        match rustix::io::read(fd, &mut b) {
            Ok(1) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            _ => exit(EXIT_SANDBOX_FAILED),
        }
    }
}

/// The supervisor keeps its end of the go pipe open while it lives.
fn check_parent_alive(fd: BorrowedFd<'_>) -> StepResult {
    use rustix::event::{PollFd, PollFlags};
    let mut pfd = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let n = rustix::event::poll(&mut pfd, Some(&now)).unwrap_or(0);
    if n > 0 && pfd[0].revents().intersects(PollFlags::HUP | PollFlags::ERR) {
        exit(EXIT_SANDBOX_FAILED);
    }
    Ok(())
}

/// Forward signals to the command's process group, reap every child, and
/// exit with the command's status once it has ended.
fn reap(cmd: libc::pid_t, status_fd: BorrowedFd<'_>) -> ! {
    let waited = SignalSet::of(FORWARDED, true);
    let cmd_pid = crate::sys::pid(cmd);
    loop {
        let Some(sig) = waited.wait() else { continue };
        if sig != libc::SIGCHLD {
            if let (Some(p), Some(s)) = (cmd_pid, crate::sys::signal(sig)) {
                // The command's group, or the command alone if it has left
                // that group.
                if rustix::process::kill_process_group(p, s).is_err() {
                    let _ = rustix::process::kill_process(p, s);
                }
            }
            continue;
        }
        // wait(), not waitpid(None): rustix maps None to 0, our own group only.
        while let Ok(Some((pid, ws))) = rustix::process::wait(WaitOptions::NOHANG) {
            if pid.as_raw_nonzero().get() != cmd {
                continue;
            }
            let (report, code) = match ws.terminating_signal() {
                Some(s) => (
                    Report::Exited {
                        code: None,
                        signal: Some(s),
                    },
                    128 + s,
                ),
                None => {
                    let c = ws.exit_status().unwrap_or(0);
                    (
                        Report::Exited {
                            code: Some(c),
                            signal: None,
                        },
                        c,
                    )
                }
            };
            // Nothing of the sandbox may run once the supervisor has the
            // report (it returns on it, before this process has exited):
            // end and reap every other process of the namespace first.
            kill_the_rest();
            let _ = crate::sys::write_all(status_fd, &report.to_line());
            // Our exit tears the namespaces down (an RCU grace period for
            // the mount namespace); the supervisor does not wait for it.
            exit(code);
        }
    }
}

/// SIGKILL every process of the sandbox's pid namespace but init, and reap
/// them all. kill(-1) from init reaches exactly those (init itself is
/// spared); a fork racing with it either completes before (the child is
/// killed) or fails (the parent's SIGKILL is pending). Orphans are
/// reparented to init, so ECHILD means no process of the sandbox is left.
fn kill_the_rest() {
    loop {
        // SAFETY: kill takes two integers and touches no memory; pid -1
        // from PID 1 of a pid namespace targets the other processes of
        // that namespace only (all the sandbox's, all signallable by init:
        // same uid, same Landlock domain).
        unsafe { libc::kill(-1, libc::SIGKILL) };
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some(_)) | Err(rustix::io::Errno::INTR) => continue,
            _ => return, // ECHILD: nothing left
        }
    }
}

/// A set of signals that are blocked (the supervisor blocked them before
/// the clone, and init inherits its mask) and so can be waited for.
struct SignalSet(libc::sigset_t);

impl SignalSet {
    fn of(signals: &[libc::c_int], with_sigchld: bool) -> Self {
        // SAFETY: sigemptyset fully initializes the zeroed sigset_t it is
        // given (a plain bit array, for which all-zero is valid);
        // sigaddset only sets bits in it, for valid signal numbers.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in signals {
                libc::sigaddset(&mut set, *s);
            }
            if with_sigchld {
                libc::sigaddset(&mut set, libc::SIGCHLD);
            }
            SignalSet(set)
        }
    }

    /// The next pending signal of the set (None on EINTR).
    fn wait(&self) -> Option<libc::c_int> {
        // SAFETY: `self.0` is an initialized sigset the kernel only reads;
        // the siginfo out-pointer is NULL (allowed).
        let sig = unsafe { libc::sigwaitinfo(&self.0, std::ptr::null_mut()) };
        (sig > 0).then_some(sig)
    }
}

/// End init without running the supervisor's atexit handlers or flushing
/// its inherited stdio buffers (init is a clone of the supervisor).
fn exit(code: i32) -> ! {
    crate::sys::exit_now(code)
}
