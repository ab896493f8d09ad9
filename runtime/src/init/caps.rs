//! Step 11: drop every capability: bounding set first (while CAP_SETPCAP
//! is still held), then ambient, then effective/permitted/inheritable.

use rustix::thread::{CapabilitySet, CapabilitySets};

use super::{SetupError, StepResult};

const STEP: &str = "caps";

/// Drop everything.
pub fn drop_all() -> StepResult {
    // Up to the highest capability the kernel knows: PR_CAPBSET_DROP answers
    // EINVAL past /proc/sys/kernel/cap_last_cap, which ends the loop.
    for cap in 0..64u32 {
        let one = CapabilitySet::from_bits_retain(1u64 << cap);
        match rustix::thread::remove_capability_from_bounding_set(one) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) => break, // beyond what this kernel knows
            Err(e) => {
                return Err(SetupError::io(
                    STEP,
                    format!("dropping capability {cap} from the bounding set"),
                    e.into(),
                ))
            }
        }
    }
    rustix::thread::clear_ambient_capability_set()
        .map_err(|e| SetupError::io(STEP, "clearing ambient capabilities", e.into()))?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none)
        .map_err(|e| SetupError::io(STEP, "capset(0)", e.into()))
}
