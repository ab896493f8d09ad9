//! The helper process: how a multi-threaded program runs a sandbox.
//!
//! Namespaces cannot be created from a multi-threaded process, so such a
//! caller spawns `retie __sandbox-helper` (any binary that calls
//! [`serve`]). The protocol:
//! - the request is the spec itself ([`SpecWire`], JSON), written by the
//!   caller on a pipe the helper reads on fd 4 (`--request-fd`) until EOF,
//!   before anything runs; the helper derives the identity from its own
//!   credentials and checks the rest again (see [`SpecWire`]);
//! - the command's stdin, stdout and stderr are the helper's fds 0, 1
//!   and 2, which the caller chooses ([`run_via_helper_with`]; a
//!   [`Stdio::Fds`] entry of `None` is /dev/null, as in process);
//! - the helper is single-threaded, runs [`crate::host::supervisor::run`], and
//!   writes one [`Reply`] as JSON on fd 3 (`--reply-fd`): the [`Outcome`],
//!   or the [`RuntimeError`] itself (typed, with its exit code, step and
//!   hint), so the caller gets exactly what an in-process run returns;
//! - a proxied network (`NetMode::Proxy`, ADR 0310): the caller shuts its
//!   side of the request socket for writing instead of closing it; the
//!   helper starts the sandbox and sends back on that socket one byte `L`
//!   with two descriptors as `SCM_RIGHTS`: the listening socket init made,
//!   and one end of a fresh socket pair on which the caller answers `S`
//!   once it serves the listener. The helper releases the command only on
//!   that `S`; EOF instead (the caller failed or died): the sandbox is
//!   dropped and the command never runs ([`run_via_helper_serving`],
//!   ADR 0313).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};
use crate::outcome::{Outcome, EXIT_SANDBOX_FAILED};
use crate::spec::{SandboxSpec, SpecWire, Stdio};

/// Where the helper reads the request.
const REQUEST_FD: i32 = 4;
/// Where the helper writes its reply.
const REPLY_FD: i32 = 3;

/// What a helper is asked to run: the spec's own data.
pub type Request = SpecWire;

/// The helper's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Reply {
    /// The command ran (whatever its exit code).
    Ok { outcome: Outcome },
    /// The sandbox failed, or the command could not be executed.
    Err { error: RuntimeError },
}

/// The helper to spawn for a caller whose own binary is `exe` (retie): the
/// small `retie-sandbox-helper` built beside it when there is one (a start
/// of that image costs less, see ADR 0006), else `exe` itself. Both take
/// the same arguments.
pub fn beside(exe: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let small = exe.with_file_name(SMALL_HELPER);
    match std::fs::metadata(&small) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => small,
        _ => exe.to_path_buf(),
    }
}

/// The file name of the helper alone (`src/bin/retie-sandbox-helper.rs`
/// of the root package).
pub const SMALL_HELPER: &str = "retie-sandbox-helper";

/// Run `spec` through a helper process (`helper_exe __sandbox-helper`),
/// the command's stdio inherited from the caller. Safe to call from any
/// thread of any process.
pub fn run_via_helper(helper_exe: &Path, spec: &SandboxSpec) -> Result<Outcome> {
    run_via_helper_with(helper_exe, spec, Stdio::Inherit)
}

/// Run `spec` through a helper process with the command's stdio chosen as
/// for an in-process run: [`Stdio::Inherit`] passes the caller's fds 0-2,
/// [`Stdio::Fds`] the given descriptors (`None` = /dev/null). Returns what
/// [`crate::run`] would: the outcome, or the same typed error.
pub fn run_via_helper_with(helper_exe: &Path, spec: &SandboxSpec, stdio: Stdio) -> Result<Outcome> {
    if let crate::spec::NetMode::Proxy(_) = spec.net {
        return Err(RuntimeError::InvalidSpec(
            "a proxied network needs its caller to serve the proxy: use run_via_helper_serving()"
                .into(),
        ));
    }
    via_helper(helper_exe, spec, stdio, None)
}

