//! Step 11: drop every capability: bounding set first (while CAP_SETPCAP
//! is still held), then ambient, then effective/permitted/inheritable.

use super::{SetupError, StepResult};

const STEP: &str = "caps";

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Drop everything.
pub fn drop_all() -> StepResult {
    // Up to the highest capability the kernel knows: PR_CAPBSET_DROP answers
    // EINVAL past /proc/sys/kernel/cap_last_cap, which ends the loop.
    for cap in 0..64u32 {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break; // beyond what this kernel knows
            }
            return Err(SetupError::io(
                STEP,
                format!("dropping capability {cap} from the bounding set"),
                e,
            ));
        }
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(SetupError::last_os(STEP, "clearing ambient capabilities"));
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array (version 3 layout) are
    // valid for the kernel to read.
    if unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) } < 0 {
        return Err(SetupError::last_os(STEP, "capset(0)"));
    }
    Ok(())
}
