#!/usr/bin/env python3
"""Big changes: retie's overlay run with review, apply and recording, against
bubblewrap running the same command straight on a copy of the workspace, in
one loop. Then retie's undo of each. Prints a markdown table of medians and
ratios, and retie's peak memory (max RSS of the `retie` process and what it waited
for, by wait4).

Scenarios (1 KiB files, 100 per directory):
- created N: the command writes N new files under a new directory;
- modified N: a formatter-like rewrite of N existing files;
- deleted N: the command removes a tree of N files.

Never asserts: machines are noisy. Needs bwrap and /usr/bin/python3.
usage: tests/bench/apply.py [--retie PATH] [--runs N] [--only created:1000,modified:1000]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PY = "/usr/bin/python3"

CREATE = """import os
n={n}
for i in range(n):
    if i % 100 == 0:
        os.makedirs(f"gen/d{{i // 100:04d}}")
    with open(f"gen/d{{i // 100:04d}}/f{{i:06d}}", "wb") as f:
        f.write(b"x" * 1024)
"""

MODIFY = """import os
for d in sorted(os.listdir("tree")):
    for name in sorted(os.listdir(f"tree/{d}")):
        p = f"tree/{d}/{name}"
        with open(p, "rb") as f:
            b = f.read()
        with open(p + ".fmt", "wb") as f:
            f.write(b.replace(b"a", b"b"))
        os.replace(p + ".fmt", p)
"""

DELETE = """import shutil
shutil.rmtree("tree")
"""


def populate(ws, n):
    tree = os.path.join(ws, "tree")
    for i in range(n):
        d = os.path.join(tree, f"d{i // 100:04d}")
        if i % 100 == 0:
            os.makedirs(d)
        with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
            f.write(b"a" * 1024)


def run(argv, cwd, env=None):
    """Runs argv; returns its time, its output and the peak RSS (KiB) of
    that process and the descendants it waited for (wait4), never of
    another command the script ran."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        o, e = out.read(), err.read()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)[:200]}\n{e.decode()[-2000:]}")
    return dt, subprocess.CompletedProcess(argv, p.returncode, o, e), usage.ru_maxrss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retie", default=os.path.join(
        os.path.dirname(__file__), "../../target/x86_64-unknown-linux-musl/release/retie"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="created:1000,created:10000,created:50000,"
                    "modified:1000,modified:10000,deleted:10000")
    args = ap.parse_args()
    retie = os.path.abspath(args.retie)
    if not shutil.which("bwrap"):
        sys.exit("needs bubblewrap (Debian: bubblewrap)")
    root = tempfile.mkdtemp(prefix="retie-applybench-")
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(root, "state"),
               XDG_CONFIG_HOME=os.path.join(root, "config"))
    rows = []
    try:
        for item in args.only.split(","):
            kind, n = item.split(":")
            n = int(n)
            script = {"created": CREATE.format(n=n), "modified": MODIFY, "deleted": DELETE}[kind]
            bw, rt, un, peak, handled = [], [], [], 0, []
            for r in range(args.runs):
                for who in (("bwrap", "retie") if r % 2 == 0 else ("retie", "bwrap")):
                    ws = os.path.join(root, f"ws-{who}")
                    shutil.rmtree(ws, ignore_errors=True)
                    os.makedirs(ws)
                    if kind != "created":
                        populate(ws, n)
                    subprocess.run(["sync"])
                    if who == "bwrap":
                        dt, _, _ = run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev",
                                        "--proc", "/proc", "--bind", ws, ws, "--chdir", ws,
                                        "--unshare-all", "--die-with-parent",
                                        PY, "-c", script], ws)
                        bw.append(dt)
                    else:
                        dt, p, rss = run([retie, "sandbox", "exec", "--json", "--",
                                          PY, "-c", script], ws, env)
                        status = json.loads(p.stderr.decode().strip().splitlines()[-1])
                        if not status["changes"]["applied"]:
                            sys.exit(f"not applied: {status['changes']}")
                        handled.append(status["changes"]["handled_ms"] / 1000)
                        rt.append(dt)
                        peak = max(peak, rss)
                        du, _, rss = run([retie, "undo", "last", "--json"], ws, env)
                        un.append(du)
                        peak = max(peak, rss)
                    shutil.rmtree(ws, ignore_errors=True)
            b, t, u = statistics.median(bw), statistics.median(rt), statistics.median(un)
            rows.append((kind, n, b, t, t / b, statistics.median(handled), u, u / t, peak))
            print(f"{kind} {n}: bwrap {b:.2f} s, retie {t:.2f} s ({t / b:.2f}x), "
                  f"undo {u:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"runs per cell: {args.runs}, interleaved; retie: {retie}")
    print()
    print("| change | files | bubblewrap | retie (run + review + apply + record) | ratio | of which apply | "
          "retie undo | undo / apply run | peak RSS |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind, n, b, t, ratio, h, u, ur, peak in rows:
        print(f"| {kind} | {n:,} | {b:.2f} s | {t:.2f} s | {ratio:.2f}x | {h:.2f} s | {u:.2f} s | "
              f"{ur:.2f} | {peak / 1024:.0f} MiB |")


if __name__ == "__main__":
    main()
