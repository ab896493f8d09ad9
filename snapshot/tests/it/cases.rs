//! Each kind of change applied, undone, redone and undone again, compared by
//! full tree hash (path, kind, mode, content or target).

use retie_snapshot::{
    apply, undo, ApplyOptions, ChangeKind, Changeset, ComputeOptions, EntryState, Error, Op,
    RelPath, UndoOptions,
};

use crate::common::{assert_tree, base_tree, put, tree, Env};

/// Runs `ops` in an overlay over the base tree, applies the changeset,
/// checks the workspace equals what the command saw, undoes it (back to
/// the original), redoes (undo of the undo) and undoes the redo.
fn roundtrip(name: &str, ops: &str) -> Changeset {
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let (upper, expected_dir) = env.overlay("ovl", ops);
    let after = tree(&expected_dir);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    assert!(cs.refused.is_empty(), "{name}: refused {:?}", cs.refused);
    assert!(cs.blocked.is_empty(), "{name}: blocked {:?}", cs.blocked);
    let (ws, store, journal) = env.open();

    let applied = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert_eq!(applied.state, EntryState::Complete);
    assert_eq!(applied.id, cs.id);
    assert_tree(&format!("{name}: after apply"), &after, &tree(&env.ws));

    let undone = undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_eq!(undone.op, Op::Undo { of: cs.id.clone() });
    assert_tree(&format!("{name}: after undo"), &before, &tree(&env.ws));

    let redone = undo(&undone.id, &ws, &store, &journal, &UndoOptions::default()).expect("redo");
    assert_tree(&format!("{name}: after redo"), &after, &tree(&env.ws));

    undo(&redone.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo redo");
    assert_tree(
        &format!("{name}: after undoing the redo"),
        &before,
        &tree(&env.ws),
    );
    assert_eq!(journal.entries().expect("entries").len(), 4);
    cs
}

fn kinds(cs: &Changeset) -> Vec<(String, ChangeKind)> {
    cs.changes
        .iter()
        .map(|c| (c.path.to_string(), c.kind))
        .collect()
}

#[test]
fn create() {
    let cs = roundtrip(
        "create",
        "echo new > new.txt; mkdir -p made/deep; echo x > made/deep/x; mkdir newempty; echo y > dir/sub/y",
    );
    let k = kinds(&cs);
    assert!(k.contains(&("new.txt".into(), ChangeKind::Created)));
    assert!(k.contains(&("made".into(), ChangeKind::Created)));
    assert!(k.contains(&("newempty".into(), ChangeKind::Created)));
    assert!(k.contains(&("dir/sub/y".into(), ChangeKind::Created)));
    let c = cs
        .changes
        .iter()
        .find(|c| c.path.as_str() == "new.txt")
        .expect("new.txt");
    assert_eq!(c.new_hash(), Some(retie_snapshot::Hash::of(b"new\n")));
    assert_eq!(c.base_hash(), None);
}

#[test]
fn modify() {
    let cs = roundtrip(
        "modify",
        "echo more >> a.txt; head -c 1000 /dev/zero > big.bin; echo changed > dir/sub/deeper/f3; touch dir/f1",
    );
    let k = kinds(&cs);
    assert!(k.contains(&("a.txt".into(), ChangeKind::Modified)));
    assert!(k.contains(&("big.bin".into(), ChangeKind::Modified)));
    // `touch` copies up without changing content or mode: not a change.
    assert!(!k.iter().any(|(p, _)| p == "dir/f1"), "{k:?}");
    let a = cs
        .changes
        .iter()
        .find(|c| c.path.as_str() == "a.txt")
        .expect("a.txt");
    assert_eq!(a.base_hash(), Some(retie_snapshot::Hash::of(b"hello\n")));
    assert_eq!(
        a.new_hash(),
        Some(retie_snapshot::Hash::of(b"hello\nmore\n"))
    );
}

#[test]
fn delete() {
    let cs = roundtrip("delete", "rm a.txt big.bin dir/sub/f2 link; rmdir emptydir");
    assert!(cs.changes.iter().all(|c| c.kind == ChangeKind::Deleted));
    assert_eq!(cs.changes.len(), 5);
}

#[test]
fn chmod() {
    let cs = roundtrip(
        "chmod",
        "chmod 600 a.txt; chmod 644 script.sh; chmod 700 dir; chmod 555 dir/sub; chmod 640 dir/sub/deeper/f3",
    );
    let k = kinds(&cs);
    for p in ["a.txt", "script.sh", "dir", "dir/sub"] {
        assert!(
            k.contains(&(p.into(), ChangeKind::ModeChanged)),
            "{p}: {k:?}"
        );
    }
}

#[test]
fn symlink() {
    let cs = roundtrip(
        "symlink",
        "ln -s dir/f1 newlink; ln -sfn script.sh link; ln -s /nonexistent/abs abslink; rm dirlink; ln -s dir dirlink",
    );
    let k = kinds(&cs);
    assert!(k.contains(&("newlink".into(), ChangeKind::Created)));
    assert!(k.contains(&("link".into(), ChangeKind::Modified)));
    assert!(k.contains(&("abslink".into(), ChangeKind::Created)));
}

#[test]
fn rename() {
    // Renaming a lower directory gives EXDEV in the overlay; mv copies.
    let cs = roundtrip(
        "rename",
        "mv a.txt b.txt; mv dir dir2; mv script.sh tree/t1/",
    );
    let k = kinds(&cs);
    assert!(k.contains(&("a.txt".into(), ChangeKind::Deleted)));
    assert!(k.contains(&("b.txt".into(), ChangeKind::Created)));
    assert!(k.contains(&("dir/sub/deeper/f3".into(), ChangeKind::Deleted)));
    assert!(k.contains(&("dir2/sub/deeper/f3".into(), ChangeKind::Created)));
}

#[test]
fn delete_directory_tree() {
    let cs = roundtrip("delete tree", "rm -rf tree dir/sub");
    assert_eq!(
        cs.changes
            .iter()
            .filter(|c| c.path.as_str().starts_with("tree"))
            .count(),
        25
    );
}

#[test]
fn replace_file_with_directory_and_back() {
    let cs = roundtrip(
        "replace",
        "rm a.txt; mkdir a.txt; echo inner > a.txt/inner; rm -rf dir; echo now-a-file > dir; \
         rm link; mkdir link; rm -rf emptydir; ln -s a.txt emptydir",
    );
    let k = kinds(&cs);
    assert!(k.contains(&("a.txt".into(), ChangeKind::TypeChanged)));
    assert!(k.contains(&("dir".into(), ChangeKind::TypeChanged)));
    assert!(k.contains(&("dir/sub/f2".into(), ChangeKind::Deleted)));
    assert!(k.contains(&("link".into(), ChangeKind::TypeChanged)));
    assert!(k.contains(&("emptydir".into(), ChangeKind::TypeChanged)));
}

#[test]
fn opaque_directory_recreated() {
    // rm -rf + mkdir of the same name makes an opaque directory: everything
    // of the lower's not in it is deleted, same-named files are compared.
    let cs = roundtrip(
        "opaque",
        "rm -rf dir; mkdir -p dir/sub; echo one > dir/f1; echo fresh > dir/sub/f2",
    );
    let k = kinds(&cs);
    assert!(
        !k.iter().any(|(p, _)| p == "dir/f1"),
        "unchanged content: {k:?}"
    );
    assert!(k.contains(&("dir/sub/f2".into(), ChangeKind::Modified)));
    assert!(k.contains(&("dir/sub/deeper".into(), ChangeKind::Deleted)));
}

#[test]
fn undo_refused_after_later_edit_and_allowed_with_force() {
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo sandbox > a.txt; echo n > new.txt");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    // A later edit by someone else.
    put(&env.ws, "a.txt", b"edited by the user\n", 0o644);
    let edited = tree(&env.ws);
    let err =
        undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect_err("must refuse");
    assert!(matches!(err, Error::UndoRefused { .. }), "{err}");
    let paths: Vec<_> = err
        .mismatched_paths()
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(paths, vec!["a.txt"]);
    assert!(err.to_string().contains("a.txt"), "{err}");
    assert_tree("refused undo touches nothing", &edited, &tree(&env.ws));

    let forced = undo(
        &cs.id,
        &ws,
        &store,
        &journal,
        &UndoOptions {
            force: true,
            ..UndoOptions::default()
        },
    )
    .expect("forced undo");
    assert_tree("forced undo restores the original", &before, &tree(&env.ws));
    // Undoing the forced undo brings the user's edit back.
    undo(&forced.id, &ws, &store, &journal, &UndoOptions::default()).expect("redo");
    assert_tree("redo of a forced undo", &edited, &tree(&env.ws));
}

#[test]
fn conflict_when_workspace_changed_after_base_applies_nothing() {
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay(
        "ovl",
        "echo sandbox >> a.txt; echo new > new.txt; rm dir/f1; echo s > script.sh",
    );
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    // The real workspace moves on while the command ran.
    put(&env.ws, "a.txt", b"concurrent edit\n", 0o644);
    put(&env.ws, "new.txt", b"also created outside\n", 0o644);
    let now = tree(&env.ws);
    let (ws, store, journal) = env.open();
    let err = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect_err("conflict");
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    let mut paths: Vec<_> = err
        .mismatched_paths()
        .iter()
        .map(|p| p.to_string())
        .collect();
    paths.sort();
    assert_eq!(paths, vec!["a.txt", "new.txt"]);
    assert_tree("conflict applies nothing", &now, &tree(&env.ws));
    assert!(journal.entries().expect("entries").is_empty());
}

#[test]
fn planted_git_hook_and_config_are_blocked() {
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let (upper, merged) = env.overlay(
        "ovl",
        "printf '#!/bin/sh\\ncurl evil\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; \
         printf '[core]\\n\\thooksPath = /tmp/h\\n' >> .git/config; mkdir -p sub/.git/hooks; \
         echo x > sub/.git/hooks/post-checkout; echo ok > fine.txt; mkdir -p .retie; echo forged > .retie/ledger",
    );
    let opts = ComputeOptions {
        protected: vec![RelPath::new(".retie").expect("valid")],
        ..ComputeOptions::default()
    };
    let cs = Changeset::compute_with(&env.ws, &upper, &opts).expect("compute");
    let blocked: Vec<_> = cs
        .blocked
        .iter()
        .map(|b| b.change.path.to_string())
        .collect();
    for p in [
        ".git/hooks/pre-commit",
        ".git/config",
        "sub/.git/hooks",
        "sub/.git/hooks/post-checkout",
        ".retie",
        ".retie/ledger",
    ] {
        assert!(
            blocked.contains(&p.to_string()),
            "{p} not blocked: {blocked:?}"
        );
    }
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert!(
        !env.ws.join(".git/hooks/pre-commit").exists(),
        "hook planted"
    );
    assert_eq!(
        std::fs::read(env.ws.join(".git/config")).expect("config"),
        b"[core]\n"
    );
    assert!(!env.ws.join(".retie").exists());
    assert!(env.ws.join("fine.txt").exists());
    // With the explicit flag they apply; undo still returns to the original.
    undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("undo", &before, &tree(&env.ws));
    let cs2 = Changeset::compute_with(&env.ws, &upper, &opts).expect("compute");
    let e = apply(
        &cs2,
        &ws,
        &store,
        &journal,
        &ApplyOptions {
            allow_blocked: true,
            ..ApplyOptions::default()
        },
    )
    .expect("apply allowed");
    assert_tree("allowed", &tree(&merged), &tree(&env.ws));
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("undo allowed", &before, &tree(&env.ws));
}

#[test]
fn apply_twice_is_refused_and_blobs_dedup() {
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "cp big.bin big2.bin; cp big.bin big3.bin");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    let err = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect_err("twice");
    assert!(matches!(err, Error::EntryState { .. }), "{err}");
    // Undo stores both copies' pre-images: one blob.
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    let h = cs.changes[0].new_hash().expect("hash");
    assert!(store.contains(&h));
    let blobs = walkdir_count(&env.state.join("blobs"));
    assert_eq!(blobs, 1, "one blob for identical content");
}

