#!/usr/bin/env python3
"""The layering check (issue 27): the one-way flow, enforced on the code.

    python3 scripts/check-layers.py          # exit 0: clean; 1: violations
    python3 scripts/check-layers.py --list   # also every write the allow-list lets through
    python3 scripts/check-layers.py --self-test  # each rule fires on a planted case

Each violation is printed as FILE:LINE: RULE: what, and the exit code is 1.
Python 3.11+ standard library only. The rules (docs/architecture.md, "One
action, function by function" and "No step goes back up"):

1. ledger: only `ledger/` and `dispatch/` open SQLite or append to the
   ledger. Outside them, any use of `rusqlite::`, `Connection::open*`, a
   ledger `.append(` / `append_batch*(` / `Ledger::append*` is a violation
   unless its file is on LEDGER_ALLOWED, with its reason.
2. writes: only `snapshot/` and `dispatch/` write the workspace. A grep
   cannot tell a workspace path from another, so the rule is stricter:
   outside snapshot/ and dispatch/, every function that writes, creates,
   renames or removes a file or directory at all, or calls a snapshot
   function that does (apply, undo, recover, gc, chown_written...), must
   be on WRITERS_ALLOWED ("path:function", the innermost named function,
   with the reason it is no workspace write). A new writer fails until
   someone adds it here with its reason, or moves the write where it
   belongs; an entry that matches no writer any more fails too.
3. crates: each crate's [dependencies] (and [build-dependencies] and
   target-specific dependencies; dev-dependencies too: a test must not
   pull a higher crate into a lower one) name only the retie crates
   CRATE_MAY_USE allows it: no crate depends upward.
4. policy: `policy/src` does no I/O (no files, processes, environment,
   sockets, printing).
5. providers: `agent/src/provider/` never executes anything: no process,
   no sandbox, no tool, no chokepoint (nothing of `retie_dispatch`).
6. trace: every `path.rs:function` named in docs/architecture.md exists
   (the trace of one action cannot go stale silently).
7. payloads: outside `ledger/`, no statement that names a ledger entry
   kind (`Kind::Note`, `Kind::Intent`...) builds its payload with `json!`:
   every kind's payload is a struct of `retie_ledger::payload` (issue 27
   item 3, ADR 0453), written with `payload::to_value`. What it cannot
   see: a payload built with `json!` in one statement and handed to the
   ledger in another (the recorder's entry points take the structs, so
   the compiler sees those), and keys spelled on a `serde_json::Map`.

8. claims: every `module::test_name` (or `crate::module`, `mod::*`)
   README.md and docs/*.md name exists as a function, module or file of
   the tree, tests included: a claim cannot keep naming a test that was
   renamed or removed. docs/performance.md and the ADRs are history and
   are not read.

What a grep cannot see (said, not hidden): a write reached through a
function of another crate is judged where that function lives (the ledger's
own writers take a path: a caller could hand them a workspace path), a
renamed import (`use std::fs::write as w`) is missed, and the function a
line belongs to is the innermost named `fn` around it.

Test code is not checked for rules 1, 2, 4 and 5: files under a `tests/`
or `benches/` directory, files a `#[cfg(test)] mod NAME;` declares, and
items marked `#[cfg(test)]`. Comments and string literals never match.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------
# Rule 3: the intended order of the crates (docs/architecture.md, "No step
# goes back up"). A crate may depend on the retie crates listed for it, and
# on no other. `retie` is the binary package (src/): nothing may depend on it.
# ---------------------------------------------------------------------------
CRATE_MAY_USE: dict[str, set[str]] = {
    # The leaf: terminal text.
    "retie-display": set(),
    # Pure decisions: no I/O, knows no other layer.
    "retie-policy": {"retie-display"},
    # The sandbox: knows nothing of agents, ledgers or policies.
    "retie-runtime": {"retie-display"},
    # Changesets, pre-images, apply and undo: no ledger, no policy.
    "retie-snapshot": {"retie-display"},
    # The signed record: no dispatch, no agent, no snapshot.
    "retie-ledger": {"retie-display"},
    # Pentest findings read into one shape: parsing only.
    "retie-finding": {"retie-display"},
    # The network proxy: every decision is the policy's netguard.
    "retie-net": {"retie-policy", "retie-display"},
    # The chokepoint: everything below it, never the agent.
    "retie-dispatch": {
        "retie-policy",
        "retie-ledger",
        "retie-snapshot",
        "retie-runtime",
        "retie-net",
        "retie-display",
    },
    # The agent: dispatch and what is below, never the binary.
    "retie-agent": {
        "retie-dispatch",
        "retie-policy",
        "retie-ledger",
        "retie-snapshot",
        "retie-runtime",
        "retie-net",
        "retie-finding",
        "retie-display",
    },
    # The policy's fuzz targets (policy/fuzz, a workspace of its own).
    "retie-policy-fuzz": {"retie-policy"},
    # The binary (src/): it may use every crate; nothing uses it.
    "retie": {
        "retie-agent",
        "retie-dispatch",
        "retie-policy",
        "retie-ledger",
        "retie-snapshot",
        "retie-runtime",
        "retie-net",
        "retie-finding",
        "retie-display",
    },
}

# ---------------------------------------------------------------------------
# Rule 1: who may touch SQLite or append to a ledger outside ledger/ and
# dispatch/. Each entry: the file, why, and what it must still never do.
# ---------------------------------------------------------------------------
LEDGER_ALLOWED: dict[str, dict] = {
    "src/ledger/dev.rs": {
        "why": (
            "`retie __ledger` (hidden): builds test ledgers for verify's tests "
            "(bulk notes, a rogue key, an expired or escalating delegation: "
            "entries `retie verify` must catch) and the append benchmark against "
            "bare SQLite. It appends only notes, delegations and session "
            "open/close, never an action's entries, signs with the person's own "
            "key (no power they lack: that key and the SQLite file are theirs "
            "already), and acts on no workspace. An acceptable exception; it "
            "could move behind a cargo feature to leave the shipped binary."
        ),
        # An action's entries are dispatch's alone, even here.
        "must_not": re.compile(
            r"Kind::(Proposed|Decision|Intent|Changes|Outcome|Undo|Refusal|Pending|Grant|Revoke)\b"
        ),
    },
}

# ---------------------------------------------------------------------------
# Rule 2: every function outside snapshot/ and dispatch/ that writes files,
# and why that is no workspace write. "path:function" (the enclosing `fn`;
# "path:*" for a whole file, only where every function of it writes the same
# kind of thing).
# ---------------------------------------------------------------------------
_SANDBOX_SETUP = (
    "sandbox set-up inside init's new mount namespace, before the command: "
    "mount points, /dev nodes and the synthesized /etc on the sandbox's own "
    "tmpfs root, never a host path or the workspace (which is a bind or an "
    "overlay mounted over, not written)"
)
_BUILD = "a build script: writes only into cargo's OUT_DIR"
_STATE = "retie's own state directory (XDG_STATE_HOME), never the workspace"
_LEDGER = "the ledger crate's own files: the ledger database, its keys, verify's anchor"
_LAB = "a lab's own directory under retie's state (labs/NAME), never the workspace"
_PROBE = (
    "`retie __probe`, run INSIDE a sandbox by the self-test and tests to prove "
    "its walls (it tries writes that must fail, and scratch files that must "
    "succeed, in the sandbox's own view)"
)
WRITERS_ALLOWED: dict[str, str] = {
    # runtime: the sandbox's own set-up (init), the supervisor's id maps.
    "runtime/src/init/dev.rs:populate": _SANDBOX_SETUP,
    "runtime/src/init/layered.rs:hide_all": _SANDBOX_SETUP
    + " (empty files and a staging dir on that tmpfs, for the hides)",
    "runtime/src/init/workspace.rs:overlay_from_trees": _SANDBOX_SETUP
    + " (the overlay's staging directory on that tmpfs)",
    "runtime/src/init/procfs.rs:mount_proc": _SANDBOX_SETUP,
    "runtime/src/init/system.rs:bind_system": _SANDBOX_SETUP,
    "runtime/src/init/system.rs:expose": _SANDBOX_SETUP,
    "runtime/src/init/system.rs:synthesize_etc": _SANDBOX_SETUP,
    "runtime/src/init/step.rs:mountpoint": _SANDBOX_SETUP
    + " (the mount-point helper every step uses)",
    "runtime/src/init/rootfs.rs:pivot_into_tmpfs": _SANDBOX_SETUP,
    "runtime/src/init/rootfs.rs:detach_old_root": _SANDBOX_SETUP,
    "runtime/src/host/userns.rs:write_maps": (
        "/proc/PID/{uid_map,gid_map,setgroups} of the sandbox being made"
    ),
    "runtime/src/host/keeper.rs:keeper_setup": (
        "/proc/self/{setgroups,uid_map,gid_map} of the lab keeper's new namespace"
    ),
    "runtime/src/host/net_stage.rs:ipv6_off": (
        "/proc/sys/net settings inside the lab's new network namespace"
    ),
    "runtime/src/host/supervisor.rs:stdio_fds": (
        "opens /dev/null for a sandbox's absent stdio"
    ),
    "runtime/build.rs:main": _BUILD,
    "policy/build.rs:main": _BUILD,
    # ledger: its own files.
    "ledger/src/lib.rs:mkdir_private": _LEDGER + " (the ledger's directory, 0700)",
    "ledger/src/lib.rs:create_initialized": _LEDGER
    + " (a new ledger made whole in a temp file, then linked into place)",
    "ledger/src/lib.rs:open_marker": _LEDGER + " (the WAL fold record beside the ledger)",
    "ledger/src/lib.rs:checkpoint": _LEDGER + " (the signed checkpoints beside the ledger and in RETIE_CHECKPOINT_COPY)",
    "ledger/src/keys.rs:write_key": _LEDGER + " (a key written 0600, then linked into place)",
    "ledger/src/keys.rs:save_session_key": _LEDGER + " (the keys' directory kept 0700)",
    "ledger/src/verify.rs:write_seen": _LEDGER
    + " (verify's record of the last head it saw, temp file + rename)",
    # agent: output capture.
    "agent/src/tools/bash.rs:new": (
        "an anonymous temp file (tempfile::tempfile) capturing the command's output"
    ),
    "agent/src/tools/retest.rs:new": (
        "an anonymous temp file (tempfile::tempfile) capturing the command's output"
    ),
    # the CLI: state, config, reports, demos, labs, self-test.
    "src/state.rs:dir": _STATE + " (created 0700)",
    "src/state.rs:landlock_notice_once": _STATE + " (a marker: the notice is said once)",
    "src/commands/chat/editor.rs:history_path": (
        "the line editor's history file under retie's state (0600)"
    ),
    "src/commands/models.rs:save_cache": (
        "the model catalogue cache under retie's state (temp file + rename)"
    ),
    "src/commands/generate.rs:create": (
        "`retie __generate`: man pages and completions into the directory "
        "the release script names"
    ),
    "src/commands/changes.rs:ask": (
        "opens /dev/tty to ask the person (a terminal, no file is written)"
    ),
    "src/commands/demo.rs:demo": (
        "`retie demo`: makes its own throwaway project in a new temp dir "
        "(before any action; from then on only dispatch writes it)"
    ),
    "src/commands/lab.rs:labs_dir": _LAB,
    "src/commands/lab.rs:running_labs": _LAB + " (a dead lab's directory removed)",
    "src/commands/lab.rs:up": _LAB + " (the lab's app, data and log)",
    "src/commands/lab.rs:down": _LAB,
    "src/commands/lab.rs:holder_inner": _LAB + " (lab.json, temp file + rename)",
    "src/commands/retest.rs:scratch_dir": (
        "`retie retest`: its scratch directory under retie's state (each "
        "command's sandbox workspace, made empty by retie itself)"
    ),
    "src/commands/retest.rs:resume": (
        "`retie retest --resume`: the scratch directory the session recorded "
        "at its open, made again if it is gone (the ledger was verified first)"
    ),
    "src/commands/selftest.rs:selftest": "`retie selftest`: its own throwaway workspace in a temp dir",
    "src/commands/selftest.rs:lab_section": "`retie selftest`: its own throwaway workspace in a temp dir",
    "src/commands/selftest.rs:plant_canary": (
        "`retie selftest`: a canary file in $HOME that no sandbox may read "
        "(removed again by Canary's drop)"
    ),
    "src/commands/selftest.rs:drop": "`retie selftest`: removes its canary",
    "src/commands/probe.rs:init_process_probes": _PROBE,
    "src/commands/probe.rs:battery": _PROBE,
    "src/commands/gc.rs:gc": (
        "`retie gc`: snapshot::gc removes expired pre-images and journal "
        "entries from retie's state, never a workspace byte"
    ),
    "src/ledger/dev.rs:bench": (
        "`retie __ledger bench`: its own scratch databases in a temp dir"
    ),
    "src/commands/ledger_cmd.rs:copy": (
        "`retie ledger copy`: appends the source ledger's signed checkpoint "
        "lines to the target ledger's checkpoint file (retie's state or the "
        "directory the person named), never a workspace byte"
    ),
}

# ---------------------------------------------------------------------------
# Reading Rust: comments and literals blanked, test items found.
# ---------------------------------------------------------------------------
_CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.)|[^\\'\n])'")
_RAW = re.compile(r'(?:b|c)?r(#*)"')


def blank(text: str) -> str:
    """`text` with every comment and the inside of every string and char
    literal replaced by spaces (newlines kept, so offsets and lines hold)."""
    out = list(text)
    n = len(text)
    i = 0

    def wipe(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    def ident_before(k: int) -> bool:
        return k > 0 and (text[k - 1].isalnum() or text[k - 1] == "_")

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c in "rbc" and not ident_before(i) and (m := _RAW.match(text, i)):
            close = '"' + m.group(1)
            start = m.end()
            j = text.find(close, start)
            j = n if j < 0 else j
            wipe(start, j)
            i = j + len(close)
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1) and not ident_before(i)):
            j = i + (1 if c == '"' else 2)
            start = j
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(start, j)
            i = j + 1
        elif c == "'":
            m = _CHAR.match(text, i)
            if m:
                wipe(i + 1, m.end() - 1)
                i = m.end()
            else:
                i += 1  # a lifetime or a label
        else:
            i += 1
    return "".join(out)


def matching(code: str, open_at: int) -> int:
    """The offset just past the brace that closes the one at `open_at`."""
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(code)


_CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
_ATTR = re.compile(r"\s*#\[")
_MOD_DECL = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


def test_items(code: str) -> tuple[list[tuple[int, int]], list[str]]:
    """Spans of `#[cfg(test)]` items, and the modules `#[cfg(test)] mod X;`
    declares (their files are test code)."""
    spans, mods = [], []
    for m in _CFG_TEST.finditer(code):
        k = m.end()
        while (a := _ATTR.match(code, k)) is not None:
            depth, j = 0, a.end() - 1
            while j < len(code):
                if code[j] == "[":
                    depth += 1
                elif code[j] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            k = j + 1
        d = _MOD_DECL.match(code, k)
        if d:
            mods.append(d.group(1))
            continue
        j = k
        while j < len(code) and code[j] not in "{;":
            j += 1
        end = matching(code, j) if j < len(code) and code[j] == "{" else j + 1
        spans.append((m.start(), end))
    return spans, mods


class Source:
    def __init__(self, rel: str):
        self.rel = rel
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            self.text = f.read()
        self.code = blank(self.text)
        self.tests, self.test_mods = test_items(self.code)
        self._lines = [m.start() for m in re.finditer(r"^", self.code, re.M)]
        # Each function's span: from `fn NAME` to its body's closing brace.
        self._fns = []
        for m in re.finditer(r"\bfn\s+([A-Za-z_]\w*)", self.code):
            j = m.end()
            while j < len(self.code) and self.code[j] not in "{;":
                j += 1
            if j < len(self.code) and self.code[j] == "{":
                self._fns.append((m.start(), matching(self.code, j), m.group(1)))

    def line(self, off: int) -> int:
        lo, hi = 0, len(self._lines)
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if self._lines[mid] <= off:
                lo = mid
            else:
                hi = mid
        return lo + 1

    def in_test(self, off: int) -> bool:
        return any(a <= off < b for a, b in self.tests)

    def function(self, off: int) -> str:
        """The innermost function whose body holds `off` (a closure's is
        its enclosing function's)."""
        name, best = "<top>", -1
        for start, end, fname in self._fns:
            if start <= off < end and start > best:
                name, best = fname, start
        return name

    def source_line(self, off: int) -> str:
        return self.text.splitlines()[self.line(off) - 1].strip()


def rust_files() -> list[Source]:
    found = []
    skip_dirs = {"target", ".git", "tests", "benches", "examples", "node_modules"}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs and not d.startswith("."))
        for fn in sorted(filenames):
            if fn.endswith(".rs"):
                found.append(os.path.relpath(os.path.join(dirpath, fn), ROOT))
    sources = {rel: Source(rel) for rel in found}
    # Files a `#[cfg(test)] mod X;` declares are test code.
    test_files = set()
    for rel, s in sources.items():
        d, base = os.path.split(rel)
        stem = base[:-3]
        here = d if stem in ("mod", "lib", "main") else os.path.join(d, stem)
        for m in s.test_mods:
            test_files.add(os.path.join(here, m + ".rs"))
            test_files.add(os.path.join(here, m, "mod.rs"))
    return [s for rel, s in sorted(sources.items()) if rel not in test_files]


