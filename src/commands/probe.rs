//! `retie __probe`: runs *inside* the self-test's sandbox and tries each
//! escape for real. Every probe states what it expects (usually a specific
//! errno) and reports what it saw; a probe passes only on the expected
//! observation, never on "some error happened".
//!
//! Output: one JSON object per probe on stdout.

use std::ffi::CString;
use std::io::Write;
use std::path::Path;

use clap::Args;
use serde::{Deserialize, Serialize};

#[derive(Args)]
pub struct ProbeArgs {
    /// A file in the invoking user's real home that must be unreadable.
    #[arg(long)]
    pub canary: Option<String>,
    /// Host TCP listeners (ADDR:PORT) that must be unreachable.
    #[arg(long = "tcp")]
    pub tcp: Vec<String>,
    /// Abstract unix socket name (without the leading NUL) listening on the host.
    #[arg(long)]
    pub abstract_socket: Option<String>,
    /// A host pid that must be invisible and unsignalable.
    #[arg(long)]
    pub host_pid: Option<i32>,
    /// The host's network namespace (`net:[INODE]`), which must not be ours.
    #[arg(long)]
    pub host_netns: Option<String>,
    /// `PATH=MIB`: a tmpfs that must be capped at MIB MiB (`HOME` = $HOME).
    #[arg(long = "tmpfs-cap")]
    pub tmpfs_cap: Vec<String>,
    /// The RLIMIT_NPROC the profile sets (absent: inherited).
    #[arg(long)]
    pub nproc: Option<u64>,
}

