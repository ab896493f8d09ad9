//! Typed payloads of the ledger's entry kinds (issue 27 item 3): one
//! serde struct per kind, in this one file, read by writers and readers
//! alike. A field the kind requires that is missing is an error, never a
//! fallback; where every version of retie wrote the same fields, unknown
//! fields are errors too (`deny_unknown_fields`). `retie verify` checks
//! every entry's payload against its kind with [`check`], so an entry
//! that was signed correctly but does not have its kind's shape (only
//! possible with a stolen key) is reported as "ill-typed payload at #N".
//!
//! Adding a kind: add the [`crate::Kind`] variant and its stored name,
//! add its struct here (required fields plain, optional ones
//! `#[serde(default, skip_serializing_if = "Option::is_none")]`,
//! `deny_unknown_fields` unless older ledgers wrote other fields), and
//! add its arm to [`check`]. Writers build the struct and store
//! [`to_value`]; readers call [`parse`].
//!
//! The encoding is the JSON the entries always had: old entries verify.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Kind;

/// The words of a decision's verdict.
pub const VERDICTS: &[&str] = &["run", "ask", "deny", "approve", "edit"];

/// `decision`: what the gate or a person decided. A policy decision
/// (`run`, `deny`, `ask` answered at once) names its proposal; a person's
/// decision on a pending approval (`approve`, `deny`, `edit`) also names
/// the pending entry and the digest that was shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub verdict: String,
    pub decided_by: String,
    pub class: Value,
    pub reason: Value,
    /// The digest the decision lets run (`null`: nothing runs).
    pub approved_digest: Option<String>,
    /// The digest of what the person was shown (a person's decision;
    /// required of an edit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_arguments: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<i64>,
}

impl Decision {
    /// The fields its verdict needs.
    pub fn check(&self) -> Result<(), String> {
        if !VERDICTS.contains(&self.verdict.as_str()) {
            return Err(format!("unknown verdict {:?}", self.verdict));
        }
        if self.pending.is_some() {
            // A person's decision binds what was shown: an approval its
            // approved digest, an edit the digest it was an edit of (the
            // chokepoint's approvals and denies of earlier versions wrote
            // no shown_digest: not required of them).
            match self.verdict.as_str() {
                "edit" if self.shown_digest.is_none() => {
                    return Err("an edit without shown_digest (the digest that was shown)".into())
                }
                "approve" if self.approved_digest.is_none() => {
                    return Err("an approval without approved_digest".into())
                }
                "deny" if self.deny_reason.is_none() => {
                    return Err("a person's deny without deny_reason".into())
                }
                "edit" if self.edited_arguments.is_none() => {
                    return Err("an edit without edited_arguments".into())
                }
                "run" | "ask" => {
                    return Err(format!(
                        "verdict {:?} on a pending approval (approve, deny or edit)",
                        self.verdict
                    ))
                }
                _ => {}
            }
        } else if matches!(self.verdict.as_str(), "edit") {
            return Err("an edit that names no pending approval".into());
        }
        Ok(())
    }
}

impl Decision {
    /// retie's own refusal before the gate (a call that does not fit its
    /// tool, a tool that could not be set up): verdict `deny`, class
    /// `unknown`.
    pub fn refused_by_retie(by: &str, reason: &str) -> Decision {
        Decision {
            verdict: "deny".into(),
            decided_by: by.into(),
            class: Value::from("unknown"),
            reason: Value::from(reason),
            approved_digest: None,
            shown_digest: None,
            deny_reason: None,
            edited_arguments: None,
            pending: None,
            proposal: None,
        }
    }
}

/// `grant`: "always, for this session, for these exact keys".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub keys: Vec<String>,
    pub by: String,
    /// The pending approval it was granted with.
    pub pending: i64,
    /// The decision entry it was granted with.
    pub decision: i64,
}

/// `revoke`: a grant taken back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revoke {
    pub grant: i64,
    pub by: String,
}