def under(rel: str, *dirs: str) -> bool:
    return any(rel.startswith(d.rstrip("/") + "/") for d in dirs)


# ---------------------------------------------------------------------------
# The rules.
# ---------------------------------------------------------------------------
Violation = tuple[str, int, str, str]

LEDGER_PATTERNS = [
    (re.compile(r"\brusqlite::"), "uses SQLite directly (rusqlite)"),
    (re.compile(r"\bConnection::open\w*"), "opens an SQLite connection"),
    (re.compile(r"\bappend_batch\w*\s*\("), "appends to the ledger (append_batch)"),
    (re.compile(r"\bLedger::append\w*\b"), "appends to the ledger (Ledger::append)"),
    # A ledger append; not OpenOptions::append(bool), not Vec::append(&mut v).
    (
        re.compile(r"\.append\s*\((?!\s*(?:true|false)\s*\)|\s*&mut\b)"),
        "appends to the ledger (.append)",
    ),
]


def check_ledger(sources: list[Source]) -> list[Violation]:
    out: list[Violation] = []
    for s in sources:
        if under(s.rel, "ledger", "dispatch"):
            continue
        allowed = LEDGER_ALLOWED.get(s.rel)
        if allowed:
            for m in allowed["must_not"].finditer(s.code):
                if not s.in_test(m.start()):
                    out.append(
                        (s.rel, s.line(m.start()), "ledger",
                         f"an allowed ledger tool writes an action's entry ({m.group(0)}): only dispatch/ does")
                    )
            continue
        for pat, what in LEDGER_PATTERNS:
            for m in pat.finditer(s.code):
                if s.in_test(m.start()):
                    continue
                out.append(
                    (s.rel, s.line(m.start()), "ledger",
                     f"{what} outside ledger/ and dispatch/: `{s.source_line(m.start())}`")
                )
    return out


