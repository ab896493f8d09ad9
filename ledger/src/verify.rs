//! Verification from outside: recompute every hash, check the chain, every
//! signature (batched, on every core), every delegation and the newest
//! checkpoint. "Intact" and "complete" are separate verdicts.

use std::collections::HashMap;
use std::path::Path;

use ed25519_dalek::{Signature, VerifyingKey};
use rusqlite::{Connection, OpenFlags};
use serde::Serialize;

use super::keys::{parse_key, user_public, Delegation};
use super::{checkpoint_digest, hex, read_rows, Checkpoint, Error, Kind, Result, Row};

/// Exit codes of `retie verify`.
pub const EXIT_INTACT: i32 = 0;
pub const EXIT_TAMPERED: i32 = 1;
pub const EXIT_INCOMPLETE: i32 = 2;

/// One thing wrong.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// The entry (seq) it concerns; `None` for a checkpoint or the file.
    pub seq: Option<i64>,
    pub what: String,
}

/// The result of a verification.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub ledger: String,
    pub entries: u64,
    pub sessions: u64,
    pub intact: bool,
    /// `None` when there is no checkpoint to compare with.
    pub complete: Option<bool>,
    pub verdict: &'static str,
    pub first_bad: Option<Problem>,
    pub problems: Vec<Problem>,
    pub incomplete_because: Option<String>,
    pub checkpoint: Option<CheckpointSeen>,
    pub user_key: Option<String>,
    pub user_key_source: &'static str,
    pub head: Option<String>,
    pub verify_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointSeen {
    pub count: u64,
    pub head: String,
    pub line: usize,
}

impl Report {
    pub fn exit_code(&self) -> i32 {
        if !self.intact {
            EXIT_TAMPERED
        } else if self.complete == Some(false) {
            EXIT_INCOMPLETE
        } else {
            EXIT_INTACT
        }
    }
}

/// A delegation accepted so far, by key.
struct Granted {
    d: Delegation,
    /// The root-to-leaf chain's tightest expiry.
    not_after_ms: i64,
}

/// Verify the ledger at `path` (which must exist).
pub fn verify(path: &Path) -> Result<Report> {
    verify_with(path, user_public())
}

/// [`verify`] with the user key given (tests: no key file is read).
pub(crate) fn verify_with(path: &Path, user_key: Option<VerifyingKey>) -> Result<Report> {
    let t0 = std::time::Instant::now();
    let mut problems: Vec<Problem> = Vec::new();
    let rows = if crate::pg::is_url(path) {
        // The same verifier, rows read from the server (its own storage
        // checks are its business: an unreadable server is an error with
        // its cause, never a verdict).
        let url = path
            .to_str()
            .ok_or_else(|| Error::Invalid("the ledger URL is not UTF-8".into()))?;
        let url = crate::pg::PgUrl::parse(url)?;
        let mut c = url.connect()?;
        crate::pg::read_rows(&mut c).map_err(|e| url.err("reading the entries", &e))?
    } else {
        read_sqlite(path, &mut problems)?
    };
    verify_rows(path, rows, problems, user_key, t0)
}

/// Read an SQLite ledger's rows for [`verify_with`]; damage SQLite finds
/// is a problem, a machine that cannot read is an error.
fn read_sqlite(path: &Path, problems: &mut Vec<Problem>) -> Result<Vec<Row>> {
    if !path.exists() {
        return Err(Error::Missing(path.to_path_buf()));
    }
    let read = open_ro(path).and_then(|c| Ok((read_rows(&c)?, quick_check(&c)?)));
    Ok(match read {
        Ok((r, damage)) => {
            // A damaged page the entries' own pages do not use (an index)
            // still means the file was changed outside SQLite: retie's
            // writes then fail, and `intact` would be a lie.
            if let Some(d) = damage {
                problems.push(Problem {
                    seq: None,
                    what: format!("the database file is damaged (SQLite's quick_check: {d})"),
                });
            }
            r
        }
        // The machine, not the ledger: a full disk, an I/O error, no
        // permission, a lock held too long. Nothing was read, so nothing
        // is judged: an error that names the cause, never "tampered".
        Err(e) if cannot_read(&e) => {
            return Err(Error::Sqlite {
                path: path.to_path_buf(),
                source: e,
            })
        }
        Err(e) => {
            problems.push(Problem {
                seq: None,
                what: format!("the database cannot be read as a ledger: {e}"),
            });
            Vec::new()
        }
    })
}