/// What serves a proxied sandbox's listening socket
/// ([`run_via_helper_serving`]): `Err` says why it could not.
pub type Serve<'a> = &'a mut dyn FnMut(OwnedFd) -> std::result::Result<(), String>;

/// [`run_via_helper_with`] for a spec with a proxied network: the helper
/// hands the sandbox's listening socket back and `serve` is given it
/// (while the command waits); the command is released only when `serve`
/// returned `Ok`. When it fails, the helper aborts the sandbox and the
/// run is an error naming why; when the sandbox's set-up failed first,
/// `serve` is never called and the error is the set-up's.
pub fn run_via_helper_serving(
    helper_exe: &Path,
    spec: &SandboxSpec,
    stdio: Stdio,
    serve: Serve<'_>,
) -> Result<Outcome> {
    via_helper(helper_exe, spec, stdio, Some(serve))
}

fn via_helper(
    helper_exe: &Path,
    spec: &SandboxSpec,
    stdio: Stdio,
    serve: Option<Serve<'_>>,
) -> Result<Outcome> {
    // The helper serves the agent's commands, which never get a terminal;
    // the relay lives in an in-process supervisor only (ADR 0550).
    if let Stdio::Terminal = stdio {
        return Err(RuntimeError::InvalidSpec(
            "a terminal is relayed by an in-process supervisor only: use run() or start()".into(),
        ));
    }
    let request = serde_json::to_vec(&Request::from(spec))
        .map_err(|e| RuntimeError::Helper(format!("encoding the request: {e}")))?;
    let (reply_r, reply_w) =
        crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    // A socket pair, written with MSG_NOSIGNAL: a helper that died at
    // once must not raise SIGPIPE in a caller that keeps its default.
    let (request_r, request_w) =
        crate::sys::go_channel().map_err(|e| RuntimeError::host("socketpair", e))?;
    let (w, r) = (reply_w.as_raw_fd(), request_r.as_raw_fd());
    let mut cmd = Command::new(helper_exe);
    cmd.arg("__sandbox-helper")
        .arg("--reply-fd")
        .arg(REPLY_FD.to_string())
        .arg("--request-fd")
        .arg(REQUEST_FD.to_string());
    if let Stdio::Fds {
        stdin,
        stdout,
        stderr,
    } = stdio
    {
        let pick = |fd: Option<OwnedFd>| fd.map_or_else(std::process::Stdio::null, Into::into);
        cmd.stdin(pick(stdin))
            .stdout(pick(stdout))
            .stderr(pick(stderr));
    }
    // SAFETY: the closure runs in the forked child before exec and calls
    // only fcntl and dup2, which are async-signal-safe and allocate
    // nothing. `w` and `r` stay open in the parent until spawn returns.
    // Both are first copied above 9, so moving one to 3 or 4 can never
    // overwrite the other before it moves, and dup2 onto a different
    // number always clears close-on-exec on the copy the helper keeps.
    unsafe {
        cmd.pre_exec(move || {
            let high_w = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
            let high_r = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
            if high_w < 0
                || high_r < 0
                || libc::dup2(high_w, REPLY_FD) < 0
                || libc::dup2(high_r, REQUEST_FD) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| RuntimeError::host(format!("spawning {}", helper_exe.display()), e))?;
    drop(cmd);
    drop(reply_w);
    drop(request_r);
    // The helper reads the whole request before it does anything else, so
    // this write cannot wait on the reply. A helper that died at once
    // leaves a broken pipe: its (missing) reply tells the story.
    let _ = crate::sys::send_all(std::os::fd::AsFd::as_fd(&request_w), &request);
    let mut serve_failed = None;
    if let Some(serve) = serve {
        // End of request; the socket stays open for the listener and
        // the go-ahead.
        let _ = rustix::net::shutdown(&request_w, rustix::net::Shutdown::Write);
        match crate::sys::recv_fds(std::os::fd::AsFd::as_fd(&request_w), b'L') {
            // The helper ended first (its set-up failed): its reply says why.
            Ok(None) => {}
            Ok(Some(fds)) if fds.len() == 2 => {
                let mut fds = fds.into_iter();
                let (listener, go) = (fds.next(), fds.next());
                if let (Some(listener), Some(go)) = (listener, go) {
                    match serve(listener) {
                        // Release the command. A helper gone meanwhile
                        // has its own reply.
                        Ok(()) => {
                            let _ = crate::sys::send_all(std::os::fd::AsFd::as_fd(&go), b"S");
                        }
                        // `go` closes unanswered: the helper aborts.
                        Err(why) => serve_failed = Some(why),
                    }
                }
            }
            Ok(Some(fds)) => {
                serve_failed = Some(format!(
                    "the helper sent {} descriptors where 2 were due",
                    fds.len()
                ))
            }
            Err(e) => serve_failed = Some(format!("receiving the sandbox's listening socket: {e}")),
        }
    }
    // Closed with no go-ahead after a failure: the helper aborts the
    // sandbox and the command never runs.
    drop(request_w);
    let mut reply = String::new();
    std::fs::File::from(reply_r)
        .read_to_string(&mut reply)
        .map_err(|e| RuntimeError::host("reading the helper's reply", e))?;
    let status = child
        .wait()
        .map_err(|e| RuntimeError::host("waiting for the helper", e))?;
    if let Some(why) = serve_failed {
        return Err(RuntimeError::Helper(format!(
            "the proxied network could not be served, so the command never ran: {why}"
        )));
    }
    match serde_json::from_str::<Reply>(reply.trim()) {
        Ok(Reply::Ok { outcome }) => Ok(outcome),
        Ok(Reply::Err { error }) => Err(error),
        Err(e) => Err(RuntimeError::Helper(format!(
            "no valid reply ({e}); helper exited with {status}"
        ))),
    }
}

/// One captured stream of [`run_via_helper_captured`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first `cap` bytes the command wrote.
    pub bytes: Vec<u8>,
    /// Every byte the command wrote, kept or not.
    pub total: u64,
    /// True when bytes beyond the cap were dropped.
    pub truncated: bool,
}

/// What [`run_via_helper_captured`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedRun {
    pub outcome: Outcome,
    pub stdout: Captured,
    pub stderr: Captured,
}

