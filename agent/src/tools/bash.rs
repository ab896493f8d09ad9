//! bash: always a fresh sandbox with the workspace behind an overlay, run
//! through `retie_dispatch::sandbox::SandboxJob` exactly like `retie
//! sandbox exec` (changes captured, recorded right before they are applied,
//! undoable). The model's timeout is clamped to a ceiling; the output is
//! captured to a file, capped, and what the preview leaves out is kept for
//! recall.

use std::io::{Read, Seek};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use retie_dispatch::overlay::{ChangesMode, Snapshots};
use retie_dispatch::sandbox::{JobMode, JobUi, NetProxy, Runner, SandboxJob};
use retie_dispatch::{Error, Executor, Step, UndoPlan};
use retie_policy::Action;
use retie_runtime::{Interrupt, Profile, Sandbox, Stdio};
use serde_json::{Map, Value};

use super::{ToolOutput, Tools};

/// How a sandbox is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BashRunner {
    /// In this process: only from a single-threaded process (the runtime
    /// refuses otherwise, with a clear error).
    InProcess,
    /// Through `EXE __sandbox-helper` (for a multi-threaded process, such
    /// as one that talks HTTP to a provider): the helper carries the whole
    /// spec, overlay mode included.
    Helper { exe: PathBuf },
}

/// The bash tool's settings (the person's, never the model's).
#[derive(Debug, Clone)]
pub struct BashSettings {
    pub profile: Profile,
    /// The longest a command may run, whatever the model asks.
    pub ceiling: Duration,
    /// When the model names no timeout.
    pub default_timeout: Duration,
    /// Bytes of output captured (beyond them: cut, said so).
    pub output_cap: u64,
    pub runner: BashRunner,
    /// Set: a SIGINT kills the running sandbox (everything in it) instead
    /// of being passed on to the command, and this flag is raised when
    /// that happened, so the session stops the turn (a person's Ctrl-C in
    /// the interactive terminal). None: SIGINT is forwarded.
    pub cancel_on_interrupt: Option<&'static AtomicBool>,
    /// The network its sandboxes get, the person's (`retie run --net`,
    /// `[network] bash`; ADR 0313): the proxy as the only way out, served
    /// by the job whichever runner starts the sandbox. `None`: none.
    pub net: Option<NetProxy>,
}

impl BashSettings {
    /// The defaults: the host profile, 120 s ceiling, 60 s default, 1 MiB.
    pub fn defaults() -> Result<BashSettings, retie_runtime::RuntimeError> {
        Ok(BashSettings {
            profile: Profile::load("host")?,
            ceiling: Duration::from_secs(120),
            default_timeout: Duration::from_secs(60),
            output_cap: 1 << 20,
            runner: BashRunner::InProcess,
            cancel_on_interrupt: None,
            net: None,
        })
    }

    /// The timeout a call gets: the model's, clamped to the ceiling.
    pub fn timeout_for(&self, asked_secs: Option<u64>) -> Duration {
        asked_secs
            .map(|s| Duration::from_secs(s.max(1)))
            .unwrap_or(self.default_timeout)
            .min(self.ceiling)
    }
}

/// What the job says while its changes are handled, kept for the model.
#[derive(Default)]
pub(crate) struct Notes(pub Vec<String>);

impl JobUi for Notes {
    fn say(&mut self, line: &str) {
        self.0.push(line.to_string());
    }
    fn review(&mut self, _: &retie_dispatch::overlay::Review<'_>) -> Option<bool> {
        None
    }
}

pub(crate) struct BashExec<'u> {
    job: SandboxJob<'u>,
    out: std::fs::File,
    cap: u64,
    timeout: Duration,
    cancel: Option<&'static AtomicBool>,
    /// The session's token: cancelled too when the sandbox was killed.
    session_cancel: retie_dispatch::Cancel,
}

