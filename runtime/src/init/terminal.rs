//! Step 9b (only for [`crate::Stdio::Terminal`]): the command's terminal, a
//! pseudo-terminal of the sandbox's own devpts instance (mounted by
//! [`super::dev`], `newinstance`), so `tty` names a `/dev/pts/N` that
//! exists inside and nothing of the host's devpts is reachable.
//!
//! The master goes to the supervisor over the go channel (SCM_RIGHTS,
//! tag `T`, after the proxy socket's `L` when there is one: the channel's
//! one order) and is closed here at once: nothing in the sandbox holds it
//! afterwards. init keeps the slave (opened with O_NOCTTY: init's session
//! has no terminal) until the command's child has made it the controlling
//! terminal of its own session (`crate::command`). See ADR 0550.

use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::pty::OpenptFlags;

use super::{SetupError, StepResult};

const STEP: &str = "terminal";

/// The tag of the master's message on the go channel.
pub const TAG: u8 = b'T';

/// Make the pty, hand its master to the supervisor, return the slave.
pub fn hand_out(go: BorrowedFd<'_>) -> StepResult<OwnedFd> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    // /dev/ptmx -> pts/ptmx: the sandbox's own devpts instance.
    let master = rustix::pty::openpt(flags)
        .map_err(|e| SetupError::io(STEP, "opening /dev/ptmx", e.into()))?;
    rustix::pty::unlockpt(&master)
        .map_err(|e| SetupError::io(STEP, "unlocking the pty", e.into()))?;
    // The slave by the master, not by a path someone could swap.
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags)
        .map_err(|e| SetupError::io(STEP, "opening the pty's slave", e.into()))?;
    crate::sys::send_fds(go, TAG, &[std::os::fd::AsFd::as_fd(&master)])
        .map_err(|e| SetupError::io(STEP, "handing the pty's master to the supervisor", e))?;
    drop(master);
    Ok(slave)
}
