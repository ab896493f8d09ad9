//! Reading a shell command line for the approval prompt.
//!
//! [`split`] turns a command line into its simple commands: the parts joined
//! by pipes, `&&`, `||`, `;`, `&` and newlines, the commands inside
//! subshells `( ... )`, and those inside command and process substitutions
//! (`$( ... )`, backticks, `<( ... )`), each with the operator that joins it
//! to the one before. Quotes and escapes are removed from words; a word whose
//! value depends on the environment (`$VAR`, a glob, a substitution) is
//! marked dynamic.
//!
//! This informs a person and lets rules match prefixes: allow `cargo test`
//! but not `cargo test && curl ...`. It never makes an unsandboxed command
//! reversible, and it does not claim to be a full shell parser: what it does
//! not understand (keywords, heredoc bodies) comes out as extra commands that
//! match no allow prefix, so the reading errs towards asking.

use std::fmt;

use serde::Serialize;

use crate::error::Error;

/// Nesting limit, so hostile input cannot exhaust the stack.
const MAX_DEPTH: usize = 64;

/// The operator joining a simple command to the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Connector {
    /// First command of a list, subshell or substitution.
    Start,
    /// `|` (or `|&`).
    Pipe,
    /// `&&`
    And,
    /// `||`
    Or,
    /// `;` or a newline.
    Seq,
    /// `&` (the previous command runs in the background).
    Background,
}

impl Connector {
    /// The operator as written (`""` for [`Connector::Start`]).
    pub fn symbol(self) -> &'static str {
        match self {
            Connector::Start => "",
            Connector::Pipe => "|",
            Connector::And => "&&",
            Connector::Or => "||",
            Connector::Seq => ";",
            Connector::Background => "&",
        }
    }
}

/// A word after quote removal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Word {
    /// The text, quotes and escapes removed; expansions kept as written.
    pub text: String,
    /// The value depends on expansion at run time (`$x`, glob, substitution).
    pub dynamic: bool,
}

/// A redirection such as `> out.txt` or `2>&1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Redirect {
    /// The operator with its file descriptor, e.g. `2>`, `>>`, `<`.
    pub op: String,
    /// The target word.
    pub target: Word,
}

impl Redirect {
    /// Duplicates a descriptor (`2>&1`) or targets `/dev/null`: writes no file.
    pub fn is_harmless(&self) -> bool {
        self.op.ends_with('&')
            && !self.target.dynamic
            && self
                .target
                .text
                .chars()
                .all(|c| c.is_ascii_digit() || c == '-')
            || (self.target.text == "/dev/null" && !self.target.dynamic)
    }
}

/// One simple command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimpleCommand {
    /// Its words (the command name first).
    pub words: Vec<Word>,
    /// Its redirections.
    pub redirects: Vec<Redirect>,
    /// The operator joining it to the previous command at the same level.
    pub connector: Connector,
    /// 0 at top level, +1 per subshell or substitution around it.
    pub depth: usize,
    /// It runs inside a command or process substitution.
    pub in_substitution: bool,
}

impl SimpleCommand {
    /// The literal words up to the first dynamic one.
    fn literal_prefix(&self) -> impl Iterator<Item = &str> {
        self.words
            .iter()
            .take_while(|w| !w.dynamic)
            .map(|w| w.text.as_str())
    }
}

impl fmt::Display for SimpleCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for w in &self.words {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            f.write_str(&quote(&w.text))?;
        }
        for r in &self.redirects {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{}{}", r.op, quote(&r.target.text))?;
        }
        Ok(())
    }
}

/// Quote a word for display if it needs it.
fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^$*?[]{}~".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A command line split into its simple commands, in the order they appear
/// (a substitution's commands come before the command that contains them,
/// which is the order they run in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShellLine {
    /// The simple commands.
    pub commands: Vec<SimpleCommand>,
}

/// Split a command line into its simple commands.
pub fn split(line: &str) -> Result<ShellLine, Error> {
    let chars: Vec<char> = line.chars().collect();
    let mut p = Parser {
        chars: &chars,
        pos: 0,
        out: Vec::new(),
    };
    p.list(None, 0, false)?;
    Ok(ShellLine { commands: p.out })
}

