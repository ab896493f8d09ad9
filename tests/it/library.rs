//! The runtime crate used as a library: the helper process for
//! multi-threaded callers, and the fail-closed checks.

use std::time::Duration;

use retie_runtime::{helper, Profile, RuntimeError, Sandbox, Stdio};

use crate::harness::*;

#[test]
fn multithreaded_callers_are_refused_in_process() {
    // The test harness itself runs several threads.
    let _t = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(300)));
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = Sandbox::builder(["true"])
        .workspace(dir.path())
        .build()
        .expect("spec");
    match retie_runtime::run(&spec, Stdio::Inherit) {
        Err(RuntimeError::NotSingleThreaded { threads }) => assert!(threads > 1),
        other => panic!("expected NotSingleThreaded, got {other:?}"),
    }
}

#[test]
fn multithreaded_callers_run_through_the_helper() {
    let _t = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(300)));
    let s = Scratch::new(Leg::Invoker);
    let spec = Sandbox::builder(["sh", "-c", "echo via-helper > out.txt; exit 3"])
        .workspace(&s.ws)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("spec");
    let outcome = helper::run_via_helper(&bin(Leg::Invoker), &spec).expect("helper run");
    assert_eq!(outcome.exit_code, 3);
    assert!(outcome.seccomp && outcome.landlock_enforced);
    assert_eq!(
        std::fs::read_to_string(s.ws.join("out.txt"))
            .expect("out")
            .trim(),
        "via-helper"
    );
    // The helper keeps its footprint small.
    assert!(outcome.helper_max_rss_kib > 0);
}

fn profile_with(replace: &str, with: &str) -> String {
    let text = retie_runtime::profile::HOST_PROFILE_TOML.replace(replace, with);
    assert_ne!(
        text,
        retie_runtime::profile::HOST_PROFILE_TOML,
        "replacement did not apply"
    );
    text
}

#[test]
fn a_landlock_floor_above_the_kernel_refuses_to_run() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let p = s.root.path().join("strict.toml");
        std::fs::write(&p, profile_with("min_abi = 6", "min_abi = 99")).expect("write");
        let marker_file = s.ws.join("ran");
        let o = s.exec(
            &["--profile", path_str(&p)],
            &["touch", path_str(&marker_file)],
        );
        assert_code(&o, 125, "min_abi 99");
        let e = stderr(&o);
        assert!(
            e.contains("requires at least ABI 99") && e.contains("fix:"),
            "{e}"
        );
        assert!(!marker_file.exists(), "the command ran despite the refusal");
    }
}

#[test]
fn a_bad_profile_is_a_clear_error() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let p = s.root.path().join("typo.toml");
        std::fs::write(&p, profile_with("[limits]", "[limits]\nnofiles = 3")).expect("write");
        let o = s.exec(&["--profile", path_str(&p)], &["true"]);
        assert_code(&o, 125, "typo");
        assert!(stderr(&o).contains("nofiles"), "{}", stderr(&o));
        let p2 = s.root.path().join("home.toml");
        std::fs::write(
            &p2,
            profile_with("ro = [\"/usr\"]", "ro = [\"/usr\", \"/root\"]"),
        )
        .expect("write");
        let o = s.exec(&["--profile", path_str(&p2)], &["true"]);
        assert_code(&o, 125, "exposes /root");
        assert!(
            stderr(&o).contains("/root may not be exposed"),
            "{}",
            stderr(&o)
        );
        let o = s.exec(&["--profile", "/nonexistent/profile.toml"], &["true"]);
        assert_code(&o, 125, "missing profile");
    }
}

/// A set-up step that fails inside the sandbox, after the supervisor let
/// init begin, is reported with its step and cause. init is gone by the
/// time the supervisor releases the command; the release used to raise
/// SIGPIPE, which the CLI keeps at its default, and retie died with 141
/// and printed nothing (3 of 3 runs). Now it exits 125 and says why.
#[test]
fn a_set_up_failure_inside_the_sandbox_is_reported() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let p = s.root.path().join("bad-tmpfs.toml");
        std::fs::write(
            &p,
            profile_with(
                "tmpfs = [\"/tmp\", \"/var/tmp\"]",
                "tmpfs = [\"/tmp\", \"/var/tmp\", \"/usr/retie-no-such-dir\"]",
            ),
        )
        .expect("write");
        for mode in ["overlay", "direct"] {
            let o = s.exec(
                &["--profile", path_str(&p), "--workspace-mode", mode],
                &["true"],
            );
            assert_code(&o, 125, &format!("{leg:?} {mode}: set-up failure"));
            let e = stderr(&o);
            assert!(
                e.contains("set-up failed") && e.contains("/usr/retie-no-such-dir"),
                "{leg:?} {mode}: {e}"
            );
        }
    }
}

#[test]
fn profile_limits_are_applied() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let p = s.root.path().join("limits.toml");
        std::fs::write(
            &p,
            profile_with("nofile = 8192", "nofile = 100\nfsize = 4096"),
        )
        .expect("write");
        let o = s.exec(
            &["--profile", path_str(&p)],
            &[
                "sh",
                "-c",
                "ulimit -n; ulimit -c; head -c 10000 /dev/zero > big",
            ],
        );
        let out = stdout(&o);
        assert!(out.starts_with("100\n0\n"), "{out}");
        // fsize 4096 bytes: the write past it is stopped (SIGXFSZ).
        assert_ne!(o.status.code(), Some(0));
        assert!(
            std::fs::metadata(s.ws.join("big"))
                .map(|m| m.len())
                .unwrap_or(0)
                <= 4096
        );
    }
}

#[test]
fn builtin_profile_is_the_documented_file() {
    let p = Profile::host().expect("host");
    let on_disk = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/rootfs/host.toml"))
        .expect("read");
    assert_eq!(retie_runtime::profile::HOST_PROFILE_TOML, on_disk);
    assert_eq!(p.name, "host");
}
