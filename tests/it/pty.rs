//! A pseudo-terminal for the interactive tests: the child gets the slave
//! side as its controlling terminal (stdin, stdout and stderr), the test
//! types on the master side and reads everything the child printed.
//! Nothing to install (no tmux, no expect).
//!
//! A reader thread collects the output and answers the one question a
//! terminal is asked (the cursor position report `ESC [ 6 n`, which the
//! line editor sends before a prompt), as a real terminal would, so typed
//! input is never taken for the answer.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;

/// How long a test waits for expected output: generous, never asserted.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub struct Pty {
    master: std::fs::File,
    pub child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// How far `expect` has consumed the output.
    seen: usize,
}

impl Pty {
    /// Spawn `cmd` on a new pseudo-terminal (40 rows, 200 columns).
    pub fn spawn(mut cmd: Command) -> Pty {
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
        rustix::pty::grantpt(&master).expect("grantpt");
        rustix::pty::unlockpt(&master).expect("unlockpt");
        let name = rustix::pty::ptsname(&master, Vec::new()).expect("ptsname");
        let slave: OwnedFd = rustix::fs::open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY,
            Mode::empty(),
        )
        .expect("open the pty slave");
        rustix::termios::tcsetwinsize(
            &slave,
            rustix::termios::Winsize {
                ws_row: 40,
                ws_col: 200,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .expect("window size");
        let dup = |f: &OwnedFd| f.try_clone().expect("dup the slave");
        cmd.stdin(dup(&slave))
            .stdout(dup(&slave))
            .stderr(dup(&slave));
        cmd.env("TERM", "xterm");
        // SAFETY: runs in the forked child before exec; setsid and the
        // TIOCSCTTY ioctl on fd 0 (the slave, dup2'ed there by Command)
        // are async-signal-safe and allocate nothing.
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::setsid()?;
                rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn on the pty");
        drop(slave);
        let master = std::fs::File::from(master);
        let out = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let out = out.clone();
            let mut r = master.try_clone().expect("dup the master");
            let mut w = master.try_clone().expect("dup the master");
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) | Err(_) => break, // EIO: every slave fd closed
                        Ok(n) => {
                            let mut o = out.lock().expect("lock");
                            let before = o.len();
                            o.extend_from_slice(&buf[..n]);
                            // Count position reports asked in this chunk
                            // (including one split across chunks).
                            let from = before.saturating_sub(3);
                            let asks = count(&o[from..], b"\x1b[6n");
                            drop(o);
                            for _ in 0..asks {
                                let _ = w.write_all(b"\x1b[1;1R");
                            }
                        }
                    }
                }
            })
        };
        Pty {
            master,
            child,
            out,
            reader: Some(reader),
            seen: 0,
        }
    }

    /// Everything printed so far, lossily decoded.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().expect("lock")).into_owned()
    }

    /// Everything printed so far, raw.
    pub fn bytes(&self) -> Vec<u8> {
        self.out.lock().expect("lock").clone()
    }

    /// Wait until `want` appears after what earlier `expect`s consumed;
    /// consume up to its end. Panics with the whole output at the deadline.
    #[track_caller]
    pub fn expect(&mut self, want: &str) {
        let end = Instant::now() + DEADLINE;
        loop {
            {
                let o = self.out.lock().expect("lock");
                if let Some(i) = find(&o[self.seen.min(o.len())..], want.as_bytes()) {
                    self.seen += i + want.len();
                    return;
                }
            }
            if Instant::now() > end {
                panic!(
                    "no {want:?} in the terminal within {} s\n--- terminal (from the last match on) ---\n{}\n--- whole terminal ---\n{}",
                    DEADLINE.as_secs(),
                    String::from_utf8_lossy(&self.bytes()[self.seen..]),
                    self.output()
                );
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                // The child is gone: give the reader a moment to drain,
                // then the output is final.
                let _ = st;
                let drained = crate::harness::wait_until(5.0, || {
                    let o = self.out.lock().expect("lock");
                    find(&o[self.seen.min(o.len())..], want.as_bytes()).is_some()
                });
                if !drained {
                    panic!(
                        "the process ended ({st}) without printing {want:?}\n--- terminal ---\n{}",
                        self.output()
                    );
                }
                continue;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Type `text` (no Enter).
    pub fn type_(&mut self, text: &str) {
        self.master.write_all(text.as_bytes()).expect("type");
        self.master.flush().expect("flush");
    }

    /// Type a line and Enter.
    pub fn line(&mut self, text: &str) {
        self.type_(text);
        self.type_("\r");
    }

    /// Wait for the process to end (at the deadline: kill it and panic).
    #[track_caller]
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                if let Some(r) = self.reader.take() {
                    let _ = r.join();
                }
                return st;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!(
                    "the process did not end\n--- terminal ---\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn master_fd(&self) -> i32 {
        self.master.as_raw_fd()
    }

    /// Resize the terminal (the kernel signals SIGWINCH to its
    /// foreground job, as a terminal emulator's resize does).
    pub fn resize(&self, rows: u16, cols: u16) {
        rustix::termios::tcsetwinsize(
            &self.master,
            rustix::termios::Winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .expect("resize the pty");
    }

    /// The terminal's settings as the child left them (read through the
    /// master: a pty's settings are its slave's).
    pub fn termios(&self) -> rustix::termios::Termios {
        rustix::termios::tcgetattr(&self.master).expect("tcgetattr on the pty")
    }

    /// Whether the terminal is in its cooked mode: line editing, echo,
    /// and the signal characters on (what a shell leaves, and what a
    /// program that took raw mode must restore).
    pub fn is_cooked(&self) -> bool {
        use rustix::termios::LocalModes as L;
        self.termios()
            .local_modes
            .contains(L::ICANON | L::ECHO | L::ISIG)
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}
