//! The helper alone (`retie-sandbox-helper`) serves a request like `retie
//! __sandbox-helper`: the command's exit code, its output, a typed exec
//! error. And `helper::beside` finds it next to a caller's binary.

use std::io::Read;
use std::path::Path;

use retie_runtime::helper::{beside, run_via_helper_with, SMALL_HELPER};
use retie_runtime::{RuntimeError, Sandbox, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_retie-sandbox-helper");

#[test]
fn the_small_helper_runs_a_sandbox_like_retie() {
    let ws = tempfile::tempdir().expect("tempdir");
    let spec = Sandbox::builder(["sh", "-c", "echo inside; exit 7"])
        .workspace(ws.path())
        .build()
        .expect("spec");
    let (r, w) = rustix::pipe::pipe().expect("pipe");
    let out = run_via_helper_with(
        Path::new(EXE),
        &spec,
        Stdio::Fds {
            stdin: None,
            stdout: Some(w),
            stderr: None,
        },
    )
    .expect("outcome");
    let mut text = String::new();
    std::fs::File::from(r)
        .read_to_string(&mut text)
        .expect("read");
    assert_eq!((out.exit_code, text.as_str()), (7, "inside\n"));
    assert!(out.seccomp && out.landlock_enforced, "{out:?}");

    let missing = Sandbox::builder(["no-such-command-here"])
        .workspace(ws.path())
        .build()
        .expect("spec");
    match run_via_helper_with(Path::new(EXE), &missing, Stdio::Inherit) {
        Err(RuntimeError::Exec { exit_code, .. }) => assert_eq!(exit_code, 127),
        other => panic!("expected an exec error, got {other:?}"),
    }
}

#[test]
fn beside_prefers_the_small_helper_and_falls_back_to_the_caller() {
    let exe = Path::new(EXE);
    let caller = exe.with_file_name("retie");
    assert_eq!(beside(&caller), exe.with_file_name(SMALL_HELPER));
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let alone = elsewhere.path().join("retie");
    assert_eq!(beside(&alone), alone);
}
