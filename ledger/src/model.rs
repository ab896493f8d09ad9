//! Sessions and actions as read back from the entries (for log, replay
//! and undo).

use retie_display::{shell_line, visible};
use serde::Serialize;
use serde_json::Value;

use super::{Kind, Row};
use crate::payload::Status;

/// One action: an intent and what followed it.
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    /// The intent entry's seq: the action's id.
    pub id: i64,
    pub session: String,
    pub time_ms: i64,
    pub intent: Value,
    /// The outcome entry's payload; `None` if the writer died before it.
    pub outcome: Option<Value>,
    pub outcome_time_ms: Option<i64>,
    /// Undo entries recorded for it, oldest first.
    pub undos: Vec<Value>,
    /// The exact changes it was about to make, recorded right before.
    pub changes: Option<Value>,
}

impl Action {
    /// Its intent as the typed payload (`None`: ill-typed, which `retie
    /// verify` names).
    pub fn typed_intent(&self) -> Option<crate::payload::Intent> {
        crate::payload::parse(&self.intent).ok()
    }
    /// The tool, for display (control characters escaped).
    pub fn tool(&self) -> String {
        visible(
            self.intent
                .get("tool")
                .and_then(Value::as_str)
                .unwrap_or("?"),
        )
    }
    /// The command line, quoted so it pastes back into a shell, control
    /// characters shown as `$'…'` escapes.
    pub fn command(&self) -> String {
        self.intent
            .get("command")
            .and_then(Value::as_array)
            .map(|a| {
                let args: Vec<&str> = a.iter().map(|s| s.as_str().unwrap_or("?")).collect();
                shell_line(&args)
            })
            .unwrap_or_default()
    }
    /// The changeset an undo of this action rolls back: the one recorded
    /// right before the changes were made, else the intent's plan.
    pub fn undo_changeset(&self) -> Option<&str> {
        self.changes
            .as_ref()
            .and_then(|c| c.pointer("/undo/changeset"))
            .or_else(|| self.intent.pointer("/undo/changeset"))
            .and_then(Value::as_str)
    }
    pub fn reversible(&self) -> bool {
        self.intent
            .pointer("/undo/reversible")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
    /// The outcome's word ([`crate::payload::Status`]), or `interrupted`
    /// when the writer died before the outcome.
    pub fn status(&self) -> &'static str {
        match &self.outcome {
            None => "interrupted",
            Some(o) => o
                .get("status")
                .and_then(Value::as_str)
                .and_then(crate::payload::Status::from_stored)
                .map_or("failed", crate::payload::Status::word),
        }
    }
    /// An undo can do something: reversible, applied to the workspace
    /// (not timed out, kept, discarded, refused), a changeset to roll
    /// back, and not undone yet. What `undo last` picks.
    pub fn undoable(&self) -> bool {
        self.reversible()
            && self.status() == "applied"
            && self.undo_changeset().is_some()
            && !self.undone()
    }
    /// The workspace the action worked in (raw, for comparison).
    pub fn workspace_path(&self) -> Option<&str> {
        self.intent.get("workspace").and_then(Value::as_str)
    }
    /// An undo of it succeeded: an `undo` entry (older ledgers) saying
    /// `result: undone`, or the outcome of an undo action (its own
    /// intent, tool `undo`) saying `status: undone`.
    pub fn undone(&self) -> bool {
        self.undos.iter().any(|u| {
            u.get("result").and_then(Value::as_str) == Some("undone")
                || u.get("status").and_then(Value::as_str) == Some(Status::Undone.word())
        })
    }
    /// The action this one undoes, when it is an undo (issue 27 item 2).
    pub fn undoes(&self) -> Option<i64> {
        if self.intent.get("tool").and_then(Value::as_str) != Some("undo") {
            return None;
        }
        self.intent.get("undoes").and_then(Value::as_i64)
    }
    pub fn flags(&self) -> Vec<String> {
        self.intent
            .get("flags")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|s| s.as_str().map(visible)).collect())
            .unwrap_or_default()
    }
}

/// One session.
#[derive(Debug, Clone, Serialize)]
pub struct Session {
    pub id: String,
    pub opened_ms: i64,
    pub closed_ms: Option<i64>,
    pub last_ms: i64,
    pub opened: Value,
    pub actions: Vec<Action>,
    pub refusals: Vec<Value>,
    pub turns: u64,
    /// Approvals the gate asked a person for: the pending entry, and the
    /// decision when one was made.
    pub approvals: Vec<Approval>,
    /// Grants ("always for this session"), with their revocation if any.
    pub grants: Vec<GrantSeen>,
    /// Times the session was suspended and resumed.
    pub suspended: u64,
    pub resumed: u64,
    /// Failed attempts at model turns, in order (time, payload).
    pub provider_attempts: Vec<(i64, crate::provider::ProviderAttempt)>,
    /// How it ended: the last close (or provider suspension) that says.
    pub end: Option<crate::provider::SessionEnd>,
}

