//! A lab's network: a user namespace and a network namespace of its own,
//! held open by a **keeper** process that does nothing but wait.
//!
//! The lab namespace has `lo` (with the lab's address,
//! [`LAB_ADDRESS`](crate::setup::net_lab::LAB_ADDRESS)), IPv6 off, and
//! later one veth end per lab-mode sandbox. It has no uplink of any kind:
//! nothing in it was ever connected to the host's network.
//!
//! The keeper runs as the sandbox's host identity (65534 when retie is
//! invoked as root), so the lab's user namespace belongs to the same uid
//! that every sandbox's net stage takes (see `setup::net_lab`). It dies
//! with the process that spawned it (PR_SET_PDEATHSIG), which takes the
//! namespaces, and every veth in them, with it.

use std::io::Read;
use std::os::fd::AsRawFd;

use crate::error::{Result, RuntimeError};
use crate::setup::net_lab::{ipv6_off, LAB_ADDRESS};
use crate::setup::netlink::{if_index, Netlink};

/// A running keeper (the caller's child).
#[derive(Debug)]
pub struct Keeper {
    pub pid: i32,
}

impl Keeper {
    /// Kill and reap the keeper: the lab's namespaces go with it.
    pub fn stop(self) {
        // SAFETY: signalling and reaping our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Fork a keeper whose namespaces form a new lab, owned by host uid/gid
/// `uid`/`gid`. The caller must be single-threaded.
pub fn spawn_keeper(uid: u32, gid: u32) -> Result<Keeper> {
    let (rd, wr) = crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    let parent = std::process::id() as i32;
    // SAFETY: the caller is single-threaded; the child only runs `keep`,
    // which never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(RuntimeError::last_os("fork of the lab keeper"));
    }
    if pid == 0 {
        drop(rd);
        let msg = match keeper_setup(uid, gid, parent) {
            Ok(()) => "R\n".to_string(),
            Err(e) => format!("E{e}\n"),
        };
        let _ = crate::sys::write_all(wr.as_raw_fd(), msg.as_bytes());
        if !msg.starts_with('R') {
            // SAFETY: ending the child without exit handlers.
            unsafe { libc::_exit(1) };
        }
        drop(wr);
        loop {
            // SAFETY: waiting for a signal; SIGKILL (or the parent's death)
            // ends us.
            unsafe { libc::pause() };
        }
    }
    drop(wr);
    let mut text = String::new();
    let _ = std::fs::File::from(rd).read_to_string(&mut text);
    if text.starts_with('R') {
        return Ok(Keeper { pid });
    }
    Keeper { pid }.stop();
    Err(RuntimeError::Setup {
        step: "lab".into(),
        message: text
            .trim_end()
            .strip_prefix('E')
            .unwrap_or("the lab keeper died during set-up")
            .to_string(),
        hint: Some(
            "the lab needs unprivileged user namespaces; run `retie selftest` for the fix".into(),
        ),
    })
}

fn keeper_setup(uid: u32, gid: u32, parent: i32) -> std::result::Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain syscalls on this single-threaded child.
    unsafe {
        if libc::geteuid() != uid
            && (libc::setgroups(0, std::ptr::null()) < 0
                || libc::setresgid(gid, gid, gid) < 0
                || libc::setresuid(uid, uid, uid) < 0)
        {
            return Err(os("taking the lab's host identity"));
        }
        // The uid change made us non-dumpable, which would hand our /proc
        // files (the id maps) to root; the keeper holds nothing secret.
        if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) < 0 {
            return Err(os("PR_SET_DUMPABLE"));
        }
        // After the uid change: die with the holder, and make sure it did
        // not die already.
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) < 0
        {
            return Err(os("PR_SET_PDEATHSIG"));
        }
        if libc::getppid() != parent {
            return Err("the lab holder died".into());
        }
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) < 0 {
            return Err(os("creating the lab's user and network namespaces"));
        }
    }
    let w = |f: &str, d: String| {
        std::fs::write(format!("/proc/self/{f}"), d).map_err(|e| format!("writing {f}: {e}"))
    };
    w("setgroups", "deny".into())?;
    w("uid_map", format!("{uid} {uid} 1\n"))?;
    w("gid_map", format!("{gid} {gid} 1\n"))?;
    ipv6_off().map_err(|e| format!("turning IPv6 off in the lab: {e}"))?;
    let mut nl = Netlink::open().map_err(|e| format!("netlink socket: {e}"))?;
    let lo = if_index("lo").map_err(|e| format!("lo: {e}"))?;
    nl.link_up(lo).map_err(|e| format!("bringing lo up: {e}"))?;
    nl.add_address(lo, LAB_ADDRESS, 32)
        .map_err(|e| format!("adding {LAB_ADDRESS} to lo: {e}"))?;
    Ok(())
}

/// The host uid/gid that owns labs started by this process: the same
/// identity its sandboxes take (65534 when invoked as root).
pub fn owner() -> (u32, u32) {
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if euid == 0 {
        (
            crate::spec::ROOT_INVOKED_HOST_ID,
            crate::spec::ROOT_INVOKED_HOST_ID,
        )
    } else {
        (euid, egid)
    }
}
