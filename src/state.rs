//! Where retie keeps its state: `$XDG_STATE_HOME/retie`, else
//! `~/.local/state/retie`, created with mode 0700.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use crate::error::CliError;

/// The XDG base directory rule: one copy, in the ledger crate (the
/// lowest crate that needs it).
pub use retie_ledger::xdg_base;

/// The state directory, created if missing.
pub fn dir() -> Result<PathBuf, CliError> {
    let base = xdg_base("XDG_STATE_HOME", ".local/state").ok_or_else(|| {
        CliError::Usage(
            "neither XDG_STATE_HOME nor HOME is set: retie needs a state directory".into(),
        )
    })?;
    let dir = base.join("retie");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| CliError::io(format!("creating the state directory {}", dir.display()), e))?;
    Ok(dir)
}

/// Every directory retie keeps something in: the user key (config), overlay
/// runs, snapshots and the default ledger (state), data, the ledger's own
/// directory and the named checkpoint copy's. None of them may be within a
/// sandboxed command's reach: `retie sandbox exec` masks each one that lies
/// inside the workspace and never applies a change beneath it.
pub fn retie_dirs(ledger: Option<&std::path::Path>) -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    for (what, var, fallback) in [
        ("config", "XDG_CONFIG_HOME", ".config"),
        ("state", "XDG_STATE_HOME", ".local/state"),
        ("data", "XDG_DATA_HOME", ".local/share"),
    ] {
        if let Some(b) = xdg_base(var, fallback) {
            out.push((what, b.join("retie")));
        }
    }
    if let Some(l) = ledger.and_then(std::path::Path::parent) {
        out.push(("ledger", l.to_path_buf()));
    }
    if let Some(c) = std::env::var_os("RETIE_CHECKPOINT_COPY").map(PathBuf::from) {
        if let Some(d) = c.parent().filter(|_| c.is_absolute()) {
            out.push(("checkpoint copy", d.to_path_buf()));
        }
    }
    out
}
