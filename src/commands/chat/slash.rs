//! The slash commands of the interactive terminal. Undo, undo-all and
//! replay call the same functions as `retie undo`, `retie undo-all` and
//! `retie replay` (nothing spawns the binary).

use std::path::Path;

use retie_agent::provider::AnyProvider;
use retie_agent::session::Session;
use retie_policy::Tier;
use serde_json::Value;

use crate::commands::{replay, undo};
use crate::ledger::{model, Ledger};
use crate::ui::{visible, Style};

pub const HELP: &str = "\
/undo [ACTION]     undo one action (default: the last undoable one)
/undo-all          undo every action of this session, newest first
/replay            this session's actions, decisions and outcomes
/diff [ACTION]     what this session changed so far, as diffs (or one action's: /diff #13)
/approvals         the \"always\" grants of this session
/approvals revoke N  revoke grant N
/autonomy [LEVEL]  show, or set manual, gated or auto from the next task on
/model [NAME]      show, or set the model asked from the next task on
/cost              tokens in and out so far (and the cost, with prices in config)
/help              this list
/quit, /exit       end the session (as Ctrl-D does)
Ctrl-C cancels the running turn; Ctrl-C twice or Ctrl-D ends the session.
A line ending in \\ (or Alt-Enter) continues on the next.";

/// What a slash command may change.
pub struct Ctx<'a> {
    pub ledger_path: &'a Path,
    pub session: &'a mut Session<AnyProvider>,
    pub price: Option<(f64, f64)>,
    pub style: Style,
}

/// Whether this line ends the session (`/quit`, `/exit`), as Ctrl-D does.
pub fn ends_session(line: &str) -> bool {
    matches!(line.split_whitespace().next(), Some("/quit" | "/exit"))
}

/// Run one slash command line (`/name args`).
pub fn run(line: &str, cx: Ctx<'_>) {
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    let ledger = Some(cx.ledger_path.to_path_buf());
    let id = cx.session.id().to_string();
    match (name, rest.as_slice()) {
        ("/help", _) => println!("{HELP}"),
        ("/undo", []) | ("/undo", [_]) => {
            let action = rest.first().copied().unwrap_or("last").to_string();
            undo::run_one(undo::UndoArgs {
                action,
                all: false,
                workspace: Some(cx.session.tools().workspace.clone()),
                ledger,
                json: false,
            });
        }
        ("/undo-all", []) => {
            undo::run_all(undo::UndoAllArgs {
                session: Some(id.clone()),
                all: false,
                ledger,
                json: false,
            });
        }
        ("/replay", []) => {
            replay::run(replay::ReplayArgs {
                session: Some(id.clone()),
                last: false,
                all: false,
                ledger,
                markdown: false,
                json: false,
                diff: false,
            });
        }
        ("/diff", []) => {
            if list(cx.ledger_path, &id, cx.style) {
                diff(cx.ledger_path, &id, None);
            }
        }
        ("/diff", [a]) => match a.trim_start_matches('#').parse::<i64>() {
            Ok(n) => diff(cx.ledger_path, &id, Some(n)),
            Err(_) => println!("/diff takes an action's number (/diff #13; see /replay)"),
        },
        ("/approvals", []) => {
            let grants = cx.session.grants();
            if grants.is_empty() {
                println!("no grants in this session");
            }
            for (i, g) in grants.iter().enumerate() {
                let what: Vec<String> = g
                    .keys
                    .iter()
                    .map(|k| visible(k.strip_prefix("bash:").unwrap_or(k)))
                    .collect();
                println!(
                    "{}. always: {}  {}",
                    i + 1,
                    what.join(" ; "),
                    cx.style
                        .dim(&format!("(grant #{}, {})", g.seq, visible(&g.by)))
                );
            }
        }
        ("/approvals", ["revoke", n]) => {
            let grants = cx.session.grants();
            match n
                .parse::<usize>()
                .ok()
                .and_then(|i| grants.get(i.wrapping_sub(1)))
            {
                Some(g) => match cx.session.revoke(g.seq) {
                    Ok(()) => println!("revoked: {}", visible(&g.keys.join(" ; "))),
                    Err(e) => println!("could not revoke: {e}"),
                },
                None => println!("no grant {} (see /approvals)", visible(n)),
            }
        }
        ("/autonomy", []) => println!(
            "autonomy {} (change it with /autonomy manual|gated|auto)",
            cx.session.config().tier
        ),
        ("/model", []) => println!(
            "model {} (change it with /model NAME)",
            visible(&cx.session.config().model)
        ),
        ("/autonomy", [level]) => match level.parse::<Tier>() {
            Ok(t) => match cx.session.set_tier(t) {
                Ok(()) => println!("autonomy {t} from the next task on (recorded)"),
                Err(e) => println!("autonomy unchanged: the ledger could not record it: {e}"),
            },
            Err(_) => println!("autonomy is manual, gated or auto"),
        },
        ("/model", [m]) => match cx.session.set_model(m) {
            Ok(()) => println!("model {} from the next task on (recorded)", visible(m)),
            Err(e) => println!("model unchanged: the ledger could not record it: {e}"),
        },
        ("/cost", []) => {
            // The same computation as `retie usage`, over this session's
            // records (flushed first, so the last turn is in them).
            let rows = cx
                .session
                .flush()
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    retie_ledger::Ledger::open(cx.ledger_path, false, None)
                        .and_then(|l| l.session_rows(cx.session.id()))
                        .map_err(|e| e.to_string())
                });
            match rows {
                Ok(rows) => {
                    let u = super::super::models::usage_rows(&rows);
                    print!(
                        "{}",
                        super::super::models::render(&u, super::super::models::GroupBy::Model)
                    );
                }
                Err(e) => println!("the ledger could not be read: {e}"),
            }
            let u = cx.session.usage();
            print!(
                "{} tokens in, {} out, {} turns",
                u.input_tokens,
                u.output_tokens,
                cx.session.turns()
            );
            match cx.price {
                Some((i, o)) => println!(
                    ", about ${:.4} at the configured prices",
                    u.input_tokens as f64 / 1e6 * i + u.output_tokens as f64 / 1e6 * o
                ),
                None => println!(" (no price for this model in config: [agent.prices])"),
            }
        }
        _ => println!("unknown command {} (see /help)", visible(line.trim())),
    }
}

