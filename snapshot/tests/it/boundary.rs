//! Whatever the upper layer or the workspace holds, apply and undo never
//! write outside the workspace; special files are refused.

use std::fs;
use std::os::unix::fs::symlink;

use retie_snapshot::{apply, undo, ApplyOptions, Changeset, Error, RefuseReason, UndoOptions};

use crate::common::{assert_tree, base_tree, overlay, put, tree, Env};

/// Whether we run as root: a directory we just created is owned by uid 0.
fn is_root(env: &Env) -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(env.tmp.path()).expect("stat").uid() == 0
}

#[test]
fn fifo_socket_and_device_in_upper_are_refused() {
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "mkfifo pipe; mkfifo dir/pipe2; echo ok > ok.txt");
    // A socket, and (as root) device nodes, placed in the upper directly.
    let _sock = std::os::unix::net::UnixListener::bind(upper.join("sock")).expect("bind socket");
    let mut expect_devices = false;
    if is_root(&env) {
        for (name, kind) in [("null", "c"), ("disk", "b")] {
            let st = std::process::Command::new("mknod")
                .arg(upper.join(name))
                .args([kind, "1", "3"])
                .status()
                .expect("mknod");
            assert!(st.success(), "mknod as root failed");
        }
        expect_devices = true;
    } else {
        eprintln!("not root: device nodes cannot be created; testing fifo and socket only");
    }
    let before = tree(&env.ws);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let refused: Vec<_> = cs
        .refused
        .iter()
        .map(|r| (r.path.as_str(), &r.reason))
        .collect();
    assert!(
        refused.contains(&("pipe", &RefuseReason::Fifo)),
        "{refused:?}"
    );
    assert!(
        refused.contains(&("dir/pipe2", &RefuseReason::Fifo)),
        "{refused:?}"
    );
    assert!(
        refused.contains(&("sock", &RefuseReason::Socket)),
        "{refused:?}"
    );
    if expect_devices {
        assert!(refused.contains(&("null", &RefuseReason::CharDevice { major: 1, minor: 3 })));
        assert!(refused.contains(&("disk", &RefuseReason::BlockDevice { major: 1, minor: 3 })));
    }
    assert_eq!(cs.changes.len(), 1, "{:?}", cs.changes);
    let (ws, store, journal) = env.open();
    apply(
        &cs,
        &ws,
        &store,
        &journal,
        &ApplyOptions {
            allow_blocked: true,
            ..ApplyOptions::default()
        },
    )
    .expect("apply");
    let mut want = before.clone();
    want.insert("ok.txt".into(), tree(&env.ws)["ok.txt"].clone());
    assert_tree("only ok.txt applied", &want, &tree(&env.ws));
}

#[test]
fn symlink_to_outside_is_applied_as_a_link_never_written_through() {
    let env = Env::new();
    base_tree(&env.ws);
    put(&env.out, "target", b"outside\n", 0o644);
    let outside_before = tree(&env.out);
    let passwd_before = fs::read("/etc/passwd").expect("read /etc/passwd");
    let t = env.out.join("target");
    let (upper, _) = env.overlay(
        "ovl",
        &format!(
            "ln -s /etc/passwd pw; ln -s {} x; ln -s {} outdir",
            t.display(),
            env.out.display()
        ),
    );
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert_eq!(
        fs::read_link(env.ws.join("pw")).expect("link"),
        std::path::Path::new("/etc/passwd")
    );

    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("outside untouched", &outside_before, &tree(&env.out));
    assert_eq!(fs::read("/etc/passwd").expect("read"), passwd_before);
}

#[test]
fn symlinked_directory_in_lower_is_replaced_not_followed() {
    // The lower has `d -> outside`; an upper (crafted, as any upper may be)
    // holds a real directory `d` with a file. Apply must replace the link
    // with a directory inside the workspace, never write into `outside`.
    let env = Env::new();
    put(&env.ws, "keep", b"k\n", 0o644);
    symlink(&env.out, env.ws.join("d")).expect("symlink");
    put(&env.out, "victim", b"original\n", 0o644);
    let outside_before = tree(&env.out);
    let before = tree(&env.ws);
    let upper = env.tmp.path().join("crafted-upper");
    put(&upper, "d/victim", b"overwritten\n", 0o644);
    put(&upper, "d/new", b"planted\n", 0o644);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    let e = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert!(fs::symlink_metadata(env.ws.join("d"))
        .expect("lstat")
        .is_dir());
    assert_eq!(
        fs::read(env.ws.join("d/victim")).expect("read"),
        b"overwritten\n"
    );
    assert_tree("outside untouched", &outside_before, &tree(&env.out));
    undo(&e.id, &ws, &store, &journal, &UndoOptions::default()).expect("undo");
    assert_tree("undo restores the link", &before, &tree(&env.ws));
}

