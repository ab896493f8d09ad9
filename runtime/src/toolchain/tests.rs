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
    let py = l.root.join("pyroot/3.11");
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
    let real = l.root.join("elsewhere/node18");
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
    let py = l.root.join("py/3.12");
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
