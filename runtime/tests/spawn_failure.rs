//! When init cannot start the command's child (here: RLIMIT_NPROC already
//! reached), the run fails as an exec error carrying the clone's errno,
//! not as a tampered status channel: after `Ready`, `ExecFailed` is the
//! channel's one legal failure (a `SetupFailed` there reads as forged).
//!
//! Its own harness (`harness = false`): `retie_runtime::run` needs a
//! single-threaded process, which libtest's is not.

use retie_runtime::profile::Limits;
use retie_runtime::{RuntimeError, Sandbox, Stdio};

fn main() {
    let ws = tempfile::tempdir().expect("tempdir");
    let spec = Sandbox::builder(["true"])
        .workspace(ws.path())
        .limits(Limits {
            nproc: Some(1),
            ..Limits::default()
        })
        .build()
        .expect("spec");
    match retie_runtime::run(&spec, Stdio::Inherit) {
        Err(RuntimeError::Exec {
            program,
            exit_code,
            reason,
        }) => {
            assert_eq!((program.as_str(), exit_code), ("true", 126), "{reason}");
            println!("spawn_failure: ok ({reason})");
        }
        other => panic!("expected an exec error with the clone's errno, got {other:?}"),
    }
}
