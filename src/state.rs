//! Where retie keeps its state: `$XDG_STATE_HOME/retie`, else
//! `~/.local/state/retie`, created with mode 0700.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use crate::error::CliError;

/// `$VAR` if it is an absolute path, else `$HOME/fallback` (the XDG base
/// directory rule); `None` when neither is usable.
pub fn xdg_base(var: &str, fallback: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(fallback))
        })
}

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
