//! Step 14, the last before exec: the seccomp filters.
//!
//! The policy is data: each entry names the syscall, the condition, and why
//! it is denied. One program is installed:
//! 1. a hand-written prefix: the x32 guard (seccompiler checks the
//!    architecture but not the x32 bit, `nr | 0x40000000`, which would
//!    reach syscalls by another number) and `clone3` answered with ENOSYS
//!    (its flags live in memory a filter cannot read; ENOSYS makes libc
//!    fall back to `clone`, whose flags the deny list checks);
//! 2. a fast path: for the native architecture, a binary search over the
//!    denied syscall numbers that answers ALLOW at once for every number
//!    the table does not name (about six compares instead of the whole
//!    list; the kernel evaluates the filter for every syscall number when
//!    it is installed, to cache the constant answers, so a linear program
//!    made the install cost 0.1 ms more; ADR 0415);
//! 3. seccompiler's program for the deny list, answering EPERM. Every
//!    named number, and every call of a foreign architecture, reaches it.
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
    pub const sendto: libc::c_long = libc::SYS_sendto;
    pub const sendmsg: libc::c_long = libc::SYS_sendmsg;
    pub const sendmmsg: libc::c_long = libc::SYS_sendmmsg;
    pub const setsockopt: libc::c_long = libc::SYS_setsockopt;
    pub const listen: libc::c_long = libc::SYS_listen;
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

/// `MSG_FASTOPEN` (a flags bit of the send calls, an int the kernel
/// truncates, so compared as a Dword).
const MSG_FASTOPEN: u64 = 0x2000_0000;
const IPPROTO_TCP: u64 = libc::IPPROTO_TCP as u64;
/// `TCP_REPAIR` and `TCP_FASTOPEN_CONNECT` (linux/tcp.h).
const TCP_REPAIR: u64 = 19;
const TCP_FASTOPEN_CONNECT: u64 = 30;

/// Extra denials in both lab modes: every way found to open a TCP
/// connection without the `connect()` that Landlock's port rules see
/// (ADR 0302, "TCP without connect"). Landlock's hook sits on `connect`
/// and `bind` of sockets whose protocol is TCP: `sendto`/`sendmsg`/
/// `sendmmsg` with `MSG_FASTOPEN` send the SYN from the send path and are
/// never checked, and an MPTCP socket (`IPPROTO_MPTCP`, a stream socket
/// whose protocol is not TCP) is not checked at all. `MSG_FASTOPEN` can
/// only come from the flags argument: `sendmsg` ignores the msghdr's own
/// `msg_flags` on send, and `sendmmsg` takes only `MSG_EOR` from each
/// entry's.
pub const DENY_LAB_TCP: &[Deny] = &[
    deny!(
        sendto,
        &[(3, Len::Dword, Op::MaskedEq(MSG_FASTOPEN), MSG_FASTOPEN)],
        "TCP Fast Open: sendto(MSG_FASTOPEN, addr) connects without connect(), past Landlock's port rules"
    ),
    deny!(
        sendmsg,
        &[(2, Len::Dword, Op::MaskedEq(MSG_FASTOPEN), MSG_FASTOPEN)],
        "TCP Fast Open through sendmsg (msg_name is the address): past Landlock's port rules"
    ),
    deny!(
        sendmmsg,
        &[(3, Len::Dword, Op::MaskedEq(MSG_FASTOPEN), MSG_FASTOPEN)],
        "TCP Fast Open through sendmmsg: past Landlock's port rules"
    ),
    deny!(
        setsockopt,
        &[
            (1, Len::Dword, Op::Eq, IPPROTO_TCP),
            (2, Len::Dword, Op::Eq, TCP_FASTOPEN_CONNECT)
        ],
        "TCP_FASTOPEN_CONNECT defers the SYN to the first write (connect() is still checked today; refused so no later kernel change opens it)"
    ),
    deny!(
        setsockopt,
        &[
            (1, Len::Dword, Op::Eq, IPPROTO_TCP),
            (2, Len::Dword, Op::Eq, TCP_REPAIR)
        ],
        "TCP repair mode makes a socket connected without a handshake (needs CAP_NET_ADMIN, which is dropped; refused as well)"
    ),
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), libc::SOCK_STREAM as u64),
            (2, Len::Dword, Op::Ne, 0),
            (2, Len::Dword, Op::Ne, IPPROTO_TCP)
        ],
        "stream sockets other than TCP (MPTCP, SCTP): Landlock's port rules check TCP only, an MPTCP connect reaches any port"
    ),
];

