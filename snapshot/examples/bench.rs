//! Benchmark: on generated workspaces of 1k, 10k and 100k files, time
//! (a) computing the changeset of a command that changed one file (a real
//! overlay upper, made with `unshare -Urm`), (b) applying it (pre-image
//! stored, journal entry, temp + fsync + rename), (c) undoing it, against
//! `cp -a` of the workspace (the predecessor's snapshot), side by side.
//!
//! Run: `cargo run --release -p retie-snapshot --example bench [-- SIZES...]`
//! (sizes in files; default 1000 10000 100000). `RETIE_BENCH_DIR` picks the
//! scratch directory (default: the system temp dir). `RETIE_BENCH_FILE_KB`
//! sets the file size (default 4 KiB; 100k files of 4 KiB = 400 MB).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use retie_snapshot::{
    apply, undo, ApplyOptions, Changeset, Journal, Store, UndoOptions, Workspace,
};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BoxResult<()> {
    let sizes: Vec<usize> = {
        let a: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|s| s.parse().ok())
            .collect();
        if a.is_empty() {
            vec![1_000, 10_000, 100_000]
        } else {
            a
        }
    };
    let kb: usize = std::env::var("RETIE_BENCH_FILE_KB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let base = std::env::var_os("RETIE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("retie-bench-")
        .tempdir_in(base)?;
    let load_before = loadavg();
    let mut rows = Vec::new();
    for &n in &sizes {
        rows.push(bench_size(scratch.path(), n, kb)?);
    }
    println!();
    println!("| files | data | `cp -a` | compute (1 file changed) | apply | undo | apply min | cp -a / (compute + apply) |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} MB | {} | {} | {} | {} | {} | {:.0}x |",
            r.files,
            r.bytes / 1_000_000,
            ms(r.cp),
            ms(r.compute),
            ms(r.apply),
            ms(r.undo),
            ms(r.apply_min),
            r.cp.as_secs_f64() / (r.compute + r.apply).as_secs_f64()
        );
    }
    println!(
        "\n(medians; compute/apply/undo over {ROUNDS} rounds, cp -a over {CP_ROUNDS}; load average {} before, {} after)",
        load_before,
        loadavg()
    );
    Ok(())
}

const ROUNDS: usize = 31;
const CP_ROUNDS: usize = 3;

struct Row {
    files: usize,
    bytes: u64,
    cp: Duration,
    compute: Duration,
    apply: Duration,
    apply_min: Duration,
    undo: Duration,
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn ms(d: Duration) -> String {
    let m = d.as_secs_f64() * 1000.0;
    if m < 10.0 {
        format!("{m:.2} ms")
    } else {
        format!("{m:.0} ms")
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench_size(scratch: &Path, n: usize, kb: usize) -> BoxResult<Row> {
    let root = scratch.join(format!("n{n}"));
    let ws = root.join("ws");
    eprintln!("generating {n} files of {kb} KiB ...");
    let per_dir = 100;
    let mut content = vec![0u8; kb * 1024];
    for i in 0..n {
        let d = ws.join(format!("d{:04}", i / per_dir));
        if i % per_dir == 0 {
            fs::create_dir_all(&d)?;
        }
        for (j, b) in content.iter_mut().enumerate().take(64) {
            *b = (i.wrapping_mul(31).wrapping_add(j) % 251) as u8;
        }
        fs::write(d.join(format!("f{i}.txt")), &content)?;
    }
    let bytes = (n * kb * 1024) as u64;
    // Sync so the cp -a timing is not dominated by writeback of generation.
    Command::new("sync").status()?;

    // The upper of a command that appended to one file.
    let ovl = root.join("ovl");
    let (u, w, m) = (ovl.join("upper"), ovl.join("work"), ovl.join("merged"));
    for d in [&u, &w, &m] {
        fs::create_dir_all(d)?;
    }
    let script = format!(
        "set -e; mount -t overlay overlay -o userxattr,lowerdir={},upperdir={},workdir={} {}; echo changed >> {}/d0000/f7.txt",
        ws.display(),
        u.display(),
        w.display(),
        m.display(),
        m.display()
    );
    let st = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .status()?;
    if !st.success() {
        return Err("overlay mount in unshare -Urm failed".into());
    }

    let state = root.join("state");
    let store = Store::open(&state)?;
    let journal = Journal::open(&state)?;
    let wso = Workspace::open(&ws)?;
    let (mut c, mut a, mut un) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let cs = Changeset::compute(&ws, &u)?;
        c.push(t.elapsed());
        assert_eq!(cs.changes.len(), 1);
        let t = Instant::now();
        let e = apply(&cs, &wso, &store, &journal, &ApplyOptions::default())?;
        a.push(t.elapsed());
        let t = Instant::now();
        undo(&e.id, &wso, &store, &journal, &UndoOptions::default())?;
        un.push(t.elapsed());
    }
    let mut cps = Vec::new();
    for i in 0..CP_ROUNDS {
        let dst = root.join(format!("cp{i}"));
        let t = Instant::now();
        let st = Command::new("cp").arg("-a").arg(&ws).arg(&dst).status()?;
        cps.push(t.elapsed());
        if !st.success() {
            return Err("cp -a failed".into());
        }
        fs::remove_dir_all(&dst)?;
    }
    let _ = Command::new("chmod")
        .arg("-R")
        .arg("u+rwx")
        .arg(&ovl)
        .status();
    let row = Row {
        files: n,
        bytes,
        cp: median(cps),
        compute: median(c),
        apply_min: a.iter().copied().min().unwrap_or_default(),
        apply: median(a),
        undo: median(un),
    };
    fs::remove_dir_all(&root)?;
    eprintln!(
        "{n} files: cp -a {}, compute {}, apply {}, undo {}",
        ms(row.cp),
        ms(row.compute),
        ms(row.apply),
        ms(row.undo)
    );
    Ok(row)
}