/// `pending`: an action the gate asks a person about, durable before the
/// question. Its other fields (the call's tool, command, reasons, undo
/// plan...) are for display.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// The frozen arguments' digest a decision must bind.
    pub digest: String,
    /// The action (tool, arguments, effects).
    pub action: Value,
    /// The proposal entry.
    pub proposal: i64,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// How an action ended: one word per outcome (issue 35 item 4, ADR
/// 0451), stored as the outcome's `status` and shown as is by `--json`,
/// `retie log`, `retie replay` and the live line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It ran (a tool answered, a command exited); nothing to apply.
    Ran,
    /// Its changes reached the workspace.
    Applied,
    /// A sandboxed command ran and changed nothing.
    Unchanged,
    /// Its changes were not applied (timed out, interrupted, discarded,
    /// kept for review): they wait in a kept run or are gone.
    NotApplied,
    /// The gate (the policy, or the person it asked) said no: it never
    /// ran. A `refusal` entry, not an outcome.
    RefusedByPolicy,
    /// The policy allowed it, but a guard stopped it when it ran: a path
    /// outside the workspace or in retie's own directories, a symlink, a
    /// file changed since it was read, a blocked path, the URL guard.
    RefusedByGuard,
    /// It was tried and failed (a missing file, an I/O error, a sandbox
    /// that could not start).
    Failed,
    /// An undo put the action's changes back.
    Undone,
    /// An undo had nothing to do (already undone, not reversible...).
    Skipped,
}

impl Status {
    pub const ALL: [Status; 9] = [
        Status::Ran,
        Status::Applied,
        Status::Unchanged,
        Status::NotApplied,
        Status::RefusedByPolicy,
        Status::RefusedByGuard,
        Status::Failed,
        Status::Undone,
        Status::Skipped,
    ];

    /// The stored word.
    pub fn word(self) -> &'static str {
        match self {
            Status::Ran => "ran",
            Status::Applied => "applied",
            Status::Unchanged => "unchanged",
            Status::NotApplied => "not_applied",
            Status::RefusedByPolicy => "refused_by_policy",
            Status::RefusedByGuard => "refused_by_guard",
            Status::Failed => "failed",
            Status::Undone => "undone",
            Status::Skipped => "skipped",
        }
    }

    /// The word read back, older ledgers' words included: an outcome
    /// `refused` was always a guard's (the gate's refusals are `refusal`
    /// entries, never outcomes), `not applied` is `not_applied`.
    pub fn from_stored(s: &str) -> Option<Status> {
        match s {
            "refused" => Some(Status::RefusedByGuard),
            "not applied" => Some(Status::NotApplied),
            w => Status::ALL.into_iter().find(|x| x.word() == w),
        }
    }

    /// It did what was asked (ran, applied, changed nothing, undone).
    pub fn succeeded(self) -> bool {
        matches!(
            self,
            Status::Ran | Status::Applied | Status::Unchanged | Status::Undone
        )
    }

    /// The tool's error text, as the agent's tools word it: a guard's
    /// refusal says `refused:` first; anything else failed.
    pub fn of_tool_error(text: &str) -> Status {
        if text.starts_with("refused") {
            Status::RefusedByGuard
        } else {
            Status::Failed
        }
    }
}

/// `outcome`: how an action ended. `status` is its word; the rest
/// depends on the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The action (its intent's seq).
    pub action: i64,
    pub status: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `undo` (ledgers before undo was an action): an undo's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UndoEntry {
    pub action: i64,
    pub result: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `changes`: the exact changes an action is about to make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Changes {
    pub action: i64,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `session_closed`: how the session ended. Sessions closed by `retie
/// sandbox exec` and older ones carry nothing (`{}`): `end` is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionClosed {
    #[serde(flatten)]
    pub end: Option<crate::provider::SessionEnd>,
}

/// `suspended`: the session stopped, to be resumed (`retie run
/// --resume`). Older entries may lack any field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Suspended {
    /// The pending approval it waits on; `None` when it stopped for
    /// another reason (its provider stayed unavailable: `end` says).
    #[serde(default)]
    pub pending: Option<i64>,
    /// The process that suspended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// How the session ended for now, when it was not an approval.
    #[serde(flatten)]
    pub end: Option<crate::provider::SessionEnd>,
}

