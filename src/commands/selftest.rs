//! `retie selftest`: prove the sandbox on this very machine.
//!
//! The host side plants what must stay out of reach (a canary in the real
//! home, TCP listeners on loopback and on the host's own interface
//! address, an abstract unix socket, its own pid), then runs the probe
//! battery (`retie __probe`) inside a real sandbox and prints what each
//! probe expected and observed. Exit 0 only if every probe passes, 1 if
//! one fails; 125 (or 126/127, ADR 0005) if retie could not run them.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use retie_runtime::{Profile, Sandbox, Stdio};
use serde_json::json;

use super::probe::ProbeResult;
use crate::error::CliError;

#[derive(Args)]
pub struct SelftestArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Filesystem profile to test (default: host).
    #[arg(long, default_value = "host")]
    pub profile: String,
}

const PROBE_PATH: &str = "/.retie/retie";

struct Canary(PathBuf);
impl Drop for Canary {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn run(args: SelftestArgs) -> i32 {
    let started = Instant::now();
    match selftest(&args) {
        Ok((rows, abi)) => {
            let landlock = retie_runtime::preflight::landlock_in_use().ok();
            let pass = rows.iter().all(|r| r.pass);
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            if args.json {
                println!(
                    "{}",
                    json!({
                        "pass": pass,
                        "landlock_abi": abi,
                        "landlock": landlock.map(|l| json!({
                            "kernel": l.kernel,
                            "used": l.used,
                            "cap": l.cap,
                            "missing": retie_runtime::preflight::landlock_gaps(l.used)
                                .iter()
                                .map(|g| json!({
                                    "abi": g.abi,
                                    "linux": g.linux,
                                    "missing": g.missing,
                                    "instead": g.instead,
                                }))
                                .collect::<Vec<_>>(),
                        })),
                        "duration_ms": ms.round(),
                        "probes": rows
                    })
                );
            } else {
                let table: Vec<Vec<String>> = rows
                    .iter()
                    .map(|r| {
                        vec![
                            r.probe.clone(),
                            r.expected.clone(),
                            r.observed.clone(),
                            if r.pass { "PASS".into() } else { "FAIL".into() },
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    crate::ui::table(&["probe", "expected", "observed", "result"], &table)
                );
                let failed = rows.iter().filter(|r| !r.pass).count();
                println!(
                    "\n{} probes, {} failed, Landlock ABI {abi}, {:.0} ms: {}",
                    rows.len(),
                    failed,
                    ms,
                    if pass {
                        "the sandbox holds on this machine"
                    } else {
                        "THE SANDBOX DOES NOT HOLD: see FAIL rows"
                    }
                );
            }
            if pass {
                0
            } else {
                1
            }
        }
        Err(e) => {
            if args.json {
                println!("{}", json!({ "pass": false, "error": e.to_string() }));
            }
            eprintln!("retie selftest: {e}");
            e.exit_code()
        }
    }
}

fn selftest(args: &SelftestArgs) -> Result<(Vec<ProbeResult>, i32), CliError> {
    let profile = Profile::load(&args.profile)?;
    let mut rows = Vec::new();

    // Preflight, reported as rows.
    let userns = retie_runtime::preflight::userns_problem();
    rows.push(ProbeResult {
        probe: "preflight: user namespaces".into(),
        expected: "available".into(),
        observed: userns.as_ref().map_or("available".into(), |f| {
            format!("{} (fix: {})", f.problem, f.fix)
        }),
        pass: userns.is_none(),
    });
    let landlock = retie_runtime::preflight::landlock_in_use();
    rows.push(ProbeResult {
        probe: "preflight: Landlock ABI".into(),
        expected: format!(">= {}", profile.landlock.min_abi),
        observed: match &landlock {
            Ok(l) => l.describe(),
            Err(f) => format!("{} (fix: {})", f.problem, f.fix),
        },
        pass: matches!(&landlock, Ok(l) if l.used >= profile.landlock.min_abi),
    });
    let Ok(landlock) = landlock else {
        return Ok((rows, 0));
    };
    rows.extend(landlock_gap_rows(&landlock));
    if rows.iter().any(|r| !r.pass) {
        return Ok((rows, landlock.used));
    }

    // What must stay out of reach.
    let ws = tempfile::Builder::new()
        .prefix("retie-selftest-")
        .tempdir()
        .map_err(|e| CliError::io("creating the self-test workspace", e))?;
    let canary = plant_canary()?;
    let lo = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| CliError::io("listening on loopback", e))?;
    let mut tcp = vec![lo
        .local_addr()
        .map_err(|e| CliError::io("listener address", e))?
        .to_string()];
    let host_ip = host_interface_ipv4();
    let _ext = match host_ip {
        Some(ip) => {
            let l = TcpListener::bind((ip, 0))
                .map_err(|e| CliError::io(format!("listening on {ip}"), e))?;
            tcp.push(
                l.local_addr()
                    .map_err(|e| CliError::io("listener address", e))?
                    .to_string(),
            );
            Some(l)
        }
        None => None,
    };
    let my_pid = std::process::id();
    let abstract_name = format!("retie-selftest-{my_pid}");
    let addr = SocketAddr::from_abstract_name(abstract_name.as_bytes())
        .map_err(|e| CliError::io("abstract socket name", e))?;
    let _abstract = UnixListener::bind_addr(&addr)
        .map_err(|e| CliError::io("listening on an abstract socket", e))?;

    let exe = std::env::current_exe().map_err(|e| CliError::io("locating the retie binary", e))?;
    let mut argv: Vec<String> = vec![PROBE_PATH.into(), "__probe".into()];
    argv.extend(["--canary".into(), canary.0.display().to_string()]);
    for t in &tcp {
        argv.extend(["--tcp".into(), t.clone()]);
    }
    argv.extend([
        "--abstract-socket".into(),
        abstract_name,
        "--host-pid".into(),
        my_pid.to_string(),
    ]);
    let host_netns = std::fs::read_link("/proc/self/ns/net")
        .map_err(|e| CliError::io("reading this process's network namespace", e))?;
    argv.extend(["--host-netns".into(), host_netns.display().to_string()]);
    // The limits the profile sets, checked from inside (ADR 0418).
    let fs = &profile.filesystem;
    let scratch = fs.tmpfs_size_mib;
    for p in &fs.tmpfs {
        argv.extend(["--tmpfs-cap".into(), format!("{}={scratch}", p.display())]);
    }
    argv.extend(["--tmpfs-cap".into(), format!("HOME={scratch}")]);
    argv.extend([
        "--tmpfs-cap".into(),
        format!("/dev/shm={}", fs.shm_size_mib),
    ]);
    if let Some(n) = profile.limits.nproc {
        argv.extend(["--nproc".into(), n.to_string()]);
    }

    let spec = Sandbox::builder(&argv)
        .workspace(ws.path())
        .profile(profile)
        .ro_bind(&exe, PROBE_PATH)
        .timeout(std::time::Duration::from_secs(20))
        .build()?;
    let (out_r, out_w) = pipe()?;
    let stderr = dup_stderr()?;
    let outcome = retie_runtime::run(
        &spec,
        Stdio::Fds {
            stdin: None,
            stdout: Some(out_w),
            stderr: Some(stderr),
        },
    )?;
    let mut text = String::new();
    std::fs::File::from(out_r)
        .read_to_string(&mut text)
        .map_err(|e| CliError::io("reading the probe output", e))?;
    let results: Vec<ProbeResult> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();

    rows.push(ProbeResult {
        probe: "Landlock enforced inside".into(),
        expected: format!("fully, ABI >= {}", spec.profile().landlock.min_abi),
        observed: format!(
            "{}, ABI {}",
            if outcome.landlock_enforced {
                "fully"
            } else {
                "NOT fully"
            },
            outcome.landlock_abi
        ),
        pass: outcome.landlock_enforced && outcome.landlock_abi >= spec.profile().landlock.min_abi,
    });
    rows.push(ProbeResult {
        probe: "probe battery ran to completion".into(),
        expected: "exit 0 or 1, >= 40 results".into(),
        observed: format!("exit {}, {} results", outcome.exit_code, results.len()),
        pass: (outcome.exit_code == 0 || outcome.exit_code == 1) && results.len() >= 40,
    });
    if host_ip.is_none() {
        rows.push(ProbeResult {
            probe: "host interface listener".into(),
            expected: "a non-loopback IPv4 address to test".into(),
            observed: "this host has none (loopback listener tested)".into(),
            pass: true,
        });
    }
    rows.extend(results);
    rows.push(memory_limit_row());
    // The lab network, with a throwaway lab; refused below ABI 4.
    if landlock.used < retie_runtime::preflight::LAB_MIN_ABI {
        rows.push(lab_refused_row(&exe, spec.profile(), ws.path()));
    } else {
        match lab_section(&exe, spec.profile(), &tcp) {
            Ok(r) => rows.extend(r),
            Err(e) => rows.push(ProbeResult {
                probe: "lab network".into(),
                expected: "a throwaway lab starts".into(),
                observed: e.to_string(),
                pass: false,
            }),
        }
    }
    Ok((rows, outcome.landlock_abi))
}

/// Name of the row that lists the Landlock walls this kernel lacks.
pub const LANDLOCK_GAPS_ROW: &str = "Landlock walls missing at this ABI";
/// Name of the row that proves the lab modes are refused below ABI 4.
pub const LAB_REFUSED_ROW: &str = "lab modes refused below Landlock ABI 4";

/// What the Landlock ABI in use lacks, one row each, with the wall that
/// stands in (ADR 0430); the stand-ins themselves are probed by the
/// battery (own network and pid namespaces, the socket families, the
/// read-only mounts).
fn landlock_gap_rows(l: &retie_runtime::preflight::LandlockAbi) -> Vec<ProbeResult> {
    let gaps = retie_runtime::preflight::landlock_gaps(l.used);
    let mut rows = vec![ProbeResult {
        probe: LANDLOCK_GAPS_ROW.into(),
        expected: "reported".into(),
        observed: if gaps.is_empty() {
            format!("none: {} has every wall retie uses", l.describe())
        } else {
            gaps.iter()
                .map(|g| format!("ABI {}", g.abi))
                .collect::<Vec<_>>()
                .join(", ")
        },
        pass: true,
    }];
    for g in gaps {
        rows.push(ProbeResult {
            probe: format!(
                "Landlock ABI {} (Linux {}) not in use: {}",
                g.abi, g.linux, g.missing
            ),
            expected: "another wall stands in".into(),
            observed: g.instead.into(),
            pass: true,
        });
    }
    rows
}

/// Below ABI 4 a lab-mode sandbox must be refused before it starts, with
/// the fix: tried for real (the refusal comes before the lab is looked
/// up, so no lab is needed).
fn lab_refused_row(exe: &std::path::Path, profile: &Profile, ws: &std::path::Path) -> ProbeResult {
    let lab = retie_runtime::LabNet {
        name: "selftest".into(),
        keeper_pid: 0,
        ports: vec![LAB_PORT],
    };
    let argv = [PROBE_PATH.to_string(), "__lab-probe".into()];
    let observed = match Sandbox::builder(&argv)
        .workspace(ws)
        .profile(profile.clone())
        .ro_bind(exe, PROBE_PATH)
        .network(retie_runtime::NetMode::Lab(lab))
        .timeout(std::time::Duration::from_secs(20))
        .build()
    {
        Err(e) => format!("not built: {e}"),
        Ok(spec) => match retie_runtime::run(&spec, Stdio::Inherit) {
            Ok(o) => format!("RAN (exit {})", o.exit_code),
            Err(e) => e.to_string().replace("\n ", ""),
        },
    };
    let pass = observed.contains("the lab modes need Landlock's TCP port rules");
    ProbeResult {
        probe: LAB_REFUSED_ROW.into(),
        expected: "refused before the sandbox starts, naming the fix".into(),
        observed,
        pass,
    }
}

/// Whether a memory limit could hold here: retie does not place
/// sandboxes in a cgroup yet (ADR 0418), so this row reports what the host
/// offers and the fix; a profile that asks for `limits.memory_mib` is
/// refused when it loads. The tmpfs caps and RLIMIT_NPROC rows above are
/// the limits that hold.
fn memory_limit_row() -> ProbeResult {
    let v2 =
        rustix::fs::statfs("/sys/fs/cgroup").is_ok_and(|s| s.f_type == libc::CGROUP2_SUPER_MAGIC);
    let controllers = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .or_else(|_| std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers"))
        .unwrap_or_default();
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    let host = if v2 {
        format!(
            "cgroup v2 (controllers: {})",
            if controllers.trim().is_empty() {
                "none"
            } else {
                controllers.trim()
            }
        )
    } else if has("memory") && has("pids") {
        "cgroup v1 with a v2 hierarchy holding memory and pids".into()
    } else {
        format!(
            "cgroup v1 (the v2 hierarchy holds: {})",
            if controllers.trim().is_empty() {
                "nothing"
            } else {
                controllers.trim()
            }
        )
    };
    ProbeResult {
        probe: "memory and cgroup pids limit".into(),
        expected: "reported".into(),
        observed: format!(
            "not applied: retie places no sandbox in a cgroup yet; this host: {host}; fix: \
             a unified cgroup v2 hierarchy (systemd.unified_cgroup_hierarchy=1) with memory \
             and pids delegated (systemd-run --user --scope -p Delegate=yes) once retie uses it \
             (ADR 0418); until then tmpfs caps and RLIMIT_NPROC hold"
        ),
        pass: true,
    }
}

/// A canary in the invoking user's real home directory.
fn plant_canary() -> Result<Canary, CliError> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .ok_or_else(|| {
            CliError::Usage(
                "HOME is not set: the self-test plants a canary in your home directory".into(),
            )
        })?;
    let path = home.join(format!(".retie-selftest-canary-{}", std::process::id()));
    std::fs::write(
        &path,
        b"retie canary: if a sandbox can read this, it is broken\n",
    )
    .map_err(|e| CliError::io(format!("planting the canary {}", path.display()), e))?;
    Ok(Canary(path))
}

/// The first non-loopback IPv4 address of an interface that is up.
pub fn host_interface_ipv4() -> Option<Ipv4Addr> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null()
            && ifa.ifa_flags & libc::IFF_UP as u32 != 0
            && ifa.ifa_flags & libc::IFF_LOOPBACK as u32 == 0
        {
            // SAFETY: ifa_addr is non-null and points at a sockaddr.
            let family = unsafe { (*ifa.ifa_addr).sa_family };
            if family == libc::AF_INET as libc::sa_family_t {
                // SAFETY: for AF_INET the address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !IpAddr::V4(ip).is_loopback() {
                    found = Some(ip);
                    break;
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: freeing the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(addrs) };
    found
}

fn pipe() -> Result<(OwnedFd, OwnedFd), CliError> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| CliError::io("pipe", e.into()))?;
    // A larger buffer so the probe never blocks (best effort).
    let _ = rustix::pipe::fcntl_setpipe_size(&r, 1 << 20);
    Ok((r, w))
}

