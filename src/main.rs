//! `retie`: the command-line front of the sandbox runtime, and (built as
//! `retie-agent`) of the agent built on it (ADR 0412).
//!
//! `main` owns the exit codes. Everything that runs a sandbox does so from
//! this single-threaded process; nothing here starts a thread before a
//! sandbox is spawned.

/// In musl builds (the default, ADR 0416) Rust's allocations go to
/// dlmalloc: musl's own malloc spreads small allocations over more fresh
/// pages, and every first touch of a page is a fault (about 2 µs in a VM).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

mod commands;
mod error;
mod ledger;
mod state;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use retie_runtime::EXIT_SANDBOX_FAILED;

/// retie: run what an AI agent proposes with nothing but the workspace in reach.
#[derive(Parser)]
#[command(
    name = "retie",
    bin_name = "retie",
    version,
    about,
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run commands inside a fresh sandbox.
    #[command(subcommand)]
    Sandbox(commands::sandbox::SandboxCmd),
    /// Ask the policy why: show it, explain a decision, inspect a write,
    /// check a URL.
    #[command(subcommand)]
    Policy(commands::policy::PolicyCmd),
    /// Prove, on this machine, that the sandbox holds: seccomp, Landlock,
    /// namespaces and the network lock, probed from inside a real sandbox.
    Selftest(commands::selftest::SelftestArgs),
    /// Internal: the probe battery run inside the self-test's sandbox.
    #[command(name = "__probe", hide = true)]
    Probe(commands::probe::ProbeArgs),
    /// Internal: a long tool call's elapsed time on stderr (`run -p`).
    #[command(name = "__progress", hide = true)]
    Progress(commands::progress::ProgressArgs),
    /// Internal: the sandbox helper for multi-threaded callers.
    #[command(name = "__sandbox-helper", hide = true)]
    Helper(commands::helper::HelperArgs),
    /// Start, list and stop lab targets (a network with no uplink).
    #[command(subcommand)]
    Lab(commands::lab::LabCmd),
    /// Internal: a lab's holder process.
    #[command(name = "__lab-holder", hide = true)]
    LabHolder(commands::lab::HolderArgs),
    /// Internal: the network proxy of a `--net allow:` sandbox.
    #[command(name = "__net-proxy", hide = true)]
    NetProxy(commands::net::ProxyArgs),
    /// Internal: the self-test's lab probes.
    #[command(name = "__lab-probe", hide = true)]
    LabProbe(commands::selftest::LabProbeArgs),
    /// Check the ledger from outside: hashes, chain, signatures,
    /// delegations, checkpoints. Exit 0 intact, 1 tampered, 2 incomplete.
    Verify(commands::verify::VerifyArgs),
    /// Show a session's actions, decisions and outcomes (verified first).
    Replay(commands::replay::ReplayArgs),
    /// A retest session's report from the ledger alone: markdown, JSON
    /// or SARIF 2.1.0.
    Report(commands::report::ReportArgs),
    /// List the ledger's sessions and their action ids.
    Log(commands::log::LogArgs),
    /// Kept overlay runs (timed out, conflicting, not reviewed): list,
    /// show, apply or discard them.
    #[command(subcommand)]
    Changes(commands::runs::RunsCmd),
    /// Remove what no undoable action needs: expired undo data, old kept
    /// runs, leftovers of killed runs.
    Gc(commands::gc::GcArgs),
    /// What state retie keeps, where, and how large.
    Status(commands::gc::StatusArgs),
    /// Undo one recorded action (an id from `retie log`, or `last`).
    Undo(commands::undo::UndoArgs),
    /// Undo every action of a session, newest first.
    UndoAll(commands::undo::UndoAllArgs),
    /// The agent: one task in DIR, every tool call through the chokepoint.
    /// Exits 0 finished, 3 budget spent, 4 provider failed, 5 suspended
    /// (an approval is pending), 130 interrupted, 125 usage error.
    Run(commands::run::RunArgs),
    /// Retest pentest findings against a lab: one agent session per
    /// finding, each command approved and run in a lab-mode sandbox, a
    /// verdict (still_open, fixed, inconclusive) in the ledger.
    Retest(commands::retest::RetestArgs),
    /// Pending approvals across sessions: session, tool, frozen
    /// arguments, digest, age.
    Pending(commands::pending::PendingArgs),
    /// Approve a suspended session's pending action (or run an edit of
    /// it); `retie run --resume SESSION` carries it out.
    Approve(commands::pending::ApproveArgs),
    /// Deny a suspended session's pending action; the model reads the
    /// reason when the session resumes.
    Deny(commands::pending::DenyArgs),
    /// Take back an "always" grant of a session that is not running.
    Revoke(commands::pending::RevokeArgs),
    /// Sessions with their state (running, suspended, finished, crashed),
    /// workspace, model, turns and tokens.
    Sessions(commands::sessions::SessionsArgs),
    /// Offline, no key, under a minute: a scripted model fixes a bug in a
    /// sample project, then replay, verify and undo-all. The show is on
    /// stderr; stdout gets one line at the end, the result.
    Demo(commands::demo::DemoArgs),
    /// What the provider serves: each model's size, tier, context length
    /// and this account's standing (from `retie probe`).
    Models(commands::models::ModelsArgs),
    /// A one-token request to each model (all listed if none named):
    /// callable, refused (403) or inconclusive, cached in the state
    /// directory. A wrong key (401) stops at once.
    #[command(name = "probe")]
    ModelProbe(commands::models::ProbeArgs),
    /// Tokens and requests per model and tier, per day and per session,
    /// from the ledger (consumption, never a balance).
    Usage(commands::models::UsageArgs),
    /// A shared ledger: this machine's key, admitting another machine's
    /// key, copying a local ledger into a PostgreSQL one.
    #[command(subcommand)]
    Ledger(commands::ledger_cmd::LedgerCmd),
    /// Internal: ledger test and benchmark tools.
    #[command(name = "__ledger", hide = true, subcommand)]
    LedgerDev(ledger::dev::DevCmd),
    /// Internal: write the man pages or a shell's completions, generated
    /// from this definition (scripts/release.sh).
    #[command(name = "__generate", hide = true)]
    Generate(commands::generate::GenerateArgs),
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE; a CLI piped into `head` should end quietly
    // instead of panicking on a broken pipe.
    // SAFETY: setting a signal disposition to its default, before any
    // thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // SQLite's allocations into the process's one heap (ADR 0416).
    // SAFETY: `install` needs a single-threaded process with no SQLite
    // connection open: this is main's first statement after the SIGPIPE
    // disposition; no thread has been spawned and nothing opened SQLite.
    unsafe { retie_ledger::sqlite_memory::install() };
    // Usage errors exit 125 like every other failure of retie itself, so
    // they cannot be mistaken for the sandboxed command's own exit code.
    // `retie sandbox exec`, the command people run most, is read by
    // exec's own clap parser (the same `ExecArgs` definition, built alone:
    // building every subcommand's cost 0.15 ms a run; ADR 0520).
    if let Some(args) = commands::sandbox::exec_args_alone(std::env::args_os().skip(1)) {
        return exit_code(commands::sandbox::run(commands::sandbox::SandboxCmd::Exec(
            args,
        )));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(mut e) => {
            exec_separator_tip(&mut e);
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                EXIT_SANDBOX_FAILED as u8
            } else {
                0
            });
        }
    };
    let mut cli = cli;
    if let Err(e) = full_session_ids(&mut cli.command) {
        crate::ui::say_failure(&e);
        return exit_code(e.exit_code());
    }
    let code = match cli.command {
        Command::Policy(cmd) => commands::policy::run(cmd),
        Command::Sandbox(cmd) => commands::sandbox::run(cmd),
        Command::Selftest(args) => commands::selftest::run(args),
        Command::Lab(cmd) => commands::lab::run(cmd),
        Command::LabHolder(args) => commands::lab::holder(args),
        Command::LabProbe(args) => commands::selftest::lab_probe(args),
        Command::NetProxy(args) => commands::net::proxy(args),
        Command::Probe(args) => commands::probe::run(args),
        Command::Helper(args) => commands::helper::run(args),
        Command::Progress(args) => commands::progress::run(args),
        Command::Verify(args) => commands::verify::run(args),
        Command::Replay(args) => commands::replay::run(args),
        Command::Log(args) => commands::log::run(args),
        Command::Report(args) => commands::report::run(args),
        Command::Changes(cmd) => or_125(commands::runs::run(cmd)),
        Command::Gc(args) => or_125(commands::gc::gc(args)),
        Command::Status(args) => or_125(commands::gc::status(args)),
        Command::Undo(args) => commands::undo::run_one(args),
        Command::UndoAll(args) => commands::undo::run_all(args),
        Command::LedgerDev(cmd) => ledger::dev::run(cmd),
        Command::Sessions(args) => or_125(commands::sessions::run(args)),
        Command::Ledger(cmd) => or_125(commands::ledger_cmd::run(cmd)),
        // The agent's commands run in retie-agent (ADR 0412): `retie`
        // hands them over, `retie-agent` runs them. The constant folds,
        // so `retie` links none of the agent.
        _ if !AGENT => exec_agent(),
        Command::Run(args) => commands::run::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::Retest(args) => commands::retest::run(args),
        Command::Pending(args) => or_125(commands::pending::list(args)),
        Command::Approve(args) => or_125(commands::pending::approve(args)),
        Command::Deny(args) => or_125(commands::pending::deny(args)),
        Command::Revoke(args) => or_125(commands::pending::revoke(args)),
        Command::Models(args) => or_125(commands::models::models(args)),
        Command::ModelProbe(args) => or_125(commands::models::probe(args)),
        Command::Usage(args) => or_125(commands::models::usage(args)),
        // In retie-agent too, so `retie` links neither generator.
        Command::Generate(args) => or_125(commands::generate::run(
            args,
            <Cli as clap::CommandFactory>::command(),
        )),
    };
    exit_code(code)
}

