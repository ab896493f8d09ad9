//! The last step, in the command's own process (forked by init): restore
//! the signal mask, take its own process group, wire stdio, and exec.
//!
//! PATH is searched here, with the sandbox's PATH: glibc's execvpe would
//! search the PATH of the *host* environment this process still carries.

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;

use crate::protocol::Report;

/// Stdio fds for the command (`-1` = keep what is inherited).
#[derive(Clone, Copy)]
pub struct StdioFds {
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
}

/// Become the command. Never returns: on failure reports over `status`
/// and exits 127 (not found) or 126 (not executable).
pub fn exec_command(argv: &[CString], env: &[CString], stdio: StdioFds, status: RawFd) -> ! {
    // SAFETY: an empty, then process-wide, signal mask; plain syscalls on
    // a valid sigset we own.
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
        // Own process group, so init can signal the whole job.
        libc::setpgid(0, 0);
    }
    for (fd, target) in [(stdio.stdin, 0), (stdio.stdout, 1), (stdio.stderr, 2)] {
        // SAFETY: dup2 onto 0..2 of fds the caller keeps open.
        if fd >= 0 && fd != target && unsafe { libc::dup2(fd, target) } < 0 {
            fail(
                status,
                &argv[0],
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EBADF),
            );
        }
    }
    let mut argp: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argp.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());

    let prog = argv[0].as_bytes();
    if prog.contains(&b'/') {
        try_exec(&argv[0], &argp, &envp);
        fail(status, &argv[0], errno());
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
        try_exec(&full, &argp, &envp);
        match errno() {
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

/// execve; on ENOEXEC run it as a shell script like execvp does.
fn try_exec(path: &CStr, argp: &[*const libc::c_char], envp: &[*const libc::c_char]) {
    // SAFETY: path and both arrays are valid, NUL-terminated, and outlive
    // the call; execve only returns on failure.
    unsafe { libc::execve(path.as_ptr(), argp.as_ptr(), envp.as_ptr()) };
    if errno() == libc::ENOEXEC {
        let mut sh: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), path.as_ptr()];
        sh.extend_from_slice(&argp[1..]);
        // SAFETY: as above; `sh` ends with the NULL copied from argp.
        unsafe { libc::execve(c"/bin/sh".as_ptr(), sh.as_ptr(), envp.as_ptr()) };
        set_errno(libc::ENOEXEC);
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn fail(status: RawFd, prog: &CStr, errno: i32) -> ! {
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
    // SAFETY: _exit never returns and runs no destructors or atexit hooks
    // (the parent's buffers must not be flushed twice).
    unsafe { libc::_exit(code) }
}
