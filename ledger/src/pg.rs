//! The ledger's second store: a PostgreSQL database many machines share
//! (issue 32, docs/adr/0460-postgres-ledger-backend.md). Only storage
//! lives here: the entry encoding, the chain, the signatures, the guard,
//! the checkpoints and the verifier are the SQLite store's, unchanged
//! ([`crate::Ledger`] and [`crate::verify`] call into this file for rows,
//! nothing else).
//!
//! A ledger is named by a URL, `postgres://USER@HOST[:PORT]/DB` (or
//! `postgresql://`; a unix socket directory as a percent-encoded host, or
//! `?host=/dir`). The password never comes from the URL (one there is
//! refused, the error names the fix): it comes from `PGPASSWORD`, from
//! the variable `RETIE_LEDGER_PASSWORD_ENV` names, or from `PGPASSFILE`
//! (default `~/.pgpass`). This build has no TLS: a URL naming a host other
//! than a unix socket or the loopback is refused unless it says
//! `sslmode=disable` (the person's explicit "plaintext on this network").
//!
//! Appends are serialised by the database: each append's transaction
//! first takes the row lock on the one row of `retie_chain_head`
//! (`SELECT ... FOR UPDATE`), then reads the newest entry, so two writers
//! on two machines never both extend the same head. `seq` is also the
//! primary key (a second wall: a fork would be a duplicate key). Rows
//! cannot be updated, deleted or truncated through the ledger's role
//! except by the table owner disabling the triggers, which verify then
//! catches like any other rewrite.

use std::net::IpAddr;
use std::path::Path;

use postgres::config::{Host, SslMode};
use postgres::{Client, Config, NoTls, Transaction};

use crate::{Error, Result, Row};

/// Whether `p` names a PostgreSQL ledger (a `postgres://` or
/// `postgresql://` URL) rather than an SQLite file.
pub fn is_url(p: &Path) -> bool {
    let s = p.as_os_str().as_encoded_bytes();
    s.starts_with(b"postgres://") || s.starts_with(b"postgresql://")
}

/// The URL with any password removed (`user:secret@` and `password=`),
/// for every message that names it.
pub fn redact(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let auth_end = out[rest_start..]
            .find(['/', '?'])
            .map(|i| rest_start + i)
            .unwrap_or(out.len());
        if let Some(at) = out[rest_start..auth_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest_start + colon..rest_start + at, ":***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|kv| {
                if kv.to_ascii_lowercase().starts_with("password=") {
                    "password=***".to_string()
                } else {
                    kv.to_string()
                }
            })
            .collect();
        out = format!("{head}{}", query.join("&"));
    }
    out
}

/// Run `f` where the sync client may block: on this thread, or, when this
/// thread drives an async runtime (the agent's), on a scoped thread of
/// its own. The `postgres` client blocks on a runtime of its own, which
/// tokio forbids inside another runtime (it panicked: "Cannot start a
/// runtime from within a runtime"); dropping a client or an open
/// transaction blocks too, so those go through here as well.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    })
}

/// A connected client that is closed (and its runtime dropped) off any
/// async runtime ([`off_runtime`]).
pub struct PgClient(Option<Client>);

impl std::ops::Deref for PgClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        // Some until drop.
        self.0.as_ref().expect("a live client")
    }
}

impl std::ops::DerefMut for PgClient {
    fn deref_mut(&mut self) -> &mut Client {
        self.0.as_mut().expect("a live client")
    }
}

impl Drop for PgClient {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            off_runtime(move || drop(c));
        }
    }
}

/// A parsed, checked ledger URL.
#[derive(Clone)]
pub struct PgUrl {
    config: Config,
    /// The URL as shown (no password ever).
    pub shown: String,
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

fn bad(shown: &str, why: impl Into<String>) -> Error {
    Error::Postgres {
        url: shown.to_string(),
        why: why.into(),
    }
}

/// Whether every host the config names is on this machine: a unix socket
/// directory, `localhost`, or a loopback address.
fn local_only(c: &Config) -> bool {
    let hosts_local = c.get_hosts().iter().all(|h| match h {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name == "localhost" || name.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
        }
    });
    hosts_local && c.get_hostaddrs().iter().all(|a| a.is_loopback())
}

