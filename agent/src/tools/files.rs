//! read, glob, grep, write, edit: every path through the snapshot crate's
//! boundary guard (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
//! `..`, an absolute path outside the workspace and a symlink anywhere on
//! the way are refused and said to the model.

use std::path::PathBuf;

use retie_dispatch::overlay::{ApplyLock, Snapshots};
use retie_dispatch::{Error, Executor, Step, UndoPlan};
use retie_policy::Action;
use retie_snapshot::{DirEntryKind, RelPath, Workspace};
use serde_json::{json, Map, Value};

use super::{Prepared, ToolOutput, Tools};

/// Largest file read whole (the model sees a preview of more).
const READ_MAX: u64 = 4 << 20;
/// Most entries a glob or grep walks.
const WALK_MAX: usize = 20_000;
/// Most matches grep reports.
const GREP_MAX: usize = 500;

/// A path from the model, as a workspace path. `None` for the root.
pub(crate) fn resolve(ws: &std::path::Path, raw: &str) -> Result<Option<RelPath>, String> {
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
                return Err(format!(
                    "refused: {raw:?} is outside the workspace; only paths inside it can be reached"
                ))
            }
        }
    }
    let cleaned: Vec<&str> = s
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if cleaned.contains(&"..") {
        return Err(format!(
            "refused: {raw:?} goes up with `..`; only paths inside the workspace can be reached"
        ));
    }
    RelPath::new(&cleaned.join("/"))
        .map(Some)
        .map_err(|e| format!("refused: {e}"))
}

/// The guard's refusal, worded for the model.
fn guard_error(raw: &str, e: retie_snapshot::Error) -> String {
    match e {
        retie_snapshot::Error::Boundary { .. } => format!(
            "refused: {raw:?} is or passes through a symlink; retie never follows a symlink inside the workspace (it could lead outside)"
        ),
        retie_snapshot::Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            format!("{raw:?}: no such file in the workspace")
        }
        other => format!("{raw:?}: {other}"),
    }
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
    let (bytes, size) =
        t.ws.read_file(&rel, READ_MAX)
            .map_err(|e| guard_error(raw, e))?;
    let text = text_of(&bytes, raw)?;
    let offset = int_arg(args, "offset").unwrap_or(1).max(1) as usize;
    let limit = int_arg(args, "limit")
        .map(|l| l as usize)
        .unwrap_or(usize::MAX);
    let mut out = String::new();
    for (i, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
        out.push_str(&format!("{:>5}\t{line}\n", i + 1));
    }
    if size > READ_MAX {
        out.push_str(&format!(
            "[file is {size} bytes; only the first {READ_MAX} were read]\n"
        ));
    }
    if out.is_empty() {
        out.push_str("[empty]\n");
    }
    Ok(out)
}

/// Every file beneath `dir` (symlinks listed, never followed).
fn walk(ws: &Workspace, dir: Option<&RelPath>, out: &mut Vec<(RelPath, DirEntryKind)>) {
    let Ok(entries) = ws.list_dir(dir) else {
        return;
    };
    for (rel, kind) in entries {
        if out.len() >= WALK_MAX {
            return;
        }
        if rel.file_name() == ".git" {
            continue;
        }
        let is_dir = kind == DirEntryKind::Dir;
        out.push((rel.clone(), kind));
        if is_dir {
            walk(ws, Some(&rel), out);
        }
    }
}

fn glob(t: &Tools, args: &Map<String, Value>) -> ToolOutput {
    let raw = str_arg(args, "path");
    let dir = resolve(&t.workspace, raw)?;
    if let Some(d) = &dir {
        t.ws.list_dir(Some(d)).map_err(|e| guard_error(raw, e))?;
    }
    let pattern = str_arg(args, "pattern");
    let mut all = Vec::new();
    walk(&t.ws, dir.as_ref(), &mut all);
    let base = dir
        .as_ref()
        .map(|d| format!("{}/", d.as_str()))
        .unwrap_or_default();
    let hits: Vec<String> = all
        .iter()
        .filter(|(_, k)| *k != DirEntryKind::Dir)
        .filter(|(p, _)| {
            let rel = p.as_str().strip_prefix(&base).unwrap_or(p.as_str());
            glob_match(pattern.as_bytes(), rel.as_bytes())
        })
        .map(|(p, k)| match k {
            DirEntryKind::Symlink => format!("{} (symlink, not followed)", p.as_str()),
            _ => p.as_str().to_string(),
        })
        .collect();
    if hits.is_empty() {
        return Ok("no files match\n".into());
    }
    Ok(hits.join("\n") + "\n")
}

/// `*` and `?` within a component, `**` across components.
pub(crate) fn glob_match(p: &[u8], s: &[u8]) -> bool {
    if p.starts_with(b"**/") {
        let rest = &p[3..];
        if glob_match(rest, s) {
            return true;
        }
        return s
            .iter()
            .enumerate()
            .filter(|(_, c)| **c == b'/')
            .any(|(i, _)| glob_match(rest, &s[i + 1..]));
    }
    if p == b"**" {
        return true;
    }
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob_match(&p[1..], s) || (!s.is_empty() && s[0] != b'/' && glob_match(p, &s[1..]))
        }
        (Some(b'?'), Some(c)) if *c != b'/' => glob_match(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob_match(&p[1..], &s[1..]),
        _ => false,
    }
}

