//! Messages from inside the sandbox to its supervisor, one JSON object per
//! line over a close-on-exec pipe. The pipe reaches EOF once the sandbox's
//! init has exited and the command has exec'd, so the supervisor reads it
//! only after the init is reaped.

use serde::{Deserialize, Serialize};

/// One report from the sandbox's init or the command child.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "msg", rename_all = "snake_case")]
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

impl Report {
    /// Encode as one line.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        v.push(b'\n');
        v
    }

    /// Decode every complete line; unknown lines are skipped (and reported
    /// by the caller as a protocol problem if nothing useful came).
    pub fn parse_all(buf: &[u8]) -> Vec<Report> {
        buf.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect()
    }
}
