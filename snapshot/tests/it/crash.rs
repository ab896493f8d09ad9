//! kill -9 at random points during apply, in a loop: after recovery the
//! workspace is either entirely as before or entirely as after (the
//! roll-back rule of ADR 0201 gives "before" for every interrupted apply),
//! and no journal entry is left pending.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use retie_snapshot::{
    apply, recover, ApplyOptions, Changeset, EntryState, Journal, Store, Workspace,
};

use crate::common::{assert_tree, noise, put, tree, Env, Tree};

const CHILD_ENV: &str = "RETIE_SNAPSHOT_CRASH_CHILD";

/// Re-invoked by the parent with `CHILD_ENV` set: applies the changeset.
/// Does nothing in a normal test run.
#[test]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut lines = spec.lines();
    let (mode, cs, ws, state) = (
        lines.next().expect("mode"),
        lines.next().expect("cs path"),
        lines.next().expect("ws path"),
        lines.next().expect("state path"),
    );
    let ws = Workspace::open(Path::new(ws)).expect("ws");
    let state = Path::new(state);
    let (store, journal) = (
        Store::open(state).expect("store"),
        Journal::open(state).expect("journal"),
    );
    if mode == "recover" {
        recover(&ws, &store, &journal).expect("child recover");
        return;
    }
    let cs: Changeset = serde_json::from_slice(&fs::read(cs).expect("read cs")).expect("parse cs");
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("child apply");
}

fn spawn_child(mode: &str, cs: &Path, ws: &Path, state: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "crash::crash_child", "--test-threads=1", "-q"])
        .env(
            CHILD_ENV,
            format!(
                "{mode}\n{}\n{}\n{}",
                cs.display(),
                ws.display(),
                state.display()
            ),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn child")
}

fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp -a");
    assert!(st.success());
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn kill_9_during_apply_then_recover_gives_before_or_after() {
    let env = Env::new();
    for d in 0..40 {
        for f in 0..10 {
            put(
                &env.ws,
                &format!("d{d:02}/f{f}"),
                &noise((d * 10 + f) as u64, 8192),
                0o644,
            );
        }
    }
    let ops = "for f in d0*/f*; do echo mod >> $f; done\n\
               rm -rf d1*\n\
               mkdir new; for i in $(seq 1 100); do echo $i > new/n$i; done\n\
               for d in d2*; do chmod 700 $d; done\n\
               for d in d3*; do rm $d/f0; mkdir $d/f0; echo x > $d/f0/inner; done";
    let (upper, merged) = env.overlay("ovl", ops);
    let before: Tree = tree(&env.ws);
    let after: Tree = tree(&merged);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    assert!(cs.changes.len() > 300, "{} changes", cs.changes.len());
    let cs_path = env.tmp.path().join("cs.json");
    fs::write(&cs_path, serde_json::to_vec(&cs).expect("json")).expect("write cs");

    // Calibrate: one uninterrupted child run.
    let run = |i: usize| {
        let dir = env.tmp.path().join(format!("run{i}"));
        fs::create_dir_all(&dir).expect("mkdir");
        let ws = dir.join("ws");
        copy_tree(&env.ws, &ws);
        (dir.clone(), ws, dir.join("state"))
    };
    let (dir, ws, state) = run(0);
    let t0 = Instant::now();
    let st = spawn_child("apply", &cs_path, &ws, &state)
        .wait()
        .expect("wait");
    let full = t0.elapsed();
    assert!(st.success(), "uninterrupted child apply failed");
    assert_tree("uninterrupted apply", &after, &tree(&ws));
    fs::remove_dir_all(&dir).expect("cleanup");

    let seed = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
            % 1_000_000_007,
    )
    .expect("fits")
        | 1;
    eprintln!("crash loop: full apply {full:?}, seed {seed}");
    let mut rng = Rng(seed);
    let (mut got_before, mut got_after, mut reapplied) = (0, 0, 0);
    let (mut recoveries_killed, mut mid_apply) = (0, 0);
    // At least 30 kills; go on (up to 90) until 5 have landed mid-apply, so
    // timing noise on a loaded machine cannot make the loop prove nothing.
    let mut iterations = 0;
    for i in 1..=90 {
        if i > 30 && mid_apply >= 5 {
            break;
        }
        iterations = i;
        let (dir, ws_path, state) = run(i);
        // Capturing pre-images takes the first part of an apply; spread the
        // kills over [full/4, full] so most land after the journal entry.
        let span = full.as_micros() as u64;
        let delay = Duration::from_micros(span / 4 + rng.next() % (span * 3 / 4 + 1));
        let mut child = spawn_child("apply", &cs_path, &ws_path, &state);
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();

        let ws = Workspace::open(&ws_path).expect("ws");
        let (store, journal) = (
            Store::open(&state).expect("store"),
            Journal::open(&state).expect("journal"),
        );
        // Every other interrupted apply also gets its recovery killed
        // part-way: recovery must itself be recoverable.
        let interrupted = !journal.pending().expect("pending").is_empty();
        if interrupted {
            mid_apply += 1;
        }
        if interrupted && rng.next() & 1 == 0 {
            let delay = Duration::from_micros(rng.next() % (full.as_micros() as u64 / 2 + 1));
            let mut rchild = spawn_child("recover", &cs_path, &ws_path, &state);
            std::thread::sleep(delay);
            let _ = rchild.kill();
            let _ = rchild.wait();
            recoveries_killed += 1;
        }
        recover(&ws, &store, &journal).expect("recover");
        let entries = journal.entries().expect("entries");
        assert!(
            entries.iter().all(|e| e.state != EntryState::Pending),
            "iteration {i} (seed {seed}, delay {delay:?}): pending entry after recovery"
        );
        let t = tree(&ws_path);
        if interrupted {
            // The roll-back rule: an interrupted entry ends as "before".
            assert_tree(
                &format!("iteration {i} (seed {seed}): rolled back"),
                &before,
                &t,
            );
        }
        if t == before {
            got_before += 1;
            assert!(entries.iter().all(|e| e.state != EntryState::Complete));
            if reapplied == 0 {
                // After a roll-back the same changeset applies cleanly.
                apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("re-apply");
                assert_tree("re-apply after recovery", &after, &tree(&ws_path));
                reapplied += 1;
            }
        } else if t == after {
            got_after += 1;
            assert!(entries.iter().any(|e| e.state == EntryState::Complete));
        } else {
            assert_tree(
                &format!("iteration {i} (seed {seed}, delay {delay:?}): neither before nor after; vs before"),
                &before,
                &t,
            );
        }
        fs::remove_dir_all(&dir).expect("cleanup");
    }
    eprintln!(
        "crash loop: {iterations} kills: {got_before} before ({mid_apply} interrupted mid-apply and rolled back, \
         {recoveries_killed} of whose recoveries were killed too), {got_after} after"
    );
    assert!(
        mid_apply >= 1,
        "no kill landed mid-apply (seed {seed}); the loop proved nothing"
    );
}
