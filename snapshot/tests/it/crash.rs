//! kill -9 at random points during apply, in a loop: after recovery the
//! workspace is either entirely as before or entirely as after (the
//! roll-back rule of ADR 0201 gives "before" for every interrupted apply),
//! and no journal entry is left pending.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use retie_snapshot::{
    apply, recover, undo, ApplyOptions, Changeset, EntryState, Journal, Store, UndoOptions,
    Workspace,
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
    if mode == "undo" {
        // The "cs path" line carries the id of the entry to undo.
        undo(cs, &ws, &store, &journal, &UndoOptions::default()).expect("child undo");
        return;
    }
    let cs: Changeset = serde_json::from_slice(&fs::read(cs).expect("read cs")).expect("parse cs");
    apply(&cs, &ws, &store, &journal, &consumed()).expect("child apply");
}

/// As `retie` applies a finished run: its layer is consumed, and the
/// directories it created move into the workspace whole (ADR 0211).
fn consumed() -> ApplyOptions {
    ApplyOptions {
        consume_layer: true,
        ..ApplyOptions::default()
    }
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

/// A round's own copy of the layer (the apply consumes it: the directories
/// it created move into the workspace whole, ADR 0211), and the changeset
/// naming it, written beside; returns its path.
fn layer_of_round(cs: &Changeset, upper: &Path, dir: &Path) -> PathBuf {
    copy_layer(upper, &dir.join("upper"));
    let mut cs = cs.clone();
    cs.upper = dir.join("upper");
    let cs_path = dir.join("cs.json");
    fs::write(&cs_path, serde_json::to_vec(&cs).expect("json")).expect("write cs");
    cs_path
}

/// Copies a layer's directories, files and symlinks (modes kept); its
/// whiteouts, which an apply never reads, are left out (a character
/// device only root can make outside a user namespace).
fn copy_layer(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir(to).expect("mkdir layer copy");
    for e in fs::read_dir(from).expect("read layer") {
        let e = e.expect("layer entry");
        let (ft, dst) = (e.file_type().expect("type"), to.join(e.file_name()));
        if ft.is_dir() {
            copy_layer(&e.path(), &dst);
        } else if ft.is_file() {
            fs::copy(e.path(), &dst).expect("copy layer file");
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(e.path()).expect("readlink"), &dst)
                .expect("symlink");
            continue;
        } else {
            continue;
        }
        let mode = e.metadata().expect("meta").permissions().mode();
        fs::set_permissions(&dst, fs::Permissions::from_mode(mode)).expect("chmod");
    }
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

    // Calibrate: one uninterrupted child run.
    let run = |i: usize| {
        let dir = env.tmp.path().join(format!("run{i}"));
        fs::create_dir_all(&dir).expect("mkdir");
        let ws = dir.join("ws");
        copy_tree(&env.ws, &ws);
        let cs_path = layer_of_round(&cs, &upper, &dir);
        (dir.clone(), ws, dir.join("state"), cs_path)
    };
    let (dir, ws, state, cs_path) = run(0);
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
        let (dir, ws_path, state, cs_path) = run(i);
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

/// Wait until `child`'s journal entry under `state` is pending (its
/// `journal/open/*.pending.json` exists), polling; how long that took
/// from now, or `None` when the child ended first.
fn wait_pending(state: &std::path::Path, child: &mut std::process::Child) -> Option<Duration> {
    let t = Instant::now();
    let open = state.join("journal").join("open");
    loop {
        if let Ok(rd) = fs::read_dir(&open) {
            let pending = rd
                .flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".pending.json"));
            if pending {
                return Some(t.elapsed());
            }
        }
        if matches!(child.try_wait(), Ok(Some(_))) {
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A 10,000-file tree (100 directories of 100 files of 1 KiB).
fn big_tree(env: &Env) {
    for d in 0..100 {
        for f in 0..100 {
            put(
                &env.ws,
                &format!("t{d:03}/f{f:03}"),
                &noise((d * 100 + f) as u64, 1024),
                0o644,
            );
        }
    }
}

/// What a big change does: rewrites 5,000 files, removes 2,000, creates
/// 5,000 in new directories (issue 30's sizes; the batch path of ADR 0208).
const BIG_OPS: &str = "for d in t00* t01* t02* t03* t04*; do for f in $d/f*; do echo mod >> $f; done; done\n\
    rm -rf t08* t09*\n\
    for d in $(seq 1 50); do mkdir -p gen/g$d; for f in $(seq 1 100); do echo $d.$f > gen/g$d/n$f; done; done";

fn seed() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
            % 1_000_000_007,
    )
    .expect("fits")
        | 1
}

/// kill -9 at random moments during a 12,000-path apply, 30 rounds (or
/// `RETIE_BIG_CRASH_ROUNDS`; CI runs fewer per leg, both legs at once): after
/// recovery the workspace is wholly before (an interrupted apply rolls
/// back) or wholly after, and nothing is pending.
#[test]
#[ignore = "minutes in a debug build: .ci/run runs it in release, as root and as uid 65534"]
fn kill_9_during_a_10k_file_apply_gives_before_or_after() {
    big_crash_loop(false);
}

