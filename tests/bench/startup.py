#!/usr/bin/env python3
"""Side-by-side start-up benchmark: `true` under retie and under bubblewrap.

Rows:
- `retie-runtime`: the runtime alone, through `retie __sandbox-helper`
  (the entry the agent uses; the caller records in the ledger around it).
  This is the figure comparable to bubblewrap, which records nothing.
- `retie-runtime-small`: the same through `retie-sandbox-helper`, the
  helper alone (`cargo build --release --workspace` builds it beside
  retie), when it is there.
- `cli-direct`: `retie sandbox exec --workspace-mode direct`: the same
  sandbox through the chokepoint (policy evaluated, session, proposal,
  decision and intent durably recorded before, outcome and close after).
- `cli-overlay-unchanged`: `retie sandbox exec -- true` in overlay mode
  (the default): the overlay, an empty changeset, every step recorded.
- `cli-overlay-write`: a command that writes one file, whose change is
  recorded (the exact changes, durably, right before), applied
  crash-safely with its pre-image kept, and its outcome recorded.
- `bwrap-write`: its anchor: bubblewrap running the same command, which
  writes the file straight into the bound workspace (ADR 0410). The
  `bwrap` row runs `true`, the anchor of every other row.
Lab mode has its own benchmark (tests/bench/lab.py).

Both run in the same loop, interleaved and alternating which goes first, so
machine noise hits them alike. Prints medians, p90s and the ratio, plus the
peak RSS of retie's supervising helper process. Nothing here asserts a time:
machines are noisy; the figures are for README and humans.

A/B rows for the runtime's own work (ADR 0006):
- `--compare PATH` (repeatable): the runtime alone through another retie
  binary (same request), in the same loop: `retie-runtime@NAME`;
- `--without ITEM` (repeatable): the runtime alone with ITEM (a path of the
  profile's ro/ro_optional/tmpfs lists or a name of its etc list) left out
  of the request: `retie-runtime-without-ITEM`, what that part of the
  system view costs;
- `--runtime-only`: leave out the CLI rows (a shorter loop for A/B).

usage: tests/bench/startup.py [--retie PATH] [--runs N] [--json]
         [--compare PATH]... [--without ITEM]... [--runtime-only]
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


def high_pipe():
    """A pipe whose ends sit above the fds the file actions set (3, 4), so
    one dup2 cannot overwrite the source of another; both inheritable (a
    dup2 onto itself would keep CLOEXEC)."""
    import fcntl
    r, w = os.pipe()
    hr, hw = fcntl.fcntl(r, fcntl.F_DUPFD, 100), fcntl.fcntl(w, fcntl.F_DUPFD, 100)
    os.set_inheritable(hr, True)
    os.set_inheritable(hw, True)
    os.close(r)
    os.close(w)
    return hr, hw


def spawn_time(argv, cwd, env=None, request=None):
    """Wall time of one fork+exec+wait of argv, in ms; checks it succeeded.
    With `request`, it is written to a pipe the child reads on fd 4 (the
    helper's protocol), inside the timed span."""
    t0 = time.perf_counter_ns()
    actions = [
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 3, "/dev/null", os.O_WRONLY, 0),
    ]
    r = w = None
    if request is not None:
        r, w = high_pipe()
        actions.append((os.POSIX_SPAWN_DUP2, r, 4))
        actions.append((os.POSIX_SPAWN_CLOSE, r))
        actions.append((os.POSIX_SPAWN_CLOSE, w))
    pid = os.posix_spawn(argv[0], argv, env or os.environ, file_actions=actions) if cwd is None else None
    if pid is None:
        raise RuntimeError("cwd unsupported")
    if request is not None:
        os.close(r)
        os.write(w, request)
        os.close(w)
    _, status = os.waitpid(pid, 0)
    dt = (time.perf_counter_ns() - t0) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(argv)}")
    return dt