WRITE_PATTERNS = [
    re.compile(
        r"\bfs::(?:write|rename|remove_file|remove_dir|remove_dir_all|create_dir|create_dir_all|"
        r"copy|hard_link|soft_link|set_permissions)\s*\("
    ),
    re.compile(r"\bFile::create(?:_new)?\s*\("),
    re.compile(r"\bDirBuilder::new\s*\("),
    re.compile(r"(?<![\w.])(?:symlink|symlinkat|[fl]?chown|fchownat|lchown)\s*\("),
    re.compile(r"\btempfile::(?:tempfile|tempdir|tempfile_in|tempdir_in|NamedTempFile|Builder)\b"),
    re.compile(
        r"\b(?:rustix::fs|libc)::(?:mkdir|mkdirat|unlink|unlinkat|rename|renameat|renameat2|rmdir|"
        r"link|linkat|symlink|symlinkat|mknod|mknodat|creat|chown|fchown|fchownat|chmod|fchmod|fchmodat)\b"
    ),
    re.compile(r"\bO_CREAT\b|\bOFlags::CREATE\b"),
    # A write path of the snapshot crate called from outside the chokepoint.
    re.compile(
        r"\bretie_snapshot::(?:apply|apply_alongside|undo|recover|gc|record_file_write\w*)\b"
        r"|\b(?:apply_alongside|chown_written|record_file_write\w*)\b"
    ),
]
_OPEN_CHAIN = re.compile(r"\b(?:OpenOptions::new|File::options)\s*\(")
# Any of these set to anything but a literal `false`.
_WRITES_IN_CHAIN = re.compile(r"\.(?:write|create|create_new|append|truncate)\s*\((?!\s*false\s*\))")
_SNAPSHOT_USE = re.compile(r"\buse\s+retie_snapshot::\{([^}]*)\}")
_SNAPSHOT_WRITERS = {"apply", "apply_alongside", "undo", "recover", "gc"}


