//! `retie sandbox exec`: run one command in a fresh sandbox.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use retie_runtime::{Outcome, Profile, RuntimeError, Sandbox, Stdio, EXIT_SANDBOX_FAILED};
use serde_json::json;

use crate::error::CliError;

#[derive(Subcommand)]
pub enum SandboxCmd {
    /// Run CMD in a fresh sandbox: the workspace read-write, the system
    /// read-only, no home, no network, no capabilities. Exits with the
    /// command's code, 128+N if signal N killed it, 124 on timeout, 125 if
    /// the sandbox could not be set up, 126/127 if the command could not be
    /// executed / was not found.
    Exec(ExecArgs),
}

#[derive(Args)]
pub struct ExecArgs {
    /// Workspace directory, bound read-write at its own path (default: the
    /// current directory).
    #[arg(long, short = 'w', value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Filesystem profile: a built-in name (host) or a TOML file.
    #[arg(long, value_name = "NAME|PATH", default_value = "host")]
    pub profile: String,
    /// Kill the whole sandbox after this many seconds (fractions allowed).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Set an environment variable inside (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Pass a variable through from this environment (repeatable).
    #[arg(long = "env-pass", value_name = "NAME")]
    pub env_pass: Vec<String>,
    /// Print one JSON status object when the command ends (to stderr, or
    /// to --json-fd).
    #[arg(long)]
    pub json: bool,
    /// File descriptor for --json output instead of stderr.
    #[arg(long, value_name = "FD", requires = "json")]
    pub json_fd: Option<i32>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Run the subcommand; returns the process exit code.
pub fn run(cmd: SandboxCmd) -> i32 {
    match cmd {
        SandboxCmd::Exec(args) => exec(args),
    }
}

fn exec(args: ExecArgs) -> i32 {
    let json = args.json;
    let json_fd = args.json_fd;
    match exec_inner(args) {
        Ok(outcome) => {
            if json {
                emit_json(json_fd, &outcome_json(&outcome));
            }
            outcome.exit_code
        }
        Err(e) => {
            let code = match &e {
                CliError::Runtime(RuntimeError::Exec { exit_code, .. }) => *exit_code,
                _ => EXIT_SANDBOX_FAILED,
            };
            eprintln!("retie: {e}");
            if json {
                emit_json(
                    json_fd,
                    &json!({ "exit_code": code, "error": e.to_string() }),
                );
            }
            code
        }
    }
}

fn exec_inner(args: ExecArgs) -> Result<Outcome, CliError> {
    let profile = Profile::load(&args.profile)?;
    let mut b = Sandbox::builder(&args.command).profile(profile);
    if let Some(ws) = args.workspace {
        b = b.workspace(ws);
    }
    if let Some(t) = args.timeout {
        if !(t.is_finite() && t > 0.0) {
            return Err(CliError::Usage(format!(
                "--timeout {t}: must be a positive number of seconds"
            )));
        }
        b = b.timeout(Duration::from_secs_f64(t));
    }
    for kv in &args.env {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(CliError::Usage(format!("--env {kv}: expected K=V")));
        };
        b = b.env(k, v);
    }
    for name in &args.env_pass {
        b = b.env_pass(name);
    }
    let spec = b.build()?;
    Ok(retie_runtime::run(&spec, Stdio::Inherit)?)
}

/// The documented shape of `--json`.
pub fn outcome_json(o: &Outcome) -> serde_json::Value {
    json!({
        "exit_code": o.exit_code,
        "signal": o.signal,
        "timed_out": o.timed_out,
        "duration_ms": (o.duration_ms * 1000.0).round() / 1000.0,
        "landlock_abi": o.landlock_abi,
        "landlock_enforced": o.landlock_enforced,
        "seccomp": o.seccomp,
        "helper_max_rss_kib": o.helper_max_rss_kib,
    })
}

fn emit_json(fd: Option<i32>, v: &serde_json::Value) {
    let line = format!("{v}\n");
    match fd {
        Some(fd) if fd > 2 => {
            // SAFETY: the caller handed us this fd on the command line; we
            // take ownership of it for this one write and close it.
            let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
            let _ = f.write_all(line.as_bytes());
        }
        Some(1) => {
            let _ = std::io::stdout().write_all(line.as_bytes());
        }
        _ => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}
