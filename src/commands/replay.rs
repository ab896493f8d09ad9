//! `retie replay`: verify the ledger, then show one session's actions with
//! their decisions, classes, outcomes, refusals and totals (text, Markdown
//! for a pull request, or JSON).

use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use crate::ledger::{self, model, verify, Ledger};

#[derive(Args)]
pub struct ReplayArgs {
    /// The session to show (default: the last one).
    #[arg(value_name = "SESSION", conflicts_with = "last")]
    pub session: Option<String>,
    /// Show the last session.
    #[arg(long)]
    pub last: bool,
    /// Without SESSION: the last session of any workspace, not only the
    /// current directory's.
    #[arg(long)]
    pub all: bool,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// Markdown, fit to paste into a pull request.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// The session as JSON, on stdout.
    #[arg(long)]
    pub json: bool,
    /// What the session changed, as diffs: each file's content before the
    /// session against the workspace now (as `/diff` shows it).
    #[arg(long, conflicts_with_all = ["json", "markdown"])]
    pub diff: bool,
}

/// UTC time of a millisecond timestamp, `YYYY-MM-DD HH:MM:SS`.
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub fn run(a: ReplayArgs) -> i32 {
    let path = match ledger::resolve_path(a.ledger.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            crate::ui::say_failure(&e);
            return crate::error::EXIT_FAILED;
        }
    };
    let report = match verify::verify(&path) {
        Ok(r) => r,
        Err(e) => {
            crate::ui::say_failure(&e);
            return crate::error::EXIT_FAILED;
        }
    };
    if !report.intact {
        eprintln!("retie: the ledger does not verify; refusing to replay it:");
        if let Some(b) = &report.first_bad {
            eprintln!(
                "  first bad entry: {}: {}",
                b.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                b.what
            );
        }
        return report.exit_code();
    }
    if let Some(why) = &report.incomplete_because {
        eprintln!("retie: warning: the ledger is INCOMPLETE: {why}");
    }
    let rows = match Ledger::open(&path, false, None).and_then(|l| l.rows()) {
        Ok(r) => r,
        Err(e) => {
            crate::ui::say_failure(&e);
            return crate::error::EXIT_FAILED;
        }
    };
    let sessions = model::sessions(&rows);
    let (s, place) = match &a.session {
        Some(id) => (sessions.iter().find(|s| &s.id == id), String::new()),
        None => {
            let scope = super::scope::Scope::of_cwd(
                a.all,
                sessions.iter().filter_map(|s| s.workspace_path()),
            );
            (
                sessions
                    .iter()
                    .rev()
                    .find(|s| scope.holds(s.workspace_path())),
                scope.place(),
            )
        }
    };
    let Some(s) = s else {
        eprintln!(
            "retie: {}",
            match &a.session {
                Some(id) => format!("no session {id} in the ledger"),
                None => format!("no session {place}"),
            }
        );
        return crate::error::EXIT_FAILED;
    };
    if a.diff {
        crate::commands::netdiff::print(s, None, crate::ui::Style::stdout());
        return 0;
    }
    let t = totals(s);
    if a.json {
        let actions: Vec<Value> = s.actions.iter().map(action_json).collect();
        println!(
            "{}",
            json!({
                "verified": {"intact": report.intact, "complete": report.complete, "entries": report.entries},
                "session": s.id,
                "workspace": s.workspace(),
                "objective": s.objective(),
                "opened": s.opened,
                "actions": actions,
                "refusals": s.refusals,
                "approvals": s.approvals,
                "grants": s.grants,
                "provider_attempts": s.provider_attempts.iter().map(|(ms, a)| json!({"time_ms": ms, "attempt": a})).collect::<Vec<_>>(),
                "end": s.end,
                "totals": t,
            })
        );
        return report.exit_code();
    }
    let md = a.markdown;
    if md {
        println!("## retie session `{}`\n", crate::ui::visible(&s.id));
        println!("- objective: {}", s.objective());
        println!("- workspace: `{}`", s.workspace());
        println!(
            "- ledger: {} entries, verified intact{}\n",
            report.entries,
            match report.complete {
                Some(true) => ", complete",
                Some(false) => ", INCOMPLETE",
                None => "",
            }
        );
        println!("| # | time (UTC) | tool | command | decision | class | flags | outcome |");
        println!("|---|---|---|---|---|---|---|---|");
    } else {
        println!("session {}  {}", crate::ui::visible(&s.id), s.workspace());
        println!("objective: {}", s.objective());
        println!(
            "ledger verified: intact{}",
            if report.complete == Some(false) {
                ", INCOMPLETE"
            } else {
                ""
            }
        );
    }
    for a in &s.actions {
        // An ill-typed intent shows `?` (replay verified the ledger first).
        let i = a.typed_intent();
        let decision = format!(
            "{} by {}",
            i.as_ref().map_or("?", |i| i.decision.as_str()),
            i.as_ref().map_or("?", |i| i.decided_by.as_str())
        );
        let class = i
            .as_ref()
            .and_then(|i| i.class.clone())
            .unwrap_or_else(|| "?".into());
        let decision = crate::ui::visible(&decision);
        let class = crate::ui::visible(&class);
        let flags = a.flags().join(", ");
        let outcome = outcome_text(a);
        if md {
            println!(
                "| {} | {} | {} | `{}` | {} | {} | {} | {} |",
                a.id,
                time(a.time_ms),
                a.tool(),
                a.command().replace('|', "\\|").replace('`', "'"),
                decision,
                class,
                flags,
                outcome.replace('|', "\\|")
            );
        } else {
            println!(
                "  [{}] {}  {}  {}\n        decision: {decision}; class: {class}{}\n        outcome: {outcome}",
                a.id,
                time(a.time_ms),
                a.tool(),
                a.command(),
                if flags.is_empty() { String::new() } else { format!("; flags: {flags}") }
            );
            for l in net_lines(a) {
                println!("        net: {l}");
            }
        }
    }
    if !s.refusals.is_empty() {
        if md {
            println!("\n### Refused\n");
        } else {
            println!("REFUSED:");
        }
        for r in &s.refusals {
            let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
            let command = r
                .get("command")
                .and_then(Value::as_array)
                .map(|a| {
                    let args: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
                    crate::ui::shell_line(&args)
                })
                .unwrap_or_default();
            let line = format!(
                "{} {}: {} (by {})",
                crate::ui::visible(&field("tool")),
                command,
                crate::ui::visible(&field("reason")),
                crate::ui::visible(&field("by"))
            );
            if md {
                println!("- **refused**: {}", line.replace('|', "\\|"));
            } else {
                println!("  {line}");
            }
        }
    }
    if !s.approvals.is_empty() || !s.grants.is_empty() {
        if md {
            println!("\n### Asked a person\n");
        } else {
            println!("ASKED A PERSON:");
        }
        for a in &s.approvals {
            let line = format!(
                "[{}] {}  {}  digest {}: {}",
                a.pending,
                time(a.time_ms),
                a.action(),
                crate::ui::visible(
                    a.payload
                        .get("digest")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                ),
                a.verdict()
            );
            if md {
                println!("- {}", line.replace('|', "\\|"));
            } else {
                println!("  {line}");
            }
        }
        for g in &s.grants {
            let line = format!(
                "grant [{}] always: {}{}",
                g.seq,
                g.keys.join(", "),
                if g.revoked { " (revoked)" } else { "" }
            );
            if md {
                println!("- {}", line.replace('|', "\\|"));
            } else {
                println!("  {line}");
            }
        }
        if s.suspended > 0 {
            println!(
                "{}suspended {} time(s), resumed {} time(s)",
                if md { "- " } else { "  " },
                s.suspended,
                s.resumed
            );
        }
    }
    if !s.provider_attempts.is_empty() {
        if md {
            println!("\n### Provider failures\n");
        } else {
            println!("PROVIDER FAILURES:");
        }
        for (ms, a) in &s.provider_attempts {
            let line = format!("{}  {}", time(*ms), a.line());
            if md {
                println!("- {}", line.replace('|', "\\|"));
            } else {
                println!("  {line}");
            }
        }
    }
    if let Some(end) = &s.end {
        let line = format!("{}: {}", end.words(), crate::ui::visible(&end.message));
        if md {
            println!("\n**Ended**: {}", line.replace('|', "\\|"));
        } else {
            println!("ended: {line}");
        }
    }
    let line = format!(
        "actions {}, refused {}, interrupted {}, not reversible {}, flagged {}, undone {}, turns {}, duration {:.1} s",
        t["actions"], t["refused"], t["interrupted"], t["not_reversible"], t["flagged"], t["undone"], t["turns"],
        t["duration_s"].as_f64().unwrap_or(0.0)
    );
    if md {
        println!("\n**Totals**: {line}");
    } else {
        println!("totals: {line}");
    }
    report.exit_code()
}

