//! Step 4: a fresh /proc for the new pid namespace, with the knobs that
//! reach the kernel (sysctls, sysrq, irq, bus) read-only.
//!
//! Runs while the host root is still attached: the kernel allows a user
//! namespace to mount proc only if a fully visible proc already exists in
//! the mount namespace.

use std::path::Path;

use super::{bind, make_readonly, mount, MountFlags, StepResult};

const STEP: &str = "proc";
const READ_ONLY: &[&str] = &["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"];

/// Mount proc and cover its dangerous corners.
pub fn mount_proc() -> StepResult {
    std::fs::create_dir_all("/proc").map_err(|e| super::SetupError::io(STEP, "mkdir /proc", e))?;
    mount(
        STEP,
        "proc",
        Path::new("/proc"),
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .map_err(|e| {
        e.hint("/proc cannot be mounted here: a container runtime masks parts of the host's /proc. Run retie on the host or in a VM, or give the container an unmasked /proc (docker: --security-opt systempaths=unconfined)")
    })?;
    for p in READ_ONLY {
        let p = Path::new(p);
        if p.exists() {
            bind(STEP, p, p)?;
            make_readonly(STEP, p)?;
        }
    }
    Ok(())
}
