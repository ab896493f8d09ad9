//! The sandbox set-up, one module per step, in the order the steps run.
//!
//! The host side ([`userns::write_maps`], [`workspace::prepare_idmap`]) runs
//! in the supervisor; everything else runs in the sandbox's init (PID 1 of
//! the new pid namespace), single-threaded, straight after `clone`. The
//! order is the recipe in [`crate::init`]; each step says why it sits where
//! it does.

pub mod caps;
pub mod dev;
pub mod exec;
pub mod fds;
pub mod identity;
pub mod landlock;
pub mod net;
pub mod procfs;
pub mod rlimits;
pub mod rootfs;
pub mod seccomp;
pub mod session;
pub mod system;
pub mod userns;
pub mod workspace;

use std::ffi::CString;
use std::fmt::Display;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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
    /// A step failed with the last OS error.
    pub fn last_os(step: &'static str, op: impl Display) -> Self {
        Self::io(step, op, io::Error::last_os_error())
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

/// `mount(2)` with optional source/fstype/data.
pub(crate) fn mount(
    step: &'static str,
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> StepResult {
    let src = source.map(cpath);
    let tgt = cpath(target);
    let fst = fstype.and_then(|f| CString::new(f).ok());
    let dat = data.and_then(|d| CString::new(d).ok());
    // SAFETY: every pointer is either NULL or a valid NUL-terminated string
    // that outlives the call.
    let ret = unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            fst.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            dat.as_ref().map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    };
    if ret < 0 {
        return Err(SetupError::last_os(
            step,
            format!(
                "mount {} on {} ({})",
                source.map_or("-".into(), |s| s.display().to_string()),
                target.display(),
                fstype.unwrap_or("bind")
            ),
        ));
    }
    Ok(())
}

/// Make the mount at `target` (and everything under it) read-only,
/// nosuid and nodev. `MS_BIND|MS_RDONLY` in one call would leave it
/// writable; mount_setattr also covers submounts.
pub(crate) fn make_readonly(step: &'static str, target: &Path) -> StepResult {
    crate::sys::mount_setattr(
        libc::AT_FDCWD,
        &cpath(target),
        crate::sys::AT_RECURSIVE,
        crate::sys::MOUNT_ATTR_RDONLY | crate::sys::MOUNT_ATTR_NOSUID | crate::sys::MOUNT_ATTR_NODEV,
        None,
    )
    .map_err(|e| SetupError::io(step, format!("making {} read-only", target.display()), e))
}

/// Create a mount point for `source` at `target`: a directory for a
/// directory, an empty file otherwise. Parents are created as needed.
pub(crate) fn mountpoint_like(step: &'static str, source: &Path, target: &Path) -> StepResult {
    let is_dir = std::fs::metadata(source)
        .map_err(|e| SetupError::io(step, format!("stat {}", source.display()), e))?
        .is_dir();
    mountpoint(step, target, is_dir)
}

/// Create a directory or empty-file mount point (and its parents).
pub(crate) fn mountpoint(step: &'static str, target: &Path, dir: bool) -> StepResult {
    if dir {
        if target.is_dir() {
            return Ok(());
        }
        return std::fs::create_dir_all(target)
            .map_err(|e| SetupError::io(step, format!("mkdir {}", target.display()), e));
    }
    if let Some(parent) = target.parent() {
        if !parent.is_dir() {
            std::fs::create_dir_all(parent)
                .map_err(|e| SetupError::io(step, format!("mkdir {}", parent.display()), e))?;
        }
    }
    if target.exists() {
        return Ok(());
    }
    std::fs::File::create(target)
        .map(drop)
        .map_err(|e| SetupError::io(step, format!("creating {}", target.display()), e))
}

/// Bind `source` at `target` (recursively).
pub(crate) fn bind(step: &'static str, source: &Path, target: &Path) -> StepResult {
    mount(
        step,
        Some(source),
        target,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    )
}
