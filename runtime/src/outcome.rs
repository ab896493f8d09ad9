//! How a sandboxed command ended, and the exit codes retie reports.

use serde::{Deserialize, Serialize};

/// Exit code when the sandbox itself could not be set up (as hakoniwa and
/// `docker run` use 125).
pub const EXIT_SANDBOX_FAILED: i32 = 125;
/// Exit code when the command was found but could not be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit code when the command does not exist inside the sandbox.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit code when the time limit killed the sandbox (as GNU timeout).
pub const EXIT_TIMEOUT: i32 = 124;

/// The end of one sandboxed command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// What `retie sandbox exec` exits with: the command's own code,
    /// 128+signal when a signal killed it, [`EXIT_TIMEOUT`] on timeout.
    pub exit_code: i32,
    /// The signal that killed the command, if one did.
    pub signal: Option<i32>,
    /// True when the time limit ended the sandbox.
    pub timed_out: bool,
    /// True when a SIGINT killed the sandbox ([`crate::Interrupt::Kill`]).
    #[serde(default)]
    pub interrupted: bool,
    /// The first signal asking the run to stop (SIGINT, SIGTERM, SIGHUP,
    /// SIGQUIT) that the supervisor received and forwarded to the command
    /// ([`crate::Interrupt::Forward`]): someone asked the run to stop,
    /// whatever the command then did with the signal.
    #[serde(default)]
    pub stop_signal: Option<i32>,
    /// Wall time from the first clone to the last reap.
    pub duration_ms: f64,
    /// The Landlock ABI enforced inside.
    pub landlock_abi: i32,
    /// True when the Landlock ruleset was fully enforced.
    pub landlock_enforced: bool,
    /// True when the seccomp filter was installed.
    pub seccomp: bool,
    /// Peak resident set size of the supervising (helper) process, KiB.
    pub helper_max_rss_kib: i64,
}
