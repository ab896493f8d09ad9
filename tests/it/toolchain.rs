//! Toolchains in the sandbox (issue 12): the project's own tools run, read
//! only, and the owner's credentials stay out.
//!
//! Every test builds its toolchain layout in the test's own temporary home
//! (owned by the leg's user), from this machine's real toolchains: files
//! are hard links (read-only use; nothing of the real home is changed) or
//! links to `/usr`. retie is run with HOME pointing there and every
//! toolchain variable of the test's own environment removed.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use retie_runtime::toolchain::{
    secrets::{Where, SECRETS},
    HostEnv,
};

use crate::harness::*;

/// `retie ARGS` as the leg, with HOME = the scratch home and a clean
/// toolchain environment.
fn retie(s: &Scratch, args: &[&str]) -> Output {
    retie_with(s, &[], args)
}

/// [`retie`] with some variables of the invoking user set (PATH replaces
/// the default one).
fn retie_with(s: &Scratch, vars: &[(&str, &str)], args: &[&str]) -> Output {
    // Homes are private, as root's is: invoked as root, the sandbox user
    // (uid 65534) cannot walk into this one, so the toolchain binds must
    // come through the supervisor's detached trees.
    std::fs::set_permissions(&s.home, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod home");
    let mut cmd = s.retie();
    for v in HostEnv::VARS {
        cmd.env_remove(v);
    }
    cmd.env("HOME", &s.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .envs(vars.iter().copied())
        .args(args)
        .stdin(Stdio::null());
    cmd.output().expect("run retie")
}

/// `sandbox exec` in direct mode (builds write `target/` and the like
/// straight into the test's workspace).
fn exec(s: &Scratch, extra: &[&str], argv: &[&str]) -> Output {
    exec_with(s, &[], extra, argv)
}

fn exec_with(s: &Scratch, vars: &[(&str, &str)], extra: &[&str], argv: &[&str]) -> Output {
    let mut args = vec![
        "sandbox",
        "exec",
        "--workspace-mode",
        "direct",
        "-w",
        path_str(&s.ws),
    ];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(argv);
    retie_with(s, vars, &args)
}

fn explain_json(s: &Scratch) -> serde_json::Value {
    let o = retie(s, &["sandbox", "explain", "--json", "-w", path_str(&s.ws)]);
    assert_code(&o, 0, "explain --json");
    serde_json::from_str(stdout(&o).trim()).expect("explain JSON")
}

/// Give `p` and its ancestors up to the scratch root to the leg's user.
fn own(s: &Scratch, p: &Path) {
    if s.leg != Leg::Nobody {
        return;
    }
    for a in p
        .ancestors()
        .take_while(|a| a.starts_with(s.root.path()) && *a != s.root.path())
    {
        let _ = std::os::unix::fs::lchown(a, Some(NOBODY), Some(NOBODY));
    }
}

/// Write a file under the scratch area, owned by the leg's user.
fn put(s: &Scratch, p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
    own(s, p);
}

fn mkdir(s: &Scratch, p: &Path) {
    std::fs::create_dir_all(p).expect("mkdir");
    own(s, p);
}

/// Mirror `src` at `dst`: directories created (and owned by the leg's
/// user), files hard-linked (never chowned: they are the real toolchain's
/// inodes), links recreated. Names in `skip` are left out.
fn link_tree(s: &Scratch, src: &Path, dst: &Path, skip: &[&str]) {
    mkdir(s, dst);
    for e in std::fs::read_dir(src).expect("read_dir") {
        let e = e.expect("entry");
        let name = e.file_name();
        if skip.iter().any(|k| name == *k) {
            continue;
        }
        let (from, to) = (e.path(), dst.join(&name));
        let ft = e.file_type().expect("type");
        if ft.is_dir() {
            link_tree(s, &from, &to, skip);
        } else if ft.is_symlink() {
            symlink(std::fs::read_link(&from).expect("readlink"), &to).expect("symlink");
            own(s, &to);
        } else {
            std::fs::hard_link(&from, &to).expect("hard link");
        }
    }
}

/// Run a command outside the sandbox as the leg's user.
fn as_leg(s: &Scratch, argv: &[&str]) -> Output {
    let mut cmd = match s.leg {
        Leg::Invoker => Command::new(argv[0]),
        Leg::Nobody => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(argv[0]);
            c
        }
    };
    cmd.args(&argv[1..])
        .current_dir(&s.ws)
        .env("HOME", &s.home)
        .stdin(Stdio::null());
    cmd.output().expect("run")
}

const STABLE: &str = "stable-x86_64-unknown-linux-gnu";

/// The real rustup install this test borrows from, if there is one.
fn real_rustup() -> Option<(PathBuf, PathBuf)> {
    let home = PathBuf::from(std::env::var_os("HOME")?);
    let cargo = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"));
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".rustup"));
    (cargo.join("bin/rustup").is_file() && rustup.join("toolchains").join(STABLE).is_dir())
        .then_some((cargo, rustup))
}

