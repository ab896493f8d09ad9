//! The supervisor's side of [`crate::Stdio::Terminal`] (ADR 0550): the
//! relay between the caller's terminal (fds 0 and 1) and the master of the
//! pty that the sandbox's init made in its own devpts
//! (`crate::init::terminal`).
//!
//! [`Relay::begin`] copies the caller's terminal settings and window size
//! to the pty, then puts the caller's terminal in raw mode: every byte
//! typed, Ctrl-C and Ctrl-Z included, goes to the pty, whose own line
//! discipline turns it into the command's signals. The caller's settings
//! are restored when the relay is dropped: on every way `Started::run`
//! returns (the command's end, a timeout, a forwarded signal, an error),
//! and on a panic that unwinds. A SIGKILL of retie leaves the terminal raw
//! (`stty sane` restores it), as for any program.
//!
//! The supervisor is single-threaded, so the relay is part of its one poll
//! loop (`supervisor::finish`): the master is non-blocking, typed bytes the
//! pty has not taken yet wait in [`Relay::pending`] (stdin is not read
//! meanwhile), and the command's output is written to fd 1 as it comes.

use std::os::fd::{AsFd, OwnedFd};

use rustix::event::PollFlags;
use rustix::termios::{self, OptionalActions, Termios};

use crate::error::{Result, RuntimeError};

/// The most read at once from either side.
const CHUNK: usize = 4096;

/// A running relay; dropping it restores the caller's terminal.
pub struct Relay {
    master: OwnedFd,
    /// The caller's terminal settings before raw mode.
    saved: Termios,
    /// Typed bytes the pty has not taken yet.
    pending: Vec<u8>,
    /// The caller's stdin has not reached its end.
    stdin_open: bool,
    /// The pty has a slave open somewhere (reads have not failed with EIO).
    master_open: bool,
}

