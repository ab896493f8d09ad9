//! The supervisor: the host-side half of a sandbox run.
//!
//! [`run`] is one linear function: check, prepare, clone, map, release,
//! watch, report. It must be called from a single-threaded process (the
//! CLI is one; a multi-threaded program uses [`crate::helper`]).

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::time::Instant;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Signal, WaitOptions, WaitStatus};

use super::placement::Placement;
use super::{idmap, net_stage, terminal, userns};
use crate::command::StdioFds;
use crate::error::{Result, RuntimeError};
use crate::init::{self, InitArgs, FORWARDED};
use crate::outcome::{
    Outcome, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SANDBOX_FAILED, EXIT_TIMEOUT,
};
use crate::protocol::{read_channel, Message, Report, MAX_CHANNEL};
use crate::spec::{Interrupt, SandboxSpec, Stdio};
use crate::sys::{self, Forked};

const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP;

/// Run the sandboxed command to completion: [`start`], then
/// [`Started::run`] at once.
pub fn run(spec: &SandboxSpec, stdio: Stdio) -> Result<Outcome> {
    // Nobody would serve the proxy: its socket would take connections
    // that nothing answers. Its caller starts it and takes the socket.
    if let crate::spec::NetMode::Proxy(_) = spec.net {
        return Err(RuntimeError::InvalidSpec(
            "a proxied network needs its caller to serve the proxy: use start() and Started::take_net_listener()".into(),
        ));
    }
    // The caller waits at once: init may start on its CPU.
    start_placed(spec, stdio, false)?.run()
}

/// A sandbox being set up whose command has not started: init does its
/// whole set-up and then waits for [`Started::run`]. Dropping it aborts
/// the run: init is killed and reaped, and the command never starts. A
/// caller does its own work (the chokepoint records the intent durably)
/// while the kernel builds the sandbox, and releases the command only
/// when that work is done.
///
/// Until it is run or dropped, the caller's forwarded signals are blocked
/// (delivered to the sandbox once it runs). Threads the caller starts
/// meanwhile inherit that mask, so a forwarded signal still waits for the
/// supervisor; they must be joined before `run` returns (the mask is
/// restored for the calling thread only) and before another sandbox is
/// started in process (that needs a single thread).
pub struct Started {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    go_w: Option<OwnedFd>,
    status_r: Option<OwnedFd>,
    signals: Option<SignalGuard>,
    timeout: Option<std::time::Duration>,
    interrupt: Interrupt,
    /// A proxied network whose socket has not been taken yet.
    proxy_socket: bool,
    /// [`Stdio::Terminal`]: init hands out a pty's master, relayed.
    terminal: bool,
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.go_w.take().is_some() {
            // Not released: init sees EOF where it waits for the command's
            // go and exits; the kill makes it prompt and covers a set-up
            // step that does not read the pipe.
            let _ = sys::pidfd_send_signal(&self.pidfd, Signal::KILL);
            wait(self.pid);
        }
    }
}

/// Clone the sandbox and let its set-up run; the command waits for
/// [`Started::run`].
pub fn start(spec: &SandboxSpec, stdio: Stdio) -> Result<Started> {
    // The caller works while the sandbox is built: init starts on another
    // CPU (placement).
    start_placed(spec, stdio, true)
}

