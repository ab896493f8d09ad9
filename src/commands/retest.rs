//! `retie retest FINDING_FILE... --lab NAME`: from a pentest finding to a
//! verdict (issue 28). A thin front like `retie run`: it reads the
//! findings (`retie-finding`), maps their origin onto the lab, checks the
//! sandbox's tools, and runs one agent session per finding on the same
//! session loop, providers, approvals and ledger as `retie run`, with the
//! retest tool set (`run_command` in a lab-mode sandbox, `conclude`). The
//! verdict is a note in the ledger (`retie_ledger::retest::RetestVerdict`).
//!
//! Exit codes: 0 a verdict was recorded for every finding; 3 a budget ran
//! out (the verdict is `inconclusive`); 4 the provider failed; 5
//! suspended (an approval is pending: `retie approve`/`deny`, then `retie
//! retest --resume SESSION`); 130 interrupted; 125 a usage error (a
//! broken finding file, no such lab, a missing tool) before anything ran.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use retie_agent::session::{NoOne, Report, Session, SessionConfig, Status, YesFlag};
use retie_agent::tools::retest::{RetestSettings, RetestState, RETEST_SYSTEM_PROMPT};
use retie_agent::tools::{BashSettings, Tools};
use retie_agent::Provider;
use retie_dispatch::record::SessionSpec;
use retie_dispatch::sandbox::Runner;
use retie_dispatch::{Approver, Recorder};
use retie_finding::{Finding, OriginMap};
use retie_ledger::retest::{
    CommandRun, EvidenceItem, OriginPair, RetestAdjudication, RetestEnded, RetestOpened,
    RetestVerdict,
};
use retie_policy::Policy;
use retie_runtime::NetMode;
use serde_json::{json, Value};

use super::run::{self as agent_run, AutonomyArg, ProviderArg, ProviderArgs, RunArgs};
use crate::error::CliError;

/// The tools a retest command may count on, with the Debian package that
/// brings each (checked before the first step; never a silent fallback).
pub const PROFILE_TOOLS: &[(&str, &str)] = &[("curl", "curl"), ("python3", "python3")];

#[derive(Args, Debug)]
pub struct RetestArgs {
    /// Findings files: retie-finding/1, SARIF 2.1.0, OWASP ZAP JSON or
    /// Nuclei JSONL. Every finding in them is retested, one session each
    /// (or the one --id names).
    #[arg(value_name = "FINDING_FILE", required_unless_present = "resume")]
    pub findings: Vec<PathBuf>,
    /// The lab to retest against (`retie lab up --name NAME`).
    #[arg(long, value_name = "NAME", required_unless_present = "resume")]
    pub lab: Option<String>,
    /// Retest only the finding with this id.
    #[arg(long)]
    pub id: Option<String>,
    /// Continue retest session SESSION from the ledger (verified first).
    #[arg(long, value_name = "SESSION", conflicts_with_all = ["findings", "lab", "id"])]
    pub resume: Option<String>,
    /// The model provider: which wire format, model, endpoint and key.
    #[command(flatten)]
    pub provider: ProviderArgs,
    /// The ladder climbs no higher than tier N (a spend cap; no effect
    /// with --model).
    #[arg(long, value_name = "N")]
    pub max_tier: Option<u32>,
    /// manual: every command asks; gated (default) and auto: every
    /// run_command asks too (a lab target cannot be rolled back), unless
    /// an "always" grant covers it.
    #[arg(long, value_enum)]
    pub autonomy: Option<AutonomyArg>,
    /// Approve whatever the gate asks (never what the policy denies).
    #[arg(long)]
    pub yes: bool,
    /// Model turns at most per finding; then the verdict is
    /// `inconclusive: budget exhausted`.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_steps: u32,
    /// The longest one command may run, seconds (the model's timeout is
    /// clamped to it).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub command_ceiling: u64,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// One JSON object per finding at the end, on stdout.
    #[arg(long)]
    pub json: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn run(args: RetestArgs) -> i32 {
    let json_out = args.json;
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            crate::ui::say_failure(&e);
            if json_out {
                println!(
                    "{}",
                    json!({"status": "error", "error": crate::ui::failure_text(&e)})
                );
            }
            agent_run::EXIT_USAGE
        }
    }
}

