//! ADR 0213: in a batch from a consumed layer, the layer's file itself
//! moves into the workspace (a rename that replaces nothing, or an
//! exchange across the two directories, judged as it comes out). A
//! person's edit made after the capture is kept and named, ours stays in
//! the layer; a failed apply moves every file it moved back into the
//! layer, so a kept run still holds all it made.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use retie_snapshot::{apply, apply_alongside, undo, ApplyOptions, Changeset, Error, UndoOptions};

use crate::common::{assert_tree, put, tree, Env};

fn consumed() -> ApplyOptions {
    ApplyOptions {
        consume_layer: true,
        ..ApplyOptions::default()
    }
}

/// 100 files in `tree/` (an existing directory): a batch (ADR 0208) of
/// modified files and of files created beside them, none in a new
/// directory (those move whole, ADR 0211).
fn hundred(env: &Env) {
    for i in 0..100 {
        put(
            &env.ws,
            &format!("tree/f{i:03}"),
            format!("old {i}\n").as_bytes(),
            0o644,
        );
    }
}

const REWRITE_AND_ADD: &str = "for i in $(seq -w 0 099); do echo new $i > tree/f$i; done; \
    for i in $(seq -w 0 069); do echo made $i > tree/n$i; done";

/// `p` holds exactly `text`.
fn holds(p: &Path, text: &str) {
    let got = fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(got, text, "{}", p.display());
}

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).expect("lstat").ino()
}

/// Waits until the journal holds a pending entry: the capture is done.
fn wait_pending(state: &Path) {
    let open = state.join("journal").join("open");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if fs::read_dir(&open).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".pending.json")))
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no pending entry in {}", open.display());
}

/// The 100 files, rewritten and 70 made beside them in a layer: the
/// workspace, the layer, what the command saw, the changeset.
fn rewritten() -> (Env, PathBuf, PathBuf, Changeset) {
    let env = Env::new();
    hundred(&env);
    let (upper, merged) = env.overlay("ovl", REWRITE_AND_ADD);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    (env, upper, merged, cs)
}

#[test]
fn the_layers_file_moves_in_and_a_persons_edit_after_the_capture_is_kept() {
    let (env, upper, merged, cs) = rewritten();
    assert_eq!(cs.changes.len(), 170, "{:?}", cs.changes.len());
    let (ws, store, journal) = env.open();
    let moved_in = ino(&upper.join("tree/f010"));
    let made_in = ino(&upper.join("tree/n020"));
    // The person saves f050 and makes n030 after the pre-images were
    // captured, before the first rename.
    let state = env.state.clone();
    let wsp = env.ws.clone();
    let e = apply_alongside(&cs, &ws, &store, &journal, &consumed(), move || {
        wait_pending(&state);
        fs::write(wsp.join("tree/f050"), "person's f050\n").expect("person f050");
        fs::write(wsp.join("tree/n030"), "person's n030\n").expect("person n030");
        true
    })
    .expect("apply");
    let mut raced: Vec<&str> = e.raced.iter().map(|r| r.path.as_str()).collect();
    raced.sort_unstable();
    assert_eq!(raced, ["tree/f050", "tree/n030"], "{:?}", e.raced);
    // Theirs in the workspace; ours still in the layer.
    holds(&env.ws.join("tree/f050"), "person's f050\n");
    holds(&env.ws.join("tree/n030"), "person's n030\n");
    holds(&upper.join("tree/f050"), "new 050\n");
    holds(&upper.join("tree/n030"), "made 030\n");
    // The very inodes of the layer, moved: no copy, no second link.
    assert_eq!(ino(&env.ws.join("tree/f010")), moved_in);
    assert_eq!(ino(&env.ws.join("tree/n020")), made_in);
    assert_eq!(
        fs::symlink_metadata(env.ws.join("tree/f010"))
            .expect("f010")
            .nlink(),
        1
    );
    assert!(!upper.join("tree/f010").exists(), "moved out of the layer");
    // Everything else is what the command left.
    let mut want = tree(&merged);
    let got = tree(&env.ws);
    for p in ["tree/f050", "tree/n030"] {
        want.insert(p.into(), got[p].clone());
    }
    assert_tree("after the apply", &want, &got);
    // The undo puts back what the apply changed, and leaves the
    // person's two files.
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    holds(&env.ws.join("tree/f010"), "old 10\n");
    assert!(!env.ws.join("tree/n020").exists());
    holds(&env.ws.join("tree/f050"), "person's f050\n");
    holds(&env.ws.join("tree/n030"), "person's n030\n");
}

