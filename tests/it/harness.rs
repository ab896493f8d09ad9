//! The test harness: legs, workspaces and the binary.

#![allow(dead_code)]

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub const NOBODY: u32 = 65534;

/// Who runs retie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// The user running the tests (root in CI).
    Invoker,
    /// uid/gid 65534 with a cleared group list.
    Nobody,
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The legs this machine can run.
pub fn legs() -> Vec<Leg> {
    if is_root() {
        vec![Leg::Invoker, Leg::Nobody]
    } else {
        eprintln!(
            "note: not root, so the uid-65534 leg cannot be run; testing as the invoking user only"
        );
        vec![Leg::Invoker]
    }
}

struct Shared {
    bin: PathBuf,
}

/// Directories of world-readable copies of binaries (for the uid-65534
/// leg), removed when the test process exits: a static's TempDir is never
/// dropped, and every run of the suite left about 450 MB of debug binaries
/// in the temporary directory.
static COPY_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" fn remove_copy_dirs() {
    // Never wait at exit (a thread that panicked holding the lock).
    if let Ok(dirs) = COPY_DIRS.try_lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Copies left by a test process that was killed (its exit handler never
/// ran): removed once they are a day old.
fn sweep_stale_copies(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(24 * 3600));
        if old && e.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A fresh world-traversable directory (`PREFIX*` in the temporary
/// directory) for copies of binaries, removed when this process exits.
pub fn copy_dir(prefix: &str) -> PathBuf {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    sweep_stale_copies(prefix);
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
        .keep();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    if let Ok(mut dirs) = COPY_DIRS.lock() {
        dirs.push(dir.clone());
    }
    REGISTERED.get_or_init(|| {
        // SAFETY: registers a function without arguments or captured
        // state, which only reads a static.
        unsafe { libc::atexit(remove_copy_dirs) };
    });
    dir
}

fn shared() -> &'static Shared {
    static S: OnceLock<Shared> = OnceLock::new();
    S.get_or_init(|| {
        let dir = copy_dir("retie-it-bin-");
        // retie execs retie-agent, beside it, for the agent's commands.
        for (from, name) in [
            (env!("CARGO_BIN_EXE_retie"), "retie"),
            (env!("CARGO_BIN_EXE_retie-agent"), "retie-agent"),
        ] {
            let to = dir.join(name);
            std::fs::copy(from, &to).expect("copy retie");
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        Shared {
            bin: dir.join("retie"),
        }
    })
}

/// The binary a leg runs.
pub fn bin(leg: Leg) -> PathBuf {
    match leg {
        Leg::Invoker => PathBuf::from(env!("CARGO_BIN_EXE_retie")),
        Leg::Nobody => shared().bin.clone(),
    }
}

/// A scratch area for one test and leg: a workspace and a home, owned by
/// the leg's user, under a world-traversable directory.
pub struct Scratch {
    pub root: tempfile::TempDir,
    pub ws: PathBuf,
    pub home: PathBuf,
    pub leg: Leg,
}

impl Scratch {
    /// Hand `p` to the leg's user: uid 65534 owns it in the Nobody leg
    /// (the invoker owns it already).
    pub fn give(&self, p: &Path) {
        if self.leg == Leg::Nobody {
            chown(p, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
    }

    /// Write retie's config file (`$XDG_CONFIG_HOME/retie/config.toml`,
    /// replacing any) with `toml`, owned by the leg's user.
    pub fn write_config(&self, toml: &str) {
        let dir = self.home.join(".config/retie");
        std::fs::create_dir_all(&dir).expect("config dir");
        let cfg = dir.join("config.toml");
        std::fs::write(&cfg, toml).expect("write config");
        for p in [self.home.join(".config"), dir, cfg] {
            self.give(&p);
        }
    }

    pub fn new(leg: Leg) -> Scratch {
        Self::with_ws_name(leg, "ws")
    }

    pub fn with_ws_name(leg: Leg, name: &str) -> Scratch {
        let root = tempfile::Builder::new()
            .prefix("retie-it-")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let ws = root.path().join(name);
        let home = root.path().join("home");
        std::fs::create_dir_all(&ws).expect("mkdir ws");
        std::fs::create_dir_all(&home).expect("mkdir home");
        if leg == Leg::Nobody {
            for p in [&ws, &home] {
                chown(p, Some(NOBODY), Some(NOBODY)).expect("chown");
            }
        }
        Scratch {
            root,
            ws,
            home,
            leg,
        }
    }

    /// A `retie` command for this leg, cwd = the workspace.
    pub fn retie(&self) -> Command {
        let mut cmd = match self.leg {
            Leg::Invoker => {
                // Keep retie's state (overlay runs, snapshots), config and
                // home in the scratch area: a test never touches the
                // invoking user's real home or state.
                let mut c = Command::new(bin(Leg::Invoker));
                c.env("HOME", &self.home)
                    .env("XDG_STATE_HOME", self.home.join(".local/state"));
                // The ledger's user key lives in the config directory.
                c.env("XDG_CONFIG_HOME", self.home.join(".config"));
                c
            }
            Leg::Nobody => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .arg(bin(Leg::Nobody));
                c.env("HOME", &self.home)
                    .env("XDG_STATE_HOME", self.home.join(".local/state"))
                    .env("XDG_CONFIG_HOME", self.home.join(".config"))
                    .env("XDG_RUNTIME_DIR", &self.home);
                c
            }
        };
        cmd.current_dir(&self.ws);
        cmd
    }

    /// `retie SUB --provider PROVIDER --model MODEL --base-url URL`, an agent
    /// run against a test server: no provider, base URL, attempt count or
    /// OpenAI key from the environment, stdin closed. The caller adds the
    /// rest.
    pub fn agent(&self, sub: &str, provider: &str, model: &str, url: &str) -> Command {
        let mut c = self.retie();
        c.args([
            sub,
            "--provider",
            provider,
            "--model",
            model,
            "--base-url",
            url,
        ])
        .env_remove("RETIE_PROVIDER")
        .env_remove("RETIE_BASE_URL")
        .env_remove("RETIE_MAX_ATTEMPTS")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null());
        c
    }

    /// `retie sandbox exec -w WS [extra] -- argv`, collected.
    pub fn exec(&self, extra: &[&str], argv: &[&str]) -> Output {
        let mut cmd = self.retie();
        cmd.args(["sandbox", "exec", "-w"])
            .arg(&self.ws)
            .args(extra)
            .arg("--")
            .args(argv);
        cmd.stdin(Stdio::null());
        cmd.output().expect("run retie")
    }

    /// `sh -c script` in the sandbox.
    pub fn sh(&self, script: &str) -> Output {
        self.exec(&[], &["sh", "-c", script])
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert an exit code, printing both streams as blocks on failure.
#[track_caller]
pub fn assert_code(o: &Output, want: i32, ctx: &str) {
    let got = o.status.code().unwrap_or(-1);
    assert_eq!(
        got,
        want,
        "{ctx}: expected exit {want}, got {got}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        stdout(o),
        stderr(o)
    );
}

/// The last JSON object printed on stderr (`--json`).
pub fn json_status(o: &Output) -> serde_json::Value {
    stderr(o)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON status on stderr:\n{}", stderr(o)))
}

/// Pids of host processes whose command line contains `marker`.
pub fn pids_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

/// A marker unique to this test process and call.
pub fn marker() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    format!(
        "9{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Wait until `f` holds, up to `secs`.
pub fn wait_until(secs: f64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    f()
}

/// Host uid of a pid (real uid from /proc/PID/status).
pub fn host_uid(pid: i32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Write `text` to `rel` in the workspace (creating directories), owned by
/// the leg's user. Returns after one tick of the kernel's coarse clock
/// (4 ms at HZ=250): retie counts a change stamped within the tick its run
/// starts in as made during the run (a conservative conflict), and a test
/// that writes and runs at once must not hit that on purpose.
pub fn write(s: &Scratch, rel: &str, text: &str) {
    write_now(s, rel, text);
    std::thread::sleep(std::time::Duration::from_millis(11));
}

/// [`write`] without the wait: for edits made while a run is going on.
pub fn write_now(s: &Scratch, rel: &str, text: &str) {
    let p = s.ws.join(rel);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(&p, text).expect("write");
    if s.leg == Leg::Nobody {
        for q in [p.as_path()]
            .into_iter()
            .chain(p.ancestors().skip(1).take_while(|a| a.starts_with(&s.ws)))
        {
            chown(q, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
    }
}
