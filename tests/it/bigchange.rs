//! Issue 30: big changes. A command that writes thousands of files is
//! applied whole (hard links from the layer, one sync: ADR 0208) with
//! every per-path rule still holding: the plant table at any depth, the
//! ownership rule, undo; and a large set is summarised for a person.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::harness::*;
use crate::overlay::runs_left;

/// Every regular file and directory under `root` (relative), with its
/// owner and inode number.
fn walk(root: &Path) -> Vec<(String, u32, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            let m = std::fs::symlink_metadata(&p).expect("lstat");
            let rel = p.strip_prefix(root).expect("under root");
            out.push((rel.display().to_string(), m.uid(), m.ino()));
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A command that creates 10,000 files in 100 directories and, eight
/// levels down among them, a git hook: the hook is blocked (the plant
/// table judges every path of a batch), the 10,000 files are applied, each
/// owned by the workspace's owner and each its own inode (a file the
/// command hard-linked is copied, not linked twice), and `retie undo
/// last` removes them all.
/// As root the workspace is owned by uid 65534, so the ownership rule has
/// work to do in both legs.
#[test]
fn a_10k_file_change_keeps_every_rule_and_undoes_whole() {
    for leg in legs() {
        let s = Scratch::new(leg);
        std::fs::write(s.ws.join("keep.txt"), "mine\n").expect("write");
        if is_root() {
            let _ = std::process::Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(&s.ws)
                .status();
        }
        let owner = std::fs::metadata(&s.ws).expect("ws").uid();
        let deep = "gen/a/b/c/d/e/f/.git/hooks/post-checkout";
        let script = format!(
            "for d in $(seq 0 99); do mkdir -p gen/d$d; \
               for f in $(seq 0 99); do echo $d.$f > gen/d$d/f$f; done; done; \
             ln gen/d0/f0 gen/d0/hardlink && \
             mkdir -p gen/a/b/c/d/e/f/.git/hooks && \
             printf '#!/bin/sh\\nexit 0\\n' > {deep} && chmod +x {deep}"
        );
        let o = s.exec(&["--json"], &["sh", "-c", &script]);
        assert_code(&o, 0, "10k-file run");
        let st = json_status(&o);
        assert_eq!(st["changes"]["applied"], true, "{leg:?}: {st}");
        // The result lists the first 64 paths and says how many there are
        // (the whole list as JSON was most of a big apply's memory).
        let listed = st["changes"]["changes"].as_array().expect("changes").len();
        let total = st["changes"]["changes_total"]
            .as_u64()
            .expect("changes_total");
        assert_eq!(listed, 64, "{leg:?}: a 10k-path result lists 64 paths");
        assert!(total > 10_100, "{leg:?}: changes_total {total}");
        let blocked: Vec<String> = st["changes"]["blocked"]
            .as_array()
            .expect("blocked")
            .iter()
            .filter_map(|b| b["path"].as_str().map(String::from))
            .collect();
        assert!(
            blocked.iter().any(|p| p == deep),
            "{leg:?}: the hook eight levels down was not blocked: {blocked:?}"
        );
        assert!(
            !s.ws.join(deep).exists(),
            "{leg:?}: a plant buried in a 10k-file tree was applied"
        );
        let files = walk(&s.ws.join("gen"));
        let regular: Vec<_> = files
            .iter()
            .filter(|(p, _, _)| p.starts_with("d"))
            .collect();
        assert_eq!(regular.len(), 100 + 10_001, "{leg:?}: dirs + files applied");
        assert_eq!(
            std::fs::read_to_string(s.ws.join("gen/d42/f7")).expect("read"),
            "42.7\n"
        );
        let not_owner: Vec<_> = files.iter().filter(|(_, u, _)| *u != owner).collect();
        assert!(
            not_owner.is_empty(),
            "{leg:?}: {} paths not owned by {owner}, e.g. {:?}",
            not_owner.len(),
            not_owner.first()
        );
        // Linked from the layer, yet no two workspace paths share an
        // inode (the layer's own links are retie's, in its trash), not
        // even the two names the command gave one file (`hardlink`).
        let mut inodes: Vec<u64> = files.iter().map(|(_, _, i)| *i).collect();
        inodes.sort_unstable();
        inodes.dedup();
        assert_eq!(
            inodes.len(),
            files.len(),
            "{leg:?}: applied paths share an inode"
        );
        assert_eq!(runs_left(&s), 0, "{leg:?}: the run's layer stayed");

        let o = s.retie().args(["undo", "last"]).output().expect("undo");
        assert_code(&o, 0, "undo last");
        let left: Vec<_> = walk(&s.ws).into_iter().map(|(p, _, _)| p).collect();
        assert_eq!(
            left,
            vec!["keep.txt".to_string()],
            "{leg:?}: undo left paths behind"
        );

        // A created tree with nothing to hold it back (no plant, no second
        // link) moves in whole (ADR 0211): the ownership rule still reaches
        // every path of it.
        let o = s.exec(
            &["--json"],
            &[
                "sh",
                "-c",
                "mkdir -p whole/a; for i in $(seq 1 200); do echo $i > whole/a/f$i; done",
            ],
        );
        assert_code(&o, 0, "whole-tree run");
        assert_eq!(json_status(&o)["changes"]["applied"], true, "{leg:?}");
        let files = walk(&s.ws.join("whole"));
        assert_eq!(files.len(), 201, "{leg:?}: whole/a and its 200 files");
        let not_owner: Vec<_> = files.iter().filter(|(_, u, _)| *u != owner).collect();
        assert!(
            not_owner.is_empty(),
            "{leg:?}: {} paths of a tree moved whole not owned by {owner}, e.g. {:?}",
            not_owner.len(),
            not_owner.first()
        );
    }
}

/// A kept run of 300 files: `retie changes show` summarises it per top
/// directory (counts and bytes), not 300 lines; `--all` lists every path.
#[test]
fn a_large_kept_run_is_summarised_and_listed_in_full_on_request() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(
            &["--json", "--timeout", "2"],
            &[
                "sh",
                "-c",
                "mkdir -p big small; for f in $(seq 1 299); do echo $f > big/f$f; done; \
                 echo one > small/only; sleep 30",
            ],
        );
        assert_code(&o, 124, "timeout keeps the run");
        let run = json_status(&o)["changes"]["kept"]["run"]
            .as_str()
            .expect("kept run")
            .to_string();
        let o = s
            .retie()
            .args(["changes", "show", &run])
            .output()
            .expect("show");
        assert_code(&o, 0, "show");
        let text = stderr(&o);
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("big ") || l.starts_with("small "))
            .collect();
        assert_eq!(rows.len(), 2, "{leg:?}: one row per top directory:\n{text}");
        assert!(
            rows[0].split_whitespace().nth(1) == Some("300"),
            "{leg:?}: big: 299 files + the directory created:\n{text}"
        );
        assert!(
            !text.contains("big/f17"),
            "{leg:?}: a summarised set listed its paths:\n{text}"
        );
        assert!(text.contains("--all"), "{leg:?}: no hint of --all:\n{text}");
        let o = s
            .retie()
            .args(["changes", "show", &run, "--all"])
            .output()
            .expect("show --all");
        assert_code(&o, 0, "show --all");
        let text = stderr(&o);
        for f in ["big/f1", "big/f17", "big/f299", "small/only"] {
            assert!(
                text.contains(&format!("+ {f}\n")),
                "{leg:?}: --all does not list {f}"
            );
        }
    }
}

