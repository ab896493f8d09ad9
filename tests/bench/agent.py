#!/usr/bin/env python3
"""Dispatch overhead of the agent's tool calls: everything but the model and
the command itself.

- write: a scripted session of N write calls minus one of a single call,
  per call (the whole call: the chokepoint, the ledger, the pre-image and
  the crash-safe write with its fsyncs).
- bash: the same with N bash `true` calls (sandboxed in overlay mode, in
  process), minus the sandbox's own start-up. That start-up is measured in
  the same run as the runtime alone through `retie __sandbox-helper`
  (R) minus the helper's own process start, estimated by `retie --version`
  (V): bash overhead = per call - (R - V).

Medians of R repetitions. Prints figures; asserts nothing. Set TMPDIR to a
tmpfs to see the CPU part alone (fsyncs there cost nothing).

    python3 tests/bench/agent.py [path/to/retie]
"""
import json, os, statistics, subprocess, sys, tempfile, time

RETIE = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/x86_64-unknown-linux-musl/release/retie")
N, R = 20, 5


def session(tmp, calls):
    ws = tempfile.mkdtemp(dir=tmp)
    script = os.path.join(tmp, "s.json")
    with open(script, "w") as f:
        json.dump({"turns": [{"tool_calls": [c]} for c in calls] + [{"text": "done"}]}, f)
    t = time.perf_counter()
    subprocess.run([RETIE, "run", ws, "--provider", "script", "--script", script,
                    "--json", "-p", "bench", "--max-turns", str(len(calls) + 2)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - t


def per_call(tmp, make):
    many = statistics.median(session(tmp, [make(i) for i in range(N)]) for _ in range(R))
    one = statistics.median(session(tmp, [make(0)]) for _ in range(R))
    return (many - one) / (N - 1) * 1000


def spawn_ms(argv, stdin=None):
    t = time.perf_counter()
    subprocess.run(argv, input=stdin, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=ENV)
    return (time.perf_counter() - t) * 1000


def sandbox_start(tmp):
    """The runtime alone through the helper, and the helper's bare process
    start, interleaved."""
    ws = tempfile.mkdtemp(dir=tmp)
    req = subprocess.run([RETIE, "__sandbox-helper", "--print-request", "--workspace", ws, "--", "/usr/bin/true"],
                         check=True, capture_output=True, env=ENV).stdout
    rt, ver = [], []
    for _ in range(R * 8):
        r, w = os.pipe()
        null = os.open("/dev/null", os.O_WRONLY)
        t = time.perf_counter()
        # The request on a pipe, the reply to /dev/null.
        p = subprocess.Popen([RETIE, "__sandbox-helper", "--reply-fd", str(null), "--request-fd", str(r)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=ENV, pass_fds=(r, null))
        os.close(r)
        os.close(null)
        os.write(w, req)
        os.close(w)
        if p.wait() != 0:
            raise SystemExit("the helper failed")
        rt.append((time.perf_counter() - t) * 1000)
        ver.append(spawn_ms([RETIE, "--version"]))
    return statistics.median(rt), statistics.median(ver)


with tempfile.TemporaryDirectory() as tmp:
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    ENV = dict(os.environ, HOME=home, XDG_STATE_HOME=home + "/state", XDG_CONFIG_HOME=home + "/config",
               XDG_DATA_HOME=home + "/data")
    ENV.pop("RETIE_LEDGER", None)
    w = per_call(tmp, lambda i: {"name": "write", "arguments": {"path": f"f{i}.txt", "content": f"{i}\n"}})
    b = per_call(tmp, lambda i: {"name": "bash", "arguments": {"command": "true"}})
    rt, ver = sandbox_start(tmp)
    print(f"state and workspaces under {tmp}")
    print(f"write, per call (dispatch + record + pre-image + crash-safe write): median {w:.2f} ms  (target <= 5)")
    print(f"bash `true`, per call:                                             median {b:.2f} ms")
    print(f"the runtime alone through the helper (R):                          median {rt:.2f} ms")
    print(f"the helper's process start, `retie --version` (V):                 median {ver:.2f} ms")
    print(f"bash dispatch overhead, per call - (R - V):                               {b - (rt - ver):.2f} ms  (target <= 5)")