fn walkdir_count(d: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(d).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            n += walkdir_count(&p);
        } else {
            n += 1;
        }
    }
    n
}

#[test]
fn journal_ids_are_not_paths_and_unknown_ids_are_reported() {
    let env = Env::new();
    base_tree(&env.ws);
    let (ws, store, journal) = env.open();
    for bad in ["../../etc/passwd", "a/b", "", ".hidden"] {
        let err = undo(bad, &ws, &store, &journal, &UndoOptions::default()).expect_err("refused");
        assert!(matches!(err, Error::InvalidPath { .. }), "{bad:?}: {err}");
    }
    let err = undo(
        "0123456789abcdef",
        &ws,
        &store,
        &journal,
        &UndoOptions::default(),
    )
    .expect_err("unknown");
    assert!(matches!(err, Error::UnknownEntry { .. }), "{err}");
}

/// `apply_alongside`: the workspace is not touched until the recording
/// running alongside has returned (it sees the old content even after a
/// pause long enough for an apply that did not wait to have finished),
/// and a recording that fails leaves the workspace as it was and the
/// entry rolled back.
#[test]
fn apply_alongside_touches_nothing_before_the_recording_returns() {
    use retie_snapshot::apply_alongside;
    let env = Env::new();
    put(&env.ws, "f", b"old\n", 0o644);
    let (upper, _) = env.overlay("ovl", "printf 'new\\n' > f");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let path = env.ws.join("f");

    // Refused: nothing touched, the entry rolled back, NotRecorded.
    let r = apply_alongside(&cs, &ws, &store, &journal, &ApplyOptions::default(), || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        false
    });
    assert!(matches!(r, Err(Error::NotRecorded { .. })), "{r:?}");
    assert_eq!(std::fs::read(&path).expect("read"), b"old\n");
    assert_eq!(
        journal.get(&cs.id).expect("entry").state,
        EntryState::RolledBack
    );

    // Accepted: during the recording the workspace still holds the base.
    let (upper2, _) = env.overlay("ovl2", "printf 'new\\n' > f");
    let cs2 = Changeset::compute(&env.ws, &upper2).expect("compute");
    let seen = std::sync::Mutex::new(Vec::new());
    let entry = apply_alongside(
        &cs2,
        &ws,
        &store,
        &journal,
        &ApplyOptions::default(),
        || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            seen.lock()
                .expect("lock")
                .push(std::fs::read(&path).expect("read"));
            true
        },
    )
    .expect("apply");
    assert_eq!(entry.state, EntryState::Complete);
    assert_eq!(seen.into_inner().expect("lock"), vec![b"old\n".to_vec()]);
    assert_eq!(std::fs::read(&path).expect("read"), b"new\n");
}