/// Run `spec` through a helper with stdin on /dev/null and stdout and
/// stderr captured, each up to `cap_bytes`: bytes beyond the cap are read
/// (the command never blocks on a full pipe), counted and dropped, and the
/// stream is marked truncated. Both streams are drained concurrently, on
/// two threads of their own, while the helper runs.
pub fn run_via_helper_captured(
    helper_exe: &Path,
    spec: &SandboxSpec,
    cap_bytes: usize,
) -> Result<CapturedRun> {
    let (out_r, out_w) = crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    let (err_r, err_w) = crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    let out = std::thread::spawn(move || drain(out_r, cap_bytes));
    let err = std::thread::spawn(move || drain(err_r, cap_bytes));
    // The write ends are moved into the helper's Command and closed in
    // this process when the run returns, so both readers reach EOF.
    let ran = run_via_helper_with(
        helper_exe,
        spec,
        Stdio::Fds {
            stdin: None,
            stdout: Some(out_w),
            stderr: Some(err_w),
        },
    );
    let join = |h: std::thread::JoinHandle<std::io::Result<Captured>>, what: &str| {
        h.join()
            .map_err(|_| RuntimeError::Helper(format!("the {what} reader panicked")))?
            .map_err(|e| RuntimeError::host(format!("reading the command's {what}"), e))
    };
    let stdout = join(out, "stdout");
    let stderr = join(err, "stderr");
    let outcome = ran?;
    Ok(CapturedRun {
        outcome,
        stdout: stdout?,
        stderr: stderr?,
    })
}

/// Read `fd` to EOF, keeping the first `cap` bytes.
fn drain(fd: OwnedFd, cap: usize) -> std::io::Result<Captured> {
    let mut file = std::fs::File::from(fd);
    let mut got = Captured::default();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => return Ok(got),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        got.total = got.total.saturating_add(n as u64);
        let room = cap.saturating_sub(got.bytes.len());
        got.bytes.extend_from_slice(&chunk[..n.min(room)]);
        if n > room {
            got.truncated = true;
        }
    }
}

