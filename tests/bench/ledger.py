#!/usr/bin/env python3
"""Ledger benchmark: durable appends per second, the ledger (chaining and
signing included) side by side with a bare SQLite insert of the same row
size and the same durability (WAL, synchronous=FULL, one IMMEDIATE
transaction per insert), on the same disk; then verification speed of a
large ledger, every signature included.

    cargo build --release
    python3 tests/bench/ledger.py [--bin PATH] [--appends N] [--verify N] [--runs R]

It runs the hidden `retie __ledger bench` R times (fresh databases under
/var/tmp each time) and prints the median of each figure, as Markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_bin():
    for d in ("target/x86_64-unknown-linux-musl/release", "target/release"):
        p = os.path.join(ROOT, d, "retie")
        if os.path.exists(p):
            return p
    return os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/retie")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=default_bin())
    ap.add_argument("--appends", type=int, default=3000)
    ap.add_argument("--verify", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    # The bench signs with a throwaway key; keep the real config dir (and
    # its user key, which verify would trust) and state dir (the verifier's
    # memory) out of it.
    import tempfile
    cfg = tempfile.mkdtemp(prefix="retie-ledger-bench-cfg-")
    env = dict(os.environ, XDG_CONFIG_HOME=cfg, XDG_STATE_HOME=cfg)
    results = []
    for i in range(a.runs):
        out = subprocess.run(
            [a.bin, "__ledger", "bench", "--appends", str(a.appends),
             "--verify-entries", str(a.verify), "--dir", a.dir],
            capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            sys.exit(f"bench failed: {out.stderr}")
        r = json.loads(out.stdout)
        print(f"run {i + 1}: {json.dumps(r)}", file=sys.stderr)
        results.append(r)

    def med(k):
        return statistics.median(r[k] for r in results)

    bare, ledger = med("bare_appends_per_s"), med("ledger_appends_per_s")
    print(f"| what | median of {a.runs} runs |")
    print("| --- | --- |")
    print(f"| bare SQLite insert (WAL, synchronous=FULL, 1 tx each) | {bare:,.0f} /s |")
    print(f"| ledger append (chain + SHA-256 + ed25519 sign, same durability) | {ledger:,.0f} /s |")
    print(f"| ratio ledger / bare (median of the per-run ratios) | {med('ratio'):.2f} |")
    print(f"| verify {a.verify:,} entries (hash, chain, every signature, delegations, checkpoint) | {med('verify_s'):.2f} s = {med('verify_entries_per_s'):,.0f} entries/s |")
    print(f"| cores | {results[0]['cores']} |")


if __name__ == "__main__":
    main()
