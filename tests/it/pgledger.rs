//! The shared PostgreSQL ledger through the real binary (issue 32, ADR
//! 0460): `[ledger] url` and `--ledger postgres://...` record and verify
//! like the file; a server that is not there, or a password in the URL,
//! is a clear error and nothing runs; a pending approval on machine A is
//! listed and approved on machine B and carried out once on A; a key the
//! owner never admitted cannot decide; `retie ledger copy` moves a local
//! ledger into a shared one with its chain intact.
//!
//! Each test starts a throwaway cluster (ledger/tests/pgcluster: a unix
//! socket only, the server as uid 65534 when the tests run as root) and
//! runs both legs against it.

#[path = "../../ledger/tests/pgcluster/mod.rs"]
mod pgcluster;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use crate::harness::*;

fn retie(s: &Scratch, args: &[&str]) -> Output {
    s.retie()
        .args(args)
        .env_remove("RETIE_LEDGER")
        .env_remove("PGPASSWORD")
        .stdin(Stdio::null())
        .output()
        .expect("retie")
}

/// This "machine" keeps its ledger at `url` (`[ledger] url`).
fn use_shared(s: &Scratch, url: &str) {
    s.write_config(&format!("[ledger]\nurl = \"{url}\"\n"));
}

fn json_of(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", stdout(o), stderr(o)))
}

fn verify_intact(s: &Scratch, ctx: &str) -> serde_json::Value {
    let o = retie(s, &["verify", "--json"]);
    assert_code(&o, 0, &format!("verify ({ctx})"));
    let v = json_of(&o);
    assert_eq!(v["verdict"], "intact", "{ctx}: {v}");
    v
}

/// `[ledger] url`: a sandboxed command is recorded in the PostgreSQL
/// ledger (no SQLite file is made) and verifies; the same ledger named by
/// `--ledger` verifies too.
#[test]
fn a_shared_ledger_records_sandboxed_commands_and_verifies() {
    let cluster = pgcluster::Cluster::start();
    for (i, leg) in legs().into_iter().enumerate() {
        let url = cluster.database(&format!("rec{i}"));
        let s = Scratch::new(leg);
        use_shared(&s, &url);
        let o = s
            .retie()
            .env_remove("RETIE_LEDGER")
            .args(["sandbox", "exec", "-w"])
            .arg(&s.ws)
            .args(["--", "sh", "-c", "echo hi > f.txt"])
            .stdin(Stdio::null())
            .output()
            .expect("exec");
        assert_code(&o, 0, "exec recorded in postgres");
        assert!(
            s.ws.join("f.txt").exists(),
            "{leg:?}: the command did not run"
        );
        assert!(
            !s.home.join(".local/state/retie/ledger.db").exists(),
            "{leg:?}: an SQLite ledger was made beside the shared one"
        );
        let v = verify_intact(&s, "config url");
        assert!(v["entries"].as_u64().unwrap_or(0) >= 3, "{v}");
        let kinds: Vec<String> = cluster
            .superuser(&format!("rec{i}"))
            .query(
                "SELECT convert_from(kind, 'UTF8') FROM entries ORDER BY seq",
                &[],
            )
            .expect("kinds")
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        assert!(
            kinds.iter().any(|k| k == "intent") && kinds.iter().any(|k| k == "outcome"),
            "{leg:?}: {kinds:?}"
        );
        let o = retie(&s, &["verify", "--json", "--ledger", &url]);
        assert_code(&o, 0, "verify --ledger URL");
    }
}

/// The server down, or a password in the URL: a clear error naming the
/// URL (never the password) and the fix; the command never runs. (Seen
/// failing with the password check removed: the command ran.)
#[test]
fn a_server_down_or_a_password_in_the_url_runs_nothing() {
    let cluster = pgcluster::Cluster::start();
    let dead = cluster.dead_url();
    // A real database (trust authentication would let it in): only the
    // refusal stops it.
    let with_password = cluster.database("pw").replace("retie@", "retie:hunter2@");
    for leg in legs() {
        let s = Scratch::new(leg);
        for (url, needle) in [
            (dead.as_str(), "cannot reach"),
            (with_password.as_str(), "the URL carries a password"),
        ] {
            let o = s
                .retie()
                .env_remove("RETIE_LEDGER")
                .args(["sandbox", "exec", "--ledger", url, "-w"])
                .arg(&s.ws)
                .args(["--", "sh", "-c", "echo ran > ran.txt"])
                .stdin(Stdio::null())
                .output()
                .expect("exec");
            assert_ne!(o.status.code(), Some(0), "{leg:?}: {url} accepted");
            let err = stderr(&o);
            assert!(err.contains(needle), "{leg:?}: {err}");
            assert!(
                !err.contains("hunter2"),
                "{leg:?}: the password shown: {err}"
            );
            assert!(
                err.contains(&pg_shown(url)),
                "{leg:?}: the URL is not named: {err}"
            );
            assert!(
                !s.ws.join("ran.txt").exists(),
                "{leg:?}: the command ran unrecorded"
            );
            let o = retie(&s, &["verify", "--ledger", url]);
            assert_ne!(o.status.code(), Some(0));
            assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
        }
    }
}