def bwrap_argv(bwrap, ws, command):
    """bubblewrap with comparable isolation: every namespace, a new session,
    parent-death kill, read-only /usr (and the merged-/usr links), proc,
    dev, tmpfs /tmp, the workspace bound read-write."""
    return [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", ws, ws, "--chdir", ws] + command


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retie", default=os.path.join(os.path.dirname(__file__), "../../target/x86_64-unknown-linux-musl/release/retie"))
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compare", action="append", default=[], metavar="PATH")
    ap.add_argument("--without", action="append", default=[], metavar="ITEM")
    ap.add_argument("--runtime-only", action="store_true")
    args = ap.parse_args()

    retie = os.path.abspath(args.retie)
    bwrap = shutil.which("bwrap")
    if not os.access(retie, os.X_OK):
        sys.exit(f"no retie binary at {retie}: run `cargo build --release` first")
    if not bwrap:
        sys.exit("bubblewrap is not installed (apt-get install bubblewrap): the comparison needs it")
    true = shutil.which("true")

    ws = tempfile.mkdtemp(prefix="retie-bench-")
    ws2 = tempfile.mkdtemp(prefix="retie-bench-w-")
    ws3 = tempfile.mkdtemp(prefix="retie-bench-bw-")
    state = tempfile.mkdtemp(prefix="retie-bench-state-")
    # The helper's request: the sandbox spec, as retie itself serializes it.
    request = subprocess.run([retie, "__sandbox-helper", "--print-request", "--workspace", ws, "--", true],
                             check=True, capture_output=True).stdout
    envs = {}
    for k in ("cli-direct", "cli-overlay-unchanged", "cli-overlay-write"):
        envs[k] = dict(os.environ, XDG_STATE_HOME=state, XDG_CONFIG_HOME=state, XDG_DATA_HOME=state)
    try:
        cmds = {
            # the runtime alone, direct workspace bind as bubblewrap does
            "retie-runtime": [retie, "__sandbox-helper", "--reply-fd", "3"],
            # the CLI: the same sandbox through the chokepoint
            "cli-direct": [retie, "sandbox", "exec", "-w", ws, "--workspace-mode", "direct", "--", "true"],
            "cli-overlay-unchanged": [retie, "sandbox", "exec", "-w", ws, "--", "true"],
            "cli-overlay-write": [retie, "sandbox", "exec", "-w", ws2, "--", "sh", "-c", "date +%s%N > f"],
            "bwrap": bwrap_argv(bwrap, ws, ["true"]),
            # the same command as cli-overlay-write, writing the bound
            # workspace in place
            "bwrap-write": bwrap_argv(bwrap, ws3, ["sh", "-c", "date +%s%N > f"]),
            "true": [true],
        }
        reqs = {"retie-runtime": request}
        # The helper alone (src/bin/retie-sandbox-helper.rs), built beside retie: what
        # `retie_runtime::helper::beside` hands a caller that spawns helpers.
        small = os.path.join(os.path.dirname(retie), "retie-sandbox-helper")
        if os.access(small, os.X_OK):
            cmds["retie-runtime-small"] = [small, "__sandbox-helper", "--reply-fd", "3"]
            reqs["retie-runtime-small"] = request
        if args.runtime_only:
            for k in ("cli-direct", "cli-overlay-unchanged", "cli-overlay-write", "bwrap-write"):
                del cmds[k]
        for other in args.compare:
            name = f"retie-runtime@{os.path.basename(other)}"
            cmds[name] = [os.path.abspath(other), "__sandbox-helper", "--reply-fd", "3"]
            reqs[name] = request
        for item in args.without:
            spec = json.loads(request)
            fs = spec["profile"]["filesystem"]
            for key in ("ro", "ro_optional", "etc", "tmpfs"):
                fs[key] = [e for e in fs.get(key, []) if e != item]
            name = f"retie-runtime-without-{item}"
            cmds[name] = cmds["retie-runtime"]
            reqs[name] = json.dumps(spec).encode()
        for name, argv in cmds.items():  # warm up, and fail early
            for _ in range(5):
                spawn_time(argv, None, envs.get(name), reqs.get(name))
        times = {k: [] for k in cmds}
        order = list(cmds)
        for i in range(args.runs):
            for name in (order if i % 2 == 0 else reversed(order)):
                times[name].append(spawn_time(cmds[name], None, envs.get(name), reqs.get(name)))

        rss = []
        for _ in range(20):
            r, w = high_pipe()
            qr, qw = high_pipe()
            pid = os.posix_spawn(retie, [retie, "__sandbox-helper", "--reply-fd", "3"], os.environ,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, w, 3),
                                               (os.POSIX_SPAWN_DUP2, qr, 4),
                                               (os.POSIX_SPAWN_CLOSE, w), (os.POSIX_SPAWN_CLOSE, qr),
                                               (os.POSIX_SPAWN_CLOSE, r), (os.POSIX_SPAWN_CLOSE, qw),
                                               (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)])
            os.close(w)
            os.close(qr)
            os.write(qw, request)
            os.close(qw)
            reply = b""
            while chunk := os.read(r, 65536):
                reply += chunk
            os.close(r)
            os.waitpid(pid, 0)
            rss.append(json.loads(reply)["outcome"]["helper_max_rss_kib"])
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(ws2, ignore_errors=True)
        shutil.rmtree(ws3, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    summary = {
        "runs": args.runs,
        "uid": os.geteuid(),
        "median_ms": {k: round(v, 3) for k, v in med.items()},
        "p90_ms": {k: round(pct(v, 0.9), 3) for k, v in times.items()},
        "ratio_retie_over_bwrap": round(med["retie-runtime"] / med["bwrap"], 3),
        "ratio_small_helper_over_bwrap": round(med["retie-runtime-small"] / med["bwrap"], 3) if "retie-runtime-small" in med else None,
        "ratios_over_bwrap": {k: round(med[k] / med["bwrap"], 3) for k in med if k not in ("bwrap", "true")},
        "ratio_write_over_bwrap_write": round(med["cli-overlay-write"] / med["bwrap-write"], 3) if "bwrap-write" in med else None,
        "ledger_cost_ms": round(med["cli-direct"] - med["retie-runtime"], 3) if "cli-direct" in med else None,
        "helper_peak_rss_kib": max(rss),
    }
    if args.json:
        print(json.dumps(summary))
        return
    print(f"start-up of `true` (one file written in the *-write rows), {args.runs} interleaved runs each, uid {os.geteuid()}")
    print(f"{'':24}{'median ms':>12}{'p90 ms':>10}{'x bwrap':>10}")
    for k in cmds:
        print(f"{k:24}{med[k]:>12.3f}{pct(times[k], 0.9):>10.3f}{med[k] / med['bwrap']:>10.2f}")
    print(f"ratio retie-runtime/bwrap (median): {summary['ratio_retie_over_bwrap']:.3f}  (target <= 0.8)")
    if summary["ratio_small_helper_over_bwrap"] is not None:
        print(f"ratio retie-runtime-small/bwrap (median): {summary['ratio_small_helper_over_bwrap']:.3f}  (target <= 0.8)")
    if summary["ledger_cost_ms"] is not None:
        print(f"cli-overlay-write over bwrap-write (the same command): {summary['ratio_write_over_bwrap_write']:.2f}")
        print(f"targets: cli-overlay-unchanged <= 1.3x bwrap, cli-overlay-write <= 2.0x bwrap-write")
        print(f"the chokepoint and ledger add {summary['ledger_cost_ms']:.2f} ms to the runtime (cli-direct, median)")
    print(f"retie helper peak RSS: {max(rss)} KiB ({max(rss) / 1024:.1f} MiB; target < 8 MiB)")


if __name__ == "__main__":
    main()
