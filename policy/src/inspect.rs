//! Content inspection of writes: a separate axis from reversibility.
//!
//! Each rule compares what its pattern matches in the old and in the new
//! text of a file, not only how often. The text is first read the way the
//! file's language reads it: comments are dropped (`#`, `//`, `/* */`,
//! `--`, `<!-- -->` by file type), so a guard commented out is a guard
//! removed. Each match becomes a key: the matched text, and for a decorator
//! (`@login_required`, `[Authorize]`) also the name of the function it
//! guards, so a decorator moved from one view to another is a change.
//! Matches that are placeholders (`YOUR_API_KEY_HERE`, `changeme`,
//! `********`, `<...>`, `xxx`, `${...}`) are not keys.
//!
//! A rule that `fires_on = "increase"` (a secret, `verify=False`) fires when
//! the new text has a key the old one has fewer of (a new secret, or a
//! placeholder swapped for a real-looking value); one that `fires_on =
//! "decrease"` (an auth check, a signature check) fires when the old text has
//! a key the new one has fewer of. An in-place edit that keeps the matched
//! text stays quiet: appending `timeout=5` to a call that keeps
//! `verify=False` does not change its key. Documentation files are only
//! inspected for download-into-shell lines; secrets in test fixtures are not
//! findings. The rules
//! themselves live in the policy file.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

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
    /// CSRF protection switched off or removed.
    CsrfProtectionRemoved,
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
    pub const ALL: [Category; 9] = [
        Category::HardcodedSecret,
        Category::TlsVerificationDisabled,
        Category::AuthCheckRemoved,
        Category::CryptoVerificationRemoved,
        Category::CsrfProtectionRemoved,
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
            Category::CsrfProtectionRemoved => "csrf_protection_removed",
            Category::ShellInjection => "shell_injection",
            Category::SqlInterpolation => "sql_interpolation",
            Category::WorldWritable => "world_writable",
            Category::CurlPipeShell => "curl_pipe_shell",
        }
    }
}

impl Category {
    /// Whether matches are compared by their text (a secret swapped for
    /// another, a guard moved) or only counted (patterns whose matched text
    /// includes the surrounding code, where an in-place edit changes it).
    fn compares_text(self) -> bool {
        matches!(
            self,
            Category::HardcodedSecret
                | Category::TlsVerificationDisabled
                | Category::AuthCheckRemoved
                | Category::CryptoVerificationRemoved
                | Category::CsrfProtectionRemoved
        )
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which change makes a rule fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FiresOn {
    /// The new text has a match the old one has fewer of.
    Increase,
    /// The old text has a match the new one has fewer of.
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

/// A compiled inspection rule. Its regex is compiled on first use (the
/// shipped policy loads without compiling any); a policy read with
/// [`crate::Policy::parse`] has every pattern compiled and checked against its
/// examples when it loads.
#[derive(Debug, Clone)]
pub struct Rule {
    name: String,
    category: Category,
    level: RiskLevel,
    fires_on: FiresOn,
    source: String,
    pattern: OnceLock<Option<Regex>>,
    why: String,
    files: Vec<String>,
}

/// Upper bound on a compiled pattern, so a policy cannot make inspection slow.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

fn compile(pattern: &str) -> Result<Regex, String> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("pattern is not a valid regex: {e}"))
}

impl Rule {
    /// Compile and check a rule. The error is a sentence saying what is
    /// wrong.
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
        let compiled = compile(pattern)?;
        if compiled.is_match("") {
            return Err("pattern matches the empty string, so it would count everywhere".into());
        }
        let rule = Rule::unchecked(name, category, level, fires_on, pattern, why);
        let _ = rule.pattern.set(Some(compiled));
        Ok(rule)
    }

    /// A rule whose pattern is compiled on first use, unchecked (for the
    /// shipped policy, which a test checks in full).
    pub(crate) fn unchecked(
        name: &str,
        category: Category,
        level: RiskLevel,
        fires_on: FiresOn,
        pattern: &str,
        why: &str,
    ) -> Rule {
        Rule {
            name: name.to_owned(),
            category,
            level,
            fires_on,
            source: pattern.to_owned(),
            pattern: OnceLock::new(),
            why: why.to_owned(),
            files: Vec::new(),
        }
    }

    /// Limit the rule to files whose name ends with (or, for names starting
    /// with a dot, starts with) one of `files`; empty means every file.
    pub fn with_files(mut self, files: Vec<String>) -> Rule {
        self.files = files;
        self
    }

    /// The compiled pattern. A pattern that does not compile (only possible
    /// for the unchecked shipped policy, which a test rules out) matches
    /// nothing.
    fn regex(&self) -> Option<&Regex> {
        self.pattern
            .get_or_init(|| compile(&self.source).ok())
            .as_ref()
    }

    /// Matches of the pattern in `text` (non-overlapping), with no comment,
    /// placeholder or file-type handling: what the examples are checked with.
    pub fn count(&self, text: &str) -> usize {
        self.regex().map_or(0, |r| r.find_iter(text).count())
    }