/// The URL as retie shows it (the password masked).
fn pg_shown(url: &str) -> String {
    url.replace(":hunter2@", ":***@")
}

/// A script-provider session in `a` that asks to run `command` under
/// manual autonomy and suspends (exit 5): its id, the pending
/// action's digest and the script (for the resume).
fn suspend_at_append(a: &Scratch, command: &str) -> (String, String, PathBuf) {
    let sc = script(
        a,
        "s.json",
        serde_json::json!([
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"expect": ["exit code 0"], "text": "appended"}
        ]),
    );
    let o = run_agent(
        a,
        &[
            "--provider",
            "script",
            "--autonomy",
            "manual",
            "-p",
            "append a line",
        ],
        &sc,
    );
    assert_code(&o, 5, "A suspends");
    let r = json_of(&o);
    let sid = r["session"].as_str().expect("session").to_string();
    let digest = r["pending"]["digest"].as_str().expect("digest").to_string();
    (sid, digest, sc)
}

fn script(s: &Scratch, name: &str, turns: serde_json::Value) -> PathBuf {
    let p = s.root.path().join(name);
    std::fs::write(&p, serde_json::json!({ "turns": turns }).to_string()).expect("script");
    s.give(&p);
    p
}

fn run_agent(s: &Scratch, extra: &[&str], script: &Path) -> Output {
    s.retie()
        .env_remove("RETIE_LEDGER")
        .env_remove("RETIE_PROVIDER")
        .args(["run", "--json", "--script"])
        .arg(script)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("run")
}

/// Issue 32: a session on machine A suspends at an approval (exit 5);
/// machine B (its own HOME and user key, admitted by A, the ledger's
/// owner) lists it with `retie pending` and approves it, bound to the
/// digest; A's `--resume` carries it out exactly once; both verify
/// intact. Machine C, never admitted, cannot decide (refused, nothing
/// written).
#[test]
fn approved_on_another_machine_runs_once_on_resume() {
    let cluster = pgcluster::Cluster::start();
    for (i, leg) in legs().into_iter().enumerate() {
        let url = cluster.database(&format!("appr{i}"));
        let (a, b, c) = (Scratch::new(leg), Scratch::new(leg), Scratch::new(leg));
        for m in [&a, &b, &c] {
            use_shared(m, &url);
        }
        let (sid, digest, sc) = suspend_at_append(&a, "echo ran >> log.txt");
        // B is admitted by A.
        let o = retie(&b, &["ledger", "key"]);
        assert_code(&o, 0, "B's key");
        let bkey = stdout(&o).trim().to_string();
        let o = retie(&a, &["ledger", "admit", &bkey]);
        assert_code(&o, 0, "A admits B");
        // C is not: it cannot decide.
        let o = retie(&c, &["approve", &sid, "--digest", &digest]);
        assert_code(&o, 125, "C approves");
        assert!(stderr(&o).contains("retie ledger admit"), "{}", stderr(&o));
        // B sees it and approves it.
        let o = retie(&b, &["pending", "--json"]);
        assert_code(&o, 0, "B lists pending");
        let listed = json_of(&o)["pending"]
            .as_array()
            .expect("pending")
            .iter()
            .any(|p| p["session"] == sid.as_str() && p["digest"] == digest.as_str());
        assert!(listed, "{leg:?}: B does not list A's pending approval");
        let o = retie(&b, &["approve", &sid, "--digest", "00ff"]);
        assert_code(&o, 125, "B approves another digest");
        let o = retie(&b, &["approve", &sid, "--digest", &digest]);
        assert_code(&o, 0, "B approves");
        // A resumes and runs it once.
        let o = run_agent(&a, &["--resume", &sid], &sc);
        assert_code(&o, 0, "A resumes");
        assert_eq!(
            std::fs::read_to_string(a.ws.join("log.txt"))
                .ok()
                .as_deref(),
            Some("ran\n"),
            "{leg:?}: not run exactly once"
        );
        let o = run_agent(&a, &["--resume", &sid], &sc);
        assert_ne!(
            o.status.code(),
            Some(0),
            "a second resume of a finished session"
        );
        assert_eq!(
            std::fs::read_to_string(a.ws.join("log.txt"))
                .ok()
                .as_deref(),
            Some("ran\n")
        );
        // The decision is B's, signed by B's key.
        let signer: Vec<u8> = cluster
            .superuser(&format!("appr{i}"))
            .query_one(
                "SELECT signer FROM entries WHERE kind = 'decision'::bytea AND convert_from(payload, 'UTF8')::jsonb ? 'pending'",
                &[],
            )
            .expect("decision")
            .get(0);
        let hex: String = signer.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, bkey, "{leg:?}: the decision is not signed by B's key");
        verify_intact(&a, "A after resume");
        verify_intact(&b, "B after resume");
    }
}