impl PgUrl {
    /// Parse and check `url`: no password in it, a user and a database
    /// named, TLS refused (this build has none) and a remote host refused
    /// unless it says `sslmode=disable`.
    pub fn parse(url: &str) -> Result<PgUrl> {
        let shown = redact(url);
        let mut config: Config = url.parse().map_err(|e| {
            bad(
                &shown,
                format!("not a PostgreSQL URL ({e}); write postgres://USER@HOST[:PORT]/DATABASE"),
            )
        })?;
        if config.get_password().is_some() {
            return Err(bad(
                &shown,
                "the URL carries a password: remove it from the URL and give it in PGPASSWORD, in ~/.pgpass (or PGPASSFILE), or in the environment variable RETIE_LEDGER_PASSWORD_ENV names; a password is never taken from the command line or the config, and never written to the ledger",
            ));
        }
        if config.get_user().is_none() {
            return Err(bad(
                &shown,
                "the URL names no user: write postgres://USER@HOST/DATABASE",
            ));
        }
        if config.get_dbname().is_none() {
            return Err(bad(
                &shown,
                "the URL names no database: write postgres://USER@HOST/DATABASE",
            ));
        }
        if config.get_hosts().is_empty() {
            return Err(bad(&shown, "the URL names no host: write postgres://USER@HOST/DATABASE (a unix socket directory percent-encoded, e.g. %2Frun%2Fpostgresql)"));
        }
        let explicit_disable = url.contains("sslmode=disable");
        match config.get_ssl_mode() {
            SslMode::Require => {
                return Err(bad(&shown, "sslmode=require, but this retie is built without TLS: reach the server over a unix socket or an SSH tunnel to the loopback, or say sslmode=disable if the network is trusted"));
            }
            SslMode::Disable | SslMode::Prefer => {}
            _ => return Err(bad(&shown, "an sslmode this retie does not know: it has no TLS; use a unix socket, the loopback through a tunnel, or sslmode=disable")),
        }
        if !local_only(&config) && !explicit_disable {
            return Err(bad(&shown, "the host is not on this machine and this retie is built without TLS: the ledger would travel in plaintext. Reach the server through an SSH tunnel or a unix socket (postgres://USER@localhost:PORT/DB), or add ?sslmode=disable if this network is trusted"));
        }
        config.ssl_mode(SslMode::Disable);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(std::time::Duration::from_secs(10));
        }
        config.application_name("retie");
        Ok(PgUrl { config, shown })
    }

    /// The password for this URL, from the environment or the pgpass file.
    fn password(&self) -> Result<Option<Vec<u8>>> {
        if let Ok(name) = std::env::var("RETIE_LEDGER_PASSWORD_ENV") {
            if !name.is_empty() {
                return match std::env::var_os(&name) {
                    Some(v) => Ok(Some(v.into_encoded_bytes())),
                    None => Err(bad(
                        &self.shown,
                        format!("RETIE_LEDGER_PASSWORD_ENV names {name}, which is not set: set it, or unset RETIE_LEDGER_PASSWORD_ENV"),
                    )),
                };
            }
        }
        if let Some(v) = std::env::var_os("PGPASSWORD") {
            return Ok(Some(v.into_encoded_bytes()));
        }
        Ok(self.pgpass())
    }

    /// libpq's password file: `host:port:database:user:password`, `*`
    /// matching anything; only a file private to its owner is read.
    fn pgpass(&self) -> Option<Vec<u8>> {
        use std::os::unix::fs::MetadataExt;
        let file = std::env::var_os("PGPASSFILE")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")))?;
        let meta = std::fs::metadata(&file).ok()?;
        if meta.mode() & 0o077 != 0 {
            return None;
        }
        let text = std::fs::read_to_string(&file).ok()?;
        let host = match self.config.get_hosts().first()? {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => {
                if p.as_os_str() == "/var/run/postgresql" || p.as_os_str() == "/run/postgresql" {
                    "localhost".into()
                } else {
                    p.display().to_string()
                }
            }
        };
        let port = self
            .config
            .get_ports()
            .first()
            .copied()
            .unwrap_or(5432)
            .to_string();
        let want = [
            host.as_str(),
            port.as_str(),
            self.config.get_dbname().unwrap_or(""),
            self.config.get_user().unwrap_or(""),
        ];
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let fields = split_pgpass(line);
            if fields.len() != 5 {
                continue;
            }
            if fields[..4]
                .iter()
                .zip(want)
                .all(|(f, w)| f == "*" || f == w)
            {
                return Some(fields[4].clone().into_bytes());
            }
        }
        None
    }

    /// Connect, create the schema if it is not there, and return the
    /// client.
    pub fn connect(&self) -> Result<PgClient> {
        let mut config = self.config.clone();
        if let Some(p) = self.password()? {
            config.password(p);
        }
        let mut c = off_runtime(|| config.connect(NoTls)).map(|c| PgClient(Some(c))).map_err(|e| {
            bad(
                &self.shown,
                format!(
                    "cannot reach the ledger's database server ({}): start it or check the URL, the network and the credentials (PGPASSWORD / ~/.pgpass). Nothing was run",
                    one_line(&e)
                ),
            )
        })?;
        // The tables, once: a cheap look first; their creation under a
        // transaction-scoped advisory lock, so first writers on many
        // machines do not trip over each other's DDL.
        let ready: bool = off_runtime(|| c
            .query_one(
                "SELECT to_regclass('entries') IS NOT NULL AND to_regclass('retie_chain_head') IS NOT NULL",
                &[],
            )
            .and_then(|r| r.try_get(0)))
            .map_err(|e| self.err("looking for the ledger's tables", &e))?;
        if !ready {
            off_runtime(|| {
                c.batch_execute(&format!(
                    "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {SCHEMA} COMMIT;"
                ))
            })
            .map_err(|e| self.err("creating the ledger's tables", &e))?;
        }
        Ok(c)
    }

    /// An error from the server while doing `what`.
    pub fn err(&self, what: &str, e: &postgres::Error) -> Error {
        bad(&self.shown, format!("{what}: {}", one_line(e)))
    }

    /// A file-name-safe id for this URL (checkpoints, verify's memory).
    pub fn id(&self) -> String {
        use sha2::Digest;
        let h = sha2::Sha256::digest(self.shown.as_bytes());
        crate::hex(&h)[..32].to_string()
    }
}