/// A journal of the older layout (pending files and temporaries beside
/// the finished entries) is taken over when first opened: its pending
/// entry is still found (and recovered), its temporary is gone, and from
/// then on finding pending entries lists `journal/open/` only.
#[test]
fn a_journal_of_the_older_layout_keeps_its_pending_entries() {
    use retie_snapshot::{recover, Entry, Journal, JOURNAL_VERSION};
    let env = Env::new();
    let jdir = env.state.join("journal");
    std::fs::create_dir_all(&jdir).expect("mkdir");
    let ws = std::fs::canonicalize(&env.ws).expect("canonical ws");
    let e = Entry {
        version: JOURNAL_VERSION,
        id: "0123456789abcdef".into(),
        seq: 1,
        workspace: ws,
        op: Op::FileWrite,
        state: EntryState::Pending,
        created_unix_ms: 0,
        steps: Vec::new(),
        raced: Vec::new(),
        manifest: None,
    };
    std::fs::write(
        jdir.join("0123456789abcdef.pending.json"),
        serde_json::to_vec(&e).expect("json"),
    )
    .expect("write legacy pending");
    std::fs::write(jdir.join(".fedcba9876543210.json.tmp"), b"{").expect("write temp");
    let journal = Journal::open(&env.state).expect("open");
    assert!(jdir.join("open").is_dir());
    assert!(!jdir.join(".fedcba9876543210.json.tmp").exists());
    let pending = journal.pending().expect("pending");
    assert_eq!(pending.len(), 1, "{pending:?}");
    let (ws, store, journal) = env.open();
    let report = recover(&ws, &store, &journal).expect("recover");
    assert_eq!(report.rolled_back, vec!["0123456789abcdef".to_string()]);
    assert!(journal.pending().expect("pending").is_empty());
    assert_eq!(
        journal.get("0123456789abcdef").expect("entry").state,
        EntryState::RolledBack
    );
}

