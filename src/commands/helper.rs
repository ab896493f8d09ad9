//! `retie __sandbox-helper`: the single-threaded helper a multi-threaded
//! program (the agent) spawns to run one sandbox. See
//! `retie_runtime::helper`. Its command line is read by
//! [`retie_runtime::helper::HelperArgs`], the one parser both helper
//! binaries share (`retie-sandbox-helper` takes the same): clap only
//! hands the words over.

use clap::Args;
use retie_runtime::helper::{HelperArgs as Parsed, HELPER_USAGE};

#[derive(Args)]
pub struct HelperArgs {
    /// `--reply-fd N [--request-fd M]`, or `--print-request --workspace
    /// DIR -- CMD...` (see `retie_runtime::helper::HelperArgs`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub words: Vec<String>,
}

pub fn run(args: HelperArgs) -> i32 {
    match Parsed::parse(args.words) {
        Ok(parsed) => parsed.run(),
        Err(problem) => {
            eprintln!("retie __sandbox-helper: {problem}\n{HELPER_USAGE}");
            crate::error::EXIT_FAILED
        }
    }
}
