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
            fix: "use Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK=y (ABI 6, the full set retie uses, needs Linux >= 6.12)".into(),
        }),
    }
}

/// The test knob that lowers the Landlock ABI retie uses below the
/// kernel's (ADR 0430). It can only lower: a cap above the kernel's ABI
/// changes nothing.
pub const ABI_CAP_VAR: &str = "RETIE_LANDLOCK_ABI_CAP";

/// The newest Landlock ABI this build uses (the ruleset handles what the
/// ABI in use offers, up to this one).
pub const NEWEST_KNOWN_ABI: i32 = crate::init::landlock::NEWEST_KNOWN_ABI;

/// The Landlock ABI whose walls retie's guarantee is stated against: ABI 6
/// (Linux 6.12) adds the last one retie uses (scoping). Below it, each
/// missing wall has a stand-in (see [`LANDLOCK_GAPS`]) or the mode that
/// needs it is refused.
pub const FULL_ABI: i32 = 6;

/// The lab modes need Landlock's TCP port rules (ABI 4, Linux 6.7):
/// nothing else keeps a lab sandbox to the lab's declared ports.
pub const LAB_MIN_ABI: i32 = 4;

/// The Landlock ABI retie uses on this machine: the kernel's, lowered by
/// [`ABI_CAP_VAR`] when that is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LandlockAbi {
    /// What the kernel offers.
    pub kernel: i32,
    /// What retie uses: `min(kernel, cap, NEWEST_KNOWN_ABI)`.
    pub used: i32,
    /// The cap, when [`ABI_CAP_VAR`] is set.
    pub cap: Option<i32>,
}

impl LandlockAbi {
    /// "ABI 4" or "ABI 2 (the kernel has 7; capped by RETIE_LANDLOCK_ABI_CAP=2)".
    pub fn describe(&self) -> String {
        match self.cap {
            Some(c) if c < self.kernel.min(NEWEST_KNOWN_ABI) => format!(
                "ABI {} (the kernel has {}; capped by {ABI_CAP_VAR}={c})",
                self.used, self.kernel
            ),
            _ => format!("ABI {}", self.used),
        }
    }
}

/// [`ABI_CAP_VAR`], checked: unset is `None`; anything but a number from
/// 1 to [`NEWEST_KNOWN_ABI`] is refused (fail closed: a mistyped cap must
/// not silently test the wrong thing).
pub fn landlock_cap() -> std::result::Result<Option<i32>, Finding> {
    let Some(raw) = std::env::var_os(ABI_CAP_VAR) else {
        return Ok(None);
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<i32>() {
        Ok(n) if (1..=NEWEST_KNOWN_ABI).contains(&n) => Ok(Some(n)),
        _ => Err(Finding {
            problem: format!(
                "{ABI_CAP_VAR}={text:?} is not a Landlock ABI from 1 to {NEWEST_KNOWN_ABI}"
            ),
            fix: format!(
                "unset {ABI_CAP_VAR}, or set it to a number from 1 to {NEWEST_KNOWN_ABI} (a test knob: it can only lower the ABI retie uses, never raise it)"
            ),
        }),
    }
}

/// The Landlock ABI retie uses here, or why there is none.
pub fn landlock_in_use() -> std::result::Result<LandlockAbi, Finding> {
    let kernel = landlock_abi()?;
    let cap = landlock_cap()?;
    let used = kernel.min(NEWEST_KNOWN_ABI).min(cap.unwrap_or(i32::MAX));
    Ok(LandlockAbi { kernel, used, cap })
}

/// A Landlock wall that an older ABI lacks, and what retie has instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The ABI that brings the wall.
    pub abi: i32,
    /// The first Linux release with that ABI.
    pub linux: &'static str,
    /// What Landlock does not check below that ABI.
    pub missing: &'static str,
    /// The wall that covers it, or what is refused instead.
    pub instead: &'static str,
}

/// What each Landlock ABI retie uses adds, and what stands in below it
/// (ADR 0430). ABI 1 (Linux 5.13) is the floor: the filesystem rules.
/// ABI 7 adds only audit-log controls, which retie does not use.
pub const LANDLOCK_GAPS: &[Gap] = &[
    Gap {
        abi: 2,
        linux: "5.19",
        missing: "REFER: moving or hard-linking a file into another directory",
        instead: "stricter, not weaker: below ABI 2 Landlock refuses every rename and hard link into another directory (EXDEV: mv copies instead, ln fails)",
    },
    Gap {
        abi: 3,
        linux: "6.2",
        missing: "TRUNCATE: truncate(2) and O_TRUNC are not checked",
        instead: "the read-only mounts: every path outside the writable set is on a read-only mount (EROFS), denied by its owner, or not truncatable (a device node: EINVAL; the sandbox's own /proc files ignore the size)",
    },
    Gap {
        abi: 4,
        linux: "6.7",
        missing: "TCP bind and connect by port",
        instead: "no-network mode: seccomp refuses AF_INET and AF_INET6 sockets and the network namespace has only lo; the lab modes are refused (nothing else keeps a lab sandbox to its declared ports)",
    },
    Gap {
        abi: 5,
        linux: "6.10",
        missing: "IOCTL_DEV: ioctl on device files",
        instead: "the sandbox's /dev holds only null, zero, full, random, urandom, tty and its own pts (all granted ioctl anyway); seccomp refuses TIOCSTI and TIOCLINUX",
    },
    Gap {
        abi: 6,
        linux: "6.12",
        missing: "scoping of abstract unix sockets and signals",
        instead: "the sandbox's own network namespace (abstract sockets live in one) and pid namespace (no process outside can be named)",
    },
];