/// The `RunArgs` the shared resolution reads (provider, model, key,
/// autonomy, budgets).
fn run_args(a: &RetestArgs, dir: Option<PathBuf>) -> RunArgs {
    RunArgs {
        dir,
        prompt: None,
        resume: a.resume.clone(),
        continue_last: false,
        provider: a.provider.clone(),
        max_tier: a.max_tier,
        autonomy: a.autonomy,
        yes: a.yes,
        on_ask: None,
        max_turns: Some(a.max_steps.max(1)),
        max_tokens: None,
        timeout: None,
        bash_timeout: None,
        fetch_allow: Vec::new(),
        net: None,
        diff_lines: None,
        ledger: a.ledger.clone(),
        json: a.json,
        resume_overrides: Vec::new(),
    }
}

fn run_inner(a: RetestArgs) -> Result<i32, CliError> {
    if let Some(id) = a.resume.clone() {
        return resume(a, &id);
    }
    // Every file read and checked before anything starts.
    let mut findings: Vec<Finding> = Vec::new();
    for f in &a.findings {
        findings.extend(retie_finding::load(f).map_err(|e| CliError::Usage(e.to_string()))?);
    }
    if let Some(id) = &a.id {
        let all: Vec<String> = findings.iter().map(|f| f.id.clone()).collect();
        findings.retain(|f| &f.id == id);
        if findings.is_empty() {
            return Err(CliError::Usage(format!(
                "--id {}: no such finding; the files hold: {}",
                crate::ui::visible(id),
                crate::ui::visible(&all.join(", "))
            )));
        }
    }
    let lab = a.lab.clone().unwrap_or_default();
    let net = super::lab::resolve_net(&format!("lab:{lab}"))?;
    let ports = match &net {
        NetMode::Lab(l) => l.ports.clone(),
        _ => Vec::new(),
    };
    let mut mapped = Vec::new();
    for f in &findings {
        let (on_lab, map) =
            retie_finding::onto_lab(f, &lab, &ports).map_err(|e| CliError::Usage(e.to_string()))?;
        mapped.push((f.clone(), on_lab, map));
    }
    let checked = check_tools()?;
    let mut code = agent_run::EXIT_FINISHED;
    for (f, on_lab, map) in mapped {
        eprintln!(
            "retie: retest of {} ({}) from {} against lab {lab}",
            crate::ui::visible(&f.id),
            crate::ui::visible(&f.title),
            crate::ui::visible(&f.source.file),
        );
        for m in &map {
            eprintln!(
                "retie: origin {} -> {}",
                crate::ui::visible(&m.from),
                crate::ui::visible(&m.to)
            );
        }
        let c = one(&a, &f, &on_lab, &map, &lab, &ports, &net, &checked)?;
        if code == agent_run::EXIT_FINISHED {
            code = c;
        }
        if c == agent_run::EXIT_SUSPENDED || c == agent_run::EXIT_INTERRUPTED {
            break;
        }
    }
    Ok(code)
}

/// The profile's tools, looked up where the sandbox sees them (its
/// system view is the host's /usr, read-only). A missing one stops the
/// retest with the package to install.
fn check_tools() -> Result<Vec<String>, CliError> {
    check_tools_in(&[
        Path::new("/usr/local/bin"),
        Path::new("/usr/bin"),
        Path::new("/bin"),
    ])
}

/// [`check_tools`] in `dirs`: each of [`PROFILE_TOOLS`] must be an
/// executable file in one of them; the error names every missing tool
/// with its Debian package and the one `apt-get install` line.
fn check_tools_in(dirs: &[&Path]) -> Result<Vec<String>, CliError> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = Vec::new();
    let mut missing = Vec::new();
    let mut packages = Vec::new();
    for (tool, package) in PROFILE_TOOLS {
        match dirs.iter().map(|d| d.join(tool)).find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        }) {
            Some(p) => found.push(p.display().to_string()),
            None => {
                missing.push(format!("{tool} (Debian package {package})"));
                packages.push(*package);
            }
        }
    }
    if !missing.is_empty() {
        return Err(CliError::Usage(format!(
            "the retest sandbox lacks {}: install it (`apt-get install {}`); retie does not retest with fewer tools",
            missing.join(", "),
            packages.join(" ")
        )));
    }
    Ok(found)
}

fn provider_name(p: ProviderArg) -> &'static str {
    match p {
        ProviderArg::Openai => "openai",
        ProviderArg::Anthropic => "anthropic",
        ProviderArg::Ollama => "ollama",
        ProviderArg::Script => "script",
    }
}

