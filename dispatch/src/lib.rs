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

pub mod display;
pub mod overlay;
pub mod record;
pub mod sandbox;

use retie_policy::{
    evaluate, gate, Action, ClassKind, Context, Evaluation, GateInput, Policy, Verdict,
};
use serde_json::{json, Value};

pub use record::Recorder;

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
    /// Do not run it; `reason` goes back to whoever proposed it.
    Denied { by: String, reason: String },
}

/// Answers the gate's questions.
pub trait Approver {
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval;
}

/// The person who typed the command line has approved exactly what they
/// typed: `retie sandbox exec -- CMD` is its own approval. The policy
/// still decides the class and may deny; a deny is not overridden.
pub struct CommandLine;

impl Approver for CommandLine {
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
    fn execute(&mut self, action: &Action, step: &mut Step<'_>) -> Result<Self::Output, Error>;
}

/// An action between its intent and its outcome.
pub struct Step<'r> {
    rec: &'r mut Recorder,
    action_id: i64,
    outcome: Option<Value>,
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

    /// How the action ended (recorded after `execute` returns).
    pub fn set_outcome(&mut self, outcome: Value) {
        self.outcome = Some(outcome);
    }
}

/// How a dispatched action ended.
#[derive(Debug)]
pub enum Dispatched<O> {
    /// It ran; `action` is its id in the ledger.
    Ran { action: i64, output: O },
    /// It did not run: the policy denied it or the approver said no.
    Refused { reason: String, by: String },
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
    let class = if plan.reversible {
        ev.class.kind()
    } else {
        ClassKind::Irreversible
    };
    let proposed = json!({
        "origin": proposal.origin,
        "action": action.to_json(),
        "digest": ev.digest.to_hex(),
        "evaluation": ev.to_json(),
    });
    let (by, refusal) = match ev.decision.verdict {
        Verdict::Run => ("policy".to_string(), None),
        Verdict::Deny => ("policy".to_string(), Some(ev.decision.reason().to_string())),
        Verdict::Ask => match approver.approve(&ApprovalRequest {
            action: &action,
            evaluation: &ev,
            plan: &plan,
        }) {
            Approval::Approved { by, digest } => {
                // What runs is exactly what was shown.
                retie_policy::ensure_approved(&digest, &action)?;
                (by, None)
            }
            Approval::Denied { by, reason } => (by, Some(reason)),
        },
    };
    let decision = json!({
        "verdict": ev.decision.verdict,
        "decided_by": by,
        "class": class,
        "reason": ev.decision.reason().to_string(),
        "approved_digest": refusal.is_none().then(|| ev.digest.to_hex()),
    });
    if let Some(reason) = refusal {
        rec.refuse(proposed, decision, json!({ "reason": reason, "by": by }))?;
        return Ok(Dispatched::Refused { reason, by });
    }
    // Record: proposal, decision and intent with the undo plan, durably,
    // in one transaction, before anything runs.
    let intent = json!({
        "decision": "allow",
        "decided_by": by,
        "class": if plan.reversible { "reversible" } else { "not_reversible" },
        "undo": plan.detail,
        "digest": ev.digest.to_hex(),
    });
    let action_id = rec.begin(proposed, decision, intent)?;
    // Execute.
    let mut step = Step {
        rec,
        action_id,
        outcome: None,
    };
    let result = exec.execute(&action, &mut step);
    let outcome = match (&result, step.outcome.take()) {
        (Ok(_), Some(o)) => o,
        (Ok(_), None) => json!({ "status": "ran" }),
        (Err(e), _) => json!({ "status": "failed", "failure": e.to_string() }),
    };
    // Confirm: the outcome, after.
    step.rec.outcome(action_id, outcome)?;
    result.map(|output| Dispatched::Ran {
        action: action_id,
        output,
    })
}

fn strictness(v: Verdict) -> u8 {
    match v {
        Verdict::Run => 0,
        Verdict::Ask => 1,
        Verdict::Deny => 2,
    }
}
