//! `retie report SESSION [--markdown | --json | --sarif]`: a retest
//! session's report from the ledger alone (verified first): the finding,
//! the origin mapping, the verdict and any adjudication, every command
//! run (the original payload and the variants), and the output excerpts
//! the verdict rests on. SARIF 2.1.0 carries the verdict as
//! `baselineState`: still_open → `unchanged`, fixed → `absent`,
//! inconclusive → `unchanged` with the property `retieInconclusive`.

use std::path::PathBuf;

use clap::Args;
use retie_finding::Finding;
use retie_ledger::payload;
use retie_ledger::retest::{RetestAdjudication, RetestEnded, RetestOpened, RetestVerdict};
use retie_ledger::{verify, Kind, Ledger};
use serde_json::{json, Value};

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The retest session (`retie sessions` lists them).
    pub session: String,
    /// Markdown, for people (the default).
    #[arg(long, group = "format")]
    pub markdown: bool,
    /// One JSON object.
    #[arg(long, group = "format")]
    pub json: bool,
    /// A SARIF 2.1.0 log (GitHub code scanning, DefectDojo).
    #[arg(long, group = "format")]
    pub sarif: bool,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
}

/// What a report is made of, read back from the ledger.
struct Retest {
    session: String,
    model: String,
    provider: String,
    opened: RetestOpened,
    finding: Finding,
    verdict: Option<RetestVerdict>,
    adjudications: Vec<RetestAdjudication>,
    /// The operator ended the session before any verdict.
    ended: Option<RetestEnded>,
}

pub fn run(a: ReportArgs) -> i32 {
    match report(&a) {
        Ok(text) => {
            println!("{text}");
            0
        }
        Err(e) => {
            crate::ui::say_failure(&e);
            crate::error::EXIT_FAILED
        }
    }
}

fn report(a: &ReportArgs) -> Result<String, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let v = verify::verify(&path).map_err(|e| CliError::Usage(e.to_string()))?;
    if !v.intact {
        return Err(CliError::Usage(format!(
            "the ledger {} does not verify (`retie verify`); no report is made from it",
            path.display()
        )));
    }
    let r = read(&path, &a.session)?;
    Ok(if a.json {
        serde_json::to_string_pretty(&as_json(&r)).unwrap_or_default()
    } else if a.sarif {
        serde_json::to_string_pretty(&sarif(&r)).unwrap_or_default()
    } else {
        markdown(&r)
    })
}

/// The retest record of session `id`'s opening entry (`opened`, None when
/// the ledger at `path` has no such session), or the error that says
/// which is missing; `hint` names what to use for a session that is not a
/// retest. One reader for `retie report` and `retie retest --resume`.
pub(crate) fn retest_opened(
    opened: Option<Value>,
    id: &str,
    path: &std::path::Path,
    hint: &str,
) -> Result<RetestOpened, CliError> {
    let opened = opened.ok_or_else(|| {
        CliError::Usage(format!(
            "no session {} in the ledger {} (`retie sessions` lists them)",
            crate::ui::visible(id),
            path.display()
        ))
    })?;
    let opened = payload::parse::<payload::SessionOpened>(&opened).map_err(|e| {
        CliError::Usage(format!(
            "session {}: its opening entry is ill-typed ({e}); `retie verify` names it",
            crate::ui::visible(id)
        ))
    })?;
    opened.retest.ok_or_else(|| {
        CliError::Usage(format!(
            "session {} is not a retest session ({hint})",
            crate::ui::visible(id)
        ))
    })
}

