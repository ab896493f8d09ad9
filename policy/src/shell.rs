//! Reading a shell command line the way bash does, for the approval prompt.
//!
//! [`split`] parses a command line with tree-sitter-bash (ADR 0106) and
//! returns every simple command bash could run: the parts joined by pipes,
//! `&&`, `||`, `;`, `&` and newlines, and those nested anywhere else, in
//! subshells, groups, `$( )`, backticks, `<( )`, `${x:-$( )}`, `$(( ))`,
//! function bodies, loops, `case` arms, unquoted heredoc bodies, and the
//! bodies of `bash -c '...'`, `sh -c` and `eval` (parsed again, recursively).
//!
//! A line is *plain* when it is nothing but simple commands of literal words
//! (after quote removal) joined by those operators, with redirections to
//! literal files: no expansion, no substitution, no `$'...'`, no heredoc, no
//! assignment, no function, array, loop, group or subshell, no comment and no
//! control character. Only a plain line can be covered by allow prefixes.
//! Any other line is shown to a person as its raw text with every command
//! listed, and never counts as covered.
//!
//! A line tree-sitter cannot parse is an error; the caller asks, and scans
//! the line's tokens for deny prefixes ([`ShellRules::denied_in_tokens`]).
//!
//! Deny prefixes match what runs: leading assignments are skipped, wrappers
//! (`env`, `command`, `exec`, `time`, `nohup`, `nice`, `timeout`, `xargs`,
//! `sudo`, `doas`, ...) are unwrapped layer by layer, and flags are compared
//! as sets (`rm -fr`, `rm -r -f` and `rm --recursive --force` are `rm -rf`).
//! They are a convenience in front of the sandbox, not the control.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use crate::display::{escape_for_terminal, needs_escape};
use crate::error::Error;

/// Longest line read; longer lines are an error (so the caller asks).
const MAX_LINE_BYTES: usize = 64 * 1024;
/// Deepest syntax tree walked, so hostile input cannot exhaust the stack.
const MAX_DEPTH: usize = 200;
/// Deepest `bash -c` / `eval` nesting parsed again.
const MAX_NESTED_SHELLS: usize = 8;

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
    /// The text, quotes and escapes removed when it is literal; as written
    /// (raw source) when it is not.
    pub text: String,
    /// The value depends on expansion at run time (`$x`, glob, substitution,
    /// `$'...'`), so `text` is the source, not the value.
    pub dynamic: bool,
}

/// A redirection such as `> out.txt` or `2>&1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Redirect {
    /// The operator with its file descriptor, e.g. `2>&`, `>>`, `<`, `<<`.
    pub op: String,
    /// The target word (a heredoc's delimiter).
    pub target: Word,
}

impl Redirect {
    /// Duplicates a descriptor (`2>&1`) or targets `/dev/null`: writes no file.
    pub fn is_harmless(&self) -> bool {
        if self.target.dynamic || self.op.starts_with("<<") {
            return false;
        }
        let dup = self.op.ends_with('&')
            && !self.target.text.is_empty()
            && self
                .target
                .text
                .chars()
                .all(|c| c.is_ascii_digit() || c == '-');
        dup || self.target.text == "/dev/null"
    }
}

/// One simple command (or a builtin-like statement such as `declare` or
/// `[[ ... ]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SimpleCommand {
    /// Its words (leading `NAME=value` assignments, then the command name).
    pub words: Vec<Word>,
    /// Its redirections.
    pub redirects: Vec<Redirect>,
    /// The operator joining it to the previous command at the same level.
    pub connector: Connector,
    /// 0 at top level, +1 per subshell, substitution or `bash -c` around it.
    pub depth: usize,
    /// It runs inside a command or process substitution, or from a string
    /// (`bash -c`, `eval`).
    pub in_substitution: bool,
    /// Every word is literal, there is no assignment and no heredoc, and
    /// every redirection target is literal.
    pub plain: bool,
    /// The command as written in the line (control characters included).
    pub source: String,
}

impl SimpleCommand {
    /// The words with leading `NAME=value` assignments skipped.
    fn command_words(&self) -> &[Word] {
        let skip = self
            .words
            .iter()
            .take_while(|w| is_assignment(&w.text))
            .count();
        self.words.get(skip..).unwrap_or(&[])
    }