def write_sites(s: Source):
    for pat in WRITE_PATTERNS:
        for m in pat.finditer(s.code):
            yield m.start()
    for m in _OPEN_CHAIN.finditer(s.code):
        end = s.code.find(";", m.end())
        chain = s.code[m.end(): end if end >= 0 else len(s.code)]
        if _WRITES_IN_CHAIN.search(chain):
            yield m.start()
    for m in _SNAPSHOT_USE.finditer(s.code):
        names = {n.strip().split(" as ")[0] for n in m.group(1).split(",")}
        if names & _SNAPSHOT_WRITERS:
            yield m.start()


# Every write the allow-list let through (`--list` prints them).
ALLOWED_SITES: list[tuple[str, int, str, str, str]] = []


def check_writes(sources: list[Source]) -> tuple[list[Violation], set[str]]:
    out: list[Violation] = []
    used: set[str] = set()
    for s in sources:
        if under(s.rel, "snapshot", "dispatch"):
            continue
        seen = set()
        for off in sorted(set(write_sites(s))):
            if s.in_test(off):
                continue
            fn = s.function(off)
            key, whole = f"{s.rel}:{fn}", f"{s.rel}:*"
            line = s.line(off)
            entry = key if key in WRITERS_ALLOWED else whole if whole in WRITERS_ALLOWED else None
            if entry is not None:
                used.add(entry)
                ALLOWED_SITES.append((s.rel, line, fn, entry, s.source_line(off)))
                continue
            if (line, key) in seen:
                continue
            seen.add((line, key))
            out.append(
                (s.rel, line, "writes",
                 f"`{fn}` writes files outside snapshot/ and dispatch/ and is on no allow-list "
                 f"(a workspace write goes through dispatch; any other writer is added to "
                 f"WRITERS_ALLOWED in scripts/check-layers.py with its reason): `{s.source_line(off)}`")
            )
    return out, used


