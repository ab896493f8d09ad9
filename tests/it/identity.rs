//! Who the command is: 1:1 for an ordinary user; for root an unprivileged
//! host uid that sees an idmapped workspace as its own.

use std::os::unix::fs::{chown, MetadataExt};

use crate::harness::*;

#[test]
fn writes_land_owned_by_the_workspace_owner() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.sh("id -u; stat -c %u .; echo hi > new.txt; mkdir d; touch d/f");
        assert_code(&o, 0, "write");
        let owner = std::fs::metadata(&s.ws).expect("ws").uid();
        for p in ["new.txt", "d", "d/f"] {
            let m = std::fs::metadata(s.ws.join(p)).expect(p);
            assert_eq!(m.uid(), owner, "{leg:?}: {p} owned by {}", m.uid());
        }
        let lines: Vec<String> = stdout(&o).lines().map(String::from).collect();
        assert_eq!(
            lines[0], lines[1],
            "{leg:?}: the command does not own its workspace: {lines:?}"
        );
    }
}

#[test]
fn root_sees_a_foreign_owned_workspace_as_its_own_without_loosening_modes() {
    if !is_root() {
        eprintln!("note: idmapped workspaces are a root-only path; skipped as non-root");
        return;
    }
    let s = Scratch::new(Leg::Invoker);
    // A workspace owned by uid 1000 with a private file.
    chown(&s.ws, Some(1000), Some(1000)).expect("chown");
    std::fs::write(s.ws.join("private.txt"), "secret").expect("write");
    chown(s.ws.join("private.txt"), Some(1000), Some(1000)).expect("chown");
    std::fs::set_permissions(
        s.ws.join("private.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let o = s.sh("id -u; cat private.txt; echo more >> private.txt; echo new > made.txt");
    assert_code(&o, 0, "foreign workspace");
    let out = stdout(&o);
    assert!(out.starts_with("1000\nsecret"), "{out}");
    let m = std::fs::metadata(s.ws.join("made.txt")).expect("made");
    assert_eq!((m.uid(), m.gid()), (1000, 1000));
    let m = std::fs::metadata(s.ws.join("private.txt")).expect("private");
    assert_eq!(m.mode() & 0o777, 0o600, "mode was loosened");
    assert_eq!(
        std::fs::read_to_string(s.ws.join("private.txt")).expect("read"),
        "secretmore\n"
    );
}