#[test]
fn a_failed_apply_moves_each_file_back_into_the_layer() {
    let (env, upper, merged, cs) = rewritten();
    let before = tree(&env.ws);
    let layer = tree(&upper);
    // The last path's file in the layer changes after the review: the
    // apply reaches it after moving the others, fails, rolls back.
    let last = cs.changes.last().expect("changes").path.to_string();
    assert_eq!(last, "tree/n069");
    fs::write(upper.join(&last), "changed after review\n").expect("tamper");
    let layer_tampered = tree(&upper);
    assert_ne!(layer, layer_tampered);
    let (ws, store, journal) = env.open();
    let err = apply(&cs, &ws, &store, &journal, &consumed()).expect_err("must fail");
    assert!(
        matches!(&err, Error::RolledBack { path, .. } if *path == last),
        "{err:?}"
    );
    assert_tree("workspace after the failed apply", &before, &tree(&env.ws));
    // Every file the apply moved in is back in the layer.
    assert_tree(
        "layer after the failed apply",
        &layer_tampered,
        &tree(&upper),
    );
    // Mended, the same layer applies in full.
    fs::write(upper.join(&last), "made 069\n").expect("mend");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute again");
    apply(&cs, &ws, &store, &journal, &consumed()).expect("apply");
    assert_tree("after the second apply", &tree(&merged), &tree(&env.ws));
}

/// ADR 0215: what the layer's files replaced stays in the layer under its
/// own name, and the layer, renamed whole, becomes the entry's kept files
/// (one rename, not one a file); the undo takes those very files back.
#[test]
fn the_layer_kept_whole_holds_what_the_apply_replaced_and_the_undo_takes_it_back() {
    let (env, upper, _, cs) = rewritten();
    let originals: Vec<(String, u64)> = (0..100)
        .map(|i| {
            let p = format!("tree/f{i:03}");
            let n = ino(&env.ws.join(&p));
            (p, n)
        })
        .collect();
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &consumed()).expect("apply");
    let layer = env.state.join("kept").join(&e.id).join("layer");
    assert!(!upper.exists(), "the layer moved whole");
    for (p, n) in &originals {
        assert_eq!(ino(&layer.join(p)), *n, "{p} kept in the layer");
    }
    let applied: Vec<u64> = originals
        .iter()
        .map(|(p, _)| ino(&env.ws.join(p)))
        .collect();
    let u = undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    for (i, (p, n)) in originals.iter().enumerate() {
        assert_eq!(ino(&env.ws.join(p)), *n, "{p}: the very file back");
        holds(&env.ws.join(p), &format!("old {i}\n"));
    }
    assert!(!env.ws.join("tree/n000").exists());
    // The undo moved them in from the kept layer the same way, and left
    // what it replaced there: that layer is now the undo's kept files,
    // and the redo moves the command's files back in, as they were.
    let ulayer = env.state.join("kept").join(&u.id).join("layer");
    for ((p, _), n) in originals.iter().zip(&applied) {
        assert_eq!(ino(&ulayer.join(p)), *n, "{p} kept in the undo's layer");
    }
    undo(&u.id, &ws, &store, &journal, &UndoOptions::default()).expect("redo");
    for (i, ((p, _), n)) in originals.iter().zip(&applied).enumerate() {
        assert_eq!(ino(&env.ws.join(p)), *n, "{p}: the command's file again");
        holds(&env.ws.join(p), &format!("new {i:03}\n"));
    }
}

/// ADR 0215: a layer that still holds what the apply did not take (here a
/// blocked `.envrc`) is not kept whole for the entry's life; what the
/// apply replaced is kept file by file, and the undo still puts back the
/// very files.
#[test]
fn a_layer_holding_a_blocked_entry_is_not_kept_whole() {
    let env = Env::new();
    hundred(&env);
    let (upper, _) = env.overlay("ovl", &format!("{REWRITE_AND_ADD}; echo hi > .envrc"));
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    assert_eq!(cs.blocked.len(), 1, "{:?}", cs.blocked);
    let original = ino(&env.ws.join("tree/f007"));
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &consumed()).expect("apply");
    assert!(
        !env.state.join("kept").join(&e.id).join("layer").exists(),
        "the layer, blocked entry and all, was kept whole"
    );
    assert!(!env.ws.join(".envrc").exists());
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_eq!(
        ino(&env.ws.join("tree/f007")),
        original,
        "the very file back"
    );
    holds(&env.ws.join("tree/f007"), "old 7\n");
}
