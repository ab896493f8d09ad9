//! read, glob, grep, write, edit: every path through the snapshot crate's
//! boundary guard (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
//! `..`, an absolute path outside the workspace and a symlink anywhere on
//! the way are refused and said to the model.

use retie_dispatch::write::FileWrite;
use retie_dispatch::{Error, Executor, Step, UndoPlan};
use retie_policy::Action;
use retie_snapshot::{DirEntryKind, RelPath};
use serde_json::{json, Map, Value};

use super::{Prepared, ToolError, ToolOutput, Tools};

/// Largest file read whole (the model sees a preview of more).
const READ_MAX: u64 = 4 << 20;
/// Most entries a glob or grep walks.
const WALK_MAX: usize = 20_000;
/// Most matches grep reports.
const GREP_MAX: usize = 500;

/// A path from the model, as a workspace path. `None` for the root.
pub(crate) fn resolve(ws: &std::path::Path, raw: &str) -> Result<Option<RelPath>, ToolError> {
    let mut s = raw.trim();
    if s.is_empty() || s == "." || s == "./" {
        return Ok(None);
    }
    let abs;
    if s.starts_with('/') {
        let p = std::path::Path::new(s);
        match p.strip_prefix(ws) {
            Ok(rest) => {
                abs = rest.to_string_lossy().into_owned();
                s = &abs;
                if s.is_empty() {
                    return Ok(None);
                }
            }
            Err(_) => {
                return Err(ToolError::refused(format!(
                    "refused: {raw:?} is outside the workspace; only paths inside it can be reached"
                )))
            }
        }
    }
    let cleaned: Vec<&str> = s
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if cleaned.contains(&"..") {
        return Err(ToolError::refused(format!(
            "refused: {raw:?} goes up with `..`; only paths inside the workspace can be reached"
        )));
    }
    RelPath::new(&cleaned.join("/"))
        .map(Some)
        .map_err(|e| ToolError::refused(format!("refused: {e}")))
}

/// The guard's refusal, worded for the model.
fn guard_error(raw: &str, e: retie_snapshot::Error) -> ToolError {
    ToolError::failed(match e {
        retie_snapshot::Error::Boundary { .. } => return ToolError::refused(format!(
            "refused: {raw:?} is or passes through a symlink; retie never follows a symlink inside the workspace (it could lead outside)"
        )),
        retie_snapshot::Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            format!("{raw:?}: no such file in the workspace")
        }
        retie_snapshot::Error::Io { source, .. } if source.raw_os_error() == Some(libc_enotdir()) => {
            format!("{raw:?}: a component of the path is a file, not a directory")
        }
        other => format!("{raw:?}: {other}"),
    })
}

fn text_of(bytes: &[u8], raw: &str) -> Result<String, String> {
    if bytes.contains(&0) {
        return Err(format!("{raw:?} is a binary file; not shown"));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// read, glob, grep.
pub(crate) struct ReadExec<'a> {
    pub tools: &'a Tools,
    pub args: &'a Map<String, Value>,
}

impl Executor for ReadExec<'_> {
    type Output = ToolOutput;
    fn plan(&self, _: &Action) -> UndoPlan {
        super::no_effect_plan()
    }
    fn execute(&mut self, action: &Action, step: &mut Step<'_>) -> Result<ToolOutput, Error> {
        let out = match action.tool() {
            "read" => read(self.tools, self.args),
            "glob" => glob(self.tools, self.args),
            _ => grep(self.tools, self.args),
        };
        super::read_outcome(step, &out);
        Ok(out)
    }
}

fn str_arg<'a>(args: &'a Map<String, Value>, k: &str) -> &'a str {
    args.get(k).and_then(Value::as_str).unwrap_or("")
}

fn int_arg(args: &Map<String, Value>, k: &str) -> Option<u64> {
    args.get(k).and_then(Value::as_u64)
}

