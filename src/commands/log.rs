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
    /// The sessions and their actions as JSON, on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: LogArgs) -> i32 {
    let rows = match ledger::resolve_path(a.ledger.as_deref())
        .and_then(|p| Ledger::open(&p, false, None))
        .and_then(|l| l.rows())
    {
        Ok(r) => r,
        Err(e) => {
            crate::ui::say_error(&e);
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
    if a.json {
        let v: Vec<_> = sessions
            .iter()
            .map(|s| {
                json!({
                    "session": s.id,
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
    if sessions.is_empty() {
        println!("no sessions {}", scope.place());
    }
    for s in &sessions {
        println!(
            "session {}  {}  {}  \"{}\"",
            crate::ui::visible(&s.id),
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
    0
}