    /// The command and, for a wrapper such as `env`, `sudo -u x`, `timeout 5`
    /// or `xargs`, each command it runs in turn (outermost first).
    pub fn layers(&self) -> Vec<&[Word]> {
        let mut out = Vec::new();
        let mut cur = self.command_words();
        for _ in 0..16 {
            if cur.is_empty() {
                break;
            }
            out.push(cur);
            match unwrap_once(cur) {
                Some(inner) => cur = inner,
                None => break,
            }
        }
        out
    }

    /// The names of the programs this command runs: its own and those of
    /// the commands its wrappers run, each as written (a dynamic name as its
    /// source text).
    pub fn names(&self) -> Vec<String> {
        self.layers()
            .iter()
            .filter_map(|l| l.first())
            .map(|w| w.text.clone())
            .collect()
    }

    /// The literal words up to the first dynamic one.
    fn literal_prefix(&self) -> impl Iterator<Item = &str> {
        self.words
            .iter()
            .take_while(|w| !w.dynamic)
            .map(|w| w.text.as_str())
    }
}

impl fmt::Display for SimpleCommand {
    /// A plain command as its words, quoted where needed; any other as its
    /// source text. Control characters are always escaped.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.plain {
            return f.write_str(&escape_for_terminal(&self.source));
        }
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

/// Quote a word for display if it needs it; control characters come out as
/// a `$'...'` word with visible escapes.
fn quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%^".contains(c));
    if plain {
        s.to_owned()
    } else if needs_escape(s) {
        format!("$'{}'", escape_for_terminal(s).replace('\'', r"\'"))
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A command line read into its simple commands, in the order they appear
/// (a substitution's commands come before the command that contains them,
/// which is the order they run in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShellLine {
    /// Every simple command, nested ones included.
    pub commands: Vec<SimpleCommand>,
    /// The whole line is plain (see the module documentation).
    pub plain: bool,
    /// Why it is not plain, one phrase per kind of construct (empty when
    /// it is).
    pub not_plain: Vec<String>,
}

impl ShellLine {
    /// The names of every program the line may run (wrappers unwrapped),
    /// deduplicated and sorted.
    pub fn command_names(&self) -> BTreeSet<String> {
        self.commands
            .iter()
            .flat_map(SimpleCommand::names)
            .collect()
    }
}

/// Read a command line into its simple commands. An error means the line
/// is not valid bash (or too long, or too deeply nested): ask.
pub fn split(line: &str) -> Result<ShellLine, Error> {
    let mut r = Reader {
        src: line,
        out: Vec::new(),
        why: BTreeSet::new(),
        connector: Connector::Start,
    };
    r.read(line, 0, 0, false)?;
    let plain = r.why.is_empty();
    Ok(ShellLine {
        commands: r.out,
        plain,
        not_plain: r.why.into_iter().collect(),
    })
}

fn err(src: &str, byte: usize, problem: impl Into<String>) -> Error {
    let offset = src.get(..byte).map_or(0, |s| s.chars().count());
    Error::ShellSyntax {
        offset,
        problem: problem.into(),
    }
}

/// tree-sitter-bash treats `\r` and other control and Unicode space
/// characters as blanks, bash treats them as ordinary word characters. The
/// parser is therefore fed a copy with each of them replaced by `_` bytes
/// (same length, so every offset still points into the original), and the
/// words are read from the original.
fn shadow(line: &str) -> (String, bool) {
    let mut out = String::with_capacity(line.len());
    let mut odd = false;
    for c in line.chars() {
        if c == ' ' || c == '\t' || c == '\n' || !(c.is_control() || c.is_whitespace()) {
            out.push(c);
        } else {
            odd = true;
            out.extend(std::iter::repeat_n('_', c.len_utf8()));
        }
    }
    (out, odd)
}

struct Reader<'a> {
    /// The outermost line, for error offsets.
    src: &'a str,
    out: Vec<SimpleCommand>,
    why: BTreeSet<String>,
    connector: Connector,
}

