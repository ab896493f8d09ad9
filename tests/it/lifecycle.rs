//! Timeouts, parent death and signals: nothing outlives the sandbox.

use std::process::Stdio;

use crate::harness::*;

#[test]
fn timeout_kills_the_whole_sandbox_even_stubborn_forkers() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        // A child that ignores SIGTERM, a grandchild that daemonizes with
        // setsid, and a shell that ignores SIGTERM too.
        let script = format!(
            "trap '' TERM; (trap '' TERM; exec sleep {m}) & setsid sh -c 'exec sleep {m}' & sleep {m}"
        );
        let started = std::time::Instant::now();
        let o = s.exec(&["--timeout", "0.5", "--json"], &["sh", "-c", &script]);
        assert_code(&o, 124, "timeout");
        let st = json_status(&o);
        assert_eq!(st["timed_out"], true, "{st}");
        assert!(started.elapsed().as_secs() < 30, "timeout did not fire");
        assert!(
            wait_until(2.0, || pids_with(&m).is_empty()),
            "{leg:?}: survivors: {:?}",
            pids_with(&m)
        );
    }
}

#[test]
fn killing_retie_kills_the_sandbox() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        let mut child = start_sleepers(&s, &format!("sleep {m} & sleep {m}"), &m);
        // SIGKILL the supervisor (for the Nobody leg, setpriv execs into it,
        // so the child's pid is retie itself).
        child.kill().expect("kill");
        let _ = child.wait();
        assert!(
            wait_until(3.0, || pids_with(&m).is_empty()),
            "{leg:?}: orphans: {:?}",
            pids_with(&m)
        );
    }
}

#[test]
fn signals_to_retie_are_forwarded_to_the_command() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        let child = start_sleepers(&s, &format!("trap 'exit 42' TERM; sleep {m} & wait"), &m);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let o = child.wait_with_output().expect("wait");
        assert_code(&o, 42, "forwarded SIGTERM");
        assert!(
            wait_until(2.0, || pids_with(&m).is_empty()),
            "{leg:?}: survivors"
        );
    }
}

/// Start `script` in a sandbox and wait until a `sleep` carrying the marker
/// runs: by then the shell has run everything before it (traps included).
fn start_sleepers(s: &Scratch, script: &str, m: &str) -> std::process::Child {
    let child = s
        .retie()
        .args(["sandbox", "exec", "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let sleeping = || {
        pids_with(m).into_iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .map(|c| c.trim() == "sleep")
                .unwrap_or(false)
        })
    };
    assert!(
        wait_until(10.0, sleeping),
        "{:?}: sandbox did not start",
        s.leg
    );
    child
}

/// A run whose retie was killed is listed by `retie changes list` (as
/// interrupted), so its work can be shown, applied or discarded; before,
/// only `show` found it, by an id nobody printed.
#[test]
fn a_run_whose_retie_was_killed_is_listed_as_interrupted() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        let mut child = start_sleepers(&s, &format!("echo work > result.txt; sleep {m}"), &m);
        child.kill().expect("kill");
        let _ = child.wait();
        assert!(
            wait_until(3.0, || pids_with(&m).is_empty()),
            "{leg:?}: orphans"
        );
        // The sandbox's init held the run's lock too; it is gone once the
        // namespace is.
        let listed = || {
            let o = s
                .retie()
                .args(["changes", "list", "--json"])
                .output()
                .expect("list");
            serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_default()
        };
        assert!(
            wait_until(3.0, || listed()["runs"][0]["why"]
                .as_str()
                .is_some_and(|w| w.starts_with("interrupted"))),
            "{leg:?}: {}",
            listed()
        );
        let run = listed()["runs"][0]["run"]
            .as_str()
            .expect("run id")
            .to_string();
        let o = s
            .retie()
            .args(["changes", "apply", &run])
            .output()
            .expect("apply");
        assert_code(&o, 0, "apply the interrupted run");
        assert_eq!(
            std::fs::read_to_string(s.ws.join("result.txt"))
                .ok()
                .as_deref(),
            Some("work\n")
        );
    }
}

/// Issue 33 item 5: a Ctrl-C to `retie sandbox exec` (SIGINT, forwarded
/// to the command, which dies of it: exit 130) applied the command's
/// half-done changes, where a timeout or the agent's Ctrl-C kept them.
/// One rule now: an interrupted run is kept, not applied, and retie says
/// how to apply or discard it.
#[test]
fn a_ctrl_c_to_sandbox_exec_keeps_the_run_unapplied() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        let child = start_sleepers(&s, &format!("echo x > f; sleep {m}"), &m);
        // SAFETY: signalling our own child (setpriv execs into retie).
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let o = child.wait_with_output().expect("wait");
        assert_code(&o, 130, "Ctrl-C");
        assert!(
            !s.ws.join("f").exists(),
            "{leg:?}: an interrupted run's changes were applied: {}",
            stderr(&o)
        );
        let listed = s
            .retie()
            .args(["changes", "list", "--json"])
            .output()
            .expect("list");
        let listed: serde_json::Value =
            serde_json::from_slice(&listed.stdout).expect("changes list --json");
        let run = listed["runs"][0]["run"]
            .as_str()
            .unwrap_or_else(|| panic!("{leg:?}: no kept run listed: {listed}"))
            .to_string();
        assert!(
            listed["runs"][0]["why"]
                .as_str()
                .is_some_and(|w| w.starts_with("interrupted")),
            "{leg:?}: {listed}"
        );
        let err = stderr(&o);
        assert!(
            err.contains(&format!("retie changes apply {run}"))
                && err.contains(&format!("retie changes discard {run}")),
            "{leg:?}: the message does not say how to apply or discard: {err}"
        );
        let o = s
            .retie()
            .args(["changes", "apply", &run])
            .output()
            .expect("apply");
        assert_code(&o, 0, "apply the interrupted run");
        assert_eq!(
            std::fs::read_to_string(s.ws.join("f")).ok().as_deref(),
            Some("x\n")
        );
    }
}