/// Every session id a command line names, made full: any unique prefix
/// of an id names its session, everywhere (`retie replay 3804`); an
/// ambiguous or unknown one is a usage error listing the candidates.
fn full_session_ids(cmd: &mut Command) -> Result<(), error::CliError> {
    use ledger::full_session_id as full;
    match cmd {
        Command::Replay(a) => {
            if let Some(s) = &a.session {
                a.session = Some(full(a.ledger.as_deref(), s)?);
            }
        }
        Command::Report(a) => a.session = full(a.ledger.as_deref(), &a.session)?,
        Command::UndoAll(a) => {
            if let Some(s) = &a.session {
                a.session = Some(full(a.ledger.as_deref(), s)?);
            }
        }
        Command::Run(a) => {
            if let Some(s) = &a.resume {
                a.resume = Some(full(a.ledger.as_deref(), s)?);
            }
        }
        Command::Retest(a) => {
            if let Some(s) = &a.resume {
                a.resume = Some(full(a.ledger.as_deref(), s)?);
            }
        }
        Command::Approve(a) => a.session = full(a.ledger.as_deref(), &a.session)?,
        Command::Deny(a) => a.session = full(a.ledger.as_deref(), &a.session)?,
        Command::Revoke(a) => a.session = full(a.ledger.as_deref(), &a.session)?,
        _ => {}
    }
    Ok(())
}