/// Node kinds a plain line may contain.
const PLAIN_KINDS: &[&str] = &[
    "program",
    "command",
    "command_name",
    "word",
    "string",
    "string_content",
    "raw_string",
    "concatenation",
    "pipeline",
    "list",
    "redirected_statement",
    "file_redirect",
    "file_descriptor",
    "number",
];

fn kind_phrase(kind: &str) -> String {
    match kind {
        "command_substitution" => "command substitution".into(),
        "process_substitution" => "process substitution".into(),
        "arithmetic_expansion" => "arithmetic expansion".into(),
        "expansion" | "simple_expansion" => "parameter expansion".into(),
        "ansi_c_string" => "ANSI-C quoting ($'...')".into(),
        "translated_string" => "locale quoting ($\"...\")".into(),
        "heredoc_redirect" | "heredoc_body" | "heredoc_start" | "heredoc_end" => "heredoc".into(),
        "herestring_redirect" => "herestring".into(),
        "variable_assignment" | "variable_assignments" => "variable assignment".into(),
        "function_definition" => "function definition".into(),
        "array" => "array".into(),
        "subshell" => "subshell".into(),
        "compound_statement" => "group { ...; }".into(),
        "case_statement" | "case_item" => "case".into(),
        "if_statement" | "elif_clause" | "else_clause" => "if".into(),
        "while_statement" | "for_statement" | "c_style_for_statement" | "do_group" => "loop".into(),
        "comment" => "comment".into(),
        "negated_command" => "negation (!)".into(),
        "test_command" => "test ([ ] or [[ ]])".into(),
        "declaration_command" | "unset_command" => "declaration".into(),
        "brace_expression" => "brace expansion".into(),
        other => other.replace('_', " "),
    }
}

