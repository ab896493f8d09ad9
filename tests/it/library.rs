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
        std::fs::write(&p, profile_with("min_abi = 1", "min_abi = 99")).expect("write");
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

/// Issue 26, item 7: `/tmp`, `/var/tmp`, `$HOME` and `/dev/shm` were tmpfs
/// of half the machine's memory each. With the built-in profile each is
/// capped (256 MiB; `/dev/shm` 64 MiB) and a write past `/dev/shm`'s cap
/// fails with ENOSPC; with a profile's own caps (8 MiB, 4 MiB), a write
/// past each cap fails with ENOSPC, in both workspace modes.
#[test]
fn every_writable_tmpfs_is_capped_and_a_write_past_the_cap_is_enospc() {
    // `PATH=SIZE_MIB:RESULT` for each tmpfs, RESULT = ENOSPC or ok.
    let script = |mib: u64, shm: u64| {
        format!(
            "for p in /tmp /var/tmp \"$HOME\" /dev/shm; do \
               cap={mib}; [ \"$p\" = /dev/shm ] && cap={shm}; \
               size=$(( $(stat -f -c '%b * %S' \"$p\") / 1048576 )); \
               e=$(head -c $(( (cap + 1) * 1048576 )) /dev/zero 2>&1 >\"$p/fill\"); \
               case $e in *'No space left'*) r=ENOSPC;; *) r=ok;; esac; \
               rm -f \"$p/fill\"; \
               case $p in /tmp|/var/tmp|/dev/shm) n=$p;; *) n=HOME;; esac; \
               echo \"$n=$size:$r\"; \
             done"
        )
    };
    for leg in legs() {
        let s = Scratch::new(leg);
        // The built-in profile: sizes, and /dev/shm filled past its cap
        // (the others are only sized: 256 MiB of writes each is slow).
        let o = s.exec(
            &["--workspace-mode", "direct"],
            &[
                "sh",
                "-c",
                "for p in /tmp /var/tmp \"$HOME\" /dev/shm; do echo $(( $(stat -f -c '%b * %S' \"$p\") / 1048576 )); done; \
                 head -c $(( 65 * 1048576 )) /dev/zero > /dev/shm/fill 2>/tmp/err; grep -c 'No space left' /tmp/err",
            ],
        );
        assert_eq!(
            stdout(&o),
            "256\n256\n256\n64\n1\n",
            "{leg:?} built-in caps\n{}",
            stderr(&o)
        );
        let p = s.root.path().join("caps.toml");
        std::fs::write(
            &p,
            profile_with("tmpfs_size_mib = 256", "tmpfs_size_mib = 8")
                .replace("shm_size_mib = 64", "shm_size_mib = 4"),
        )
        .expect("write profile");
        for mode in ["direct", "overlay"] {
            let o = s.exec(
                &["--profile", path_str(&p), "--workspace-mode", mode],
                &["sh", "-c", &script(8, 4)],
            );
            assert_eq!(
                stdout(&o),
                "/tmp=8:ENOSPC\n/var/tmp=8:ENOSPC\nHOME=8:ENOSPC\n/dev/shm=4:ENOSPC\n",
                "{leg:?} {mode}\n{}",
                stderr(&o)
            );
        }
    }
}

/// Issue 26, item 7: no process limit held. RLIMIT_NPROC is counted per
/// user namespace (ucounts), so the profile's `nproc` caps the sandbox's
/// own processes, as root (the command runs as uid 65534) and as uid 65534
/// itself: a fork loop stops with EAGAIN below the cap, within a timeout.
#[test]
fn a_fork_loop_stops_at_the_profiles_process_limit() {
    const FORKS: &str = r#"
import errno, os, time
n, err = 0, "none"
for i in range(400):
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno)); break
    if pid == 0:
        time.sleep(2); os._exit(0)
    n += 1
print("forked=%d" % n); print("stopped=" + err)
"#;
    for leg in legs() {
        let s = Scratch::new(leg);
        let p = s.root.path().join("nproc.toml");
        std::fs::write(&p, profile_with("nproc = 4096", "nproc = 40")).expect("write profile");
        std::fs::write(s.ws.join("forks.py"), FORKS).expect("write script");
        let o = s.exec(
            &[
                "--profile",
                path_str(&p),
                "--timeout",
                "60",
                "--workspace-mode",
                "direct",
            ],
            &["python3", "forks.py"],
        );
        assert_code(&o, 0, "fork loop");
        let out = stdout(&o);
        assert!(
            out.contains("stopped=EAGAIN"),
            "{leg:?}: {out}{}",
            stderr(&o)
        );
        let n: u32 = out
            .lines()
            .find_map(|l| l.strip_prefix("forked="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(u32::MAX);
        assert!(n < 40, "{leg:?}: {n} forks under nproc = 40");
    }
}
