//! An undo is an action (issue 27 item 2): `retie undo`, `retie undo-all`
//! and the session's `/undo` put each recorded action back through
//! [`crate::dispatch`], like any other action. The undo's intent (which
//! action it undoes, the changeset it rolls back, and for each path the
//! pre-image it restores with its digest) is durable in the ledger before
//! a byte of the workspace changes; the outcome follows. A process killed
//! in between leaves an intent without an outcome (`retie log` shows it
//! interrupted), and the snapshot journal rolls back whatever half of the
//! undo reached the workspace when the workspace is next opened
//! ([`Snapshots::open`]): the action stays not undone, and a second
//! `retie undo` does it (ADR 0450).
//!
//! The undos of one invocation are one ledger session (origin
//! `retie undo`); each names the action it undoes (`undoes`), and the
//! ledger's read model links the two ([`retie_ledger::model`]).

use std::path::{Path, PathBuf};

use retie_ledger::model;
use retie_ledger::payload::Status;
use retie_policy::{Action, Context, Policy};
use retie_snapshot::{EntryState, Error as SnapError, Manifest, UndoOptions};
use serde_json::{json, Value};

use crate::overlay::{root_owner, Snapshots, LISTED_PATHS_MAX};
use crate::record::{Recorder, SessionSpec};
use crate::sandbox::manifest_json;
use crate::{dispatch, CommandLine, Dispatched, Error, Executor, Proposal, Step, UndoPlan};

/// The origin recorded in an undo session's opening.
pub const ORIGIN: &str = "retie undo";

/// What became of one undo: the outcome recorded for it, with
/// `status` one of `undone`, `skipped`, `refused`, `failed`.
#[derive(Debug, Clone)]
pub struct UndoResult {
    /// The action undone.
    pub target: i64,
    /// The undo's own action id (its intent), when it was recorded.
    pub id: Option<i64>,
    /// The recorded outcome (`status`, `why`, `paths`, ...).
    pub outcome: Value,
}

impl UndoResult {
    pub fn status(&self) -> &str {
        self.outcome
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or(Status::Failed.word())
    }
}

/// Undo `actions` in the order given, each through the chokepoint, in one
/// new session of `ledger_path`. `state` is retie's state directory (the
/// snapshot store). Returns one result per action; an error only when the
/// ledger cannot record (what was undone before that is in the results).
pub fn undo_actions(
    ledger_path: &Path,
    state: &Path,
    actions: &[model::Action],
    command: Vec<String>,
) -> Result<Vec<UndoResult>, (Vec<UndoResult>, Error)> {
    let policy = match Policy::shipped() {
        Ok(p) => p,
        Err(e) => return Err((Vec::new(), e.into())),
    };
    let workspace = actions
        .iter()
        .find_map(|a| a.workspace_path())
        .unwrap_or("")
        .to_string();
    let spec = SessionSpec {
        join: None,
        workspace: PathBuf::from(&workspace),
        opened: retie_ledger::payload::SessionOpened {
            objective: Some(command.join(" ")),
            origin: Some(ORIGIN.into()),
            policy_digest: Some(policy.digest().to_hex().to_string()),
            ..Default::default()
        },
        effects: vec!["writes_workspace".into()],
        intent_base: json!({
            "tool": "undo",
            "command": command,
            "workspace": workspace,
        }),
    };
    let mut rec = match Recorder::open(ledger_path, spec) {
        Ok(r) => r,
        Err(e) => return Err((Vec::new(), e)),
    };
    let ctx = Context::new(policy.default_tier());
    let mut out = Vec::new();
    for a in actions {
        match undo_one(&mut rec, &policy, &ctx, state, a) {
            Ok(r) => out.push(r),
            Err(e) => {
                let _ = rec.finish();
                return Err((out, e));
            }
        }
    }
    if let Err(e) = rec.finish() {
        return Err((out, e));
    }
    Ok(out)
}