/// Extra denials for a lab-mode **sandbox** (not the lab target): every
/// IPv4 datagram socket. Landlock covers UDP only from ABI 10, so without
/// this rule a datagram reaches any port of the lab; the type is compared
/// under a mask, so `SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC` is caught
/// too. ICMP "ping" sockets are datagram sockets and fall under it. ADR 0302.
pub const DENY_LAB_SANDBOX: &[Deny] = &[
    deny!(
        socket,
        &[
            (0, Len::Dword, Op::Eq, libc::AF_INET as u64),
            (1, Len::Dword, Op::MaskedEq(SOCK_TYPE_MASK), libc::SOCK_DGRAM as u64)
        ],
        "lab sandbox: UDP and ICMP datagram sockets (Landlock has no UDP rules before ABI 10; the lab's undeclared ports stay out of reach)"
    ),
    deny!(
        listen,
        "lab sandbox: nothing listens (bind is refused by Landlock, but listen() on an unbound socket binds an ephemeral port itself; unix-socket servers are refused with it, seccomp cannot tell the family)"
    ),
];

/// The tables in force for a network mode, by name.
fn tables(net: &NetMode) -> Vec<(&'static str, &'static [Deny])> {
    let mut lists: Vec<(&'static str, &'static [Deny])> = vec![("DENY_ALWAYS", DENY_ALWAYS)];
    match net {
        NetMode::None => lists.push(("DENY_NO_NETWORK", DENY_NO_NETWORK)),
        // A proxied sandbox is walled as a lab sandbox: AF_INET stream
        // only, no datagram, no TCP start without connect(), no listen.
        NetMode::Lab(_) | NetMode::Proxy(_) => {
            lists.push(("DENY_LAB_NETWORK", DENY_LAB_NETWORK));
            lists.push(("DENY_LAB_TCP", DENY_LAB_TCP));
            lists.push(("DENY_LAB_SANDBOX", DENY_LAB_SANDBOX));
        }
        NetMode::LabTarget(_) => {
            lists.push(("DENY_LAB_NETWORK", DENY_LAB_NETWORK));
            lists.push(("DENY_LAB_TCP", DENY_LAB_TCP));
        }
    }
    lists
}

/// The errno every deny-table rule answers with.
pub const DENY_ERRNO: i32 = libc::EPERM;

/// How an argument is compared (mirrors the table's `Op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgOp {
    /// `arg == value`
    Eq,
    /// `arg != value`
    Ne,
    /// `arg & mask == value`
    MaskedEq(u64),
    /// A compare the probes do not model: no arguments can be generated
    /// for it, so the coverage test fails until it is modelled.
    Unmodelled,
}

/// One argument condition of a denied call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgCheck {
    /// The argument's index (0-5).
    pub index: u8,
    /// Compared as 32 bits (the kernel truncates int arguments).
    pub dword: bool,
    pub op: ArgOp,
    pub value: u64,
}

impl ArgCheck {
    /// Whether `arg` satisfies the condition, as the filter compares it.
    pub fn holds(&self, arg: u64) -> bool {
        let a = if self.dword { arg & 0xffff_ffff } else { arg };
        match self.op {
            ArgOp::Eq => a == self.value,
            ArgOp::Ne => a != self.value,
            ArgOp::MaskedEq(m) => a & m == self.value,
            ArgOp::Unmodelled => false,
        }
    }
}

impl std::fmt::Display for ArgCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op {
            ArgOp::Eq => write!(f, "arg{} == {:#x}", self.index, self.value),
            ArgOp::Ne => write!(f, "arg{} != {:#x}", self.index, self.value),
            ArgOp::MaskedEq(m) => {
                write!(f, "arg{} & {m:#x} == {:#x}", self.index, self.value)
            }
            ArgOp::Unmodelled => write!(f, "arg{} ? {:#x}", self.index, self.value),
        }
    }
}

