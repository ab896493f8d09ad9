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

/// Any JSON object (what a payload's open part is).
pub type Object = Map<String, Value>;

/// `ledger_opened`: the genesis entry. Every version wrote these two
/// fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerOpened {
    /// The user key, hex.
    pub user_key: String,
    /// The ledger's format (1).
    pub format: u32,
}

/// An agent session's budget, in its opening.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
}

/// `session_opened`: what a session is for and under which settings it
/// began. Its fields differ by writer (`retie run`, `retie retest`,
/// `retie sandbox exec`, `retie undo`, `retie changes apply`, `retie
/// probe`, the dev ledger's `{}`): every one is optional, typed when
/// present. Fields of older versions this one does not know stay in
/// `rest` (read, never invented).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionOpened {
    /// What the session was asked to do (the prompt, the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<String>,
    /// Which command opened it (`retie run`, `retie sandbox exec`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The process that opened it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_digest: Option<String>,
    /// The autonomy tier it began with (later changes: `setting` notes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autonomy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals_from_yes_flag: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_allow: Option<Vec<String>>,
    /// A networked bash's settings (ADR 0313), as the agent recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bash_net: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// `retie sandbox exec --profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `retie sandbox exec` on a system workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_workspace: Option<bool>,
    /// The workspace's instruction files read into the system prompt
    /// (`retie run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_instructions: Option<Vec<InstructionsRead>>,
    /// A retest session's finding, lab and budget (issue 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retest: Option<crate::retest::RetestOpened>,
    /// The session key's delegation (the recorder adds it; verify checks
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<crate::keys::Delegation>,
    /// Fields of other versions.
    #[serde(flatten)]
    pub rest: Object,
}

/// One instruction file `retie run` read into the system prompt: its
/// name, size and the digest of the bytes read, or why it was refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstructionsRead {
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// `delegation`: a key delegated after the session's opening (renewed on
/// resume, or a sub-agent's). Only these fields were ever written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationEntry {
    pub delegation: crate::keys::Delegation,
    /// Why (`renewed on resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// To whom (the dev ledger's `sub-agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// `action_proposed`: an action as proposed: put to the policy (its
/// `action`, frozen arguments' `digest` and the policy's `evaluation`),
/// or a model's call that never reached the policy (`checked: false`:
/// the `call` as received, refused by retie's call check).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Proposed {
    /// Who proposed it (`agent`, `command line`, the operator...).
    pub origin: String,
    /// The action (tool, arguments, effects): `retie_policy::Action`'s
    /// JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Object>,
    /// The frozen arguments' digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The policy's evaluation, as it judged the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Value>,
    /// The pending approval whose edit this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_of: Option<i64>,
    /// A call that was not put to the policy, as received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<ProposedCall>,
    /// `false`: the call never reached the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<bool>,
    #[serde(flatten)]
    pub rest: Object,
}

/// A model's call as received, when it was refused before the policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProposedCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    /// The arguments (a person's edit of a call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Object>,
    /// The argument text as received (not a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
}

impl Proposed {
    /// An action put to the policy.
    pub fn of_action(origin: &str, action: Object, digest: String, evaluation: Value) -> Proposed {
        Proposed {
            origin: origin.into(),
            action: Some(action),
            digest: Some(digest),
            evaluation: Some(evaluation),
            ..Proposed::default()
        }
    }

    /// The same, proposed by `origin`.
    pub fn with_origin(self, origin: &str) -> Proposed {
        Proposed {
            origin: origin.into(),
            ..self
        }
    }

    /// A call refused before the policy.
    pub fn unchecked(origin: &str, call: ProposedCall) -> Proposed {
        Proposed {
            origin: origin.into(),
            call: Some(call),
            checked: Some(false),
            ..Proposed::default()
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.checked == Some(false) {
            if self.call.is_none() && self.action.is_none() {
                return Err("an unchecked proposal without its `call`".into());
            }
        } else if self.action.is_none() {
            return Err("missing field `action`".into());
        } else if self.digest.is_none() {
            return Err("missing field `digest`".into());
        }
        Ok(())
    }
}

/// The fields every intent and refusal of a session repeats (the
/// recorder's intent base: what the session runs and where).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallFields {
    /// The tool (`agent.bash`, `sandbox.exec`, `undo`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The command, as words (or as the tool shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Value>,
    /// The model's call id (agent sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// `overlay`, `direct`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The action's (intent) or the session's (base) effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_workspace: Option<bool>,
    /// The proposal entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<i64>,
    /// The pending approval it was decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<i64>,
    /// The decision entry (after a pending approval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_entry: Option<i64>,
    /// Fields of other writers and versions (`net`, `inspection`...).
    #[serde(flatten)]
    pub rest: Object,
}