#[test]
fn cargo_test_offline_with_a_cached_dependency() {
    let Some((real_cargo, real_rustup)) = real_rustup() else {
        eprintln!("note: skipped: no rustup install with a {STABLE} toolchain on this machine");
        return;
    };
    // A small crate already in the host's cargo cache, sources extracted.
    let reg = real_cargo.join("registry");
    let idx = std::fs::read_dir(reg.join("src"))
        .ok()
        .and_then(|mut d| d.find_map(|e| e.ok()))
        .map(|e| e.file_name());
    let found = idx.as_ref().and_then(|idx| {
        let src = std::fs::read_dir(reg.join("src").join(idx)).ok()?;
        src.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("itoa-1."))
    });
    let (Some(idx), Some(itoa)) = (idx, found) else {
        eprintln!("note: skipped: no extracted itoa 1.x in {}", reg.display());
        return;
    };
    let version = itoa.trim_start_matches("itoa-").to_string();
    for leg in legs() {
        let s = Scratch::new(leg);
        let (cargo, rustup) = (s.home.join(".cargo"), s.home.join(".rustup"));
        // rustup and its proxies.
        mkdir(&s, &cargo.join("bin"));
        std::fs::hard_link(real_cargo.join("bin/rustup"), cargo.join("bin/rustup"))
            .expect("link rustup");
        for proxy in ["cargo", "rustc", "rustdoc"] {
            symlink("rustup", cargo.join("bin").join(proxy)).expect("proxy");
            own(&s, &cargo.join("bin").join(proxy));
        }
        link_tree(
            &s,
            &real_rustup.join("toolchains").join(STABLE),
            &rustup.join("toolchains").join(STABLE),
            &["share", "libexec"],
        );
        put(
            &s,
            &rustup.join("settings.toml"),
            &format!("version = \"12\"\ndefault_toolchain = \"{STABLE}\"\nprofile = \"minimal\"\n\n[overrides]\n"),
        );
        // The registry: index entry, .crate file, extracted sources.
        let (from, to) = (&reg, cargo.join("registry"));
        put(
            &s,
            &to.join("index").join(&idx).join("config.json"),
            &std::fs::read_to_string(from.join("index").join(&idx).join("config.json"))
                .expect("index config"),
        );
        put(
            &s,
            &to.join("index").join(&idx).join(".cache/it/oa/itoa"),
            "",
        );
        std::fs::copy(
            from.join("index").join(&idx).join(".cache/it/oa/itoa"),
            to.join("index").join(&idx).join(".cache/it/oa/itoa"),
        )
        .expect("index entry");
        mkdir(&s, &to.join("cache").join(&idx));
        std::fs::hard_link(
            from.join("cache").join(&idx).join(format!("{itoa}.crate")),
            to.join("cache").join(&idx).join(format!("{itoa}.crate")),
        )
        .expect("crate file");
        link_tree(
            &s,
            &from.join("src").join(&idx).join(&itoa),
            &to.join("src").join(&idx).join(&itoa),
            &[],
        );
        // A credential beside the toolchain.
        put(
            &s,
            &cargo.join("credentials.toml"),
            "[registry]\ntoken = \"CANARY-cargo\"\n",
        );
        // The crate.
        write(
            &s,
            "Cargo.toml",
            &format!("[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nitoa = \"={version}\"\n"),
        );
        write(
            &s,
            "src/lib.rs",
            "#[test]\nfn formats() {\n    assert_eq!(itoa::Buffer::new().format(42u8), \"42\");\n}\n",
        );
        let o = exec(
            &s,
            &[],
            &[
                "sh",
                "-c",
                "cat $CARGO_HOME/credentials.toml; cargo test --offline 2>&1",
            ],
        );
        assert_code(&o, 0, &format!("{leg:?}: cargo test --offline"));
        let out = stdout(&o);
        assert!(out.contains("test formats ... ok"), "{leg:?}: {out}");
        assert!(
            !out.contains("CANARY"),
            "{leg:?}: credentials readable:\n{out}"
        );
        // cargo's locks and last-use database went to the throwaway layer.
        for f in [".package-cache", ".global-cache"] {
            assert!(
                !cargo.join(f).exists(),
                "{leg:?}: {f} written to the host's CARGO_HOME"
            );
        }
    }
}