fn undo_one(
    rec: &mut Recorder,
    policy: &Policy,
    ctx: &Context,
    state: &Path,
    a: &model::Action,
) -> Result<UndoResult, Error> {
    let ws = a.workspace_path().unwrap_or("").to_string();
    rec.note("undoes", json!(a.id));
    rec.note("workspace", json!(ws));
    let action = Action::from_json(
        &json!({"tool": "undo", "args": {"action": a.id}, "effects": ["writes_workspace"]})
            .to_string(),
    )?;
    let mut job = UndoJob::prepare(a, state);
    let d = dispatch(
        rec,
        policy,
        ctx,
        Proposal {
            action,
            origin: "command line".into(),
            edit_of: None,
        },
        &mut CommandLine,
        &mut job,
    )?;
    Ok(match d {
        Dispatched::Ran { action, output } => UndoResult {
            target: a.id,
            id: Some(action),
            outcome: output,
        },
        Dispatched::Refused { reason, by } => UndoResult {
            target: a.id,
            id: None,
            outcome: json!({
                "status": Status::RefusedByPolicy.word(),
                "why": format!("refused by {by}: {reason}"),
            }),
        },
        Dispatched::Suspended { .. } | Dispatched::Edited { .. } => {
            return Err(Error::Invalid(
                "the command line's approval neither suspends nor edits".into(),
            ))
        }
    })
}

/// What an undo will do, worked out before anything is recorded.
enum Prepared {
    /// Nothing to do, and why (recorded as the outcome `skipped`).
    Skip(String),
    /// The store could not be opened: recorded as `failed`.
    Fail(String),
    /// Roll back `changeset` of the workspace.
    Undo {
        changeset: String,
        snaps: Box<Snapshots>,
        /// For each path: what it holds now (expected) and the pre-image
        /// the undo restores, with its digest.
        restores: Vec<Value>,
        /// In place of `restores` past `LISTED_PATHS_MAX` paths (ADR 0209).
        manifest: Option<Manifest>,
    },
}

/// One recorded action's undo, as an [`Executor`].
pub struct UndoJob {
    target: i64,
    workspace: String,
    prepared: Option<Prepared>,
}

impl UndoJob {
    /// Read what the undo of `a` would do (the snapshot store is opened
    /// here, which rolls back anything a crash left half-applied first).
    fn prepare(a: &model::Action, state: &Path) -> UndoJob {
        let ws = a.workspace_path().unwrap_or("").to_string();
        let job = |p| UndoJob {
            target: a.id,
            workspace: ws.clone(),
            prepared: Some(p),
        };
        if a.typed_intent().and_then(|i| i.call.tool).as_deref() == Some("undo") {
            return job(Prepared::Skip(
                "it is an undo; an undo is not undone (run the action again instead)".into(),
            ));
        }
        if a.undone() {
            return job(Prepared::Skip("already undone".into()));
        }
        if !a.reversible() {
            let why = a
                .intent
                .pointer("/undo/why")
                .and_then(Value::as_str)
                .unwrap_or("no undo plan was recorded");
            return job(Prepared::Skip(format!("not reversible: {why}")));
        }
        if let Some(o) = &a.outcome {
            if o.get("status").and_then(Value::as_str) != Some("applied") {
                return job(Prepared::Skip(format!(
                    "nothing to undo: its changes were not applied ({})",
                    o.get("status").and_then(Value::as_str).unwrap_or("?")
                )));
            }
        }
        let Some(cs) = a.undo_changeset() else {
            return job(Prepared::Skip(
                "not reversible: the undo plan names no changeset".into(),
            ));
        };
        let snaps = match Snapshots::open(state, Path::new(&ws)) {
            Ok(s) => s,
            Err(e) => {
                return job(Prepared::Fail(format!(
                    "opening the snapshot store for {ws}: {e}"
                )))
            }
        };
        let entry = match snaps.journal.get(cs) {
            Err(SnapError::UnknownEntry { .. }) => {
                return job(Prepared::Skip(
                    "nothing to undo: the changeset was never applied (interrupted before it reached the workspace)"
                        .into(),
                ))
            }
            Err(e) => return job(Prepared::Fail(e.to_string())),
            Ok(e) if e.state == EntryState::RolledBack => {
                return job(Prepared::Skip(
                    "nothing to undo: crash recovery rolled the interrupted changeset back".into(),
                ))
            }
            Ok(e) => e,
        };
        // An undo that completed but was killed before its outcome was
        // recorded: the journal holds it; the action is undone.
        // Looked up by the journal's marker (ADR 0212): reading every
        // entry made each undo slower with every big change before it.
        if let Some(u) = snaps.journal.undone_by(cs) {
            return job(Prepared::Skip(format!(
                "already undone (journal entry {}: an earlier undo completed but was interrupted before its outcome was recorded)",
                u.id
            )));
        }
        // Listed path by path when few; past that, named by its manifest
        // (ADR 0209), stored with the undo's pre-images.
        let (restores, manifest) = if entry.steps.len() > LISTED_PATHS_MAX {
            (Vec::new(), Some(Manifest::of_undo(&entry)))
        } else {
            let restores = entry
                .steps
                .iter()
                .map(|s| json!({"path": s.path.as_str(), "expect": s.after, "restore": s.before}))
                .collect();
            (restores, None)
        };
        job(Prepared::Undo {
            changeset: cs.to_string(),
            snaps: Box::new(snaps),
            restores,
            manifest,
        })
    }
}