impl Reader<'_> {
    fn not_plain(&mut self, why: impl Into<String>) {
        self.why.insert(why.into());
    }

    /// Parse `text` (the line, or a `bash -c` body) and collect its commands.
    fn read(&mut self, text: &str, base: usize, nest: usize, in_sub: bool) -> Result<(), Error> {
        if text.len() > MAX_LINE_BYTES {
            return Err(err(self.src, base, "the line is longer than 64 KiB"));
        }
        if nest > 2 * MAX_NESTED_SHELLS {
            return Err(err(self.src, base, "substitutions nested too deeply"));
        }
        if text.contains('\0') {
            return Err(err(self.src, base, "the line contains a NUL byte"));
        }
        let (shadowed, odd) = shadow(text);
        if odd {
            self.not_plain("control or unusual space character");
        }
        let tree = parse_bash(&shadowed).map_err(|problem| err(self.src, base, problem))?;
        let root = tree.root_node();
        if root.has_error() {
            let (at, what) = first_error(root);
            return Err(err(self.src, base + at, what));
        }
        self.connector = Connector::Start;
        self.visit(root, text, base, 0, nest, in_sub)
    }

    fn visit(
        &mut self,
        node: tree_sitter::Node<'_>,
        text: &str,
        base: usize,
        depth: usize,
        nest: usize,
        in_sub: bool,
    ) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(err(self.src, base + node.start_byte(), "nested too deeply"));
        }
        let kind = node.kind();
        let own_connector = self.connector;
        if !node.is_named() {
            self.connector = match kind {
                "|" | "|&" => Connector::Pipe,
                "&&" => Connector::And,
                "||" => Connector::Or,
                ";" | "\n" | ";;" | ";&" | ";;&" => Connector::Seq,
                "&" => Connector::Background,
                _ => self.connector,
            };
            return Ok(());
        }
        if !PLAIN_KINDS.contains(&kind) {
            self.not_plain(kind_phrase(kind));
        }
        if kind == "command_substitution" && raw(node, text).starts_with('`') {
            // tree-sitter-bash merges `a` `b` into one substitution; read
            // backticks the way bash pairs them instead.
            self.not_plain(kind_phrase(kind));
            for (at, inner) in backtick_spans(raw(node, text)) {
                let saved = self.connector;
                self.read(&inner, base + node.start_byte() + at, nest + 1, true)?;
                self.connector = saved;
            }
            return Ok(());
        }
        if matches!(kind, "word" | "string_content") && raw(node, text).contains('`') {
            for (at, inner) in backtick_spans(raw(node, text)) {
                let saved = self.connector;
                self.read(&inner, base + node.start_byte() + at, nest + 1, true)?;
                self.connector = saved;
            }
        }
        if kind == "heredoc_body" && !heredoc_quoted(node, text) {
            // tree-sitter-bash does not see backticks in a heredoc body;
            // bash runs them.
            for (at, inner) in backtick_spans(raw(node, text)) {
                let saved = self.connector;
                self.read(&inner, base + node.start_byte() + at, nest + 1, true)?;
                self.connector = saved;
            }
        }
        if kind == "word" && !word_value(node, text).1 {
            self.not_plain("glob, brace or tilde expansion");
        }
        let sub = matches!(kind, "command_substitution" | "process_substitution");
        let nested_depth = usize::from(sub || matches!(kind, "subshell"));
        let mut cursor = node.walk();
        let children: Vec<_> = node.children(&mut cursor).collect();
        let saved = self.connector;
        if sub || kind == "subshell" {
            self.connector = Connector::Start;
        }
        for child in children {
            self.visit(
                child,
                text,
                base,
                depth + 1,
                nest + nested_depth,
                in_sub || sub,
            )?;
        }
        if sub || kind == "subshell" {
            self.connector = saved;
        }
        if matches!(
            kind,
            "command" | "declaration_command" | "unset_command" | "test_command"
        ) {
            self.connector = own_connector;
            self.command(node, text, base, nest, in_sub)?;
        }
        Ok(())
    }

    /// Record one command node, then parse any command string it runs.
    fn command(
        &mut self,
        node: tree_sitter::Node<'_>,
        text: &str,
        base: usize,
        nest: usize,
        in_sub: bool,
    ) -> Result<(), Error> {
        let mut words = Vec::new();
        let mut redirects = Vec::new();
        let mut plain = node.kind() == "command";
        let mut cursor = node.walk();
        for (i, child) in node.children(&mut cursor).enumerate() {
            let field = node.field_name_for_child(i as u32);
            match child.kind() {
                "variable_assignment" => {
                    plain = false;
                    words.push(Word {
                        text: raw(child, text).to_owned(),
                        dynamic: true,
                    });
                }
                "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                    let r = redirect(child, text);
                    plain &= child.kind() == "file_redirect" && !r.target.dynamic;
                    redirects.push(r);
                }
                "command_name" => {
                    let w = child.named_child(0).unwrap_or(child);
                    let (t, lit) = word_value(w, text);
                    plain &= lit;
                    words.push(Word {
                        text: t,
                        dynamic: !lit,
                    });
                }
                _ if field == Some("argument") || node.kind() != "command" => {
                    if !child.is_named() && node.kind() == "command" {
                        continue;
                    }
                    let (t, lit) = word_value(child, text);
                    plain &= lit;
                    words.push(Word {
                        text: t,
                        dynamic: !lit,
                    });
                }
                _ => {}
            }
        }
        // Redirections written after the command belong to its
        // redirected_statement parent.
        if let Some(parent) = node.parent().filter(|p| p.kind() == "redirected_statement") {
            let mut c = parent.walk();
            for child in parent.children_by_field_name("redirect", &mut c) {
                let r = redirect(child, text);
                plain &= child.kind() == "file_redirect" && !r.target.dynamic;
                redirects.push(r);
            }
        }
        let cmd = SimpleCommand {
            words,
            redirects,
            connector: self.connector,
            depth: nest,
            in_substitution: in_sub,
            plain,
            source: raw(node, text).to_owned(),
        };
        self.connector = Connector::Start;
        let at = base + node.start_byte();
        let bodies = command_strings(&cmd);
        self.out.push(cmd);
        for body in bodies {
            match body {
                Some(body) => {
                    self.not_plain("runs a command string (bash -c, eval)");
                    if nest >= MAX_NESTED_SHELLS {
                        return Err(err(self.src, at, "command strings nested too deeply"));
                    }
                    let saved = self.connector;
                    self.read(&body, at, nest + 1, true)?;
                    self.connector = saved;
                }
                None => self.not_plain("runs a command string that is not literal"),
            }
        }
        Ok(())
    }
}

