//! Content inspection of writes: a separate axis from reversibility.
//!
//! Each rule counts the matches of its pattern in the old and in the new text
//! of a file. A rule that `fires_on = "increase"` (a secret, `verify=False`)
//! fires when the new text has more matches than the old one; a rule that
//! `fires_on = "decrease"` (an auth check, a signature check) fires when it
//! has fewer. Counting rather than diffing lines keeps in-place edits quiet:
//! appending `timeout=5` to a call that keeps `verify=True` changes the line
//! but not the count. The rules themselves live in the policy file.

use std::fmt;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::gate::RiskLevel;

/// What a rule looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Hard-coded credentials and private keys.
    HardcodedSecret,
    /// TLS certificate verification switched off.
    TlsVerificationDisabled,
    /// Authentication checks or permission decorators removed.
    AuthCheckRemoved,
    /// Cryptographic or signature verification removed.
    CryptoVerificationRemoved,
    /// `shell=True` or shell commands built from strings.
    ShellInjection,
    /// SQL built by string interpolation.
    SqlInterpolation,
    /// World-writable permissions.
    WorldWritable,
    /// Piping a download into a shell.
    CurlPipeShell,
}

impl Category {
    /// Every category.
    pub const ALL: [Category; 8] = [
        Category::HardcodedSecret,
        Category::TlsVerificationDisabled,
        Category::AuthCheckRemoved,
        Category::CryptoVerificationRemoved,
        Category::ShellInjection,
        Category::SqlInterpolation,
        Category::WorldWritable,
        Category::CurlPipeShell,
    ];

    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            Category::HardcodedSecret => "hardcoded_secret",
            Category::TlsVerificationDisabled => "tls_verification_disabled",
            Category::AuthCheckRemoved => "auth_check_removed",
            Category::CryptoVerificationRemoved => "crypto_verification_removed",
            Category::ShellInjection => "shell_injection",
            Category::SqlInterpolation => "sql_interpolation",
            Category::WorldWritable => "world_writable",
            Category::CurlPipeShell => "curl_pipe_shell",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which change of count makes a rule fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FiresOn {
    /// More matches in the new text than in the old.
    Increase,
    /// Fewer matches in the new text than in the old.
    Decrease,
}

impl FiresOn {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            FiresOn::Increase => "increase",
            FiresOn::Decrease => "decrease",
        }
    }
}

/// A compiled inspection rule.
#[derive(Debug, Clone)]
pub struct Rule {
    name: String,
    category: Category,
    level: RiskLevel,
    fires_on: FiresOn,
    pattern: Regex,
    why: String,
}

/// Upper bound on a compiled pattern, so a policy cannot make inspection slow.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

impl Rule {
    /// Compile a rule. The error is a sentence saying what is wrong.
    pub fn new(
        name: &str,
        category: Category,
        level: RiskLevel,
        fires_on: FiresOn,
        pattern: &str,
        why: &str,
    ) -> Result<Rule, String> {
        if pattern.is_empty() {
            return Err("pattern is empty".into());
        }
        let pattern = regex::RegexBuilder::new(pattern)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| format!("pattern is not a valid regex: {e}"))?;
        if pattern.is_match("") {
            return Err("pattern matches the empty string, so it would count everywhere".into());
        }
        Ok(Rule {
            name: name.to_owned(),
            category,
            level,
            fires_on,
            pattern,
            why: why.to_owned(),
        })
    }

    /// Matches of the pattern in `text` (non-overlapping).
    pub fn count(&self, text: &str) -> usize {
        self.pattern.find_iter(text).count()
    }

    /// Rule name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Category.
    pub fn category(&self) -> Category {
        self.category
    }

    /// Level when it fires.
    pub fn level(&self) -> RiskLevel {
        self.level
    }

    /// Which change of count fires it.
    pub fn fires_on(&self) -> FiresOn {
        self.fires_on
    }

    /// The rule as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "category": self.category,
            "level": self.level,
            "fires_on": self.fires_on,
            "pattern": self.pattern.as_str(),
            "why": self.why,
        })
    }
}

/// One rule that fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Rule name.
    pub rule: String,
    /// Its category.
    pub category: Category,
    /// Its level.
    pub level: RiskLevel,
    /// Matches in the old text.
    pub old_count: usize,
    /// Matches in the new text.
    pub new_count: usize,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} [{}] ({} -> {})",
            self.level, self.rule, self.category, self.old_count, self.new_count
        )
    }
}

/// The result of inspecting one write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inspection {
    /// The highest level among the findings (none if there are none).
    pub level: RiskLevel,
    /// Every rule that fired, in policy order.
    pub findings: Vec<Finding>,
}

/// Inspect a write that turns `old` into `new` (`old` is empty for a new
/// file). Rules of level `none` are counted but never fire.
pub fn inspect(rules: &[Rule], old: &str, new: &str) -> Inspection {
    let mut findings = Vec::new();
    for rule in rules {
        if rule.level == RiskLevel::None {
            continue;
        }
        let old_count = rule.count(old);
        let new_count = rule.count(new);
        let fires = match rule.fires_on {
            FiresOn::Increase => new_count > old_count,
            FiresOn::Decrease => new_count < old_count,
        };
        if fires {
            findings.push(Finding {
                rule: rule.name.clone(),
                category: rule.category,
                level: rule.level,
                old_count,
                new_count,
            });
        }
    }
    let level = findings
        .iter()
        .map(|f| f.level)
        .max()
        .unwrap_or(RiskLevel::None);
    Inspection { level, findings }
}
