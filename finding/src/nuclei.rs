//! Nuclei JSONL: one result a line. The results of one template are one
//! finding, each matched URL an instance. A line that is not a JSON object
//! is an error naming that line; so is a result without `template-id` or
//! `matched-at`.

use serde_json::Value;

use crate::{cwe_of, severity_word, At, Finding, FindingError, Format, Instance, Source};

pub(crate) fn parse_lines(file: &str, text: &str) -> Result<Vec<Finding>, FindingError> {
    let mut out: Vec<Finding> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| FindingError::Syntax {
            file: file.into(),
            line: n,
            column: e.column(),
            why: format!("this JSON line is not JSON: {}", crate::syntax_words(&e)),
        })?;
        let path = format!("line {n}");
        let at = At::new(file, &path, &v);
        if !v.is_object() {
            return Err(at.err(
                "(the line)",
                format!("{}, not a JSON object", crate::kind_of(&v)),
            ));
        }
        let template = at.req_str("template-id")?;
        let matched = match at.opt_str("matched-at")? {
            Some(m) => m,
            None => at.req_str("host").map_err(|_| {
                at.err(
                    "matched-at",
                    "missing (and no host): the result names no place",
                )
            })?,
        };
        let ok = url::Url::parse(matched)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        if !ok {
            return Err(at.err(
                "matched-at",
                format!("{matched:?} is not an http(s) URL (only http results can be retested)"),
            ));
        }
        let request = at.opt_str("request")?.map(str::to_string);
        let method = request
            .as_deref()
            .and_then(|r| r.split_whitespace().next())
            .filter(|m| m.bytes().all(|b| b.is_ascii_uppercase()))
            .unwrap_or("GET")
            .to_string();
        let body = request.as_deref().and_then(|r| {
            let b = r
                .split_once("\r\n\r\n")
                .or_else(|| r.split_once("\n\n"))
                .map(|(_, b)| b.to_string())?;
            (!b.is_empty()).then_some(b)
        });
        let mut evidence = Vec::new();
        for (i, e) in at.opt_array("extracted-results")?.iter().enumerate() {
            match e.as_str() {
                Some(s) => evidence.push(s.to_string()),
                None => {
                    return Err(at.err(
                        &format!("extracted-results[{i}]"),
                        format!("{}, not a string", crate::kind_of(e)),
                    ))
                }
            }
        }
        if let Some(m) = at.opt_str("matcher-name")? {
            evidence.push(format!("matcher {m}"));
        }
        let instance = Instance {
            url: matched.into(),
            method,
            param: None,
            payload: None,
            body,
            request: request.or_else(|| {
                v.get("curl-command")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            }),
            evidence,
            precondition: None,
        };
        if let Some(f) = out.iter_mut().find(|f| f.id == template) {
            f.instances.push(instance);
            continue;
        }
        let info = v.get("info").filter(|i| i.is_object());
        let ia = info.map(|i| At::new(file, &path, i));
        let title = match &ia {
            Some(a) => a.opt_str("name")?.unwrap_or(template).to_string(),
            None => template.to_string(),
        };
        let severity = match &ia {
            Some(a) => match a.opt_str("severity")? {
                Some(s) => Some(severity_word(s).ok_or_else(|| {
                    a.err("info.severity", format!("{s:?} is not a Nuclei severity"))
                })?),
                None => None,
            },
            None => None,
        };
        let cwe = info
            .and_then(|i| i.pointer("/classification/cwe-id"))
            .and_then(|c| match c {
                Value::Array(a) => a.iter().filter_map(Value::as_str).find_map(cwe_of),
                Value::String(s) => cwe_of(s),
                _ => None,
            });
        let description = info
            .and_then(|i| i.get("description"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim()
            .to_string();
        out.push(Finding {
            id: template.into(),
            title,
            severity,
            rule: Some(template.into()),
            cwe,
            description,
            steps: Vec::new(),
            instances: vec![instance],
            source: Source {
                file: file.into(),
                format: Format::NucleiJsonl,
                at: path,
            },
        });
    }
    if out.is_empty() {
        return Err(FindingError::Empty {
            file: file.into(),
            why: "no result line".into(),
        });
    }
    Ok(out)
}
