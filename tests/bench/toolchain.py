#!/usr/bin/env python3
"""Side-by-side benchmark: `true` in a Rust project, `--toolchain auto` vs
`--toolchain none`.

Runs `retie sandbox exec --workspace-mode direct --toolchain auto|none --
true` in a fresh workspace holding a `Cargo.toml`, with this user's real
home and toolchains (rustup in ~/.cargo and ~/.rustup), interleaved and
alternating which goes first, so machine noise hits both alike. The
difference of the medians is what detection, the never-bound scan, the
scratch tmpfs, the binds (detached trees when root) and the covers cost
(the issue's target: at most 1 ms). Asserts no time.

usage: tests/bench/toolchain.py [--retie PATH] [--runs N] [--json]
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
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    retie = os.path.abspath(args.retie)
    if not os.access(retie, os.X_OK):
        sys.exit(f"no retie binary at {retie}: run `cargo build --release` first")
    true = shutil.which("true")
    tmp = tempfile.mkdtemp(prefix="retie-bench-toolchain-")
    # The ledger on tmpfs when there is one: its fsyncs (4 to 70 ms on a
    # busy disk) are the same for both rows and would bury the difference.
    state = tempfile.mkdtemp(prefix="retie-bench-toolchain-state-",
                             dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(state, "state"),
               XDG_CONFIG_HOME=os.path.join(state, "config"))
    ws = os.path.join(tmp, "ws")
    os.makedirs(ws)
    with open(os.path.join(ws, "Cargo.toml"), "w") as f:
        f.write('[package]\nname = "bench"\nversion = "0.1.0"\nedition = "2021"\n')
    explain = subprocess.run([retie, "sandbox", "explain", "--json", "-w", ws], env=env,
                             capture_output=True, text=True)
    if explain.returncode != 0:
        sys.exit(f"retie sandbox explain failed:\n{explain.stderr}")
    plan = json.loads(explain.stdout)["toolchain"]
    if not plan["binds"]:
        sys.exit("no toolchain detected for a Rust project: is rustup installed in this home?")
    try:
        base = [retie, "sandbox", "exec", "-w", ws, "--workspace-mode", "direct"]
        cmds = {"none": base + ["--toolchain", "none", "--", true],
                "auto": base + ["--toolchain", "auto", "--", true]}
        for argv in cmds.values():  # warm-up, and fail early
            for _ in range(5):
                spawn_time(argv, env)
        times = {k: [] for k in cmds}
        names = list(cmds)
        for i in range(args.runs):
            for k in (names if i % 2 == 0 else names[::-1]):
                times[k].append(spawn_time(cmds[k], env))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    res = {k: {"median_ms": round(statistics.median(v), 3), "p90_ms": round(pct(v, 0.9), 3)}
           for k, v in times.items()}
    res["auto_minus_none_median_ms"] = round(res["auto"]["median_ms"] - res["none"]["median_ms"], 3)
    res["runs"] = args.runs
    res["uid"] = os.geteuid()
    res["binds"] = len(plan["binds"])
    res["scratch"] = len(plan["scratch"])
    res["hidden"] = len(plan["hidden"])
    if args.json:
        print(json.dumps(res))
        return
    print(f"`true` in a Rust project, {args.runs} interleaved runs each, uid {os.geteuid()}; "
          f"auto = {res['binds']} binds, {res['scratch']} scratch, {res['hidden']} covers")
    print(f"{'--toolchain':<12} {'median':>9} {'p90':>9}")
    for k in names:
        print(f"{k:<12} {res[k]['median_ms']:>7.3f}ms {res[k]['p90_ms']:>7.3f}ms")
    print(f"toolchain binds add {res['auto_minus_none_median_ms']:.3f} ms to the median (target <= 1 ms)")


if __name__ == "__main__":
    main()