struct Parser<'a> {
    chars: &'a [char],
    pos: usize,
    out: Vec<SimpleCommand>,
}

fn err(offset: usize, problem: impl Into<String>) -> Error {
    Error::ShellSyntax {
        offset,
        problem: problem.into(),
    }
}

fn is_meta(c: char) -> bool {
    matches!(c, '|' | '&' | ';' | '<' | '>' | '(' | ')' | '\n')
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t' || c == '\r'
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.chars.get(self.pos + n).copied()
    }

    fn skip_blanks(&mut self) {
        while let Some(c) = self.peek() {
            if is_blank(c) {
                self.pos += 1;
            } else if c == '\\' && self.peek_at(1) == Some('\n') {
                self.pos += 2;
            } else {
                break;
            }
        }
    }

    /// Parse a list until `end` (or the end of input when `end` is None).
    fn list(&mut self, end: Option<char>, depth: usize, subst: bool) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(err(self.pos, "nested too deeply"));
        }
        let opened_at = self.pos;
        let mut connector = Connector::Start;
        loop {
            self.skip_blanks();
            match self.peek() {
                None => {
                    return match end {
                        None => Ok(()),
                        Some(c) => Err(err(
                            opened_at,
                            format!("missing closing {c:?} for the group opened here"),
                        )),
                    };
                }
                Some(c) if Some(c) == end => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(')') => return Err(err(self.pos, "unmatched ')'")),
                Some('\n') | Some(';') => {
                    // An empty command between separators is allowed (blank lines).
                    self.pos += 1;
                    if connector != Connector::Start {
                        connector = Connector::Seq;
                    }
                    continue;
                }
                Some('#') => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                    continue;
                }
                _ => {}
            }
            self.pipeline(connector, depth, subst)?;
            self.skip_blanks();
            connector = match (self.peek(), self.peek_at(1)) {
                (Some('&'), Some('&')) => {
                    self.pos += 2;
                    self.expect_command_after("&&")?;
                    Connector::And
                }
                (Some('|'), Some('|')) => {
                    self.pos += 2;
                    self.expect_command_after("||")?;
                    Connector::Or
                }
                (Some('&'), _) => {
                    self.pos += 1;
                    Connector::Background
                }
                (Some(';'), _) | (Some('\n'), _) => {
                    self.pos += 1;
                    Connector::Seq
                }
                (None, _) => continue,
                (Some(c), _) if Some(c) == end || c == ')' => continue,
                (Some(c), _) => {
                    return Err(err(self.pos, format!("unexpected {c:?}")));
                }
            };
        }
    }

    /// After `&&`, `||` or `|`, a command must follow (newlines may intervene).
    fn expect_command_after(&mut self, op: &str) -> Result<(), Error> {
        loop {
            self.skip_blanks();
            if self.peek() == Some('\n') {
                self.pos += 1;
            } else {
                break;
            }
        }
        match self.peek() {
            None | Some(';') | Some('&') | Some('|') | Some(')') => {
                Err(err(self.pos, format!("{op} must be followed by a command")))
            }
            _ => Ok(()),
        }
    }

    fn pipeline(&mut self, connector: Connector, depth: usize, subst: bool) -> Result<(), Error> {
        self.command(connector, depth, subst)?;
        loop {
            self.skip_blanks();
            if self.peek() == Some('|') && self.peek_at(1) != Some('|') {
                self.pos += 1;
                if self.peek() == Some('&') {
                    self.pos += 1;
                }
                self.expect_command_after("|")?;
                self.command(Connector::Pipe, depth, subst)?;
            } else {
                return Ok(());
            }
        }
    }

    fn command(&mut self, connector: Connector, depth: usize, subst: bool) -> Result<(), Error> {
        self.skip_blanks();
        if self.peek() == Some('(') {
            self.pos += 1;
            let first = self.out.len();
            self.list(Some(')'), depth + 1, subst)?;
            if let Some(cmd) = self.out.get_mut(first) {
                // The subshell as a whole is joined by `connector`.
                if cmd.connector == Connector::Start {
                    cmd.connector = connector;
                }
            }
            // Redirections after a subshell apply to all of it; keep them as
            // a command of their own so no allow prefix covers them.
            let mut words = Vec::new();
            let mut redirects = Vec::new();
            self.simple_parts(&mut words, &mut redirects, depth, subst)?;
            if !words.is_empty() {
                return Err(err(self.pos, "words after a subshell"));
            }
            if !redirects.is_empty() {
                self.out.push(SimpleCommand {
                    words,
                    redirects,
                    connector: Connector::Seq,
                    depth,
                    in_substitution: subst,
                });
            }
            return Ok(());
        }
        let mut words = Vec::new();
        let mut redirects = Vec::new();
        self.simple_parts(&mut words, &mut redirects, depth, subst)?;
        if words.is_empty() && redirects.is_empty() {
            return Err(err(self.pos, "expected a command"));
        }
        self.out.push(SimpleCommand {
            words,
            redirects,
            connector,
            depth,
            in_substitution: subst,
        });
        Ok(())
    }

    fn simple_parts(
        &mut self,
        words: &mut Vec<Word>,
        redirects: &mut Vec<Redirect>,
        depth: usize,
        subst: bool,
    ) -> Result<(), Error> {
        loop {
            self.skip_blanks();
            let Some(c) = self.peek() else { return Ok(()) };
            // Process substitution: <( ... ) or >( ... ).
            if (c == '<' || c == '>') && self.peek_at(1) == Some('(') {
                self.pos += 2;
                self.list(Some(')'), depth + 1, true)?;
                words.push(Word {
                    text: format!("{c}(...)"),
                    dynamic: true,
                });
                continue;
            }
            if let Some(op) = self.redirect_op() {
                self.skip_blanks();
                match self.peek() {
                    Some(c) if !is_meta(c) => {
                        let target = self.word(depth, subst)?;
                        redirects.push(Redirect { op, target });
                    }
                    _ => return Err(err(self.pos, format!("redirection {op} has no target"))),
                }
                continue;
            }
            if c == '(' {
                return Err(err(self.pos, "unexpected '(' inside a command"));
            }
            if is_meta(c) {
                return Ok(());
            }
            if c == '#' && words.is_empty() && redirects.is_empty() {
                return Ok(());
            }
            if c == '#' {
                // A comment starts only at the beginning of a word.
                while self.peek().is_some_and(|c| c != '\n') {
                    self.pos += 1;
                }
                return Ok(());
            }
            let w = self.word(depth, subst)?;
            words.push(w);
        }
    }

    /// A redirection operator at the current position, consumed if present.
    fn redirect_op(&mut self) -> Option<String> {
        let start = self.pos;
        let mut i = self.pos;
        let mut op = String::new();
        // Optional file descriptor number, or `&>`.
        while let Some(c) = self.chars.get(i).copied().filter(char::is_ascii_digit) {
            op.push(c);
            i += 1;
        }
        let c = self.chars.get(i).copied();
        let next = self.chars.get(i + 1).copied();
        if op.is_empty() && c == Some('&') && next == Some('>') {
            op.push_str("&>");
            i += 2;
            if self.chars.get(i) == Some(&'>') {
                op.push('>');
                i += 1;
            }
        } else if c == Some('>') || c == Some('<') {
            op.push(c.unwrap_or('>'));
            i += 1;
            while let Some(d) = self
                .chars
                .get(i)
                .copied()
                .filter(|d| matches!(d, '>' | '<' | '&' | '|'))
            {
                if op.len() >= 4 {
                    break;
                }
                op.push(d);
                i += 1;
            }
        } else {
            self.pos = start;
            return None;
        }
        self.pos = i;
        Some(op)
    }

    /// One word, quotes and escapes removed.
    fn word(&mut self, depth: usize, subst: bool) -> Result<Word, Error> {
        let mut text = String::new();
        let mut dynamic = false;
        let start = self.pos;
        if self.peek() == Some('~') {
            dynamic = true;
        }
        while let Some(c) = self.peek() {
            if is_blank(c) || is_meta(c) {
                break;
            }
            match c {
                '\'' => {
                    let open = self.pos;
                    self.pos += 1;
                    loop {
                        match self.peek() {
                            None => return Err(err(open, "unterminated single quote")),
                            Some('\'') => {
                                self.pos += 1;
                                break;
                            }
                            Some(q) => {
                                text.push(q);
                                self.pos += 1;
                            }
                        }
                    }
                }
                '"' => {
                    let open = self.pos;
                    self.pos += 1;
                    loop {
                        match self.peek() {
                            None => return Err(err(open, "unterminated double quote")),
                            Some('"') => {
                                self.pos += 1;
                                break;
                            }
                            Some('\\') => {
                                match self.peek_at(1) {
                                    Some(e @ ('$' | '`' | '"' | '\\')) => text.push(e),
                                    Some('\n') => {}
                                    Some(other) => {
                                        text.push('\\');
                                        text.push(other);
                                    }
                                    None => return Err(err(open, "unterminated double quote")),
                                }
                                self.pos += 2;
                            }
                            Some('$') => {
                                dynamic |= self.dollar(&mut text, depth, subst)?;
                            }
                            Some('`') => {
                                self.backtick(&mut text, depth)?;
                                dynamic = true;
                            }
                            Some(q) => {
                                text.push(q);
                                self.pos += 1;
                            }
                        }
                    }
                }
                '\\' => match self.peek_at(1) {
                    Some('\n') => self.pos += 2,
                    Some(e) => {
                        text.push(e);
                        self.pos += 2;
                    }
                    None => {
                        text.push('\\');
                        self.pos += 1;
                    }
                },
                '$' => {
                    dynamic |= self.dollar(&mut text, depth, subst)?;
                }
                '`' => {
                    self.backtick(&mut text, depth)?;
                    dynamic = true;
                }
                '*' | '?' | '[' => {
                    dynamic = true;
                    text.push(c);
                    self.pos += 1;
                }
                _ => {
                    text.push(c);
                    self.pos += 1;
                }
            }
        }
        if self.pos == start {
            return Err(err(self.pos, "expected a word"));
        }
        Ok(Word { text, dynamic })
    }

    /// At a `$`: consume an expansion. Returns whether it was one.
    fn dollar(&mut self, text: &mut String, depth: usize, _subst: bool) -> Result<bool, Error> {
        let open = self.pos;
        match self.peek_at(1) {
            Some('(') if self.peek_at(2) == Some('(') => {
                // Arithmetic $(( ... )): skip to the matching "))".
                self.pos += 3;
                let mut level = 2usize;
                while level > 0 {
                    match self.peek() {
                        None => return Err(err(open, "unterminated $((")),
                        Some('(') => level += 1,
                        Some(')') => level -= 1,
                        Some(_) => {}
                    }
                    self.pos += 1;
                }
                text.push_str("$((...))");
                Ok(true)
            }
            Some('(') => {
                self.pos += 2;
                self.list(Some(')'), depth + 1, true)?;
                text.push_str("$(...)");
                Ok(true)
            }
            Some('{') => {
                self.pos += 2;
                text.push_str("${");
                loop {
                    match self.peek() {
                        None => return Err(err(open, "unterminated ${")),
                        Some('}') => {
                            self.pos += 1;
                            text.push('}');
                            break;
                        }
                        Some(c) => {
                            text.push(c);
                            self.pos += 1;
                        }
                    }
                }
                Ok(true)
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                text.push('$');
                self.pos += 1;
                while let Some(c) = self
                    .peek()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                {
                    text.push(c);
                    self.pos += 1;
                }
                Ok(true)
            }
            Some(c) if c.is_ascii_digit() || "@*#?$!-".contains(c) => {
                text.push('$');
                text.push(c);
                self.pos += 2;
                Ok(true)
            }
            _ => {
                text.push('$');
                self.pos += 1;
                Ok(false)
            }
        }
    }

    /// At a backtick: parse the substitution inside.
    fn backtick(&mut self, text: &mut String, depth: usize) -> Result<(), Error> {
        let open = self.pos;
        self.pos += 1;
        let mut inner = String::new();
        loop {
            match self.peek() {
                None => return Err(err(open, "unterminated backtick")),
                Some('`') => {
                    self.pos += 1;
                    break;
                }
                Some('\\') => {
                    match self.peek_at(1) {
                        Some(e @ ('`' | '\\' | '$')) => inner.push(e),
                        Some(e) => {
                            inner.push('\\');
                            inner.push(e);
                        }
                        None => return Err(err(open, "unterminated backtick")),
                    }
                    self.pos += 2;
                }
                Some(c) => {
                    inner.push(c);
                    self.pos += 1;
                }
            }
        }
        if depth + 1 > MAX_DEPTH {
            return Err(err(open, "nested too deeply"));
        }
        let chars: Vec<char> = inner.chars().collect();
        let mut sub = Parser {
            chars: &chars,
            pos: 0,
            out: Vec::new(),
        };
        sub.list(None, depth + 1, true).map_err(|e| match e {
            Error::ShellSyntax { offset, problem } => err(open + 1 + offset, problem),
            other => other,
        })?;
        self.out.append(&mut sub.out);
        text.push_str("`...`");
        Ok(())
    }
}

