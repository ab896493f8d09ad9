//! The gate: run, ask or deny, with a reason a person can read.
//!
//! The gate is a pure function of a small [`GateInput`] and the policy's
//! [`GateRules`], so its whole behaviour fits in a truth table
//! ([`truth_table`]), which `docs/policy.md` publishes and a test checks row
//! by row. When several rules apply the strictest wins (deny > ask > run),
//! and every rule that applied is kept in [`Decision::reasons`].

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::action::Effect;
use crate::class::ClassKind;

/// Autonomy tier of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Every action asks.
    Manual,
    /// Asks for what the policy's `[tiers.gated] ask` lists.
    Gated,
    /// Asks for what the policy's `[tiers.auto] ask` lists.
    Auto,
}

impl Tier {
    /// Every tier, most careful first.
    pub const ALL: [Tier; 3] = [Tier::Manual, Tier::Gated, Tier::Auto];

    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Manual => "manual",
            Tier::Gated => "gated",
            Tier::Auto => "auto",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown tier {s:?} (expected manual, gated or auto)"))
    }
}

/// Content risk of a write, from inspection. It feeds the gate; it never
/// decides alone.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    /// Nothing found.
    #[default]
    None,
    /// Recorded; runs.
    Medium,
    /// Asks (in tiers whose `ask` list has `high_risk`).
    High,
}

impl RiskLevel {
    /// Every level, lowest first.
    pub const ALL: [RiskLevel; 3] = [RiskLevel::None, RiskLevel::Medium, RiskLevel::High];

    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            RiskLevel::None => "none",
            RiskLevel::Medium => "medium",
            RiskLevel::High => "high",
        }
    }
}

impl fmt::Display for RiskLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The three decisions, mildest first (so `max` is the strictest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Runs without asking.
    Run,
    /// Waits for a person.
    Ask,
    /// Does not run.
    Deny,
}

impl Verdict {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Run => "run",
            Verdict::Ask => "ask",
            Verdict::Deny => "deny",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the policy does with actions of unknown class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownTools {
    /// Deny them (the default).
    Deny,
    /// Hand them to the gate like any other class (tiers decide; the shipped
    /// tiers all ask for `unknown`).
    Gate,
}

impl UnknownTools {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            UnknownTools::Deny => "deny",
            UnknownTools::Gate => "gate",
        }
    }
}

/// What the lethal-trifecta check does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrifectaMode {
    /// Ask, in every tier (the default).
    Flag,
    /// Deny.
    Deny,
}

impl TrifectaMode {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            TrifectaMode::Flag => "flag",
            TrifectaMode::Deny => "deny",
        }
    }
}

/// A condition a tier can be told to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AskOn {
    /// Actions of class no_effect.
    NoEffect,
    /// Actions of class reversible.
    Reversible,
    /// Actions of class irreversible.
    Irreversible,
    /// Actions of class unknown (only reached with `unknown_tools = "gate"`).
    Unknown,
    /// Writes whose content inspection is medium or high.
    MediumRisk,
    /// Writes whose content inspection is high.
    HighRisk,
}

impl AskOn {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            AskOn::NoEffect => "no_effect",
            AskOn::Reversible => "reversible",
            AskOn::Irreversible => "irreversible",
            AskOn::Unknown => "unknown",
            AskOn::MediumRisk => "medium_risk",
            AskOn::HighRisk => "high_risk",
        }
    }

    fn for_class(class: ClassKind) -> AskOn {
        match class {
            ClassKind::NoEffect => AskOn::NoEffect,
            ClassKind::Reversible => AskOn::Reversible,
            ClassKind::Irreversible => AskOn::Irreversible,
            ClassKind::Unknown => AskOn::Unknown,
        }
    }

    fn phrase(self) -> &'static str {
        match self {
            AskOn::NoEffect => "actions with no effect",
            AskOn::Reversible => "reversible actions",
            AskOn::Irreversible => "irreversible actions",
            AskOn::Unknown => "actions of unknown class",
            AskOn::MediumRisk => "writes of medium or high content risk",
            AskOn::HighRisk => "writes of high content risk",
        }
    }
}

/// The gate's part of the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateRules {
    /// What happens to unknown actions.
    pub unknown_tools: UnknownTools,
    /// What happens when the trifecta check fires.
    pub trifecta_mode: TrifectaMode,
    /// What the gated tier asks for.
    pub gated_ask: BTreeSet<AskOn>,
    /// What the auto tier asks for.
    pub auto_ask: BTreeSet<AskOn>,
}

impl GateRules {
    /// The rules of the shipped `policy/default.toml`.
    pub fn shipped() -> GateRules {
        GateRules {
            unknown_tools: UnknownTools::Deny,
            trifecta_mode: TrifectaMode::Flag,
            gated_ask: [AskOn::Irreversible, AskOn::Unknown, AskOn::HighRisk]
                .into_iter()
                .collect(),
            auto_ask: [AskOn::Irreversible, AskOn::Unknown].into_iter().collect(),
        }
    }
}

