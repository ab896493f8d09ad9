//! `retie changes list|show|apply|discard`: overlay runs whose changes
//! were kept instead of applied (a timeout, a conflict, a review with no
//! terminal, a failed run). Applying one later checks for conflicts
//! against the workspace as the command saw it when it started.

use std::path::Path;

use clap::Subcommand;
use retie_snapshot::{Changeset, ComputeOptions};
use serde_json::json;

use super::changes::{self, root_owner, ChangesMode, OverlayRun, RunMeta, Snapshots};
use crate::error::CliError;
use crate::ledger::record::{self, Recorder};
use crate::ui::{shell_line, visible};

#[derive(Subcommand)]
pub enum RunsCmd {
    /// List the kept runs: id, age, workspace, why kept, command.
    List {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show a kept run's changes: the list and a diff of the text files.
    Show {
        /// The run id (from `retie changes list`).
        run: String,
    },
    /// Apply a kept run's changes (recorded in the ledger, undoable), unless
    /// the workspace changed where the command wrote since it started.
    Apply {
        run: String,
        /// Also apply changes a sandbox may not make unasked.
        #[arg(long)]
        allow_blocked: bool,
    },
    /// Throw a kept run away.
    Discard { run: String },
}

pub fn run(cmd: RunsCmd) -> Result<i32, CliError> {
    let state = crate::state::dir()?;
    match cmd {
        RunsCmd::List { json } => list(&state, json),
        RunsCmd::Show { run } => {
            let (run, meta) = OverlayRun::open_kept(&state, &run)?;
            let cs = compute(&meta, &run)?;
            eprintln!(
                "run {}: {} in {} ({})",
                run.id,
                shell_line(&meta.command.iter().map(String::as_str).collect::<Vec<_>>()),
                visible(&meta.workspace.display().to_string()),
                visible(meta.kept.as_deref().unwrap_or("kept"))
            );
            changes::print_review(&cs, &meta.workspace, &run.upper, true);
            Ok(0)
        }
        RunsCmd::Apply { run, allow_blocked } => apply(&state, &run, allow_blocked),
        RunsCmd::Discard { run } => {
            let (mut run, _) = OverlayRun::open_kept(&state, &run)?;
            run.release();
            eprintln!("retie: run {} discarded", run.id);
            Ok(0)
        }
    }
}

fn compute(meta: &RunMeta, run: &OverlayRun) -> Result<Changeset, CliError> {
    Changeset::compute_with(&meta.workspace, &run.upper, &ComputeOptions::default())
        .map_err(CliError::Snapshot)
}

fn list(state: &Path, as_json: bool) -> Result<i32, CliError> {
    let mut rows: Vec<(String, RunMeta)> = std::fs::read_dir(state.join("runs"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let id = e.file_name().to_string_lossy().into_owned();
                    let meta: RunMeta = std::fs::read(e.path().join("run.json"))
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok())?;
                    meta.kept.is_some().then_some((id, meta))
                })
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by_key(|(_, m)| m.created_ms);
    if as_json {
        let v: Vec<_> = rows
            .iter()
            .map(|(id, m)| json!({"run": id, "workspace": m.workspace, "command": m.command, "why": m.kept, "created_ms": m.created_ms}))
            .collect();
        println!("{}", json!({ "runs": v }));
        return Ok(0);
    }
    if rows.is_empty() {
        println!("no kept runs");
        return Ok(0);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|(id, m)| {
            vec![
                id.clone(),
                visible(&m.workspace.display().to_string()),
                visible(m.kept.as_deref().unwrap_or("")),
                shell_line(&m.command.iter().map(String::as_str).collect::<Vec<_>>()),
            ]
        })
        .collect();
    print!(
        "{}",
        crate::ui::table(&["RUN", "WORKSPACE", "KEPT BECAUSE", "COMMAND"], &table)
    );
    Ok(0)
}

fn apply(state: &Path, id: &str, allow_blocked: bool) -> Result<i32, CliError> {
    let (mut run, meta) = OverlayRun::open_kept(state, id)?;
    let ws = std::fs::canonicalize(&meta.workspace).map_err(|e| {
        CliError::io(
            format!("the run's workspace {}", meta.workspace.display()),
            e,
        )
    })?;
    let snaps = Snapshots::open(state, &ws)?;
    let ledger = crate::ledger::resolve_path(None)?;
    let mut rec = Recorder::open(None, None, &ws, &meta.command, "overlay", "host")?;
    rec.note("applied_from_kept_run", json!(run.id));
    let guarded = super::sandbox::guard_retie_dirs(&ws, rec.mask(), &ledger)?;
    let owner = root_owner(&ws)?;
    // Applied, the run goes; on a conflict `handle` keeps it again.
    run.release();
    let h = changes::handle(
        ChangesMode::Apply,
        allow_blocked,
        &guarded,
        state,
        &snaps,
        &mut run,
        owner,
        meta.started(),
        &mut |cs| {
            Ok(rec
                .intent(record::plan_for(cs, allow_blocked))
                .map(|_| ())?)
        },
    );
    let h = rec.after_changes(h)?;
    rec.finish();
    match h.failure {
        Some(msg) => {
            eprintln!("retie: {msg}");
            Ok(retie_runtime::EXIT_SANDBOX_FAILED)
        }
        None => Ok(0),
    }
}
