//! `retie changes list|show|apply|discard`: overlay runs whose changes
//! were kept instead of applied (a timeout, a conflict, a review with no
//! terminal, a failed run). Applying one later checks for conflicts
//! against the workspace as the command saw it when it started.

use std::path::Path;

use clap::Subcommand;
use retie_ledger::payload::Status;
use retie_snapshot::{Changeset, ComputeOptions};
use serde_json::json;

use retie_dispatch::overlay;
use retie_dispatch::record::SessionSpec;
use retie_dispatch::sandbox::{Hooks, JobUi};
use retie_dispatch::{
    dispatch, CommandLine, Dispatched, Error as DispatchError, Executor, Proposal, Recorder, Step,
    UndoPlan,
};
use retie_policy::{Action, Context, Policy};

use super::changes::{self, root_owner, Handled, OverlayRun, RunMeta, Snapshots};
use crate::error::CliError;
use crate::ui::{shell_line, visible};

#[derive(Subcommand)]
pub enum RunsCmd {
    /// List the kept runs: id, age, workspace, why kept, command.
    List {
        /// One JSON object.
        #[arg(long)]
        json: bool,
        /// Every workspace's kept runs, not only the current directory's.
        #[arg(long)]
        all: bool,
    },
    /// Show a kept run's changes: the list and a diff of the text files.
    Show {
        /// The run id (from `retie changes list`).
        run: String,
        /// Every path and diff even of a large set (by default a set of
        /// more than 200 changes is summarised per top directory).
        #[arg(long)]
        all: bool,
    },
    /// Apply a kept run's changes (recorded in the ledger, undoable), unless
    /// the workspace changed where the command wrote since it started.
    Apply {
        /// The run id (from `retie changes list`).
        run: String,
        /// Also apply changes a sandbox may not make unasked.
        #[arg(long)]
        allow_blocked: bool,
        /// Where the workspace changed too, keep the workspace's version
        /// and apply the rest.
        #[arg(long, conflicts_with = "ours")]
        theirs: bool,
        /// Where the workspace changed too, take the command's version;
        /// the workspace's is kept as the pre-image (`retie undo` brings
        /// it back).
        #[arg(long)]
        ours: bool,
    },
    /// Throw a kept run away.
    Discard {
        /// The run id (from `retie changes list`).
        run: String,
    },
}

pub fn run(cmd: RunsCmd) -> Result<i32, CliError> {
    let state = crate::state::dir()?;
    match cmd {
        RunsCmd::List { json, all } => list(&state, json, all),
        RunsCmd::Show { run, all } => {
            let (run, meta) = OverlayRun::open_kept(&state, &run)?;
            let cs = compute(&meta, &run)?;
            eprintln!(
                "run {}: {} in {} ({})",
                run.id,
                shell_line(&meta.command.iter().map(String::as_str).collect::<Vec<_>>()),
                visible(&meta.workspace.display().to_string()),
                visible(meta.kept.as_deref().unwrap_or("kept"))
            );
            changes::print_review(&cs, &meta.workspace, &run.upper, true, all);
            Ok(0)
        }
        RunsCmd::Apply {
            run,
            allow_blocked,
            theirs,
            ours,
        } => {
            let on_conflict = match (theirs, ours) {
                (true, _) => overlay::OnConflict::Theirs,
                (_, true) => overlay::OnConflict::Ours,
                _ => overlay::OnConflict::Refuse,
            };
            apply(&state, &run, allow_blocked, on_conflict)
        }
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

fn list(state: &Path, as_json: bool, all: bool) -> Result<i32, CliError> {
    let mut rows: Vec<(String, RunMeta)> = std::fs::read_dir(state.join("runs"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let id = e.file_name().to_string_lossy().into_owned();
                    let mut meta: RunMeta = std::fs::read(e.path().join("run.json"))
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok())?;
                    if meta.kept.is_none() {
                        // Not kept and nobody's: its retie was stopped
                        // (kill -9, a crash) before the run ended. Listed
                        // when the command left anything, so that it can
                        // be shown, applied or discarded like a kept run.
                        let dir = e.path();
                        let wrote = std::fs::read_dir(dir.join("upper"))
                            .is_ok_and(|mut d| d.next().is_some());
                        if !wrote || retie_dispatch::overlay::RunLock::take(&dir).is_none() {
                            return None;
                        }
                        meta.kept = Some("interrupted: retie stopped before the run ended".into());
                    }
                    Some((id, meta))
                })
                .collect()
        })
        .unwrap_or_default();
    let known: Vec<String> = rows
        .iter()
        .map(|(_, m)| m.workspace.display().to_string())
        .collect();
    let scope = super::scope::Scope::of_cwd(all, known.iter().map(String::as_str));
    rows.retain(|(_, m)| scope.holds(m.workspace.to_str()));
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
        println!("no kept runs {}", scope.place());
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

/// Applying a kept run is an action like any other: it goes through the
/// chokepoint (classified, gated, recorded with its undo plan) and its
/// executor applies the run's changes with the conflict check against the
/// workspace as the command saw it when it started.
struct KeptApply<'a> {
    run: Option<OverlayRun>,
    meta: RunMeta,
    state: &'a Path,
    snaps: Snapshots,
    protect: Vec<std::path::PathBuf>,
    owner: Option<(u32, u32)>,
    allow_blocked: bool,
    on_conflict: overlay::OnConflict,
}

