//! The proxy's own walls: it needs its two descriptors, outbound TCP and
//! the resolver's few files, and gets nothing else.

use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, ABI,
};

use crate::NetError;

/// The files the resolver reads (musl and glibc alike).
const RESOLVER_FILES: &[&str] = &[
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/services",
];

/// Confine the calling process (the proxy, before it serves): a session
/// of its own; dies with its parent; as root, becomes uid/gid 65534 with no groups; no new
/// privileges; Landlock: no file but the resolver's, read-only; no TCP
/// bind; abstract unix sockets and signals scoped to itself.
pub fn confine() -> Result<(), NetError> {
    let os = std::io::Error::last_os_error;
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number; no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(NetError::io("PR_SET_PDEATHSIG", os()));
    }
    // A session of its own: a person's Ctrl-C (or a hang-up) at retie's
    // terminal goes to retie and its command, never to the proxy, whose
    // death would fail the run as cut off. Fails only for a group leader,
    // which a freshly spawned child is not.
    // SAFETY: setsid takes no arguments.
    if unsafe { libc::setsid() } < 0 {
        return Err(NetError::io("setsid", os()));
    }
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == 1 {
        return Err(NetError::Config("the proxy's parent is gone".into()));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: setgroups with a zero count reads no memory; setgid and
        // setuid take plain ids. Each result is checked; the order (groups,
        // gid, uid) is the only one that works.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(NetError::io("dropping groups", os()));
            }
            if libc::setgid(65534) != 0 {
                return Err(NetError::io("setgid 65534", os()));
            }
            if libc::setuid(65534) != 0 {
                return Err(NetError::io("setuid 65534", os()));
            }
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return Err(NetError::Config("the proxy is still root".into()));
        }
        // SAFETY: as above (the uid change cleared the death signal).
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            return Err(NetError::io("PR_SET_PDEATHSIG", os()));
        }
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(NetError::io("PR_SET_NO_NEW_PRIVS", os()));
    }
    let _ = std::env::set_current_dir("/");
    let err = |e: landlock::RulesetError| NetError::Config(format!("the proxy's Landlock: {e}"));
    let abi = ABI::V6;
    let mut created = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .handle_access(AccessNet::BindTcp)
        .map_err(err)?
        .scope(Scope::from_all(abi))
        .map_err(err)?
        .create()
        .map_err(err)?;
    for f in RESOLVER_FILES {
        if let Ok(fd) = PathFd::new(f) {
            created = created
                .add_rule(PathBeneath::new(fd, AccessFs::ReadFile))
                .map_err(err)?;
        }
    }
    let status = created.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(NetError::Config(
            "Landlock is not enforced here; the proxy runs only confined (Linux 5.13 or newer with Landlock on)".into(),
        ));
    }
    Ok(())
}