fn grep(t: &Tools, args: &Map<String, Value>) -> ToolOutput {
    let pattern = str_arg(args, "pattern");
    let re = regex::RegexBuilder::new(pattern)
        .case_insensitive(args.get("ignore_case").and_then(Value::as_bool) == Some(true))
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("grep: not a valid regular expression: {e}"))?;
    let raw = str_arg(args, "path");
    let start = resolve(&t.workspace, raw)?;
    let mut files = Vec::new();
    match &start {
        Some(rel) => match t.ws.list_dir(Some(rel)) {
            Ok(_) => walk(&t.ws, Some(rel), &mut files),
            Err(retie_snapshot::Error::Io { source, .. })
                if source.raw_os_error() == Some(libc_enotdir()) =>
            {
                files.push((rel.clone(), DirEntryKind::File { size: 0 }))
            }
            Err(e) => return Err(guard_error(raw, e)),
        },
        None => walk(&t.ws, None, &mut files),
    }
    let mut out = String::new();
    let mut n = 0;
    for (rel, kind) in files {
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
            if re.is_match(line) {
                out.push_str(&format!("{}:{}:{line}\n", rel.as_str(), i + 1));
                n += 1;
                if n >= GREP_MAX {
                    out.push_str(&format!("[stopped at {GREP_MAX} matches]\n"));
                    return Ok(out);
                }
            }
        }
    }
    if out.is_empty() {
        out.push_str("no matches\n");
    }
    Ok(out)
}

fn libc_enotdir() -> i32 {
    20
}

/// What a write or edit will do, worked out before it is proposed.
#[derive(Debug, Clone)]
pub(crate) struct PlannedWrite {
    pub rel: RelPath,
    pub new: Vec<u8>,
    /// The content seen when planning (`None`: no such file).
    pub old: Option<Vec<u8>>,
}

/// Work out a write or edit and inspect its content (the risk feeds the
/// gate). Errors are for the model; nothing was proposed.
pub(crate) fn prepare_write(t: &Tools, p: &mut Prepared) -> Result<(), String> {
    let tool = p.action.tool().to_string();
    let raw = str_arg(&p.args, "path").to_string();
    let rel = resolve(&t.workspace, &raw)
        .map_err(|e| format!("{tool}: {e}"))?
        .ok_or_else(|| format!("{tool}: the workspace root is a directory"))?;
    for dir in &t.protect {
        if let Ok(inner) = dir.strip_prefix(&t.workspace) {
            if rel.as_str().starts_with(&*inner.to_string_lossy()) {
                return Err(format!(
                    "{tool}: refused: {raw:?} is inside retie's own state"
                ));
            }
        }
    }
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
    p.write = Some(PlannedWrite { rel, new, old });
    Ok(())
}

/// write, edit: the pre-image stored through `record_file_write`, the
/// journal entry's id in the intent's undo plan before anything is written.
pub(crate) struct WriteExec {
    snaps: Snapshots,
    /// retie's state directory (the workspace's apply lock).
    state: PathBuf,
    plan: Option<PlannedWrite>,
    id: String,
}

impl WriteExec {
    pub fn new(snaps: Snapshots, state: PathBuf, p: &Prepared) -> WriteExec {
        WriteExec {
            snaps,
            state,
            plan: p.write.clone(),
            id: retie_snapshot::new_id(),
        }
    }
}

impl Executor for WriteExec {
    type Output = ToolOutput;
    fn plan(&self, _: &Action) -> UndoPlan {
        // The intent carries the exact change (path, size, content digest,
        // created or replaced): it is the durable record right before the
        // write, so a write needs no second durable entry (one fsync less).
        let path = self.plan.as_ref().map(|w| w.rel.as_str().to_string());
        let change = self.plan.as_ref().map(|w| {
            json!({
                "path": w.rel.as_str(),
                "bytes": w.new.len(),
                "blake3": blake3::hash(&w.new).to_hex().to_string(),
                "created": w.old.is_none(),
            })
        });
        UndoPlan {
            reversible: true,
            detail: json!({
                "reversible": true,
                "via": "snapshot",
                "changeset": self.id,
                "paths": path.into_iter().collect::<Vec<_>>(),
                "change": change,
                "how": "the prior content (or its absence) is stored before the write; undo puts it back",
            }),
        }
    }
    fn execute(&mut self, _: &Action, step: &mut Step<'_>) -> Result<ToolOutput, Error> {
        let Some(w) = self.plan.take() else {
            return Err(Error::Invalid("a write runs once".into()));
        };
        // Serialized with every apply on this workspace, and stamped like
        // one: a sandbox started in the same clock tick waits for the next
        // (overlay::wait_past_last_apply), or this write would read as a
        // change made during its run.
        let lock = ApplyLock::take(&self.state, self.snaps.ws.path())?;
        // Nothing changed the file since it was inspected and shown.
        let now = match self.snaps.ws.read_file(&w.rel, READ_MAX) {
            Ok((b, _)) => Some(b),
            Err(retie_snapshot::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => {
                let msg = guard_error(w.rel.as_str(), e);
                step.set_outcome(json!({"status": "refused", "why": msg}));
                return Ok(Err(msg));
            }
        };
        if now != w.old {
            let msg = format!(
                "{} changed since it was read; nothing written, read it again",
                w.rel.as_str()
            );
            step.set_outcome(json!({"status": "refused", "why": msg}));
            return Ok(Err(msg));
        }
        let entry = retie_snapshot::record_file_write_as(
            &self.snaps.ws,
            &self.snaps.store,
            &self.snaps.journal,
            self.id.clone(),
            &w.rel,
            &w.new,
            None,
        )?;
        lock.stamp();
        step.set_outcome(json!({
            "status": "applied",
            "changeset": entry.id,
            "changes": 1,
            "bytes": w.new.len(),
        }));
        Ok(Ok(format!(
            "{} {} ({} bytes)",
            if w.old.is_none() { "created" } else { "wrote" },
            w.rel.as_str(),
            w.new.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