fn read(t: &Tools, args: &Map<String, Value>) -> ToolOutput {
    let raw = str_arg(args, "path");
    let Some(rel) = resolve(&t.workspace, raw)? else {
        return Err("read: the workspace root is a directory; use glob to list it".into());
    };
    t.masked(&rel, raw)?;
    let (bytes, size) =
        t.ws.read_file(&rel, READ_MAX)
            .map_err(|e| guard_error(raw, e))?;
    let text = text_of(&bytes, raw)?;
    let offset = int_arg(args, "offset").unwrap_or(1).max(1);
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let limit = int_arg(args, "limit")
        .and_then(|l| usize::try_from(l).ok())
        .unwrap_or(usize::MAX);
    let mut out = String::new();
    for (i, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
        if out.len() > RESULT_MAX {
            break;
        }
        out.push_str(&format!("{:>5}\t{line}\n", i + 1));
    }
    let mut out = capped(out, "file's text");
    if size > READ_MAX {
        out.push_str(&format!(
            "[truncated: the file is {size} bytes; only the first {READ_MAX} were read]\n"
        ));
    }
    if out.is_empty() {
        out.push_str("[empty]\n");
    }
    Ok(out)
}

impl Tools {
    /// A file at the workspace root that the person keeps for agents
    /// (`AGENTS.md`, `RETIE.md`), read through the read tool's own path:
    /// the boundary guard (a symlink anywhere on the way is refused, never
    /// followed) and retie's masked directories. At most `max` bytes are
    /// read; returns them with the file's size. `Ok(None)`: no such file.
    /// The error says why it was not read, worded for a person.
    pub fn read_root_file(&self, name: &str, max: u64) -> Result<Option<(Vec<u8>, u64)>, String> {
        let Some(rel) = resolve(&self.workspace, name)? else {
            return Err(format!("{name:?} names the workspace root"));
        };
        self.masked(&rel, name)?;
        match self.ws.read_file(&rel, max) {
            Ok(r) => Ok(Some(r)),
            Err(retie_snapshot::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(None)
            }
            Err(e) => Err(guard_error(name, e).text),
        }
    }
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walked {
    All,
    /// Stopped at [`WALK_MAX`] entries.
    Cut,
    /// The person stopped it.
    Cancelled,
}

/// Every file beneath `dir` (symlinks listed, never followed), without
/// recursion, at most [`WALK_MAX`] entries, stopping when the person
/// cancels; retie's own directories are left out ([`Tools::masked`]).
fn walk(t: &Tools, dir: Option<&RelPath>, out: &mut Vec<(RelPath, DirEntryKind)>) -> Walked {
    let mut todo: Vec<Option<RelPath>> = vec![dir.cloned()];
    while let Some(d) = todo.pop() {
        if t.cancelled() {
            return Walked::Cancelled;
        }
        let Ok(entries) = t.ws.list_dir(d.as_ref()) else {
            continue;
        };
        let mut subdirs = Vec::new();
        for (rel, kind) in entries {
            if out.len() >= WALK_MAX {
                return Walked::Cut;
            }
            if rel.file_name() == ".git" || t.masked(&rel, rel.as_str()).is_err() {
                continue;
            }
            if kind == DirEntryKind::Dir {
                subdirs.push(Some(rel.clone()));
            }
            out.push((rel, kind));
        }
        // Depth first, in name order.
        todo.extend(subdirs.into_iter().rev());
    }
    Walked::All
}

/// What a walk that did not end says.
fn walk_note(w: Walked) -> &'static str {
    match w {
        Walked::All => "",
        Walked::Cut => "[truncated: the search stopped after 20000 entries; narrow the path]\n",
        Walked::Cancelled => "[cancelled by the person (Ctrl-C); the search stopped here]\n",
    }
}

