//! The one chokepoint every action retie takes for someone passes through,
//! in one order only:
//!
//! **classify → gate → plan the undo → record → execute → confirm.**
//!
//! [`dispatch`] is that order, as one function. Its callers differ only in
//! what they hand it:
//! - a [`Proposal`]: the action (a policy [`Action`]: tool, frozen
//!   arguments, declared effects) and where it came from;
//! - an [`Approver`]: who answers when the gate asks (the person at the
//!   command line, the agent's approval prompt, a test);
//! - an [`Executor`]: what runs it (the sandbox, a fake in tests). The
//!   executor plans the undo before anything runs and may write one more
//!   durable entry right before its effect reaches the workspace.
//!
//! Everything is written to the ledger through a [`Recorder`]: the
//! proposal, the decision and who made it, and the intent with its undo
//! plan, in one durable transaction before the action runs (a refusal
//! instead, if it is not to run); the outcome after. The policy crate
//! decides; this crate only carries the decision out.

pub mod approval;
pub mod diffs;
pub mod display;
pub mod guard;
pub mod overlay;
pub mod record;
pub mod sandbox;
pub mod undo;
pub mod write;

use retie_ledger::payload::Status;
use retie_policy::{
    evaluate, gate, Action, ClassKind, Context, Decision, Evaluation, GateInput, Policy, Reason,
    Verdict,
};
use serde_json::{json, Value};

pub use record::Recorder;

/// The origin of an action the operator proposed themselves at a retest's
/// prompt (`!CMD`): its proposal and intent are recorded with the person
/// as their actor, not the agent.
pub const OPERATOR_ORIGIN: &str = "person (operator)";

