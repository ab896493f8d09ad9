//! `retie-finding/1` (`lab/findings/README.md`): one finding a file, its
//! request relative to the lab (origin `http://lab`).

use serde_json::Value;

use crate::{cwe_of, kind_of, severity_word, At, Finding, FindingError, Format, Instance, Source};

/// The origin a `retie-finding/1` request is relative to.
pub(crate) const LAB_ORIGIN: &str = "http://lab";

pub(crate) fn parse(file: &str, v: &Value) -> Result<Finding, FindingError> {
    let top = At::new(file, "$", v);
    let id = top.req_str("id")?;
    let title = top.req_str("title")?;
    let severity = match top.opt_str("severity")? {
        Some(s) => Some(severity_word(s).ok_or_else(|| {
            top.err(
                "severity",
                format!("{s:?} is not low, medium, high or critical"),
            )
        })?),
        None => None,
    };
    let cwe = match top.opt_str("cwe")? {
        Some(c) => Some(
            cwe_of(c).ok_or_else(|| top.err("cwe", format!("{c:?} is not a CWE id (CWE-N)")))?,
        ),
        None => None,
    };
    let req_v = top.req("request")?;
    let req = At::new(file, "$.request", req_v);
    if !req_v.is_object() {
        return Err(top.err("request", format!("{}, not an object", kind_of(req_v))));
    }
    let method = req.req_str("method")?.to_ascii_uppercase();
    if method != "GET" && method != "POST" {
        return Err(req.err("method", format!("{method:?}: GET or POST")));
    }
    let path = req.req_str("path")?;
    if !path.starts_with('/') {
        return Err(req.err("path", format!("{path:?} does not start with /")));
    }
    let query = pairs(&req, "query")?;
    let form = pairs(&req, "form")?;
    let mut url = format!("{LAB_ORIGIN}{path}");
    if !query.is_empty() {
        url.push('?');
        url.push_str(&encode(&query));
    }
    let body = (!form.is_empty()).then(|| encode(&form));
    let payload = {
        let all: Vec<String> = query
            .iter()
            .chain(form.iter())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        (!all.is_empty()).then(|| all.join("&"))
    };
    let precondition = match req_v.get("login") {
        None | Some(Value::Null) => None,
        Some(l) => {
            let at = At::new(file, "$.request.login", l);
            Some(format!(
                "log in first: POST /login with user={} and password={}, and send the session cookie",
                at.req_str("user")?,
                at.req_str("password")?
            ))
        }
    };
    let mut evidence = Vec::new();
    if let Some(e) = v.get("expected_evidence").filter(|e| !e.is_null()) {
        let at = At::new(file, "$.expected_evidence", e);
        if let Some(s) = e.get("status") {
            match s.as_u64() {
                Some(n) if (100..600).contains(&n) => evidence.push(format!("HTTP status {n}")),
                _ => return Err(at.err("status", format!("{s} is not an HTTP status"))),
            }
        }
        if let Some(b) = at.opt_str("body_contains")? {
            evidence.push(format!("the body contains {b:?}"));
        }
    }
    let mut steps = Vec::new();
    for (i, s) in top.opt_array("reproduction")?.iter().enumerate() {
        match s.as_str() {
            Some(s) => steps.push(s.to_string()),
            None => {
                return Err(top.err(
                    &format!("reproduction[{i}]"),
                    format!("{}, not a string", kind_of(s)),
                ))
            }
        }
    }
    let mut description = top.opt_str("root_cause")?.unwrap_or("").to_string();
    if let Some(e) = top.opt_str("endpoint")? {
        description = format!("endpoint {e}. {description}");
    }
    Ok(Finding {
        id: id.into(),
        title: title.into(),
        severity,
        rule: None,
        cwe,
        description: description.trim().to_string(),
        steps,
        instances: vec![Instance {
            url,
            method,
            // Named only when there is one to name (the JSON objects
            // come back sorted, not in the file's order).
            param: match (query.as_slice(), form.as_slice()) {
                ([(k, _)], []) | ([], [(k, _)]) => Some(k.clone()),
                _ => None,
            },
            payload,
            body,
            request: None,
            evidence,
            precondition,
        }],
        source: Source {
            file: file.into(),
            format: Format::RetieFinding1,
            at: "$".into(),
        },
    })
}

/// An optional object of string values, in file order.
fn pairs(at: &At<'_>, field: &str) -> Result<Vec<(String, String)>, FindingError> {
    match at.v.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(n) => Ok((k.clone(), n.to_string())),
                other => Err(at.err(
                    &format!("{field}.{k}"),
                    format!("{}, not a string", kind_of(other)),
                )),
            })
            .collect(),
        Some(other) => Err(at.err(field, format!("{}, not an object", kind_of(other)))),
    }
}

fn encode(pairs: &[(String, String)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}