/// The one verifier, whichever store the rows came from.
fn verify_rows(
    path: &Path,
    rows: Vec<Row>,
    mut problems: Vec<Problem>,
    user_key: Option<VerifyingKey>,
    t0: std::time::Instant,
) -> Result<Report> {
    // Whose ledger: the user key in the config directory, else the one the
    // first entry names.
    let genesis_key = rows
        .first()
        .filter(|r| r.kind == Kind::LedgerOpened.as_bytes())
        .and_then(|r| {
            crate::payload::parse::<crate::payload::LedgerOpened>(&r.payload_json())
                .ok()
                .and_then(|g| parse_key(&g.user_key))
        });
    // Other machines' keys the owner admitted to a shared ledger: `member`
    // entries that claim the genesis key as signer (each one's signature
    // is checked with every other below).
    // (key, the index of the row that admitted it)
    let admitted: Vec<(VerifyingKey, usize)> = genesis_key
        .map(|g| {
            rows.iter()
                .enumerate()
                .filter(|(_, r)| r.kind == Kind::Member.as_bytes() && r.signer == g.as_bytes())
                .filter_map(|(i, r)| {
                    crate::payload::parse::<crate::payload::Member>(&r.payload_json())
                        .ok()
                        .and_then(|m| parse_key(&m.key))
                        .map(|k| (k, i))
                })
                .collect()
        })
        .unwrap_or_default();
    let members: Vec<VerifyingKey> = admitted.iter().map(|(k, _)| *k).collect();
    // This machine's key, when it is an admitted member, anchors on the
    // owner's (genesis) key.
    let user_key = match (user_key, genesis_key) {
        (Some(u), Some(g)) if u != g && members.contains(&u) => Some(g),
        (u, _) => u,
    };
    let (user, source) = match user_key {
        Some(k) => (Some(k), "config"),
        None => (genesis_key, "ledger"),
    };
    if let (Some(u), Some(g)) = (user, genesis_key) {
        if u != g {
            problems.push(Problem {
                seq: rows.first().map(|r| r.seq),
                what: format!(
                    "the ledger was opened by key {} but the user key is {}",
                    hex(g.as_bytes()),
                    hex(u.as_bytes())
                ),
            });
        }
    }
    if user.is_none() && !rows.is_empty() {
        problems.push(Problem {
            seq: rows.first().map(|r| r.seq),
            what: "no user key in the config directory and no ledger_opened entry naming one"
                .into(),
        });
    }
    let mut granted: HashMap<[u8; 32], Granted> = HashMap::new();
    let mut key_cache: HashMap<[u8; 32], Option<(VerifyingKey, bool)>> = HashMap::new();
    let mut sessions = 0u64;
    let mut to_check: Vec<(usize, VerifyingKey)> = Vec::with_capacity(rows.len());
    let mut prev_hash: Vec<u8> = vec![0; 32];
    let mut expected: i64 = 1;
    for (i, r) in rows.iter().enumerate() {
        let bad = |what: String| Problem {
            seq: Some(r.seq),
            what,
        };
        if r.seq != expected {
            problems.push(bad(if r.seq > expected {
                format!(
                    "entries {expected}..{} are missing (the sequence jumps to {})",
                    r.seq - 1,
                    r.seq
                )
            } else {
                format!(
                    "sequence number {} out of order (expected {expected})",
                    r.seq
                )
            }));
        }
        expected = r.seq.saturating_add(1);
        if r.prev != prev_hash {
            problems.push(bad(
                "its previous-hash does not match the entry before it (an entry was removed, inserted or reordered)".into(),
            ));
        }
        prev_hash = r.hash.clone();
        if r.recompute()[..] != r.hash[..] {
            problems.push(bad(
                "its hash does not match its contents (time, session, actor, kind or payload edited)".into(),
            ));
        }
        let signer: Option<[u8; 32]> = r.signer.clone().try_into().ok();
        // Decompressing a key and checking its order cost more than the
        // rest of the row: once per key.
        let parsed = signer.map(|b| {
            *key_cache
                .entry(b)
                .or_insert_with(|| VerifyingKey::from_bytes(&b).ok().map(|k| (k, k.is_weak())))
        });
        let (signer_bytes, signer_key) = match (signer, parsed) {
            (Some(b), Some(Some((k, false)))) => (b, k),
            (Some(_), Some(Some((_, true)))) => {
                problems.push(bad("signed by a weak (small-order) key".into()));
                continue;
            }
            _ => {
                problems.push(bad("its signer key is malformed".into()));
                continue;
            }
        };
        // A member's entries count as a person's only after its admission.
        let is_member = admitted.iter().any(|(k, at)| *k == signer_key && *at < i);
        let is_user = user.is_some_and(|u| u == signer_key) || is_member;
        let k = r.kind_str();
        if k == Kind::Member && user.is_some_and(|u| u != signer_key) {
            problems.push(bad(
                "a member entry signed by a key other than the ledger's owner (admits nothing)"
                    .into(),
            ));
        }
        if !is_user {
            match granted.get(&signer_bytes) {
                None => problems.push(bad(format!(
                    "signed by key {} that no delegation covers",
                    hex(&signer_bytes)
                ))),
                Some(g) => {
                    if g.d.session != r.session_str() {
                        problems.push(bad(format!(
                            "written for session {} by a key delegated only for session {}",
                            r.session_str(),
                            g.d.session
                        )));
                    }
                    if r.time_ms > g.not_after_ms {
                        problems.push(bad(format!(
                            "written at {} ms, after its delegation expired at {} ms",
                            r.time_ms, g.not_after_ms
                        )));
                    }
                    // A delegated key signs for the agent and for the gate's
                    // decisions in its session; never for the person.
                    if r.actor != b"agent" && r.actor != b"policy" {
                        problems.push(bad(format!(
                            "actor {} signed by an agent key",
                            r.actor_str()
                        )));
                    }
                    if k == Kind::Intent {
                        // Effect names are the policy crate's (`writes_workspace`,
                        // `runs_sandboxed`, ...); older intents carry one `effect`.
                        // An ill-typed intent is reported below; it claims
                        // no effect it could be held to ("?").
                        let effects: Vec<String> = match crate::payload::parse::<
                            crate::payload::Intent,
                        >(&r.payload_json())
                        {
                            Ok(i) if i.call.effects.is_some() || i.effect.is_some() => i.effects(),
                            Ok(_) => vec![String::new()],
                            Err(_) => vec!["?".into()],
                        };
                        for effect in effects {
                            if !g.d.effects.contains(&effect) {
                                problems.push(bad(format!(
                                    "effect {effect:?} is outside its delegation ({})",
                                    g.d.effects.join(", ")
                                )));
                            }
                        }
                    }
                }
            }
        }
        if k == Kind::SessionOpened {
            sessions += 1;
        }
        if k == Kind::SessionOpened || k == Kind::Delegation {
            let p = r.payload_json();
            let delegation = if k == Kind::SessionOpened {
                crate::payload::parse::<crate::payload::SessionOpened>(&p)
                    .map(|o| o.delegation)
                    .transpose()
            } else {
                Some(
                    crate::payload::parse::<crate::payload::DelegationEntry>(&p)
                        .map(|e| e.delegation),
                )
            };
            match delegation {
                Some(Ok(d)) => match accept(&d, &signer_bytes, is_user, &granted) {
                    Ok(exp) => {
                        if d.session != r.session_str() {
                            problems.push(bad(
                                "its delegation names another session than the entry".into(),
                            ));
                        }
                        if let Some(kb) = parse_key(&d.key).map(|k| k.to_bytes()) {
                            granted.insert(
                                kb,
                                Granted {
                                    d,
                                    not_after_ms: exp,
                                },
                            );
                        }
                    }
                    Err(why) => problems.push(bad(format!("its delegation is invalid: {why}"))),
                },
                Some(Err(e)) => problems.push(bad(format!("its delegation is malformed: {e}"))),
                None if k == Kind::Delegation => {
                    problems.push(bad("a delegation entry without a delegation".into()))
                }
                None => {}
            }
        }
        to_check.push((i, signer_key));
    }
    problems.extend(check_approvals(&rows));
    // Each payload against its kind (issue 27 item 3).
    for r in &rows {
        if let Some(k) = Kind::parse(&r.kind) {
            if let Err(why) = crate::payload::check(k, &r.payload) {
                problems.push(Problem {
                    seq: Some(r.seq),
                    what: format!(
                        "ill-typed payload at #{} (a {} entry): {why}",
                        r.seq,
                        k.as_str()
                    ),
                });
            }
        }
    }
    for p in check_signatures(&rows, &to_check) {
        problems.push(p);
    }
    // Checkpoints.
    let signers: Vec<VerifyingKey> = user.into_iter().chain(members.iter().copied()).collect();
    let (newest, mut cp_problems) = read_checkpoints(path, &signers);
    problems.append(&mut cp_problems);
    let n = rows.len() as u64;
    let mut complete = None;
    let mut incomplete_because = None;
    if let Some(cp) = &newest {
        if cp.count > n {
            complete = Some(false);
            incomplete_because = Some(format!(
                "the newest checkpoint (line {}) counts {} entries but the ledger holds {n}: its tail was cut off",
                cp.line, cp.count
            ));
        } else {
            complete = Some(true);
            if cp.count > 0 {
                let at = rows.get(cp.count as usize - 1);
                if at.map(|r| hex(&r.hash)) != Some(cp.head.clone()) {
                    problems.push(Problem {
                        seq: at.map(|r| r.seq),
                        what: format!(
                            "the chain diverges from the checkpoint (line {}) at entry {}: its head there was {}",
                            cp.line, cp.count, cp.head
                        ),
                    });
                }
            }
        }
    }
    // What an earlier verification of this ledger saw: a checkpoint that
    // lives where the writer does not write.
    let seen = read_seen(path);
    if let Some(sn) = &seen {
        if sn.count > n {
            complete = Some(false);
            incomplete_because.get_or_insert_with(|| {
                format!(
                    "an earlier verification saw {} entries but the ledger holds {n}: its tail was cut off",
                    sn.count
                )
            });
        } else if sn.count > 0 {
            complete.get_or_insert(true);
            let at = rows.get(sn.count as usize - 1);
            if at.map(|r| hex(&r.hash)) != Some(sn.head.clone()) {
                problems.push(Problem {
                    seq: at.map(|r| r.seq),
                    what: format!(
                        "the chain diverges at entry {} from the head an earlier verification saw ({})",
                        sn.count, sn.head
                    ),
                });
            }
        }
    }
    problems.sort_by_key(|p| p.seq.unwrap_or(i64::MAX));
    let intact = problems.is_empty();
    let first_bad = problems.first().cloned();
    let verdict = if !intact {
        "tampered"
    } else if complete == Some(false) {
        "incomplete"
    } else {
        "intact"
    };
    if problems.is_empty() && complete != Some(false) && n > 0 {
        if let Some(last) = rows.last() {
            write_seen(path, n, &hex(&last.hash));
        }
    }
    Ok(Report {
        ledger: path.display().to_string(),
        entries: n,
        sessions,
        intact,
        complete,
        verdict,
        first_bad,
        problems,
        incomplete_because,
        checkpoint: newest.map(|c| CheckpointSeen {
            count: c.count,
            head: c.head,
            line: c.line,
        }),
        user_key: user.map(|u| hex(u.as_bytes())),
        user_key_source: source,
        head: rows.last().map(|r| hex(&r.hash)),
        verify_ms: t0.elapsed().as_secs_f64() * 1000.0,
    })
}

