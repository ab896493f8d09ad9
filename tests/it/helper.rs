//! The helper process, as a multi-threaded program uses it: the request is
//! the spec itself (an overlay run stays an overlay run), errors come back
//! typed with their exit codes and hints, output can be captured with a
//! cap, and a `SandboxJob` dispatched through the helper from a threaded
//! program records and applies exactly what the CLI does.

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use retie_dispatch::overlay::{root_owner, ChangesMode, Snapshots};
use retie_dispatch::record::SessionSpec;
use retie_dispatch::sandbox::{JobMode, JobUi, Runner, SandboxJob};
use retie_dispatch::{dispatch, CommandLine, Dispatched, Proposal, Recorder};
use retie_policy::{Action, Context, Policy};
use retie_runtime::{helper, RuntimeError, Sandbox};
use serde_json::json;

use crate::harness::*;

/// The test process itself must be multi-threaded for these tests to mean
/// anything: a few threads, and the count checked.
struct Threads {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Threads {
    fn start(n: usize) -> Threads {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                })
            })
            .collect();
        let t = Threads { stop, handles };
        let count = thread_count();
        assert!(
            count > n,
            "expected more than {n} threads, /proc says {count}"
        );
        t
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Threads: line")
}

/// Exit 127 and 126 come back as the same typed error an in-process run
/// returns (and the CLI exits with), not a string.
#[test]
fn exec_failures_come_back_typed_with_their_exit_codes() {
    let _threads = Threads::start(2);
    let s = Scratch::new(Leg::Invoker);
    let spec = Sandbox::builder(["retie-no-such-command"])
        .workspace(&s.ws)
        .build()
        .expect("spec");
    match helper::run_via_helper(&bin(Leg::Invoker), &spec) {
        Err(RuntimeError::Exec {
            exit_code, program, ..
        }) => {
            assert_eq!(exit_code, 127);
            assert_eq!(program, "retie-no-such-command");
        }
        other => panic!("expected Exec 127, got {other:?}"),
    }
    let cli = s.exec(&[], &["retie-no-such-command"]);
    assert_code(&cli, 127, "the CLI agrees");

    write(&s, "not-exec.sh", "echo hi\n");
    std::fs::set_permissions(
        s.ws.join("not-exec.sh"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let spec = Sandbox::builder([s.ws.join("not-exec.sh")])
        .workspace(&s.ws)
        .build()
        .expect("spec");
    match helper::run_via_helper(&bin(Leg::Invoker), &spec) {
        Err(e @ RuntimeError::Exec { exit_code: 126, .. }) => assert_eq!(e.exit_code(), 126),
        other => panic!("expected Exec 126, got {other:?}"),
    }
}

/// A set-up failure keeps its step and its hint across the process
/// boundary.
#[test]
fn setup_failures_come_back_with_their_step_and_hint() {
    let _threads = Threads::start(2);
    let s = Scratch::new(Leg::Invoker);
    let spec = Sandbox::builder(["true"])
        .workspace(&s.ws)
        // Beneath the read-only /usr: the scratch directory cannot be made.
        .scratch("/usr/retie-it-no-such-scratch")
        .build()
        .expect("spec");
    match helper::run_via_helper(&bin(Leg::Invoker), &spec) {
        Err(e @ RuntimeError::Setup { .. }) => {
            assert_eq!(e.exit_code(), 125);
            assert!(e.to_string().contains("fix:"), "{e}");
            let RuntimeError::Setup { step, hint, .. } = e else {
                unreachable!()
            };
            assert!(!step.is_empty());
            let hint = hint.expect("a hint");
            assert!(hint.contains("--toolchain none"), "{hint}");
        }
        other => panic!("expected a set-up failure with a hint, got {other:?}"),
    }
}

/// Output is captured up to the cap; the rest is counted, dropped and
/// reported; a command writing far more than a pipe holds cannot hang.
#[test]
fn output_is_captured_up_to_a_cap() {
    let _threads = Threads::start(2);
    let s = Scratch::new(Leg::Invoker);
    let spec = Sandbox::builder([
        "sh",
        "-c",
        "head -c 300000 /dev/zero | tr '\\0' x; echo to-stderr >&2; exit 4",
    ])
    .workspace(&s.ws)
    .timeout(Duration::from_secs(30))
    .build()
    .expect("spec");
    let run = helper::run_via_helper_captured(&bin(Leg::Invoker), &spec, 1000).expect("run");
    assert_eq!(run.outcome.exit_code, 4);
    assert_eq!(run.stdout.bytes, vec![b'x'; 1000]);
    assert_eq!(run.stdout.total, 300_000);
    assert!(run.stdout.truncated);
    assert_eq!(run.stderr.bytes, b"to-stderr\n");
    assert_eq!(run.stderr.total, 10);
    assert!(!run.stderr.truncated);
}

const CLIENT_WS: &str = "RETIE_IT_CLIENT_WS";
const CLIENT_BIN: &str = "RETIE_IT_CLIENT_RETIE";
const SCRIPT: &str = "echo new > f.txt; echo added > g.txt; echo written; sleep 1";

/// Issue 10: an overlay run through the helper, from a multi-threaded
/// program, captures the changes and applies them exactly like the CLI
/// (same files, same ledger entries, `verify` passes), and the real
/// workspace is not written while the command runs. Before the fix the
/// helper's request had no workspace mode: the run went direct and wrote
/// the workspace in place.
#[test]
fn overlay_run_through_the_helper_from_a_threaded_program_matches_the_cli() {
    for leg in legs() {
        let cli = Scratch::new(leg);
        write(&cli, "f.txt", "old\n");
        let o = cli.sh(SCRIPT);
        assert_code(&o, 0, "the CLI run");

        let s = Scratch::new(leg);
        write(&s, "f.txt", "old\n");
        let o = threaded_client(&s).output().expect("run the client");
        assert!(
            o.status.success() && stdout(&o).contains("test result: ok. 1 passed"),
            "{leg:?}: the threaded client failed ({:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            o.status,
            stdout(&o),
            stderr(&o)
        );

        for f in ["f.txt", "g.txt"] {
            assert_eq!(
                std::fs::read_to_string(s.ws.join(f)).ok(),
                std::fs::read_to_string(cli.ws.join(f)).ok(),
                "{leg:?}: {f}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(s.ws.join("f.txt")).ok().as_deref(),
            Some("new\n")
        );
        let (helper_kinds, helper_outcome) = ledger_of(&s);
        let (cli_kinds, cli_outcome) = ledger_of(&cli);
        assert_eq!(helper_kinds, cli_kinds, "{leg:?}: ledger entries");
        for k in [
            "action_proposed",
            "decision",
            "intent",
            "changes",
            "outcome",
        ] {
            assert!(
                helper_kinds.iter().any(|h| h == k),
                "{leg:?}: no {k} in {helper_kinds:?}"
            );
        }
        for key in ["status", "changes", "exit_code"] {
            assert_eq!(
                helper_outcome[key], cli_outcome[key],
                "{leg:?}: outcome {key}: {helper_outcome} vs {cli_outcome}"
            );
        }
        assert_eq!(helper_outcome["status"], "applied", "{helper_outcome}");
        let ledger = default_ledger(&s);
        let mut v = s.retie();
        v.args(["verify", "--ledger", path_str(&ledger)])
            .stdin(Stdio::null());
        let o = v.output().expect("verify");
        assert_code(&o, 0, "verify the helper run's ledger");
    }
}

fn default_ledger(s: &Scratch) -> PathBuf {
    s.home.join(".local/state/retie/ledger.db")
}

/// Entry kinds of the ledger (the genesis aside), and the last outcome.
fn ledger_of(s: &Scratch) -> (Vec<String>, serde_json::Value) {
    let l = retie_ledger::Ledger::open(&default_ledger(s), false, None).expect("open ledger");
    let rows = l.rows().expect("rows");
    let kinds = rows.iter().map(|r| r.kind_str()).collect();
    let outcome = rows
        .iter()
        .rev()
        .find(|r| r.kind_str() == "outcome")
        .map(|r| r.payload_json())
        .unwrap_or_default();
    (kinds, outcome)
}

/// This test binary again, running only [`threaded_client_entry`], as the
/// leg's user, with the scratch area's home and XDG directories (the
/// client's ledger key and state never touch the invoker's).
fn threaded_client(s: &Scratch) -> Command {
    let args = [
        "--exact",
        "helper::threaded_client_entry",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ];
    let mut c = match s.leg {
        Leg::Invoker => Command::new(std::env::current_exe().expect("test binary")),
        Leg::Nobody => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(test_bin_copy());
            c.env("XDG_RUNTIME_DIR", &s.home);
            c
        }
    };
    c.args(args)
        .env("HOME", &s.home)
        .env("XDG_STATE_HOME", s.home.join(".local/state"))
        .env("XDG_CONFIG_HOME", s.home.join(".config"))
        .env("XDG_DATA_HOME", s.home.join(".local/share"))
        .env(CLIENT_WS, &s.ws)
        .env(CLIENT_BIN, bin(s.leg))
        .current_dir(&s.ws)
        .stdin(Stdio::null());
    c
}

/// A world-readable copy of this test binary, for the uid-65534 leg
/// (removed when this process exits, see `harness::copy_dir`).
fn test_bin_copy() -> PathBuf {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = copy_dir("retie-it-testbin-");
        let p = dir.join("it");
        std::fs::copy(std::env::current_exe().expect("test binary"), &p).expect("copy");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    })
    .clone()
}

