//! Issue 33, "runs on the kernels people have" (ADR 0430): retie uses the
//! strongest Landlock ABI the kernel has, says what is weaker below ABI 6,
//! and refuses only where no other wall covers a gap (the lab modes below
//! ABI 4). Older kernels are stood in for by `RETIE_LANDLOCK_ABI_CAP`,
//! which lowers the ABI retie uses (a ruleset that does not handle a right
//! leaves it unchecked, exactly as an older kernel does).

use std::process::{Output, Stdio};

use crate::harness::*;

const CAP: &str = "RETIE_LANDLOCK_ABI_CAP";
/// The caps the issue names: the filesystem floor, REFER, TCP, scoping.
const CAPS: &[i32] = &[1, 2, 4, 6];

/// The kernel's own Landlock ABI (a cap above it changes nothing).
fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel
    // reads no memory and returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    assert!(v >= 1, "this kernel has no Landlock");
    i32::try_from(v).expect("abi")
}

/// `retie sandbox exec -w WS [extra] -- argv` with the ABI capped.
fn exec_capped(s: &Scratch, cap: Option<i32>, extra: &[&str], argv: &[&str]) -> Output {
    let mut c = s.retie();
    if let Some(n) = cap {
        c.env(CAP, n.to_string());
    }
    c.args(["sandbox", "exec", "-w"])
        .arg(&s.ws)
        .args(extra)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null());
    c.output().expect("run retie")
}

/// The ABIs whose walls a used ABI lacks (2..=6 above it).
fn missing(used: i32) -> Vec<i64> {
    (2..=6).filter(|a| *a > used).map(i64::from).collect()
}

/// The self-test passes at every cap, with the capped ABI in force inside,
/// one row per missing wall naming its stand-in, the stand-ins' own
/// probes passing, and the lab section replaced by a refusal below ABI 4.
#[test]
fn selftest_passes_at_each_landlock_cap_and_names_what_is_weaker() {
    let kernel = kernel_abi();
    for leg in legs() {
        for &cap in CAPS {
            let used = cap.min(kernel);
            let s = Scratch::new(leg);
            let o = s
                .retie()
                .env(CAP, cap.to_string())
                .args(["selftest", "--json"])
                .output()
                .expect("selftest");
            let ctx = format!("{leg:?} cap {cap}");
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
                panic!("{ctx}: selftest JSON: {e}\n{}\n{}", stdout(&o), stderr(&o))
            });
            let probes = v["probes"].as_array().expect("probes");
            let failed: Vec<&serde_json::Value> =
                probes.iter().filter(|p| p["pass"] != true).collect();
            assert!(failed.is_empty(), "{ctx}: failing probes: {failed:#?}");
            assert_eq!(v["pass"], true, "{ctx}");
            assert_code(&o, 0, &ctx);
            assert_eq!(v["landlock"]["used"], used, "{ctx}: {}", v["landlock"]);
            assert_eq!(v["landlock"]["kernel"], kernel, "{ctx}");
            assert_eq!(v["landlock_abi"], used, "{ctx}");
            let row = |name: &str| probes.iter().find(|p| p["probe"] == name);
            // The capped ruleset is what init enforced.
            assert_eq!(
                row("Landlock enforced inside").map(|r| r["observed"].clone()),
                Some(serde_json::json!(format!("fully, ABI {used}"))),
                "{ctx}"
            );
            // Exactly the walls the capped ABI lacks, each with its stand-in.
            let gaps: Vec<i64> = v["landlock"]["missing"]
                .as_array()
                .expect("missing")
                .iter()
                .map(|g| g["abi"].as_i64().expect("abi"))
                .collect();
            assert_eq!(gaps, missing(used), "{ctx}");
            for g in &gaps {
                let prefix = format!("Landlock ABI {g} (Linux ");
                let r = probes
                    .iter()
                    .find(|p| p["probe"].as_str().is_some_and(|n| n.starts_with(&prefix)));
                assert!(
                    r.is_some_and(|r| r["observed"].as_str().is_some_and(|o| !o.is_empty())),
                    "{ctx}: no row for the missing ABI {g}"
                );
            }
            assert!(
                row("Landlock walls missing at this ABI").is_some(),
                "{ctx}: the summary row is gone"
            );
            // The stand-ins for ABI 4 and ABI 6, probed from inside.
            for name in [
                "own network namespace",
                "host abstract unix socket unreachable",
                "host pids invisible",
                "IPv6 socket refused",
                "interfaces",
                "write outside workspace (/usr/retie-probe) refused",
                "write through a workspace symlink to /etc refused",
            ] {
                assert!(
                    row(name).is_some_and(|r| r["pass"] == true),
                    "{ctx}: stand-in probe `{name}` missing or failing"
                );
            }
            let tcp_rows = probes
                .iter()
                .filter(|p| {
                    p["probe"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("TCP connect to host listener"))
                })
                .count();
            assert!(tcp_rows >= 1, "{ctx}: no TCP probe");
            assert!(
                probes.iter().any(|p| p["probe"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("signal to host pid"))),
                "{ctx}: no signal probe"
            );
            let lab_rows = probes
                .iter()
                .filter(|p| {
                    p["probe"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("lab sandbox:"))
                })
                .count();
            if used < 4 {
                let r = row("lab modes refused below Landlock ABI 4");
                assert!(
                    r.is_some_and(|r| r["pass"] == true),
                    "{ctx}: the lab refusal row: {r:?}"
                );
                assert_eq!(lab_rows, 0, "{ctx}: a lab sandbox ran below ABI 4");
            } else {
                assert!(
                    row("lab sandbox: undeclared lab port refused (Landlock)")
                        .is_some_and(|r| r["pass"] == true),
                    "{ctx}: the lab section did not run"
                );
            }
        }
    }
}