/// A pending approval and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct Approval {
    /// The pending entry's seq.
    pub pending: i64,
    pub time_ms: i64,
    pub payload: Value,
    pub decision: Option<Value>,
}

impl Approval {
    /// Tool and arguments, for display (escaped).
    pub fn action(&self) -> String {
        visible(&format!(
            "{} {}",
            self.payload
                .pointer("/action/tool")
                .and_then(Value::as_str)
                .unwrap_or("?"),
            self.payload
                .pointer("/action/args")
                .map(|a| a.to_string())
                .unwrap_or_default()
        ))
    }
    /// `approve by X`, `deny by X: REASON`, `edit by X: ARGS`, or
    /// `pending` (escaped).
    pub fn verdict(&self) -> String {
        let Some(d) = &self.decision else {
            return "pending".into();
        };
        let f = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
        visible(&match f("verdict").as_str() {
            "deny" => format!("deny by {}: {}", f("decided_by"), f("deny_reason")),
            "edit" => format!(
                "edit by {}: {}",
                f("decided_by"),
                d.get("edited_arguments")
                    .map(|a| a.to_string())
                    .unwrap_or_default()
            ),
            v => format!("{v} by {}", f("decided_by")),
        })
    }
}

/// A grant as recorded.
#[derive(Debug, Clone, Serialize)]
pub struct GrantSeen {
    pub seq: i64,
    pub keys: Vec<String>,
    pub revoked: bool,
}

impl Session {
    /// The workspace, for display (control characters escaped).
    pub fn workspace(&self) -> String {
        visible(
            self.opened
                .pointer("/delegation/workspace")
                .and_then(Value::as_str)
                .unwrap_or(""),
        )
    }
    /// The workspace (raw, for comparison).
    pub fn workspace_path(&self) -> Option<&str> {
        self.opened
            .pointer("/delegation/workspace")
            .and_then(Value::as_str)
    }
    /// What kind of session it is, from the origin its opening recorded
    /// (see [`session_kind`]).
    pub fn kind(&self) -> &'static str {
        session_kind(&self.opened)
    }
    /// An agent (or retest) session whose provider failed before its
    /// first turn: no turn, no action, no approval, ended by the
    /// provider (refused, or suspended after failed attempts). `retie
    /// sessions` and `retie log` fold these into one line (ADR 0525).
    pub fn failed_before_first_turn(&self) -> bool {
        matches!(self.kind(), "agent" | "retest")
            && self.turns == 0
            && self.actions.is_empty()
            && self.approvals.is_empty()
            && self
                .end
                .as_ref()
                .is_some_and(|e| matches!(e.outcome.as_str(), "provider_failed" | "suspended"))
    }
    /// A session of `retie undo`/`undo-all`: its actions are undos.
    pub fn is_undo(&self) -> bool {
        session_kind(&self.opened) == "undo"
    }
    /// The objective, for display (control characters escaped).
    pub fn objective(&self) -> String {
        visible(
            &crate::payload::parse::<crate::payload::SessionOpened>(&self.opened)
                .ok()
                .and_then(|o| o.objective)
                .unwrap_or_default(),
        )
    }
}

/// The kind of a session, from its `session_opened` payload's origin:
/// `exec` (`retie sandbox exec`), `agent` (`retie run`), `retest`,
/// `undo`, `apply` (`retie changes apply`), `probe`; `other` for an
/// origin this build does not know.
pub fn session_kind(opened: &Value) -> &'static str {
    // An ill-typed opening is `other` (`retie verify` names it).
    let origin = crate::payload::parse::<crate::payload::SessionOpened>(opened)
        .ok()
        .and_then(|o| o.origin);
    match origin.as_deref() {
        Some("retie sandbox exec") => "exec",
        Some("retie run") => "agent",
        Some("retie retest") => "retest",
        Some("retie undo") => "undo",
        Some("retie changes apply") => "apply",
        Some("retie probe") => "probe",
        _ => "other",
    }
}