/// Whether this binary is `retie-agent`, the one with the agent's
/// commands in it (`src/agent.rs` is a link to this file).
const AGENT: bool = matches!(env!("CARGO_BIN_NAME").as_bytes(), b"retie-agent");

/// Hand an agent command to `retie-agent`, beside this binary, with the
/// same arguments (the same process: its terminal, signals and exit code).
/// It returns only if that binary cannot be started.
fn exec_agent() -> i32 {
    use std::os::unix::process::CommandExt;
    let agent = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("retie-agent"),
        Err(e) => {
            eprintln!("retie: locating this binary, to start retie-agent beside it: {e}");
            return EXIT_SANDBOX_FAILED;
        }
    };
    let err = std::process::Command::new(&agent)
        .arg0("retie")
        .args(std::env::args_os().skip(1))
        .exec();
    eprintln!(
        "retie: the agent's commands (run, demo, pending, approve, deny, revoke) are in retie-agent, which must sit beside retie: {}: {err}\n  fix: install both binaries (`cargo install --path .`, or `cargo build --release` builds both into target/)",
        ui::visible(&agent.display().to_string())
    );
    EXIT_SANDBOX_FAILED
}

/// `retie sandbox exec true`: the command must follow `--` (so that no
/// word of it is ever read as retie's own option); clap's error says the
/// word was unexpected, this says where it goes, with the line to type.
fn exec_separator_tip(e: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return;
    }
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if argv.get(1).map(String::as_str) != Some("sandbox")
        || argv.get(2).map(String::as_str) != Some("exec")
        || argv.iter().any(|a| a == "--")
    {
        return;
    }
    let Some(ContextValue::String(word)) = e.get(ContextKind::InvalidArg) else {
        return;
    };
    if word.starts_with('-') {
        return;
    }
    let Some(at) = argv.iter().skip(3).position(|a| a == word).map(|i| i + 3) else {
        return;
    };
    let mut line: Vec<&str> = vec!["retie"];
    line.extend(argv[1..at].iter().map(String::as_str));
    line.push("--");
    line.extend(argv[at..].iter().map(String::as_str));
    let tip = format!(
        "the command goes after `--`: {}",
        crate::ui::shell_line(&line)
    );
    e.insert(
        ContextKind::Suggested,
        ContextValue::StyledStrs(vec![tip.into()]),
    );
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1))
}