fn glob(t: &Tools, args: &Map<String, Value>) -> ToolOutput {
    let pattern = str_arg(args, "pattern");
    if pattern.len() > GLOB_PATTERN_MAX {
        return Err(ToolError::failed(format!(
            "glob: the pattern is {} bytes; at most {GLOB_PATTERN_MAX} are taken",
            pattern.len()
        )));
    }
    let raw = str_arg(args, "path");
    let dir = resolve(&t.workspace, raw)?;
    if let Some(d) = &dir {
        t.masked(d, raw)?;
        t.ws.list_dir(Some(d)).map_err(|e| guard_error(raw, e))?;
    }
    let mut all = Vec::new();
    let walked = walk(t, dir.as_ref(), &mut all);
    let base = dir
        .as_ref()
        .map(|d| format!("{}/", d.as_str()))
        .unwrap_or_default();
    let mut out = String::new();
    let mut cancelled = walked == Walked::Cancelled;
    for (i, (p, k)) in all.iter().enumerate() {
        if i % 256 == 0 && t.cancelled() {
            cancelled = true;
            break;
        }
        if *k == DirEntryKind::Dir {
            continue;
        }
        let rel = p.as_str().strip_prefix(&base).unwrap_or(p.as_str());
        if !glob_match(pattern.as_bytes(), rel.as_bytes()) {
            continue;
        }
        match k {
            DirEntryKind::Symlink => {
                out.push_str(&format!("{} (symlink, not followed)\n", p.as_str()))
            }
            _ => out.push_str(&format!("{}\n", p.as_str())),
        }
        if out.len() > RESULT_MAX {
            break;
        }
    }
    if out.is_empty() && walked == Walked::All {
        return Ok("no files match\n".into());
    }
    let mut out = capped(out, "list");
    out.push_str(walk_note(if cancelled {
        Walked::Cancelled
    } else {
        walked
    }));
    Ok(out)
}

/// Longest glob pattern taken (a model sent a million `*`).
pub(crate) const GLOB_PATTERN_MAX: usize = 1024;
/// Longest regular expression taken.
pub(crate) const GREP_PATTERN_MAX: usize = 4096;
/// Most bytes a read, glob or grep answers with (the rest is cut, and
/// said so).
pub(crate) const RESULT_MAX: usize = 1 << 20;
/// Longest line grep shows of a match.
const GREP_LINE_MAX: usize = 2000;

/// `*` and `?` within a component, `**` (a whole component) across
/// components. Linear in neither, but bounded by the product of the
/// lengths, without recursion: the classic wildcard walk that, on a
/// mismatch, backs up only to the last star (at two levels: components
/// against `**`, bytes against `*`). The recursive matcher it replaces
/// took ~20 s on `*a*a*a*a*a*a*a*a*a*aQ` against a 44-byte name and
/// overflowed the stack on a million `*`.
pub(crate) fn glob_match(p: &[u8], s: &[u8]) -> bool {
    let ps: Vec<&[u8]> = p.split(|&c| c == b'/').collect();
    let ss: Vec<&[u8]> = s.split(|&c| c == b'/').collect();
    let (mut pi, mut si) = (0, 0);
    // (the pattern component after the last `**`, the path component it
    // was tried at)
    let mut star: Option<(usize, usize)> = None;
    while si < ss.len() {
        if ps.get(pi) == Some(&&b"**"[..]) {
            pi += 1;
            star = Some((pi, si));
        } else if ps.get(pi).is_some_and(|pc| component_match(pc, ss[si])) {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss0)) = star {
            pi = sp;
            si = ss0 + 1;
            star = Some((sp, si));
        } else {
            return false;
        }
    }
    while ps.get(pi) == Some(&&b"**"[..]) {
        pi += 1;
    }
    pi == ps.len()
}

/// One component against one pattern component (`*`, `?`, literal bytes).
fn component_match(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                pi += 1;
                star = Some((pi, si));
            }
            Some(&c) if c == b'?' || c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, s0)) => {
                    pi = sp;
                    si = s0 + 1;
                    star = Some((sp, si));
                }
                None => return false,
            },
        }
    }
    while p.get(pi) == Some(&b'*') {
        pi += 1;
    }
    pi == p.len()
}

