//! `retie undo ACTION` and `retie undo-all [--session S]`: reverse recorded
//! actions through the snapshot store, newest first, recording each undo.
//! Each action is reported undone, skipped (not reversible, and why) or
//! refused (changed since, with the paths). Exit 0 when every action asked
//! for was undone (or had been already), 1 when any was refused or failed,
//! 2 when some were skipped and none refused; 125 when it cannot run.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Value};

use super::scope::Scope;
use crate::ledger::{self, model, verify, Ledger};

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
    let command = vec!["retie".into(), "undo".into(), a.action.clone()];
    run(a.ledger.as_deref(), a.json, command, |sessions| {
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
    let mut command: Vec<String> = vec!["retie".into(), "undo-all".into()];
    if let Some(s) = &a.session {
        command.extend(["--session".into(), s.clone()]);
    }
    run(a.ledger.as_deref(), a.json, command, |sessions| {
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
                    // An undo session's actions are undos: never the
                    // session undo-all means.
                    .find(|s| {
                        !s.actions.is_empty() && !s.is_undo() && scope.holds(s.workspace_path())
                    })
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
    command: Vec<String>,
    pick: impl FnOnce(&[model::Session]) -> Result<Vec<model::Action>, String>,
) -> i32 {
    match run_inner(ledger_arg, json_out, command, pick) {
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
    command: Vec<String>,
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
    let rows = Ledger::open(&path, false, None)
        .and_then(|l| l.rows())
        .map_err(|e| e.to_string())?;
    let sessions = model::sessions(&rows);
    let actions = pick(&sessions)?;
    let state = crate::state::dir().map_err(|e| e.to_string())?;
    // Each undo is an action: through the chokepoint, its intent durable
    // before the workspace changes, its outcome after.
    let (results, failed) =
        match retie_dispatch::undo::undo_actions(&path, &state, &actions, command) {
            Ok(r) => (r, None),
            Err((r, e)) => (r, Some(e)),
        };
    let (mut refused, mut skipped) = (0, 0);
    let mut out = Vec::new();
    for (a, r) in actions.iter().zip(&results) {
        match r.status() {
            "refused_by_guard" | "refused_by_policy" | "failed" => refused += 1,
            "skipped" => skipped += 1,
            _ => {}
        }
        if !json_out {
            print_result(a, &r.outcome);
        }
        let mut p = r.outcome.clone();
        if let Some(o) = p.as_object_mut() {
            o.insert("action".into(), json!(a.id));
            o.insert("undo_action".into(), json!(r.id));
            // The word older scripts read.
            o.insert("result".into(), json!(r.status()));
        }
        out.push(p);
    }
    if json_out {
        println!("{}", json!({ "results": out }));
    }
    if let Some(e) = failed {
        return Err(format!(
            "the undo could not be recorded, so it stopped ({} of {} done): {e}",
            results.len(),
            actions.len()
        ));
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
    let res = r["status"].as_str().unwrap_or("?");
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