/// The first message: the finding as the agent sees it (on the lab).
fn objective(f: &Finding, lab_origin: &str, max_steps: u32) -> String {
    let mut t = format!(
        "Retest this finding against the lab at {lab_origin} and conclude still_open, fixed or inconclusive. You have {max_steps} steps.\n\nFinding {}: {}\n",
        f.id, f.title
    );
    if let Some(s) = &f.severity {
        t.push_str(&format!("Severity: {s}\n"));
    }
    if let Some(c) = &f.cwe {
        t.push_str(&format!("Weakness: {c}\n"));
    }
    if let Some(r) = &f.rule {
        t.push_str(&format!("Rule: {r}\n"));
    }
    if !f.description.is_empty() {
        t.push_str(&format!("Description: {}\n", f.description));
    }
    for (i, s) in f.steps.iter().enumerate() {
        t.push_str(&format!("Step {}: {s}\n", i + 1));
    }
    for (i, x) in f.instances.iter().enumerate() {
        t.push_str(&format!("\nInstance {}: {} {}\n", i + 1, x.method, x.url));
        if let Some(p) = &x.param {
            t.push_str(&format!("  parameter: {p}\n"));
        }
        if let Some(p) = &x.payload {
            t.push_str(&format!("  payload: {p}\n"));
        }
        if let Some(b) = &x.body {
            t.push_str(&format!("  body: {b}\n"));
        }
        if let Some(p) = &x.precondition {
            t.push_str(&format!("  first: {p}\n"));
        }
        if let Some(r) = &x.request {
            t.push_str(&format!("  request as recorded:\n{r}\n"));
        }
        for e in &x.evidence {
            t.push_str(&format!("  evidence: {e}\n"));
        }
    }
    t
}

fn pairs(map: &[OriginMap]) -> Vec<OriginPair> {
    map.iter()
        .map(|m| OriginPair {
            from: m.from.clone(),
            to: m.to.clone(),
        })
        .collect()
}

/// The retest's scratch directory: each command's sandbox workspace.
fn scratch_dir() -> Result<PathBuf, CliError> {
    let base = crate::state::dir()?.join("retest");
    std::fs::create_dir_all(&base)
        .map_err(|e| CliError::io(format!("creating {}", base.display()), e))?;
    let d = tempfile::Builder::new()
        .prefix("scratch-")
        .tempdir_in(&base)
        .map_err(|e| CliError::io(format!("creating a directory in {}", base.display()), e))?
        .keep();
    Ok(d)
}

/// Tools with the retest tool set on `scratch`.
fn retest_tools(
    r: &agent_run::Resolved,
    scratch: &Path,
    net: &NetMode,
    ceiling: u64,
    ledger: &Path,
) -> Result<Tools, CliError> {
    let state = crate::state::dir()?;
    crate::state::landlock_notice_once(&state);
    // The workspace guards of every entry point: the scratch lies in
    // retie's own state directory (its retest area) and nowhere else; a
    // scratch named by a resumed session's ledger is held to the same.
    let ws = std::fs::canonicalize(scratch)
        .map_err(|e| CliError::io(format!("the retest's scratch {}", scratch.display()), e))?;
    let protect = super::guard_workspace(
        &ws,
        ledger,
        retie_dispatch::guard::GuardOptions {
            system_flag: None,
            retie_scratch: Some(state.join("retest")),
        },
    )?
    .protect;
    let policy =
        Policy::shipped().map_err(|e| CliError::Usage(format!("the shipped policy: {e}")))?;
    let bash = BashSettings::defaults()?;
    let runner = if r.provider == ProviderArg::Script {
        Runner::InProcess
    } else {
        // Talking HTTP makes this process multi-threaded: sandboxes start
        // from the single-threaded helper, as for `retie run`.
        Runner::Helper {
            exe: retie_runtime::helper::beside(
                &std::env::current_exe()
                    .map_err(|e| CliError::io("locating the retie binary", e))?,
            ),
        }
    };
    let ceiling = Duration::from_secs(ceiling.max(1));
    let settings = RetestSettings {
        net: net.clone(),
        workspace: scratch.to_path_buf(),
        profile: bash.profile.clone(),
        ceiling,
        default_timeout: ceiling.min(Duration::from_secs(30)),
        output_cap: 64 << 10,
        runner,
    };
    let mut tools = Tools::open(scratch.to_path_buf(), state, protect, None, policy, bash)?;
    tools.retest = Some(RetestState::new(settings));
    Ok(tools)
}

/// What the operator types at the retest prompt.
#[derive(Debug, PartialEq, Eq)]
enum OperatorLine {
    Nothing,
    Help,
    End,
    Command(String),
    Verdict { status: String, reason: String },
    Steer(String),
    Bad(String),
}

