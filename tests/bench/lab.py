#!/usr/bin/env python3
"""Side-by-side benchmark: `true` under `--net lab` and with no network.

Starts a throwaway lab (`retie lab up`, a python3 listener), then runs
`retie sandbox exec --workspace-mode direct [--net lab] -- true` in one
loop, interleaved and alternating which goes first, so machine noise hits
both alike. Prints medians, p90s and the difference of the medians (the
issue's target: lab mode adds at most 3 ms). Asserts no time; the figures
are for docs/lab.md. The lab is stopped at the end, also on failure.

usage: tests/bench/lab.py [--retie PATH] [--runs N] [--json]
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

SERVER = ("import socket,time\n"
          "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
          "s.bind(('0.0.0.0',8080));s.listen(8)\n"
          "while True: time.sleep(60)\n")


def spawn_time(argv, env):
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
    ])
    _, status = os.waitpid(pid, 0)
    dt = (time.perf_counter_ns() - t0) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(argv)}")
    return dt


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retie", default=os.path.join(os.path.dirname(__file__),
                    "../../target/x86_64-unknown-linux-musl/release/retie"))
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    retie = os.path.abspath(args.retie)
    if not os.access(retie, os.X_OK):
        sys.exit(f"no retie binary at {retie}: run `cargo build --release` first")
    true = shutil.which("true")
    tmp = tempfile.mkdtemp(prefix="retie-bench-lab-")
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(tmp, "state"))
    ws = os.path.join(tmp, "ws")
    os.makedirs(ws)
    up = subprocess.run([retie, "lab", "up", "--name", "bench", "--port", "8080", "--json",
                         "--", "python3", "-c", SERVER], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        sys.exit(f"retie lab up failed:\n{up.stderr}")
    try:
        base = [retie, "sandbox", "exec", "-w", ws, "--workspace-mode", "direct"]
        cmds = {"no network": base + ["--", true], "--net lab": base + ["--net", "lab", "--", true]}
        for argv in cmds.values():  # warm-up
            for _ in range(5):
                spawn_time(argv, env)
        times = {k: [] for k in cmds}
        names = list(cmds)
        for i in range(args.runs):
            order = names if i % 2 == 0 else names[::-1]
            for k in order:
                times[k].append(spawn_time(cmds[k], env))
    finally:
        subprocess.run([retie, "lab", "down", "bench"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    res = {k: {"median_ms": round(statistics.median(v), 2), "p90_ms": round(pct(v, 0.9), 2)}
           for k, v in times.items()}
    res["lab_minus_none_median_ms"] = round(res["--net lab"]["median_ms"] - res["no network"]["median_ms"], 2)
    res["runs"] = args.runs
    if args.json:
        print(json.dumps(res))
        return
    print(f"{'mode':<12} {'median':>9} {'p90':>9}")
    for k in names:
        print(f"{k:<12} {res[k]['median_ms']:>7.2f}ms {res[k]['p90_ms']:>7.2f}ms")
    print(f"lab mode adds {res['lab_minus_none_median_ms']:.2f} ms to the median ({args.runs} runs each)")


if __name__ == "__main__":
    main()