#[test]
fn toolchain_none_leaves_the_tools_out() {
    for leg in legs() {
        let s = Scratch::new(leg);
        put(&s, &s.home.join(".local/bin/greet"), "#!/bin/sh\necho hi\n");
        write(&s, "Makefile", "all:\n\tgreet\n");
        std::fs::set_permissions(
            s.home.join(".local/bin/greet"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let o = exec(&s, &["--toolchain", "none"], &["greet"]);
        assert_code(&o, 127, &format!("{leg:?}: --toolchain none"));
        let o = exec(&s, &["--toolchain", "local-bin"], &["greet"]);
        assert_code(&o, 0, &format!("{leg:?}: --toolchain local-bin"));
        let o = exec(&s, &["--toolchain", "ruby"], &["true"]);
        assert_code(&o, 125, "unknown toolchain");
        assert!(stderr(&o).contains("ruby"), "{}", stderr(&o));
    }
}

#[test]
fn python_unittest_in_a_workspace_venv() {
    let real = ["/root/.pyenv/versions/3.11.7"]
        .iter()
        .map(PathBuf::from)
        .chain(
            std::env::var_os("PYENV_ROOT")
                .map(|r| PathBuf::from(r).join("versions"))
                .and_then(|v| {
                    std::fs::read_dir(v)
                        .ok()?
                        .filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .find(|p| p.join("bin/python3").exists())
                }),
        )
        .find(|p| p.join("bin/python3").exists());
    let Some(real) = real else {
        eprintln!("note: skipped: no pyenv-installed python on this machine");
        return;
    };
    for leg in legs() {
        let s = Scratch::new(leg);
        let py = s
            .home
            .join(".pyenv/versions")
            .join(real.file_name().expect("name"));
        link_tree(
            &s,
            &real,
            &py,
            &[
                "test",
                "site-packages",
                "idlelib",
                "tkinter",
                "ensurepip",
                "share",
                "include",
            ],
        );
        let o = as_leg(
            &s,
            &[
                path_str(&py.join("bin/python3")),
                "-m",
                "venv",
                "--without-pip",
                ".venv",
            ],
        );
        assert_code(&o, 0, &format!("{leg:?}: python -m venv"));
        write(
            &s,
            "test_tiny.py",
            &format!(
                "import sys, unittest\n\nclass T(unittest.TestCase):\n    def test_venv(self):\n        self.assertEqual(sys.prefix, {:?})\n        self.assertEqual(sys.base_prefix, {:?})\n",
                s.ws.join(".venv").display().to_string(),
                py.display().to_string()
            ),
        );
        let o = exec(&s, &[], &["python", "-m", "unittest", "-v"]);
        assert_code(&o, 0, &format!("{leg:?}: python -m unittest"));
        assert!(
            stderr(&o).contains("test_venv") && stderr(&o).contains("OK"),
            "{}",
            stderr(&o)
        );
    }
}

fn node_version() -> Option<String> {
    let o = Command::new("/usr/bin/node")
        .arg("--version")
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// A fake nvm: `$NVM_DIR/versions/node/vX/bin/node` -> /usr/bin/node.
fn fake_nvm(s: &Scratch, version: &str) -> PathBuf {
    let nvm = s.home.join(".nvm");
    let vdir = nvm.join("versions/node").join(version);
    mkdir(s, &vdir.join("bin"));
    symlink("/usr/bin/node", vdir.join("bin/node")).expect("link node");
    own(s, &vdir.join("bin/node"));
    // A decoy version that must not be chosen.
    mkdir(s, &nvm.join("versions/node/v0.1.0/bin"));
    vdir
}

#[test]
fn node_test_through_an_nvm_layout() {
    let Some(version) = node_version() else {
        eprintln!("note: skipped: no /usr/bin/node on this machine");
        return;
    };
    let major = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .unwrap_or("0")
        .to_string();
    for leg in legs() {
        let s = Scratch::new(leg);
        let vdir = fake_nvm(&s, &version);
        write(&s, ".nvmrc", &format!("{major}\n"));
        write(
            &s,
            "package.json",
            "{\"name\":\"tiny\",\"type\":\"module\"}\n",
        );
        write(
            &s,
            "tiny.test.js",
            "import test from 'node:test';\nimport assert from 'node:assert';\ntest('adds', () => assert.strictEqual(1 + 1, 2));\n",
        );
        let o = exec(&s, &[], &["sh", "-c", "command -v node && node --test"]);
        assert_code(&o, 0, &format!("{leg:?}: node --test"));
        let out = stdout(&o);
        assert!(
            out.starts_with(&format!("{}\n", vdir.join("bin/node").display())),
            "{out}"
        );
        assert!(out.contains("pass 1"), "{out}");
    }
}

#[test]
fn make_with_a_tool_from_local_bin() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let bin = s.home.join(".local/bin");
        for (name, text) in [
            ("greet", "#!/bin/sh\necho hello from greet\n"),
            ("unnamed-tool", "#!/bin/sh\necho no\n"),
        ] {
            put(&s, &bin.join(name), text);
            std::fs::set_permissions(
                bin.join(name),
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .expect("chmod");
        }
        // The tool the project does not name stays out.
        write(
            &s,
            "Makefile",
            "all:\n\tgreet\n\tls -A $$(dirname $$(command -v greet))\n",
        );
        let o = exec(&s, &[], &["make", "-s"]);
        assert_code(&o, 0, &format!("{leg:?}: make"));
        assert_eq!(stdout(&o), "hello from greet\ngreet\n", "{leg:?}");
    }
}

/// Directory entries of the never-bound list (the rest are files).
const DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".config/gcloud",
    ".config/gh",
    ".config/pip",
    ".pip",
];

/// A concrete name for a pattern (`*.pem` -> `canary.pem`).
fn instance(pat: &str) -> String {
    pat.replace('*', "canary")
}

#[test]
fn never_bound_entries_are_unreadable_and_explained() {
    let version = node_version().unwrap_or_else(|| "v20.0.0".into());
    for leg in legs() {
        let s = Scratch::new(leg);
        let vdir = fake_nvm(&s, &version);
        write(&s, ".nvmrc", &format!("{version}\n"));
        // Something beside the canaries that must stay readable.
        put(&s, &vdir.join("etc/visible.txt"), "VISIBLE\n");
        let mut planted: Vec<(PathBuf, String)> = Vec::new();
        for (i, secret) in SECRETS.iter().enumerate() {
            let (rel, base) = match secret.at {
                Where::Home(rel) => (rel.to_string(), s.home.clone()),
                Where::CargoHome(pat) => (instance(pat), s.home.join(".cargo")),
                // Inside the bound node version, two levels down.
                Where::Named(pat) => (instance(pat), vdir.join("etc")),
            };
            let p = base.join(&rel);
            let canary = format!("CANARY-{i}");
            let file = if DIRS.contains(&rel.as_str()) {
                p.join("secret")
            } else {
                p.clone()
            };
            put(&s, &file, &format!("{canary}\n"));
            planted.push((p, canary));
        }
        // Every planted path: read it (a file) or list and read inside it
        // (a directory). Nothing may come back but the visible file.
        let mut script = format!("cat {}/etc/visible.txt\n", vdir.display());
        for (p, _) in &planted {
            script.push_str(&format!(
                "cat '{0}' '{0}/secret' 2>/dev/null; ls -A '{0}' 2>/dev/null\n",
                p.display()
            ));
        }
        script.push_str("true\n");
        let o = exec(&s, &[], &["sh", "-c", &script]);
        assert_code(&o, 0, &format!("{leg:?}: reading the canaries"));
        let out = stdout(&o);
        assert!(
            out.starts_with("VISIBLE\n"),
            "{leg:?}: the bound dir is not visible:\n{out}"
        );
        for (p, canary) in &planted {
            assert!(
                !out.contains(&format!("{canary}\n")),
                "{leg:?}: {} readable:\n{out}",
                p.display()
            );
        }
        assert!(
            !out.contains("secret"),
            "{leg:?}: a hidden directory lists:\n{out}"
        );
        // explain names each one as hidden or excluded.
        let v = explain_json(&s);
        let listed: Vec<String> = ["hidden", "excluded"]
            .iter()
            .flat_map(|k| v["toolchain"][k].as_array().cloned().unwrap_or_default())
            .filter_map(|e| e["path"].as_str().map(str::to_string))
            .collect();
        for (p, _) in &planted {
            let real = std::fs::canonicalize(p).expect("canonical");
            assert!(
                listed
                    .iter()
                    .any(|l| Path::new(l) == p || Path::new(l) == real),
                "{leg:?}: explain does not list {}:\n{listed:#?}",
                p.display()
            );
        }
    }
}

#[test]
fn explain_names_binds_rules_environment_and_network() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let bin = s.home.join(".local/bin");
        put(&s, &bin.join("greet"), "#!/bin/sh\n");
        put(&s, &s.home.join(".ssh/id_rsa"), "CANARY\n");
        write(&s, "Makefile", "all:\n\tgreet\n");
        let o = retie(&s, &["sandbox", "explain", "-w", path_str(&s.ws)]);
        assert_code(&o, 0, "explain");
        let out = stdout(&o);
        for want in [
            "network     none".to_string(),
            "toolchain   auto: local-bin (greet named in the project)".to_string(),
            format!(
                "  {}\n      local-bin: `greet`, named by the project",
                bin.join("greet").display()
            ),
            format!("PATH={}:", bin.display()),
            format!(
                "excluded (never bound):\n  {}\n      ~/.ssh: SSH private keys",
                s.home.join(".ssh").display()
            ),
        ] {
            assert!(out.contains(&want), "{leg:?}: missing {want:?} in:\n{out}");
        }
    }
}

