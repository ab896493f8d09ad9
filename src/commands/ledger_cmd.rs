//! `retie ledger`: a shared ledger's housekeeping (ADR 0460): this
//! machine's public key, admitting another machine's key, and copying a
//! local SQLite ledger into a shared PostgreSQL one.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::error::CliError;
use crate::ledger::{self, keys, verify, Ledger};

#[derive(Subcommand)]
pub enum LedgerCmd {
    /// Print this machine's user key (public half, hex): what the owner of
    /// a shared ledger admits with `retie ledger admit`.
    Key,
    /// Admit another machine's user key to this ledger (only its owner,
    /// the key that opened it, can): a `member` entry.
    Admit(AdmitArgs),
    /// Copy a local SQLite ledger into an empty PostgreSQL one, entry for
    /// entry, with its checkpoints; both are verified, before and after.
    Copy(CopyArgs),
}

#[derive(Args)]
pub struct AdmitArgs {
    /// The key to admit (64 hex digits; `retie ledger key` on that machine).
    pub key: String,
    /// The ledger (default: RETIE_LEDGER, else `[ledger] url`, else
    /// STATE/ledger.db).
    #[arg(long, value_name = "PATH|URL")]
    pub ledger: Option<PathBuf>,
}

#[derive(Args)]
pub struct CopyArgs {
    /// The SQLite ledger to copy.
    #[arg(long, value_name = "PATH")]
    pub from: PathBuf,
    /// The PostgreSQL ledger to copy into (postgres://USER@HOST/DB; it
    /// must hold no entry).
    #[arg(long, value_name = "URL")]
    pub to: PathBuf,
}

pub fn run(cmd: LedgerCmd) -> Result<i32, CliError> {
    match cmd {
        LedgerCmd::Key => {
            let user = keys::user_key()?;
            println!("{}", ledger::hex(user.verifying_key().as_bytes()));
            Ok(0)
        }
        LedgerCmd::Admit(a) => {
            let path = ledger::resolve_path(a.ledger.as_deref())?;
            let user = keys::user_key()?;
            let mut l = Ledger::open(&path, false, Some(&user))?;
            let by = std::env::var("USER").unwrap_or_else(|_| "person".into());
            let e = l.admit(&user, a.key.trim(), &format!("{by} (retie ledger admit)"))?;
            eprintln!(
                "admitted {} to {} (entry {})",
                a.key.trim(),
                path.display(),
                e.seq
            );
            Ok(0)
        }
        LedgerCmd::Copy(a) => copy(a),
    }
}

/// Verify `path`; an error unless intact and complete.
fn verified(path: &std::path::Path, what: &str) -> Result<verify::Report, CliError> {
    let r = verify::verify(path)?;
    if !r.intact || r.complete == Some(false) {
        return Err(CliError::Usage(format!(
            "{what} {} does not verify ({}): nothing copied. `retie verify --ledger {}` shows what is wrong",
            path.display(),
            r.first_bad
                .as_ref()
                .map(|b| b.what.clone())
                .or(r.incomplete_because.clone())
                .unwrap_or_else(|| r.verdict.into()),
            path.display()
        )));
    }
    Ok(r)
}

fn copy(a: CopyArgs) -> Result<i32, CliError> {
    if ledger::pg::is_url(&a.from) {
        return Err(CliError::Usage(
            "--from is a local SQLite ledger file (a PostgreSQL source is not supported)".into(),
        ));
    }
    if !ledger::pg::is_url(&a.to) {
        return Err(CliError::Usage(
            "--to must be a postgres://USER@HOST/DB URL".into(),
        ));
    }
    let before = verified(&a.from, "the source ledger")?;
    let rows = Ledger::open(&a.from, false, None)?.rows()?;
    let mut to = Ledger::open(&a.to, true, None)?;
    let n = to.import_rows(&rows)?;
    drop(to);
    // The source's checkpoints sign (count, head): they hold for the copy.
    let (src_cp, dst_cp) = (
        ledger::checkpoint_path(&a.from),
        ledger::checkpoint_path(&a.to),
    );
    if let Ok(text) = std::fs::read(&src_cp) {
        if let Some(d) = dst_cp.parent() {
            std::fs::create_dir_all(d)
                .map_err(|e| CliError::io(format!("creating {}", d.display()), e))?;
        }
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&dst_cp)
            .and_then(|mut f| f.write_all(&text))
            .map_err(|e| CliError::io(format!("writing {}", dst_cp.display()), e))?;
    }
    let after = verified(&a.to, "the copy")?;
    if after.entries != before.entries || after.head != before.head {
        return Err(CliError::Usage(format!(
            "the copy {} holds {} entries with head {:?}, the source {} with head {:?}",
            a.to.display(),
            after.entries,
            after.head,
            before.entries,
            before.head
        )));
    }
    eprintln!(
        "copied {n} entries from {} to {}: both verify intact, head {}",
        a.from.display(),
        a.to.display(),
        after.head.unwrap_or_default()
    );
    Ok(0)
}
