//! `retie sandbox exec`: run one command in a fresh sandbox.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use retie_runtime::{
    Outcome, Profile, RuntimeError, Sandbox, Stdio, WorkspaceMode, EXIT_SANDBOX_FAILED,
};
use serde_json::json;

use super::changes::{self, root_owner, ChangesMode, Handled, OverlayRun, Snapshots};
use crate::error::CliError;
use crate::ledger::record::{self, Recorder};

#[derive(Subcommand)]
pub enum SandboxCmd {
    /// Run CMD in a fresh sandbox: the workspace read-write, the system
    /// read-only, no home, no network, no capabilities. Exits with the
    /// command's code, 128+N if signal N killed it, 124 on timeout, 125 if
    /// the sandbox could not be set up, 126/127 if the command could not be
    /// executed / was not found.
    Exec(ExecArgs),
    /// What a sandbox will see, and why: each bind with its source and the
    /// rule that added it, what was excluded and why, the environment, the
    /// network mode. Runs nothing.
    Explain(super::toolchain::ExplainArgs),
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
    /// How the workspace is presented: `overlay` (writes are captured and
    /// then applied, discarded or reviewed, with pre-images kept for undo)
    /// or `direct` (the real workspace, read-write).
    #[arg(long, value_enum, default_value = "overlay")]
    pub workspace_mode: ModeArg,
    /// In overlay mode, what to do with the command's changes.
    #[arg(long, value_enum, default_value = "apply")]
    pub changes: ChangesMode,
    /// Also apply changes a sandbox may not make unasked (.git/hooks,
    /// .git/config, retie's own state).
    #[arg(long)]
    pub allow_blocked: bool,
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
    /// Network: `none` (default), or `lab[:NAME]` to reach a running lab's
    /// declared ports and nothing else (see `retie lab up`).
    #[arg(long, value_name = "none|lab[:NAME]")]
    pub net: Option<String>,
    /// File descriptor for --json output instead of stderr.
    #[arg(long, value_name = "FD", requires = "json")]
    pub json_fd: Option<i32>,
    /// Record this run in an open ledger session instead of a new one.
    #[arg(long, value_name = "S")]
    pub session: Option<String>,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// Toolchains the sandbox sees, read-only: `auto` (what the
    /// workspace's marker files call for), `none`, or names (rust, python,
    /// node, go, local-bin). Default: the profile's `[toolchain] use`.
    #[arg(long, value_name = "auto|none|NAME", num_args = 1.., value_delimiter = ',')]
    pub toolchain: Vec<String>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `--workspace-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Overlay,
    Direct,
}

/// Run the subcommand; returns the process exit code.
pub fn run(cmd: SandboxCmd) -> i32 {
    match cmd {
        SandboxCmd::Exec(args) => exec(args),
        SandboxCmd::Explain(args) => super::toolchain::explain(args),
    }
}

fn exec(args: ExecArgs) -> i32 {
    let json = args.json;
    let json_fd = args.json_fd;
    match exec_inner(args) {
        Ok((outcome, changes)) => {
            let mut code = outcome.exit_code;
            let mut v = outcome_json(&outcome);
            if let Some(h) = changes {
                if let Some(msg) = &h.failure {
                    eprintln!("retie: {msg} (the command exited {})", outcome.exit_code);
                    code = EXIT_SANDBOX_FAILED;
                    if let Some(o) = v.as_object_mut() {
                        o.insert("exit_code".into(), json!(code));
                        o.insert("command_exit_code".into(), json!(outcome.exit_code));
                        o.insert("error".into(), json!(msg));
                    }
                }
                if let Some(o) = v.as_object_mut() {
                    o.insert("changes".into(), h.json);
                }
            }
            if json {
                emit_json(json_fd, &v);
            }
            code
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

fn exec_inner(args: ExecArgs) -> Result<(Outcome, Option<Handled>), CliError> {
    let profile = Profile::load(&args.profile)?;
    let toolchains = super::toolchain::selection(&args.toolchain, &profile)?;
    let mut b = Sandbox::builder(&args.command).profile(profile.clone());
    let ws = match &args.workspace {
        Some(ws) => ws.clone(),
        None => {
            std::env::current_dir().map_err(|e| CliError::io("reading the current directory", e))?
        }
    };
    let ws = std::fs::canonicalize(&ws).map_err(|e| {
        CliError::Runtime(RuntimeError::Workspace {
            path: ws.clone(),
            reason: if e.kind() == std::io::ErrorKind::NotFound {
                "does not exist".into()
            } else {
                e.to_string()
            },
        })
    })?;
    b = b.workspace(&ws);
    b = super::toolchain::plan(&ws, &profile, &toolchains).apply(b);
    if let Some(n) = &args.net {
        b = b.network(super::lab::resolve_net(n)?);
    }
    let mode = match args.workspace_mode {
        ModeArg::Overlay => "overlay",
        ModeArg::Direct => "direct",
    };
    let mut rec = Recorder::open(
        args.ledger.as_deref(),
        args.session.clone(),
        &ws,
        &args.command,
        mode,
        &args.profile,
    )?;
    if let Some(dir) = rec.mask() {
        b = b.mask(dir);
    }
    let mut overlay = None;
    if args.workspace_mode == ModeArg::Overlay {
        let state = crate::state::dir()?;
        let snaps = Snapshots::open(&state, &ws)?;
        let owner = root_owner(&ws)?;
        let run = OverlayRun::create(&state, owner)?;
        b = b.workspace_mode(WorkspaceMode::Overlay {
            upper: run.upper.clone(),
            work: run.work.clone(),
        });
        overlay = Some((state, snaps, run, owner));
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
    // A file edited before this moment has a ctime at or below it (coarse
    // or fine-grained). One edited within a clock tick after it may look
    // older, but that is before the sandbox has even finished its set-up,
    // so the command saw the edited version anyway.
    if overlay.is_none() {
        // Direct mode writes the workspace in place: record that before.
        rec.intent(record::plan_direct())?;
    }
    let started = std::time::SystemTime::now();
    let outcome = rec.after_run(retie_runtime::run(&spec, Stdio::Inherit))?;
    let handled = match overlay {
        None => None,
        Some((_, _, mut run, _)) if outcome.timed_out => {
            // A timed-out command's half-done changes are not applied, and
            // not thrown away either.
            run.keep();
            eprintln!(
                "retie: the command timed out; its changes were not applied and are kept in {}",
                run.upper.display()
            );
            None
        }
        Some((state, snaps, mut run, owner)) => {
            let t = std::time::Instant::now();
            let allow_blocked = args.allow_blocked;
            let h = changes::handle(
                args.changes,
                allow_blocked,
                &state,
                &snaps,
                &mut run,
                owner,
                started,
                &mut |cs| {
                    Ok(rec
                        .intent(record::plan_for(cs, allow_blocked))
                        .map(|_| ())?)
                },
            );
            let mut h = rec.after_changes(h)?;
            if let Some(o) = h.json.as_object_mut() {
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                o.insert("handled_ms".into(), json!((ms * 1000.0).round() / 1000.0));
            }
            Some(h)
        }
    };
    rec.finish();
    Ok((outcome, handled))
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
