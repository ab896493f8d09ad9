//! Step 6: the workspace, read-write at its own absolute path.
//!
//! The mount dispatches on [`WorkspaceMode`], so other presentations (an
//! overlay whose upper layer captures the command's changes) replace this
//! one step and nothing else.
//!
//! When retie runs as root the sandbox runs as an unprivileged host uid;
//! the workspace is then presented through an idmapped mount (prepared on
//! the host side by [`prepare_idmap`]/[`apply_idmap`]) so that files owned
//! by the workspace's owner appear as the sandbox user's own, and what it
//! writes lands on disk owned by the workspace's owner. No file mode is
//! loosened and nothing is mapped to host root.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use super::rootfs::host;
use super::{bind, cpath, mountpoint, SetupError, StepResult};
use crate::error::{Result, RuntimeError};
use crate::spec::{SandboxSpec, WorkspaceMode};

const STEP: &str = "workspace";

/// Host side, before clone: a detached copy of the workspace mount tree.
pub fn prepare_idmap(spec: &SandboxSpec) -> Result<Option<OwnedFd>> {
    if !spec.identity.idmap_workspace {
        return Ok(None);
    }
    crate::sys::open_tree_clone(&cpath(&spec.workspace))
        .map(Some)
        .map_err(|e| RuntimeError::host(format!("open_tree {}", spec.workspace.display()), e))
}

/// Host side, after the maps are written: idmap the detached tree through
/// the sandbox's own user namespace (on-disk owner <-> sandbox user).
pub fn apply_idmap(tree: &OwnedFd, child: libc::pid_t) -> Result<()> {
    let userns = std::fs::File::open(format!("/proc/{child}/ns/user"))
        .map_err(|e| RuntimeError::host("opening the sandbox's user namespace", e))?;
    crate::sys::mount_setattr(
        tree.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as libc::c_uint | crate::sys::AT_RECURSIVE,
        crate::sys::MOUNT_ATTR_IDMAP | crate::sys::MOUNT_ATTR_NOSUID | crate::sys::MOUNT_ATTR_NODEV,
        Some(userns.as_raw_fd()),
    )
    .map_err(|e| RuntimeError::Unsupported {
        problem: format!("cannot create an idmapped mount of the workspace: {e}"),
        fix: "idmapped mounts need Linux >= 5.12 and a filesystem that supports them (ext4, xfs, btrfs, tmpfs >= 6.3). Run retie as the workspace's owner instead of root.".into(),
    })
}

/// Inside: mount the workspace at its own path.
pub fn mount_workspace(spec: &SandboxSpec, idmapped: Option<&OwnedFd>) -> StepResult {
    let ws = &spec.workspace;
    mountpoint(STEP, ws, true)?;
    match (spec.workspace_mode, idmapped) {
        (WorkspaceMode::Direct, Some(tree)) => {
            crate::sys::move_mount_fd(tree.as_raw_fd(), &cpath(ws))
                .map_err(|e| SetupError::io(STEP, "attaching the idmapped workspace", e))?
        }
        (WorkspaceMode::Direct, None) => {
            bind(STEP, &host(ws), ws)?;
            crate::sys::mount_setattr(
                libc::AT_FDCWD,
                &cpath(ws),
                crate::sys::AT_RECURSIVE,
                crate::sys::MOUNT_ATTR_NOSUID | crate::sys::MOUNT_ATTR_NODEV,
                None,
            )
            .map_err(|e| SetupError::io(STEP, "nosuid,nodev on the workspace", e))?
        }
    }
    Ok(())
}

/// Inside: fresh tmpfs for $HOME and the profile's scratch directories,
/// owned by the sandbox user. Mounted before the workspace, so a workspace
/// that lives under one of them is bound on top, not hidden.
pub fn mount_scratch(spec: &SandboxSpec) -> StepResult {
    let id = &spec.identity;
    let mut dirs: Vec<(&Path, &str)> = spec
        .profile
        .filesystem
        .tmpfs
        .iter()
        .map(|p| (p.as_path(), "1777"))
        .collect();
    dirs.push((id.home.as_path(), "0700"));
    dirs.sort_by_key(|(p, _)| p.components().count());
    for (dir, mode) in dirs {
        mountpoint(STEP, dir, true)?;
        let opts = format!(
            "mode={mode},uid={},gid={},size=50%",
            id.inner_uid, id.inner_gid
        );
        super::mount(
            STEP,
            Some(Path::new("tmpfs")),
            dir,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&opts),
        )?;
    }
    Ok(())
}