fn start_placed(spec: &SandboxSpec, stdio: Stdio, place: bool) -> Result<Started> {
    let threads = sys::thread_count().map_err(|e| RuntimeError::host("counting threads", e))?;
    if threads > 1 {
        return Err(RuntimeError::NotSingleThreaded { threads });
    }
    let kernel_abi = crate::preflight::check(&spec.profile, &spec.net)?;
    reap_earlier_runs();

    // Everything the child needs exists before the clone.
    let idmapped = idmap::prepare(spec)?;
    let ro_trees = open_trees(spec, &spec.ro_binds)?;
    let layered_trees = open_trees(spec, &spec.layered_binds)?;
    let (go_r, go_w) = sys::go_channel().map_err(|e| RuntimeError::host("socketpair", e))?;
    let (status_r, status_w) = sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    let stdio_fds = stdio_fds(stdio);
    let terminal = stdio_fds.terminal;
    if spec.identity.idmap_workspace {
        // Root: the child must not carry root's supplementary groups
        // (setgroups is denied inside, so it could not drop them itself).
        // The call is per thread; this process has one (checked above).
        rustix::thread::set_thread_groups(&[])
            .map_err(|e| RuntimeError::host("dropping supplementary groups", e.into()))?;
    }
    let signals = SignalGuard::block()?;

    // Lab modes: the lab's namespaces, opened while we are still ourselves.
    let lab_ns = match spec.net.lab() {
        Some(lab) => Some(net_stage::LabNs::open(lab.keeper_pid)?),
        None => None,
    };

    // Read before the clone (init gets a copy): see placement. Not in the
    // lab modes: the supervisor waits for the net stage, which clones
    // init, and leaves its CPU to them.
    let placement = if place && lab_ns.is_none() {
        Placement::before_clone()
    } else {
        None
    };
    let forked = match &lab_ns {
        // SAFETY: single-threaded (checked above); the child only runs the
        // set-up recipe and then execs or _exits.
        // Without the network namespace: a task of init's makes it beside
        // init's set-up (init::netns, ADR 0415).
        None => unsafe { sys::clone_namespaces(NAMESPACES & !libc::CLONE_NEWNET) }
            .map_err(clone_error)?,
        // SAFETY: as above. The net stage wires the network, clones init
        // (without CLONE_NEWNET: init inherits the wired namespace) and
        // writes its id maps itself.
        Some(ns) => unsafe {
            net_stage::clone_into_lab(
                ns,
                &spec.net,
                &spec.identity,
                NAMESPACES & !libc::CLONE_NEWNET,
            )
        }?,
    };
    let own_network = lab_ns.is_none();
    drop(lab_ns);
    let (pid, pidfd) = match forked {
        Forked::Child => {
            drop(go_w);
            drop(status_r);
            init::main(InitArgs {
                spec,
                kernel_abi,
                go: go_r,
                status: status_w,
                stdio: stdio_fds,
                idmapped,
                ro_trees,
                layered_trees,
                own_network,
                placement,
            })
        }
        Forked::Parent { pid, pidfd } => (pid, pidfd),
    };
    if let Some(p) = &placement {
        p.move_child(pid);
    }
    drop(go_r);
    drop(status_w);

    // Id maps, then the idmapped workspace, then release the child.
    let maps = if spec.net.lab().is_some() {
        Ok(()) // written by the net stage, from the lab's user namespace
    } else {
        userns::write_maps(pid, &spec.identity)
    };
    let prepared = maps.and_then(|()| match &idmapped {
        Some(trees) => idmap::apply(trees, pid),
        None => Ok(()),
    });
    drop(idmapped);
    drop(ro_trees);
    drop(layered_trees);
    if let Err(e) = prepared {
        let _ = sys::pidfd_send_signal(&pidfd, Signal::KILL);
        wait(pid);
        return Err(e);
    }
    let started = Started {
        pid,
        pidfd,
        go_w: Some(go_w),
        status_r: Some(status_r),
        signals: Some(signals),
        timeout: spec.timeout,
        interrupt: spec.interrupt,
        proxy_socket: matches!(spec.net, crate::spec::NetMode::Proxy(_)),
        terminal,
    };
    if let Some(go) = &started.go_w {
        // Set-up may begin; the command waits for a second byte.
        sys::send_all(go.as_fd(), b"G")
            .map_err(|e| RuntimeError::host("releasing the sandbox's set-up", e))?;
    }
    Ok(started)
}

