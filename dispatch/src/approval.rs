//! A person's decision on a pending approval, written by one function
//! (issue 27 item 2): the terminal prompt's y/n/e/a (through
//! [`crate::dispatch`], which asks the [`crate::Approver`]) and `retie
//! approve`/`deny` from another process ([`decide_pending`]) build the
//! decision entry with [`decision`] and append it guarded by the pending
//! approval still being the session's open, undecided one. The CLI and the
//! agent's prompt only parse the answer and render what was written.

use std::path::Path;

use retie_display::visible;
use retie_ledger::payload::{self, Decision};
use retie_ledger::{keys, Actor, Guard, Kind, Ledger, NewEntry};
use serde_json::{json, Map, Value};

use crate::record::{OpenPending, SessionState};
use crate::Error;

/// What the person answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Run exactly what was shown.
    Approve,
    /// Run it, and grant its keys for the rest of the session.
    Always,
    /// Do not run it; the reason goes back to the model.
    Deny(String),
    /// Run these arguments instead (classified and gated again).
    Edit(Map<String, Value>),
}

impl Answer {
    /// The verdict word recorded: `approve`, `deny`, `edit`.
    pub fn verdict(&self) -> &'static str {
        match self {
            Answer::Approve | Answer::Always => "approve",
            Answer::Deny(_) => "deny",
            Answer::Edit(_) => "edit",
        }
    }
}

/// The decision entry's payload for `answer`, by `by`, on an action of
/// `class` that asked because of `reason`, whose shown digest is
/// `digest` (hex). The one place a decision's fields are spelled; the
/// pending and proposal entries it answers are set by the writer.
pub fn decision(answer: &Answer, by: &str, class: Value, reason: Value, digest: &str) -> Value {
    payload::to_value(&Decision {
        verdict: answer.verdict().into(),
        decided_by: by.into(),
        class,
        reason,
        shown_digest: Some(digest.into()),
        approved_digest: match answer {
            Answer::Approve | Answer::Always => Some(digest.into()),
            _ => None,
        },
        deny_reason: match answer {
            Answer::Deny(why) => Some(why.clone()),
            _ => None,
        },
        edited_arguments: match answer {
            Answer::Edit(args) => Some(args.clone()),
            _ => None,
        },
        pending: None,
        proposal: None,
    })
}

/// A grant entry's payload: `keys` granted by `by` with pending `pending`.
/// The writer sets `decision` (the decision entry's seq) in the append's
/// transaction.
pub fn grant(keys: &[String], by: &str, pending: i64) -> Value {
    payload::to_value(&payload::Grant {
        keys: keys.to_vec(),
        by: by.into(),
        pending,
        decision: 0,
    })
}

/// What [`decide_pending`] wrote.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The pending approval decided.
    pub pending: i64,
    /// The decision entry's seq.
    pub entry: i64,
    /// The digest it bound (what was shown).
    pub digest: String,
}

