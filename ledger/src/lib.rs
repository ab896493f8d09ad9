//! The ledger: a hash-chained, signed, append-only record of what retie
//! was asked to do, what it planned (with the undo plan) before doing it,
//! and how it ended.
//!
//! Store: one SQLite database per user (WAL, `synchronous=FULL`), every
//! append in a `BEGIN IMMEDIATE` transaction that reads the previous hash
//! inside it, `BEFORE UPDATE/DELETE` triggers that abort rewrites. Each
//! entry's hash is SHA-256 over one canonical encoding (see
//! [`entry_hash`] and docs/adr/0401-ledger-crates-and-encoding.md); the
//! signature is ed25519 over that hash. Person entries are signed by the
//! user key; agent entries by a session key the user key delegated to.
//! Checkpoints (count + head, user-signed) go to a file next to the
//! database so that a truncated tail is detected.

pub mod keys;
pub mod model;
pub mod payload;
pub mod pg;
pub mod provider;
pub mod retest;
pub mod sqlite_memory;
pub mod verify;

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Domain of an entry hash.
pub const DOMAIN_ENTRY: &[u8] = b"retie/ledger/entry/v1\0";
/// Domain of a delegation digest.
pub const DOMAIN_DELEGATION: &[u8] = b"retie/ledger/delegation/v1\0";
/// Domain of a checkpoint digest.
pub const DOMAIN_CHECKPOINT: &[u8] = b"retie/ledger/checkpoint/v1\0";
/// A checkpoint is written every this many entries (and after each session).
pub const CHECKPOINT_EVERY: u64 = 1000;

/// Entries between two folds of the WAL by a process that has a moment to
/// spare ([`Ledger::take_fold`], [`Fold::run`]): about every fourth
/// sandboxed command, well before SQLite's automatic checkpoint (64 pages)
/// would land inside a commit someone waits for.
pub const FOLD_EVERY: u64 = 24;

/// Everything that can go wrong in the ledger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// SQLite refused or failed.
    #[error("ledger database {}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// The PostgreSQL server refused, failed or could not be reached (the
    /// URL never carries a password: one there is refused).
    #[error("ledger database {url}: {why}")]
    Postgres { url: String, why: String },
    /// File I/O around the ledger (keys, checkpoints, directories).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A key file is missing, malformed or has the wrong mode.
    #[error("key file {}: {why}", path.display())]
    Key { path: PathBuf, why: String },
    /// There is no ledger where one was expected.
    #[error("no ledger at {}", .0.display())]
    Missing(PathBuf),
    /// Neither XDG_*_HOME nor HOME names a directory.
    #[error("neither {0} nor HOME is set: retie needs a place for its ledger and keys")]
    NoHome(&'static str),
    /// A session cannot be joined or used.
    #[error("session {session}: {why}")]
    Session { session: String, why: String },
    /// An action id, session id or stored record that does not make sense.
    #[error("{0}")]
    Invalid(String),
    /// A guarded append found the session had moved on (a pending approval
    /// already decided, or no longer the session's open one): nothing was
    /// written.
    #[error("session {session}: {why}")]
    Conflict { session: String, why: String },
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result with the ledger's error.
pub type Result<T> = std::result::Result<T, Error>;

/// Who wrote an entry.
#[allow(dead_code)] // Policy: for the agent's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    Person,
    Agent,
    Policy,
}

impl Actor {
    pub fn as_str(self) -> &'static str {
        match self {
            Actor::Person => "person",
            Actor::Agent => "agent",
            Actor::Policy => "policy",
        }
    }
}

/// Entry kinds: the vocabulary of the ledger, stored as their `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The genesis entry: the user key and the format.
    LedgerOpened,
    /// A session begins: objective, origin, policy digest, the delegation.
    SessionOpened,
    /// A session ends.
    SessionClosed,
    /// A key delegated to a sub-agent.
    Delegation,
    /// An action as proposed, with its frozen arguments' digest.
    Proposed,
    /// What the gate decided, and who (policy or person).
    Decision,
    /// About to act: the action with its undo plan, before any effect.
    Intent,
    /// The exact changes an action is about to make to the workspace, with
    /// their undo plan: written right before they are made.
    Changes,
    /// How the action ended.
    Outcome,
    /// An undo of an earlier action.
    Undo,
    /// An action refused: never executed.
    Refusal,
    /// Anything else worth keeping.
    Note,
    /// One message of the conversation (user, assistant with its tool
    /// calls and usage, tool result as sent to the model).
    Message,
    /// An action the gate asks about, waiting for a person: durable before
    /// any prompt is shown. Its decision names it.
    Pending,
    /// "Always, for this session, for this exact prefix": a person's grant.
    Grant,
    /// A grant taken back.
    Revoke,
    /// The session stopped with an approval pending (nobody could answer).
    Suspended,
    /// A process took the session up again (`retie run --resume`).
    Resumed,
    /// A model turn's attempt that failed, its cause and whether it was
    /// retried ([`provider::ProviderAttempt`]).
    ProviderAttempt,
    /// Another machine's user key admitted to a shared ledger by its
    /// owner (signed by the genesis key; ADR 0460).
    Member,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 20] = [
        Kind::LedgerOpened,
        Kind::SessionOpened,
        Kind::SessionClosed,
        Kind::Delegation,
        Kind::Proposed,
        Kind::Decision,
        Kind::Intent,
        Kind::Changes,
        Kind::Outcome,
        Kind::Undo,
        Kind::Refusal,
        Kind::Note,
        Kind::Message,
        Kind::Pending,
        Kind::Grant,
        Kind::Revoke,
        Kind::Suspended,
        Kind::Resumed,
        Kind::ProviderAttempt,
        Kind::Member,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::LedgerOpened => "ledger_opened",
            Kind::SessionOpened => "session_opened",
            Kind::SessionClosed => "session_closed",
            Kind::Delegation => "delegation",
            Kind::Proposed => "action_proposed",
            Kind::Decision => "decision",
            Kind::Intent => "intent",
            Kind::Changes => "changes",
            Kind::Outcome => "outcome",
            Kind::Undo => "undo",
            Kind::Refusal => "refusal",
            Kind::Note => "note",
            Kind::Message => "message",
            Kind::Pending => "pending",
            Kind::Grant => "grant",
            Kind::Revoke => "revoke",
            Kind::Suspended => "suspended",
            Kind::Resumed => "resumed",
            Kind::ProviderAttempt => "provider_attempt",
            Kind::Member => "member",
        }
    }

    /// The stored name as bytes (rows keep their fields raw).
    pub fn as_bytes(self) -> &'static [u8] {
        self.as_str().as_bytes()
    }

    /// The kind a stored name stands for.
    pub fn parse(s: &[u8]) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str().as_bytes() == s)
    }
}

impl PartialEq<Kind> for String {
    fn eq(&self, k: &Kind) -> bool {
        self == k.as_str()
    }
}

impl PartialEq<Kind> for &str {
    fn eq(&self, k: &Kind) -> bool {
        *self == k.as_str()
    }
}

/// One stored entry, as read back (fields raw, so a tampered row can still
/// be read and judged).
#[derive(Debug, Clone)]
pub struct Row {
    pub seq: i64,
    pub time_ms: i64,
    pub session: Vec<u8>,
    pub actor: Vec<u8>,
    pub kind: Vec<u8>,
    pub payload: Vec<u8>,
    pub prev: Vec<u8>,
    pub hash: Vec<u8>,
    pub signer: Vec<u8>,
    pub sig: Vec<u8>,
}

impl Row {
    pub fn session_str(&self) -> String {
        String::from_utf8_lossy(&self.session).into_owned()
    }
    pub fn kind_str(&self) -> String {
        String::from_utf8_lossy(&self.kind).into_owned()
    }
    pub fn actor_str(&self) -> String {
        String::from_utf8_lossy(&self.actor).into_owned()
    }
    pub fn payload_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap_or(serde_json::Value::Null)
    }
    /// The hash of this row's contents, recomputed.
    pub fn recompute(&self) -> [u8; 32] {
        entry_hash(
            self.seq,
            self.time_ms,
            &self.session,
            &self.actor,
            &self.kind,
            &self.payload,
            &self.prev,
            &self.signer,
        )
    }
}

