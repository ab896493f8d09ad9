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

    /// A channel between retie's own processes (the sandbox's init, the
    /// lab net stage, a lab keeper) carried something its sender did not
    /// write. Nothing it said is reported as retie's own.
    #[error("a channel between retie's processes was tampered with ({why}); nothing it reported is trusted, and the run counts as failed")]
    Channel { why: String },

    /// A toolchain selection or plan is unusable.
    #[error("toolchain: {0}")]
    Toolchain(String),

    /// The helper process misbehaved (bad status, protocol error).
    #[error("sandbox helper: {0}")]
    Helper(String),

    /// A signal to stop (SIGINT, SIGTERM, ...) arrived while the sandbox
    /// was being built, before its command started: the command never ran.
    #[error("cancelled by signal {signal} before the command started; it did not run")]
    Cancelled { signal: i32 },
}

impl RuntimeError {
    /// The exit code `retie sandbox exec` ends with for this error: the
    /// command's 126/127 when it could not be executed, 125
    /// ([`crate::EXIT_SANDBOX_FAILED`]) when the sandbox itself failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            RuntimeError::Exec { exit_code, .. } => *exit_code,
            RuntimeError::Cancelled { signal } => 128 + signal,
            _ => crate::outcome::EXIT_SANDBOX_FAILED,
        }
    }

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

/// [`RuntimeError`] as it crosses a process boundary (the helper's reply):
/// one variant per variant, converted both ways by exhaustive matches, so
/// a new error variant cannot be forgotten on the wire. A host error keeps
/// its errno (its message is rebuilt from it); one without an errno keeps
/// its message.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum Wire {
    InvalidSpec {
        message: String,
    },
    Workspace {
        path: PathBuf,
        reason: String,
    },
    Profile {
        path: String,
        reason: String,
    },
    Unsupported {
        problem: String,
        fix: String,
    },
    NotSingleThreaded {
        threads: usize,
    },
    Host {
        op: String,
        errno: Option<i32>,
        message: String,
    },
    Setup {
        step: String,
        message: String,
        hint: Option<String>,
    },
    Exec {
        program: String,
        reason: String,
        exit_code: i32,
    },
    Channel {
        why: String,
    },
    Toolchain {
        message: String,
    },
    Helper {
        message: String,
    },
    Cancelled {
        signal: i32,
    },
}

impl RuntimeError {
    /// The wire form of this error.
    fn wire(&self) -> Wire {
        match self {
            RuntimeError::InvalidSpec(m) => Wire::InvalidSpec { message: m.clone() },
            RuntimeError::Workspace { path, reason } => Wire::Workspace {
                path: path.clone(),
                reason: reason.clone(),
            },
            RuntimeError::Profile { path, reason } => Wire::Profile {
                path: path.clone(),
                reason: reason.clone(),
            },
            RuntimeError::Unsupported { problem, fix } => Wire::Unsupported {
                problem: problem.clone(),
                fix: fix.clone(),
            },
            RuntimeError::NotSingleThreaded { threads } => {
                Wire::NotSingleThreaded { threads: *threads }
            }
            RuntimeError::Host { op, source } => Wire::Host {
                op: op.clone(),
                errno: source.raw_os_error(),
                message: source.to_string(),
            },
            RuntimeError::Setup {
                step,
                message,
                hint,
            } => Wire::Setup {
                step: step.clone(),
                message: message.clone(),
                hint: hint.clone(),
            },
            RuntimeError::Exec {
                program,
                reason,
                exit_code,
            } => Wire::Exec {
                program: program.clone(),
                reason: reason.clone(),
                exit_code: *exit_code,
            },
            RuntimeError::Channel { why } => Wire::Channel { why: why.clone() },
            RuntimeError::Toolchain(m) => Wire::Toolchain { message: m.clone() },
            RuntimeError::Helper(m) => Wire::Helper { message: m.clone() },
            RuntimeError::Cancelled { signal } => Wire::Cancelled { signal: *signal },
        }
    }
}

impl From<Wire> for RuntimeError {
    fn from(w: Wire) -> RuntimeError {
        match w {
            Wire::InvalidSpec { message } => RuntimeError::InvalidSpec(message),
            Wire::Workspace { path, reason } => RuntimeError::Workspace { path, reason },
            Wire::Profile { path, reason } => RuntimeError::Profile { path, reason },
            Wire::Unsupported { problem, fix } => RuntimeError::Unsupported { problem, fix },
            Wire::NotSingleThreaded { threads } => RuntimeError::NotSingleThreaded { threads },
            Wire::Host { op, errno, message } => RuntimeError::Host {
                op,
                source: match errno {
                    Some(n) => io::Error::from_raw_os_error(n),
                    None => io::Error::other(message),
                },
            },
            Wire::Setup {
                step,
                message,
                hint,
            } => RuntimeError::Setup {
                step,
                message,
                hint,
            },
            Wire::Exec {
                program,
                reason,
                exit_code,
            } => RuntimeError::Exec {
                program,
                reason,
                exit_code,
            },
            Wire::Channel { why } => RuntimeError::Channel { why },
            Wire::Toolchain { message } => RuntimeError::Toolchain(message),
            Wire::Helper { message } => RuntimeError::Helper(message),
            Wire::Cancelled { signal } => RuntimeError::Cancelled { signal },
        }
    }
}

impl serde::Serialize for RuntimeError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.wire().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for RuntimeError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Wire::deserialize(d).map(RuntimeError::from)
    }
}