/// Decide session `session`'s open pending approval from another process
/// (`retie approve`/`deny`): the ledger must verify; `want_digest`, when
/// given, must be the pending action's; `answer` reads the pending
/// approval (an edit is parsed against its action) and says what the
/// person decided. The decision (and a grant with `Always`) is appended
/// only while that approval is still open and undecided, checked inside
/// the append's transaction. Every refusal is an [`Error::Invalid`] saying
/// why; nothing is written then.
pub fn decide_pending(
    path: &Path,
    session: &str,
    want_digest: Option<&str>,
    by: &str,
    answer: impl FnOnce(&OpenPending) -> Result<Answer, String>,
) -> Result<Decided, Error> {
    let invalid = |m: String| Error::Invalid(m);
    if !retie_ledger::exists(path) {
        return Err(invalid(format!("no ledger at {}", path.display())));
    }
    // A decision is written only into a ledger that verifies.
    let report = retie_ledger::verify::verify(path)?;
    if !report.intact || report.complete == Some(false) {
        return Err(invalid(format!(
            "the ledger {} does not verify ({}): no decision written. `retie verify` shows what is wrong",
            path.display(),
            report
                .first_bad
                .map(|b| b.what)
                .or(report.incomplete_because)
                .unwrap_or_else(|| report.verdict.into())
        )));
    }
    let user = keys::user_key()?;
    let mut l = Ledger::open(path, false, Some(&user))?;
    l.check_user_key(&user)?;
    let rows = l.session_rows(session)?;
    let sid = visible(session);
    if !rows
        .iter()
        .any(|r| r.kind == Kind::SessionOpened.as_bytes())
    {
        return Err(invalid(format!(
            "no session {sid} in the ledger {} (`retie pending` lists the pending approvals)",
            path.display()
        )));
    }
    let st = SessionState::of(&rows);
    let op: OpenPending = match st.open_pending {
        Some(op) => op,
        None => {
            let last = rows
                .iter()
                .rev()
                .find(|r| r.kind == Kind::Pending.as_bytes())
                .map(|r| r.seq);
            return Err(invalid(match (last, st.closed) {
                (None, _) => format!("session {sid} has no pending approval"),
                (Some(p), true) => format!(
                    "session {sid} moved on: its pending approval {p} was decided and carried out, and the session is finished"
                ),
                (Some(p), false) => format!(
                    "session {sid} moved on: its last pending approval {p} was decided and carried out; nothing waits for a decision"
                ),
            }));
        }
    };
    if let Some((seq, d)) = &op.decision {
        return Err(invalid(format!(
            "pending approval {} of session {sid} was already decided (entry {seq}: {} by {}); `retie run --resume {sid}` carries it out",
            op.seq,
            visible(d.get("verdict").and_then(Value::as_str).unwrap_or("?")),
            visible(d.get("decided_by").and_then(Value::as_str).unwrap_or("?"))
        )));
    }
    if let Some(want) = want_digest {
        if want != op.digest {
            return Err(invalid(format!(
                "the pending action's digest is {}, not {}: it is not what you read; nothing written",
                op.digest,
                visible(want)
            )));
        }
    }
    let answer = answer(&op).map_err(invalid)?;
    let keys: Vec<String> = op
        .payload
        .get("grant_keys")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|k| k.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if answer == Answer::Always && keys.is_empty() {
        return Err(invalid(
            "this action cannot be granted \"always\" (a shell line that is not plain has no exact prefix); approve it once instead".into(),
        ));
    }
    let mut payload = decision(
        &answer,
        by,
        op.payload.get("class").cloned().unwrap_or(Value::Null),
        op.payload.get("reason").cloned().unwrap_or(Value::Null),
        &op.digest,
    );
    payload["pending"] = json!(op.seq);
    payload["proposal"] = json!(op.proposal);
    let mut entries = vec![NewEntry {
        session: session.to_string(),
        actor: Actor::Person,
        kind: Kind::Decision,
        payload,
        key: user.clone(),
    }];
    if answer == Answer::Always {
        entries.push(NewEntry {
            session: session.to_string(),
            actor: Actor::Person,
            kind: Kind::Grant,
            payload: grant(&keys, by, op.seq),
            key: user.clone(),
        });
    }
    let guard = Guard::OpenPending {
        session: session.to_string(),
        pending: op.seq,
    };
    let appended = l
        .append_batch_guarded(Some(&guard), |first| {
            if let Some(g) = entries.get_mut(1) {
                g.payload["decision"] = json!(first);
            }
            entries
        })
        .map_err(|e| match e {
            retie_ledger::Error::Conflict { why, .. } => {
                invalid(format!("session {sid}: {why}; nothing written"))
            }
            e => e.into(),
        })?;
    l.checkpoint(&user)?;
    Ok(Decided {
        pending: op.seq,
        entry: appended.first().map(|a| a.seq).unwrap_or_default(),
        digest: op.digest,
    })
}

/// Take back grant `grant` of session `session`, which is not running (a
/// running session revokes through its own recorder): a `revoke` entry
/// signed by the person.
pub fn revoke(path: &Path, session: &str, grant: i64, by: &str) -> Result<(), Error> {
    let sid = visible(session);
    let user = keys::user_key()?;
    let mut l = Ledger::open(path, false, Some(&user))?;
    l.check_user_key(&user)?;
    if crate::record::SessionLock::held_in(&l, path, session) {
        return Err(Error::Invalid(format!(
            "session {sid} is running: revoke the grant in it (/approvals), or stop it first"
        )));
    }
    let rows = l.session_rows(session)?;
    let st = SessionState::of(&rows);
    if !st.grants.iter().any(|g| g.seq == grant) {
        return Err(Error::Invalid(format!(
            "session {sid} has no grant {grant} in force"
        )));
    }
    l.append_batch(|_| {
        vec![NewEntry {
            session: session.to_string(),
            actor: Actor::Person,
            kind: Kind::Revoke,
            payload: payload::to_value(&payload::Revoke {
                grant,
                by: by.into(),
            }),
            key: user.clone(),
        }]
    })?;
    l.checkpoint(&user)?;
    Ok(())
}