def check_crates() -> list[Violation]:
    out: list[Violation] = []
    manifests = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in {"target", ".git", "tests"} and not d.startswith(".")]
        if "Cargo.toml" in filenames:
            p = os.path.join(dirpath, "Cargo.toml")
            with open(p, "rb") as f:
                data = tomllib.load(f)
            if "package" in data:
                manifests[os.path.relpath(p, ROOT)] = data
    by_dir = {os.path.dirname(rel): d["package"]["name"] for rel, d in manifests.items()}
    names = set(by_dir.values())
    for rel, data in sorted(manifests.items()):
        me = data["package"]["name"]
        if me not in CRATE_MAY_USE:
            out.append((rel, 1, "crates", f"crate {me} is not in CRATE_MAY_USE: place it in the order first"))
            continue
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines = f.read().splitlines()
        tables = []
        for key in ("dependencies", "build-dependencies", "dev-dependencies"):
            tables.append((key, data.get(key, {})))
        for target, t in data.get("target", {}).items():
            for key in ("dependencies", "build-dependencies", "dev-dependencies"):
                tables.append((f"target.{target}.{key}", t.get(key, {})))
        for table, deps in tables:
            for key, spec in deps.items():
                dep = key
                if isinstance(spec, dict):
                    dep = spec.get("package", key)
                    if "path" in spec:
                        d = os.path.normpath(os.path.join(os.path.dirname(rel), spec["path"]))
                        dep = by_dir.get("" if d == "." else d, dep)
                if dep not in names:
                    continue
                if dep not in CRATE_MAY_USE[me]:
                    line = next((i + 1 for i, l in enumerate(lines) if re.match(rf"\s*{re.escape(key)}\s*=", l)), 1)
                    out.append(
                        (rel, line, "crates",
                         f"{me} depends on {dep} ([{table}]): upward or sideways against the order "
                         f"(it may use: {', '.join(sorted(CRATE_MAY_USE[me])) or 'no retie crate'})")
                    )
    return out


