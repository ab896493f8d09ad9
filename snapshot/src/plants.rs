//! Code-running plants: paths that something outside the sandbox runs later
//! (git, a shell, an editor, direnv, the login session), so a sandboxed
//! command must not be able to plant them through an applied changeset.
//!
//! The list is data: [`PLANTS`], one entry per plant with its patterns and
//! the reason (what would run it). [`NOT_PLANTS`] records the candidates that
//! were considered and deliberately left applicable, with why. A change
//! matching an entry is reported as [`crate::BlockReason::Plant`] with the
//! entry's name and is applied only with `allow_blocked`.
//!
//! Matching rules (ADR 0203):
//! - paths are [`RelPath`]s (normalized, no `.`/`..`) and components are
//!   compared exactly, byte for byte, as a case-sensitive filesystem does;
//! - in a pattern, `*` is exactly one component and `**` zero or more;
//!   project patterns start with `**/` (a nested repository or a
//!   subdirectory opened in an editor is as dangerous as the root), home
//!   patterns are anchored at the workspace root;
//! - a deletion (no new state) is never a plant: removing a file cannot make
//!   anything run;
//! - a symlink whose path leads into a pattern (it matched at least one of
//!   the pattern's literal components and the pattern goes on, e.g. a
//!   `.vscode` or `.git/hooks` symlink) is a plant of that entry: following
//!   it would reach files the table blocks by name;
//! - every changed path is matched on its own, so a plant created inside a
//!   new directory (a new `.git`, a `.vscode` made by `mkdir` + `mv`) is
//!   caught like one written into an existing directory.

use crate::node::Node;
use crate::relpath::RelPath;

/// What a [`Plant`] entry matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The path matches one of the patterns.
    Path(&'static [&'static str]),
    /// The path matches one of the patterns and its new state is not a
    /// directory (a file or a symlink).
    NotDir(&'static [&'static str]),
    /// The path, relative to a directory that holds a `HEAD` (in the real
    /// workspace, or created by the changeset), matches one of the patterns:
    /// a git directory planted anywhere.
    InGitDir(&'static [&'static str]),
    /// A `HEAD` file the changeset creates (none in the real workspace, or
    /// a directory there) in a
    /// directory that holds one of these (in the real workspace, or created
    /// by the changeset): the last piece of a git directory planted over
    /// several runs, its config or hooks first.
    HeadBeside(&'static [&'static str]),
    /// The path is, or lies beneath, a path the real repository's
    /// `.git/config` names for this key (`core.hooksPath`, `include.path`):
    /// what git runs or reads as config, wherever the config points.
    NamedByGitConfig(&'static str),
    /// The new state is a file or directory with the setuid or setgid bit.
    SetId,
}

impl Rule {
    /// The patterns (none for [`Rule::SetId`]).
    pub fn patterns(&self) -> &'static [&'static str] {
        match self {
            Rule::Path(p) | Rule::NotDir(p) | Rule::InGitDir(p) | Rule::HeadBeside(p) => p,
            Rule::SetId | Rule::NamedByGitConfig(_) => &[],
        }
    }
}

/// Where an entry applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every workspace.
    Always,
    /// Only when the workspace is a home directory
    /// ([`crate::ComputeOptions::home_workspace`]), or beneath the home
    /// directory a workspace holds ([`crate::ComputeOptions::home_dir`]),
    /// relative to it.
    Home,
}

/// One code-running plant.
#[derive(Debug)]
pub struct Plant {
    /// Stable name, reported in [`crate::BlockReason::Plant`].
    pub name: &'static str,
    /// Where it applies.
    pub scope: Scope,
    /// What it matches.
    pub rule: Rule,
    /// What would later run it outside the sandbox.
    pub reason: &'static str,
}

