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

/// The marker of the Landlock notice last shown (ADR 0430).
const LANDLOCK_NOTICE: &str = "landlock-notice";

/// Say once, on stderr, what is weaker with the Landlock ABI in use here
/// (ADR 0430): the first time a command starts sandboxes from `state`
/// with this ABI (kernel, cap), then not again until it changes.
/// `retie selftest` says it every time. Nothing is said on a kernel with
/// every wall, and an unreadable or unwritable marker only means the
/// line is said again: the preflight refuses a bad cap with its own error.
pub fn landlock_notice_once(state: &std::path::Path) {
    let Ok(abi) = retie_runtime::preflight::landlock_in_use() else {
        return;
    };
    let Some(line) = retie_runtime::preflight::landlock_notice(&abi) else {
        return;
    };
    let key = format!(
        "used {} kernel {} cap {:?}\n",
        abi.used, abi.kernel, abi.cap
    );
    let marker = state.join(LANDLOCK_NOTICE);
    if std::fs::read_to_string(&marker).is_ok_and(|k| k == key) {
        return;
    }
    eprintln!("{line}");
    let _ = std::fs::write(&marker, key);
}
