//! Step 8: a new session (no controlling terminal, so TIOCSTI-style
//! injection into the caller's terminal has no target) and a hostname.
//! A command on a terminal gets a session of its own whose controlling
//! terminal is the sandbox's pty (`super::terminal`, ADR 0550).

use super::{SetupError, StepResult};

const STEP: &str = "session";

/// setsid + sethostname.
pub fn detach(hostname: &std::ffi::CStr) -> StepResult {
    rustix::process::setsid().map_err(|e| SetupError::io(STEP, "setsid", e.into()))?;
    rustix::system::sethostname(hostname.to_bytes())
        .map_err(|e| SetupError::io(STEP, "sethostname", e.into()))
}
