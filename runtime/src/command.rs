//! The last step, in the command's own process (forked by init): restore
//! the signal mask, take its own process group, wire stdio, and exec.
//!
//! PATH is searched here, with the sandbox's PATH: glibc's execvpe would
//! search the PATH of the *host* environment this process still carries.

use std::ffi::{CStr, CString};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use crate::protocol::{Message, Report};

/// Stdio fds for the command (`None` = keep what is inherited).
#[derive(Default)]
pub struct StdioFds {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Become the command. Never returns: on failure reports over `status`
/// and exits 127 (not found) or 126 (not executable).
pub fn exec_command(
    argv: &[CString],
    env: &[CString],
    stdio: &StdioFds,
    status: BorrowedFd<'_>,
) -> ! {
    // SAFETY: this process is single-threaded (a fresh fork of init) and
    // installs no handler: it empties its signal mask and sets every
    // signal's disposition to SIG_DFL. `set` and `dfl` are live, zeroed
    // (valid) values the kernel only reads; the old-value pointers are
    // NULL; 8 is the kernel's sigset size for rt_sigaction.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // Ignored signals stay ignored across execve (a Rust caller ignores
        // SIGPIPE, for one): give the command default dispositions.
        // The raw syscall reaches the two signals glibc reserves (32, 33).
        let dfl: libc::sigaction = std::mem::zeroed(); // sa_handler = SIG_DFL
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl,
                    std::ptr::null_mut::<libc::sigaction>(),
                    8,
                );
            }
        }
    }
    // Own process group, so init can signal the whole job.
    let _ = rustix::process::setpgid(None, None);
    let wired = [
        stdio.stdin.as_ref().map(rustix::stdio::dup2_stdin),
        stdio.stdout.as_ref().map(rustix::stdio::dup2_stdout),
        stdio.stderr.as_ref().map(rustix::stdio::dup2_stderr),
    ];
    if let Some(Err(e)) = wired.into_iter().flatten().find(Result::is_err) {
        fail(status, &argv[0], e.raw_os_error());
    }
    let mut argp: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());

    let prog = argv[0].as_bytes();
    if prog.contains(&b'/') {
        let e = try_exec(&argv[0], &argp, &envp);
        fail(status, &argv[0], e);
    }
    let path = env
        .iter()
        .find_map(|kv| kv.as_bytes().strip_prefix(b"PATH="))
        .unwrap_or(b"/usr/bin:/bin");
    let mut last = libc::ENOENT;
    let mut saw_eacces = false;
    for dir in path.split(|b| *b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let mut full = dir.to_vec();
        full.push(b'/');
        full.extend_from_slice(prog);
        let Ok(full) = CString::new(full) else {
            continue;
        };
        match try_exec(&full, &argp, &envp) {
            libc::EACCES => saw_eacces = true,
            libc::ENOENT | libc::ENOTDIR => {}
            e => last = e,
        }
    }
    fail(
        status,
        &argv[0],
        if saw_eacces { libc::EACCES } else { last },
    )
}

/// execve; on ENOEXEC run it as a shell script like execvp does. Returns
/// the errno of the failure (execve only returns on failure).
fn try_exec(path: &CStr, argp: &[*const libc::c_char], envp: &[*const libc::c_char]) -> i32 {
    // SAFETY: `path` is a &CStr; `argp` and `envp` are NULL-terminated
    // arrays of pointers into CStrings the caller owns, all alive for the
    // call (the kernel copies them before replacing this image).
    unsafe { libc::execve(path.as_ptr(), argp.as_ptr(), envp.as_ptr()) };
    let e = errno();
    if e != libc::ENOEXEC {
        return e;
    }
    let mut sh: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), path.as_ptr()];
    sh.extend_from_slice(&argp[1..]);
    // SAFETY: as above; `sh` borrows the same strings and ends with the
    // NULL copied from `argp`.
    unsafe { libc::execve(c"/bin/sh".as_ptr(), sh.as_ptr(), envp.as_ptr()) };
    libc::ENOEXEC
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

fn fail(status: BorrowedFd<'_>, prog: &CStr, errno: i32) -> ! {
    let report = Report::ExecFailed {
        program: String::from_utf8_lossy(std::ffi::OsStr::from_bytes(prog.to_bytes()).as_bytes())
            .into_owned(),
        errno,
    };
    let _ = crate::sys::write_all(status, &report.to_line());
    let code = if errno == libc::ENOENT || errno == libc::ENOTDIR {
        crate::outcome::EXIT_NOT_FOUND
    } else {
        crate::outcome::EXIT_NOT_EXECUTABLE
    };
    crate::sys::exit_now(code)
}
