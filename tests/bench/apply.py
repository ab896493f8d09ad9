#!/usr/bin/env python3
"""Big changes: retie's overlay run with review, apply and recording, against
bubblewrap running the same command straight on a copy of the workspace, in
one loop. Then retie's undo of each. Prints a markdown table of medians and
ratios, and retie's peak memory (max RSS of the `retie` process and what it waited
for, by wait4).

A second anchor, "overlay alone", runs the same command in a bare overlayfs
mount of a copy of the workspace (`unshare -Urm`, `mount -t overlay` with the
options retie's sandbox uses, `userxattr,volatile`): no walls, no review, no
apply, nothing recorded. It is the floor of any design that runs the command
in an overlay and reviews what it wrote; what retie adds on top is the
last column's ratio.

Scenarios (1 KiB files, 100 per directory):
- created N: the command writes N new files under a new directory;
- modified N: a formatter-like rewrite of N existing files;
- deleted N: the command removes a tree of N files.

Nothing is deleted between the timed runs: each used workspace is moved
to a graveyard removed at the end. On an ext4 without a journal (this
project's VM), the inode allocator skips every inode freed in the last
minute or more (`recently_deleted`), so a run that follows the removal of
10,000 files creates its own files several times slower: whichever side
ran after the script's own clean-up lost, by up to 10x.

Never asserts: machines are noisy. Needs bwrap and /usr/bin/python3.
usage: tests/bench/apply.py [--retie PATH [--retie PATH2]] [--runs N] [--dir DIR] [--only created:1000,modified:1000]
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

PY = "/usr/bin/python3"

# The same command in a bare overlay of the workspace (ws, upper, work,
# script as positional arguments), mounted as retie's sandbox mounts it.
OVERLAY_ALONE = ('mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3,userxattr,volatile" '
                 '"$1" && cd "$1" && exec "$5" -c "$4"')

CREATE = """import os
n={n}
for i in range(n):
    if i % 100 == 0:
        os.makedirs(f"gen/d{{i // 100:04d}}")
    with open(f"gen/d{{i // 100:04d}}/f{{i:06d}}", "wb") as f:
        f.write(b"x" * 1024)
"""

MODIFY = """import os
for d in sorted(os.listdir("tree")):
    for name in sorted(os.listdir(f"tree/{d}")):
        p = f"tree/{d}/{name}"
        with open(p, "rb") as f:
            b = f.read()
        with open(p + ".fmt", "wb") as f:
            f.write(b.replace(b"a", b"b"))
        os.replace(p + ".fmt", p)