/// A networked run's allow-list and connections (ADR 0310), one line each.
fn net_lines(a: &model::Action) -> Vec<String> {
    let Some(net) = a.outcome.as_ref().and_then(|o| o.get("net")) else {
        return Vec::new();
    };
    let s =
        |v: &Value| crate::ui::visible(&v.as_str().map_or_else(|| v.to_string(), str::to_owned));
    let mut out = vec![format!(
        "allow {}",
        net["allow"]
            .as_array()
            .map(|l| l.iter().map(s).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    )];
    for c in net["connections"].as_array().into_iter().flatten() {
        out.push(if c["allowed"] == json!(true) {
            format!(
                "allowed {} {}:{} ({}), sent {} B, received {} B{}",
                s(&c["method"]),
                s(&c["host"]),
                c["port"],
                s(&c["addr"]),
                c["sent"],
                c["received"],
                match (&c["error"], &c["closed"]) {
                    (Value::String(e), _) => format!(", failed: {}", crate::ui::visible(e)),
                    (_, Value::Bool(false)) => ", cut off".to_string(),
                    _ => String::new(),
                }
            )
        } else {
            format!(
                "refused {} {}: {} ({})",
                s(&c["method"]),
                s(&c["target"]),
                s(&c["detail"]),
                s(&c["reason"])
            )
        });
    }
    if let Some(d) = net["proxy_died"].as_str() {
        out.push(format!(
            "the proxy ended during the run: {}",
            crate::ui::visible(d)
        ));
    }
    out
}

fn outcome_text(a: &model::Action) -> String {
    let mut s = match &a.outcome {
        None => "INTERRUPTED: no outcome was recorded (the writer died)".to_string(),
        Some(o) => {
            let mut t = a.status().to_string();
            if let Some(c) = o.get("exit_code").and_then(Value::as_i64) {
                t.push_str(&format!(", exit {c}"));
            }
            if let Some(n) = o.get("changes").and_then(Value::as_u64) {
                t.push_str(&format!(", {n} change(s)"));
            }
            if let Some(m) = o
                .get("failure")
                .or_else(|| o.get("why"))
                .and_then(Value::as_str)
            {
                t.push_str(&format!(": {}", crate::ui::visible(m)));
            }
            if let Some(c) = o.pointer("/net/connections").and_then(Value::as_array) {
                let allowed = c.iter().filter(|c| c["allowed"] == json!(true)).count();
                t.push_str(&format!(
                    ", network: {allowed} connection(s) allowed, {} refused",
                    c.len() - allowed
                ));
            }
            t
        }
    };
    for u in &a.undos {
        s.push_str(&format!(
            "; undo: {}",
            u.get("result")
                .or_else(|| u.get("status"))
                .and_then(Value::as_str)
                .unwrap_or("?")
        ));
    }
    s
}

fn action_json(a: &model::Action) -> Value {
    let i = a.typed_intent();
    json!({
        "id": a.id,
        "time_ms": a.time_ms,
        "tool": a.tool(),
        "command": a.command(),
        "decision": i.as_ref().map(|i| &i.decision),
        "decided_by": i.as_ref().map(|i| &i.decided_by),
        "class": i.as_ref().and_then(|i| i.class.as_ref()),
        "flags": a.flags(),
        "undo_plan": i.as_ref().and_then(|i| i.undo.as_ref()),
        "status": a.status(),
        "outcome": a.outcome,
        "undos": a.undos,
    })
}

fn totals(s: &model::Session) -> Value {
    let refused = s.refusals.len()
        + s.actions
            .iter()
            .filter(|a| a.status().starts_with("refused"))
            .count();
    json!({
        "actions": s.actions.len(),
        "refused": refused,
        "interrupted": s.actions.iter().filter(|a| a.outcome.is_none()).count(),
        "not_reversible": s.actions.iter().filter(|a| !a.reversible()).count(),
        "flagged": s.actions.iter().filter(|a| !a.flags().is_empty()).count(),
        "undone": s.actions.iter().filter(|a| a.undone()).count(),
        "turns": s.turns,
        "duration_s": (s.closed_ms.unwrap_or(s.last_ms) - s.opened_ms) as f64 / 1000.0,
    })
}
