//! The helper process: how a multi-threaded program runs a sandbox.
//!
//! Namespaces cannot be created from a multi-threaded process, so such a
//! caller spawns `retie __sandbox-helper` (any binary that calls
//! [`serve`]) with the request as JSON in `RETIE_HELPER_REQUEST` and a
//! reply pipe on fd 3. The helper is single-threaded, runs
//! [`crate::supervisor::run`], and writes the [`Outcome`] (or the error)
//! as one JSON object on fd 3. The command's stdio is the helper's stdio.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};
use crate::outcome::{Outcome, EXIT_SANDBOX_FAILED};
use crate::profile::Profile;
use crate::spec::{Sandbox, SandboxSpec, Stdio};

const REQUEST_ENV: &str = "RETIE_HELPER_REQUEST";
const REPLY_FD: i32 = 3;

/// What a helper is asked to run: a [`SandboxSpec`] in transferable form.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub argv: Vec<String>,
    pub workspace: PathBuf,
    pub profile: Profile,
    pub timeout_ms: Option<u64>,
    /// The final environment, `K=V`.
    pub env: Vec<String>,
    pub ro_binds: Vec<(PathBuf, PathBuf)>,
    /// Directories hidden from the command.
    #[serde(default)]
    pub masks: Vec<PathBuf>,
    /// The network mode (a lab mode names the lab's keeper).
    #[serde(default)]
    pub net: crate::spec::NetMode,
    /// Throwaway writable tmpfs directories.
    #[serde(default)]
    pub scratch: Vec<PathBuf>,
    /// Read-only binds layered after the scratch directories.
    #[serde(default)]
    pub layered_binds: Vec<(PathBuf, PathBuf)>,
    /// Paths covered inside the binds.
    #[serde(default)]
    pub hides: Vec<crate::spec::Hide>,
}

/// The helper's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Reply {
    Ok { outcome: Outcome },
    Err { message: String, exit_code: i32 },
}

impl Request {
    /// Transferable form of a spec.
    pub fn from_spec(spec: &SandboxSpec) -> Self {
        Request {
            argv: spec.argv(),
            workspace: spec.workspace.clone(),
            profile: spec.profile.clone(),
            timeout_ms: spec
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            env: spec.env(),
            ro_binds: spec
                .ro_binds
                .iter()
                .map(|b| (b.host.clone(), b.inside.clone()))
                .collect(),
            masks: spec.masks.clone(),
            net: spec.net.clone(),
            scratch: spec.scratch.clone(),
            layered_binds: spec
                .layered_binds
                .iter()
                .map(|b| (b.host.clone(), b.inside.clone()))
                .collect(),
            hides: spec.hides.clone(),
        }
    }

    fn to_spec(&self) -> Result<SandboxSpec> {
        let mut b = Sandbox::builder(&self.argv)
            .workspace(&self.workspace)
            .profile(self.profile.clone())
            .network(self.net.clone());
        if let Some(ms) = self.timeout_ms {
            b = b.timeout(Duration::from_millis(ms));
        }
        for m in &self.masks {
            b = b.mask(m);
        }
        for (h, i) in &self.ro_binds {
            b = b.ro_bind(h, i);
        }
        for d in &self.scratch {
            b = b.scratch(d);
        }
        for (h, i) in &self.layered_binds {
            b = b.layered_ro_bind(h, i);
        }
        for h in &self.hides {
            b = b.hide(&h.path, h.kind);
        }
        let mut spec = b.build()?;
        spec.env = self
            .env
            .iter()
            .map(|kv| {
                std::ffi::CString::new(kv.as_bytes()).map_err(|_| {
                    RuntimeError::InvalidSpec(format!("environment entry {kv:?} holds NUL"))
                })
            })
            .collect::<Result<_>>()?;
        Ok(spec)
    }
}

