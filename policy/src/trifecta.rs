//! The lethal trifecta: untrusted content in, private data around, a way out.
//!
//! A session that has taken in untrusted content is *tainted* from then on.
//! In a tainted session, an action that can send data out is flagged: it asks
//! in every tier (or is denied, in the policy's deny mode). Taint is a value
//! the caller keeps and updates with [`Taint::after`]; this module holds no
//! state of its own.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::action::{Action, Effect};
use crate::policy::Policy;

/// A tool's trifecta capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Brings content retie does not trust into the session.
    UntrustedContent,
    /// Reads private data.
    PrivateData,
    /// Can send data out.
    Egress,
}

impl Capability {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            Capability::UntrustedContent => "untrusted_content",
            Capability::PrivateData => "private_data",
            Capability::Egress => "egress",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a session has taken in so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    /// It has read untrusted content (it is tainted).
    pub untrusted: bool,
    /// It has read private data.
    pub private: bool,
}

impl Taint {
    /// A clean session.
    pub fn clean() -> Taint {
        Taint::default()
    }

    /// A session that has taken in untrusted content.
    pub fn tainted() -> Taint {
        Taint {
            untrusted: true,
            private: false,
        }
    }

    /// The taint after `action` has run. Taint only grows.
    pub fn after(self, policy: &Policy, action: &Action) -> Taint {
        Taint {
            untrusted: self.untrusted || brings_untrusted(policy, action),
            private: self.private || reads_private(policy, action),
        }
    }
}

fn has_cap(policy: &Policy, action: &Action, cap: Capability) -> bool {
    policy
        .tool(action.tool())
        .is_some_and(|t| t.capabilities.contains(&cap))
}

/// The action brings untrusted content into the session: its tool has the
/// `untrusted_content` capability (every action of it does), or it declares
/// `reads_untrusted`, `network_egress` or `lab_access` (this one does: a
/// bash run with network or in lab mode, input the person marked untrusted).
pub fn brings_untrusted(policy: &Policy, action: &Action) -> bool {
    has_cap(policy, action, Capability::UntrustedContent)
        || action.effects().iter().any(|e| e.brings_untrusted())
}

/// The action reads private data.
pub fn reads_private(policy: &Policy, action: &Action) -> bool {
    has_cap(policy, action, Capability::PrivateData)
        || action.effects().contains(&Effect::ReadsPrivate)
}

/// The action can send data out: its tool has the egress capability, or it
/// declares an effect that reaches outside (network, lab, unsandboxed code).
/// A tool the policy does not know is assumed able to.
pub fn can_send_out(policy: &Policy, action: &Action) -> bool {
    policy.tool(action.tool()).is_none()
        || has_cap(policy, action, Capability::Egress)
        || action.effects().iter().any(|e| e.can_send_out())
}

/// Whether the trifecta check fires for `action` in a session with `taint`.
pub fn fires(taint: Taint, policy: &Policy, action: &Action) -> bool {
    taint.untrusted && can_send_out(policy, action)
}
