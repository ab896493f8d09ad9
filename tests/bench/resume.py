#!/usr/bin/env python3
"""Resume benchmark: how long `retie run --resume` takes to take up a
session of 200 turns (verify the ledger, rebuild the conversation from it,
find the pending approval, gate it again), against anchors on the same
ledger: `retie verify` (a process that opens and verifies the whole
ledger) and a bare read of every row with Python's sqlite3.

    cargo build --release --bin retie
    python3 tests/bench/resume.py [--bin PATH] [--turns N] [--runs R]

The session is built once: N-1 turns that each read a file (gated
autonomy runs them), then a turn whose write holds a secret (high risk:
the gate asks; no terminal: the session suspends, exit 5). Each timed
resume has no decision to carry out and no terminal, so it suspends again
at the same pending approval (same digest): the measurement repeats on
the same session. Prints the medians and the ratio, as Markdown.
"""
import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_bin():
    for d in ("target/x86_64-unknown-linux-musl/release", "target/release"):
        p = os.path.join(ROOT, d, "retie")
        if os.path.exists(p):
            return p
    return os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/retie")


def timed(cmd, env, want):
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, check=False)
    dt = time.perf_counter() - t
    if out.returncode != want:
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}, wanted {want}\n{out.stderr[-2000:]}")
    return dt, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=default_bin())
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="retie-resume-bench-", dir=a.dir)
    home = os.path.join(root, "home")
    ws = os.path.join(root, "ws")
    os.makedirs(home)
    os.makedirs(ws)
    with open(os.path.join(ws, "f.txt"), "w") as f:
        f.write("a line of the project\n" * 20)
    env = dict(os.environ, HOME=home,
               XDG_STATE_HOME=os.path.join(home, "state"),
               XDG_CONFIG_HOME=os.path.join(home, "config"))
    env.pop("RETIE_PROVIDER", None)
    env.pop("RETIE_LEDGER", None)
    turns = [{"text": f"turn {i}: reading again.",
              "tool_calls": [{"name": "read", "arguments": {"path": "f.txt"}}]}
             for i in range(a.turns - 1)]
    turns.append({"tool_calls": [{"name": "write", "arguments": {
        "path": "cfg.sh", "content": "password = \"hunter22secret\"\n"}}]})
    turns.append({"text": "done"})
    script = os.path.join(root, "script.json")
    with open(script, "w") as f:
        json.dump({"turns": turns}, f)
    run = [a.bin, "run", ws, "--provider", "script", "--script", script,
           "--autonomy", "gated", "--max-turns", str(a.turns + 10),
           "--max-tokens", "1000000000", "--json",
           "-p", "read the file many times"]
    build_s, out = timed(run, env, 5)
    report = json.loads(out.stdout)
    sid = report["session"]
    digest = report["pending"]["digest"]
    assert report["turns"] == a.turns, report["turns"]
    ledger = os.path.join(home, "state", "retie", "ledger.db")
    entries = sqlite3.connect(ledger).execute("SELECT count(*) FROM entries").fetchone()[0]
    print(f"built: {a.turns} turns, {entries} entries, {build_s:.1f} s", file=sys.stderr)

    resume = [a.bin, "run", "--json", "--resume", sid, "--script", script,
              "--max-turns", "10", "--max-tokens", "1000000000"]
    verify = [a.bin, "verify", "--json"]
    rs, vs, qs = [], [], []
    for i in range(a.runs):
        dt, out = timed(resume, env, 5)
        r = json.loads(out.stdout)
        if r["pending"]["digest"] != digest:
            sys.exit("the resumed session shows another digest")
        rs.append(dt)
        dt, _ = timed(verify, env, 0)
        vs.append(dt)
        t = time.perf_counter()
        c = sqlite3.connect(ledger)
        rows = c.execute("SELECT * FROM entries ORDER BY seq").fetchall()
        c.close()
        qs.append(time.perf_counter() - t)
        print(f"run {i + 1}: resume {rs[-1] * 1000:.0f} ms, verify {vs[-1] * 1000:.0f} ms, "
              f"sqlite3 read {qs[-1] * 1000:.1f} ms ({len(rows)} rows)", file=sys.stderr)
    # Finish it: deny, then the resume carries the deny out and the
    # conversation ends.
    timed([a.bin, "deny", sid, "--reason", "no secrets in files"], env, 0)
    fin_s, _ = timed(resume, env, 0)
    med = statistics.median
    print(f"| what | median of {a.runs} |")
    print("|---|---|")
    print(f"| `retie run --resume` of a {a.turns}-turn session ({entries} entries), suspends again | {med(rs) * 1000:.0f} ms |")
    print(f"| `retie verify` of the same ledger (anchor) | {med(vs) * 1000:.0f} ms |")
    print(f"| bare sqlite3 read of every row (anchor, in-process) | {med(qs) * 1000:.1f} ms |")
    print(f"| ratio resume / verify | {med(rs) / med(vs):.2f} |")
    print(f"| resume after a deny, to the end of the task (once) | {fin_s * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
