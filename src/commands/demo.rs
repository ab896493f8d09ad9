//! `retie demo`: offline, no key, under a minute. A scripted model fixes a
//! bug in a small bundled project (POSIX sh only), in a temporary
//! workspace, with retie's state, config and ledger in a temporary
//! directory (unless `--use-my-ledger`); then `replay`, `verify` and
//! `undo-all` show what was recorded and put everything back.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use retie_dispatch::{Approval, ApprovalRequest, Approver};

use super::run::{self, RunArgs};
use crate::error::CliError;

const FILES: &[(&str, &str)] = &[
    ("sum.sh", include_str!("../../agent/demo/project/sum.sh")),
    ("test.sh", include_str!("../../agent/demo/project/test.sh")),
    (
        "README.md",
        include_str!("../../agent/demo/project/README.md"),
    ),
];
const SCRIPT: &str = include_str!("../../agent/demo/script.json");

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Record in your real ledger and state instead of a temporary one.
    #[arg(long)]
    pub use_my_ledger: bool,
    /// Keep the temporary directory (its path is printed).
    #[arg(long)]
    pub keep: bool,
}

fn say(s: &str) {
    use std::io::IsTerminal;
    // Bold only on a terminal, and never with NO_COLOR.
    if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        eprintln!("\n\x1b[1m== {s}\x1b[0m");
    } else {
        eprintln!("\n== {s}");
    }
}

/// The show goes to stderr, the children's (`replay`, `verify`,
/// `undo-all`) included; stdout gets one line, the result, after the
/// temporary directory is gone. So `retie demo | head -1` runs the whole
/// demo and leaves nothing behind: nothing it writes meets a closed pipe
/// before its clean-up.
pub fn run(args: DemoArgs) -> i32 {
    use std::io::Write;
    use std::os::fd::AsFd;
    let out = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from);
    let moved = rustix::stdio::dup2_stdout(std::io::stderr().as_fd());
    if let Err(e) = &moved {
        eprintln!("retie demo: the show stays on stdout ({e})");
    }
    let (code, line) = match demo(args) {
        Ok(0) => (0, "retie demo: ok".to_string()),
        Ok(code) => (code, format!("retie demo: failed (exit {code})")),
        Err(e) => {
            eprintln!("retie demo: {e}");
            (run::EXIT_USAGE, format!("retie demo: error: {e}"))
        }
    };
    let _ = std::io::stdout().flush();
    if let (Ok(mut out), Ok(())) = (out, moved) {
        // A reader that is gone (`| head -1` after its line) is no
        // failure of the demo: everything is cleaned up by now.
        // SAFETY: setting a signal disposition to "ignore" is always
        // sound; nothing in this process relies on SIGPIPE's default.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let _ = writeln!(out, "{line}");
    }
    code
}