/// An apply is completed by moving its pending entry, synced when it was
/// written, to the entry's final name (ADR 0407): `open/` is left empty,
/// the bytes on disk still say `pending`, and every reader takes the entry
/// as complete (undo accepts it). A crash that leaves both names is read
/// as complete too: recovery removes the pending name and rolls nothing
/// back.
#[test]
fn an_apply_is_completed_by_moving_its_pending_entry() {
    use retie_snapshot::recover;
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let (upper, expected_dir) = env.overlay("ovl", "echo new > new.txt; echo changed > a.txt");
    let after = tree(&expected_dir);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let applied = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert_eq!(applied.state, EntryState::Complete);

    let jdir = env.state.join("journal");
    let open: Vec<_> = std::fs::read_dir(jdir.join("open"))
        .expect("open/")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(open.is_empty(), "open/ after a complete apply: {open:?}");
    let final_path = jdir.join(format!("{}.json", cs.id));
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&final_path).expect("final entry")).expect("json");
    assert_eq!(
        raw["state"], "pending",
        "the pending bytes were moved, not rewritten"
    );
    assert_eq!(
        journal.get(&cs.id).expect("get").state,
        EntryState::Complete
    );
    let listed = journal.entries().expect("entries");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, EntryState::Complete);
    assert!(journal.pending().expect("pending").is_empty());

    // A crash that left both names: the entry is complete, nothing is
    // rolled back, and recovery removes the pending name.
    let pending_path = jdir.join("open").join(format!("{}.pending.json", cs.id));
    std::fs::hard_link(&final_path, &pending_path).expect("link");
    assert!(journal.pending().expect("pending").is_empty());
    let report = recover(&ws, &store, &journal).expect("recover");
    assert!(report.rolled_back.is_empty(), "{report:?}");
    assert!(!pending_path.exists());
    assert_tree("after recovery", &after, &tree(&env.ws));

    undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("after undo", &before, &tree(&env.ws));
}

