#!/usr/bin/env python3
"""Dispatch overhead of the agent's tool calls (everything but the model and
the command): a scripted session of N write calls and one of N bash `true`
calls, each minus a session with one call, per call; the bash figure minus
`retie sandbox exec -- true` start-up measured the same way. Medians of R
repetitions. Prints figures; asserts nothing.

    python3 tests/bench/agent.py [path/to/retie]
"""
import json, os, statistics, subprocess, sys, tempfile, time

RETIE = sys.argv[1] if len(sys.argv) > 1 else "target/x86_64-unknown-linux-gnu/release/retie"
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


def sandbox_start(tmp):
    ws = tempfile.mkdtemp(dir=tmp)
    ts = []
    for _ in range(R * 4):
        t = time.perf_counter()
        subprocess.run([RETIE, "sandbox", "exec", "-w", ws, "--", "true"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000


with tempfile.TemporaryDirectory() as tmp:
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    ENV = dict(os.environ, HOME=home, XDG_STATE_HOME=home + "/state", XDG_CONFIG_HOME=home + "/config",
               XDG_DATA_HOME=home + "/data")
    ENV.pop("RETIE_LEDGER", None)
    w = per_call(tmp, lambda i: {"name": "write", "arguments": {"path": f"f{i}.txt", "content": f"{i}\n"}})
    b = per_call(tmp, lambda i: {"name": "bash", "arguments": {"command": "true"}})
    s = sandbox_start(tmp)
    print(f"write, per call (dispatch + record + pre-image + write): median {w:.2f} ms")
    print(f"bash `true`, per call:                                  median {b:.2f} ms")
    print(f"`retie sandbox exec -- true` (process + sandbox + ledger):  median {s:.2f} ms")
    print(f"bash overhead beyond a whole `sandbox exec` process:      {b - s:+.2f} ms (an upper bound on dispatch overhead: sandbox exec pays its own process start)")