/// Whether an fd handed over by number (on a command line) can be used:
/// above stdio and open (`fcntl(F_GETFD)`).
pub fn check_passed_fd(fd: i32) -> std::result::Result<(), String> {
    if fd <= 2 {
        return Err("must be a descriptor above 2 (0-2 are stdio)".into());
    }
    // SAFETY: F_GETFD only reads the descriptor table entry's flags; for a
    // number that is not an open fd the kernel answers EBADF. No memory is
    // passed and no descriptor changes owner.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!(
            "is not an open file descriptor ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The helper's command line, one definition for both binaries that take
/// it: `retie __sandbox-helper ARGS` and `retie-sandbox-helper
/// [__sandbox-helper] ARGS` (ADR 0520).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperArgs {
    /// `--reply-fd N [--request-fd M]`: serve one request, read from M
    /// (default 4) to EOF, the reply written on N.
    Serve { reply_fd: i32, request_fd: i32 },
    /// `--print-request --workspace DIR -- CMD...`: print the request a
    /// caller would send for CMD in DIR (the built-in profile, the
    /// workspace bound directly) and exit: for the benchmarks, which
    /// drive the helper without a Rust caller.
    PrintRequest {
        workspace: std::path::PathBuf,
        command: Vec<String>,
    },
}

/// What the helper binaries print under an argument error.
pub const HELPER_USAGE: &str = "usage: [__sandbox-helper] --reply-fd N [--request-fd M]\n       [__sandbox-helper] --print-request --workspace DIR -- CMD...";

impl HelperArgs {
    /// Read the helper's arguments (after the program name; a leading
    /// `__sandbox-helper` is skipped). Flags take `--flag V` or
    /// `--flag=V`.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
    ) -> std::result::Result<HelperArgs, String> {
        let mut args = args.into_iter().peekable();
        if args.peek().map(String::as_str) == Some("__sandbox-helper") {
            args.next();
        }
        let (mut reply, mut request, mut print, mut workspace) = (None, None, false, None);
        let mut command = None;
        while let Some(arg) = args.next() {
            if arg == "--" {
                command = Some(args.by_ref().collect::<Vec<_>>());
                break;
            }
            if arg == "--print-request" {
                print = true;
                continue;
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f.to_string(), Some(v.to_string())),
                None => (arg, None),
            };
            if !matches!(flag.as_str(), "--reply-fd" | "--request-fd" | "--workspace") {
                return Err(format!("unknown argument {flag}"));
            }
            let value = match inline.or_else(|| args.next()) {
                Some(v) => v,
                None => return Err(format!("{flag} needs a value")),
            };
            let fd = || -> std::result::Result<i32, String> {
                value
                    .parse()
                    .map_err(|_| format!("{flag}: not a descriptor number"))
            };
            match flag.as_str() {
                "--reply-fd" if reply.is_none() => reply = Some(fd()?),
                "--request-fd" if request.is_none() => request = Some(fd()?),
                "--workspace" if workspace.is_none() => workspace = Some(value.clone()),
                _ => return Err(format!("{flag} given twice")),
            }
        }
        match (print, reply, request, workspace, command) {
            (false, Some(reply_fd), request, None, None) => Ok(HelperArgs::Serve {
                reply_fd,
                request_fd: request.unwrap_or(4),
            }),
            (false, None, ..) => Err("--reply-fd is required".into()),
            (true, None, None, Some(ws), Some(command)) if !command.is_empty() => {
                Ok(HelperArgs::PrintRequest {
                    workspace: ws.into(),
                    command,
                })
            }
            (true, None, None, ..) => {
                Err("--print-request needs --workspace DIR -- CMD...".into())
            }
            _ => Err("--print-request goes without --reply-fd/--request-fd, and --workspace and a command only with it".into()),
        }
    }

    /// Do what the arguments say; the helper process's exit code.
    pub fn run(self) -> i32 {
        match self {
            HelperArgs::Serve {
                reply_fd,
                request_fd,
            } => serve(reply_fd, request_fd),
            HelperArgs::PrintRequest { workspace, command } => {
                let printed = crate::spec::Sandbox::builder(&command)
                    .workspace(&workspace)
                    .profile(match crate::Profile::host() {
                        Ok(p) => p,
                        Err(e) => {
                            eprintln!("retie: {e}");
                            return e.exit_code();
                        }
                    })
                    .build()
                    .and_then(|spec| {
                        serde_json::to_string(&Request::from(&spec))
                            .map_err(|e| RuntimeError::Helper(e.to_string()))
                    });
                match printed {
                    Ok(text) => {
                        println!("{text}");
                        0
                    }
                    Err(e) => {
                        eprintln!("retie: {e}");
                        e.exit_code()
                    }
                }
            }
        }
    }
}