"""

DELETE = """import shutil
shutil.rmtree("tree")
"""


def populate(ws, n, salt):
    tree = os.path.join(ws, "tree")
    for i in range(n):
        d = os.path.join(tree, f"d{i // 100:04d}")
        if i % 100 == 0:
            os.makedirs(d)
        # Each file its own content, as a project's files are, and each
        # run its own (`salt`): the pre-images are then 10,000 blobs new to
        # the store every run, not one stored once, nor a run's found
        # stored by the run before it.
        with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
            f.write(f"{salt:08d}:{i:08d}".encode() + b"a" * 1007)


def run(argv, cwd, env=None):
    """Runs argv; returns its time, its output and the peak RSS (KiB) of
    that process and the descendants it waited for (wait4), never of
    another command the script ran."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        o, e = out.read(), err.read()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)[:200]}\n{e.decode()[-2000:]}")
    return dt, subprocess.CompletedProcess(argv, p.returncode, o, e), usage.ru_maxrss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--retie", action="append", help="a retie binary; give it twice "
                    "(say, before and after a change) to time both in the same loop")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="where the workspaces and retie's state go (default: "
                    "the system's temporary directory); one filesystem for both sides")
    ap.add_argument("--only", default="created:1000,created:10000,created:50000,"
                    "modified:1000,modified:10000,deleted:10000")
    args = ap.parse_args()
    retie = [os.path.abspath(r) for r in (args.retie or [os.path.join(
        os.path.dirname(__file__), "../../target/x86_64-unknown-linux-musl/release/retie")])]
    if not shutil.which("bwrap"):
        sys.exit("needs bubblewrap (Debian: bubblewrap)")
    root = tempfile.mkdtemp(prefix="retie-applybench-", dir=args.dir)
    if any(ch in root for ch in ",:"):
        shutil.rmtree(root)
        sys.exit(f"--dir {root}: a ',' or ':' in the path cannot go into overlayfs's mount options")
    # Each binary its own state (a journal and store of its own).
    envs = [dict(os.environ, XDG_STATE_HOME=os.path.join(root, f"state{i}"),
                 XDG_CONFIG_HOME=os.path.join(root, "config")) for i in range(len(retie))]
    if not shutil.which("unshare"):
        sys.exit("needs unshare (util-linux)")
    sides = ["bwrap", "overlay"] + list(range(len(retie)))
    rows = []
    graves = os.path.join(root, "graveyard")
    os.makedirs(graves)

    def bury(path):
        if os.path.exists(path):
            os.rename(path, os.path.join(graves, str(len(os.listdir(graves)))))

    salt = 0
    try:
        for item in args.only.split(","):
            kind, n = item.split(":")
            n = int(n)
            script = {"created": CREATE.format(n=n), "modified": MODIFY, "deleted": DELETE}[kind]
            bw = []
            ov = []
            rt = {i: [] for i in range(len(retie))}
            un = {i: [] for i in range(len(retie))}
            handled = {i: [] for i in range(len(retie))}
            peak = {i: 0 for i in range(len(retie))}
            for r in range(args.runs):
                # Each side first in turn.
                order = sides[r % len(sides):] + sides[:r % len(sides)]
                for who in order:
                    ws = os.path.join(root, f"ws-{who}")
                    bury(ws)
                    os.makedirs(ws)
                    if kind != "created":
                        salt += 1
                        populate(ws, n, salt)
                    subprocess.run(["sync"])
                    if who == "bwrap":
                        dt, _, _ = run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev",
                                        "--proc", "/proc", "--bind", ws, ws, "--chdir", ws,
                                        "--unshare-all", "--die-with-parent",
                                        PY, "-c", script], ws)
                        bw.append(dt)
                    elif who == "overlay":
                        layer = ws + ".layer"
                        bury(layer)
                        os.makedirs(os.path.join(layer, "upper"))
                        os.makedirs(os.path.join(layer, "work"))
                        dt, _, _ = run(["unshare", "-Urm", "sh", "-c", OVERLAY_ALONE, "sh", ws,
                                        os.path.join(layer, "upper"), os.path.join(layer, "work"),
                                        script, PY], ws)
                        ov.append(dt)
                        bury(layer)
                    else:
                        dt, p, rss = run([retie[who], "sandbox", "exec", "--json", "--",
                                          PY, "-c", script], ws, envs[who])
                        status = json.loads(p.stderr.decode().strip().splitlines()[-1])
                        if not status["changes"]["applied"]:
                            sys.exit(f"not applied: {status['changes']}")
                        handled[who].append(status["changes"]["handled_ms"] / 1000)
                        rt[who].append(dt)
                        peak[who] = max(peak[who], rss)
                        du, _, rss = run([retie[who], "undo", "last", "--json"], ws, envs[who])
                        un[who].append(du)
                        peak[who] = max(peak[who], rss)
                    bury(ws)
            b, o = statistics.median(bw), statistics.median(ov)
            for i in range(len(retie)):
                t, u = statistics.median(rt[i]), statistics.median(un[i])
                h = statistics.median(handled[i])
                rows.append((kind, n, i, b, o, t, t / b, h, u, u / h, peak[i]))
                print(f"{kind} {n} [{i}]: bwrap {b:.2f} s, overlay alone {o:.2f} s "
                      f"({o / b:.2f}x), retie {t:.2f} s ({t / b:.2f}x, {t / o:.2f}x the "
                      f"overlay alone), apply {h:.2f} s, undo {u:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"runs per cell: {args.runs}, interleaved (each side first in turn)")
    for i, r in enumerate(retie):
        print(f"- retie [{i}]: {r}")
    print()
    print("| change | files | retie | bubblewrap | overlay alone | retie (run + review + apply + "
          "record) | ratio | of which apply | retie undo | undo / apply | peak RSS | "
          "overlay alone / bubblewrap | retie / overlay alone |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind, n, i, b, o, t, ratio, h, u, uh, pk in rows:
        print(f"| {kind} | {n:,} | [{i}] | {b:.2f} s | {o:.2f} s | {t:.2f} s | {ratio:.2f}x | "
              f"{h:.2f} s | {u:.2f} s | {uh:.2f} | {pk / 1024:.0f} MiB | {o / b:.2f}x | "
              f"{t / o:.2f}x |")


if __name__ == "__main__":
    main()