/// `intent`: about to act, with the undo plan, before any effect.
/// Every version wrote the tool (`call.tool`, required), the decision
/// (`allow`) and who decided.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub decision: String,
    pub decided_by: String,
    /// `reversible` or `not_reversible`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The undo plan (the executor's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo: Option<Value>,
    /// The frozen arguments' digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Older intents: one effect instead of `effects`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    /// The session's call fields (its tool, command...) and this action's
    /// effects and bindings.
    #[serde(flatten)]
    pub call: CallFields,
}

impl Intent {
    fn check(&self) -> Result<(), String> {
        if self.call.tool.is_none() {
            return Err("missing field `tool`".into());
        }
        Ok(())
    }

    /// The effects it declared (older intents: its one `effect`).
    pub fn effects(&self) -> Vec<String> {
        match (&self.call.effects, &self.effect) {
            (Some(e), _) => e.clone(),
            (None, Some(e)) => vec![e.clone()],
            (None, None) => Vec::new(),
        }
    }
}

/// `refusal`: an action refused, never executed (the gate's or a
/// person's no), or a recorded decision refused (its signer is not on the
/// workspace's allow-list: `refused: "decision"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    pub reason: String,
    /// Who refused (`policy`, a person).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// What was refused when it is not the action (`decision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The refused decision entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<i64>,
    /// The refused decision's signer, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    #[serde(flatten)]
    pub call: CallFields,
}

impl Refusal {
    /// A refusal of the action by `by`.
    pub fn of_action(reason: &str, by: &str) -> Refusal {
        Refusal {
            reason: reason.into(),
            by: Some(by.into()),
            refused: None,
            decision: None,
            signer: None,
            call: CallFields::default(),
        }
    }
}

/// Token counts of one model turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// `message`: one message of the conversation, as sent to or received
/// from the model (`message`: the agent's message, its `role` required),
/// with what retie knows of the turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The agent's message (`role`, `text`, tool calls...).
    pub message: Value,
    /// An assistant turn's token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
    /// The turn was cut off by the length limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The turn's attempt (1 unless the provider was retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The model that answered, and its ladder tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<u32>,
    /// A message retie wrote itself (`retie`), not the person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(flatten)]
    pub rest: Object,
}

impl Message {
    /// A message with nothing known of its turn.
    pub fn of(message: Value) -> Message {
        Message {
            message,
            usage: None,
            truncated: None,
            stop_reason: None,
            attempt: None,
            model: None,
            tier: None,
            from: None,
            rest: Object::new(),
        }
    }

    /// Its role (`user`, `assistant`, `tool`, `system`).
    pub fn role(&self) -> Option<&str> {
        self.message.get("role").and_then(Value::as_str)
    }

    fn check(&self) -> Result<(), String> {
        match self.message.get("role") {
            Some(Value::String(_)) => Ok(()),
            Some(_) => Err("message.role: not a string".into()),
            None => Err("missing field `message.role`".into()),
        }
    }
}

/// The model ladder's steps (`ladder` notes).
pub const LADDER_STEPS: &[&str] = &["start", "stop", "switch"];

/// `note`: anything else worth keeping. Its shapes, each checked when
/// its key is present: a setting a person (or the ladder) changed
/// (`setting`, `value`, `by`), the model ladder's steps (`ladder`:
/// start, stop, switch), a probe's results (`probe`), a retest's verdict,
/// adjudication and end. Other keys (the dev ledger's counters, older
/// versions) stay in `rest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// The setting changed (`autonomy`, `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// Its new value (present, even `null`, on a setting note).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// Who changed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The ladder's step: `start`, `stop`, `switch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ladder: Option<String>,
    /// The model (ladder start and stop; probe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<u32>,
    /// The ladder's rungs (start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rungs: Option<Vec<Value>>,
    /// A switch's models and tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_tier: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_tier: Option<u32>,
    /// The failure's name (ladder stop, switch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// `retie probe`'s results, one object per model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Vec<Object>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retest_verdict: Option<crate::retest::RetestVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retest_adjudication: Option<crate::retest::RetestAdjudication>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retest_ended: Option<crate::retest::RetestEnded>,
    /// A probe's provider, endpoint, why it stopped, its requests and
    /// tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
    /// The dev ledger's counters (`retie ledger dev`, the ledger bench):
    /// the note's number, a sub-agent's, a rogue key's mark, the writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rogue: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Other fields (older versions).
    #[serde(flatten)]
    pub rest: Object,
}

