//! The command line's papercuts (issue 33): what a new user types first
//! gets an answer that says what to do.

use crate::harness::*;

/// `retie sandbox exec true` (no `--`): the error shows the line to type.
#[test]
fn exec_without_the_separator_suggests_it() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s
            .retie()
            .args(["sandbox", "exec", "true"])
            .output()
            .expect("retie");
        assert_code(&o, 125, "no --");
        assert!(
            stderr(&o).contains("retie sandbox exec -- true"),
            "{leg:?}: no suggestion of `--`:\n{}",
            stderr(&o)
        );
        let o = s
            .retie()
            .args(["sandbox", "exec", "--json", "ls", "-la", "a b"])
            .output()
            .expect("retie");
        assert_code(&o, 125, "no -- with options");
        assert!(
            stderr(&o).contains("retie sandbox exec --json -- ls -la 'a b'"),
            "{leg:?}: the suggestion is not the line to type:\n{}",
            stderr(&o)
        );
    }
}

/// A file given as the workspace: said to be no directory, nothing run.
#[test]
fn a_file_as_workspace_is_said_not_to_be_a_directory() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let f = s.ws.join("notes.txt");
        std::fs::write(&f, "x").expect("write");
        s.give(&f);
        let o = s
            .retie()
            .args(["sandbox", "exec", "-w"])
            .arg(&f)
            .args(["--", "sh", "-c", "echo ran > /tmp/x"])
            .output()
            .expect("retie");
        assert_code(&o, 125, "file as workspace");
        assert!(
            stderr(&o).contains("is not a directory"),
            "{leg:?}: {}",
            stderr(&o)
        );
    }
}

/// `sandbox exec --json` names the action id `retie undo` takes, and
/// that id undoes the run.
#[test]
fn exec_json_names_the_action_undo_takes() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(&["--json"], &["sh", "-c", "echo hi > made.txt"]);
        assert_code(&o, 0, "exec");
        let st = json_status(&o);
        let action = st["action"]
            .as_i64()
            .unwrap_or_else(|| panic!("{leg:?}: no action id in {st}"));
        assert!(
            st["session"].as_str().is_some_and(|v| !v.is_empty()),
            "{st}"
        );
        assert!(s.ws.join("made.txt").exists());
        let o = s
            .retie()
            .args(["undo", &action.to_string()])
            .output()
            .expect("undo");
        assert_code(&o, 0, "undo by the JSON's action id");
        assert!(!s.ws.join("made.txt").exists(), "{leg:?}: not undone");
    }
}

/// `retie status` prints sizes a person reads (KiB, MiB), not byte counts.
#[test]
fn status_prints_human_sizes() {
    for leg in legs() {
        let s = Scratch::new(leg);
        assert_code(&s.sh("echo hi > a.txt"), 0, "exec");
        let o = s.retie().arg("status").output().expect("status");
        assert_code(&o, 0, "status");
        let out = stdout(&o);
        let ledger = out
            .lines()
            .find(|l| l.starts_with("ledger"))
            .unwrap_or_else(|| panic!("no ledger line:\n{out}"));
        assert!(
            ledger.ends_with(" KiB") || ledger.ends_with(" MiB"),
            "{leg:?}: {ledger}"
        );
        assert!(!out.contains(" bytes"), "{leg:?}: raw byte counts:\n{out}");
    }
}

/// `retie demo | head -1`: the reader is gone before the demo writes
/// anything; the demo still runs to its end (undo-all included) and
/// leaves nothing in TMPDIR, and the one line it gives stdout is its
/// result.
#[test]
fn the_demo_into_a_closed_pipe_leaves_nothing_behind() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let tmp = s.home.join("tmp");
        std::fs::create_dir_all(&tmp).expect("tmp");
        s.give(&tmp);
        // A pipe whose reading end is closed before the demo starts.
        let (reader, writer) = rustix::pipe::pipe().expect("pipe");
        drop(reader);
        let o = s
            .retie()
            .arg("demo")
            .env("TMPDIR", &tmp)
            .stdin(std::process::Stdio::null())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("demo");
        assert_code(&o, 0, "retie demo into a closed pipe");
        assert!(
            stderr(&o).contains("the project is back to its starting tree"),
            "{leg:?}: {}",
            stderr(&o)
        );
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .expect("read tmp")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{leg:?}: the demo left {left:?} in TMPDIR");
        // Read by a reader: one line, the result.
        let o = s
            .retie()
            .arg("demo")
            .env("TMPDIR", &tmp)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("demo");
        assert_code(&o, 0, "retie demo");
        assert_eq!(stdout(&o), "retie demo: ok\n", "{leg:?}");
    }
}

