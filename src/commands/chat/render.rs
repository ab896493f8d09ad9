//! What the person sees during a turn: the model's text streamed as it
//! comes (stdout), its reasoning dimmed (stderr), a spinner while it
//! thinks (stderr, only on a terminal), and each tool call as one line
//! with its outcome (stderr). Everything the model or a file controls is
//! escaped first (`ui::prose`, `ui::visible`).

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};

use retie_agent::session::{CallRecord, Render};
use retie_agent::{StreamEvent, ToolCall};

use crate::ui::{preview, visible, visible_again, Gutter, Style, MODEL_MARK, REASONING_MARK};

const FRAMES: &[&str] = &["|", "/", "-", "\\"];

/// The spinner: shown on stderr while the model thinks, only when stderr
/// is a terminal. Plain characters and carriage returns, no escape
/// sequences (so `NO_COLOR` output stays free of them).
#[derive(Debug)]
pub struct Spinner {
    enabled: bool,
    active: bool,
    shown: bool,
    frame: usize,
    label: String,
}

pub type SharedSpinner = Arc<Mutex<Spinner>>;

impl Spinner {
    pub fn shared() -> SharedSpinner {
        Arc::new(Mutex::new(Spinner {
            enabled: std::io::stderr().is_terminal(),
            active: false,
            shown: false,
            frame: 0,
            label: String::new(),
        }))
    }

    pub fn start(&mut self, label: &str) {
        self.active = self.enabled;
        self.label = label.to_string();
        self.draw();
    }

    /// Hide it (before anything else is printed).
    pub fn stop(&mut self) {
        self.active = false;
        if self.shown {
            let width = self.label.chars().count() + 3;
            eprint!("\r{}\r", " ".repeat(width));
            let _ = std::io::stderr().flush();
            self.shown = false;
        }
    }

    /// The next frame (the ticker calls this).
    pub fn tick(&mut self) {
        if self.active {
            self.frame = (self.frame + 1) % FRAMES.len();
            self.draw();
        }
    }

    fn draw(&mut self) {
        if !self.active {
            return;
        }
        eprint!("\r{} {}", FRAMES[self.frame], self.label);
        let _ = std::io::stderr().flush();
        self.shown = true;
    }
}

/// Stop a shared spinner (a poisoned lock still stops it).
pub fn stop(s: &SharedSpinner) {
    match s.lock() {
        Ok(mut g) => g.stop(),
        Err(p) => p.into_inner().stop(),
    }
}

/// Start a shared spinner.
pub fn start(s: &SharedSpinner, label: &str) {
    match s.lock() {
        Ok(mut g) => g.start(label),
        Err(p) => p.into_inner().start(label),
    }
}

/// The [`Render`] of the interactive terminal.
pub struct ChatRender {
    pub err: Style,
    /// Lines of a change's diff shown after an edit or a write.
    pub diff_lines: usize,
    pub spin: SharedSpinner,
    /// The last thing printed on stdout ended a line (or nothing was).
    at_line_start: bool,
    in_reasoning: bool,
    /// Every line of the model's text and reasoning marked.
    text: Gutter,
    reasoning: Gutter,
}

impl ChatRender {
    pub fn new(spin: SharedSpinner) -> ChatRender {
        ChatRender {
            err: Style::stderr(),
            diff_lines: retie_display::DEFAULT_DIFF_LINES,
            spin,
            at_line_start: true,
            in_reasoning: false,
            text: Gutter::new(MODEL_MARK),
            reasoning: Gutter::new(REASONING_MARK),
        }
    }

    /// End the model's text with a line break if it did not.
    pub fn end_text(&mut self) {
        if !self.at_line_start {
            println!();
            self.at_line_start = true;
        }
        if self.in_reasoning {
            eprintln!();
            self.in_reasoning = false;
        }
        self.text.new_line();
        self.reasoning.new_line();
    }
}

impl Render for ChatRender {
    fn event(&mut self, ev: &StreamEvent) {
        match ev {
            StreamEvent::Text(t) if !t.is_empty() => {
                stop(&self.spin);
                if self.in_reasoning {
                    eprintln!();
                    self.in_reasoning = false;
                    self.reasoning.new_line();
                }
                print!("{}", self.text.mark(t));
                let _ = std::io::stdout().flush();
                self.at_line_start = t.ends_with('\n');
            }
            StreamEvent::Reasoning(t) if !t.is_empty() => {
                stop(&self.spin);
                let marked = self.reasoning.mark(t);
                eprint!("{}", self.err.dim(&marked));
                let _ = std::io::stderr().flush();
                self.in_reasoning = !t.ends_with('\n');
            }
            _ => {}
        }
    }

    fn call_started(&mut self, call: &ToolCall) {
        stop(&self.spin);
        self.end_text();
        let name: String = call.name.chars().take(40).collect();
        start(&self.spin, &format!("running {}", visible(&name)));
    }

