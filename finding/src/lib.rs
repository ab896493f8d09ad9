//! # retie-finding: what a retest starts from
//!
//! A pentest finding arrives in one of four shapes; this crate reads each
//! into one [`Finding`] (a title, a severity, the rule or CWE, and the
//! [`Instance`]s: the URL, method, parameter, payload and evidence of each
//! place the flaw was seen):
//!
//! - `retie-finding/1` (`lab/findings/README.md`);
//! - SARIF 2.1.0: `runs[].results[]` with `ruleId`, `message`,
//!   `locations`, and any `webRequest` / `webResponse` / `properties`;
//! - OWASP ZAP's JSON report: `site[].alerts[].instances[]`;
//! - Nuclei JSONL: one result a line (`template-id`, `matched-at`,
//!   `request`, `extracted-results`), the lines of one template one
//!   finding.
//!
//! [`parse`] is pure (text in, findings or a [`FindingError`] out); [`load`]
//! reads the file first and does nothing else. Broken input is never
//! guessed at: the error names the file, the line or the JSON path, and
//! the field.
//!
//! A finding's URLs point at wherever the scan ran (`http://localhost:8080`,
//! `https://staging.example`); [`onto_lab`] maps their origin onto a lab
//! (`http://NAME:PORT`) and returns the mapping, to be shown and recorded.
//!
//! ```
//! let text = r#"{"format": "retie-finding/1", "id": "F1", "title": "t",
//!   "severity": "high", "request": {"method": "GET", "path": "/a", "query": {"q": "1 2"}}}"#;
//! let found = retie_finding::parse("f.json", text).expect("a valid finding");
//! assert_eq!(found[0].instances[0].url, "http://lab/a?q=1+2");
//! let (mapped, map) = retie_finding::onto_lab(&found[0], "demo", &[8080]).expect("maps");
//! assert_eq!(mapped.instances[0].url, "http://demo:8080/a?q=1+2");
//! assert_eq!(map[0].from, "http://lab");
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod nuclei;
mod origin;
mod retie;
mod sarif;
mod zap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use origin::{onto_lab, OriginMap};

/// One flaw as a report states it, whatever format it came in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Unique within its file (`--id` picks it): the finding's own id, or
    /// one made from the rule and the position.
    pub id: String,
    /// One line, as in a report.
    pub title: String,
    /// `info`, `low`, `medium`, `high` or `critical`, when the format says.
    pub severity: Option<String>,
    /// The scanner's rule (SARIF `ruleId`, ZAP `pluginid`, Nuclei
    /// `template-id`).
    pub rule: Option<String>,
    /// `CWE-N`, when the format says.
    pub cwe: Option<String>,
    /// What the report says about it (text; may be long).
    pub description: String,
    /// How a person reproduces it, step by step, when the format says.
    pub steps: Vec<String>,
    /// Each place the flaw was seen (at least one).
    pub instances: Vec<Instance>,
    /// Where it came from.
    pub source: Source,
}

/// One place a flaw was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// The absolute URL, as found (its origin is mapped by [`onto_lab`]).
    pub url: String,
    /// The HTTP method (upper case; `GET` when the format does not say).
    pub method: String,
    /// The parameter the payload goes in.
    pub param: Option<String>,
    /// The payload (ZAP's `attack`; the request's form values).
    pub payload: Option<String>,
    /// A request body (`application/x-www-form-urlencoded` unless the raw
    /// request says otherwise).
    pub body: Option<String>,
    /// The raw request, when the format carries one (Nuclei `request`).
    pub request: Option<String>,
    /// What proved the flaw in the response (ZAP `evidence`, a status and
    /// a body excerpt, Nuclei `extracted-results`).
    pub evidence: Vec<String>,
    /// Something to do first (log in as ...), in words.
    pub precondition: Option<String>,
}

/// A finding's origin: the file, its format, and where in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    /// The file as the person named it.
    pub file: String,
    /// Which format it was read as.
    pub format: Format,
    /// A JSON path (`$.runs[0].results[2]`) or a line (`line 3`).
    pub at: String,
}

/// The formats read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// `retie-finding/1`.
    RetieFinding1,
    /// SARIF 2.1.0.
    Sarif210,
    /// OWASP ZAP's JSON report.
    ZapJson,
    /// Nuclei's JSON lines.
    NucleiJsonl,
}