impl Note {
    /// A person (or the ladder) changed `setting` to `value`.
    pub fn setting(setting: &str, value: Value, by: &str) -> Note {
        Note {
            setting: Some(setting.into()),
            value: Some(value),
            by: Some(by.into()),
            ..Note::default()
        }
    }

    /// The setting it records, if it is a setting note: (name, value).
    pub fn setting_value(&self) -> Option<(&str, &Value)> {
        Some((self.setting.as_deref()?, self.value.as_ref()?))
    }

    /// What each shape requires.
    fn check(&self, raw: &Value) -> Result<(), String> {
        if self.setting.is_some() {
            if raw.get("value").is_none() {
                return Err("a setting note without `value`".into());
            }
            if self.by.is_none() {
                return Err("a setting note without `by`".into());
            }
        }
        if let Some(step) = &self.ladder {
            let need: &[(&str, bool)] = match step.as_str() {
                "start" => &[
                    ("model", self.model.is_some()),
                    ("tier", self.tier.is_some()),
                ],
                "stop" => &[
                    ("model", self.model.is_some()),
                    ("reason", self.reason.is_some()),
                ],
                "switch" => &[
                    ("setting", self.setting.is_some()),
                    ("from", self.from.is_some()),
                    ("to", self.to.is_some()),
                    ("reason", self.reason.is_some()),
                ],
                other => return Err(format!("unknown ladder step {other:?}")),
            };
            if let Some((field, _)) = need.iter().find(|(_, present)| !present) {
                return Err(format!("a ladder {step} note without `{field}`"));
            }
        }
        Ok(())
    }
}

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

