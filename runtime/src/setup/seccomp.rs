//! Step 14, the last before exec: the seccomp filters.
//!
//! The policy is data: each entry names the syscall, the condition, and why
//! it is denied. One program is installed:
//! 1. a hand-written prefix: the x32 guard (seccompiler checks the
//!    architecture but not the x32 bit, `nr | 0x40000000`, which would
//!    reach syscalls by another number) and `clone3` answered with ENOSYS
//!    (its flags live in memory a filter cannot read; ENOSYS makes libc
//!    fall back to `clone`, whose flags the deny list checks);
//! 2. seccompiler's program for the deny list, answering EPERM.
//!
//! Arguments of type int (ioctl's request, socket's domain) are compared as
//! 32-bit Dwords: the kernel truncates them, so a 64-bit compare could be
//! bypassed with high bits set.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
    SeccompCondition as Cond, SeccompFilter, SeccompRule, TargetArch,
};

use super::{SetupError, StepResult};
use crate::spec::NetMode;

const STEP: &str = "seccomp";

/// One denied call: the syscall, the argument conditions (all must hold;
/// none = always), and the reason.
pub struct Deny {
    pub name: &'static str,
    pub nr: libc::c_long,
    pub when: &'static [(u8, Len, Op, u64)],
    pub why: &'static str,
}

// libc's ioctl request type differs between libcs (c_ulong on glibc).
#[allow(clippy::unnecessary_cast)]
const TIOCSTI: u64 = libc::TIOCSTI as u64;
const TIOCLINUX: u64 = 0x541C;
const NEWUSER: u64 = libc::CLONE_NEWUSER as u64;

macro_rules! deny {
    ($sys:ident, $why:expr) => {
        Deny {
            name: stringify!($sys),
            nr: sysnr::$sys,
            when: &[],
            why: $why,
        }
    };
    ($sys:ident, $when:expr, $why:expr) => {
        Deny {
            name: stringify!($sys),
            nr: sysnr::$sys,
            when: $when,
            why: $why,
        }
    };
}

/// Syscall numbers (x86_64 / aarch64 via libc).
#[allow(non_upper_case_globals)]
mod sysnr {
    pub const ioctl: libc::c_long = libc::SYS_ioctl;
    pub const clone: libc::c_long = libc::SYS_clone;
    pub const unshare: libc::c_long = libc::SYS_unshare;
    pub const setns: libc::c_long = libc::SYS_setns;
    pub const mount: libc::c_long = libc::SYS_mount;
    pub const umount2: libc::c_long = libc::SYS_umount2;
    pub const pivot_root: libc::c_long = libc::SYS_pivot_root;
    pub const chroot: libc::c_long = libc::SYS_chroot;
    pub const mount_setattr: libc::c_long = libc::SYS_mount_setattr;
    pub const fsopen: libc::c_long = libc::SYS_fsopen;
    pub const fsconfig: libc::c_long = libc::SYS_fsconfig;
    pub const fsmount: libc::c_long = libc::SYS_fsmount;
    pub const fspick: libc::c_long = libc::SYS_fspick;
    pub const open_tree: libc::c_long = libc::SYS_open_tree;
    pub const move_mount: libc::c_long = libc::SYS_move_mount;
    pub const ptrace: libc::c_long = libc::SYS_ptrace;
    pub const process_vm_readv: libc::c_long = libc::SYS_process_vm_readv;
    pub const process_vm_writev: libc::c_long = libc::SYS_process_vm_writev;
    pub const keyctl: libc::c_long = libc::SYS_keyctl;
    pub const add_key: libc::c_long = libc::SYS_add_key;
    pub const request_key: libc::c_long = libc::SYS_request_key;
    pub const bpf: libc::c_long = libc::SYS_bpf;
    pub const perf_event_open: libc::c_long = libc::SYS_perf_event_open;
    pub const userfaultfd: libc::c_long = libc::SYS_userfaultfd;
    pub const io_uring_setup: libc::c_long = libc::SYS_io_uring_setup;
    pub const io_uring_enter: libc::c_long = libc::SYS_io_uring_enter;
    pub const io_uring_register: libc::c_long = libc::SYS_io_uring_register;
    pub const kexec_load: libc::c_long = libc::SYS_kexec_load;
    pub const kexec_file_load: libc::c_long = libc::SYS_kexec_file_load;
    pub const init_module: libc::c_long = libc::SYS_init_module;
    pub const finit_module: libc::c_long = libc::SYS_finit_module;
    pub const delete_module: libc::c_long = libc::SYS_delete_module;
    pub const acct: libc::c_long = libc::SYS_acct;
    pub const swapon: libc::c_long = libc::SYS_swapon;
    pub const swapoff: libc::c_long = libc::SYS_swapoff;
    pub const reboot: libc::c_long = libc::SYS_reboot;
    pub const open_by_handle_at: libc::c_long = libc::SYS_open_by_handle_at;
    pub const socket: libc::c_long = libc::SYS_socket;
    pub const pidfd_getfd: libc::c_long = libc::SYS_pidfd_getfd;
    pub const quotactl: libc::c_long = libc::SYS_quotactl;
    pub const personality: libc::c_long = libc::SYS_personality;
}

