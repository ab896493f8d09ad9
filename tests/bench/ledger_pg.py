#!/usr/bin/env python3
"""The ledger on SQLite and on PostgreSQL side by side (issue 32, ADR
0460): durable appends per second through the one append path (chain,
SHA-256, ed25519), then `verify` of a large ledger on each, every
signature included.

    python3 tests/bench/ledger_pg.py [--appends N] [--verify N] [--runs R]

It builds ledger/examples/pg_bench.rs (release), starts a throwaway
PostgreSQL cluster of its own (initdb into a temporary directory, a unix
socket only, fsync and synchronous_commit at their durable defaults; as
uid 65534 through setpriv when run as root), runs the example R times
with fresh databases (SQLite files under --dir, /var/tmp by default: the
same disk as the cluster when that is /var/tmp too), and prints the median
of each figure as Markdown. The server binaries come from RETIE_PG_BINDIR,
else /usr/lib/postgresql/*/bin (Debian's `postgresql`).
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bindir():
    d = os.environ.get("RETIE_PG_BINDIR")
    if d:
        return d
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        sys.exit("no PostgreSQL server: apt-get install postgresql, or set RETIE_PG_BINDIR")
    return os.path.dirname(found[-1])


def as_server(argv):
    if os.geteuid() == 0:
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] + argv
    return argv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--verify", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "retie-ledger",
                    "--example", "pg_bench"], cwd=ROOT, check=True)
    exe = None
    for d in ("target/x86_64-unknown-linux-musl/release/examples",
              "target/release/examples"):
        p = os.path.join(ROOT, d, "pg_bench")
        if os.path.exists(p):
            exe = p
            break
    if exe is None:
        sys.exit("pg_bench was not built")
    bins = bindir()
    top = tempfile.mkdtemp(prefix="retie-pg-bench-", dir=a.dir)
    os.chmod(top, 0o755)
    data, sock = os.path.join(top, "data"), os.path.join(top, "s")
    os.mkdir(sock)
    if os.geteuid() == 0:
        for p in (top, sock):
            os.chown(p, 65534, 65534)
    env_c = dict(os.environ, LC_ALL="C")
    subprocess.run(as_server([os.path.join(bins, "initdb"), "-D", data, "-U", "retie",
                              "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True, env=env_c)
    log = open(os.path.join(top, "server.log"), "w")
    server = subprocess.Popen(as_server([os.path.join(bins, "postgres"), "-D", data, "-k", sock,
                                         "-c", "listen_addresses="]),
                              stdout=log, stderr=log, env=env_c)
    try:
        for _ in range(600):
            if os.path.exists(os.path.join(sock, ".s.PGSQL.5432")):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        host = sock.replace("/", "%2F")
        cfg = tempfile.mkdtemp(prefix="retie-ledger-bench-cfg-")
        env = dict(os.environ, XDG_CONFIG_HOME=cfg, XDG_STATE_HOME=cfg, HOME=cfg)
        env.pop("RETIE_CHECKPOINT_DIR", None)
        env.pop("RETIE_CHECKPOINT_COPY", None)
        results = []
        for i in range(a.runs):
            dbs = [f"a{i}", f"v{i}"]
            for db in dbs:
                subprocess.run([os.path.join(bins, "createdb"), "-h", sock, "-U", "retie", db],
                               check=True)
            work = tempfile.mkdtemp(prefix="retie-ledger-bench-", dir=a.dir)
            out = subprocess.run(
                [exe, "--postgres", f"postgres://retie@{host}/{dbs[0]}",
                 "--verify-url", f"postgres://retie@{host}/{dbs[1]}",
                 "--appends", str(a.appends), "--verify", str(a.verify), "--dir", work],
                capture_output=True, text=True, env=env, check=False)
            shutil.rmtree(work, ignore_errors=True)
            if out.returncode != 0:
                sys.exit(f"bench failed: {out.stderr}")
            r = json.loads(out.stdout)
            print(f"run {i + 1}: {json.dumps(r)}", file=sys.stderr)
            results.append(r)
        shutil.rmtree(cfg, ignore_errors=True)
    finally:
        server.send_signal(2)
        server.wait()
        shutil.rmtree(top, ignore_errors=True)

    def med(k):
        return statistics.median(r[k] for r in results)

    print(f"| what (median of {a.runs} runs) | SQLite | PostgreSQL |")
    print("| --- | --- | --- |")
    print(f"| durable appends (one commit each; chain + SHA-256 + ed25519) | "
          f"{med('sqlite_appends_per_s'):,.0f} /s | {med('postgres_appends_per_s'):,.0f} /s |")
    print(f"| verify {a.verify:,} entries (hash, chain, every signature, checkpoint) | "
          f"{med('sqlite_verify_s'):.2f} s = {med('sqlite_verify_entries_per_s'):,.0f} /s | "
          f"{med('postgres_verify_s'):.2f} s = {med('postgres_verify_entries_per_s'):,.0f} /s |")
    print(f"| verdicts | {results[0]['sqlite_verdict']} | {results[0]['postgres_verdict']} |")
    print(f"| cores | {results[0]['cores']} | |")


if __name__ == "__main__":
    main()