/// The code-running plants. Order matters only for which name is reported
/// when two entries match the same path (the first wins).
pub static PLANTS: &[Plant] = &[
    Plant {
        name: "git_hooks",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.git/hooks/**"]),
        reason: "git runs hooks on commit, checkout, merge, rebase and push in the real \
                 repository; a hook made executable (mode change) is activated too",
    },
    Plant {
        name: "git_hooks_path",
        scope: Scope::Always,
        rule: Rule::NamedByGitConfig("core.hooksPath"),
        reason: "the repository's config moved its hooks (core.hooksPath, as husky does) into \
                 the workspace: git runs what is there on commit, checkout, merge and push",
    },
    Plant {
        name: "git_config_include",
        scope: Scope::Always,
        rule: Rule::NamedByGitConfig("include.path"),
        reason: "the repository's config includes this file (include.path, includeIf): it is \
                 git config, with core.fsmonitor, core.hooksPath and aliases that run commands",
    },
    Plant {
        name: "git_sequencer",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/.git/rebase-merge/**",
            "**/.git/rebase-apply/**",
            "**/.git/sequencer/**",
        ]),
        reason: "a rebase, cherry-pick or revert in progress: its todo list runs `exec` lines \
                 as shell commands at the next `git rebase --continue` (or cherry-pick/revert \
                 --continue) on the host",
    },
    Plant {
        name: "git_config",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/.git/config",
            "**/.git/config.worktree",
            "**/.git/commondir",
        ]),
        reason: "config names commands git runs later: core.fsmonitor (on every status), \
                 core.hooksPath, core.sshCommand, core.pager, aliases, filter and diff drivers; \
                 commondir points git at another directory's config and hooks",
    },
    Plant {
        name: "git_submodule_dir",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/.git/modules/**/hooks/**",
            "**/.git/modules/**/config",
            "**/.git/modules/**/config.worktree",
            "**/.git/modules/**/commondir",
        ]),
        reason: "a submodule's git dir: git runs its hooks and config (core.fsmonitor...) in \
                 the submodule's checkout, and `git status` in the superproject recurses into it",
    },
    Plant {
        name: "git_worktree_dir",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/.git/worktrees/*/config",
            "**/.git/worktrees/*/config.worktree",
            "**/.git/worktrees/*/commondir",
        ]),
        reason: "a linked worktree's git dir: config.worktree (extensions.worktreeConfig) is \
                 read by every git command in that worktree, commondir redirects its config and \
                 hooks",
    },
    Plant {
        name: "git_file",
        scope: Scope::Always,
        rule: Rule::NotDir(&["**/.git"]),
        reason: "a `.git` file (`gitdir: <path>`) or symlink sends git to another git dir, \
                 whose config and hooks then run in this checkout",
    },
    Plant {
        name: "git_dir_anywhere",
        scope: Scope::Always,
        rule: Rule::InGitDir(&["config", "config.worktree", "commondir", "hooks/**"]),
        reason: "a directory holding HEAD is a git dir wherever it is (a planted bare \
                 repository: git accepts bare repositories by default, safe.bareRepository=all); \
                 its config (core.fsmonitor, core.hooksPath) and hooks run as soon as git is used \
                 in it or with --git-dir",
    },
    Plant {
        name: "git_dir_completed",
        scope: Scope::Always,
        rule: Rule::HeadBeside(&["config", "config.worktree", "commondir", "hooks"]),
        reason: "a HEAD added beside a config, commondir or hooks that are already there (put \
                 there by an earlier run, when no HEAD made them part of a git dir) turns that \
                 directory into a git dir, and its config and hooks run as soon as git is used \
                 in it",
    },
    Plant {
        name: "hg_config",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.hg/hgrc"]),
        reason: "Mercurial runs the [hooks] and extensions of a repository's .hg/hgrc on hg \
                 commands",
    },
    Plant {
        name: "direnv_envrc",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.envrc"]),
        reason: "direnv runs .envrc (a shell script) on entering the directory; it asks for \
                 `direnv allow` first, but that is one command people type without reading, and \
                 a whitelist in direnv.toml skips the question",
    },
    Plant {
        name: "mise_config",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/mise.toml",
            "**/.mise.toml",
            "**/mise.local.toml",
            "**/.mise.local.toml",
            "**/.mise/config.toml",
            "**/.tool-versions",
        ]),
        reason: "mise runs a project's [hooks], [env] _.source scripts and tasks on entering \
                 the directory or running a tool, behind a `mise trust` prompt like direnv's \
                 (.tool-versions selects the tools and plugins it installs and runs)",
    },
    Plant {
        name: "emacs_dir_locals",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.dir-locals.el", "**/.dir-locals-2.el"]),
        reason: "Emacs applies directory-local variables to every file opened beneath, \
                 `eval` forms included, after one prompt people answer by habit",
    },
    Plant {
        name: "vscode_tasks",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.vscode/tasks.json"]),
        reason: "VS Code runs tasks with runOptions.runOn=folderOpen when the folder is opened \
                 (in a trusted workspace)",
    },
    Plant {
        name: "vscode_settings",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.vscode/settings.json"]),
        reason: "workspace settings name programs VS Code and its extensions start on open: \
                 terminal profiles and env, python.defaultInterpreterPath, git.path, linter and \
                 formatter paths",
    },
    Plant {
        name: "idea_workspace",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.idea/workspace.xml"]),
        reason: "JetBrains IDEs keep the project's local run configurations, before-launch and \
                 startup tasks and tool paths here; it is IDE state, never project source, so \
                 nothing legitimate needs it changed",
    },
    Plant {
        name: "vim_local_rc",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/.exrc",
            "**/.vimrc",
            "**/.nvimrc",
            "**/.nvim.lua",
            "**/.lvimrc",
        ]),
        reason: "vim and neovim with 'exrc' set source .exrc/.vimrc/.nvimrc/.nvim.lua from the \
                 current directory (neovim asks :trust once per content); the localvimrc plugin \
                 sources .lvimrc; in a home workspace .vimrc runs at every vim start",
    },
    Plant {
        name: "pre_commit_config",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.pre-commit-config.yaml"]),
        reason: "when pre-commit is installed as the repository's hook, the next `git commit` \
                 runs the commands of its `repo: local` hooks",
    },
    Plant {
        name: "cargo_project_config",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.cargo/config.toml", "**/.cargo/config"]),
        reason: "cargo reads .cargo/config.toml from the current directory and every parent: \
                 build.rustc-wrapper, build.rustc, target.*.runner, target.*.linker and aliases \
                 name programs the next `cargo build`, `run` or `test` starts on the host, and \
                 [env] sets LD_PRELOAD and the like for them",
    },
    Plant {
        name: "python_startup_hooks",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/site-packages/*.pth",
            "**/site-packages/sitecustomize.py",
            "**/site-packages/usercustomize.py",
        ]),
        reason: "Python's site module runs the `import` lines of every .pth file and imports \
                 sitecustomize/usercustomize in a virtualenv's (or any) site-packages at every \
                 start of that interpreter, before the script asked for; `pip install` of \
                 setuptools or an editable package makes .pth files too: those are shown as \
                 blocked, and --allow-blocked applies them",
    },
    Plant {
        name: "devcontainer",
        scope: Scope::Always,
        rule: Rule::Path(&[
            "**/.devcontainer/devcontainer.json",
            "**/.devcontainer/*/devcontainer.json",
            "**/.devcontainer.json",
        ]),
        reason: "VS Code's Dev Containers and the devcontainer CLI run initializeCommand on the \
                 host before the container is built, and the other lifecycle commands, mounts \
                 and run arguments (--privileged, a bind of /) when the folder is reopened in a \
                 container",
    },
    Plant {
        name: "vscode_code_workspace",
        scope: Scope::Always,
        rule: Rule::Path(&["**/*.code-workspace"]),
        reason: "a .code-workspace file carries settings and tasks like .vscode/settings.json \
                 and tasks.json (terminal profiles and env, interpreter and tool paths, tasks \
                 run on folder open) for whoever opens it",
    },
    Plant {
        name: "zed_project_settings",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.zed/settings.json", "**/.zed/tasks.json"]),
        reason: "Zed applies a project's .zed/settings.json on open: language server binaries \
                 and their arguments, the terminal's shell and env, formatters run on save \
                 (external commands); .zed/tasks.json names commands run from the editor",
    },
    Plant {
        name: "helix_project_config",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.helix/languages.toml", "**/.helix/config.toml"]),
        reason: "Helix merges a workspace's .helix/languages.toml (language-server commands, \
                 formatters) and config.toml into its own and starts the named language servers \
                 as soon as a file of that language is opened",
    },
    Plant {
        name: "npm_project_config",
        scope: Scope::Always,
        rule: Rule::Path(&["**/.npmrc", "**/.yarnrc", "**/.yarnrc.yml"]),
        reason: "npm, pnpm and yarn read the project's .npmrc/.yarnrc: script-shell and \
                 node-options (--require runs a file) apply to every script, registry and \
                 @scope:registry send the next install (and its auth token) to another server; \
                 yarn's yarnPath runs the named file as yarn itself on every yarn command",
    },
    Plant {
        name: "setid",
        scope: Scope::Always,
        rule: Rule::SetId,
        reason: "a setuid/setgid file runs with its owner's or group's privileges (root's when \
                 retie applies as root); a setgid directory gives everything later created in it \
                 its group and keeps new subdirectories setgid",
    },
    Plant {
        name: "shell_startup",
        scope: Scope::Home,
        rule: Rule::Path(&[
            ".bashrc",
            ".bash_profile",
            ".bash_login",
            ".bash_logout",
            ".bash_aliases",
            ".profile",
            ".zshrc",
            ".zshenv",
            ".zprofile",
            ".zlogin",
            ".zlogout",
            ".inputrc",
            ".config/fish/**",
            ".bash_completion",
            ".bash_completion.d/**",
            ".local/share/bash-completion/**",
            ".pam_environment",
        ]),
        reason: "every login or interactive shell sources these (.bash_aliases from Debian's \
                 .bashrc; .inputrc macros type commands into bash; bash-completion, which \
                 Debian's .bashrc loads, sources ~/.bash_completion and the user's completion \
                 scripts; PAM reads ~/.pam_environment at login)",
    },
    Plant {
        name: "ssh",
        scope: Scope::Home,
        rule: Rule::Path(&[".ssh/**"]),
        reason: "authorized_keys grants logins; config runs ProxyCommand, LocalCommand and \
                 `Match exec` on every ssh; rc runs at each login",
    },
    Plant {
        name: "git_user_config",
        scope: Scope::Home,
        rule: Rule::Path(&[".gitconfig", ".config/git/**"]),
        reason: "the user's git config applies to every repository: core.fsmonitor, \
                 core.hooksPath, pager, aliases, credential helpers",
    },
    Plant {
        name: "session_autostart",
        scope: Scope::Home,
        rule: Rule::Path(&[
            ".config/autostart/**",
            ".config/systemd/user/**",
            ".config/environment.d/**",
            ".xprofile",
            ".xsession",
            ".xsessionrc",
            ".xinitrc",
        ]),
        reason: "run or read at the next graphical or systemd user session: autostart entries, \
                 user units, the session's environment (PATH, LD_PRELOAD), X start-up scripts",
    },
    Plant {
        name: "user_path_bin",
        scope: Scope::Home,
        rule: Rule::Path(&[".local/bin/**", "bin/**"]),
        reason: "common default profiles (Debian's ~/.profile) put both on PATH before \
                 /usr/bin: a planted `git` or `ls` runs instead of the real one",
    },
    Plant {
        name: "python_user_site",
        scope: Scope::Home,
        rule: Rule::Path(&[".local/lib/*/site-packages/**"]),
        reason: "Python runs the import lines of every .pth file there at each start, and user \
                 packages shadow the system's",
    },
    Plant {
        name: "editor_user_config",
        scope: Scope::Home,
        rule: Rule::Path(&[
            ".vim/**",
            ".config/nvim/**",
            ".emacs",
            ".emacs.d/**",
            ".config/emacs/**",
            ".config/Code/User/**",
            ".vscode/extensions/**",
        ]),
        reason: "editors run their start-up files, plugins and installed extensions (VS Code's \
                 user settings and tasks) every time they start",
    },
    Plant {
        name: "tool_user_config",
        scope: Scope::Home,
        rule: Rule::Path(&[
            ".tmux.conf",
            ".config/tmux/**",
            ".gnupg/**",
            ".aws/config",
            ".aws/credentials",
            ".kube/**",
            ".docker/config.json",
            ".ipython/**",
            ".jupyter/**",
            ".gdbinit",
            ".config/gdb/**",
            ".Rprofile",
            ".psqlrc",
            ".local/share/applications/**",
            ".config/mimeapps.list",
        ]),
        reason: "tools run commands their user config names: tmux's run-shell and hooks, \
                 gpg-agent's pinentry-program, the AWS CLI's credential_process, kubectl's \
                 exec plugins, docker's credential helpers, npm's script-shell and \
                 node-options, cargo's runners and aliases, IPython's startup scripts, gdb's \
                 and R's start-up files, psql's \\! lines, desktop entries and the MIME \
                 handlers that open files with them",
    },
    Plant {
        name: "direnv_user",
        scope: Scope::Home,
        rule: Rule::Path(&[".config/direnv/**", ".local/share/direnv/**"]),
        reason: "direnvrc runs before every .envrc; direnv.toml's whitelist and the allow \
                 database decide which .envrc run without asking",
    },
];