/// `out` cut to [`RESULT_MAX`] bytes (at a line), saying so.
fn capped(mut out: String, what: &str) -> String {
    if out.len() <= RESULT_MAX {
        return out;
    }
    let mut cut = RESULT_MAX;
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    let cut = out[..cut].rfind('\n').map_or(cut, |i| i + 1);
    let total = out.len();
    out.truncate(cut);
    out.push_str(&format!(
        "[truncated: the {what} is {total} bytes; only the first {cut} are shown]\n"
    ));
    out
}

fn grep(t: &Tools, args: &Map<String, Value>) -> ToolOutput {
    let pattern = str_arg(args, "pattern");
    if pattern.len() > GREP_PATTERN_MAX {
        return Err(ToolError::failed(format!(
            "grep: the pattern is {} bytes; at most {GREP_PATTERN_MAX} are taken",
            pattern.len()
        )));
    }
    // The regex crate matches in linear time; the limits bound what a
    // pattern may compile to (`(a{1000}){1000}` is refused, not built).
    let re = regex::RegexBuilder::new(pattern)
        .case_insensitive(args.get("ignore_case").and_then(Value::as_bool) == Some(true))
        .size_limit(1 << 20)
        .dfa_size_limit(1 << 22)
        .nest_limit(64)
        .build()
        .map_err(|e| format!("grep: not a valid regular expression: {e}"))?;
    let raw = str_arg(args, "path");
    let start = resolve(&t.workspace, raw)?;
    if let Some(rel) = &start {
        t.masked(rel, raw)?;
    }
    let mut files = Vec::new();
    let mut walked = Walked::All;
    match &start {
        Some(rel) => match t.ws.list_dir(Some(rel)) {
            Ok(_) => walked = walk(t, Some(rel), &mut files),
            Err(retie_snapshot::Error::Io { source, .. })
                if source.raw_os_error() == Some(libc_enotdir()) =>
            {
                files.push((rel.clone(), DirEntryKind::File { size: 0 }))
            }
            Err(e) => return Err(guard_error(raw, e)),
        },
        None => walked = walk(t, None, &mut files),
    }
    let mut out = String::new();
    let mut n = 0;
    'files: for (rel, kind) in files {
        if t.cancelled() {
            walked = Walked::Cancelled;
            break;
        }
        if !matches!(kind, DirEntryKind::File { .. }) {
            continue;
        }
        let Ok((bytes, _)) = t.ws.read_file(&rel, READ_MAX) else {
            continue;
        };
        if bytes.contains(&0) {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        for (i, line) in text.lines().enumerate() {
            if i % 4096 == 4095 && t.cancelled() {
                walked = Walked::Cancelled;
                break 'files;
            }
            if re.is_match(line) {
                let mut shown = line;
                let mut cut = "";
                if shown.len() > GREP_LINE_MAX {
                    let mut end = GREP_LINE_MAX;
                    while !shown.is_char_boundary(end) {
                        end -= 1;
                    }
                    shown = &shown[..end];
                    cut = " [line truncated]";
                }
                out.push_str(&format!("{}:{}:{shown}{cut}\n", rel.as_str(), i + 1));
                n += 1;
                if n >= GREP_MAX {
                    out.push_str(&format!("[truncated: stopped at {GREP_MAX} matches]\n"));
                    break 'files;
                }
                if out.len() > RESULT_MAX {
                    break 'files;
                }
            }
        }
    }
    if out.is_empty() && walked == Walked::All {
        out.push_str("no matches\n");
    }
    let mut out = capped(out, "list of matches");
    out.push_str(walk_note(walked));
    Ok(out)
}

fn libc_enotdir() -> i32 {
    20
}

