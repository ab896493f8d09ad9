//! One module per subcommand.

pub mod changes;
pub mod chat;
pub mod demo;
pub mod gc;
pub mod generate;
pub mod helper;
pub mod lab;
pub mod ledger_cmd;
pub mod log;
pub mod models;
pub mod net;
pub mod netdiff;
pub mod pending;
pub mod policy;
pub mod probe;
pub mod progress;
pub mod replay;
pub mod report;
pub mod retest;
pub mod run;
pub mod runs;
pub mod sandbox;
pub mod scope;
pub mod selftest;
pub mod sessions;
pub mod toolchain;
pub mod undo;
pub mod verify;

/// The workspace guards of `retie_dispatch::guard` (one place for every
/// entry point) with retie's own directories as this process sees them
/// (the ledger's included); a refusal is a usage error.
pub(crate) fn guard_workspace(
    ws: &std::path::Path,
    ledger: &std::path::Path,
    opts: retie_dispatch::guard::GuardOptions,
) -> Result<retie_dispatch::guard::Guarded, crate::error::CliError> {
    let dirs = crate::state::retie_dirs(Some(ledger));
    retie_dispatch::guard::workspace(ws, &dirs, &opts).map_err(|e| match e {
        retie_dispatch::Error::Invalid(m) => crate::error::CliError::Usage(m),
        e => e.into(),
    })
}
