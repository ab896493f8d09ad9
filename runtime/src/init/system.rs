//! Step 3: the read-only system view from the profile, and the few files
//! retie writes itself (passwd, group, hosts, hostname, resolv.conf).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::rootfs::host;
use std::os::fd::OwnedFd;

use super::{bind, make_readonly, mountpoint, SetupError, StepResult};
use crate::spec::SandboxSpec;

const STEP: &str = "system";

/// Bind every `ro` / `ro_optional` path and the `/etc` subset.
pub fn bind_system(spec: &SandboxSpec, ro_trees: &[OwnedFd]) -> StepResult {
    let fs = &spec.profile.filesystem;
    for p in &fs.ro {
        expose(p, p, true)?;
    }
    for p in &fs.ro_optional {
        expose(p, p, false)?;
    }
    std::fs::create_dir_all("/etc").map_err(|e| SetupError::io(STEP, "mkdir /etc", e))?;
    for name in &fs.etc {
        let p = Path::new("/etc").join(name);
        expose(&p, &p, false)?;
    }
    if ro_trees.is_empty() {
        for b in &spec.ro_binds {
            expose(&b.host, &b.inside, true)?;
        }
    } else {
        for (b, tree) in spec.ro_binds.iter().zip(ro_trees) {
            attach(tree, &b.inside)?;
        }
    }
    Ok(())
}

/// Regular files up to this size are copied onto the (read-only) root
/// instead of bound: a copy costs a few syscalls, a bind costs a mount that
/// must also be torn down.
const COPY_MAX: u64 = 256 * 1024;

/// Expose host path `src` at `dst`: a symlink is recreated as the same
/// symlink, a small regular file is copied, anything else is bound
/// read-only.
fn expose(src: &Path, dst: &Path, required: bool) -> StepResult {
    let h = host(src);
    let meta = match std::fs::symlink_metadata(&h) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(()),
        Err(e) => {
            return Err(SetupError::io(
                STEP,
                format!("{} (required by the profile)", src.display()),
                e,
            ))
        }
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = std::fs::read_link(&h)
            .map_err(|e| SetupError::io(STEP, format!("readlink {}", src.display()), e))?;
        return match symlink(&target, dst) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = dst.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| {
                        SetupError::io(STEP, format!("mkdir {}", parent.display()), e)
                    })?;
                }
                symlink(&target, dst)
                    .map_err(|e| SetupError::io(STEP, format!("symlink {}", dst.display()), e))
            }
            Err(e) => Err(SetupError::io(
                STEP,
                format!("symlink {}", dst.display()),
                e,
            )),
        };
    }
    if ft.is_file() && meta.len() <= COPY_MAX && dst.starts_with("/etc") {
        let data = std::fs::read(&h)
            .map_err(|e| SetupError::io(STEP, format!("reading {}", src.display()), e))?;
        return std::fs::write(dst, data)
            .map_err(|e| SetupError::io(STEP, format!("writing {}", dst.display()), e));
    }
    mountpoint(STEP, dst, ft.is_dir())?;
    bind(STEP, &h, dst)?;
    make_readonly(STEP, dst)
}

/// Attach a detached tree (opened by the supervisor) read-only at `dst`.
fn attach(tree: &OwnedFd, dst: &Path) -> StepResult {
    let st = rustix::fs::fstat(tree).map_err(|e| {
        SetupError::io(
            STEP,
            format!("fstat of the tree for {}", dst.display()),
            e.into(),
        )
    })?;
    mountpoint(STEP, dst, st.st_mode & libc::S_IFMT == libc::S_IFDIR)?;
    crate::sys::move_mount_fd(tree, &super::cpath(dst))
        .map_err(|e| SetupError::io(STEP, format!("attaching {}", dst.display()), e))?;
    make_readonly(STEP, dst)
}

/// `/etc/hosts`: localhost, and in the lab modes `lab` and the lab's name
/// mapped to the lab's address (the only name that resolves there).
fn hosts(spec: &SandboxSpec) -> String {
    let mut h = String::from("127.0.0.1\tlocalhost retie\n::1\tlocalhost ip6-localhost\n");
    if let Some(lab) = spec.net.lab() {
        h.push_str(&format!(
            "{}\tlab {}\n",
            crate::host::net_stage::LAB_ADDRESS,
            lab.name
        ));
    }
    h
}

/// Write the synthesized identity and name-service files.
pub fn synthesize_etc(spec: &SandboxSpec) -> StepResult {
    let id = &spec.identity;
    let home = id.home.display();
    let mut passwd = String::new();
    let mut group = String::new();
    if id.inner_uid != 0 {
        passwd.push_str("root:x:0:0:root:/root:/bin/sh\n");
    }
    passwd.push_str(&format!(
        "{}:x:{}:{}:{}:{home}:/bin/sh\n",
        id.user, id.inner_uid, id.inner_gid, id.user
    ));
    if id.inner_uid != 65534 {
        passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    }
    if id.inner_gid != 0 {
        group.push_str("root:x:0:\n");
    }
    group.push_str(&format!(
        "{}:x:{}:\n",
        if id.inner_gid == 0 { "root" } else { &id.user },
        id.inner_gid
    ));
    if id.inner_gid != 65534 {
        group.push_str("nogroup:x:65534:\n");
    }
    let files: [(&str, String); 5] = [
        ("passwd", passwd),
        ("group", group),
        ("hosts", hosts(spec)),
        ("hostname", "retie\n".into()),
        // No nameserver: nothing inside resolves a name over the network.
        (
            "resolv.conf",
            "# retie: no DNS inside the sandbox\noptions attempts:1 timeout:1\n".into(),
        ),
    ];
    for (name, text) in files {
        let p: PathBuf = Path::new("/etc").join(name);
        std::fs::write(&p, text)
            .map_err(|e| SetupError::io(STEP, format!("writing {}", p.display()), e))?;
    }
    Ok(())
}
