//! Step 8: a new session (no controlling terminal, so TIOCSTI-style
//! injection into the caller's terminal has no target) and a hostname.

use super::{SetupError, StepResult};

const STEP: &str = "session";

/// setsid + sethostname.
pub fn detach(hostname: &std::ffi::CStr) -> StepResult {
    // SAFETY: setsid takes no arguments.
    if unsafe { libc::setsid() } < 0 {
        return Err(SetupError::last_os(STEP, "setsid"));
    }
    let name = hostname.to_bytes();
    // SAFETY: `name` is a valid buffer of the given length.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } < 0 {
        return Err(SetupError::last_os(STEP, "sethostname"));
    }
    Ok(())
}