    fn call(&mut self, c: &CallRecord) {
        stop(&self.spin);
        self.end_text();
        let mark = match retie_ledger::payload::Status::from_stored(c.status) {
            Some(s) if s.succeeded() => self.err.green("✓"),
            Some(
                retie_ledger::payload::Status::RefusedByPolicy
                | retie_ledger::payload::Status::RefusedByGuard,
            ) => self.err.yellow("✗"),
            None if c.status == "invalid" => self.err.yellow("✗"),
            _ => self.err.red("✗"),
        };
        let id = c.action.map(|a| format!("#{a} ")).unwrap_or_default();
        let said = c.said.lines().next().unwrap_or("");
        let said: String = said.chars().take(120).collect();
        eprintln!(
            "  {mark} {}{} {} {}",
            self.err.dim(&id),
            visible_again(&c.summary, false),
            self.err.dim(c.status),
            self.err.dim(&format!("— {}", preview(&said)))
        );
        for l in
            crate::ui::changes::after_call(&c.tool, c.action, &c.changes, self.err, self.diff_lines)
        {
            eprintln!("{l}");
        }
        // The model thinks again after a call.
        start(&self.spin, "thinking");
    }

    fn retrying(&mut self, why: &str, wait: std::time::Duration) {
        stop(&self.spin);
        self.end_text();
        eprintln!(
            "  {}",
            self.err.yellow(&format!(
                "retrying in {:.1} s: {} (what this attempt streamed is dropped)",
                wait.as_secs_f64(),
                visible(why)
            ))
        );
        start(&self.spin, "thinking");
    }

    fn switched(&mut self, line: &str) {
        stop(&self.spin);
        self.end_text();
        eprintln!("  {}", self.err.yellow(&format!("ladder: {line}")));
    }
}

/// The render of `retie run -p`: streamed text on stdout (on stderr with
/// `--json`, so stdout holds the JSON alone), reasoning dimmed, one line
/// per tool call on stderr.
pub struct PlainRender {
    json: bool,
    /// Show a long bash call's elapsed time (no one is asked on this
    /// terminal meanwhile).
    pub progress: bool,
    ticker: super::super::progress::Ticker,
    /// Lines of a change's diff shown after an edit or a write.
    pub diff_lines: usize,
    err: Style,
    /// Every line of the model's text and reasoning marked.
    text: Gutter,
    reasoning: Gutter,
}

impl PlainRender {
    pub fn new(json: bool) -> PlainRender {
        PlainRender {
            json,
            progress: false,
            ticker: Default::default(),
            diff_lines: retie_display::DEFAULT_DIFF_LINES,
            err: Style::stderr(),
            text: Gutter::new(MODEL_MARK),
            reasoning: Gutter::new(REASONING_MARK),
        }
    }
}

impl Render for PlainRender {
    fn call_started(&mut self, call: &ToolCall) {
        self.ticker.stop();
        if self.progress && call.name == "bash" {
            self.ticker = super::super::progress::Ticker::start("bash");
        }
    }
    fn event(&mut self, ev: &StreamEvent) {
        match ev {
            StreamEvent::Text(t) if self.json => eprint!("{}", self.text.mark(t)),
            StreamEvent::Text(t) => {
                print!("{}", self.text.mark(t));
                let _ = std::io::stdout().flush();
            }
            StreamEvent::Reasoning(t) => {
                let marked = self.reasoning.mark(t);
                eprint!("{}", self.err.dim(&marked));
            }
            StreamEvent::ToolCall(_) => {}
        }
    }
    fn call(&mut self, c: &CallRecord) {
        self.ticker.stop();
        // What follows starts a line of its own (printed below). Text on
        // a stdout that is not the terminal (a pipe, a file) gets its own
        // line break, or one turn's text runs into the next's.
        if !self.json && !std::io::stdout().is_terminal() {
            print!("{}", self.text.end_line());
            let _ = std::io::stdout().flush();
        }
        self.text.new_line();
        self.reasoning.new_line();
        let id = c.action.map(|a| format!("#{a} ")).unwrap_or_default();
        let said: String = c
            .said
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(160)
            .collect();
        eprintln!(
            "\n  → {id}{}: {} — {}",
            visible_again(&c.summary, false),
            c.status,
            preview(&said)
        );
        for l in
            crate::ui::changes::after_call(&c.tool, c.action, &c.changes, self.err, self.diff_lines)
        {
            eprintln!("{l}");
        }
    }
    fn retrying(&mut self, why: &str, wait: std::time::Duration) {
        eprintln!(
            "\nretie: retrying in {:.1} s: {} (what this attempt streamed is dropped)",
            wait.as_secs_f64(),
            visible(why)
        );
    }

    fn switched(&mut self, line: &str) {
        eprintln!("\nretie: ladder: {line}");
    }
}
