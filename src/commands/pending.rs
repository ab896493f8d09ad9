//! `retie pending`, `retie approve`, `retie deny`: pending approvals
//! across sessions, decided from another process without a terminal.
//!
//! A decision is a `decision` entry signed by the user key (the person),
//! naming the pending entry and binding its digest. It is appended only
//! while that pending approval is still the session's open one and
//! undecided, checked inside the append's transaction: a second decision,
//! or one for a session that moved on, is refused and nothing is written.
//! `retie run --resume SESSION` carries it out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use retie_dispatch::approval::Answer;
use retie_dispatch::record::{OpenPending, SessionState};
use retie_ledger::{Kind, Ledger, Row};
use serde_json::{json, Value};

use crate::error::CliError;
use crate::ui::visible;

#[derive(Args)]
pub struct PendingArgs {
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// The pending approvals as JSON, on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ApproveArgs {
    /// The suspended session (`retie pending` lists them).
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Run this instead: a JSON object of arguments, or for bash the new
    /// command line. The edited action is classified and gated again when
    /// the session resumes, recorded as an edit of the proposal, and the
    /// model is told what ran.
    #[arg(long, value_name = "JSON-OR-COMMAND")]
    pub edit: Option<String>,
    /// Approve only if the pending action's digest is this one (what you
    /// read in `retie pending`).
    #[arg(long, value_name = "HEX")]
    pub digest: Option<String>,
    /// Also grant "always, for this session, for this exact prefix": the
    /// same simple commands run without asking from now on (a `grant`
    /// entry; `retie revoke` takes it back).
    #[arg(long, conflicts_with = "edit")]
    pub always: bool,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
}

#[derive(Args)]
pub struct RevokeArgs {
    /// The session whose grant to take back (not running).
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// The grant's entry number (`retie sessions --json` lists them under
    /// `grants`).
    #[arg(value_name = "GRANT")]
    pub grant: i64,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
}

#[derive(Args)]
pub struct DenyArgs {
    /// The suspended session (`retie pending` lists them).
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// Why: the model reads it when the session resumes.
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Deny only if the pending action's digest is this one (what you
    /// read in `retie pending`).
    #[arg(long, value_name = "HEX")]
    pub digest: Option<String>,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
}

/// Every session's rows, in the order the sessions were opened.
pub fn by_session(rows: Vec<Row>) -> Vec<(String, Vec<Row>)> {
    let mut order: Vec<String> = Vec::new();
    let mut map: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    for r in rows {
        let s = r.session_str();
        if s.is_empty() {
            continue;
        }
        if !map.contains_key(&s) {
            order.push(s.clone());
        }
        map.entry(s).or_default().push(r);
    }
    order
        .into_iter()
        .filter_map(|s| map.remove(&s).map(|r| (s, r)))
        .collect()
}

fn read_rows(ledger: Option<&Path>) -> Result<(PathBuf, Vec<Row>), CliError> {
    let path = crate::ledger::resolve_path(ledger)?;
    let rows = Ledger::open(&path, false, None)?.rows()?;
    Ok((path, rows))
}

pub fn list(a: PendingArgs) -> Result<i32, CliError> {
    let (_, rows) = read_rows(a.ledger.as_deref())?;
    let now = retie_ledger::now_ms();
    let mut out = Vec::new();
    for (sid, rows) in by_session(rows) {
        let st = SessionState::of(&rows);
        let Some(op) = st.open_pending else { continue };
        let time = rows
            .iter()
            .find(|r| r.seq == op.seq)
            .map(|r| r.time_ms)
            .unwrap_or(now);
        let ws = rows
            .iter()
            .find(|r| r.kind == Kind::SessionOpened.as_bytes())
            .map(retie_ledger::payload::of_row::<retie_ledger::payload::SessionOpened>)
            .transpose()
            .map_err(CliError::Usage)?
            .and_then(|o| o.delegation)
            .map(|d| d.workspace)
            .unwrap_or_default();
        out.push(json!({
            "session": sid,
            "pending": op.seq,
            "tool": op.payload.pointer("/action/tool"),
            "command": op.payload.get("command"),
            "arguments": op.payload.pointer("/action/args"),
            "digest": op.digest,
            "reason": op.payload.get("reason"),
            "age_s": (now - time).max(0) / 1000,
            "workspace": ws,
            "decided": op.decision.as_ref().map(|(seq, d)| json!({
                "entry": seq, "verdict": d.get("verdict"), "by": d.get("decided_by"),
            })),
        }));
    }
    if a.json {
        println!("{}", json!({ "pending": out }));
        return Ok(0);
    }
    if out.is_empty() {
        println!("no pending approvals");
    }
    for p in &out {
        let s = |k: &str| visible(p[k].as_str().unwrap_or(""));
        println!(
            "session {}  pending {}  {} ago  {}",
            s("session"),
            p["pending"],
            age(p["age_s"].as_i64().unwrap_or(0)),
            s("workspace")
        );
        println!("  tool: {}", s("tool"));
        if let Some(argv) = p["command"].as_array() {
            let argv: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
            println!("  command: {}", crate::ui::shell_line(&argv));
        }
        println!("  arguments: {}", visible(&p["arguments"].to_string()));
        println!("  digest: {}", s("digest"));
        println!("  why it asks: {}", s("reason"));
        match p["decided"].as_object() {
            Some(d) => println!(
                "  decided: {} by {} (entry {}): continue with `retie run --resume {}`",
                visible(d["verdict"].as_str().unwrap_or("?")),
                visible(d["by"].as_str().unwrap_or("?")),
                d["entry"],
                s("session")
            ),
            None => println!(
                "  decide: retie approve {0} | retie approve {0} --edit ... | retie deny {0} --reason TEXT",
                s("session")
            ),
        }
    }
    Ok(0)
}

