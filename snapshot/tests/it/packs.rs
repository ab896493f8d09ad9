//! ADR 0214: a batch of many small pre-images stores them in one pack
//! (one file written and synced, one rename) instead of a loose blob each;
//! what reads the store finds them there, `gc` keeps a pack's live blobs
//! and drops the rest, and a damaged pack is named, not taken for a blob
//! that was never stored.

use std::fs;
use std::path::{Path, PathBuf};

use retie_snapshot::{
    apply, gc, undo, ApplyOptions, Changeset, Entry, Error, GcOptions, Hash, Node, Store,
    UndoOptions,
};

use crate::common::{noise, put, Env};

/// 200 files of 4 KiB, each its own content: more than an entry carries
/// itself (ADR 0408), so most pre-images go to the store.
fn two_hundred(env: &Env, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..200)
        .map(|i| {
            let p = format!("tree/f{i:03}");
            let c = noise(seed + i, 4096);
            put(&env.ws, &p, &c, 0o644);
            (p, c)
        })
        .collect()
}

const REWRITE_ALL: &str = "for f in tree/*; do echo new > $f; done";

fn files_in(d: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(d).expect("read dir").flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(files_in(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

fn packs(env: &Env) -> Vec<PathBuf> {
    files_in(&env.state.join("packs"))
}

/// Applies `ops` run over the workspace.
fn applied(env: &Env, name: &str, ops: &str) -> Entry {
    let (upper, _) = env.overlay(name, ops);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply")
}

fn undone(env: &Env, id: &str) -> retie_snapshot::Result<Entry> {
    let (ws, store, journal) = env.open();
    undo(id, &ws, &store, &journal, &UndoOptions::default())
}

/// The pre-images the entry does not carry itself.
fn stored_pre_images(e: &Entry) -> Vec<Hash> {
    e.steps
        .iter()
        .filter(|s| s.before_content.is_none())
        .filter_map(|s| s.before.as_ref().and_then(Node::hash))
        .collect()
}

#[test]
fn a_big_rewrite_packs_its_pre_images_and_an_undo_reads_them_back() {
    let env = Env::new();
    let old = two_hundred(&env, 1);
    let e = applied(&env, "ovl", REWRITE_ALL);
    let stored = stored_pre_images(&e);
    assert!(stored.len() > 100, "{} pre-images stored", stored.len());
    assert_eq!(packs(&env).len(), 1, "one pack: {:?}", packs(&env));
    assert!(
        files_in(&env.state.join("blobs")).is_empty(),
        "no loose blob: {:?}",
        files_in(&env.state.join("blobs"))
    );
    // Another process's view of the store (nothing read yet) finds each.
    let fresh = Store::open(&env.state).expect("store");
    for h in &stored {
        assert!(fresh.contains(h), "{h} not found");
    }
    // The kept files gone, the undo reads every pre-image from the store.
    fs::remove_dir_all(env.state.join("kept")).expect("remove kept");
    undone(&env, &e.id).expect("undo");
    for (p, c) in &old {
        assert_eq!(&fs::read(env.ws.join(p)).expect("read"), c, "{p}");
    }
}

#[test]
fn gc_keeps_a_packs_live_blobs_and_removes_the_rest() {
    let env = Env::new();
    let old = two_hundred(&env, 7);
    let a = applied(&env, "a", REWRITE_ALL);
    let pack_a = packs(&env);
    assert_eq!(pack_a.len(), 1);
    // B puts 40 of A's packed pre-images back as they were (the first 64
    // ride in A's entry): those stay needed (B's targets) once A expires;
    // A's other pre-images do not.
    let old = &old[100..];
    let back: String = old[..40]
        .iter()
        .map(|(p, _)| format!("cp ../orig/{p} {p}; "))
        .collect();
    let orig = env.tmp.path().join("orig");
    for (p, c) in &old[..40] {
        put(&orig, p, c, 0o644);
    }
    // The overlay runs in the workspace; the originals sit beside it.
    let ops = back.replace("../orig", orig.to_str().expect("utf-8"));
    std::thread::sleep(std::time::Duration::from_millis(5));
    let b = applied(&env, "b", &ops);
    let (_, store, journal) = env.open();
    let live: Vec<Hash> = old[..40].iter().map(|(_, c)| Hash::of(c)).collect();
    let dead: Vec<Hash> = stored_pre_images(&a)
        .into_iter()
        .filter(|h| !live.contains(h))
        .collect();
    assert!(dead.len() > 90, "{}", dead.len());
    let r = gc(
        &store,
        &journal,
        &GcOptions {
            expire_before_ms: Some(a.created_unix_ms + 1),
            dry_run: false,
        },
    )
    .expect("gc");
    assert_eq!(r.expired, vec![a.id.clone()]);
    assert!(!pack_a[0].exists(), "A's pack rewritten");
    let fresh = Store::open(&env.state).expect("store");
    for h in &live {
        assert!(fresh.contains(h), "a live blob of A's pack is gone");
    }
    for h in &dead {
        assert!(!fresh.contains(h), "a dead blob of A's pack is kept");
    }
    // B still undoes (its pre-images, "new", and A's it put back).
    fs::remove_dir_all(env.state.join("kept")).ok();
    undone(&env, &b.id).expect("undo B");
    for (p, _) in &old[..40] {
        assert_eq!(fs::read(env.ws.join(p)).expect("read"), b"new\n", "{p}");
    }
}

#[test]
fn a_damaged_pack_is_named_when_a_blob_is_not_found() {
    let env = Env::new();
    two_hundred(&env, 13);
    let e = applied(&env, "ovl", REWRITE_ALL);
    let pack = packs(&env).pop().expect("a pack");
    let bytes = fs::read(&pack).expect("read pack");
    fs::write(&pack, &bytes[..bytes.len() - 1]).expect("truncate");
    fs::remove_dir_all(env.state.join("kept")).expect("remove kept");
    let err = undone(&env, &e.id).expect_err("no pre-image to read");
    let Error::RolledBack { source, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(matches!(**source, Error::DamagedPack { .. }), "{source:?}");
    assert!(
        source.to_string().contains(&pack.display().to_string()),
        "{source}"
    );
    for f in files_in(&env.ws.join("tree")) {
        assert_eq!(fs::read(&f).expect("read"), b"new\n", "left as applied");
    }
}
