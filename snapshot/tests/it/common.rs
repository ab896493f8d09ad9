//! Test harness: temp workspaces, a real overlay mount through
//! `unshare -Urm`, and a full tree hash.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use retie_snapshot::{Journal, Store, Workspace};

/// A scratch area: `ws` (the real workspace), `state` (store + journal),
/// `ovl` (overlay upper/work/merged), `out` (a directory outside the
/// workspace that nothing may write to).
pub struct Env {
    pub tmp: tempfile::TempDir,
    pub ws: PathBuf,
    pub state: PathBuf,
    pub out: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        let tmp = tempfile::Builder::new()
            .prefix("retie-snap-")
            .tempdir()
            .expect("tempdir");
        let ws = tmp.path().join("ws");
        let state = tmp.path().join("state");
        let out = tmp.path().join("outside");
        for d in [&ws, &state, &out] {
            fs::create_dir_all(d).expect("mkdir");
        }
        Env {
            tmp,
            ws,
            state,
            out,
        }
    }

    pub fn open(&self) -> (Workspace, Store, Journal) {
        (
            Workspace::open(&self.ws).expect("open workspace"),
            Store::open(&self.state).expect("open store"),
            Journal::open(&self.state).expect("open journal"),
        )
    }

    /// Runs `ops` (sh) in an overlay over `ws` and returns (upper, a copy of
    /// the merged view as the command left it).
    pub fn overlay(&self, name: &str, ops: &str) -> (PathBuf, PathBuf) {
        overlay(&self.ws, &self.tmp.path().join(name), ops)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Make every directory writable so the tempdir can be removed
        // (overlay leaves work/work at mode 000; tests chmod dirs 555).
        let _ = Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(self.tmp.path())
            .status();
    }
}

/// Fails loudly (no silent skip) when util-linux's unshare is missing.
pub fn require_unshare() {
    let ok = Command::new("unshare")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "`unshare` (util-linux) is required for the overlay tests: install util-linux"
    );
}

/// Mounts an overlay (userxattr) with `lower` inside `unshare -Urm`, runs
/// `ops` with the merged dir as cwd, copies the merged view, unmounts (by
/// leaving the namespace). Returns (upper, merged copy).
pub fn overlay(lower: &Path, scratch: &Path, ops: &str) -> (PathBuf, PathBuf) {
    require_unshare();
    let (u, w, m, c) = (
        scratch.join("upper"),
        scratch.join("work"),
        scratch.join("merged"),
        scratch.join("expected"),
    );
    for d in [&u, &w, &m, &c] {
        fs::create_dir_all(d).expect("mkdir overlay dirs");
    }
    let script = format!(
        "set -e\n\
         mount -t overlay overlay -o userxattr,lowerdir={l},upperdir={u},workdir={w} {m}\n\
         cd {m}\n\
         {ops}\n\
         cd /\n\
         cp -a {m}/. {c}/\n",
        l = lower.display(),
        u = u.display(),
        w = w.display(),
        m = m.display(),
        c = c.display(),
    );
    let out = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .output()
        .expect("spawn unshare");
    assert!(
        out.status.success(),
        "overlay script failed ({}):\n--- script\n{script}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = fs::set_permissions(w.join("work"), fs::Permissions::from_mode(0o700));
    (u, c)
}

/// Writes a file with a mode.
pub fn put(root: &Path, rel: &str, content: &[u8], mode: u32) {
    let p = root.join(rel);
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).expect("mkdir parent");
    }
    fs::write(&p, content).expect("write");
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Deterministic pseudo-random bytes.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The standard base workspace used by the per-case tests.
pub fn base_tree(ws: &Path) {
    put(ws, "a.txt", b"hello\n", 0o644);
    put(ws, "script.sh", b"#!/bin/sh\necho hi\n", 0o755);
    put(ws, "big.bin", &noise(1, 300 * 1024), 0o644);
    put(ws, "dir/f1", b"one\n", 0o644);
    put(ws, "dir/sub/f2", b"two\n", 0o600);
    put(ws, "dir/sub/deeper/f3", b"three\n", 0o644);
    for i in 0..20 {
        put(
            ws,
            &format!("tree/t{}/n{i}.txt", i % 4),
            &noise(i, 100 + i as usize),
            0o644,
        );
    }
    fs::create_dir_all(ws.join("emptydir")).expect("mkdir");
    std::os::unix::fs::symlink("a.txt", ws.join("link")).expect("symlink");
    std::os::unix::fs::symlink("dir/sub", ws.join("dirlink")).expect("symlink");
    put(ws, ".git/HEAD", b"ref: refs/heads/main\n", 0o644);
    put(ws, ".git/config", b"[core]\n", 0o644);
    fs::create_dir_all(ws.join(".git/hooks")).expect("mkdir");
}

/// A full tree hash: every path with kind, mode and content hash or target.
pub type Tree = BTreeMap<String, String>;

pub fn tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Tree) {
    let mut ents: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    ents.sort();
    for p in ents {
        let rel = p
            .strip_prefix(root)
            .expect("under root")
            .to_string_lossy()
            .into_owned();
        let md = fs::symlink_metadata(&p).expect("lstat");
        let mode = md.mode() & 0o7777;
        let ft = md.file_type();
        let v = if ft.is_symlink() {
            format!(
                "symlink -> {}",
                fs::read_link(&p).expect("readlink").display()
            )
        } else if ft.is_dir() {
            walk(root, &p, out);
            format!("dir {mode:o}")
        } else if ft.is_file() {
            let bytes = fs::read(&p).expect("read");
            format!(
                "file {mode:o} {} {}",
                bytes.len(),
                &blake3::hash(&bytes).to_hex()[..16]
            )
        } else {
            format!("special {:o}", md.mode())
        };
        out.insert(rel, v);
    }
}

/// Asserts two trees are equal, listing the differing paths.
#[track_caller]
pub fn assert_tree(label: &str, expected: &Tree, actual: &Tree) {
    if expected == actual {
        return;
    }
    let mut diff = String::new();
    for (k, v) in expected {
        match actual.get(k) {
            None => diff += &format!("  missing  {k}: {v}\n"),
            Some(a) if a != v => {
                diff += &format!("  differs  {k}:\n    expected {v}\n    actual   {a}\n")
            }
            _ => {}
        }
    }
    for (k, v) in actual {
        if !expected.contains_key(k) {
            diff += &format!("  extra    {k}: {v}\n");
        }
    }
    panic!("{label}: trees differ\n{diff}");
}