/// Everything the gate looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GateInput {
    /// The session's tier.
    pub tier: Tier,
    /// The action's class.
    pub class: ClassKind,
    /// The tool's `requires_approval`.
    pub requires_approval: bool,
    /// Content risk of the write (none for actions that write nothing).
    pub risk: RiskLevel,
    /// The trifecta check fired: the session is tainted and the action can
    /// send data out.
    pub trifecta: bool,
}

/// Why a decision came out as it did. Each variant reads as a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// The action declares an effect its tool is not allowed to have.
    EffectNotPermitted {
        /// The tool.
        tool: String,
        /// The effect.
        effect: Effect,
    },
    /// A simple command of a shell line matches a deny prefix of the policy.
    ShellDenied {
        /// The simple command.
        command: String,
        /// The policy prefix it matched.
        prefix: String,
    },
    /// A shell command line that cannot be read as bash: a person decides.
    ShellUnreadable {
        /// Why it cannot be read.
        problem: String,
    },
    /// Unknown class, and the policy denies unknown tools.
    UnknownDenied,
    /// Trifecta fired and the policy is in deny mode.
    TrifectaDenied,
    /// Manual tier: everything asks.
    ManualTier,
    /// The tool requires approval in every tier.
    RequiresApproval,
    /// Trifecta fired (flag mode): asks in every tier.
    TrifectaFlagged,
    /// The tier's `ask` list names this class or risk.
    TierAsks {
        /// The tier.
        tier: Tier,
        /// What it asks for.
        on: AskOn,
    },
    /// A person was asked about this exact action (same digest) in an
    /// earlier process of the session: their decision, or the open
    /// question, binds it whatever tier the session runs in now.
    PendingApproval {
        /// The pending entry's seq in the ledger.
        entry: i64,
    },
    /// Medium content risk: recorded, does not ask by itself.
    RiskRecorded,
    /// Nothing asks: the action runs.
    Allowed {
        /// The tier.
        tier: Tier,
        /// The class.
        class: ClassKind,
    },
}

impl Reason {
    /// A short stable code, used by the truth table in `docs/policy.md`.
    pub fn code(&self) -> String {
        match self {
            Reason::EffectNotPermitted { .. } => "effect-not-permitted".into(),
            Reason::ShellDenied { .. } => "shell-denied".into(),
            Reason::ShellUnreadable { .. } => "shell-unreadable".into(),
            Reason::UnknownDenied => "unknown-denied".into(),
            Reason::TrifectaDenied => "trifecta-denied".into(),
            Reason::ManualTier => "manual".into(),
            Reason::RequiresApproval => "requires-approval".into(),
            Reason::TrifectaFlagged => "trifecta".into(),
            Reason::TierAsks { on, .. } => format!("tier-asks:{}", on.name()),
            Reason::PendingApproval { .. } => "pending-approval".into(),
            Reason::RiskRecorded => "risk-recorded".into(),
            Reason::Allowed { .. } => "allowed".into(),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::EffectNotPermitted { tool, effect } => write!(
                f,
                "the action declares {effect}, which the policy does not allow tool {tool:?} to have"
            ),
            Reason::ShellDenied { command, prefix } => write!(
                f,
                "the shell command part \"{}\" matches the policy's deny prefix \"{}\"",
                crate::display::escape_for_terminal(command),
                crate::display::escape_for_terminal(prefix)
            ),
            Reason::ShellUnreadable { problem } => write!(
                f,
                "the shell command line cannot be read as bash ({problem}), so no one can say what it runs: a person decides"
            ),
            Reason::UnknownDenied => f.write_str(
                "no rule says how to undo this action (unknown class), and the policy denies unknown tools",
            ),
            Reason::TrifectaDenied => f.write_str(
                "the session has taken in untrusted content and this action can send data out; the policy denies that (trifecta deny mode)",
            ),
            Reason::ManualTier => f.write_str("manual tier: every action asks"),
            Reason::RequiresApproval => {
                f.write_str("the tool requires approval, in every tier")
            }
            Reason::TrifectaFlagged => f.write_str(
                "the session has taken in untrusted content and this action can send data out (lethal trifecta): a person decides",
            ),
            Reason::TierAsks { tier, on } => write!(f, "the {tier} tier asks for {}", on.phrase()),
            Reason::PendingApproval { entry } => write!(
                f,
                "a person was asked about this exact action (pending approval {entry}): their decision binds it, whatever the autonomy now"
            ),
            Reason::RiskRecorded => {
                f.write_str("content risk is medium: recorded, does not ask by itself")
            }
            Reason::Allowed { tier, class } => {
                write!(f, "the {tier} tier runs {} without asking", AskOn::for_class(*class).phrase())
            }
        }
    }
}

/// A decision and every reason that contributed, strictest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Run, ask or deny.
    pub verdict: Verdict,
    /// Non-empty; the first is the one that decided.
    pub reasons: Vec<Reason>,
}