struct QuietUi(Vec<String>);

impl JobUi for QuietUi {
    fn say(&mut self, line: &str) {
        self.0.push(line.to_string());
    }
    fn review(&mut self, _: &retie_dispatch::overlay::Review<'_>) -> Option<bool> {
        None
    }
}

/// Not a test on its own: the multi-threaded program that
/// [`overlay_run_through_the_helper_from_a_threaded_program_matches_the_cli`]
/// runs in a process of its own (its environment names the scratch area).
#[test]
#[ignore = "run by overlay_run_through_the_helper_from_a_threaded_program_matches_the_cli"]
fn threaded_client_entry() {
    let (Some(ws), Some(exe)) = (std::env::var_os(CLIENT_WS), std::env::var_os(CLIENT_BIN)) else {
        panic!("{CLIENT_WS} and {CLIENT_BIN} must be set: this is the client half of overlay_run_through_the_helper_from_a_threaded_program_matches_the_cli");
    };
    let ws = PathBuf::from(ws);
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let _threads = Threads::start(3);

    let state = home.join(".local/state/retie");
    std::fs::create_dir_all(&state).expect("state dir");
    let ledger = state.join("ledger.db");
    let snaps = Snapshots::open(&state, &ws).expect("snapshots");
    let owner = root_owner(&ws).expect("owner");
    let line = format!("sh -c '{SCRIPT}'");
    let effects = ["reads_workspace", "writes_workspace", "runs_sandboxed"];
    let action = Action::from_json(
        &json!({ "tool": "bash", "args": { "command": line }, "effects": effects }).to_string(),
    )
    .expect("action");
    let policy = Policy::shipped().expect("policy");
    let mut rec = Recorder::open(
        &ledger,
        SessionSpec {
            join: None,
            workspace: ws.clone(),
            opened: retie_ledger::payload::SessionOpened {
                objective: Some(line.to_string()),
                origin: Some("threaded test program".into()),
                policy_digest: Some(policy.digest().to_hex().to_string()),
                ..Default::default()
            },
            effects: effects.iter().map(|e| e.to_string()).collect(),
            intent_base: json!({
                "tool": "sandbox.exec",
                "command": ["sh", "-c", SCRIPT],
                "workspace": ws.display().to_string(),
                "mode": "overlay",
                "effects": effects,
            }),
        },
    )
    .expect("recorder");

    // The command says when it has written; a watcher thread then looks at
    // the real workspace while the command sleeps.
    let (out_r, out_w) = {
        let (r, w) = std::io::pipe().expect("pipe");
        (std::os::fd::OwnedFd::from(r), std::os::fd::OwnedFd::from(w))
    };
    let watched = ws.clone();
    let watcher = std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(std::fs::File::from(out_r)).lines();
        let said = lines.next().and_then(Result::ok);
        let during = (
            std::fs::read_to_string(watched.join("f.txt")).ok(),
            watched.join("g.txt").exists(),
        );
        (said, during)
    });
    assert!(thread_count() > 1);

    let mut ui = QuietUi(Vec::new());
    let mut job = SandboxJob {
        builder: Some(
            Sandbox::builder(["sh", "-c", SCRIPT])
                .workspace(&ws)
                .timeout(Duration::from_secs(60)),
        ),
        workspace: ws.clone(),
        mode: JobMode::Overlay {
            changes: ChangesMode::Apply,
            allow_blocked: false,
        },
        state,
        protect: Vec::new(),
        snaps,
        owner,
        stdio: Some(retie_runtime::Stdio::Fds {
            stdin: None,
            stdout: Some(out_w),
            stderr: None,
        }),
        runner: Runner::Helper {
            exe: PathBuf::from(exe),
        },
        ui: &mut ui,
        net: None,
    };
    let d = dispatch(
        &mut rec,
        &policy,
        &Context::new(policy.default_tier()),
        Proposal {
            action,
            origin: "threaded test program".into(),
            edit_of: None,
        },
        &mut CommandLine,
        &mut job,
    );
    rec.finish().expect("close the session");
    let (said, during) = watcher.join().expect("watcher");
    assert_eq!(said.as_deref(), Some("written"), "the command's stdout");
    assert_eq!(
        during,
        (Some("old\n".to_string()), false),
        "the real workspace was written while the command ran"
    );
    match d.expect("dispatch") {
        Dispatched::Ran { output, .. } => {
            assert_eq!(output.outcome.exit_code, 0);
            let changes = output.changes.expect("overlay changes");
            assert_eq!(changes.json["applied"], true, "{}", changes.json);
        }
        Dispatched::Refused { reason, by } => panic!("refused by {by}: {reason}"),
        Dispatched::Suspended { .. } | Dispatched::Edited { .. } => {
            panic!("the command line neither suspends nor edits")
        }
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("f.txt")).ok().as_deref(),
        Some("new\n")
    );
}

