//! The runtime's one error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while describing, preparing or running a
/// sandbox. Messages are written for the person at the terminal: each says
/// what failed and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The sandbox description is inconsistent; nothing was started.
    #[error("invalid sandbox description: {0}")]
    InvalidSpec(String),

    /// The workspace directory is missing or unusable.
    #[error("workspace {path}: {reason}")]
    Workspace { path: PathBuf, reason: String },

    /// A filesystem profile could not be read or is malformed.
    #[error("profile {path}: {reason}")]
    Profile { path: String, reason: String },

    /// The kernel or system lacks something the sandbox needs. `fix` names
    /// what to change; retie never falls back to weaker isolation.
    #[error("{problem}\n  fix: {fix}")]
    Unsupported { problem: String, fix: String },

    /// The calling process has more than one thread; namespaces cannot be
    /// created from it. Use the helper process instead.
    #[error("the sandbox must be set up from a single-threaded process (this one has {threads} threads); use Sandbox::run_via_helper")]
    NotSingleThreaded { threads: usize },

    /// A host-side system call failed while preparing or supervising.
    #[error("{op}: {source}")]
    Host {
        op: String,
        #[source]
        source: io::Error,
    },

    /// A set-up step inside the new namespaces failed (reported by the
    /// sandbox's init over the status pipe).
    #[error("sandbox set-up failed at step `{step}`: {message}{}", hint.as_ref().map(|h| format!("\n  fix: {h}")).unwrap_or_default())]
    Setup {
        step: String,
        message: String,
        hint: Option<String>,
    },

    /// The command could not be executed inside the sandbox.
    #[error("cannot run `{}` in the sandbox: {reason}", program.escape_debug())]
    Exec {
        program: String,
        reason: String,
        /// 127 when not found, 126 when found but not executable.
        exit_code: i32,
    },

    /// The status channel from the sandbox's init carried something init
    /// did not write. Nothing it said is reported as retie's own.
    #[error("the sandbox's status channel was tampered with ({why}); nothing it reported is trusted, and the run counts as failed")]
    Channel { why: String },

    /// A toolchain selection or plan is unusable.
    #[error("toolchain: {0}")]
    Toolchain(String),

    /// The helper process misbehaved (bad status, protocol error).
    #[error("sandbox helper: {0}")]
    Helper(String),
}

impl RuntimeError {
    /// Shorthand for a failed host-side syscall.
    pub(crate) fn host(op: impl Into<String>, source: io::Error) -> Self {
        RuntimeError::Host {
            op: op.into(),
            source,
        }
    }

    /// Shorthand for the last OS error of a host-side syscall.
    pub(crate) fn last_os(op: impl Into<String>) -> Self {
        Self::host(op, io::Error::last_os_error())
    }
}

/// Result alias for the runtime crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