/// Each check `OP:PATH[:ARG]` inside the sandbox, printing `CHECK=RESULT`:
/// `create` and `append` open like escapes.rs's OPEN_CHECK; `truncate`
/// truncates by path (the call Landlock checks only from ABI 3);
/// `comm` truncates the sandbox's own /proc/self/comm (on a writable
/// mount, owned by the caller) and reports whether its content changed;
/// `link` hard-links PATH into the workspace, `rename` moves the
/// workspace file ARG to PATH (REFER, ABI 2).
const FS_CHECK: &str = r#"
import errno, os, sys
def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))
for arg in sys.argv[1:]:
    op, path = arg.split(":", 1)
    try:
        if op == "create":
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)); r = "opened"
        elif op == "append":
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND)); r = "opened"
        elif op == "truncate":
            os.truncate(path, 0); r = "truncated"
        elif op == "comm":
            before = open("/proc/self/comm").read()
            try:
                os.truncate("/proc/self/comm", 0)
            except OSError:
                pass
            r = "unchanged" if open("/proc/self/comm").read() == before else "CHANGED"
        elif op == "link":
            os.link(path, "linked-" + os.path.basename(path)); r = "linked"
        elif op == "rename":
            src = "moved-src"
            open(src, "w").write("x")
            os.rename(src, path); r = "renamed"
    except OSError as e:
        r = name(e)
    print("%s=%s" % (arg, r))
"#;