impl Relay {
    /// Copy the caller's terminal settings and window size to the pty,
    /// then put the caller's terminal (fd 0) in raw mode.
    pub fn begin(master: OwnedFd) -> Result<Relay> {
        let stdin = rustix::stdio::stdin();
        let saved = termios::tcgetattr(stdin).map_err(|e| {
            RuntimeError::host(
                "reading the settings of the caller's terminal (stdin); run with --no-tty when it is not one",
                e.into(),
            )
        })?;
        // The command's terminal starts as the caller's was: the same
        // erase and interrupt characters, echo, and size.
        termios::tcsetattr(&master, OptionalActions::Now, &saved)
            .map_err(|e| RuntimeError::host("setting the pty's terminal settings", e.into()))?;
        copy_size(&master);
        let flags = rustix::fs::fcntl_getfl(&master)
            .map_err(|e| RuntimeError::host("reading the pty master's flags", e.into()))?;
        rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| RuntimeError::host("making the pty master non-blocking", e.into()))?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin, OptionalActions::Drain, &raw).map_err(|e| {
            RuntimeError::host("putting the caller's terminal in raw mode", e.into())
        })?;
        Ok(Relay {
            master,
            saved,
            pending: Vec::new(),
            stdin_open: true,
            master_open: true,
        })
    }

    /// The master, for the supervisor's poll.
    pub fn master(&self) -> &OwnedFd {
        &self.master
    }

    /// What to poll stdin for: input, unless typed bytes still wait for
    /// the pty or stdin has ended.
    pub fn stdin_events(&self) -> PollFlags {
        if self.stdin_open && self.pending.is_empty() {
            PollFlags::IN
        } else {
            PollFlags::empty()
        }
    }

    /// What to poll the master for: output, and room for pending input.
    pub fn master_events(&self) -> PollFlags {
        match (self.master_open, self.pending.is_empty()) {
            (false, _) => PollFlags::empty(),
            (true, true) => PollFlags::IN,
            (true, false) => PollFlags::IN | PollFlags::OUT,
        }
    }

    /// stdin polled ready (`revents`): take what was typed. Returns the
    /// signal the pty's line discipline will send for it, if the person
    /// typed the pty's interrupt or quit character while the pty turns
    /// them into signals: a Ctrl-C to the command, which counts as a stop
    /// signal to retie did before the relay (`Outcome::stop_signal`: its
    /// half-done changes are kept, not applied).
    pub fn on_stdin(&mut self, revents: PollFlags) -> Option<i32> {
        if !revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
            return None;
        }
        let mut buf = [0u8; CHUNK];
        let mut stop = None;
        match rustix::io::read(rustix::stdio::stdin(), &mut buf) {
            Ok(0) => self.stdin_open = false,
            Ok(n) => {
                stop = self.signal_typed(&buf[..n]);
                self.pending.extend_from_slice(&buf[..n]);
            }
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
            Err(_) => self.stdin_open = false,
        }
        self.flush_input();
        stop
    }

    /// SIGINT or SIGQUIT when `typed` holds the pty's VINTR or VQUIT
    /// character and its ISIG is on (as the command left its settings).
    fn signal_typed(&self, typed: &[u8]) -> Option<i32> {
        use rustix::termios::{LocalModes, SpecialCodeIndex as C};
        let t = termios::tcgetattr(&self.master).ok()?;
        if !t.local_modes.contains(LocalModes::ISIG) {
            return None;
        }
        // 0 is _POSIX_VDISABLE: the character is switched off.
        let is = |c: u8| c != 0 && typed.contains(&c);
        if is(t.special_codes[C::VINTR]) {
            Some(libc::SIGINT)
        } else if is(t.special_codes[C::VQUIT]) {
            Some(libc::SIGQUIT)
        } else {
            None
        }
    }

    /// The master polled ready (`revents`): relay the command's output,
    /// hand over pending input.
    pub fn on_master(&mut self, revents: PollFlags) {
        if revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
            self.output_once();
        }
        if revents.contains(PollFlags::OUT) {
            self.flush_input();
        }
    }

    /// The caller's window changed (SIGWINCH): the pty's size follows,
    /// and the kernel signals the pty's foreground job.
    pub fn resize(&self) {
        copy_size(&self.master);
    }

    /// The command has ended: relay whatever output is still buffered in
    /// the pty (every slave is closed by now: the reads end with EIO).
    pub fn drain(&mut self) {
        while self.master_open && self.output_once() {}
    }

    /// One read from the master, written to fd 1. False when nothing was
    /// read (nothing buffered, or no slave left).
    fn output_once(&mut self) -> bool {
        let mut buf = [0u8; CHUNK];
        match rustix::io::read(&self.master, &mut buf) {
            Ok(0) => {
                self.master_open = false;
                false
            }
            Ok(n) => {
                // A caller's terminal that went away loses the output;
                // the command's status still counts.
                let _ = crate::sys::write_all(rustix::stdio::stdout(), &buf[..n]);
                true
            }
            Err(rustix::io::Errno::INTR) => true,
            Err(rustix::io::Errno::AGAIN) => false,
            // EIO: no slave is open any more.
            Err(_) => {
                self.master_open = false;
                false
            }
        }
    }

    /// Write pending input to the master, as much as it takes now.
    fn flush_input(&mut self) {
        while !self.pending.is_empty() {
            match rustix::io::write(&self.master, &self.pending) {
                Ok(0) => break,
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => break,
                Err(_) => {
                    // No slave left: nobody will read it.
                    self.pending.clear();
                    self.master_open = false;
                }
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Drain: what retie prints next comes after the command's output.
        let _ = termios::tcsetattr(rustix::stdio::stdin(), OptionalActions::Drain, &self.saved);
    }
}

/// The caller's window size (of fd 0) onto the pty. A caller's terminal
/// without a size leaves the pty's (0x0, as a fresh pty has).
fn copy_size(master: &impl AsFd) {
    if let Ok(ws) = termios::tcgetwinsize(rustix::stdio::stdin()) {
        let _ = termios::tcsetwinsize(master, ws);
    }
}