/// Pending approvals and their decisions (ADR 0502): a decision names a
/// pending entry of its own session, earlier; one decision per pending
/// entry; an approval binds the pending entry's digest, and an intent
/// that names a pending entry ran exactly that digest.
fn check_approvals(rows: &[Row]) -> Vec<Problem> {
    let mut out = Vec::new();
    // pending seq -> (session, digest, decided)
    let mut pending: HashMap<i64, (Vec<u8>, String, bool)> = HashMap::new();
    for r in rows {
        let k = Kind::parse(&r.kind);
        if !matches!(
            k,
            Some(Kind::Pending) | Some(Kind::Decision) | Some(Kind::Intent)
        ) {
            continue;
        }
        let p = r.payload_json();
        let bad = |what: String| Problem {
            seq: Some(r.seq),
            what,
        };
        if k == Some(Kind::Pending) {
            let digest = p
                .get("digest")
                .and_then(|d| d.as_str())
                .unwrap_or("")
                .to_string();
            pending.insert(r.seq, (r.session.clone(), digest, false));
            continue;
        }
        let Some(target) = p.get("pending").and_then(|v| v.as_i64()) else {
            continue;
        };
        let Some(entry) = pending.get_mut(&target) else {
            out.push(bad(format!(
                "it names pending approval {target}, which is not an earlier pending entry"
            )));
            continue;
        };
        if entry.0 != r.session {
            out.push(bad(format!(
                "it names pending approval {target} of another session"
            )));
            continue;
        }
        if k == Some(Kind::Decision) {
            if entry.2 {
                out.push(bad(format!(
                    "a second decision for pending approval {target}"
                )));
            }
            entry.2 = true;
            if let Some(d) = p.get("approved_digest").and_then(|d| d.as_str()) {
                if d != entry.1 {
                    out.push(bad(format!(
                        "it approves digest {d}, but pending approval {target} showed {}",
                        entry.1
                    )));
                }
            }
        } else if let Some(d) = p.get("digest").and_then(|d| d.as_str()) {
            if !entry.2 {
                out.push(bad(format!(
                    "it runs pending approval {target}, which no decision answered"
                )));
            }
            if d != entry.1 {
                out.push(bad(format!(
                    "it runs digest {d}, but pending approval {target} was for {}",
                    entry.1
                )));
            }
        }
    }
    out
}

