//! What every set-up step shares: the step error reported to the
//! supervisor, and the mount helpers. The steps run in the sandbox's init
//! (PID 1 of the new pid namespace), single-threaded, straight after
//! `clone`, in the order of the recipe in [`crate::init`].

use std::ffi::CString;
use std::fmt::Display;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) use rustix::mount::MountFlags;

/// A failed step inside the sandbox; sent to the supervisor as a report.
#[derive(Debug)]
pub struct SetupError {
    pub step: &'static str,
    pub message: String,
    pub hint: Option<String>,
}

impl SetupError {
    /// A step failed with an OS error.
    pub fn io(step: &'static str, op: impl Display, err: io::Error) -> Self {
        SetupError {
            step,
            message: format!("{op}: {err}"),
            hint: None,
        }
    }
    /// Attach the fix a person should apply.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// Result of a set-up step.
pub type StepResult<T = ()> = Result<T, SetupError>;

/// A path as a C string (paths from a validated spec never hold NUL).
pub(crate) fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_else(|_| CString::from(c"/nonexistent"))
}

/// A `tmpfs` on `dir` owned by the sandbox user (nosuid, nodev), with the
/// given mode and size (`64k`, `25%`).
pub(crate) fn owned_tmpfs(
    step: &'static str,
    dir: &Path,
    mode: &str,
    size: &str,
    id: &crate::spec::Identity,
) -> StepResult {
    let opts = format!(
        "mode={mode},uid={},gid={},size={size}",
        id.inner_uid, id.inner_gid
    );
    mount(
        step,
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(&opts),
    )
}

/// `mount(2)` of a filesystem (`tmpfs`, `proc`, ...) with optional data.
pub(crate) fn mount(
    step: &'static str,
    source: &str,
    target: &Path,
    fstype: &str,
    flags: MountFlags,
    data: Option<&str>,
) -> StepResult {
    let dat = data.and_then(|d| CString::new(d).ok());
    rustix::mount::mount(source, target, fstype, flags, dat.as_deref()).map_err(|e| {
        SetupError::io(
            step,
            format!("mount {source} on {} ({fstype})", target.display()),
            e.into(),
        )
    })
}

/// Make the mount at `target` (and everything under it) read-only,
/// nosuid and nodev. `MS_BIND|MS_RDONLY` in one call would leave it
/// writable; mount_setattr also covers submounts.
pub(crate) fn make_readonly(step: &'static str, target: &Path) -> StepResult {
    use crate::sys::MountAttrFlags as A;
    crate::sys::mount_setattr(
        None,
        &cpath(target),
        crate::sys::AT_RECURSIVE,
        A::MOUNT_ATTR_RDONLY | A::MOUNT_ATTR_NOSUID | A::MOUNT_ATTR_NODEV,
        None,
    )
    .map_err(|e| SetupError::io(step, format!("making {} read-only", target.display()), e))
}

/// Create a directory or empty-file mount point, creating parents only
/// when needed. The new root is a fresh tmpfs, so the common case is one
/// syscall; an existing mount point is fine.
pub(crate) fn mountpoint(step: &'static str, target: &Path, dir: bool) -> StepResult {
    use rustix::fs::{Mode, OFlags};
    let attempt = || -> rustix::io::Result<()> {
        if dir {
            rustix::fs::mkdir(target, Mode::from_raw_mode(0o755))
        } else {
            rustix::fs::open(
                target,
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map(drop)
        }
    };
    let mut res = attempt();
    if res == Err(rustix::io::Errno::NOENT) {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| SetupError::io(step, format!("mkdir {}", parent.display()), e))?;
        }
        res = attempt();
    }
    match res {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        // A read-only bind already holds the path (e.g. a workspace under
        // /usr): mounting over an existing directory is still possible.
        Err(rustix::io::Errno::ROFS) if target.exists() => Ok(()),
        Err(e) => Err(SetupError::io(
            step,
            format!("creating mount point {}", target.display()),
            e.into(),
        )),
    }
}

/// Bind `source` at `target` (recursively).
pub(crate) fn bind(step: &'static str, source: &Path, target: &Path) -> StepResult {
    rustix::mount::mount_bind_recursive(source, target).map_err(|e| {
        SetupError::io(
            step,
            format!("bind {} on {}", source.display(), target.display()),
            e.into(),
        )
    })
}