const OPERATOR_HELP: &str = "\
!CMD                      run your own command in a fresh lab sandbox (recorded as yours; the agent reads its output with your next message)
TEXT                      steer the agent: your message, then it goes on
/verdict STATUS REASON    your adjudication (still_open, fixed or inconclusive), recorded beside the agent's verdict, never replacing it
/end                      end this retest (Ctrl-D too); with no verdict yet the report says it was ended by the operator
/help                     this list";

fn parse_operator(line: &str) -> OperatorLine {
    let t = line.trim();
    if t.is_empty() {
        return OperatorLine::Nothing;
    }
    if let Some(cmd) = t.strip_prefix('!') {
        return if cmd.trim().is_empty() {
            OperatorLine::Bad("!CMD needs a command after the !".into())
        } else {
            OperatorLine::Command(cmd.trim().to_string())
        };
    }
    if !t.starts_with('/') {
        return OperatorLine::Steer(t.to_string());
    }
    let (word, rest) = t.split_once(char::is_whitespace).unwrap_or((t, ""));
    match word {
        "/help" => OperatorLine::Help,
        "/end" if rest.trim().is_empty() => OperatorLine::End,
        "/verdict" => {
            let rest = rest.trim();
            let (status, reason) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            if !matches!(status, "still_open" | "fixed" | "inconclusive") {
                OperatorLine::Bad(format!(
                    "/verdict STATUS REASON: the status is still_open, fixed or inconclusive, not {:?}",
                    crate::ui::visible(status)
                ))
            } else if reason.trim().is_empty() {
                OperatorLine::Bad("/verdict STATUS REASON: say why (the reason is recorded)".into())
            } else {
                OperatorLine::Verdict {
                    status: status.into(),
                    reason: reason.trim().into(),
                }
            }
        }
        _ => OperatorLine::Bad(format!(
            "unknown command {} (/help lists them)",
            crate::ui::visible(word)
        )),
    }
}

