#!/usr/bin/env python3
"""Overlay mode vs direct mode vs `cp -a`, side by side, on generated
workspaces of 1k, 10k and 100k files (4 KiB each, so the largest is about
400 MB). For each size:

- `true` under `retie sandbox exec --workspace-mode overlay` and
  `--workspace-mode direct`, interleaved: the overlay's overhead;
- `cp -a` of the workspace: what the predecessor paid before every command;
- a command that changes one file, in overlay mode: the time retie spends
  computing and applying the changeset (`changes.handled_ms` in --json).

Prints a markdown table. Never asserts: machines are noisy.
usage: tests/bench/overlay.py [--retie PATH] [--sizes 1000,10000,100000] [--runs N]
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


def timed(argv, **kw):
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    dt = (time.perf_counter() - t0) * 1000
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stderr.decode()}")
    return dt, p.stderr.decode()


def generate(root, n):
    ws = os.path.join(root, f"ws{n}")
    payload = os.urandom(4096)
    per_dir = 1000
    for i in range(n):
        d = os.path.join(ws, f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(d)
        with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
            f.write(payload)
    return ws


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retie", default=os.path.join(os.path.dirname(__file__),
                                                    "../../target/x86_64-unknown-linux-musl/release/retie"))
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    retie = os.path.abspath(args.retie)
    root = tempfile.mkdtemp(prefix="retie-obench-")
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(root, "state"))
    rows = []
    try:
        for n in [int(x) for x in args.sizes.split(",")]:
            ws = generate(root, n)
            mb = n * 4096 / 1e6
            ov, di = [], []
            for i in range(args.runs):
                pair = [("overlay", ov), ("direct", di)]
                for mode, acc in (pair if i % 2 == 0 else reversed(pair)):
                    dt, _ = timed([retie, "sandbox", "exec", "-w", ws, "--workspace-mode", mode, "--", "true"], env=env)
                    acc.append(dt)
            cp = []
            for _ in range(3 if n >= 100000 else 5):
                dst = os.path.join(root, "copy")
                dt, _ = timed(["cp", "-a", ws, dst])
                cp.append(dt)
                shutil.rmtree(dst)
            handled = []
            for i in range(min(args.runs, 15)):
                target = f"d0000/f{i:06d}"
                _, err = timed([retie, "sandbox", "exec", "-w", ws, "--json", "--",
                                "sh", "-c", f"echo changed >> {target}"], env=env)
                status = json.loads(err.strip().splitlines()[-1])
                assert status["changes"]["applied"], status
                handled.append(status["changes"]["handled_ms"])
            rows.append((n, mb, statistics.median(ov), statistics.median(di), statistics.median(cp),
                         statistics.median(handled)))
            shutil.rmtree(ws)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| files | size | `true`, overlay | `true`, direct | overlay overhead | `cp -a` | one-file change: compute + apply |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, mb, ov, di, cp, h in rows:
        print(f"| {n:,} | {mb:.0f} MB | {ov:.2f} ms | {di:.2f} ms | {ov - di:+.2f} ms | {cp:.0f} ms | {h:.2f} ms |")


if __name__ == "__main__":
    main()