impl Started {
    /// A proxied network's listening socket (`NetMode::Proxy`), made by
    /// init in the sandbox's namespace; waits for init to hand it out.
    /// `Ok(None)` in the other modes, and when init ended first (its
    /// set-up failed: [`Started::run`] reports why). Taken once.
    pub fn take_net_listener(&mut self) -> Result<Option<OwnedFd>> {
        if !std::mem::take(&mut self.proxy_socket) {
            return Ok(None);
        }
        let Some(go) = &self.go_w else {
            return Ok(None);
        };
        recv_one(go.as_fd(), b'L', "proxy socket")
    }

    /// [`Stdio::Terminal`]: the pty's master, which init hands out after
    /// the proxy socket (received and closed here if the caller did not
    /// take it: the channel's one order), and the relay begun on it.
    /// `Ok(None)` when init ended first (its report says why).
    fn begin_terminal(&mut self, go: &OwnedFd) -> Result<Option<terminal::Relay>> {
        if std::mem::take(&mut self.proxy_socket) {
            drop(recv_one(go.as_fd(), b'L', "proxy socket")?);
        }
        match recv_one(go.as_fd(), init::terminal::TAG, "terminal")? {
            Some(master) => terminal::Relay::begin(master).map(Some),
            None => Ok(None),
        }
    }

    /// Start the command (init may still be setting up: it goes on to the
    /// command when done) and watch it to the end.
    pub fn run(self) -> Result<Outcome> {
        self.run_while(|| {})
    }

    /// [`Started::run`], doing `meanwhile` once the command has been
    /// released and before watching it: the caller's housekeeping (the
    /// chokepoint sweeps the run directories of earlier runs) costs
    /// nothing when the command runs longer than it. The deadline counts
    /// from the release; a signal that arrives meanwhile is forwarded as
    /// soon as `meanwhile` returns (it stays blocked until then), so it
    /// must be short and must not wait on anything the command does.
    pub fn run_while(mut self, meanwhile: impl FnOnce()) -> Result<Outcome> {
        let (pid, go_w) = match self.go_w.take() {
            Some(g) => (self.pid, g),
            None => return Err(RuntimeError::Helper("a sandbox runs once".into())),
        };
        // A signal to stop that arrived while the sandbox was built (its
        // caller was recording the intent; the signals were blocked) calls
        // the run off: the command never starts.
        // A window resize is no reason to stop (the command reads the
        // size when it starts, and a terminal's is copied then).
        let early = loop {
            match self.signals.as_ref().and_then(SignalGuard::read) {
                Some(libc::SIGWINCH) => continue,
                other => break other,
            }
        };
        if let Some(sig) = early {
            let _ = sys::pidfd_send_signal(&self.pidfd, Signal::KILL);
            wait(pid);
            return Err(RuntimeError::Cancelled { signal: sig });
        }
        // The command's terminal: waits for init's set-up to reach it
        // (the command waits for our go anyway). From here on the caller's
        // terminal is raw until `relay` is dropped, on every way out.
        let mut relay = None;
        if self.terminal {
            match self.begin_terminal(&go_w) {
                Ok(r) => relay = r,
                Err(e) => {
                    let _ = sys::pidfd_send_signal(&self.pidfd, Signal::KILL);
                    wait(pid);
                    return Err(e);
                }
            }
        }
        let started = Instant::now();
        match sys::send_all(go_w.as_fd(), b"X") {
            Ok(()) => {}
            // Init is gone: its set-up failed, and its report of why is
            // in the status pipe, which `finish` reads.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) => {
                let _ = sys::pidfd_send_signal(&self.pidfd, Signal::KILL);
                wait(pid);
                return Err(RuntimeError::host("starting the sandboxed command", e));
            }
        }
        meanwhile();
        let pidfd = &self.pidfd;
        let (Some(status_r), Some(signals)) = (self.status_r.take(), self.signals.take()) else {
            return Err(RuntimeError::Helper("a sandbox runs once".into()));
        };
        finish(
            pid,
            pidfd,
            go_w,
            status_r,
            signals,
            (self.timeout, self.interrupt),
            (started, relay.as_mut()),
        )
    }
}