/// `retie ledger copy`: a local ledger with a few recorded commands goes
/// into an empty PostgreSQL one entry for entry; both verify; a second
/// copy into the now non-empty one is refused.
#[test]
fn ledger_copy_moves_a_local_ledger_with_its_chain_intact() {
    let cluster = pgcluster::Cluster::start();
    for (i, leg) in legs().into_iter().enumerate() {
        let s = Scratch::new(leg);
        for n in 0..3 {
            let o = s.sh(&format!("echo {n} > f{n}.txt"));
            assert_code(&o, 0, "exec");
        }
        let local = s.home.join(".local/state/retie/ledger.db");
        let before = json_of(&retie(&s, &["verify", "--json"]));
        assert_eq!(before["verdict"], "intact", "{before}");
        let url = cluster.database(&format!("copy{i}"));
        let o = retie(
            &s,
            &["ledger", "copy", "--from", path_str(&local), "--to", &url],
        );
        assert_code(&o, 0, "copy");
        let o = retie(&s, &["verify", "--json", "--ledger", &url]);
        assert_code(&o, 0, "verify the copy");
        let after = json_of(&o);
        assert_eq!(after["entries"], before["entries"], "{after}");
        assert_eq!(after["head"], before["head"], "{after}");
        assert_eq!(
            after["checkpoint"]["count"], before["checkpoint"]["count"],
            "{after}"
        );
        let o = retie(
            &s,
            &["ledger", "copy", "--from", path_str(&local), "--to", &url],
        );
        assert_code(&o, 125, "a copy into a non-empty ledger");
        assert!(stderr(&o).contains("empty"), "{}", stderr(&o));
    }
}

/// `[ledger] approvers` on machine A (the one that carries decisions
/// out): a decision B made (B admitted, but not on A's list) is refused at
/// A's resume and the refusal is recorded; nothing runs, and the action
/// is asked again. Once A lists B's key, B's next decision is carried
/// out, once.
#[test]
fn a_decision_by_a_key_off_the_allow_list_is_refused_and_recorded() {
    let cluster = pgcluster::Cluster::start();
    for (i, leg) in legs().into_iter().enumerate() {
        let db = format!("allow{i}");
        let url = cluster.database(&db);
        let (a, b) = (Scratch::new(leg), Scratch::new(leg));
        use_shared(&b, &url);
        let other = "ab".repeat(32);
        let with_list = |keys: &[&str]| {
            let cfg = a.home.join(".config/retie/config.toml");
            let list: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
            std::fs::write(
                &cfg,
                format!(
                    "[ledger]\nurl = \"{url}\"\napprovers = [{}]\n",
                    list.join(", ")
                ),
            )
            .expect("config");
            a.give(&cfg);
        };
        use_shared(&a, &url);
        with_list(&[&other]);
        let (sid, digest, sc) = suspend_at_append(&a, "echo ran >> log.txt");
        let bkey = stdout(&retie(&b, &["ledger", "key"])).trim().to_string();
        assert_code(&retie(&a, &["ledger", "admit", &bkey]), 0, "admit B");
        assert_code(
            &retie(&b, &["approve", &sid, "--digest", &digest]),
            0,
            "B approves",
        );
        let o = run_agent(&a, &["--resume", &sid], &sc);
        assert_code(&o, 125, "A refuses B's decision");
        assert!(stderr(&o).contains("allow-list"), "{}", stderr(&o));
        assert!(
            !a.ws.join("log.txt").exists(),
            "{leg:?}: ran on a refused decision"
        );
        let refusals: i64 = cluster
            .superuser(&db)
            .query_one(
                "SELECT count(*) FROM entries WHERE kind = 'refusal'::bytea AND convert_from(payload, 'UTF8')::jsonb ->> 'signer' = $1",
                &[&bkey],
            )
            .expect("refusals")
            .get(0);
        assert_eq!(refusals, 1, "{leg:?}: the refusal is not recorded");
        verify_intact(&a, "after the refusal");
        // The refused decision does not count: the action is asked again
        // (a new pending approval), and B, now listed, decides it.
        with_list(&[&other, &bkey]);
        let o = run_agent(&a, &["--resume", &sid], &sc);
        assert_code(&o, 5, "asked again after the refusal");
        assert!(!a.ws.join("log.txt").exists(), "{leg:?}: ran undecided");
        assert_code(
            &retie(&b, &["approve", &sid, "--digest", &digest]),
            0,
            "B approves again",
        );
        let o = run_agent(&a, &["--resume", &sid], &sc);
        assert_code(&o, 0, "A resumes with B listed");
        assert_eq!(
            std::fs::read_to_string(a.ws.join("log.txt"))
                .ok()
                .as_deref(),
            Some("ran\n"),
            "{leg:?}: not run exactly once"
        );
    }
}

