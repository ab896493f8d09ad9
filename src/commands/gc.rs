//! `retie gc` and `retie status`: the state retie keeps, where, how large,
//! and collecting what nothing needs.
//!
//! What `gc` removes:
//! - journal entries older than `keep_days` are expired (they can no
//!   longer be undone, and `undo` says so), then every pre-image blob that
//!   no pending or complete entry names;
//! - kept overlay runs older than `keep_days`, and run directories a
//!   killed retie left behind (no `run.json`, or never kept) older than a
//!   day;
//! - then, if the state is still over `max_mb`, the oldest entries and
//!   runs until it fits.
//!
//! It never removes a pre-image an action that can still be undone needs:
//! only entries it expires first lose theirs.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use retie_snapshot::{EntryState, GcOptions, Journal, Store};
use serde::Deserialize;
use serde_json::json;

use super::changes::RunMeta;
use crate::error::CliError;

#[derive(Args)]
pub struct GcArgs {
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep undo data and kept runs this many days (default: the config's
    /// `[state] keep_days`, else 30).
    #[arg(long, value_name = "N")]
    pub keep_days: Option<u64>,
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `$XDG_CONFIG_HOME/retie/config.toml`; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    #[serde(default)]
    state: StateConfig,
    /// `retie run`'s settings.
    #[serde(default)]
    pub(crate) agent: super::run::AgentConfig,
    /// `--net allow:` and `--net registries` (ADR 0310).
    #[serde(default)]
    pub(crate) network: super::net::NetworkConfig,
    /// The model ladder's settings.
    #[serde(default)]
    pub(crate) ladder: super::models::LadderConfig,
    /// Where the ledger is (ADR 0460).
    #[serde(default)]
    pub(crate) ledger: LedgerConfig,
}

/// `[ledger]`: `url = "postgres://USER@HOST/DB"` names a shared ledger
/// (after `--ledger` and `RETIE_LEDGER`, before the default file). A
/// password in it is refused when it is opened; it comes from PGPASSWORD,
/// ~/.pgpass or the variable RETIE_LEDGER_PASSWORD_ENV names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LedgerConfig {
    pub(crate) url: Option<String>,
    /// Keys (hex) whose decisions a resume here carries out, for every
    /// workspace; this machine's own key always. Empty: any key the
    /// ledger accepts.
    #[serde(default)]
    pub(crate) approvers: Vec<String>,
    /// Per workspace (its absolute path): replaces `approvers` there.
    #[serde(default)]
    pub(crate) workspace_approvers: std::collections::BTreeMap<String, Vec<String>>,
}

