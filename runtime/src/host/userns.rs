//! The id maps of the sandbox's user namespace, written from outside by
//! the supervisor (or, in the lab modes, by the net stage).
//!
//! The supervisor writes them from outside, in the parent namespace: an
//! ordinary user may map only its own uid/gid (after `setgroups deny`),
//! and root may map the sandbox to an unprivileged host id, which a
//! process inside the namespace could not do for itself.

use crate::error::{Result, RuntimeError};
use crate::spec::Identity;

/// Write `setgroups`, `uid_map` and `gid_map` for `pid`.
pub fn write_maps(pid: libc::pid_t, id: &Identity) -> Result<()> {
    let base = format!("/proc/{pid}");
    let write = |file: &str, data: String| {
        std::fs::write(format!("{base}/{file}"), data.as_bytes()).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (is this uid allowed to create user namespaces? see `retie selftest`)"
            } else {
                ""
            };
            RuntimeError::host(format!("writing {base}/{file}{hint}"), e)
        })
    };
    // Deny setgroups first: required before an unprivileged gid_map, and it
    // keeps the sandbox from ever adding groups back.
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{} {} 1\n", id.inner_uid, id.host_uid))?;
    write("gid_map", format!("{} {} 1\n", id.inner_gid, id.host_gid))?;
    Ok(())
}