impl Decision {
    /// The reason that decided.
    pub fn reason(&self) -> &Reason {
        // `reasons` is never empty: every constructor pushes one.
        &self.reasons[0]
    }

    /// Every reason's code, strictest first, joined by `+`.
    pub fn codes(&self) -> String {
        self.reasons
            .iter()
            .map(Reason::code)
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Make this decision at least an ask for `reason`: a run becomes an
    /// ask, an ask or a denial keeps its verdict and gains the reason.
    pub(crate) fn ask_at_least(&mut self, reason: Reason) {
        match self.verdict {
            Verdict::Run => {
                self.verdict = Verdict::Ask;
                self.reasons
                    .retain(|r| !matches!(r, Reason::Allowed { .. } | Reason::RiskRecorded));
                self.reasons.insert(0, reason);
            }
            Verdict::Ask | Verdict::Deny => self.reasons.push(reason),
        }
    }

    /// Make this decision a denial for `reason`, keeping the others.
    pub(crate) fn deny_first(&mut self, reason: Reason) {
        self.verdict = Verdict::Deny;
        self.reasons
            .retain(|r| !matches!(r, Reason::Allowed { .. } | Reason::RiskRecorded));
        self.reasons.insert(0, reason);
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.verdict, self.reason())
    }
}

/// Decide. Pure; allocates only the reason list.
pub fn gate(rules: &GateRules, input: &GateInput) -> Decision {
    let mut deny = Vec::new();
    let mut ask = Vec::new();

    if input.class == ClassKind::Unknown && rules.unknown_tools == UnknownTools::Deny {
        deny.push(Reason::UnknownDenied);
    }
    if input.trifecta && rules.trifecta_mode == TrifectaMode::Deny {
        deny.push(Reason::TrifectaDenied);
    }
    if input.tier == Tier::Manual {
        ask.push(Reason::ManualTier);
    }
    if input.requires_approval {
        ask.push(Reason::RequiresApproval);
    }
    if input.trifecta && rules.trifecta_mode == TrifectaMode::Flag {
        ask.push(Reason::TrifectaFlagged);
    }
    let tier_ask = match input.tier {
        Tier::Manual => None,
        Tier::Gated => Some(&rules.gated_ask),
        Tier::Auto => Some(&rules.auto_ask),
    };
    if let Some(list) = tier_ask {
        let on_class = AskOn::for_class(input.class);
        if list.contains(&on_class) {
            ask.push(Reason::TierAsks {
                tier: input.tier,
                on: on_class,
            });
        }
        let on_risk = match input.risk {
            RiskLevel::High if list.contains(&AskOn::HighRisk) => Some(AskOn::HighRisk),
            RiskLevel::High | RiskLevel::Medium if list.contains(&AskOn::MediumRisk) => {
                Some(AskOn::MediumRisk)
            }
            _ => None,
        };
        if let Some(on) = on_risk {
            ask.push(Reason::TierAsks {
                tier: input.tier,
                on,
            });
        }
    }

    let verdict = if !deny.is_empty() {
        Verdict::Deny
    } else if !ask.is_empty() {
        Verdict::Ask
    } else {
        Verdict::Run
    };
    let mut reasons = deny;
    reasons.append(&mut ask);
    if verdict == Verdict::Run {
        reasons.push(Reason::Allowed {
            tier: input.tier,
            class: input.class,
        });
    }
    if input.risk != RiskLevel::None && verdict == Verdict::Run {
        reasons.push(Reason::RiskRecorded);
    }
    Decision { verdict, reasons }
}

/// One row of the truth table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruthRow {
    /// The input.
    pub input: GateInput,
    /// What the gate decides for it.
    pub decision: Decision,
}

/// Every combination of [`GateInput`], decided under `rules`, in a fixed
/// order (tier, class, requires_approval, risk, trifecta).
pub fn truth_table(rules: &GateRules) -> Vec<TruthRow> {
    let mut rows = Vec::with_capacity(144);
    for tier in Tier::ALL {
        for class in ClassKind::ALL {
            for requires_approval in [false, true] {
                for risk in RiskLevel::ALL {
                    for trifecta in [false, true] {
                        let input = GateInput {
                            tier,
                            class,
                            requires_approval,
                            risk,
                            trifecta,
                        };
                        let decision = gate(rules, &input);
                        rows.push(TruthRow { input, decision });
                    }
                }
            }
        }
    }
    rows
}

/// Render a truth table as a Markdown table (what `docs/policy.md` holds).
pub fn truth_table_markdown(rows: &[TruthRow]) -> String {
    let mut out = String::from(
        "| tier | class | requires_approval | risk | trifecta | decision | reasons (deciding one first) |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        let i = &row.input;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            i.tier,
            i.class,
            if i.requires_approval { "yes" } else { "no" },
            i.risk,
            if i.trifecta { "yes" } else { "no" },
            row.decision.verdict,
            row.decision.codes(),
        ));
    }
    out
}