/// Whether a heredoc body belongs to a heredoc whose delimiter is quoted
/// (`<<'EOF'`, `<<"EOF"`, `<<\EOF`): then bash expands nothing in it.
fn heredoc_quoted(body: tree_sitter::Node<'_>, text: &str) -> bool {
    let Some(redirect) = body.parent() else {
        return false;
    };
    let mut c = redirect.walk();
    let quoted = redirect
        .children(&mut c)
        .find(|n| n.kind() == "heredoc_start")
        .is_some_and(|n| raw(n, text).contains(['\'', '"', '\\']));
    quoted
}

/// The backtick substitutions in `s` (unescaped `` ` `` pairs), each with
/// its byte offset and its text with `` \` ``, `\\` and `\$` unescaped.
fn backtick_spans(s: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut it = s.char_indices();
    while let Some((i, c)) = it.next() {
        match c {
            '\\' => {
                it.next();
            }
            '`' => {
                let mut inner = String::new();
                while let Some((_, d)) = it.next() {
                    match d {
                        '`' => break,
                        '\\' => match it.next() {
                            Some((_, e @ ('`' | '\\' | '$'))) => inner.push(e),
                            Some((_, e)) => {
                                inner.push('\\');
                                inner.push(e);
                            }
                            None => inner.push('\\'),
                        },
                        d => inner.push(d),
                    }
                }
                out.push((i + 1, inner));
            }
            _ => {}
        }
    }
    out
}

thread_local! {
    /// One tree-sitter parser per thread, reset before each use: creating
    /// one and loading the grammar costs more than parsing a command line.
    /// It carries no state from one line to the next (no old tree is ever
    /// passed back in).
    static PARSER: std::cell::RefCell<Option<tree_sitter::Parser>> =
        const { std::cell::RefCell::new(None) };
}

/// Parse `text` with tree-sitter-bash.
fn parse_bash(text: &str) -> Result<tree_sitter::Tree, String> {
    PARSER.with(|cell| {
        let mut slot = cell
            .try_borrow_mut()
            .map_err(|_| "the bash parser is busy".to_owned())?;
        if slot.is_none() {
            let mut parser = tree_sitter::Parser::new();
            parser
                .set_language(&tree_sitter_bash::LANGUAGE.into())
                .map_err(|e| format!("the bash grammar did not load: {e}"))?;
            *slot = Some(parser);
        }
        let parser = slot
            .as_mut()
            .ok_or_else(|| "the bash parser did not start".to_owned())?;
        parser.reset();
        parser
            .parse(text, None)
            .ok_or_else(|| "the bash parser gave up".to_owned())
    })
}

/// The first ERROR or MISSING node: its byte offset and a phrase.
fn first_error(root: tree_sitter::Node<'_>) -> (usize, String) {
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if n.is_missing() {
            return (n.start_byte(), format!("bash expects {:?} here", n.kind()));
        }
        if n.is_error() {
            return (n.start_byte(), "bash cannot parse the line here".into());
        }
        let mut c = n.walk();
        let mut kids: Vec<_> = n.children(&mut c).filter(|k| k.has_error()).collect();
        kids.reverse();
        stack.extend(kids);
    }
    (0, "bash cannot parse the line".into())
}

fn raw<'t>(node: tree_sitter::Node<'_>, text: &'t str) -> &'t str {
    text.get(node.start_byte()..node.end_byte()).unwrap_or("")
}

fn redirect(node: tree_sitter::Node<'_>, text: &str) -> Redirect {
    let mut op = String::new();
    let mut target = None;
    let mut cursor = node.walk();
    for (i, child) in node.children(&mut cursor).enumerate() {
        match node.field_name_for_child(i as u32) {
            Some("descriptor") => op.push_str(raw(child, text)),
            Some("destination") if target.is_none() => {
                let (t, lit) = word_value(child, text);
                target = Some(Word {
                    text: t,
                    dynamic: !lit,
                });
            }
            _ if !child.is_named() && op.chars().all(|c| c.is_ascii_digit()) => {
                op.push_str(raw(child, text));
            }
            _ if child.kind() == "heredoc_start" && target.is_none() => {
                target = Some(Word {
                    text: raw(child, text).to_owned(),
                    dynamic: true,
                });
            }
            _ => {}
        }
    }
    if node.kind() != "file_redirect" && op.is_empty() {
        op.push_str("<<");
    }
    Redirect {
        op,
        target: target.unwrap_or(Word {
            text: String::new(),
            dynamic: true,
        }),
    }
}

