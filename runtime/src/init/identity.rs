//! Step 7: become the sandbox user.
//!
//! Runs after the mounts (which, for a root-invoked sandbox, reach root-only
//! host directories) and before the capability drop. The securebits are
//! set first so the uid change keeps the namespace capabilities the next
//! steps still need (bringing `lo` up, setting limits), and so that an
//! inner uid 0 never regains capabilities across execve.
//!
//! rustix's id calls are per thread (the raw syscalls, without glibc's
//! broadcast to every thread); init is single-threaded, so the thread's
//! credentials are the process's.

use rustix::process::{Gid, Uid};
use rustix::thread::CapabilitiesSecureBits as Bits;

use super::{SetupError, StepResult};
use crate::spec::Identity;

const STEP: &str = "identity";

/// Lock the securebits, then set gid and uid.
pub fn become_user(id: &Identity) -> StepResult {
    let bits = Bits::NO_ROOT
        | Bits::NO_ROOT_LOCKED
        | Bits::NO_SETUID_FIXUP
        | Bits::NO_SETUID_FIXUP_LOCKED
        | Bits::KEEP_CAPS_LOCKED
        | Bits::NO_CAP_AMBIENT_RAISE
        | Bits::NO_CAP_AMBIENT_RAISE_LOCKED;
    rustix::thread::set_capabilities_secure_bits(bits)
        .map_err(|e| SetupError::io(STEP, "setting securebits", e.into()))?;
    let gid = Gid::from_raw(id.inner_gid);
    rustix::thread::set_thread_res_gid(gid, gid, gid)
        .map_err(|e| SetupError::io(STEP, format!("setresgid({})", id.inner_gid), e.into()))?;
    let uid = Uid::from_raw(id.inner_uid);
    rustix::thread::set_thread_res_uid(uid, uid, uid)
        .map_err(|e| SetupError::io(STEP, format!("setresuid({})", id.inner_uid), e.into()))
}
