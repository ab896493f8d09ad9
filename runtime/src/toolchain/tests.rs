use std::os::unix::fs::symlink;

use super::*;

struct Lab {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    env: HostEnv,
}

fn lab() -> Lab {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    let ws = root.join("ws");
    let home = root.join("home");
    std::fs::create_dir_all(&ws).expect("mkdir");
    std::fs::create_dir_all(&home).expect("mkdir");
    Lab {
        _dir: dir,
        root,
        ws,
        env: HostEnv {
            home,
            ..HostEnv::default()
        },
    }
}

fn put(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

fn run(l: &Lab, sel: &Selection) -> Plan {
    let system = [PathBuf::from("/usr")];
    plan(
        sel,
        &Context {
            workspace: &l.ws,
            env: &l.env,
            fs: &RealFs,
            system: &system,
        },
    )
}

fn bound(p: &Plan) -> Vec<PathBuf> {
    p.binds.iter().map(|b| b.path.clone()).collect()
}

#[test]
fn selection_parses() {
    assert_eq!(Selection::parse::<&str>(&[]).expect("ok"), Selection::Auto);
    assert_eq!(Selection::parse(&["none"]).expect("ok"), Selection::None);
    assert_eq!(
        Selection::parse(&["rust,node", "rust"]).expect("ok"),
        Selection::Only(vec![Kind::Rust, Kind::Node])
    );
    let e = Selection::parse(&["ruby"]).expect_err("unknown");
    assert!(e.to_string().contains("ruby"), "{e}");
}

#[test]
fn rust_binds_bin_toolchains_and_cache_and_covers_credentials() {
    let l = lab();
    let h = &l.env.home;
    put(&l.ws.join("Cargo.toml"), "[package]\n");
    put(&h.join(".cargo/bin/cargo"), "");
    put(&h.join(".cargo/credentials.toml"), "token = \"x\"");
    put(&h.join(".cargo/bin/deploy.pem"), "key");
    put(&h.join(".cargo/registry/cache/x.crate"), "");
    put(&h.join(".rustup/toolchains/stable/bin/rustc"), "");
    put(&h.join(".rustup/settings.toml"), "");
    put(&h.join(".ssh/id_rsa"), "key");
    let p = run(&l, &Selection::Auto);
    assert_eq!(p.detected[0].kind, Kind::Rust);
    let b = bound(&p);
    for want in [
        ".cargo/bin",
        ".cargo/registry",
        ".rustup/toolchains",
        ".rustup/settings.toml",
    ] {
        assert!(b.contains(&h.join(want)), "{want} not in {b:?}");
    }
    assert!(p
        .binds
        .iter()
        .any(|b| b.cache && b.path.ends_with("registry")));
    let scratch: Vec<_> = p.scratch.iter().map(|s| s.path.clone()).collect();
    assert!(scratch.contains(&h.join(".cargo")));
    assert_eq!(p.env["CARGO_HOME"], h.join(".cargo").to_string_lossy());
    assert!(p.env["PATH"].starts_with(&format!("{}:", h.join(".cargo/bin").display())));
    // The planted key inside a bound dir is covered; credentials and ~/.ssh
    // are outside every bind and listed as excluded.
    assert!(p
        .hidden
        .iter()
        .any(|x| x.path == h.join(".cargo/bin/deploy.pem") && x.kind == HideKind::File));
    for out in [".cargo/credentials.toml", ".ssh"] {
        assert!(
            p.excluded.iter().any(|e| e.path == h.join(out)),
            "{out}: {:?}",
            p.excluded
        );
    }
}

#[test]
fn none_binds_nothing() {
    let l = lab();
    put(&l.ws.join("Cargo.toml"), "");
    put(&l.env.home.join(".cargo/bin/cargo"), "");
    let p = run(&l, &Selection::None);
    assert!(p.binds.is_empty() && p.scratch.is_empty() && p.env.is_empty());
}

#[test]
fn the_home_itself_is_never_bound() {
    let mut l = lab();
    put(&l.ws.join("go.mod"), "");
    put(&l.env.home.join(".ssh/id_rsa"), "key");
    l.env
        .vars
        .insert("GOROOT".into(), l.env.home.clone().into());
    let p = run(&l, &Selection::Auto);
    assert!(
        !bound(&p).iter().any(|b| l.env.home.starts_with(b)),
        "{:?}",
        p.binds
    );
    assert!(
        p.excluded.iter().any(|e| e.reason.contains("home")),
        "{:?}",
        p.excluded
    );
}

#[test]
fn secrets_inside_a_bound_dir_are_covered_by_name() {
    let mut l = lab();
    let gopath = l.root.join("gopath");
    put(&l.ws.join("go.mod"), "");
    for f in [
        ".ssh/id_ed25519",
        ".aws/credentials",
        ".config/gh/hosts.yml",
        ".docker/config.json",
        "bin/tool",
        "bin/.netrc",
        "bin/api_token",
        "bin/id_map.rs",
    ] {
        put(&gopath.join(f), "x");
    }
    l.env.vars.insert("GOPATH".into(), gopath.clone().into());
    let p = run(&l, &Selection::Only(vec![Kind::Go]));
    let hidden: Vec<_> = p.hidden.iter().map(|h| h.path.clone()).collect();
    // GOPATH itself is scratch; its bin is bound and scanned.
    assert!(hidden.contains(&gopath.join("bin/.netrc")), "{hidden:?}");
    assert!(hidden.contains(&gopath.join("bin/api_token")), "{hidden:?}");
    assert!(!hidden.contains(&gopath.join("bin/id_map.rs")));
}

#[test]
fn python_venv_binds_its_interpreter() {
    let l = lab();
    let py = l.env.home.join(".pyenv/versions/3.11");
    put(&py.join("bin/python3"), "");
    put(
        &l.ws.join(".venv/pyvenv.cfg"),
        &format!("home = {}\n", py.join("bin").display()),
    );
    let p = run(&l, &Selection::Auto);
    assert!(bound(&p).contains(&py), "{:?}", p.binds);
    assert_eq!(p.env["VIRTUAL_ENV"], l.ws.join(".venv").to_string_lossy());
    assert!(p.env["PATH"].starts_with(&l.ws.join(".venv/bin").to_string_lossy().into_owned()));
}

#[test]
fn nvm_picks_the_wanted_version_and_follows_its_link() {
    let mut l = lab();
    let nvm = l.root.join("nvm");
    put(&l.ws.join(".nvmrc"), "v18\n");
    put(&nvm.join("versions/node/v18.2.0/bin/x"), "");
    put(&nvm.join("versions/node/v20.1.0/bin/x"), "");
    // The link leads into another toolchain root (volta's images): bound.
    let real = l.env.home.join(".volta/tools/image/node/18.2.0");
    put(&real.join("bin/node"), "");
    symlink(
        real.join("bin/node"),
        nvm.join("versions/node/v18.2.0/bin/node"),
    )
    .expect("link");
    l.env.vars.insert("NVM_DIR".into(), nvm.clone().into());
    let p = run(&l, &Selection::Auto);
    let b = bound(&p);
    assert!(b.contains(&nvm.join("versions/node/v18.2.0")), "{b:?}");
    assert!(b.contains(&real), "{b:?}");
    assert!(!b.contains(&nvm.join("versions/node/v20.1.0")));
}

#[test]
fn a_link_leading_outside_every_toolchain_root_is_not_followed() {
    let mut l = lab();
    let nvm = l.root.join("nvm");
    put(&l.ws.join(".nvmrc"), "18\n");
    put(&nvm.join("versions/node/v18.2.0/bin/x"), "");
    let elsewhere = l.env.home.join("src/node18");
    put(&elsewhere.join("bin/node"), "");
    put(&elsewhere.join("notes.txt"), "CANARY");
    symlink(
        elsewhere.join("bin/node"),
        nvm.join("versions/node/v18.2.0/bin/node"),
    )
    .expect("link");
    l.env.vars.insert("NVM_DIR".into(), nvm.clone().into());
    // ~/.local/bin tools: one a link out of every root, one into cargo's.
    let bin = l.env.home.join(".local/bin");
    put(&l.env.home.join(".cargo/bin/fmt-tool"), "#!/bin/sh\n");
    std::fs::create_dir_all(&bin).expect("mkdir");
    symlink(elsewhere.join("bin/node"), bin.join("lint-tool")).expect("link");
    symlink(l.env.home.join(".cargo/bin/fmt-tool"), bin.join("fmt-tool")).expect("link");
    put(&l.ws.join("Makefile"), "all:\n\tlint-tool\n\tfmt-tool\n");
    let p = run(&l, &Selection::Only(vec![Kind::Node, Kind::LocalBin]));
    let b = bound(&p);
    assert!(b.contains(&nvm.join("versions/node/v18.2.0")), "{b:?}");
    assert!(b.contains(&bin.join("fmt-tool")), "{b:?}");
    assert!(
        !b.iter()
            .chain(p.binds.iter().map(|x| &x.source))
            .any(|x| x.starts_with(&elsewhere)),
        "{:?}",
        p.binds
    );
    assert!(!b.contains(&bin.join("lint-tool")), "{b:?}");
    assert!(
        p.excluded
            .iter()
            .any(|e| e.path.starts_with(&elsewhere) && e.reason.contains("outside every known")),
        "{:?}",
        p.excluded
    );
}

#[test]
fn local_bin_binds_only_named_tools() {
    let l = lab();
    let bin = l.env.home.join(".local/bin");
    put(&bin.join("fmt-tool"), "#!/bin/sh\n");
    put(&bin.join("other"), "#!/bin/sh\n");
    put(&l.ws.join("Makefile"), "all:\n\tfmt-tool --check\n");
    let p = run(&l, &Selection::Auto);
    let b = bound(&p);
    assert!(b.contains(&bin.join("fmt-tool")), "{b:?}");
    assert!(!b.contains(&bin.join("other")));
    assert!(p.env["PATH"].starts_with(&bin.to_string_lossy().into_owned()));
}

#[test]
fn a_cargo_config_with_a_token_is_not_bound() {
    let l = lab();
    put(&l.ws.join("Cargo.toml"), "");
    put(&l.env.home.join(".cargo/bin/cargo"), "");
    put(
        &l.env.home.join(".cargo/config.toml"),
        "[registry]\ntoken = \"x\"\n",
    );
    let p = run(&l, &Selection::Auto);
    assert!(!bound(&p).iter().any(|b| b.ends_with("config.toml")));
    assert!(p.excluded.iter().any(|e| e.path.ends_with("config.toml")));
}

#[test]
fn a_toolchain_inside_a_never_bound_entry_is_refused() {
    let mut l = lab();
    let nvm = l.env.home.join(".config/gh/nvm");
    put(&l.ws.join(".nvmrc"), "20\n");
    put(&nvm.join("versions/node/v20.1.0/bin/node"), "");
    l.env.vars.insert("NVM_DIR".into(), nvm.clone().into());
    let p = run(&l, &Selection::Auto);
    assert!(p.binds.is_empty(), "{:?}", p.binds);
    assert!(
        p.excluded.iter().any(|e| e.reason.contains("~/.config/gh")),
        "{:?}",
        p.excluded
    );
    let mut l = lab();
    let nvm = l.root.join("keys.pem/nvm");
    put(&l.ws.join("package.json"), "{}");
    put(&nvm.join("versions/node/v20.1.0/bin/node"), "");
    l.env.vars.insert("NVM_DIR".into(), nvm.into());
    let p = run(&l, &Selection::Auto);
    assert!(p.binds.is_empty(), "{:?}", p.binds);
}

#[test]
fn an_nvmrc_naming_no_installed_version_falls_back_with_a_note() {
    let mut l = lab();
    let nvm = l.root.join("nvm");
    put(&l.ws.join(".nvmrc"), "lts/*\n");
    put(&nvm.join("versions/node/v18.2.0/bin/node"), "");
    put(&nvm.join("versions/node/v20.1.0/bin/node"), "");
    put(&nvm.join("alias/default"), "18\n");
    l.env.vars.insert("NVM_DIR".into(), nvm.clone().into());
    let p = run(&l, &Selection::Auto);
    assert_eq!(bound(&p), vec![nvm.join("versions/node/v18.2.0")]);
    assert!(p.notes.iter().any(|n| n.contains("lts/*")), "{:?}", p.notes);
}

#[test]
fn a_secret_link_is_covered_at_its_target_or_reported_dangling() {
    let mut l = lab();
    let gopath = l.root.join("gopath");
    put(&l.ws.join("go.mod"), "");
    put(&gopath.join("bin/keys/real-key"), "k");
    put(&l.root.join("outside/key"), "k");
    symlink(gopath.join("bin/keys/real-key"), gopath.join("bin/id_rsa")).expect("link");
    symlink(l.root.join("outside/key"), gopath.join("bin/deploy.pem")).expect("link");
    l.env.vars.insert("GOPATH".into(), gopath.clone().into());
    let p = run(&l, &Selection::Only(vec![Kind::Go]));
    assert!(
        p.hidden
            .iter()
            .any(|h| h.path == gopath.join("bin/keys/real-key")),
        "{:?}",
        p.hidden
    );
    assert!(
        p.excluded
            .iter()
            .any(|e| e.path == gopath.join("bin/deploy.pem") && e.reason.contains("dangles")),
        "{:?}",
        p.excluded
    );
}

#[test]
fn go_binds_goroot_from_path_and_the_module_cache() {
    let mut l = lab();
    let goroot = l.root.join("sdk/go");
    put(&goroot.join("bin/go"), "");
    std::fs::create_dir_all(goroot.join("pkg/tool")).expect("mkdir");
    let gopath = l.env.home.join("go");
    put(&gopath.join("pkg/mod/cache/x"), "");
    put(&gopath.join("bin/gopls"), "");
    put(&l.ws.join("go.mod"), "module x\n");
    l.env.vars.insert(
        "PATH".into(),
        format!("/nonexistent:{}", goroot.join("bin").display()).into(),
    );
    let p = run(&l, &Selection::Auto);
    let b = bound(&p);
    assert!(b.contains(&goroot), "{b:?}");
    assert!(b.contains(&gopath.join("bin")), "{b:?}");
    assert!(p
        .binds
        .iter()
        .any(|x| x.cache && x.path == gopath.join("pkg/mod")));
    assert!(p.scratch.iter().any(|s| s.path == gopath));
    assert_eq!(p.env["GOPROXY"], "off");
    assert_eq!(p.env["GOROOT"], goroot.to_string_lossy());
}

#[test]
fn a_pipx_tool_brings_its_venv_and_interpreter() {
    let l = lab();
    let py = l.env.home.join(".pyenv/versions/3.12");
    put(&py.join("bin/python3"), "");
    let venv = l.env.home.join(".local/share/pipx/venvs/black");
    put(
        &venv.join("pyvenv.cfg"),
        &format!("home = {}\n", py.join("bin").display()),
    );
    put(&venv.join("bin/black"), "#!/usr/bin/env python3\n");
    let bin = l.env.home.join(".local/bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    symlink(venv.join("bin/black"), bin.join("black")).expect("link");
    put(&l.ws.join("Makefile"), "fmt:\n\tblack .\n");
    let p = run(&l, &Selection::Only(vec![Kind::LocalBin]));
    let tool = p
        .binds
        .iter()
        .find(|b| b.path == bin.join("black"))
        .expect("the tool is bound at its name");
    assert_eq!(tool.source, venv.join("bin/black"));
    let b = bound(&p);
    assert!(b.contains(&venv) && b.contains(&py), "{b:?}");
}

/// The home of issue 26's attack: secrets a planted file must not reach.
fn canaries(l: &Lab) {
    let h = &l.env.home;
    put(&h.join(".config/rclone/rclone.conf"), "CANARY");
    put(&h.join(".config/openai/api_key"), "CANARY");
    put(&h.join(".config/bin/x"), "");
    put(&h.join(".local/state/retie/ledger.db"), "CANARY");
    put(&h.join(".local/bin/tool"), "");
    put(&h.join(".cargo/bin/cargo"), "");
    put(&h.join(".pyenv/versions/3.11/bin/python3"), "");
}

/// Nothing bound holds `p`.
fn unreachable(p: &Plan, path: &Path) -> bool {
    !p.binds.iter().any(|b| path.starts_with(&b.path))
}

#[test]
fn a_planted_pyvenv_cfg_selects_no_directory_of_the_home() {
    let l = lab();
    canaries(&l);
    let h = l.env.home.clone();
    for home in [
        h.join(".config/bin"),
        h.join(".local/bin"),
        // A toolchain root, but not a python one.
        h.join(".cargo/bin"),
        // A python root itself (not one install inside it), and a way out.
        h.join(".pyenv/versions"),
        h.join(".pyenv/versions/3.11/../../../.config/bin"),
    ] {
        put(
            &l.ws.join(".venv/pyvenv.cfg"),
            &format!("home = {}\n", home.display()),
        );
        let p = run(&l, &Selection::Auto);
        for secret in [
            ".config/rclone/rclone.conf",
            ".config/openai/api_key",
            ".local/state/retie/ledger.db",
            ".cargo/bin/cargo",
        ] {
            assert!(
                unreachable(&p, &h.join(secret)),
                "home = {}: {secret} bound: {:?}",
                home.display(),
                p.binds
            );
        }
        assert!(
            p.binds.is_empty(),
            "home = {}: {:?}",
            home.display(),
            p.binds
        );
        assert!(
            p.warnings.iter().any(|w| w.contains("pyvenv.cfg")),
            "home = {}: no warning: {:?}",
            home.display(),
            p.warnings
        );
    }
    // One install of pyenv: bound, and only that one.
    put(
        &l.ws.join(".venv/pyvenv.cfg"),
        &format!("home = {}\n", h.join(".pyenv/versions/3.11/bin").display()),
    );
    let p = run(&l, &Selection::Auto);
    assert_eq!(bound(&p), vec![h.join(".pyenv/versions/3.11")]);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn an_empty_or_workspace_path_entry_never_names_goroot() {
    let mut l = lab();
    canaries(&l);
    let h = l.env.home.clone();
    put(&l.ws.join("go.mod"), "module x\n");
    // `go` in the workspace, a link to a file two levels under the home:
    // its grandparent would be ~/.config.
    symlink(h.join(".config/rclone/rclone.conf"), l.ws.join("go")).expect("link");
    put(&l.ws.join("bin/go"), "");
    std::fs::create_dir_all(l.ws.join("pkg/tool")).expect("mkdir");
    // A plain `go` in ~/.local/bin would make ~/.local a GOROOT.
    put(&h.join(".local/bin/go"), "");
    for path in [
        String::new(),
        ":/usr/bin".into(),
        "/usr/bin::/bin".into(),
        ".".into(),
        "bin".into(),
        format!("{}", l.ws.join("bin").display()),
        format!("{}", h.join(".local/bin").display()),
    ] {
        l.env.vars.insert("PATH".into(), path.clone().into());
        // The process's own directory is the workspace, as when `retie`
        // is started there.
        let p = {
            let _cwd = Cwd::enter(&l.ws);
            run(&l, &Selection::Only(vec![Kind::Go]))
        };
        assert!(!p.env.contains_key("GOROOT"), "PATH={path:?}: {:?}", p.env);
        for secret in [".config/rclone/rclone.conf", ".local/state/retie/ledger.db"] {
            assert!(
                unreachable(&p, &h.join(secret)),
                "PATH={path:?}: {secret} bound: {:?}",
                p.binds
            );
        }
    }
}

/// Change the process's directory for a while (tests in this module that
/// use it hold the lock: the directory is process-wide).
struct Cwd(
    PathBuf,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

static CWD: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Cwd {
    fn enter(p: &Path) -> Cwd {
        let guard = CWD.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::env::current_dir().expect("cwd");
        std::env::set_current_dir(p).expect("chdir");
        Cwd(old, guard)
    }
}

impl Drop for Cwd {
    fn drop(&mut self) {
        let _ = std::env::set_current_dir(&self.0);
    }
}

#[test]
fn a_bind_holding_or_inside_a_protected_directory_is_refused() {
    let mut l = lab();
    canaries(&l);
    let h = l.env.home.clone();
    l.env.protected = vec![h.join(".local/state/retie")];
    put(&l.ws.join("go.mod"), "module x\n");
    // The user's own GOROOT, set to a directory holding retie's state.
    l.env
        .vars
        .insert("GOROOT".into(), h.join(".local").into_os_string());
    let p = run(&l, &Selection::Only(vec![Kind::Go]));
    assert!(
        unreachable(&p, &h.join(".local/state/retie/ledger.db")),
        "{:?}",
        p.binds
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("retie's own directory")),
        "{:?}",
        p.warnings
    );
    // And one inside it.
    let mut l2 = lab();
    let nvm = l2.env.home.join(".local/state/retie/nvm");
    put(&nvm.join("versions/node/v20.1.0/bin/node"), "");
    put(&l2.ws.join(".nvmrc"), "20\n");
    l2.env.protected = vec![l2.env.home.join(".local/state/retie")];
    l2.env.vars.insert("NVM_DIR".into(), nvm.into());
    let p = run(&l2, &Selection::Auto);
    assert!(p.binds.is_empty(), "{:?}", p.binds);
    assert!(!p.warnings.is_empty());
}

fn hidden(p: &Plan) -> Vec<PathBuf> {
    p.hidden.iter().map(|h| h.path.clone()).collect()
}

#[test]
fn credential_stores_the_name_list_missed_are_covered() {
    let mut l = lab();
    let h = l.env.home.clone();
    // nvm: the version's global npmrc (no leading dot).
    let nvm = h.join(".nvm");
    let v = nvm.join("versions/node/v20.1.0");
    put(&v.join("bin/node"), "");
    put(
        &v.join("etc/npmrc"),
        "//registry.npmjs.org/:_authToken=npm_CANARY\n",
    );
    put(&l.ws.join(".nvmrc"), "20\n");
    // pyenv: a version's pip.conf.
    let pyenv = h.join(".pyenv");
    put(&pyenv.join("versions/3.11/bin/python3"), "");
    put(
        &pyenv.join("versions/3.11/pip.conf"),
        "[global]\nindex-url = https://u:CANARY@pypi.example.test/simple\n",
    );
    put(&l.ws.join(".python-version"), "3.11\n");
    // cargo: a registry URL with a password, and a git dependency's db.
    put(&l.ws.join("Cargo.toml"), "");
    put(&h.join(".cargo/bin/cargo"), "");
    put(
        &h.join(".cargo/config.toml"),
        "[registries.corp]\nindex = \"sparse+https://u:CANARY@crates.example.test/\"\n",
    );
    let db = h.join(".cargo/git/db/dep-0123");
    put(
        &db.join("config"),
        "[remote \"origin\"]\n\turl = https://bob:CANARY@git.example.test/dep.git\n",
    );
    let clean = h.join(".cargo/git/db/clean-4567/config");
    put(
        &clean,
        "[remote \"origin\"]\n\turl = https://git.example.test/clean.git\n",
    );
    // A configuration file deeper in a bind, with and without a password.
    put(&v.join("lib/x/settings.toml"), "password = \"hunter22\"\n");
    put(&v.join("lib/y/settings.toml"), "jobs = 4\n");
    l.env.vars.insert("NVM_DIR".into(), nvm.into());
    let p = run(&l, &Selection::Auto);
    let hid = hidden(&p);
    for want in [
        v.join("etc/npmrc"),
        pyenv.join("versions/3.11/pip.conf"),
        db.join("config"),
        v.join("lib/x/settings.toml"),
    ] {
        assert!(
            hid.contains(&want),
            "{} not hidden: {hid:#?}",
            want.display()
        );
    }
    assert!(!hid.contains(&clean) && !hid.contains(&v.join("lib/y/settings.toml")));
    assert!(
        !bound(&p).contains(&h.join(".cargo/config.toml")),
        "{:?}",
        p.binds
    );
    assert!(
        p.excluded
            .iter()
            .any(|e| e.path == h.join(".cargo/config.toml") && e.reason.contains("password")),
        "{:?}",
        p.excluded
    );
}