/// The pre-images are made durable side by side with the pending entry
/// that names them, so a crash can leave a durable pending entry whose
/// blobs were never stored. The workspace is touched only after both, so
/// it is still as the entry's pre-images say, and recovery rolls the entry
/// back without reading a blob (a roll-back that read one would fail here
/// with a missing blob).
#[test]
fn a_pending_entry_whose_pre_images_were_never_stored_rolls_back() {
    use retie_snapshot::{recover, Entry, Hash, Journal, Node, Step, JOURNAL_VERSION};
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let content = std::fs::read(env.ws.join("a.txt")).expect("a.txt");
    let ws_path = std::fs::canonicalize(&env.ws).expect("canonical ws");
    let (ws, store, journal) = env.open();
    let hash = Hash::of(&content);
    assert!(!store.contains(&hash), "the pre-image is not in the store");
    let e = Entry {
        version: JOURNAL_VERSION,
        id: "00112233445566aa".into(),
        seq: 1,
        workspace: ws_path,
        op: Op::FileWrite,
        state: EntryState::Pending,
        created_unix_ms: 0,
        steps: vec![Step {
            path: RelPath::new("a.txt").expect("path"),
            before: Some(Node::File {
                mode: 0o644,
                size: content.len() as u64,
                hash,
            }),
            after: Some(Node::File {
                mode: 0o644,
                size: 3,
                hash: Hash::of(b"new"),
            }),
            before_content: None,
        }],
        raced: Vec::new(),
        manifest: None,
    };
    let open = env.state.join("journal").join("open");
    std::fs::write(
        open.join("00112233445566aa.pending.json"),
        serde_json::to_vec(&e).expect("json"),
    )
    .expect("write pending");
    drop(journal);
    // After the crash, somebody edits the file: recovery must not need
    // (or restore) a pre-image that was never stored.
    std::fs::write(env.ws.join("a.txt"), "edited after the crash\n").expect("edit");
    let edited = tree(&env.ws);
    assert_ne!(edited, before);
    let journal = Journal::open(&env.state).expect("journal");
    let report = recover(&ws, &store, &journal).expect("recover");
    assert_eq!(report.rolled_back, vec!["00112233445566aa".to_string()]);
    assert_tree("after recovery", &edited, &tree(&env.ws));
    assert_eq!(
        journal.get("00112233445566aa").expect("entry").state,
        EntryState::RolledBack
    );
}

/// A changeset applied again after its first apply was rolled back, cut
/// short by a crash: its pending entry (a newer `seq`) is not hidden by the
/// earlier, rolled-back entry of the same id, and recovery rolls it back.
#[test]
fn a_re_apply_cut_short_is_recovered_despite_the_earlier_rolled_back_entry() {
    use retie_snapshot::{recover, Entry, Hash, Node, Step, JOURNAL_VERSION};
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let ws_path = std::fs::canonicalize(&env.ws).expect("canonical ws");
    let (ws, store, journal) = env.open();
    let old = std::fs::read(env.ws.join("a.txt")).expect("a.txt");
    let hash = store.put_bytes(&old).expect("pre-image");
    let step = Step {
        path: RelPath::new("a.txt").expect("path"),
        before: Some(Node::File {
            mode: 0o644,
            size: old.len() as u64,
            hash,
        }),
        after: Some(Node::File {
            mode: 0o644,
            size: 8,
            hash: Hash::of(b"changed\n"),
        }),
        before_content: None,
    };
    let mut e = Entry {
        version: JOURNAL_VERSION,
        id: "0a1b2c3d4e5f6071".into(),
        seq: 1,
        workspace: ws_path,
        op: Op::FileWrite,
        state: EntryState::RolledBack,
        created_unix_ms: 0,
        steps: vec![step],
        raced: Vec::new(),
        manifest: None,
    };
    let jdir = env.state.join("journal");
    std::fs::write(
        jdir.join("0a1b2c3d4e5f6071.json"),
        serde_json::to_vec(&e).expect("json"),
    )
    .expect("rolled-back entry");
    e.seq = 2;
    e.state = EntryState::Pending;
    std::fs::write(
        jdir.join("open").join("0a1b2c3d4e5f6071.pending.json"),
        serde_json::to_vec(&e).expect("json"),
    )
    .expect("pending re-apply");
    // The re-apply had reached the workspace.
    std::fs::write(env.ws.join("a.txt"), "changed\n").expect("half-applied");
    assert_eq!(journal.pending().expect("pending").len(), 1);
    let report = recover(&ws, &store, &journal).expect("recover");
    assert_eq!(report.rolled_back, vec!["0a1b2c3d4e5f6071".to_string()]);
    assert_tree("after recovery", &before, &tree(&env.ws));
}