/// The value of a word node after quote removal, and whether it is literal
/// (no expansion of any kind). A non-literal word's value is its source.
fn word_value(node: tree_sitter::Node<'_>, text: &str) -> (String, bool) {
    let src = raw(node, text);
    match node.kind() {
        "word" | "number" => unescape_unquoted(src),
        "raw_string" => {
            let inner = src
                .strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .unwrap_or(src);
            (inner.to_owned(), true)
        }
        "string" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                if child.kind() != "string_content" {
                    return (src.to_owned(), false);
                }
            }
            let inner = src
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .unwrap_or(src);
            let mut chars = inner.chars().peekable();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.peek().copied() {
                        Some(e @ ('$' | '`' | '"' | '\\')) => {
                            out.push(e);
                            chars.next();
                        }
                        Some('\n') => {
                            chars.next();
                        }
                        _ => out.push('\\'),
                    }
                } else if c == '$' || c == '`' {
                    return (src.to_owned(), false);
                } else {
                    out.push(c);
                }
            }
            (out, true)
        }
        "concatenation" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            let mut covered = node.start_byte();
            for child in node.children(&mut cursor) {
                if child.start_byte() != covered {
                    return (src.to_owned(), false);
                }
                covered = child.end_byte();
                let (t, lit) = word_value(child, text);
                if !lit {
                    return (src.to_owned(), false);
                }
                out.push_str(&t);
            }
            if covered != node.end_byte() {
                return (src.to_owned(), false);
            }
            (out, true)
        }
        _ => (src.to_owned(), false),
    }
}

/// An unquoted word: backslash escapes removed; not literal if it has an
/// unescaped glob, brace, tilde or `$` character.
fn unescape_unquoted(src: &str) -> (String, bool) {
    let mut out = String::new();
    let mut literal = true;
    let mut chars = src.chars();
    let mut first = true;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(e) => out.push(e),
                None => out.push('\\'),
            },
            '*' | '?' | '[' | ']' | '{' | '}' | '$' | '`' | '(' | ')' => {
                literal = false;
                out.push(c);
            }
            '~' if first => {
                literal = false;
                out.push(c);
            }
            c => out.push(c),
        }
        first = false;
    }
    (out, literal)
}

