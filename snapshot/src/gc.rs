//! Bounded state: expire old journal entries and remove the blobs nothing
//! needs any more.
//!
//! A blob is needed while any entry that names it is pending (recovery
//! rolls it back from its pre-images) or complete (it can be undone). An
//! entry older than the cut-off is marked [`EntryState::Expired`] first:
//! from then on `undo` refuses it, saying why, instead of finding its
//! pre-images gone. Nothing is removed for an entry that can still be
//! undone.

use std::collections::HashSet;

use crate::error::Result;
use crate::journal::{EntryState, Journal};
use crate::store::Store;
use crate::Hash;

/// What to collect.
#[derive(Debug, Clone, Default)]
pub struct GcOptions {
    /// Complete entries created before this (ms since the epoch) expire.
    pub expire_before_ms: Option<u64>,
    /// Report only; change nothing.
    pub dry_run: bool,
}

/// What was (or, with `dry_run`, would be) collected.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GcReport {
    /// Entries expired now.
    pub expired: Vec<String>,
    /// Entries still undoable (complete) or pending.
    pub live_entries: usize,
    /// Blobs some live entry needs.
    pub blobs_kept: usize,
    /// Their bytes.
    pub bytes_kept: u64,
    /// Blobs nothing needs (removed unless `dry_run`).
    pub blobs_removed: usize,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Small pre-images live entries carry themselves (ADR 0408), kept.
    pub carried_kept: usize,
    /// Their bytes.
    pub carried_bytes_kept: u64,
    /// Pre-images carried by entries expired now or rolled back, dropped.
    pub carried_removed: usize,
}

/// Collect under the journal lock.
pub fn gc(store: &Store, journal: &Journal, opts: &GcOptions) -> Result<GcReport> {
    let _lock = journal.lock()?;
    let mut report = GcReport::default();
    let mut live: HashSet<Hash> = HashSet::new();
    for mut e in journal.entries()? {
        let old = opts
            .expire_before_ms
            .is_some_and(|cut| e.created_unix_ms < cut);
        // An entry that expires now, or one rolled back (never undone):
        // the pre-images it carries go (an expiring entry's blobs too).
        let expire = e.state == EntryState::Complete && old;
        if expire || e.state == EntryState::RolledBack {
            let carried = e
                .steps
                .iter()
                .filter(|s| s.before_content.is_some())
                .count();
            report.carried_removed += carried;
            if expire {
                report.expired.push(e.id.clone());
                e.state = EntryState::Expired;
                if !opts.dry_run {
                    journal.forget_undone(&e.id);
                }
            }
            // What it kept for its undo (ADR 0210) goes too.
            if !opts.dry_run {
                crate::kept::retire(store, &e.id);
            }
            if !opts.dry_run && (expire || carried > 0) {
                for s in &mut e.steps {
                    s.before_content = None;
                }
                journal.write(&e)?;
            }
            continue;
        }
        if e.state == EntryState::Expired && !opts.dry_run {
            crate::kept::retire(store, &e.id);
        }
        if matches!(e.state, EntryState::Complete | EntryState::Pending) {
            report.live_entries += 1;
            live.extend(e.manifest);
            for s in &e.steps {
                if let Some(c) = &s.before_content {
                    report.carried_kept += 1;
                    report.carried_bytes_kept += c.len() as u64;
                }
                for n in [&s.before, &s.after].into_iter().flatten() {
                    if let Some(h) = n.hash() {
                        live.insert(h);
                    }
                }
            }
        }
    }
    if !opts.dry_run {
        crate::kept::sweep_kept(store.state_dir());
    }
    let c = store.collect(&live, opts.dry_run)?;
    report.blobs_kept = c.kept;
    report.bytes_kept = c.bytes_kept;
    report.blobs_removed = c.removed;
    report.bytes_removed = c.bytes_removed;
    Ok(report)
}