/// The interactive agent's Ctrl-C through the helper (the path a process
/// that talks HTTP takes): with `Interrupt::Kill`, a SIGINT to the helper
/// kills the whole sandbox, even a command that ignores SIGINT, and the
/// outcome says so. Forwarded instead (the default), the command would
/// ignore it and run on.
#[test]
fn a_sigint_to_the_helper_kills_the_sandbox_when_asked_to() {
    let _threads = Threads::start(2);
    let s = Scratch::new(Leg::Invoker);
    let m = marker();
    let spec = Sandbox::builder(["sh", "-c", &format!("trap '' INT; sleep {m} & sleep {m}")])
        .workspace(&s.ws)
        .timeout(Duration::from_secs(300))
        .interrupt(retie_runtime::Interrupt::Kill)
        .build()
        .expect("spec");
    let (tx, rx) = std::sync::mpsc::channel();
    let exe = bin(Leg::Invoker);
    std::thread::spawn(move || {
        let _ = tx.send(helper::run_via_helper(&exe, &spec));
    });
    assert!(
        wait_until(60.0, || pids_with(&m).len() >= 2),
        "the sandboxed sleeps never started"
    );
    // sleep -> (sh, the command) -> init -> the helper, as host pids.
    // (A SIGINT to init would only be passed on to the command.)
    let ppid = |pid: i32| -> i32 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let is_helper = |pid: i32| {
        String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
            .contains("__sandbox-helper")
    };
    // The sandbox's init is a clone of the helper (same command line):
    // the helper is the topmost of the two.
    let mut helper_pid = pids_with(&m)[0];
    for _ in 0..6 {
        if is_helper(helper_pid) && !is_helper(ppid(helper_pid)) {
            break;
        }
        helper_pid = ppid(helper_pid);
    }
    assert!(is_helper(helper_pid), "no helper above the sandbox");
    // SAFETY: kill takes two integers; the pid is the helper we checked.
    unsafe { libc::kill(helper_pid, libc::SIGINT) };
    let outcome = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the helper did not end after the SIGINT")
        .expect("an outcome");
    assert!(outcome.interrupted, "{outcome:?}");
    assert_eq!(outcome.signal, Some(libc::SIGKILL));
    assert!(
        pids_with(&m).is_empty(),
        "processes of the sandbox are left"
    );
}

