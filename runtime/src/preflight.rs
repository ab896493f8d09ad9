//! Checks that run before the first sandbox: each failure names the exact
//! fix. retie never falls back to weaker isolation.

use crate::error::{Result, RuntimeError};
use crate::profile::Profile;

/// A finding of the preflight, for `retie selftest` and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub problem: String,
    pub fix: String,
}

fn read_num(path: &str) -> Option<i64> {
    crate::sys::read_proc(path).ok()?.trim().parse().ok()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Why user namespaces are unavailable, with the fix, if a known switch
/// says so.
pub fn userns_problem() -> Option<Finding> {
    if read_num("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Some(Finding {
            problem: "user namespaces are disabled (user.max_user_namespaces = 0)".into(),
            fix: "sudo sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d/)"
                .into(),
        });
    }
    if is_root() {
        return None;
    }
    if read_num("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Some(Finding {
            problem:
                "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)"
                    .into(),
            fix: "sudo sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d/)"
                .into(),
        });
    }
    if read_num("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Some(Finding {
            problem: "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 23.10+)".into(),
            fix: "allow retie alone with an AppArmor profile, /etc/apparmor.d/retie:\n    abi <abi/4.0>, include <tunables/global>\n    profile retie /path/to/retie flags=(unconfined) { userns, }\n  then `sudo apparmor_parser -r /etc/apparmor.d/retie`; or system-wide: sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0".into(),
        });
    }
    None
}

/// The fix for a failed clone, if a known switch explains it.
pub fn userns_fix() -> Option<String> {
    userns_problem().map(|f| format!("{}: {}", f.problem, f.fix))
}

/// Landlock's ABI on this kernel, or why it is unusable.
pub fn landlock_abi() -> std::result::Result<i32, Finding> {
    match crate::sys::landlock_abi() {
        Ok(v) => Ok(v),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Err(Finding {
            problem: "Landlock is built into this kernel but not enabled".into(),
            fix: "add landlock to the kernel's lsm= boot parameter (e.g. lsm=landlock,lockdown,yama,integrity,apparmor,bpf) and reboot".into(),
        }),
        Err(e) => Err(Finding {
            problem: format!("this kernel has no Landlock ({e})"),
            fix: "use Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK=y (ABI 6, with scoping, needs Linux >= 6.12)".into(),
        }),
    }
}

/// Everything that must hold before a sandbox is attempted. Returns the
/// kernel's Landlock ABI.
pub fn check(profile: &Profile) -> Result<i32> {
    if let Some(f) = userns_problem() {
        return Err(RuntimeError::Unsupported {
            problem: f.problem,
            fix: f.fix,
        });
    }
    let abi = landlock_abi().map_err(|f| RuntimeError::Unsupported {
        problem: f.problem,
        fix: f.fix,
    })?;
    if abi < profile.landlock.min_abi {
        return Err(RuntimeError::Unsupported {
            problem: format!(
                "this kernel offers Landlock ABI {abi}, but profile `{}` requires at least ABI {}",
                profile.name, profile.landlock.min_abi
            ),
            fix: "upgrade the kernel (ABI 4 = Linux 6.7, ABI 6 = Linux 6.12), or choose a profile whose landlock.min_abi this kernel meets (--profile PATH)".into(),
        });
    }
    Ok(abi)
}
