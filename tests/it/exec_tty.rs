//! `retie sandbox exec` on a terminal (issue 33, ADR 0550): when the
//! caller's stdin and stdout are terminals the command runs on a
//! pseudo-terminal of the sandbox's own devpts, its session's controlling
//! terminal, relayed by retie; pipes and `--no-tty` keep today's stdio.
//! Driven through a real pseudo-terminal (`pty.rs`, 40 rows, 200
//! columns). Every wait is for expected output with a generous deadline.

use crate::harness::*;
use crate::pty::Pty;

/// `retie sandbox exec -w WS [extra] -- argv` on a fresh terminal.
fn on_terminal(s: &Scratch, extra: &[&str], argv: &[&str]) -> Pty {
    let mut c = s.retie();
    c.args(["sandbox", "exec", "-w"])
        .arg(&s.ws)
        .args(extra)
        .arg("--")
        .args(argv);
    Pty::spawn(c)
}

/// The command's stdin and stdout are a terminal that exists inside
/// (`tty` names a /dev/pts path of the sandbox's own devpts), with the
/// outer terminal's size, and no descriptor of the shell is the pty's
/// master. The outer terminal is back in its cooked mode afterwards.
#[test]
fn on_a_terminal_the_command_gets_a_pty_of_the_sandbox() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut t = on_terminal(
            &s,
            &[],
            &[
                "sh",
                "-c",
                "echo TTY=$(tty); test -t 0 && echo T0; test -t 1 && echo T1; \
                 echo SIZE=$(stty size); echo CTTY=$(cut -d' ' -f7 /proc/$$/stat); \
                 for f in /proc/$$/fd/*; do echo FD=$(readlink $f); done; echo END",
            ],
        );
        t.expect("TTY=/dev/pts/");
        t.expect("T0");
        t.expect("T1");
        t.expect("SIZE=40 200");
        t.expect("CTTY=");
        t.expect("END");
        let st = t.wait();
        let out = t.output();
        assert!(st.success(), "{leg:?}: {st}\n{out}");
        assert!(!out.contains("not a tty"), "{leg:?}:\n{out}");
        // The pty is the controlling terminal of the command's session
        // (tty_nr in /proc/PID/stat; 0 without one). sh opens no terminal
        // itself, so this is init's TIOCSCTTY, not a shell's open().
        let ctty = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("CTTY="))
            .unwrap_or_default();
        assert!(
            !ctty.is_empty() && ctty != "0",
            "{leg:?}: the pty is the command's controlling terminal (tty_nr {ctty:?})\n{out}"
        );
        assert!(
            !out.contains("ptmx"),
            "{leg:?}: the pty's master is not in the sandbox\n{out}"
        );
        // The pty the command sees is the sandbox's, not the test's.
        let inside = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("TTY="))
            .unwrap_or_default()
            .to_string();
        assert!(
            out.lines()
                .filter_map(|l| l.trim().strip_prefix("FD="))
                .filter(|f| f.starts_with("/dev/pts/"))
                .all(|f| f == inside),
            "{leg:?}: every terminal fd of the shell is its own pty {inside}\n{out}"
        );
        assert!(
            t.is_cooked(),
            "{leg:?}: the outer terminal is restored: {:?}",
            t.termios().local_modes
        );
    }
}

/// A shell with job control: `bash -i` on the pty gets its terminal's
/// process group (without a controlling terminal it says "no job
/// control in this shell" and runs without `m` in `$-`).
#[test]
fn an_interactive_shell_on_the_terminal_has_job_control() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut t = on_terminal(
            &s,
            &[],
            &[
                "bash",
                "--norc",
                "--noprofile",
                "-i",
                "-c",
                "case $- in *m*) echo JOBS-ON;; *) echo JOBS-OFF;; esac; \
                 sleep 0.1 & fg; echo FG-$?",
            ],
        );
        t.expect("JOBS-ON");
        t.expect("FG-0");
        let st = t.wait();
        let out = t.output();
        assert!(st.success(), "{leg:?}: {st}\n{out}");
        assert!(!out.contains("no job control"), "{leg:?}:\n{out}");
        assert!(t.is_cooked(), "{leg:?}: the outer terminal is restored");
    }
}