/// `resumed`: a process took the session up again. Older entries may lack
/// any field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The pending approval it resumed with, if any.
    #[serde(default)]
    pub pending: Option<i64>,
    /// It took up a session that had been closed (`retie run --resume` of
    /// a finished session); older entries: absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reopened: Option<bool>,
}

/// `revoke`, `grant`... have their structs; kinds whose fields differ by
/// writer and version (intent, proposal, refusal, note, message, the
/// session's opening) must at least be a JSON object.
pub type Object = Map<String, Value>;

/// `member`: another machine's user key admitted to a shared ledger by
/// the ledger's owner (ADR 0460): from this entry on it may sign person
/// entries and checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The admitted public key, hex.
    pub key: String,
    /// Who asked (a name for people to read).
    pub by: String,
}

/// Read `payload` as `T`.
pub fn parse<T: DeserializeOwned>(payload: &Value) -> Result<T, String> {
    T::deserialize(payload).map_err(|e| e.to_string())
}

/// `T` as the stored JSON.
pub fn to_value<T: Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// A flattened `Option<SessionEnd>` reads as `None` when its fields do
/// not fit; a payload that carries any of them must carry all, well
/// typed.
fn end_fields(v: &Value) -> Result<(), String> {
    if ["outcome", "message", "turns"]
        .iter()
        .any(|k| v.get(k).is_some())
    {
        parse::<crate::provider::SessionEnd>(v).map(|_| ())
    } else {
        Ok(())
    }
}

