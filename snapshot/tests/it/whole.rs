//! ADR 0211: a directory created or removed with all beneath it moves by
//! one rename (in from the consumed layer, out into the kept files, back
//! in from them), checked where it lands; a tree that does not match what
//! was reviewed is moved back and nothing of it is placed.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use retie_snapshot::{apply, undo, ApplyOptions, Changeset, Error, UndoOptions};

use crate::common::{assert_tree, put, tree, Env};

/// 100 files in `gen/a`, 100 in `gen/a/b` (mode 750), a symlink: more
/// paths than a batch needs (ADR 0208).
const MAKE_GEN: &str = "mkdir -p gen/a/b; for i in $(seq 1 100); do echo $i > gen/a/f$i; \
    echo b$i > gen/a/b/g$i; done; ln -s f1 gen/a/link; chmod 750 gen/a/b";

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p).expect("lstat").ino()
}

/// The entries of the kept files of journal entry `id` that hold a tree.
fn kept_trees(env: &Env, id: &str) -> Vec<u64> {
    let Ok(rd) = fs::read_dir(env.state.join("kept").join(id)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("t-"))
        .map(|e| ino(&e.path()))
        .collect()
}

fn consumed() -> ApplyOptions {
    ApplyOptions {
        consume_layer: true,
        ..ApplyOptions::default()
    }
}

/// The created tree is the layer's own directory, moved (same inode), and
/// gone from the layer; its undo takes it out whole into the kept files
/// (same inode there); the redo brings that very directory back.
#[test]
fn a_created_tree_moves_in_whole_and_its_undo_and_redo_move_it_whole() {
    let env = Env::new();
    put(&env.ws, "keep.txt", b"mine\n", 0o644);
    let before = tree(&env.ws);
    let (upper, merged) = env.overlay("ovl", MAKE_GEN);
    let after = tree(&merged);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let gen = ino(&upper.join("gen"));
    let (ws, store, journal) = env.open();

    let e = apply(&cs, &ws, &store, &journal, &consumed()).expect("apply");
    assert_tree("after apply", &after, &tree(&env.ws));
    assert_eq!(ino(&env.ws.join("gen")), gen, "gen was not moved whole");
    assert!(!upper.join("gen").exists(), "the layer still holds gen");

    let u = undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("after undo", &before, &tree(&env.ws));
    assert_eq!(
        kept_trees(&env, &u.id),
        vec![gen],
        "the undo did not keep gen whole"
    );

    undo(&u.id, &ws, &store, &journal, &UndoOptions::default()).expect("redo");
    assert_tree("after redo", &after, &tree(&env.ws));
    assert_eq!(
        ino(&env.ws.join("gen")),
        gen,
        "the redo did not bring gen back whole"
    );
}

/// A file of the layer changed after the changeset was computed (what the
/// person reviewed): the tree moved in does not match, goes back to the
/// layer whole, and the apply is refused with the workspace as before and
/// the layer still holding everything the command made.
#[test]
fn a_tree_that_changed_since_review_is_not_placed_and_stays_in_the_layer() {
    let env = Env::new();
    put(&env.ws, "keep.txt", b"mine\n", 0o644);
    let before = tree(&env.ws);
    let (upper, _) = env.overlay("ovl", MAKE_GEN);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    fs::write(upper.join("gen/a/b/g50"), b"swapped after review\n").expect("tamper");
    let layer = tree(&upper.join("gen"));
    let (ws, store, journal) = env.open();

    let err = apply(&cs, &ws, &store, &journal, &consumed()).expect_err("applied a changed tree");
    assert!(
        matches!(err, Error::RolledBack { .. }),
        "unexpected error: {err:?}"
    );
    assert_tree("workspace after the refusal", &before, &tree(&env.ws));
    assert_tree("layer after the refusal", &layer, &tree(&upper.join("gen")));
}

/// A removed tree goes out whole into the kept files, and the undo brings
/// that very directory back; a tree holding a file past the kept files'
/// bound is removed path by path instead (ADR 0210's rule, whole or not).
#[test]
fn a_removed_tree_is_kept_whole_unless_a_file_is_too_big_to_keep() {
    let env = Env::new();
    for i in 0..100 {
        put(
            &env.ws,
            &format!("old/x/f{i}"),
            format!("{i}\n").as_bytes(),
            0o644,
        );
        put(
            &env.ws,
            &format!("big/f{i}"),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    put(&env.ws, "big/huge", &vec![7u8; 100 * 1024], 0o644);
    let before = tree(&env.ws);
    let old = ino(&env.ws.join("old"));
    let big = ino(&env.ws.join("big"));
    let (upper, merged) = env.overlay("ovl", "rm -rf old big");
    let after = tree(&merged);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();

    let e = apply(&cs, &ws, &store, &journal, &consumed()).expect("apply");
    assert_tree("after apply", &after, &tree(&env.ws));
    assert_eq!(kept_trees(&env, &e.id), vec![old], "old was not kept whole");

    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("after undo", &before, &tree(&env.ws));
    assert_eq!(ino(&env.ws.join("old")), old, "old did not come back whole");
    assert_ne!(
        ino(&env.ws.join("big")),
        big,
        "big cannot have been kept whole"
    );
}
