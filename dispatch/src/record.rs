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
use retie_ledger::{now_ms, payload, Actor, Durability, Guard, Kind, Ledger, NewEntry, Row};
use serde_json::{json, Value};

use crate::Error;

/// The ledger opened for a recorder, with the user key that signs for
/// it: the slow half of [`Recorder::open`] (the key file, SQLite's open
/// and WAL recovery), which a caller may run on another thread.
pub struct OpenLedger {
    user: SigningKey,
    ledger: Ledger,
}

impl OpenLedger {
    /// Open the ledger (creating it and the user key on first use) and
    /// refuse a replaced user key.
    pub fn open(ledger_path: &Path) -> Result<OpenLedger, Error> {
        let user = keys::user_key()?;
        let ledger = Ledger::open(ledger_path, true, Some(&user))?;
        ledger.check_user_key(&user)?;
        Ok(OpenLedger { user, ledger })
    }
}

/// How long a session's delegation lasts.
pub const SESSION_TTL_MS: i64 = 24 * 3600 * 1000;

/// What a session is opened with.
pub struct SessionSpec {
    /// Join this open session instead of opening one.
    pub join: Option<String>,
    /// The workspace the session acts on.
    pub workspace: PathBuf,
    /// Recorded in the session's opening entry: objective, origin, policy
    /// digest, profile, model... (the recorder adds the delegation).
    pub opened: payload::SessionOpened,
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
    /// Joined with `--session` (another invocation closes it): outcomes
    /// are written at once. A new or resumed session is this process's to
    /// close or suspend.
    joined: bool,
}

/// A grant in force: "always, for this session, for these exact keys".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The grant entry's seq (what a revoke names).
    pub seq: i64,
    /// What it covers: `bash:SIMPLE COMMAND` per simple command, or
    /// `TOOL:ARGUMENTS-JSON`.
    pub keys: Vec<String>,
    /// Who granted it.
    pub by: String,
}

/// A pending approval still open in the ledger (being resumed).
#[derive(Debug, Clone, PartialEq)]
pub struct OpenPending {
    /// The pending entry's seq.
    pub seq: i64,
    /// The proposal entry's seq.
    pub proposal: i64,
    /// The frozen arguments' digest the decision must bind.
    pub digest: String,
    /// The pending entry's payload.
    pub payload: Value,
    /// The decision someone recorded for it (`retie approve`/`deny`),
    /// with its seq; `None` while undecided.
    pub decision: Option<(i64, Value)>,
}

/// Records one session's actions.
pub struct Recorder {
    ledger: Ledger,
    user: SigningKey,
    session: Session,
    intent_base: Value,
    /// An outcome waiting for the session's close (one transaction).
    pending_outcome: Option<Value>,
    /// The waiting outcome may reach the disk with the next durable point
    /// (nothing later depends on it being there at once).
    outcome_deferred: bool,
    /// Entries (messages) that ride on the next durable transaction
    /// instead of paying an fsync of their own.
    queued: Vec<NewEntry>,
    /// Grants in force.
    grants: Vec<Grant>,
    /// The open pending approval this process resumed, until dispatch
    /// takes it up.
    resume: Option<OpenPending>,
    /// The session's lock, held while this process runs it.
    lock: Option<SessionLock>,
    /// The last pending entry this process wrote (seq, payload).
    last_pending: Option<(i64, Value)>,
    /// The status word of the last outcome recorded (what `--json` and
    /// the live line say of the call: the ledger's own word).
    /// The action whose changes were recorded last, and its changeset
    /// (the diff a person is shown after it).
    last_changeset: Option<(i64, String)>,
    last_status: Option<String>,
}

impl Recorder {
    /// Open the ledger (creating it and the user key on first use), refuse
    /// a replaced user key, and open or join the session. Nothing is
    /// written yet.
    pub fn open(ledger_path: &Path, spec: SessionSpec) -> Result<Recorder, Error> {
        Recorder::with_ledger(OpenLedger::open(ledger_path)?, spec)
    }

