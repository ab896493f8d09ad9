//! # retie-policy: pure decisions between the model and the machine
//!
//! For every proposed [`Action`] retie asks one question: can this be undone,
//! and if not, who said yes? This crate answers it without I/O (beyond
//! parsing the policy text it is handed), deterministically, so that it can
//! be tested exhaustively and fuzzed.
//!
//! The principal entry point is [`evaluate`]: it classifies an action
//! ([`classify`]), checks the lethal trifecta ([`trifecta`]), reads a shell
//! command line if the tool has one ([`shell`]), and asks the [`gate()`] for a
//! [`Decision`] (run / ask / deny, with reasons). Around it:
//!
//! - [`Policy`]: the loaded policy file (`policy/default.toml` is shipped and
//!   embedded), with a stable [`Policy::digest`].
//! - [`Action`]: tool, frozen arguments, declared effects, and the digest an
//!   approval binds to; [`ensure_approved`] refuses a mismatch.
//! - [`inspect()`]: content inspection of a write, count-based over old and new
//!   text; its [`RiskLevel`] feeds the gate through [`Context::risk`].
//! - [`urlguard`]: the fetch tool's SSRF guard, pure over (URL, addresses).
//!
//! ```
//! use retie_policy::{evaluate, Action, Context, Effect, Policy, Tier, Value, Verdict};
//!
//! let policy = Policy::shipped().expect("the shipped policy loads");
//! let args = Value::object([("command", Value::from("cargo test"))]);
//! let action = Action::new("bash", args, [Effect::RunsSandboxed]).expect("well formed");
//! let ev = evaluate(&policy, &action, &Context::new(Tier::Gated));
//! assert_eq!(ev.decision.verdict, Verdict::Run);
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod action;
pub mod class;
pub mod display;
pub mod error;
pub mod gate;
pub mod inspect;
pub mod netguard;
pub mod policy;
pub mod shell;
pub mod trifecta;
pub mod urlguard;
pub mod value;

pub use action::{ensure_approved, Action, Digest, Effect};
pub use class::{classify, Class, ClassKind, Classification, Inverse};
pub use display::escape_for_terminal;
pub use error::Error;
pub use gate::{
    gate, truth_table, truth_table_markdown, AskOn, Decision, GateInput, GateRules, Reason,
    RiskLevel, Tier, TrifectaMode, TruthRow, UnknownTools, Verdict,
};
pub use inspect::{inspect, inspect_file, Category, Finding, Inspection};
pub use policy::{Policy, ToolSpec, DEFAULT_POLICY};
pub use shell::{split, Coverage, ShellLine};
pub use trifecta::{Capability, Taint};
pub use value::Value;

use serde::Serialize;

/// The session state an evaluation depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// The session's autonomy tier.
    pub tier: Tier,
    /// What the session has taken in so far.
    pub taint: Taint,
    /// Content risk of the write, from [`inspect()`] (none if not a write).
    pub risk: RiskLevel,
}

impl Context {
    /// A clean session in `tier`, no content risk.
    pub fn new(tier: Tier) -> Context {
        Context {
            tier,
            taint: Taint::clean(),
            risk: RiskLevel::None,
        }
    }
}

/// A shell command line as read for the prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShellReading {
    /// The command line, as given (render it with [`escape_for_terminal`]).
    pub line: String,
    /// Every simple command bash could run, nested ones included, as
    /// displayed (control characters escaped; empty if it did not parse).
    pub parts: Vec<String>,
    /// The line is plain: literal simple commands joined by operators. Only
    /// a plain line can be covered by allow prefixes; any other is shown as
    /// the raw line with `parts` listed.
    pub plain: bool,
    /// Why it is not plain (empty when it is).
    pub not_plain: Vec<String>,
    /// Why it did not parse, if it did not.
    pub error: Option<String>,
    /// Allow-prefix coverage (None if it did not parse).
    pub coverage: Option<Coverage>,
}

/// Everything [`evaluate`] found out about one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// The action's digest (what an approval binds to).
    pub digest: Digest,
    /// Its class.
    pub class: Class,
    /// Whether the trifecta check fired.
    pub trifecta: bool,
    /// The reading of its shell command line, for shell tools.
    pub shell: Option<ShellReading>,
    /// The decision.
    pub decision: Decision,
}

impl Evaluation {
    /// The JSON shape printed by `retie policy explain --json` (see
    /// `docs/policy.md`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "digest": self.digest.to_hex(),
            "class": self.class.kind(),
            "class_detail": self.class.to_string(),
            "trifecta": self.trifecta,
            "decision": self.decision.verdict,
            "reason": self.decision.reason().to_string(),
            "reasons": self.decision.reasons.iter().map(|r| serde_json::json!({
                "code": r.code(),
                "text": r.to_string(),
            })).collect::<Vec<_>>(),
            "shell": self.shell,
        })
    }
}

/// Classify and gate one action. Pure.
///
/// Order: classify; then the gate decides from (tier, class,
/// requires_approval, risk, trifecta); then two checks that can only make the
/// decision stricter: an effect the tool is not allowed to declare, and a
/// shell command part matching a deny prefix, each deny.
pub fn evaluate(policy: &Policy, action: &Action, ctx: &Context) -> Evaluation {
    let Classification {
        class,
        forbidden_effects,
    } = classify(policy, action);
    let tool = policy.tool(action.tool());
    let trifecta = trifecta::fires(ctx.taint, policy, action);
    let input = GateInput {
        tier: ctx.tier,
        class: class.kind(),
        requires_approval: tool.is_some_and(|t| t.requires_approval),
        risk: ctx.risk,
        trifecta,
    };
    let mut decision = gate(policy.gate_rules(), &input);

    let shell = tool
        .and_then(|t| t.shell_arg.as_deref())
        .and_then(|arg| action.args().get(arg))
        .and_then(Value::as_str)
        .map(|line| {
            let (reading, parsed) = read_shell(policy, line);
            let denied = match &parsed {
                Some(p) => policy.shell_rules().denied(p),
                None => {
                    // Unreadable: a person decides, unless a deny prefix
                    // shows up anywhere among its tokens.
                    decision.ask_at_least(Reason::ShellUnreadable {
                        problem: reading.error.clone().unwrap_or_default(),
                    });
                    policy.shell_rules().denied_in_tokens(line)
                }
            };
            if let Some((command, prefix)) = denied {
                decision.deny_first(Reason::ShellDenied { command, prefix });
            }
            reading
        });
    for effect in forbidden_effects.into_iter().rev() {
        decision.deny_first(Reason::EffectNotPermitted {
            tool: action.tool().to_owned(),
            effect,
        });
    }
    Evaluation {
        digest: action.digest(),
        class,
        trifecta,
        shell,
        decision,
    }
}

fn read_shell(policy: &Policy, line: &str) -> (ShellReading, Option<ShellLine>) {
    match split(line) {
        Ok(parsed) => (
            ShellReading {
                line: line.to_owned(),
                parts: parsed
                    .commands
                    .iter()
                    .map(|c| {
                        let sym = c.connector.symbol();
                        if sym.is_empty() {
                            c.to_string()
                        } else {
                            format!("{sym} {c}")
                        }
                    })
                    .collect(),
                plain: parsed.plain,
                not_plain: parsed.not_plain.clone(),
                error: None,
                coverage: Some(policy.shell_rules().coverage(&parsed)),
            },
            Some(parsed),
        ),
        Err(e) => (
            ShellReading {
                line: line.to_owned(),
                parts: Vec::new(),
                plain: false,
                not_plain: Vec::new(),
                error: Some(e.to_string()),
                coverage: None,
            },
            None,
        ),
    }
}