/// An SQLite error that says the ledger could not be read here and now,
/// as opposed to one that says what was read is not a ledger.
fn cannot_read(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    matches!(
        e.sqlite_error_code(),
        Some(
            C::SystemIoFailure
                | C::DiskFull
                | C::CannotOpen
                | C::PermissionDenied
                | C::ReadOnly
                | C::DatabaseBusy
                | C::DatabaseLocked
                | C::OutOfMemory
        )
    )
}

/// SQLite's own check of every page (b-trees of the table and its
/// index): `None` when it says "ok", else what it found (the first lines).
fn quick_check(c: &Connection) -> rusqlite::Result<Option<String>> {
    let mut st = c.prepare("PRAGMA quick_check(5)")?;
    let lines: Vec<String> = st
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(match lines.as_slice() {
        [ok] if ok == "ok" => None,
        _ => Some(lines.join("; ")),
    })
}

fn open_ro(path: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(std::time::Duration::from_secs(60))?;
    Ok(c)
}

/// Is `d` a valid delegation written by `signer`? Returns its effective
/// expiry (the tightest along its chain).
fn accept(
    d: &Delegation,
    signer: &[u8; 32],
    signer_is_user: bool,
    granted: &HashMap<[u8; 32], Granted>,
) -> std::result::Result<i64, String> {
    if hex(signer) != d.parent {
        return Err("its parent is not the key that wrote the entry".into());
    }
    d.check_signature()?;
    if parse_key(&d.key).is_none() {
        return Err("its key is malformed".into());
    }
    if signer_is_user {
        return Ok(d.not_after_ms);
    }
    let Some(parent) = granted.get(signer) else {
        return Err("its parent key has no delegation itself".into());
    };
    if let Some(e) = d.effects.iter().find(|e| !parent.d.effects.contains(e)) {
        return Err(format!(
            "it grants effect {e:?} that its parent does not hold"
        ));
    }
    if d.workspace != parent.d.workspace {
        return Err("it names another workspace than its parent".into());
    }
    Ok(d.not_after_ms.min(parent.not_after_ms))
}

