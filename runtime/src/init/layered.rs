//! Step 5b: the layered view, after `$HOME` and the profile's tmpfs and
//! before the workspace: extra throwaway tmpfs directories, read-only binds
//! that may lie beneath them (a toolchain under the invoker's home), and
//! the hides that cover what must not be read inside those binds.
//!
//! It sits after the scratch mounts because the binds often live under a
//! path that is a tmpfs inside (`/root`, `/tmp`), and before the workspace
//! because a workspace may live inside a bound directory (a Go project
//! under `GOPATH`): the workspace is mounted on top, not hidden.
//!
//! Every hide is checked after it is mounted. A hide that cannot be
//! applied, or that does not hold, fails the run: a credential file that
//! stays readable is never a silent degradation.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::rootfs::host;
use super::{
    bind, cpath, make_readonly, mount, mountpoint, owned_tmpfs, MountFlags, SetupError, StepResult,
};
use crate::spec::{HideKind, SandboxSpec};

const STEP: &str = "layered view";
/// Where the empty file that covers hidden files is staged (detached again
/// before the command starts).
const STAGE: &str = "/.retie-hide";
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// One mount of the layered view, in the order they are applied.
enum Op<'a> {
    Scratch(&'a Path),
    /// A layered bind: its index in `spec.layered_binds`.
    Bind(usize),
}

/// Mount the scratch directories and the layered binds (shallowest first,
/// a scratch before a bind at the same depth), then apply the hides.
/// `trees` holds a root supervisor's detached trees, one per layered bind.
pub fn mount_layered(spec: &SandboxSpec, trees: &[OwnedFd]) -> StepResult {
    let mut ops: Vec<(usize, u8, Op<'_>)> = spec
        .scratch
        .iter()
        .map(|p| (depth(p), 0, Op::Scratch(p)))
        .chain(
            spec.layered_binds
                .iter()
                .enumerate()
                .map(|(i, b)| (depth(&b.inside), 1, Op::Bind(i))),
        )
        .collect();
    ops.sort_by_key(|(d, k, _)| (*d, *k));
    for (_, _, op) in ops {
        let hint = "`retie sandbox explain` shows each bind and the rule that added it; `--toolchain none` leaves the toolchains out";
        match op {
            Op::Scratch(dir) => scratch(spec, dir).map_err(|e| e.hint(hint))?,
            Op::Bind(i) => {
                let b = &spec.layered_binds[i];
                match trees.get(i) {
                    Some(tree) => attach(tree, &b.inside),
                    None => bind_host(&b.host, &b.inside),
                }
                .map_err(|e| e.hint(hint))?;
            }
        }
    }
    hide_all(spec)
}

fn bind_host(src: &Path, dst: &Path) -> StepResult {
    let from = host(src);
    let meta = std::fs::metadata(&from)
        .map_err(|e| SetupError::io(STEP, format!("layered bind {}", src.display()), e))?;
    mountpoint(STEP, dst, meta.is_dir())?;
    bind(STEP, &from, dst)?;
    make_readonly(STEP, dst)
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

fn scratch(spec: &SandboxSpec, dir: &Path) -> StepResult {
    mountpoint(STEP, dir, true)?;
    owned_tmpfs(
        STEP,
        dir,
        "0755",
        &spec.profile.filesystem.tmpfs_size(),
        &spec.identity,
    )
}

fn attach(tree: &OwnedFd, dst: &Path) -> StepResult {
    let meta = fstat(tree, dst)?;
    mountpoint(STEP, dst, meta.st_mode & libc::S_IFMT == libc::S_IFDIR)?;
    crate::sys::move_mount_fd(tree, &cpath(dst))
        .map_err(|e| SetupError::io(STEP, format!("attaching {}", dst.display()), e))?;
    make_readonly(STEP, dst)
}

fn fstat(fd: &OwnedFd, what: &Path) -> StepResult<rustix::fs::Stat> {
    rustix::fs::fstat(fd).map_err(|e| {
        SetupError::io(
            STEP,
            format!("fstat of the tree for {}", what.display()),
            e.into(),
        )
    })
}

/// Cover every hidden path, then check each one holds.
fn hide_all(spec: &SandboxSpec) -> StepResult {
    if spec.hides.is_empty() {
        return Ok(());
    }
    let stage = Path::new(STAGE);
    let empty = stage.join("empty");
    let files = spec.hides.iter().any(|h| h.kind == HideKind::File);
    if files {
        mountpoint(STEP, stage, true)?;
        mount(
            STEP,
            "tmpfs",
            stage,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            Some("mode=0700,size=4k"),
        )?;
        std::fs::write(&empty, b"")
            .map_err(|e| SetupError::io(STEP, "creating the empty cover file", e))?;
    }
    for h in &spec.hides {
        let before = std::fs::symlink_metadata(&h.path).map_err(|e| {
            SetupError::io(STEP, format!("hiding {}", h.path.display()), e).hint(
                "the path changed between retie's look at the host and the sandbox's set-up; run again",
            )
        })?;
        let fits = match h.kind {
            HideKind::Dir => before.is_dir(),
            HideKind::File => before.is_file(),
        };
        if !fits {
            return Err(SetupError {
                step: STEP,
                message: format!(
                    "cannot hide {}: expected a {}, found a {}",
                    h.path.display(),
                    kind_name(h.kind),
                    type_name(&before)
                ),
                hint: Some(
                    "the path changed between retie's look at the host and the sandbox's set-up; run again"
                        .into(),
                ),
            });
        }
        match h.kind {
            HideKind::Dir => mount(
                STEP,
                "tmpfs",
                &h.path,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY,
                Some("mode=000,size=4k"),
            )?,
            HideKind::File => {
                bind(STEP, &empty, &h.path)?;
                make_readonly(STEP, &h.path)?;
            }
        }
        verify(&h.path, h.kind, &before)?;
    }
    if files {
        // The binds of the empty file keep their own reference.
        rustix::mount::unmount(stage, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| SetupError::io(STEP, "detaching the hide staging", e.into()))?;
        std::fs::remove_dir(stage)
            .map_err(|e| SetupError::io(STEP, "rmdir the hide staging", e))?;
    }
    Ok(())
}

/// The hide holds: a directory is now an empty tmpfs, a file is now an
/// empty file that is not the one that was there.
fn verify(path: &Path, kind: HideKind, before: &std::fs::Metadata) -> StepResult {
    let fail = |what: String| SetupError {
        step: STEP,
        message: format!("the cover over {} does not hold: {what}", path.display()),
        hint: Some("report this: retie refuses to run with a readable credential".into()),
    };
    let after = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if after.dev() == before.dev() && after.ino() == before.ino() {
        return Err(fail("the original is still in place".into()));
    }
    match kind {
        HideKind::Dir => {
            let st = rustix::fs::statfs(path).map_err(|e| fail(e.to_string()))?;
            if st.f_type != TMPFS_MAGIC {
                return Err(fail("not covered by a tmpfs".into()));
            }
            let entries = std::fs::read_dir(path)
                .map_err(|e| fail(e.to_string()))?
                .count();
            if entries != 0 {
                return Err(fail(format!("{entries} entries visible")));
            }
        }
        HideKind::File => {
            if !after.is_file() || after.len() != 0 {
                return Err(fail("not an empty file".into()));
            }
        }
    }
    Ok(())
}

fn kind_name(k: HideKind) -> &'static str {
    match k {
        HideKind::Dir => "directory",
        HideKind::File => "regular file",
    }
}

fn type_name(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "regular file"
    } else if t.is_symlink() {
        "symlink"
    } else {
        "special file"
    }
}
