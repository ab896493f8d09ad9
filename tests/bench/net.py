#!/usr/bin/env python3
"""Side-by-side benchmark of the proxied network (ADR 0310).

1. Start-up: `retie sandbox exec --workspace-mode direct -- true` with no
   network, with `--net allow:pypi.test:PORT` and with `--net lab`,
   interleaved (rotating which goes first), so machine noise hits all alike.
2. A 20 MB download from a loopback http.server: curl on the host, direct,
   against curl inside `--net allow:` through the proxy (curl's own
   `time_total`, the transfer alone), interleaved.
Asserts no time; the figures are for docs/performance.md.

usage: tests/bench/net.py [--retie PATH] [--runs N] [--downloads N] [--json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from lab import SERVER, pct, spawn_time  # noqa: E402

HTTP = ("import http.server,socketserver,os,sys\n"
        "os.chdir(sys.argv[1])\n"
        "class H(http.server.SimpleHTTPRequestHandler):\n"
        "    def log_message(self,*a): pass\n"
        "s=socketserver.ThreadingTCPServer(('127.0.0.1',0),H)\n"
        "print(s.server_address[1],flush=True)\n"
        "s.serve_forever()\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retie", default=os.path.join(os.path.dirname(__file__),
                    "../../target/x86_64-unknown-linux-musl/release/retie"))
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--downloads", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    retie = os.path.abspath(args.retie)
    if not os.access(retie, os.X_OK):
        sys.exit(f"no retie binary at {retie}: run `cargo build --release` first")
    true = shutil.which("true")
    tmp = tempfile.mkdtemp(prefix="retie-bench-net-")
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(tmp, "state"),
               RETIE_NET_HOSTS="pypi.test=127.0.0.1")
    ws = os.path.join(tmp, "ws")
    files = os.path.join(tmp, "files")
    os.makedirs(ws)
    os.makedirs(files)
    with open(os.path.join(files, "big.bin"), "wb") as f:
        f.write(os.urandom(20 * 1024 * 1024))
    srv = subprocess.Popen(["python3", "-c", HTTP, files], stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline())
    up = subprocess.run([retie, "lab", "up", "--name", "benchnet", "--port", "8080", "--json",
                         "--", "python3", "-c", SERVER], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        srv.kill()
        sys.exit(f"retie lab up failed:\n{up.stderr}")
    allow = f"allow:pypi.test:{port}"
    try:
        base = [retie, "sandbox", "exec", "-w", ws, "--workspace-mode", "direct"]
        cmds = {"no network": base + ["--", true],
                "--net allow:": base + ["--net", allow, "--", true],
                "--net lab": base + ["--net", "lab:benchnet", "--", true]}
        for argv in cmds.values():  # warm-up
            for _ in range(5):
                spawn_time(argv, env)
        times = {k: [] for k in cmds}
        names = list(cmds)
        for i in range(args.runs):
            k0 = i % len(names)
            for k in names[k0:] + names[:k0]:
                times[k].append(spawn_time(cmds[k], env))
        curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{time_total}"]
        dl = {"direct (host)": [], "through the proxy": []}
        for i in range(args.downloads):
            d = subprocess.run(curl + [f"http://127.0.0.1:{port}/big.bin"],
                               capture_output=True, text=True, check=True)
            p = subprocess.run(base + ["--net", allow, "--"] + curl + [f"http://pypi.test:{port}/big.bin"],
                               env=env, capture_output=True, text=True, check=True)
            dl["direct (host)"].append(float(d.stdout) * 1000)
            dl["through the proxy"].append(float(p.stdout) * 1000)
    finally:
        subprocess.run([retie, "lab", "down", "benchnet"], env=env, capture_output=True)
        srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    res = {k: {"median_ms": round(statistics.median(v), 2), "p90_ms": round(pct(v, 0.9), 2)}
           for k, v in list(times.items()) + list(dl.items())}
    res["runs"] = args.runs
    res["downloads"] = args.downloads
    if args.json:
        print(json.dumps(res))
        return
    print(f"{'case':<20} {'median':>10} {'p90':>10}")
    for k in list(times) + list(dl):
        print(f"{k:<20} {res[k]['median_ms']:>8.2f}ms {res[k]['p90_ms']:>8.2f}ms")


if __name__ == "__main__":
    main()