fn demo(args: DemoArgs) -> Result<i32, CliError> {
    let tmp = tempfile::Builder::new()
        .prefix("retie-demo-")
        .tempdir()
        .map_err(|e| CliError::io("creating the demo directory", e))?;
    let root = std::fs::canonicalize(tmp.path()).map_err(|e| CliError::io("demo dir", e))?;
    let ws = root.join("project");
    std::fs::create_dir_all(&ws).map_err(|e| CliError::io("creating the project", e))?;
    for (name, text) in FILES {
        std::fs::write(ws.join(name), text)
            .map_err(|e| CliError::io(format!("writing {name}"), e))?;
    }
    // A secret next to the project, and a symlink in the project that
    // points at it: neither may be read.
    let secret = root.join("outside-secret.txt");
    std::fs::write(&secret, "demo-secret-do-not-read\n").map_err(|e| CliError::io("secret", e))?;
    std::os::unix::fs::symlink(&root, ws.join("link-out"))
        .map_err(|e| CliError::io("symlink", e))?;
    if !args.use_my_ledger {
        let home = root.join("home");
        for (var, sub) in [
            ("XDG_STATE_HOME", "state"),
            ("XDG_CONFIG_HOME", "config"),
            ("XDG_DATA_HOME", "data"),
        ] {
            let d = home.join(sub);
            std::fs::create_dir_all(&d).map_err(|e| CliError::io("demo home", e))?;
            // Single-threaded here: nothing reads the environment
            // concurrently.
            std::env::set_var(var, &d);
        }
        std::env::set_var("RETIE_LEDGER", home.join("state/retie/ledger.db"));
        std::env::remove_var("RETIE_PROVIDER");
        std::env::remove_var("RETIE_MODEL");
    }
    let before = tree(&ws);
    let script = SCRIPT.replace("OUTSIDE_ABS", &secret.display().to_string());

    say("A small shell project with a bug: sum.sh starts counting at 1.");
    eprintln!("   workspace: {}", ws.display());
    eprintln!(
        "   A scripted model (no network, no key) will read it, run its tests in the sandbox,"
    );
    eprintln!("   fix it, try to write a hard-coded secret, and try to read outside the project.");
    eprintln!("   Every call goes through retie's chokepoint: classify, gate, plan the undo, record, run, confirm.");
    let report = run::run_inner(
        RunArgs {
            dir: Some(ws.clone()),
            prompt: Some("Fix the failing tests of this project.".into()),
            resume: None,
            continue_last: false,
            provider: run::ProviderArgs {
                provider: Some(run::ProviderArg::Script),
                model: Some("demo-script".into()),
                ..Default::default()
            },
            max_tier: None,
            autonomy: None,
            yes: false,
            on_ask: None,
            max_turns: Some(12),
            max_tokens: None,
            timeout: Some(60),
            bash_timeout: None,
            fetch_allow: Vec::new(),
            net: None,
            diff_lines: None,
            ledger: None,
            json: false,
            resume_overrides: Vec::new(),
        },
        Some(script),
        Some(Box::new(DemoPerson)),
    )?;
    let code = run::finish(&report, false);
    if code != 0 {
        return Ok(code);
    }
    let refused: Vec<_> = report
        .actions
        .iter()
        .filter(|a| {
            !retie_ledger::payload::Status::from_stored(a.status)
                .is_some_and(retie_ledger::payload::Status::succeeded)
        })
        .collect();
    say("What the gate and the guard refused:");
    for a in &refused {
        eprintln!(
            "   {} {}: {}",
            a.status,
            crate::ui::visible_again(&a.summary, false),
            crate::ui::preview(a.said.lines().next().unwrap_or(""))
        );
    }
    let leaked = report
        .actions
        .iter()
        .any(|a| a.said.contains("demo-secret-do-not-read"));
    let exe = std::env::current_exe().map_err(|e| CliError::io("finding retie", e))?;
    say("retie replay: the session as recorded (verified first).");
    let replay = sub(&exe, &["replay", &report.session])?;
    say("retie verify: hashes, chain, signatures, checkpoints.");
    let verify = sub(&exe, &["verify"])?;
    let fixed = tree(&ws);
    say("retie undo-all: every action of the session undone, newest first.");
    let undo = sub(&exe, &["undo-all", "--session", &report.session])?;
    let after = tree(&ws);
    say("Result");
    let ok = [
        ("the model fixed the bug", fixed != before),
        ("no secret outside the workspace was read", !leaked),
        ("replay succeeded", replay == 0),
        ("verify: intact", verify == 0),
        // 2: some actions had nothing to undo (reads, runs that changed
        // nothing, refusals); 1 would be a refused undo.
        ("undo-all refused nothing", undo == 0 || undo == 2),
        ("the project is back to its starting tree", after == before),
    ];
    for (what, good) in ok {
        eprintln!("   [{}] {what}", if good { "ok" } else { "FAILED" });
    }
    if args.keep {
        let kept = tmp.keep();
        eprintln!("   kept: {}", kept.display());
    } else if !args.use_my_ledger {
        // overlayfs leaves its work directories with mode 0 in the demo's
        // state (the last run's, in the trash until a next run sweeps it);
        // as anyone but root, removing the demo directory would stop at
        // them. retie's own removal opens them up first.
        clear_state(&root.join("home/state/retie"));
    }
    Ok(if ok.iter().all(|(_, g)| *g) { 0 } else { 1 })
}

/// Remove the run directories and the trash of the demo's own state the
/// way retie's housekeeping does, so the temporary directory can go.
fn clear_state(state: &std::path::Path) {
    retie_dispatch::overlay::sweep_trash(state);
    if let Ok(runs) = std::fs::read_dir(state.join("runs")) {
        for run in runs.flatten() {
            retie_dispatch::overlay::remove_run_dir(&run.path());
        }
    }
}

/// The person at the demo's keyboard, scripted: declines what the gate
/// asks about, saying why.
struct DemoPerson;

impl Approver for DemoPerson {
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval {
        eprintln!(
            "\n   the gate asks the person about {} {}: {}",
            req.action.tool(),
            req.action
                .args()
                .get("path")
                .and_then(|v| v.as_str())
                .unwrap_or(""),
            req.evaluation.decision.reason()
        );
        Approval::Denied {
            by: "person (demo, scripted)".into(),
            reason: "no: that writes a hard-coded secret; read it from the environment".into(),
        }
    }
}

fn sub(exe: &Path, args: &[&str]) -> Result<i32, CliError> {
    let st = Command::new(exe)
        .args(args)
        .status()
        .map_err(|e| CliError::io(format!("running retie {}", args.join(" ")), e))?;
    Ok(st.code().unwrap_or(1))
}

/// Every path with its content (files) or target (symlinks), sorted.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap_or(&p).to_path_buf();
            match e.file_type() {
                Ok(t) if t.is_symlink() => out.push((
                    rel,
                    std::fs::read_link(&p)
                        .map(|l| l.into_os_string().into_encoded_bytes())
                        .unwrap_or_default(),
                )),
                Ok(t) if t.is_dir() => {
                    out.push((rel, Vec::new()));
                    stack.push(p);
                }
                _ => out.push((rel, std::fs::read(&p).unwrap_or_default())),
            }
        }
    }
    out.sort();
    out
}