/// The canonical encoding, hashed: the domain, then seq and time as 8-byte
/// big-endian integers, then session, actor, kind, payload, previous hash
/// and signer key, each as an 8-byte big-endian length and its bytes.
#[allow(clippy::too_many_arguments)]
pub fn entry_hash(
    seq: i64,
    time_ms: i64,
    session: &[u8],
    actor: &[u8],
    kind: &[u8],
    payload: &[u8],
    prev: &[u8],
    signer: &[u8],
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(DOMAIN_ENTRY);
    h.update(seq.to_be_bytes());
    h.update(time_ms.to_be_bytes());
    for f in [session, actor, kind, payload, prev, signer] {
        h.update((f.len() as u64).to_be_bytes());
        h.update(f);
    }
    h.finalize().into()
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The ledger's path: `--ledger`, else `RETIE_LEDGER`, else
/// `STATE/ledger.db`.
pub fn resolve_path(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("RETIE_LEDGER").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let base = xdg_dir("XDG_STATE_HOME", ".local/state")?;
    Ok(base.join("retie").join("ledger.db"))
}

/// The XDG base directory rule, the one copy of it (the CLI's state,
/// config and data directories use it too): `$VAR` if it is an absolute
/// path, else `$HOME/fallback`; `None` when neither is usable.
pub fn xdg_base(var: &str, fallback: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(fallback))
        })
}

/// [`xdg_base`], or the error that names the variable.
pub(crate) fn xdg_dir(var: &'static str, fallback: &str) -> Result<PathBuf> {
    xdg_base(var, fallback).ok_or(Error::NoHome(var))
}

pub(crate) fn mkdir_private(d: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(d)
        .map_err(|e| Error::io(format!("creating {}", d.display()), e))
}

/// Whether there is a ledger at `path`: an SQLite file that exists; a
/// PostgreSQL URL always counts (opening it says whether the server is
/// there and holds one).
pub fn exists(path: &Path) -> bool {
    pg::is_url(path) || path.exists()
}

/// The checkpoint file of a ledger: next to an SQLite one; for a
/// PostgreSQL one, in the directory the person names (see [`sidecar`]).
pub fn checkpoint_path(ledger: &Path) -> PathBuf {
    sidecar(ledger, ".checkpoints")
}

/// A file that belongs to a ledger but not in its database (checkpoints,
/// session keys): `LEDGER{suffix}` next to an SQLite ledger. A PostgreSQL
/// ledger has no directory of its own, and the database is exactly what
/// these files must not live in: they go to `RETIE_CHECKPOINT_DIR` (an
/// absolute path, local or a shared mount the person names), else
/// `STATE/retie/shared/`, as `pg-ID{suffix}` with ID a digest of the URL
/// (no password is ever in it).
pub fn sidecar(ledger: &Path, suffix: &str) -> PathBuf {
    if !pg::is_url(ledger) {
        let mut s = ledger.as_os_str().to_owned();
        s.push(suffix);
        return PathBuf::from(s);
    }
    let base = std::env::var_os("RETIE_CHECKPOINT_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            xdg_base("XDG_STATE_HOME", ".local/state").map(|b| b.join("retie").join("shared"))
        })
        .unwrap_or_else(|| PathBuf::from("/nonexistent/set-HOME-or-RETIE_CHECKPOINT_DIR"));
    let id = ledger
        .to_str()
        .and_then(|u| pg::PgUrl::parse(u).ok())
        .map(|u| u.id())
        .unwrap_or_else(|| "unparsable-url".into());
    base.join(format!("pg-{id}{suffix}"))
}

/// The copy of the checkpoints the user asked for in
/// `RETIE_CHECKPOINT_COPY` (an absolute path), if any.
pub fn checkpoint_copy_path() -> Option<PathBuf> {
    std::env::var_os("RETIE_CHECKPOINT_COPY")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// A checkpoint line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub count: u64,
    pub head: String,
    pub time_ms: i64,
    pub key: String,
    pub sig: String,
}

/// What a checkpoint signature covers.
pub fn checkpoint_digest(count: u64, head: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(DOMAIN_CHECKPOINT);
    h.update(count.to_be_bytes());
    h.update((head.len() as u64).to_be_bytes());
    h.update(head);
    h.finalize().into()
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY,
    time_ms INTEGER NOT NULL,
    session TEXT NOT NULL,
    actor TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    prev BLOB NOT NULL,
    hash BLOB NOT NULL,
    signer BLOB NOT NULL,
    sig BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_session ON entries(session);
CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
";

/// Create the database at `path` with its schema, whole or not at all: it
/// is built under a random temporary name (mode 0600, rollback journal,
/// synced), then linked into place. A writer killed before the link leaves
/// no ledger (only a stray temporary); one that loses a race to another
/// first writer drops its own. Before this, a writer killed between
/// creating the empty file and its schema left a file `verify` had to call
/// tampered ("no such table: entries").
fn create_initialized(path: &Path) -> Result<()> {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).map_err(|e| {
        Error::io(
            "drawing a temporary name",
            std::io::Error::other(e.to_string()),
        )
    })?;
    let suffix: String = r.iter().map(|b| format!("{b:02x}")).collect();
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".new-{suffix}"));
    let tmp = PathBuf::from(tmp_name);
    let made = (|| -> Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
        let sql = |source| Error::Sqlite {
            path: tmp.clone(),
            source,
        };
        let conn =
            Connection::open_with_flags(&tmp, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(sql)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql)?;
        conn.execute_batch(&format!("BEGIN;{SCHEMA}COMMIT;"))
            .map_err(sql)?;
        conn.close().map_err(|(_, e)| sql(e))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(format!("syncing {}", tmp.display()), e))?;
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(()),
            // Another first writer linked its own: use that one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(Error::io(format!("creating {}", path.display()), e)),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    made?;
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(f) = std::fs::File::open(d) {
            let _ = f.sync_all();
        }
    }
    Ok(())
}

/// Fold the WAL of the ledger at `path` into its database (SQLite's
/// PASSIVE checkpoint: the WAL synced, its pages copied, the database
/// synced), on a connection of its own, so any thread may (see
/// [`Ledger::take_fold`]). The WAL stays short: the next process's open,
/// which reads all of it to rebuild its index, reads less, and SQLite's
/// automatic checkpoint seldom lands in a commit someone waits for.
/// Durability is unchanged: a checkpoint only moves synced pages.
/// Whether it folded every frame (false when a reader or writer held some
/// back: SQLite's `busy`, or fewer frames moved than the WAL holds).
/// Run through [`Fold::run`], which decides when one is due.
fn fold_wal(path: &Path) -> Result<bool> {
    let sql = |source| Error::Sqlite {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql)?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .map_err(sql)?;
    conn.busy_timeout(std::time::Duration::from_secs(1))
        .map_err(sql)?;
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
        let (busy, log, moved): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        Ok(busy == 0 && moved == log)
    })
    .map_err(sql)
}

/// A fold of a ledger's WAL that a process may run ([`Ledger::take_fold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fold {
    path: PathBuf,
    /// The last entry the process appended.
    head: u64,
}

impl Fold {
    /// Fold the WAL ([`fold_wal`]) when [`FOLD_EVERY`] or more entries came
    /// after the last fold any process recorded (the file
    /// `LEDGER.folded`, the head it folded at; a missing or unreadable one,
    /// or one ahead of this head, counts as no fold), and record this one.
    /// Whether it ran one.
    ///
    /// The record is what makes the fold happen: a process that only
    /// looked at its own commits missed every multiple of FOLD_EVERY that
    /// fell in a commit after it had asked, and with a fixed number of
    /// entries per `sandbox exec` that was always the same commit. No
    /// fold then ran at all; the WAL grew to SQLite's automatic checkpoint
    /// (64 pages), which ran inside a commit someone waited for, and every
    /// process's open read up to 64 pages to rebuild the WAL's index.
    /// The record needs no sync: losing it costs one early fold. A fold
    /// that could not move every frame (a reader held some back) is not
    /// recorded. The record is opened without following a symlink and
    /// without blocking, and only a regular file is read or written: one
    /// planted in a shared ledger directory (a FIFO, a link to another
    /// file) can neither hang a run nor have retie write through it.
    pub fn run(&self) -> Result<bool> {
        let marker = marker_path(&self.path);
        let last = read_marker(&marker);
        if last.is_some_and(|l| l <= self.head && self.head < l.saturating_add(FOLD_EVERY)) {
            return Ok(false);
        }
        if fold_wal(&self.path)? {
            write_marker(&marker, self.head)
                .map_err(|e| Error::io(format!("writing {}", marker.display()), e))?;
        }
        Ok(true)
    }
}