/// Ctrl-C is a byte the relay passes on (the outer terminal is raw): the
/// pty's line discipline sends SIGINT to the command's foreground job,
/// which ends with 130, and retie exits with it. The outer terminal is
/// restored, and the run's changes are kept unapplied, as after a Ctrl-C
/// without a terminal (`lifecycle::a_ctrl_c_to_sandbox_exec_keeps_the_run_unapplied`).
#[test]
fn ctrl_c_interrupts_the_command_on_its_terminal_and_the_mode_is_restored() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut t = on_terminal(
            &s,
            &[],
            &[
                "sh",
                "-c",
                "echo x > half-done; echo READY; sleep 30; echo NOT-INTERRUPTED",
            ],
        );
        t.expect("READY");
        // Raw while the command runs: ICANON is off on the outer terminal.
        let raw = wait_until(30.0, || !t.is_cooked());
        assert!(
            raw,
            "{leg:?}: the outer terminal is raw while the command runs"
        );
        t.type_("\x03");
        let st = t.wait();
        let out = t.output();
        assert_eq!(st.code(), Some(130), "{leg:?}: {st}\n{out}");
        assert!(!out.contains("NOT-INTERRUPTED"), "{leg:?}:\n{out}");
        assert!(t.is_cooked(), "{leg:?}: the outer terminal is restored");
        // A Ctrl-C on the command's terminal is a Ctrl-C to the run, as a
        // SIGINT to retie is: the half-done changes are kept, not applied.
        assert!(
            !s.ws.join("half-done").exists(),
            "{leg:?}: an interrupted run's changes were applied\n{out}"
        );
        assert!(
            out.contains("interrupted") && out.contains("retie changes apply"),
            "{leg:?}: the kept run is named\n{out}"
        );
    }
}

/// Resizing the outer terminal resizes the command's: its job gets
/// SIGWINCH and reads the new size.
#[test]
fn the_commands_terminal_follows_a_resize() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut t = on_terminal(
            &s,
            &[],
            &[
                "sh",
                "-c",
                "trap 'echo RESIZED=$(stty size); exit 0' WINCH; echo READY; \
                 while :; do sleep 0.1; done",
            ],
        );
        t.expect("READY");
        t.resize(50, 100);
        t.expect("RESIZED=50 100");
        let st = t.wait();
        assert!(st.success(), "{leg:?}: {st}\n{}", t.output());
    }
}

/// TIOCSTI stays refused on the command's own pty (seccomp, the same rule
/// as everywhere): it would otherwise feed the command's own input.
#[test]
fn tiocsti_is_refused_on_the_commands_terminal() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut t = on_terminal(
            &s,
            &[],
            &[
                "/usr/bin/python3",
                "-c",
                "import fcntl, termios\n\
                 try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('TIOCSTI-ALLOWED')\n\
                 except OSError as e:\n    print('TIOCSTI-REFUSED', e.errno)",
            ],
        );
        let st = t.wait();
        let out = t.output();
        assert!(
            out.contains(&format!("TIOCSTI-REFUSED {}", libc::EPERM)),
            "{leg:?}: {st}\n{out}"
        );
        assert!(!out.contains("TIOCSTI-ALLOWED"), "{leg:?}:\n{out}");
    }
}

/// Without a terminal (pipes), and on a terminal with `--no-tty` or
/// `--json`, stdio is what it was: the caller's fds, no terminal inside.
#[test]
fn pipes_and_no_tty_keep_the_callers_stdio() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.sh("tty; test -t 0 || echo NOT-T0");
        assert_code(&o, 0, &format!("{leg:?} tty on pipes"));
        let out = stdout(&o);
        assert!(out.contains("not a tty"), "{leg:?}: {out}");
        assert!(out.contains("NOT-T0"), "{leg:?}: {out}");
        for flag in ["--no-tty", "--json"] {
            let mut t = on_terminal(&s, &[flag], &["sh", "-c", "echo TTY=$(tty); echo END"]);
            t.expect("END");
            let st = t.wait();
            let out = t.output();
            assert!(out.contains("TTY=not a tty"), "{leg:?} {flag}: {st}\n{out}");
        }
    }
}