#[test]
fn a_hide_that_cannot_be_applied_fails_the_run() {
    let s = Scratch::new(Leg::Invoker);
    let spec = retie_runtime::Sandbox::builder(["true"])
        .workspace(&s.ws)
        .hide("/usr/retie-no-such-file", retie_runtime::HideKind::File)
        .build()
        .expect("spec");
    let err = retie_runtime::helper::run_via_helper(&bin(Leg::Invoker), &spec)
        .expect_err("a hide that cannot be applied must fail the run");
    assert!(err.to_string().contains("retie-no-such-file"), "{err}");
    // The wrong kind fails too: a directory where a file was expected.
    let spec = retie_runtime::Sandbox::builder(["true"])
        .workspace(&s.ws)
        .hide("/usr/bin", retie_runtime::HideKind::File)
        .build()
        .expect("spec");
    let err =
        retie_runtime::helper::run_via_helper(&bin(Leg::Invoker), &spec).expect_err("wrong kind");
    assert!(err.to_string().contains("expected a regular file"), "{err}");
}

/// Secrets in the home that no toolchain rule binds (issue 26): a cloud
/// sync config, an API key, and retie's own state.
fn home_canaries(s: &Scratch) -> Vec<PathBuf> {
    let h = &s.home;
    let files = vec![
        h.join(".config/rclone/rclone.conf"),
        h.join(".config/openai/api_key"),
        h.join(".local/state/retie/canary"),
    ];
    for (i, f) in files.iter().enumerate() {
        put(s, f, &format!("CANARY-home-{i}\n"));
    }
    mkdir(s, &h.join(".config/bin"));
    mkdir(s, &h.join(".local/bin"));
    files
}

