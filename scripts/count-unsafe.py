#!/usr/bin/env python3
"""Count `unsafe` per crate of the workspace: blocks (`unsafe { ... }`),
functions (`unsafe fn`), impls and extern blocks, in each crate's `src/`.

Comments, string and char literals are stripped first, so a `// SAFETY:`
comment or a message that says "unsafe" is not counted. The CLI's probe
(`src/commands/probe.rs`) must stay raw (it calls what the sandbox must
refuse): it is counted on a row of its own and left out of `retie`.

usage: scripts/count-unsafe.py [--markdown] [ROOT]
"""
import os
import re
import sys

PROBE = os.path.join("src", "commands", "probe.rs")
CRATES = [
    ("retie (binary, without probe.rs)", "src", lambda p: p != PROBE),
    ("retie probe.rs (stays raw)", "src", lambda p: p == PROBE),
    ("retie-runtime", "runtime/src", None),
    ("retie-policy", "policy/src", None),
    ("retie-snapshot", "snapshot/src", None),
    ("retie-ledger", "ledger/src", None),
    ("retie-dispatch", "dispatch/src", None),
    ("retie-agent", "agent/src", None),
]


def strip(text):
    """Source text with comments and string/char literals blanked out."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or (c == "'" and text.startswith("'\\", i) and re.match(r"'\\(x..|u\{[0-9a-fA-F]+\})'", text[i:])):
            m = re.match(r"'(\\x..|\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


KINDS = {
    "blocks": re.compile(r"\bunsafe\s*\{"),
    "fns": re.compile(r"\bunsafe\s+(extern\s+\"?\w*\"?\s*)?fn\b"),
    "impls": re.compile(r"\bunsafe\s+impl\b"),
    "extern": re.compile(r"\bunsafe\s+extern\s*(\"\"\s*)?\{"),
}


def count(root, sub, keep):
    totals = {k: 0 for k in KINDS}
    files = {}
    base = os.path.join(root, sub)
    for dirpath, _, names in os.walk(base):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if keep and not keep(rel):
                continue
            text = strip(open(path, encoding="utf-8").read())
            c = {k: len(r.findall(text)) for k, r in KINDS.items()}
            for k in KINDS:
                totals[k] += c[k]
            if c["blocks"]:
                files[rel] = c["blocks"]
    return totals, files


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    md = "--markdown" in sys.argv
    rows = []
    for label, sub, keep in CRATES:
        if os.path.isdir(os.path.join(root, sub)):
            rows.append((label, *count(root, sub, keep)))
    if md:
        print("| crate | unsafe blocks | unsafe fn | unsafe impl | unsafe extern |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for label, t, _ in rows:
            print(f"| {label} | {t['blocks']} | {t['fns']} | {t['impls']} | {t['extern']} |")
    else:
        print(f"{'crate':36}{'blocks':>8}{'fn':>5}{'impl':>6}{'extern':>8}")
        for label, t, _ in rows:
            print(f"{label:36}{t['blocks']:>8}{t['fns']:>5}{t['impls']:>6}{t['extern']:>8}")
    if "--files" in sys.argv:
        for label, _, files in rows:
            for f, n in sorted(files.items(), key=lambda kv: -kv[1]):
                print(f"  {n:4} {f}")


if __name__ == "__main__":
    main()
