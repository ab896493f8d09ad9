//! OWASP ZAP's JSON report: `site[].alerts[]`, each alert one finding,
//! its `instances[]` the places. ZAP writes numbers as strings
//! (`"riskcode": "3"`) and HTML in `desc`; both are taken as they come.

use serde_json::Value;

use crate::{cwe_of, kind_of, At, Finding, FindingError, Format, Instance, Source};

pub(crate) fn parse(file: &str, v: &Value) -> Result<Vec<Finding>, FindingError> {
    let top = At::new(file, "$", v);
    // Older reports hold one site as an object.
    let sites: Vec<&Value> = match top.req("site")? {
        Value::Array(a) => a.iter().collect(),
        o @ Value::Object(_) => vec![o],
        other => return Err(top.err("site", format!("{}, not an array", kind_of(other)))),
    };
    let mut out = Vec::new();
    for (si, site) in sites.iter().enumerate() {
        let sp = format!("$.site[{si}]");
        let sa = At::new(file, &sp, site);
        let site_name = sa.opt_str("@name")?.map(str::to_string);
        for (ai, alert) in sa.opt_array("alerts")?.iter().enumerate() {
            let ap = format!("{sp}.alerts[{ai}]");
            out.push(alert_of(file, &ap, alert, site_name.as_deref())?);
        }
    }
    if out.is_empty() {
        return Err(FindingError::Empty {
            file: file.into(),
            why: "no site has an alert in `site[].alerts[]`".into(),
        });
    }
    // The same plugin on several sites: PLUGIN@1, PLUGIN@2...
    let ids: Vec<String> = out.iter().map(|f| f.id.clone()).collect();
    for (i, f) in out.iter_mut().enumerate() {
        if ids.iter().filter(|x| **x == ids[i]).count() > 1 {
            f.id = format!(
                "{}@{}",
                ids[i],
                ids[..=i].iter().filter(|x| **x == ids[i]).count()
            );
        }
    }
    Ok(out)
}

fn alert_of(
    file: &str,
    path: &str,
    a: &Value,
    site: Option<&str>,
) -> Result<Finding, FindingError> {
    let at = At::new(file, path, a);
    if !a.is_object() {
        return Err(FindingError::Field {
            file: file.into(),
            at: path.into(),
            field: "(the alert)".into(),
            why: format!("{}, not an object", kind_of(a)),
        });
    }
    let plugin = at.opt_scalar("pluginid")?;
    let alert_ref = at.opt_scalar("alertRef")?;
    let id = alert_ref
        .clone()
        .or(plugin.clone())
        .ok_or_else(|| at.err("pluginid", "missing (and no alertRef)"))?;
    let title = match at.opt_str("alert")? {
        Some(t) => t.to_string(),
        None => at.req_str("name")?.to_string(),
    };
    let severity = match at.opt_scalar("riskcode")? {
        Some(r) => Some(
            match r.trim() {
                "0" => "info",
                "1" => "low",
                "2" => "medium",
                "3" => "high",
                other => {
                    return Err(at.err(
                        "riskcode",
                        format!("{other:?}: ZAP's risk codes are 0 to 3"),
                    ))
                }
            }
            .to_string(),
        ),
        None => None,
    };
    let cwe = at.opt_scalar("cweid")?.and_then(|c| cwe_of(&c));
    let mut description = strip_tags(at.opt_str("desc")?.unwrap_or(""));
    if let Some(s) = at.opt_str("solution")? {
        description = format!("{description}\n\nSolution: {}", strip_tags(s));
    }
    let mut instances = Vec::new();
    for (ii, inst) in at.req_array("instances")?.iter().enumerate() {
        let ip = format!("{path}.instances[{ii}]");
        let ia = At::new(file, &ip, inst);
        let uri = ia.req_str("uri")?;
        let ok = url::Url::parse(uri)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
        if !ok {
            return Err(ia.err("uri", format!("{uri:?} is not an http(s) URL")));
        }
        let mut evidence = Vec::new();
        if let Some(e) = ia.opt_str("evidence")? {
            evidence.push(e.to_string());
        }
        if let Some(o) = ia.opt_str("otherinfo")? {
            evidence.push(strip_tags(o));
        }
        instances.push(Instance {
            url: uri.into(),
            method: ia.opt_str("method")?.unwrap_or("GET").to_ascii_uppercase(),
            param: ia.opt_str("param")?.map(str::to_string),
            payload: ia.opt_str("attack")?.map(str::to_string),
            // ZAP's report keeps no request body.
            body: None,
            request: None,
            evidence,
            precondition: None,
        });
    }
    if instances.is_empty() {
        return Err(at.err("instances", "empty: the alert names no place it was seen"));
    }
    Ok(Finding {
        id,
        title,
        severity,
        rule: plugin.map(|p| format!("zap:{p}")),
        cwe,
        description: description.trim().to_string(),
        steps: site
            .map(|s| vec![format!("scanned site: {s}")])
            .unwrap_or_default(),
        instances,
        source: Source {
            file: file.into(),
            format: Format::ZapJson,
            at: path.into(),
        },
    })
}

/// ZAP's `<p>` paragraphs as text.
fn strip_tags(s: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                if !out.ends_with('\n') && !out.is_empty() {
                    out.push('\n');
                }
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.trim().to_string()
}