/// One rule of the deny table in force, in a form a probe can iterate:
/// the self-test calls every entry with [`DeniedCall::matching_args`] and
/// expects exactly [`DeniedCall::errno`].
#[derive(Debug, Clone)]
pub struct DeniedCall {
    /// The table it comes from (`DENY_ALWAYS`, ...).
    pub table: &'static str,
    pub name: &'static str,
    pub nr: i64,
    /// All must hold; empty = every call of that number.
    pub when: Vec<ArgCheck>,
    pub errno: i32,
    pub why: &'static str,
}

impl DeniedCall {
    /// A stable, unique label: `setns` or `socket [arg0 == 0x11]`.
    pub fn label(&self) -> String {
        if self.when.is_empty() {
            self.name.to_string()
        } else {
            let conds: Vec<String> = self.when.iter().map(ToString::to_string).collect();
            format!("{} [{}]", self.name, conds.join(", "))
        }
    }

    /// Arguments that satisfy every condition, starting from `base` (the
    /// probe's harmless defaults). A 32-bit compare gets garbage in the
    /// high half, so a probe also proves the compare is 32-bit. None if no
    /// candidate satisfies them all (a table error a unit test catches).
    pub fn matching_args(&self, base: [u64; 6]) -> Option<[u64; 6]> {
        let mut args = base;
        for index in 0..6u8 {
            let conds: Vec<&ArgCheck> = self.when.iter().filter(|c| c.index == index).collect();
            if conds.is_empty() {
                continue;
            }
            let high = if conds.iter().all(|c| c.dword) {
                0xdead_0000_0000_u64
            } else {
                0
            };
            let b = base[usize::from(index)];
            let mut candidates = vec![b];
            for c in &conds {
                match c.op {
                    ArgOp::Eq => candidates.push(c.value),
                    ArgOp::MaskedEq(m) => candidates.push((b & !m) | c.value),
                    ArgOp::Ne | ArgOp::Unmodelled => {}
                }
            }
            candidates.extend([0, 0x7fff_fff0, 0xffff]);
            let pick = candidates
                .into_iter()
                .map(|v| {
                    if high != 0 {
                        (v & 0xffff_ffff) | high
                    } else {
                        v
                    }
                })
                .find(|v| conds.iter().all(|c| c.holds(*v)))?;
            args[usize::from(index)] = pick;
        }
        Some(args)
    }
}

