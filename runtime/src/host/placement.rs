//! Where the sandbox's init first runs (ADR 0417).
//!
//! A freshly cloned task starts on its parent's CPU, queued behind the
//! parent, and the scheduler lets the parent run on (it has work to do:
//! the caller records the intent while the sandbox is built). An idle CPU
//! sleeping in a tickless state does not notice the queued task until a
//! load-balancing tick, up to one tick later (4 ms at HZ=250). On the
//! project's two-CPU VM, init first ran a median of 0.09 ms after the
//! clone returned, and 0.67 ms or later in one run in ten, with the other
//! CPU idle all along.
//!
//! So, for a caller that works while the sandbox is built
//! ([`super::supervisor::start`]; one that waits at once leaves its CPU
//! to init anyway), the supervisor reads its allowed CPUs and the one it
//! is on before the clone, and right after it narrows the child's allowed
//! set to the others: the kernel moves the queued task to one of them at
//! once. init puts the caller's set back as soon as the supervisor
//! releases its set-up (the supervisor narrowed it before that release),
//! so everything init starts from then on, the command included, runs on
//! the caller's CPUs (test `exec::the_command_runs_on_the_callers_cpus`).
//!
//! The narrowing is a hint: when it cannot be made (one allowed CPU, the
//! call refused) the run goes on unmoved, and init then changes nothing.
//! Putting the set back is not a hint: a command must not run on fewer
//! CPUs than its caller gave it, so a failure there fails the set-up.
//!
//! The kernel also keeps the set a task asked for, and applies it again
//! when a cpuset changes or a CPU comes back; that set cannot be read.
//! init asks for every CPU first and keeps that if it gives the caller's
//! set (a caller that never narrowed its own: the command follows later
//! cpuset changes as the caller does), else asks for the caller's set as
//! read before the clone.

use rustix::thread::CpuSet;

/// The caller's allowed CPUs and the one it ran on just before the clone.
#[derive(Clone, Copy)]
pub struct Placement {
    allowed: CpuSet,
    here: usize,
}

/// Whether two sets name the same CPUs (`CpuSet` has no `==`).
fn same(a: &CpuSet, b: &CpuSet) -> bool {
    a.count() == b.count() && (0..CpuSet::MAX_CPU).all(|c| a.is_set(c) == b.is_set(c))
}

impl Placement {
    /// Read before the clone: `None` when there is nowhere else to go (a
    /// single allowed CPU) or the set cannot be read.
    pub fn before_clone() -> Option<Placement> {
        let allowed = rustix::thread::sched_getaffinity(None).ok()?;
        // getcpu is never refused to the supervisor (it runs outside any
        // filter); a CPU past the set's size cannot be named in it.
        let here = rustix::thread::sched_getcpu();
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
    /// it starts (see the module's notes). Nothing when the narrowing was
    /// not made.
    pub fn restore(&self) -> std::io::Result<()> {
        use rustix::thread::{sched_getaffinity, sched_setaffinity};
        if same(&sched_getaffinity(None)?, &self.allowed) {
            return Ok(());
        }
        let mut every = CpuSet::new();
        for c in 0..CpuSet::MAX_CPU {
            every.set(c);
        }
        if sched_setaffinity(None, &every).is_ok() && same(&sched_getaffinity(None)?, &self.allowed)
        {
            return Ok(());
        }
        sched_setaffinity(None, &self.allowed)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The narrowing happens: a child moved by `move_child` may run on
    /// every CPU of ours but the one we were on, and `restore` (run here on
    /// ourselves, narrowed the same way) gives the whole set back.
    #[test]
    fn the_child_is_narrowed_to_the_other_cpus_and_restore_undoes_it() {
        let Some(p) = Placement::before_clone() else {
            eprintln!("note: one CPU allowed here, nothing to narrow");
            return;
        };
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .expect("spawn sleep");
        p.move_child(child.id() as libc::pid_t);
        let got = rustix::process::Pid::from_raw(child.id() as i32)
            .map(|pid| rustix::thread::sched_getaffinity(Some(pid)));
        let _ = child.kill();
        let _ = child.wait();
        let got = got.expect("pid").expect("child's set");
        let mut want = p.allowed;
        want.unset(p.here);
        assert!(same(&got, &want), "the child was not narrowed");
        assert!(!got.is_set(p.here));

        // restore, on a thread of our own narrowed the same way.
        std::thread::spawn(move || {
            rustix::thread::sched_setaffinity(None, &want).expect("narrow");
            p.restore().expect("restore");
            let now = rustix::thread::sched_getaffinity(None).expect("read");
            assert!(same(&now, &p.allowed), "restore left a narrower set");
        })
        .join()
        .expect("thread");
    }
}
