//! Step 10: resource limits from the profile (soft = hard, so the command
//! cannot raise them back).

use super::{SetupError, StepResult};
use crate::profile::Limits;

const STEP: &str = "rlimits";

/// Apply every limit that is set.
pub fn apply(limits: &Limits) -> StepResult {
    use rustix::process::{Resource, Rlimit};
    let table = [
        (Resource::As, limits.address_space, "address_space"),
        (Resource::Core, limits.core, "core"),
        (Resource::Cpu, limits.cpu, "cpu"),
        (Resource::Fsize, limits.fsize, "fsize"),
        (Resource::Nofile, limits.nofile, "nofile"),
        (Resource::Nproc, limits.nproc, "nproc"),
    ];
    for (resource, value, name) in table {
        let Some(v) = value else { continue };
        let lim = Rlimit {
            current: Some(v),
            maximum: Some(v),
        };
        rustix::process::setrlimit(resource, lim)
            .map_err(|e| SetupError::io(STEP, format!("setrlimit {name}={v}"), e.into()))?;
    }
    Ok(())
}