fn cat_all(files: &[PathBuf]) -> String {
    let mut script = String::new();
    for f in files {
        script.push_str(&format!("cat '{}' 2>/dev/null\n", f.display()));
    }
    script.push_str("true\n");
    script
}

#[test]
fn a_planted_pyvenv_cfg_does_not_expose_the_home_next_run() {
    for leg in legs() {
        for target in [".config/bin", ".local/bin"] {
            let s = Scratch::new(leg);
            let files = home_canaries(&s);
            // Run 1: the command writes the venv's configuration.
            let plant = format!(
                "mkdir -p .venv && printf 'home = {}\\n' > .venv/pyvenv.cfg",
                s.home.join(target).display()
            );
            let o = exec(&s, &[], &["sh", "-c", &plant]);
            assert_code(&o, 0, &format!("{leg:?}: planting pyvenv.cfg"));
            assert!(s.ws.join(".venv/pyvenv.cfg").exists());
            // Run 2: the next command reads the home.
            let o = exec(&s, &[], &["sh", "-c", &cat_all(&files)]);
            assert_code(&o, 0, &format!("{leg:?}: the run after the plant"));
            assert!(
                !stdout(&o).contains("CANARY"),
                "{leg:?}: home = ~/{target} exposed the home:\n{}",
                stdout(&o)
            );
            assert!(
                stderr(&o).contains("pyvenv.cfg"),
                "{leg:?}: the refusal is not said:\n{}",
                stderr(&o)
            );
        }
    }
}