fn finish(
    pid: libc::pid_t,
    pidfd: &OwnedFd,
    go_w: OwnedFd,
    status_r: OwnedFd,
    signals: SignalGuard,
    (timeout, interrupt): (Option<std::time::Duration>, Interrupt),
    (started, mut relay): (Instant, Option<&mut terminal::Relay>),
) -> Result<Outcome> {
    // Watch: the child's exit, its reports, forwarded signals, the
    // deadline. A timeout past what an Instant can hold is no deadline.
    // Once init reports the command's end (after it has killed and reaped
    // everything else in the sandbox), the run is over: init's own exit,
    // the namespaces' teardown, happens off our path and is reaped later.
    let deadline = timeout.and_then(|t| started.checked_add(t));
    let mut timed_out = false;
    let mut interrupted = false;
    let mut stop_signal = None;
    let mut buf = Vec::new();
    let mut reported_end = false;
    let mut status_eof = false;
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    timed_out = true;
                    let _ = sys::pidfd_send_signal(pidfd, Signal::KILL);
                    break;
                }
                Some(poll_timeout(left))
            }
        };
        // After EOF the status pipe stays readable: leave it out.
        let status_events = if status_eof {
            PollFlags::empty()
        } else {
            PollFlags::IN
        };
        let stdin = rustix::stdio::stdin();
        let mut fds = vec![
            PollFd::new(pidfd, PollFlags::IN),
            PollFd::new(&signals.fd, PollFlags::IN),
            PollFd::new(&status_r, status_events),
        ];
        // The command's terminal: the caller's typing, the pty's output.
        // A side with nothing to wait for is left out (poll would still
        // report its hang-up, again and again).
        let (mut typed_at, mut output_at) = (None, None);
        if let Some(r) = &relay {
            if !r.stdin_events().is_empty() {
                typed_at = Some(fds.len());
                fds.push(PollFd::from_borrowed_fd(stdin, r.stdin_events()));
            }
            if !r.master_events().is_empty() {
                output_at = Some(fds.len());
                fds.push(PollFd::new(r.master(), r.master_events()));
            }
        }
        if rustix::event::poll(&mut fds, timeout.as_ref()).is_err() {
            continue; // EINTR
        }
        let revents = |i: usize| fds.get(i).map_or(PollFlags::empty(), PollFd::revents);
        let (child_ended, signalled, reported) = (
            revents(0).contains(PollFlags::IN),
            revents(1).contains(PollFlags::IN),
            !status_eof && revents(2).intersects(PollFlags::IN | PollFlags::HUP),
        );
        let (typed, output) = (
            typed_at.map_or(PollFlags::empty(), revents),
            output_at.map_or(PollFlags::empty(), revents),
        );
        drop(fds);
        if let Some(r) = relay.as_deref_mut() {
            // A Ctrl-C typed to the command: as a SIGINT to retie was.
            let typed_stop = r.on_stdin(typed);
            if stop_signal.is_none() {
                stop_signal = typed_stop;
            }
            r.on_master(output);
        }
        if signalled {
            if let Some(sig) = signals.read().and_then(sys::signal) {
                if let (Some(r), Signal::WINCH) = (relay.as_deref(), sig) {
                    // The pty's size follows the caller's; the kernel
                    // signals the pty's foreground job itself.
                    r.resize();
                    continue;
                }
                if sig == Signal::INT && interrupt == Interrupt::Kill {
                    // init's death makes the kernel kill everything in its
                    // pid namespace; reaping init (below) waits for that.
                    interrupted = true;
                    let _ = sys::pidfd_send_signal(pidfd, Signal::KILL);
                    break;
                }
                if stop_signal.is_none()
                    && [Signal::INT, Signal::TERM, Signal::HUP, Signal::QUIT].contains(&sig)
                {
                    stop_signal = Some(sig.as_raw());
                }
                let _ = sys::pidfd_send_signal(pidfd, sig);
            }
        }
        if reported {
            let mut chunk = [0u8; 4096];
            match rustix::io::read(&status_r, &mut chunk) {
                Ok(0) => status_eof = true,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
            if buf.len() > MAX_CHANNEL {
                // A flood init never writes: stop reading, end the
                // sandbox; the strict parse below refuses the channel.
                let _ = sys::pidfd_send_signal(pidfd, Signal::KILL);
                break;
            }
            if ends_the_run(&buf) {
                reported_end = true;
                break;
            }
        }
        if child_ended {
            break;
        }
    }
    // The command's last output, still in the pty.
    if let Some(r) = relay {
        r.drain();
    }
    let init_status = if reported_end {
        leave_to_reap(pid);
        None
    } else {
        let st = wait(pid);
        // init is gone: the rest of the channel is in the pipe.
        if buf.len() <= MAX_CHANNEL {
            let rest = read_channel(status_r).unwrap_or_default();
            buf.extend_from_slice(&rest);
        }
        st
    };
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    drop(go_w);
    drop(signals);

    // Only init and the command's pre-exec child can reach this pipe; a
    // report that breaks the protocol means something else did, and nothing
    // it says (a "fix" to run, an exit code) is believed.
    let reports = Report::parse_strict(&buf).map_err(|why| RuntimeError::Channel { why })?;
    let mut ready = None;
    let mut ended = None;
    for r in reports {
        match r {
            Report::SetupFailed {
                step,
                message,
                hint,
            } => {
                return Err(RuntimeError::Setup {
                    step,
                    message,
                    hint,
                })
            }
            Report::ExecFailed { program, errno } => {
                let exit_code = if errno == libc::ENOENT || errno == libc::ENOTDIR {
                    EXIT_NOT_FOUND
                } else {
                    EXIT_NOT_EXECUTABLE
                };
                let reason = match errno {
                    libc::ENOENT | libc::ENOTDIR => {
                        "not found (the sandbox sees the profile's system paths and the workspace only)".to_string()
                    }
                    e => std::io::Error::from_raw_os_error(e).to_string(),
                };
                return Err(RuntimeError::Exec {
                    program,
                    reason,
                    exit_code,
                });
            }
            Report::Ready {
                landlock_abi,
                landlock_enforced,
                seccomp,
            } => ready = Some((landlock_abi, landlock_enforced, seccomp)),
            Report::Exited { code, signal } => ended = Some((code, signal)),
        }
    }
    let (landlock_abi, landlock_enforced, seccomp) = match ready {
        Some(r) => r,
        None if timed_out || interrupted => (0, false, false),
        None => {
            return Err(RuntimeError::Helper(format!(
                "the sandbox ended before finishing its set-up (init status {:#x})",
                init_status.map_or(-1, WaitStatus::as_raw)
            )))
        }
    };
    let (exit_code, signal) = if timed_out {
        (EXIT_TIMEOUT, Some(libc::SIGKILL))
    } else if interrupted {
        (128 + libc::SIGKILL, Some(libc::SIGKILL))
    } else {
        match ended {
            Some((_, Some(s))) => (128 + s, Some(s)),
            Some((Some(c), None)) => (c, None),
            _ => match init_status {
                Some(st) => match st.terminating_signal() {
                    Some(s) => (128 + s, Some(s)),
                    None => (st.exit_status().unwrap_or(0), None),
                },
                None => (EXIT_SANDBOX_FAILED, None),
            },
        }
    };
    Ok(Outcome {
        exit_code,
        signal,
        timed_out,
        interrupted,
        stop_signal,
        duration_ms,
        landlock_abi,
        landlock_enforced,
        seccomp,
        helper_max_rss_kib: max_rss_kib(),
    })
}

