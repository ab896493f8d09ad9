//! The line editor (rustyline, ADR 0503): history in the state directory,
//! multi-line input (a trailing backslash or Alt-Enter continues the
//! line), and the answers to an approval prompt.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use rustyline::completion::Completer;
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::FileHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Cmd, Editor, Helper, KeyCode, KeyEvent, Modifiers};

use crate::error::CliError;

/// Completion, hints and highlighting: none. Validation: a line ending in
/// a backslash is continued on the next.
pub struct ChatHelper;

impl Completer for ChatHelper {
    type Candidate = String;
}
impl Hinter for ChatHelper {
    type Hint = String;
}
impl Highlighter for ChatHelper {}
impl Helper for ChatHelper {}

impl Validator for ChatHelper {
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        Ok(if ctx.input().ends_with('\\') {
            ValidationResult::Incomplete
        } else {
            ValidationResult::Valid(None)
        })
    }
}

/// What one read gave.
pub enum Read {
    Line(String),
    /// Ctrl-C.
    Interrupted,
    /// Ctrl-D on an empty line.
    Eof,
}

pub struct LineEditor {
    ed: Editor<ChatHelper, FileHistory>,
    history: Option<PathBuf>,
}

/// `$XDG_STATE_HOME/retie/history` (else `~/.local/state/retie/history`),
/// the directory 0700, the file created 0600 before anything is written.
pub fn history_path() -> Result<PathBuf, CliError> {
    let base = crate::state::xdg_base("XDG_STATE_HOME", ".local/state").ok_or_else(|| {
        CliError::Usage("neither XDG_STATE_HOME nor HOME is set: no place for the history".into())
    })?;
    let dir = base.join("retie");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| CliError::io(format!("creating {}", dir.display()), e))?;
    let path = dir.join("history");
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| CliError::io(format!("opening the history {}", path.display()), e))?;
    // A file made earlier by something else: tighten it.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| CliError::io(format!("chmod 600 {}", path.display()), e))?;
    Ok(path)
}

impl LineEditor {
    pub fn open() -> Result<LineEditor, CliError> {
        let config = rustyline::Config::builder()
            .auto_add_history(false)
            .max_history_size(10_000)
            .map_err(|e| CliError::Usage(format!("the line editor: {e}")))?
            .build();
        let mut ed = Editor::<ChatHelper, FileHistory>::with_config(config)
            .map_err(|e| CliError::Usage(format!("the line editor: {e}")))?;
        ed.set_helper(Some(ChatHelper));
        // Alt-Enter: a new line in the same input.
        ed.bind_sequence(KeyEvent(KeyCode::Enter, Modifiers::ALT), Cmd::Newline);
        let history = match history_path() {
            Ok(p) => {
                // An unreadable history is not a reason to stop.
                let _ = ed.load_history(&p);
                Some(p)
            }
            Err(e) => {
                eprintln!("retie: no history: {e}");
                None
            }
        };
        Ok(LineEditor { ed, history })
    }

    /// One input (continued lines joined with newlines), kept in the
    /// history when `remember`.
    pub fn read(&mut self, prompt: &str, remember: bool) -> Read {
        self.read_with(prompt, "", remember)
    }

    /// Like [`read`], the line pre-filled with `initial`.
    pub fn read_with(&mut self, prompt: &str, initial: &str, remember: bool) -> Read {
        let got = if initial.is_empty() {
            self.ed.readline(prompt)
        } else {
            self.ed.readline_with_initial(prompt, (initial, ""))
        };
        match got {
            Ok(line) => {
                if remember && !line.trim().is_empty() {
                    let _ = self.ed.add_history_entry(line.as_str());
                    if let Some(p) = &self.history {
                        let _ = self.ed.append_history(p);
                    }
                }
                Read::Line(line.replace("\\\n", "\n"))
            }
            Err(ReadlineError::Interrupted) => Read::Interrupted,
            Err(_) => Read::Eof,
        }
    }
}
