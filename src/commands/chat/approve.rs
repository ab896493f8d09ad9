//! The approval prompt of the interactive terminal: what exactly would
//! run, what it can reach, why the policy asks; answered yes, no with a
//! reason (for the model), edit (the person's own version of the
//! arguments, gated again), or always for this session for this exact
//! prefix (a grant, listed and revocable with `/approvals`).

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

use retie_dispatch::{Approval, ApprovalRequest, Approver};
use serde_json::Value;

use super::editor::{LineEditor, Read};
use super::render::{stop, SharedSpinner};
use crate::ui::{visible, Style};

pub struct TerminalApprover {
    pub editor: Rc<RefCell<LineEditor>>,
    pub spin: SharedSpinner,
    pub style: Style,
    /// Raised when the person cancels the turn at the prompt (Ctrl-C).
    pub cancel: &'static AtomicBool,
    /// Lines of a write's diff shown (`--diff-lines`).
    pub diff_lines: usize,
}

/// The command or arguments as the person edits them: a bash line as
/// itself, anything else as its JSON arguments.
pub fn editable(req: &ApprovalRequest<'_>) -> String {
    let args = req.action.args().to_json();
    match args.get("command").and_then(Value::as_str) {
        Some(c) if req.evaluation.shell.is_some() => c.to_string(),
        _ => args.to_string(),
    }
}

/// The call as every screen shows it (the live line, replay, log,
/// `retie pending`): [`crate::ui::shell_line`] of the intent's command.
fn command_line(req: &ApprovalRequest<'_>) -> String {
    let args = req.action.args().to_json();
    let map = args.as_object().cloned().unwrap_or_default();
    let argv = retie_agent::tools::command_of(req.action.tool(), &map);
    crate::ui::shell_line(&argv.iter().map(String::as_str).collect::<Vec<_>>())
}

impl TerminalApprover {
    fn show(&self, req: &ApprovalRequest<'_>) {
        let st = self.style;
        let ev = req.evaluation;
        let args = req.action.args().to_json();
        let bar = st.cyan("│");
        eprintln!();
        eprintln!(
            "{} {} {}",
            st.cyan("┌"),
            st.bold("retie asks:"),
            st.bold(&visible(req.action.tool()))
        );
        match &ev.shell {
            Some(s) => {
                eprintln!("{bar} command: {}", command_line(req));
                for p in &s.parts {
                    eprintln!("{bar}   runs: {}", visible(p));
                }
                let other: Vec<String> = args
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .filter(|(k, _)| k.as_str() != "command")
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect()
                    })
                    .unwrap_or_default();
                if !other.is_empty() {
                    eprintln!("{bar}   with: {}", visible(&other.join(" ")));
                }
            }
            None => match req.change {
                // A write or an edit: the change it would make to the
                // file as it is now, not its JSON (the digest below still
                // binds exactly the frozen arguments).
                Some(c) => {
                    eprintln!("{bar} command: {}", command_line(req));
                    let more = Some("`e` shows the whole arguments".to_string());
                    for l in crate::ui::changes::file_lines(c, st, self.diff_lines, more) {
                        eprintln!("{bar}{}", l.strip_prefix(' ').unwrap_or(&l));
                    }
                }
                None => eprintln!("{bar} arguments: {}", visible(&args.to_string())),
            },
        }
        let effects: Vec<&str> = req.action.effects().iter().map(|e| e.name()).collect();
        let undo = req
            .plan
            .detail
            .get("when")
            .or_else(|| req.plan.detail.get("why"))
            .and_then(Value::as_str)
            .map(|s| s.to_string())
            .unwrap_or_else(|| {
                if req.plan.reversible {
                    "reversible".into()
                } else {
                    "not reversible".into()
                }
            });
        eprintln!(
            "{bar} class: {}   reaches: {}",
            st.bold(ev.class.kind().name()),
            if effects.is_empty() {
                "nothing".to_string()
            } else {
                effects.join(", ")
            }
        );
        eprintln!("{bar} undo: {}", visible(&undo));
        let mut flags = Vec::new();
        if ev.trifecta {
            flags.push("trifecta (untrusted content in the session and a way out)".to_string());
        }
        if let Some(s) = &ev.shell {
            if let Some(e) = &s.error {
                flags.push(format!("unreadable shell: {}", visible(e)));
            }
            for n in &s.not_plain {
                flags.push(format!("not plain: {}", visible(n)));
            }
        }
        if !flags.is_empty() {
            eprintln!("{bar} risk: {}", st.yellow(&flags.join("; ")));
        }
        for r in &ev.decision.reasons {
            eprintln!(
                "{bar} asks because: {} ({})",
                visible(&r.to_string()),
                r.code()
            );
        }
        eprintln!(
            "{} {}",
            st.cyan("└"),
            st.dim(&format!("digest {}", req.action.digest().to_hex()))
        );
        let _ = std::io::stderr().flush();
    }

    fn read(&self, prompt: &str, initial: &str) -> Read {
        self.editor.borrow_mut().read_with(prompt, initial, false)
    }

    fn cancelled(&self) -> Approval {
        self.cancel.store(true, Ordering::SeqCst);
        Approval::Denied {
            by: "person (terminal)".into(),
            reason: "the person cancelled the turn (Ctrl-C)".into(),
        }
    }
}

