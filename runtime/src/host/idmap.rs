//! The idmapped workspace (retie invoked as root), host side: the
//! supervisor opens detached copies of the trees before the clone, and
//! idmaps them through the sandbox's user namespace once its id maps are
//! written. init attaches them (`crate::init::workspace`).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crate::error::{Result, RuntimeError};
use crate::init::cpath;
use crate::spec::{SandboxSpec, WorkspaceMode};

/// Detached copies of the host trees the sandbox user must reach through
/// an idmapped mount (retie invoked as root): the workspace and, in overlay
/// mode, the directory holding upper and work (overlay wants both under
/// one mount).
pub struct IdmapTrees {
    pub workspace: OwnedFd,
    pub overlay: Option<OwnedFd>,
}

impl IdmapTrees {
    fn all(&self) -> impl Iterator<Item = &OwnedFd> {
        std::iter::once(&self.workspace).chain(self.overlay.iter())
    }
}

/// Before the clone: detached copies of the trees to idmap.
pub fn prepare(spec: &SandboxSpec) -> Result<Option<IdmapTrees>> {
    if !spec.identity.idmap_workspace {
        return Ok(None);
    }
    let open = |p: &Path| {
        crate::sys::open_tree_clone(&cpath(p))
            .map_err(|e| RuntimeError::host(format!("open_tree {}", p.display()), e))
    };
    let overlay = match &spec.workspace_mode {
        WorkspaceMode::Direct => None,
        WorkspaceMode::Overlay { upper, .. } => Some(open(upper.parent().unwrap_or(upper))?),
    };
    Ok(Some(IdmapTrees {
        workspace: open(&spec.workspace)?,
        overlay,
    }))
}

/// After the id maps are written: idmap the detached tree through
/// the sandbox's own user namespace (on-disk owner <-> sandbox user).
pub fn apply(trees: &IdmapTrees, child: libc::pid_t) -> Result<()> {
    let userns = std::fs::File::open(format!("/proc/{child}/ns/user"))
        .map_err(|e| RuntimeError::host("opening the sandbox's user namespace", e))?;
    for tree in trees.all() {
        idmap_one(tree, &userns)?;
    }
    Ok(())
}

fn idmap_one(tree: &OwnedFd, userns: &std::fs::File) -> Result<()> {
    use crate::sys::MountAttrFlags as A;
    crate::sys::mount_setattr(
        Some(tree.as_fd()),
        c"",
        libc::AT_EMPTY_PATH.cast_unsigned() | crate::sys::AT_RECURSIVE,
        A::MOUNT_ATTR_IDMAP | A::MOUNT_ATTR_NOSUID | A::MOUNT_ATTR_NODEV,
        Some(userns.as_fd()),
    )
    .map_err(|e| RuntimeError::Unsupported {
        problem: format!("cannot create an idmapped mount of the workspace: {e}"),
        fix: "idmapped mounts need Linux >= 5.12 and a filesystem that supports them (ext4, xfs, btrfs, tmpfs >= 6.3). Run retie as the workspace's owner instead of root.".into(),
    })
}