/// The operator's prompt of an interactive retest: after each of the
/// agent's sends (it concluded, stopped to talk, ran out of steps or was
/// cancelled with Ctrl-C), until `/end` or Ctrl-D. The agent's verdict
/// is recorded as soon as it exists; the operator's `/verdict` is a note
/// of its own beside it.
#[allow(clippy::too_many_arguments)]
async fn operator_loop<P: Provider>(
    mut s: Session<P>,
    editor: &std::rc::Rc<std::cell::RefCell<super::chat::LineEditor>>,
    approver: &mut dyn Approver,
    ui: &mut super::chat::PlainRender,
    first: Option<String>,
    max_steps: u32,
    opened: &RetestOpened,
) -> Result<i32, CliError> {
    use super::chat::Read;
    let st = crate::ui::Style::stderr();
    eprintln!(
        "retie: retest session {} · at retest> : !CMD runs your command, text steers the agent, /verdict STATUS REASON, /end (/help)",
        crate::ui::visible(s.id())
    );
    let mut next: Option<String> = first;
    // Resumed with nothing to carry on: straight to the prompt.
    let mut run = next.is_some() || !s.waiting_for_input();
    let mut verdict: Option<RetestVerdict> = None;
    let mut last: Option<Report> = None;
    // Outputs of the operator's commands not yet given to the agent.
    let mut context: Vec<String> = Vec::new();
    let mut ctrl_c = false;
    loop {
        if run {
            run = false;
            INTERRUPTED.store(false, Ordering::SeqCst);
            s.cancel_token().reset();
            let left = max_steps.saturating_sub(s.turns()).max(1);
            s.config().max_turns = left;
            let report = s.send(next.take().as_deref(), approver, ui).await;
            println!();
            match report.status {
                Status::ProviderFailed | Status::Failed | Status::Suspended => {
                    last = Some(report);
                    break;
                }
                Status::Interrupted => eprintln!(
                    "{}",
                    st.yellow("cancelled: the agent's turn stopped; what ran is recorded")
                ),
                _ => {}
            }
            let concluded = s.tools().concluded();
            let spent = s.turns() >= max_steps;
            if verdict.is_none() && (concluded || spent) {
                let v = verdict_of(&mut s, &report, max_steps);
                s.record_note(false, &v.to_note())
                    .map_err(|e| CliError::Usage(format!("recording the verdict: {e}")))?;
                print_verdict(false, s.id(), opened, Some(&v), &report);
                verdict = Some(v);
            }
            last = Some(report);
        }
        let line = match editor.borrow_mut().read("retest> ", true) {
            Read::Eof => break,
            Read::Interrupted if ctrl_c => break,
            Read::Interrupted => {
                ctrl_c = true;
                eprintln!(
                    "{}",
                    st.dim("(Ctrl-C again, Ctrl-D or /end ends the retest)")
                );
                continue;
            }
            Read::Line(l) => l,
        };
        ctrl_c = false;
        match parse_operator(&line) {
            OperatorLine::Nothing => {}
            OperatorLine::Help => eprintln!("{OPERATOR_HELP}"),
            OperatorLine::End => break,
            OperatorLine::Bad(why) => eprintln!("{why}"),
            OperatorLine::Command(cmd) => {
                INTERRUPTED.store(false, Ordering::SeqCst);
                s.cancel_token().reset();
                let text = s
                    .operator_command(&cmd)
                    .map_err(|e| CliError::Usage(format!("the operator's command: {e}")))?;
                eprintln!("{}", crate::ui::prose(&text));
                context.push(format!("$ {cmd}\n{text}"));
            }
            OperatorLine::Verdict { status, reason } => {
                let note = retie_ledger::payload::Note {
                    retest_adjudication: Some(RetestAdjudication {
                        status: status.clone(),
                        reason: reason.clone(),
                        by: "operator".into(),
                        agent_status: verdict.as_ref().map(|v| v.status.clone()),
                    }),
                    ..Default::default()
                };
                s.record_note(true, &note)
                    .map_err(|e| CliError::Usage(format!("recording the adjudication: {e}")))?;
                eprintln!(
                    "retie: your adjudication {status} is recorded beside {} (the report shows both)",
                    match &verdict {
                        Some(v) => format!("the agent's verdict {}", v.status),
                        None => "no verdict yet".into(),
                    }
                );
            }
            OperatorLine::Steer(text) => {
                if verdict.is_some() {
                    eprintln!(
                        "the retest has its verdict: /verdict STATUS REASON adjudicates it, !CMD checks, /end closes"
                    );
                    continue;
                }
                let mut msg = String::new();
                if !context.is_empty() {
                    msg.push_str("The operator ran these commands themselves in the same kind of lab sandbox (their outputs may be cited like yours):\n");
                    for c in context.drain(..) {
                        msg.push_str(&c);
                        msg.push('\n');
                    }
                    msg.push_str("\nThe operator says: ");
                }
                msg.push_str(&text);
                next = Some(msg);
                run = true;
            }
        }
    }
    let stopped = last.as_ref().map(|r| r.status);
    match (&verdict, stopped) {
        (Some(_), _) | (None, Some(Status::Suspended)) => {}
        // The session itself failed: retie's inconclusive, as without a
        // terminal.
        (None, Some(Status::ProviderFailed | Status::Failed)) => {
            if let Some(r) = &last {
                let v = verdict_of(&mut s, r, max_steps);
                s.record_note(false, &v.to_note())
                    .map_err(|e| CliError::Usage(format!("recording the verdict: {e}")))?;
                print_verdict(false, s.id(), opened, Some(&v), r);
            }
        }
        (None, _) => {
            s.record_note(
                true,
                &retie_ledger::payload::Note {
                    retest_ended: Some(RetestEnded {
                        by: "operator".into(),
                        reason: "ended by operator".into(),
                        steps: s.turns(),
                        max_steps,
                    }),
                    ..Default::default()
                },
            )
            .map_err(|e| CliError::Usage(format!("recording the end: {e}")))?;
            eprintln!("retie: retest ended by the operator with no verdict (recorded)");
        }
    }
    let session = s.id().to_string();
    let closed = s.close();
    if let Err(e) = closed {
        return Err(CliError::Usage(format!(
            "the ledger could not close session {session}: {e}"
        )));
    }
    eprintln!("retie: session {} closed", crate::ui::visible(&session));
    Ok(match last {
        Some(r)
            if matches!(
                r.status,
                Status::ProviderFailed | Status::Failed | Status::Suspended
            ) =>
        {
            agent_run::finish(&r, false)
        }
        _ => agent_run::EXIT_FINISHED,
    })
}

fn approver(a: &RetestArgs) -> Result<Box<dyn Approver>, CliError> {
    Ok(if a.yes {
        eprintln!(
            "retie: warning: --yes approves every command the gate asks about (never one the policy denies); the ledger records each such approval as coming from the flag"
        );
        Box::new(YesFlag)
    } else if std::io::stdin().is_terminal() {
        Box::new(super::chat::terminal_approver(&INTERRUPTED)?)
    } else {
        Box::new(NoOne)
    })
}

