//! The policy file: tools, their classes and capabilities, inspection rules,
//! tier behaviour, trifecta mode, shell prefixes.
//!
//! Reading is strict: unknown keys are errors, every error names its line,
//! rules are checked against their own examples, and a tool that claims to
//! be reversible must name its inverse. The loaded policy has a stable
//! digest over its normalized content, so reformatting the file or
//! reordering its tables does not change it, and any change of meaning does.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::action::{Digest, Effect};
use crate::class::{ClassKind, Inverse};
use crate::error::Error;
use crate::gate::{AskOn, GateRules, RiskLevel, Tier, TrifectaMode, UnknownTools};
use crate::inspect::{Category, FiresOn, Rule};
use crate::shell::ShellRules;
use crate::trifecta::Capability;
use crate::value::Value;

/// The text of the shipped default policy.
pub const DEFAULT_POLICY: &str = include_str!("../default.toml");

/// Domain separator of the policy digest.
/// v2: the digest covers the file's content as written (v1 covered it with
/// every default filled in).
const POLICY_DOMAIN: &[u8] = b"retie.policy.v2\0";

/// The only policy format version this crate reads.
pub const POLICY_VERSION: u32 = 1;

// ---- the file, as written -------------------------------------------------

/// The file's tables that errors point into: [`Spanned`] when read from
/// TOML text (an error names the line), [`Bare`] when read from the
/// shipped policy's build-time JSON (checked whole by the tests).
trait Located<T> {
    fn get(&self) -> &T;
    fn span(&self) -> std::ops::Range<usize>;
}

impl<T> Located<T> for Spanned<T> {
    fn get(&self) -> &T {
        self.get_ref()
    }
    fn span(&self) -> std::ops::Range<usize> {
        Spanned::span(self)
    }
}

#[derive(Debug, Deserialize)]
#[serde(transparent)]
struct Bare<T>(T);

impl<T> Located<T> for Bare<T> {
    fn get(&self) -> &T {
        &self.0
    }
    fn span(&self) -> std::ops::Range<usize> {
        0..0
    }
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    bound(deserialize = "T: Deserialize<'de>, R: Deserialize<'de>")
)]
struct PolicyFile<T, R> {
    version: u32,
    #[serde(default = "default_tier")]
    default_tier: Tier,
    #[serde(default = "default_unknown")]
    unknown_tools: UnknownTools,
    #[serde(default)]
    trifecta: TrifectaFile,
    #[serde(default)]
    tiers: TiersFile,
    #[serde(default)]
    tools: BTreeMap<String, T>,
    #[serde(default)]
    shell: ShellFile,
    #[serde(default)]
    rules: Vec<R>,
}

/// The shipped policy as JSON, converted from `default.toml` at build time
/// (build.rs): reading it costs a fifth of reading the TOML.
const SHIPPED_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/shipped.json"));

/// The shipped policy's digest, computed at build time from the same value
/// (`policy_file::the_shipped_policy_reads_the_same_from_json_and_toml`).
const SHIPPED_DIGEST: [u8; 32] = *include_bytes!(concat!(env!("OUT_DIR"), "/shipped.digest"));

fn default_tier() -> Tier {
    Tier::Gated
}

