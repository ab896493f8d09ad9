//! `retie __ledger`: hidden tools for tests and benchmarks (bulk appends,
//! deliberately bad entries, the append/verify benchmark).

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};
use retie_ledger::payload;
use serde_json::json;

use super::keys;
use super::{Actor, Error, Kind, Ledger, Result};

#[derive(Subcommand)]
pub enum DevCmd {
    /// Open a session and append COUNT agent entries to it.
    Append(AppendArgs),
    /// Durable appends/s (ledger vs bare SQLite) and verification entries/s.
    Bench(BenchArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Forge {
    /// One more entry signed by a key no delegation covers.
    RogueKey,
    /// The session's delegation expires before its entries are written.
    Expired,
    /// A sub-agent delegation that grants an effect its parent lacks.
    SubAgentEscalates,
}

#[derive(Args)]
pub struct AppendArgs {
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    #[arg(long, value_enum)]
    pub forge: Option<Forge>,
    /// synchronous=OFF (building large test ledgers only).
    #[arg(long)]
    pub fast: bool,
    /// Do not close the session nor write a checkpoint.
    #[arg(long)]
    pub no_checkpoint: bool,
    /// Also delegate from the session key to a sub-agent key, which then
    /// appends COUNT entries of its own.
    #[arg(long)]
    pub sub_agent: bool,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Durable appends per side.
    #[arg(long, default_value_t = 2000)]
    pub appends: u64,
    /// Entries in the ledger that is verified.
    #[arg(long, default_value_t = 100_000)]
    pub verify_entries: u64,
    /// Directory for the databases (default: a temp dir under /var/tmp).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub fn run(cmd: DevCmd) -> i32 {
    let r = match cmd {
        DevCmd::Append(a) => append(a),
        DevCmd::Bench(b) => bench(b),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            crate::ui::say_failure(&e);
            crate::error::EXIT_FAILED
        }
    }
}

fn append(a: AppendArgs) -> Result<()> {
    let user = keys::user_key()?;
    let path = super::resolve_path(a.ledger.as_deref())?;
    let mut l = Ledger::open(&path, true, Some(&user))?;
    if a.fast {
        l.unsafe_fast_for_tests()?;
    }
    let ttl = if a.forge == Some(Forge::Expired) {
        1
    } else {
        retie_dispatch::record::SESSION_TTL_MS
    };
    let s = open_session(
        &mut l,
        &user,
        "/dev/null",
        payload::SessionOpened {
            objective: Some("ledger test appends".into()),
            ..Default::default()
        },
        &["note"],
        ttl,
    )?;
    if a.forge == Some(Forge::Expired) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for i in 0..a.count {
        l.append(
            &s.id,
            Actor::Agent,
            Kind::Note,
            &payload::to_value(&payload::Note {
                n: Some(i),
                pid: Some(std::process::id()),
                ..Default::default()
            }),
            &s.key,
        )?;
    }
    if a.sub_agent || a.forge == Some(Forge::SubAgentEscalates) {
        let child = keys::generate()?;
        let effects: &[&str] = if a.forge == Some(Forge::SubAgentEscalates) {
            &["note", "exec"]
        } else {
            &["note"]
        };
        let d = super::keys::Delegation::issue(
            &s.key,
            &child.verifying_key(),
            &s.id,
            "/dev/null",
            effects,
            super::now_ms() + 3_600_000,
        );
        l.append(
            &s.id,
            Actor::Agent,
            Kind::Delegation,
            &payload::to_value(&payload::DelegationEntry {
                delegation: d,
                why: None,
                to: Some("sub-agent".into()),
            }),
            &s.key,
        )?;
        for i in 0..a.count {
            l.append(
                &s.id,
                Actor::Agent,
                Kind::Note,
                &payload::to_value(&payload::Note {
                    sub: Some(i),
                    pid: Some(std::process::id()),
                    ..Default::default()
                }),
                &child,
            )?;
        }
    }
    if a.forge == Some(Forge::RogueKey) {
        let rogue = keys::generate()?;
        l.append(
            &s.id,
            Actor::Agent,
            Kind::Note,
            &payload::to_value(&payload::Note {
                rogue: Some(true),
                ..Default::default()
            }),
            &rogue,
        )?;
    }
    if !a.no_checkpoint {
        l.append(
            &s.id,
            Actor::Person,
            Kind::SessionClosed,
            &retie_ledger::payload::to_value(&retie_ledger::payload::SessionClosed::default()),
            &user,
        )?;
        l.checkpoint(&user)?;
    }
    println!("{}", json!({"session": s.id}));
    Ok(())
}

fn bench(b: BenchArgs) -> Result<()> {
    let tmp = match &b.dir {
        Some(d) => tempfile::Builder::new()
            .prefix("retie-ledger-bench-")
            .tempdir_in(d),
        None => tempfile::Builder::new()
            .prefix("retie-ledger-bench-")
            .tempdir_in("/var/tmp"),
    }
    .map_err(|e| Error::io("creating the bench directory", e))?;
    let n = b.appends;
    // Bare: same columns, same row size, WAL + FULL, one IMMEDIATE
    // transaction per insert, no chaining, no signing.
    let bare_path = tmp.path().join("bare.db");
    let mut bare = rusqlite::Connection::open(&bare_path).map_err(|e| Error::Sqlite {
        path: bare_path.clone(),
        source: e,
    })?;
    let sq = |e| Error::Sqlite {
        path: bare_path.clone(),
        source: e,
    };
    bare.pragma_update(None, "journal_mode", "WAL")
        .map_err(sq)?;
    bare.pragma_update(None, "synchronous", "FULL")
        .map_err(sq)?;
    bare.execute_batch(
        "CREATE TABLE entries (seq INTEGER PRIMARY KEY, time_ms INTEGER NOT NULL, session TEXT NOT NULL, actor TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL, prev BLOB NOT NULL, hash BLOB NOT NULL, signer BLOB NOT NULL, sig BLOB NOT NULL)",
    )
    .map_err(sq)?;
    let payload = json!({"n": 0, "pid": 0}).to_string();
    let user = keys::generate()?;
    let lp = tmp.path().join("ledger.db");
    let mut l = Ledger::open(&lp, true, Some(&user))?;
    let s = open_session(
        &mut l,
        &user,
        "/dev/null",
        payload::SessionOpened::default(),
        &["note"],
        3_600_000,
    )?;
    // Interleaved rounds of 100, so both sides see the same disk weather.
    let (mut bare_s, mut ledger_s) = (0.0f64, 0.0f64);
    let mut i = 0u64;
    while i < n {
        let round = (n - i).min(100);
        let t = Instant::now();
        for j in i..i + round {
            let tx = bare
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sq)?;
            tx.prepare_cached("INSERT INTO entries (time_ms, session, actor, kind, payload, prev, hash, signer, sig) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
                .and_then(|mut s| {
                    s.execute(rusqlite::params![
                        j as i64,
                        "0123456789abcdef",
                        "agent",
                        "note",
                        payload,
                        &[0u8; 32][..],
                        &[1u8; 32][..],
                        &[2u8; 32][..],
                        &[3u8; 64][..]
                    ])
                })
                .map_err(sq)?;
            tx.commit().map_err(sq)?;
        }
        bare_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for j in i..i + round {
            l.append(
                &s.id,
                Actor::Agent,
                Kind::Note,
                &payload::to_value(&payload::Note {
                    n: Some(j),
                    pid: Some(0),
                    ..Default::default()
                }),
                &s.key,
            )?;
        }
        ledger_s += t.elapsed().as_secs_f64();
        i += round;
    }
    let bare_rate = n as f64 / bare_s;
    let ledger_rate = n as f64 / ledger_s;
    drop(bare);
    drop(l);

    // Verification: a large ledger built without fsync (it is the reading
    // that is measured), then verified with every signature.
    let vp = tmp.path().join("verify.db");
    let mut l = Ledger::open(&vp, true, Some(&user))?;
    l.unsafe_fast_for_tests()?;
    let s = open_session(
        &mut l,
        &user,
        "/dev/null",
        payload::SessionOpened::default(),
        &["note"],
        3_600_000,
    )?;
    let t = Instant::now();
    for i in 0..b.verify_entries {
        l.append(
            &s.id,
            Actor::Agent,
            Kind::Note,
            &payload::to_value(&payload::Note {
                n: Some(i),
                pid: Some(0),
                ..Default::default()
            }),
            &s.key,
        )?;
    }
    let build_s = t.elapsed().as_secs_f64();
    l.checkpoint(&user)?;
    drop(l);
    let t = Instant::now();
    let report = super::verify::verify(&vp)?;
    let vs = t.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "appends": n,
            "bare_appends_per_s": bare_rate.round(),
            "ledger_appends_per_s": ledger_rate.round(),
            "ratio": (ledger_rate / bare_rate * 1000.0).round() / 1000.0,
            "verify_entries": report.entries,
            "verify_s": (vs * 1000.0).round() / 1000.0,
            "verify_entries_per_s": (report.entries as f64 / vs).round(),
            "verify_verdict": report.verdict,
            "build_s": (build_s * 1000.0).round() / 1000.0,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        })
    );
    Ok(())
}

/// An open session of the test tools: its id and the key that signs for it.
struct Session {
    id: String,
    key: ed25519_dalek::SigningKey,
}

/// Open a session the way the chokepoint does (a key derived from the
/// user key, delegated for `effects`), in its own transaction.
fn open_session(
    ledger: &mut Ledger,
    user: &ed25519_dalek::SigningKey,
    workspace: &str,
    opened: payload::SessionOpened,
    effects: &[&str],
    ttl_ms: i64,
) -> Result<Session> {
    let id = retie_snapshot::new_id();
    let key = keys::session_key(user, &id);
    let d = keys::Delegation::issue(
        user,
        &key.verifying_key(),
        &id,
        workspace,
        effects,
        super::now_ms() + ttl_ms,
    );
    let opened = payload::SessionOpened {
        delegation: Some(d),
        ..opened
    };
    ledger.append(
        &id,
        Actor::Person,
        Kind::SessionOpened,
        &payload::to_value(&opened),
        user,
    )?;
    Ok(Session { id, key })
}