#[allow(clippy::too_many_arguments)]
fn one(
    a: &RetestArgs,
    f: &Finding,
    on_lab: &Finding,
    map: &[OriginMap],
    lab: &str,
    ports: &[u16],
    net: &NetMode,
    checked: &[String],
) -> Result<i32, CliError> {
    let scratch = scratch_dir()?;
    let ra = run_args(a, Some(scratch.clone()));
    let mut r = agent_run::resolve(&ra)?;
    r.cfg.system_prompt = RETEST_SYSTEM_PROMPT.into();
    r.cfg.max_turns = a.max_steps.max(1);
    r.cfg.interrupt = Some(&INTERRUPTED);
    let ledger_path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let tools = retest_tools(&r, &scratch, net, a.command_ceiling, &ledger_path)?;
    let provider_name = provider_name(r.provider);
    let lab_origin = map
        .first()
        .map(|m| m.to.clone())
        .unwrap_or_else(|| format!("http://{lab}:{}", ports.first().copied().unwrap_or(80)));
    let prompt = objective(on_lab, &lab_origin, r.cfg.max_turns);
    let opened = RetestOpened {
        finding: serde_json::to_value(f).unwrap_or(Value::Null),
        finding_on_lab: serde_json::to_value(on_lab).unwrap_or(Value::Null),
        lab: lab.into(),
        lab_ports: ports.to_vec(),
        origin_map: pairs(map),
        max_steps: r.cfg.max_turns,
        tools_checked: checked.to_vec(),
        scratch: scratch.display().to_string(),
    };
    let spec = spec(&scratch, provider_name, &r, &prompt, a.yes, &opened)?;
    let mut rec = Recorder::open(&ledger_path, spec)?;
    rec.lock(&ledger_path)?;
    let p = agent_run::provider(&ra, &r, provider_name, None, false)?;
    drive(a, p, tools, rec, None, r.cfg.clone(), Some(prompt), opened)
}

fn spec(
    scratch: &Path,
    provider_name: &str,
    r: &agent_run::Resolved,
    prompt: &str,
    yes: bool,
    opened: &RetestOpened,
) -> Result<SessionSpec, CliError> {
    let effects = ["runs_sandboxed", "lab_access", "reads_untrusted"];
    let policy =
        Policy::shipped().map_err(|e| CliError::Usage(format!("the shipped policy: {e}")))?;
    Ok(SessionSpec {
        join: None,
        workspace: scratch.to_path_buf(),
        opened: retie_ledger::payload::SessionOpened {
            objective: Some(prompt.into()),
            origin: Some("retie retest".into()),
            provider: Some(provider_name.into()),
            model: Some(r.cfg.model.clone()),
            system_prompt_digest: Some(
                blake3::hash(r.cfg.system_prompt.as_bytes())
                    .to_hex()
                    .to_string(),
            ),
            system_prompt: Some(r.cfg.system_prompt.clone()),
            pid: Some(std::process::id()),
            policy_digest: Some(policy.digest().to_hex().to_string()),
            autonomy: Some(r.cfg.tier.name().into()),
            approvals_from_yes_flag: Some(yes),
            fetch_allow: Some(Vec::new()),
            base_url: r.cfg.base_url.clone(),
            api_key_env: r.cfg.api_key_env.clone(),
            budget: Some(retie_ledger::payload::Budget {
                max_turns: Some(r.cfg.max_turns),
                max_tokens: Some(r.cfg.max_tokens),
                timeout_s: Some(r.cfg.timeout.as_secs_f64()),
            }),
            retest: Some(opened.clone()),
            ..Default::default()
        },
        effects: effects.iter().map(|e| e.to_string()).collect(),
        intent_base: json!({
            "tool": "agent",
            "workspace": scratch.display().to_string(),
            "mode": "direct",
            "effects": effects,
        }),
    })
}

