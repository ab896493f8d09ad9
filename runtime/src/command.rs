//! The last step, in the command's own process: restore the signal mask
//! and dispositions, take its own process group, wire stdio, and exec.
//!
//! init starts that process with `clone(CLONE_VM | CLONE_VFORK)`, the way
//! `posix_spawn` does: the child borrows init's memory (no page tables
//! copied, no copy-on-write faults afterwards) and init sleeps until the
//! child has exec'd or exited. The child therefore runs on a stack of its
//! own and must not allocate or take a lock: everything it needs (argv and
//! envp arrays, every PATH candidate) is built by [`Spawn::prepare`]
//! before the clone, and between the clone and `execve` the child makes
//! raw system calls only. It inherits everything init set up (namespaces,
//! no capabilities, Landlock, the seccomp filter, NO_NEW_PRIVS): those
//! belong to the thread and its credentials, which `clone` copies, not to
//! the memory it shares.
//!
//! PATH is searched with the sandbox's PATH: glibc's execvpe would search
//! the PATH of the *host* environment init still carries.

use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

/// Stdio fds for the command (`None` = keep what is inherited).
#[derive(Default)]
pub struct StdioFds {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// [`crate::Stdio::Terminal`]: init makes a pseudo-terminal and the
    /// command runs on it (`Spawn::on_terminal`).
    pub terminal: bool,
    /// With `terminal`: stderr on it too (else `stderr`, or inherited).
    pub terminal_stderr: bool,
}

/// The child's stack: enough for [`child`]'s few frames (no formatting,
/// no allocation), with a guard page below it.
const STACK_SIZE: usize = 64 * 1024;

/// Everything the child reads, prepared before the clone, and the one
/// word it writes back (the errno of its failure).
pub struct Spawn<'a> {
    /// The program as given (argv[0]), for the report.
    pub program: String,
    /// NULL-terminated pointers into the spec's argv.
    argp: Vec<*const libc::c_char>,
    /// NULL-terminated pointers into the spec's environment.
    envp: Vec<*const libc::c_char>,
    /// The paths execve tries, in order (argv[0] alone when it has a `/`).
    candidates: Vec<CString>,
    /// argv[0] has a `/`: its one execve's errno is the answer; else the
    /// PATH search's (EACCES if any candidate gave it, ENOENT if none
    /// was found, or the last other error), as execvp reports.
    direct: bool,
    /// `/bin/sh`, a candidate (filled in by the child), argv[1..], NULL:
    /// the fallback for a candidate without a binary format (ENOEXEC),
    /// as execvp does.
    sh_argp: Vec<*const libc::c_char>,
    /// The command's stdio (init holds them until the child is gone).
    stdio: &'a StdioFds,
    /// The slave of the sandbox's pty, when the command runs on one: its
    /// stdin and stdout (stderr too with `terminal_stderr`), and the
    /// controlling terminal of the session it makes (see [`child`]).
    terminal: Option<&'a OwnedFd>,
    /// Whether stderr goes to `terminal` as well.
    terminal_stderr: bool,
    /// Signals whose disposition the child sets back to SIG_DFL: bit
    /// `n - 1` for signal `n` (see [`dispositions_to_reset`]).
    reset: u64,
    /// 0 until the child fails; then the errno it reports.
    errno: i32,
    _strings: PhantomData<&'a CString>,
}