/// Many files with one small content: the entry carries it once (the
/// per-entry budget counts what is written), and undo restores them all.
#[test]
fn one_content_in_many_files_is_carried_once() {
    let env = Env::new();
    base_tree(&env.ws);
    for i in 0..8 {
        put(&env.ws, &format!("same/{i}.txt"), &[b'x'; 10_000], 0o644);
    }
    let before = tree(&env.ws);
    let (upper, _) = env.overlay(
        "ovl",
        "for i in 0 1 2 3 4 5 6 7; do echo new > same/$i.txt; done",
    );
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    let entry = journal.get(&cs.id).expect("entry");
    let carried = entry
        .steps
        .iter()
        .filter(|s| s.before_content.is_some())
        .count();
    assert_eq!(carried, 1, "{} steps", entry.steps.len());
    undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("after undo", &before, &tree(&env.ws));
}

/// A small file's pre-image rides in the journal entry itself, durable
/// with it, and goes to the blob store only when an undo reads it back; a
/// large one is in the store before the workspace is touched. A carried
/// content that does not hash to its pre-image (a damaged journal) is
/// refused and nothing is touched.
#[test]
fn small_pre_images_ride_in_the_entry_and_are_stored_when_read_back() {
    use retie_snapshot::Hash;
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let small = std::fs::read(env.ws.join("a.txt")).expect("a.txt");
    let big = std::fs::read(env.ws.join("big.bin")).expect("big.bin");
    let (upper, expected_dir) =
        env.overlay("ovl", "echo changed > a.txt; echo changed too > big.bin");
    let after = tree(&expected_dir);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    let entry = journal.get(&cs.id).expect("entry");
    let step = |p: &str| {
        entry
            .steps
            .iter()
            .find(|s| s.path.as_str() == p)
            .expect("step")
            .clone()
    };
    assert_eq!(step("a.txt").before_content.as_deref(), Some(&small[..]));
    assert!(
        !store.contains(&Hash::of(&small)),
        "small pre-image stored at apply"
    );
    assert_eq!(step("big.bin").before_content, None);
    assert!(
        store.contains(&Hash::of(&big)),
        "large pre-image not stored"
    );

    // A damaged carried content: refused, nothing touched.
    let final_path = env.state.join("journal").join(format!("{}.json", cs.id));
    let mut raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&final_path).expect("read")).expect("json");
    let good = raw.clone();
    for s in raw["steps"].as_array_mut().expect("steps") {
        if s["path"] == "a.txt" {
            s["before_content"] = serde_json::json!("Zm9yZ2VkCg==");
        }
    }
    std::fs::write(&final_path, serde_json::to_vec(&raw).expect("json")).expect("write");
    let err = undo(&cs.id, &ws, &store, &journal, &UndoOptions::default())
        .expect_err("a damaged pre-image must be refused");
    assert!(matches!(err, Error::SourceChanged { .. }), "{err:?}");
    assert_tree("after the refused undo", &after, &tree(&env.ws));

    std::fs::write(&final_path, serde_json::to_vec(&good).expect("json")).expect("write");
    undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("after undo", &before, &tree(&env.ws));
    assert!(store.contains(&Hash::of(&small)), "stored when read back");
}

/// A pre-image that cannot be stored (its shard is in the way) fails the
/// apply before anything is touched: the error says so, the entry written
/// alongside is closed as rolled back at once (nothing is left pending),
/// and no temporary stays behind.
#[test]
fn a_pre_image_that_cannot_be_stored_fails_the_apply_and_touches_nothing() {
    use retie_snapshot::Hash;
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let big = std::fs::read(env.ws.join("big.bin")).expect("big.bin");
    let (upper, _) = env.overlay("ovl", "echo changed > big.bin; echo new > n.txt");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let shard = env.state.join("blobs").join(&Hash::of(&big).to_hex()[..2]);
    std::fs::write(&shard, b"in the way").expect("file where the shard goes");
    let err = apply(&cs, &ws, &store, &journal, &ApplyOptions::default())
        .expect_err("the pre-image cannot be stored");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_tree("after the failed apply", &before, &tree(&env.ws));
    assert!(journal.pending().expect("pending").is_empty());
    assert_eq!(
        journal.get(&cs.id).expect("entry").state,
        EntryState::RolledBack
    );
    assert_eq!(
        std::fs::read_dir(env.state.join("tmp"))
            .expect("tmp")
            .count(),
        0,
        "temporaries left"
    );
}

