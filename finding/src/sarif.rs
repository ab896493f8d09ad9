//! SARIF 2.1.0: `runs[].results[]`. A web finding's place is its
//! `webRequest.target` or a location's `artifactLocation.uri` (resolved
//! through the run's `originalUriBaseIds`); a result with neither is an
//! error, never a finding without a place.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{cwe_of, kind_of, severity_word, At, Finding, FindingError, Format, Instance, Source};

/// What a run's `tool.driver.rules[]` says about a rule.
#[derive(Default, Clone)]
struct Rule {
    id: String,
    title: Option<String>,
    description: Option<String>,
    level: Option<String>,
    security_severity: Option<f64>,
    cwe: Option<String>,
}

pub(crate) fn parse(file: &str, v: &Value) -> Result<Vec<Finding>, FindingError> {
    let top = At::new(file, "$", v);
    match top.req("version")? {
        Value::String(s) if s == "2.1.0" => {}
        other => return Err(top.err("version", format!("{other}: retie reads SARIF 2.1.0 only"))),
    }
    let mut out = Vec::new();
    for (ri, run) in top.req_array("runs")?.iter().enumerate() {
        let rpath = format!("$.runs[{ri}]");
        let run_at = At::new(file, &rpath, run);
        if !run.is_object() {
            return Err(top.err(
                &format!("runs[{ri}]"),
                format!("{}, not an object", kind_of(run)),
            ));
        }
        let rules = rules_of(file, &rpath, run)?;
        let bases = bases_of(run);
        for (i, r) in run_at.opt_array("results")?.iter().enumerate() {
            let path = format!("{rpath}.results[{i}]");
            out.push(result(file, &path, r, &rules, &bases)?);
        }
    }
    if out.is_empty() {
        return Err(FindingError::Empty {
            file: file.into(),
            why: "no run has a result in `runs[].results[]`".into(),
        });
    }
    // A rule seen several times: its findings are RULE#1, RULE#2...
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for f in &out {
        *count.entry(f.id.clone()).or_default() += 1;
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for f in &mut out {
        if count.get(&f.id).copied().unwrap_or(0) > 1 {
            let n = seen.entry(f.id.clone()).or_default();
            *n += 1;
            f.id = format!("{}#{n}", f.id);
        }
    }
    Ok(out)
}

fn text_of(v: Option<&Value>) -> Option<String> {
    let t = v?;
    t.get("text")
        .or_else(|| t.get("markdown"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .filter(|s| !s.trim().is_empty())
}

fn rules_of(file: &str, rpath: &str, run: &Value) -> Result<Vec<Rule>, FindingError> {
    let Some(rules) = run.pointer("/tool/driver/rules") else {
        return Ok(Vec::new());
    };
    let at = At::new(file, rpath, run);
    let Some(rules) = rules.as_array() else {
        return Err(at.err(
            "tool.driver.rules",
            format!("{}, not an array", kind_of(rules)),
        ));
    };
    let mut out = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let p = format!("{rpath}.tool.driver.rules[{i}]");
        let a = At::new(file, &p, r);
        let props = r.get("properties");
        let mut cwe = None;
        if let Some(tags) = props.and_then(|p| p.get("tags")).and_then(Value::as_array) {
            cwe = tags.iter().filter_map(Value::as_str).find_map(cwe_of);
        }
        if cwe.is_none() {
            cwe = props
                .and_then(|p| p.get("cwe"))
                .and_then(Value::as_str)
                .and_then(cwe_of);
        }
        out.push(Rule {
            id: a.req_str("id")?.to_string(),
            title: a
                .opt_str("name")?
                .map(str::to_string)
                .or_else(|| text_of(r.get("shortDescription"))),
            description: text_of(r.get("fullDescription"))
                .or_else(|| text_of(r.get("help")))
                .or_else(|| text_of(r.get("shortDescription"))),
            level: r
                .pointer("/defaultConfiguration/level")
                .and_then(Value::as_str)
                .map(str::to_string),
            security_severity: props
                .and_then(|p| p.get("security-severity"))
                .and_then(|s| {
                    s.as_f64()
                        .or_else(|| s.as_str().and_then(|t| t.trim().parse().ok()))
                }),
            cwe,
        });
    }
    Ok(out)
}

/// `originalUriBaseIds`: name → absolute URI (followed through other
/// bases, a few levels deep).
fn bases_of(run: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(o) = run.get("originalUriBaseIds").and_then(Value::as_object) else {
        return out;
    };
    for name in o.keys() {
        let mut uri = String::new();
        let mut at = name.clone();
        for _ in 0..8 {
            let Some(b) = o.get(&at) else { break };
            let u = b.get("uri").and_then(Value::as_str).unwrap_or("");
            uri = format!("{u}{uri}");
            match b.get("uriBaseId").and_then(Value::as_str) {
                Some(next) => at = next.to_string(),
                None => break,
            }
        }
        out.insert(name.clone(), uri);
    }
    out
}

fn join(base: &str, rel: &str) -> Option<String> {
    let b = url::Url::parse(base).ok()?;
    b.join(rel).ok().map(|u| u.to_string())
}

fn is_web(u: &str) -> bool {
    url::Url::parse(u).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
}

fn result(
    file: &str,
    path: &str,
    r: &Value,
    rules: &[Rule],
    bases: &BTreeMap<String, String>,
) -> Result<Finding, FindingError> {
    let at = At::new(file, path, r);
    if !r.is_object() {
        return Err(FindingError::Field {
            file: file.into(),
            at: path.into(),
            field: "(the result)".into(),
            why: format!("{}, not an object", kind_of(r)),
        });
    }
    // The rule: ruleId, rule.id, or rules[ruleIndex].
    let index = r
        .get("ruleIndex")
        .or_else(|| r.pointer("/rule/index"))
        .and_then(Value::as_u64);
    let rule_id = match at.opt_str("ruleId")? {
        Some(id) => id.to_string(),
        None => match r.pointer("/rule/id").and_then(Value::as_str) {
            Some(id) => id.to_string(),
            None => match index.and_then(|i| rules.get(i as usize)) {
                Some(rule) => rule.id.clone(),
                None => {
                    return Err(at.err(
                        "ruleId",
                        "missing (and no rule.id, nor a ruleIndex into tool.driver.rules)",
                    ))
                }
            },
        },
    };
    let rule = rules
        .iter()
        .find(|x| x.id == rule_id)
        .or_else(|| index.and_then(|i| rules.get(i as usize)))
        .cloned()
        .unwrap_or_default();
    let message = match r.get("message") {
        None | Some(Value::Null) => return Err(at.err("message", "missing")),
        Some(m) => match text_of(Some(m)) {
            Some(t) => t,
            // A message by id (its text in the rule's messageStrings):
            // the rule's description stands in for it.
            None if m.get("id").is_some() => rule.description.clone().unwrap_or_default(),
            None => return Err(at.err("message.text", "missing (and no message.id)")),
        },
    };
    // Places: every location's URI, resolved.
    let mut urls: Vec<String> = Vec::new();
    for (li, l) in at.opt_array("locations")?.iter().enumerate() {
        let Some(al) = l.pointer("/physicalLocation/artifactLocation") else {
            continue; // a logical location only
        };
        let field = format!("locations[{li}].physicalLocation.artifactLocation.uri");
        let uri = al
            .get("uri")
            .and_then(Value::as_str)
            .ok_or_else(|| at.err(&field, "missing"))?;
        let full = match al.get("uriBaseId").and_then(Value::as_str) {
            Some(b) => {
                let base = bases.get(b).ok_or_else(|| {
                    at.err(
                        &format!("locations[{li}].physicalLocation.artifactLocation.uriBaseId"),
                        format!("{b:?} is not in the run's originalUriBaseIds"),
                    )
                })?;
                join(base, uri).ok_or_else(|| {
                    at.err(&field, format!("{uri:?} does not resolve against {base:?}"))
                })?
            }
            None => uri.to_string(),
        };
        if !is_web(&full) {
            return Err(at.err(
                &field,
                format!("{full:?} is not an http(s) URL: a retest needs the web address the flaw was seen at"),
            ));
        }
        if !urls.contains(&full) {
            urls.push(full);
        }
    }
    // The web request, if the scanner kept it.
    let web = r.get("webRequest").filter(|w| !w.is_null());
    let mut instances: Vec<Instance> = urls
        .iter()
        .map(|u| Instance {
            url: u.clone(),
            method: "GET".into(),
            param: None,
            payload: None,
            body: None,
            request: None,
            evidence: Vec::new(),
            precondition: None,
        })
        .collect();
    if let Some(w) = web {
        let wp = format!("{path}.webRequest");
        let wa = At::new(file, &wp, w);
        let target = match wa.opt_str("target")? {
            Some(t) if is_web(t) => Some(t.to_string()),
            Some(t) => match urls.first().and_then(|b| join(b, t)) {
                Some(u) if is_web(&u) => Some(u),
                _ => {
                    return Err(wa.err(
                        "target",
                        format!("{t:?} is relative and no location gives an http(s) URL to resolve it against"),
                    ))
                }
            },
            None => None,
        };
        let method = wa.opt_str("method")?.unwrap_or("GET").to_ascii_uppercase();
        let body = w
            .pointer("/body/text")
            .and_then(Value::as_str)
            .map(str::to_string);
        let params = w
            .get("parameters")
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .map(|(k, v)| {
                        format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_string))
                    })
                    .collect::<Vec<_>>()
                    .join("&")
            })
            .filter(|s| !s.is_empty());
        let request = {
            let mut t = String::new();
            if let Some(tg) = &target {
                t = format!("{method} {tg}");
            }
            if let Some(h) = w.get("headers").and_then(Value::as_object) {
                for (k, v) in h {
                    t.push_str(&format!("\n{k}: {}", v.as_str().unwrap_or("")));
                }
            }
            (!t.is_empty()).then_some(t)
        };
        let i = match &target {
            Some(t) => match instances.iter().position(|x| &x.url == t) {
                Some(i) => i,
                None => {
                    instances.insert(
                        0,
                        Instance {
                            url: t.clone(),
                            method: "GET".into(),
                            param: None,
                            payload: None,
                            body: None,
                            request: None,
                            evidence: Vec::new(),
                            precondition: None,
                        },
                    );
                    0
                }
            },
            None => 0,
        };
        if let Some(x) = instances.get_mut(i) {
            x.method = method;
            x.body = body;
            x.payload = params;
            x.request = request;
        }
    }
    if instances.is_empty() {
        return Err(at.err(
            "locations",
            "no location: the result needs locations[].physicalLocation.artifactLocation.uri (an http(s) URL) or webRequest.target",
        ));
    }
    // Evidence: the response, and what the properties carry.
    let props = r.get("properties").filter(|p| p.is_object());
    if let Some(x) = instances.first_mut() {
        if let Some(resp) = r.get("webResponse") {
            if let Some(code) = resp.get("statusCode").and_then(Value::as_u64) {
                x.evidence.push(format!("HTTP status {code}"));
            }
            if let Some(b) = resp.pointer("/body/text").and_then(Value::as_str) {
                x.evidence
                    .push(format!("the body contains {:?}", excerpt(b)));
            }
        }
        if let Some(p) = props {
            let s = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_string);
            if let Some(e) = s("evidence") {
                x.evidence.push(e);
            }
            if x.param.is_none() {
                x.param = s("param").or_else(|| s("parameter"));
            }
            if x.payload.is_none() {
                x.payload = s("payload").or_else(|| s("attack"));
            }
        }
    }
    let level = at
        .opt_str("level")?
        .map(str::to_string)
        .or(rule.level.clone());
    let severity = match rule.security_severity {
        Some(s) if s >= 9.0 => Some("critical".to_string()),
        Some(s) if s >= 7.0 => Some("high".to_string()),
        Some(s) if s >= 4.0 => Some("medium".to_string()),
        Some(s) if s > 0.0 => Some("low".to_string()),
        _ => level.as_deref().and_then(severity_word),
    };
    let cwe = rule.cwe.clone().or_else(|| {
        props
            .and_then(|p| p.get("cwe"))
            .and_then(Value::as_str)
            .and_then(cwe_of)
    });
    let id = match at.opt_str("guid")? {
        Some(g) => g.to_string(),
        None => rule_id.clone(),
    };
    let title = rule
        .title
        .clone()
        .unwrap_or_else(|| message.lines().next().unwrap_or("").to_string());
    let mut description = message;
    if let Some(d) = &rule.description {
        if !description.contains(d.as_str()) {
            description = format!("{description}\n\n{d}");
        }
    }
    Ok(Finding {
        id,
        title,
        severity,
        rule: Some(rule_id),
        cwe,
        description,
        steps: Vec::new(),
        instances,
        source: Source {
            file: file.into(),
            format: Format::Sarif210,
            at: path.into(),
        },
    })
}

fn excerpt(s: &str) -> String {
    let t: String = s.chars().take(200).collect();
    if t.len() < s.len() {
        format!("{t}…")
    } else {
        t
    }
}
