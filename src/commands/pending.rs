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
use retie_dispatch::record::{OpenPending, SessionState};
use retie_ledger::{keys, Actor, Guard, Kind, Ledger, NewEntry, Row};
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
            .and_then(|r| {
                r.payload_json()
                    .pointer("/delegation/workspace")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .unwrap_or_default();
        out.push(json!({
            "session": sid,
            "pending": op.seq,
            "tool": op.payload.pointer("/action/tool"),
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

/// What a decision is.
enum Verdict {
    Approve,
    Always,
    Edit(String),
    Deny(String),
}

pub fn approve(a: ApproveArgs) -> Result<i32, CliError> {
    let v = match (a.edit, a.always) {
        (Some(e), _) => Verdict::Edit(e),
        (None, true) => Verdict::Always,
        (None, false) => Verdict::Approve,
    };
    decide(&a.session, a.ledger.as_deref(), a.digest.as_deref(), v)
}

pub fn deny(a: DenyArgs) -> Result<i32, CliError> {
    if a.reason.trim().is_empty() {
        return Err(CliError::Usage(
            "--reason is empty: say why (the model reads it)".into(),
        ));
    }
    decide(
        &a.session,
        a.ledger.as_deref(),
        a.digest.as_deref(),
        Verdict::Deny(a.reason),
    )
}

fn decide(
    session: &str,
    ledger: Option<&Path>,
    want_digest: Option<&str>,
    v: Verdict,
) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(ledger)?;
    if !path.exists() {
        return Err(CliError::Usage(format!("no ledger at {}", path.display())));
    }
    // A decision is written only into a ledger that verifies.
    let report = retie_ledger::verify::verify(&path)?;
    if !report.intact || report.complete == Some(false) {
        return Err(CliError::Usage(format!(
            "the ledger {} does not verify ({}): no decision written. `retie verify` shows what is wrong",
            path.display(),
            report
                .first_bad
                .map(|b| b.what)
                .or(report.incomplete_because)
                .unwrap_or_else(|| report.verdict.into())
        )));
    }
    let user = keys::user_key()?;
    let mut l = Ledger::open(&path, false, Some(&user))?;
    l.check_user_key(&user)?;
    let rows = l.session_rows(session)?;
    let sid = visible(session);
    if !rows
        .iter()
        .any(|r| r.kind == Kind::SessionOpened.as_bytes())
    {
        return Err(CliError::Usage(format!(
            "no session {sid} in the ledger {} (`retie pending` lists the pending approvals)",
            path.display()
        )));
    }
    let st = SessionState::of(&rows);
    let op: OpenPending = match st.open_pending {
        Some(op) => op,
        None => {
            let last = rows
                .iter()
                .rev()
                .find(|r| r.kind == Kind::Pending.as_bytes())
                .map(|r| r.seq);
            return Err(CliError::Usage(match (last, st.closed) {
                (None, _) => format!("session {sid} has no pending approval"),
                (Some(p), true) => format!(
                    "session {sid} moved on: its pending approval {p} was decided and carried out, and the session is finished"
                ),
                (Some(p), false) => format!(
                    "session {sid} moved on: its last pending approval {p} was decided and carried out; nothing waits for a decision"
                ),
            }));
        }
    };
    if let Some((seq, d)) = &op.decision {
        return Err(CliError::Usage(format!(
            "pending approval {} of session {sid} was already decided (entry {seq}: {} by {}); `retie run --resume {sid}` carries it out",
            op.seq,
            visible(d.get("verdict").and_then(Value::as_str).unwrap_or("?")),
            visible(d.get("decided_by").and_then(Value::as_str).unwrap_or("?"))
        )));
    }
    if let Some(want) = want_digest {
        if want != op.digest {
            return Err(CliError::Usage(format!(
                "the pending action's digest is {}, not {}: it is not what you read; nothing written",
                op.digest,
                visible(want)
            )));
        }
    }
    let by = "person (retie approve)";
    let mut payload = json!({
        "pending": op.seq,
        "proposal": op.proposal,
        "class": op.payload.get("class"),
        "reason": op.payload.get("reason"),
        "shown_digest": op.digest,
    });
    let mut grant = None;
    let what = match &v {
        Verdict::Always => {
            let keys = op.payload.get("grant_keys").cloned().unwrap_or(json!([]));
            if keys.as_array().map_or(true, |k| k.is_empty()) {
                return Err(CliError::Usage(
                    "this action cannot be granted \"always\" (a shell line that is not plain has no exact prefix); approve it once instead".into(),
                ));
            }
            payload["verdict"] = json!("approve");
            payload["decided_by"] = json!("person (retie approve --always)");
            payload["approved_digest"] = json!(op.digest);
            grant = Some(
                json!({"keys": keys, "by": "person (retie approve --always)", "pending": op.seq}),
            );
            "approved, and granted for this session from now on".to_string()
        }
        Verdict::Approve => {
            payload["verdict"] = json!("approve");
            payload["decided_by"] = json!(by);
            payload["approved_digest"] = json!(op.digest);
            "approved".to_string()
        }
        Verdict::Deny(reason) => {
            payload["verdict"] = json!("deny");
            payload["decided_by"] = json!("person (retie deny)");
            payload["approved_digest"] = Value::Null;
            payload["deny_reason"] = json!(reason);
            "denied".to_string()
        }
        Verdict::Edit(text) => {
            let action = op
                .payload
                .get("action")
                .and_then(|a| retie_policy::Action::from_json(&a.to_string()).ok())
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "pending approval {} holds no readable action",
                        op.seq
                    ))
                })?;
            let args = super::run::edited_arguments(&action, text).map_err(|why| {
                CliError::Usage(format!("the edit cannot be used: {why}; nothing written"))
            })?;
            if let Some(d) = retie_agent::tools::declaration(action.tool()) {
                retie_agent::tools::check_args(d.params, &args).map_err(|why| {
                    CliError::Usage(format!(
                        "the edited arguments do not fit {}: {why}; nothing written",
                        action.tool()
                    ))
                })?;
            }
            payload["verdict"] = json!("edit");
            payload["decided_by"] = json!("person (retie approve --edit)");
            payload["approved_digest"] = Value::Null;
            payload["edited_arguments"] = Value::Object(args);
            "edited (the edit is gated again when the session resumes)".to_string()
        }
    };
    let mut entries = vec![NewEntry {
        session: session.to_string(),
        actor: Actor::Person,
        kind: Kind::Decision,
        payload,
        key: user.clone(),
    }];
    if let Some(g) = grant {
        entries.push(NewEntry {
            session: session.to_string(),
            actor: Actor::Person,
            kind: Kind::Grant,
            payload: g,
            key: user.clone(),
        });
    }
    let guard = Guard::OpenPending {
        session: session.to_string(),
        pending: op.seq,
    };
    let appended = l
        .append_batch_guarded(Some(&guard), |first| {
            if let Some(g) = entries.get_mut(1) {
                g.payload["decision"] = json!(first);
            }
            entries
        })
        .map_err(|e| match e {
            retie_ledger::Error::Conflict { why, .. } => {
                CliError::Usage(format!("session {sid}: {why}; nothing written"))
            }
            e => e.into(),
        })?;
    l.checkpoint(&user)?;
    eprintln!(
        "retie: pending approval {} of session {sid} {what} (entry {}, digest {}); continue with `retie run --resume {sid}`",
        op.seq,
        appended.first().map(|a| a.seq).unwrap_or_default(),
        op.digest
    );
    Ok(0)
}

/// `retie revoke SESSION GRANT`: take back a grant of a session that is
/// not running (a running session revokes with its own `/approvals`).
pub fn revoke(a: RevokeArgs) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let sid = visible(&a.session);
    if retie_dispatch::record::SessionLock::held(&path, &a.session) {
        return Err(CliError::Usage(format!(
            "session {sid} is running: revoke the grant in it (/approvals), or stop it first"
        )));
    }
    let user = keys::user_key()?;
    let mut l = Ledger::open(&path, false, Some(&user))?;
    l.check_user_key(&user)?;
    let rows = l.session_rows(&a.session)?;
    let st = SessionState::of(&rows);
    if !st.grants.iter().any(|g| g.seq == a.grant) {
        return Err(CliError::Usage(format!(
            "session {sid} has no grant {} in force",
            a.grant
        )));
    }
    l.append_batch(|_| {
        vec![NewEntry {
            session: a.session.clone(),
            actor: Actor::Person,
            kind: Kind::Revoke,
            payload: json!({"grant": a.grant, "by": "person (retie revoke)"}),
            key: user.clone(),
        }]
    })?;
    l.checkpoint(&user)?;
    eprintln!("retie: grant {} of session {sid} revoked", a.grant);
    Ok(0)
}
