#!/usr/bin/env python3
"""Side-by-side benchmark: `true` under `--net lab`, with no network, and
under a bare `bwrap --unshare-net`.

Starts a throwaway lab (`retie lab up`, a python3 listener), then runs
`retie sandbox exec --workspace-mode direct [--net lab] -- true` (each
through the chokepoint: classify, gate, record in the ledger, a fresh
sandbox) and the same command under bubblewrap with only a network
namespace of its own (`bwrap --unshare-net --unshare-pid --die-with-parent
--ro-bind / / --dev /dev --proc /proc -- true`: no ledger, no policy, no
seccomp or Landlock) in one loop, interleaved, the order rotating each
round, so machine noise hits all alike. Prints medians, p90s, the
difference of the medians lab - none (issue 30's target: at most 3 ms) and
the ratio of the medians lab / bwrap (issue 28's target: at most 2.0x).
Asserts no time; the figures are for docs/lab.md and docs/retest.md. The
lab is stopped at the end, also on failure. Without bwrap on PATH the
ratio is not measured, and it says so.

usage: tests/bench/lab.py [--retie PATH] [--runs N] [--no-bwrap] [--json]
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
    ap.add_argument("--no-bwrap", action="store_true",
                    help="leave out the bare bwrap --unshare-net run (and the ratio)")
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
        bwrap = None if args.no_bwrap else shutil.which("bwrap")
        if bwrap:
            cmds["bwrap"] = [bwrap, "--unshare-net", "--unshare-pid", "--die-with-parent",
                             "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--", true]
        for argv in cmds.values():  # warm-up
            for _ in range(5):
                spawn_time(argv, env)
        times = {k: [] for k in cmds}
        names = list(cmds)
        for i in range(args.runs):
            r = i % len(names)
            order = names[r:] + names[:r]
            for k in order:
                times[k].append(spawn_time(cmds[k], env))
    finally:
        subprocess.run([retie, "lab", "down", "bench"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    res = {k: {"median_ms": round(statistics.median(v), 2), "p90_ms": round(pct(v, 0.9), 2)}
           for k, v in times.items()}
    res["lab_minus_none_median_ms"] = round(res["--net lab"]["median_ms"] - res["no network"]["median_ms"], 2)
    if "bwrap" in res:
        res["lab_over_bwrap_ratio"] = round(res["--net lab"]["median_ms"] / res["bwrap"]["median_ms"], 2)
    res["runs"] = args.runs
    if args.json:
        print(json.dumps(res))
        return
    print(f"{'mode':<12} {'median':>9} {'p90':>9}")
    for k in names:
        print(f"{k:<12} {res[k]['median_ms']:>7.2f}ms {res[k]['p90_ms']:>7.2f}ms")
    print(f"lab mode adds {res['lab_minus_none_median_ms']:.2f} ms to the median ({args.runs} runs each)")
    if "lab_over_bwrap_ratio" in res:
        print(f"a lab-mode command through the chokepoint costs {res['lab_over_bwrap_ratio']:.2f}x "
              f"a bare bwrap --unshare-net run of it (median over median; target <= 2.0x)")
    else:
        print("no bwrap on PATH (or --no-bwrap): the ratio to a bare bwrap run was not measured "
              "(apt-get install bubblewrap)")


if __name__ == "__main__":
    main()