/// One probe's verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeResult {
    pub probe: String,
    pub expected: String,
    pub observed: String,
    pub pass: bool,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ename(e: i32) -> String {
    let name = match e {
        0 => "success",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EACCES => "EACCES",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EINVAL => "EINVAL",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::ENOTTY => "ENOTTY",
        libc::EBADF => "EBADF",
        libc::EEXIST => "EEXIST",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

struct Battery {
    out: Vec<ProbeResult>,
}

impl Battery {
    fn record(&mut self, probe: &str, expected: &str, observed: String, pass: bool) {
        self.out.push(ProbeResult {
            probe: probe.into(),
            expected: expected.into(),
            observed,
            pass,
        });
    }

    /// A syscall result that must fail with exactly `want`.
    fn expect_errno(&mut self, probe: &str, ret: i64, want: i32) {
        let got = if ret < 0 { errno() } else { 0 };
        let observed = if ret < 0 {
            ename(got)
        } else {
            format!("succeeded ({ret})")
        };
        self.record(probe, &ename(want), observed, ret < 0 && got == want);
    }

    /// A syscall result that must fail with one of `wants`.
    fn expect_one_of(&mut self, probe: &str, ret: i64, wants: &[i32]) {
        let got = if ret < 0 { errno() } else { 0 };
        let observed = if ret < 0 {
            ename(got)
        } else {
            format!("succeeded ({ret})")
        };
        let expected = wants
            .iter()
            .map(|w| ename(*w))
            .collect::<Vec<_>>()
            .join(" or ");
        self.record(probe, &expected, observed, ret < 0 && wants.contains(&got));
    }
}

fn status_field(name: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix(&format!("{name}:"))
                    .map(|v| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "missing".into())
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// The harmless arguments a denied call starts from, before the rule's
/// own conditions are applied: an invalid descriptor, a NULL pointer, an
/// invalid request. Where the kernel would answer without the rule, it
/// answers something other than EPERM for most of them (EBADF, EFAULT,
/// EIO, EAFNOSUPPORT), so a rule that stops matching shows.
fn base_args(name: &str) -> [u64; 6] {
    const BAD_FD: u64 = u64::MAX; // -1
    match name {
        "ioctl" | "setns" | "pidfd_getfd" | "io_uring_enter" | "io_uring_register" | "fsconfig"
        | "fsmount" | "fspick" | "mount_setattr" | "open_tree" | "move_mount"
        | "open_by_handle_at" | "sendto" | "sendmsg" | "sendmmsg" | "setsockopt" | "listen" => {
            [BAD_FD, 0, 0, 0, 0, 0]
        }
        // ptrace(-1): no such request (EIO), never PTRACE_TRACEME (0).
        "ptrace" => [u64::MAX, 0, 0, 0, 0, 0],
        _ => [0; 6],
    }
}

/// Every rule of the seccomp deny table in force for `net`, called for
/// real with arguments that match the rule, each expecting exactly the
/// table's errno. The rows come from the table itself, so a rule cannot be
/// added without its probe. Each call runs in a forked child, so a call
/// that the filter failed to stop (a new user namespace, a personality)
/// changes nothing for the probes after it.
pub fn deny_table_probes(net: &retie_runtime::NetMode, prefix: &str) -> Vec<ProbeResult> {
    retie_runtime::deny_table(net)
        .iter()
        .map(|d| {
            let probe = format!("{prefix}seccomp: {} refused", d.label());
            let expected = ename(d.errno);
            let Some(a) = d.matching_args(base_args(d.name)) else {
                return ProbeResult {
                    probe,
                    expected,
                    observed: "no arguments match the rule".into(),
                    pass: false,
                };
            };
            let observed = call_in_child(d.nr, a);
            let pass = observed == expected;
            ProbeResult {
                probe,
                expected,
                observed,
                pass,
            }
        })
        .collect()
}

/// Make one raw syscall in a forked child; its errno name, `succeeded`, or
/// how the child died.
fn call_in_child(nr: i64, a: [u64; 6]) -> String {
    // SAFETY: the child only makes raw syscalls (getpid, the probed call,
    // _exit), all async-signal-safe, so forking is sound even if this
    // process had other threads.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return format!("fork failed: {}", ename(errno()));
    }
    if pid == 0 {
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        // SAFETY: a raw syscall whose pointer arguments are NULL or
        // integers (the base arguments above): the kernel validates them
        // and cannot write into our memory through them.
        let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
        let e = errno();
        // SAFETY: getpid cannot fail; a clone that got through returns 0
        // in a new process, which must leave at once.
        if unsafe { libc::getpid() } != me {
            // SAFETY: leaving the unexpected grandchild without unwinding.
            unsafe { libc::_exit(0) };
        }
        let code = if r < 0 { e.clamp(1, 254) } else { 255 };
        // SAFETY: leaving the forked child without running the parent's
        // handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: reaping the child forked above, with a valid status pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        return format!("waitpid failed: {}", ename(errno()));
    }
    if libc::WIFEXITED(status) {
        match libc::WEXITSTATUS(status) {
            255 => "succeeded".into(),
            e => ename(e),
        }
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("wait status {status:#x}")
    }
}

/// The sandbox's init (PID 1) is retie's own process: a copy of the
/// caller's memory and environment, and the status pipe retie believes.
/// Nothing of it may be read or opened from inside. Each probe must fail
/// with EACCES (the ptrace access check of a non-dumpable process).
pub fn init_process_probes() -> Vec<ProbeResult> {
    let mut out = Vec::new();
    let mut row = |probe: &str, r: std::io::Result<String>| {
        let (observed, pass) = match r {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => ("EACCES".to_string(), true),
            Err(e) => (e.raw_os_error().map_or_else(|| e.to_string(), ename), false),
            Ok(what) => (format!("succeeded: {what}"), false),
        };
        out.push(ProbeResult {
            probe: probe.into(),
            expected: "EACCES".into(),
            observed,
            pass,
        });
    };
    row(
        "another process's environment unreadable (/proc/1/environ)",
        std::fs::read("/proc/1/environ").map(|b| format!("{} bytes", b.len())),
    );
    row(
        "another process's memory unreadable (/proc/1/mem)",
        std::fs::File::open("/proc/1/mem").map(|_| "opened".into()),
    );
    row(
        "another process's fd table unlistable (/proc/1/fd)",
        std::fs::read_dir("/proc/1/fd").map(|d| format!("{} entries", d.count())),
    );
    // Every descriptor init could hold, opened for writing the way a forged
    // status report would be: all must fail.
    let opened: Vec<String> = (0..64)
        .filter_map(|n| {
            let p = format!("/proc/1/fd/{n}");
            match std::fs::OpenOptions::new().write(true).open(&p) {
                Ok(_) => Some(format!("{n}")),
                Err(e) if e.raw_os_error() == Some(libc::EACCES) => None,
                Err(e) => Some(format!(
                    "{n}:{}",
                    e.raw_os_error().map_or_else(|| e.to_string(), ename)
                )),
            }
        })
        .collect();
    row(
        "another process's fds unopenable (/proc/1/fd/0..63 for writing)",
        if opened.is_empty() {
            Err(std::io::Error::from_raw_os_error(libc::EACCES))
        } else {
            Ok(format!("not refused: {}", opened.join(" ")))
        },
    );
    row(
        "another process's root and cwd unreachable (/proc/1/root)",
        std::fs::read_link("/proc/1/root").map(|p| p.display().to_string()),
    );
    out
}

/// Run the battery and print the results.
pub fn run(args: ProbeArgs) -> i32 {
    let results = battery(&args);
    let mut stdout = std::io::stdout().lock();
    for r in &results {
        let _ = writeln!(stdout, "{}", serde_json::to_string(r).unwrap_or_default());
    }
    if results.iter().all(|r| r.pass) {
        0
    } else {
        1
    }
}

#[allow(clippy::too_many_lines)]
fn battery(args: &ProbeArgs) -> Vec<ProbeResult> {
    let mut b = Battery { out: Vec::new() };

    // --- process state ---------------------------------------------------
    let sc = status_field("Seccomp");
    b.record(
        "seccomp filter active",
        "Seccomp: 2",
        format!("Seccomp: {sc}"),
        sc == "2",
    );
    let nnp = status_field("NoNewPrivs");
    b.record(
        "no_new_privs",
        "NoNewPrivs: 1",
        format!("NoNewPrivs: {nnp}"),
        nnp == "1",
    );
    let caps: Vec<(String, String)> = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
        .iter()
        .map(|n| (n.to_string(), status_field(n)))
        .collect();
    let all_zero = caps
        .iter()
        .all(|(_, v)| v.chars().all(|ch| ch == '0') && !v.is_empty());
    b.record(
        "no capabilities (inh/prm/eff/bnd/amb)",
        "all 0",
        caps.iter()
            .map(|(n, v)| {
                let shown = if v.trim_start_matches('0').is_empty() {
                    "0"
                } else {
                    v
                };
                format!("{n}={shown}")
            })
            .collect::<Vec<_>>()
            .join(" "),
        all_zero,
    );
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let env_names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    let mut sorted = env_names.clone();
    sorted.sort();
    b.record(
        "environment is clean",
        "HOME LANG PATH TERM USER",
        sorted.join(" "),
        sorted == ["HOME", "LANG", "PATH", "TERM", "USER"],
    );

    // --- terminal injection ---------------------------------------------
    // SAFETY: opening /dev/ptmx gives us a pty master we own.
    let ptmx = unsafe {
        libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    let tty_fd = if ptmx >= 0 { ptmx } else { 0 };
    let ch: libc::c_char = b'x' as libc::c_char;
    // SAFETY: TIOCSTI with a pointer to one valid byte; expected to be refused.
    let r = unsafe { libc::ioctl(tty_fd, libc::TIOCSTI, &ch) };
    b.expect_errno("TIOCSTI refused", r as i64, libc::EPERM);
    // SAFETY: raw ioctl with the request's high bits set (the Flatpak bypass
    // class): the kernel truncates to 32 bits, so the filter must too.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            tty_fd,
            u64::from(libc::TIOCSTI as u32) | (1u64 << 32),
            &ch,
        )
    };
    b.expect_errno("TIOCSTI with high bits refused", r, libc::EPERM);
    let sub: libc::c_char = 2;
    // SAFETY: TIOCLINUX subcode pointer to a valid byte; expected refused.
    let r = unsafe { libc::ioctl(tty_fd, 0x541C, &sub) };
    b.expect_errno("TIOCLINUX refused", r as i64, libc::EPERM);
    if ptmx >= 0 {
        // SAFETY: closing our own fd.
        unsafe { libc::close(ptmx) };
    }

    // --- namespaces and privilege ------------------------------------------
    // SAFETY: unshare with a flag; expected to be refused.
    let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
    b.expect_errno(
        "nested user namespace (unshare) refused",
        r as i64,
        libc::EPERM,
    );
    // SAFETY: raw clone asking for a new user namespace; if it unexpectedly
    // succeeds the child exits at once.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0,
            0,
            0,
            0,
        )
    };
    if r == 0 {
        // SAFETY: in the unexpected child: leave immediately.
        unsafe { libc::_exit(0) };
    }
    b.expect_errno("nested user namespace (clone) refused", r, libc::EPERM);
    // SAFETY: clone3 with a NULL args pointer; the filter answers first.
    let r = unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) };
    b.expect_errno("clone3 answered ENOSYS", r, libc::ENOSYS);
    // SAFETY: mount with valid strings; expected refused.
    let r = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            c"/tmp".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    b.expect_errno("mount refused", r as i64, libc::EPERM);
    // SAFETY: fsopen with a valid string; expected refused.
    let r = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0) };
    b.expect_errno("new mount API (fsopen) refused", r, libc::EPERM);
    // SAFETY: open_tree on a valid path; expected refused.
    let r = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/".as_ptr(), 1) };
    b.expect_errno("new mount API (open_tree) refused", r, libc::EPERM);
    // SAFETY: ptrace attach to init; expected refused.
    let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, 1, 0, 0) };
    b.expect_errno("ptrace refused", r, libc::EPERM);
    let mut buf = [0u8; 8];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: 0x1000 as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: valid iovecs; expected refused before any access.
    let r = unsafe { libc::process_vm_readv(1, &local, 1, &remote, 1, 0) };
    b.expect_errno("process_vm_readv refused", r as i64, libc::EPERM);
    // SAFETY: io_uring_setup with a NULL params pointer; the filter answers first.
    let r = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, 0usize) };
    b.expect_errno("io_uring refused", r, libc::EPERM);
    // SAFETY: bpf with a NULL attr; the filter answers first.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 0, 0usize, 0) };
    b.expect_errno("bpf refused", r, libc::EPERM);
    // SAFETY: keyctl with integer args; the filter answers first.
    let r = unsafe { libc::syscall(libc::SYS_keyctl, 0, 0, 0) };
    b.expect_errno("keyctl refused", r, libc::EPERM);
    // SAFETY: userfaultfd with flags only.
    let r = unsafe { libc::syscall(libc::SYS_userfaultfd, 0) };
    b.expect_errno("userfaultfd refused", r, libc::EPERM);
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: getpid by its x32 number; expected refused by the x32 guard.
        let r = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
        b.expect_errno("x32 syscall numbers refused", r, libc::EPERM);
    }
    // SAFETY: socket with constant arguments; expected refused.
    let r = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) };
    b.expect_errno("AF_VSOCK refused", r as i64, libc::EPERM);
    // SAFETY: as above.
    let r = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    b.expect_errno("AF_PACKET refused", r as i64, libc::EPERM);
    // SAFETY: mknod of a character device in the writable /tmp.
    let r = unsafe {
        libc::mknod(
            c"/tmp/retie-null".as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    };
    b.expect_one_of(
        "mknod of a device refused",
        r as i64,
        &[libc::EPERM, libc::EACCES],
    );

    // --- every rule of the deny table ------------------------------------------
    b.out
        .extend(deny_table_probes(&retie_runtime::NetMode::None, ""));

    // --- filesystem ----------------------------------------------------------
    if let Some(canary) = &args.canary {
        let r = std::fs::read(canary);
        b.record(
            "canary in the real home unreadable",
            "ENOENT",
            match &r {
                Ok(_) => "READ IT".into(),
                Err(e) => ename(e.raw_os_error().unwrap_or(0)),
            },
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::NotFound),
        );
    }
    let home_entries: Vec<String> = std::fs::read_dir("/home")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let home = std::env::var("HOME").unwrap_or_default();
    let home_empty = std::fs::read_dir(&home)
        .map(|d| d.count() == 0)
        .unwrap_or(false);
    b.record(
        "home is a fresh empty tmpfs",
        "empty $HOME",
        format!(
            "$HOME={home} entries={} /home={home_entries:?}",
            if home_empty { 0 } else { 1 }
        ),
        home_empty,
    );
    for secret in [
        "/etc/shadow",
        "/root/.ssh",
        "/var/run/docker.sock",
        "/run/user",
    ] {
        let exists = Path::new(secret).symlink_metadata().is_ok();
        b.record(
            &format!("{secret} absent"),
            "absent",
            if exists {
                "present".into()
            } else {
                "absent".into()
            },
            !exists,
        );
    }
    for target in [
        "/usr/retie-probe",
        "/etc/retie-probe",
        "/retie-probe",
        "/dev/retie-probe",
    ] {
        let fd = try_open(target, libc::O_CREAT | libc::O_WRONLY);
        b.expect_one_of(
            &format!("write outside workspace ({target}) refused"),
            fd,
            &[libc::EROFS, libc::EACCES],
        );
    }
    // A symlink planted in the workspace does not lead out of it.
    let _ = std::fs::remove_file("retie-probe-link");
    let link_ok = std::os::unix::fs::symlink("/etc/passwd", "retie-probe-link").is_ok();
    // Open through the symlink for writing: expected refused.
    let fd = try_open("retie-probe-link", libc::O_WRONLY | libc::O_APPEND);
    if link_ok {
        b.expect_one_of(
            "write through a workspace symlink to /etc refused",
            fd,
            &[libc::EROFS, libc::EACCES],
        );
        let _ = std::fs::remove_file("retie-probe-link");
    } else {
        b.record(
            "write through a workspace symlink to /etc refused",
            "EROFS or EACCES",
            "could not plant the symlink".into(),
            false,
        );
    }
    let wrote = std::fs::write("retie-probe-file", b"ok").is_ok();
    let _ = std::fs::remove_file("retie-probe-file");
    b.record(
        "workspace is writable",
        "write succeeds",
        if wrote {
            "written".into()
        } else {
            "refused".into()
        },
        wrote,
    );
    for knob in ["/proc/sys/kernel/hostname", "/proc/sysrq-trigger"] {
        if !Path::new(knob).exists() && knob == "/proc/sysrq-trigger" {
            b.record(
                &format!("{knob} read-only"),
                "EROFS or EACCES",
                "absent (kernel built without magic sysrq)".into(),
                true,
            );
            continue;
        }
        let fd = try_open(knob, libc::O_WRONLY);
        b.expect_one_of(
            &format!("{knob} read-only"),
            fd,
            &[libc::EROFS, libc::EACCES],
        );
    }

    // --- processes -------------------------------------------------------------
    let pids: Vec<String> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.bytes().all(|c| c.is_ascii_digit()))
                .collect()
        })
        .unwrap_or_default();
    b.record(
        "host pids invisible",
        "only the sandbox's own (<= 2)",
        format!("{} pids: {}", pids.len(), pids.join(",")),
        pids.len() <= 2,
    );
    b.out.extend(init_process_probes());
    if let Some(hp) = args.host_pid {
        // SAFETY: kill with a pid and signal; expected to fail.
        let r = unsafe { libc::kill(hp, libc::SIGTERM) };
        b.expect_one_of(
            &format!("signal to host pid {hp} refused"),
            r as i64,
            &[libc::ESRCH, libc::EPERM],
        );
    }

    // --- network ---------------------------------------------------------------
    if let Some(host) = &args.host_netns {
        // The wall itself, not its effects: seccomp refuses every socket
        // but AF_UNIX and Landlock may scope abstract sockets, so the
        // probes below could pass in the host's namespace too.
        let mine = std::fs::read_link("/proc/self/ns/net")
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"));
        let own = mine.starts_with("net:[") && mine != *host;
        b.record(
            "own network namespace",
            &format!("a namespace other than the host's {host}"),
            mine,
            own,
        );
    }
    if let Some(name) = &args.abstract_socket {
        b.expect_one_of(
            "host abstract unix socket unreachable",
            connect_abstract(name),
            &[libc::ECONNREFUSED, libc::EPERM],
        );
    }
    let ifaces: Vec<String> = std::fs::read_to_string("/proc/net/dev")
        .unwrap_or_default()
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|s| s.trim().to_string()))
        .collect();
    b.record("interfaces", "lo only", ifaces.join(","), ifaces == ["lo"]);
    let routes = std::fs::read_to_string("/proc/net/route")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .count();
    let routes6: Vec<String> = std::fs::read_to_string("/proc/net/ipv6_route")
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_end().ends_with(" lo"))
        .map(|s| s.to_string())
        .collect();
    b.record(
        "no IPv4 route",
        "0 routes",
        format!("{routes} routes"),
        routes == 0,
    );
    b.record(
        "no IPv6 route off lo",
        "0 routes",
        format!("{} routes", routes6.len()),
        routes6.is_empty(),
    );
    for target in &args.tcp {
        b.expect_errno(
            &format!("TCP connect to host listener {target} refused"),
            connect_tcp(target),
            libc::EPERM,
        );
    }
    // SAFETY: socket with constants; expected refused in no-network mode.
    let r = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0) };
    b.expect_errno("IPv6 socket refused", r as i64, libc::EPERM);
    // SAFETY: as above.
    let r = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) };
    b.expect_errno("netlink socket refused", r as i64, libc::EPERM);
    let dns = std::net::ToSocketAddrs::to_socket_addrs(&("retie-selftest.invalid", 80));
    b.record(
        "DNS resolution fails",
        "lookup error",
        match &dns {
            Ok(a) => format!("resolved {:?}", a.clone().collect::<Vec<_>>()),
            Err(e) => format!("error: {e}"),
        },
        dns.is_err(),
    );
    let _ = uid;

    // --- resource limits (ADR 0418) --------------------------------------
    for cap in &args.tmpfs_cap {
        let Some((path, mib)) = cap.split_once('=') else {
            b.record(
                &format!("tmpfs cap {cap}"),
                "PATH=MIB",
                "malformed".into(),
                false,
            );
            continue;
        };
        let path = if path == "HOME" {
            std::env::var("HOME").unwrap_or_else(|_| "$HOME unset".into())
        } else {
            path.to_string()
        };
        let observed = match rustix::fs::statvfs(path.as_str()) {
            Ok(v) => format!("{} MiB", v.f_blocks.saturating_mul(v.f_frsize) >> 20),
            Err(e) => ename(e.raw_os_error()),
        };
        let expected = format!("{mib} MiB");
        let pass = observed == expected;
        b.record(&format!("tmpfs {path} capped"), &expected, observed, pass);
    }
    let nproc = rustix::process::getrlimit(rustix::process::Resource::Nproc).maximum;
    let shown = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    match args.nproc {
        Some(want) => b.record(
            "process limit (RLIMIT_NPROC, per user namespace)",
            &want.to_string(),
            shown(nproc),
            nproc == Some(want),
        ),
        None => b.record(
            "process limit (RLIMIT_NPROC, per user namespace)",
            "not set by the profile",
            shown(nproc),
            true,
        ),
    }
    b.out
}

