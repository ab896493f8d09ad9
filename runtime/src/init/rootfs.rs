//! Step 2: a private mount tree and a fresh tmpfs root.
//!
//! The host tree stays reachable at [`OLD_ROOT`] until [`detach_old_root`],
//! so later steps bind from it; it must stay attached until `/proc` is
//! mounted (the kernel only lets a user namespace mount proc while a fully
//! visible proc exists in the mount namespace).

use std::path::Path;

use super::{mount, MountFlags, SetupError, StepResult};

const STEP: &str = "rootfs";
/// Where the host's root is reachable during set-up.
pub const OLD_ROOT: &str = "/oldroot";
/// Where the new root's tmpfs is first mounted (hidden by the pivot).
const STAGING: &str = "/tmp";

/// Make every mount private, mount a tmpfs and pivot into it.
pub fn pivot_into_tmpfs() -> StepResult {
    // Nothing done in here may propagate back to the host.
    use rustix::mount::MountPropagationFlags as P;
    rustix::mount::mount_change("/", P::REC | P::PRIVATE)
        .map_err(|e| SetupError::io(STEP, "making / private", e.into()))?;
    mount(
        STEP,
        "tmpfs",
        Path::new(STAGING),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some("mode=0755,size=16m"),
    )?;
    std::fs::create_dir(Path::new(STAGING).join("oldroot"))
        .map_err(|e| SetupError::io(STEP, "mkdir oldroot", e))?;
    std::env::set_current_dir(STAGING).map_err(|e| SetupError::io(STEP, "chdir to new root", e))?;
    rustix::process::pivot_root(".", "oldroot").map_err(|e| {
        SetupError::io(STEP, "pivot_root", e.into())
            .hint("pivot_root is refused inside some container runtimes; run retie on the host or in a VM")
    })?;
    std::env::set_current_dir("/").map_err(|e| SetupError::io(STEP, "chdir /", e))?;
    Ok(())
}

/// Host path `p` as reachable during set-up.
pub fn host(p: &Path) -> std::path::PathBuf {
    Path::new(OLD_ROOT).join(p.strip_prefix("/").unwrap_or(p))
}

/// Detach the host's tree; from here on nothing of it is reachable.
pub fn detach_old_root() -> StepResult {
    rustix::mount::unmount(OLD_ROOT, rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| SetupError::io(STEP, "detaching the old root", e.into()))?;
    std::fs::remove_dir(OLD_ROOT).map_err(|e| SetupError::io(STEP, "rmdir /oldroot", e))
}

/// Make the tmpfs root itself read-only (the writable places are their
/// own mounts: workspace, home, tmp).
pub fn seal_root() -> StepResult {
    use crate::sys::MountAttrFlags as A;
    crate::sys::mount_setattr(
        None,
        c"/",
        0,
        A::MOUNT_ATTR_RDONLY | A::MOUNT_ATTR_NOSUID | A::MOUNT_ATTR_NODEV,
        None,
    )
    .map_err(|e| SetupError::io(STEP, "making / read-only", e))
}
