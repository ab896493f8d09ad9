//! Step 13: no descriptor but 0, 1 and 2 crosses into the command. A
//! descriptor opened before Landlock keeps its access, so every other fd
//! is marked close-on-exec (the status pipe already is, and must stay open
//! until exec so a failed exec can be reported).

use super::{SetupError, StepResult};

const STEP: &str = "fds";

/// Mark fds >= 3 close-on-exec.
pub fn cloexec_all() -> StepResult {
    crate::sys::cloexec_from(3).map_err(|e| SetupError::io(STEP, "close_range(3.., CLOEXEC)", e))
}