impl Executor for UndoJob {
    type Output = Value;

    fn plan(&self, _: &Action) -> UndoPlan {
        let (changeset, restores, nothing, manifest) = match &self.prepared {
            Some(Prepared::Undo {
                changeset,
                restores,
                manifest,
                ..
            }) => (
                Some(changeset.as_str()),
                restores.clone(),
                None,
                manifest.as_ref(),
            ),
            Some(Prepared::Skip(why)) | Some(Prepared::Fail(why)) => {
                (None, Vec::new(), Some(why.as_str()), None)
            }
            None => (None, Vec::new(), Some("already run"), None),
        };
        let mut detail = json!({
            "reversible": true,
            "via": "snapshot",
            "changeset": null,
            "undoes": self.target,
            "rolls_back": changeset,
            "restores": restores,
            "nothing_because": nothing,
            "how": "the rolled-back changeset's pre-images are put back through the crash-safe journal; a crash midway is rolled back when the workspace is next opened",
        });
        if let (Some(m), Some(o)) = (manifest, detail.as_object_mut()) {
            o.insert("manifest".into(), manifest_json(m));
        }
        UndoPlan {
            reversible: true,
            detail,
        }
    }

    fn execute(&mut self, _: &Action, step: &mut Step<'_>) -> Result<Value, Error> {
        let mut outcome = match self.prepared.take() {
            None => return Err(Error::Invalid("an undo runs once".into())),
            Some(Prepared::Skip(why)) => json!({"status": Status::Skipped.word(), "why": why}),
            Some(Prepared::Fail(why)) => json!({"status": Status::Failed.word(), "why": why}),
            Some(Prepared::Undo {
                changeset,
                snaps,
                manifest,
                ..
            }) => run_undo(&changeset, &snaps, &self.workspace, manifest),
        };
        if let Some(o) = outcome.as_object_mut() {
            o.insert("undoes".into(), json!(self.target));
        }
        step.set_outcome(outcome.clone());
        Ok(outcome)
    }
}

/// Roll back `changeset`; the JSON says what happened, honestly.
fn run_undo(changeset: &str, snaps: &Snapshots, ws: &str, manifest: Option<Manifest>) -> Value {
    match retie_snapshot::undo(
        changeset,
        &snaps.ws,
        &snaps.store,
        &snaps.journal,
        &UndoOptions {
            manifest,
            ..UndoOptions::default()
        },
    ) {
        Ok(entry) => {
            let mut v = json!({"status": Status::Undone.word(), "undo_changeset": entry.id});
            if let Ok(Some((uid, gid))) = root_owner(Path::new(ws)) {
                if let Err(e) = snaps.ws.chown_written(&entry, uid, gid) {
                    v["warning"] = json!(format!("ownership not restored: {e}"));
                }
            }
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
            "status": Status::RefusedByGuard.word(),
            "why": "changed since the action",
            "paths": paths.iter().map(|m| m.path.to_string()).collect::<Vec<_>>(),
        }),
        Err(e) => json!({"status": Status::Failed.word(), "why": e.to_string()}),
    }
}
