//! A file written for someone (the agent's write and edit tools) as an
//! [`Executor`], through the very path a sandboxed command's changes take:
//! the new content is staged in an overlay run's upper layer, exactly as
//! the command's writes would be, and [`overlay::handle`] applies it. So a
//! write gets the apply lock and its stamp, the conflict check, the plant
//! table, the masks of retie's own directories, the crash-safe journal
//! with its pre-images, the ownership rule of a root caller and the
//! durable record of the exact changes right before they are made, from
//! the same code and in the same order (issue 27: a second write path
//! beside this one had none of the ownership step).
//!
//! Directories missing on the way to the file are created with it (as a
//! command's `mkdir -p` would be), recorded in the same changeset and
//! removed by its undo.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use retie_ledger::payload::Status;
use retie_policy::Action;
use retie_snapshot::{Node, RelPath, Workspace};
use serde_json::{json, Value};

use crate::overlay::{self, ChangesMode, OverlayRun, RunMeta, Snapshots};
use crate::sandbox::{Hooks, JobUi};
use crate::{Error, Executor, Step, UndoPlan};

/// Most bytes of the current content read back for the "changed since it
/// was read" check (a larger file is never offered for writing).
const SEEN_MAX: u64 = 4 << 20;

/// Mode of a directory a write creates on the way to its file.
const NEW_DIR_MODE: u32 = 0o755;
/// Mode of a file a write creates.
const NEW_FILE_MODE: u32 = 0o644;

/// One file's new content, worked out (and inspected, and shown) before it
/// was proposed.
#[derive(Debug, Clone)]
pub struct FileWrite {
    pub path: RelPath,
    pub content: Vec<u8>,
    /// The content seen when it was worked out (`None`: no such file).
    /// The write is refused if the file holds anything else by then.
    pub seen: Option<Vec<u8>>,
}

/// What the model (or whoever asked) reads: `Ok` text, or `Err` text for a
/// write that was not made (nothing changed).
pub type WriteOutput = Result<String, String>;

/// One file write.
pub struct WriteJob<'u> {
    pub write: Option<FileWrite>,
    /// retie's state directory (overlay runs, snapshots, locks).
    pub state: PathBuf,
    /// retie's own directories inside the workspace (never applied).
    pub protect: Vec<PathBuf>,
    pub snaps: Snapshots,
    /// When retie runs as root for a workspace owned by someone else.
    pub owner: Option<(u32, u32)>,
    pub ui: &'u mut dyn JobUi,
}

impl Executor for WriteJob<'_> {
    type Output = WriteOutput;

    fn shown_change(&self) -> Option<crate::diffs::FileChange> {
        let w = self.write.as_ref()?;
        // The file as it is now, through the same guarded read as the
        // check before the write; what the write was worked out against
        // (`seen`) is what it will insist on finding.
        let (before, note) = match current(&self.snaps.ws, &w.path) {
            Ok(now) if now == w.seen => (now, None),
            Ok(now) => (
                now,
                Some("the file changed since this write was worked out from it: as it stands the write will be refused (the model reads it again)".to_string()),
            ),
            Err(why) => (w.seen.clone(), Some(why)),
        };
        Some(crate::diffs::FileChange {
            path: w.path.as_str().to_string(),
            before,
            after: Some(w.content.clone()),
            note,
            missing: false,
        })
    }

    fn plan(&self, _: &Action) -> UndoPlan {
        let w = self.write.as_ref();
        UndoPlan {
            reversible: true,
            detail: json!({
                "reversible": true,
                "via": "snapshot",
                "changeset": null,
                "paths": w.map(|w| w.path.as_str()).into_iter().collect::<Vec<_>>(),
                "change": w.map(|w| json!({
                    "path": w.path.as_str(),
                    "bytes": w.content.len(),
                    "blake3": retie_snapshot::Hash::of(&w.content).to_hex(),
                    "created": w.seen.is_none(),
                })),
                "how": "the write is applied like a sandboxed command's changes: the changeset and its pre-images are recorded right before it reaches the workspace; undo puts back the prior content and removes what it created",
            }),
        }
    }

    fn execute(&mut self, _: &Action, step: &mut Step<'_>) -> Result<WriteOutput, Error> {
        let w = self
            .write
            .take()
            .ok_or_else(|| Error::Invalid("a write runs once".into()))?;
        let shown = retie_display::visible(w.path.as_str());
        let ws = self.snaps.ws.path().to_path_buf();
        // Every change to the workspace from here on carries a change time
        // at or after this (the conflict check of `overlay::handle`); the
        // content is compared with what was shown right after it.
        let started = overlay::run_start(&self.state, &ws);
        let refuse = |step: &mut Step<'_>, why: String| {
            step.set_outcome(json!({"status": Status::RefusedByGuard.word(), "why": why}));
            Ok(Err(why))
        };
        match current(&self.snaps.ws, &w.path) {
            Ok(now) if now == w.seen => {}
            Ok(_) => {
                return refuse(
                    step,
                    format!("{shown} changed since it was read; nothing written, read it again"),
                )
            }
            Err(why) => return refuse(step, format!("{shown}: {why}; nothing written")),
        }
        let mut run = OverlayRun::create(&self.state, self.owner)?;
        run.write_meta(&RunMeta {
            workspace: ws.clone(),
            command: vec!["write".into(), w.path.as_str().into()],
            started_ns: nanos(started),
            created_ms: nanos(SystemTime::now()) / 1_000_000,
            kept: None,
        })?;
        let made = match stage(&self.snaps.ws, &run.upper, &w.path, &w.content) {
            Ok(m) => m,
            Err(Staging::Refused(why)) => {
                return refuse(step, format!("{shown}: {why}; nothing written"))
            }
            Err(Staging::Io(e)) => {
                return Err(Error::io(format!("staging the write of {shown}"), e))
            }
        };
        let mut hooks = Hooks {
            ui: &mut *self.ui,
            step,
            allow_blocked: false,
        };
        let h = overlay::handle(
            ChangesMode::Apply,
            false,
            &self.protect,
            &self.state,
            &self.snaps,
            &mut run,
            self.owner,
            started,
            // A file changed since the model staged it is refused, never
            // overwritten: the model reads it again.
            overlay::OnConflict::Refuse,
            &mut hooks,
        )?;
        let raced = h.json["raced"].as_array().is_some_and(|r| !r.is_empty());
        if h.json["applied"] == json!(true) && raced {
            // Someone saved the file at the moment of the write: their
            // version stays, the model's is kept in the run (ADR 0205).
            step.set_outcome(
                json!({"status": Status::RefusedByGuard.word(), "why": "raced", "changes": h.json}),
            );
            return Ok(Err(format!(
                "{shown} was not written: it changed at the moment of the write; the other version is kept in the workspace (read it again)"
            )));
        }
        if h.json["applied"] == json!(true) {
            step.set_outcome(json!({
                "status": Status::Applied.word(),
                "changeset": h.json["id"],
                "changes": crate::overlay::changes_count(&h.json),
                "bytes": w.content.len(),
                "created_dirs": made.iter().map(RelPath::as_str).collect::<Vec<_>>(),
            }));
            let dirs = if made.is_empty() {
                String::new()
            } else {
                format!(
                    "; created the directories {}",
                    made.iter()
                        .map(|d| retie_display::visible(d.as_str()))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Ok(Ok(format!(
                "{} {shown} ({} bytes{dirs})",
                if w.seen.is_none() { "created" } else { "wrote" },
                w.content.len()
            )));
        }
        let why = h.failure.clone().unwrap_or_else(|| not_applied(&h.json));
        step.set_outcome(
            json!({"status": Status::RefusedByGuard.word(), "why": why, "changes": h.json}),
        );
        Ok(Err(format!("{shown} was not written: {why}")))
    }
}