/// A proxied sandbox through the helper (ADR 0313): the helper hands the
/// listening socket init made back to its caller, and releases the
/// command only once the caller serves it. Not served: the command never
/// runs. Served: what the command sends to 127.0.0.1:3128 inside arrives
/// at the socket the caller was given.
#[test]
fn a_proxied_sandbox_through_the_helper_hands_its_socket_back_and_waits_to_be_served() {
    use std::io::Read;
    use std::os::fd::OwnedFd;
    let _threads = Threads::start(2);
    let s = Scratch::new(Leg::Invoker);
    let proxied = |argv: &[&str]| {
        Sandbox::builder(argv)
            .workspace(&s.ws)
            .network(retie_runtime::NetMode::Proxy(retie_runtime::ProxyNet {
                port: 3128,
            }))
            .build()
            .expect("spec")
    };
    let spec = proxied(&["sh", "-c", "echo ran > ran.txt"]);
    let mut refuse = |_: OwnedFd| -> Result<(), String> { Err("no proxy today".into()) };
    match helper::run_via_helper_serving(
        &bin(Leg::Invoker),
        &spec,
        retie_runtime::Stdio::Inherit,
        &mut refuse,
    ) {
        Err(RuntimeError::Helper(m)) => assert!(m.contains("no proxy today"), "{m}"),
        other => panic!("expected the run called off, got {other:?}"),
    }
    assert!(
        !s.ws.join("ran.txt").exists(),
        "the command ran with its socket unserved"
    );

    let spec = proxied(&[
        "/usr/bin/python3",
        "-c",
        "import socket; c = socket.create_connection(('127.0.0.1', 3128), timeout=10); c.sendall(b'hello from inside'); c.close()",
    ]);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut serve = |l: OwnedFd| -> Result<(), String> {
        let tx = tx.clone();
        let l = std::net::TcpListener::from(l);
        std::thread::spawn(move || {
            let mut got = String::new();
            if let Ok((mut c, _)) = l.accept() {
                let _ = c.read_to_string(&mut got);
            }
            let _ = tx.send(got);
        });
        Ok(())
    };
    let out = helper::run_via_helper_serving(
        &bin(Leg::Invoker),
        &spec,
        retie_runtime::Stdio::Inherit,
        &mut serve,
    )
    .expect("the served run");
    assert_eq!(out.exit_code, 0, "{out:?}");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).as_deref(),
        Ok("hello from inside")
    );
}