/// Prefix rules over simple commands, from the policy's `[shell]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellRules {
    allow: Vec<Vec<String>>,
    deny: Vec<Vec<String>>,
}

/// Whether a whole command line is covered by allow prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Every simple command matched an allow prefix (and there is at least one).
    pub all_allowed: bool,
    /// For each simple command, the allow prefix it matched, if any.
    pub matched: Vec<Option<String>>,
}

impl ShellRules {
    /// Build from prefix strings (each split into words on whitespace).
    pub fn new(allow: &[String], deny: &[String]) -> Result<ShellRules, String> {
        let words = |list: &[String], which: &str| -> Result<Vec<Vec<String>>, String> {
            list.iter()
                .map(|p| {
                    let w: Vec<String> = p.split_whitespace().map(str::to_owned).collect();
                    if w.is_empty() {
                        Err(format!("an empty {which} prefix would match every command"))
                    } else {
                        Ok(w)
                    }
                })
                .collect()
        };
        Ok(ShellRules {
            allow: words(allow, "allow")?,
            deny: words(deny, "deny")?,
        })
    }

    /// The allow prefixes, as written (words joined by one space).
    pub fn allow_prefixes(&self) -> Vec<String> {
        self.allow.iter().map(|w| w.join(" ")).collect()
    }

