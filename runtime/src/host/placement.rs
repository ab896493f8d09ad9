//! Where the sandbox's init first runs (ADR 0417).
//!
//! A freshly cloned task starts on its parent's CPU, queued behind the
//! parent, and the scheduler lets the parent run on (it has work to do: the
//! caller records the intent while the sandbox is built). An idle CPU
//! sleeping in a tickless state does not notice the queued task until a
//! load-balancing tick, up to one tick later (4 ms at HZ=250). On the
//! project's two-CPU VM, init first ran a median of 0.09 ms after the clone
//! returned, and 0.67 ms or later in one run in ten, with the other CPU
//! idle all along.
//!
//! So, for a caller that works while the sandbox is built
//! ([`super::supervisor::start`]; one that waits at once leaves its CPU to
//! init anyway), the supervisor reads its allowed CPUs and the one it is on before the
//! clone, and right after it narrows the child's allowed set to the others:
//! the kernel moves the queued task to one of them at once. init puts its
//! own set back as soon as the supervisor releases its set-up (the
//! supervisor narrowed it before that release), so everything init starts
//! from then on, the command included, gets exactly the caller's CPUs
//! (test `exec::the_command_runs_on_the_callers_cpus`).
//!
//! The narrowing is a hint: when it cannot be made (one allowed CPU, the
//! call refused) the run goes on unmoved. Putting the set back is not: a
//! command must not run on fewer CPUs than its caller gave it, so a
//! failure there fails the set-up.

use rustix::thread::CpuSet;

/// The caller's allowed CPUs and the one it ran on just before the clone.
#[derive(Clone)]
pub struct Placement {
    allowed: CpuSet,
    here: usize,
}

impl Placement {
    /// Read before the clone: `None` when there is nowhere else to go (a
    /// single allowed CPU) or the set cannot be read.
    pub fn before_clone() -> Option<Placement> {
        let allowed = rustix::thread::sched_getaffinity(None).ok()?;
        let here = rustix::thread::sched_getcpu();
        // (A CPU past the set's size cannot be named in it.)
        (here < CpuSet::MAX_CPU && allowed.count() > 1 && allowed.is_set(here))
            .then_some(Placement { allowed, here })
    }

    /// In the supervisor, right after the clone: allow the child every CPU
    /// of ours but this one. Best effort (see the module's notes).
    pub fn move_child(&self, pid: libc::pid_t) {
        let mut others = self.allowed;
        others.unset(self.here);
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::thread::sched_setaffinity(Some(pid), &others);
        }
    }

    /// In init, once released: the caller's CPUs again, for init and all
    /// it starts.
    pub fn restore(&self) -> std::io::Result<()> {
        rustix::thread::sched_setaffinity(None, &self.allowed).map_err(Into::into)
    }
}