/// Every signature: batches on every core; a failing batch is re-checked
/// one by one (strictly) to name the entry.
fn check_signatures(rows: &[Row], items: &[(usize, VerifyingKey)]) -> Vec<Problem> {
    const CHUNK: usize = 256;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8);
    let per = items.len().div_ceil(threads).max(CHUNK);
    let check_part = |part: &[(usize, VerifyingKey)]| -> Vec<Problem> {
        let mut out = Vec::new();
        for chunk in part.chunks(CHUNK) {
            let mut msgs: Vec<&[u8]> = Vec::with_capacity(chunk.len());
            let mut sigs = Vec::with_capacity(chunk.len());
            let mut keys = Vec::with_capacity(chunk.len());
            let mut malformed = false;
            for (i, k) in chunk {
                let r = &rows[*i];
                match <[u8; 64]>::try_from(r.sig.as_slice()) {
                    Ok(s) => {
                        msgs.push(&r.hash);
                        sigs.push(Signature::from_bytes(&s));
                        keys.push(*k);
                    }
                    Err(_) => malformed = true,
                }
            }
            if !malformed && ed25519_dalek::verify_batch(&msgs, &sigs, &keys).is_ok() {
                continue;
            }
            for (i, k) in chunk {
                let r = &rows[*i];
                let ok = <[u8; 64]>::try_from(r.sig.as_slice())
                    .ok()
                    .map(|s| k.verify_strict(&r.hash, &Signature::from_bytes(&s)).is_ok())
                    .unwrap_or(false);
                if !ok {
                    out.push(Problem {
                        seq: Some(r.seq),
                        what: format!(
                            "its signature does not verify under key {}",
                            hex(k.as_bytes())
                        ),
                    });
                }
            }
        }
        out
    };
    if items.len() <= CHUNK * 2 || threads == 1 {
        return check_part(items);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(per)
            .map(|part| s.spawn(move || check_part(part)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join().unwrap_or_else(|_| {
                    vec![Problem {
                        seq: None,
                        what: "a verification thread panicked".into(),
                    }]
                })
            })
            .collect()
    })
}