/// Every rule in force for a network mode, in table order.
pub fn deny_table(net: &NetMode) -> Vec<DeniedCall> {
    tables(net)
        .into_iter()
        .flat_map(|(table, list)| {
            list.iter().map(move |d| DeniedCall {
                table,
                name: d.name,
                nr: d.nr,
                when: d
                    .when
                    .iter()
                    .map(|(i, len, op, v)| ArgCheck {
                        index: *i,
                        dword: matches!(len, Len::Dword),
                        op: match op {
                            Op::Eq => ArgOp::Eq,
                            Op::Ne => ArgOp::Ne,
                            Op::MaskedEq(m) => ArgOp::MaskedEq(*m),
                            _ => ArgOp::Unmodelled,
                        },
                        value: *v,
                    })
                    .collect(),
                errno: DENY_ERRNO,
                why: d.why,
            })
        })
        .collect()
}

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
// A syscall number: a small non-negative constant (435 on x86_64 and
// aarch64), so the cast loses nothing.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
const CLONE3_NR: u32 = libc::SYS_clone3 as u32;

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
    p.push(jump(BPF_JMP_JEQ_K, CLONE3_NR, 0, 1));
    p.push(stmt(
        BPF_RET_K,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    p
}

const BPF_JMP_JA: u16 = 0x05;
/// `seccomp_data.arch` (offset 4) of the architecture retie is built for.
const AUDIT_ARCH_NATIVE: u32 = if cfg!(target_arch = "aarch64") {
    0xC000_00B7
} else {
    0xC000_003E
};
/// Denied numbers per leaf of the fast path's search tree.
const LEAF: usize = 3;

/// One instruction of the fast path before its jumps are resolved.
enum Fast {
    /// `A >= k`: jump `skip` instructions (to the upper half), else fall
    /// through to the lower half.
    Ge { k: u32, skip: usize },
    /// `A == k`: jump `skip` instructions (to this leaf's `Out`).
    Eq { k: u32, skip: usize },
    /// The number is not in the table.
    Allow,
    /// The number is in the table: on to seccompiler's program.
    Out,
}

/// A binary search over `denied` (sorted, distinct): every leaf tests its
/// few numbers for equality, answers ALLOW when none matches, and
/// otherwise jumps out to seccompiler's program.
fn search(denied: &[u32]) -> Vec<Fast> {
    if denied.len() <= LEAF {
        let m = denied.len();
        let mut v: Vec<Fast> = denied
            .iter()
            .enumerate()
            .map(|(i, &k)| Fast::Eq { k, skip: m - i })
            .collect();
        v.push(Fast::Allow);
        v.push(Fast::Out);
        return v;
    }
    let (low, high) = denied.split_at(denied.len() / 2);
    let low = search(low);
    let mut v = vec![Fast::Ge {
        k: high[0],
        skip: low.len(),
    }];
    v.extend(low);
    v.extend(search(high));
    v
}

/// The fast path placed between the prefix and seccompiler's program.
/// A call of a foreign architecture skips it (seccompiler's architecture
/// check kills it); a native call whose number no table entry names is
/// allowed after about log2(n) compares; a named number goes on to
/// seccompiler's program, which decides on its arguments. So the fast path
/// can only allow what seccompiler's program would allow: numbers it
/// never refuses.
fn fast_path(lists: &[&[Deny]]) -> StepResult<Vec<sock_filter>> {
    let err = |message: String| SetupError {
        step: STEP,
        message,
        hint: None,
    };
    let mut denied = lists
        .iter()
        .flat_map(|l| l.iter())
        .map(|d| {
            u32::try_from(d.nr).map_err(|_| {
                err(format!(
                    "syscall number {} of {} is out of range",
                    d.nr, d.name
                ))
            })
        })
        .collect::<StepResult<Vec<u32>>>()?;
    denied.sort_unstable();
    denied.dedup();
    let tree = search(&denied);
    let short = |skip: usize| {
        u8::try_from(skip).map_err(|_| err(format!("a jump of {skip} in the fast path")))
    };
    let long = |skip: usize| {
        u32::try_from(skip).map_err(|_| err(format!("a jump of {skip} in the fast path")))
    };
    // A = arch; a foreign one jumps over everything to seccompiler.
    let head = 4;
    let total = head + tree.len();
    let mut p = vec![
        stmt(BPF_LD_W_ABS, 4),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_NATIVE, 1, 0),
        stmt(BPF_JMP_JA, long(total - 3)?),
        // A = nr
        stmt(BPF_LD_W_ABS, 0),
    ];
    for (i, t) in tree.iter().enumerate() {
        p.push(match *t {
            Fast::Ge { k, skip } => jump(BPF_JMP_JGE_K, k, short(skip)?, 0),
            Fast::Eq { k, skip } => jump(BPF_JMP_JEQ_K, k, short(skip)?, 0),
            Fast::Allow => stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW),
            Fast::Out => stmt(BPF_JMP_JA, long(total - (head + i) - 1)?),
        });
    }
    Ok(p)
}

/// The compiled filter: one program, so the kernel JITs and runs one.
pub struct Filters(BpfProgram);