/// Invoked as root, the sandbox user may not be able to walk to a bind's
/// source (root's home is mode 700): the supervisor opens each one as a
/// detached tree while it is still root, and init attaches it.
fn open_trees(spec: &SandboxSpec, binds: &[crate::spec::RoBind]) -> Result<Vec<OwnedFd>> {
    if !spec.identity.idmap_workspace {
        return Ok(Vec::new());
    }
    binds
        .iter()
        .map(|b| {
            sys::open_tree_clone(&crate::init::cpath(&b.host))
                .map_err(|e| RuntimeError::host(format!("open_tree {}", b.host.display()), e))
        })
        .collect()
}

/// One descriptor init hands out on the go channel with `tag` (`Ok(None)`:
/// init ended first). Another tag, or none with it, breaks the channel's
/// one order: `RuntimeError::Channel`.
fn recv_one(go: std::os::fd::BorrowedFd<'_>, tag: u8, what: &str) -> Result<Option<OwnedFd>> {
    let fds = sys::recv_fds(go, tag).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => RuntimeError::Channel {
            why: format!("init's {what} message: {e}"),
        },
        _ => RuntimeError::host(format!("receiving the {what}"), e),
    })?;
    // Init sends exactly one; any other is closed here.
    Ok(fds.and_then(|f| f.into_iter().next()))
}