impl<'u> BashExec<'u> {
    pub fn new(
        t: &Tools,
        snaps: Snapshots,
        args: &Map<String, Value>,
        notes: &'u mut Notes,
    ) -> Result<BashExec<'u>, Error> {
        let line = args.get("command").and_then(Value::as_str).unwrap_or("");
        let timeout = t
            .bash
            .timeout_for(args.get("timeout").and_then(Value::as_u64));
        let builder = Sandbox::builder(["sh", "-c", line])
            .profile(t.bash.profile.clone())
            .workspace(&t.workspace)
            .timeout(timeout)
            .interrupt(if t.bash.cancel_on_interrupt.is_some() {
                Interrupt::Kill
            } else {
                Interrupt::Forward
            });
        let out = tempfile::tempfile().map_err(|e| Error::io("creating the output file", e))?;
        let fd = |f: &std::fs::File| -> Result<OwnedFd, Error> {
            f.try_clone()
                .map(OwnedFd::from)
                .map_err(|e| Error::io("duplicating the output file", e))
        };
        let stdio = Stdio::Fds {
            stdin: None,
            stdout: Some(fd(&out)?),
            stderr: Some(fd(&out)?),
        };
        Ok(BashExec {
            job: SandboxJob {
                builder: Some(builder),
                workspace: t.workspace.clone(),
                mode: JobMode::Overlay {
                    changes: ChangesMode::Apply,
                    allow_blocked: false,
                },
                state: t.state.clone(),
                protect: t.protect.clone(),
                snaps,
                owner: t.owner,
                stdio: Some(stdio),
                ui: notes,
                runner: match &t.bash.runner {
                    BashRunner::InProcess => Runner::InProcess,
                    BashRunner::Helper { exe } => Runner::Helper { exe: exe.clone() },
                },
                net: t.bash.net.clone(),
            },
            out,
            cap: t.bash.output_cap,
            timeout,
            cancel: t.bash.cancel_on_interrupt,
            session_cancel: t.cancel.clone(),
        })
    }
}

impl Executor for BashExec<'_> {
    type Output = ToolOutput;
    fn plan(&self, action: &Action) -> UndoPlan {
        self.job.plan(action)
    }
    fn execute(&mut self, action: &Action, step: &mut Step<'_>) -> Result<ToolOutput, Error> {
        let ran = self.job.execute(action, step)?;
        let mut text = String::new();
        let o = &ran.outcome;
        if o.interrupted {
            // The supervisor consumed the SIGINT: tell the session.
            if let Some(flag) = self.cancel {
                flag.store(true, Ordering::SeqCst);
            }
            self.session_cancel.cancel();
            text.push_str(
                "cancelled by the person (Ctrl-C): the sandbox was killed; its changes were not applied\n",
            );
        } else if o.timed_out {
            text.push_str(&format!(
                "timed out after {} s (the ceiling is the person's)\n",
                self.timeout.as_secs()
            ));
        } else {
            text.push_str(&format!("exit code {}\n", o.exit_code));
        }
        if let Some(h) = &ran.changes {
            let n = retie_dispatch::overlay::changes_count(&h.json);
            if h.json["applied"] == Value::Bool(true) {
                text.push_str(&format!(
                    "{n} change(s) to the workspace applied (undoable)\n"
                ));
            } else if let Some(f) = &h.failure {
                text.push_str(&format!("changes not applied: {f}\n"));
            }
        }
        text.push_str("--- output ---\n");
        let mut buf = Vec::new();
        let _ = self.out.rewind();
        let total = self.out.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = (&mut self.out).take(self.cap).read_to_end(&mut buf);
        text.push_str(&String::from_utf8_lossy(&buf));
        if total > self.cap {
            text.push_str(&format!(
                "\n[output cut at {} bytes of {total}]\n",
                self.cap
            ));
        }
        // A command that ran and exited non-zero, timed out or was
        // interrupted: failed (its outcome says which).
        Ok(if o.exit_code == 0 && !o.timed_out && !o.interrupted {
            Ok(text)
        } else {
            Err(super::ToolError::failed(text))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_models_timeout_is_clamped_to_the_ceiling() {
        let s = BashSettings {
            profile: Profile::host().expect("the built-in host profile loads"),
            ceiling: Duration::from_secs(30),
            default_timeout: Duration::from_secs(10),
            output_cap: 10,
            runner: BashRunner::InProcess,
            cancel_on_interrupt: None,
            net: None,
        };
        assert_eq!(s.timeout_for(None), Duration::from_secs(10));
        assert_eq!(s.timeout_for(Some(5)), Duration::from_secs(5));
        assert_eq!(s.timeout_for(Some(100_000)), Duration::from_secs(30));
        assert_eq!(s.timeout_for(Some(0)), Duration::from_secs(1));
    }
}