impl Format {
    /// The name people know it by.
    pub fn name(self) -> &'static str {
        match self {
            Format::RetieFinding1 => "retie-finding/1",
            Format::Sarif210 => "SARIF 2.1.0",
            Format::ZapJson => "OWASP ZAP JSON",
            Format::NucleiJsonl => "Nuclei JSONL",
        }
    }
}

/// Why a findings file was not read. Each names the file; nothing is
/// retested from a file with an error in it.
#[derive(Debug, thiserror::Error)]
pub enum FindingError {
    /// The file could not be read.
    #[error("{file}: cannot read it: {source}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not JSON (a truncated file, a stray character).
    #[error("{file}: line {line}, column {column}: not valid JSON ({why})")]
    Syntax {
        /// The file.
        file: String,
        /// 1-based.
        line: usize,
        /// 1-based.
        column: usize,
        /// The parser's words.
        why: String,
    },
    /// A field is missing, of the wrong type, or holds something not
    /// usable.
    #[error("{file}: {at}: field `{field}`: {why}")]
    Field {
        /// The file.
        file: String,
        /// A JSON path (`$.site[0].alerts[1]`) or `line N`.
        at: String,
        /// The field.
        field: String,
        /// What is wrong with it.
        why: String,
    },
    /// None of the formats.
    #[error("{file}: {why}; retie reads retie-finding/1, SARIF 2.1.0, OWASP ZAP JSON reports and Nuclei JSONL")]
    Unknown {
        /// The file.
        file: String,
        /// What it looked like.
        why: String,
    },
    /// Valid, but no finding in it.
    #[error("{file}: it holds no finding ({why})")]
    Empty {
        /// The file.
        file: String,
        /// Where they were looked for.
        why: String,
    },
    /// Two findings of the file share an id, so `--id` could not tell
    /// them apart.
    #[error("{file}: two findings have the id {id:?} ({first} and {second})")]
    DuplicateId {
        /// The file.
        file: String,
        /// The id.
        id: String,
        /// Where the first is.
        first: String,
        /// Where the second is.
        second: String,
    },
    /// A finding's URL cannot be mapped onto the lab.
    #[error("finding {id}: {why}")]
    Origin {
        /// The finding.
        id: String,
        /// Why.
        why: String,
    },
}

/// Read `path` and [`parse`] it. The only I/O of this crate.
pub fn load(path: &std::path::Path) -> Result<Vec<Finding>, FindingError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| FindingError::Read {
        file: file.clone(),
        source,
    })?;
    parse(&file, &text)
}

/// Every finding in `text` (the content of `file`), in file order. The
/// format is recognised from the content, never from the file name.
pub fn parse(file: &str, text: &str) -> Result<Vec<Finding>, FindingError> {
    let found = match serde_json::from_str::<Value>(text) {
        Ok(v) => parse_value(file, &v)?,
        Err(e) => {
            // Several lines, the first of them a JSON object: JSON lines.
            let mut lines = text.lines().filter(|l| !l.trim().is_empty());
            let first_is_object = lines
                .next()
                .and_then(|l| serde_json::from_str::<Value>(l).ok())
                .is_some_and(|v| v.is_object());
            if first_is_object && lines.next().is_some() {
                nuclei::parse_lines(file, text)?
            } else {
                return Err(FindingError::Syntax {
                    file: file.into(),
                    line: e.line(),
                    column: e.column(),
                    why: syntax_words(&e),
                });
            }
        }
    };
    check_ids(file, &found)?;
    Ok(found)
}

fn parse_value(file: &str, v: &Value) -> Result<Vec<Finding>, FindingError> {
    let Some(o) = v.as_object() else {
        return Err(FindingError::Unknown {
            file: file.into(),
            why: format!("its top level is {}, not an object", kind_of(v)),
        });
    };
    if let Some(f) = o.get("format") {
        return match f.as_str() {
            Some("retie-finding/1") => retie::parse(file, v).map(|f| vec![f]),
            _ => Err(FindingError::Field {
                file: file.into(),
                at: "$".into(),
                field: "format".into(),
                why: format!("{f} is not a format retie reads (`retie-finding/1`)"),
            }),
        };
    }
    if o.contains_key("runs") {
        return sarif::parse(file, v);
    }
    if o.contains_key("site") {
        return zap::parse(file, v);
    }
    if o.contains_key("template-id") {
        return nuclei::parse_lines(file, &v.to_string());
    }
    let keys: Vec<&str> = o.keys().map(String::as_str).take(6).collect();
    Err(FindingError::Unknown {
        file: file.into(),
        why: format!(
            "an object with the keys {keys:?}: no `format` (retie-finding/1), `runs` (SARIF), `site` (ZAP) or `template-id` (Nuclei)"
        ),
    })
}