/// The deny list common to every network mode.
pub const DENY_ALWAYS: &[Deny] = &[
    deny!(
        ioctl,
        &[(1, Len::Dword, Op::Eq, TIOCSTI)],
        "TIOCSTI pushes keystrokes into a terminal's input queue"
    ),
    deny!(
        ioctl,
        &[(1, Len::Dword, Op::Eq, TIOCLINUX)],
        "TIOCLINUX can paste the console selection (the same injection)"
    ),
    deny!(
        clone,
        &[(0, Len::Qword, Op::MaskedEq(NEWUSER), NEWUSER)],
        "a nested user namespace regains capabilities over fresh namespaces"
    ),
    deny!(
        unshare,
        &[(0, Len::Qword, Op::MaskedEq(NEWUSER), NEWUSER)],
        "a nested user namespace (as with clone)"
    ),
    deny!(setns, "joining another namespace"),
    deny!(mount, "the sandbox's mounts are final"),
    deny!(umount2, "unmounting could reveal what a mount hides"),
    deny!(pivot_root, "the root is final"),
    deny!(chroot, "the root is final"),
    deny!(mount_setattr, "could make a read-only mount writable"),
    deny!(fsopen, "new mount API"),
    deny!(fsconfig, "new mount API"),
    deny!(fsmount, "new mount API"),
    deny!(fspick, "new mount API"),
    deny!(open_tree, "new mount API"),
    deny!(move_mount, "new mount API"),
    deny!(ptrace, "reading or steering another process"),
    deny!(process_vm_readv, "reading another process's memory"),
    deny!(process_vm_writev, "writing another process's memory"),
    deny!(pidfd_getfd, "stealing another process's file descriptors"),
    deny!(keyctl, "the kernel keyring is not namespaced"),
    deny!(add_key, "the kernel keyring is not namespaced"),
    deny!(request_key, "the kernel keyring is not namespaced"),
    deny!(bpf, "kernel attack surface"),
    deny!(perf_event_open, "kernel attack surface and side channels"),
    deny!(userfaultfd, "a tool for widening kernel race windows"),
    deny!(
        io_uring_setup,
        "io_uring performs I/O (even opens sockets) outside seccomp's view"
    ),
    deny!(io_uring_enter, "io_uring"),
    deny!(io_uring_register, "io_uring"),
    deny!(kexec_load, "replacing the kernel"),
    deny!(kexec_file_load, "replacing the kernel"),
    deny!(init_module, "loading kernel modules"),
    deny!(finit_module, "loading kernel modules"),
    deny!(delete_module, "unloading kernel modules"),
    deny!(acct, "process accounting is host-wide"),
    deny!(swapon, "host-wide"),
    deny!(swapoff, "host-wide"),
    deny!(reboot, "host-wide"),
    deny!(quotactl, "host-wide"),
    deny!(
        open_by_handle_at,
        "opens files by handle, bypassing path checks"
    ),
    deny!(
        socket,
        &[(0, Len::Dword, Op::Eq, libc::AF_PACKET as u64)],
        "raw link-layer access"
    ),
    deny!(
        socket,
        &[(0, Len::Dword, Op::Eq, libc::AF_VSOCK as u64)],
        "reaches the hypervisor and other VMs"
    ),
    deny!(
        personality,
        &[(0, Len::Dword, Op::MaskedEq(0x0040_0000), 0x0040_0000)],
        "READ_IMPLIES_EXEC makes every readable mapping executable"
    ),
];

/// Extra denials when the sandbox has no network.
pub const DENY_NO_NETWORK: &[Deny] = &[deny!(
    socket,
    &[(0, Len::Dword, Op::Ne, libc::AF_UNIX as u64)],
    "no network: only unix sockets (AF_INET, AF_INET6, AF_NETLINK and every other family refused)"
)];

