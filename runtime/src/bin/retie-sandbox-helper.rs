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

use retie_runtime::EXIT_SANDBOX_FAILED;

fn main() {
    std::process::exit(match parse(std::env::args().skip(1)) {
        Ok((reply, request)) => retie_runtime::helper::serve(reply, request),
        Err(problem) => {
            eprintln!("retie-sandbox-helper: {problem}");
            eprintln!(
                "usage: retie-sandbox-helper [__sandbox-helper] --reply-fd N [--request-fd M]"
            );
            EXIT_SANDBOX_FAILED
        }
    })
}

/// `(reply_fd, request_fd)`; the request fd defaults to 4, as in retie.
fn parse(args: impl Iterator<Item = String>) -> Result<(i32, i32), String> {
    let (mut reply, mut request) = (None, 4);
    let mut args = args.peekable();
    if args.peek().map(String::as_str) == Some("__sandbox-helper") {
        args.next();
    }
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (arg, None),
        };
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => return Err(format!("{flag} needs a value")),
        };
        let fd: i32 = value
            .parse()
            .map_err(|_| format!("{flag}: not a descriptor number"))?;
        match flag.as_str() {
            "--reply-fd" => reply = Some(fd),
            "--request-fd" => request = fd,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    reply
        .map(|r| (r, request))
        .ok_or_else(|| "--reply-fd is required".to_string())
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn p(a: &[&str]) -> Result<(i32, i32), String> {
        parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn takes_retie_helpers_arguments() {
        assert_eq!(p(&["__sandbox-helper", "--reply-fd", "3"]), Ok((3, 4)));
        assert_eq!(p(&["--reply-fd=5", "--request-fd", "6"]), Ok((5, 6)));
        for bad in [
            &[][..],
            &["--reply-fd"],
            &["--reply-fd", "x"],
            &["--request-fd", "4"],
            &["--reply-fd", "3", "--print-request"],
            &["--reply-fd", "3", "extra"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
