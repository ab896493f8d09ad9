//! Issue 33, "install like the tools people use": the man pages and the
//! shell completions `scripts/release.sh` packs are generated from the one
//! clap definition (`retie __generate`). The release script itself is not
//! run here (a release build takes minutes).

use std::process::Command;

use crate::harness::*;

/// The subcommands `retie --help` lists (but `help`).
fn subcommands(args: &[&str]) -> Vec<String> {
    let o = Command::new(bin(Leg::Invoker))
        .args(args)
        .arg("--help")
        .output()
        .expect("retie --help");
    assert_code(&o, 0, "--help");
    stdout(&o)
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn generated_man_pages_name_every_subcommand_and_completions_parse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let man = dir.path().join("man1");
    let comp = dir.path().join("completions");
    let o = Command::new(bin(Leg::Invoker))
        .args(["__generate", "man"])
        .arg(&man)
        .output()
        .expect("generate man");
    assert_code(&o, 0, "__generate man");
    let page = std::fs::read_to_string(man.join("retie.1")).expect("retie.1");
    let top = subcommands(&[]);
    assert!(
        top.len() >= 20 && top.iter().any(|c| c == "sandbox") && top.iter().any(|c| c == "run"),
        "{top:?}"
    );
    let pages: Vec<String> = std::fs::read_dir(&man)
        .expect("man dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    for c in &top {
        // roff escapes the dash: `retie\-sandbox(1)`.
        let named = format!("retie\\-{}(1)", c.replace('-', "\\-"));
        assert!(
            page.contains(&named),
            "retie.1 does not name `{c}`:\n{page}"
        );
        assert!(
            pages.contains(&format!("retie-{c}.1")),
            "no page for `{c}`: {pages:?}"
        );
    }
    // The nested ones too (sandbox exec, changes apply, ...).
    for parent in ["sandbox", "changes", "policy", "lab"] {
        for c in subcommands(&[parent]) {
            assert!(
                pages.contains(&format!("retie-{parent}-{c}.1")),
                "no page for `{parent} {c}`: {pages:?}"
            );
        }
    }
    // No page for clap's generated `help` subcommands or an internal one.
    assert!(
        !pages
            .iter()
            .any(|p| p.contains("-help") || p.contains("__")),
        "{pages:?}"
    );
    assert!(
        page.contains(".SH SUBCOMMANDS") && !page.contains("__probe"),
        "{page}"
    );
    if let Ok(o) = Command::new("man")
        .arg("-l")
        .arg(man.join("retie-sandbox-exec.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        assert_code(&o, 0, "man -l retie-sandbox-exec.1");
        assert!(stdout(&o).contains("--workspace-mode"), "{}", stdout(&o));
    }

    for (shell, file) in [
        ("bash", "retie.bash"),
        ("zsh", "_retie"),
        ("fish", "retie.fish"),
    ] {
        let o = Command::new(bin(Leg::Invoker))
            .args(["__generate", "completions", shell])
            .arg(&comp)
            .output()
            .expect("generate completions");
        assert_code(&o, 0, &format!("__generate completions {shell}"));
        let text = std::fs::read_to_string(comp.join(file)).expect("completion file");
        assert!(
            // The hidden `__probe` is never offered as a word (bash names
            // the function of the user-facing `probe` `retie__probe`).
            text.contains("sandbox")
                && text.contains("selftest")
                && !text
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                    .any(|w| w == "__probe"),
            "{shell}: {file}"
        );
        // The shell's own syntax check, where the shell is installed.
        let check = Command::new(shell).arg("-n").arg(comp.join(file)).output();
        match check {
            Ok(o) => assert_code(&o, 0, &format!("{shell} -n {file}: {}", stderr(&o))),
            Err(_) if shell != "bash" => {
                eprintln!("note: {shell} not installed; {file} not parsed")
            }
            Err(e) => panic!("bash: {e}"),
        }
    }
    // And bash completes with it: `retie sa<TAB>` and `retie sandbox exec --work<TAB>`.
    let script = format!(
        r#"source {}
COMP_WORDS=(retie sa); COMP_CWORD=1; COMP_LINE="retie sa"; COMP_POINT=8
_retie retie sa retie; echo "top: ${{COMPREPLY[*]}}"
COMP_WORDS=(retie sandbox exec --work); COMP_CWORD=3; COMP_LINE="retie sandbox exec --work"; COMP_POINT=25
_retie retie --work exec; echo "exec: ${{COMPREPLY[*]}}"
COMP_WORDS=(retie __); COMP_CWORD=1; COMP_LINE="retie __"; COMP_POINT=8
_retie retie __ retie; echo "hidden: ${{COMPREPLY[*]}}"
"#,
        comp.join("retie.bash").display()
    );
    let o = Command::new("bash")
        .args(["--norc", "-c", &script])
        .output()
        .expect("bash");
    assert_code(&o, 0, &format!("bash completion: {}", stderr(&o)));
    let out = stdout(&o);
    assert!(out.contains("top: sandbox"), "{out}");
    assert!(out.contains("--workspace"), "{out}");
    assert!(
        out.contains("hidden: \n") || out.ends_with("hidden: \n"),
        "{out}"
    );
}

/// `cargo install --path .` installs every binary target of the root
/// package: retie, retie-agent and the small sandbox helper must all be
/// among them, so the helper lands beside retie, where
/// `retie_runtime::helper::beside` finds it (ADR 0527). Read from `cargo
/// metadata` (the install itself is CI's fresh-clone step, `.ci/run`).
/// Failed while the helper was a binary of retie-runtime.
#[test]
fn cargo_install_of_the_root_package_installs_the_helper_too() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let o = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .args(["--manifest-path", manifest])
        .output()
        .expect("cargo metadata");
    assert_code(&o, 0, "cargo metadata");
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let root = m["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "retie")
        .expect("the retie package");
    let mut bins: Vec<&str> = root["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|t| t["name"].as_str())
        .collect();
    bins.sort();
    assert_eq!(
        bins,
        ["retie", "retie-agent", "retie-sandbox-helper"],
        "the binaries `cargo install --path .` installs"
    );
    assert_eq!(
        std::path::Path::new(env!("CARGO_BIN_EXE_retie-sandbox-helper")).parent(),
        std::path::Path::new(env!("CARGO_BIN_EXE_retie")).parent(),
        "built beside retie"
    );
}