/// The same during the undo of that apply: wholly as the apply left it (an
/// interrupted undo rolls back) or wholly as before the apply.
#[test]
#[ignore = "minutes in a debug build: .ci/run runs it in release, as root and as uid 65534"]
fn kill_9_during_a_10k_file_undo_gives_before_or_after() {
    big_crash_loop(true);
}

fn big_crash_loop(undoing: bool) {
    let env = Env::new();
    big_tree(&env);
    let (upper, merged) = env.overlay("ovl", BIG_OPS);
    let before: Tree = tree(&env.ws);
    let after: Tree = tree(&merged);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    assert!(cs.changes.len() > 12_000, "{} changes", cs.changes.len());
    // Each round: a fresh copy of the workspace and of the layer's created
    // tree (the apply consumes the layer: `gen` moves into the workspace
    // whole, ADR 0211); for the undo loop, the apply done in full first,
    // and the id of its entry handed to the child.
    let run = |i: usize| {
        let dir = env.tmp.path().join(format!("run{i}"));
        fs::create_dir_all(&dir).expect("mkdir");
        let ws = dir.join("ws");
        copy_tree(&env.ws, &ws);
        let cs_path = layer_of_round(&cs, &upper, &dir);
        let state = dir.join("state");
        let arg = if undoing {
            let w = Workspace::open(&ws).expect("ws");
            let (store, journal) = (
                Store::open(&state).expect("store"),
                Journal::open(&state).expect("journal"),
            );
            let cs: Changeset =
                serde_json::from_slice(&fs::read(&cs_path).expect("read cs")).expect("parse cs");
            let e = apply(&cs, &w, &store, &journal, &consumed()).expect("apply");
            std::path::PathBuf::from(e.id)
        } else {
            cs_path
        };
        (dir, ws, state, arg)
    };
    let mode = if undoing { "undo" } else { "apply" };
    let (start, end) = if undoing {
        (&after, &before)
    } else {
        (&before, &after)
    };
    let (dir, ws, state, arg) = run(0);
    let t0 = Instant::now();
    let mut child = spawn_child(mode, &arg, &ws, &state);
    // When its journal entry became pending: the window a kill must hit
    // to interrupt it is from there to the end.
    let pending_at = wait_pending(&state, &mut child);
    let st = child.wait().expect("wait");
    let full = t0.elapsed();
    assert!(st.success(), "uninterrupted child {mode} failed");
    let window = pending_at.map_or(full, |p| full.saturating_sub(p));
    assert_tree(&format!("uninterrupted {mode}"), end, &tree(&ws));
    fs::remove_dir_all(&dir).expect("cleanup");

    let seed = seed();
    eprintln!("big crash loop ({mode}): full {full:?}, pending after {pending_at:?}, seed {seed}");
    let mut rng = Rng(seed);
    let (mut at_start, mut at_end, mut mid) = (0, 0, 0);
    let mut rounds = 0;
    let wanted: usize = std::env::var("RETIE_BIG_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(30);
    for i in 1..=wanted {
        rounds = i;
        let (dir, ws_path, state, arg) = run(i);
        // Odd rounds: a moment anywhere from a fifth of the way on. Even
        // rounds: a moment after its journal entry became pending, within
        // the uninterrupted run's window from there to the end (the
        // other leg may share the machine and stretch the run: a blind
        // moment could land before that point every time).
        let mut child = spawn_child(mode, &arg, &ws_path, &state);
        let delay = if i % 2 == 1 {
            let span = full.as_micros() as u64;
            let d = Duration::from_micros(span / 5 + rng.next() % (span * 4 / 5 + 1));
            std::thread::sleep(d);
            d
        } else {
            let span = window.as_micros() as u64;
            let d = Duration::from_micros(rng.next() % (span * 9 / 10 + 1));
            let _ = wait_pending(&state, &mut child);
            std::thread::sleep(d);
            d
        };
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let ws = Workspace::open(&ws_path).expect("ws");
        let (store, journal) = (
            Store::open(&state).expect("store"),
            Journal::open(&state).expect("journal"),
        );
        let interrupted = !journal.pending().expect("pending").is_empty();
        if interrupted {
            mid += 1;
        }
        recover(&ws, &store, &journal).expect("recover");
        assert!(
            journal
                .entries()
                .expect("entries")
                .iter()
                .all(|e| e.state != EntryState::Pending),
            "round {i} (seed {seed}): pending entry after recovery"
        );
        let t = tree(&ws_path);
        if interrupted {
            assert_tree(&format!("round {i} (seed {seed}): rolled back"), start, &t);
        }
        if t == *start {
            at_start += 1;
        } else if t == *end {
            at_end += 1;
        } else {
            assert_tree(
                &format!("round {i} (seed {seed}, delay {delay:?}): neither; vs start"),
                start,
                &t,
            );
        }
        fs::remove_dir_all(&dir).expect("cleanup");
    }
    eprintln!(
        "big crash loop ({mode}): {rounds} kills: {at_start} at the start ({mid} interrupted mid-way, rolled back), {at_end} at the end"
    );
    assert!(
        mid >= 1,
        "no kill landed mid-{mode} (seed {seed}); the loop proved nothing"
    );
}