fn check_ids(file: &str, found: &[Finding]) -> Result<(), FindingError> {
    for (i, f) in found.iter().enumerate() {
        if let Some(g) = found[..i].iter().find(|g| g.id == f.id) {
            return Err(FindingError::DuplicateId {
                file: file.into(),
                id: f.id.clone(),
                first: g.source.at.clone(),
                second: f.source.at.clone(),
            });
        }
    }
    Ok(())
}

fn syntax_words(e: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; the error says it already.
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// `object`, `array`, ... for an error message.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON value read at a path, for precise errors.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub file: &'a str,
    pub path: &'a str,
    pub v: &'a Value,
}

impl<'a> At<'a> {
    pub fn new(file: &'a str, path: &'a str, v: &'a Value) -> At<'a> {
        At { file, path, v }
    }

    pub fn err(&self, field: &str, why: impl Into<String>) -> FindingError {
        FindingError::Field {
            file: self.file.into(),
            at: self.path.into(),
            field: field.into(),
            why: why.into(),
        }
    }

    /// A field that must be present (`null` counts as absent).
    pub fn req(&self, field: &str) -> Result<&'a Value, FindingError> {
        match self.v.get(field) {
            Some(Value::Null) | None => Err(self.err(field, "missing")),
            Some(x) => Ok(x),
        }
    }

    /// A string field that must be present and not empty.
    pub fn req_str(&self, field: &str) -> Result<&'a str, FindingError> {
        match self.req(field)? {
            Value::String(s) if !s.trim().is_empty() => Ok(s),
            Value::String(_) => Err(self.err(field, "empty")),
            other => Err(self.err(field, format!("{}, not a string", kind_of(other)))),
        }
    }

    /// A string field that may be absent; wrong types are errors.
    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>, FindingError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.err(field, format!("{}, not a string", kind_of(other)))),
        }
    }

    /// A string or a number given as either (ZAP writes numbers as
    /// strings, other tools do not).
    pub fn opt_scalar(&self, field: &str) -> Result<Option<String>, FindingError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(self.err(
                field,
                format!("{}, not a string or a number", kind_of(other)),
            )),
        }
    }

    /// An array field that may be absent.
    pub fn opt_array(&self, field: &str) -> Result<&'a [Value], FindingError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(other) => Err(self.err(field, format!("{}, not an array", kind_of(other)))),
        }
    }

    /// An array field that must be present.
    pub fn req_array(&self, field: &str) -> Result<&'a [Value], FindingError> {
        match self.req(field)? {
            Value::Array(a) => Ok(a),
            other => Err(self.err(field, format!("{}, not an array", kind_of(other)))),
        }
    }
}

/// `high`, `medium`... from the words scanners use.
pub(crate) fn severity_word(s: &str) -> Option<String> {
    let w = s.trim().to_ascii_lowercase();
    Some(
        match w.as_str() {
            "critical" => "critical",
            "high" | "error" => "high",
            "medium" | "moderate" | "warning" => "medium",
            "low" | "note" => "low",
            "info" | "informational" | "none" | "unknown" => "info",
            _ => return None,
        }
        .to_string(),
    )
}

/// `CWE-89` from `89`, `cwe-89`, `CWE-89`, `external/cwe/cwe-89`.
pub(crate) fn cwe_of(s: &str) -> Option<String> {
    let t = s.trim();
    let t = t.rsplit('/').next().unwrap_or(t);
    let digits = t
        .strip_prefix("CWE-")
        .or_else(|| t.strip_prefix("cwe-"))
        .unwrap_or(t);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && digits != "0")
        .then(|| format!("CWE-{digits}"))
}

#[cfg(test)]
mod tests;
