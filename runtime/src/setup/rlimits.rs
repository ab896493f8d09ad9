//! Step 10: resource limits from the profile (soft = hard, so the command
//! cannot raise them back).

use super::{SetupError, StepResult};
use crate::profile::Limits;

const STEP: &str = "rlimits";

/// Apply every limit that is set.
pub fn apply(limits: &Limits) -> StepResult {
    let table = [
        (libc::RLIMIT_AS, limits.address_space, "address_space"),
        (libc::RLIMIT_CORE, limits.core, "core"),
        (libc::RLIMIT_CPU, limits.cpu, "cpu"),
        (libc::RLIMIT_FSIZE, limits.fsize, "fsize"),
        (libc::RLIMIT_NOFILE, limits.nofile, "nofile"),
        (libc::RLIMIT_NPROC, limits.nproc, "nproc"),
    ];
    for (resource, value, name) in table {
        let Some(v) = value else { continue };
        let lim = libc::rlimit {
            rlim_cur: v as libc::rlim_t,
            rlim_max: v as libc::rlim_t,
        };
        // SAFETY: `lim` is a valid rlimit struct the kernel only reads.
        if unsafe { libc::setrlimit(resource, &lim) } < 0 {
            return Err(SetupError::last_os(STEP, format!("setrlimit {name}={v}")));
        }
    }
    Ok(())
}