impl Approver for TerminalApprover {
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval {
        stop(&self.spin);
        self.show(req);
        loop {
            let line = match self.read("approve? [y]es [n]o REASON [e]dit [a]lways: ", "") {
                Read::Line(l) => l,
                Read::Interrupted | Read::Eof => return self.cancelled(),
            };
            let line = line.trim();
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "y" | "yes" => {
                    return Approval::Approved {
                        by: "person (terminal)".into(),
                        digest: req.action.digest(),
                    }
                }
                "a" | "always" if req.grant_keys.is_empty() => eprintln!(
                    "  this command line is not plain enough to grant (the policy cannot split it into exact simple commands); answer y, n or e"
                ),
                "a" | "always" => {
                    eprintln!(
                        "  {}",
                        self.style.dim(
                            "granted for this session: exactly these simple commands run unasked (`/approvals` lists and revokes)"
                        )
                    );
                    return Approval::Always {
                        by: "person (terminal, always this session)".into(),
                        digest: req.action.digest(),
                    };
                }
                "n" | "no" => {
                    let mut reason = rest.trim().to_string();
                    if reason.is_empty() {
                        reason = match self.read("reason (for the model, Enter for none): ", "") {
                            Read::Line(l) => l.trim().to_string(),
                            Read::Interrupted | Read::Eof => return self.cancelled(),
                        };
                    }
                    return Approval::Denied {
                        by: "person (terminal)".into(),
                        reason: if reason.is_empty() {
                            "the person said no".into()
                        } else {
                            format!("the person said no: {reason}")
                        },
                    };
                }
                "e" | "edit" => {
                    let original = editable(req);
                    let edited = match self.read("edit> ", &original) {
                        Read::Line(l) => l,
                        Read::Interrupted | Read::Eof => return self.cancelled(),
                    };
                    if edited.trim().is_empty() || edited == original {
                        eprintln!("  (unchanged; answer again)");
                        continue;
                    }
                    return edit_answer(req, &edited);
                }
                _ => eprintln!(
                    "  y: run it · n REASON: do not (the reason goes to the model) · e: edit it, then it is checked again · a: always, this session, for exactly this"
                ),
            }
        }
    }
}

/// The person's edit as an answer: the edited arguments, classified and
/// gated again by the chokepoint and recorded as an edit of the pending
/// proposal (whose digest is the one shown).
fn edit_answer(req: &ApprovalRequest<'_>, edited: &str) -> Approval {
    match crate::commands::run::edited_arguments(req.action, edited) {
        Ok(arguments) => Approval::Edit {
            by: "person (terminal)".into(),
            digest: req.action.digest(),
            arguments,
        },
        Err(why) => Approval::Denied {
            by: "person (terminal)".into(),
            reason: format!("the person's edit could not be read ({why}); not run"),
        },
    }
}