/// Why a changeset with nothing applied and no failure was not applied:
/// every change was blocked or refused.
fn not_applied(j: &Value) -> String {
    let reasons: Vec<String> = ["blocked", "refused"]
        .iter()
        .filter_map(|k| j[*k].as_array())
        .flatten()
        .map(|b| {
            format!(
                "{} ({})",
                retie_display::visible(b["path"].as_str().unwrap_or("?")),
                match &b["reason"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }
            )
        })
        .collect();
    if reasons.is_empty() {
        "nothing to change".into()
    } else {
        format!("refused: {}", reasons.join(", "))
    }
}

/// The file's current content (`None`: no such file), through the
/// boundary guard.
pub(crate) fn current(ws: &Workspace, path: &RelPath) -> Result<Option<Vec<u8>>, String> {
    match ws.read_file(path, SEEN_MAX) {
        Ok((b, size)) if size <= SEEN_MAX => Ok(Some(b)),
        Ok(_) => Err("too large to write here".into()),
        Err(retie_snapshot::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(retie_snapshot::Error::Boundary { .. }) => Err(
            "it is or passes through a symlink; retie never follows a symlink inside the workspace"
                .into(),
        ),
        Err(e) => Err(e.to_string()),
    }
}

enum Staging {
    /// Not writable there (a file or symlink on the way): said to the model.
    Refused(String),
    Io(std::io::Error),
}

impl From<std::io::Error> for Staging {
    fn from(e: std::io::Error) -> Staging {
        Staging::Io(e)
    }
}

/// Put `content` at `path` in the run's `upper` as a command's write
/// would leave it there: each directory on the way that the workspace has
/// with its mode (a merged directory, no change), each it lacks new.
/// Returns the directories the write creates in the workspace.
fn stage(
    ws: &Workspace,
    upper: &Path,
    path: &RelPath,
    content: &[u8],
) -> Result<Vec<RelPath>, Staging> {
    // (directory in the upper, its mode) for every directory on the way.
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    let mut made = Vec::new();
    let mut ancestors: Vec<RelPath> =
        std::iter::successors(path.parent(), RelPath::parent).collect();
    ancestors.reverse();
    for here in ancestors {
        let shown = || retie_display::visible(here.as_str());
        let mode = if !made.is_empty() {
            None
        } else {
            match ws.node(&here) {
                Ok(Some(Node::Dir { mode })) => Some(mode),
                Ok(None) => None,
                Ok(Some(_)) => {
                    return Err(Staging::Refused(format!("{} is not a directory", shown())))
                }
                Err(retie_snapshot::Error::Boundary { .. }) => {
                    return Err(Staging::Refused(format!(
                        "{} is a symlink; retie never follows a symlink inside the workspace",
                        shown()
                    )))
                }
                Err(e) => return Err(Staging::Refused(e.to_string())),
            }
        };
        let at = upper.join(here.as_str());
        // Owner-writable while it is filled; its own mode set last.
        std::fs::DirBuilder::new().mode(0o700).create(&at)?;
        dirs.push((at, mode.unwrap_or(NEW_DIR_MODE)));
        if mode.is_none() {
            made.push(here);
        }
    }
    let mode = match ws.node(path) {
        Ok(Some(Node::File { mode, .. })) => mode,
        _ => NEW_FILE_MODE,
    };
    let at = upper.join(path.as_str());
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&at)?;
        f.write_all(content)?;
    }
    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode))?;
    for (d, mode) in dirs.iter().rev() {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(*mode))?;
    }
    Ok(made)
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
