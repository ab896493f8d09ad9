//! The ledger lives in its own crate (`retie-ledger`); the binary adds
//! what only the CLI needs: the test and benchmark tools (the recorder
//! of every action is `retie_dispatch::record`).

pub mod dev;

pub use retie_ledger::*;

use crate::error::CliError;

/// The ledger's location: `--ledger`, else `RETIE_LEDGER`, else
/// `[ledger] url` in config.toml (a shared PostgreSQL ledger, ADR 0460),
/// else `STATE/retie/ledger.db`. Shadows the crate's rule, which knows
/// no config file; a config that does not parse is an error naming it,
/// only when it is consulted.
pub fn resolve_path(arg: Option<&std::path::Path>) -> Result<std::path::PathBuf> {
    let explicit = arg.is_some() || std::env::var_os("RETIE_LEDGER").is_some_and(|p| !p.is_empty());
    if !explicit {
        let (cfg, path) = crate::commands::gc::config()
            .map_err(|e| Error::Invalid(format!("reading the config: {e}")))?;
        if let Some(url) = cfg.ledger.url.filter(|u| !u.is_empty()) {
            if !pg::is_url(std::path::Path::new(&url)) {
                return Err(Error::Invalid(format!(
                    "{}: [ledger] url must be a postgres:// URL (for a file, set RETIE_LEDGER or pass --ledger)",
                    path.display()
                )));
            }
            return Ok(std::path::PathBuf::from(url));
        }
    }
    retie_ledger::resolve_path(arg)
}

/// The full id of the session `given` names: itself, or the one session
/// whose id starts with it (`retie replay 3804`). No session, or more
/// than one, is a usage error that lists the candidates. A ledger that
/// does not exist yet leaves `given` as it is (the command says what is
/// missing).
pub fn full_session_id(
    ledger: Option<&std::path::Path>,
    given: &str,
) -> std::result::Result<String, CliError> {
    let path = resolve_path(ledger)?;
    if !exists(&path) {
        return Ok(given.to_string());
    }
    let l = Ledger::open(&path, false, None)?;
    let found = l.sessions_starting_with(given, 11)?;
    drop(l);
    pick_unique(given, found)
}

/// `given` among the ids that start with it (sorted, at most 11).
pub fn pick_unique(given: &str, found: Vec<String>) -> std::result::Result<String, CliError> {
    if found.iter().any(|id| id == given) {
        return Ok(given.to_string());
    }
    match found.len() {
        0 => Err(CliError::Usage(format!(
            "no session id starts with {} (`retie sessions --all` lists them)",
            crate::ui::visible(given)
        ))),
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        n => Err(CliError::Usage(format!(
            "{} is ambiguous: {}{}; give more of the id",
            crate::ui::visible(given),
            found
                .iter()
                .take(10)
                .map(|s| crate::ui::visible(s))
                .collect::<Vec<_>>()
                .join(", "),
            if n > 10 { ", ..." } else { "" }
        ))),
    }
}

#[cfg(test)]
mod prefix_tests {
    use super::pick_unique;

    #[test]
    fn a_unique_prefix_names_its_session_and_an_ambiguous_one_lists_them() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            pick_unique("38", ids(&["3804aa"])).expect("unique"),
            "3804aa"
        );
        assert_eq!(
            pick_unique("38", ids(&["38", "3804aa"])).expect("exact"),
            "38"
        );
        let e = pick_unique("3", ids(&["3804aa", "3911bb"])).expect_err("ambiguous");
        let e = e.to_string();
        assert!(
            e.contains("ambiguous") && e.contains("3804aa") && e.contains("3911bb"),
            "{e}"
        );
        let e = pick_unique("zz", Vec::new()).expect_err("none").to_string();
        assert!(e.contains("no session id starts with zz"), "{e}");
    }
}