POLICY_IO = re.compile(
    r"\bstd::(?:fs|process|env|thread)\b|\b(?:TcpStream|TcpListener|UdpSocket|UnixStream|ToSocketAddrs|File)\b"
    r"|\b(?:libc|rustix)::|\be?print(?:ln)?!|\bstd::io::(?:stdin|stdout|stderr)\b|\b(?:Instant|SystemTime)::now\b"
)


def check_policy(sources: list[Source]) -> list[Violation]:
    out: list[Violation] = []
    for s in sources:
        if not under(s.rel, "policy/src"):
            continue
        for m in POLICY_IO.finditer(s.code):
            if not s.in_test(m.start()):
                out.append((s.rel, s.line(m.start()), "policy",
                            f"policy/ does no I/O ({m.group(0)}): `{s.source_line(m.start())}`"))
    return out


PROVIDER_EXEC = re.compile(
    r"\bstd::process::Command\b|\bCommand::new\b|\bretie_runtime\b|\bretie_snapshot\b|\bcrate::tools\b"
    r"|\bsuper::super::tools\b|\bretie_dispatch\b|\bdispatch\s*\("
)


def check_providers(sources: list[Source]) -> list[Violation]:
    out: list[Violation] = []
    for s in sources:
        if not under(s.rel, "agent/src/provider"):
            continue
        for m in PROVIDER_EXEC.finditer(s.code):
            if not s.in_test(m.start()):
                out.append((s.rel, s.line(m.start()), "providers",
                            f"a provider never executes anything ({m.group(0)}): `{s.source_line(m.start())}`"))
    return out