fn dup_stderr() -> Result<OwnedFd, CliError> {
    rustix::io::fcntl_dupfd_cloexec(std::io::stderr(), 3)
        .map_err(|e| CliError::io("dup stderr", e.into()))
}

// ---------------------------------------------------------------------------
// The lab section: a throwaway lab, probed from a lab-mode sandbox and from
// inside the lab itself.

/// Ports of the throwaway lab: the first is declared, the second is not.
const LAB_PORT: u16 = 18080;
const LAB_CLOSED_PORT: u16 = 18081;

/// `retie __lab-probe`: run inside the self-test's lab sandboxes.
#[derive(Args)]
pub struct LabProbeArgs {
    /// Serve these ports (the lab target's role) until killed.
    #[arg(long = "serve")]
    pub serve: Vec<u16>,
    /// Probe from inside the lab (the target's network).
    #[arg(long)]
    pub inside_lab: bool,
    /// Host TCP listeners (ADDR:PORT) that must be unreachable.
    #[arg(long = "tcp")]
    pub tcp: Vec<String>,
}

pub fn lab_probe(args: LabProbeArgs) -> i32 {
    if !args.serve.is_empty() {
        let listeners: Vec<TcpListener> = args
            .serve
            .iter()
            .filter_map(|p| TcpListener::bind((Ipv4Addr::UNSPECIFIED, *p)).ok())
            .collect();
        if listeners.len() != args.serve.len() {
            return 1;
        }
        // The signal that ends us ends the wait.
        loop {
            rustix::event::pause();
        }
    }
    let mut rows = Vec::new();
    let generated;
    let mut row = |probe: &str, expected: &str, observed: String| {
        let pass = observed == expected;
        rows.push(ProbeResult {
            probe: probe.into(),
            expected: expected.into(),
            observed,
            pass,
        });
    };
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let default = routes
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().nth(1) == Some("00000000"));
    let prefix = if args.inside_lab {
        "lab itself"
    } else {
        "lab sandbox"
    };
    row(
        &format!("{prefix}: no default route"),
        "none",
        if default { "present" } else { "none" }.into(),
    );
    if args.inside_lab {
        let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
        let links: Vec<&str> = dev
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(str::trim)
            .filter(|n| !n.starts_with("rl"))
            .collect();
        row(
            "lab itself: no uplink (only lo and sandbox veths)",
            "lo",
            links.join(","),
        );
        for t in &args.tcp {
            row(
                &format!("lab itself: TCP connect to host listener {t} refused"),
                "refused",
                tcp_result(t),
            );
        }
        // The target's own undeclared port: Landlock refuses the lab
        // itself every connect, Fast Open included.
        let own = std::net::SocketAddrV4::new(retie_runtime::LAB_ADDRESS, LAB_CLOSED_PORT);
        for (what, observed) in tcp_without_connect(own) {
            row(&format!("lab itself: {what}"), "EPERM", observed);
        }
        generated = super::probe::deny_table_probes(
            &retie_runtime::NetMode::LabTarget(any_lab()),
            "lab itself: ",
        );
    } else {
        let lab = format!("{}:{LAB_PORT}", retie_runtime::LAB_ADDRESS);
        row(
            "lab sandbox: lab port reachable",
            "connected",
            tcp_result(&lab),
        );
        let closed = format!("{}:{LAB_CLOSED_PORT}", retie_runtime::LAB_ADDRESS);
        // The target listens on this port: only Landlock refuses it.
        row(
            "lab sandbox: undeclared lab port refused (Landlock)",
            "EACCES",
            tcp_errno(&closed),
        );
        // Landlock has no UDP rules before ABI 10: the seccomp table
        // refuses every datagram socket (ADR 0302).
        let lab_ip = retie_runtime::LAB_ADDRESS;
        row(
            "lab sandbox: UDP to an undeclared lab port refused",
            "EPERM",
            udp_result(&format!("{lab_ip}:{LAB_CLOSED_PORT}")),
        );
        row(
            "lab sandbox: UDP to the lab's declared port refused",
            "EPERM",
            udp_result(&format!("{lab_ip}:{LAB_PORT}")),
        );
        // TCP without the connect() Landlock checks (ADR 0302).
        let closed4 = std::net::SocketAddrV4::new(lab_ip, LAB_CLOSED_PORT);
        for (what, observed) in tcp_without_connect(closed4) {
            row(&format!("lab sandbox: {what}"), "EPERM", observed);
        }
        row(
            "lab sandbox: listen without bind refused",
            "EPERM",
            listen_without_bind(),
        );
        let ping = rustix::net::socket_with(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::DGRAM,
            rustix::net::SocketFlags::CLOEXEC,
            Some(rustix::net::ipproto::ICMP),
        );
        row(
            "lab sandbox: ICMP ping socket refused",
            "EPERM",
            match ping {
                Ok(_) => "opened".into(),
                Err(e) => errno_name(e.raw_os_error()),
            },
        );
        generated = super::probe::deny_table_probes(
            &retie_runtime::NetMode::Lab(any_lab()),
            "lab sandbox: ",
        );
        for t in &args.tcp {
            row(
                &format!("lab sandbox: TCP connect to host listener {t} refused"),
                "refused",
                tcp_result(t),
            );
            // The same address on the lab's own port: Landlock lets it
            // through, so only the routing table stands in the way.
            if let Ok(a) = t.parse::<std::net::SocketAddrV4>() {
                row(
                    &format!("lab sandbox: {}:{LAB_PORT} has no route", a.ip()),
                    "unreachable",
                    tcp_result(&format!("{}:{LAB_PORT}", a.ip())),
                );
            }
        }
        for r in super::probe::init_process_probes() {
            row(&format!("lab sandbox: {}", r.probe), "EACCES", r.observed);
        }
        row(
            "lab sandbox: DNS resolution fails",
            "fails",
            match std::net::ToSocketAddrs::to_socket_addrs("example.com:80") {
                Ok(_) => "resolved".into(),
                Err(_) => "fails".into(),
            },
        );
        row(
            "lab sandbox: IPv6 socket refused",
            "refused",
            match std::net::TcpStream::connect("[::1]:1") {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => "refused".into(),
                Err(e) => format!("other: {e}"),
                Ok(_) => "connected".into(),
            },
        );
    }
    rows.extend(generated);
    for r in rows {
        println!("{}", json!(r));
    }
    0
}

