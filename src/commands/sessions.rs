//! `retie sessions`: every session with its state (running, suspended,
//! finished, crashed), workspace, model, turns and tokens.
//!
//! Running means a process holds the session's lock
//! (`LEDGER.sessions/SESSION.lock`, an exclusive flock the kernel drops
//! when the process dies); a session neither running, suspended nor
//! closed is crashed, and `retie run --resume` takes it up again.

use std::path::PathBuf;

use clap::Args;
use retie_dispatch::record::{SessionLock, SessionState};
use retie_ledger::provider::SessionEnd;
use retie_ledger::{payload, Kind, Ledger};
use serde_json::{json, Value};

use crate::error::CliError;
use crate::ui::visible;

#[derive(Args)]
pub struct SessionsArgs {
    /// Every workspace's sessions, not only the current directory's.
    #[arg(long)]
    pub all: bool,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// The sessions as JSON, on stdout (each with its kind, and
    /// `unstarted` for one whose provider failed before its first turn;
    /// these are listed there whatever --unstarted says).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub list: super::scope::ListArgs,
}

pub fn run(a: SessionsArgs) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let ledger = Ledger::open(&path, false, None)?;
    let rows = ledger.rows()?;
    // Kind and "failed before its first turn", from the read model (one
    // definition for `sessions` and `log`).
    let read: std::collections::HashMap<String, (&'static str, bool)> =
        retie_ledger::model::sessions(&rows)
            .into_iter()
            .map(|s| {
                let v = (s.kind(), s.failed_before_first_turn());
                (s.id, v)
            })
            .collect();
    let mut out = Vec::new();
    let grouped = super::pending::by_session(rows);
    let opened_of = |rows: &[retie_ledger::Row]| {
        rows.iter()
            .find(|r| r.kind == Kind::SessionOpened.as_bytes())
            .map(|r| {
                payload::of_row::<payload::SessionOpened>(r)
                    .map(|o| (r.time_ms, o))
                    .map_err(CliError::Usage)
            })
            .transpose()
    };
    let ws_of = |o: &payload::SessionOpened| o.delegation.as_ref().map(|d| d.workspace.clone());
    let mut known: Vec<String> = Vec::new();
    for (_, r) in &grouped {
        if let Some(w) = opened_of(r)?.and_then(|o| ws_of(&o.1)) {
            known.push(w);
        }
    }
    let scope = super::scope::Scope::of_cwd(a.all, known.iter().map(String::as_str));
    for (sid, rows) in grouped {
        let Some(opened) = opened_of(&rows)? else {
            continue;
        };
        if !scope.holds(ws_of(&opened.1).as_deref()) {
            continue;
        }
        let st = SessionState::of(&rows);
        // How it ended, as its last close or suspension says (older
        // closes say nothing: finished).
        let end = rows
            .iter()
            .rev()
            .find(|r| {
                r.kind == Kind::SessionClosed.as_bytes()
                    || r.kind == Kind::Suspended.as_bytes()
                    || r.kind == Kind::Resumed.as_bytes()
            })
            .and_then(|r| {
                let p = r.payload_json();
                if r.kind == Kind::SessionClosed.as_bytes() {
                    payload::parse::<payload::SessionClosed>(&p).ok()?.end
                } else if r.kind == Kind::Suspended.as_bytes() {
                    payload::parse::<payload::Suspended>(&p).ok()?.end
                } else {
                    None
                }
            });
        let state = if SessionLock::held_in(&ledger, &path, &sid) {
            "running"
        } else if st.closed {
            end.as_ref().map_or("finished", SessionEnd::words)
        } else if st.suspended {
            "suspended"
        } else {
            "crashed"
        };
        let (mut turns, mut tin, mut tout) = (0u64, 0u64, 0u64);
        for r in rows.iter().filter(|r| r.kind == Kind::Message.as_bytes()) {
            let m = payload::of_row::<payload::Message>(r).map_err(CliError::Usage)?;
            if m.role() == Some("assistant") {
                turns += 1;
                let u = m.usage.unwrap_or_default();
                tin += u.input_tokens;
                tout += u.output_tokens;
            }
        }
        let o = &opened.1;
        let (kind, unstarted) = read.get(&sid).copied().unwrap_or(("other", false));
        out.push(json!({
            "session": sid,
            "kind": kind,
            "unstarted": unstarted && state != "running",
            "state": state,
            "opened_ms": opened.0,
            "origin": o.origin,
            "workspace": ws_of(o),
            "provider": o.provider,
            "model": o.model,
            "turns": turns,
            "tokens_in": tin,
            "tokens_out": tout,
            "pending": st.open_pending.as_ref().map(|p| p.seq),
            "outcome": end.as_ref().map(|e| e.outcome.clone()),
            "why": end.as_ref().map(|e| e.message.clone()),
            "grants": st.grants.iter().map(|g| json!({"grant": g.seq, "keys": g.keys, "by": g.by})).collect::<Vec<_>>(),
        }));
    }
    if a.json {
        let mut list = a.list.clone();
        list.unstarted = true;
        let sel = list.select(out, kind_of, |_| false);
        println!("{}", json!({ "sessions": sel.items }));
        return Ok(0);
    }
    let sel = a
        .list
        .select(out, kind_of, |v| v["unstarted"].as_bool() == Some(true));
    if sel.items.is_empty() && sel.unstarted.is_empty() && sel.older == 0 {
        println!("no sessions {}", scope.place());
        return Ok(0);
    }
    println!("{}", a.list.header("session", &scope, sel.items.len()));
    if !sel.items.is_empty() {
        println!(
            "{:<16}  {:<15}  {:<19}  {:<6}  MODEL, TURNS, TOKENS, WORKSPACE",
            "SESSION", "STATE", "OPENED", "KIND"
        );
    }
    for s in &sel.items {
        let f = |k: &str| visible(s[k].as_str().unwrap_or("-"));
        println!(
            "{}  {:<15}  {}  {:<6}  model {}  {} turns  {} tokens in / {} out{}  {}{}",
            f("session"),
            f("state"),
            super::replay::time(s["opened_ms"].as_i64().unwrap_or(0)),
            f("kind"),
            f("model"),
            s["turns"],
            s["tokens_in"],
            s["tokens_out"],
            s["pending"]
                .as_i64()
                .map(|p| format!("  pending {p}"))
                .unwrap_or_default(),
            f("workspace"),
            match (s["state"].as_str(), s["why"].as_str()) {
                (Some("finished") | Some("running"), _) | (_, None) => String::new(),
                (_, Some(why)) => format!("\n    {}", visible(why)),
            }
        );
    }
    if sel.older > 0 {
        println!("({} older sessions not listed: --limit)", sel.older);
    }
    if let Some(last) = sel.unstarted.last() {
        println!(
            "({} agent session{} whose provider failed before the first turn not listed (--unstarted lists them); the last, {}, {}: {})",
            sel.unstarted.len(),
            if sel.unstarted.len() == 1 { "" } else { "s" },
            visible(last["session"].as_str().unwrap_or("-")),
            visible(last["state"].as_str().unwrap_or("-")),
            visible(last["why"].as_str().unwrap_or("-")),
        );
    }
    Ok(0)
}

/// A listed session's kind.
fn kind_of(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("other")
}
