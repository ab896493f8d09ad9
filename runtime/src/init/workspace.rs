//! Step 6: the workspace, read-write at its own absolute path.
//!
//! The mount dispatches on [`WorkspaceMode`], so other presentations (an
//! overlay whose upper layer captures the command's changes) replace this
//! one step and nothing else.
//!
//! When retie runs as root the sandbox runs as an unprivileged host uid;
//! the workspace is then presented through an idmapped mount (prepared by
//! the supervisor, `crate::host::idmap`) so that files owned
//! by the workspace's owner appear as the sandbox user's own, and what it
//! writes lands on disk owned by the workspace's owner. No file mode is
//! loosened and nothing is mapped to host root.

use std::os::fd::OwnedFd;
use std::path::Path;

use super::rootfs::host;
use super::{bind, cpath, mountpoint, owned_tmpfs, MountFlags, SetupError, StepResult};
use crate::host::idmap::IdmapTrees;
use crate::spec::{SandboxSpec, WorkspaceMode};

const STEP: &str = "workspace";

/// Inside: mount the workspace at its own path.
pub fn mount_workspace(spec: &SandboxSpec, idmapped: Option<&IdmapTrees>) -> StepResult {
    let ws = &spec.workspace;
    mountpoint(STEP, ws, true)?;
    match (&spec.workspace_mode, idmapped) {
        (WorkspaceMode::Overlay { upper, work }, None) => {
            mount_overlay(ws, &host(ws), &host(upper), &host(work))?
        }
        (WorkspaceMode::Overlay { upper, work }, Some(trees)) => {
            overlay_from_trees(ws, trees, upper, work, &spec.identity)?
        }
        (WorkspaceMode::Direct, Some(trees)) => {
            crate::sys::move_mount_fd(&trees.workspace, &cpath(ws))
                .map_err(|e| SetupError::io(STEP, "attaching the idmapped workspace", e))?
        }
        (WorkspaceMode::Direct, None) => {
            bind(STEP, &host(ws), ws)?;
            crate::sys::mount_setattr(
                None,
                &cpath(ws),
                crate::sys::AT_RECURSIVE,
                crate::sys::MountAttrFlags::MOUNT_ATTR_NOSUID
                    | crate::sys::MountAttrFlags::MOUNT_ATTR_NODEV,
                None,
            )
            .map_err(|e| SetupError::io(STEP, "nosuid,nodev on the workspace", e))?
        }
    }
    Ok(())
}

/// Inside, after the workspace is mounted: cover each masked directory
/// with an empty, read-only tmpfs. A mask that does not exist yet has
/// nothing to hide.
pub fn mask_dirs(spec: &SandboxSpec) -> StepResult {
    for m in &spec.masks {
        if !m.is_dir() {
            continue;
        }
        super::mount(
            STEP,
            "tmpfs",
            m,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY,
            Some("mode=000,size=4k"),
        )?;
    }
    Ok(())
}