_TRACE_REF = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.rs):((?:[A-Z]\w*::)?[A-Za-z_]\w*)`")


def check_trace() -> list[Violation]:
    out: list[Violation] = []
    doc = os.path.join("docs", "architecture.md")
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = f.read()
    cache: dict[str, str | None] = {}
    for m in _TRACE_REF.finditer(text):
        path, name = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        if path not in cache:
            p = os.path.join(ROOT, path)
            cache[path] = blank(open(p, encoding="utf-8").read()) if os.path.isfile(p) else None
        code = cache[path]
        if code is None:
            out.append((doc, line, "trace", f"{path} does not exist"))
            continue
        ty, _, fn = name.rpartition("::")
        if not re.search(rf"\bfn\s+{re.escape(fn)}\b", code) and not (
            not ty and re.search(rf"\b(?:struct|enum|trait|type)\s+{re.escape(fn)}\b", code)
        ):
            out.append((doc, line, "trace", f"{path} has no function {fn}"))
        elif ty and not re.search(rf"\b(?:impl(?:<[^>]*>)?\s+(?:[\w:<>, ]+\s+for\s+)?{re.escape(ty)}\b|struct\s+{re.escape(ty)}\b|enum\s+{re.escape(ty)}\b)", code):
            out.append((doc, line, "trace", f"{path} has no type {ty}"))
    return out


_KIND = re.compile(r"\bKind::[A-Z]\w*")


def check_payloads(sources: list[Source]) -> list[Violation]:
    out: list[Violation] = []
    for s in sources:
        if under(s.rel, "ledger"):
            continue
        for m in _KIND.finditer(s.code):
            if s.in_test(m.start()):
                continue
            a = max(s.code.rfind(";", 0, m.start()), s.code.rfind("{\n", 0, m.start()))
            b = s.code.find(";", m.end())
            b = len(s.code) if b < 0 else b
            j = s.code.find("json!", a + 1, b)
            if j >= 0:
                out.append((s.rel, s.line(m.start()), "payloads",
                            f"{m.group(0)}'s payload spelled with json! (build its struct in "
                            f"retie_ledger::payload): `{s.source_line(m.start())}`"))
    return out


# A test or module a claim names: `module::test_name`, `crate::module`,
# `plants::*`. Its last name must be a function, a module or a file of the
# tree (tests included). docs/performance.md and the ADRs are history and
# are not read.
_CLAIM_REF = re.compile(r"`([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)+)(?:::\*)?`")


def check_claims() -> list[Violation]:
    out: list[Violation] = []
    names: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules") and not d.startswith(".")]
        for fn in filenames:
            if not fn.endswith(".rs"):
                continue
            names.add(fn[:-3])
            with open(os.path.join(dirpath, fn), encoding="utf-8", errors="replace") as f:
                names.update(re.findall(r"\b(?:fn|mod)\s+([a-z_][a-z0-9_]*)", f.read()))
    docs = ["README.md"]
    ddir = os.path.join(ROOT, "docs")
    if os.path.isdir(ddir):
        docs += [os.path.join("docs", f) for f in sorted(os.listdir(ddir))
                 if f.endswith(".md") and f != "performance.md"]
    for doc in docs:
        p = os.path.join(ROOT, doc)
        if not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8") as f:
            text = f.read()
        for m in _CLAIM_REF.finditer(text):
            last = m.group(1).rsplit("::", 1)[1]
            if last not in names:
                line = text.count("\n", 0, m.start()) + 1
                out.append((doc, line, "claims", f"`{m.group(1)}` names no function, module or file of the tree"))
    return out


def collect(stale: bool = True) -> tuple[list[Violation], int]:
    """Every violation under ROOT, and how many Rust files were read.
    `stale`: also report allow-list entries that match nothing."""
    ALLOWED_SITES.clear()
    sources = rust_files()
    violations = check_ledger(sources)
    writes, used = check_writes(sources)
    violations += writes
    violations += check_crates()
    violations += check_policy(sources)
    violations += check_providers(sources)
    violations += check_trace()
    violations += check_payloads(sources)
    violations += check_claims()
    if stale:
        for key in sorted(set(WRITERS_ALLOWED) - used):
            path = key.rsplit(":", 1)[0]
            violations.append((path, 1, "writes",
                               f"allow-list entry {key} matches no writer any more: remove it from WRITERS_ALLOWED"))
        for rel in LEDGER_ALLOWED:
            if not os.path.isfile(os.path.join(ROOT, rel)):
                violations.append((rel, 1, "ledger", "allow-list entry names a file that no longer exists"))
    return violations, len(sources)


# ---------------------------------------------------------------------------
# --self-test: each rule fires on a planted violation, at its line, and stays
# quiet on comments, literals and test code (a small tree in a temp dir).
# ---------------------------------------------------------------------------
_CARGO = '[package]\nname = "{name}"\nversion = "0.1.0"\n\n[dependencies]\n{deps}'
SELF_TEST_FIRES = [
    # (what, {path: text}, (rule, path, line))
    ("SQLite outside the ledger",
     {"agent/src/a.rs": 'fn f() {}\nfn g() { let _ = rusqlite::Connection::open("x"); }\n'},
     ("ledger", "agent/src/a.rs", 2)),
    ("a ledger append outside dispatch",
     {"src/commands/x.rs": "fn f(l: &mut L) {\n    l.append_batch(|_| vec![]);\n}\n"},
     ("ledger", "src/commands/x.rs", 2)),
    ("an action's entry from the allowed ledger tool",
     {"src/ledger/dev.rs": "fn f(l: &mut L) { l.append(&id, Actor::Agent, Kind::Intent, &p, &k); }\n"},
     ("ledger", "src/ledger/dev.rs", 1)),
    ("a new file writer",
     {"src/commands/x.rs": 'fn f(p: &Path) {\n    std::fs::write(p.join("a"), b"x").ok();\n}\n'},
     ("writes", "src/commands/x.rs", 2)),
    ("a writing OpenOptions chain",
     {"agent/src/tools/files.rs": "fn w(p: &Path) {\n    let _ = std::fs::OpenOptions::new()\n        .create(true)\n        .open(p);\n}\n"},
     ("writes", "agent/src/tools/files.rs", 2)),
    ("the snapshot's write path from outside the chokepoint",
     {"agent/src/tools/files.rs": "fn w(ws: &W) {\n    retie_snapshot::record_file_write_as(ws, 0, 0);\n}\n"},
     ("writes", "agent/src/tools/files.rs", 2)),
    ("a new writer in a file with allowed writers",
     {"src/commands/lab.rs": 'fn labs_dir() { std::fs::create_dir_all("d").ok(); }\nfn tidy(ws: &Path) { std::fs::remove_file(ws).ok(); }\n'},
     ("writes", "src/commands/lab.rs", 2)),
    ("I/O in the policy",
     {"policy/src/a.rs": 'fn f() -> bool {\n    std::fs::metadata("x").is_ok()\n}\n'},
     ("policy", "policy/src/a.rs", 2)),
    ("a provider that executes",
     {"agent/src/provider/a.rs": 'fn f() {\n    let _ = std::process::Command::new("sh");\n}\n'},
     ("providers", "agent/src/provider/a.rs", 2)),
    ("a provider that reaches into the chokepoint",
     {"agent/src/provider/a.rs": 'use retie_dispatch::display::visible;\nfn f() {}\n'},
     ("providers", "agent/src/provider/a.rs", 1)),
    ("a claim naming a test that does not exist",
     {"README.md": "| a wall | `cases::no_such_test` |\n",
      "snapshot/tests/it/cases.rs": "#[test]\nfn a_real_test() {}\n"},
     ("claims", "README.md", 1)),
    ("a crate that depends upward",
     {"policy/Cargo.toml": _CARGO.format(name="retie-policy", deps='retie-ledger = { path = "../ledger" }\n'),
      "ledger/Cargo.toml": _CARGO.format(name="retie-ledger", deps="")},
     ("crates", "policy/Cargo.toml", 6)),
    ("a ledger payload spelled with json!",
     {"dispatch/src/a.rs": 'fn f(r: &R) {\n    r.entry(\n        Actor::Agent,\n        Kind::Note,\n        json!({"n": 1}),\n    );\n}\n'},
     ("payloads", "dispatch/src/a.rs", 4)),
    ("a trace naming a function that does not exist",
     {"agent/src/a.rs": "fn f() {}\n", "docs/architecture.md": "x\n1. `agent/src/a.rs:g`: gone\n"},
     ("trace", "docs/architecture.md", 2)),
]
SELF_TEST_QUIET = [
    ("comments and literals",
     {"agent/src/a.rs": '// rusqlite::Connection::open\n/* std::fs::write(x) /* nested */ */\nfn f() {\n'
      '    let s = "std::fs::write(x) \\" rusqlite::";\n    let r = r#"fs::write("a")"#;\n'
      "    let c = '\"'; let d = '{';\n    let mut v = vec![1]; v.append(&mut vec![2]);\n}\n"}),
    ("test code",
     {"agent/src/a.rs": '#[cfg(test)]\nmod tests {\n    fn t() { std::fs::write("x", b"").ok(); let _ = rusqlite::Connection::open("y"); }\n}\n',
      "agent/src/b.rs": "#[cfg(test)]\nmod helpers;\n",
      "agent/src/b/helpers.rs": 'fn t() { std::fs::write("x", b"").ok(); }\n',
      "agent/tests/t.rs": 'fn t() { std::fs::write("x", b"").ok(); }\n'}),
    ("claims naming real tests, modules and files",
     {"README.md": "`cases::a_real_test`, `plants::*`, `retie_ledger::payload`, `run::key_tests`\n",
      "snapshot/tests/it/cases.rs": "#[test]\nfn a_real_test() {}\n",
      "snapshot/tests/it/plants.rs": "",
      "ledger/src/payload.rs": "",
      "src/commands/run.rs": "#[cfg(test)]\nmod key_tests {}\n"}),
    ("reading and read-only opens",
     {"agent/src/a.rs": 'fn f() { let _ = std::fs::read("x"); let _ = std::fs::OpenOptions::new().read(true).write(false).open("x"); }\n'}),
    ("a typed payload, and json! in the statements around it",
     {"dispatch/src/a.rs": 'fn f(r: &R) {\n    let x = json!({"a": 1});\n    r.entry(Actor::Agent, Kind::Note, payload::to_value(&n));\n    let y = json!([]);\n}\n'
                           '#[cfg(test)]\nmod tests {\n    fn t() { row(1, Kind::SessionOpened, json!({})); }\n}\n',
      "ledger/src/lib.rs": 'fn g(l: &mut L) { l.genesis(Kind::LedgerOpened, &json!({"format": 1})); }\n'}),
    ("the order kept",
     {"policy/Cargo.toml": _CARGO.format(name="retie-policy", deps='retie-display = { path = "../display" }\n'),
      "display/Cargo.toml": _CARGO.format(name="retie-display", deps=""),
      "agent/src/a.rs": "fn f() {}\n", "docs/architecture.md": "1. `agent/src/a.rs:f`\n"}),
]


def self_test() -> int:
    import tempfile

    global ROOT
    real, failed = ROOT, 0

    def run(files: dict[str, str]) -> list[Violation]:
        global ROOT
        with tempfile.TemporaryDirectory() as d:
            files = {"docs/architecture.md": "", **files}
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            ROOT = d
            try:
                return collect(stale=False)[0]
            finally:
                ROOT = real

    for what, files, (rule, path, line) in SELF_TEST_FIRES:
        got = run(files)
        if not any(v[0] == path and v[1] == line and v[2] == rule for v in got):
            failed += 1
            print(f"self-test: FAILED to catch {what} ({rule} at {path}:{line}); got {got}")
    for what, files in SELF_TEST_QUIET:
        got = run(files)
        if got:
            failed += 1
            print(f"self-test: FALSE ALARM on {what}: {got}")
    n = len(SELF_TEST_FIRES) + len(SELF_TEST_QUIET)
    print(f"check-layers self-test: {n - failed} of {n} cases passed")
    return 1 if failed else 0


def main() -> int:
    if "--self-test" in sys.argv[1:]:
        return self_test()
    violations, files = collect()
    if "--list" in sys.argv[1:]:
        for rel, line, fn, entry, text in sorted(ALLOWED_SITES):
            print(f"{rel}:{line}: allowed writer {fn} ({entry}): `{text}`")
    for rel, line, rule, what in sorted(violations):
        print(f"{rel}:{line}: {rule}: {what}")
    if violations:
        print(f"check-layers: {len(violations)} violation(s)", file=sys.stderr)
        return 1
    print(f"check-layers: clean ({files} Rust files; ledger, writes, crates, policy, providers, trace, payloads, claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
