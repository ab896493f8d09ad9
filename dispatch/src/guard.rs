//! The workspace guards, in one place (issue 27 item 2): which directory
//! may be a sandbox's workspace at all (never a system directory unless
//! the person insists), and retie's own directories (keys, ledger, state)
//! relative to it: a workspace inside one is refused, one inside the
//! workspace is created if missing and masked from every sandboxed
//! command and every changeset. `retie sandbox exec`, `retie run`,
//! applying a kept run and `retie retest` all call [`workspace`].

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use retie_display::visible;

use crate::Error;

/// What the caller allows beyond the default.
#[derive(Debug, Clone, Default)]
pub struct GuardOptions {
    /// The flag that lets a system directory be the workspace, when the
    /// entry point has one (`--allow-system-workspace`), and whether the
    /// person passed it.
    pub system_flag: Option<(&'static str, bool)>,
    /// A scratch area retie made inside one of its own directories for
    /// its own use (the retest's scratch workspaces): a workspace under it
    /// is not refused for lying inside that directory.
    pub retie_scratch: Option<PathBuf>,
}

/// A workspace that passed the guards.
#[derive(Debug, Clone)]
pub struct Guarded {
    /// retie's own directories inside the workspace: masked in the
    /// sandbox (an empty read-only tmpfs) and never written by a changeset.
    pub protect: Vec<PathBuf>,
    /// Why it is a system directory, when the person allowed one.
    pub system: Option<String>,
}

/// Guard canonical workspace `ws`. `retie_dirs` are retie's own
/// directories, each with what it is (`config`, `state`, `ledger`...).
pub fn workspace(
    ws: &Path,
    retie_dirs: &[(&'static str, PathBuf)],
    opts: &GuardOptions,
) -> Result<Guarded, Error> {
    let system = system_workspace(ws);
    if let Some(why) = &system {
        let shown = visible(&ws.display().to_string());
        match opts.system_flag {
            Some((_, true)) => {}
            Some((flag, false)) => {
                return Err(Error::Invalid(format!(
                    "the workspace {shown} is {why}: a sandboxed command could read everything in it (as root: /etc/shadow, keys) and a changeset could rewrite it. Choose a project directory, or pass {flag} if you mean it"
                )))
            }
            None => {
                return Err(Error::Invalid(format!(
                    "the workspace {shown} is {why}: a sandboxed command could read everything in it (as root: /etc/shadow, keys) and a changeset could rewrite it. Choose a project directory"
                )))
            }
        }
    }
    let protect = retie_dirs_in(ws, retie_dirs, opts.retie_scratch.as_deref())?;
    Ok(Guarded { protect, system })
}

/// Directories no sandbox should get as its workspace, and why. `ws` is
/// canonical.
pub fn system_workspace(ws: &Path) -> Option<String> {
    // Exactly these, and every ancestor of them (only `/`).
    const EXACT: &[&str] = &[
        "/", "/etc", "/usr", "/boot", "/dev", "/proc", "/sys", "/var", "/root", "/run", "/home",
        "/srv", "/opt", "/mnt", "/media", "/snap", "/lib", "/lib64", "/bin", "/sbin",
    ];
    // These and everything beneath them: system trees, never a project.
    const TREES: &[&str] = &["/etc", "/usr", "/boot", "/dev", "/proc", "/sys", "/run"];
    let p = ws.to_string_lossy();
    if EXACT.contains(&p.as_ref()) {
        return Some(if p == "/" {
            "the root of the filesystem".into()
        } else {
            format!("the system directory {p}")
        });
    }
    TREES
        .iter()
        .find(|t| ws.starts_with(t))
        .map(|t| format!("inside the system directory {t}"))
}

/// retie's own directories that lie inside the workspace: each is created
/// if missing and returned. A workspace that is one of them, or lies
/// inside one (but for `scratch`), is refused.
fn retie_dirs_in(
    ws: &Path,
    dirs: &[(&'static str, PathBuf)],
    scratch: Option<&Path>,
) -> Result<Vec<PathBuf>, Error> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut changed: Vec<PathBuf> = Vec::new();
    let scratch = scratch.map(real_path);
    for (what, dir) in dirs {
        let real = real_path(dir);
        if ws == real {
            return Err(Error::Invalid(format!(
                "retie's own {what} directory {} is the root of the workspace: a sandboxed command must never reach retie's keys, ledger or state; keep it in a directory of its own or outside (--ledger, RETIE_LEDGER, XDG_*_HOME)",
                visible(&real.display().to_string())
            )));
        }
        let in_scratch = scratch
            .as_deref()
            .is_some_and(|s| s.starts_with(&real) && ws.starts_with(s) && ws != s);
        if ws.starts_with(&real) && !in_scratch {
            return Err(Error::Invalid(format!(
                "the workspace {} lies inside retie's own {what} directory {}: a sandboxed command must never reach retie's keys, ledger or state; choose another workspace",
                visible(&ws.display().to_string()),
                visible(&real.display().to_string())
            )));
        }
        if !real.starts_with(ws) || out.contains(&real) {
            continue;
        }
        if !real.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&real)
                .map_err(|e| Error::io(format!("creating {}", real.display()), e))?;
            // Every directory from the workspace down to it may have
            // changed (a new entry in each).
            changed.extend(
                real.ancestors()
                    .take_while(|a| a.starts_with(ws))
                    .map(Path::to_path_buf),
            );
        }
        out.push(real);
    }
    if !changed.is_empty() {
        // retie's own change to the workspace must not look like one made
        // during the run (see overlay::changed_during_run).
        crate::overlay::wait_past_changes_of(&changed);
    }
    Ok(out)
}

/// `p` with its longest existing ancestor resolved (symlinks and all).
pub fn real_path(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut base = p;
    loop {
        if let Ok(r) = std::fs::canonicalize(base) {
            let mut out = r;
            for c in rest.iter().rev() {
                out.push(c);
            }
            return out;
        }
        match (base.file_name(), base.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n.to_owned());
                base = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_directories_are_refused_unless_the_flag_allows() {
        let o = GuardOptions::default();
        assert!(workspace(Path::new("/etc"), &[], &o).is_err());
        assert!(workspace(Path::new("/usr/lib"), &[], &o).is_err());
        let flag = GuardOptions {
            system_flag: Some(("--allow-system-workspace", false)),
            ..Default::default()
        };
        let e = workspace(Path::new("/"), &[], &flag).expect_err("refused");
        assert!(e.to_string().contains("--allow-system-workspace"), "{e}");
        let yes = GuardOptions {
            system_flag: Some(("--allow-system-workspace", true)),
            ..Default::default()
        };
        let g = workspace(Path::new("/"), &[], &yes).expect("allowed");
        assert!(g.system.is_some());
    }

    #[test]
    fn a_workspace_inside_retie_state_is_refused_but_its_own_scratch() {
        let t = tempfile::tempdir().expect("tmp");
        let state = std::fs::canonicalize(t.path())
            .expect("canon")
            .join("state");
        let scratch = state.join("retest");
        let ws = scratch.join("scratch-1");
        std::fs::create_dir_all(&ws).expect("mkdir");
        let dirs = [("state", state.clone())];
        let e = workspace(&ws, &dirs, &GuardOptions::default()).expect_err("refused");
        assert!(e.to_string().contains("inside retie's own state"), "{e}");
        let o = GuardOptions {
            retie_scratch: Some(scratch.clone()),
            ..Default::default()
        };
        workspace(&ws, &dirs, &o).expect("retie's own scratch");
        // The scratch area itself is no workspace.
        assert!(workspace(&scratch, &dirs, &o).is_err());
    }
}
