//! Step 5: a minimal /dev: the harmless character devices bound from the
//! host, a private devpts instance, and a tmpfs /dev/shm.

use std::os::unix::fs::symlink;
use std::path::Path;

use super::rootfs::host;
use super::{bind, mount, mountpoint, MountFlags, SetupError, StepResult};

const STEP: &str = "dev";
/// Device nodes bound from the host (a user namespace cannot mknod).
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Populate /dev; `/dev/shm` is capped at `shm_size` (a tmpfs `size=`).
pub fn populate(shm_size: &str) -> StepResult {
    let dev = Path::new("/dev");
    std::fs::create_dir_all(dev).map_err(|e| SetupError::io(STEP, "mkdir /dev", e))?;
    mount(
        STEP,
        "tmpfs",
        dev,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        Some("mode=0755,size=64k"),
    )?;
    for name in DEVICES {
        let target = dev.join(name);
        mountpoint(STEP, &target, false)?;
        bind(STEP, &host(&target), &target)?;
    }
    let pts = dev.join("pts");
    mountpoint(STEP, &pts, true)?;
    // gid=5 would be EINVAL: that gid is not mapped in the namespace.
    mount(
        STEP,
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    let shm = dev.join("shm");
    mountpoint(STEP, &shm, true)?;
    mount(
        STEP,
        "tmpfs",
        &shm,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(&format!("mode=1777,size={shm_size}")),
    )?;
    let links = [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ];
    for (name, target) in links {
        symlink(target, dev.join(name))
            .map_err(|e| SetupError::io(STEP, format!("symlink /dev/{name}"), e))?;
    }
    // Nothing new may appear in /dev itself (its submounts stay as they are).
    use crate::sys::MountAttrFlags as A;
    crate::sys::mount_setattr(
        None,
        c"/dev",
        0,
        A::MOUNT_ATTR_RDONLY | A::MOUNT_ATTR_NOSUID,
        None,
    )
    .map_err(|e| SetupError::io(STEP, "making /dev read-only", e))
}