/// Group rows into sessions, in the order they were opened.
pub fn sessions(rows: &[Row]) -> Vec<Session> {
    let mut out: Vec<Session> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for r in rows {
        let k = Kind::parse(&r.kind);
        // A turn: an assistant message (older ledgers: a `turn` entry).
        let turn = r.kind == b"turn"
            || (k == Some(Kind::Message)
                && crate::payload::of_row::<crate::payload::Message>(r)
                    .is_ok_and(|m| m.role() == Some("assistant")));
        let sid = r.session_str();
        if k == Some(Kind::SessionOpened) {
            index.insert(sid.clone(), out.len());
            out.push(Session {
                id: sid,
                opened_ms: r.time_ms,
                closed_ms: None,
                last_ms: r.time_ms,
                opened: r.payload_json(),
                actions: Vec::new(),
                refusals: Vec::new(),
                turns: 0,
                approvals: Vec::new(),
                grants: Vec::new(),
                suspended: 0,
                resumed: 0,
                provider_attempts: Vec::new(),
                end: None,
            });
            continue;
        }
        let Some(&i) = index.get(&sid) else { continue };
        let s = &mut out[i];
        s.last_ms = s.last_ms.max(r.time_ms);
        let p = r.payload_json();
        if turn {
            s.turns += 1;
            continue;
        }
        let Some(k) = k else { continue };
        match k {
            Kind::Intent => s.actions.push(Action {
                id: r.seq,
                session: s.id.clone(),
                time_ms: r.time_ms,
                intent: p,
                outcome: None,
                outcome_time_ms: None,
                undos: Vec::new(),
                changes: None,
            }),
            Kind::Changes => {
                let target = p.get("action").and_then(Value::as_i64);
                if let Some(a) = s.actions.iter_mut().find(|a| Some(a.id) == target) {
                    a.changes = Some(p);
                }
            }
            Kind::Outcome | Kind::Undo => {
                let target = p.get("action").and_then(Value::as_i64);
                if let Some(a) = s.actions.iter_mut().find(|a| Some(a.id) == target) {
                    if k == Kind::Outcome {
                        a.outcome = Some(p);
                        a.outcome_time_ms = Some(r.time_ms);
                    } else {
                        a.undos.push(p);
                    }
                }
            }
            Kind::Refusal => s.refusals.push(p),
            Kind::Pending => s.approvals.push(Approval {
                pending: r.seq,
                time_ms: r.time_ms,
                payload: p,
                decision: None,
            }),
            Kind::Decision => {
                let target = p.get("pending").and_then(Value::as_i64);
                if let Some(a) = s.approvals.iter_mut().find(|a| Some(a.pending) == target) {
                    a.decision = Some(p);
                }
            }
            Kind::Grant => s.grants.push(GrantSeen {
                seq: r.seq,
                keys: p
                    .get("keys")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|k| k.as_str().map(visible)).collect())
                    .unwrap_or_default(),
                revoked: false,
            }),
            Kind::Revoke => {
                let target = p.get("grant").and_then(Value::as_i64);
                if let Some(g) = s.grants.iter_mut().find(|g| Some(g.seq) == target) {
                    g.revoked = true;
                }
            }
            Kind::Suspended => {
                s.suspended += 1;
                s.end = crate::payload::parse::<crate::payload::Suspended>(&p)
                    .ok()
                    .and_then(|x| x.end);
            }
            Kind::Resumed => {
                s.resumed += 1;
                s.end = None;
            }
            Kind::SessionClosed => {
                s.closed_ms = Some(r.time_ms);
                s.end = crate::payload::parse::<crate::payload::SessionClosed>(&p)
                    .ok()
                    .and_then(|x| x.end);
            }
            Kind::ProviderAttempt => {
                if let Some(a) = crate::provider::ProviderAttempt::from_payload(&p) {
                    s.provider_attempts.push((r.time_ms, a));
                }
            }
            _ => {}
        }
    }
    link_undos(&mut out);
    out
}

/// An undo is an action of its own session (`retie undo`); its outcome
/// is also listed under the action it undid, in the order recorded.
fn link_undos(sessions: &mut [Session]) {
    let mut found: Vec<(i64, i64, Value)> = Vec::new();
    for a in sessions.iter().flat_map(|s| s.actions.iter()) {
        if let (Some(target), Some(o)) = (a.undoes(), &a.outcome) {
            let mut o = o.clone();
            if let Some(m) = o.as_object_mut() {
                m.insert("undo_action".into(), Value::from(a.id));
            }
            found.push((a.id, target, o));
        }
    }
    if found.is_empty() {
        return;
    }
    let mut index = std::collections::HashMap::new();
    for (i, s) in sessions.iter().enumerate() {
        for (j, a) in s.actions.iter().enumerate() {
            index.insert(a.id, (i, j));
        }
    }
    for (id, target, o) in found {
        if let Some(&(i, j)) = index.get(&target) {
            // An undo names an earlier action only.
            if target < id {
                sessions[i].actions[j].undos.push(o);
            }
        }
    }
}