pub struct NewestCheckpoint {
    pub count: u64,
    pub head: String,
    pub line: usize,
}

/// The newest valid checkpoint, and every problem with the checkpoint
/// files: the one next to the ledger and, when the user names one in
/// `RETIE_CHECKPOINT_COPY`, its copy (kept somewhere the writer of the
/// ledger cannot reach, it survives a rewrite of both files beside it).
fn read_checkpoints(
    ledger: &Path,
    user: &[VerifyingKey],
) -> (Option<NewestCheckpoint>, Vec<Problem>) {
    let mut newest: Option<NewestCheckpoint> = None;
    let mut problems = Vec::new();
    let mut files = vec![super::checkpoint_path(ledger)];
    files.extend(super::checkpoint_copy_path());
    for p in files {
        read_checkpoint_file(&p, user, &mut newest, &mut problems);
    }
    (newest, problems)
}

fn read_checkpoint_file(
    p: &Path,
    user: &[VerifyingKey],
    newest: &mut Option<NewestCheckpoint>,
    problems: &mut Vec<Problem>,
) {
    let text = match std::fs::read(p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            problems.push(Problem {
                seq: None,
                what: format!("the checkpoint file {} cannot be read: {e}", p.display()),
            });
            return;
        }
    };
    for (i, line) in String::from_utf8_lossy(&text).lines().enumerate() {
        let ln = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut bad = |what: String| {
            problems.push(Problem {
                seq: None,
                what: format!("{} line {ln}: {what}", p.display()),
            })
        };
        let cp: Checkpoint = match serde_json::from_str(line) {
            Ok(c) => c,
            Err(e) => {
                bad(format!("malformed ({e})"));
                continue;
            }
        };
        if user.is_empty() {
            bad("no user key to check it against".into());
            continue;
        }
        // The owner's key, or another machine's key the owner admitted.
        let Some(u) = user.iter().find(|u| cp.key == hex(u.as_bytes())) else {
            bad(format!(
                "signed by key {} which is not the user key (forged)",
                cp.key
            ));
            continue;
        };
        let head = super::unhex(&cp.head).unwrap_or_default();
        let sig = super::unhex(&cp.sig).and_then(|b| <[u8; 64]>::try_from(b).ok());
        let ok = sig.is_some_and(|s| {
            u.verify_strict(
                &checkpoint_digest(cp.count, &head),
                &Signature::from_bytes(&s),
            )
            .is_ok()
        });
        if !ok {
            bad(format!(
                "its signature does not verify (forged checkpoint of {} entries)",
                cp.count
            ));
            continue;
        }
        let newer = match &*newest {
            None => true,
            Some(n) => cp.count >= n.count,
        };
        if newer {
            *newest = Some(NewestCheckpoint {
                count: cp.count,
                head: cp.head,
                line: ln,
            });
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Seen {
    count: u64,
    head: String,
}

/// `STATE/retie/verified/HASH.json`, HASH of the ledger's absolute path.
fn seen_path(ledger: &Path) -> Option<std::path::PathBuf> {
    use sha2::Digest;
    let abs = if crate::pg::is_url(ledger) {
        ledger.to_path_buf()
    } else {
        std::fs::canonicalize(ledger).ok()?
    };
    let h = sha2::Sha256::digest(abs.as_os_str().as_encoded_bytes());
    let base = super::xdg_base("XDG_STATE_HOME", ".local/state")?;
    Some(
        base.join("retie")
            .join("verified")
            .join(format!("{}.json", &hex(&h)[..32])),
    )
}

fn read_seen(ledger: &Path) -> Option<Seen> {
    let text = std::fs::read(seen_path(ledger)?).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Remember the head of an intact, complete ledger (best effort: a
/// verifier that cannot write its memory still verifies).
fn write_seen(ledger: &Path, count: u64, head: &str) {
    let Some(p) = seen_path(ledger) else { return };
    if read_seen(ledger).is_some_and(|s| s.count >= count) {
        return;
    }
    // What is remembered must be on disk: a deferred outcome a power cut
    // takes back would otherwise read as a cut-off tail next time.
    if super::sync_wal(ledger).is_err() {
        return;
    }
    let Some(dir) = p.parent() else { return };
    if super::mkdir_private(dir).is_err() {
        return;
    }
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    let body = serde_json::json!({"count": count, "head": head}).to_string();
    if std::fs::write(&tmp, body).is_ok() && std::fs::rename(&tmp, &p).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::cannot_read;
    use rusqlite::ffi;

    fn err(code: std::os::raw::c_int) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), None)
    }

    /// What the machine could not do (a full disk, an I/O error, no
    /// permission, a lock) is an error with its cause; what was read and
    /// is not a ledger is judged (tampered).
    #[test]
    fn the_machine_failing_is_told_apart_from_a_damaged_ledger() {
        for code in [
            ffi::SQLITE_IOERR,
            ffi::SQLITE_FULL,
            ffi::SQLITE_CANTOPEN,
            ffi::SQLITE_PERM,
            ffi::SQLITE_BUSY,
        ] {
            assert!(cannot_read(&err(code)), "{code}");
        }
        for code in [ffi::SQLITE_CORRUPT, ffi::SQLITE_NOTADB, ffi::SQLITE_ERROR] {
            assert!(!cannot_read(&err(code)), "{code}");
        }
    }
}