/// A pgpass line's fields (`\:` and `\\` escaped).
fn split_pgpass(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(last)) = (chars.next(), out.last_mut()) {
                    last.push(n);
                }
            }
            ':' => out.push(String::new()),
            c => {
                if let Some(last) = out.last_mut() {
                    last.push(c)
                }
            }
        }
    }
    out
}

/// A postgres error on one line, with the server's message when it sent
/// one.
fn one_line(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(x) = src {
                s.push_str(&format!(": {x}"));
                src = x.source();
            }
            s
        }
    }
}

/// The tables. Fields are kept raw (`bytea`), as SQLite keeps them, so a
/// row edited to something odd can still be read and judged. The head
/// table holds one row: its row lock is what serialises appends.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    seq BIGINT PRIMARY KEY,
    time_ms BIGINT NOT NULL,
    session BYTEA NOT NULL,
    actor BYTEA NOT NULL,
    kind BYTEA NOT NULL,
    payload BYTEA NOT NULL,
    prev BYTEA NOT NULL,
    hash BYTEA NOT NULL,
    signer BYTEA NOT NULL,
    sig BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_session ON entries(session);
CREATE TABLE IF NOT EXISTS retie_chain_head (
    id INT PRIMARY KEY CHECK (id = 1)
);
INSERT INTO retie_chain_head (id) VALUES (1) ON CONFLICT DO NOTHING;
CREATE OR REPLACE FUNCTION retie_append_only() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'the ledger is append-only'; END $$;
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'entries_no_rewrite') THEN
    CREATE TRIGGER entries_no_rewrite BEFORE UPDATE OR DELETE ON entries
      FOR EACH ROW EXECUTE FUNCTION retie_append_only();
    CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON entries
      FOR EACH STATEMENT EXECUTE FUNCTION retie_append_only();
  END IF;
END $$;
";

/// The advisory lock key the schema's creation takes ("retie" in ASCII).
const SCHEMA_LOCK: i64 = 0x72_65_74_69_65;

const COLUMNS: &str = "seq, time_ms, session, actor, kind, payload, prev, hash, signer, sig";

fn row_of(r: &postgres::Row) -> std::result::Result<Row, postgres::Error> {
    Ok(Row {
        seq: r.try_get(0)?,
        time_ms: r.try_get(1)?,
        session: r.try_get(2)?,
        actor: r.try_get(3)?,
        kind: r.try_get(4)?,
        payload: r.try_get(5)?,
        prev: r.try_get(6)?,
        hash: r.try_get(7)?,
        signer: r.try_get(8)?,
        sig: r.try_get(9)?,
    })
}