/// Check one entry's payload against its kind. `Err` says what is wrong.
pub fn check(kind: Kind, payload: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(payload).map_err(|e| format!("not JSON: {e}"))?;
    fn obj(v: &Value) -> Result<(), String> {
        v.as_object()
            .map(|_| ())
            .ok_or_else(|| "not a JSON object".into())
    }
    match kind {
        Kind::Decision => parse::<Decision>(&v)?.check(),
        Kind::Grant => parse::<Grant>(&v).map(|_| ()),
        Kind::Revoke => parse::<Revoke>(&v).map(|_| ()),
        Kind::Pending => parse::<Pending>(&v).map(|_| ()),
        Kind::Outcome => {
            let o = parse::<Outcome>(&v)?;
            Status::from_stored(&o.status)
                .map(|_| ())
                .ok_or_else(|| format!("unknown outcome status {:?}", o.status))
        }
        Kind::Undo => parse::<UndoEntry>(&v).map(|_| ()),
        Kind::Member => parse::<Member>(&v).map(|_| ()),
        Kind::Changes => parse::<Changes>(&v).map(|_| ()),
        Kind::ProviderAttempt => crate::provider::ProviderAttempt::from_payload(&v)
            .map(|_| ())
            .ok_or_else(|| "not a provider attempt".into()),
        Kind::SessionClosed => obj(&v)
            .and_then(|_| end_fields(&v))
            .and_then(|_| parse::<SessionClosed>(&v).map(|_| ())),
        Kind::Suspended => obj(&v)
            .and_then(|_| end_fields(&v))
            .and_then(|_| parse::<Suspended>(&v).map(|_| ())),
        Kind::Resumed => obj(&v).and_then(|_| parse::<Resumed>(&v).map(|_| ())),
        Kind::LedgerOpened
        | Kind::SessionOpened
        | Kind::Delegation
        | Kind::Proposed
        | Kind::Intent
        | Kind::Refusal
        | Kind::Note
        | Kind::Message => obj(&v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn person(verdict: &str) -> Value {
        json!({
            "verdict": verdict, "decided_by": "person", "class": "irreversible",
            "reason": "asks", "approved_digest": null, "shown_digest": "ab",
            "pending": 3, "proposal": 2,
        })
    }

    #[test]
    fn an_edit_without_its_shown_digest_is_ill_typed() {
        let mut d = person("edit");
        d["edited_arguments"] = json!({"command": "ls"});
        check(Kind::Decision, d.to_string().as_bytes()).expect("well typed");
        d.as_object_mut().expect("object").remove("shown_digest");
        let e = check(Kind::Decision, d.to_string().as_bytes()).expect_err("ill-typed");
        assert!(e.contains("shown_digest"), "{e}");
    }

    /// The session's lifecycle kinds, typed: what this version writes
    /// reads back as itself; what older versions wrote (`{}`, or a
    /// suspension without its end) still reads; a field of the wrong type
    /// is ill-typed.
    #[test]
    fn lifecycle_entries_are_typed_and_old_shapes_still_read() {
        use crate::provider::SessionEnd;
        let end = SessionEnd {
            outcome: "provider_failed".into(),
            message: "the provider stayed unavailable".into(),
            turns: 3,
        };
        let written = [
            (
                Kind::Suspended,
                to_value(&Suspended {
                    pending: None,
                    pid: Some(42),
                    end: Some(end.clone()),
                }),
            ),
            (
                Kind::Suspended,
                to_value(&Suspended {
                    pending: Some(7),
                    pid: Some(42),
                    end: None,
                }),
            ),
            (
                Kind::Resumed,
                to_value(&Resumed {
                    pid: Some(43),
                    pending: Some(7),
                    reopened: Some(false),
                }),
            ),
            (
                Kind::SessionClosed,
                to_value(&SessionClosed {
                    end: Some(end.clone()),
                }),
            ),
            (Kind::SessionClosed, to_value(&SessionClosed::default())),
        ];
        for (kind, v) in &written {
            check(*kind, v.to_string().as_bytes()).unwrap_or_else(|e| panic!("{kind:?} {v}: {e}"));
        }
        // The exact JSON the writers spelled by hand before.
        assert_eq!(
            written[0].1,
            json!({"pending": null, "pid": 42, "outcome": "provider_failed", "message": "the provider stayed unavailable", "turns": 3})
        );
        assert_eq!(written[1].1, json!({"pending": 7, "pid": 42}));
        assert_eq!(
            written[2].1,
            json!({"pid": 43, "pending": 7, "reopened": false})
        );
        assert_eq!(written[4].1, json!({}));
        assert_eq!(
            parse::<Suspended>(&written[0].1).expect("reads").end,
            Some(end.clone())
        );
        // Older shapes.
        for kind in [Kind::Suspended, Kind::Resumed, Kind::SessionClosed] {
            check(kind, b"{}").unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
        assert_eq!(
            parse::<Suspended>(&json!({"pending": 5})).expect("old suspension"),
            Suspended {
                pending: Some(5),
                pid: None,
                end: None
            }
        );
        assert_eq!(
            parse::<SessionClosed>(&json!({})).expect("old close").end,
            None
        );
        // Ill-typed.
        for (kind, bad) in [
            (Kind::Suspended, json!({"pending": "seven"})),
            (Kind::Resumed, json!({"pid": -1})),
            (
                Kind::SessionClosed,
                json!({"outcome": "finished", "message": "x", "turns": "many"}),
            ),
            (Kind::Resumed, json!([1])),
        ] {
            assert!(
                check(kind, bad.to_string().as_bytes()).is_err(),
                "{kind:?} {bad}"
            );
        }
    }

    #[test]
    fn unknown_fields_and_missing_ones_are_errors() {
        let mut d = person("deny");
        d["deny_reason"] = json!("no");
        check(Kind::Decision, d.to_string().as_bytes()).expect("well typed");
        let mut extra = d.clone();
        extra["run_anyway"] = json!(true);
        assert!(check(Kind::Decision, extra.to_string().as_bytes()).is_err());
        let mut missing = d.clone();
        missing
            .as_object_mut()
            .expect("object")
            .remove("decided_by");
        assert!(check(Kind::Decision, missing.to_string().as_bytes()).is_err());
        assert!(check(Kind::Grant, br#"{"keys": ["bash:ls"], "by": "p"}"#).is_err());
        assert!(check(Kind::Intent, b"[1]").is_err());
    }
}
