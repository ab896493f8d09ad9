//! What `retie sandbox exec` writes: a session (per invocation, unless it
//! joins one), the intent with the undo plan before any change reaches the
//! workspace, the outcome after.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use retie_snapshot::Changeset;
use serde_json::{json, Value};

use super::keys::{self, Delegation};
use super::{kind, now_ms, Actor, Error, Ledger, Result};
use crate::commands::changes::Handled;
use crate::error::CliError;

/// Effects a runtime session may have.
pub const EXEC_EFFECTS: &[&str] = &["workspace.write", "exec"];
/// How long a session's delegation lasts.
pub const SESSION_TTL_MS: i64 = 24 * 3600 * 1000;

/// An open session: its id and the agent key that signs for it.
pub struct Session {
    pub id: String,
    pub key: SigningKey,
}

/// Open a new session: a fresh agent key, delegated by the user key, and
/// the session_opened entry that carries the delegation.
pub fn open_session(
    ledger: &mut Ledger,
    user: &SigningKey,
    workspace: &str,
    opened: Value,
    effects: &[&str],
    ttl_ms: i64,
) -> Result<Session> {
    let id = retie_snapshot::new_id();
    let key = keys::generate()?;
    let d = Delegation::issue(
        user,
        &key.verifying_key(),
        &id,
        workspace,
        effects,
        now_ms() + ttl_ms,
    );
    keys::save_session_key(ledger.path(), &id, &key)?;
    let mut payload = opened;
    if let Some(o) = payload.as_object_mut() {
        o.insert("delegation".into(), json!(d));
    }
    ledger.append(&id, Actor::Person, kind::SESSION_OPENED, &payload, user)?;
    Ok(Session { id, key })
}

/// Rejoin a session (`--session S`): its key must still be delegated.
pub fn join_session(ledger: &Ledger, id: &str) -> Result<Session> {
    let err = |why: &str| Error::Session {
        session: id.into(),
        why: why.into(),
    };
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(err("not a session id"));
    }
    let rows = ledger.session_rows(id)?;
    let opened = rows
        .iter()
        .find(|r| r.kind == kind::SESSION_OPENED.as_bytes())
        .ok_or_else(|| err("no such session in this ledger"))?;
    let d: Delegation = opened
        .payload_json()
        .get("delegation")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| err("its delegation is unreadable"))?;
    if d.not_after_ms < now_ms() {
        return Err(err("its delegation has expired; start a new session"));
    }
    let key = keys::load_session_key(ledger.path(), id)?;
    if super::hex(key.verifying_key().as_bytes()) != d.key {
        return Err(err("its key file does not hold the delegated key"));
    }
    Ok(Session { id: id.into(), key })
}

/// The undo plan of a changeset about to be applied.
pub fn plan_for(cs: &Changeset, allow_blocked: bool) -> Value {
    let paths: Vec<&str> = cs
        .to_apply(allow_blocked)
        .map(|c| c.path.as_str())
        .collect();
    json!({
        "reversible": true,
        "via": "snapshot",
        "changeset": cs.id,
        "paths": paths,
    })
}

/// `p` with its longest existing ancestor resolved (symlinks and all).
fn real_path(p: &Path) -> Option<PathBuf> {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(p)
    };
    let mut base = abs.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(r) = std::fs::canonicalize(base) {
            let mut out = r;
            for c in rest.iter().rev() {
                out.push(c);
            }
            return Some(out);
        }
        rest.push(base.file_name()?.to_owned());
        base = base.parent()?;
    }
}

/// The undo plan of a direct-mode run: there is none.
pub fn plan_direct() -> Value {
    json!({
        "reversible": false,
        "why": "direct mode: the command wrote the workspace in place and no pre-images were kept",
    })
}

/// A stall point for the crash tests: `RETIE_LEDGER_STALL=STAGE` makes the
/// writer say so on stderr and sleep, so a test can kill it there. Debug
/// builds only (what `cargo test` builds): a release binary has no hook
/// that an environment variable can use to hold a run between its intent
/// and its outcome.
#[cfg(not(debug_assertions))]
fn stall(_stage: &str) {}