    /// The deny prefixes, as written.
    pub fn deny_prefixes(&self) -> Vec<String> {
        self.deny.iter().map(|w| w.join(" ")).collect()
    }

    /// Which allow prefix, if any, covers one simple command. A command is
    /// covered when its leading literal words equal the prefix and it writes
    /// no file by redirection.
    pub fn allowed_by(&self, cmd: &SimpleCommand) -> Option<String> {
        if cmd.redirects.iter().any(|r| !r.is_harmless()) {
            return None;
        }
        let lit: Vec<&str> = cmd.literal_prefix().collect();
        self.allow
            .iter()
            .filter(|p| p.len() <= lit.len() && p.iter().zip(&lit).all(|(a, b)| a == b))
            .max_by_key(|p| p.len())
            .map(|p| p.join(" "))
    }

    /// Whether every simple command of `line` is covered by an allow prefix.
    pub fn coverage(&self, line: &ShellLine) -> Coverage {
        let matched: Vec<Option<String>> =
            line.commands.iter().map(|c| self.allowed_by(c)).collect();
        Coverage {
            all_allowed: !matched.is_empty() && matched.iter().all(Option::is_some),
            matched,
        }
    }

    /// The first simple command matching a deny prefix, with that prefix.
    /// Leading `NAME=value` assignments are skipped, and the command name is
    /// also compared by its last path component (`/usr/bin/sudo` is `sudo`).
    pub fn denied(&self, line: &ShellLine) -> Option<(String, String)> {
        for cmd in &line.commands {
            let words: Vec<&str> = cmd
                .words
                .iter()
                .map(|w| w.text.as_str())
                .skip_while(|w| is_assignment(w))
                .collect();
            for p in &self.deny {
                if p.len() > words.len() {
                    continue;
                }
                let hit = p.iter().zip(&words).enumerate().all(|(i, (a, b))| {
                    a == b || (i == 0 && !a.contains('/') && b.rsplit('/').next() == Some(a))
                });
                if hit {
                    return Some((cmd.to_string(), p.join(" ")));
                }
            }
        }
        None
    }
}

fn is_assignment(w: &str) -> bool {
    match w.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}
