//! Step 12: Landlock. Read-only on the whole system view, read-write on
//! the workspace, $HOME, the scratch tmpfs and the few devices; TCP bind
//! and connect denied; abstract unix sockets and signals scoped to the
//! sandbox. Runs after every mount (Landlock refuses mounts afterwards)
//! and after the capability drop.

use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use super::{SetupError, StepResult};
use crate::spec::SandboxSpec;

const STEP: &str = "landlock";
/// The newest ABI this build knows how to use.
pub const NEWEST_KNOWN_ABI: i32 = 7;

/// What was enforced.
pub struct Enforced {
    pub abi: i32,
    pub fully: bool,
}

/// Build and enforce the ruleset. `kernel_abi` is the ABI to use: the
/// kernel's, lowered by the test cap (`preflight::landlock_in_use`), read by
/// the supervisor and already checked against the profile's floor and the
/// lab modes' (ABI 4). Below ABI 6 the walls the ruleset lacks have stand-ins
/// (`preflight::LANDLOCK_GAPS`, ADR 0430).
pub fn restrict(spec: &SandboxSpec, kernel_abi: i32) -> StepResult<Enforced> {
    let abi_num = kernel_abi.min(NEWEST_KNOWN_ABI);
    let abi = ABI::from(abi_num);
    let err = |e: landlock::RulesetError| SetupError {
        step: STEP,
        message: e.to_string(),
        hint: None,
    };

    let read = AccessFs::from_read(abi);
    let write_all = AccessFs::from_all(abi) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let device = AccessFs::from_file(abi);

    let mut writable: Vec<PathBuf> = vec![
        spec.workspace.clone(),
        spec.identity.home.clone(),
        "/dev/shm".into(),
        "/dev/pts".into(),
    ];
    writable.extend(spec.profile.filesystem.tmpfs.iter().cloned());
    writable.extend(spec.scratch.iter().cloned());

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if abi_num >= 4 {
        // Every TCP bind and connect is denied but the lab's ports (below).
        // The lab target may bind any port (it has no uplink; what it
        // listens on is reachable only on the ports the lab declared).
        let net = match spec.net {
            crate::spec::NetMode::LabTarget(_) => AccessNet::ConnectTcp.into(),
            _ => AccessNet::from_all(abi),
        };
        ruleset = ruleset.handle_access(net).map_err(err)?;
    }
    if abi_num >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    created = created
        .add_rule(PathBeneath::new(open(Path::new("/"))?, read))
        .map_err(err)?;
    for p in &writable {
        created = created
            .add_rule(PathBeneath::new(open(p)?, write_all))
            .map_err(err)?;
    }
    for name in super::dev::DEVICES {
        let p = Path::new("/dev").join(name);
        created = created
            .add_rule(PathBeneath::new(open(&p)?, device & access_file_only(abi)))
            .map_err(err)?;
    }
    // The lab modes: the second wall behind the namespace's routes. A lab
    // sandbox may connect to the lab's declared ports only; the lab target
    // connects nowhere.
    match &spec.net {
        crate::spec::NetMode::None => {}
        // The proxy's port on the sandbox's own loopback, and nothing else.
        crate::spec::NetMode::Proxy(p) => {
            if abi_num < 4 {
                return Err(SetupError {
                    step: STEP,
                    message: "the proxied network needs Landlock TCP rules (ABI 4)".into(),
                    hint: Some("upgrade the kernel to Linux 6.7 or newer".into()),
                });
            }
            created = created
                .add_rule(NetPort::new(p.port, AccessNet::ConnectTcp))
                .map_err(err)?;
        }
        crate::spec::NetMode::Lab(lab) | crate::spec::NetMode::LabTarget(lab) => {
            if abi_num < 4 {
                // The preflight refused this already (with the full
                // message); a second check, so a lab sandbox never runs
                // without its port rules.
                return Err(SetupError {
                    step: STEP,
                    message: "the lab modes need Landlock TCP rules (ABI 4)".into(),
                    hint: Some("upgrade the kernel to Linux 6.7 or newer".into()),
                });
            }
            if matches!(spec.net, crate::spec::NetMode::Lab(_)) {
                for port in &lab.ports {
                    created = created
                        .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                        .map_err(err)?;
                }
            }
        }
    }
    let status = created.restrict_self().map_err(err)?;
    let fully = status.ruleset == RulesetStatus::FullyEnforced;
    if !fully {
        return Err(SetupError {
            step: STEP,
            message: format!(
                "the Landlock ruleset was not fully enforced ({:?})",
                status.ruleset
            ),
            hint: Some(
                "upgrade the kernel, or use a profile whose landlock.min_abi matches it".into(),
            ),
        });
    }
    Ok(Enforced {
        abi: abi_num,
        fully,
    })
}

/// Access rights that make sense on a single file.
fn access_file_only(abi: ABI) -> BitFlags<AccessFs> {
    AccessFs::from_file(abi)
}

/// Open a rule's path ourselves: the crate's helper silently skips paths
/// that do not exist, which would quietly drop a rule.
fn open(p: &Path) -> StepResult<PathFd> {
    PathFd::new(p).map_err(|e| SetupError {
        step: STEP,
        message: format!("opening {} for a Landlock rule: {e}", p.display()),
        hint: None,
    })
}
