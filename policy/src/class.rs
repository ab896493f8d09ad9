//! The reversibility classifier: one class per action.
//!
//! The tool's entry in the policy gives the class of its mildest form (e.g.
//! `bash` inside the sandbox is reversible by discarding its changeset); the
//! effects an action declares can only raise it (the same `bash` declaring
//! `runs_unsandboxed` is irreversible). A tool the policy does not name is
//! unknown, and so is one the policy classes as `unknown`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::action::{Action, Effect};
use crate::policy::Policy;

/// How a reversible action is undone. Only inverses the runtime implements
/// can be named; a policy naming another one is rejected when it loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Inverse {
    /// Put back the file contents captured before the write.
    RestorePreImage,
    /// Throw away (or revert) the changeset of a sandboxed run.
    DiscardChangeset,
}

impl Inverse {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            Inverse::RestorePreImage => "restore_pre_image",
            Inverse::DiscardChangeset => "discard_changeset",
        }
    }
}

/// The four classes, without their detail: what the gate looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassKind {
    /// Changes nothing (read, glob, grep, recall).
    NoEffect,
    /// Changes something that a named inverse puts back.
    Reversible,
    /// Acts on something retie cannot roll back.
    Irreversible,
    /// Nobody said how to undo it.
    Unknown,
}

impl ClassKind {
    /// Every class, mildest first.
    pub const ALL: [ClassKind; 4] = [
        ClassKind::NoEffect,
        ClassKind::Reversible,
        ClassKind::Irreversible,
        ClassKind::Unknown,
    ];

    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            ClassKind::NoEffect => "no_effect",
            ClassKind::Reversible => "reversible",
            ClassKind::Irreversible => "irreversible",
            ClassKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ClassKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An action's class with the detail a person needs to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// Changes nothing.
    NoEffect,
    /// Undone by this inverse.
    Reversible(Inverse),
    /// Cannot be undone, and why.
    Irreversible(Irreversibility),
    /// No rule says how to undo it, and why.
    Unknown(Unknownness),
}

/// Why an action is irreversible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Irreversibility {
    /// The policy classes the tool itself as irreversible.
    Tool,
    /// The action declares an effect that acts outside retie's reach.
    Effect(Effect),
}

/// Why an action is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unknownness {
    /// The policy has no entry for the tool.
    Unclassified,
    /// The policy classes the tool as unknown.
    Tool,
}

impl Class {
    /// The class without detail.
    pub fn kind(&self) -> ClassKind {
        match self {
            Class::NoEffect => ClassKind::NoEffect,
            Class::Reversible(_) => ClassKind::Reversible,
            Class::Irreversible(_) => ClassKind::Irreversible,
            Class::Unknown(_) => ClassKind::Unknown,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Class::NoEffect => f.write_str("no effect"),
            Class::Reversible(inv) => write!(f, "reversible (inverse: {})", inv.name()),
            Class::Irreversible(Irreversibility::Tool) => {
                f.write_str("irreversible (the tool acts outside what retie can roll back)")
            }
            Class::Irreversible(Irreversibility::Effect(e)) => {
                write!(
                    f,
                    "irreversible (declares {e}, which retie cannot roll back)"
                )
            }
            Class::Unknown(Unknownness::Unclassified) => {
                f.write_str("unknown (the policy has no entry for this tool)")
            }
            Class::Unknown(Unknownness::Tool) => {
                f.write_str("unknown (the policy classes this tool as unknown)")
            }
        }
    }
}

/// The class of an action, plus the effects it declares that its tool is not
/// allowed to have (which the gate turns into a denial).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// The class.
    pub class: Class,
    /// Declared effects outside the tool's allowed set, sorted.
    pub forbidden_effects: Vec<Effect>,
}

/// Classify an action under a policy.
pub fn classify(policy: &Policy, action: &Action) -> Classification {
    let Some(tool) = policy.tool(action.tool()) else {
        return Classification {
            class: Class::Unknown(Unknownness::Unclassified),
            forbidden_effects: Vec::new(),
        };
    };
    let forbidden_effects: Vec<Effect> = action
        .effects()
        .iter()
        .copied()
        .filter(|e| !tool.effects.contains(e))
        .collect();
    let base = match tool.class {
        ClassKind::NoEffect => Class::NoEffect,
        // The policy loader guarantees a reversible tool names its inverse.
        ClassKind::Reversible => match tool.inverse {
            Some(inv) => Class::Reversible(inv),
            None => Class::Unknown(Unknownness::Tool),
        },
        ClassKind::Irreversible => Class::Irreversible(Irreversibility::Tool),
        ClassKind::Unknown => Class::Unknown(Unknownness::Tool),
    };
    // Declared effects can only raise the class, never lower it.
    let raised = action
        .effects()
        .iter()
        .copied()
        .find(|e| e.is_irreversible())
        .map(|e| Class::Irreversible(Irreversibility::Effect(e)));
    let class = match raised {
        Some(irr) if base.kind() < ClassKind::Irreversible => irr,
        _ => base,
    };
    Classification {
        class,
        forbidden_effects,
    }
}