#[test]
fn symlink_replacing_a_directory_after_compute_cannot_redirect_apply_or_undo() {
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo sandbox > dir/sub/f2; echo n > dir/sub/new");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let upper2 = env.tmp.path().join("crafted-upper");
    put(&upper2, "dir/sub/planted", b"x\n", 0o644);
    let cs2 = Changeset::compute(&env.ws, &upper2).expect("compute");
    // Someone swaps dir/sub for a symlink to a directory outside holding
    // identical files, so a content check alone would pass.
    fs::remove_dir_all(env.ws.join("dir/sub")).expect("rm");
    put(&env.out, "f2", b"two\n", 0o600);
    symlink(&env.out, env.ws.join("dir/sub")).expect("symlink");
    let outside_before = tree(&env.out);
    let ws_before = tree(&env.ws);
    let (ws, store, journal) = env.open();
    // In the no-follow view dir/sub/f2 is gone: a conflict, nothing applied.
    let err = apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect_err("refused");
    assert!(matches!(err, Error::Conflict { .. }), "{err}");
    assert_tree("outside untouched", &outside_before, &tree(&env.out));
    assert_tree("workspace untouched", &ws_before, &tree(&env.ws));
    // A changeset that only creates beneath the swapped directory (so no
    // base can conflict) is refused at the boundary.
    let err = apply(&cs2, &ws, &store, &journal, &ApplyOptions::default()).expect_err("refused");
    assert!(matches!(err, Error::Boundary { .. }), "{err}");
    assert_tree("outside untouched", &outside_before, &tree(&env.out));
    assert_tree("workspace untouched", &ws_before, &tree(&env.ws));

    // Same for undo, even forced: apply for real, then swap, then undo.
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, _) = env.overlay("ovl", "echo sandbox > dir/sub/f2");
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    fs::remove_dir_all(env.ws.join("dir/sub")).expect("rm");
    put(&env.out, "f2", b"sandbox\n", 0o600);
    symlink(&env.out, env.ws.join("dir/sub")).expect("symlink");
    let outside_before = tree(&env.out);
    let err = undo(
        &cs.id,
        &ws,
        &store,
        &journal,
        &UndoOptions {
            force: true,
            ..UndoOptions::default()
        },
    )
    .expect_err("refused");
    assert!(matches!(err, Error::Boundary { .. }), "{err}");
    assert_tree(
        "outside untouched by undo",
        &outside_before,
        &tree(&env.out),
    );
}

#[test]
fn overlay_over_a_symlinked_directory_writes_only_inside() {
    // In the overlay, the command replaces the lower's symlinked directory
    // by a real one (the only way its writes land in the upper).
    let env = Env::new();
    put(&env.ws, "keep", b"k\n", 0o644);
    symlink(&env.out, env.ws.join("d")).expect("symlink");
    put(&env.out, "victim", b"original\n", 0o644);
    let outside_before = tree(&env.out);
    let (upper, merged) = overlay(
        &env.ws,
        &env.tmp.path().join("ovl"),
        "rm d; mkdir d; echo planted > d/victim",
    );
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert_tree("as the command saw it", &tree(&merged), &tree(&env.ws));
    assert_tree("outside untouched", &outside_before, &tree(&env.out));
}

#[test]
fn invalid_names_in_an_upper_are_refused() {
    // A real overlay cannot produce these, but an upper is untrusted input.
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    base_tree(&env.ws);
    let upper = env.tmp.path().join("crafted-upper");
    fs::create_dir_all(&upper).expect("mkdir");
    fs::write(
        upper.join(std::ffi::OsStr::from_bytes(b"bad\xffname")),
        b"x",
    )
    .expect("write");
    put(&upper, "good.txt", b"ok\n", 0o644);
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    assert_eq!(cs.refused.len(), 1, "{:?}", cs.refused);
    assert!(matches!(
        cs.refused[0].reason,
        RefuseReason::InvalidName { .. }
    ));
    assert_eq!(cs.changes.len(), 1);
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert!(env.ws.join("good.txt").exists());
    let non_utf8 = fs::read_dir(&env.ws)
        .expect("ls")
        .filter(|e| {
            e.as_ref()
                .map_or(true, |e| e.file_name().to_str().is_none())
        })
        .count();
    assert_eq!(non_utf8, 0, "the refused name reached the workspace");
}