fn clone_error(e: std::io::Error) -> RuntimeError {
    let fix = crate::preflight::userns_fix()
        .unwrap_or_else(|| "check that unprivileged user namespaces are enabled (sysctl user.max_user_namespaces > 0)".into());
    RuntimeError::Unsupported {
        problem: format!("cannot create the sandbox's namespaces: {e}"),
        fix,
    }
}

/// Whether the channel so far ends with init's `Exited` report, on a
/// complete line (the last report init sends).
fn ends_the_run(buf: &[u8]) -> bool {
    let Some(body) = buf.strip_suffix(b"\n") else {
        return false;
    };
    let last = body.rsplit(|b| *b == b'\n').next().unwrap_or(body);
    matches!(
        serde_json::from_slice::<Report>(last),
        Ok(Report::Exited { .. })
    )
}

/// Inits that reported their command's end but had not exited yet: our
/// children, not reaped, so their pids cannot be reused. Reaped (without
/// waiting) at the start of the next run; a process that runs once leaves
/// them to whoever inherits them.
static UNREAPED: std::sync::Mutex<Vec<libc::pid_t>> = std::sync::Mutex::new(Vec::new());

fn leave_to_reap(pid: libc::pid_t) {
    if let Ok(mut v) = UNREAPED.lock() {
        v.push(pid);
    }
}

/// The inits of this process's earlier runs that have not exited yet
/// (reaping those that have). An init that reported its command's end is
/// left to exit on its own, its namespaces' teardown off the caller's
/// path; the workspace overlay is unmounted only once it has exited.
pub fn earlier_runs() -> Vec<libc::pid_t> {
    reap_earlier_runs();
    UNREAPED.lock().map(|v| v.clone()).unwrap_or_default()
}

/// Reap the inits of earlier runs that have exited by now.
fn reap_earlier_runs() {
    if let Ok(mut v) = UNREAPED.lock() {
        v.retain(|p| {
            matches!(
                rustix::process::waitpid(sys::pid(*p), WaitOptions::NOHANG),
                Ok(None)
            )
        });
    }
}

/// Reap `pid` (our child, whose exit signal is SIGCHLD), returning its
/// wait status (None if it was not ours to reap).
fn wait(pid: libc::pid_t) -> Option<WaitStatus> {
    loop {
        match rustix::process::waitpid(sys::pid(pid), WaitOptions::empty()) {
            Ok(Some((_, status))) => return Some(status),
            Err(rustix::io::Errno::INTR) => continue,
            _ => return None,
        }
    }
}

fn stdio_fds(stdio: Stdio) -> StdioFds {
    match stdio {
        Stdio::Inherit => StdioFds::default(),
        Stdio::Terminal => StdioFds {
            terminal: true,
            // The command's stderr is the pty too when the caller's is a
            // terminal; else it stays the caller's fd 2 (a `2>file`).
            terminal_stderr: rustix::termios::isatty(rustix::stdio::stderr()),
            ..StdioFds::default()
        },
        Stdio::Fds {
            stdin,
            stdout,
            stderr,
        } => {
            let fd = |o: Option<OwnedFd>, write: bool| -> Option<OwnedFd> {
                o.or_else(|| {
                    std::fs::OpenOptions::new()
                        .read(!write)
                        .write(write)
                        .open("/dev/null")
                        .ok()
                        .map(OwnedFd::from)
                })
            };
            StdioFds {
                stdin: fd(stdin, false),
                stdout: fd(stdout, true),
                stderr: fd(stderr, true),
                ..StdioFds::default()
            }
        }
    }
}