/// Open (or resume) the session, one send, the verdict, close.
#[allow(clippy::too_many_arguments)]
fn drive<P: Provider>(
    a: &RetestArgs,
    p: P,
    tools: Tools,
    rec: Recorder,
    rows: Option<Vec<retie_ledger::Row>>,
    cfg: SessionConfig,
    prompt: Option<String>,
    opened: RetestOpened,
) -> Result<i32, CliError> {
    // On a terminal (and not --json) the operator has a prompt of their
    // own between the agent's sends: `!CMD`, steering, `/end`,
    // `/verdict` (`operator_loop`). The approval prompt reads the same
    // editor.
    let operator = (!a.json && std::io::stdin().is_terminal())
        .then(super::chat::LineEditor::open)
        .transpose()?
        .map(|e| std::rc::Rc::new(std::cell::RefCell::new(e)));
    let mut approver: Box<dyn Approver> = match (&operator, a.yes) {
        (Some(ed), false) => Box::new(super::chat::terminal_approver_on(ed.clone(), &INTERRUPTED)),
        _ => approver(a)?,
    };
    // SAFETY: installing a handler that only stores to an atomic, before
    // any thread exists; it replaces the default disposition of SIGINT.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let mut ui = super::chat::PlainRender::new(a.json);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::io("starting the async runtime", e))?;
    let max_steps = cfg.max_turns;
    let cache_key =
        retie_agent::catalogue::Cache::key(p.name(), cfg.base_url.as_deref().unwrap_or(""));
    rt.block_on(async {
        let mut s = match &rows {
            None => Session::open(p, tools, rec, cfg),
            Some(rows) => {
                let mut s = Session::resume(p, tools, rec, cfg, rows)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                let msgs = s.messages().to_vec();
                if let Some(r) = s.tools().retest.as_mut() {
                    r.rebuild(&msgs);
                }
                eprintln!(
                    "retie: resuming retest session {} ({} steps so far)",
                    crate::ui::visible(s.id()),
                    s.turns()
                );
                s
            }
        };
        if let Some(editor) = operator.as_ref() {
            return operator_loop(
                s,
                editor,
                approver.as_mut(),
                &mut ui,
                prompt,
                max_steps,
                &opened,
            )
            .await;
        }
        let report = s.send(prompt.as_deref(), approver.as_mut(), &mut ui).await;
        let verdict = if report.status == Status::Suspended {
            None
        } else {
            Some(verdict_of(&mut s, &report, max_steps))
        };
        if let Some(v) = &verdict {
            s.record_note(false, &v.to_note())
                .map_err(|e| CliError::Usage(format!("recording the verdict: {e}")))?;
        }
        let session = s.id().to_string();
        if let Some(l) = s.ladder() {
            super::models::remember_refusals(&cache_key, &session, l.refused());
        }
        let closed = s.close();
        let code = agent_run::finish(&report, false);
        if let Err(e) = closed {
            return Err(CliError::Usage(format!(
                "the ledger could not close session {session}: {e}"
            )));
        }
        print_verdict(a.json, &session, &opened, verdict.as_ref(), &report);
        Ok(match (&verdict, report.status) {
            (Some(_), Status::Finished) => agent_run::EXIT_FINISHED,
            _ => code,
        })
    })
}

/// The verdict: the agent's valid conclusion, else `inconclusive` with
/// why the session ended without one.
fn verdict_of<P: Provider>(s: &mut Session<P>, report: &Report, max_steps: u32) -> RetestVerdict {
    let turns = s.turns();
    let state = s.tools().retest.clone();
    let outputs = state
        .as_ref()
        .map(|r| r.outputs.clone())
        .unwrap_or_default();
    let commands = outputs
        .iter()
        .map(|o| CommandRun {
            output_id: o.id.clone(),
            command: o.command.clone(),
            exit_code: o.exit_code,
            timed_out: o.timed_out,
            output: o.text.clone(),
            operator: o.operator,
        })
        .collect();
    match state.and_then(|r| r.conclusion) {
        Some(c) => RetestVerdict {
            status: c.status,
            rationale: c.rationale,
            decided_by: "agent".into(),
            evidence: c
                .evidence
                .iter()
                .map(|e| EvidenceItem {
                    output_id: e.output_id.clone(),
                    excerpt: e.excerpt.clone(),
                    command: outputs
                        .iter()
                        .find(|o| o.id == e.output_id)
                        .map(|o| o.command.clone())
                        .unwrap_or_default(),
                })
                .collect(),
            commands,
            steps: turns,
            max_steps,
        },
        None => RetestVerdict {
            status: "inconclusive".into(),
            rationale: match report.status {
                Status::TurnBudget => "budget exhausted".into(),
                Status::Finished => "the agent stopped without a valid conclusion".into(),
                _ => format!("the session ended without a conclusion: {}", report.message),
            },
            decided_by: "retie".into(),
            evidence: Vec::new(),
            commands,
            steps: turns,
            max_steps,
        },
    }
}