fn age(s: i64) -> String {
    match s {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{} h", s / 3600),
    }
}

pub fn approve(a: ApproveArgs) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let (by, what) = match (&a.edit, a.always) {
        (Some(_), _) => (
            "person (retie approve --edit)",
            "edited (the edit is gated again when the session resumes)",
        ),
        (None, true) => (
            "person (retie approve --always)",
            "approved, and granted for this session from now on",
        ),
        (None, false) => ("person (retie approve)", "approved"),
    };
    let d = retie_dispatch::approval::decide_pending(
        &path,
        &a.session,
        a.digest.as_deref(),
        by,
        |op| match &a.edit {
            None if a.always => Ok(Answer::Always),
            None => Ok(Answer::Approve),
            Some(text) => edit_answer(op, text),
        },
    )
    .map_err(usage)?;
    say_decided(&a.session, &d, what);
    Ok(0)
}

pub fn deny(a: DenyArgs) -> Result<i32, CliError> {
    if a.reason.trim().is_empty() {
        return Err(CliError::Usage(
            "--reason is empty: say why (the model reads it)".into(),
        ));
    }
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let d = retie_dispatch::approval::decide_pending(
        &path,
        &a.session,
        a.digest.as_deref(),
        "person (retie deny)",
        |_| Ok(Answer::Deny(a.reason.clone())),
    )
    .map_err(usage)?;
    say_decided(&a.session, &d, "denied");
    Ok(0)
}

/// A refusal of the chokepoint (nothing written) is a usage error here.
fn usage(e: retie_dispatch::Error) -> CliError {
    match e {
        retie_dispatch::Error::Invalid(m) => CliError::Usage(m),
        e => e.into(),
    }
}

/// Parse `--edit TEXT` against the pending action: a JSON object of
/// arguments, or for bash the new command line, fitting the tool.
fn edit_answer(op: &OpenPending, text: &str) -> Result<Answer, String> {
    let action = op
        .payload
        .get("action")
        .and_then(|a| retie_policy::Action::from_json(&a.to_string()).ok())
        .ok_or_else(|| format!("pending approval {} holds no readable action", op.seq))?;
    let args = super::run::edited_arguments(&action, text)
        .map_err(|why| format!("the edit cannot be used: {why}; nothing written"))?;
    if let Some(d) = retie_agent::tools::declaration(action.tool()) {
        retie_agent::tools::check_args(d.params, &args).map_err(|why| {
            format!(
                "the edited arguments do not fit {}: {why}; nothing written",
                action.tool()
            )
        })?;
    }
    Ok(Answer::Edit(args))
}

fn say_decided(session: &str, d: &retie_dispatch::approval::Decided, what: &str) {
    let sid = visible(session);
    eprintln!(
        "retie: pending approval {} of session {sid} {what} (entry {}, digest {}); continue with `retie run --resume {sid}`",
        d.pending, d.entry, d.digest
    );
}

/// `retie revoke SESSION GRANT`: take back a grant of a session that is
/// not running (a running session revokes with its own `/approvals`).
pub fn revoke(a: RevokeArgs) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    retie_dispatch::approval::revoke(&path, &a.session, a.grant, "person (retie revoke)")
        .map_err(usage)?;
    eprintln!(
        "retie: grant {} of session {} revoked",
        a.grant,
        visible(&a.session)
    );
    Ok(0)
}