/// A candidate considered and deliberately not blocked.
#[derive(Debug)]
pub struct NotPlant {
    /// An example path (a test proves it applies unblocked).
    pub path: &'static str,
    /// Why it is not blocked.
    pub reason: &'static str,
}

/// Candidates left applicable, with the reasoning.
pub static NOT_PLANTS: &[NotPlant] = &[
    NotPlant {
        path: ".git/info/attributes",
        reason: "attributes only select filter/diff/merge drivers, and drivers are defined in \
                 config (blocked); a tracked .gitattributes has the same power and is ordinary \
                 project content",
    },
    NotPlant {
        path: ".gitmodules",
        reason: "tracked project content: git ignores `update = !command` from .gitmodules and \
                 refuses ext:: URLs by default; submodule config is copied into .git/config \
                 (blocked) only by an explicit `git submodule init/sync`",
    },
    NotPlant {
        path: ".env",
        reason: "data (KEY=value), not a script; direnv reads it only with the non-default \
                 load_dotenv and then behind the same `direnv allow` as .envrc; projects edit it \
                 routinely",
    },
    NotPlant {
        path: ".vscode/launch.json",
        reason: "runs only when the person starts debugging, i.e. asks to run the project, like \
                 a Makefile or package.json script, which the sandbox edits legitimately",
    },
    NotPlant {
        path: ".idea/runConfigurations/App.xml",
        reason: "shared run configurations run only when the person starts them (as \
                 launch.json)",
    },
    NotPlant {
        path: ".git/hooks/pre-commit",
        reason: "deleting it: a deletion cannot make anything run; it is shown in the \
                 changeset and undoable",
    },
];

