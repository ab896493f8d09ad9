//! `retie sandbox exec`: run one command in a fresh sandbox.

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use retie_runtime::{Outcome, Profile, RuntimeError, Sandbox, Stdio, EXIT_SANDBOX_FAILED};
use serde_json::json;

use retie_dispatch::guard::GuardOptions;
use retie_dispatch::record::{OpenLedger, SessionSpec};
use retie_dispatch::sandbox::{JobMode, Runner, SandboxJob};
use retie_dispatch::{dispatch, CommandLine, Dispatched, Proposal, Recorder};
use retie_policy::{Action, Context, Policy};

use super::changes::{self, root_owner, ChangesMode, Handled, Snapshots};
use crate::error::CliError;

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

#[derive(Args, Debug, PartialEq)]
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
    /// Accept a system directory (/, /etc, /usr, /var, /root, ...) as the
    /// workspace. Said on stderr and recorded in the ledger.
    #[arg(long)]
    pub allow_system_workspace: bool,
    /// In direct mode, run although the workspace holds paths a command
    /// could turn into code run later on the host (`.git` hooks and
    /// config, `.envrc`): direct mode writes them in place, unchecked.
    #[arg(long)]
    pub accept_plants: bool,
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
    /// Network: `none` (default); `lab[:NAME]` to reach a running lab's
    /// declared ports and nothing else (see `retie lab up`);
    /// `allow:HOST[:PORT],...` to reach those hosts through retie's
    /// filtering proxy and nothing else; `registries` for the package
    /// registries' hosts (npm, PyPI, crates.io, the Go proxy).
    #[arg(long, value_name = "none|lab[:NAME]|allow:HOSTS|registries")]
    pub net: Option<String>,
    /// File descriptor for --json output instead of stderr.
    #[arg(long, value_name = "FD", requires = "json")]
    pub json_fd: Option<i32>,
    /// Give the command the caller's stdin and stdout as they are, never a
    /// terminal of its own. Without it the command runs on a
    /// pseudo-terminal of the sandbox (job control, `tty`) when both stdin
    /// and stdout are terminals and --json is not given.
    #[arg(long)]
    pub no_tty: bool,
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