/// Open the fold record: no symlink followed, never blocking, a regular
/// file or nothing.
fn open_marker(marker: &Path, write: bool) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .create(write)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(marker)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// The head the last recorded fold was at, if the record reads as one.
fn read_marker(marker: &Path) -> Option<u64> {
    let mut text = String::new();
    let mut f = open_marker(marker, false).ok()?;
    std::io::Read::read_to_string(&mut std::io::Read::take(&mut f, 32), &mut text).ok()?;
    text.trim().parse().ok()
}

fn write_marker(marker: &Path, head: u64) -> std::io::Result<()> {
    let mut f = open_marker(marker, true)?;
    f.set_len(0)?;
    std::io::Write::write_all(&mut f, head.to_string().as_bytes())
}

/// Where the head of the last fold of the ledger at `path` is recorded.
fn marker_path(path: &Path) -> PathBuf {
    let mut m = path.as_os_str().to_owned();
    m.push(".folded");
    PathBuf::from(m)
}

/// Sync the WAL of the ledger at `path` (all its committed entries reach
/// the disk). No WAL, nothing to sync: the database file holds everything
/// and SQLite synced it when it moved the pages there.
pub(crate) fn sync_wal(path: &Path) -> Result<()> {
    if pg::is_url(path) {
        // Every PostgreSQL commit of a synced append is durable at once.
        return Ok(());
    }
    let mut w = path.as_os_str().to_owned();
    w.push("-wal");
    let w = PathBuf::from(w);
    match std::fs::File::open(&w) {
        Ok(f) => f
            .sync_data()
            .map_err(|e| Error::io(format!("syncing {}", w.display()), e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("opening {}", w.display()), e)),
    }
}

/// Where an open ledger's entries are stored. Only this differs between
/// the backends: encoding, chain, signatures, guard, checkpoints and the
/// verifier are one copy (ADR 0460).
enum Store {
    Sqlite(Connection),
    Postgres {
        client: Box<std::cell::RefCell<pg::PgClient>>,
        url: Box<pg::PgUrl>,
    },
}

/// An append's transaction on either store: what the one append path
/// ([`Ledger::append_inner`]) and its [`Guard`] need from storage.
pub(crate) trait AppendTx {
    /// The newest entry's (seq, hash), read inside the transaction after
    /// the store's write lock is held.
    fn last(&mut self) -> Result<Option<(i64, Vec<u8>)>>;
    /// The newest seq of `kind` in `session`.
    fn newest_of(&mut self, session: &str, kind: &str) -> Result<Option<i64>>;
    /// The first seq of `kind` in `session` after `after`.
    fn first_after(&mut self, session: &str, after: i64, kind: &str) -> Result<Option<i64>>;
    fn insert(&mut self, row: &Row) -> Result<()>;
    fn commit(self: Box<Self>) -> Result<()>;
}

struct SqliteTx<'a> {
    tx: rusqlite::Transaction<'a>,
    path: &'a Path,
}

impl SqliteTx<'_> {
    fn err(&self, source: rusqlite::Error) -> Error {
        Error::Sqlite {
            path: self.path.to_path_buf(),
            source,
        }
    }
}