/// The signed record of the ledger entries of `s`'s default ledger, as
/// (kind, payload text).
fn ledger_entries(s: &Scratch) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(s.home.join(".local/state/retie/ledger.db"))
        .expect("open the ledger");
    let mut st = db
        .prepare("SELECT kind, payload FROM entries ORDER BY seq")
        .expect("query");
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect()
}

/// The blob named `hex` in `s`'s snapshot stores, if any.
fn blob(s: &Scratch, hex: &str) -> Option<Vec<u8>> {
    let p = s
        .home
        .join(".local/state/retie/snapshots/blobs")
        .join(&hex[..2])
        .join(&hex[2..]);
    std::fs::read(p).ok()
}

/// ADR 0209: a change of hundreds of paths is recorded by its manifest, a
/// ledger entry of constant size naming (by blake3) the list of every
/// path with what it was and became, stored in the state directory; the
/// undo's intent likewise. A change of a few paths is still listed in
/// the entry itself.
#[test]
fn a_large_change_is_recorded_by_its_manifest_not_path_by_path() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(
            &["--json"],
            &[
                "sh",
                "-c",
                "mkdir gen; for f in $(seq 1 500); do echo $f > gen/f$f; done",
            ],
        );
        assert_code(&o, 0, "500-file run");
        let o = s.sh("echo small > one.txt");
        assert_code(&o, 0, "one-file run");
        let entries = ledger_entries(&s);
        let changes: Vec<&(String, String)> =
            entries.iter().filter(|(k, _)| k == "changes").collect();
        assert_eq!(changes.len(), 2, "{leg:?}: two changes entries");
        let big: serde_json::Value = serde_json::from_str(&changes[0].1).expect("json");
        let m = &big["undo"]["manifest"];
        assert_eq!(m["paths"], 501, "{leg:?}: {big}");
        assert_eq!(m["created"], 501, "{leg:?}: {big}");
        assert!(
            big["undo"].get("paths").is_none(),
            "{leg:?}: the large change listed its paths: {}",
            &changes[0].1[..200.min(changes[0].1.len())]
        );
        assert!(
            changes[0].1.len() < 1024,
            "{leg:?}: the entry grows with the change: {} bytes",
            changes[0].1.len()
        );
        let hex = m["blake3"].as_str().expect("blake3");
        let bytes = blob(&s, hex).expect("the manifest is in the state directory");
        let lines = retie_snapshot::Manifest::parse(
            &bytes,
            &retie_snapshot::Hash::from_hex(hex).expect("hex"),
        )
        .expect("the manifest hashes to the name the ledger signed");
        assert_eq!(lines.len(), 501);
        assert!(lines
            .iter()
            .any(|l| l.path.as_str() == "gen/f250" && l.before.is_none() && l.after.is_some()));
        let small: serde_json::Value = serde_json::from_str(&changes[1].1).expect("json");
        assert_eq!(
            small["undo"]["paths"],
            serde_json::json!(["one.txt"]),
            "{leg:?}: a small change is listed: {small}"
        );

        // The undo of the large one: its intent names the undo's manifest.
        let o = s.retie().args(["undo", "last"]).output().expect("undo");
        assert_code(&o, 0, "undo last (the small one)");
        let o = s.retie().args(["undo", "last"]).output().expect("undo");
        assert_code(&o, 0, "undo last (the large one)");
        assert!(!s.ws.join("gen").exists(), "{leg:?}: undone");
        let entries = ledger_entries(&s);
        let intent = entries
            .iter()
            .rev()
            .find(|(k, p)| k == "intent" && p.contains("\"manifest\""))
            .expect("the large undo's intent names a manifest");
        let v: serde_json::Value = serde_json::from_str(&intent.1).expect("json");
        let um = v
            .pointer("/undo/manifest")
            .or_else(|| v.pointer("/plan/manifest"))
            .cloned()
            .unwrap_or_else(|| panic!("{leg:?}: where is the manifest? {v}"));
        assert_eq!(um["deleted"], 501, "{leg:?}: {um}");
        assert!(intent.1.len() < 2048, "{leg:?}: {} bytes", intent.1.len());
        let hex = um["blake3"].as_str().expect("blake3");
        assert!(
            blob(&s, hex).is_some(),
            "{leg:?}: the undo's manifest is stored"
        );
    }
}