/// ADR 0209: a manifest handed to the apply and to the undo is stored in
/// the blob store with the pre-images, named by the journal entry, reads
/// back as every path of the change, and `gc` keeps it as long as the
/// entry can be undone.
#[test]
fn a_manifest_is_stored_with_the_change_and_kept_while_it_can_be_undone() {
    use retie_snapshot::{gc, GcOptions, Manifest};
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay(
        "ovl",
        "for i in $(seq 1 80); do echo $i > n$i; done; rm dir/f1; echo more >> a.txt",
    );
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let m = Manifest::of_changeset(&cs, false);
    assert_eq!((m.created, m.deleted, m.modified), (80, 1, 1), "{m:?}");
    let (ws, store, journal) = env.open();
    let opts = ApplyOptions {
        manifest: Some(m.clone()),
        ..ApplyOptions::default()
    };
    let e = apply(&cs, &ws, &store, &journal, &opts).expect("apply");
    assert_eq!(e.manifest, Some(m.hash), "the entry names its manifest");
    let back = Manifest::parse(&store.read(&m.hash).expect("stored"), &m.hash).expect("parses");
    let mut want: Vec<&str> = cs.changes.iter().map(|c| c.path.as_str()).collect();
    want.sort();
    assert_eq!(
        back.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(),
        want
    );

    let um = Manifest::of_undo(&journal.get(&e.id).expect("entry"));
    assert_eq!(
        (um.created, um.deleted),
        (1, 80),
        "the undo's is the other way round"
    );
    let u = undo(
        &e.id,
        &ws,
        &store,
        &journal,
        &UndoOptions {
            manifest: Some(um.clone()),
            ..UndoOptions::default()
        },
    )
    .expect("undo");
    assert_eq!(u.manifest, Some(um.hash));
    gc(&store, &journal, &GcOptions::default()).expect("gc");
    assert!(
        store.contains(&m.hash) && store.contains(&um.hash),
        "gc kept both"
    );
    // Once the entries expire, their manifests go with their pre-images.
    gc(
        &store,
        &journal,
        &GcOptions {
            expire_before_ms: Some(u64::MAX),
            dry_run: false,
        },
    )
    .expect("gc");
    assert!(
        !store.contains(&m.hash) && !store.contains(&um.hash),
        "gc removed both"
    );
}

/// The files `id`'s transition kept (ADR 0210), by content.
fn kept_files(env: &Env, id: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let d = env.state.join("kept").join(id);
    let Ok(rd) = std::fs::read_dir(&d) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).expect("read kept")))
        .collect()
}

fn ino(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).expect("stat").ino()
}

/// ADR 0210: what an apply takes out of the workspace (a replaced file, a
/// removed one) is kept, and its undo puts those very files back, with a
/// modification time of now (a build tool sees them changed, as after a
/// copy); the kept directory is retired at the undo and swept by `gc`.
#[test]
fn an_undo_takes_back_the_files_the_apply_took_out() {
    use retie_snapshot::{gc, GcOptions};
    use std::time::{Duration, SystemTime};
    let env = Env::new();
    base_tree(&env.ws);
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(978_307_200); // 2001-01-01
    for p in ["a.txt", "dir/f1"] {
        std::fs::File::options()
            .write(true)
            .open(env.ws.join(p))
            .and_then(|f| f.set_modified(old))
            .expect("set mtime");
    }
    let (a_ino, f1_ino) = (ino(&env.ws.join("a.txt")), ino(&env.ws.join("dir/f1")));
    let before = tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo more >> a.txt; rm dir/f1");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert_eq!(kept_files(&env, &e.id).len(), 2, "both kept");
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("undone", &before, &tree(&env.ws));
    assert_eq!(
        ino(&env.ws.join("a.txt")),
        a_ino,
        "the replaced file came back"
    );
    assert_eq!(
        ino(&env.ws.join("dir/f1")),
        f1_ino,
        "the removed file came back"
    );
    for p in ["a.txt", "dir/f1"] {
        let m = std::fs::metadata(env.ws.join(p))
            .and_then(|m| m.modified())
            .expect("mtime");
        assert!(m > old, "{p}: restored with its old modification time");
    }
    assert!(
        !env.state.join("kept").join(&e.id).exists(),
        "retired at the undo"
    );
    gc(&store, &journal, &GcOptions::default()).expect("gc");
    let left: Vec<_> = std::fs::read_dir(env.state.join("kept"))
        .expect("kept dir")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(".done-"))
        .collect();
    assert!(left.is_empty(), "swept by gc: {left:?}");
}