/// Everything that can go wrong at the chokepoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ledger could not record (nothing ran that needed recording first).
    #[error(transparent)]
    Ledger(#[from] retie_ledger::Error),
    /// The sandbox failed.
    #[error(transparent)]
    Runtime(#[from] retie_runtime::RuntimeError),
    /// Capturing, applying or undoing workspace changes failed.
    #[error(transparent)]
    Snapshot(#[from] retie_snapshot::Error),
    /// The policy refused to load or to bind an approval.
    #[error(transparent)]
    Policy(#[from] retie_policy::Error),
    /// File I/O around a run (run directories, locks).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A request that does not make sense (bad run id, workspace inside
    /// retie's own state...).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// An action someone proposes.
#[derive(Debug, Clone)]
pub struct Proposal {
    /// Tool, frozen arguments, declared effects.
    pub action: Action,
    /// Who proposed it: `command line`, `agent`, ...
    pub origin: String,
    /// The pending approval whose edit this is (recorded as `edit_of`).
    pub edit_of: Option<i64>,
}

/// What the executor says about undoing the action, before it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct UndoPlan {
    /// Can retie put the workspace back afterwards?
    pub reversible: bool,
    /// How (or why not), recorded as the intent's `undo`.
    pub detail: Value,
}

/// What the person is asked to approve: exactly what will run.
pub struct ApprovalRequest<'a> {
    pub action: &'a Action,
    pub evaluation: &'a Evaluation,
    pub plan: &'a UndoPlan,
    /// The pending entry already durable in the ledger (`None` only for
    /// callers outside a recorded session).
    pub pending: Option<i64>,
    /// What "always for this session" would grant: one key per simple
    /// command of a shell line (`bash:git status`), else the tool and
    /// its exact arguments.
    pub grant_keys: &'a [String],
    /// The change to a file it would make, as it is now
    /// ([`Executor::shown_change`]): what the prompt shows as a diff.
    pub change: Option<&'a diffs::FileChange>,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// Run it. `digest` is the digest of the arguments that were shown;
    /// an approval binds them, so it must equal the action's.
    Approved {
        by: String,
        digest: retie_policy::Digest,
    },
    /// Run it, and from now on in this session run every action whose
    /// grant keys are all granted without asking (recorded as a `grant`
    /// entry; revocable).
    Always {
        by: String,
        digest: retie_policy::Digest,
    },
    /// Do not run it; `reason` goes back to whoever proposed it.
    Denied { by: String, reason: String },
    /// The person changed the arguments: the edited action is a new
    /// proposal, classified and gated again (recorded as an edit of this
    /// one); the model is told what ran. `digest` is what was shown.
    Edit {
        by: String,
        digest: retie_policy::Digest,
        arguments: serde_json::Map<String, Value>,
    },
    /// Nobody can answer now: the session suspends with the approval
    /// pending (durable), to be decided by `retie approve`/`deny`.
    Suspend,
}

/// A cancel flag for a turn: set from outside (Ctrl-C), checked between
/// steps and handed down so a running sandbox can be stopped.
#[derive(Debug, Clone, Default)]
pub struct Cancel(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }
    /// Ask whatever runs to stop.
    pub fn cancel(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Clear it for the next turn.
    pub fn reset(&self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
    /// The flag itself (for a signal handler or a sandbox watcher).
    pub fn flag(&self) -> &std::sync::Arc<std::sync::atomic::AtomicBool> {
        &self.0
    }
}

/// What "always for this session" grants for an action: one key per
/// simple command of a shell line, as the policy crate splits it
/// (`bash:git status`), else `TOOL:ARGUMENTS-JSON`. A shell line that
/// is not plain gets no key (it cannot be granted).
pub fn grant_keys(action: &Action, ev: &Evaluation) -> Vec<String> {
    match ev.shell.as_ref() {
        Some(s) if s.plain && !s.parts.is_empty() => s
            .parts
            .iter()
            .map(|p| format!("{}:{p}", action.tool()))
            .collect(),
        Some(_) => Vec::new(),
        None => vec![format!("{}:{}", action.tool(), action.args().to_json())],
    }
}

/// Answers the gate's questions.
pub trait Approver {
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval;

    /// True for an approver that answers without asking anyone (the
    /// command line, `--yes`, "no one to approve"): nothing waits on a
    /// person, so no pending entry is written first and the decision
    /// rides in the intent's transaction (one durable point, not two).
    /// Such an approver may only approve or deny.
    fn answers_at_once(&self) -> bool {
        false
    }
}

/// The person who typed the command line has approved exactly what they
/// typed: `retie sandbox exec -- CMD` is its own approval. The policy
/// still decides the class and may deny; a deny is not overridden.
pub struct CommandLine;

impl Approver for CommandLine {
    fn answers_at_once(&self) -> bool {
        true
    }
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval {
        Approval::Approved {
            by: "person (command line)".into(),
            digest: req.action.digest(),
        }
    }
}

/// Runs actions. `plan` is called before anything runs; `execute` gets a
/// [`Step`] to write the one durable entry allowed between intent and
/// outcome (the exact changes about to reach the workspace) and to set
/// the outcome.
pub trait Executor {
    type Output;
    fn plan(&self, action: &Action) -> UndoPlan;
    /// The change it would make to one file, against the file as it is
    /// now, for the approval prompt to show (a write or an edit; issue
    /// 31). Shown only: the approval still binds the frozen arguments'
    /// digest, nothing of this is hashed or recorded.
    fn shown_change(&self) -> Option<diffs::FileChange> {
        None
    }
    fn execute(&mut self, action: &Action, step: &mut Step<'_>) -> Result<Self::Output, Error>;
}

/// An action between its intent and its outcome.
pub struct Step<'r> {
    rec: &'r mut Recorder,
    action_id: i64,
    outcome: Option<Value>,
    deferred: bool,
}

impl Step<'_> {
    /// The intent's sequence number: the action's id in `retie log`.
    pub fn action_id(&self) -> i64 {
        self.action_id
    }

    /// Durably record what is about to change (and how to undo it) right
    /// before it changes. Nothing may change if this fails.
    pub fn before_effect(&mut self, changes: Value) -> Result<(), Error> {
        self.rec.changes(self.action_id, changes)
    }

    /// Work for while the command runs: write the checkpoint of what is
    /// already on disk (the intent), so that an action whose outcome is
    /// deferred has nothing left to sign and write after it. Best effort:
    /// the close writes it again if this failed.
    pub fn checkpoint_meanwhile(&mut self) {
        self.rec.checkpoint_meanwhile();
    }

    /// A fold of the ledger's WAL to run (`retie_ledger::Fold::run`, on a
    /// thread of the caller's, while the command runs; it folds when due).
    pub fn take_fold(&mut self) -> Option<retie_ledger::Fold> {
        self.rec.take_fold()
    }

    /// How the action ended (recorded after `execute` returns).
    pub fn set_outcome(&mut self, outcome: Value) {
        self.outcome = Some(outcome);
        self.deferred = false;
    }

    /// How an action ended, when nothing later depends on that record
    /// being on disk at once (undo works from the durable points before
    /// it): its outcome rides on the next durable point instead of costing
    /// a sync of its own ([`retie_ledger::Durability::Deferred`]).
    pub fn set_outcome_deferred(&mut self, outcome: Value) {
        self.outcome = Some(outcome);
        self.deferred = true;
    }
}

/// How a dispatched action ended.
#[derive(Debug)]
pub enum Dispatched<O> {
    /// It ran; `action` is its id in the ledger.
    Ran { action: i64, output: O },
    /// It did not run: the policy denied it or the approver said no.
    Refused { reason: String, by: String },
    /// The approval is pending in the ledger (entry `pending`) and nobody
    /// can answer now: the session suspends.
    Suspended { pending: i64 },
    /// The person edited the arguments (decision recorded): the caller
    /// dispatches the edited action as a new proposal, `edit_of` the
    /// pending entry.
    Edited {
        pending: i64,
        by: String,
        arguments: serde_json::Map<String, Value>,
    },
}

/// The chokepoint. See the crate documentation for the order.
pub fn dispatch<E: Executor>(
    rec: &mut Recorder,
    policy: &Policy,
    ctx: &Context,
    proposal: Proposal,
    approver: &mut dyn Approver,
    exec: &mut E,
) -> Result<Dispatched<E::Output>, Error> {
    let action = proposal.action;
    // Classify and gate.
    let mut ev = evaluate(policy, &action, ctx);
    // Plan the undo; what the executor cannot undo is irreversible,
    // whatever the tool's declared class, and is gated as such.
    let plan = exec.plan(&action);
    if !plan.reversible && ev.decision.verdict != Verdict::Deny {
        let regated = gate(
            policy.gate_rules(),
            &GateInput {
                tier: ctx.tier,
                class: ClassKind::Irreversible,
                requires_approval: policy
                    .tool(action.tool())
                    .is_some_and(|t| t.requires_approval),
                risk: ctx.risk,
                trifecta: ev.trifecta,
            },
        );
        if strictness(regated.verdict) > strictness(ev.decision.verdict) {
            ev.decision = regated;
        }
    }
    // A pending approval this process resumed binds its action: a person
    // was asked about exactly this (same digest), so a looser autonomy
    // now (`--resume --autonomy gated`) neither runs it unasked nor
    // passes over the decision recorded for it. Only a policy deny is
    // stricter.
    if let Some(op) = rec.resumed_pending() {
        if op.digest == ev.digest.to_hex() && ev.decision.verdict == Verdict::Run {
            ev.decision = Decision {
                verdict: Verdict::Ask,
                reasons: vec![Reason::PendingApproval { entry: op.seq }],
            };
        }
    }
    let class = if plan.reversible {
        ev.class.kind()
    } else {
        ClassKind::Irreversible
    };
    let proposed = retie_ledger::payload::Proposed {
        edit_of: proposal.edit_of,
        ..retie_ledger::payload::Proposed::of_action(
            &proposal.origin,
            action.to_json().as_object().cloned().unwrap_or_default(),
            ev.digest.to_hex().to_string(),
            ev.to_json(),
        )
    };
    // What this action can reach, as the policy accepted its declared
    // effects: the intent records the action's own reach, never the
    // session's permissions (issue 35, item 3).
    let reach: Vec<&str> = action.effects().iter().map(|e| e.name()).collect();
    // What a person asked about a write is shown (the diff), read once.
    let shown = match ev.decision.verdict {
        Verdict::Ask => exec.shown_change(),
        _ => None,
    };
    let intent = |by: &str| retie_ledger::payload::Intent {
        decision: "allow".into(),
        decided_by: by.into(),
        class: Some(
            if plan.reversible {
                "reversible"
            } else {
                "not_reversible"
            }
            .into(),
        ),
        undo: Some(plan.detail.clone()),
        digest: Some(ev.digest.to_hex().to_string()),
        effect: None,
        call: retie_ledger::payload::CallFields {
            effects: Some(reach.iter().map(|e| e.to_string()).collect()),
            ..Default::default()
        },
    };
    // A person's decision on a pending approval: the one builder
    // `retie approve`/`deny` use too.
    let person_decision = |answer: &approval::Answer, by: &str| {
        approval::decision(
            answer,
            by,
            json!(class),
            json!(ev.decision.reason().to_string()),
            &ev.digest.to_hex(),
        )
    };
    let (by, refusal) = match ev.decision.verdict {
        Verdict::Run => ("policy".to_string(), None),
        Verdict::Deny => ("policy".to_string(), Some(ev.decision.reason().to_string())),
        Verdict::Ask if approver.answers_at_once() && rec.resumed_pending().is_none() => {
            let keys = grant_keys(&action, &ev);
            match approver.approve(&ApprovalRequest {
                action: &action,
                evaluation: &ev,
                plan: &plan,
                pending: None,
                grant_keys: &keys,
                change: shown.as_ref(),
            }) {
                Approval::Approved { by, digest } => {
                    // What runs is exactly what was approved.
                    retie_policy::ensure_approved(&digest, &action)?;
                    (by, None)
                }
                Approval::Denied { by, reason } => (by, Some(reason)),
                _ => {
                    return Err(Error::Invalid(
                        "an approver that answers at once may only approve or deny".into(),
                    ))
                }
            }
        }
        Verdict::Ask => {
            let keys = grant_keys(&action, &ev);
            let resumed = rec
                .resumed_pending()
                .is_some_and(|op| op.digest == ev.digest.to_hex());
            if let (false, Some(g)) = (resumed, rec.granted(&keys)) {
                (format!("person (grant #{g})"), None)
            } else {
                let digest_hex = ev.digest.to_hex();
                // Durable before anyone is asked: the proposal and the
                // pending approval (or the one this process resumed).
                let (proposal_seq, pending_seq, mut recorded) = match rec.take_resumed(&digest_hex)
                {
                    Some(op) => (op.proposal, op.seq, op.decision),
                    None => {
                        let pending = json!({
                            "digest": digest_hex,
                            "action": action.to_json(),
                            "class": class,
                            "reason": ev.decision.reason().to_string(),
                            "reasons": ev.to_json()["reasons"],
                            "shell": ev.shell.as_ref().map(|s| &s.parts),
                            "undo": plan.detail,
                            "grant_keys": keys,
                        });
                        let (p, s) = rec.pending(&proposed, pending)?;
                        (p, s, None)
                    }
                };
                loop {
                    let (answer, fresh) = match &recorded {
                        Some((_, d)) => (recorded_approval(d)?, false),
                        None => (
                            approver.approve(&ApprovalRequest {
                                action: &action,
                                evaluation: &ev,
                                plan: &plan,
                                pending: Some(pending_seq),
                                grant_keys: &keys,
                                change: shown.as_ref(),
                            }),
                            true,
                        ),
                    };
                    let recorded_seq = recorded.as_ref().map(|(s, _)| *s);
                    let mut d = record::PendingDecision {
                        proposal: proposal_seq,
                        pending: pending_seq,
                        decision: None,
                        by_person: true,
                        recorded_decision: recorded_seq,
                        grant: None,
                        grant_keys: None,
                        grant_by: String::new(),
                        then: record::Then::Nothing,
                    };
                    let mut edited = None;
                    let mut refused = None;
                    match answer {
                        Approval::Suspend => {
                            return Ok(Dispatched::Suspended {
                                pending: pending_seq,
                            })
                        }
                        Approval::Approved { by, digest } | Approval::Always { by, digest }
                            if digest != ev.digest =>
                        {
                            let _ = by;
                            // What runs is exactly what was shown.
                            retie_policy::ensure_approved(&digest, &action)?;
                        }
                        Approval::Approved { by, .. } => {
                            d.decision =
                                fresh.then(|| person_decision(&approval::Answer::Approve, &by));
                            d.then = record::Then::Intent(intent(&by));
                        }
                        Approval::Always { by, .. } => {
                            d.decision =
                                fresh.then(|| person_decision(&approval::Answer::Always, &by));
                            if fresh && !keys.is_empty() {
                                d.grant = Some(approval::grant(&keys, &by, pending_seq));
                                d.grant_keys = Some(keys.clone());
                                d.grant_by = by.clone();
                            }
                            d.then = record::Then::Intent(intent(&by));
                        }
                        Approval::Denied { by, reason } => {
                            if fresh {
                                d.decision = Some(person_decision(
                                    &approval::Answer::Deny(reason.clone()),
                                    &by,
                                ));
                            }
                            d.then = record::Then::Refusal(
                                retie_ledger::payload::Refusal::of_action(&reason, &by),
                            );
                            refused = Some((reason, by));
                        }
                        Approval::Edit {
                            by,
                            digest,
                            arguments,
                        } => {
                            retie_policy::ensure_approved(&digest, &action)?;
                            if fresh {
                                d.decision = Some(person_decision(
                                    &approval::Answer::Edit(arguments.clone()),
                                    &by,
                                ));
                            }
                            edited = Some((by, arguments));
                        }
                    }
                    match rec.decide(d) {
                        Ok(intent_seq) => {
                            if let Some((by, arguments)) = edited {
                                return Ok(Dispatched::Edited {
                                    pending: pending_seq,
                                    by,
                                    arguments,
                                });
                            }
                            if let Some((reason, by)) = refused {
                                return Ok(Dispatched::Refused { reason, by });
                            }
                            let action_id = intent_seq.ok_or_else(|| {
                                Error::Invalid("the intent was not recorded".into())
                            })?;
                            return execute(rec, action_id, &action, exec);
                        }
                        // Someone else (`retie approve` from another
                        // process) decided first: theirs stands.
                        Err(Error::Ledger(retie_ledger::Error::Conflict { session, why }))
                            if recorded.is_none() =>
                        {
                            match rec.decision_for(pending_seq)? {
                                Some(found) => recorded = Some(found),
                                None => {
                                    return Err(Error::Ledger(retie_ledger::Error::Conflict {
                                        session,
                                        why,
                                    }))
                                }
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    };
    let decision = retie_ledger::payload::to_value(&retie_ledger::payload::Decision {
        verdict: ev.decision.verdict.name().into(),
        decided_by: by.clone(),
        class: json!(class),
        reason: json!(ev.decision.reason().to_string()),
        approved_digest: refusal.is_none().then(|| ev.digest.to_hex()),
        shown_digest: None,
        deny_reason: None,
        edited_arguments: None,
        pending: None,
        proposal: None,
    });
    if let Some(reason) = refusal {
        rec.refuse(
            &proposed,
            decision,
            &retie_ledger::payload::Refusal::of_action(&reason, &by),
        )?;
        return Ok(Dispatched::Refused { reason, by });
    }
    // Record: proposal, decision and intent with the undo plan, durably,
    // in one transaction, before anything runs.
    let action_id = rec.begin(&proposed, decision, &intent(&by))?;
    execute(rec, action_id, &action, exec)
}

/// Execute and confirm: the action runs, its outcome is recorded after.
fn execute<E: Executor>(
    rec: &mut Recorder,
    action_id: i64,
    action: &Action,
    exec: &mut E,
) -> Result<Dispatched<E::Output>, Error> {
    let mut step = Step {
        rec,
        action_id,
        outcome: None,
        deferred: false,
    };
    let result = exec.execute(action, &mut step);
    let deferred = step.deferred && result.is_ok();
    let outcome = match (&result, step.outcome.take()) {
        (Ok(_), Some(o)) => o,
        (Ok(_), None) => json!({ "status": Status::Ran.word() }),
        (Err(e), _) => json!({ "status": Status::Failed.word(), "failure": e.to_string() }),
    };
    // Confirm: the outcome, after.
    let durability = if deferred {
        retie_ledger::Durability::Deferred
    } else {
        retie_ledger::Durability::Now
    };
    step.rec.outcome_with(action_id, outcome, durability)?;
    result.map(|output| Dispatched::Ran {
        action: action_id,
        output,
    })
}

/// The answer a decision entry recorded (by `retie approve`/`deny` or an
/// earlier process): an approval binds the digest it names, an edit the
/// digest that was shown. A field the verdict needs that is missing is an
/// error, never a fallback.
fn recorded_approval(d: &Value) -> Result<Approval, Error> {
    let d: retie_ledger::payload::Decision = retie_ledger::payload::parse(d)
        .map_err(|e| Error::Invalid(format!("the recorded decision is ill-typed: {e}")))?;
    d.check()
        .map_err(|e| Error::Invalid(format!("the recorded decision is ill-typed: {e}")))?;
    let digest = |field: &str, v: &Option<String>| -> Result<retie_policy::Digest, Error> {
        v.as_deref()
            .and_then(|h| h.parse().ok())
            .ok_or_else(|| Error::Invalid(format!("the recorded decision has no {field}")))
    };
    let by = d.decided_by.clone();
    Ok(match d.verdict.as_str() {
        "approve" => Approval::Approved {
            by,
            digest: digest("approved_digest", &d.approved_digest)?,
        },
        "edit" => Approval::Edit {
            by,
            digest: digest("shown_digest", &d.shown_digest)?,
            arguments: d
                .edited_arguments
                .ok_or_else(|| Error::Invalid("the recorded edit has no arguments".into()))?,
        },
        "deny" => Approval::Denied {
            by,
            reason: d
                .deny_reason
                .ok_or_else(|| Error::Invalid("the recorded deny has no reason".into()))?,
        },
        v => {
            return Err(Error::Invalid(format!(
                "the recorded decision's verdict {v:?} answers no pending approval"
            )))
        }
    })
}

fn strictness(v: Verdict) -> u8 {
    match v {
        Verdict::Run => 0,
        Verdict::Ask => 1,
        Verdict::Deny => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 27 item 3: a recorded edit without the digest that was
    /// shown is refused; it once fell back to the action's own digest.
    #[test]
    fn a_recorded_edit_without_its_shown_digest_is_refused() {
        let mut d = json!({
            "verdict": "edit", "decided_by": "person (retie approve --edit)",
            "class": "irreversible", "reason": "asks", "approved_digest": null,
            "shown_digest": "00".repeat(32), "edited_arguments": {"command": "ls"},
            "pending": 3, "proposal": 2,
        });
        assert!(matches!(recorded_approval(&d), Ok(Approval::Edit { .. })));
        d.as_object_mut().expect("object").remove("shown_digest");
        let e = recorded_approval(&d).expect_err("refused");
        assert!(e.to_string().contains("shown_digest"), "{e}");
        // A deny with no reason is no "the person said no".
        let deny = json!({
            "verdict": "deny", "decided_by": "person", "class": "irreversible",
            "reason": "asks", "approved_digest": null, "shown_digest": "00".repeat(32),
            "pending": 3, "proposal": 2,
        });
        assert!(recorded_approval(&deny).is_err());
    }
}
