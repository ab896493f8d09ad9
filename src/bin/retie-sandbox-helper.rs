//! `retie-sandbox-helper`: the sandbox helper alone, without the rest of
//! retie's image (agent, ledger, CLI). It serves one request exactly like
//! `retie __sandbox-helper` and takes the same arguments:
//!
//! ```text
//! retie-sandbox-helper [__sandbox-helper] --reply-fd N [--request-fd M]
//! ```
//!
//! so [`retie_runtime::helper::run_via_helper_with`] drives either. A
//! start of the small image costs less than one of the whole retie binary
//! (fewer pages to fault in and relocate, a smaller argument parser): see
//! docs/adr/0006-static-binary.md, third pass. Callers find it with
//! [`retie_runtime::helper::beside`].

/// In musl builds (the default, ADR 0416) Rust's allocations go to
/// dlmalloc: musl's own malloc spreads small allocations over more fresh
/// pages, and every first touch of a page is a fault (about 2 µs in a VM).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

use retie_runtime::helper::{HelperArgs, HELPER_USAGE};
use retie_runtime::EXIT_SANDBOX_FAILED;

fn main() {
    std::process::exit(match HelperArgs::parse(std::env::args().skip(1)) {
        Ok(args) => args.run(),
        Err(problem) => {
            eprintln!("retie-sandbox-helper: {problem}");
            eprintln!("{HELPER_USAGE}");
            EXIT_SANDBOX_FAILED
        }
    })
}