/// Work out a write or edit and inspect its content (the risk feeds the
/// gate). Errors are for the model; nothing was proposed.
pub(crate) fn prepare_write(t: &Tools, p: &mut Prepared) -> Result<(), String> {
    let tool = p.action.tool().to_string();
    let raw = str_arg(&p.args, "path").to_string();
    let rel = resolve(&t.workspace, &raw)
        .map_err(|e| format!("{tool}: {e}"))?
        .ok_or_else(|| format!("{tool}: the workspace root is a directory"))?;
    t.masked(&rel, &raw).map_err(|e| format!("{tool}: {e}"))?;
    let old = match t.ws.read_file(&rel, READ_MAX) {
        Ok((b, size)) if size <= READ_MAX => Some(b),
        Ok(_) => return Err(format!("{tool}: {raw:?} is too large to edit here")),
        Err(retie_snapshot::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => return Err(format!("{tool}: {}", guard_error(&raw, e))),
    };
    let new: Vec<u8> = if tool == "write" {
        str_arg(&p.args, "content").as_bytes().to_vec()
    } else {
        let Some(old) = &old else {
            return Err(format!(
                "edit: {raw:?} does not exist; use write to create it"
            ));
        };
        let text = text_of(old, &raw)?;
        let from = str_arg(&p.args, "old_string");
        let to = str_arg(&p.args, "new_string");
        if from.is_empty() {
            return Err("edit: old_string is empty".into());
        }
        let n = text.matches(from).count();
        let all = p.args.get("replace_all").and_then(Value::as_bool) == Some(true);
        match (n, all) {
            (0, _) => {
                return Err(format!(
                    "edit: old_string does not occur in {raw:?}; nothing changed"
                ))
            }
            (1, _) | (_, true) => text.replace(from, to).into_bytes(),
            (n, false) => {
                return Err(format!(
                    "edit: old_string occurs {n} times in {raw:?}; give more context or replace_all"
                ))
            }
        }
    };
    // A file that runs code outside the sandbox (a git hook or config, an
    // .envrc, a home's start-up files: the plant table a sandboxed
    // command's changes are held to) is never written by a tool call. An
    // attack pass had a model plant core.fsmonitor through `edit
    // .git/config`, unasked, and `git status` on the host ran it.
    match retie_snapshot::plant_of_file_write(
        &t.workspace,
        &rel,
        new.len() as u64,
        &retie_dispatch::overlay::plant_options(&t.workspace),
    ) {
        Ok(None) => {}
        Ok(Some(plant)) => {
            return Err(format!(
                "{tool}: refused: {raw:?} runs code outside the sandbox ({}: {}); the agent never writes it, a person can",
                plant.name, plant.reason
            ))
        }
        Err(e) => {
            return Err(format!(
                "{tool}: refused: whether {raw:?} is safe to write could not be checked ({})",
                guard_error(&raw, e)
            ))
        }
    }
    let old_text = old
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let insp = retie_policy::inspect_file(
        t.policy.rules(),
        rel.as_str(),
        &old_text,
        &String::from_utf8_lossy(&new),
    );
    p.risk = insp.level;
    p.inspection = Some(json!({
        "level": insp.level,
        "findings": insp.findings.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
    }));
    p.write = Some(FileWrite {
        path: rel,
        content: new,
        seen: old,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool's error carries its kind from where it happened (ADR 0453):
    /// the guard's refusals are `refused_by_guard`, a failure worded like a
    /// refusal is still `failed`. Seen failing with the outside-the-workspace
    /// refusal built as a failure.
    #[test]
    fn a_tool_error_carries_its_kind_not_its_wording() {
        use retie_ledger::payload::Status;
        let ws = std::path::Path::new("/ws");
        for raw in ["/etc/passwd", "../x", "a/../../b"] {
            let e = resolve(ws, raw).expect_err("refused");
            assert_eq!(e.status, Status::RefusedByGuard, "{raw}: {}", e.text);
        }
        let boundary = guard_error(
            "l",
            retie_snapshot::Error::Boundary {
                path: RelPath::new("l").expect("path"),
                source: std::io::Error::from_raw_os_error(40),
            },
        );
        assert_eq!(boundary.status, Status::RefusedByGuard);
        let worded: ToolError = String::from("refused: a failure worded like a refusal").into();
        assert_eq!(worded.status, Status::Failed);
    }

    #[test]
    fn paths_out_of_the_workspace_are_refused_lexically() {
        let ws = std::path::Path::new("/w/proj");
        assert!(resolve(ws, "../x").is_err());
        assert!(resolve(ws, "a/../../x").is_err());
        assert!(resolve(ws, "/etc/passwd").is_err());
        assert!(resolve(ws, "/w/projX/a").is_err());
        assert_eq!(
            resolve(ws, "/w/proj/a/b")
                .ok()
                .flatten()
                .map(|r| r.as_str().to_string()),
            Some("a/b".into())
        );
        assert_eq!(
            resolve(ws, "./a//b")
                .ok()
                .flatten()
                .map(|r| r.as_str().to_string()),
            Some("a/b".into())
        );
    }

    #[test]
    fn glob_matches() {
        assert!(glob_match(b"**/*.sh", b"a/b/c.sh"));
        assert!(glob_match(b"**/*.sh", b"c.sh"));
        assert!(glob_match(b"*.sh", b"c.sh"));
        assert!(!glob_match(b"*.sh", b"a/c.sh"));
        assert!(glob_match(b"src/?.rs", b"src/a.rs"));
        assert!(glob_match(b"src/**/x.rs", b"src/x.rs"));
        assert!(glob_match(b"src/**/x.rs", b"src/a/b/x.rs"));
        assert!(!glob_match(b"src/**/x.rs", b"lib/a/x.rs"));
        assert!(glob_match(b"**", b"a/b/c"));
        assert!(glob_match(b"a*b*c", b"aXbYbZc"));
        assert!(!glob_match(b"a*b*c", b"aXbYbZ"));
        assert!(glob_match(b"**/a/**/b", b"x/a/y/z/b"));
        assert!(!glob_match(b"?", b"ab"));
        assert!(glob_match(b"*", b""));
    }

    fn tools_on(ws: &std::path::Path, state: &std::path::Path) -> Tools {
        Tools::open(
            ws.to_path_buf(),
            state.to_path_buf(),
            Vec::new(),
            None,
            retie_policy::Policy::shipped().expect("the shipped policy"),
            crate::tools::BashSettings::defaults().expect("bash settings"),
        )
        .expect("tools")
    }

    /// A person's Ctrl-C (the session's cancel token) stops glob's and
    /// grep's walk at once, and the answer says so.
    #[test]
    fn glob_and_grep_stop_when_the_person_cancels() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ws, state) = (dir.path().join("ws"), dir.path().join("state"));
        for i in 0..50 {
            let d = ws.join(format!("d{i}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("f.txt"), "needle\n").expect("write");
        }
        let t = tools_on(&ws, &state);
        let mut args = Map::new();
        args.insert("pattern".into(), json!("**/*.txt"));
        let all = glob(&t, &args).expect("glob");
        assert_eq!(all.lines().count(), 50, "{all}");
        t.cancel.cancel();
        let cut = glob(&t, &args).expect("glob");
        assert!(cut.contains("cancelled by the person"), "{cut}");
        args.insert("pattern".into(), json!("needle"));
        let cut = grep(&t, &args).expect("grep");
        assert!(cut.contains("cancelled by the person"), "{cut}");
        assert!(!cut.contains("needle\n"), "{cut}");
    }

    /// The pattern that froze retie-agent for ~20 s (the recursive
    /// matcher was exponential in its stars) and a million `*` (which
    /// overflowed its stack) are answered at once.
    #[test]
    fn pathological_globs_are_answered_at_once() {
        let name = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(name.len(), 44);
        assert!(!glob_match(b"*a*a*a*a*a*a*a*a*a*aQ", name));
        let stars = vec![b'*'; 1_000_000];
        assert!(glob_match(&stars, name));
        let mut p = stars.clone();
        p.push(b'Q');
        assert!(!glob_match(&p, name));
        let deep = "**/".repeat(100_000) + "x";
        assert!(!glob_match(deep.as_bytes(), b"a/b/c/d/e/f/g/h/i/j/y"));
    }
}
