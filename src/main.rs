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
    /// sample project, then replay, verify and undo-all.
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
    // `retie sandbox exec`, the command people run most, is parsed alone:
    // building every subcommand's parser cost a third of a millisecond per
    // run. Anything it does not take as is (help, version, an error) goes
    // to the full parser, which says it the usual way.
    if let Some(args) = commands::sandbox::fast_exec_args() {
        return exit_code(commands::sandbox::run(commands::sandbox::SandboxCmd::Exec(
            args,
        )));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                EXIT_SANDBOX_FAILED as u8
            } else {
                0
            });
        }
    };
    let code = match cli.command {
        Command::Policy(cmd) => return commands::policy::run(cmd),
        Command::Sandbox(cmd) => commands::sandbox::run(cmd),
        Command::Selftest(args) => commands::selftest::run(args),
        Command::Lab(cmd) => commands::lab::run(cmd),
        Command::LabHolder(args) => commands::lab::holder(args),
        Command::LabProbe(args) => commands::selftest::lab_probe(args),
        Command::NetProxy(args) => commands::net::proxy(args),
        Command::Probe(args) => commands::probe::run(args),
        Command::Helper(args) => commands::helper::run(args),
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
            crate::ui::say_error(&e);
            e.exit_code()
        }
    }
}