/// Compile the filter (before it is installed, so a compile error leaves
/// the process untouched).
pub fn compile_all(net: &NetMode) -> StepResult<Filters> {
    let lists: Vec<&[Deny]> = tables(net).into_iter().map(|(_, l)| l).collect();
    let mut program = prefix();
    program.extend(fast_path(&lists)?);
    program.extend(compile(&lists, SeccompAction::Errno(DENY_ERRNO as u32))?);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::LabNet;

    fn modes() -> Vec<NetMode> {
        let lab = LabNet {
            name: "t".into(),
            keeper_pid: 1,
            ports: vec![8080],
        };
        vec![
            NetMode::None,
            NetMode::Lab(lab.clone()),
            NetMode::LabTarget(lab),
        ]
    }

    /// A classic-BPF interpreter for the instructions seccompiler and the
    /// prefix emit, run over a `seccomp_data` built from `nr` and `args`.
    fn run_filter(prog: &[sock_filter], nr: i64, args: [u64; 6]) -> Result<u32, String> {
        let nr = u32::try_from(nr).map_err(|e| e.to_string())?;
        run(prog, AUDIT_ARCH_NATIVE, nr, args).map(|(answer, _)| answer)
    }

    /// The interpreter, for any architecture: the answer and how many
    /// instructions ran.
    fn run(
        prog: &[sock_filter],
        arch: u32,
        nr: u32,
        args: [u64; 6],
    ) -> Result<(u32, usize), String> {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let mut acc: u32 = 0;
        let mut pc = 0usize;
        for steps in 1..10_000 {
            let ins = prog.get(pc).ok_or("ran off the program")?;
            let k = ins.k;
            pc += 1;
            match ins.code {
                0x20 => {
                    let o = k as usize;
                    let w = data.get(o..o + 4).ok_or("load out of range")?;
                    acc = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
                }
                0x54 => acc &= k,
                0x06 => return Ok((k, steps)),
                0x05 => pc += k as usize,
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match ins.code {
                        0x15 => acc == k,
                        0x25 => acc > k,
                        0x35 => acc >= k,
                        _ => acc & k != 0,
                    };
                    pc += usize::from(if taken { ins.jt } else { ins.jf });
                }
                c => return Err(format!("unmodelled opcode {c:#x}")),
            }
        }
        Err("no return".into())
    }

    /// Every rule's generated arguments hit the compiled filter (EPERM),
    /// in every mode that has the rule: the self-test's probes call the
    /// kernel with exactly these arguments.
    #[test]
    fn every_rule_has_arguments_that_hit_the_compiled_filter() {
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        for mode in modes() {
            let Ok(Filters(prog)) = compile_all(&mode) else {
                panic!("{mode:?}: the filter does not compile");
            };
            let table = deny_table(&mode);
            assert!(!table.is_empty());
            for d in &table {
                let args = d
                    .matching_args([0; 6])
                    .unwrap_or_else(|| panic!("{mode:?}: no arguments match {}", d.label()));
                assert!(d.when.iter().all(|c| c.holds(args[usize::from(c.index)])));
                assert_eq!(
                    run_filter(&prog, d.nr, args),
                    Ok(eperm),
                    "{mode:?}: {} with {args:x?} is not refused",
                    d.label()
                );
                assert_eq!(d.errno, libc::EPERM);
            }
            // The filter is not refusing everything: getpid passes.
            assert_eq!(
                run_filter(&prog, libc::SYS_getpid, [0; 6]),
                Ok(libc::SECCOMP_RET_ALLOW)
            );
            // Labels are unique (they name the self-test's rows).
            let mut labels: Vec<String> = table.iter().map(DeniedCall::label).collect();
            labels.sort();
            let n = labels.len();
            labels.dedup();
            assert_eq!(labels.len(), n, "{mode:?}: duplicate labels");
        }
    }

    /// The fast path changes no answer: for every syscall number (and the
    /// x32 and out-of-range ones), of the native and a foreign
    /// architecture, with plain arguments and with each rule's matching
    /// arguments, the filter answers exactly as the prefix and
    /// seccompiler's program alone. And it is fast: a number no rule
    /// names is allowed within a dozen instructions.
    #[test]
    fn the_fast_path_answers_as_the_deny_list_and_allows_in_few_steps() {
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        for mode in modes() {
            let lists: Vec<&[Deny]> = tables(&mode).into_iter().map(|(_, l)| l).collect();
            let Ok(Filters(fast)) = compile_all(&mode) else {
                panic!("{mode:?}: the filter does not compile");
            };
            let mut plain = prefix();
            let Ok(list) = compile(&lists, SeccompAction::Errno(DENY_ERRNO as u32)) else {
                panic!("{mode:?}: the deny list does not compile");
            };
            plain.extend(list);
            let table = deny_table(&mode);
            let named: Vec<u32> = table
                .iter()
                .filter_map(|d| u32::try_from(d.nr).ok())
                .collect();
            let mut argsets = vec![[0u64; 6], [u64::MAX; 6], [0xffff_ffff; 6]];
            argsets.extend(table.iter().filter_map(|d| d.matching_args([0; 6])));
            let mut nrs: Vec<u32> = (0..1024).collect();
            nrs.extend([
                0x3fff_ffff,
                0x4000_0000,
                0x4000_0010,
                0x7fff_ffff,
                0x8000_0000,
                u32::MAX,
            ]);
            let mut longest_allow = 0;
            for arch in [AUDIT_ARCH_NATIVE, AUDIT_ARCH_I386] {
                for &nr in &nrs {
                    for args in &argsets {
                        let want = run(&plain, arch, nr, *args).map(|(a, _)| a);
                        let got = run(&fast, arch, nr, *args);
                        assert_eq!(
                            got.as_ref().map(|(a, _)| *a).map_err(Clone::clone),
                            want,
                            "{mode:?}: arch {arch:#x} nr {nr} args {args:x?}"
                        );
                        if let Ok((answer, steps)) = got {
                            if arch == AUDIT_ARCH_NATIVE
                                && nr < 0x4000_0000
                                && !named.contains(&nr)
                                && nr != CLONE3_NR
                            {
                                assert_eq!(answer, libc::SECCOMP_RET_ALLOW, "{mode:?}: nr {nr}");
                                longest_allow = longest_allow.max(steps);
                            }
                        }
                    }
                }
            }
            assert!(
                longest_allow <= 14,
                "{mode:?}: an unnamed syscall takes {longest_allow} instructions to allow"
            );
        }
    }

    /// ADR 0310: a proxied sandbox is walled exactly as a lab sandbox (no
    /// datagram, no TCP start without connect, no listen, no IPv6): the
    /// same tables, so the lab tests below cover it.
    #[test]
    fn the_proxied_mode_has_the_lab_sandbox_tables() {
        let [_, lab, _] = modes().try_into().unwrap_or_else(|_| panic!("three modes"));
        let proxy = NetMode::Proxy(crate::spec::ProxyNet { port: 3128 });
        let names = |m: &NetMode| tables(m).iter().map(|(n, _)| *n).collect::<Vec<_>>();
        assert_eq!(names(&proxy), names(&lab));
        assert_eq!(
            format!("{:?}", deny_table(&proxy)),
            format!("{:?}", deny_table(&lab))
        );
        assert!(compile_all(&proxy).is_ok());
    }

    /// The lab sandbox's datagram rule catches every flag variant and the
    /// ICMP ping socket, and leaves TCP alone; the lab target keeps UDP.
    #[test]
    fn lab_sandboxes_cannot_open_datagram_sockets() {
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let [_, lab, target] = modes().try_into().unwrap_or_else(|_| panic!("three modes"));
        let Ok(Filters(sandbox)) = compile_all(&lab) else {
            panic!("lab filter");
        };
        let Ok(Filters(target)) = compile_all(&target) else {
            panic!("target filter");
        };
        let inet = libc::AF_INET as u64;
        for ty in [
            libc::SOCK_DGRAM,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        ] {
            for proto in [0, libc::IPPROTO_UDP, libc::IPPROTO_ICMP] {
                let args = [
                    inet,
                    u64::from(ty.cast_unsigned()),
                    u64::from(proto.cast_unsigned()),
                    0,
                    0,
                    0,
                ];
                assert_eq!(run_filter(&sandbox, libc::SYS_socket, args), Ok(eperm));
                assert_eq!(
                    run_filter(&target, libc::SYS_socket, args),
                    Ok(libc::SECCOMP_RET_ALLOW)
                );
            }
        }
        let tcp = [
            inet,
            (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(
            run_filter(&sandbox, libc::SYS_socket, tcp),
            Ok(libc::SECCOMP_RET_ALLOW)
        );
    }

    /// Issue 26, item 1: both lab modes refuse every TCP connection made
    /// without `connect()` (Fast Open through each send call, with any
    /// other flags and garbage in the high half; TCP_FASTOPEN_CONNECT;
    /// TCP_REPAIR; MPTCP and other non-TCP stream sockets) and keep plain
    /// TCP; only the lab sandbox refuses `listen`.
    #[test]
    fn lab_modes_refuse_tcp_without_connect() {
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let allow = libc::SECCOMP_RET_ALLOW;
        let [none, lab, target] = modes().try_into().unwrap_or_else(|_| panic!("three modes"));
        let compiled = |m: &NetMode| match compile_all(m) {
            Ok(Filters(p)) => p,
            Err(_) => panic!("{m:?}: the filter does not compile"),
        };
        let (none, sandbox, target) = (compiled(&none), compiled(&lab), compiled(&target));
        let nosignal = libc::MSG_NOSIGNAL as u64;
        for prog in [&sandbox, &target] {
            for flags in [
                MSG_FASTOPEN,
                MSG_FASTOPEN | nosignal,
                MSG_FASTOPEN | libc::MSG_DONTWAIT as u64 | 0xdead_0000_0000,
            ] {
                let to = [3, 0, 1, flags, 0x1000, 16];
                assert_eq!(run_filter(prog, libc::SYS_sendto, to), Ok(eperm));
                let msg = [3, 0x1000, flags, 0, 0, 0];
                assert_eq!(run_filter(prog, libc::SYS_sendmsg, msg), Ok(eperm));
                let mmsg = [3, 0x1000, 1, flags, 0, 0];
                assert_eq!(run_filter(prog, libc::SYS_sendmmsg, mmsg), Ok(eperm));
            }
            // Plain sends pass.
            for flags in [0, nosignal] {
                let to = [3, 0, 1, flags, 0, 0];
                assert_eq!(run_filter(prog, libc::SYS_sendto, to), Ok(allow));
                assert_eq!(
                    run_filter(prog, libc::SYS_sendmsg, [3, 0x1000, flags, 0, 0, 0]),
                    Ok(allow)
                );
            }
            for opt in [TCP_FASTOPEN_CONNECT, TCP_REPAIR] {
                let args = [3, IPPROTO_TCP | 0xdead_0000_0000, opt, 0x1000, 4, 0];
                assert_eq!(run_filter(prog, libc::SYS_setsockopt, args), Ok(eperm));
            }
            // TCP_NODELAY (1) passes; so does SO_REUSEADDR at SOL_SOCKET.
            let nodelay = [3, IPPROTO_TCP, 1, 0x1000, 4, 0];
            assert_eq!(run_filter(prog, libc::SYS_setsockopt, nodelay), Ok(allow));
            let reuse = [3, libc::SOL_SOCKET as u64, 2, 0x1000, 4, 0];
            assert_eq!(run_filter(prog, libc::SYS_setsockopt, reuse), Ok(allow));
            let inet = libc::AF_INET as u64;
            let stream = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
            for proto in [262u64, libc::IPPROTO_SCTP as u64] {
                let args = [inet, stream, proto, 0, 0, 0];
                assert_eq!(run_filter(prog, libc::SYS_socket, args), Ok(eperm));
            }
            for proto in [0, IPPROTO_TCP] {
                let args = [inet, stream, proto, 0, 0, 0];
                assert_eq!(run_filter(prog, libc::SYS_socket, args), Ok(allow));
            }
        }
        assert_eq!(
            run_filter(&sandbox, libc::SYS_listen, [3, 1, 0, 0, 0, 0]),
            Ok(eperm)
        );
        assert_eq!(
            run_filter(&target, libc::SYS_listen, [3, 1, 0, 0, 0, 0]),
            Ok(allow)
        );
        // No-network mode has no AF_INET socket at all.
        let inet = [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(run_filter(&none, libc::SYS_socket, inet), Ok(eperm));
    }
}

#[cfg(test)]
mod cost {
    /// `cargo test --release -p retie-runtime -- --ignored --nocapture
    /// seccomp_compile_cost`: what compiling the filter costs per start.
    #[test]
    #[ignore]
    fn seccomp_compile_cost() {
        let n = 2000u32;
        let t = std::time::Instant::now();
        for _ in 0..n {
            let f = super::compile_all(&crate::spec::NetMode::None);
            assert!(f.is_ok());
        }
        eprintln!("compile_all: {:?} per call", t.elapsed() / n);
    }
}