/// The filesystem escape probes of escapes.rs (the read-only system view,
/// symlinks out of the workspace) and the calls the missing ABIs concern
/// (truncate, cross-directory link and rename) hold at every cap, with
/// the same errno as on a full kernel: the read-only mounts and ABI 1's
/// write rules answer them.
#[test]
fn filesystem_escape_probes_hold_at_each_landlock_cap() {
    let kernel = kernel_abi();
    for leg in legs() {
        for &cap in CAPS {
            let ctx = format!("{leg:?} cap {cap} (ABI {})", cap.min(kernel));
            let s = Scratch::new(leg);
            std::fs::write(s.ws.join("fs_check.py"), FS_CHECK).expect("write");
            for (link, target) in [
                ("link-usr", "/usr/bin/env"),
                ("link-proc", "/proc/self/comm"),
            ] {
                std::os::unix::fs::symlink(target, s.ws.join(link)).expect("symlink");
            }
            let env_before = std::fs::metadata("/usr/bin/env").expect("env").len();
            let checks: &[(&str, &str)] = &[
                ("create:/usr/bin/retie-x", "EROFS"),
                ("create:/etc/retie-x", "EROFS"),
                ("create:/retie-x", "EROFS"),
                ("append:/etc/passwd", "EROFS"),
                ("append:/usr/bin/env", "EACCES"),
                ("append:link-usr", "EACCES"),
                // Landlock alone stands here (a writable mount, the
                // caller's own file): ABI 1's write rule.
                ("append:link-proc", "EACCES"),
                ("truncate:/etc/passwd", "EROFS"),
                ("truncate:/usr/bin/env", "EACCES"),
                ("comm:/proc/self/comm", "unchanged"),
                ("link:/usr/bin/env", "EXDEV"),
                ("rename:/usr/bin/retie-moved", "EXDEV"),
                ("rename:/tmp/retie-moved", "EXDEV"),
            ];
            let mut argv = vec!["python3", "fs_check.py"];
            argv.extend(checks.iter().map(|(c, _)| *c));
            let o = exec_capped(&s, Some(cap), &["--workspace-mode", "direct"], &argv);
            assert_code(&o, 0, &ctx);
            let got: std::collections::BTreeMap<String, String> = stdout(&o)
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            for (check, want) in checks {
                assert_eq!(
                    got.get(*check).map(String::as_str),
                    Some(*want),
                    "{ctx}: {check}: {got:#?}\n{}",
                    stderr(&o)
                );
            }
            assert_eq!(
                std::fs::metadata("/usr/bin/env").expect("env").len(),
                env_before,
                "{ctx}: /usr/bin/env changed on the host"
            );
            for host in [
                "/usr/bin/retie-x",
                "/etc/retie-x",
                "/retie-x",
                "/usr/bin/retie-moved",
            ] {
                assert!(
                    !std::path::Path::new(host).exists(),
                    "{ctx}: {host} appeared on the host"
                );
            }
            // Inside the workspace, moving between directories works at
            // every cap (below ABI 2 by mv's copy, which it falls back to).
            let o = exec_capped(
                &s,
                Some(cap),
                &["--workspace-mode", "direct"],
                &[
                    "sh",
                    "-c",
                    "mkdir -p a b && echo x > a/f && mv a/f b/f && cat b/f",
                ],
            );
            assert_code(&o, 0, &format!("{ctx}: mv across directories"));
            assert_eq!(stdout(&o), "x\n", "{ctx}");
        }
    }
}

/// Below ABI 4 a lab-mode sandbox is refused before it starts, with the
/// fix; at ABI 4 the same command runs.
#[test]
fn a_lab_sandbox_is_refused_below_landlock_abi_4() {
    let kernel = kernel_abi();
    assert!(kernel >= 4, "this test needs a kernel with Landlock ABI 4");
    for leg in legs() {
        let s = Scratch::new(leg);
        let _lab = crate::lab::Lab::up(
            &s,
            "kernels",
            &[
                "--port",
                "8080",
                "--",
                "python3",
                "-m",
                "http.server",
                "8080",
            ],
        );
        let ran = s.ws.join("ran");
        for cap in [1, 2, 3] {
            let o = exec_capped(
                &s,
                Some(cap),
                &["--workspace-mode", "direct", "--net", "lab"],
                &["touch", path_str(&ran)],
            );
            let ctx = format!("{leg:?} cap {cap}");
            assert_code(&o, 125, &ctx);
            let e = stderr(&o);
            assert!(
                e.contains("the lab modes need Landlock's TCP port rules (ABI 4, Linux 6.7)")
                    && e.contains(&format!("capped by {CAP}={cap}"))
                    && e.contains("fix: upgrade the kernel to Linux 6.7 or newer"),
                "{ctx}: {e}"
            );
            assert!(!ran.exists(), "{ctx}: the command ran");
        }
        let o = exec_capped(
            &s,
            Some(4),
            &["--workspace-mode", "direct", "--net", "lab"],
            &["touch", path_str(&ran)],
        );
        assert_code(&o, 0, &format!("{leg:?} cap 4: {}", stderr(&o)));
        assert!(ran.exists(), "{leg:?} cap 4: the command did not run");
    }
}