impl Executor for KeptApply<'_> {
    type Output = Handled;

    fn plan(&self, _action: &Action) -> UndoPlan {
        UndoPlan {
            reversible: true,
            detail: json!({"reversible": true, "via": "snapshot", "changeset": null}),
        }
    }

    fn execute(&mut self, _action: &Action, step: &mut Step<'_>) -> Result<Handled, DispatchError> {
        let mut run = self
            .run
            .take()
            .ok_or_else(|| DispatchError::Invalid("applied once".into()))?;
        // Applied, the run goes; on a conflict `handle` keeps it again.
        run.release();
        let mut hooks = Hooks {
            ui: &mut Unasked,
            step,
            allow_blocked: self.allow_blocked,
        };
        let h = overlay::handle(
            overlay::ChangesMode::Apply,
            self.allow_blocked,
            &self.protect,
            self.state,
            &self.snaps,
            &mut run,
            self.owner,
            self.meta.started(),
            self.on_conflict,
            &mut hooks,
        )?;
        let applied = h.json["applied"] == json!(true);
        step.set_outcome(json!({
            "status": if applied {
                Status::Applied
            } else if h.failure.is_some() {
                Status::RefusedByGuard
            } else {
                Status::NotApplied
            }
            .word(),
            "changes": retie_dispatch::overlay::changes_count(&h.json),
            "conflicts": h.json.get("conflicts"),
            "failure": h.failure,
        }));
        Ok(h)
    }
}

/// `retie changes apply`: lines on the terminal, nobody to review (the
/// person asked for the apply), the recording as for a sandboxed
/// command's changes (`retie_dispatch::sandbox::Hooks`).
struct Unasked;

impl JobUi for Unasked {
    fn say(&mut self, line: &str) {
        crate::ui::say_error(&line);
    }
    fn review(&mut self, _: &overlay::Review<'_>) -> Option<bool> {
        None
    }
}

fn apply(
    state: &Path,
    id: &str,
    allow_blocked: bool,
    on_conflict: overlay::OnConflict,
) -> Result<i32, CliError> {
    let (run, meta) = OverlayRun::open_kept(state, id)?;
    let ws = std::fs::canonicalize(&meta.workspace).map_err(|e| {
        CliError::io(
            format!("the run's workspace {}", meta.workspace.display()),
            e,
        )
    })?;
    let snaps = Snapshots::open(state, &ws)?;
    changes::report_recovery(&snaps);
    let ledger = crate::ledger::resolve_path(None)?;
    // A kept run's workspace passed the guards when it ran (a system
    // directory only with the person's flag): retie's own directories are
    // guarded again, as they are now.
    let protect = super::guard_workspace(
        &ws,
        &ledger,
        retie_dispatch::guard::GuardOptions {
            system_flag: Some(("--allow-system-workspace", true)),
            retie_scratch: None,
        },
    )?
    .protect;
    let owner = root_owner(&ws)?;
    let line = shell_line(&meta.command.iter().map(String::as_str).collect::<Vec<_>>());
    let effects = ["writes_workspace"];
    let action = Action::from_json(
        &json!({"tool": "write", "args": {"kept_run": run.id, "command": line}, "effects": effects})
            .to_string(),
    )
    .map_err(|e| CliError::Usage(format!("the apply cannot be put to the policy: {e}")))?;
    let policy =
        Policy::shipped().map_err(|e| CliError::Usage(format!("the shipped policy: {e}")))?;
    let mut rec = Recorder::open(
        &ledger,
        SessionSpec {
            join: None,
            workspace: ws.clone(),
            opened: retie_ledger::payload::SessionOpened {
                objective: Some(format!("apply kept run {}", run.id)),
                origin: Some("retie changes apply".into()),
                policy_digest: Some(policy.digest().to_hex().to_string()),
                ..Default::default()
            },
            effects: effects.iter().map(|e| e.to_string()).collect(),
            intent_base: json!({
                "tool": "changes.apply",
                "command": meta.command,
                "workspace": ws.display().to_string(),
                "mode": "overlay",
                "kept_run": run.id,
                "effects": effects,
            }),
        },
    )?;
    let mut exec = KeptApply {
        run: Some(run),
        meta,
        state,
        snaps,
        protect,
        owner,
        allow_blocked,
        on_conflict,
    };
    let d = dispatch(
        &mut rec,
        &policy,
        &Context::new(policy.default_tier()),
        Proposal {
            action,
            origin: "command line".into(),
            edit_of: None,
        },
        &mut CommandLine,
        &mut exec,
    );
    if let Err(e) = rec.finish() {
        eprintln!("retie: warning: the ledger session could not be closed: {e}");
    }
    match d? {
        Dispatched::Ran { output, .. } => match output.failure {
            Some(msg) => {
                crate::ui::say_error(&msg);
                Ok(retie_runtime::EXIT_SANDBOX_FAILED)
            }
            None => Ok(0),
        },
        Dispatched::Refused { reason, by } => Err(CliError::Refused { reason, by }),
        // The command line approves or the policy denies: it never
        // suspends or edits.
        Dispatched::Suspended { .. } | Dispatched::Edited { .. } => Err(CliError::Usage(
            "the command line's approval neither suspends nor edits".into(),
        )),
    }
}
