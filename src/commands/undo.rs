//! `retie undo ACTION` and `retie undo-all [--session S]`: reverse recorded
//! actions through the snapshot store, newest first, recording each undo.
//! Each action is reported undone, skipped (not reversible, and why) or
//! refused (changed since, with the paths). Exit 0 when every action asked
//! for was undone (or had been already), 1 when any was refused or failed,
//! 2 when some were skipped and none refused; 125 when it cannot run.

use std::path::{Path, PathBuf};

use clap::Args;
use retie_snapshot::{EntryState, Error as SnapError, UndoOptions};
use serde_json::{json, Value};

use super::changes::{root_owner, Snapshots};
use super::scope::Scope;
use crate::ledger::{self, keys, model, verify, Actor, Kind, Ledger};

#[derive(Args)]
pub struct UndoArgs {
    /// The action id (see `retie log`), or `last`: the last undoable
    /// action (applied, reversible, not undone) of this workspace.
    #[arg(value_name = "ACTION")]
    pub action: String,
    /// With `last`: of every workspace, not only the current directory's.
    #[arg(long)]
    pub all: bool,
    /// With `last`: of this workspace (the interactive session's), not
    /// the current directory's.
    #[arg(skip)]
    pub workspace: Option<PathBuf>,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// The outcome as one JSON object, on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct UndoAllArgs {
    /// The session (default: the last one with actions in the current
    /// directory's workspace).
    #[arg(long, value_name = "S")]
    pub session: Option<String>,
    /// Without --session: the last session of any workspace.
    #[arg(long, conflicts_with = "session")]
    pub all: bool,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// The outcome as one JSON object, on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The workspaces the ledger's sessions and actions name.
fn known(sessions: &[model::Session]) -> Vec<&str> {
    sessions
        .iter()
        .filter_map(|s| s.workspace_path())
        .chain(
            sessions
                .iter()
                .flat_map(|s| s.actions.iter())
                .filter_map(|a| a.workspace_path()),
        )
        .collect()
}

pub fn run_one(a: UndoArgs) -> i32 {
    run(a.ledger.as_deref(), a.json, |sessions| {
        if a.action == "last" {
            let scope = match &a.workspace {
                Some(w) => Scope::of(w),
                None => Scope::of_cwd(a.all, known(sessions)),
            };
            // The last action an undo can do something for, of this
            // workspace: never a timed-out, kept, discarded or refused
            // one (that would answer "skipped" forever).
            return sessions
                .iter()
                .flat_map(|s| {
                    s.actions
                        .iter()
                        .map(move |x| (x, x.workspace_path().or(s.workspace_path())))
                })
                .filter(|(x, ws)| x.undoable() && scope.holds(*ws))
                .map(|(x, _)| x)
                .max_by_key(|x| x.id)
                .cloned()
                .map(|x| vec![x])
                .ok_or_else(|| format!("no undoable action {}", scope.place()));
        }
        let id: i64 = a
            .action
            .parse()
            .map_err(|_| format!("{:?} is not an action id (see `retie log`)", a.action))?;
        sessions
            .iter()
            .flat_map(|s| s.actions.iter())
            .find(|x| x.id == id)
            .cloned()
            .map(|x| vec![x])
            .ok_or_else(|| format!("no action {} in the ledger (see `retie log`)", a.action))
    })
}

pub fn run_all(a: UndoAllArgs) -> i32 {
    run(a.ledger.as_deref(), a.json, |sessions| {
        let s = match &a.session {
            Some(id) => sessions
                .iter()
                .find(|s| &s.id == id)
                .ok_or_else(|| format!("no session {id} in the ledger"))?,
            None => {
                let scope = Scope::of_cwd(a.all, known(sessions));
                sessions
                    .iter()
                    .rev()
                    .find(|s| !s.actions.is_empty() && scope.holds(s.workspace_path()))
                    .ok_or_else(|| format!("no session with actions {}", scope.place()))?
            }
        };
        let mut v = s.actions.clone();
        v.reverse();
        Ok(v)
    })
}

fn run(
    ledger_arg: Option<&Path>,
    json_out: bool,
    pick: impl FnOnce(&[model::Session]) -> Result<Vec<model::Action>, String>,
) -> i32 {
    match run_inner(ledger_arg, json_out, pick) {
        Ok(code) => code,
        Err(e) => {
            crate::ui::say_error(&e);
            crate::error::EXIT_FAILED
        }
    }
}

fn run_inner(
    ledger_arg: Option<&Path>,
    json_out: bool,
    pick: impl FnOnce(&[model::Session]) -> Result<Vec<model::Action>, String>,
) -> Result<i32, String> {
    let path = ledger::resolve_path(ledger_arg).map_err(|e| e.to_string())?;
    let report = verify::verify(&path).map_err(|e| e.to_string())?;
    if !report.intact {
        return Err(format!(
            "the ledger does not verify, so it cannot be trusted for undo: {}",
            report
                .first_bad
                .map(|b| format!(
                    "entry {}: {}",
                    b.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                    b.what
                ))
                .unwrap_or_default()
        ));
    }
    let user = keys::user_key().map_err(|e| e.to_string())?;
    let mut l = Ledger::open(&path, false, Some(&user)).map_err(|e| e.to_string())?;
    let rows = l.rows().map_err(|e| e.to_string())?;
    let sessions = model::sessions(&rows);
    let actions = pick(&sessions)?;
    let state = crate::state::dir().map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    let (mut refused, mut skipped) = (0, 0);
    for a in &actions {
        let r = undo_action(a, &state);
        match r["result"].as_str() {
            Some("refused") | Some("failed") => refused += 1,
            Some("skipped") => skipped += 1,
            _ => {}
        }
        let mut p = r.clone();
        if let Some(o) = p.as_object_mut() {
            o.insert("action".into(), json!(a.id));
        }
        // Record it, whatever it was; a result that cannot be recorded is
        // an error (the undo itself has happened: say so).
        if let Err(e) = l.append(&a.session, Actor::Person, Kind::Undo, &p, &user) {
            eprintln!(
                "retie: action {}: {} but recording it failed: {e}",
                a.id,
                r["result"].as_str().unwrap_or("?")
            );
            refused += 1;
        }
        if !json_out {
            print_result(a, &r);
        }
        results.push(p);
    }
    l.checkpoint(&user).map_err(|e| e.to_string())?;
    if json_out {
        println!("{}", json!({ "results": results }));
    }
    Ok(if refused > 0 {
        1
    } else if skipped > 0 {
        2
    } else {
        0
    })
}

fn print_result(a: &model::Action, r: &Value) {
    let res = r["result"].as_str().unwrap_or("?");
    let mut line = format!("action {}: {res}", a.id);
    // The paths (and a refusal's reason, which may name them) are the
    // sandboxed command's file names: shown escaped.
    if let Some(why) = r.get("why").and_then(Value::as_str) {
        line.push_str(&format!(" ({})", crate::ui::visible(why)));
    }
    if let Some(paths) = r.get("paths").and_then(Value::as_array) {
        let ps: Vec<String> = paths
            .iter()
            .filter_map(Value::as_str)
            .map(crate::ui::visible)
            .collect();
        line.push_str(&format!(": changed since: {}", ps.join(", ")));
    }
    if let Some(kept) = r.get("kept_yours").and_then(Value::as_array) {
        let ps: Vec<String> = kept
            .iter()
            .filter_map(|k| k["path"].as_str())
            .map(crate::ui::visible)
            .collect();
        line.push_str(&format!(
            "; changed while the undo ran, your version kept (not undone): {}",
            ps.join(", ")
        ));
    }
    line.push_str(&format!("  [{}]", a.command()));
    println!("{line}");
}

/// Undo one action; the JSON says what happened, honestly.
fn undo_action(a: &model::Action, state: &Path) -> Value {
    let skipped = |why: String| json!({"result": "skipped", "why": why});
    if a.undone() {
        return skipped("already undone".into());
    }
    if !a.reversible() {
        let why = a
            .intent
            .pointer("/undo/why")
            .and_then(Value::as_str)
            .unwrap_or("no undo plan was recorded");
        return skipped(format!("not reversible: {why}"));
    }
    if let Some(o) = &a.outcome {
        if o.get("status").and_then(Value::as_str) != Some("applied") {
            return skipped(format!(
                "nothing to undo: its changes were not applied ({})",
                o.get("status").and_then(Value::as_str).unwrap_or("?")
            ));
        }
    }
    let Some(cs) = a.undo_changeset() else {
        return skipped("not reversible: the undo plan names no changeset".into());
    };
    let ws = a
        .intent
        .get("workspace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let snaps = match Snapshots::open(state, Path::new(ws)) {
        Ok(s) => s,
        Err(e) => {
            return json!({"result": "failed", "why": format!("opening the snapshot store for {ws}: {e}")})
        }
    };
    match snaps.journal.get(cs) {
        Err(SnapError::UnknownEntry { .. }) => {
            return skipped(
                "nothing to undo: the changeset was never applied (interrupted before it reached the workspace)"
                    .into(),
            )
        }
        Err(e) => return json!({"result": "failed", "why": e.to_string()}),
        Ok(e) if e.state == EntryState::RolledBack => {
            return skipped(
                "nothing to undo: crash recovery rolled the interrupted changeset back".into(),
            )
        }
        Ok(_) => {}
    }
    match retie_snapshot::undo(
        cs,
        &snaps.ws,
        &snaps.store,
        &snaps.journal,
        &UndoOptions::default(),
    ) {
        Ok(entry) => {
            if let Ok(Some((uid, gid))) = root_owner(Path::new(ws)) {
                if let Err(e) = snaps.ws.chown_written(&entry, uid, gid) {
                    return json!({"result": "undone", "undo_changeset": entry.id, "warning": format!("ownership not restored: {e}")});
                }
            }
            let mut v = json!({"result": "undone", "undo_changeset": entry.id});
            // Paths a person changed while the undo ran: their version
            // stayed in the workspace (issue 26 item 6).
            if !entry.raced.is_empty() {
                v["kept_yours"] = json!(entry
                    .raced
                    .iter()
                    .map(|r| json!({"path": r.path.as_str(), "saved_as": r.saved_as}))
                    .collect::<Vec<_>>());
                v["note"] = json!(
                    "changed while the undo ran: your version is kept in the workspace, not undone"
                );
            }
            v
        }
        Err(SnapError::UndoRefused { paths, .. }) => json!({
            "result": "refused",
            "why": "changed since the action",
            "paths": paths.iter().map(|m| m.path.to_string()).collect::<Vec<_>>(),
        }),
        Err(e) => json!({"result": "failed", "why": e.to_string()}),
    }
}