#[test]
fn go_mod_and_an_empty_path_entry_do_not_set_goroot() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let files = home_canaries(&s);
        // Run 1: `go` in the workspace leads two levels into the home, so
        // its grandparent is ~/.config.
        let plant = format!(
            "printf 'module x\\n' > go.mod && ln -s '{}' go",
            files[0].display()
        );
        let o = exec(&s, &[], &["sh", "-c", &plant]);
        assert_code(&o, 0, &format!("{leg:?}: planting go.mod and go"));
        // Run 2: the user's PATH has an empty entry (the current directory,
        // which is the workspace).
        for path in [":/usr/bin:/bin", "/usr/bin::/bin", ".:/usr/bin:/bin"] {
            let o = exec_with(
                &s,
                &[("PATH", path)],
                &[],
                &[
                    "sh",
                    "-c",
                    &format!("{}echo GOROOT=$GOROOT\n", cat_all(&files)),
                ],
            );
            assert_code(&o, 0, &format!("{leg:?}: PATH={path}"));
            let out = stdout(&o);
            assert!(
                !out.contains("CANARY"),
                "{leg:?}: PATH={path} exposed the home:\n{out}"
            );
            assert!(
                out.contains("GOROOT=\n"),
                "{leg:?}: PATH={path} set a GOROOT:\n{out}"
            );
        }
    }
}

#[test]
fn a_bind_holding_retie_state_is_refused() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let files = home_canaries(&s);
        write(&s, "go.mod", "module x\n");
        // The user's own GOROOT holds retie's state directory.
        let goroot = s.home.join(".local");
        let o = exec_with(
            &s,
            &[("GOROOT", path_str(&goroot))],
            &[],
            &[
                "sh",
                "-c",
                &format!(
                    "{}ls -A '{}' 2>&1; true\n",
                    cat_all(&files),
                    s.home.join(".local/state/retie").display()
                ),
            ],
        );
        assert_code(&o, 0, &format!("{leg:?}: GOROOT=~/.local"));
        let out = stdout(&o);
        assert!(
            !out.contains("CANARY") && !out.contains("canary"),
            "{leg:?}: retie's state is visible:\n{out}"
        );
        assert!(
            stderr(&o).contains("retie's own directory"),
            "{leg:?}: the refusal is not said:\n{}",
            stderr(&o)
        );
    }
}

#[test]
fn credential_stores_beside_toolchains_are_unreadable() {
    let version = node_version().unwrap_or_else(|| "v20.0.0".into());
    for leg in legs() {
        let s = Scratch::new(leg);
        let h = s.home.clone();
        let vdir = fake_nvm(&s, &version);
        write(&s, ".nvmrc", &format!("{version}\n"));
        write(&s, ".python-version", "3.11\n");
        write(&s, "Cargo.toml", "[package]\n");
        mkdir(&s, &h.join(".cargo/bin"));
        mkdir(&s, &h.join(".pyenv/versions/3.11/bin"));
        let planted = [
            (
                vdir.join("etc/npmrc"),
                "//registry.npmjs.org/:_authToken=CANARY-npmrc\n",
            ),
            (
                h.join(".pyenv/versions/3.11/pip.conf"),
                "[global]\nindex-url = https://u:CANARY-pip@pypi.example.test/simple\n",
            ),
            (
                h.join(".cargo/config.toml"),
                "[registries.corp]\nindex = \"sparse+https://u:CANARY-cargo@crates.example.test/\"\n",
            ),
            (
                h.join(".cargo/git/db/dep-0123/config"),
                "[remote \"origin\"]\n\turl = https://bob:CANARY-gitdb@git.example.test/dep.git\n",
            ),
            (
                vdir.join("lib/x/settings.toml"),
                "password = \"CANARY-deep\"\n",
            ),
        ];
        for (p, text) in &planted {
            put(&s, p, text);
        }
        put(&s, &vdir.join("etc/visible.txt"), "VISIBLE\n");
        let files: Vec<PathBuf> = planted.iter().map(|(p, _)| p.clone()).collect();
        let o = exec(
            &s,
            &[],
            &[
                "sh",
                "-c",
                &format!(
                    "cat '{}'\n{}",
                    vdir.join("etc/visible.txt").display(),
                    cat_all(&files)
                ),
            ],
        );
        assert_code(&o, 0, &format!("{leg:?}: reading the stores"));
        let out = stdout(&o);
        assert!(
            out.starts_with("VISIBLE\n"),
            "{leg:?}: nothing bound:\n{out}"
        );
        assert!(
            !out.contains("CANARY"),
            "{leg:?}: a store is readable:\n{out}"
        );
    }
}
