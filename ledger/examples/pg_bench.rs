//! The ledger on SQLite and on PostgreSQL side by side (issue 32 item 5),
//! run by tests/bench/ledger_pg.py: durable appends per second (the same
//! append path, chain, SHA-256 and ed25519 signature; SQLite WAL with
//! synchronous=FULL, PostgreSQL with its default synchronous_commit=on;
//! interleaved rounds of 100 so both see the same machine weather), then
//! `verify` of an N-entry ledger on each (built without sync: the reading
//! is what is measured). One JSON object on stdout.
//!
//!     cargo run --release -p retie-ledger --example pg_bench -- \
//!         --postgres URL --verify-url URL [--appends N] [--verify N] --dir DIR

use std::path::{Path, PathBuf};
use std::time::Instant;

use ed25519_dalek::SigningKey;
use retie_ledger::{keys, verify, Actor, Kind, Ledger};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn note(l: &mut Ledger, user: &SigningKey, j: u64) -> retie_ledger::Result<()> {
    l.append(
        "0123456789abcdef",
        Actor::Person,
        Kind::Note,
        &serde_json::json!({"n": j, "pid": 0}),
        user,
    )
    .map(|_| ())
}

fn build(path: &Path, user: &SigningKey, n: u64) -> retie_ledger::Result<(f64, verify::Report)> {
    let mut l = Ledger::open(path, true, Some(user))?;
    l.unsafe_fast_for_tests()?;
    l.append_batch(|_| {
        (0..n)
            .map(|j| retie_ledger::NewEntry {
                session: "0123456789abcdef".into(),
                actor: Actor::Person,
                kind: Kind::Note,
                payload: serde_json::json!({"n": j, "pid": 0}),
                key: user.clone(),
            })
            .collect()
    })?;
    l.checkpoint(user)?;
    drop(l);
    let t = Instant::now();
    let r = verify::verify(path)?;
    Ok((t.elapsed().as_secs_f64(), r))
}

fn main() -> retie_ledger::Result<()> {
    let pg = PathBuf::from(arg("--postgres").expect("--postgres URL"));
    let pg_verify = PathBuf::from(arg("--verify-url").expect("--verify-url URL"));
    let dir = PathBuf::from(arg("--dir").expect("--dir DIR"));
    let n: u64 = arg("--appends")
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let nv: u64 = arg("--verify")
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let user = keys::generate()?;
    let mut sq = Ledger::open(&dir.join("ledger.db"), true, Some(&user))?;
    let mut pq = Ledger::open(&pg, true, Some(&user))?;
    let (mut sq_s, mut pg_s) = (0.0f64, 0.0f64);
    let mut i = 0;
    while i < n {
        let round = (n - i).min(100);
        let t = Instant::now();
        for j in i..i + round {
            note(&mut sq, &user, j)?;
        }
        sq_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        for j in i..i + round {
            note(&mut pq, &user, j)?;
        }
        pg_s += t.elapsed().as_secs_f64();
        i += round;
    }
    drop((sq, pq));
    let (sv, sr) = build(&dir.join("verify.db"), &user, nv)?;
    let (pv, pr) = build(&pg_verify, &user, nv)?;
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    println!(
        "{}",
        serde_json::json!({
            "appends": n,
            "sqlite_appends_per_s": (n as f64 / sq_s).round(),
            "postgres_appends_per_s": (n as f64 / pg_s).round(),
            "verify_entries": sr.entries,
            "sqlite_verify_s": r(sv),
            "postgres_verify_s": r(pv),
            "sqlite_verify_entries_per_s": (sr.entries as f64 / sv).round(),
            "postgres_verify_entries_per_s": (pr.entries as f64 / pv).round(),
            "sqlite_verdict": sr.verdict,
            "postgres_verdict": pr.verdict,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        })
    );
    Ok(())
}