fn print_verdict(
    json_out: bool,
    session: &str,
    opened: &RetestOpened,
    v: Option<&RetestVerdict>,
    report: &Report,
) {
    let id = opened
        .finding
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("?");
    if json_out {
        println!(
            "{}",
            json!({
                "session": session,
                "finding": id,
                "lab": opened.lab,
                "origin_map": opened.origin_map,
                "status": v.map(|v| v.status.as_str()).unwrap_or("suspended"),
                "verdict": v,
                "pending": report.pending,
                "message": report.message,
                "turns": report.turns,
                "tokens_in": report.tokens_in,
                "tokens_out": report.tokens_out,
            })
        );
        return;
    }
    match v {
        Some(v) => eprintln!(
            "retie: verdict for {}: {}: {} (decided by {}, {} command(s), session {})",
            crate::ui::visible(id),
            v.status,
            crate::ui::visible(&v.rationale),
            v.decided_by,
            v.commands.len(),
            crate::ui::visible(session)
        ),
        None => eprintln!(
            "retie: no verdict yet for {}: {}; then `retie retest --resume {}`",
            crate::ui::visible(id),
            crate::ui::visible(&report.message),
            crate::ui::visible(session)
        ),
    }
}

/// `--resume SESSION`: the lab, the finding and the settings from the
/// session's opening; the outputs from its conversation.
fn resume(mut a: RetestArgs, id: &str) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let ledger = retie_ledger::Ledger::open(&path, false, None)?;
    let rows = ledger.session_rows(id)?;
    drop(ledger);
    let opened: RetestOpened = super::report::retest_opened(
        rows.iter()
            .find(|r| r.kind == retie_ledger::Kind::SessionOpened.as_bytes())
            .map(|r| r.payload_json()),
        id,
        &path,
        "`retie run --resume` resumes agent sessions",
    )?;
    let mut ra = run_args(&a, None);
    agent_run::defaults_from_session(&mut ra, id)?;
    a.provider = ra.provider.clone();
    a.autonomy = ra.autonomy;
    let scratch = PathBuf::from(&opened.scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| CliError::io(format!("creating {}", scratch.display()), e))?;
    ra.dir = Some(scratch.clone());
    ra.max_turns = Some(opened.max_steps);
    let mut r = agent_run::resolve(&ra)?;
    r.cfg.max_turns = opened.max_steps;
    r.cfg.interrupt = Some(&INTERRUPTED);
    let net = super::lab::resolve_net(&format!("lab:{}", opened.lab))?;
    let tools = retest_tools(&r, &scratch, &net, a.command_ceiling, &path)?;
    let provider_name = provider_name(r.provider);
    let spec = spec(&scratch, provider_name, &r, "", a.yes, &opened)?;
    let (mut rec, rows) = Recorder::resume(&path, id, spec.intent_base)?;
    // The allow-list of deciders (ADR 0460), as `retie run --resume`.
    let allowed = super::gc::config()?.0.ledger.approvers_for(&scratch);
    rec.refuse_unlisted_decider(&rows, &allowed)?;
    for (name, value) in &ra.resume_overrides {
        rec.setting(name, json!(value), "person (a flag on resume)")?;
    }
    let p = agent_run::provider(&ra, &r, provider_name, None, true)?;
    drive(&a, p, tools, rec, Some(rows), r.cfg.clone(), None, opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(dir: &Path, name: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// Issue 28: a tool the retest profile names is missing (or is not
    /// executable): the retest stops with the Debian package for each,
    /// never carrying on with fewer tools.
    #[test]
    fn a_missing_tool_stops_the_retest_with_its_debian_package() {
        let a = tempfile::tempdir().expect("tmp");
        let b = tempfile::tempdir().expect("tmp");
        let dirs = [a.path(), b.path()];
        let e = check_tools_in(&dirs)
            .expect_err("nothing there")
            .to_string();
        assert!(
            e.contains("curl (Debian package curl), python3 (Debian package python3)")
                && e.contains("`apt-get install curl python3`")
                && e.contains("does not retest with fewer tools"),
            "{e}"
        );
        put(b.path(), "curl", 0o755);
        put(a.path(), "python3", 0o644);
        let e = check_tools_in(&dirs)
            .expect_err("python3 not executable")
            .to_string();
        assert!(
            e.contains("lacks python3 (Debian package python3)")
                && e.contains("`apt-get install python3`")
                && !e.contains("curl"),
            "{e}"
        );
        put(b.path(), "python3", 0o755);
        let found = check_tools_in(&dirs).expect("both there");
        assert_eq!(
            found,
            vec![
                b.path().join("curl").display().to_string(),
                b.path().join("python3").display().to_string()
            ]
        );
    }
}