/// What the session changed so far (or one action), as diffs: the same
/// as `retie replay --diff`.
fn diff(path: &Path, session: &str, action: Option<i64>) {
    let rows = match Ledger::open(path, false, None).and_then(|l| l.rows()) {
        Ok(r) => r,
        Err(e) => {
            println!("the ledger could not be read: {e}");
            return;
        }
    };
    let sessions = model::sessions(&rows);
    if let Some(s) = sessions.iter().find(|s| s.id == session) {
        if action.is_none() {
            println!(
                "{}",
                Style::stdout().bold("net change (before the session → now):")
            );
        }
        crate::commands::netdiff::print(s, action, Style::stdout());
    }
}

/// What the session changed so far, from the ledger: each action that
/// changed the workspace, with the paths, marked when undone.
fn list(path: &Path, session: &str, st: Style) -> bool {
    let rows = match Ledger::open(path, false, None).and_then(|l| l.rows()) {
        Ok(r) => r,
        Err(e) => {
            println!("the ledger could not be read: {e}");
            return false;
        }
    };
    let sessions = model::sessions(&rows);
    let Some(s) = sessions.iter().find(|s| s.id == session) else {
        println!("nothing changed yet");
        return false;
    };
    let mut any = false;
    for a in &s.actions {
        let paths: Vec<String> = a
            .changes
            .as_ref()
            .and_then(|c| c.pointer("/undo/paths"))
            .or_else(|| a.intent.pointer("/undo/paths"))
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).map(visible).collect())
            .unwrap_or_default();
        let file = a
            .intent
            .pointer("/args/path")
            .and_then(Value::as_str)
            .map(visible);
        let changed = a.status() == "applied" || (!paths.is_empty()) || a.reversible();
        if !changed || (paths.is_empty() && file.is_none()) {
            continue;
        }
        if !any {
            println!("{}", st.bold("actions that changed files:"));
        }
        any = true;
        let mark = if a.undone() { " (undone)" } else { "" };
        println!(
            "#{} {} {}{}",
            a.id,
            a.tool(),
            st.dim(&a.command()),
            st.yellow(mark)
        );
        for p in paths.iter().chain(file.iter()) {
            println!("    {p}");
        }
    }
    if !any {
        println!("nothing changed yet");
    }
    any
}