impl AppendTx for SqliteTx<'_> {
    fn last(&mut self) -> Result<Option<(i64, Vec<u8>)>> {
        self.tx
            .prepare_cached("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1")
            .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
            .map_err(|e| self.err(e))
    }

    fn newest_of(&mut self, session: &str, kind: &str) -> Result<Option<i64>> {
        self.tx
            .query_row(
                "SELECT max(seq) FROM entries WHERE session = ?1 AND kind = ?2",
                params![session, kind],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }

    fn first_after(&mut self, session: &str, after: i64, kind: &str) -> Result<Option<i64>> {
        self.tx
            .query_row(
                "SELECT min(seq) FROM entries WHERE session = ?1 AND seq > ?2 AND kind = ?3",
                params![session, after, kind],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }

    fn insert(&mut self, r: &Row) -> Result<()> {
        // Session, actor, kind and payload are stored as TEXT (they are
        // UTF-8: the writer made them from strings).
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        self.tx
            .prepare_cached(
                "INSERT INTO entries (seq, time_ms, session, actor, kind, payload, prev, hash, signer, sig)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    r.seq,
                    r.time_ms,
                    text(&r.session),
                    text(&r.actor),
                    text(&r.kind),
                    text(&r.payload),
                    r.prev,
                    r.hash,
                    r.signer,
                    r.sig
                ])
            })
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn commit(self: Box<Self>) -> Result<()> {
        let path = self.path;
        self.tx.commit().map_err(|source| Error::Sqlite {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// An open ledger.
pub struct Ledger {
    store: Store,
    path: PathBuf,
    /// The user key, when this process holds it (checkpoints every
    /// [`CHECKPOINT_EVERY`] entries).
    user: Option<SigningKey>,
    /// The newest entry this process knows is on disk: the last entry of
    /// its newest synced commit (each one syncs the whole WAL, so every
    /// entry before it too). A checkpoint names this head, never one a
    /// power cut could still take back.
    synced: Option<(u64, Vec<u8>)>,
    /// The newest checkpoint this process wrote (one naming the same
    /// head again is not written twice).
    written: Option<Checkpoint>,
    /// The last entry this process appended, until [`Ledger::take_fold`]
    /// hands it on.
    appended: Option<u64>,
}

/// Whether an append must be on disk before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Synced at commit (`synchronous=FULL`: one WAL sync).
    Now,
    /// On disk with the next synced commit, or the WAL's next checkpoint,
    /// whichever comes first; until then a power cut may take it back
    /// (with everything after it, never anything before). For what no
    /// later step depends on: the outcome of an action that changed
    /// nothing retie could undo.
    Deferred,
}

/// What an append produced.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub seq: i64,
}

/// An entry to append with [`Ledger::append_batch`].
pub struct NewEntry {
    pub session: String,
    pub actor: Actor,
    pub kind: Kind,
    pub payload: serde_json::Value,
    pub key: SigningKey,
}

impl Ledger {
    /// Open (creating if `create`) the ledger at `path`. A new ledger's
    /// first entry names the user key that signs it.
    pub fn open(path: &Path, create: bool, user: Option<&SigningKey>) -> Result<Ledger> {
        if pg::is_url(path) {
            return Ledger::open_postgres(path, create, user);
        }
        let sql = |source| Error::Sqlite {
            path: path.to_path_buf(),
            source,
        };
        // A zero-length file (left by a writer of an older retie killed
        // before its schema) gets the schema; any other existing ledger
        // already has it.
        let has_schema = path.metadata().is_ok_and(|m| m.len() > 0);
        if !path.exists() {
            if !create {
                return Err(Error::Missing(path.to_path_buf()));
            }
            if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                mkdir_private(d)?;
            }
            create_initialized(path)?;
        }
        // SQLite is built without its directory fsync at every process's
        // first commit (SQLITE_DISABLE_DIRSYNC, .cargo/config.toml): the
        // WAL file is kept between processes, so that fsync only matters
        // the once it is created, and then it is done here.
        let wal = {
            let mut w = path.as_os_str().to_owned();
            w.push("-wal");
            PathBuf::from(w)
        };
        let wal_was_there = wal.exists();
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(60))
            .map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql)?;
        if !wal_was_there && wal.exists() {
            // SQLite just created the WAL: its name must be durable before
            // a commit in it is called durable.
            if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(d)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| Error::io(format!("syncing the directory {}", d.display()), e))?;
            }
        }
        // No checkpoint when the connection closes: the WAL stays (so the
        // next process's first commit appends to it instead of creating
        // it, which costs a directory and a header fsync), and the pages
        // move into the database by SQLite's automatic checkpoint. Each
        // commit is still one fsync of the WAL, which is what makes it
        // durable (synchronous=FULL).
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(sql)?;
        // The first process to open the database after the others closed
        // rebuilds the WAL's index by reading the whole WAL: keep it short
        // (a checkpoint every 64 pages, 256 KiB) so that costs little at
        // every start.
        conn.pragma_update(None, "wal_autocheckpoint", 64)
            .map_err(sql)?;
        let mut l = Ledger {
            store: Store::Sqlite(conn),
            path: path.to_path_buf(),
            user: user.cloned(),
            synced: None,
            written: None,
            appended: None,
        };
        if create {
            // A ledger is created whole, schema included (see
            // `create_initialized`); running the schema again at every
            // open cost a fifth of the open. Its genesis entry is written
            // by the first opener (a creator killed before that leaves an
            // empty ledger): a read decides whether it is due, so an open
            // takes no write lock.
            if !has_schema {
                l.sqlite()?.execute_batch(SCHEMA).map_err(sql)?;
            }
            if let Some(user) = user {
                let empty = l
                    .sqlite()?
                    .query_row("SELECT NOT EXISTS (SELECT 1 FROM entries)", [], |r| {
                        r.get::<_, bool>(0)
                    })
                    .map_err(sql)?;
                if empty {
                    l.genesis(user)?;
                }
            }
        }
        Ok(l)
    }

    /// Open the PostgreSQL ledger `url` names (see [`pg`]): connect,
    /// create its tables if they are not there, and write its genesis
    /// entry when `create` and it has none (inside the chain head's lock:
    /// two first writers write one genesis).
    fn open_postgres(url: &Path, create: bool, user: Option<&SigningKey>) -> Result<Ledger> {
        let text = url
            .to_str()
            .ok_or_else(|| Error::Invalid("the ledger URL is not UTF-8".into()))?;
        let parsed = pg::PgUrl::parse(text)?;
        let client = parsed.connect()?;
        let mut l = Ledger {
            store: Store::Postgres {
                client: Box::new(std::cell::RefCell::new(client)),
                url: Box::new(parsed),
            },
            path: url.to_path_buf(),
            user: user.cloned(),
            synced: None,
            written: None,
            appended: None,
        };
        let empty = l.head()?.0 == 0;
        if empty {
            match (create, user) {
                (true, Some(user)) => l.genesis(user)?,
                (true, None) => {}
                (false, _) => return Err(Error::Missing(url.to_path_buf())),
            }
        }
        Ok(l)
    }

    /// The SQLite connection (an SQLite-only step).
    fn sqlite(&self) -> Result<&Connection> {
        match &self.store {
            Store::Sqlite(c) => Ok(c),
            Store::Postgres { url, .. } => Err(Error::Invalid(format!(
                "{}: this step exists only for an SQLite ledger",
                url.shown
            ))),
        }
    }

    /// Whether this ledger lives on a PostgreSQL server.
    pub fn is_postgres(&self) -> bool {
        matches!(self.store, Store::Postgres { .. })
    }

    /// Leave the connection for the process's exit to close: for a process
    /// about to exit with everything committed (SQLite's close would only
    /// free memory, unmap the WAL index and drop locks the exit drops
    /// anyway; the WAL is never checkpointed at close, see `open`). The
    /// copy of the user key drops first, zeroed.
    pub fn leave_to_exit(mut self) {
        drop(self.user.take());
        std::mem::forget(self);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The user key this ledger was started with (its genesis entry).
    pub fn genesis_user_key(&self) -> Result<Option<String>> {
        let kind = Kind::LedgerOpened.as_str();
        let payload: Option<Vec<u8>> = match &self.store {
            Store::Sqlite(c) => c
                .query_row(
                    "SELECT payload FROM entries WHERE kind = ?1 ORDER BY seq LIMIT 1",
                    [kind],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map(|p| p.map(String::into_bytes))
                .map_err(|source| Error::Sqlite {
                    path: self.path.clone(),
                    source,
                })?,
            Store::Postgres { client, url } => pg::of_kind(&mut client.borrow_mut(), kind)
                .map_err(|e| url.err("reading the genesis entry", &e))?
                .into_iter()
                .next()
                .map(|(p, _)| p),
        };
        Ok(payload
            .and_then(|p| serde_json::from_slice::<serde_json::Value>(&p).ok())
            .and_then(|v| v.get("user_key").and_then(|k| k.as_str()).map(String::from)))
    }

    /// Refuse to write under a user key other than the one the ledger was
    /// started with: a replaced key file (planted by a sandboxed command
    /// that could reach it, or swapped by hand) is reported at the next
    /// run, before anything runs, not only by `retie verify`.
    pub fn check_user_key(&self, user: &SigningKey) -> Result<()> {
        let mine = hex(user.verifying_key().as_bytes());
        let genesis = self.genesis_user_key()?;
        if genesis.as_ref().is_some_and(|k| *k != mine) && self.members()?.contains(&mine) {
            // Another machine's key, admitted by the ledger's owner.
            return Ok(());
        }
        match genesis {
            Some(k) if k != mine => Err(Error::Key {
                path: keys::user_key_path()?,
                why: format!(
                    "this is not the key the ledger {} was started with (it was {}…, this one is {}…), nor one its owner admitted: the key file was replaced, or this machine was never admitted to a shared ledger. Nothing was run. Restore the original key, have the owner run `retie ledger admit KEY` for a shared ledger, or start a new ledger elsewhere (--ledger or RETIE_LEDGER); `retie verify` checks the old one",
                    self.path.display(),
                    &k[..k.len().min(16)],
                    &mine[..16]
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Turn off fsync for this connection: for building large test and
    /// benchmark ledgers only, never for a real one.
    pub fn unsafe_fast_for_tests(&mut self) -> Result<()> {
        match &mut self.store {
            Store::Sqlite(c) => c
                .pragma_update(None, "synchronous", "OFF")
                .map_err(|source| Error::Sqlite {
                    path: self.path.clone(),
                    source,
                }),
            Store::Postgres { client, url } => client
                .get_mut()
                .batch_execute("SET synchronous_commit = off")
                .map_err(|e| url.err("turning off synchronous commit", &e)),
        }
    }

    /// The keys (hex) the ledger's owner admitted as other machines' user
    /// keys of a shared ledger: `member` entries signed by the genesis key.
    /// A `member` entry signed by any other key admits nothing (verify
    /// reports it).
    pub fn members(&self) -> Result<Vec<String>> {
        let Some(owner) = self.genesis_user_key()? else {
            return Ok(Vec::new());
        };
        let kind = Kind::Member.as_str();
        let rows: Vec<(Vec<u8>, Vec<u8>)> = match &self.store {
            Store::Sqlite(c) => c
                .prepare("SELECT payload, signer FROM entries WHERE kind = ?1 ORDER BY seq")
                .and_then(|mut st| {
                    st.query_map([kind], |r| {
                        Ok((r.get::<_, String>(0)?.into_bytes(), r.get::<_, Vec<u8>>(1)?))
                    })
                    .and_then(|it| it.collect())
                })
                .map_err(|source| Error::Sqlite {
                    path: self.path.clone(),
                    source,
                })?,
            Store::Postgres { client, url } => pg::of_kind(&mut client.borrow_mut(), kind)
                .map_err(|e| url.err("reading the admitted keys", &e))?,
        };
        Ok(rows
            .into_iter()
            .filter(|(_, signer)| hex(signer) == owner)
            .filter_map(|(p, _)| {
                serde_json::from_slice::<serde_json::Value>(&p)
                    .ok()
                    .and_then(|v| payload::parse::<payload::Member>(&v).ok())
                    .map(|m| m.key.to_ascii_lowercase())
            })
            .collect())
    }

    /// Admit another machine's user key to this (shared) ledger: a
    /// `member` entry signed by the owner's key (the genesis key; any
    /// other is refused here and by verify). From then on that key may
    /// sign person entries and checkpoints of this ledger.
    pub fn admit(&mut self, owner: &SigningKey, key: &str, by: &str) -> Result<Appended> {
        let Some(k) = keys::parse_key(key) else {
            return Err(Error::Invalid(format!(
                "{key:?} is not a public key (64 hex digits: `retie key show` on the other machine prints it)"
            )));
        };
        match self.genesis_user_key()? {
            Some(g) if g == hex(owner.verifying_key().as_bytes()) => {}
            _ => return Err(Error::Invalid(
                "only the ledger's owner (the key that opened it) can admit another machine's key"
                    .into(),
            )),
        }
        let payload = payload::to_value(&payload::Member {
            key: hex(k.as_bytes()),
            by: by.to_string(),
        });
        self.append("", Actor::Person, Kind::Member, &payload, owner)
    }

    fn genesis(&mut self, user: &SigningKey) -> Result<()> {
        let payload = serde_json::json!({
            "user_key": hex(user.verifying_key().as_bytes()),
            "format": 1,
        });
        self.append_if(
            |last| last == 0,
            "",
            Actor::Person,
            Kind::LedgerOpened,
            &payload,
            user,
        )?;
        Ok(())
    }

    /// Append several entries in one durable transaction: all of them or
    /// none. `build` gets the sequence number the first entry will have,
    /// so a later entry can name an earlier one.
    pub fn append_batch(
        &mut self,
        build: impl FnOnce(i64) -> Vec<NewEntry>,
    ) -> Result<Vec<Appended>> {
        self.append_batch_guarded(None, build)
    }

    /// [`append_batch`](Self::append_batch) with its durability said: a
    /// deferred batch costs no sync (see [`Durability::Deferred`]).
    pub fn append_batch_with(
        &mut self,
        durability: Durability,
        build: impl FnOnce(i64) -> Vec<NewEntry>,
    ) -> Result<Vec<Appended>> {
        if durability == Durability::Now {
            return self.append_batch_guarded(None, build);
        }
        let path = self.path.clone();
        let out = match &self.store {
            Store::Sqlite(c) => {
                let sql = |source| Error::Sqlite {
                    path: path.clone(),
                    source,
                };
                // WAL mode, NORMAL: the commit is not synced (checkpoints
                // still are); the next FULL commit's WAL sync covers it.
                c.pragma_update(None, "synchronous", "NORMAL")
                    .map_err(sql)?;
                let r = self.append_inner(None, None, build, false);
                let back = self
                    .sqlite()?
                    .pragma_update(None, "synchronous", "FULL")
                    .map_err(sql);
                let out = r?;
                back?;
                out
            }
            // PostgreSQL: `synchronous_commit = off` for this transaction
            // (the server flushes it within moments; a crash of the server
            // may take it back, with everything after it).
            Store::Postgres { .. } => self.append_inner(None, None, build, false)?,
        };
        Ok(out.unwrap_or_default())
    }

    /// Make every committed entry durable (a sync of the WAL), as a
    /// synced commit would.
    fn sync(&mut self) -> Result<()> {
        sync_wal(&self.path)?;
        self.synced = Some(self.head()?);
        Ok(())
    }

    /// [`append_batch`](Self::append_batch), but only while `guard` holds,
    /// checked inside the same transaction (the store's write lock held):
    /// two processes deciding one pending approval cannot both succeed. A
    /// guard that fails writes nothing and returns [`Error::Conflict`].
    pub fn append_batch_guarded(
        &mut self,
        guard: Option<&Guard>,
        build: impl FnOnce(i64) -> Vec<NewEntry>,
    ) -> Result<Vec<Appended>> {
        Ok(self
            .append_inner(guard, None, build, true)?
            .unwrap_or_default())
    }

    /// Begin an append's transaction with the store's write lock held:
    /// SQLite's `BEGIN IMMEDIATE`, PostgreSQL's row lock on the chain
    /// head. Every append reads the newest entry only after this.
    fn begin(&mut self, synced: bool) -> Result<Box<dyn AppendTx + '_>> {
        match &mut self.store {
            Store::Sqlite(c) => {
                let tx = c
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(|source| Error::Sqlite {
                        path: self.path.clone(),
                        source,
                    })?;
                Ok(Box::new(SqliteTx {
                    tx,
                    path: &self.path,
                }))
            }
            Store::Postgres { client, url } => {
                Ok(Box::new(pg::PgTx::begin(client.get_mut(), url, !synced)?))
            }
        }
    }

    /// The one append path, for both stores: lock, read the head, check
    /// the guard and the condition (`None` when the condition said no:
    /// nothing written), chain, hash, sign, insert, commit.
    fn append_inner(
        &mut self,
        guard: Option<&Guard>,
        cond: Option<&dyn Fn(i64) -> bool>,
        build: impl FnOnce(i64) -> Vec<NewEntry>,
        synced: bool,
    ) -> Result<Option<Vec<Appended>>> {
        let mut tx = self.begin(synced)?;
        let last = tx.last()?;
        if let Some(g) = guard {
            g.check(tx.as_mut())?;
        }
        let (mut seq, mut prev) = last.unwrap_or((0, vec![0; 32]));
        if cond.is_some_and(|c| !c(seq)) {
            return Ok(None);
        }
        let mut out = Vec::new();
        let mut crossed = false;
        for e in build(seq + 1) {
            seq += 1;
            let time_ms = now_ms();
            let payload = e.payload.to_string();
            let signer = e.key.verifying_key().to_bytes();
            let hash = entry_hash(
                seq,
                time_ms,
                e.session.as_bytes(),
                e.actor.as_str().as_bytes(),
                e.kind.as_bytes(),
                payload.as_bytes(),
                &prev,
                &signer,
            );
            let sig = e.key.sign(&hash).to_bytes();
            tx.insert(&Row {
                seq,
                time_ms,
                session: e.session.into_bytes(),
                actor: e.actor.as_str().as_bytes().to_vec(),
                kind: e.kind.as_bytes().to_vec(),
                payload: payload.into_bytes(),
                prev,
                hash: hash.to_vec(),
                signer: signer.to_vec(),
                sig: sig.to_vec(),
            })?;
            crossed |= seq as u64 % CHECKPOINT_EVERY == 0;
            prev = hash.to_vec();
            out.push(Appended { seq });
        }
        tx.commit()?;
        if let Some(last) = out.last() {
            self.appended = Some(last.seq.max(0) as u64);
        }
        if synced {
            self.synced = Some((seq.max(0) as u64, prev.clone()));
        }
        if crossed {
            if let Some(u) = self.user.clone() {
                self.checkpoint(&u)?;
            }
        }
        Ok(Some(out))
    }

    /// Copy `rows` (another ledger's, verified by the caller) into this
    /// one, byte for byte (same seq, hashes and signatures: the chain and
    /// every checkpoint of the source stay valid), in one transaction
    /// under the store's write lock, and only into a ledger that holds no
    /// entry: `retie ledger copy`. Returns how many were copied.
    pub fn import_rows(&mut self, rows: &[Row]) -> Result<usize> {
        let shown = self.path.display().to_string();
        let mut tx = self.begin(true)?;
        if let Some((seq, _)) = tx.last()? {
            return Err(Error::Invalid(format!(
                "the target ledger {shown} already holds {seq} entries: a copy goes only into an empty one"
            )));
        }
        for r in rows {
            tx.insert(r)?;
        }
        tx.commit()?;
        self.synced = None;
        Ok(rows.len())
    }

    /// Append one entry, durably. The previous hash is read inside the
    /// same locked transaction, so concurrent writers serialize.
    pub fn append(
        &mut self,
        session: &str,
        actor: Actor,
        kind: Kind,
        payload: &serde_json::Value,
        key: &SigningKey,
    ) -> Result<Appended> {
        self.append_if(|_| true, session, actor, kind, payload, key)?
            .ok_or_else(|| Error::Invalid("append skipped".into()))
    }

    fn append_if(
        &mut self,
        cond: impl Fn(i64) -> bool,
        session: &str,
        actor: Actor,
        kind: Kind,
        payload: &serde_json::Value,
        key: &SigningKey,
    ) -> Result<Option<Appended>> {
        let entry = NewEntry {
            session: session.to_string(),
            actor,
            kind,
            payload: payload.clone(),
            key: key.clone(),
        };
        // A single append leaves the fold to batch writers, as it always
        // did (`take_fold` hands on what a batch appended).
        let before = self.appended;
        let out = self.append_inner(None, Some(&cond), |_| vec![entry], true);
        self.appended = before;
        Ok(out?.and_then(|v| v.first().copied()))
    }

    /// Every row in seq order.
    pub fn rows(&self) -> Result<Vec<Row>> {
        match &self.store {
            Store::Sqlite(c) => read_rows(c).map_err(|e| self.sql(e)),
            Store::Postgres { client, url } => pg::read_rows(&mut client.borrow_mut())
                .map_err(|e| url.err("reading the entries", &e)),
        }
    }

    fn sql(&self, source: rusqlite::Error) -> Error {
        Error::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// The session ids that start with `prefix` (at most `limit`, sorted):
    /// how `retie replay 3804` finds its session. An empty prefix matches
    /// nothing.
    pub fn sessions_starting_with(&self, prefix: &str, limit: u32) -> Result<Vec<String>> {
        if prefix.is_empty() {
            return Ok(Vec::new());
        }
        let c = match &self.store {
            Store::Sqlite(c) => c,
            Store::Postgres { client, url } => {
                return pg::sessions_starting_with(&mut client.borrow_mut(), prefix, limit)
                    .map_err(|e| url.err("reading the sessions", &e))
            }
        };
        let mut st = c
            .prepare("SELECT DISTINCT session FROM entries WHERE substr(session, 1, length(?1)) = ?1 ORDER BY session LIMIT ?2")
            .map_err(|e| self.sql(e))?;
        let ids = st
            .query_map(rusqlite::params![prefix, limit], |r| r.get::<_, String>(0))
            .and_then(|it| it.collect::<rusqlite::Result<Vec<String>>>())
            .map_err(|e| self.sql(e))?;
        Ok(ids)
    }

    /// Claim session `session` for this process on a shared ledger: on
    /// PostgreSQL a session-level advisory lock on this connection, held
    /// until it closes (the server drops it when the process dies, on any
    /// machine); `false` when another connection holds it. On SQLite
    /// always `true`: the ledger is one machine's, and the session's
    /// `flock` beside it (dispatch's `SessionLock`) is the lock.
    pub fn claim_session(&self, session: &str) -> Result<bool> {
        match &self.store {
            Store::Sqlite(_) => Ok(true),
            Store::Postgres { client, url } => pg::claim_session(&mut client.borrow_mut(), session)
                .map_err(|e| url.err("taking the session's lock", &e)),
        }
    }

    /// Whether a process holds session `session`'s claim on this shared
    /// ledger ([`Ledger::claim_session`]); always `false` on SQLite.
    pub fn session_claimed(&self, session: &str) -> Result<bool> {
        match &self.store {
            Store::Sqlite(_) => Ok(false),
            Store::Postgres { client, url } => {
                pg::session_claimed(&mut client.borrow_mut(), session)
                    .map_err(|e| url.err("looking for the session's lock", &e))
            }
        }
    }

    /// Rows of one session (and the genesis), in seq order.
    pub fn session_rows(&self, session: &str) -> Result<Vec<Row>> {
        let c = match &self.store {
            Store::Sqlite(c) => c,
            Store::Postgres { client, url } => {
                return pg::session_rows(&mut client.borrow_mut(), session)
                    .map_err(|e| url.err("reading the session", &e))
            }
        };
        let mut st = c
            .prepare("SELECT seq, time_ms, session, actor, kind, payload, prev, hash, signer, sig FROM entries WHERE session = ?1 ORDER BY seq")
            .map_err(|e| self.sql(e))?;
        let rows = st
            .query_map([session], row_of)
            .and_then(|it| it.collect::<rusqlite::Result<Vec<Row>>>())
            .map_err(|e| self.sql(e))?;
        Ok(rows)
    }

    /// (count, head hash) as of now.
    pub fn head(&self) -> Result<(u64, Vec<u8>)> {
        let r: Option<(i64, Vec<u8>)> = match &self.store {
            Store::Sqlite(c) => c
                .query_row(
                    "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(|e| self.sql(e))?,
            Store::Postgres { client, url } => pg::head(&mut client.borrow_mut())
                .map_err(|e| url.err("reading the chain head", &e))?,
        };
        Ok(r.map(|(s, h)| (s.max(0) as u64, h))
            .unwrap_or((0, vec![0; 32])))
    }

    /// A fold of the WAL to run ([`Fold::run`], which decides whether one
    /// is due), once this process has appended something; asked once. A
    /// caller with time to spare (the CLI, while the sandboxed command
    /// runs) runs it on a thread of its own.
    pub fn take_fold(&mut self) -> Option<Fold> {
        if self.is_postgres() {
            // No WAL of ours to fold: the server keeps its own.
            self.appended = None;
            return None;
        }
        self.appended.take().map(|head| Fold {
            path: self.path.clone(),
            head,
        })
    }

    /// Write a user-signed checkpoint of the current head to the file next
    /// to the database.
    pub fn checkpoint(&mut self, user: &SigningKey) -> Result<Checkpoint> {
        // Only what is on disk: a line that claims more than a power cut
        // leaves would read as a cut-off tail.
        let (count, head) = match &self.synced {
            Some(h) => h.clone(),
            None => {
                self.sync()?;
                self.head()?
            }
        };
        if let Some(cp) = self.written.as_ref().filter(|cp| cp.count == count) {
            return Ok(cp.clone());
        }
        let cp = Checkpoint {
            count,
            head: hex(&head),
            time_ms: now_ms(),
            key: hex(user.verifying_key().as_bytes()),
            sig: hex(&user.sign(&checkpoint_digest(count, &head)).to_bytes()),
        };
        let mut line = serde_json::to_string(&cp)
            .map_err(|e| Error::Invalid(format!("encoding a checkpoint: {e}")))?;
        line.push('\n');
        let mut files = vec![checkpoint_path(&self.path)];
        files.extend(checkpoint_copy_path());
        for p in files {
            if self.is_postgres() {
                if let Some(d) = p.parent() {
                    mkdir_private(d)?;
                }
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&p)
                .map_err(|e| Error::io(format!("opening {}", p.display()), e))?;
            // Not fsynced: the ledger's own commit is durable before this
            // line is written, so a crash can only lose a checkpoint (the
            // file then lags the ledger, which verify accepts), never make
            // one claim more than the ledger holds.
            f.write_all(line.as_bytes())
                .map_err(|e| Error::io(format!("writing {}", p.display()), e))?;
        }
        self.written = Some(cp.clone());
        Ok(cp)
    }
}

/// A condition checked inside an append's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// Entry `pending` is session `session`'s newest `pending` entry and no
    /// `decision` of that session follows it: it is still open.
    OpenPending { session: String, pending: i64 },
}

impl Guard {
    fn check(&self, tx: &mut dyn AppendTx) -> Result<()> {
        match self {
            Guard::OpenPending { session, pending } => {
                let conflict = |why: String| Error::Conflict {
                    session: session.clone(),
                    why,
                };
                match tx.newest_of(session, Kind::Pending.as_str())? {
                    None => return Err(conflict("it has no pending approval".into())),
                    Some(n) if n != *pending => {
                        return Err(conflict(format!(
                            "the pending approval {pending} is no longer the session's open one (the session moved on to {n})"
                        )))
                    }
                    Some(_) => {}
                }
                if let Some(d) = tx.first_after(session, *pending, Kind::Decision.as_str())? {
                    return Err(conflict(format!(
                        "the pending approval {pending} was already decided (entry {d})"
                    )));
                }
                Ok(())
            }
        }
    }
}

fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    use rusqlite::types::ValueRef;
    let bytes = |i: usize| -> rusqlite::Result<Vec<u8>> {
        Ok(match r.get_ref(i)? {
            ValueRef::Null => Vec::new(),
            ValueRef::Integer(n) => n.to_string().into_bytes(),
            ValueRef::Real(f) => f.to_string().into_bytes(),
            ValueRef::Text(t) | ValueRef::Blob(t) => t.to_vec(),
        })
    };
    let int = |i: usize| -> rusqlite::Result<i64> {
        Ok(match r.get_ref(i)? {
            ValueRef::Integer(n) => n,
            _ => i64::MIN,
        })
    };
    Ok(Row {
        seq: int(0)?,
        time_ms: int(1)?,
        session: bytes(2)?,
        actor: bytes(3)?,
        kind: bytes(4)?,
        payload: bytes(5)?,
        prev: bytes(6)?,
        hash: bytes(7)?,
        signer: bytes(8)?,
        sig: bytes(9)?,
    })
}

pub(crate) fn read_rows(conn: &Connection) -> rusqlite::Result<Vec<Row>> {
    let mut st = conn.prepare(
        "SELECT seq, time_ms, session, actor, kind, payload, prev, hash, signer, sig FROM entries ORDER BY seq",
    )?;
    let rows = st.query_map([], row_of)?.collect();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> SigningKey {
        SigningKey::from_bytes(&[b; 32])
    }

    #[test]
    fn every_kind_round_trips_through_its_stored_name() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_bytes()), Some(k));
        }
        assert_eq!(Kind::parse(b"turn"), None);
    }

    /// Issue 27 item 3: an entry signed correctly (as only a holder of
    /// the key could) whose payload does not have its kind's shape is
    /// reported: "ill-typed payload at #N". Seen failing with the check
    /// removed from verify (the ledger said intact).
    #[test]
    fn verify_flags_a_correctly_signed_but_ill_typed_payload() {
        use serde_json::json;
        let dir = tempfile::tempdir().expect("tempdir");
        let user = key(9);
        // A ledger with a pending approval and `decision` for it, every
        // entry signed by the user key; returns the decision's seq.
        let build = |name: &str, decision: &serde_json::Value| {
            let path = dir.path().join(name);
            let mut l = Ledger::open(&path, true, Some(&user)).expect("open");
            let pending = l
                .append(
                    "s",
                    Actor::Person,
                    Kind::Pending,
                    &json!({"digest": "ab", "action": {"tool": "bash"}, "proposal": 1}),
                    &user,
                )
                .expect("pending")
                .seq;
            let mut d = decision.clone();
            d["pending"] = json!(pending);
            let seq = l
                .append("s", Actor::Person, Kind::Decision, &d, &user)
                .expect("decision")
                .seq;
            (path, seq, l)
        };
        let decision = json!({
            "verdict": "edit", "decided_by": "person", "class": "irreversible",
            "reason": "asks", "approved_digest": null, "shown_digest": "ab",
            "edited_arguments": {"command": "ls"}, "proposal": 1,
        });
        let (good, _, g) = build("good.db", &decision);
        drop(g);
        let r = verify::verify_with(&good, Some(user.verifying_key())).expect("verify");
        assert!(r.intact, "{:?}", r.problems);
        // The same decision without the digest that was shown.
        let mut bad = decision.clone();
        bad.as_object_mut().expect("object").remove("shown_digest");
        let (path, seq, mut l) = build("bad.db", &bad);
        let r = verify::verify_with(&path, Some(user.verifying_key())).expect("verify");
        assert!(!r.intact);
        let p = r
            .problems
            .iter()
            .find(|p| p.seq == Some(seq))
            .unwrap_or_else(|| panic!("{:?}", r.problems));
        assert!(
            p.what.contains(&format!("ill-typed payload at #{seq}"))
                && p.what.contains("shown_digest"),
            "{}",
            p.what
        );
        // A field no revoke has.
        let odd = l
            .append(
                "t",
                Actor::Person,
                Kind::Revoke,
                &json!({"grant": 3, "by": "p", "also": "this"}),
                &user,
            )
            .expect("append")
            .seq;
        let r = verify::verify_with(&path, Some(user.verifying_key())).expect("verify");
        assert!(
            r.problems
                .iter()
                .any(|p| p.seq == Some(odd) && p.what.contains("ill-typed payload")),
            "{:?}",
            r.problems
        );
    }

    /// Issue 27 item 3, the rest: a correctly signed entry of each kind
    /// typed in session 22 whose payload lacks a field its kind requires
    /// or has one of the wrong type is reported by verify, naming the
    /// entry ("ill-typed payload at #N (a K entry)") and the field; the
    /// same kinds well typed verify intact.
    #[test]
    fn verify_names_an_ill_typed_entry_of_every_kind() {
        use serde_json::json;
        let dir = tempfile::tempdir().expect("tempdir");
        let user = key(11);
        let good = [
            (
                Kind::SessionOpened,
                json!({"objective": "x", "origin": "retie run"}),
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "action": {"tool": "read"}, "digest": "ab"}),
            ),
            (
                Kind::Intent,
                json!({"tool": "agent.read", "decision": "allow", "decided_by": "policy"}),
            ),
            (Kind::Refusal, json!({"reason": "no", "by": "policy"})),
            (
                Kind::Note,
                json!({"setting": "autonomy", "value": "gated", "by": "person"}),
            ),
            (
                Kind::Message,
                json!({"message": {"role": "user", "text": "hi"}}),
            ),
        ];
        let path = dir.path().join("good.db");
        let mut l = Ledger::open(&path, true, Some(&user)).expect("open");
        for (k, p) in &good {
            l.append("s", Actor::Person, *k, p, &user).expect("append");
        }
        drop(l);
        let r = verify::verify_with(&path, Some(user.verifying_key())).expect("verify");
        assert!(r.intact, "{:?}", r.problems);
        let bad = [
            (
                Kind::SessionOpened,
                json!({"objective": "x", "pid": "me"}),
                "\"me\"",
            ),
            (
                Kind::Delegation,
                json!({"why": "renewed on resume"}),
                "delegation",
            ),
            (
                Kind::Proposed,
                json!({"origin": "agent", "action": {}}),
                "digest",
            ),
            (
                Kind::Intent,
                json!({"tool": "agent.read", "decided_by": "policy"}),
                "decision",
            ),
            (
                Kind::Intent,
                json!({"decision": "allow", "decided_by": "policy"}),
                "tool",
            ),
            (Kind::Refusal, json!({"by": "policy"}), "reason"),
            (
                Kind::Note,
                json!({"setting": "autonomy", "value": "yolo"}),
                "by",
            ),
            (Kind::Message, json!({"message": {"text": "hi"}}), "role"),
        ];
        for (i, (k, p, field)) in bad.iter().enumerate() {
            let path = dir.path().join(format!("bad{i}.db"));
            let mut l = Ledger::open(&path, true, Some(&user)).expect("open");
            let seq = l
                .append("s", Actor::Person, *k, p, &user)
                .expect("append")
                .seq;
            drop(l);
            let r = verify::verify_with(&path, Some(user.verifying_key())).expect("verify");
            assert!(!r.intact, "{k:?} {p}: intact");
            let want = format!("ill-typed payload at #{seq} (a {} entry)", k.as_str());
            assert!(
                r.problems.iter().any(|x| x.seq == Some(seq)
                    && x.what.contains(&want)
                    && x.what.contains(field)),
                "{k:?} {p}: {:?}",
                r.problems
            );
        }
        // The genesis entry itself, re-signed with a field it never had.
        let path = dir.path().join("genesis.db");
        let mut l = Ledger::open(&path, true, Some(&user)).expect("open");
        let seq = l
            .append(
                "",
                Actor::Person,
                Kind::LedgerOpened,
                &json!({"user_key": hex(user.verifying_key().as_bytes()), "format": 1, "owner": "x"}),
                &user,
            )
            .expect("append")
            .seq;
        drop(l);
        let r = verify::verify_with(&path, Some(user.verifying_key())).expect("verify");
        assert!(
            r.problems.iter().any(|x| x.seq == Some(seq)
                && x.what.contains("ill-typed payload")
                && x.what.contains("owner")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn appends_chain_and_each_row_hashes_to_what_is_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = key(7);
        let mut l = Ledger::open(&dir.path().join("l.db"), true, Some(&user)).expect("open");
        for i in 0..5 {
            l.append(
                "s",
                Actor::Person,
                Kind::Note,
                &serde_json::json!({ "i": i }),
                &user,
            )
            .expect("append");
        }
        let rows = l.rows().expect("rows");
        assert_eq!(rows.len(), 6, "genesis + 5");
        for w in rows.windows(2) {
            assert_eq!(w[1].prev, w[0].hash, "chain broken at {}", w[1].seq);
        }
        for r in &rows {
            assert_eq!(r.recompute().to_vec(), r.hash, "row {} hash", r.seq);
        }
        assert_eq!(
            l.genesis_user_key().expect("genesis"),
            Some(hex(user.verifying_key().as_bytes()))
        );
        l.check_user_key(&user).expect("same key");
        assert!(
            l.check_user_key(&key(8)).is_err(),
            "a replaced key must be refused"
        );
    }

    /// Eight processes' worth of connections decide one pending approval
    /// at once: the guard, checked inside each append's transaction, lets
    /// exactly one decision in (seen failing with the guard removed: all
    /// eight were written).
    #[test]
    fn a_pending_approval_is_decided_once_under_concurrent_deciders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("l.db");
        let user = key(5);
        let mut l = Ledger::open(&path, true, Some(&user)).expect("open");
        let pending = l
            .append(
                "s",
                Actor::Policy,
                Kind::Pending,
                &serde_json::json!({}),
                &user,
            )
            .expect("pending")
            .seq;
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let won: usize = (0..8)
            .map(|i| {
                let path = path.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let user = key(5);
                    let mut l = Ledger::open(&path, false, Some(&user)).expect("open");
                    barrier.wait();
                    let guard = Guard::OpenPending {
                        session: "s".into(),
                        pending,
                    };
                    match l.append_batch_guarded(Some(&guard), |_| {
                        vec![NewEntry {
                            session: "s".into(),
                            actor: Actor::Person,
                            kind: Kind::Decision,
                            payload: serde_json::json!({ "pending": pending, "by": i }),
                            key: user.clone(),
                        }]
                    }) {
                        Ok(_) => 1,
                        Err(Error::Conflict { .. }) => 0,
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .sum();
        assert_eq!(won, 1, "decisions written");
        // A later pending makes the first one moved-on.
        l.append(
            "s",
            Actor::Policy,
            Kind::Pending,
            &serde_json::json!({}),
            &user,
        )
        .expect("second pending");
        let guard = Guard::OpenPending {
            session: "s".into(),
            pending,
        };
        assert!(matches!(
            l.append_batch_guarded(Some(&guard), |_| Vec::new()),
            Err(Error::Conflict { .. })
        ));
    }

    /// A checkpoint names only what is on disk: after a deferred append
    /// (no sync) it still names the last synced commit's head, so a power
    /// cut that takes the deferred entry back cannot leave a checkpoint
    /// claiming more than the ledger holds; the next synced commit moves
    /// it to the newest entry.
    #[test]
    fn a_checkpoint_never_names_a_deferred_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = key(5);
        let mut l = Ledger::open(&dir.path().join("l.db"), true, Some(&user)).expect("open");
        let note = |i: i32| NewEntry {
            session: "s".into(),
            actor: Actor::Person,
            kind: Kind::Note,
            payload: serde_json::json!({ "i": i }),
            key: user.clone(),
        };
        l.append_batch(|_| vec![note(1)]).expect("synced append");
        let synced = l.head().expect("head");
        l.append_batch_with(Durability::Deferred, |_| vec![note(2), note(3)])
            .expect("deferred append");
        let cp = l.checkpoint(&user).expect("checkpoint");
        assert_eq!((cp.count, cp.head.clone()), (synced.0, hex(&synced.1)));
        assert_eq!(l.head().expect("head").0, synced.0 + 2);
        l.append_batch_with(Durability::Now, |_| vec![note(4)])
            .expect("synced append");
        let cp = l.checkpoint(&user).expect("checkpoint");
        assert_eq!(cp.count, l.head().expect("head").0);
        // A fresh process knows nothing synced yet: it syncs, then names
        // the newest entry.
        l.append_batch_with(Durability::Deferred, |_| vec![note(5)])
            .expect("deferred append");
        drop(l);
        let mut l = Ledger::open(&dir.path().join("l.db"), true, Some(&user)).expect("open");
        let cp = l.checkpoint(&user).expect("checkpoint");
        assert_eq!(cp.count, l.head().expect("head").0);
    }

    /// A note of about 200 bytes, signed by `user` (the fold tests need
    /// entries that fill pages).
    fn padded_note(user: &SigningKey, i: u64) -> NewEntry {
        NewEntry {
            session: "s".into(),
            actor: Actor::Person,
            kind: Kind::Note,
            payload: serde_json::json!({ "i": i, "pad": "x".repeat(200) }),
            key: user.clone(),
        }
    }

    /// A fold runs once FOLD_EVERY entries came after the last recorded
    /// one, whichever process appended them: a crossing in a commit made
    /// after a process took its fold (the outcome's, in `sandbox exec`)
    /// is folded by the next process. The fold moves the WAL's pages into
    /// the database file.
    #[test]
    fn the_wal_is_folded_into_the_database_once_due() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("l.db");
        let user = key(7);
        let note = |i: u64| padded_note(&user, i);
        let size = || std::fs::metadata(&db).expect("db").len();
        let mut l = Ledger::open(&db, true, Some(&user)).expect("open");
        assert_eq!(l.take_fold(), None, "nothing appended, nothing to fold");
        l.append_batch(|_| (0..20).map(note).collect())
            .expect("append");
        let first = l.take_fold().expect("a fold to run");
        assert_eq!(l.take_fold(), None, "asked once");
        let before = size();
        assert!(first.run().expect("fold"), "no fold recorded yet: due");
        assert!(size() > before, "the fold moved nothing");
        let folded_at = l.head().expect("head").0;

        // A process that appends fewer than FOLD_EVERY entries after it:
        // not due.
        l.append_batch(|_| (0..FOLD_EVERY - 2).map(|i| note(100 + i)).collect())
            .expect("append");
        let early = l.take_fold().expect("a fold to run");
        let before = size();
        assert!(!early.run().expect("fold"), "a fold due too early");
        assert_eq!(size(), before);

        // Its last entries cross the mark after it took its fold (the
        // outcome's commit): the next process folds them.
        l.append_batch(|_| (200..220).map(note).collect())
            .expect("append");
        assert!(l.head().expect("head").0 >= folded_at + FOLD_EVERY);
        drop(l);
        let mut l = Ledger::open(&db, true, Some(&user)).expect("reopen");
        l.append_batch(|_| vec![note(300)]).expect("append");
        let before = size();
        assert!(
            l.take_fold().expect("a fold to run").run().expect("fold"),
            "the crossing the last process missed is folded"
        );
        assert!(size() > before, "the fold moved nothing");
    }

    /// The fold's record, planted as a FIFO or as a symlink to another
    /// file (someone who can write a shared ledger directory), neither
    /// hangs the run's fold nor gets written through.
    #[test]
    fn a_planted_fold_record_neither_hangs_nor_is_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("l.db");
        let user = key(8);
        let mut l = Ledger::open(&db, true, Some(&user)).expect("open");
        let note = |i: u64| padded_note(&user, i);
        let marker = marker_path(&db);
        let fifo = std::ffi::CString::new(marker.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads the NUL-terminated path, a live local.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
        l.append_batch(|_| vec![note(0)]).expect("append");
        let fold = l.take_fold().expect("a fold to run");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Folded; recording into a FIFO is refused (an error the
            // run's housekeeping ignores).
            let _ = tx.send(fold.run().is_err());
        });
        let done = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(done, Ok(true), "the fold hung on a FIFO, or wrote into it");

        std::fs::remove_file(&marker).expect("remove the FIFO");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").expect("victim");
        std::os::unix::fs::symlink(&victim, &marker).expect("symlink");
        l.append_batch(|_| vec![note(1)]).expect("append");
        let _ = l.take_fold().expect("a fold to run").run();
        assert_eq!(
            std::fs::read_to_string(&victim).expect("victim"),
            "keep",
            "the fold wrote through a symlink"
        );
    }

    /// SQLite is built without its per-process directory sync (see
    /// `.cargo/config.toml`); the ledger makes the WAL exist from its
    /// first open (and syncs the directory then), so no commit lands in
    /// a WAL whose name is not yet durable.
    #[test]
    fn the_wal_exists_from_the_first_open_and_sqlite_leaves_directory_syncs_to_us() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = key(6);
        let l = Ledger::open(&dir.path().join("l.db"), true, Some(&user)).expect("open");
        assert!(dir.path().join("l.db-wal").exists());
        let opts: Vec<String> = l
            .sqlite()
            .expect("sqlite")
            .prepare("PRAGMA compile_options")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))
                    .and_then(|rows| rows.collect())
            })
            .expect("compile options");
        assert!(opts.iter().any(|o| o == "DISABLE_DIRSYNC"), "{opts:?}");
    }

    #[test]
    fn rows_cannot_be_rewritten_or_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = key(3);
        let l = Ledger::open(&dir.path().join("l.db"), true, Some(&user)).expect("open");
        assert!(l
            .sqlite()
            .expect("sqlite")
            .execute("UPDATE entries SET payload = '{}'", [])
            .is_err());
        assert!(l
            .sqlite()
            .expect("sqlite")
            .execute("DELETE FROM entries", [])
            .is_err());
    }
}

#[cfg(test)]
mod key_tests {
    /// Many processes' first use at once: each reads a whole key, the same
    /// one (a key file seen half written was a real race).
    #[test]
    fn concurrent_first_writers_all_read_one_whole_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("retie").join("user.key");
        let keys: Vec<_> = (0..16)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let k = ed25519_dalek::SigningKey::from_bytes(&[i as u8; 32]);
                    match crate::keys::write_key(&path, &k) {
                        Ok(()) => {}
                        Err(crate::Error::Io { source, .. })
                            if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => panic!("{e}"),
                    }
                    crate::keys::read_key(&path)
                        .expect("a whole key")
                        .to_bytes()
                })
            })
            .collect();
        let got: Vec<[u8; 32]> = keys
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect();
        assert!(got.windows(2).all(|w| w[0] == w[1]), "different keys read");
    }
}