/// Run `spec` through a helper process (`helper_exe __sandbox-helper`).
/// Safe to call from any thread of any process. The command's stdio is
/// inherited from the caller.
pub fn run_via_helper(helper_exe: &Path, spec: &SandboxSpec) -> Result<Outcome> {
    let request = serde_json::to_string(&Request::from_spec(spec))
        .map_err(|e| RuntimeError::Helper(format!("encoding the request: {e}")))?;
    let (reply_r, reply_w) =
        crate::sys::pipe_cloexec().map_err(|e| RuntimeError::host("pipe", e))?;
    let w = reply_w.as_raw_fd();
    let mut cmd = Command::new(helper_exe);
    cmd.arg("__sandbox-helper")
        .arg("--reply-fd")
        .arg(REPLY_FD.to_string())
        .env(REQUEST_ENV, request);
    // SAFETY: the closure runs in the forked child before exec and only
    // calls dup2, which is async-signal-safe; `w` stays open in the parent
    // until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(w, REPLY_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| RuntimeError::host(format!("spawning {}", helper_exe.display()), e))?;
    drop(reply_w);
    let mut reply = String::new();
    std::fs::File::from(reply_r)
        .read_to_string(&mut reply)
        .map_err(|e| RuntimeError::host("reading the helper's reply", e))?;
    let status = child
        .wait()
        .map_err(|e| RuntimeError::host("waiting for the helper", e))?;
    match serde_json::from_str::<Reply>(reply.trim()) {
        Ok(Reply::Ok { outcome }) => Ok(outcome),
        Ok(Reply::Err { message, .. }) => Err(RuntimeError::Helper(message)),
        Err(e) => Err(RuntimeError::Helper(format!(
            "no valid reply ({e}); helper exited with {status}"
        ))),
    }
}

/// Whether an fd handed over by number (on a command line) can be used:
/// above stdio and open (`fcntl(F_GETFD)`).
pub fn check_passed_fd(fd: i32) -> std::result::Result<(), String> {
    if fd <= 2 {
        return Err("must be a descriptor above 2 (0-2 are stdio)".into());
    }
    // SAFETY: F_GETFD only reads the descriptor table entry's flags; for a
    // number that is not an open fd the kernel answers EBADF. No memory is
    // passed and no descriptor changes owner.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!(
            "is not an open file descriptor ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The helper's side: read the request, run it, reply. Returns the exit
/// code the helper process should end with.
pub fn serve(reply_fd: i32) -> i32 {
    // The reply fd comes from the command line: it must be open, and not
    // stdio (the reply would mix with the command's output). Checked before
    // anything runs, so a run is never left without its report.
    if let Err(problem) = check_passed_fd(reply_fd) {
        eprintln!("retie: --reply-fd {reply_fd}: {problem}");
        return EXIT_SANDBOX_FAILED;
    }
    let reply = match std::env::var(REQUEST_ENV)
        .map_err(|_| RuntimeError::Helper(format!("{REQUEST_ENV} is not set")))
        .and_then(|s| {
            serde_json::from_str::<Request>(&s)
                .map_err(|e| RuntimeError::Helper(format!("bad request: {e}")))
        })
        .and_then(|req| req.to_spec())
        .and_then(|spec| crate::supervisor::run(&spec, Stdio::Inherit))
    {
        Ok(outcome) => Reply::Ok { outcome },
        Err(e) => Reply::Err {
            exit_code: match &e {
                RuntimeError::Exec { exit_code, .. } => *exit_code,
                _ => EXIT_SANDBOX_FAILED,
            },
            message: e.to_string(),
        },
    };
    let code = match &reply {
        Reply::Ok { outcome } => outcome.exit_code,
        Reply::Err { exit_code, .. } => *exit_code,
    };
    let text = serde_json::to_string(&reply).unwrap_or_default();
    // SAFETY: closing the fd we were handed, once.
    let reply_file = unsafe { std::fs::File::from_raw_fd(reply_fd) };
    let _ = crate::sys::write_all(std::os::fd::AsFd::as_fd(&reply_file), text.as_bytes());
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::HideKind;

    /// The hand-kept transfer form carries the layered view: a field lost
    /// here would silently drop a bind or, worse, a cover.
    #[test]
    fn request_round_trips_the_layered_view() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Sandbox::builder(["true"])
            .workspace(dir.path())
            .scratch("/opt/tool-home")
            .layered_ro_bind("/opt/tool-home-src/bin", "/opt/tool-home/bin")
            .hide("/opt/tool-home/bin/deploy.pem", HideKind::File)
            .hide("/opt/tool-home/bin/.ssh", HideKind::Dir)
            .build()
            .expect("spec");
        let text = serde_json::to_string(&Request::from_spec(&spec)).expect("encode");
        let back: Request = serde_json::from_str(&text).expect("decode");
        let spec2 = back.to_spec().expect("spec again");
        assert_eq!(spec2.scratch(), spec.scratch());
        assert_eq!(spec2.layered_binds(), spec.layered_binds());
        assert_eq!(spec2.hides(), spec.hides());
        assert_eq!(spec2.env(), spec.env());
    }
}