/// ADR 0461: a session runs in one process at a time on a shared ledger,
/// whatever machine it is resumed on. A is resuming an approved session
/// (its command takes a few seconds); "machine" D, with the same user key
/// but its own state directory (so its own local session locks, as on
/// another host), lists the session as running and is refused when it
/// tries to resume it; the approved command ran exactly once.
#[test]
fn a_session_running_on_one_machine_is_not_resumed_on_another() {
    let cluster = pgcluster::Cluster::start();
    for (i, leg) in legs().into_iter().enumerate() {
        let url = cluster.database(&format!("claim{i}"));
        let a = Scratch::new(leg);
        use_shared(&a, &url);
        let (sid, _, sc) = suspend_at_append(&a, "sleep 4; echo ran >> log.txt");
        assert_code(&retie(&a, &["approve", &sid]), 0, "approve");
        // D: the same key (config), another state directory.
        let d_state = a.home.join("machine-d-state");
        std::fs::create_dir_all(&d_state).expect("mkdir");
        a.give(&d_state);
        let on_d = |args: &[&str]| {
            a.retie()
                .env("XDG_STATE_HOME", &d_state)
                .env_remove("RETIE_LEDGER")
                .env_remove("RETIE_PROVIDER")
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("retie on D")
        };
        let mut running = a.retie();
        running
            .env_remove("RETIE_LEDGER")
            .env_remove("RETIE_PROVIDER")
            .args(["run", "--json", "--script"])
            .arg(&sc)
            .args(["--resume", &sid])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = running.spawn().expect("resume on A");
        // D sees it running (the claim on the server, not a local lock).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let o = on_d(&["sessions", "--all", "--json"]);
            assert_code(&o, 0, "sessions on D");
            let state = json_of(&o)["sessions"]
                .as_array()
                .and_then(|l| l.iter().find(|s| s["session"] == sid.as_str()).cloned())
                .map(|s| s["state"].clone());
            if state == Some(serde_json::json!("running")) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{leg:?}: D never lists the session as running: {state:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let mut resume_d = vec!["run", "--json", "--script"];
        let sc_s = sc.to_str().expect("utf-8 path");
        resume_d.push(sc_s);
        resume_d.extend(["--resume", &sid]);
        let o = on_d(&resume_d);
        assert_ne!(
            o.status.code(),
            Some(0),
            "{leg:?}: D resumed a running session"
        );
        assert!(
            stderr(&o).contains("running in another process on another machine"),
            "{leg:?}: {}",
            stderr(&o)
        );
        let o = child.wait_with_output().expect("A's resume");
        assert_code(&o, 0, "A's resume");
        assert_eq!(
            std::fs::read_to_string(a.ws.join("log.txt"))
                .ok()
                .as_deref(),
            Some("ran\n"),
            "{leg:?}: not run exactly once"
        );
        verify_intact(&a, "after the refused second resume");
    }
}