fn read(path: &std::path::Path, id: &str) -> Result<Retest, CliError> {
    let ledger = Ledger::open(path, false, None)?;
    let rows = ledger.session_rows(id)?;
    let mut opened_payload = None;
    let mut verdict = None;
    let mut adjudications = Vec::new();
    let mut ended = None;
    for r in &rows {
        let p = r.payload_json();
        if r.kind == Kind::SessionOpened.as_bytes() {
            opened_payload = Some(p);
        } else if r.kind == Kind::Note.as_bytes() {
            let note = payload::parse::<payload::Note>(&p).map_err(|e| {
                CliError::Usage(format!(
                    "session {id}: its note entry {} is unreadable: {e}",
                    r.seq
                ))
            })?;
            if let Some(v) = note.retest_verdict {
                verdict = Some(v);
            } else if let Some(adj) = note.retest_adjudication {
                adjudications.push(adj);
            } else if let Some(e) = note.retest_ended {
                ended = Some(e);
            }
        }
    }
    let opened = retest_opened(
        opened_payload.clone(),
        id,
        path,
        "`retie replay` shows any session",
    )?;
    // Some: retest_opened refuses a session without an opening.
    let opened_payload = opened_payload.unwrap_or(Value::Null);
    let finding: Finding = serde_json::from_value(opened.finding.clone())
        .map_err(|e| CliError::Usage(format!("session {id}: its finding is unreadable: {e}")))?;
    let text = |k: &str| {
        opened_payload
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Ok(Retest {
        session: id.into(),
        model: text("model"),
        provider: text("provider"),
        opened,
        finding,
        verdict,
        adjudications,
        ended,
    })
}

fn as_json(r: &Retest) -> Value {
    json!({
        "format": "retie-retest-report/1",
        "session": r.session,
        "provider": r.provider,
        "model": r.model,
        "lab": r.opened.lab,
        "origin_map": r.opened.origin_map,
        "finding": r.finding,
        "verdict": r.verdict,
        "adjudications": r.adjudications,
        "ended": r.ended,
    })
}

/// Markdown: a person's report.
fn markdown(r: &Retest) -> String {
    let f = &r.finding;
    let mut t = format!("# Retest of {}: {}\n\n", f.id, f.title);
    t.push_str(&format!(
        "- source: `{}` ({}, {})\n- severity: {}\n- weakness: {}\n- lab: `{}`\n- session: `{}` ({} / {})\n",
        f.source.file,
        f.source.format.name(),
        f.source.at,
        f.severity.as_deref().unwrap_or("-"),
        f.cwe.as_deref().unwrap_or("-"),
        r.opened.lab,
        r.session,
        r.provider,
        r.model
    ));
    for m in &r.opened.origin_map {
        t.push_str(&format!("- origin `{}` retested as `{}`\n", m.from, m.to));
    }
    match &r.verdict {
        None if r.ended.is_some() => {
            t.push_str("\n## Verdict\n\nNone: ended by operator before any verdict.\n")
        }
        None => t.push_str(
            "\n## Verdict\n\nNone yet: the session has not concluded (`retie retest --resume`).\n",
        ),
        Some(v) => {
            t.push_str(&format!(
                "\n## Verdict: {}\n\n{}\n\nDecided by {}, in {} of {} steps.\n",
                v.status, v.rationale, v.decided_by, v.steps, v.max_steps
            ));
            if !v.evidence.is_empty() {
                t.push_str("\n### Evidence\n\n");
                for e in &v.evidence {
                    t.push_str(&format!(
                        "- output {} of `{}`:\n\n  ```\n  {}\n  ```\n",
                        e.output_id,
                        e.command,
                        e.excerpt.replace('\n', "\n  ")
                    ));
                }
            }
            t.push_str("\n### Commands run (the original payload and the variants)\n\n");
            for c in &v.commands {
                let how = if c.timed_out {
                    "timed out".to_string()
                } else {
                    c.exit_code.map_or("-".to_string(), |e| format!("exit {e}"))
                };
                let whose = if c.operator { ", the operator's" } else { "" };
                t.push_str(&format!(
                    "- `{}` ({}, {how}{whose})\n",
                    c.command, c.output_id
                ));
            }
        }
    }
    for a in &r.adjudications {
        t.push_str(&format!(
            "\n## Operator's adjudication: {}\n\n{}\n\nBeside the agent's verdict ({}), which stands as recorded.\n",
            a.status,
            a.reason,
            r.verdict.as_ref().map_or("none", |v| v.status.as_str())
        ));
    }
    t
}

/// SARIF 2.1.0: one run, one result for the finding.
fn sarif(r: &Retest) -> Value {
    let f = &r.finding;
    let status = r
        .verdict
        .as_ref()
        .map_or("inconclusive", |v| v.status.as_str());
    let baseline = match status {
        "fixed" => "absent",
        _ => "unchanged",
    };
    let level = match f.severity.as_deref() {
        Some("critical" | "high") => "error",
        Some("medium") => "warning",
        Some(_) => "note",
        None => "warning",
    };
    let rule_id = f.rule.clone().unwrap_or_else(|| f.id.clone());
    let mut rule = json!({
        "id": rule_id,
        "shortDescription": {"text": f.title},
    });
    if let Some(c) = &f.cwe {
        rule["properties"] =
            json!({"tags": ["security", format!("external/cwe/{}", c.to_ascii_lowercase())]});
    }
    let locations: Vec<Value> = f
        .instances
        .iter()
        .map(|x| json!({"physicalLocation": {"artifactLocation": {"uri": x.url}}}))
        .collect();
    let mut props = json!({
        "retieRetestStatus": status,
        "retieSession": r.session,
        "retieLab": r.opened.lab,
        "retieOriginMap": r.opened.origin_map,
        "retieFindingId": f.id,
    });
    if let Some(v) = &r.verdict {
        props["retieRationale"] = json!(v.rationale);
        props["retieDecidedBy"] = json!(v.decided_by);
        props["retieEvidence"] = json!(v.evidence);
        props["retieCommands"] = json!(v.commands.iter().map(|c| &c.command).collect::<Vec<_>>());
    }
    if status == "inconclusive" {
        props["retieInconclusive"] = json!(true);
    }
    if !r.adjudications.is_empty() {
        props["retieAdjudications"] = json!(r.adjudications);
    }
    if r.ended.is_some() && r.verdict.is_none() {
        props["retieEndedBy"] = json!("operator");
    }
    let message = format!(
        "{} — retest verdict: {status}{}",
        f.title,
        r.verdict
            .as_ref()
            .map(|v| format!(" ({})", v.rationale))
            .unwrap_or_default()
    );
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "retie retest",
                "informationUri": "https://github.com/retie/retie",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": [rule],
            }},
            "results": [{
                "ruleId": rule_id,
                "ruleIndex": 0,
                "level": level,
                "message": {"text": message},
                "locations": locations,
                "baselineState": baseline,
                "partialFingerprints": {"retieFindingId/v1": f.id},
                "properties": props,
            }],
        }],
    })
}