/// The one place a CLI error becomes an exit code: retie's own failures
/// exit 125 (so they cannot be mistaken for a sandboxed command's code),
/// except a command that could not be executed (126) or found (127).
fn or_125(r: Result<i32, error::CliError>) -> i32 {
    match r {
        Ok(code) => code,
        Err(e) => {
            crate::ui::say_failure(&e);
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command};
    use crate::commands::sandbox::{exec_args_alone, ExecArgs, SandboxCmd};
    use clap::{CommandFactory, Parser};
    use std::ffi::OsString;

    fn by_full(line: &[String]) -> Option<ExecArgs> {
        let argv = ["retie", "sandbox", "exec"].iter().map(|s| s.to_string());
        match Cli::try_parse_from(argv.chain(line.iter().cloned())) {
            Ok(Cli {
                command: Command::Sandbox(SandboxCmd::Exec(a)),
            }) => Some(a),
            _ => None,
        }
    }

    fn by_alone(line: &[String]) -> Option<ExecArgs> {
        let argv = ["sandbox", "exec"].iter().map(OsString::from);
        exec_args_alone(argv.chain(line.iter().map(OsString::from)))
    }

    /// The differential test of ADR 0520: exec's own parser and the full
    /// one read every flag of `sandbox exec` alike: each flag alone, with
    /// each of its values (or sample values), `--flag=V` and `--flag V`,
    /// all of them together, and lines that must fail.
    #[test]
    fn exec_alone_parses_as_the_full_parser() {
        let exec = Cli::command()
            .find_subcommand("sandbox")
            .and_then(|s| s.find_subcommand("exec"))
            .cloned()
            .expect("sandbox exec");
        let tail = [
            "--".to_string(),
            "sh".into(),
            "-c".into(),
            "echo --json".into(),
        ];
        let mut lines: Vec<Vec<String>> = vec![tail.to_vec()];
        let mut all: Vec<String> = Vec::new();
        let mut flags = 0;
        for arg in exec.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" || long == "version" {
                continue;
            }
            flags += 1;
            let takes = arg.get_num_args().is_some_and(|n| n.takes_values());
            let values: Vec<String> = if !takes {
                vec![]
            } else if !arg.get_possible_values().is_empty() {
                arg.get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string())
                    .chain(["no-such-value".to_string()])
                    .collect()
            } else {
                ["1", "2.5", "/tmp/ws", "A=b", "host", "lab:x", "", "x y"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            };
            let mut forms: Vec<Vec<String>> = Vec::new();
            if takes {
                for v in &values {
                    forms.push(vec![format!("--{long}"), v.clone()]);
                    forms.push(vec![format!("--{long}={v}")]);
                    if let Some(short) = arg.get_short() {
                        forms.push(vec![format!("-{short}"), v.clone()]);
                    }
                }
                forms.push(vec![format!("--{long}")]);
            } else {
                forms.push(vec![format!("--{long}")]);
                forms.push(vec![format!("--{long}"), format!("--{long}")]);
                forms.push(vec![format!("--{long}=1")]);
            }
            if let Some(first) = forms.first() {
                all.extend(first.iter().cloned());
            }
            for f in forms {
                let mut line = f.clone();
                line.extend(tail.iter().cloned());
                lines.push(line.clone());
                // Without the `--`: both refuse.
                lines.push(f);
            }
        }
        assert!(flags >= 15, "only {flags} flags seen");
        all.extend(tail.iter().cloned());
        lines.push(all);
        lines.push(vec!["true".into()]);
        lines.push(vec!["--help".into()]);
        lines.push(vec!["--bogus".into(), "--".into(), "true".into()]);
        let mut parsed = 0;
        for line in &lines {
            let full = by_full(line);
            assert_eq!(by_alone(line), full, "{line:?}");
            parsed += usize::from(full.is_some());
        }
        assert!(parsed > flags, "too few lines parsed: {parsed}");
    }

    /// Every flag and argument of every subcommand says what it is for
    /// (hidden ones excepted): `retie X --help` never shows a bare flag.
    #[test]
    fn every_arg_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if arg.is_hide_set() {
                    continue;
                }
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let has = arg
                    .get_help()
                    .is_some_and(|h| !h.to_string().trim().is_empty())
                    || arg
                        .get_long_help()
                        .is_some_and(|h| !h.to_string().trim().is_empty());
                if !has {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.is_hide_set() {
                    continue;
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let cmd = Cli::command();
        let mut missing = Vec::new();
        walk(&cmd, "retie", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help text:\n{}",
            missing.join("\n")
        );
    }
}