fn rows_of(rs: Vec<postgres::Row>) -> std::result::Result<Vec<Row>, postgres::Error> {
    rs.iter().map(row_of).collect()
}

/// Every row in seq order.
pub(crate) fn read_rows(c: &mut Client) -> std::result::Result<Vec<Row>, postgres::Error> {
    off_runtime(|| rows_of(c.query(&format!("SELECT {COLUMNS} FROM entries ORDER BY seq"), &[])?))
}

/// One session's rows in seq order.
pub(crate) fn session_rows(
    c: &mut Client,
    session: &str,
) -> std::result::Result<Vec<Row>, postgres::Error> {
    off_runtime(|| {
        rows_of(c.query(
            &format!("SELECT {COLUMNS} FROM entries WHERE session = $1 ORDER BY seq"),
            &[&session.as_bytes()],
        )?)
    })
}

/// The advisory-lock key of session `session`: the first 8 bytes of
/// SHA-256("retie-session\0" || id), as PostgreSQL's bigint. Its two
/// halves are what `pg_locks` shows as `classid` and `objid`.
pub(crate) fn session_lock_key(session: &str) -> i64 {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"retie-session\0");
    h.update(session.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

/// Take session `session`'s lock on this connection, if nobody holds it:
/// a session-level advisory lock, held until the connection closes
/// (however the process ends: the server drops it with the connection).
pub(crate) fn claim_session(
    c: &mut Client,
    session: &str,
) -> std::result::Result<bool, postgres::Error> {
    let key = session_lock_key(session);
    off_runtime(|| {
        c.query_one("SELECT pg_try_advisory_lock($1)", &[&key])?
            .try_get(0)
    })
}

/// Whether some connection to this database holds session `session`'s
/// lock (its process is running the session, on whatever machine).
pub(crate) fn session_claimed(
    c: &mut Client,
    session: &str,
) -> std::result::Result<bool, postgres::Error> {
    let key = session_lock_key(session) as u64;
    let (hi, lo) = ((key >> 32) as u32, key as u32);
    off_runtime(|| {
        c.query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid::text::bigint = $1 AND objid::text::bigint = $2 AND objsubid = 1)",
            &[&i64::from(hi), &i64::from(lo)],
        )?
        .try_get(0)
    })
}

/// Session ids starting with `prefix`.
pub(crate) fn sessions_starting_with(
    c: &mut Client,
    prefix: &str,
    limit: u32,
) -> std::result::Result<Vec<String>, postgres::Error> {
    let rs = off_runtime(|| {
        c.query(
        "SELECT DISTINCT session FROM entries WHERE substring(session from 1 for length($1::bytea)) = $1::bytea ORDER BY session LIMIT $2",
        &[&prefix.as_bytes(), &i64::from(limit)],
    )
    })?;
    rs.iter()
        .map(|r| {
            r.try_get::<_, Vec<u8>>(0)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        })
        .collect()
}

/// The newest entry's (seq, hash), outside any lock.
pub(crate) fn head(c: &mut Client) -> std::result::Result<Option<(i64, Vec<u8>)>, postgres::Error> {
    let r = off_runtime(|| {
        c.query_opt(
            "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1",
            &[],
        )
    })?;
    r.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
}

/// A payload and its signer's key, raw.
pub(crate) type PayloadSigner = (Vec<u8>, Vec<u8>);

/// The payloads (with signers) of every entry of `kind`, in seq order.
pub(crate) fn of_kind(
    c: &mut Client,
    kind: &str,
) -> std::result::Result<Vec<PayloadSigner>, postgres::Error> {
    let rs = off_runtime(|| {
        c.query(
            "SELECT payload, signer FROM entries WHERE kind = $1 ORDER BY seq",
            &[&kind.as_bytes()],
        )
    })?;
    rs.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// An append's transaction on PostgreSQL (every call off any async
/// runtime, [`off_runtime`]; `None` once committed).
pub(crate) struct PgTx<'a> {
    tx: Option<Transaction<'a>>,
    url: &'a PgUrl,
}