/// Looks a plant up by name.
pub fn plant(name: &str) -> Option<&'static Plant> {
    PLANTS.iter().find(|p| p.name == name)
}

/// The plant entry `path` (with new state `new`) matches, and the pattern
/// that matched (`None` for [`Rule::SetId`]). `created`: `path` is not in
/// the real workspace. `home`: where the home directory is in the
/// workspace (`Some("")`: the workspace is one; `None`: there is none).
/// `holds(dir, name)`: whether `dir` (`None`: the workspace root) holds
/// `name` in the real workspace or in the changeset; only asked for a
/// `HEAD` when a [`Rule::InGitDir`] pattern could match beneath `dir`, and
/// for a [`Rule::HeadBeside`] name when `path` is a created `HEAD`.
pub(crate) fn matching(
    path: &RelPath,
    new: Option<&Node>,
    created: bool,
    home: Option<&str>,
    holds: &mut dyn FnMut(Option<&RelPath>, &str) -> bool,
) -> Option<(&'static Plant, Option<&'static str>)> {
    // A deletion cannot plant anything.
    let new = new?;
    let comps: Vec<&str> = path.components().collect();
    // Exact matches first, so that a symlink is reported under the entry
    // it names (a `.git` symlink is `git_file`, not `git_hooks`).
    if let Some(m) = matching_pass(&comps, new, created, home, holds, false) {
        return Some(m);
    }
    if matches!(new, Node::Symlink { .. }) {
        return matching_pass(&comps, new, created, home, holds, true);
    }
    None
}

/// One pass over the table: `lead`: match paths that lead into a pattern
/// (for a symlink) instead of paths the pattern matches.
fn matching_pass(
    comps: &[&str],
    new: &Node,
    created: bool,
    home: Option<&str>,
    holds: &mut dyn FnMut(Option<&RelPath>, &str) -> bool,
    lead: bool,
) -> Option<(&'static Plant, Option<&'static str>)> {
    // The path relative to the home directory, when it lies beneath one.
    let prefix: Vec<&str> = home
        .map(|h| h.split('/').filter(|c| !c.is_empty()).collect())
        .unwrap_or_default();
    let in_home: Option<&[&str]> = home.and_then(|_| {
        (comps.len() > prefix.len() && comps[..prefix.len()] == prefix[..])
            .then(|| &comps[prefix.len()..])
    });
    // The home directory a workspace holds, or a directory above it, no
    // longer a directory: a symlink there puts a home of the command's
    // making in its place, start-up files and all.
    if home.is_some()
        && !prefix.is_empty()
        && !new.is_dir()
        && comps.len() <= prefix.len()
        && comps[..] == prefix[..comps.len()]
    {
        if let Some(p) = plant("shell_startup") {
            return Some((p, None));
        }
    }
    let hit = |pat: &str, comps: &[&str]| {
        let p: Vec<&str> = pat.split('/').collect();
        if lead {
            reaches(&p, comps, false)
        } else {
            glob(&p, comps)
        }
    };
    for plant in PLANTS {
        let comps = match plant.scope {
            Scope::Always => comps,
            Scope::Home => match in_home {
                Some(rest) => rest,
                None => continue,
            },
        };
        match plant.rule {
            Rule::Path(pats) => {
                if let Some(p) = pats.iter().find(|p| hit(p, comps)) {
                    return Some((plant, Some(p)));
                }
            }
            Rule::NotDir(pats) => {
                if !new.is_dir() {
                    if let Some(p) = pats.iter().find(|p| hit(p, comps)) {
                        return Some((plant, Some(p)));
                    }
                }
            }
            Rule::InGitDir(pats) => {
                // Every ancestor (and the root) is a candidate git dir.
                for split in 0..comps.len() {
                    let rel = &comps[split..];
                    let Some(p) = pats.iter().find(|p| hit(p, rel)) else {
                        continue;
                    };
                    let dir = match split {
                        0 => None,
                        _ => match RelPath::new(&comps[..split].join("/")) {
                            Ok(d) => Some(d),
                            Err(_) => continue,
                        },
                    };
                    if holds(dir.as_ref(), "HEAD") {
                        return Some((plant, Some(p)));
                    }
                }
            }
            Rule::HeadBeside(names) => {
                let Some((&"HEAD", parent)) = comps.split_last() else {
                    continue;
                };
                if lead || !created || new.is_dir() {
                    continue;
                }
                let dir = match parent {
                    [] => None,
                    _ => match RelPath::new(&parent.join("/")) {
                        Ok(d) => Some(d),
                        Err(_) => continue,
                    },
                };
                if let Some(n) = names.iter().find(|n| holds(dir.as_ref(), n)) {
                    return Some((plant, Some(n)));
                }
            }
            // Decided against the real repository's config
            // (`changeset::named_by_git_config`), not by the path alone.
            Rule::NamedByGitConfig(_) => {}
            Rule::SetId => {
                let mode = match new {
                    Node::File { mode, .. } | Node::Dir { mode } => *mode,
                    Node::Symlink { .. } => 0,
                };
                if !lead && mode & 0o6000 != 0 {
                    return Some((plant, None));
                }
            }
        }
    }
    None
}

/// Whether `path` matches `pat` (`*`: one component, `**`: zero or more).
fn glob(pat: &[&str], path: &[&str]) -> bool {
    match (pat.split_first(), path.split_first()) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some((&"**", rest)), _) => {
            glob(rest, path) || path.split_first().is_some_and(|(_, p)| glob(pat, p))
        }
        (Some(_), None) => false,
        (Some((&"*", rest)), Some((_, p))) => glob(rest, p),
        (Some((lit, rest)), Some((c, p))) => component(lit, c) && glob(rest, p),
    }
}

