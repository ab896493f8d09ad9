//! The CLI's error type.

/// retie itself failed (bad arguments, unusable workspace, a set-up
/// error...): 125, never a code the sandboxed command could have meant.
pub const EXIT_FAILED: i32 = retie_runtime::EXIT_SANDBOX_FAILED;

/// Errors of the `retie` binary itself (the runtime and policy crates have
/// their own).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The sandbox runtime failed.
    #[error(transparent)]
    Runtime(#[from] retie_runtime::RuntimeError),
    /// Capturing, applying or undoing workspace changes failed.
    #[error(transparent)]
    Snapshot(#[from] retie_snapshot::Error),
    /// The ledger could not record or be read.
    #[error(transparent)]
    Ledger(#[from] crate::ledger::Error),
    /// The chokepoint (policy, ledger, sandbox, changes) failed.
    #[error(transparent)]
    Dispatch(#[from] retie_dispatch::Error),
    /// The policy or the person refused the action; it did not run.
    #[error("refused by {by}: {reason} (recorded in the ledger; nothing ran)")]
    Refused { reason: String, by: String },
    /// A user-supplied argument is malformed.
    #[error("{0}")]
    Usage(String),
    /// Host-side I/O of the CLI (temp dirs, canaries, listeners).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl CliError {
    /// The exit code this error ends the process with.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Runtime(r) | CliError::Dispatch(retie_dispatch::Error::Runtime(r)) => {
                retie_dispatch::sandbox::exit_code_of(r)
            }
            _ => retie_runtime::EXIT_SANDBOX_FAILED,
        }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        CliError::Io {
            what: what.into(),
            source,
        }
    }
}
