//! The ledger side of the chokepoint: one session, and the durable points
//! of each action in it.
//!
//! Durable points, each one SQLite transaction (`BEGIN IMMEDIATE`, WAL,
//! `synchronous=FULL`: one WAL fsync at commit):
//! 1. before the action runs: the session's opening (for its first
//!    action), the proposal, the decision and the intent with its undo
//!    plan (or the refusal instead of the intent);
//! 2. right before an effect reaches the workspace: the exact changes and
//!    their undo plan (overlay mode, only when something changed);
//! 3. after: the outcome, with the session's close when this invocation
//!    opened the session. A joined session's outcome is written at once.
//!
//! The session's key is derived from the user key (no key file per
//! session); a checkpoint is written when the session closes.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use retie_ledger::keys::{self, Delegation};
use retie_ledger::{now_ms, Actor, Kind, Ledger, NewEntry};
use serde_json::{json, Value};

use crate::Error;

/// How long a session's delegation lasts.
pub const SESSION_TTL_MS: i64 = 24 * 3600 * 1000;

/// What a session is opened with.
pub struct SessionSpec {
    /// Join this open session instead of opening one.
    pub join: Option<String>,
    /// The workspace the session acts on.
    pub workspace: PathBuf,
    /// Recorded in the session's opening entry: objective, origin, policy
    /// digest, profile, model...
    pub opened: Value,
    /// Effects (the policy crate's names) the session's key may act with.
    pub effects: Vec<String>,
    /// Fields merged into every intent (tool, command, workspace, mode...).
    pub intent_base: Value,
}

struct Session {
    id: String,
    key: SigningKey,
    /// The opening entries, not yet durable: written with the first
    /// action's durable point.
    pending_open: Option<Value>,
    joined: bool,
}

/// Records one session's actions.
pub struct Recorder {
    ledger: Ledger,
    user: SigningKey,
    session: Session,
    intent_base: Value,
    /// An outcome waiting for the session's close (one transaction).
    pending_outcome: Option<Value>,
}

impl Recorder {
    /// Open the ledger (creating it and the user key on first use), refuse
    /// a replaced user key, and open or join the session. Nothing is
    /// written yet.
    pub fn open(ledger_path: &Path, spec: SessionSpec) -> Result<Recorder, Error> {
        let user = keys::user_key()?;
        let ledger = Ledger::open(ledger_path, true, Some(&user))?;
        ledger.check_user_key(&user)?;
        let session = match &spec.join {
            Some(id) => join_session(&ledger, &user, id)?,
            None => {
                let id = new_id();
                let key = keys::session_key(&user, &id);
                let d = Delegation::issue(
                    &user,
                    &key.verifying_key(),
                    &id,
                    &spec.workspace.display().to_string(),
                    &spec.effects.iter().map(String::as_str).collect::<Vec<_>>(),
                    now_ms() + SESSION_TTL_MS,
                );
                let mut opened = spec.opened.clone();
                if let Some(o) = opened.as_object_mut() {
                    o.insert("delegation".into(), json!(d));
                }
                Session {
                    id,
                    key,
                    pending_open: Some(opened),
                    joined: false,
                }
            }
        };
        Ok(Recorder {
            ledger,
            user,
            session,
            intent_base: spec.intent_base,
            pending_outcome: None,
        })
    }

    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.session.id
    }

    /// Add a field to every intent of this session.
    pub fn note(&mut self, key: &str, value: Value) {
        if let Some(o) = self.intent_base.as_object_mut() {
            o.insert(key.into(), value);
        }
    }

    fn entry(&self, actor: Actor, kind: Kind, payload: Value) -> NewEntry {
        let key = match actor {
            Actor::Person => self.user.clone(),
            _ => self.session.key.clone(),
        };
        NewEntry {
            session: self.session.id.clone(),
            actor,
            kind,
            payload,
            key,
        }
    }

    /// The entries that must precede this session's first action.
    fn opening(&mut self) -> Vec<NewEntry> {
        let mut out = Vec::new();
        if let Some(p) = self.session.pending_open.take() {
            out.push(self.entry(Actor::Person, Kind::SessionOpened, p));
        }
        if let Some(o) = self.pending_outcome.take() {
            out.push(self.entry(Actor::Agent, Kind::Outcome, o));
        }
        out
    }

    /// Durable point 1: proposal, decision and intent, in one transaction.
    /// Returns the intent's sequence number (the action's id).
    pub fn begin(&mut self, proposed: Value, decision: Value, intent: Value) -> Result<i64, Error> {
        stall("before-intent");
        let mut intent_payload = self.intent_base.clone();
        merge(&mut intent_payload, intent);
        let mut entries = self.opening();
        let n = entries.len() as i64;
        let pe = self.entry(Actor::Agent, Kind::Proposed, proposed);
        let de = self.entry(Actor::Policy, Kind::Decision, decision);
        let ie = self.entry(Actor::Agent, Kind::Intent, intent_payload);
        let appended = self.ledger.append_batch(|first| {
            let proposal = first + n;
            let mut de = de;
            let mut ie = ie;
            set(&mut de.payload, "proposal", json!(proposal));
            set(&mut ie.payload, "proposal", json!(proposal));
            entries.push(pe);
            entries.push(de);
            entries.push(ie);
            entries
        })?;
        let action = appended.last().map(|a| a.seq).unwrap_or_default();
        stall("begin");
        Ok(action)
    }

    /// Durable point 1, refused: proposal, decision and refusal.
    pub fn refuse(
        &mut self,
        proposed: Value,
        decision: Value,
        refusal: Value,
    ) -> Result<(), Error> {
        let mut entries = self.opening();
        let n = entries.len() as i64;
        let pe = self.entry(Actor::Agent, Kind::Proposed, proposed);
        let de = self.entry(Actor::Policy, Kind::Decision, decision);
        let mut re = self.entry(Actor::Policy, Kind::Refusal, refusal);
        merge(&mut re.payload, self.intent_base.clone());
        self.ledger.append_batch(|first| {
            let mut de = de;
            set(&mut de.payload, "proposal", json!(first + n));
            set(&mut re.payload, "proposal", json!(first + n));
            entries.push(pe);
            entries.push(de);
            entries.push(re);
            entries
        })?;
        Ok(())
    }

    /// Durable point 2: the exact changes about to be made.
    pub fn changes(&mut self, action: i64, mut changes: Value) -> Result<(), Error> {
        set(&mut changes, "action", json!(action));
        let e = self.entry(Actor::Agent, Kind::Changes, changes);
        self.ledger.append_batch(|_| vec![e])?;
        stall("intent");
        Ok(())
    }

    /// Durable point 3: the outcome (batched with the close of a session
    /// this invocation opened; written at once in a joined one).
    pub fn outcome(&mut self, action: i64, mut outcome: Value) -> Result<(), Error> {
        stall("applied");
        set(&mut outcome, "action", json!(action));
        if self.session.joined {
            let e = self.entry(Actor::Agent, Kind::Outcome, outcome);
            self.ledger.append_batch(|_| vec![e])?;
        } else {
            self.pending_outcome = Some(outcome);
        }
        Ok(())
    }

    /// Close the session this invocation opened (with the pending outcome,
    /// in one transaction) and checkpoint.
    pub fn finish(mut self) -> Result<(), Error> {
        let mut entries = Vec::new();
        if let Some(o) = self.pending_outcome.take() {
            entries.push(self.entry(Actor::Agent, Kind::Outcome, o));
        }
        let opened_here = !self.session.joined && self.session.pending_open.is_none();
        if opened_here {
            entries.push(self.entry(Actor::Person, Kind::SessionClosed, json!({})));
        }
        if entries.is_empty() {
            return Ok(());
        }
        self.ledger.append_batch(|_| entries)?;
        self.ledger.checkpoint(&self.user)?;
        Ok(())
    }
}