/// See above: the debug build's stall point.
#[cfg(debug_assertions)]
fn stall(stage: &str) {
    if std::env::var("RETIE_LEDGER_STALL").as_deref() == Ok(stage) {
        eprintln!("retie: ledger stall at {stage}");
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Records one `sandbox exec`.
pub struct Recorder {
    ledger_arg: Option<PathBuf>,
    /// Opened before the run.
    open: Option<(Ledger, SigningKey)>,
    join: Option<String>,
    session: Option<Session>,
    workspace: PathBuf,
    base: Value,
    /// The intent's seq once written.
    pub action: Option<i64>,
    /// The ledger's directory, when it lies inside the workspace and must
    /// be masked in the sandbox.
    mask: Option<PathBuf>,
}

impl Recorder {
    /// The directory the sandbox must not see (the ledger lives in it).
    pub fn mask(&self) -> Option<&Path> {
        self.mask.as_deref()
    }

    /// Open the ledger (creating it and the user key on first use).
    pub fn open(
        ledger_arg: Option<&Path>,
        join: Option<String>,
        workspace: &Path,
        command: &[String],
        mode: &str,
        profile: &str,
    ) -> Result<Recorder> {
        let mut r = Recorder {
            ledger_arg: ledger_arg.map(Path::to_path_buf),
            open: None,
            join,
            session: None,
            workspace: workspace.to_path_buf(),
            base: json!({
                "tool": "sandbox.exec",
                "command": command,
                "workspace": workspace.display().to_string(),
                "mode": mode,
                "profile": profile,
            }),
            action: None,
            mask: None,
        };
        // Never within the command's reach. A ledger inside the workspace
        // gets its directory masked in the sandbox (an empty read-only
        // tmpfs covers it: the ledger, its WAL, checkpoints and keys). A
        // ledger directly in the workspace's root cannot be masked without
        // hiding the workspace itself, so that is refused.
        let path = super::resolve_path(ledger_arg)?;
        if let Some(real) = real_path(&path) {
            if real.starts_with(workspace) {
                match real.parent() {
                    Some(dir) if dir != workspace && dir.starts_with(workspace) => {
                        // It must exist before the run, or the command
                        // could create it (and plant files) unmasked.
                        if !dir.is_dir() {
                            std::fs::DirBuilder::new()
                                .recursive(true)
                                .mode(0o700)
                                .create(dir)
                                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
                            // retie's own change to the workspace must not
                            // count as the person's (see changed_during_run).
                            crate::commands::changes::wait_for_next_tick();
                        }
                        r.mask = Some(dir.to_path_buf());
                    }
                    _ => {
                        return Err(Error::Invalid(format!(
                            "the ledger {} lies in the root of the workspace {}, within the sandboxed command's reach; keep it in a directory of its own or outside (--ledger, RETIE_LEDGER)",
                            path.display(),
                            workspace.display()
                        )))
                    }
                }
            }
        }
        // Open the ledger now: a replaced user key is refused before
        // anything runs.
        r.ensure()?;
        // Joining: check the session now, before anything runs.
        if let Some(id) = r.join.clone() {
            let s = join_session(&r.ensure()?.0, &id)?;
            r.session = Some(s);
        }
        Ok(r)
    }

    fn ensure(&mut self) -> Result<&mut (Ledger, SigningKey)> {
        if self.open.is_none() {
            let user = keys::user_key()?;
            let path = super::resolve_path(self.ledger_arg.as_deref())?;
            let ledger = Ledger::open(&path, true, Some(&user))?;
            ledger.check_user_key(&user)?;
            self.open = Some((ledger, user));
        }
        self.open
            .as_mut()
            .ok_or_else(|| Error::Invalid("the ledger is not open".into()))
    }

    fn session(&mut self) -> Result<&Session> {
        if self.session.is_none() {
            let opened = json!({
                "objective": self.base["command"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" ")),
                "origin": "retie sandbox exec",
                "provider": null,
                "model": null,
                // The policy in force: `sandbox exec` runs no gate yet, but
                // the shipped policy is what a replay should be read against.
                "policy_digest": retie_policy::Policy::shipped().ok().map(|p| p.digest().to_hex()),
                "system_prompt_digest": null,
                "profile": self.base["profile"],
            });
            let ws = self.workspace.display().to_string();
            let (ledger, user) = self.ensure()?;
            let s = open_session(ledger, user, &ws, opened, EXEC_EFFECTS, SESSION_TTL_MS)?;
            self.session = Some(s);
        }
        self.session
            .as_ref()
            .ok_or_else(|| Error::Invalid("no session".into()))
    }

    /// Write the intent with its undo plan; nothing may change the
    /// workspace before this returns Ok.
    pub fn intent(&mut self, undo: Value) -> Result<i64> {
        let mut p = self.base.clone();
        if let Some(o) = p.as_object_mut() {
            o.insert("effect".into(), json!("workspace.write"));
            o.insert("decision".into(), json!("allow"));
            o.insert("decided_by".into(), json!("person"));
            o.insert(
                "class".into(),
                json!(if undo["reversible"] == json!(true) {
                    "reversible"
                } else {
                    "not_reversible"
                }),
            );
            o.insert("undo".into(), undo);
        }
        let (id, key) = {
            let s = self.session()?;
            (s.id.clone(), s.key.clone())
        };
        let a = self
            .ensure()?
            .0
            .append(&id, Actor::Agent, kind::INTENT, &p, &key)?;
        self.action = Some(a.seq);
        stall("intent");
        Ok(a.seq)
    }

    /// Write the outcome of the action (if an intent was written).
    pub fn outcome(&mut self, mut outcome: Value) -> Result<()> {
        let Some(action) = self.action else {
            return Ok(());
        };
        stall("applied");
        if let Some(o) = outcome.as_object_mut() {
            o.insert("action".into(), json!(action));
        }
        let (id, key) = {
            let s = self.session()?;
            (s.id.clone(), s.key.clone())
        };
        self.ensure()?
            .0
            .append(&id, Actor::Agent, kind::OUTCOME, &outcome, &key)?;
        Ok(())
    }

    /// Record how the sandbox run ended when it ended the action (direct
    /// mode, or a run that failed); pass the result through.
    pub fn after_run(
        &mut self,
        r: std::result::Result<retie_runtime::Outcome, retie_runtime::RuntimeError>,
    ) -> std::result::Result<retie_runtime::Outcome, CliError> {
        let v = match &r {
            Ok(o) => {
                json!({"status": "ran", "exit_code": o.exit_code, "signal": o.signal, "timed_out": o.timed_out})
            }
            Err(e) => json!({"status": "failed", "failure": e.to_string()}),
        };
        if self.action.is_some() {
            self.warn(|s| s.outcome(v));
        }
        Ok(r?)
    }

    /// Record how applying the changes ended; pass the result through.
    pub fn after_changes(
        &mut self,
        h: std::result::Result<Handled, CliError>,
    ) -> std::result::Result<Handled, CliError> {
        let v = match &h {
            Ok(h) => {
                let applied = h.json["applied"] == json!(true);
                json!({
                    "status": if applied { "applied" } else if h.failure.is_some() { "refused" } else { "not applied" },
                    "changes": h.json["changes"].as_array().map(|a| a.len()),
                    "conflicts": h.json.get("conflicts"),
                    "failure": h.failure,
                })
            }
            Err(e) => json!({"status": "failed", "failure": e.to_string()}),
        };
        self.warn(|s| s.outcome(v));
        h
    }

    fn warn(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) {
        if let Err(e) = f(self) {
            eprintln!("retie: warning: the ledger could not record the outcome: {e}");
        }
    }

    /// Close the session this invocation opened and checkpoint (a failure
    /// here is reported, not fatal: the action itself is recorded).
    pub fn finish(self) {
        if let Err(e) = self.finish_inner() {
            eprintln!("retie: warning: the ledger session could not be closed: {e}");
        }
    }

    fn finish_inner(mut self) -> Result<()> {
        let Some(s) = &self.session else {
            return Ok(());
        };
        let id = s.id.clone();
        let joined = self.join.is_some();
        let (ledger, user) = self.ensure()?;
        if !joined {
            ledger.append(&id, Actor::Person, kind::SESSION_CLOSED, &json!({}), user)?;
        }
        ledger.checkpoint(user)?;
        Ok(())
    }
}
