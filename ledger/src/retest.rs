//! Typed payloads of a retest session (issue 28), written and read by
//! this one definition: the opening's `retest` object and the verdict
//! note. A finding itself is kept as the JSON of `retie-finding`'s
//! `Finding` (the ledger does not depend on the importers).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The key of a verdict note's payload.
pub const VERDICT_KEY: &str = "retest_verdict";
/// The key of an operator's adjudication note.
pub const ADJUDICATION_KEY: &str = "retest_adjudication";
/// The key of the note written when the operator ends a retest before
/// any verdict (`/end`, Ctrl-D at the prompt): no verdict is invented.
pub const ENDED_KEY: &str = "retest_ended";

/// A finding's origin and the lab origin it became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginPair {
    pub from: String,
    pub to: String,
}

/// What a retest session retests: in its opening entry, under `retest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetestOpened {
    /// The finding as imported, origins still as reported.
    pub finding: Value,
    /// The finding with its URLs on the lab (what the agent was given).
    pub finding_on_lab: Value,
    pub lab: String,
    pub lab_ports: Vec<u16>,
    pub origin_map: Vec<OriginPair>,
    pub max_steps: u32,
    /// The tools checked in the sandbox's view before the first step.
    pub tools_checked: Vec<String>,
    /// The scratch directory commands ran in.
    pub scratch: String,
}

/// One command the retest ran (the agent's or the operator's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRun {
    pub output_id: String,
    pub command: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// The recorded output (capped), as the model read it.
    pub output: String,
    /// The operator's own command (`!CMD` at the prompt), not the model's.
    #[serde(default)]
    pub operator: bool,
}

/// One cited excerpt, with the command that printed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceItem {
    pub output_id: String,
    pub excerpt: String,
    pub command: String,
}

/// The verdict of a retest session: a note, durable before the session
/// closes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetestVerdict {
    /// `still_open`, `fixed` or `inconclusive`.
    pub status: String,
    pub rationale: String,
    /// `agent` (its valid conclusion) or `retie` (the budget ran out, the
    /// session stopped without one).
    pub decided_by: String,
    pub evidence: Vec<EvidenceItem>,
    /// Every command run, in order: the original payload and the variants.
    pub commands: Vec<CommandRun>,
    /// Model turns used, of `max_steps`.
    pub steps: u32,
    pub max_steps: u32,
}

/// An operator's adjudication of a retest (`retest_adjudication`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetestAdjudication {
    pub status: String,
    pub reason: String,
    pub by: String,
    /// The agent's verdict it stands beside, if there was one.
    #[serde(default)]
    pub agent_status: Option<String>,
}

/// A retest the operator ended before any verdict (`retest_ended`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetestEnded {
    pub by: String,
    pub reason: String,
    pub steps: u32,
    pub max_steps: u32,
}

impl RetestVerdict {
    /// The note that records it.
    pub fn to_note(&self) -> crate::payload::Note {
        crate::payload::Note {
            retest_verdict: Some(self.clone()),
            ..Default::default()
        }
    }

    /// The verdict a note carries, if it is a verdict note.
    pub fn from_note(payload: &Value) -> Option<Result<RetestVerdict, serde_json::Error>> {
        payload
            .get(VERDICT_KEY)
            .map(|v| serde_json::from_value(v.clone()))
    }
}
