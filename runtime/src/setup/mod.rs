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
pub mod layered;
pub mod net;
pub mod net_lab;
pub mod netlink;
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
        crate::sys::MOUNT_ATTR_RDONLY
            | crate::sys::MOUNT_ATTR_NOSUID
            | crate::sys::MOUNT_ATTR_NODEV,
        None,
    )
    .map_err(|e| SetupError::io(step, format!("making {} read-only", target.display()), e))
}

/// Create a directory or empty-file mount point, creating parents only
/// when needed. The new root is a fresh tmpfs, so the common case is one
/// syscall; an existing mount point is fine.
pub(crate) fn mountpoint(step: &'static str, target: &Path, dir: bool) -> StepResult {
    let c = cpath(target);
    let attempt = || -> i32 {
        // SAFETY: `c` is a valid C string; a created file's fd is closed.
        unsafe {
            if dir {
                libc::mkdir(c.as_ptr(), 0o755)
            } else {
                let fd = libc::open(
                    c.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd >= 0 {
                    libc::close(fd);
                    0
                } else {
                    fd
                }
            }
        }
    };
    if attempt() == 0 {
        return Ok(());
    }
    let mut err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOENT) {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| SetupError::io(step, format!("mkdir {}", parent.display()), e))?;
        }
        if attempt() == 0 {
            return Ok(());
        }
        err = io::Error::last_os_error();
    }
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(()),
        // A read-only bind already holds the path (e.g. a workspace under
        // /usr): mounting over an existing directory is still possible.
        Some(libc::EROFS) if target.exists() => Ok(()),
        _ => Err(SetupError::io(
            step,
            format!("creating mount point {}", target.display()),
            err,
        )),
    }
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