/// The helper's side: read the request, run it, reply. Returns the exit
/// code the helper process should end with (what `retie sandbox exec`
/// would: the command's, or the error's).
pub fn serve(reply_fd: i32, request_fd: i32) -> i32 {
    // Both fds come from the command line: they must be open, distinct,
    // and not stdio (the reply would mix with the command's output).
    // Checked before anything runs, so a run is never left without its
    // report.
    for (flag, fd) in [("--reply-fd", reply_fd), ("--request-fd", request_fd)] {
        if let Err(problem) = check_passed_fd(fd) {
            eprintln!("retie: {flag} {fd}: {problem}");
            return EXIT_SANDBOX_FAILED;
        }
    }
    if reply_fd == request_fd {
        eprintln!("retie: --reply-fd and --request-fd must be two descriptors");
        return EXIT_SANDBOX_FAILED;
    }
    // SAFETY: the request fd was checked open above, was handed to this
    // process for this one use, and nothing else in it owns or closes it.
    let request = unsafe { OwnedFd::from_raw_fd(request_fd) };
    let mut text = Vec::new();
    let mut request = std::fs::File::from(request);
    let reply = request
        .read_to_end(&mut text)
        .map_err(|e| RuntimeError::host("reading the request", e))
        .and_then(|_| {
            serde_json::from_slice::<Request>(&text)
                .map_err(|e| RuntimeError::Helper(format!("bad request: {e}")))
        })
        .and_then(SpecWire::into_spec)
        .and_then(|spec| match spec.net {
            crate::spec::NetMode::Proxy(_) => run_served(&spec, OwnedFd::from(request)),
            _ => crate::host::supervisor::run(&spec, Stdio::Inherit),
        });
    let (code, reply) = match reply {
        Ok(outcome) => (outcome.exit_code, Reply::Ok { outcome }),
        Err(error) => (error.exit_code(), Reply::Err { error }),
    };
    let text = serde_json::to_string(&reply).unwrap_or_default();
    // SAFETY: as for the request fd: checked open, handed over for this
    // one use, owned by nothing else; closed when the File drops.
    let reply_file = unsafe { std::fs::File::from_raw_fd(reply_fd) };
    let _ = crate::sys::write_all(std::os::fd::AsFd::as_fd(&reply_file), text.as_bytes());
    code
}

/// A proxied spec in the helper: start it, send the listening socket back
/// on the request socket, and release the command only on the caller's
/// `S` (it serves the socket); otherwise the sandbox is dropped (init
/// killed) and the command never runs.
fn run_served(spec: &SandboxSpec, sock: OwnedFd) -> Result<Outcome> {
    use std::os::fd::AsFd;
    let mut started = crate::host::supervisor::start(spec, Stdio::Inherit)?;
    if let Some(listener) = started.take_net_listener()? {
        let (go_r, go_w) =
            crate::sys::go_channel().map_err(|e| RuntimeError::host("socketpair", e))?;
        crate::sys::send_fds(sock.as_fd(), b'L', &[listener.as_fd(), go_w.as_fd()])
            .map_err(|e| RuntimeError::host("handing the listening socket to the caller", e))?;
        // This process keeps no copy: the caller's proxy is its only
        // server, and only the caller can answer on `go`.
        drop(listener);
        drop(go_w);
        let mut go = [0u8; 1];
        let got = loop {
            match rustix::io::read(&go_r, &mut go) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => break Err(e),
                Ok(n) => break Ok(n),
            }
        };
        if got.ok() != Some(1) || go != *b"S" {
            return Err(RuntimeError::Helper(
                "the caller did not serve the proxied network; the command never ran".into(),
            ));
        }
    }
    // No socket: init ended during set-up, and `run` reports why.
    started.run()
}