/// Read row `r`'s payload as `T`: the error names the entry (readers
/// refuse an ill-typed entry, never read around it).
pub fn of_row<T: DeserializeOwned>(r: &crate::Row) -> Result<T, String> {
    parse(&r.payload_json()).map_err(|e| {
        format!(
            "entry #{} (a {} entry) is ill-typed ({e}); `retie verify` says more",
            r.seq,
            r.kind_str()
        )
    })
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
        Kind::LedgerOpened => parse::<LedgerOpened>(&v).map(|_| ()),
        Kind::SessionOpened => obj(&v).and_then(|_| parse::<SessionOpened>(&v).map(|_| ())),
        Kind::Delegation => parse::<DelegationEntry>(&v).map(|_| ()),
        Kind::Proposed => parse::<Proposed>(&v)?.check(),
        Kind::Intent => parse::<Intent>(&v)?.check(),
        Kind::Refusal => parse::<Refusal>(&v).map(|_| ()),
        Kind::Note => obj(&v).and_then(|_| parse::<Note>(&v)?.check(&v)),
        Kind::Message => parse::<Message>(&v)?.check(),
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

    /// Ledgers written by this version before the kinds were typed (a
    /// `retie demo` session with its `undo-all`, a `retie sandbox exec`
    /// and its `retie undo`, captured in session 22 from the unchanged
    /// binary) still check, every entry of every kind.
    #[test]
    fn todays_ledgers_still_check() {
        let fixture = include_str!("../tests/fixtures/today-s22.jsonl");
        let mut kinds = std::collections::BTreeSet::new();
        for line in fixture.lines() {
            let row: Value = serde_json::from_str(line).expect("fixture line");
            let kind = row["kind"].as_str().expect("kind");
            let k = Kind::parse(kind.as_bytes()).unwrap_or_else(|| panic!("kind {kind}"));
            check(k, row["payload"].to_string().as_bytes())
                .unwrap_or_else(|e| panic!("#{} ({kind}): {e}", row["seq"]));
            kinds.insert(kind.to_string());
        }
        for k in [
            "ledger_opened",
            "session_opened",
            "action_proposed",
            "intent",
            "refusal",
            "message",
        ] {
            assert!(kinds.contains(k), "the fixture has no {k}");
        }
    }

    /// The payloads as this version's writers spelled them by hand (copied
    /// from the writers before they built the structs): each checks, and
    /// reads as its struct.
    #[test]
    fn the_hand_spelled_shapes_of_todays_writers_still_check() {
        let d = json!({"session": "s", "workspace": "/w", "key": "ab", "parent": "cd",
                       "effects": ["writes_workspace"], "not_after_ms": 5, "sig": "ef"});
        let shapes = [
            (Kind::LedgerOpened, json!({"user_key": "ab", "format": 1})),
            (Kind::SessionOpened, json!({})),
            (
                Kind::SessionOpened,
                json!({"objective": "ls", "origin": "retie sandbox exec", "provider": null,
                       "model": null, "policy_digest": "ab", "system_prompt_digest": null,
                       "profile": "host", "system_workspace": null, "delegation": d}),
            ),
            (
                Kind::SessionOpened,
                json!({"objective": "probe 2 models", "origin": "retie probe",
                       "provider": "openai", "base_url": "http://127.0.0.1:1"}),
            ),
            (
                Kind::SessionOpened,
                json!({"objective": "fix", "origin": "retie run", "provider": "script", "model": "m",
                       "system_prompt_digest": "ab", "system_prompt": "be good", "pid": 7,
                       "policy_digest": "cd", "autonomy": "gated", "approvals_from_yes_flag": false,
                       "fetch_allow": ["example.invalid"], "bash_net": {"allow": ["x.invalid"]},
                       "base_url": null, "api_key_env": null,
                       "budget": {"max_turns": 30, "max_tokens": 400000, "timeout_s": 60.0},
                       "project_instructions": [{"file": "AGENTS.md", "size": 3, "read_bytes": 3,
                                                 "truncated": false, "digest": "ab"},
                                                {"file": "CLAUDE.md", "refused": "a symlink"}]}),
            ),
            (
                Kind::Delegation,
                json!({"delegation": d, "why": "renewed on resume"}),
            ),
            (
                Kind::Delegation,
                json!({"delegation": d, "to": "sub-agent"}),
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "action": {"tool": "read", "args": {"path": "a"}, "effects": []},
                       "digest": "ab", "evaluation": {"decision": "run"}, "edit_of": 4}),
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "call": {"id": "c1", "name": "bash", "raw_arguments": "{"},
                       "checked": false}),
            ),
            (
                Kind::Proposed,
                json!({"origin": "person (edit)", "edit_of": 3,
                       "call": {"name": "bash", "arguments": {"command": 1}}, "checked": false}),
            ),
            (
                Kind::Intent,
                json!({"tool": "sandbox.exec", "command": ["ls"], "workspace": "/w", "mode": "overlay",
                       "profile": "host", "net": null, "effects": ["runs_sandboxed"],
                       "decision": "allow", "decided_by": "policy", "class": "reversible",
                       "undo": {"changeset": null}, "digest": "ab", "proposal": 3}),
            ),
            (
                Kind::Intent,
                json!({"tool": "agent.bash", "call": "c1", "inspection": null, "decision": "allow",
                       "decided_by": "person", "effects": [], "class": "not_reversible",
                       "undo": null, "digest": "ab", "proposal": 3, "pending": 4, "decision_entry": 5}),
            ),
            // The first intents: one `effect`.
            (
                Kind::Intent,
                json!({"tool": "exec", "effect": "workspace.write", "decision": "allow",
                       "decided_by": "person", "class": "reversible", "undo": {}}),
            ),
            (
                Kind::Refusal,
                json!({"reason": "no", "by": "policy", "tool": "agent.bash", "command": ["rm"],
                       "proposal": 3, "pending": 4, "decision_entry": 5}),
            ),
            (
                Kind::Refusal,
                json!({"refused": "decision", "decision": 9, "pending": 4, "signer": "ab",
                       "reason": "not on the allow-list", "tool": "agent"}),
            ),
            (
                Kind::Note,
                json!({"setting": "autonomy", "value": "gated", "by": "person"}),
            ),
            (
                Kind::Note,
                json!({"setting": "model", "value": null, "by": "person"}),
            ),
            (
                Kind::Note,
                json!({"ladder": "start", "model": "m", "tier": 1, "rungs": [{"model": "m", "tier": 1}]}),
            ),
            (
                Kind::Note,
                json!({"ladder": "stop", "model": "m", "reason": "refused", "why": "no"}),
            ),
            (
                Kind::Note,
                json!({"ladder": "switch", "setting": "model", "value": "n", "by": "ladder",
                       "from": "m", "from_tier": 1, "to": "n", "to_tier": 2,
                       "reason": "session_limit", "why": "limit"}),
            ),
            (
                Kind::Note,
                json!({"probe": [{"model": "m", "status": "callable"}], "provider": "openai",
                       "base_url": "http://127.0.0.1:1", "stopped": null, "requests": 1,
                       "usage": {"input_tokens": 1, "output_tokens": 2}}),
            ),
            (
                Kind::Note,
                json!({"retest_adjudication": {"status": "fixed", "reason": "r", "by": "operator",
                                               "agent_status": null}}),
            ),
            (
                Kind::Note,
                json!({"retest_ended": {"by": "operator", "reason": "ended by operator",
                                        "steps": 2, "max_steps": 8}}),
            ),
            // The dev ledger's and the benches' counters.
            (Kind::Note, json!({"n": 3, "pid": 7})),
            (Kind::Note, json!({"rogue": true})),
            (
                Kind::Message,
                json!({"message": {"role": "user", "text": "hi"}}),
            ),
            (
                Kind::Message,
                json!({"message": {"role": "user", "text": "go on"}, "from": "retie"}),
            ),
            (
                Kind::Message,
                json!({"message": {"role": "assistant", "text": ""},
                       "usage": {"input_tokens": 1, "output_tokens": 2}, "truncated": false,
                       "stop_reason": null, "attempt": 1, "model": "m", "tier": null}),
            ),
        ];
        for (kind, v) in &shapes {
            check(*kind, v.to_string().as_bytes()).unwrap_or_else(|e| panic!("{kind:?} {v}: {e}"));
        }
        // Read back as the structs, what they carry is there.
        let i: Intent = parse(&shapes[12].1).expect("old intent");
        assert_eq!(i.effects(), vec!["workspace.write".to_string()]);
        let n: Note = parse(&shapes[15].1).expect("setting");
        assert_eq!(n.setting_value(), Some(("autonomy", &json!("gated"))));
        let o: SessionOpened = parse(&shapes[4].1).expect("opening");
        assert_eq!(o.budget.and_then(|b| b.max_turns), Some(30));
        assert_eq!(
            o.project_instructions.map(|p| p.len()),
            Some(2),
            "instructions read"
        );
        let m: Message = parse(&shapes[27].1).expect("message");
        assert_eq!(m.role(), Some("assistant"));
        assert_eq!(m.usage.map(|u| u.output_tokens), Some(2));
    }

    /// What the writers build now reads back as itself and checks.
    #[test]
    fn each_typed_payload_round_trips() {
        fn round<T>(kind: Kind, t: T)
        where
            T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
        {
            let v = to_value(&t);
            check(kind, v.to_string().as_bytes()).unwrap_or_else(|e| panic!("{kind:?} {v}: {e}"));
            assert_eq!(parse::<T>(&v).expect("reads back"), t, "{kind:?}");
        }
        let d = crate::keys::Delegation {
            session: "s".into(),
            workspace: "/w".into(),
            key: "ab".into(),
            parent: "cd".into(),
            effects: vec!["writes_workspace".into()],
            not_after_ms: 5,
            sig: "ef".into(),
        };
        round(
            Kind::LedgerOpened,
            LedgerOpened {
                user_key: "ab".into(),
                format: 1,
            },
        );
        round(
            Kind::SessionOpened,
            SessionOpened {
                objective: Some("fix".into()),
                origin: Some("retie run".into()),
                pid: Some(3),
                budget: Some(Budget {
                    max_turns: Some(3),
                    max_tokens: Some(9),
                    timeout_s: Some(1.5),
                }),
                delegation: Some(d.clone()),
                ..SessionOpened::default()
            },
        );
        round(
            Kind::Delegation,
            DelegationEntry {
                delegation: d,
                why: Some("renewed on resume".into()),
                to: None,
            },
        );
        round(
            Kind::Proposed,
            Proposed {
                edit_of: Some(2),
                ..Proposed::of_action(
                    "agent",
                    Object::new(),
                    "ab".into(),
                    json!({"decision": "run"}),
                )
            },
        );
        round(
            Kind::Proposed,
            Proposed::unchecked(
                "agent",
                ProposedCall {
                    id: Some("c".into()),
                    name: "bash".into(),
                    arguments: None,
                    raw_arguments: Some("{".into()),
                },
            ),
        );
        round(
            Kind::Intent,
            Intent {
                decision: "allow".into(),
                decided_by: "policy".into(),
                class: Some("reversible".into()),
                undo: Some(json!({"changeset": "x"})),
                digest: Some("ab".into()),
                effect: None,
                call: CallFields {
                    tool: Some("agent.bash".into()),
                    effects: Some(vec!["runs_sandboxed".into()]),
                    proposal: Some(3),
                    ..CallFields::default()
                },
            },
        );
        round(Kind::Refusal, Refusal::of_action("no", "policy"));
        round(
            Kind::Note,
            Note::setting("autonomy", json!("gated"), "person"),
        );
        round(
            Kind::Note,
            Note {
                ladder: Some("stop".into()),
                model: Some("m".into()),
                reason: Some("refused".into()),
                ..Note::default()
            },
        );
        round(
            Kind::Message,
            Message {
                usage: Some(TokenUsage {
                    input_tokens: 1,
                    output_tokens: 2,
                }),
                attempt: Some(1),
                ..Message::of(json!({"role": "assistant", "text": "ok"}))
            },
        );
    }

    /// A payload of each newly typed kind missing what its kind requires,
    /// or with a field of the wrong type, is ill-typed, and the error
    /// names the field.
    #[test]
    fn each_kind_refuses_a_missing_or_ill_typed_field_by_name() {
        let cases = [
            (Kind::LedgerOpened, json!({"format": 1}), "user_key"),
            (
                Kind::LedgerOpened,
                json!({"user_key": "ab", "format": "one"}),
                "one",
            ),
            (
                Kind::LedgerOpened,
                json!({"user_key": "ab", "format": 1, "also": 2}),
                "also",
            ),
            (Kind::SessionOpened, json!({"origin": 7}), "integer `7`"),
            (Kind::SessionOpened, json!({"pid": "me"}), "\"me\""),
            (
                Kind::SessionOpened,
                json!({"delegation": {"session": "s"}}),
                "workspace",
            ),
            (
                Kind::SessionOpened,
                json!({"budget": {"max_turns": -1}}),
                "-1",
            ),
            (Kind::SessionOpened, json!([]), "not a JSON object"),
            (
                Kind::Delegation,
                json!({"why": "renewed on resume"}),
                "delegation",
            ),
            (Kind::Delegation, json!({"delegation": 3}), "integer `3`"),
            (
                Kind::Proposed,
                json!({"action": {}, "digest": "ab"}),
                "origin",
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "digest": "ab"}),
                "action",
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "action": {}}),
                "digest",
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "action": [], "digest": "ab"}),
                "sequence",
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "checked": false}),
                "call",
            ),
            (
                Kind::Intent,
                json!({"decided_by": "policy", "tool": "t"}),
                "decision",
            ),
            (
                Kind::Intent,
                json!({"decision": "allow", "tool": "t"}),
                "decided_by",
            ),
            (
                Kind::Intent,
                json!({"decision": "allow", "decided_by": "policy"}),
                "tool",
            ),
            (
                Kind::Intent,
                json!({"decision": "allow", "decided_by": "p", "tool": "t", "proposal": "3"}),
                "\"3\"",
            ),
            (
                Kind::Intent,
                json!({"decision": "allow", "decided_by": "p", "tool": "t", "effects": "all"}),
                "\"all\"",
            ),
            (Kind::Refusal, json!({"by": "policy"}), "reason"),
            (
                Kind::Refusal,
                json!({"reason": "no", "decision": "allow"}),
                "\"allow\"",
            ),
            (
                Kind::Note,
                json!({"setting": "autonomy", "by": "person"}),
                "value",
            ),
            (
                Kind::Note,
                json!({"setting": "autonomy", "value": "x"}),
                "by",
            ),
            (
                Kind::Note,
                json!({"setting": 3, "value": "x", "by": "p"}),
                "integer `3`",
            ),
            (Kind::Note, json!({"ladder": "start", "model": "m"}), "tier"),
            (Kind::Note, json!({"ladder": "jump"}), "jump"),
            (
                Kind::Note,
                json!({"retest_ended": {"by": "operator"}}),
                "reason",
            ),
            (Kind::Note, json!({"probe": [1]}), "integer `1`"),
            (Kind::Note, json!("a note"), "not a JSON object"),
            (
                Kind::Message,
                json!({"message": {"text": "hi"}}),
                "message.role",
            ),
            (Kind::Message, json!({"role": "user"}), "message"),
            (
                Kind::Message,
                json!({"message": {"role": "assistant"}, "usage": {"input_tokens": 1}}),
                "output_tokens",
            ),
        ];
        for (kind, bad, field) in cases {
            let e = check(kind, bad.to_string().as_bytes())
                .err()
                .unwrap_or_else(|| panic!("{kind:?} {bad}: well typed?"));
            assert!(
                e.contains(field),
                "{kind:?} {bad}: {e:?} does not name {field}"
            );
        }
    }
}
