//! `retie log`: the ledger's sessions and their action ids (to undo).

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::ledger::{self, model, Ledger};

#[derive(Args)]
pub struct LogArgs {
    /// Every workspace's sessions, not only the current directory's.
    #[arg(long)]
    pub all: bool,
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// The sessions and their actions as JSON, on stdout (each with its
    /// kind, and `unstarted` for one whose provider failed before its
    /// first turn; these are listed there whatever --unstarted says).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub list: super::scope::ListArgs,
}

pub fn run(a: LogArgs) -> i32 {
    let rows = match ledger::resolve_path(a.ledger.as_deref())
        .and_then(|p| Ledger::open(&p, false, None))
        .and_then(|l| l.rows())
    {
        Ok(r) => r,
        Err(e) => {
            crate::ui::say_failure(&e);
            return crate::error::EXIT_FAILED;
        }
    };
    let sessions = model::sessions(&rows);
    let scope =
        super::scope::Scope::of_cwd(a.all, sessions.iter().filter_map(|s| s.workspace_path()));
    let sessions: Vec<model::Session> = sessions
        .into_iter()
        .filter(|s| scope.holds(s.workspace_path()))
        .collect();
    let mut list = a.list.clone();
    list.unstarted |= a.json;
    let sel = list.select(sessions, |s| s.kind(), |s| s.failed_before_first_turn());
    let sessions = sel.items;
    if a.json {
        let v: Vec<_> = sessions
            .iter()
            .map(|s| {
                json!({
                    "session": s.id,
                    "kind": s.kind(),
                    "unstarted": s.failed_before_first_turn(),
                    "opened_ms": s.opened_ms,
                    "closed_ms": s.closed_ms,
                    "workspace": s.workspace(),
                    "objective": s.objective(),
                    "actions": s.actions.iter().map(|a| json!({
                        "id": a.id, "time_ms": a.time_ms, "tool": a.tool(),
                        "command": a.command(), "status": a.status(),
                        "reversible": a.reversible(), "undone": a.undone(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", json!({ "sessions": v }));
        return 0;
    }
    if sessions.is_empty() && sel.unstarted.is_empty() && sel.older == 0 {
        println!("no sessions {}", scope.place());
        return 0;
    }
    println!("{}", a.list.header("session", &scope, sessions.len()));
    for s in &sessions {
        println!(
            "session {}  {:<6}  {}  {}  \"{}\"",
            crate::ui::visible(&s.id),
            s.kind(),
            crate::commands::replay::time(s.opened_ms),
            s.workspace(),
            s.objective()
        );
        for a in &s.actions {
            println!(
                "  action {:>6}  {}  {:<11} {}{}  {}",
                a.id,
                crate::commands::replay::time(a.time_ms),
                a.status(),
                if a.reversible() {
                    "reversible"
                } else {
                    "not reversible"
                },
                if a.undone() { ", undone" } else { "" },
                a.command()
            );
        }
    }
    if sel.older > 0 {
        println!("({} older sessions not listed: --limit)", sel.older);
    }
    if let Some(last) = sel.unstarted.last() {
        println!(
            "({} agent session{} whose provider failed before the first turn not listed (--unstarted lists them); the last: {})",
            sel.unstarted.len(),
            if sel.unstarted.len() == 1 { "" } else { "s" },
            crate::ui::visible(&last.id),
        );
    }
    0
}
