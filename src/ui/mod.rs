//! Terminal output helpers.

pub mod changes;

pub use retie_display::{preview, shell_line, visible, visible_again, visible_line};

/// An error message as it reaches the terminal: every character
/// [`visible`] would escape is escaped, so that a name inside it (a file
/// the sandboxed command made, a path from a changeset) cannot move the
/// cursor, set a title or fake a line; the message's own line breaks
/// (`\n  fix: ...`) stay. Backslashes are not doubled: the names inside
/// were escaped where they were put in the message (a second doubling
/// would show `\\e` for an escape).
pub fn error_text(msg: &str) -> String {
    retie_display::visible_again(msg, true)
}

/// `retie: MESSAGE` on standard error, through [`error_text`].
pub fn say_error(msg: &dyn std::fmt::Display) {
    eprintln!("retie: {}", error_text(&msg.to_string()));
}

/// An error's line with its causes, each once and on the line
/// ([`retie_display::with_causes`]).
pub fn failure_text(e: &dyn std::error::Error) -> String {
    retie_display::with_causes(e)
}

/// [`say_error`] for an error, with its causes ([`failure_text`]).
pub fn say_failure(e: &dyn std::error::Error) {
    say_error(&failure_text(e));
}

/// A resume runs under another autonomy than the session recorded.
pub fn say_tier_change(was: retie_policy::Tier, now: retie_policy::Tier) {
    eprintln!(
        "retie: autonomy {now} from here on (the session had {was}; recorded). Decisions already recorded still bind: a denied action stays denied, a pending one still asks"
    );
}

/// Print a table with a header row, columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.clone()));
        out.push('\n');
    }
    out
}

/// True when `NO_COLOR` is set to anything but the empty string
/// (<https://no-color.org>).
pub fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// Colours for one stream: on only when it is a terminal and `NO_COLOR`
/// is not set. Off, every method returns its text unchanged.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
}

impl Style {
    /// For stdout (`/diff`, `retie replay --diff`).
    pub fn stdout() -> Style {
        use std::io::IsTerminal;
        Style {
            color: std::io::stdout().is_terminal() && !no_color(),
        }
    }
    /// For stderr (prompts, tool lines, reasoning).
    pub fn stderr() -> Style {
        use std::io::IsTerminal;
        Style {
            color: std::io::stderr().is_terminal() && !no_color(),
        }
    }
    fn paint(self, sgr: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{sgr}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    pub fn dim(self, s: &str) -> String {
        self.paint("2", s)
    }
    pub fn bold(self, s: &str) -> String {
        self.paint("1", s)
    }
    pub fn red(self, s: &str) -> String {
        self.paint("31", s)
    }
    pub fn green(self, s: &str) -> String {
        self.paint("32", s)
    }
    pub fn yellow(self, s: &str) -> String {
        self.paint("33", s)
    }
    pub fn cyan(self, s: &str) -> String {
        self.paint("36", s)
    }
}

/// Text a model or a file controls, for a terminal: every line escaped
/// like [`visible_line`] (controls, bidi and invisible characters shown as
/// escapes, tabs kept), the line breaks kept as line breaks.
pub fn prose(s: &str) -> String {
    s.split('\n')
        .map(visible_line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The mark at the start of every line of the model's answer: nothing the
/// model writes can pass for a line of retie's own (`retie: applied ...`).
pub const MODEL_MARK: &str = "│ ";
/// The mark of every line of the model's reasoning.
pub const REASONING_MARK: &str = "┆ ";

/// Marks every line of streamed model text: the text arrives in pieces,
/// so it remembers whether the next piece starts a line.
#[derive(Debug, Clone)]
pub struct Gutter {
    mark: &'static str,
    at_line_start: bool,
}

impl Gutter {
    pub fn new(mark: &'static str) -> Gutter {
        Gutter {
            mark,
            at_line_start: true,
        }
    }

    /// `piece` escaped ([`prose`]) with the mark before each line it starts.
    pub fn mark(&mut self, piece: &str) -> String {
        let text = prose(piece);
        let mut out = String::with_capacity(text.len() + 8);
        for ch in text.chars() {
            if self.at_line_start {
                out.push_str(self.mark);
                self.at_line_start = false;
            }
            out.push(ch);
            if ch == '\n' {
                self.at_line_start = true;
            }
        }
        out
    }

    /// The line break that ends a line left open ("" at a line's start);
    /// the next piece starts a new line.
    pub fn end_line(&mut self) -> &'static str {
        let open = !self.at_line_start;
        self.at_line_start = true;
        if open {
            "\n"
        } else {
            ""
        }
    }

    /// The next piece starts a new line (a line break was printed
    /// outside the gutter).
    pub fn new_line(&mut self) {
        self.at_line_start = true;
    }
}

/// A size for a person to read: `498 B`, `73.4 KiB`, `1.2 GiB` (binary
/// units, one decimal). JSON output keeps exact bytes.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod size_tests {
    use super::human_size;

    #[test]
    fn sizes_read_as_a_person_would_write_them() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1024), "1.0 KiB");
        assert_eq!(human_size(75_209), "73.4 KiB");
        assert_eq!(human_size(5 * 1024 * 1024 + 1), "5.0 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
        assert_eq!(human_size(u64::MAX), "16384.0 PiB");
    }
}

#[cfg(test)]
mod gutter_tests {
    use super::*;

    /// Issue 26.9: a line break in model text cannot start a line that
    /// looks like retie's own, however the text is split into pieces.
    #[test]
    fn every_line_of_model_text_is_marked() {
        let mut g = Gutter::new(MODEL_MARK);
        let out = [
            g.mark("Done.\nretie: app"),
            g.mark("lied 0 change(s)\n"),
            g.mark("\nretie: x\r\x1b[2K"),
        ]
        .concat();
        for line in out.lines() {
            assert!(
                line.starts_with(MODEL_MARK),
                "unmarked line {line:?} in {out:?}"
            );
        }
        assert_eq!(out.lines().count(), 4, "{out:?}");
        assert!(!out.contains('\r') && !out.contains('\u{1b}'), "{out:?}");
    }
}

#[cfg(test)]
mod error_text_tests {
    use super::error_text;

    #[test]
    fn error_text_escapes_all_but_its_own_line_breaks() {
        assert_eq!(
            error_text("open upper x\u{1b}[2J\u{1b}]0;t\u{7}\n  fix: chmod"),
            "open upper x\\e[2J\\e]0;t\\x07\n  fix: chmod"
        );
        // An escape already made where the name entered the message is
        // not escaped again.
        assert_eq!(error_text(r"open upper x\e[2J"), r"open upper x\e[2J");
    }
}
