//! `/diff [ACTION]` and `retie replay --diff`: what a session changed, as
//! diffs (issue 31). The session's net change pairs each file's first
//! pre-image in the session (kept by the changesets the ledger names)
//! with the file as the workspace holds it now; one action's change pairs
//! its changeset's pre-image with what it set. The contents come from
//! `retie_dispatch::diffs` (the journal, the snapshot store and the
//! workspace's guarded read); the lines from the display crate.

use std::collections::BTreeMap;
use std::path::Path;

use retie_dispatch::diffs::{FileChange, Reader};

use crate::ledger::model::{Action, Session};
use crate::ui::{changes, visible, Style};

/// Print the session's net change (`action: None`) or one action's.
/// Returns false when there was nothing to show or it could not be read.
pub fn print(s: &Session, action: Option<i64>, st: Style) -> bool {
    let state = match crate::state::dir() {
        Ok(d) => d,
        Err(e) => {
            println!("retie's state directory: {e}");
            return false;
        }
    };
    match action {
        Some(id) => {
            let Some(a) = s.actions.iter().find(|a| a.id == id) else {
                println!("no action #{id} in this session (see /replay)");
                return false;
            };
            let Some(cs) = a.undo_changeset() else {
                println!("#{id} changed no file");
                return false;
            };
            let files = match open(&state, a)
                .and_then(|r| r.changeset(cs, true).map_err(|e| e.to_string()))
            {
                Ok(f) => f,
                Err(e) => {
                    println!("#{id}: its changes could not be read: {}", visible(&e));
                    return false;
                }
            };
            let mark = if a.undone() { " (undone since)" } else { "" };
            println!(
                "#{id} {} {}{}",
                a.tool(),
                st.dim(&a.command()),
                st.yellow(mark)
            );
            show(&files, st);
            !files.is_empty()
        }
        None => {
            // Each path's first pre-image in the session, in path order.
            let mut first: BTreeMap<String, (FileChange, String)> = BTreeMap::new();
            for a in &s.actions {
                if a.status() != "applied" || a.undone() || a.undoes().is_some() {
                    continue;
                }
                let Some(cs) = a.undo_changeset() else {
                    continue;
                };
                let ws = a.workspace_path().unwrap_or("").to_string();
                match open(&state, a)
                    .and_then(|r| r.changeset(cs, false).map_err(|e| e.to_string()))
                {
                    Ok(files) => {
                        for f in files {
                            first.entry(f.path.clone()).or_insert((f, ws.clone()));
                        }
                    }
                    Err(e) => println!("#{}: its changes could not be read: {}", a.id, visible(&e)),
                }
            }
            let mut files = Vec::new();
            for (path, (f, ws)) in first {
                let now = Reader::open(&state, Path::new(&ws))
                    .ok()
                    .and_then(|r| r.now(&path));
                if now == f.before {
                    continue; // changed, then changed back
                }
                files.push(FileChange {
                    path,
                    before: f.before,
                    after: now,
                    note: f.note,
                    missing: f.missing,
                });
            }
            if files.is_empty() {
                println!("nothing changed yet");
                return false;
            }
            show(&files, st);
            true
        }
    }
}

fn open(state: &Path, a: &Action) -> Result<Reader, String> {
    let ws = a
        .workspace_path()
        .ok_or_else(|| "the action names no workspace".to_string())?;
    Reader::open(state, Path::new(ws)).map_err(|e| e.to_string())
}

/// Each file: its name and counts, then its whole diff.
fn show(files: &[FileChange], st: Style) {
    for (f, line) in files.iter().zip(changes::file_counts(files, st)) {
        println!("{}", st.bold(line.trim_start()));
        // The note is on the line above already.
        let f = FileChange {
            note: None,
            ..f.clone()
        };
        for l in changes::file_lines(&f, st, usize::MAX, None) {
            println!("{l}");
        }
    }
}