impl<'a> Spawn<'a> {
    /// Build every array and candidate the child will use.
    pub fn prepare(
        argv: &'a [CString],
        env: &'a [CString],
        stdio: &'a StdioFds,
        reset: u64,
    ) -> Spawn<'a> {
        let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
            v.iter()
                .map(|a| a.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let (argp, envp) = (ptrs(argv), ptrs(env));
        let prog = argv.first().map_or(&b""[..], |a| a.as_bytes());
        let direct = prog.contains(&b'/') || prog.is_empty();
        let candidates = if direct {
            argv.first().cloned().into_iter().collect()
        } else {
            let path = env
                .iter()
                .find_map(|kv| kv.as_bytes().strip_prefix(b"PATH="))
                .unwrap_or(b"/usr/bin:/bin");
            path.split(|b| *b == b':')
                .filter_map(|dir| {
                    let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
                    let mut full = dir.to_vec();
                    full.push(b'/');
                    full.extend_from_slice(prog);
                    CString::new(full).ok()
                })
                .collect()
        };
        let mut sh_argp = vec![c"/bin/sh".as_ptr(), std::ptr::null()];
        sh_argp.extend_from_slice(argp.get(1..).unwrap_or(&[std::ptr::null()]));
        Spawn {
            program: String::from_utf8_lossy(std::ffi::OsStr::from_bytes(prog).as_bytes())
                .into_owned(),
            argp,
            envp,
            candidates,
            direct,
            sh_argp,
            stdio,
            terminal: None,
            terminal_stderr: false,
            reset,
            errno: 0,
            _strings: PhantomData,
        }
    }

    /// Run the command on `slave` (the pty init made, [`crate::init::terminal`]):
    /// its stdin and stdout, its stderr if `stderr`, and the controlling
    /// terminal of a session of its own.
    pub fn on_terminal(&mut self, slave: &'a OwnedFd, stderr: bool) {
        self.terminal = Some(slave);
        self.terminal_stderr = stderr;
    }