/// open(2) a path (closing it again if that worked); errno is left as open
/// set it.
fn try_open(path: &str, flags: libc::c_int) -> i64 {
    let p = c(path);
    // SAFETY: a valid C string; the fd, if any, is ours and closed below.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd >= 0 {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
    }
    fd as i64
}

fn connect_abstract(name: &str) -> i64 {
    // SAFETY: a unix socket we close below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return -1;
    }
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    let n = bytes.len().min(addr.sun_path.len() - 1);
    for (i, byte) in bytes[..n].iter().enumerate() {
        addr.sun_path[i + 1] = *byte as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + n) as libc::socklen_t;
    // SAFETY: a valid address of the given length.
    let r = unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) };
    let e = errno();
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    if r < 0 {
        // SAFETY: restore errno for the caller's check.
        unsafe { *libc::__errno_location() = e };
    }
    r as i64
}

fn connect_tcp(target: &str) -> i64 {
    let Ok(addr) = target.parse::<std::net::SocketAddrV4>() else {
        return -1;
    };
    // SAFETY: socket with constants; expected refused by seccomp.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return -1;
    }
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in.
    let r = unsafe {
        libc::connect(
            fd,
            (&sin as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    };
    let e = errno();
    // SAFETY: closing our own fd.
    unsafe { libc::close(fd) };
    if r < 0 {
        // SAFETY: restore errno for the caller's check.
        unsafe { *libc::__errno_location() = e };
    }
    r as i64
}