/// `retie sandbox exec ARGS` (`argv` without the program name) read by
/// exec's own clap parser: the same definition, [`ExecArgs`], that the
/// full parser flattens, built alone. Building every subcommand's parser
/// costs about 0.15 ms a run, exec's alone about 0.04 ms (ADR 0520).
/// Anything it does not take (help, version, an error) is `None` and goes
/// to the full parser, which says it the usual way. The two agree on
/// every flag (test `exec_alone_parses_as_the_full_parser`).
pub fn exec_args_alone(argv: impl IntoIterator<Item = std::ffi::OsString>) -> Option<ExecArgs> {
    use clap::{Args as _, FromArgMatches};
    let mut args = argv.into_iter();
    if args.next()? != "sandbox" {
        return None;
    }
    let rest: Vec<std::ffi::OsString> = args.collect();
    if rest.first()? != "exec" {
        return None;
    }
    let m = ExecArgs::augment_args(clap::Command::new("exec"))
        .try_get_matches_from(rest)
        .ok()?;
    ExecArgs::from_arg_matches(&m).ok()
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
    // An fd from the command line must be open before anything runs.
    if let Some(Err(problem)) = json_fd
        .filter(|fd| *fd > 2)
        .map(retie_runtime::helper::check_passed_fd)
    {
        eprintln!(
            "retie: --json-fd {}: {problem}",
            json_fd.unwrap_or_default()
        );
        return retie_runtime::EXIT_SANDBOX_FAILED;
    }
    match exec_inner(args) {
        Ok(Ran {
            outcome,
            changes,
            action,
            session,
        }) => {
            let mut code = outcome.exit_code;
            let mut v = outcome_json(&outcome);
            // The ledger's names for this run: `retie undo ACTION`,
            // `retie replay SESSION`.
            if let Some(o) = v.as_object_mut() {
                o.insert("action".into(), json!(action));
                o.insert("session".into(), json!(session));
            }
            if let Some(h) = changes {
                if let Some(msg) = &h.failure {
                    eprintln!(
                        "retie: {} (the command exited {})",
                        crate::ui::error_text(msg),
                        outcome.exit_code
                    );
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
            let code = e.exit_code();
            crate::ui::say_failure(&e);
            if json {
                emit_json(
                    json_fd,
                    &json!({ "exit_code": code, "error": crate::ui::failure_text(&e) }),
                );
            }
            code
        }
    }
}

/// What one `sandbox exec` ran, and its names in the ledger.
struct Ran {
    outcome: Outcome,
    changes: Option<Handled>,
    /// The action's entry id: what `retie undo` takes.
    action: i64,
    session: String,
}

fn exec_inner(args: ExecArgs) -> Result<Ran, CliError> {
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
    if !ws.is_dir() {
        return Err(CliError::Runtime(RuntimeError::Workspace {
            path: ws,
            reason: "is not a directory (a workspace is a project directory)".into(),
        }));
    }
    let ledger_path = crate::ledger::resolve_path(args.ledger.as_deref())?;
    // The workspace guards (system directories; retie's own directories:
    // a workspace inside one is refused, those inside it are masked and
    // never applied), the same for every entry point.
    let guarded = super::guard_workspace(
        &ws,
        &ledger_path,
        GuardOptions {
            system_flag: Some(("--allow-system-workspace", args.allow_system_workspace)),
            retie_scratch: None,
        },
    )?;
    let system = guarded.system.clone();
    if let Some(why) = &system {
        eprintln!(
            "retie: warning: the workspace {} is {why}; allowed by --allow-system-workspace (recorded)",
            crate::ui::visible(&ws.display().to_string())
        );
    }
    b = b.workspace(&ws);
    b = super::toolchain::plan(&ws, &profile, &toolchains, Some(&ledger_path)).apply(b);
    let mut net = json!({ "mode": "none" });
    let mut lab_mode = false;
    let mut proxy = None;
    if let Some(allow) = args
        .net
        .as_deref()
        .map(super::net::allow_list)
        .transpose()?
        .flatten()
    {
        // A networked run: the job gives the sandbox the proxy as its only
        // way out (ADR 0310).
        let hosts = super::net::hosts_override()?;
        net = json!({
            "mode": "allow",
            "allow": allow,
            "hosts": (!hosts.is_empty()).then_some(&hosts),
        });
        let exe = std::env::current_exe()
            .map_err(|e| CliError::io("locating this binary, to start the network proxy", e))?;
        proxy = Some(retie_dispatch::sandbox::NetProxy { exe, allow, hosts });
    } else if let Some(n) = &args.net {
        let mode = super::lab::resolve_net(n)?;
        if let Some(lab) = mode.lab() {
            // What a lab run could reach: recorded with its intent.
            net = json!({ "mode": "lab", "lab": lab.name, "ports": lab.ports });
            lab_mode = true;
        }
        b = b.network(mode);
    }
    if let Some(t) = args.timeout {
        if !(t.is_finite() && t > 0.0) {
            return Err(CliError::Usage(format!(
                "--timeout {t}: must be a positive number of seconds"
            )));
        }
        b = b.timeout(
            Duration::try_from_secs_f64(t)
                .map_err(|e| CliError::Usage(format!("--timeout {t}: {e}")))?,
        );
    }
    for kv in &args.env {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(CliError::Usage(format!("--env {kv}: expected K=V")));
        };
        b = b.env(k, v);
    }
    for name in &args.env_pass {
        if std::env::var_os(name).is_none() {
            eprintln!(
                "retie: warning: --env-pass {}: not set in this environment, so not passed",
                crate::ui::visible(name)
            );
        }
        b = b.env_pass(name);
    }
    let protect = guarded.protect;
    // Both modes: an apply a crash interrupted on this workspace is rolled
    // back before anything runs on it (a direct-mode command would
    // otherwise work on a half-applied tree).
    let state = crate::state::dir()?;
    crate::state::landlock_notice_once(&state);
    let snaps = Snapshots::open(&state, &ws)?;
    changes::report_recovery(&snaps);
    let owner = root_owner(&ws)?;
    let (mode, mode_name) = match args.workspace_mode {
        ModeArg::Overlay => (
            JobMode::Overlay {
                changes: args.changes.into(),
                allow_blocked: args.allow_blocked,
            },
            "overlay",
        ),
        ModeArg::Direct => (
            JobMode::Direct {
                accept_plants: args.accept_plants,
            },
            "direct",
        ),
    };

    // The sandbox is built while the policy decides and the ledger records:
    // its command starts only once the intent is durable (and never if the
    // action is refused; see SandboxJob::prepare).
    let mut ui = changes::Terminal;
    let mut job = SandboxJob {
        builder: Some(b),
        workspace: ws.clone(),
        mode,
        state,
        protect,
        snaps,
        owner,
        stdio: Some(stdio(&args)),
        runner: Runner::InProcess,
        ui: &mut ui,
        net: proxy.clone(),
    }
    .prepare()?;

    // The action, as the policy reads it: a shell line run in the sandbox.
    let line = crate::ui::shell_line(&args.command.iter().map(String::as_str).collect::<Vec<_>>());
    // A lab run acts on a target retie cannot roll back and reads what it
    // answers: untrusted (it taints a session, see the policy's trifecta).
    let mut effects = vec!["reads_workspace", "writes_workspace", "runs_sandboxed"];
    if lab_mode {
        effects.extend(["lab_access", "reads_untrusted"]);
    }
    // A networked run sends out and takes in what the network answers:
    // the trifecta rule asks before it in a session that read untrusted
    // content.
    if proxy.is_some() {
        effects.extend(["network_egress", "reads_untrusted"]);
    }
    let action = Action::from_json(
        &json!({ "tool": "bash", "args": { "command": line }, "effects": effects }).to_string(),
    )
    .map_err(|e| CliError::Usage(format!("the command cannot be put to the policy: {e}")))?;
    // The ledger opens and the policy loads here, on this thread, while
    // the sandbox's init sets itself up on the other CPU. A thread of their
    // own was slower: on this 2-vCPU VM each hand-over between threads (the
    // spawn, the join) waited 0.1-0.2 ms for a CPU to wake, more than the
    // overlap won (ADR 0413).
    let opened = OpenLedger::open(&ledger_path)?;
    let policy =
        Policy::shipped().map_err(|e| CliError::Usage(format!("the shipped policy: {e}")))?;
    let mut rec = Recorder::with_ledger(
        opened,
        SessionSpec {
            join: args.session.clone(),
            workspace: ws.clone(),
            opened: retie_ledger::payload::SessionOpened {
                objective: Some(line.clone()),
                origin: Some("retie sandbox exec".into()),
                policy_digest: Some(policy.digest().to_hex().to_string()),
                profile: Some(args.profile.clone()),
                system_workspace: system.is_some().then_some(true),
                ..Default::default()
            },
            effects: effects.iter().map(|e| e.to_string()).collect(),
            intent_base: json!({
                "tool": "sandbox.exec",
                "command": args.command,
                "workspace": ws.display().to_string(),
                "mode": mode_name,
                "profile": args.profile,
                "net": net,
                "effects": effects,
            }),
        },
    )?;
    if system.is_some() {
        rec.note("system_workspace", json!(true));
    }
    let accepted_plants = match mode {
        JobMode::Direct {
            accept_plants: true,
        } => retie_dispatch::sandbox::direct_plants(&ws),
        _ => Vec::new(),
    };
    if !accepted_plants.is_empty() {
        eprintln!(
            "retie: warning: direct mode on a workspace with {}; allowed by --accept-plants (recorded)",
            accepted_plants.join(" and ")
        );
        rec.note("direct_plants_accepted", json!(accepted_plants));
    }
    let ctx = Context::new(policy.default_tier());
    let d = dispatch(
        &mut rec,
        &policy,
        &ctx,
        Proposal {
            action,
            origin: "command line".into(),
            edit_of: None,
        },
        &mut CommandLine,
        &mut job,
    );
    let session = rec.session_id().to_string();
    if let Err(e) = rec.finish_at_exit() {
        eprintln!("retie: warning: the ledger session could not be closed: {e}");
    }
    match d? {
        Dispatched::Ran { action, output } => Ok(Ran {
            outcome: output.outcome,
            changes: output.changes,
            action,
            session,
        }),
        Dispatched::Refused { reason, by } => Err(CliError::Refused { reason, by }),
        // The command line approves or the policy denies: it never
        // suspends or edits.
        Dispatched::Suspended { .. } | Dispatched::Edited { .. } => Err(CliError::Usage(
            "the command line's approval neither suspends nor edits".into(),
        )),
    }
}

/// The command's stdio: a pseudo-terminal of the sandbox, relayed, when
/// both stdin and stdout are terminals, unless `--no-tty` or `--json`
/// (ADR 0550); else the caller's fds as they are.
fn stdio(args: &ExecArgs) -> Stdio {
    use std::io::IsTerminal;
    if !args.no_tty
        && !args.json
        && std::io::stdin().is_terminal()
        && std::io::stdout().is_terminal()
    {
        Stdio::Terminal
    } else {
        Stdio::Inherit
    }
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