fn default_unknown() -> UnknownTools {
    UnknownTools::Deny
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct TrifectaFile {
    #[serde(default = "default_trifecta_mode")]
    mode: TrifectaMode,
}

fn default_trifecta_mode() -> TrifectaMode {
    TrifectaMode::Flag
}

impl Default for TrifectaFile {
    fn default() -> Self {
        TrifectaFile {
            mode: default_trifecta_mode(),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct TiersFile {
    #[serde(default = "default_gated")]
    gated: TierFile,
    #[serde(default = "default_auto")]
    auto: TierFile,
}

impl Default for TiersFile {
    fn default() -> Self {
        TiersFile {
            gated: default_gated(),
            auto: default_auto(),
        }
    }
}

fn default_gated() -> TierFile {
    TierFile {
        ask: GateRules::shipped().gated_ask,
    }
}

fn default_auto() -> TierFile {
    TierFile {
        ask: GateRules::shipped().auto_ask,
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct TierFile {
    ask: BTreeSet<AskOn>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ToolFile {
    class: ClassKind,
    #[serde(default)]
    inverse: Option<Inverse>,
    #[serde(default)]
    effects: BTreeSet<Effect>,
    #[serde(default)]
    capabilities: BTreeSet<Capability>,
    #[serde(default)]
    requires_approval: bool,
    #[serde(default)]
    shell_arg: Option<String>,
    #[serde(default)]
    why: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ShellFile {
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: String,
    category: Category,
    level: RiskLevel,
    fires_on: FiresOn,
    pattern: String,
    #[serde(default)]
    why: String,
    #[serde(default)]
    examples: ExamplesFile,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    files: Vec<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ExamplesFile {
    #[serde(default, rename = "match")]
    matches: Vec<String>,
    #[serde(default)]
    no_match: Vec<String>,
}

// ---- the loaded policy ----------------------------------------------------

/// One tool as the policy describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolSpec {
    /// The tool name.
    pub name: String,
    /// The class of its mildest form.
    pub class: ClassKind,
    /// Its inverse (present exactly when `class` is reversible).
    pub inverse: Option<Inverse>,
    /// The effects its actions may declare; any other is denied.
    pub effects: BTreeSet<Effect>,
    /// Its trifecta capabilities.
    pub capabilities: BTreeSet<Capability>,
    /// Asks in every tier.
    pub requires_approval: bool,
    /// The argument holding a shell command line, for shell tools.
    pub shell_arg: Option<String>,
    /// Why it is classed this way.
    pub why: String,
}

/// A loaded, validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    default_tier: Tier,
    gate: GateRules,
    tools: BTreeMap<String, ToolSpec>,
    rules: Vec<Rule>,
    shell: ShellRules,
    digest: Digest,
}

impl Policy {
    /// The shipped `policy/default.toml`. Its rules' patterns are compiled
    /// on first use and not checked against their examples here (that is
    /// what makes loading it cheap); `policy_file::shipped_policy_passes_every_load_check`
    /// reads it with [`Policy::parse`], which checks everything.
    pub fn shipped() -> Result<Policy, Error> {
        let file: PolicyFile<Bare<ToolFile>, Bare<RuleFile>> =
            serde_json::from_str(SHIPPED_JSON).map_err(|e| Error::PolicyInvalid {
                line: 0,
                what: "policy".into(),
                problem: format!("the shipped policy's build-time JSON: {e}"),
            })?;
        Policy::read(
            file,
            DEFAULT_POLICY,
            Digest(SHIPPED_DIGEST),
            Checks::Trusted,
        )
    }

    /// Read a policy from TOML text, compiling every rule's pattern and
    /// checking it against its examples.
    pub fn parse(text: &str) -> Result<Policy, Error> {
        let file: PolicyFile<Spanned<ToolFile>, Spanned<RuleFile>> =
            toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let raw: toml::Value = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        Policy::read(file, text, digest_of(&raw)?, Checks::Full)
    }

    /// The policy in `file`; `text` is what its spans point into.
    fn read<T: Located<ToolFile>, R: Located<RuleFile>>(
        file: PolicyFile<T, R>,
        text: &str,
        digest: Digest,
        checks: Checks,
    ) -> Result<Policy, Error> {
        let line = |span: std::ops::Range<usize>| line_col(text, span.start).0;

        if file.version != POLICY_VERSION {
            return Err(Error::PolicyInvalid {
                line: find_key_line(text, "version"),
                what: "version".into(),
                problem: format!(
                    "this retie reads policy version {POLICY_VERSION}, the file says {}",
                    file.version
                ),
            });
        }

        let mut tools = BTreeMap::new();
        for (name, spanned) in &file.tools {
            // The line is found only for an error: counting lines for
            // every entry made loading quadratic in the file's length.
            let spec = check_tool(name, spanned.get()).map_err(|problem| Error::PolicyInvalid {
                line: line(spanned.span()),
                what: format!("tool {name:?}"),
                problem,
            })?;
            tools.insert(name.clone(), spec);
        }

        let mut rules = Vec::new();
        let mut seen = BTreeSet::new();
        for spanned in &file.rules {
            let r = spanned.get();
            let invalid = |problem: String| Error::PolicyInvalid {
                line: line(spanned.span()),
                what: format!("rule {:?}", r.name),
                problem,
            };
            if r.name.trim().is_empty() {
                return Err(invalid("name is empty".into()));
            }
            if !seen.insert(r.name.clone()) {
                return Err(invalid("a rule with this name already exists".into()));
            }
            if checks == Checks::Trusted {
                rules.push(
                    Rule::unchecked(&r.name, r.category, r.level, r.fires_on, &r.pattern, &r.why)
                        .with_files(r.files.clone()),
                );
                continue;
            }
            let rule = Rule::new(&r.name, r.category, r.level, r.fires_on, &r.pattern, &r.why)
                .map_err(invalid)?
                .with_files(r.files.clone());
            for ex in &r.examples.matches {
                if rule.count(ex) == 0 {
                    return Err(invalid(format!(
                        "pattern does not match its own example {ex:?}"
                    )));
                }
            }
            for ex in &r.examples.no_match {
                if rule.count(ex) != 0 {
                    return Err(invalid(format!(
                        "pattern matches its own counter-example {ex:?}"
                    )));
                }
            }
            rules.push(rule);
        }

        let shell = ShellRules::new(&file.shell.allow, &file.shell.deny).map_err(|problem| {
            Error::PolicyInvalid {
                line: find_key_line(text, "[shell]"),
                what: "shell".into(),
                problem,
            }
        })?;

        Ok(Policy {
            default_tier: file.default_tier,
            gate: GateRules {
                unknown_tools: file.unknown_tools,
                trifecta_mode: file.trifecta.mode,
                gated_ask: file.tiers.gated.ask,
                auto_ask: file.tiers.auto.ask,
            },
            tools,
            rules,
            shell,
            digest,
        })
    }

    /// The tier a session starts in unless told otherwise.
    pub fn default_tier(&self) -> Tier {
        self.default_tier
    }

    /// The gate's rules.
    pub fn gate_rules(&self) -> &GateRules {
        &self.gate
    }

    /// The tool named `name`, if the policy classes it.
    pub fn tool(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name)
    }

    /// Every tool, by name.
    pub fn tools(&self) -> &BTreeMap<String, ToolSpec> {
        &self.tools
    }

    /// The content inspection rules, in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The shell prefix rules.
    pub fn shell_rules(&self) -> &ShellRules {
        &self.shell
    }

    /// The stable digest of the loaded policy.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The loaded policy as JSON (what `retie policy show --json` prints
    /// under `"policy"`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "default_tier": self.default_tier,
            "unknown_tools": self.gate.unknown_tools,
            "trifecta_mode": self.gate.trifecta_mode,
            "tiers": {
                "manual": { "ask": ["everything"] },
                "gated": { "ask": self.gate.gated_ask },
                "auto": { "ask": self.gate.auto_ask },
            },
            "tools": self.tools,
            "shell": {
                "allow": self.shell.allow_prefixes(),
                "deny": self.shell.deny_prefixes(),
            },
            "rules": self.rules.iter().map(Rule::to_json).collect::<Vec<_>>(),
        })
    }
}

/// How much [`Policy::read`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Everything: patterns compiled, examples matched.
    Full,
    /// The embedded shipped policy: patterns compiled on first use.
    Trusted,
}

fn check_tool(name: &str, t: &ToolFile) -> Result<ToolSpec, String> {
    if name.trim().is_empty() {
        return Err("tool name is empty".into());
    }
    match (t.class, t.inverse) {
        (ClassKind::Reversible, None) => {
            return Err(
                "class is reversible but no inverse is named; name one (restore_pre_image, discard_changeset) or class it irreversible"
                    .into(),
            )
        }
        (ClassKind::Reversible, Some(_)) => {}
        (other, Some(inv)) => {
            return Err(format!(
                "inverse {} is given but class is {other}; only reversible tools have an inverse",
                inv.name()
            ))
        }
        (_, None) => {}
    }
    if t.class == ClassKind::NoEffect {
        if let Some(e) = t.effects.iter().find(|e| e.changes_workspace()) {
            return Err(format!(
                "class is no_effect but the tool may declare {e}, which changes the workspace; class it reversible with an inverse"
            ));
        }
    }
    let needs = |e: Effect, c: Capability| t.effects.contains(&e) && !t.capabilities.contains(&c);
    for (e, c) in [
        (Effect::NetworkEgress, Capability::Egress),
        (Effect::LabAccess, Capability::Egress),
        (Effect::RunsUnsandboxed, Capability::Egress),
        (Effect::ReadsPrivate, Capability::PrivateData),
    ] {
        if needs(e, c) {
            return Err(format!(
                "the tool may declare {e} but does not have capability {}; add it so the trifecta check sees it",
                c.name()
            ));
        }
    }
    if let Some(arg) = &t.shell_arg {
        if arg.trim().is_empty() {
            return Err("shell_arg is empty".into());
        }
    }
    Ok(ToolSpec {
        name: name.to_owned(),
        class: t.class,
        inverse: t.inverse,
        effects: t.effects.clone(),
        capabilities: t.capabilities.clone(),
        requires_approval: t.requires_approval,
        shell_arg: t.shell_arg.clone(),
        why: t.why.clone(),
    })
}

/// The digest of a policy file: of its content as a value (keys sorted,
/// formatting and comments left out), in the canonical encoding. build.rs
/// computes the shipped policy's the same way.
fn digest_of(file: &toml::Value) -> Result<Digest, Error> {
    let json = serde_json::to_value(file).map_err(|e| Error::PolicyInvalid {
        line: 0,
        what: "policy".into(),
        problem: format!("cannot encode for the digest: {e}"),
    })?;
    let value = Value::from_json(&json).ok_or_else(|| Error::PolicyInvalid {
        line: 0,
        what: "policy".into(),
        problem: "a number is not finite".into(),
    })?;
    let mut bytes = Vec::new();
    value.encode(&mut bytes);
    Ok(Digest::of(POLICY_DOMAIN, &bytes))
}

fn syntax_error(text: &str, e: &toml::de::Error) -> Error {
    let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
    Error::PolicySyntax {
        line,
        column,
        problem: e.message().trim().to_owned(),
    }
}

/// 1-based line and column of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before.get(nl + 1..).map_or(0, |s| s.chars().count())
    }) + 1;
    (line, column)
}

/// The line of the first line starting with `key`, or 0.
fn find_key_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| l.trim_start().starts_with(key))
        .map_or(0, |i| i + 1)
}
