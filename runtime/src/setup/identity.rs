//! Step 7: become the sandbox user.
//!
//! Runs after the mounts (which, for a root-invoked sandbox, reach root-only
//! host directories) and before the capability drop. The securebits are
//! set first so the uid change keeps the namespace capabilities the next
//! steps still need (bringing `lo` up, setting limits), and so that an
//! inner uid 0 never regains capabilities across execve.

use super::{SetupError, StepResult};
use crate::spec::Identity;

const STEP: &str = "identity";

/// Lock the securebits, then set gid and uid.
pub fn become_user(id: &Identity) -> StepResult {
    let bits = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            libc::c_ulong::from(bits.cast_unsigned()),
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(SetupError::last_os(STEP, "setting securebits"));
    }
    // SAFETY: plain id-setting syscalls with integer arguments.
    if unsafe { libc::setresgid(id.inner_gid, id.inner_gid, id.inner_gid) } < 0 {
        return Err(SetupError::last_os(
            STEP,
            format!("setresgid({})", id.inner_gid),
        ));
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(id.inner_uid, id.inner_uid, id.inner_uid) } < 0 {
        return Err(SetupError::last_os(
            STEP,
            format!("setresuid({})", id.inner_uid),
        ));
    }
    Ok(())
}