/// The ways found to open a TCP connection without the `connect()`
/// Landlock checks (issue 26, item 1; ADR 0302), each tried against
/// `target` (a listening port nothing may reach) from a non-blocking
/// socket: `(what, errno name or what happened)`. Every one must be EPERM
/// (the lab modes' seccomp table) in both lab modes.
fn tcp_without_connect(target: std::net::SocketAddrV4) -> Vec<(&'static str, String)> {
    const MSG_FASTOPEN: libc::c_int = 0x2000_0000;
    const TCP_FASTOPEN_CONNECT: libc::c_int = 30;
    const IPPROTO_MPTCP: libc::c_int = 262;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: target.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*target.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let addr_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let stream = |proto: libc::c_int| -> Result<OwnedFd, String> {
        // SAFETY: socket() takes no pointers; a non-negative result is a
        // fresh descriptor we own.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                proto,
            )
        };
        if fd < 0 {
            Err(errno_name(
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            ))
        } else {
            // SAFETY: fd was just returned by socket() and is owned by nobody else.
            Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        }
    };
    let outcome = |r: isize| {
        if r >= 0 {
            "sent".to_string()
        } else {
            errno_name(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    };
    let mut data = *b"retie";
    let mut rows = Vec::new();
    let fd = |f: &OwnedFd| std::os::fd::AsRawFd::as_raw_fd(f);
    rows.push((
        "TCP Fast Open sendto to an undeclared port refused",
        stream(0).map_or_else(
            |e| e,
            |s| {
                // SAFETY: data and addr live across the call, their lengths are exact.
                let r = unsafe {
                    libc::sendto(
                        fd(&s),
                        data.as_ptr().cast(),
                        data.len(),
                        MSG_FASTOPEN,
                        std::ptr::from_ref(&addr).cast(),
                        addr_len,
                    )
                };
                outcome(r)
            },
        ),
    ));
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = std::ptr::from_ref(&addr).cast_mut().cast();
    msg.msg_namelen = addr_len;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    rows.push((
        "TCP Fast Open sendmsg to an undeclared port refused",
        stream(0).map_or_else(
            |e| e,
            |s| {
                // SAFETY: msg points at addr and iov, which point at data; all
                // live across the call.
                outcome(unsafe { libc::sendmsg(fd(&s), &raw const msg, MSG_FASTOPEN) })
            },
        ),
    ));
    let mut mmsg = [libc::mmsghdr {
        msg_hdr: msg,
        msg_len: 0,
    }];
    rows.push((
        "TCP Fast Open sendmmsg to an undeclared port refused",
        stream(0).map_or_else(
            |e| e,
            |s| {
                // SAFETY: one valid mmsghdr whose pointers live across the call.
                let r = unsafe { libc::sendmmsg(fd(&s), mmsg.as_mut_ptr(), 1, MSG_FASTOPEN as _) };
                outcome(r as isize)
            },
        ),
    ));
    let on: libc::c_int = 1;
    let int_len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    rows.push((
        "TCP_FASTOPEN_CONNECT refused",
        stream(0).map_or_else(
            |e| e,
            |s| {
                // SAFETY: on is a live c_int and int_len its size.
                let r = unsafe {
                    libc::setsockopt(
                        fd(&s),
                        libc::IPPROTO_TCP,
                        TCP_FASTOPEN_CONNECT,
                        std::ptr::from_ref(&on).cast(),
                        int_len,
                    )
                };
                outcome(r as isize)
            },
        ),
    ));
    rows.push((
        "MPTCP socket refused (Landlock checks TCP only)",
        match stream(IPPROTO_MPTCP) {
            Ok(_) => "opened".into(),
            Err(e) => e,
        },
    ));
    rows
}

/// `listen()` on a socket never bound: EPERM in a lab sandbox (it would
/// bind an ephemeral port itself, past Landlock's bind rule).
fn listen_without_bind() -> String {
    let s = rustix::net::socket_with(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    );
    match s {
        Err(e) => format!("socket: {}", errno_name(e.raw_os_error())),
        Ok(s) => match rustix::net::listen(&s, 1) {
            Ok(()) => "listening".into(),
            Err(e) => errno_name(e.raw_os_error()),
        },
    }
}

/// A lab description for choosing a deny table (only the mode matters).
fn any_lab() -> retie_runtime::LabNet {
    retie_runtime::LabNet {
        name: String::new(),
        keeper_pid: 0,
        ports: Vec::new(),
    }
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EPERM => "EPERM".into(),
        libc::EACCES => "EACCES".into(),
        libc::ECONNREFUSED => "ECONNREFUSED".into(),
        libc::ENETUNREACH => "ENETUNREACH".into(),
        libc::EHOSTUNREACH => "EHOSTUNREACH".into(),
        libc::ETIMEDOUT => "ETIMEDOUT".into(),
        e => format!("errno {e}"),
    }
}