    /// Start the command. Returns once the child has exec'd or exited:
    /// its pid, and the errno it failed with before or at exec, if it did
    /// (it has then exited 127 or 126). The caller reaps it either way.
    ///
    /// # Safety
    /// The calling process must be single-threaded (init is): the child
    /// shares its memory until it execs, and no other thread may run in
    /// that memory meanwhile (nor hold a lock the child could need; it
    /// takes none).
    pub unsafe fn spawn(&mut self) -> std::io::Result<(libc::pid_t, Option<i32>)> {
        let stack = crate::sys::ChildStack::new(STACK_SIZE)?;
        // SAFETY: `child` runs on the top of `stack` (its own mapping, with
        // a guard page below). CLONE_VFORK keeps this thread stopped until
        // the child has exec'd or exited, so `self`, which the child reads
        // and writes through the pointer, is not used by anyone else
        // meanwhile, and the stack outlives the child's use of it. No
        // CLONE_SIGHAND: the child's signal dispositions are its own copy.
        // The caller guarantees a single thread.
        let pid = unsafe {
            libc::clone(
                child,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (self as *mut Spawn<'a>).cast::<c_void>(),
            )
        };
        let err = std::io::Error::last_os_error();
        // The child no longer uses its stack: it has exec'd or exited.
        drop(stack);
        if pid < 0 {
            return Err(err);
        }
        Ok((pid, (self.errno != 0).then_some(self.errno)))
    }
}

/// The signals whose disposition is not SIG_DFL in this process (ignored
/// or caught), as `/proc/self/status` lists them: those the command's
/// child must set back (bit `n - 1` for signal `n`). Every signal when the
/// list cannot be read. A default disposition needs no call: resetting
/// only these skips about sixty system calls between the command's release
/// and its exec (0.05 ms; issue 10). Read once, while init waits for its
/// id maps: nothing in init changes a disposition afterwards.
pub fn dispositions_to_reset() -> u64 {
    let Ok(status) = crate::sys::read_proc("/proc/self/status") else {
        return u64::MAX;
    };
    let mask = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    match (mask("SigIgn:"), mask("SigCgt:")) {
        (Some(ign), Some(cgt)) => ign | cgt,
        _ => u64::MAX,
    }
}

/// The command's child, on its own stack in init's memory. Raw system
/// calls only (rustix's raw backend and libc's syscall wrappers): no
/// allocation, no lock, nothing but `spawn`'s prepared data.
extern "C" fn child(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the `&mut Spawn` that `spawn` passed; its thread is
    // stopped (CLONE_VFORK) until we exec or exit.
    let s = unsafe { &mut *arg.cast::<Spawn<'_>>() };
    // SAFETY: this process has one thread and installs no handler: it sets
    // the disposition of every signal init ignores or catches to SIG_DFL
    // (ignored signals would stay ignored across execve; a Rust caller
    // ignores SIGPIPE, for one), then empties its mask. `dfl` and `set`
    // are zeroed (valid) values on this stack the kernel only reads; the
    // old-value pointers are NULL; 8 is the kernel's sigset size. The raw
    // syscall reaches the two signals glibc reserves (32, 33).
    unsafe {
        let dfl: libc::sigaction = std::mem::zeroed(); // sa_handler = SIG_DFL
        for sig in 1..=64 {
            if s.reset & (1u64 << (sig - 1)) != 0 && sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl,
                    std::ptr::null_mut::<libc::sigaction>(),
                    8,
                );
            }
        }
        let set: libc::sigset_t = std::mem::zeroed();
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &set,
            std::ptr::null_mut::<libc::sigset_t>(),
            8,
        );
    }
    let stdio = s.stdio;
    let wired = if let Some(tty) = s.terminal {
        // On the sandbox's pty: a session of our own (so also our own
        // process group, which init signals), whose controlling terminal
        // is the pty's slave: job control works and the pty's line
        // discipline sends its signals (Ctrl-C) to the foreground job.
        // init's session has no terminal, and the slave was opened with
        // O_NOCTTY, so it is nobody's controlling terminal yet.
        if let Err(e) = rustix::process::setsid() {
            return fail(s, e.raw_os_error());
        }
        if let Err(e) = rustix::process::ioctl_tiocsctty(tty) {
            return fail(s, e.raw_os_error());
        }
        let err = if s.terminal_stderr {
            Some(rustix::stdio::dup2_stderr(tty))
        } else {
            stdio.stderr.as_ref().map(rustix::stdio::dup2_stderr)
        };
        [
            Some(rustix::stdio::dup2_stdin(tty)),
            Some(rustix::stdio::dup2_stdout(tty)),
            err,
        ]
    } else {
        // Own process group, so init can signal the whole job (init sleeps
        // until we exec, so no forwarded signal can come first).
        let _ = rustix::process::setpgid(None, None);
        [
            stdio.stdin.as_ref().map(rustix::stdio::dup2_stdin),
            stdio.stdout.as_ref().map(rustix::stdio::dup2_stdout),
            stdio.stderr.as_ref().map(rustix::stdio::dup2_stderr),
        ]
    };
    if let Some(Err(e)) = wired.into_iter().flatten().find(Result::is_err) {
        return fail(s, e.raw_os_error());
    }
    let mut last = libc::ENOENT;
    let mut saw_eacces = false;
    for i in 0..s.candidates.len() {
        let path = s.candidates[i].as_ptr();
        // SAFETY: `path` is a NUL-terminated string and `argp`/`envp` are
        // NULL-terminated arrays of pointers to NUL-terminated strings, all
        // owned by `s` and alive (init keeps them until we are gone). The
        // kernel copies them before replacing this image.
        unsafe { libc::execve(path, s.argp.as_ptr(), s.envp.as_ptr()) };
        let mut e = errno();
        if e == libc::ENOEXEC {
            s.sh_argp[1] = path;
            // SAFETY: as above; `sh_argp` borrows the same strings plus a
            // static one, and ends with argp's NULL.
            unsafe { libc::execve(c"/bin/sh".as_ptr(), s.sh_argp.as_ptr(), s.envp.as_ptr()) };
            e = libc::ENOEXEC;
        }
        if s.direct {
            return fail(s, e);
        }
        match e {
            libc::EACCES => saw_eacces = true,
            libc::ENOENT | libc::ENOTDIR => {}
            e => last = e,
        }
    }
    fail(s, if saw_eacces { libc::EACCES } else { last })
}

/// Hand the errno to init (shared memory) and end this process.
fn fail(s: &mut Spawn<'_>, errno: i32) -> libc::c_int {
    s.errno = if errno == 0 { libc::EINVAL } else { errno };
    let code = if errno == libc::ENOENT || errno == libc::ENOTDIR {
        crate::outcome::EXIT_NOT_FOUND
    } else {
        crate::outcome::EXIT_NOT_EXECUTABLE
    };
    crate::sys::exit_now(code)
}

/// This thread's errno (init's, shared: init is stopped meanwhile). No
/// allocation: a raw OS error is stored inline.
fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}