/// `--bash-timeout` (and `[agent] bash_timeout`) is the bash tool's
/// ceiling: a model asking 30 s for `sleep 30` gets the person's 1 s.
#[test]
fn the_bash_timeout_is_the_persons_ceiling_flag_and_config() {
    for leg in legs() {
        for via_config in [false, true] {
            let s = Scratch::new(leg);
            let script = s.root.path().join("script.json");
            let turns = serde_json::json!({"turns": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 30", "timeout": 30}}]},
                {"text": "done"}
            ]});
            std::fs::write(&script, turns.to_string()).expect("script");
            s.give(&script);
            let mut c = s.retie();
            c.args(["run", "--provider", "script", "--script"])
                .arg(&script)
                .args(["--json", "--yes", "-p", "wait"])
                .env_remove("RETIE_PROVIDER")
                .stdin(std::process::Stdio::null());
            if via_config {
                s.write_config("[agent]\nbash_timeout = 1\n");
            } else {
                c.args(["--bash-timeout", "1"]);
            }
            let o = c.output().expect("run");
            assert_code(&o, 0, "retie run");
            let r: serde_json::Value = serde_json::from_slice(&o.stdout)
                .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", stderr(&o)));
            let said = r["actions"][0]["said"].as_str().unwrap_or("").to_string();
            assert!(
                said.contains("timed out after 1 s"),
                "{leg:?} config={via_config}: the model's 30 s won over the ceiling:\n{r}"
            );
        }
    }
}

/// Session ids accept any unique prefix (`retie replay 3804`): replay,
/// undo-all --session and report take it; an ambiguous prefix is an error
/// that lists the candidates; an unknown one says so.
#[test]
fn session_ids_accept_a_unique_prefix() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let mut ids = Vec::new();
        for i in 0..6 {
            let o = s.exec(&["--json"], &["sh", "-c", &format!("echo {i} > f{i}.txt")]);
            assert_code(&o, 0, "exec");
            ids.push(
                json_status(&o)["session"]
                    .as_str()
                    .expect("session")
                    .to_string(),
            );
        }
        // The shortest prefix of the first id that no other id shares.
        let first = &ids[0];
        let n = (1..=first.len())
            .find(|n| ids[1..].iter().all(|id| !id.starts_with(&first[..*n])))
            .expect("ids differ");
        let o = s
            .retie()
            .args(["replay", &first[..n]])
            .output()
            .expect("replay");
        assert_code(&o, 0, "replay by a unique prefix");
        assert!(
            stdout(&o).contains(first.as_str()),
            "{leg:?}: {}",
            stdout(&o)
        );
        let o = s
            .retie()
            .args(["undo-all", "--session", &first[..n]])
            .output()
            .expect("undo-all");
        assert_code(&o, 0, "undo-all by a unique prefix");
        assert!(!s.ws.join("f0.txt").exists(), "{leg:?}: not undone");
        assert!(
            s.ws.join("f1.txt").exists(),
            "{leg:?}: another session undone"
        );
        // Ambiguous: a prefix two ids share, if any share one; else the
        // empty-but-one prefix case is covered by the unit test.
        let shared = (1..16).rev().find_map(|n| {
            ids.iter().enumerate().find_map(|(i, a)| {
                ids[i + 1..]
                    .iter()
                    .find(|b| b.len() >= n && a.len() >= n && a[..n] == b[..n])
                    .map(|_| a[..n].to_string())
            })
        });
        if let Some(p) = shared {
            let o = s.retie().args(["replay", &p]).output().expect("replay");
            assert_code(&o, 125, "ambiguous prefix");
            assert!(stderr(&o).contains("ambiguous"), "{leg:?}: {}", stderr(&o));
        }
        let o = s.retie().args(["replay", "zzzz"]).output().expect("replay");
        assert_code(&o, 125, "unknown prefix");
        assert!(
            stderr(&o).contains("no session id starts with zzzz"),
            "{leg:?}: {}",
            stderr(&o)
        );
    }
}