fn is_assignment(w: &str) -> bool {
    match w.split_once('=') {
        Some((name, _)) => {
            let name = name.strip_suffix('+').unwrap_or(name);
            let name = name.split_once('[').map_or(name, |(n, _)| n);
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// The last path component of a command name (`/usr/bin/sudo` is `sudo`).
fn base_name(w: &str) -> &str {
    w.rsplit('/').next().unwrap_or(w)
}

/// The command a wrapper runs: `env A=1 -i cmd`, `command -p cmd`,
/// `exec -a n cmd`, `time -p cmd`, `nohup cmd`, `nice -n 5 cmd`,
/// `timeout -s KILL 5 cmd`, `xargs -n 1 cmd`, `sudo -u x cmd`,
/// `doas -u x cmd`, `stdbuf -oL cmd`, `setsid cmd`, `ionice -c 3 cmd`,
/// `chroot dir cmd`, `find ... -exec cmd ;`.
fn unwrap_once(words: &[Word]) -> Option<&[Word]> {
    let name = words.first()?;
    if name.dynamic {
        return None;
    }
    // Options that take a separate value, per wrapper.
    let (valued, positional): (&[&str], usize) = match base_name(&name.text) {
        "env" => (
            &["-u", "--unset", "-C", "--chdir", "-S", "--split-string"],
            0,
        ),
        "command" | "builtin" | "nohup" | "setsid" | "coproc" | "stdbuf" | "unbuffer" => (&[], 0),
        "exec" => (&["-a"], 0),
        "time" => (&["-f", "--format", "-o", "--output"], 0),
        "nice" => (&["-n", "--adjustment"], 0),
        "ionice" => (&["-c", "--class", "-n", "--classdata", "-p", "--pid"], 0),
        "timeout" => (&["-s", "--signal", "-k", "--kill-after"], 1),
        "xargs" => (
            &[
                "-I",
                "-L",
                "-n",
                "-P",
                "-s",
                "-d",
                "-E",
                "-a",
                "--max-args",
                "--max-procs",
                "--delimiter",
                "--arg-file",
                "--max-lines",
                "--max-chars",
            ],
            0,
        ),
        "sudo" => (
            &[
                "-u",
                "-g",
                "-C",
                "-D",
                "-h",
                "-p",
                "-r",
                "-t",
                "-U",
                "-T",
                "--user",
                "--group",
                "--chdir",
                "--host",
                "--prompt",
                "--role",
                "--type",
                "--other-user",
                "--command-timeout",
            ],
            0,
        ),
        "doas" => (&["-u", "-C"], 0),
        "chroot" => (&["--userspec", "--groups"], 1),
        "find" => {
            let at = words
                .iter()
                .position(|w| matches!(w.text.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir"))?;
            let rest = words.get(at + 1..)?;
            let end = rest
                .iter()
                .position(|w| w.text == ";" || w.text == "+")
                .unwrap_or(rest.len());
            return rest.get(..end).filter(|r| !r.is_empty());
        }
        _ => return None,
    };
    let env = base_name(&name.text) == "env";
    let mut i = 1;
    while let Some(w) = words.get(i) {
        let t = w.text.as_str();
        if t == "--" {
            i += 1;
            break;
        }
        if t.starts_with('-') && t.len() > 1 {
            i += if valued.contains(&t) { 2 } else { 1 };
        } else if env && is_assignment(t) {
            i += 1;
        } else {
            break;
        }
    }
    i += positional;
    words.get(i..).filter(|r| !r.is_empty())
}

/// The command strings a command runs: the body of `bash -c BODY` (and
/// `sh`, `dash`, `zsh`, `ksh`, `su -c`), the joined arguments of `eval`, at
/// any wrapper layer. `None` for a string that is not literal.
fn command_strings(cmd: &SimpleCommand) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for layer in cmd.layers() {
        let Some(name) = layer.first() else { continue };
        let args = layer.get(1..).unwrap_or(&[]);
        match base_name(&name.text) {
            "bash" | "sh" | "dash" | "zsh" | "ksh" | "mksh" | "ash" | "busybox" | "su"
            | "rbash" => {
                let mut take = false;
                for w in args {
                    if take {
                        out.push((!w.dynamic).then(|| w.text.clone()));
                        break;
                    }
                    if w.text.starts_with('-') && !w.text.starts_with("--") && w.text.contains('c')
                    {
                        take = true;
                    }
                }
            }
            "eval" => {
                if args.iter().any(|w| w.dynamic) {
                    out.push(None);
                } else if !args.is_empty() {
                    out.push(Some(
                        args.iter()
                            .map(|w| w.text.as_str())
                            .collect::<Vec<_>>()
                            .join(" "),
                    ));
                }
            }
            "source" | "." | "watch" => out.push(None),
            _ => {}
        }
    }
    out
}

/// One prefix rule, read into a name, a set of flags and its operands, so
/// that `rm -rf /`, `rm -fr /`, `rm -r -f /` and `rm --recursive --force /`
/// are the same command.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Normalized {
    name: String,
    flags: BTreeSet<String>,
    operands: Vec<String>,
}

fn normalize<'w>(words: impl IntoIterator<Item = &'w str>) -> Option<Normalized> {
    let mut it = words.into_iter();
    let name = base_name(it.next()?).to_owned();
    let mut flags = BTreeSet::new();
    let mut operands = Vec::new();
    let mut options = true;
    for w in it {
        if options && w == "--" {
            options = false;
        } else if options && w.starts_with("--") && w.len() > 2 {
            let long = w.split_once('=').map_or(w, |(k, _)| k);
            flags.insert(
                match long {
                    "--recursive" => "-r",
                    "--force" => "-f",
                    other => other,
                }
                .to_owned(),
            );
        } else if options && w.starts_with('-') && w.len() > 1 && !w.contains('=') {
            for c in w.chars().skip(1) {
                let c = if c == 'R' { 'r' } else { c };
                flags.insert(format!("-{c}"));
            }
        } else {
            operands.push(normalize_path(w));
        }
    }
    Some(Normalized {
        name,
        flags,
        operands,
    })
}

/// `//`, `/./` and a trailing `/` or `/.` do not change a path.
fn normalize_path(w: &str) -> String {
    if !(w.starts_with('/') || w.starts_with('~')) {
        return w.to_owned();
    }
    let lead = if w.starts_with('/') { "/" } else { "" };
    let parts: Vec<&str> = w
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    format!("{lead}{}", parts.join("/"))
}

impl Normalized {
    /// Whether a command matches this prefix rule: same program (by base
    /// name; `mkfs` also covers `mkfs.ext4`), every flag of the rule present,
    /// every operand of the rule present.
    fn covers(&self, cmd: &Normalized) -> bool {
        let name = cmd.name == self.name
            || cmd
                .name
                .strip_prefix(self.name.as_str())
                .is_some_and(|rest| rest.starts_with('.'));
        name && self.flags.is_subset(&cmd.flags)
            && self.operands.iter().all(|o| cmd.operands.contains(o))
    }
}

/// Prefix rules over simple commands, from the policy's `[shell]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellRules {
    allow: Vec<Vec<String>>,
    deny: Vec<Vec<String>>,
    deny_normalized: Vec<Normalized>,
}

/// Whether a whole command line is covered by allow prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// The line is plain and every simple command matched an allow prefix
    /// (and there is at least one).
    pub all_allowed: bool,
    /// For each simple command, the allow prefix it matched, if any (none
    /// for every command of a line that is not plain).
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
        let deny = words(deny, "deny")?;
        let deny_normalized = deny
            .iter()
            .filter_map(|w| normalize(w.iter().map(String::as_str)))
            .collect();
        Ok(ShellRules {
            allow: words(allow, "allow")?,
            deny,
            deny_normalized,
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
    /// covered when it is plain, its leading words equal the prefix and it
    /// writes no file by redirection.
    pub fn allowed_by(&self, cmd: &SimpleCommand) -> Option<String> {
        if !cmd.plain || cmd.redirects.iter().any(|r| !r.is_harmless()) {
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
    /// A line that is not plain is never covered.
    pub fn coverage(&self, line: &ShellLine) -> Coverage {
        let matched: Vec<Option<String>> = if line.plain {
            line.commands.iter().map(|c| self.allowed_by(c)).collect()
        } else {
            vec![None; line.commands.len()]
        };
        Coverage {
            all_allowed: line.plain && !matched.is_empty() && matched.iter().all(Option::is_some),
            matched,
        }
    }

    /// The first simple command matching a deny prefix, with that prefix.
    /// Every command is checked, nested ones included, at every wrapper
    /// layer (`env sudo x`, `timeout 5 sudo x`, `xargs sudo`), with flags
    /// compared as sets.
    pub fn denied(&self, line: &ShellLine) -> Option<(String, String)> {
        for cmd in &line.commands {
            for layer in cmd.layers() {
                let Some(n) = normalize(layer.iter().map(|w| w.text.as_str())) else {
                    continue;
                };
                if let Some(p) = self.first_deny(&n) {
                    return Some((cmd.to_string(), p));
                }
            }
        }
        None
    }

    /// For a line that does not parse: the first deny prefix whose command
    /// name appears anywhere among the line's tokens (split on blanks,
    /// quotes and shell operators) followed by its flags and operands.
    pub fn denied_in_tokens(&self, line: &str) -> Option<(String, String)> {
        let tokens: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c.is_control() || "|&;()<>{}`$\"'\\".contains(c))
            .filter(|t| !t.is_empty())
            .collect();
        for i in 0..tokens.len() {
            let Some(n) = normalize(tokens.get(i..).unwrap_or(&[]).iter().copied()) else {
                continue;
            };
            if let Some(p) = self.first_deny(&n) {
                return Some((escape_for_terminal(line), p));
            }
        }
        None
    }

    fn first_deny(&self, cmd: &Normalized) -> Option<String> {
        self.deny_normalized
            .iter()
            .zip(&self.deny)
            .find(|(n, _)| n.covers(cmd))
            .map(|(_, w)| w.join(" "))
    }
}