/// ADR 0210: a kept file is only a cache. One written to since (through a
/// descriptor held open, say) is not put back: the pre-image comes from
/// the store, and the undo gives the workspace as it was.
#[test]
fn a_kept_file_changed_since_is_not_put_back() {
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo more >> a.txt; rm dir/f1");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    let kept = kept_files(&env, &e.id);
    assert_eq!(kept.len(), 2, "both kept");
    for (p, content) in &kept {
        // Same size, other bytes.
        let other: Vec<u8> = content.iter().map(|b| b ^ 0x20).collect();
        std::fs::write(p, other).expect("write kept");
    }
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("undone from the store", &before, &tree(&env.ws));
}

/// ADR 0210: a kept file that has gained a link (to a name outside the
/// workspace) is not put back: the workspace's file would be that
/// outside file too. The pre-image is copied from the store instead.
#[test]
fn a_kept_file_with_another_link_is_not_put_back() {
    let env = Env::new();
    base_tree(&env.ws);
    let before = tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo more >> a.txt");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    let kept = kept_files(&env, &e.id);
    assert_eq!(kept.len(), 1, "kept");
    let outside = env.out.join("linked");
    std::fs::hard_link(&kept[0].0, &outside).expect("link");
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("undone", &before, &tree(&env.ws));
    assert_ne!(
        ino(&env.ws.join("a.txt")),
        ino(&outside),
        "the workspace's file is not the outside one"
    );
}

/// Whether an entry was undone is answered by the journal's marker, not
/// by reading every entry (ADR 0212): it holds with another entry's file
/// unreadable, which a scan of the journal would trip over; an apply not
/// undone has no answer, and a redo (the undo of the undo) is found for
/// the undo.
#[test]
fn an_undo_is_found_by_its_marker_without_reading_the_journal() {
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo changed > a.txt\nmkdir fresh\necho x > fresh/f");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert!(journal.undone_by(&cs.id).is_none(), "applied, not undone");
    let u = undo(&cs.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    // Another entry's file, unreadable as an entry: a scan fails on it.
    std::fs::write(journal.dir().join("0000000000000000.json"), b"{ not json").expect("junk");
    assert!(
        journal.entries().is_err(),
        "the scan trips over the broken entry"
    );
    let found = journal.undone_by(&cs.id).expect("the undo is found");
    assert_eq!(found.id, u.id);
    assert!(matches!(&found.op, Op::Undo { of } if *of == cs.id));
    std::fs::remove_file(journal.dir().join("0000000000000000.json")).expect("rm junk");
    let redo = undo(&u.id, &ws, &store, &journal, &UndoOptions::default()).expect("redo");
    assert_eq!(journal.undone_by(&u.id).map(|e| e.id), Some(redo.id));
}

/// A temp left under the very name an apply uses for a path (an earlier
/// run of the same changeset cut short) is replaced, not a failure: the
/// apply no longer removes the name before every file (ADR 0212), only
/// when making the temp finds it taken.
#[test]
fn a_temp_left_under_the_applys_own_name_is_replaced() {
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, expected) = env.overlay("ovl", "echo changed > a.txt\necho new > dir/new.txt");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let paths: Vec<String> = cs.changes.iter().map(|c| c.path.to_string()).collect();
    assert_eq!(paths, ["a.txt", "dir/new.txt"], "targets in path order");
    // Index 0 is a.txt (in the root), 1 is dir/new.txt.
    put(
        &env.ws,
        &format!(".retie-tmp-{}-0", cs.id),
        b"stale one\n",
        0o644,
    );
    put(
        &env.ws,
        &format!("dir/.retie-tmp-{}-1", cs.id),
        b"stale two\n",
        0o600,
    );
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert_eq!(
        std::fs::read(env.ws.join("a.txt")).expect("a"),
        b"changed\n"
    );
    assert_eq!(
        std::fs::read(env.ws.join("dir/new.txt")).expect("n"),
        b"new\n"
    );
    assert!(!env.ws.join(format!(".retie-tmp-{}-0", cs.id)).exists());
    assert!(!env.ws.join(format!("dir/.retie-tmp-{}-1", cs.id)).exists());
    assert_tree("after apply", &tree(&expected), &tree(&env.ws));
}