/// Root-invoked overlay: the layers are idmapped trees the supervisor
/// opened (the sandbox user may not be able to walk to the state
/// directory). They are attached in a private staging tmpfs, the overlay
/// is mounted from there, and the staging is detached again: the overlay
/// keeps its own references to its layers.
fn overlay_from_trees(
    ws: &Path,
    trees: &IdmapTrees,
    upper: &Path,
    work: &Path,
    id: &crate::spec::Identity,
) -> StepResult {
    let Some(run) = &trees.overlay else {
        return Err(SetupError {
            step: STEP,
            message: "overlay mode without upper and work trees".into(),
            hint: None,
        });
    };
    // The staging tmpfs covers the host's /proc in this namespace's copy
    // of the old root: the sandbox's own proc is mounted by now (it needed
    // the host's fully visible), and the old root, staging and all, is
    // detached a few steps later in one lazy unmount. Unmounting the
    // staging by itself cost a second one (each waits for an RCU grace
    // period). Without a host /proc (never seen), the staging is made at
    // the new root and unmounted here.
    let under_old_root = host(Path::new("/proc"));
    let (stage, detach) = if under_old_root.is_dir() {
        (under_old_root, false)
    } else {
        let stage = Path::new("/.retie-stage").to_path_buf();
        mountpoint(STEP, &stage, true)?;
        (stage, true)
    };
    let stage = stage.as_path();
    owned_tmpfs(STEP, stage, "0700", "64k", id)?;
    let (lower, run_at) = (stage.join("lower"), stage.join("run"));
    for d in [&lower, &run_at] {
        mountpoint(STEP, d, true)?;
    }
    attach(&trees.workspace, &lower, "workspace")?;
    attach(run, &run_at, "overlay directory")?;
    let name = |p: &Path| {
        p.file_name()
            .map(|n| run_at.join(n))
            .unwrap_or_else(|| run_at.clone())
    };
    mount_overlay(ws, &lower, &name(upper), &name(work))?;
    if !detach {
        return Ok(());
    }
    rustix::mount::unmount(stage, rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| SetupError::io(STEP, "detaching the overlay staging", e.into()))?;
    std::fs::remove_dir(stage).map_err(|e| SetupError::io(STEP, "rmdir the overlay staging", e))
}

fn attach(tree: &OwnedFd, at: &Path, what: &str) -> StepResult {
    crate::sys::move_mount_fd(tree, &cpath(at))
        .map_err(|e| SetupError::io(STEP, format!("attaching the idmapped {what}"), e))
}

/// Escape a path for overlay's comma-separated, colon-separated options.
fn overlay_escape(p: &Path) -> String {
    let mut out = String::new();
    for ch in p.to_string_lossy().chars() {
        if matches!(ch, ',' | ':' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// The overlay: lower = the real workspace (read-only), writes go to the
/// upper. `userxattr` is what a user namespace may use (and without it,
/// deleting a lower directory fails with EIO). `volatile` (ADR 0411):
/// without it, the overlay's unmount, when the sandbox ends, syncs the
/// whole filesystem the upper lies on; the upper is a scratch layer whose
/// changes reach the workspace only through retie's own synced apply, and
/// a run that is kept is synced by the caller. The kernel marks the work
/// directory (`work/work/incompat/volatile`) and refuses to mount it again
/// until that is removed. A stale work directory makes overlay mount
/// read-only without an error, so the result is checked.
fn mount_overlay(at: &Path, lower: &Path, upper: &Path, work: &Path) -> StepResult {
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr,volatile",
        overlay_escape(lower),
        overlay_escape(upper),
        overlay_escape(work)
    );
    super::mount(STEP, "overlay", at, "overlay", MountFlags::NOSUID | MountFlags::NODEV, Some(&opts))
        .map_err(|e| e.hint("overlayfs in a user namespace needs Linux >= 5.11 and an upper directory on a filesystem with user xattrs (ext4, xfs, btrfs, tmpfs >= 6.6); or use --workspace-mode direct"))?;
    let st = rustix::fs::statvfs(at)
        .map_err(|e| SetupError::io(STEP, "statvfs of the overlay", e.into()))?;
    if st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Err(SetupError {
            step: STEP,
            message: "the workspace overlay mounted read-only (a stale or foreign work directory?)"
                .into(),
            hint: Some("use a fresh, empty upper and work directory on one filesystem".into()),
        });
    }
    Ok(())
}

/// Inside: fresh tmpfs for $HOME and the profile's scratch directories,
/// owned by the sandbox user, each capped at the profile's size. Mounted before the workspace, so a workspace
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
    // Each capped (the profile's tmpfs_size_mib; ADR 0418).
    let size = spec.profile.filesystem.tmpfs_size();
    dirs.sort_by_key(|(p, _)| p.components().count());
    for (dir, mode) in dirs {
        mountpoint(STEP, dir, true)?;
        owned_tmpfs(STEP, dir, mode, &size, id)?;
    }
    Ok(())
}