/// The stderr line is said once per ABI (kernel, cap), not on every
/// sandbox; nothing on a kernel with every wall; a bad cap is refused
/// with the fix; the cap only lowers; a profile may still demand more.
#[test]
fn the_landlock_notice_is_said_once_and_the_cap_only_lowers() {
    let kernel = kernel_abi();
    assert!(kernel >= 6, "this test needs a kernel with Landlock ABI 6");
    for leg in legs() {
        let s = Scratch::new(leg);
        let notice = |o: &Output| {
            stderr(o)
                .lines()
                .filter(|l| l.starts_with("retie: Landlock ABI"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let o = exec_capped(&s, Some(2), &[], &["true"]);
        assert_code(&o, 0, "cap 2");
        let said = notice(&o);
        assert_eq!(said.len(), 1, "{leg:?}: {}", stderr(&o));
        assert!(
            said[0].contains(&format!("ABI 2 (the kernel has {kernel}; capped by {CAP}=2)"))
                && said[0].contains("without ABI 3 truncate checks, ABI 4 TCP port rules, ABI 5 device ioctl checks, ABI 6 socket and signal scoping")
                && said[0].contains("retie selftest"),
            "{leg:?}: {}",
            said[0]
        );
        let o = exec_capped(&s, Some(2), &[], &["true"]);
        assert_code(&o, 0, "cap 2 again");
        assert!(notice(&o).is_empty(), "{leg:?}: said twice: {}", stderr(&o));
        let o = exec_capped(&s, Some(4), &[], &["true"]);
        let said = notice(&o);
        assert!(
            said.len() == 1 && said[0].contains("without ABI 5 device ioctl checks, ABI 6"),
            "{leg:?}: cap 4: {}",
            stderr(&o)
        );
        // The full set: nothing to say.
        for cap in [None, Some(6), Some(7)] {
            let o = exec_capped(&s, cap, &[], &["true"]);
            assert_code(&o, 0, &format!("{cap:?}"));
            assert!(notice(&o).is_empty(), "{leg:?} {cap:?}: {}", stderr(&o));
        }
        // A cap never raises: above the kernel it is the kernel.
        let o = exec_capped(&s, Some(7), &["--json"], &["true"]);
        let st = json_status(&o);
        assert_eq!(st["landlock_abi"], kernel.min(7), "{st}");
        let o = exec_capped(&s, Some(1), &["--json"], &["true"]);
        assert_eq!(json_status(&o)["landlock_abi"], 1);
        // A bad cap is refused, and the command does not run.
        let ran = s.ws.join("ran");
        for bad in ["0", "8", "four", ""] {
            let mut c = s.retie();
            c.env(CAP, bad)
                .args(["sandbox", "exec", "-w"])
                .arg(&s.ws)
                .args(["--workspace-mode", "direct", "--", "touch"])
                .arg(&ran)
                .stdin(Stdio::null());
            let o = c.output().expect("retie");
            assert_code(&o, 125, &format!("cap {bad:?}"));
            let e = stderr(&o);
            assert!(
                e.contains(&format!(
                    "{CAP}=\"{bad}\" is not a Landlock ABI from 1 to 7"
                )) && e.contains("it can only lower the ABI retie uses"),
                "{leg:?} {bad:?}: {e}"
            );
            assert!(!ran.exists(), "{leg:?} {bad:?}: the command ran");
        }
        // A profile may demand more than the floor: ABI 6 under a cap of 4.
        let p = s.root.path().join("strict.toml");
        std::fs::write(
            &p,
            retie_runtime::profile::HOST_PROFILE_TOML.replace("min_abi = 1", "min_abi = 6"),
        )
        .expect("write");
        let o = exec_capped(
            &s,
            Some(4),
            &["--profile", path_str(&p), "--workspace-mode", "direct"],
            &["touch", path_str(&ran)],
        );
        assert_code(&o, 125, "min_abi 6 at cap 4");
        assert!(
            stderr(&o).contains("requires at least ABI 6"),
            "{}",
            stderr(&o)
        );
        assert!(
            !ran.exists(),
            "{leg:?}: the command ran below the profile's floor"
        );
    }
}
