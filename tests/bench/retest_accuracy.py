#!/usr/bin/env python3
"""Verdict accuracy of `retie retest` over the fifteen demo cases.

Five findings (lab/findings/*.json) x three builds of the demo lab
(vulnerable, --fixed, --partial). The right verdict: still_open on the
vulnerable build, fixed on --fixed, still_open on --partial (where only a
variant of the reported payload works).

With a model configured (RETIE_PROVIDER, RETIE_MODEL, and RETIE_BASE_URL
or the provider's default; a key through --api-key-env), each case is a
real retest with --yes, and the table says correct / wrong / inconclusive
per case, with steps and tokens. Without one it runs scripted cases (a
careful retester's commands, the same as tests/it/retest.rs) and says
plainly that it measured the plumbing, not a model.

Runs in a throwaway HOME; starts and stops its own labs. Asserts no time.

usage: tests/bench/retest_accuracy.py [--retie PATH] [--max-steps N] [--json]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRUTH = {"vuln": "still_open", "fixed": "fixed", "partial": "still_open"}
BUILDS = {"vuln": [], "fixed": ["--fixed"], "partial": ["--partial"]}

LOGIN = ("c=$(curl -s -i -d user=alice -d password=alice-pw http://LAB:8080/login"
         " | sed -n 's/^Set-Cookie: session=\\([0-9a-f]*\\).*/\\1/p'); ")
# (original, variant, what each shows on: vuln, fixed orig, fixed variant,
# partial orig, partial variant) -- the scripted retester's knowledge.
SCRIPTED = {
    "F1-sqli-login": (
        "curl -s --data-urlencode \"user=admin' OR 1=1--\" --data password=x http://LAB:8080/login",
        "curl -s --data-urlencode \"user=admin' or 1=1--\" --data password=x http://LAB:8080/login",
        ["Welcome admin", "login failed", "login failed", "login failed", "Welcome admin"]),
    "F2-path-traversal": (
        "curl -s 'http://LAB:8080/download?file=" + "../" * 16 + "etc/passwd'",
        "curl -s 'http://LAB:8080/download?file=" + "....//" * 16 + "etc/passwd'",
        ["root:x:0:0", "forbidden", "no such file", "no such file", "root:x:0:0"]),
    "F3-idor-record": (
        LOGIN + "curl -s -b session=$c 'http://LAB:8080/record?id=1'",
        LOGIN + "curl -s -b session=$c 'http://LAB:8080/export?id=1'",
        ["FLAG-IDOR-7731", "not your record", "not your record", "not your record", "FLAG-IDOR-7731"]),
    "F4-reflected-xss": (
        "curl -s -G --data-urlencode 'q=<script>alert(1)</script>' http://LAB:8080/search",
        "curl -s -G --data-urlencode 'q=\" autofocus onfocus=\"alert(1)' http://LAB:8080/search",
        ["<script>alert(1)</script>", "&lt;script&gt;", "&quot; autofocus", "&lt;script&gt;",
         "onfocus=\"alert(1)\""]),
    "F5-command-injection": (
        "curl -s -G --data-urlencode 'file=report.txt; id' http://LAB:8080/diag",
        "curl -s -G --data-urlencode 'file=report.txt$(id)' http://LAB:8080/diag",
        ["uid=", "no such file", "no such file", "invalid file name", "uid="]),
}


def call(name, args):
    return {"name": name, "arguments": args}


def script(fid, build, lab):
    orig, var, shows = SCRIPTED[fid]
    orig, var = orig.replace("LAB", lab), var.replace("LAB", lab)
    run = lambda c: call("run_command", {"command": c, "rationale": "probe", "timeout_seconds": 20})
    if build == "vuln":
        return [{"tool_calls": [run(orig)]},
                {"tool_calls": [call("conclude", {"status": "still_open", "rationale": "the reported payload works",
                                                  "evidence": [{"output_id": "o1", "excerpt": shows[0]}]})]}]
    i = 1 if build == "fixed" else 3
    works = build == "partial"
    return [{"tool_calls": [run(orig)]},
            {"tool_calls": [run(var)]},
            {"tool_calls": [call("conclude", {
                "status": "still_open" if works else "fixed",
                "rationale": "a variant works" if works else "neither the payload nor a variant works",
                "evidence": [{"output_id": "o2", "excerpt": shows[i + 1]}]})]}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--retie", default=os.path.join(ROOT, "target/x86_64-unknown-linux-musl/debug/retie"))
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    model = os.environ.get("RETIE_PROVIDER") and os.environ.get("RETIE_MODEL")
    home = tempfile.mkdtemp(prefix="retie-accuracy-")
    env = dict(os.environ, HOME=home, XDG_STATE_HOME=os.path.join(home, "state"),
               XDG_CONFIG_HOME=os.path.join(home, "config"), RETIE_LEDGER=os.path.join(home, "ledger.db"))
    findings = sorted(glob.glob(os.path.join(ROOT, "lab/findings/*.json")))
    rows = []
    try:
        for build, flags in BUILDS.items():
            lab = "acc-" + build
            subprocess.run([a.retie, "lab", "up", "--demo", "--name", lab] + flags, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            try:
                for f in findings:
                    fid = os.path.basename(f)[:-5]
                    argv = [a.retie, "retest", f, "--lab", lab, "--yes", "--json",
                            "--max-steps", str(a.max_steps)]
                    if not model:
                        sp = os.path.join(home, "script.json")
                        with open(sp, "w") as fh:
                            json.dump({"turns": script(fid, build, lab)}, fh)
                        argv += ["--provider", "script", "--script", sp]
                    p = subprocess.run(argv, env=env, capture_output=True, text=True)
                    try:
                        out = json.loads(p.stdout.strip().splitlines()[-1])
                    except (ValueError, IndexError):
                        out = {"status": "error", "message": p.stderr.strip().splitlines()[-1:]}
                    got = out.get("status")
                    v = out.get("verdict") or {}
                    tokens = (out.get("tokens_in") or 0) + (out.get("tokens_out") or 0)
                    rows.append({
                        "finding": fid, "build": build, "truth": TRUTH[build], "verdict": got,
                        "result": ("correct" if got == TRUTH[build] else
                                   "inconclusive" if got == "inconclusive" else "wrong"),
                        "steps": v.get("steps"), "commands": len(v.get("commands", [])),
                        "session": out.get("session"), "tokens": tokens,
                    })
            finally:
                subprocess.run([a.retie, "lab", "down", lab], env=env, stdout=subprocess.DEVNULL)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    what = ("a model: %s %s" % (os.environ.get("RETIE_PROVIDER"), os.environ.get("RETIE_MODEL")) if model
            else "the plumbing, not a model (scripted cases: no RETIE_PROVIDER/RETIE_MODEL set)")
    if a.json:
        print(json.dumps({"measured": what, "cases": rows}))
        return
    print("measured: " + what)
    print("| finding | build | truth | verdict | result | steps | commands | tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print("| %(finding)s | %(build)s | %(truth)s | %(verdict)s | %(result)s | %(steps)s | %(commands)s"
              " | %(tokens)s |" % r)
    n = {k: sum(1 for r in rows if r["result"] == k) for k in ("correct", "wrong", "inconclusive")}
    print("\ncorrect %(correct)d, wrong %(wrong)d, inconclusive %(inconclusive)d of 15" % n)
    sys.exit(0)


if __name__ == "__main__":
    main()