const SOCK_TYPE_MASK: u64 = 0xf;
/// The obsolete IPv4 `SOCK_PACKET` type (libc deprecates the constant).
const SOCK_PACKET: u64 = 10;

/// Extra denials in the lab modes: IPv4 stream and datagram sockets (TCP,
/// UDP, and ICMP datagram sockets, which the netns' ping_group_range
/// refuses anyway) are allowed; every other family and every other IPv4
/// socket type is refused. The namespace has no route but the lab's; this
/// table keeps netlink (reconfiguring the namespace), raw and packet
/// sockets, and IPv6 out of reach.
pub const DENY_LAB_NETWORK: &[Deny] = &[
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Ne, libc::AF_UNIX as u64),
            (0, Len::Dword, Op::Ne, libc::AF_INET as u64)
        ],
        "lab network: only unix and IPv4 sockets (AF_INET6, AF_NETLINK, AF_PACKET and every other family refused)"
    ),
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), libc::SOCK_RAW as u64)
        ],
        "raw IPv4 sockets forge packets"
    ),
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), SOCK_PACKET)
        ],
        "SOCK_PACKET is link-layer access"
    ),
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), libc::SOCK_SEQPACKET as u64)
        ],
        "SCTP and other exotic IPv4 protocols: kernel attack surface"
    ),
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), libc::SOCK_RDM as u64)
        ],
        "exotic IPv4 socket type"
    ),
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), libc::SOCK_DCCP as u64)
        ],
        "DCCP: kernel attack surface"
    ),
];

fn arch() -> TargetArch {
    #[cfg(target_arch = "aarch64")]
    {
        TargetArch::aarch64
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        TargetArch::x86_64
    }
}

fn compile(list: &[&[Deny]], on_match: SeccompAction) -> StepResult<BpfProgram> {
    let err = |e: seccompiler::BackendError| SetupError {
        step: STEP,
        message: format!("compiling the filter: {e}"),
        hint: None,
    };
    // None = unconditional (any call of that number matches).
    let mut by_nr: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for d in list.iter().flat_map(|l| l.iter()) {
        let slot = by_nr.entry(d.nr).or_insert_with(|| Some(Vec::new()));
        if d.when.is_empty() {
            *slot = None;
            continue;
        }
        if let Some(chain) = slot {
            let conds = d
                .when
                .iter()
                .map(|(i, len, op, v)| Cond::new(*i, len.clone(), op.clone(), *v))
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            chain.push(SeccompRule::new(conds).map_err(err)?);
        }
    }
    let rules: BTreeMap<i64, Vec<SeccompRule>> = by_nr
        .into_iter()
        .map(|(nr, r)| (nr, r.unwrap_or_default()))
        .collect();
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, on_match, arch()).map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}
fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Instructions placed before seccompiler's program (its jumps are
/// relative, so a prefix does not disturb them):
/// - any syscall number with the x32 bit set answers EPERM (seccompiler
///   checks the architecture but not the x32 ABI, which shares it);
/// - `clone3` answers ENOSYS.
///
/// A foreign architecture's call falls through to seccompiler's
/// architecture check, which kills it.
fn prefix() -> Vec<sock_filter> {
    let mut p = vec![
        // A = seccomp_data.nr (offset 0)
        stmt(BPF_LD_W_ABS, 0),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(stmt(
            BPF_RET_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ));
    }
    p.push(jump(BPF_JMP_JEQ_K, libc::SYS_clone3 as u32, 0, 1));
    p.push(stmt(
        BPF_RET_K,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    p
}

/// The compiled filter: one program, so the kernel JITs and runs one.
pub struct Filters(BpfProgram);

/// Compile the filter (before it is installed, so a compile error leaves
/// the process untouched).
pub fn compile_all(net: &NetMode) -> StepResult<Filters> {
    let mut lists: Vec<&[Deny]> = vec![DENY_ALWAYS];
    match net {
        NetMode::None => lists.push(DENY_NO_NETWORK),
        NetMode::Lab(_) | NetMode::LabTarget(_) => lists.push(DENY_LAB_NETWORK),
    }
    let mut program = prefix();
    program.extend(compile(&lists, SeccompAction::Errno(libc::EPERM as u32))?);
    Ok(Filters(program))
}

/// Install the filters (sets NO_NEW_PRIVS).
pub fn install(filters: &Filters) -> StepResult {
    seccompiler::apply_filter(&filters.0).map_err(|e| SetupError {
        step: STEP,
        message: format!("installing the filter: {e}"),
        hint: Some("the kernel must be built with CONFIG_SECCOMP_FILTER".into()),
    })
}