/// Peak RSS of this process's current image (VmHWM). getrusage's
/// ru_maxrss would also count the image this process replaced with exec
/// (a vfork-spawning parent's), which is not ours.
fn max_rss_kib() -> i64 {
    sys::read_proc("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(-1)
}

/// Blocks the forwarded signals (and SIGCHLD) for the duration of a run,
/// delivering them through a signalfd; restores the old mask on drop. The
/// child inherits the blocked mask, which its init relies on.
struct SignalGuard {
    fd: OwnedFd,
    old: libc::sigset_t,
}

impl SignalGuard {
    fn block() -> Result<Self> {
        // SAFETY: sigemptyset fully initializes the zeroed sigset_t it is
        // given (a bit array, all-zero is valid) and sigaddset only sets
        // bits of valid signal numbers. sigprocmask changes the calling
        // thread's mask, which is the process's: `run` checked that this
        // process has one thread. The kernel reads `set`/`fdset` and
        // writes `old`, all live locals. signalfd returns a fresh fd (or
        // -1, checked) that nothing else owns, taken over exactly once.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in FORWARDED {
                libc::sigaddset(&mut set, *s);
            }
            let fdset = set;
            libc::sigaddset(&mut set, libc::SIGCHLD);
            let mut old: libc::sigset_t = std::mem::zeroed();
            if libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old) < 0 {
                return Err(RuntimeError::last_os("blocking signals"));
            }
            let fd = libc::signalfd(-1, &fdset, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                let e = RuntimeError::last_os("signalfd");
                libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                return Err(e);
            }
            Ok(SignalGuard {
                fd: OwnedFd::from_raw_fd(fd),
                old,
            })
        }
    }

    /// The next forwarded signal: one `struct signalfd_siginfo` (128
    /// bytes), whose first field is `u32 ssi_signo`.
    fn read(&self) -> Option<libc::c_int> {
        let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
        let n = rustix::io::read(&self.fd, &mut info).ok()?;
        let signo: [u8; 4] = info.get(..4)?.try_into().ok()?;
        (n == info.len())
            .then(|| libc::c_int::try_from(u32::from_ne_bytes(signo)).ok())
            .flatten()
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        // SAFETY: `self.old` was filled by sigprocmask in `block`; the
        // kernel only reads it, and the mask is this single thread's.
        unsafe { libc::sigprocmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// poll's timeout for a wait of `left`, +1 ms so the loop never wakes
/// just before the deadline. rustix passes a timespec (ppoll), so no wait
/// is cut short; a wait past what a timespec holds is capped there.
fn poll_timeout(left: std::time::Duration) -> rustix::event::Timespec {
    let left = left.saturating_add(std::time::Duration::from_millis(1));
    rustix::event::Timespec {
        tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(left.subsec_nanos()),
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::poll_timeout;
    use std::time::Duration;

    /// A timeout of 24.8 days or more overflowed `as i32 + 1` (a negative
    /// poll timeout waits forever).
    #[test]
    fn long_timeouts_stay_positive() {
        let t = poll_timeout(Duration::from_millis(5));
        assert_eq!((t.tv_sec, t.tv_nsec), (0, 6_000_000));
        for days in [24, 25, 30, 365 * 100] {
            let t = poll_timeout(Duration::from_secs(days * 86_400));
            assert!(
                t.tv_sec >= i64::try_from(days * 86_400).unwrap_or(0),
                "{days} days"
            );
        }
        let t = poll_timeout(Duration::MAX);
        assert!(t.tv_sec > 0 && t.tv_nsec >= 0);
    }
}