/// Rejoin a session (`--session S`): its delegation must not have expired.
fn join_session(ledger: &Ledger, user: &SigningKey, id: &str) -> Result<Session, Error> {
    let err = |why: &str| retie_ledger::Error::Session {
        session: id.into(),
        why: why.into(),
    };
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(err("not a session id").into());
    }
    let rows = ledger.session_rows(id)?;
    let opened = rows
        .iter()
        .find(|r| r.kind == Kind::SessionOpened.as_bytes())
        .ok_or_else(|| err("no such session in this ledger"))?;
    let d: Delegation = opened
        .payload_json()
        .get("delegation")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .ok_or_else(|| err("its delegation is unreadable"))?;
    if d.not_after_ms < now_ms() {
        return Err(err("its delegation has expired; start a new session").into());
    }
    let derived = keys::session_key(user, id);
    let key = if retie_ledger::hex(derived.verifying_key().as_bytes()) == d.key {
        derived
    } else {
        // A session opened before keys were derived kept its key in a file.
        keys::load_session_key(ledger.path(), id)?
    };
    if retie_ledger::hex(key.verifying_key().as_bytes()) != d.key {
        return Err(err("its key does not match its delegation").into());
    }
    Ok(Session {
        id: id.into(),
        key,
        pending_open: None,
        joined: true,
    })
}

fn new_id() -> String {
    retie_snapshot::new_id()
}

fn set(v: &mut Value, key: &str, val: Value) {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.into(), val);
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(o), Value::Object(from)) = (into.as_object_mut(), from) {
        for (k, v) in from {
            o.insert(k, v);
        }
    }
}

/// A stall point for the crash tests (debug builds only):
/// `RETIE_LEDGER_STALL=STAGE` makes the writer say so on stderr and sleep,
/// so a test can kill it there. Release builds have no such hook.
#[cfg(debug_assertions)]
fn stall(stage: &str) {
    if std::env::var("RETIE_LEDGER_STALL").as_deref() == Ok(stage) {
        eprintln!("retie: ledger stall at {stage}");
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

#[cfg(not(debug_assertions))]
fn stall(_stage: &str) {}