impl<'a> PgTx<'a> {
    /// Begin, and take the chain head's row lock: every other append
    /// waits here until this one commits or rolls back (a writer killed
    /// mid-transaction: the server rolls it back when its connection
    /// drops, and the lock goes with it).
    pub(crate) fn begin(c: &'a mut Client, url: &'a PgUrl, deferred: bool) -> Result<PgTx<'a>> {
        let tx = off_runtime(|| {
            let mut tx = c.transaction()?;
            if deferred {
                tx.batch_execute("SET LOCAL synchronous_commit = off")?;
            }
            tx.query_one(
                "SELECT id FROM retie_chain_head WHERE id = 1 FOR UPDATE",
                &[],
            )?;
            Ok::<_, postgres::Error>(tx)
        })
        .map_err(|e| url.err("locking the chain head", &e))?;
        Ok(PgTx { tx: Some(tx), url })
    }

    /// Run `f` on the open transaction, off any runtime; `what` names it
    /// in an error.
    fn on<T: Send>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Transaction<'a>) -> std::result::Result<T, postgres::Error> + Send,
    ) -> Result<T> {
        let url = self.url;
        let tx = self.tx.as_mut().ok_or_else(|| over(url, what))?;
        off_runtime(|| f(tx)).map_err(|e| url.err(what, &e))
    }
}

/// A call on a transaction already committed (never made: commit
/// consumes the transaction).
fn over(url: &PgUrl, what: &str) -> Error {
    bad(
        &url.shown,
        format!("{what}: the transaction is already over"),
    )
}

impl Drop for PgTx<'_> {
    fn drop(&mut self) {
        // An uncommitted transaction rolls back on drop, which blocks.
        if let Some(tx) = self.tx.take() {
            off_runtime(move || drop(tx));
        }
    }
}

impl crate::AppendTx for PgTx<'_> {
    fn last(&mut self) -> Result<Option<(i64, Vec<u8>)>> {
        self.on("reading the chain head", |tx| {
            tx.query_opt(
                "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1",
                &[],
            )?
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .transpose()
        })
    }

    fn newest_of(&mut self, session: &str, kind: &str) -> Result<Option<i64>> {
        self.on("checking the session", |tx| {
            tx.query_one(
                "SELECT max(seq) FROM entries WHERE session = $1 AND kind = $2",
                &[&session.as_bytes(), &kind.as_bytes()],
            )?
            .try_get(0)
        })
    }

    fn first_after(&mut self, session: &str, after: i64, kind: &str) -> Result<Option<i64>> {
        self.on("checking the session", |tx| {
            tx.query_one(
                "SELECT min(seq) FROM entries WHERE session = $1 AND seq > $2 AND kind = $3",
                &[&session.as_bytes(), &after, &kind.as_bytes()],
            )?
            .try_get(0)
        })
    }

    fn insert(&mut self, r: &Row) -> Result<()> {
        self.on("appending an entry", |tx| {
            tx.execute(
                &format!("INSERT INTO entries ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"),
                &[
                    &r.seq, &r.time_ms, &r.session, &r.actor, &r.kind, &r.payload, &r.prev,
                    &r.hash, &r.signer, &r.sig,
                ],
            )
            .map(|_| ())
        })
    }

    fn commit(mut self: Box<Self>) -> Result<()> {
        let url = self.url;
        match self.tx.take() {
            Some(tx) => {
                off_runtime(move || tx.commit()).map_err(|e| url.err("committing an append", &e))
            }
            None => Err(over(url, "committing an append")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_refused_and_never_shown() {
        for url in [
            "postgres://alice:s3cret@localhost/ledger",
            "postgres://alice@localhost/ledger?password=s3cret",
        ] {
            let e = PgUrl::parse(url).expect_err("a password in the URL");
            let msg = e.to_string();
            assert!(!msg.contains("s3cret"), "{msg}");
            assert!(msg.contains("PGPASSWORD"), "{msg}");
        }
    }

    #[test]
    fn a_remote_host_without_tls_is_refused_unless_said_plaintext() {
        let e = PgUrl::parse("postgres://alice@db.example.test/ledger").expect_err("remote");
        assert!(e.to_string().contains("without TLS"), "{e}");
        PgUrl::parse("postgres://alice@db.example.test/ledger?sslmode=disable").expect("said so");
        PgUrl::parse("postgres://alice@127.0.0.1:5433/ledger").expect("loopback");
        PgUrl::parse("postgres://alice@%2Ftmp%2Fpg/ledger").expect("socket");
        assert!(PgUrl::parse("postgres://alice@localhost/ledger?sslmode=require").is_err());
        assert!(
            PgUrl::parse("postgres://localhost/ledger").is_err(),
            "no user"
        );
    }
}
