//! Elapsed time of a long bash call on stderr, in `retie run -p` mode
//! (issue 33, ADR 0526). While a sandbox runs, this process is blocked
//! supervising it (and must stay single-threaded for the in-process
//! runner), so the lines come from a small child process, `retie
//! __progress`, started when the call starts and killed when it ends:
//! the first line once the call has run ~2 s, then one every 5 s. Only
//! stderr: stdout (the answer, or the JSON) never gets one.

use std::io::Write;
use std::process::{Child, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;

/// The first line after this long.
const AFTER: Duration = Duration::from_secs(2);
/// Then one line every so often.
const EVERY: Duration = Duration::from_secs(5);

#[derive(Args, Debug)]
pub struct ProgressArgs {
    /// When the call started, milliseconds since the epoch.
    #[arg(long, value_name = "MS")]
    pub since_ms: u64,
    /// What runs, as shown (`bash`).
    #[arg(long, value_name = "WHAT")]
    pub what: String,
    /// The process whose call this is: the lines stop when it is gone.
    #[arg(long, value_name = "PID")]
    pub parent: i32,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn parent_alive(pid: i32) -> bool {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() == pid }
}

/// `retie __progress`: the lines, until killed or orphaned.
pub fn run(a: ProgressArgs) -> i32 {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process;
    // its arguments are plain integers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    let what = crate::ui::visible(&a.what);
    let mut next = AFTER.as_millis() as u64;
    loop {
        if !parent_alive(a.parent) {
            return 0;
        }
        let elapsed = now_ms().saturating_sub(a.since_ms);
        if elapsed < next {
            std::thread::sleep(Duration::from_millis((next - elapsed).min(500)));
            continue;
        }
        let mut err = std::io::stderr().lock();
        if writeln!(err, "retie: {what} still running: {} s", elapsed / 1000).is_err() {
            return 0;
        }
        next = elapsed + EVERY.as_millis() as u64;
    }
}

/// The child printing a call's elapsed time; killed on [`Ticker::stop`]
/// or drop.
#[derive(Default)]
pub struct Ticker(Option<Child>);

impl Ticker {
    /// Start the lines for `what`. Progress is a courtesy, not a wall: a
    /// child that cannot start means no lines, and nothing else changes.
    pub fn start(what: &str) -> Ticker {
        let Ok(exe) = std::env::current_exe() else {
            return Ticker(None);
        };
        let child = std::process::Command::new(exe)
            .arg("__progress")
            .arg("--since-ms")
            .arg(now_ms().to_string())
            .arg("--what")
            .arg(what)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .ok();
        Ticker(child)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop();
    }
}