impl LedgerConfig {
    /// The allow-list for the workspace `ws`.
    pub(crate) fn approvers_for(&self, ws: &std::path::Path) -> Vec<String> {
        let canonical = std::fs::canonicalize(ws).unwrap_or_else(|_| ws.to_path_buf());
        self.workspace_approvers
            .iter()
            .find(|(k, _)| {
                let k = std::path::Path::new(k);
                k == ws || std::fs::canonicalize(k).is_ok_and(|c| c == canonical)
            })
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| self.approvers.clone())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateConfig {
    keep_days: Option<u64>,
    max_mb: Option<u64>,
}

pub(crate) fn config() -> Result<(Config, PathBuf), CliError> {
    let path = crate::state::xdg_base("XDG_CONFIG_HOME", ".config")
        .ok_or_else(|| CliError::Usage("neither XDG_CONFIG_HOME nor HOME is set".into()))?
        .join("retie/config.toml");
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text)
            .map(|c| (c, path.clone()))
            .map_err(|e| CliError::Usage(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Config::default(), path)),
        Err(e) => Err(CliError::io(format!("reading {}", path.display()), e)),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn dir_size(p: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !m.is_dir() {
        return m.len();
    }
    std::fs::read_dir(p)
        .map(|d| d.flatten().map(|e| dir_size(&e.path())).sum())
        .unwrap_or(0)
}

struct RunDir {
    id: String,
    path: PathBuf,
    meta: Option<RunMeta>,
    age_ms: u64,
    bytes: u64,
}

fn runs(state: &Path) -> Vec<RunDir> {
    let now = now_ms();
    std::fs::read_dir(state.join("runs"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let path = e.path();
                    let meta: Option<RunMeta> = std::fs::read(path.join("run.json"))
                        .ok()
                        .and_then(|b| serde_json::from_slice(&b).ok());
                    let created = meta
                        .as_ref()
                        .map(|m| u64::try_from(m.created_ms).unwrap_or(0))
                        .or_else(|| {
                            e.metadata()
                                .ok()
                                .and_then(|m| m.modified().ok())
                                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                                .map(|d| u64::try_from(d.as_millis()).unwrap_or(0))
                        })
                        .unwrap_or(0);
                    RunDir {
                        id: e.file_name().to_string_lossy().into_owned(),
                        bytes: dir_size(&path),
                        path,
                        meta,
                        age_ms: now.saturating_sub(created),
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

const DAY_MS: u64 = 24 * 3600 * 1000;

pub fn gc(args: GcArgs) -> Result<i32, CliError> {
    let (cfg, _) = config()?;
    let keep_days = args.keep_days.or(cfg.state.keep_days).unwrap_or(30);
    let state = crate::state::dir()?;
    let snaps = state.join("snapshots");
    let store = Store::open(&snaps)?;
    let journal = Journal::open(&snaps)?;
    let now = now_ms();
    let mut cutoff = now.saturating_sub(keep_days.saturating_mul(DAY_MS));
    let run_due = |r: &RunDir, cutoff_age: u64| match &r.meta {
        Some(m) if m.kept.is_some() => r.age_ms > cutoff_age,
        // Never kept: a run still going, or one a killed retie left.
        _ => r.age_ms > DAY_MS.max(cutoff_age),
    };
    // Over the cap: move the cut-off forward, oldest entries first, until
    // what is left fits (a dry run each step).
    if let Some(max_mb) = cfg.state.max_mb {
        let cap = max_mb.saturating_mul(1 << 20);
        let mut created: Vec<u64> = journal
            .entries()?
            .into_iter()
            .filter(|e| e.state == EntryState::Complete && e.created_unix_ms >= cutoff)
            .map(|e| e.created_unix_ms + 1)
            .collect();
        created.sort_unstable();
        for c in std::iter::once(cutoff).chain(created) {
            cutoff = c;
            let r = retie_snapshot::gc(
                &store,
                &journal,
                &GcOptions {
                    expire_before_ms: Some(cutoff),
                    dry_run: true,
                },
            )?;
            let runs_left: u64 = runs(&state)
                .iter()
                .filter(|r| !run_due(r, now.saturating_sub(cutoff)))
                .map(|r| r.bytes)
                .sum();
            if r.bytes_kept + runs_left <= cap {
                break;
            }
        }
    }
    let report = retie_snapshot::gc(
        &store,
        &journal,
        &GcOptions {
            expire_before_ms: Some(cutoff),
            dry_run: args.dry_run,
        },
    )?;
    // Finished runs' directories waiting in the trash: nothing needs them.
    // Spare run directories (runs that changed nothing) are empty.
    let trash_bytes = dir_size(&state.join(retie_dispatch::overlay::TRASH))
        + dir_size(&state.join(retie_dispatch::overlay::SPARE));
    if !args.dry_run {
        retie_dispatch::overlay::sweep_trash(&state);
        retie_dispatch::overlay::remove_spares(&state);
    }
    let mut removed_runs = Vec::new();
    let mut run_bytes = 0;
    for r in runs(&state) {
        if run_due(&r, now.saturating_sub(cutoff)) {
            // A run still going (its retie or its sandbox alive) holds
            // its lock: never removed under it.
            let Some(_lock) = retie_dispatch::overlay::RunLock::take(&r.path) else {
                continue;
            };
            if !args.dry_run {
                retie_dispatch::overlay::remove_run_dir(&r.path);
            }
            run_bytes += r.bytes;
            removed_runs.push(r.id);
        }
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    if args.json {
        println!(
            "{}",
            json!({
                "dry_run": args.dry_run,
                "keep_days": keep_days,
                "snapshots": report,
                "runs_removed": removed_runs,
                "run_bytes_removed": run_bytes,
                "trash_bytes_removed": trash_bytes,
            })
        );
    } else {
        println!(
            "retie gc: {verb} {} pre-image blob(s) ({}), {} run(s) ({}) and finished runs' directories ({}); expired {} undo entr{} older than the cut-off; kept {} blob(s) ({}) and {} small pre-image(s) carried in the journal ({}) for {} entr{} that can still be undone",
            report.blobs_removed,
            crate::ui::human_size(report.bytes_removed),
            removed_runs.len(),
            crate::ui::human_size(run_bytes),
            crate::ui::human_size(trash_bytes),
            report.expired.len(),
            if report.expired.len() == 1 { "y" } else { "ies" },
            report.blobs_kept,
            crate::ui::human_size(report.bytes_kept),
            report.carried_kept,
            crate::ui::human_size(report.carried_bytes_kept),
            report.live_entries,
            if report.live_entries == 1 { "y" } else { "ies" },
        );
    }
    Ok(0)
}

pub fn status(args: StatusArgs) -> Result<i32, CliError> {
    let (cfg, config_path) = config()?;
    let state = crate::state::dir()?;
    let ledger = crate::ledger::resolve_path(None)?;
    let key = crate::ledger::keys::user_key_path()?;
    let snaps = state.join("snapshots");
    let journal = Journal::open(&snaps)?;
    let mut by_state = std::collections::BTreeMap::new();
    for e in journal.entries()? {
        *by_state.entry(e.state.name()).or_insert(0u64) += 1;
    }
    let runs = runs(&state);
    let kept = runs
        .iter()
        .filter(|r| r.meta.as_ref().is_some_and(|m| m.kept.is_some()))
        .count();
    let ledger_bytes: u64 = ["", "-wal", "-shm", ".checkpoints"]
        .iter()
        .map(|sfx| {
            let mut p = ledger.as_os_str().to_owned();
            p.push(sfx);
            dir_size(Path::new(&p))
        })
        .sum();
    let v = json!({
        "config": {"path": config_path, "keep_days": cfg.state.keep_days.unwrap_or(30), "max_mb": cfg.state.max_mb},
        "user_key": {"path": key, "present": key.exists()},
        "state_dir": {"path": state, "bytes": dir_size(&state)},
        "ledger": {"path": ledger, "bytes": ledger_bytes},
        "snapshots": {"path": snaps, "bytes": dir_size(&snaps), "journal_entries": by_state},
        "runs": {"path": state.join("runs"), "count": runs.len(), "kept": kept, "bytes": runs.iter().map(|r| r.bytes).sum::<u64>()},
        "trash": {"path": state.join(retie_dispatch::overlay::TRASH), "bytes": dir_size(&state.join(retie_dispatch::overlay::TRASH))},
        "spare": {"path": state.join(retie_dispatch::overlay::SPARE), "bytes": dir_size(&state.join(retie_dispatch::overlay::SPARE))},
    });
    if args.json {
        println!("{v}");
        return Ok(0);
    }
    let show = |p: &serde_json::Value| crate::ui::visible(p.as_str().unwrap_or("?"));
    let size = |b: &serde_json::Value| crate::ui::human_size(b.as_u64().unwrap_or(0));
    println!("config     {}", show(&v["config"]["path"]));
    println!(
        "user key   {} ({})",
        show(&v["user_key"]["path"]),
        if key.exists() {
            "present"
        } else {
            "not created yet"
        }
    );
    println!(
        "state      {}  {}",
        show(&v["state_dir"]["path"]),
        size(&v["state_dir"]["bytes"])
    );
    println!(
        "ledger     {}  {}",
        show(&v["ledger"]["path"]),
        size(&v["ledger"]["bytes"])
    );
    println!(
        "snapshots  {}  {}, journal entries {}",
        show(&v["snapshots"]["path"]),
        size(&v["snapshots"]["bytes"]),
        v["snapshots"]["journal_entries"]
    );
    println!(
        "runs       {}  {} run(s), {} kept, {}",
        show(&v["runs"]["path"]),
        v["runs"]["count"],
        kept,
        size(&v["runs"]["bytes"])
    );
    println!(
        "trash      {}  {} (finished runs' directories, removed by the next run or gc)",
        show(&v["trash"]["path"]),
        size(&v["trash"]["bytes"])
    );
    println!(
        "spare      {}  {} (directories of runs that changed nothing, reused by the next run; gc removes them)",
        show(&v["spare"]["path"]),
        size(&v["spare"]["bytes"])
    );
    println!(
        "retention  keep {} days{} (retie gc; [state] keep_days / max_mb in the config)",
        v["config"]["keep_days"],
        cfg.state
            .max_mb
            .map(|m| format!(", at most {m} MB"))
            .unwrap_or_default()
    );
    Ok(0)
}
