//! A proposed action: the tool, its frozen arguments, its declared effects,
//! and the digest a person's approval is bound to.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::Error;
use crate::value::{encode_bytes, encode_len, Value};

/// Domain separator of the action digest; bump the version if the encoding
/// ever changes, so an old approval can never match a new encoding.
const ACTION_DOMAIN: &[u8] = b"retie.action.v1\0";

/// What an action declares it will do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Reads files inside the workspace.
    ReadsWorkspace,
    /// Writes files inside the workspace.
    WritesWorkspace,
    /// Runs code inside the sandbox (no network, workspace snapshotted).
    RunsSandboxed,
    /// Runs code outside the sandbox.
    RunsUnsandboxed,
    /// Sends data over the network.
    NetworkEgress,
    /// Talks to a lab target.
    LabAccess,
    /// Takes in content retie does not trust (a fetched page, a lab response).
    ReadsUntrusted,
    /// Reads private data.
    ReadsPrivate,
}

impl Effect {
    /// Every effect, in declaration order.
    pub const ALL: [Effect; 8] = [
        Effect::ReadsWorkspace,
        Effect::WritesWorkspace,
        Effect::RunsSandboxed,
        Effect::RunsUnsandboxed,
        Effect::NetworkEgress,
        Effect::LabAccess,
        Effect::ReadsUntrusted,
        Effect::ReadsPrivate,
    ];

    /// The stable name used in policy files, JSON and the digest.
    pub fn name(self) -> &'static str {
        match self {
            Effect::ReadsWorkspace => "reads_workspace",
            Effect::WritesWorkspace => "writes_workspace",
            Effect::RunsSandboxed => "runs_sandboxed",
            Effect::RunsUnsandboxed => "runs_unsandboxed",
            Effect::NetworkEgress => "network_egress",
            Effect::LabAccess => "lab_access",
            Effect::ReadsUntrusted => "reads_untrusted",
            Effect::ReadsPrivate => "reads_private",
        }
    }

    /// Effects that act on something retie cannot roll back.
    pub fn is_irreversible(self) -> bool {
        matches!(
            self,
            Effect::RunsUnsandboxed | Effect::NetworkEgress | Effect::LabAccess
        )
    }

    /// Effects that change the workspace (undoable given an inverse).
    pub fn changes_workspace(self) -> bool {
        matches!(self, Effect::WritesWorkspace | Effect::RunsSandboxed)
    }

    /// Effects whose results come from outside retie's trust: content read
    /// from an untrusted source, anything a networked run or a lab target
    /// sent back. An action declaring one taints the session.
    pub fn brings_untrusted(self) -> bool {
        matches!(
            self,
            Effect::ReadsUntrusted | Effect::NetworkEgress | Effect::LabAccess
        )
    }

    /// Effects through which data can leave the machine.
    pub fn can_send_out(self) -> bool {
        self.is_irreversible()
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A SHA-256 digest, shown as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Hash `bytes` after a domain separator.
    pub(crate) fn of(domain: &[u8], bytes: &[u8]) -> Digest {
        let mut h = Sha256::new();
        h.update(domain);
        h.update(bytes);
        Digest(h.finalize().into())
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl FromStr for Digest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out)
            .map_err(|_| Error::DigestSyntax { got: s.to_owned() })?;
        Ok(Digest(out))
    }
}

/// A proposed action. Its fields are private and it has no mutating methods:
/// once built, what is shown for approval is exactly what can run, and its
/// digest is computed once, at construction.
#[derive(Debug, Clone, PartialEq)]
pub struct Action {
    tool: String,
    args: Value,
    effects: BTreeSet<Effect>,
    digest: Digest,
}

/// The JSON shape of an action: `{"tool": "...", "args": {...}, "effects": [...]}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionWire {
    tool: String,
    #[serde(default)]
    args: Option<serde_json::Value>,
    #[serde(default)]
    effects: Vec<Effect>,
}

impl Action {
    /// Build an action. `args` must be an object (or `Value::Null`, read as `{}`).
    pub fn new<I>(tool: impl Into<String>, args: Value, effects: I) -> Result<Action, Error>
    where
        I: IntoIterator<Item = Effect>,
    {
        let tool = tool.into();
        if tool.is_empty() {
            return Err(Error::ActionInvalid {
                problem: "tool name is empty".into(),
            });
        }
        let args = match args {
            Value::Null => Value::object(Vec::<(String, Value)>::new()),
            obj @ Value::Object(_) => obj,
            other => {
                return Err(Error::ActionInvalid {
                    problem: format!("args must be a JSON object, got {other}"),
                })
            }
        };
        let effects: BTreeSet<Effect> = effects.into_iter().collect();
        let digest = Digest::of(ACTION_DOMAIN, &canonical(&tool, &args, &effects));
        Ok(Action {
            tool,
            args,
            effects,
            digest,
        })
    }

    /// Read an action from its JSON text.
    pub fn from_json(text: &str) -> Result<Action, Error> {
        let wire: ActionWire = serde_json::from_str(text).map_err(|e| Error::ActionInvalid {
            problem: e.to_string(),
        })?;
        let args = match &wire.args {
            None => Value::Null,
            Some(json) => Value::from_json(json).ok_or_else(|| Error::ActionInvalid {
                problem: "args contain a number that is not finite".into(),
            })?,
        };
        Action::new(wire.tool, args, wire.effects)
    }

    /// The action as JSON, in the same shape [`Action::from_json`] reads.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "tool": self.tool,
            "args": self.args.to_json(),
            "effects": self.effects.iter().map(|e| e.name()).collect::<Vec<_>>(),
        })
    }

    /// The tool name.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The frozen arguments (always an object).
    pub fn args(&self) -> &Value {
        &self.args
    }

    /// The declared effects, sorted.
    pub fn effects(&self) -> &BTreeSet<Effect> {
        &self.effects
    }

    /// The digest of the canonical encoding: what an approval binds to.
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

/// The canonical bytes of an action (without the domain separator).
fn canonical(tool: &str, args: &Value, effects: &BTreeSet<Effect>) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    encode_bytes(tool.as_bytes(), &mut out);
    args.encode(&mut out);
    encode_len(effects.len(), &mut out);
    for e in effects {
        encode_bytes(e.name().as_bytes(), &mut out);
    }
    out
}

/// Refuse to execute `action` unless it is exactly the one approved.
///
/// Call this at the single point where an approved action is about to run.
pub fn ensure_approved(approved: &Digest, action: &Action) -> Result<(), Error> {
    let actual = action.digest();
    if &actual == approved {
        Ok(())
    } else {
        Err(Error::DigestMismatch {
            approved: *approved,
            actual,
        })
    }
}