/// Whether path component `c` matches pattern component `lit`: exactly,
/// or, for `*SUFFIX` (`*.pth`), by a name that ends with the suffix and
/// has something before it.
fn component(lit: &str, c: &str) -> bool {
    match lit.strip_prefix('*') {
        Some(suffix) if !suffix.is_empty() => c.len() > suffix.len() && c.ends_with(suffix),
        _ => lit == c,
    }
}

/// Whether `path` is a proper prefix of something `pat` matches, having
/// matched at least one literal component of it (`lit`): a directory on
/// the way to a plant, so a symlink there leads into it.
fn reaches(pat: &[&str], path: &[&str], lit: bool) -> bool {
    match (pat.split_first(), path.split_first()) {
        (_, None) => lit && !pat.is_empty(),
        (None, Some(_)) => false,
        (Some((&"**", rest)), Some((_, p))) => reaches(rest, path, lit) || reaches(pat, p, lit),
        (Some((&"*", rest)), Some((_, p))) => reaches(rest, p, lit),
        (Some((l, rest)), Some((c, p))) => component(l, c) && reaches(rest, p, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Hash;
    use std::collections::BTreeSet;

    fn file(mode: u32) -> Node {
        Node::File {
            mode,
            size: 1,
            hash: Hash::of(b"x"),
        }
    }

    /// How a case's new state looks.
    #[derive(Clone, Copy)]
    enum New {
        File,
        Dir,
        Link,
        Mode(u32),
        DirMode(u32),
    }

    fn node(n: New) -> Node {
        match n {
            New::File => file(0o644),
            New::Dir => Node::Dir { mode: 0o755 },
            New::Link => Node::symlink("elsewhere".into()),
            New::Mode(m) => file(m),
            New::DirMode(m) => Node::Dir { mode: m },
        }
    }

    /// (expected entry, path, new state, home workspace, dirs holding HEAD).
    type Case = (
        &'static str,
        &'static str,
        New,
        bool,
        &'static [&'static str],
    );

    /// Positive cases: each must match its entry. Every pattern of every
    /// entry must be hit by one of them (`every_pattern_has_a_case`).
    const CASES: &[Case] = &[
        ("git_hooks", ".git/hooks/pre-commit", New::File, false, &[]),
        (
            "git_hooks",
            "vendor/lib/.git/hooks/post-checkout",
            New::File,
            false,
            &[],
        ),
        ("git_hooks", ".git/hooks", New::Link, false, &[]),
        ("git_config", ".git/config", New::File, false, &[]),
        ("git_config", ".git/config.worktree", New::File, false, &[]),
        ("git_config", "sub/.git/commondir", New::File, false, &[]),
        (
            "git_submodule_dir",
            ".git/modules/sub/hooks/post-checkout",
            New::File,
            false,
            &[],
        ),
        (
            "git_submodule_dir",
            ".git/modules/a/modules/b/config",
            New::File,
            false,
            &[],
        ),
        (
            "git_submodule_dir",
            ".git/modules/sub/config.worktree",
            New::File,
            false,
            &[],
        ),
        (
            "git_submodule_dir",
            ".git/modules/sub/commondir",
            New::File,
            false,
            &[],
        ),
        // A symlinked submodule git dir leads into its hooks and config.
        (
            "git_submodule_dir",
            ".git/modules/sub",
            New::Link,
            false,
            &[],
        ),
        (
            "git_worktree_dir",
            ".git/worktrees/wt/config",
            New::File,
            false,
            &[],
        ),
        (
            "git_worktree_dir",
            ".git/worktrees/wt/config.worktree",
            New::File,
            false,
            &[],
        ),
        (
            "git_worktree_dir",
            ".git/worktrees/wt/commondir",
            New::File,
            false,
            &[],
        ),
        ("git_file", "sub/.git", New::File, false, &[]),
        ("git_file", ".git", New::Link, false, &[]),
        (
            "git_dir_anywhere",
            "evil.git/config",
            New::File,
            false,
            &["evil.git"],
        ),
        (
            "git_dir_anywhere",
            "a/b/config.worktree",
            New::File,
            false,
            &["a/b"],
        ),
        ("git_dir_anywhere", "a/commondir", New::File, false, &["a"]),
        (
            "git_dir_anywhere",
            "x/hooks/post-update",
            New::File,
            false,
            &["x"],
        ),
        ("git_dir_anywhere", "x/hooks", New::Link, false, &["x"]),
        ("git_dir_anywhere", "config", New::File, false, &[""]),
        (
            "git_dir_completed",
            "a/HEAD",
            New::File,
            false,
            &["a/config"],
        ),
        (
            "git_dir_completed",
            "b.git/HEAD",
            New::Link,
            false,
            &["b.git/config.worktree"],
        ),
        (
            "git_dir_completed",
            "HEAD",
            New::File,
            false,
            &["commondir"],
        ),
        (
            "git_dir_completed",
            "x/y/HEAD",
            New::File,
            false,
            &["x/y/hooks"],
        ),
        ("hg_config", "repo/.hg/hgrc", New::File, false, &[]),
        ("direnv_envrc", ".envrc", New::File, false, &[]),
        (
            "git_sequencer",
            ".git/rebase-merge/git-rebase-todo",
            New::File,
            false,
            &[],
        ),
        (
            "git_sequencer",
            "sub/.git/rebase-apply/patch",
            New::File,
            false,
            &[],
        ),
        (
            "git_sequencer",
            ".git/sequencer/todo",
            New::File,
            false,
            &[],
        ),
        ("mise_config", "mise.toml", New::File, false, &[]),
        ("mise_config", "a/.mise.toml", New::File, false, &[]),
        ("mise_config", "mise.local.toml", New::File, false, &[]),
        ("mise_config", ".mise.local.toml", New::File, false, &[]),
        ("mise_config", ".mise/config.toml", New::File, false, &[]),
        ("mise_config", ".tool-versions", New::File, false, &[]),
        ("emacs_dir_locals", ".dir-locals.el", New::File, false, &[]),
        (
            "emacs_dir_locals",
            "src/.dir-locals-2.el",
            New::File,
            false,
            &[],
        ),
        ("shell_startup", ".bash_completion", New::File, true, &[]),
        (
            "shell_startup",
            ".bash_completion.d/x",
            New::File,
            true,
            &[],
        ),
        (
            "shell_startup",
            ".local/share/bash-completion/completions/ls",
            New::File,
            true,
            &[],
        ),
        ("shell_startup", ".pam_environment", New::File, true, &[]),
        ("tool_user_config", ".tmux.conf", New::File, true, &[]),
        (
            "tool_user_config",
            ".config/tmux/tmux.conf",
            New::File,
            true,
            &[],
        ),
        (
            "tool_user_config",
            ".gnupg/gpg-agent.conf",
            New::File,
            true,
            &[],
        ),
        ("tool_user_config", ".aws/config", New::File, true, &[]),
        ("tool_user_config", ".aws/credentials", New::File, true, &[]),
        ("tool_user_config", ".kube/config", New::File, true, &[]),
        (
            "tool_user_config",
            ".docker/config.json",
            New::File,
            true,
            &[],
        ),
        // A home's own .npmrc and .cargo/config.toml: the project entries
        // match them, wherever they are.
        ("npm_project_config", ".npmrc", New::File, true, &[]),
        (
            "cargo_project_config",
            ".cargo/config",
            New::File,
            true,
            &[],
        ),
        (
            "cargo_project_config",
            "crate/.cargo/config.toml",
            New::File,
            false,
            &[],
        ),
        (
            "python_startup_hooks",
            ".venv/lib/python3.12/site-packages/evil.pth",
            New::File,
            false,
            &[],
        ),
        (
            "python_startup_hooks",
            "venv/lib/python3.11/site-packages/sitecustomize.py",
            New::File,
            false,
            &[],
        ),
        (
            "python_startup_hooks",
            ".venv/lib/python3.12/site-packages/usercustomize.py",
            New::File,
            false,
            &[],
        ),
        (
            "devcontainer",
            ".devcontainer/devcontainer.json",
            New::File,
            false,
            &[],
        ),
        (
            "devcontainer",
            ".devcontainer/gpu/devcontainer.json",
            New::File,
            false,
            &[],
        ),
        ("devcontainer", ".devcontainer.json", New::File, false, &[]),
        // A symlinked .devcontainer leads into it.
        ("devcontainer", ".devcontainer", New::Link, false, &[]),
        (
            "vscode_code_workspace",
            "proj.code-workspace",
            New::File,
            false,
            &[],
        ),
        (
            "zed_project_settings",
            ".zed/settings.json",
            New::File,
            false,
            &[],
        ),
        (
            "zed_project_settings",
            "a/.zed/tasks.json",
            New::File,
            false,
            &[],
        ),
        (
            "helix_project_config",
            ".helix/languages.toml",
            New::File,
            false,
            &[],
        ),
        (
            "helix_project_config",
            ".helix/config.toml",
            New::File,
            false,
            &[],
        ),
        ("npm_project_config", "web/.npmrc", New::File, false, &[]),
        ("npm_project_config", ".yarnrc", New::File, false, &[]),
        ("npm_project_config", ".yarnrc.yml", New::File, false, &[]),
        (
            "tool_user_config",
            ".ipython/profile_default/startup/a.py",
            New::File,
            true,
            &[],
        ),
        (
            "tool_user_config",
            ".jupyter/jupyter_server_config.py",
            New::File,
            true,
            &[],
        ),
        ("tool_user_config", ".gdbinit", New::File, true, &[]),
        (
            "tool_user_config",
            ".config/gdb/gdbinit",
            New::File,
            true,
            &[],
        ),
        ("tool_user_config", ".Rprofile", New::File, true, &[]),
        ("tool_user_config", ".psqlrc", New::File, true, &[]),
        (
            "tool_user_config",
            ".local/share/applications/x.desktop",
            New::File,
            true,
            &[],
        ),
        (
            "tool_user_config",
            ".config/mimeapps.list",
            New::File,
            true,
            &[],
        ),
        ("direnv_envrc", "deep/dir/.envrc", New::File, false, &[]),
        ("vscode_tasks", ".vscode/tasks.json", New::File, false, &[]),
        ("vscode_tasks", ".vscode", New::Link, false, &[]),
        (
            "vscode_tasks",
            "pkg/.vscode/tasks.json",
            New::File,
            false,
            &[],
        ),
        (
            "vscode_settings",
            ".vscode/settings.json",
            New::File,
            false,
            &[],
        ),
        (
            "idea_workspace",
            ".idea/workspace.xml",
            New::File,
            false,
            &[],
        ),
        ("vim_local_rc", ".exrc", New::File, false, &[]),
        ("vim_local_rc", "src/.vimrc", New::File, false, &[]),
        ("vim_local_rc", ".nvimrc", New::File, false, &[]),
        ("vim_local_rc", ".nvim.lua", New::File, false, &[]),
        ("vim_local_rc", ".lvimrc", New::File, false, &[]),
        (
            "pre_commit_config",
            ".pre-commit-config.yaml",
            New::File,
            false,
            &[],
        ),
        ("setid", "tool", New::Mode(0o4755), false, &[]),
        ("setid", "tool", New::Mode(0o2755), false, &[]),
        ("setid", "shared", New::DirMode(0o2775), false, &[]),
        ("shell_startup", ".bashrc", New::File, true, &[]),
        ("shell_startup", ".bash_profile", New::File, true, &[]),
        ("shell_startup", ".bash_login", New::File, true, &[]),
        ("shell_startup", ".bash_logout", New::File, true, &[]),
        ("shell_startup", ".bash_aliases", New::File, true, &[]),
        ("shell_startup", ".profile", New::File, true, &[]),
        ("shell_startup", ".zshrc", New::File, true, &[]),
        ("shell_startup", ".zshenv", New::File, true, &[]),
        ("shell_startup", ".zprofile", New::File, true, &[]),
        ("shell_startup", ".zlogin", New::File, true, &[]),
        ("shell_startup", ".zlogout", New::File, true, &[]),
        ("shell_startup", ".inputrc", New::File, true, &[]),
        (
            "shell_startup",
            ".config/fish/config.fish",
            New::File,
            true,
            &[],
        ),
        ("shell_startup", ".config", New::Link, true, &[]),
        ("ssh", ".ssh/authorized_keys", New::File, true, &[]),
        ("ssh", ".ssh", New::Link, true, &[]),
        ("git_user_config", ".gitconfig", New::File, true, &[]),
        (
            "git_user_config",
            ".config/git/config",
            New::File,
            true,
            &[],
        ),
        (
            "session_autostart",
            ".config/autostart/x.desktop",
            New::File,
            true,
            &[],
        ),
        (
            "session_autostart",
            ".config/systemd/user/x.service",
            New::File,
            true,
            &[],
        ),
        (
            "session_autostart",
            ".config/environment.d/10-x.conf",
            New::File,
            true,
            &[],
        ),
        ("session_autostart", ".xprofile", New::File, true, &[]),
        ("session_autostart", ".xsession", New::File, true, &[]),
        ("session_autostart", ".xsessionrc", New::File, true, &[]),
        ("session_autostart", ".xinitrc", New::File, true, &[]),
        ("user_path_bin", ".local/bin/git", New::File, true, &[]),
        ("user_path_bin", "bin/ls", New::File, true, &[]),
        ("user_path_bin", "bin", New::Dir, true, &[]),
        (
            "python_user_site",
            ".local/lib/python3.12/site-packages/pkg/mod.py",
            New::File,
            true,
            &[],
        ),
        (
            "editor_user_config",
            ".vim/plugin/x.vim",
            New::File,
            true,
            &[],
        ),
        (
            "editor_user_config",
            ".config/nvim/init.lua",
            New::File,
            true,
            &[],
        ),
        ("editor_user_config", ".emacs", New::File, true, &[]),
        (
            "editor_user_config",
            ".emacs.d/init.el",
            New::File,
            true,
            &[],
        ),
        (
            "editor_user_config",
            ".config/emacs/init.el",
            New::File,
            true,
            &[],
        ),
        (
            "editor_user_config",
            ".config/Code/User/tasks.json",
            New::File,
            true,
            &[],
        ),
        (
            "editor_user_config",
            ".vscode/extensions/x/ext.js",
            New::File,
            true,
            &[],
        ),
        (
            "direnv_user",
            ".config/direnv/direnvrc",
            New::File,
            true,
            &[],
        ),
        (
            "direnv_user",
            ".local/share/direnv/allow/abc",
            New::File,
            true,
            &[],
        ),
    ];

    /// (path, new state, home, dirs holding HEAD): never a plant.
    const NEGATIVE: &[(&str, New, bool, &[&str])] = &[
        // Exact, case-sensitive components.
        (".Git/hooks/pre-commit", New::File, false, &[]),
        (".VSCODE/tasks.json", New::File, false, &[]),
        (".git/hooks2/x", New::File, false, &[]),
        ("my.git/config", New::File, false, &[]),
        (".git/HEAD", New::File, false, &[]),
        (".git/objects/ab/cdef", New::File, false, &[]),
        (".git", New::Dir, false, &[]),
        (".vscode", New::Dir, false, &[]),
        (".vscode/extensions.json", New::File, false, &[]),
        // `config` without a HEAD beside it is an ordinary file.
        ("app/config", New::File, false, &[]),
        ("app/hooks/x", New::File, false, &["other"]),
        // A HEAD two levels up does not make `a/b` a git dir.
        ("a/b/config", New::File, false, &["a"]),
        // Home entries only in a home workspace.
        (".bashrc", New::File, false, &[]),
        (".ssh/authorized_keys", New::File, false, &[]),
        (".local/bin/git", New::File, false, &[]),
        // Home entries are anchored at the root.
        ("proj/.bashrc", New::File, true, &[]),
        ("proj/bin/tool", New::File, true, &[]),
        // A symlink leads into a pattern only through a literal component.
        ("foo", New::Link, false, &[]),
        ("docs/link", New::Link, true, &[]),
        // Only the start-up hooks of a site-packages, never its modules.
        (
            ".venv/lib/python3.12/site-packages/pkg/mod.py",
            New::File,
            false,
            &[],
        ),
        (
            ".venv/lib/python3.12/site-packages/pkg/a.pth",
            New::File,
            false,
            &[],
        ),
        ("notes.pth", New::File, false, &[]),
        // A suffix pattern needs a name before the suffix.
        (".code-workspace", New::File, false, &[]),
        (".devcontainer/Dockerfile", New::File, false, &[]),
        ("README.npmrc", New::File, false, &[]),
        // Plain modes.
        ("tool", New::Mode(0o1755), false, &[]),
        ("shared", New::DirMode(0o1777), false, &[]),
    ];

    /// `heads`: directories holding a `HEAD`, and `DIR/NAME` (or `NAME`
    /// at the root) for any other name a directory holds.
    fn holder<'a>(heads: &'a [&'a str]) -> impl FnMut(Option<&RelPath>, &str) -> bool + 'a {
        move |d, name| {
            let dir = d.map(RelPath::as_str).unwrap_or("");
            if name == "HEAD" {
                heads.contains(&dir)
            } else {
                let full = if dir.is_empty() {
                    name.to_owned()
                } else {
                    format!("{dir}/{name}")
                };
                heads.contains(&full.as_str())
            }
        }
    }

    fn run(path: &str, new: New, home: bool, heads: &[&str]) -> Option<(&'static str, String)> {
        let p = RelPath::new(path).expect("valid case path");
        let n = node(new);
        matching(&p, Some(&n), true, home.then_some(""), &mut holder(heads))
            .map(|(pl, pat)| (pl.name, pat.unwrap_or("").to_owned()))
    }

    #[test]
    fn home_entries_apply_beneath_a_home_the_workspace_holds() {
        let n = node(New::File);
        let got = |path: &str, home: Option<&str>| {
            let p = RelPath::new(path).expect("valid");
            matching(&p, Some(&n), true, home, &mut holder(&[])).map(|m| m.0.name)
        };
        assert_eq!(got("alice/.bashrc", Some("alice")), Some("shell_startup"));
        assert_eq!(
            got("users/alice/.ssh/authorized_keys", Some("users/alice")),
            Some("ssh")
        );
        // Beside the home: no home entry.
        assert_eq!(got("bob/.bashrc", Some("alice")), None);
        // The home itself, or a directory above it, made anything but a
        // directory (a symlink to a home of the command's making): a plant.
        assert_eq!(got("alice", Some("alice")), Some("shell_startup"));
        assert_eq!(got("users", Some("users/alice")), Some("shell_startup"));
        let dir = node(New::Dir);
        let p = RelPath::new("alice").expect("valid");
        assert_eq!(
            matching(&p, Some(&dir), true, Some("alice"), &mut holder(&[])).map(|m| m.0.name),
            None
        );
        assert_eq!(got("alicex/.bashrc", Some("alice")), None);
        // Always-entries still match from the workspace root.
        assert_eq!(got("alice/.envrc", Some("alice")), Some("direnv_envrc"));
    }

    #[test]
    fn a_head_beside_git_parts_is_a_plant_only_when_it_is_new() {
        let p = RelPath::new("sub/HEAD").expect("valid");
        let n = node(New::File);
        let got = |created: bool, held: &[&str]| {
            matching(&p, Some(&n), created, None, &mut holder(held)).map(|m| m.0.name)
        };
        assert_eq!(got(true, &["sub/config"]), Some("git_dir_completed"));
        // An existing repository's HEAD changes (git checkout): no plant.
        assert_eq!(got(false, &["sub/config"]), None);
        // A HEAD with nothing of a git dir beside it: no plant.
        assert_eq!(got(true, &["config", "other/config"]), None);
        // A HEAD directory is not a HEAD file.
        let d = node(New::Dir);
        assert_eq!(
            matching(&p, Some(&d), true, None, &mut holder(&["sub/hooks"])).map(|m| m.0.name),
            None
        );
    }

    #[test]
    fn every_case_matches_its_entry() {
        let mut bad = String::new();
        for (name, path, new, home, heads) in CASES {
            let got = run(path, *new, *home, heads).map(|g| g.0);
            if got != Some(*name) {
                bad += &format!("  {path}: expected {name}, got {got:?}\n");
            }
        }
        assert!(bad.is_empty(), "cases not matched:\n{bad}");
    }

    #[test]
    fn every_pattern_has_a_case() {
        let mut hit: BTreeSet<(String, String)> = BTreeSet::new();
        for (_, path, new, home, heads) in CASES {
            if let Some((n, p)) = run(path, *new, *home, heads) {
                hit.insert((n.to_owned(), p));
            }
        }
        let mut missing = String::new();
        for plant in PLANTS {
            let pats: Vec<&str> = match plant.rule {
                Rule::SetId => vec![""],
                // Tested against a real config: changeset's tests and the
                // overlay cases.
                Rule::NamedByGitConfig(_) => continue,
                r => r.patterns().to_vec(),
            };
            for p in pats {
                if !hit.contains(&(plant.name.to_owned(), p.to_owned())) {
                    missing += &format!("  {} {p:?}\n", plant.name);
                }
            }
        }
        assert!(
            missing.is_empty(),
            "table entries without a case:\n{missing}"
        );
    }

    #[test]
    fn negatives_and_not_plants_are_not_matched() {
        let mut bad = String::new();
        for (path, new, home, heads) in NEGATIVE {
            if let Some(g) = run(path, *new, *home, heads) {
                bad += &format!("  {path}: matched {g:?}\n");
            }
        }
        for np in NOT_PLANTS
            .iter()
            .filter(|n| n.path != ".git/hooks/pre-commit")
        {
            if let Some(g) = run(np.path, New::File, true, &[".git"]) {
                bad += &format!("  {} (not a plant): matched {g:?}\n", np.path);
            }
        }
        assert!(bad.is_empty(), "matched but should not:\n{bad}");
    }

    #[test]
    fn deletions_are_never_plants() {
        for (_, path, _, home, heads) in CASES {
            let p = RelPath::new(path).expect("valid");
            let got = matching(&p, None, true, home.then_some(""), &mut holder(heads));
            assert!(
                got.is_none(),
                "deleting {path} matched {:?}",
                got.map(|g| g.0.name)
            );
        }
    }

    #[test]
    fn names_are_unique_and_reasons_present() {
        let names: BTreeSet<&str> = PLANTS.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), PLANTS.len(), "duplicate plant names");
        for p in PLANTS {
            assert!(p.reason.len() > 20, "{}: reason too short", p.name);
            assert_eq!(plant(p.name).map(|q| q.name), Some(p.name));
        }
    }

    #[test]
    fn docs_list_every_entry() {
        let doc = include_str!("../../docs/snapshot.md");
        let mut missing = String::new();
        for p in PLANTS {
            if !doc.contains(&format!("| `{}` |", p.name)) {
                missing += &format!("  entry {}\n", p.name);
            }
            for pat in p.rule.patterns() {
                if !doc.contains(&format!("`{pat}`")) {
                    missing += &format!("  {} pattern {pat}\n", p.name);
                }
            }
        }
        for n in NOT_PLANTS {
            if !doc.contains(&format!("| `{}` |", n.path)) {
                missing += &format!("  not-plant {}\n", n.path);
            }
        }
        assert!(missing.is_empty(), "docs/snapshot.md lacks:\n{missing}");
    }

    #[test]
    fn glob_semantics() {
        let g = |p: &str, s: &str| {
            glob(
                &p.split('/').collect::<Vec<_>>(),
                &s.split('/').collect::<Vec<_>>(),
            )
        };
        assert!(g("**/.git/hooks/**", ".git/hooks"));
        assert!(g("**/.git/hooks/**", "a/b/.git/hooks/c/d"));
        assert!(!g("**/.git/hooks/**", ".git/hook"));
        assert!(g(".git/worktrees/*/config", ".git/worktrees/w/config"));
        assert!(!g(".git/worktrees/*/config", ".git/worktrees/config"));
        assert!(!g(".git/worktrees/*/config", ".git/worktrees/a/b/config"));
        assert!(!g(".bashrc", "x/.bashrc"));
        assert!(g("**/site-packages/*.pth", "v/lib/p/site-packages/a.pth"));
        assert!(!g("**/site-packages/*.pth", "v/lib/p/site-packages/.pth"));
        assert!(!g(
            "**/site-packages/*.pth",
            "v/lib/p/site-packages/a.pth.txt"
        ));
        assert!(!g("**/site-packages/*.pth", "v/site-packages/x/a.pth"));
    }
}
