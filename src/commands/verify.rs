//! `retie verify`: check the ledger from outside the process that wrote it.
//! Exit 0: intact and complete (or no checkpoint yet); 1: tampered; 2:
//! intact but incomplete (shorter than its newest checkpoint); 125: no
//! ledger / cannot run.

use std::path::PathBuf;

use clap::Args;

use crate::ledger::{self, verify};

#[derive(Args)]
pub struct VerifyArgs {
    /// The ledger (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: VerifyArgs) -> i32 {
    let path = match ledger::resolve_path(a.ledger.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            crate::ui::say_failure(&e);
            return crate::error::EXIT_FAILED;
        }
    };
    let r = match verify::verify(&path) {
        Ok(r) => r,
        Err(e) => {
            crate::ui::say_failure(&e);
            return crate::error::EXIT_FAILED;
        }
    };
    if a.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        print_report(&r);
    }
    r.exit_code()
}

pub fn print_report(r: &verify::Report) {
    println!(
        "ledger:   {} ({} entries, {} sessions)",
        r.ledger, r.entries, r.sessions
    );
    println!(
        "intact:   {}",
        if r.intact {
            "yes: every hash, link, signature, delegation and checkpoint checks out".to_string()
        } else {
            format!("NO: {} problem(s)", r.problems.len())
        }
    );
    println!(
        "complete: {}",
        match (r.complete, &r.incomplete_because) {
            (Some(true), _) => format!(
                "yes: at least the {} entries of the newest checkpoint",
                r.checkpoint.as_ref().map(|c| c.count).unwrap_or(0)
            ),
            (Some(false), Some(why)) => format!("NO: {why}"),
            (Some(false), None) => "NO".to_string(),
            (None, _) => "unknown: no checkpoint yet".to_string(),
        }
    );
    if let Some(b) = &r.first_bad {
        match b.seq {
            Some(s) => println!("first bad entry: {s}: {}", b.what),
            None => println!("first problem: {}", b.what),
        }
        for p in r.problems.iter().skip(1).take(9) {
            match p.seq {
                Some(s) => println!("  also entry {s}: {}", p.what),
                None => println!("  also: {}", p.what),
            }
        }
        if r.problems.len() > 10 {
            println!("  ... and {} more", r.problems.len() - 10);
        }
    }
    println!("verdict:  {}", r.verdict);
}