/// The walls ABI `abi` lacks (empty from [`FULL_ABI`] on).
pub fn landlock_gaps(abi: i32) -> Vec<&'static Gap> {
    LANDLOCK_GAPS.iter().filter(|g| g.abi > abi).collect()
}

/// One line for stderr: what is weaker with the ABI in use, or `None`
/// when nothing is.
pub fn landlock_notice(abi: &LandlockAbi) -> Option<String> {
    let gaps = landlock_gaps(abi.used);
    if gaps.is_empty() {
        return None;
    }
    let list: Vec<String> = gaps
        .iter()
        .map(|g| format!("ABI {} {}", g.abi, short(g)))
        .collect();
    Some(format!(
        "retie: Landlock {} here, not {FULL_ABI}: without {}; other walls stand in (lab modes need ABI {LAB_MIN_ABI}); `retie selftest` shows each",
        abi.describe(),
        list.join(", ")
    ))
}

fn short(g: &Gap) -> &'static str {
    match g.abi {
        2 => "cross-directory rename/link (refused instead)",
        3 => "truncate checks",
        4 => "TCP port rules",
        5 => "device ioctl checks",
        _ => "socket and signal scoping",
    }
}

/// Everything that must hold before a sandbox is attempted. Returns the
/// Landlock ABI to use (the kernel's, lowered by [`ABI_CAP_VAR`]).
pub fn check(profile: &Profile, net: &crate::spec::NetMode) -> Result<i32> {
    if let Some(f) = userns_problem() {
        return Err(RuntimeError::Unsupported {
            problem: f.problem,
            fix: f.fix,
        });
    }
    let abi = landlock_in_use().map_err(|f| RuntimeError::Unsupported {
        problem: f.problem,
        fix: f.fix,
    })?;
    if abi.used < profile.landlock.min_abi {
        return Err(RuntimeError::Unsupported {
            problem: format!(
                "retie has Landlock {} here, but profile `{}` requires at least ABI {}",
                abi.describe(),
                profile.name,
                profile.landlock.min_abi
            ),
            fix: "upgrade the kernel (ABI 4 = Linux 6.7, ABI 6 = Linux 6.12), or choose a profile whose landlock.min_abi this kernel meets (--profile PATH)".into(),
        });
    }
    if net.lab().is_some() && abi.used < LAB_MIN_ABI {
        return Err(RuntimeError::Unsupported {
            problem: format!(
                "the lab modes need Landlock's TCP port rules (ABI {LAB_MIN_ABI}, Linux 6.7), and retie has Landlock {} here: nothing else keeps a lab sandbox to the lab's declared ports",
                abi.describe()
            ),
            fix: "upgrade the kernel to Linux 6.7 or newer (Ubuntu 24.04's 6.8 has it); the no-network mode runs on this kernel".into(),
        });
    }
    Ok(abi.used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_abi_below_six_names_exactly_the_walls_it_lacks() {
        let abis = |used: i32| -> Vec<i32> { landlock_gaps(used).iter().map(|g| g.abi).collect() };
        assert_eq!(abis(1), vec![2, 3, 4, 5, 6]);
        assert_eq!(abis(2), vec![3, 4, 5, 6]);
        assert_eq!(abis(4), vec![5, 6]);
        assert!(abis(FULL_ABI).is_empty());
        assert!(abis(NEWEST_KNOWN_ABI).is_empty());
        for g in LANDLOCK_GAPS {
            assert!(!g.instead.is_empty() && !g.missing.is_empty(), "{g:?}");
        }
    }

    #[test]
    fn the_notice_is_one_line_and_names_the_cap() {
        let capped = LandlockAbi {
            kernel: 7,
            used: 2,
            cap: Some(2),
        };
        let line = landlock_notice(&capped).expect("a notice below ABI 6");
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.contains("ABI 2 (the kernel has 7; capped by RETIE_LANDLOCK_ABI_CAP=2)"),
            "{line}"
        );
        let full = LandlockAbi {
            kernel: 7,
            used: 7,
            cap: None,
        };
        assert_eq!(landlock_notice(&full), None);
        // A cap at or above the kernel's ABI is not a cap.
        let high = LandlockAbi {
            kernel: 4,
            used: 4,
            cap: Some(6),
        };
        assert_eq!(high.describe(), "ABI 4");
    }
}