    /// [`open`](Self::open) on a ledger opened already (on another thread,
    /// while the caller loaded the policy).
    pub fn with_ledger(opened: OpenLedger, spec: SessionSpec) -> Result<Recorder, Error> {
        let OpenLedger { user, ledger } = opened;
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
                opened.delegation = Some(d);
                Session {
                    id,
                    key,
                    pending_open: Some(payload::to_value(&opened)),
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
            outcome_deferred: false,
            queued: Vec::new(),
            grants: Vec::new(),
            resume: None,
            lock: None,
            last_pending: None,
            last_status: None,
            last_changeset: None,
        })
    }

    /// Take up an agent session again (`retie run --resume`): verify the
    /// whole ledger first (a ledger that does not verify is refused),
    /// take the session's lock (refused while another process runs it),
    /// rebuild its grants and find its open pending approval. Returns
    /// the recorder and the session's rows (for the conversation).
    /// A finished (closed) session is refused: see [`Recorder::reopen`].
    pub fn resume(
        ledger_path: &Path,
        id: &str,
        intent_base: Value,
    ) -> Result<(Recorder, Vec<Row>), Error> {
        Self::resume_or_reopen(ledger_path, id, intent_base, false)
    }

    /// [`Recorder::resume`], and a finished (closed) session too: the
    /// person gives it a new task (`retie run --continue -p`, ADR 0523).
    /// Its `resumed` entry says `reopened`; nothing of the close is
    /// undone (it had no open approval: a close drops it).
    pub fn reopen(
        ledger_path: &Path,
        id: &str,
        intent_base: Value,
    ) -> Result<(Recorder, Vec<Row>), Error> {
        Self::resume_or_reopen(ledger_path, id, intent_base, true)
    }

    fn resume_or_reopen(
        ledger_path: &Path,
        id: &str,
        intent_base: Value,
        reopen: bool,
    ) -> Result<(Recorder, Vec<Row>), Error> {
        let err = |why: String| {
            Error::Ledger(retie_ledger::Error::Session {
                session: id.into(),
                why,
            })
        };
        if !retie_ledger::exists(ledger_path) {
            return Err(retie_ledger::Error::Missing(ledger_path.to_path_buf()).into());
        }
        let report = retie_ledger::verify::verify(ledger_path)?;
        if !report.intact {
            let bad = report
                .first_bad
                .map(|b| {
                    format!(
                        " (entry {}: {})",
                        b.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                        b.what
                    )
                })
                .unwrap_or_default();
            return Err(Error::Invalid(format!(
                "the ledger {} does not verify{bad}: refusing to resume from it. Nothing was changed; `retie verify` shows what is wrong",
                ledger_path.display()
            )));
        }
        if report.complete == Some(false) {
            return Err(Error::Invalid(format!(
                "the ledger {} is incomplete ({}): refusing to resume from it. Nothing was changed",
                ledger_path.display(),
                report.incomplete_because.unwrap_or_default()
            )));
        }
        let user = keys::user_key()?;
        let ledger = Ledger::open(ledger_path, false, Some(&user))?;
        ledger.check_user_key(&user)?;
        let (mut session, renewal) = join_or_renew(&ledger, &user, id, true)?;
        session.joined = false;
        let lock = SessionLock::acquire(ledger_path, id)?;
        claim_shared(&ledger, id)?;
        let rows = ledger.session_rows(id)?;
        let state = SessionState::of(&rows);
        if state.closed && !reopen {
            return Err(err(
                "it is finished (closed); continue it with a new task (`retie run --resume SESSION -p TASK`, or `--continue -p TASK` for this workspace's last), or start a new session with `retie run -p`".into(),
            ));
        }
        let mut rec = Recorder {
            ledger,
            user,
            session,
            intent_base,
            pending_outcome: None,
            outcome_deferred: false,
            queued: Vec::new(),
            grants: state.grants,
            last_pending: state
                .open_pending
                .as_ref()
                .map(|p| (p.seq, p.payload.clone())),
            resume: state.open_pending,
            lock: Some(lock),
            last_status: None,
            last_changeset: None,
        };
        if let Some(d) = renewal {
            let e = rec.entry(
                Actor::Person,
                Kind::Delegation,
                payload::to_value(&payload::DelegationEntry {
                    delegation: d,
                    why: Some("renewed on resume".into()),
                    to: None,
                }),
            );
            rec.queued.push(e);
        }
        let resumed = rec.entry(
            Actor::Person,
            Kind::Resumed,
            payload::to_value(&payload::Resumed {
                pid: Some(std::process::id()),
                pending: rec.resume.as_ref().map(|p| p.seq),
                reopened: Some(state.closed),
            }),
        );
        rec.queued.push(resumed);
        Ok((rec, rows))
    }

    /// The allow-list of keys that may decide for this workspace (ADR
    /// 0460, `[ledger] approvers` in the CLI's config): when the resumed
    /// pending approval was decided by a key that is neither this
    /// machine's user key nor on `allowed` (hex), the decision is refused:
    /// a refusal naming it and its signer is recorded (durable, with
    /// what is queued) and an error says why; nothing is carried out. An
    /// empty list allows every key the ledger accepts. `rows` are the
    /// session's rows as [`Recorder::resume`] returned them.
    pub fn refuse_unlisted_decider(
        &mut self,
        rows: &[Row],
        allowed: &[String],
    ) -> Result<(), Error> {
        let Some((pending, dseq)) = self
            .resume
            .as_ref()
            .and_then(|p| p.decision.as_ref().map(|(d, _)| (p.seq, *d)))
        else {
            return Ok(());
        };
        if allowed.is_empty() {
            return Ok(());
        }
        let signer = rows
            .iter()
            .find(|r| r.seq == dseq)
            .map(|r| retie_ledger::hex(&r.signer))
            .unwrap_or_default();
        let mine = retie_ledger::hex(self.user.verifying_key().as_bytes());
        if !signer.is_empty()
            && (signer == mine
                || allowed
                    .iter()
                    .any(|k| k.trim().eq_ignore_ascii_case(&signer)))
        {
            return Ok(());
        }
        let why = format!(
            "the decision (entry {dseq}) on pending approval {pending} was signed by key {signer}, which is not on this workspace's allow-list ([ledger] approvers)"
        );
        let re = self.entry(
            Actor::Policy,
            Kind::Refusal,
            payload::to_value(&payload::Refusal {
                reason: why.clone(),
                by: None,
                refused: Some("decision".into()),
                decision: Some(dseq),
                signer: Some(signer),
                call: payload::CallFields {
                    pending: Some(pending),
                    ..payload::CallFields::default()
                },
            }),
        );
        self.queued.push(re);
        self.flush()?;
        Err(Error::Invalid(format!(
            "{why}: refused and recorded; nothing was run. Add the key to [ledger] approvers in config.toml if it may decide here"
        )))
    }

    /// Hold the session's lock while this process runs it (`retie
    /// sessions` tells running from crashed by it; a second process
    /// cannot resume it meanwhile).
    pub fn lock(&mut self, ledger_path: &Path) -> Result<(), Error> {
        if self.lock.is_none() {
            self.lock = Some(SessionLock::acquire(ledger_path, &self.session.id)?);
            claim_shared(&self.ledger, &self.session.id)?;
        }
        Ok(())
    }

    /// The pending approval this process resumed, if dispatch has not
    /// taken it up yet.
    pub fn resumed_pending(&self) -> Option<&OpenPending> {
        self.resume.as_ref()
    }

    /// Dispatch takes up the resumed pending approval when the action it
    /// is about to gate has the same digest.
    pub fn take_resumed(&mut self, digest: &str) -> Option<OpenPending> {
        if self.resume.as_ref().is_some_and(|p| p.digest == digest) {
            self.resume.take()
        } else {
            None
        }
    }

    /// Grants in force, oldest first.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// The grant covering every key, if one set of grants does.
    pub fn granted(&self, keys: &[String]) -> Option<i64> {
        if keys.is_empty() {
            return None;
        }
        let mut newest = None;
        for k in keys {
            let g = self.grants.iter().rev().find(|g| g.keys.contains(k))?;
            newest = newest.max(Some(g.seq));
        }
        newest
    }

    /// Take back a grant: a `revoke` entry, durable at once.
    pub fn revoke(&mut self, grant: i64, by: &str) -> Result<(), Error> {
        if !self.grants.iter().any(|g| g.seq == grant) {
            return Err(Error::Invalid(format!(
                "no grant {grant} in force in this session"
            )));
        }
        let mut entries = self.opening();
        entries.push(self.entry(
            Actor::Person,
            Kind::Revoke,
            payload::to_value(&payload::Revoke {
                grant,
                by: by.into(),
            }),
        ));
        self.ledger.append_batch(|_| entries)?;
        self.grants.retain(|g| g.seq != grant);
        Ok(())
    }

    /// A person changed a setting of the session (autonomy, model) for
    /// what comes next: a note by the person, durable at once, so the
    /// record says under which settings each later action was decided.
    pub fn setting(&mut self, name: &str, value: Value, by: &str) -> Result<(), Error> {
        let mut entries = self.opening();
        entries.push(self.entry(
            Actor::Person,
            Kind::Note,
            payload::to_value(&payload::Note::setting(name, value, by)),
        ));
        self.ledger.append_batch(|_| entries)?;
        Ok(())
    }

    /// A note of the session (a retest's verdict, a person's
    /// adjudication), durable at once.
    pub fn record_note(&mut self, by_person: bool, note: &payload::Note) -> Result<(), Error> {
        let actor = if by_person {
            Actor::Person
        } else {
            Actor::Agent
        };
        let mut entries = self.opening();
        entries.push(self.entry(actor, Kind::Note, payload::to_value(note)));
        self.ledger.append_batch(|_| entries)?;
        Ok(())
    }

    /// Queue a conversation message: it rides on the next durable
    /// transaction (no fsync of its own).
    pub fn message(&mut self, person: bool, message: &payload::Message) {
        let actor = if person { Actor::Person } else { Actor::Agent };
        let e = self.entry(actor, Kind::Message, payload::to_value(message));
        self.queued.push(e);
    }

    /// Write what is queued now (one transaction), if anything: for an
    /// interactive front after each exchange, so a conversation with no
    /// tool call is durable before the next prompt (one fsync per
    /// exchange; `-p` lets it ride on the close instead).
    pub fn flush(&mut self) -> Result<(), Error> {
        let entries = self.opening();
        if !entries.is_empty() {
            self.ledger.append_batch(|_| entries)?;
        }
        Ok(())
    }

    /// Durable before any prompt: the proposal and the pending approval,
    /// one transaction. Returns (proposal seq, pending seq).
    pub fn pending(
        &mut self,
        proposed: &payload::Proposed,
        pending: Value,
    ) -> Result<(i64, i64), Error> {
        let mut entries = self.opening();
        let n = entries.len() as i64;
        let pe = self.entry(Actor::Agent, Kind::Proposed, payload::to_value(proposed));
        let mut pa = self.entry(Actor::Policy, Kind::Pending, pending);
        merge(&mut pa.payload, self.call_fields());
        let entries_payload = Some((0, pa.payload.clone()));
        let appended = self.ledger.append_batch(|first| {
            set(&mut pa.payload, "proposal", json!(first + n));
            entries.push(pe);
            entries.push(pa);
            entries
        })?;
        let seq = appended.last().map(|a| a.seq).unwrap_or_default();
        self.last_pending = entries_payload;
        if let Some(p) = self.last_pending.as_mut() {
            p.0 = seq;
        }
        stall("pending");
        Ok((seq - 1, seq))
    }

    /// The payload of pending entry `seq`, if this process wrote it or
    /// resumed at it.
    pub fn pending_payload(&self, seq: i64) -> Option<Value> {
        self.last_pending
            .as_ref()
            .filter(|(s, _)| *s == seq)
            .map(|(_, p)| p.clone())
    }

    /// The call fields of the intent base (tool, command, call id) a
    /// pending entry repeats for `retie pending`.
    fn call_fields(&self) -> Value {
        let mut out = serde_json::Map::new();
        for k in ["tool", "command", "call"] {
            if let Some(v) = self.intent_base.get(k) {
                out.insert(k.into(), v.clone());
            }
        }
        Value::Object(out)
    }

    /// The decision recorded for pending approval `pending` since this
    /// process last looked (another process decided it).
    pub fn decision_for(&self, pending: i64) -> Result<Option<(i64, Value)>, Error> {
        let rows = self.ledger.session_rows(&self.session.id)?;
        Ok(rows
            .iter()
            .filter(|r| r.seq > pending && r.kind == Kind::Decision.as_bytes())
            .map(|r| (r.seq, r.payload_json()))
            .find(|(_, p)| p.get("pending").and_then(Value::as_i64) == Some(pending)))
    }

    /// Durable point 1 after a pending approval: the decision (when this
    /// process made it; guarded: refused if another process decided
    /// first), a grant it made, and the intent or the refusal, one
    /// transaction. Returns the intent's seq when it will run.
    pub fn decide(&mut self, d: PendingDecision) -> Result<Option<i64>, Error> {
        // Typed before anything is taken from the queue.
        let last = match &d.then {
            Then::Intent(i) => Some(self.entry(Actor::Agent, Kind::Intent, self.intent(i)?)),
            Then::Refusal(r) => Some(self.entry(Actor::Policy, Kind::Refusal, self.refusal(r)?)),
            Then::Nothing => None,
        };
        let mut entries = self.opening();
        let guard = d.decision.as_ref().map(|_| Guard::OpenPending {
            session: self.session.id.clone(),
            pending: d.pending,
        });
        let n = entries.len() as i64;
        let actor = if d.by_person {
            Actor::Person
        } else {
            Actor::Policy
        };
        let de = d.decision.map(|p| self.entry(actor, Kind::Decision, p));
        let has_decision = de.is_some() as i64;
        let ge = d.grant.map(|p| self.entry(Actor::Person, Kind::Grant, p));
        let has_grant = ge.is_some() as i64;
        let is_intent = last.as_ref().is_some_and(|e| e.kind == Kind::Intent);
        let known_decision = d.recorded_decision;
        let proposal = d.proposal;
        let pending = d.pending;
        let appended = self.ledger.append_batch_guarded(guard.as_ref(), |first| {
            let decision_seq = if has_decision == 1 {
                first + n
            } else {
                known_decision.unwrap_or_default()
            };
            if let Some(mut de) = de {
                set(&mut de.payload, "proposal", json!(proposal));
                set(&mut de.payload, "pending", json!(pending));
                entries.push(de);
            }
            if let Some(mut ge) = ge {
                set(&mut ge.payload, "decision", json!(decision_seq));
                entries.push(ge);
            }
            if let Some(mut le) = last {
                bind(
                    &mut le.payload,
                    payload::CallFields {
                        proposal: Some(proposal),
                        pending: Some(pending),
                        decision_entry: Some(decision_seq),
                        ..payload::CallFields::default()
                    },
                );
                entries.push(le);
            }
            entries
        })?;
        // A grant made here is in force from now on.
        if let (Some(keys), 1) = (d.grant_keys, has_grant) {
            let seq = appended
                .get((n + has_decision) as usize)
                .map(|a| a.seq)
                .unwrap_or_default();
            self.grants.push(Grant {
                seq,
                keys,
                by: d.grant_by,
            });
        }
        stall("decided");
        Ok(if is_intent {
            appended.last().map(|a| a.seq)
        } else {
            None
        })
    }

    /// The session stops with an approval pending: what is queued, the
    /// outcome waiting, and a `suspended` entry, one transaction; then a
    /// checkpoint. The session stays open.
    pub fn suspend(mut self, pending: i64) -> Result<(), Error> {
        let mut entries = self.opening();
        entries.push(self.entry(
            Actor::Agent,
            Kind::Suspended,
            payload::to_value(&payload::Suspended {
                pending: Some(pending),
                pid: Some(std::process::id()),
                end: None,
            }),
        ));
        self.ledger.append_batch(|_| entries)?;
        self.ledger.checkpoint(&self.user)?;
        Ok(())
    }

    /// The session stops because its provider stayed unavailable (no
    /// approval is pending): what is queued and a `suspended` entry
    /// carrying `end` (its outcome `suspended`, the reason), one
    /// transaction; then a checkpoint. The session stays open, to be
    /// resumed (`retie run --resume`).
    pub fn suspend_on_provider(
        mut self,
        end: &retie_ledger::provider::SessionEnd,
    ) -> Result<(), Error> {
        let mut entries = self.opening();
        let payload = payload::to_value(&payload::Suspended {
            pending: None,
            pid: Some(std::process::id()),
            end: Some(end.clone()),
        });
        entries.push(self.entry(Actor::Agent, Kind::Suspended, payload));
        self.ledger.append_batch(|_| entries)?;
        self.ledger.checkpoint(&self.user)?;
        Ok(())
    }

    /// A model turn's attempt failed: its cause and whether it is
    /// retried, with what is queued, durable now (a crash while waiting
    /// to retry still leaves the record).
    pub fn provider_attempt(
        &mut self,
        attempt: &retie_ledger::provider::ProviderAttempt,
    ) -> Result<(), Error> {
        let mut entries = self.opening();
        entries.push(self.entry(Actor::Agent, Kind::ProviderAttempt, attempt.to_payload()));
        self.ledger.append_batch(|_| entries)?;
        Ok(())
    }

    /// The status word of the last outcome recorded
    /// ([`retie_ledger::payload::Status`]).
    pub fn last_outcome_status(&self) -> Option<&str> {
        self.last_status.as_deref()
    }

    /// The changeset whose changes action `action` recorded right before
    /// making them, if it was the last to record any.
    pub fn changeset_of(&self, action: i64) -> Option<&str> {
        match &self.last_changeset {
            Some((a, id)) if *a == action => Some(id),
            _ => None,
        }
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

    /// The intent as written: the session's call fields (the intent
    /// base) under the action's own, read back as a typed
    /// [`payload::Intent`]: one that would be ill-typed is refused before
    /// anything is written.
    fn intent(&self, part: &payload::Intent) -> Result<Value, Error> {
        let mut p = self.intent_base.clone();
        merge(&mut p, payload::to_value(part));
        let typed = payload::parse::<payload::Intent>(&p)
            .and_then(|i| payload::check(Kind::Intent, p.to_string().as_bytes()).map(|_| i))
            .map_err(|e| {
                Error::Invalid(format!(
                    "the intent would be ill-typed ({e}): nothing was written or run"
                ))
            })?;
        Ok(payload::to_value(&typed))
    }

    /// The refusal as written: the refusal with the session's call fields
    /// (they win, as they always did), typed.
    fn refusal(&self, r: &payload::Refusal) -> Result<Value, Error> {
        let mut p = payload::to_value(r);
        merge(&mut p, self.intent_base.clone());
        let typed = payload::parse::<payload::Refusal>(&p).map_err(|e| {
            Error::Invalid(format!(
                "the refusal would be ill-typed ({e}): nothing was written"
            ))
        })?;
        Ok(payload::to_value(&typed))
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

    /// The entries that must precede this session's next durable point:
    /// its opening (first time), the outcome waiting, then the queued
    /// messages, in the order they happened.
    fn opening(&mut self) -> Vec<NewEntry> {
        let mut out = Vec::new();
        if let Some(p) = self.session.pending_open.take() {
            out.push(self.entry(Actor::Person, Kind::SessionOpened, p));
        }
        if let Some(o) = self.pending_outcome.take() {
            out.push(self.entry(Actor::Agent, Kind::Outcome, o));
        }
        out.append(&mut self.queued);
        out
    }

    /// Durable point 1: proposal, decision and intent, in one transaction.
    /// Returns the intent's sequence number (the action's id).
    pub fn begin(
        &mut self,
        proposed: &payload::Proposed,
        decision: Value,
        intent: &payload::Intent,
    ) -> Result<i64, Error> {
        stall("before-intent");
        let intent_payload = self.intent(intent)?;
        let mut entries = self.opening();
        let n = entries.len() as i64;
        let by = proposer(proposed);
        let pe = self.entry(by, Kind::Proposed, payload::to_value(proposed));
        let de = self.entry(Actor::Policy, Kind::Decision, decision);
        let ie = self.entry(by, Kind::Intent, intent_payload);
        let appended = self.ledger.append_batch(|first| {
            let proposal = first + n;
            let mut de = de;
            let mut ie = ie;
            set(&mut de.payload, "proposal", json!(proposal));
            bind(&mut ie.payload, proposal_of(proposal));
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
        proposed: &payload::Proposed,
        decision: Value,
        refusal: &payload::Refusal,
    ) -> Result<(), Error> {
        let refusal = self.refusal(refusal)?;
        let mut entries = self.opening();
        let n = entries.len() as i64;
        let pe = self.entry(
            proposer(proposed),
            Kind::Proposed,
            payload::to_value(proposed),
        );
        let de = self.entry(Actor::Policy, Kind::Decision, decision);
        let mut re = self.entry(Actor::Policy, Kind::Refusal, refusal);
        self.ledger.append_batch(|first| {
            let mut de = de;
            set(&mut de.payload, "proposal", json!(first + n));
            bind(&mut re.payload, proposal_of(first + n));
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
        self.last_changeset = changes
            .pointer("/undo/changeset")
            .and_then(Value::as_str)
            .map(|id| (action, id.to_string()));
        let e = self.entry(Actor::Agent, Kind::Changes, changes);
        self.ledger.append_batch(|_| vec![e])?;
        stall("intent");
        Ok(())
    }

    /// Durable point 3: the outcome (batched with the close of a session
    /// this invocation opened; written at once in a joined one).
    pub fn outcome(&mut self, action: i64, outcome: Value) -> Result<(), Error> {
        self.outcome_with(action, outcome, Durability::Now)
    }

    /// [`outcome`](Self::outcome), saying whether it must be on disk
    /// before this returns (joined session) or the close does (one this
    /// invocation opened): `Deferred` for an outcome nothing later
    /// depends on being on disk at once, which then rides on the next
    /// durable point (docs/ledger.md, "What a run costs in fsyncs").
    pub fn outcome_with(
        &mut self,
        action: i64,
        mut outcome: Value,
        durability: Durability,
    ) -> Result<(), Error> {
        stall("applied");
        set(&mut outcome, "action", json!(action));
        self.last_status = outcome
            .get("status")
            .and_then(Value::as_str)
            .map(String::from);
        if self.session.joined {
            let e = self.entry(Actor::Agent, Kind::Outcome, outcome);
            self.ledger.append_batch_with(durability, |_| vec![e])?;
        } else {
            self.pending_outcome = Some(outcome);
            self.outcome_deferred = durability == Durability::Deferred;
        }
        Ok(())
    }

    /// See [`crate::Step::checkpoint_meanwhile`].
    pub fn checkpoint_meanwhile(&mut self) {
        let _ = self.ledger.checkpoint(&self.user);
    }

    /// See [`crate::Step::take_fold`].
    pub fn take_fold(&mut self) -> Option<retie_ledger::Fold> {
        self.ledger.take_fold()
    }

    /// Close the session this invocation opened (with the pending outcome,
    /// in one transaction) and checkpoint.
    pub fn finish(mut self) -> Result<(), Error> {
        self.close_out(payload::to_value(&payload::SessionClosed::default()))
    }

    /// [`finish`](Self::finish), the close entry carrying how the session
    /// ended (its outcome, why, its turns).
    pub fn finish_as(mut self, end: &retie_ledger::provider::SessionEnd) -> Result<(), Error> {
        self.close_out(payload::to_value(&payload::SessionClosed {
            end: Some(end.clone()),
        }))
    }

    /// [`finish`](Self::finish) in a process that exits right after: the
    /// ledger's connection is left for the exit to close. Everything is
    /// committed by then, and SQLite's close would only free its memory,
    /// unmap the WAL index (a TLB shootdown on the CPU the run's other
    /// thread used) and drop locks the exit drops anyway: 0.04 ms of every
    /// `retie sandbox exec` (issue 10). The WAL is never checkpointed at
    /// close (see `Ledger::open`), so nothing is skipped on disk. The rest
    /// (the user key, zeroed as it drops, and the ledger's own copy of it;
    /// the session's lock) drops here.
    pub fn finish_at_exit(mut self) -> Result<(), Error> {
        let r = self.close_out(payload::to_value(&payload::SessionClosed::default()));
        let Recorder { ledger, .. } = self;
        ledger.leave_to_exit();
        r
    }

    fn close_out(&mut self, closed: Value) -> Result<(), Error> {
        let had_open = self.session.pending_open.is_some();
        let had_queued = !self.queued.is_empty();
        // A session that never reached a durable point but has messages
        // (the model answered at once) is opened here, then closed.
        // Only an outcome and the close: they may wait for the next
        // durable point when the outcome may.
        let durability = if !had_queued && self.outcome_deferred {
            Durability::Deferred
        } else {
            Durability::Now
        };
        let mut entries = if had_queued {
            self.opening()
        } else {
            let mut e = Vec::new();
            if let Some(o) = self.pending_outcome.take() {
                e.push(self.entry(Actor::Agent, Kind::Outcome, o));
            }
            e
        };
        let opened_here = !self.session.joined
            && (self.session.pending_open.is_none() && (!had_open || had_queued));
        if opened_here {
            entries.push(self.entry(Actor::Person, Kind::SessionClosed, closed));
        }
        if entries.is_empty() {
            return Ok(());
        }
        self.ledger.append_batch_with(durability, |_| entries)?;
        self.ledger.checkpoint(&self.user)?;
        Ok(())
    }
}

/// What follows a pending approval's decision in its transaction.
#[derive(Debug, Clone)]
pub enum Then {
    /// The intent: the action runs (the recorder adds the session's call
    /// fields and the bindings).
    Intent(payload::Intent),
    /// The refusal: it never runs.
    Refusal(payload::Refusal),
    /// Nothing yet (an edit: the edited action is dispatched next).
    Nothing,
}

/// The decision of a pending approval, as [`Recorder::decide`] writes it.
#[derive(Debug, Clone)]
pub struct PendingDecision {
    pub proposal: i64,
    pub pending: i64,
    /// The decision's payload when this process decides now; `None` when
    /// it was recorded earlier (`recorded_decision` names it).
    pub decision: Option<Value>,
    /// Signed by the user key as the person (an answer at the terminal),
    /// else as the policy (a grant answered it).
    pub by_person: bool,
    pub recorded_decision: Option<i64>,
    /// A grant the person made with this decision.
    pub grant: Option<Value>,
    pub grant_keys: Option<Vec<String>>,
    pub grant_by: String,
    pub then: Then,
}

/// A session's state as its entries tell it.
#[derive(Debug, Clone, Default)]
pub struct SessionState {
    /// Its last opening, resume, suspension or close was a close.
    pub closed: bool,
    /// Its last was a suspension.
    pub suspended: bool,
    pub grants: Vec<Grant>,
    pub open_pending: Option<OpenPending>,
}

impl SessionState {
    /// Read a session's rows (in seq order).
    pub fn of(rows: &[Row]) -> SessionState {
        let mut st = SessionState::default();
        let mut pending: Option<OpenPending> = None;
        for r in rows {
            let Some(k) = Kind::parse(&r.kind) else {
                continue;
            };
            match k {
                Kind::SessionOpened | Kind::Resumed => {
                    st.closed = false;
                    st.suspended = false;
                }
                Kind::SessionClosed => {
                    // A closed session has no open approval: nothing can
                    // resume it to carry one out.
                    st.closed = true;
                    st.suspended = false;
                    pending = None;
                }
                Kind::Suspended => st.suspended = true,
                // Typed (retie_ledger::payload): an ill-typed entry is
                // none of these (`retie verify`, which resume runs
                // first, names it).
                Kind::Pending => {
                    let p = r.payload_json();
                    if let Ok(t) = payload::parse::<payload::Pending>(&p) {
                        pending = Some(OpenPending {
                            seq: r.seq,
                            proposal: t.proposal,
                            digest: t.digest,
                            payload: p,
                            decision: None,
                        });
                    }
                }
                Kind::Decision => {
                    let p = r.payload_json();
                    if let Ok(d) = payload::parse::<payload::Decision>(&p) {
                        if let Some(op) = pending.as_mut() {
                            if d.pending == Some(op.seq) {
                                op.decision = Some((r.seq, p));
                            }
                        }
                    }
                }
                Kind::Intent | Kind::Refusal => {
                    // The decision was carried out: no longer open. (Both
                    // carry the session's call fields; verify checks the
                    // kinds' own fields.)
                    let bound = payload::parse::<payload::CallFields>(&r.payload_json())
                        .ok()
                        .and_then(|c| c.pending);
                    if pending.as_ref().is_some_and(|op| bound == Some(op.seq)) {
                        pending = None;
                    }
                }
                Kind::Grant => {
                    if let Ok(g) = payload::parse::<payload::Grant>(&r.payload_json()) {
                        st.grants.push(Grant {
                            seq: r.seq,
                            keys: g.keys,
                            by: g.by,
                        });
                    }
                }
                Kind::Revoke => {
                    if let Ok(v) = payload::parse::<payload::Revoke>(&r.payload_json()) {
                        st.grants.retain(|x| x.seq != v.grant);
                    }
                }
                _ => {}
            }
        }
        // An edit decided: the pending approval is answered (the edited
        // action is a new proposal).
        if let Some(op) = &pending {
            if op
                .decision
                .as_ref()
                .is_some_and(|(_, d)| d.get("verdict").and_then(Value::as_str) == Some("edit"))
                && rows.iter().any(|r| {
                    r.seq > op.seq
                        && r.kind == Kind::Proposed.as_bytes()
                        && payload::parse::<payload::Proposed>(&r.payload_json())
                            .is_ok_and(|p| p.edit_of == Some(op.seq))
                })
            {
                pending = None;
            }
        }
        st.open_pending = pending;
        st
    }
}

/// A session's lock: `LEDGER.sessions/SESSION.lock`, an exclusive
/// `flock` held by the process running the session for as long as it
/// runs. The kernel drops it when the process dies, however it dies, so
/// "held" means running and "not held" with the session neither closed
/// nor suspended means crashed. The file holds the pid, for people.
#[derive(Debug)]
pub struct SessionLock {
    _file: std::fs::File,
}

/// Where a session's lock lives.
pub fn lock_path(ledger: &Path, session: &str) -> PathBuf {
    retie_ledger::sidecar(ledger, ".sessions").join(format!("{session}.lock"))
}

impl SessionLock {
    /// Take the lock, or say which process holds it.
    pub fn acquire(ledger: &Path, session: &str) -> Result<SessionLock, Error> {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let path = lock_path(ledger, session);
        if let Some(d) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
                .map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut pid = String::new();
                let _ = f.read_to_string(&mut pid);
                return Err(Error::Ledger(retie_ledger::Error::Session {
                    session: session.into(),
                    why: format!(
                        "it is running in another process (pid {}); wait for it to end or stop it first",
                        pid.trim()
                    ),
                }));
            }
            Err(e) => {
                return Err(Error::io(
                    format!("locking {}", path.display()),
                    std::io::Error::from(e),
                ))
            }
        }
        let _ = f.set_len(0);
        let _ = f.rewind();
        let _ = write!(f, "{}", std::process::id());
        Ok(SessionLock { _file: f })
    }

    /// Is the session running in some process right now: its local lock
    /// held, or, on a shared ledger, its claim held on the server (by a
    /// process on any machine)? A server that cannot say is "not held",
    /// as a lock file that cannot be opened is.
    pub fn held_in(ledger: &Ledger, path: &Path, session: &str) -> bool {
        Self::held(path, session) || ledger.session_claimed(session).unwrap_or(false)
    }

    /// Is the session's local lock held by some process of this machine
    /// right now?
    pub fn held(ledger: &Path, session: &str) -> bool {
        let Ok(f) = std::fs::File::open(lock_path(ledger, session)) else {
            return false;
        };
        match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared) {
            Ok(()) => false,
            Err(e) => e == rustix::io::Errno::WOULDBLOCK,
        }
    }
}

/// On a shared ledger (PostgreSQL), the session's claim on the server
/// beside the local `flock`: a process on another machine running the
/// same session holds it, and this one is refused, so a decided approval
/// is carried out once whichever machines resume it (ADR 0461).
fn claim_shared(ledger: &Ledger, session: &str) -> Result<(), Error> {
    if ledger.claim_session(session)? {
        return Ok(());
    }
    Err(Error::Ledger(retie_ledger::Error::Session {
        session: session.into(),
        why: "it is running in another process on another machine (its lock on the shared ledger is held); wait for it to end or stop it first".into(),
    }))
}

/// Rejoin a session (`--session S`): its delegation must not have expired.
fn join_session(ledger: &Ledger, user: &SigningKey, id: &str) -> Result<Session, Error> {
    join_or_renew(ledger, user, id, false).map(|(s, _)| s)
}

/// Join session `id`; with `renew`, a delegation that expired (a session
/// suspended for longer than [`SESSION_TTL_MS`]) or has less than half
/// its time left is renewed: a new delegation of the same key, signed by
/// the user key (the person resuming it), returned to be recorded before
/// the key signs anything.
fn join_or_renew(
    ledger: &Ledger,
    user: &SigningKey,
    id: &str,
    renew: bool,
) -> Result<(Session, Option<Delegation>), Error> {
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
    if !rows
        .iter()
        .any(|r| r.kind == Kind::SessionOpened.as_bytes())
    {
        return Err(err("no such session in this ledger").into());
    }
    // The newest delegation the user key gave this session (its opening,
    // or a renewal).
    let user_hex = retie_ledger::hex(user.verifying_key().as_bytes());
    let d: Delegation = rows
        .iter()
        .rev()
        .filter(|r| {
            r.kind == Kind::SessionOpened.as_bytes() || r.kind == Kind::Delegation.as_bytes()
        })
        .filter_map(|r| {
            r.payload_json()
                .get("delegation")
                .cloned()
                .and_then(|v| serde_json::from_value::<Delegation>(v).ok())
        })
        .find(|d| d.parent == user_hex)
        .ok_or_else(|| err("its delegation is unreadable"))?;
    let mut renewal = None;
    if renew && d.not_after_ms - now_ms() < SESSION_TTL_MS / 2 {
        let key = keys::session_key(user, id);
        if retie_ledger::hex(key.verifying_key().as_bytes()) == d.key {
            renewal = Some(Delegation::issue(
                user,
                &key.verifying_key(),
                id,
                &d.workspace,
                &d.effects.iter().map(String::as_str).collect::<Vec<_>>(),
                now_ms() + SESSION_TTL_MS,
            ));
        }
    } else if d.not_after_ms < now_ms() {
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
    Ok((
        Session {
            id: id.into(),
            key,
            pending_open: None,
            joined: true,
        },
        renewal,
    ))
}

fn new_id() -> String {
    retie_snapshot::new_id()
}

fn set(v: &mut Value, key: &str, val: Value) {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.into(), val);
    }
}

/// Bind an intent or refusal to its proposal (pending approval,
/// decision): `fields`' set fields win.
fn bind(payload: &mut Value, fields: payload::CallFields) {
    merge(payload, payload::to_value(&fields));
}

fn proposal_of(seq: i64) -> payload::CallFields {
    payload::CallFields {
        proposal: Some(seq),
        ..payload::CallFields::default()
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
    // `STAGE` sleeps 60 s (to be killed there); `STAGE:SECS` sleeps SECS.
    let Ok(v) = std::env::var("RETIE_LEDGER_STALL") else {
        return;
    };
    let (at, secs) = match v.split_once(':') {
        Some((at, secs)) => (at, secs.parse().unwrap_or(60)),
        None => (v.as_str(), 60),
    };
    if at == stage {
        eprintln!("retie: ledger stall at {stage}");
        std::thread::sleep(std::time::Duration::from_secs(secs));
    }
}

#[cfg(not(debug_assertions))]
fn stall(_stage: &str) {}

/// Who proposed an action, for the actor of its proposal and intent: the
/// person for the operator's own command at a retest's prompt
/// ([`crate::OPERATOR_ORIGIN`]), else the agent.
fn proposer(proposed: &payload::Proposed) -> Actor {
    if proposed.origin == crate::OPERATOR_ORIGIN {
        Actor::Person
    } else {
        Actor::Agent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, kind: Kind, payload: Value) -> Row {
        Row {
            seq,
            time_ms: 0,
            session: b"s".to_vec(),
            actor: b"agent".to_vec(),
            kind: kind.as_bytes().to_vec(),
            payload: payload.to_string().into_bytes(),
            prev: Vec::new(),
            hash: Vec::new(),
            signer: Vec::new(),
            sig: Vec::new(),
        }
    }

    /// Issue 33.1: a ledger where a session closed with its pending
    /// approval never carried out (written by a version that let a
    /// looser resume run past it) lists no open approval: `retie
    /// pending` does not show a finished session.
    #[test]
    fn a_closed_session_has_no_open_pending_approval() {
        let mut rows = vec![
            row(1, Kind::SessionOpened, json!({})),
            row(
                2,
                Kind::Pending,
                json!({"proposal": 1, "digest": "ab", "action": {}}),
            ),
            row(3, Kind::Suspended, json!({})),
        ];
        let st = SessionState::of(&rows);
        assert!(st.suspended && st.open_pending.is_some());
        rows.push(row(4, Kind::Resumed, json!({})));
        rows.push(row(5, Kind::SessionClosed, json!({})));
        let st = SessionState::of(&rows);
        assert!(st.closed);
        assert!(st.open_pending.is_none(), "{:?}", st.open_pending);
    }
}