#[cfg(test)]
mod args_tests {
    use super::HelperArgs;

    fn p(a: &[&str]) -> Result<HelperArgs, String> {
        HelperArgs::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn both_helper_binaries_read_one_command_line() {
        let serve = |reply_fd, request_fd| {
            Ok(HelperArgs::Serve {
                reply_fd,
                request_fd,
            })
        };
        assert_eq!(p(&["__sandbox-helper", "--reply-fd", "3"]), serve(3, 4));
        assert_eq!(p(&["--reply-fd", "3"]), serve(3, 4));
        assert_eq!(p(&["--reply-fd=5", "--request-fd", "6"]), serve(5, 6));
        assert_eq!(
            p(&[
                "--print-request",
                "--workspace",
                "/w",
                "--",
                "true",
                "--",
                "-x"
            ]),
            Ok(HelperArgs::PrintRequest {
                workspace: "/w".into(),
                command: vec!["true".into(), "--".into(), "-x".into()],
            })
        );
        for bad in [
            &[][..],
            &["--reply-fd"],
            &["--reply-fd", "x"],
            &["--request-fd", "4"],
            &["--reply-fd", "3", "--reply-fd", "4"],
            &["--reply-fd", "3", "--print-request"],
            &["--reply-fd", "3", "--bogus"],
            &["--reply-fd", "3", "extra"],
            &["--reply-fd", "3", "--", "true"],
            &["--print-request", "--workspace", "/w"],
            &["--print-request", "--", "true"],
            &["--print-request", "--workspace", "/w", "--"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::profile::{Limits, Profile};
    use crate::spec::{Hide, HideKind, LabNet, NetMode, RoBind, Sandbox, WorkspaceMode};

    /// A spec with every field set to something other than its default.
    fn full_spec(dir: &Path) -> SandboxSpec {
        let ws = dir.join("ws");
        let runs = dir.join("run");
        for d in [ws.join(".retie"), runs.join("upper"), runs.join("work")] {
            std::fs::create_dir_all(&d).expect("mkdir");
        }
        let ws = std::fs::canonicalize(&ws).expect("canonical");
        let runs = std::fs::canonicalize(&runs).expect("canonical");
        let mut profile = Profile::host().expect("host profile");
        profile.description = "round trip".into();
        profile.filesystem.tmpfs.push("/var/tmp".into());
        let limits = Limits {
            address_space: Some(1 << 33),
            core: Some(0),
            cpu: Some(30),
            fsize: Some(1 << 20),
            nofile: Some(256),
            nproc: Some(64),
            memory_mib: None,
        };
        let mut spec = Sandbox::builder(["sh", "-c", "echo \u{e9}t\u{e9} > f"])
            .workspace(&ws)
            .workspace_mode(WorkspaceMode::Overlay {
                upper: runs.join("upper"),
                work: runs.join("work"),
            })
            .network(NetMode::Lab(LabNet {
                name: "web".into(),
                keeper_pid: 4242,
                ports: vec![80, 8443],
            }))
            .profile(profile)
            .limits(limits)
            .timeout(Duration::from_millis(12_345))
            .interrupt(crate::spec::Interrupt::Kill)
            .env("FOO", "bar baz")
            .ro_bind("/usr/share", "/opt/share")
            .mask(ws.join(".retie"))
            .scratch("/opt/tool-home")
            .layered_ro_bind("/opt/tool-home-src/bin", "/opt/tool-home/bin")
            .hide("/opt/tool-home/bin/deploy.pem", HideKind::File)
            .hide("/opt/tool-home/bin/.ssh", HideKind::Dir)
            .build()
            .expect("spec");
        spec.hostname = c"box-1".to_owned();
        spec
    }

    /// The transfer form is the spec's own data: every field comes back
    /// equal. The destructuring below names each field, so a field added
    /// to the spec must be given a non-default value here too.
    #[test]
    fn request_round_trips_every_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = full_spec(dir.path());
        let SandboxSpec {
            argv,
            env,
            workspace,
            workspace_mode,
            net,
            profile,
            limits,
            timeout,
            interrupt,
            ro_binds,
            masks,
            scratch,
            layered_binds,
            hides,
            identity,
            hostname,
        } = &spec;
        // Each one differs from what a bare builder gives.
        let bare = Sandbox::builder(["true"])
            .workspace(dir.path())
            .build()
            .expect("bare spec");
        assert_ne!(argv, &bare.argv);
        assert_ne!(env, &bare.env);
        assert_ne!(workspace, &bare.workspace);
        assert_ne!(workspace_mode, &bare.workspace_mode);
        assert_ne!(net, &bare.net);
        assert_ne!(profile, &bare.profile);
        assert_ne!(limits, &bare.limits);
        assert_ne!(timeout, &bare.timeout);
        assert_ne!(interrupt, &bare.interrupt);
        assert_ne!(ro_binds, &bare.ro_binds);
        assert_ne!(masks, &bare.masks);
        assert_ne!(scratch, &bare.scratch);
        assert_ne!(layered_binds, &bare.layered_binds);
        assert_ne!(hides, &bare.hides);
        assert_ne!(hostname, &bare.hostname);
        // The identity is derived, not sent: the receiver computes the
        // same one for the same workspace and credentials.
        assert_eq!(identity, &bare.identity);

        let text = serde_json::to_vec(&Request::from(&spec)).expect("encode");
        let back: Request = serde_json::from_slice(&text).expect("decode");
        assert_eq!(back, Request::from(&spec));
        assert_eq!(back.into_spec().expect("spec again"), spec);
    }

    /// A request cannot choose who the sandbox runs as: an identity on the
    /// wire is refused, and the one a spec runs with is always derived by
    /// the receiver.
    #[test]
    fn request_carries_no_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = full_spec(dir.path());
        let mut v = serde_json::to_value(Request::from(&spec)).expect("encode");
        assert!(v.get("identity").is_none());
        v["identity"] = serde_json::json!({"host_uid": 0, "host_gid": 0});
        let err = serde_json::from_value::<Request>(v).expect_err("identity refused");
        assert!(err.to_string().contains("identity"), "{err}");
    }

    /// What arrives is checked as `build` checks it.
    #[test]
    fn request_is_validated_on_arrival() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = full_spec(dir.path());
        let mut req = Request::from(&spec);
        req.masks = vec![PathBuf::from("/etc")];
        assert!(matches!(
            req.into_spec(),
            Err(RuntimeError::InvalidSpec(m)) if m.contains("mask /etc")
        ));
        let mut req = Request::from(&spec);
        req.workspace = dir.path().join("ws/../ws");
        assert!(matches!(
            req.into_spec(),
            Err(RuntimeError::Workspace { reason, .. }) if reason.contains("not canonical")
        ));
        let mut req = Request::from(&spec);
        req.argv.clear();
        assert!(req.into_spec().is_err());
        let mut req = Request::from(&spec);
        req.env.push(c"NOEQUALS".to_owned());
        assert!(req.into_spec().is_err());
        let mut req = Request::from(&spec);
        req.ro_binds.push(RoBind {
            host: "relative".into(),
            inside: "/x".into(),
        });
        assert!(req.into_spec().is_err());
        let mut req = Request::from(&spec);
        req.hides.push(Hide {
            path: "/a/../etc".into(),
            kind: HideKind::Dir,
        });
        assert!(req.into_spec().is_err());
    }

    /// Every error variant crosses as itself: same message, same exit code.
    #[test]
    fn errors_round_trip_typed() {
        let errors = [
            RuntimeError::InvalidSpec("x".into()),
            RuntimeError::Workspace {
                path: "/w".into(),
                reason: "gone".into(),
            },
            RuntimeError::Profile {
                path: "p.toml".into(),
                reason: "bad".into(),
            },
            RuntimeError::Unsupported {
                problem: "no userns".into(),
                fix: "sysctl".into(),
            },
            RuntimeError::NotSingleThreaded { threads: 4 },
            RuntimeError::host("open", std::io::Error::from_raw_os_error(libc::EACCES)),
            RuntimeError::host("parse", std::io::Error::other("no digits")),
            RuntimeError::Setup {
                step: "mounts".into(),
                message: "EPERM".into(),
                hint: Some("do this".into()),
            },
            RuntimeError::Exec {
                program: "nope".into(),
                reason: "not found".into(),
                exit_code: 127,
            },
            RuntimeError::Channel { why: "junk".into() },
            RuntimeError::Toolchain("t".into()),
            RuntimeError::Helper("h".into()),
            RuntimeError::Cancelled { signal: 2 },
        ];
        for e in errors {
            let text = serde_json::to_string(&e).expect("encode");
            let back: RuntimeError = serde_json::from_str(&text).expect("decode");
            assert_eq!(back.to_string(), e.to_string(), "{text}");
            assert_eq!(back.exit_code(), e.exit_code());
            assert_eq!(
                std::mem::discriminant(&back),
                std::mem::discriminant(&e),
                "{text}"
            );
            if let (RuntimeError::Host { source: a, .. }, RuntimeError::Host { source: b, .. }) =
                (&back, &e)
            {
                assert_eq!(a.raw_os_error(), b.raw_os_error());
            }
        }
    }

    /// A proxied spec through the helper needs a caller that serves its
    /// socket: the plain entry point refuses it before spawning anything
    /// (the helper would otherwise leave the socket unserved).
    #[test]
    fn a_proxied_spec_needs_a_serving_caller() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Sandbox::builder(["true"])
            .workspace(dir.path())
            .network(NetMode::Proxy(crate::spec::ProxyNet { port: 3128 }))
            .build()
            .expect("spec");
        let missing = dir.path().join("no-such-helper");
        match run_via_helper_with(&missing, &spec, Stdio::Inherit) {
            Err(RuntimeError::InvalidSpec(m)) => assert!(m.contains("serve"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // The serving entry point goes on to spawn (and fails here only
        // because there is no helper to spawn).
        let mut serve = |_: OwnedFd| -> std::result::Result<(), String> { Ok(()) };
        assert!(matches!(
            run_via_helper_serving(&missing, &spec, Stdio::Inherit, &mut serve),
            Err(RuntimeError::Host { .. })
        ));
    }

    /// The helper runs the agent's commands: a terminal is never relayed
    /// through it (ADR 0550). Refused before anything is spawned.
    #[test]
    fn a_terminal_is_refused_through_the_helper() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Sandbox::builder(["true"])
            .workspace(dir.path())
            .build()
            .expect("spec");
        let missing = dir.path().join("no-such-helper");
        match run_via_helper_with(&missing, &spec, Stdio::Terminal) {
            Err(RuntimeError::InvalidSpec(m)) => assert!(m.contains("terminal"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Without it the same call goes on to spawn (and fails only for
        // want of a helper).
        assert!(matches!(
            run_via_helper_with(&missing, &spec, Stdio::Inherit),
            Err(RuntimeError::Host { .. })
        ));
    }

    #[test]
    fn drain_caps_and_counts() {
        let (r, w) = crate::sys::pipe_cloexec().expect("pipe");
        let reader = std::thread::spawn(move || drain(r, 10));
        // More than a pipe holds: the reader must keep draining.
        crate::sys::write_all(std::os::fd::AsFd::as_fd(&w), &[b'x'; 200_000]).expect("write");
        drop(w);
        let got = reader.join().expect("join").expect("drain");
        assert_eq!(got.bytes, vec![b'x'; 10]);
        assert_eq!(got.total, 200_000);
        assert!(got.truncated);
    }
}