/// `connected` or the exact errno name of a TCP connect.
fn tcp_errno(target: &str) -> String {
    let Ok(addr) = target.parse::<std::net::SocketAddr>() else {
        return format!("bad address {target}");
    };
    match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)) {
        Ok(_) => "connected".into(),
        Err(e) => e
            .raw_os_error()
            .map_or_else(|| format!("other: {e}"), errno_name),
    }
}

/// `sent` or the exact errno name of a UDP datagram to `target`.
fn udp_result(target: &str) -> String {
    let sent = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.send_to(b"retie", target));
    match sent {
        Ok(_) => "sent".into(),
        Err(e) => e
            .raw_os_error()
            .map_or_else(|| format!("other: {e}"), errno_name),
    }
}

/// `connected`, `refused` (EACCES/EPERM/ECONNREFUSED), `unreachable`, or the error.
fn tcp_result(target: &str) -> String {
    let Ok(addr) = target.parse::<std::net::SocketAddr>() else {
        return format!("bad address {target}");
    };
    match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)) {
        Ok(_) => "connected".into(),
        Err(e) => match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM | libc::ECONNREFUSED) => "refused".into(),
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH) => "unreachable".into(),
            _ => format!("other: {e}"),
        },
    }
}

/// Start a throwaway lab, probe it, stop it. Rows for the table.
fn lab_section(
    exe: &std::path::Path,
    profile: &Profile,
    tcp: &[String],
) -> Result<Vec<ProbeResult>, CliError> {
    let (uid, gid) = retie_runtime::lab::owner();
    let keeper = retie_runtime::lab::spawn_keeper(uid, gid)?;
    let ws = tempfile::Builder::new()
        .prefix("retie-selftest-lab-")
        .tempdir()
        .map_err(|e| CliError::io("creating the lab's workspace", e))?;
    let lab = |ports: Vec<u16>, target: bool| retie_runtime::LabNet {
        name: "selftest".into(),
        keeper_pid: keeper.pid,
        ports: if target { Vec::new() } else { ports },
    };
    let serve = vec![
        PROBE_PATH.to_string(),
        "__lab-probe".into(),
        "--serve".into(),
        LAB_PORT.to_string(),
        "--serve".into(),
        LAB_CLOSED_PORT.to_string(),
    ];
    let target_spec = Sandbox::builder(&serve)
        .workspace(ws.path())
        .profile(profile.clone())
        .ro_bind(exe, PROBE_PATH)
        .network(retie_runtime::NetMode::LabTarget(lab(vec![], true)))
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    // The target runs in a child of ours (run() blocks until it ends).
    // SAFETY: single-threaded; the child runs one sandbox and _exits.
    let server = unsafe { libc::fork() };
    if server < 0 {
        keeper.stop();
        return Err(CliError::io("fork", std::io::Error::last_os_error()));
    }
    if server == 0 {
        let code = match retie_runtime::run(&target_spec, Stdio::Inherit) {
            Ok(o) => o.exit_code,
            Err(_) => crate::error::EXIT_FAILED,
        };
        // SAFETY: ending the child without running the parent's handlers.
        unsafe { libc::_exit(code) };
    }
    let result = (|| {
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while !super::lab::listening(keeper.pid, &[LAB_PORT, LAB_CLOSED_PORT]) {
            if Instant::now() > deadline {
                return Err(CliError::Usage(
                    "the self-test's lab target did not start listening within 10 s".into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut rows = Vec::new();
        for inside in [false, true] {
            let mut argv = vec![PROBE_PATH.to_string(), "__lab-probe".into()];
            if inside {
                argv.push("--inside-lab".into());
            }
            for t in tcp {
                argv.extend(["--tcp".into(), t.clone()]);
            }
            let net = if inside {
                retie_runtime::NetMode::LabTarget(lab(vec![], true))
            } else {
                retie_runtime::NetMode::Lab(lab(vec![LAB_PORT], false))
            };
            let spec = Sandbox::builder(&argv)
                .workspace(ws.path())
                .profile(profile.clone())
                .ro_bind(exe, PROBE_PATH)
                .network(net)
                .timeout(std::time::Duration::from_secs(20))
                .build()?;
            let (out_r, out_w) = pipe()?;
            let outcome = retie_runtime::run(
                &spec,
                Stdio::Fds {
                    stdin: None,
                    stdout: Some(out_w),
                    stderr: Some(dup_stderr()?),
                },
            )?;
            let mut text = String::new();
            std::fs::File::from(out_r)
                .read_to_string(&mut text)
                .map_err(|e| CliError::io("reading the lab probe output", e))?;
            let got: Vec<ProbeResult> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            rows.push(ProbeResult {
                probe: format!(
                    "{} probes ran",
                    if inside { "lab itself" } else { "lab sandbox" }
                ),
                expected: "exit 0, >= 3 results".into(),
                observed: format!("exit {}, {} results", outcome.exit_code, got.len()),
                pass: outcome.exit_code == 0 && got.len() >= 3,
            });
            rows.extend(got);
        }
        Ok(rows)
    })();
    // Stop and reap the target's supervisor we forked; its sandbox dies
    // with it (PDEATHSIG), the lab with the keeper.
    if let Some(pid) = rustix::process::Pid::from_raw(server) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
    keeper.stop();
    result
}