    /// Whether the rule applies to a file at `path` (`""`: unknown, yes).
    pub fn applies_to(&self, path: &str) -> bool {
        if self.files.is_empty() || path.is_empty() {
            return true;
        }
        let base = path.rsplit('/').next().unwrap_or(path);
        self.files.iter().any(|f| {
            base == f
                || base.ends_with(f.as_str())
                || (f.starts_with('.') && base.starts_with(f.as_str()))
        })
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

    /// Which change fires it.
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
            "pattern": self.source,
            "why": self.why,
            "files": self.files,
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
    /// Matches in the old text (comments and placeholders left out).
    pub old_count: usize,
    /// Matches in the new text (comments and placeholders left out).
    pub new_count: usize,
    /// 1-based lines of the change: in the new text for a rule that fires on
    /// increase (what was added), in the old text for one that fires on
    /// decrease (what was removed). Line numbers, never the matched text,
    /// so a secret is not copied into a report.
    pub lines: Vec<usize>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self.lines.is_empty() {
            true => String::new(),
            false => format!(
                " at line {}",
                self.lines
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        write!(
            f,
            "{}: {} [{}] ({} -> {}){side}",
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
/// file), file type unknown: no comment handling. Rules of level `none` are
/// counted but never fire.
pub fn inspect(rules: &[Rule], old: &str, new: &str) -> Inspection {
    inspect_file(rules, "", old, new)
}

/// Inspect a write of the file at `path` (used for its type: comment
/// syntax, documentation, test fixture) that turns `old` into `new`.
pub fn inspect_file(rules: &[Rule], path: &str, old: &str, new: &str) -> Inspection {
    let kind = FileKind::of(path);
    let mut findings = Vec::new();
    let old_lines = code_lines(old, kind.comments);
    let new_lines = code_lines(new, kind.comments);
    for rule in rules {
        if rule.level == RiskLevel::None || !rule.applies_to(path) {
            continue;
        }
        if kind.fixture && rule.category == Category::HardcodedSecret {
            continue;
        }
        // Documentation describes code, it does not run; but an install line
        // that pipes a download into a shell is run by people and agents.
        if kind.docs && rule.category != Category::CurlPipeShell {
            continue;
        }
        let Some(re) = rule.regex() else { continue };
        let decorators = rule.fires_on == FiresOn::Decrease;
        let placeholders = rule.category == Category::HardcodedSecret;
        let by_text = rule.category.compares_text();
        let old_keys = keys(re, &old_lines, decorators, placeholders, by_text);
        let new_keys = keys(re, &new_lines, decorators, placeholders, by_text);
        let (from, to) = match rule.fires_on {
            FiresOn::Increase => (&old_keys, &new_keys),
            FiresOn::Decrease => (&new_keys, &old_keys),
        };
        // Keys `to` has more of than `from`: what was added (increase) or
        // removed (decrease).
        let mut lines: Vec<usize> = Vec::new();
        for (key, at) in to {
            let before = from.get(key).map_or(0, Vec::len);
            if at.len() <= before {
                continue;
            }
            if let Some((text, guarded)) = key.split_once(" -> ") {
                // A decorator whose function is gone from the new text (renamed
                // or deleted) is only a change if the decorator itself became
                // rarer; one whose function is still there lost its guard.
                let call = format!("{guarded}(");
                let still_there = new_lines.iter().any(|(_, l)| l.contains(&call));
                let count = |keys: &BTreeMap<String, Vec<usize>>| -> usize {
                    keys.iter()
                        .filter(|(k, _)| {
                            k.split_once(" -> ").map_or(k.as_str(), |(t, _)| t) == text
                        })
                        .map(|(_, v)| v.len())
                        .sum()
                };
                if !still_there && count(&new_keys) >= count(&old_keys) {
                    continue;
                }
            }
            lines.extend(at.iter().skip(before));
        }
        if !lines.is_empty() {
            lines.sort_unstable();
            findings.push(Finding {
                rule: rule.name.clone(),
                category: rule.category,
                level: rule.level,
                old_count: old_keys.values().map(Vec::len).sum(),
                new_count: new_keys.values().map(Vec::len).sum(),
                lines,
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

/// Each match of `re` in `lines` (for a secret rule, leaving placeholders
/// out), by key (the
/// matched text, plus the guarded function for a decorator), with the
/// 1-based lines it is on.
fn keys(
    re: &Regex,
    lines: &[(usize, String)],
    decorators: bool,
    placeholders: bool,
    by_text: bool,
) -> BTreeMap<String, Vec<usize>> {
    let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, (no, line)) in lines.iter().enumerate() {
        for m in re.find_iter(line) {
            if placeholders && is_placeholder(m.as_str()) {
                continue;
            }
            // Whitespace inside a match does not make it another one.
            if !by_text {
                out.entry(String::new()).or_default().push(*no);
                continue;
            }
            let mut key: String = m.as_str().split_whitespace().collect();
            let t = line.trim_start();
            if decorators && (t.starts_with('@') || t.starts_with('[')) {
                if let Some(target) = lines
                    .iter()
                    .skip(i + 1)
                    .map(|(_, l)| l.trim())
                    .find(|l| !l.is_empty() && !l.starts_with('@') && !l.starts_with('['))
                {
                    key.push_str(" -> ");
                    key.push_str(guarded_name(target));
                }
            }
            out.entry(key).or_default().push(*no);
        }
    }
    out
}

/// The name a decorated line defines: the identifier before its first `(`
/// (`def admin(request):` is `admin`), else the whole line.
fn guarded_name(line: &str) -> &str {
    let Some(open) = line.find('(') else {
        return line;
    };
    let head = line.get(..open).unwrap_or(line).trim_end();
    let start = head
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    head.get(start..).filter(|s| !s.is_empty()).unwrap_or(line)
}

/// Placeholder values documentation and templates use instead of a secret.
fn is_placeholder(m: &str) -> bool {
    let l = m.to_ascii_lowercase();
    const MARKS: &[&str] = &[
        "your_",
        "your-",
        "_here",
        "-here",
        "changeme",
        "change_me",
        "change-me",
        "placeholder",
        "dummy",
        "redacted",
        "xxx",
        "***",
        "${",
        "{{",
        "<",
        "sk_test_",
        "pk_test_",
        "rk_test_",
    ];
    MARKS.iter().any(|p| l.contains(p))
}

/// How a file's language writes comments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comments {
    /// Unknown: nothing is a comment.
    None,
    /// `#` to the end of the line (shell, Python, Ruby, YAML, TOML, .env).
    Hash,
    /// `//` and `/* */` (C family, Go, Java, JavaScript, Rust, C#).
    Slash,
    /// `#`, `//` and `/* */` (PHP).
    HashSlash,
    /// `--` (SQL, Lua).
    Dash,
    /// `<!-- -->` (HTML, XML).
    Markup,
}

struct FileKind {
    comments: Comments,
    docs: bool,
    fixture: bool,
}

impl FileKind {
    fn of(path: &str) -> FileKind {
        let lower = path.to_ascii_lowercase();
        let base = lower.rsplit('/').next().unwrap_or(&lower);
        let ext = base.rsplit_once('.').map_or("", |(_, e)| e);
        let comments = match ext {
            "py" | "rb" | "sh" | "bash" | "zsh" | "yml" | "yaml" | "toml" | "cfg" | "ini"
            | "conf" | "env" | "r" | "pl" | "properties" | "tf" | "mk" => Comments::Hash,
            "js" | "jsx" | "ts" | "tsx" | "mjs" | "cjs" | "go" | "java" | "kt" | "cs" | "rs"
            | "c" | "h" | "cc" | "cpp" | "hpp" | "swift" | "scala" | "groovy" | "gradle" => {
                Comments::Slash
            }
            "php" => Comments::HashSlash,
            "sql" | "lua" => Comments::Dash,
            "html" | "htm" | "xml" => Comments::Markup,
            _ if base.starts_with(".env")
                || base == "dockerfile"
                || base == "makefile"
                || base == "gemfile"
                || base == "rakefile"
                || base == ".gitconfig"
                || base == "config" =>
            {
                Comments::Hash
            }
            _ => Comments::None,
        };
        let docs = matches!(ext, "md" | "markdown" | "rst" | "adoc" | "txt")
            || lower.starts_with("docs/")
            || lower.contains("/docs/");
        let fixture = [
            "fixtures/",
            "fixture/",
            "testdata/",
            "__fixtures__/",
            "test_data/",
        ]
        .iter()
        .any(|d| lower.starts_with(d) || lower.contains(&format!("/{d}")));
        FileKind {
            comments,
            docs,
            fixture,
        }
    }
}

/// The lines of `text` with comments removed, numbered from 1. Quotes are
/// tracked within a line so that `"#"` or `"http://"` is not a comment.
fn code_lines(text: &str, style: Comments) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for (i, line) in text.lines().enumerate() {
        let mut code = String::new();
        let mut quote: Option<char> = None;
        let mut chars = line.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            let rest = line.get(at..).unwrap_or("");
            if in_block {
                let end = if style == Comments::Markup {
                    "-->"
                } else {
                    "*/"
                };
                if rest.starts_with(end) {
                    in_block = false;
                    for _ in 1..end.len() {
                        chars.next();
                    }
                }
                continue;
            }
            if let Some(q) = quote {
                code.push(c);
                if c == '\\' {
                    if let Some((_, n)) = chars.next() {
                        code.push(n);
                    }
                } else if c == q {
                    quote = None;
                }
                continue;
            }
            let hash = matches!(style, Comments::Hash | Comments::HashSlash)
                && c == '#'
                && (code.is_empty() || code.ends_with(char::is_whitespace));
            let slash = matches!(style, Comments::Slash | Comments::HashSlash);
            if hash
                || (slash && rest.starts_with("//"))
                || (style == Comments::Dash && rest.starts_with("--"))
            {
                break;
            }
            if (slash && rest.starts_with("/*"))
                || (style == Comments::Markup && rest.starts_with("<!--"))
            {
                in_block = true;
                chars.next();
                continue;
            }
            if matches!(c, '"' | '\'' | '`') && style != Comments::None {
                quote = Some(c);
            }
            code.push(c);
        }
        out.push((i + 1, code));
    }
    out
}
