//! `retie retest` end to end (issue 28), with the scripted model, against
//! the demo lab's three builds, through real commands in real lab-mode
//! sandboxes: the right verdict on each build for every flaw, the
//! partial build called still_open only after a variant ran, a
//! conclusion citing nothing or citing an output without its excerpt
//! refused, the budget ending in inconclusive, an overrun killed, and a
//! broken findings file starting nothing. The ledger verifies after each.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::{json, Value};

use crate::harness::*;
use crate::lab::Lab;

/// One flaw: its finding, the reported payload and a variant as curl
/// command lines (`LAB` is the lab's host name), and what each prints on
/// each build: (vulnerable, fixed original, fixed variant, partial
/// original, partial variant).
struct Flaw {
    finding: &'static str,
    original: &'static str,
    variant: &'static str,
    shows: [&'static str; 5],
}

const LOGIN_AS_ALICE: &str = "c=$(curl -s -i -d user=alice -d password=alice-pw http://LAB:8080/login | sed -n 's/^Set-Cookie: session=\\([0-9a-f]*\\).*/\\1/p'); ";

fn flaws() -> Vec<Flaw> {
    vec![
        Flaw {
            finding: "F1-sqli-login",
            original: "curl -s --data-urlencode \"user=admin' OR 1=1--\" --data password=x http://LAB:8080/login",
            variant: "curl -s --data-urlencode \"user=admin' or 1=1--\" --data password=x http://LAB:8080/login",
            shows: ["Welcome admin", "login failed", "login failed", "login failed", "Welcome admin"],
        },
        Flaw {
            finding: "F2-path-traversal",
            original: "curl -s 'http://LAB:8080/download?file=../../../../../../../../../../../../../../../../etc/passwd'",
            variant: "curl -s 'http://LAB:8080/download?file=....//....//....//....//....//....//....//....//....//....//....//....//....//....//....//....//etc/passwd'",
            shows: ["root:x:0:0", "forbidden", "no such file", "no such file", "root:x:0:0"],
        },
        Flaw {
            finding: "F3-idor-record",
            original: "curl -s -b session=$c 'http://LAB:8080/record?id=1'",
            variant: "curl -s -b session=$c 'http://LAB:8080/export?id=1'",
            shows: ["FLAG-IDOR-7731", "not your record", "not your record", "not your record", "FLAG-IDOR-7731"],
        },
        Flaw {
            finding: "F4-reflected-xss",
            original: "curl -s -G --data-urlencode 'q=<script>alert(1)</script>' http://LAB:8080/search",
            variant: "curl -s -G --data-urlencode 'q=\" autofocus onfocus=\"alert(1)' http://LAB:8080/search",
            shows: [
                "No results for <script>alert(1)</script>",
                "&lt;script&gt;",
                "&quot; autofocus",
                "&lt;script&gt;",
                "onfocus=\"alert(1)\"",
            ],
        },
        Flaw {
            finding: "F5-command-injection",
            original: "curl -s -G --data-urlencode 'file=report.txt; id' http://LAB:8080/diag",
            variant: "curl -s -G --data-urlencode 'file=report.txt$(id)' http://LAB:8080/diag",
            shows: ["uid=", "no such file", "no such file", "invalid file name", "uid="],
        },
    ]
}

fn command(f: &Flaw, which: &str, lab: &str) -> String {
    let line = if which == "original" {
        f.original
    } else {
        f.variant
    };
    let pre = if f.finding == "F3-idor-record" {
        LOGIN_AS_ALICE
    } else {
        ""
    };
    format!("{pre}{line}").replace("LAB", lab)
}

fn run_call(cmd: &str, why: &str) -> Value {
    json!({"name": "run_command", "arguments": {"command": cmd, "rationale": why, "timeout_seconds": 20}})
}

fn conclude(status: &str, why: &str, evidence: Value) -> Value {
    json!({"name": "conclude", "arguments": {"status": status, "rationale": why, "evidence": evidence}})
}

/// The script of a careful retester on `build` (vuln, fixed, partial).
fn script_for(f: &Flaw, build: &str, lab: &str) -> Value {
    let orig = command(f, "original", lab);
    let var = command(f, "variant", lab);
    match build {
        // The original reproduces; a first conclusion citing nothing is
        // refused, the agent cites the output and is done.
        "vuln" => json!([
            {"tool_calls": [run_call(&orig, "replay the reported payload")]},
            {"expect": ["output o1", f.shows[0]],
             "tool_calls": [conclude("still_open", "the reported payload works", json!([]))]},
            {"expect": ["cites no output"],
             "tool_calls": [conclude("still_open", "the reported payload works", json!([{"output_id": "o1", "excerpt": f.shows[0]}]))]},
            {"text": "still open"}
        ]),
        // The original and a variant both fail: fixed, citing both.
        "fixed" => json!([
            {"tool_calls": [run_call(&orig, "replay the reported payload")]},
            {"expect": ["output o1", f.shows[1]],
             "tool_calls": [run_call(&var, "a variant, in case only the reported payload is blocked")]},
            {"expect": ["output o2", f.shows[2]],
             "tool_calls": [conclude("fixed", "neither the reported payload nor its variant works", json!([
                 {"output_id": "o1", "excerpt": f.shows[1]},
                 {"output_id": "o2", "excerpt": f.shows[2]}]))]},
            {"text": "fixed"}
        ]),
        // The original fails; calling it still open on that output is
        // refused (the excerpt is not in it); the variant works.
        "partial" => json!([
            {"tool_calls": [run_call(&orig, "replay the reported payload")]},
            {"expect": ["output o1", f.shows[3]],
             "tool_calls": [conclude("still_open", "claimed from the original alone", json!([{"output_id": "o1", "excerpt": f.shows[0]}]))]},
            {"expect": ["does not contain the excerpt"],
             "tool_calls": [run_call(&var, "the reported payload is blocked; try a variant")]},
            {"expect": ["output o2", f.shows[4]],
             "tool_calls": [conclude("still_open", "a variant of the payload still works", json!([{"output_id": "o2", "excerpt": f.shows[4]}]))]},
            {"text": "still open"}
        ]),
        other => panic!("no build {other}"),
    }
}

fn put(s: &Scratch, name: &str, text: &str) -> PathBuf {
    let p = s.root.path().join(name);
    std::fs::write(&p, text).expect("write");
    s.give(&p);
    p
}

fn finding_file(s: &Scratch, id: &str) -> PathBuf {
    let src = format!("{}/lab/findings/{id}.json", env!("CARGO_MANIFEST_DIR"));
    put(
        s,
        &format!("{id}.json"),
        &std::fs::read_to_string(src).expect("finding"),
    )
}

fn retest(s: &Scratch, files: &[&Path], script: &Path, extra: &[&str]) -> Output {
    let mut c = s.retie();
    c.arg("retest")
        .args(files)
        .args(["--provider", "script", "--script"])
        .arg(script)
        .args(["--json", "--yes"])
        .args(extra)
        .env_remove("RETIE_PROVIDER")
        .stdin(Stdio::null());
    c.output().expect("run retie retest")
}

fn result(o: &Output) -> Value {
    let line = stdout(o).lines().last().unwrap_or("").to_string();
    serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\n{}", stdout(o), stderr(o)))
}

/// The errors of `doc` against the vendored OASIS SARIF 2.1.0 JSON schema
/// (tests/fixtures/sarif), by python3's `jsonschema` (draft-04, as the
/// schema declares). Fails loudly, naming the fix, when the validator is
/// not installed: the check is never skipped.
fn sarif_schema_errors(doc: &Value) -> Vec<String> {
    const CHECK: &str = r#"
import json, sys
try:
    import jsonschema
except ImportError:
    print("NO-JSONSCHEMA")
    sys.exit(3)
schema = json.load(open(sys.argv[1]))
doc = json.load(sys.stdin)
v = jsonschema.Draft4Validator(schema)
for e in sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path)):
    print("$." + ".".join(str(p) for p in e.absolute_path) + ": " + e.message)
"#;
    let schema = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/sarif/sarif-schema-2.1.0.json"
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", CHECK, schema])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 validates SARIF against its schema: install python3");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(doc.to_string().as_bytes())
            .expect("write the SARIF log");
    }
    let o = child.wait_with_output().expect("python3");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        !out.contains("NO-JSONSCHEMA"),
        "python3 has no jsonschema module: install it (`pip install jsonschema` or `apt-get install python3-jsonschema`)"
    );
    assert!(
        o.status.success(),
        "the SARIF check failed to run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines().map(str::to_string).collect()
}

/// `doc` is a valid SARIF 2.1.0 log, and the check would see it if it
/// were not: the same log with `baselineState` broken is refused.
#[track_caller]
fn assert_valid_sarif(doc: &Value, ctx: &str) {
    let errors = sarif_schema_errors(doc);
    assert!(
        errors.is_empty(),
        "{ctx}: retie report --sarif is not valid SARIF 2.1.0:\n{}\n{doc}",
        errors.join("\n")
    );
    let mut broken = doc.clone();
    broken["runs"][0]["results"][0]["baselineState"] = json!("gone");
    let errors = sarif_schema_errors(&broken);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("baselineState") && e.contains("gone")),
        "{ctx}: the schema check let a broken baselineState through: {errors:?}"
    );
}

fn verify(s: &Scratch, ctx: &str) {
    let v = s.retie().arg("verify").output().expect("verify");
    assert_code(&v, 0, &format!("retie verify after {ctx}"));
}

#[test]
fn a_scripted_retest_reaches_the_right_verdict_on_each_build_for_every_flaw() {
    for leg in legs() {
        let s = Scratch::new(leg);
        for (build, flags, want) in [
            ("vuln", &[][..], "still_open"),
            ("fixed", &["--fixed"][..], "fixed"),
            ("partial", &["--partial"][..], "still_open"),
        ] {
            let mut args = vec!["--demo"];
            args.extend_from_slice(flags);
            let _lab = Lab::up(&s, build, &args);
            for f in flaws() {
                let ctx = format!("{leg:?} {build} {}", f.finding);
                let file = finding_file(&s, f.finding);
                let script = put(
                    &s,
                    "script.json",
                    &json!({"turns": script_for(&f, build, build)}).to_string(),
                );
                let o = retest(&s, &[&file], &script, &["--lab", build]);
                assert_code(&o, 0, &ctx);
                let r = result(&o);
                assert_eq!(r["status"], want, "{ctx}: {r}\n{}", stderr(&o));
                assert_eq!(r["finding"], f.finding, "{ctx}");
                assert_eq!(
                    r["origin_map"],
                    json!([{"from": "http://lab", "to": format!("http://{build}:8080")}]),
                    "{ctx}: the mapping is shown and recorded"
                );
                assert!(
                    stderr(&o).contains(&format!("origin http://lab -> http://{build}:8080")),
                    "{ctx}: {}",
                    stderr(&o)
                );
                let v = &r["verdict"];
                assert_eq!(v["decided_by"], "agent", "{ctx}: {v}");
                let commands = v["commands"].as_array().expect("commands");
                match build {
                    "vuln" => assert_eq!(commands.len(), 1, "{ctx}"),
                    _ => {
                        // The variant ran, and (on --partial) the verdict
                        // rests on it, not on the original payload.
                        assert_eq!(commands.len(), 2, "{ctx}: {v}");
                        assert!(
                            commands[1]["command"]
                                .as_str()
                                .is_some_and(|c| c == command(&f, "variant", build)),
                            "{ctx}: {v}"
                        );
                    }
                }
                if build == "partial" {
                    assert_eq!(v["evidence"][0]["output_id"], "o2", "{ctx}: {v}");
                }
                verify(&s, &ctx);
            }
        }
    }
}

#[test]
fn the_step_budget_ends_in_inconclusive_and_an_overrun_is_killed() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let _lab = Lab::up(&s, "budget", &["--demo"]);
        let file = finding_file(&s, "F1-sqli-login");
        let script = put(
            &s,
            "script.json",
            &json!({"turns": [
                {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 30; echo never", "rationale": "a slow probe", "timeout_seconds": 600}}]},
                {"expect": ["output o1", "timed out after 1 s", "the whole sandbox was killed"],
                 "tool_calls": [run_call("curl -s http://budget:8080/", "look around")]},
                {"expect": ["output o2", "retie demo lab"],
                 "tool_calls": [run_call("curl -s http://budget:8080/", "look again")]},
                {"text": "never reached"}
            ]})
            .to_string(),
        );
        let o = retest(
            &s,
            &[&file],
            &script,
            &[
                "--lab",
                "budget",
                "--max-steps",
                "2",
                "--command-ceiling",
                "1",
            ],
        );
        assert_code(&o, 3, "budget");
        let r = result(&o);
        assert_eq!(r["status"], "inconclusive", "{r}");
        assert_eq!(r["verdict"]["rationale"], "budget exhausted", "{r}");
        assert_eq!(r["verdict"]["decided_by"], "retie", "{r}");
        assert_eq!(r["verdict"]["commands"][0]["timed_out"], true, "{r}");
        assert!(
            pids_with("echo never").is_empty(),
            "{leg:?}: the overrun command survived"
        );
        verify(&s, "budget");
    }
}

#[test]
fn a_broken_findings_file_or_a_missing_lab_starts_nothing() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/findings");
    for leg in legs() {
        let s = Scratch::new(leg);
        let script = put(&s, "script.json", r#"{"turns": []}"#);
        for (name, says) in [
            ("broken-truncated.sarif", "not valid JSON"),
            (
                "broken-no-location.sarif",
                "$.runs[0].results[1]: field `locations`: no location",
            ),
            ("broken-line.jsonl", "line 3, column"),
            ("broken-unknown.json", "retie reads retie-finding/1"),
        ] {
            let file = put(
                &s,
                name,
                &std::fs::read_to_string(format!("{fixtures}/{name}")).expect("fixture"),
            );
            // A good file beside the broken one: nothing starts either.
            let good = finding_file(&s, "F1-sqli-login");
            let o = retest(&s, &[&good, &file], &script, &["--lab", "nolab"]);
            assert_code(&o, 125, name);
            let err = stderr(&o);
            assert!(
                err.contains(name) && err.contains(says),
                "{leg:?} {name}: {err}"
            );
            assert!(
                !err.contains("retest of"),
                "{leg:?} {name}: a session started: {err}"
            );
        }
        let good = finding_file(&s, "F1-sqli-login");
        let o = retest(&s, &[&good], &script, &["--lab", "nolab"]);
        assert_code(&o, 125, "no lab");
        assert!(
            stderr(&o).contains("no lab named \"nolab\""),
            "{}",
            stderr(&o)
        );
        let o = retest(&s, &[&good], &script, &["--lab", "nolab", "--id", "F9"]);
        assert_code(&o, 125, "no such id");
        assert!(stderr(&o).contains("F1-sqli-login"), "{}", stderr(&o));
        // Nothing reached the ledger.
        let ledger = s.home.join(".local/state/retie/ledger.db");
        if ledger.exists() {
            let l = s.retie().args(["log", "--json"]).output().expect("log");
            assert!(!stdout(&l).contains("retie retest"), "{}", stdout(&l));
        }
    }
}

#[test]
fn report_renders_a_retest_from_the_ledger_alone_as_markdown_json_and_sarif() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let f1 = &flaws()[0];
        let mut sessions = Vec::new();
        for (build, flags, script_build, extra) in [
            ("vuln", &[][..], "vuln", &[][..]),
            ("fixed", &["--fixed"][..], "fixed", &[][..]),
            ("vuln", &[][..], "fixed", &["--max-steps", "1"][..]),
        ] {
            let mut args = vec!["--demo"];
            args.extend_from_slice(flags);
            let _lab = Lab::up(&s, build, &args);
            let file = finding_file(&s, f1.finding);
            let script = put(
                &s,
                "script.json",
                &json!({"turns": script_for(f1, script_build, build)}).to_string(),
            );
            let mut all = vec!["--lab", build];
            all.extend_from_slice(extra);
            let o = retest(&s, &[&file], &script, &all);
            let r = result(&o);
            sessions.push(r["session"].as_str().expect("session").to_string());
            // From the ledger alone: the findings file is gone.
            std::fs::remove_file(&file).expect("rm finding");
        }
        let report = |id: &str, fmt: &str| -> Output {
            let o = s
                .retie()
                .args(["report", id, fmt])
                .output()
                .expect("report");
            assert_code(&o, 0, &format!("{leg:?} report {fmt}"));
            o
        };
        for (id, status, baseline) in [
            (&sessions[0], "still_open", "unchanged"),
            (&sessions[1], "fixed", "absent"),
            (&sessions[2], "inconclusive", "unchanged"),
        ] {
            let j: Value = serde_json::from_str(&stdout(&report(id, "--json"))).expect("json");
            assert_eq!(j["verdict"]["status"], status, "{j}");
            assert_eq!(j["finding"]["id"], "F1-sqli-login", "{j}");
            let sarif: Value =
                serde_json::from_str(&stdout(&report(id, "--sarif"))).expect("sarif json");
            assert_eq!(sarif["version"], "2.1.0");
            assert_valid_sarif(&sarif, &format!("{leg:?} {status}"));
            let res = &sarif["runs"][0]["results"][0];
            assert_eq!(res["baselineState"], baseline, "{sarif}");
            assert_eq!(
                res["ruleId"],
                sarif["runs"][0]["tool"]["driver"]["rules"][0]["id"]
            );
            assert!(res["message"]["text"]
                .as_str()
                .is_some_and(|t| t.contains(status)));
            assert_eq!(
                res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                "http://lab/login"
            );
            assert_eq!(
                res["properties"]["retieInconclusive"] == json!(true),
                status == "inconclusive",
                "{sarif}"
            );
            let md = stdout(&report(id, "--markdown"));
            assert!(md.contains(&format!("## Verdict: {status}")), "{md}");
            assert!(md.contains("origin `http://lab` retested as"), "{md}");
        }
        let md = stdout(&report(&sessions[1], "--markdown"));
        assert!(
            md.contains("Commands run")
                && md.contains("user=admin' or 1=1--")
                && md.contains("login failed"),
            "{md}"
        );
        let o = s
            .retie()
            .args(["report", "nosuch"])
            .output()
            .expect("report");
        assert_code(&o, 125, "no such session");
    }
}

/// No terminal, no `--yes`: each proposed command suspends the session
/// (exit 5); `retie approve`, `retie deny --reason` and `retie approve
/// --edit` decide it and `retie retest --resume` carries on. The refusal
/// reaches the agent with its reason, the edited command runs as edited,
/// a conclusion cites an output from before a suspension, and nothing
/// runs twice.
#[test]
fn a_suspended_retest_is_decided_and_resumed_with_nothing_run_twice() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let _lab = Lab::up(&s, "susp", &["--demo", "--partial"]);
        let file = finding_file(&s, "F1-sqli-login");
        let count = "echo ran >> count; ";
        let orig = format!("{count}{}", command(&flaws()[0], "original", "susp"));
        let var = format!("{count}{}", command(&flaws()[0], "variant", "susp"));
        let script = put(
            &s,
            "script.json",
            &json!({"turns": [
                {"tool_calls": [run_call(&orig, "replay the reported payload")]},
                {"expect": ["output o1", "login failed"],
                 "tool_calls": [run_call("curl -s http://susp:8080/ # a dull one", "look around")]},
                {"expect": ["try the lower-case keyword"],
                 "tool_calls": [run_call("echo a proposal the person will edit", "a variant")]},
                {"expect": ["edited your call", "output o2", "Welcome admin"],
                 "tool_calls": [conclude("still_open", "the lower-case variant logs in as admin; the original does not", json!([
                     {"output_id": "o1", "excerpt": "login failed"},
                     {"output_id": "o2", "excerpt": "Welcome admin"}]))]},
                {"text": "still open"}
            ]})
            .to_string(),
        );
        let first = {
            let mut c = s.retie();
            c.arg("retest")
                .arg(&file)
                .args(["--lab", "susp", "--provider", "script", "--script"])
                .arg(&script)
                .arg("--json")
                .env_remove("RETIE_PROVIDER")
                .stdin(Stdio::null());
            c.output().expect("retest")
        };
        assert_code(&first, 5, &format!("{leg:?} suspended"));
        let r = result(&first);
        assert_eq!(r["status"], "suspended", "{r}");
        let sid = r["session"].as_str().expect("session").to_string();
        let resume = || {
            let mut c = s.retie();
            c.args(["retest", "--resume", &sid, "--script"])
                .arg(&script)
                .arg("--json")
                .env_remove("RETIE_PROVIDER")
                .stdin(Stdio::null());
            c.output().expect("resume")
        };
        let decide = |args: &[&str]| {
            let o = s.retie().args(args).output().expect("decide");
            assert_code(&o, 0, &format!("{leg:?} {args:?}"));
        };
        decide(&["approve", &sid]);
        let o = resume();
        assert_code(&o, 5, &format!("{leg:?} suspended again"));
        decide(&["deny", &sid, "--reason", "try the lower-case keyword"]);
        let o = resume();
        assert_code(&o, 5, &format!("{leg:?} suspended a third time"));
        decide(&["approve", &sid, "--edit", &var]);
        let o = resume();
        assert_code(&o, 0, &format!("{leg:?} concluded"));
        let r = result(&o);
        assert_eq!(r["status"], "still_open", "{r}\n{}", stderr(&o));
        let commands = r["verdict"]["commands"].as_array().expect("commands");
        assert_eq!(commands.len(), 2, "{r}");
        assert_eq!(
            commands[1]["command"],
            var.as_str(),
            "the edit ran as edited: {r}"
        );
        // Each approved command ran once: the scratch directory's count.
        let scratch = std::fs::read_dir(s.home.join(".local/state/retie/retest"))
            .expect("retest dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("count").exists())
            .expect("a scratch directory with the count");
        assert_eq!(
            std::fs::read_to_string(scratch.join("count")).expect("count"),
            "ran\nran\n",
            "{leg:?}: a command ran twice or not at all"
        );
        verify(&s, "resume");
    }
}

/// The same flow over the wire: a local OpenAI-compatible server (streamed
/// tool-call deltas) instead of the script provider. The process talks
/// HTTP, so its lab sandboxes start from the sandbox helper.
#[test]
fn an_openai_compatible_server_drives_a_retest_through_the_helper() {
    use crate::agent::{openai_server, tool_call_turn};
    for leg in legs() {
        let s = Scratch::new(leg);
        let _lab = Lab::up(&s, "wire", &["--demo"]);
        let file = finding_file(&s, "F1-sqli-login");
        let cmd = command(&flaws()[0], "original", "wire");
        let (url, seen) = openai_server(vec![
            tool_call_turn(
                "c1",
                "run_command",
                &json!({"command": cmd, "rationale": "replay", "timeout_seconds": 20}).to_string(),
            ),
            tool_call_turn(
                "c2",
                "conclude",
                &json!({"status": "still_open", "rationale": "the payload works", "evidence": [{"output_id": "o1", "excerpt": "Welcome admin"}]}).to_string(),
            ),
        ]);
        let o = {
            let mut c = s.retie();
            c.arg("retest")
                .arg(&file)
                .args([
                    "--lab",
                    "wire",
                    "--provider",
                    "openai",
                    "--model",
                    "m",
                    "--base-url",
                    &url,
                ])
                .args(["--json", "--yes"])
                .env_remove("RETIE_PROVIDER")
                .stdin(Stdio::null());
            c.output().expect("retest over the wire")
        };
        assert_code(&o, 0, &format!("{leg:?} over the wire"));
        let r = result(&o);
        assert_eq!(r["status"], "still_open", "{r}");
        let bodies = seen.lock().expect("lock").clone();
        assert_eq!(bodies.len(), 2, "{bodies:?}");
        assert!(
            bodies[0].contains("\"run_command\"")
                && bodies[0].contains("\"conclude\"")
                && !bodies[0].contains("\"write\""),
            "the retest tool set was offered: {}",
            bodies[0]
        );
        assert!(bodies[1].contains("Welcome admin"), "{}", bodies[1]);
        verify(&s, "over the wire");
    }
}

/// `retie retest ... --lab NAME` on a terminal (no --yes, no --json).
fn retest_on_a_terminal(s: &Scratch, file: &Path, script: &Path, lab: &str) -> crate::pty::Pty {
    let mut c = s.retie();
    c.arg("retest")
        .arg(file)
        .args(["--lab", lab, "--provider", "script", "--script"])
        .arg(script)
        .env_remove("RETIE_PROVIDER")
        .env("NO_COLOR", "1");
    crate::pty::Pty::spawn(c)
}

/// Every entry of the ledger: (session, actor, kind, payload).
fn entries(s: &Scratch) -> Vec<(String, String, String, Value)> {
    let db = rusqlite::Connection::open(s.home.join(".local/state/retie/ledger.db"))
        .expect("open the ledger");
    let mut st = db
        .prepare("SELECT session, actor, kind, payload FROM entries ORDER BY seq")
        .expect("query");
    st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or_default(),
        ))
    })
    .expect("rows")
    .map(|r| r.expect("row"))
    .collect()
}

fn report(s: &Scratch, session: &str, format: &str) -> String {
    let o = s
        .retie()
        .args(["report", session, format])
        .stdin(Stdio::null())
        .output()
        .expect("report");
    assert_code(&o, 0, &format!("report {format}"));
    stdout(&o)
}

/// The one retest session's id in the ledger.
fn only_session(s: &Scratch) -> String {
    let all: Vec<String> = entries(s)
        .into_iter()
        .filter(|(_, _, k, p)| k == "session_opened" && p.get("retest").is_some())
        .map(|(id, ..)| id)
        .collect();
    assert_eq!(all.len(), 1, "one retest session: {all:?}");
    all[0].clone()
}

/// Issue 28, at the operator's prompt: `!CMD` runs the operator's own
/// command in a lab sandbox through the chokepoint, recorded with the
/// person as its actor, its output shown and given to the agent with the
/// operator's next message (free text, which steers); an "always" answer
/// at the approval prompt lets the same command run unasked for the rest
/// of the session (a grant in the ledger); `/verdict` records the
/// operator's adjudication beside the agent's verdict, which stands; the
/// report shows both. A second session ended with `/end` before any
/// verdict has none, and its report says it was ended by the operator.
#[test]
fn the_operator_runs_commands_steers_adjudicates_and_ends_at_the_retest_prompt() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let _lab = Lab::up(&s, "op", &["--demo"]);
        let f = &flaws()[0];
        let file = finding_file(&s, f.finding);
        let orig = command(f, "original", "op");
        let var = command(f, "variant", "op");
        let script = put(
            &s,
            "script.json",
            &json!({"turns": [
                {"text": "Which payload first?"},
                {"expect_user": ["The operator ran these commands", "output o1", "Welcome admin", "The operator says: try the lower-case variant"],
                 "tool_calls": [run_call(&var, "the operator asked for the variant")]},
                {"expect": ["output o2", "Welcome admin"],
                 "tool_calls": [run_call(&var, "once more, to be sure")]},
                {"expect": ["output o3"],
                 "tool_calls": [conclude("still_open", "the operator's payload and the variant both log in", json!([
                     {"output_id": "o1", "excerpt": "Welcome admin"},
                     {"output_id": "o2", "excerpt": "Welcome admin"}]))]},
                {"text": "still open"}
            ]})
            .to_string(),
        );
        let mut t = retest_on_a_terminal(&s, &file, &script, "op");
        t.expect("Which payload first?");
        t.expect("retest> ");
        t.line(&format!("!{orig}"));
        t.expect("output o1 (exit code 0)");
        t.expect("Welcome admin");
        t.expect("retest> ");
        t.line("try the lower-case variant");
        t.expect("retie asks:");
        t.expect("approve?");
        t.line("a");
        t.expect("granted for this session");
        // The same command again runs unasked: the next thing shown is
        // the verdict, not another approval prompt.
        t.expect("verdict for F1-sqli-login: still_open");
        assert_eq!(
            t.output().matches("approve?").count(),
            1,
            "the grant covers the second run:\n{}",
            t.output()
        );
        t.expect("retest> ");
        t.line("and now?");
        t.expect("the retest has its verdict");
        t.expect("retest> ");
        t.line("/verdict still_open confirmed by hand");
        t.expect("recorded beside the agent's verdict still_open");
        t.expect("retest> ");
        t.line("/end");
        t.expect("closed");
        let st = t.wait();
        assert!(
            st.success(),
            "{leg:?}: /end ends cleanly: {st}\n{}",
            t.output()
        );
        verify(&s, "the operator's session");

        let id = only_session(&s);
        let es = entries(&s);
        // The operator's command: proposed and intended by the person.
        let theirs: Vec<_> = es
            .iter()
            .filter(|(_, _, k, p)| {
                (k == "action_proposed" && p["origin"] == "person (operator)")
                    || (k == "intent" && p["decided_by"] == "person (operator)")
            })
            .collect();
        assert_eq!(theirs.len(), 2, "{leg:?}: {theirs:?}");
        for (_, actor, kind, p) in &theirs {
            assert_eq!(
                actor, "person",
                "{leg:?}: the operator's {kind} is theirs: {p}"
            );
        }
        assert!(
            es.iter().any(|(_, a, k, p)| k == "action_proposed"
                && a == "agent"
                && p["origin"] == "agent"),
            "{leg:?}: the model's proposals stay the agent's"
        );
        // The grant, and the second run decided by it.
        assert!(
            es.iter().any(|(_, a, k, _)| k == "grant" && a == "person"),
            "{leg:?}: a grant"
        );
        assert!(
            es.iter().any(|(_, _, k, p)| k == "intent"
                && p["decided_by"]
                    .as_str()
                    .is_some_and(|b| b.starts_with("person (grant #"))),
            "{leg:?}: the second run went by the grant"
        );
        let r: Value = serde_json::from_str(&report(&s, &id, "--json")).expect("report json");
        assert_eq!(r["verdict"]["status"], "still_open", "{r}");
        assert_eq!(r["verdict"]["decided_by"], "agent", "{r}");
        assert_eq!(r["verdict"]["commands"][0]["operator"], true, "{r}");
        assert_eq!(r["verdict"]["commands"][0]["command"], orig, "{r}");
        assert_eq!(r["adjudications"][0]["status"], "still_open", "{r}");
        assert_eq!(r["adjudications"][0]["reason"], "confirmed by hand", "{r}");
        assert_eq!(r["adjudications"][0]["agent_status"], "still_open", "{r}");
        let md = report(&s, &id, "--markdown");
        assert!(md.contains("## Verdict: still_open"), "{md}");
        assert!(
            md.contains("## Operator's adjudication: still_open"),
            "{md}"
        );
        assert!(md.contains("the operator's"), "{md}");
        let sarif: Value = serde_json::from_str(&report(&s, &id, "--sarif")).expect("sarif");
        assert_valid_sarif(&sarif, "adjudicated");

        // /end before any verdict: none is invented.
        let s2 = Scratch::new(leg);
        let _lab2 = Lab::up(&s2, "op2", &["--demo"]);
        let file = finding_file(&s2, f.finding);
        let script = put(
            &s2,
            "script.json",
            &json!({"turns": [{"text": "Shall I start?"}]}).to_string(),
        );
        let mut t = retest_on_a_terminal(&s2, &file, &script, "op2");
        t.expect("Shall I start?");
        t.expect("retest> ");
        t.line("/end");
        t.expect("ended by the operator");
        t.expect("closed");
        let st = t.wait();
        assert!(st.success(), "{leg:?}: {st}\n{}", t.output());
        verify(&s2, "the ended session");
        let id = only_session(&s2);
        let r: Value = serde_json::from_str(&report(&s2, &id, "--json")).expect("report json");
        assert!(r["verdict"].is_null(), "{r}");
        assert_eq!(r["ended"]["by"], "operator", "{r}");
        let md = report(&s2, &id, "--markdown");
        assert!(md.contains("ended by operator"), "{md}");
        let sarif: Value = serde_json::from_str(&report(&s2, &id, "--sarif")).expect("sarif");
        assert_eq!(
            sarif["runs"][0]["results"][0]["properties"]["retieEndedBy"],
            "operator"
        );
        assert_valid_sarif(&sarif, "ended");
    }
}

/// Issue 28: SIGKILL of `retie retest` while a command runs in its lab
/// sandbox, then `retie retest --resume`: the sandbox died with it, the
/// session goes on where it stood, the agent is told that call's outcome
/// was not recorded, and nothing runs twice: each command's intent is in
/// the ledger once, each has at most one outcome, and the scratch
/// directory's count shows each command line ran once.
#[test]
fn sigkill_mid_command_then_resume_runs_nothing_twice() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let _lab = Lab::up(&s, "kill", &["--demo"]);
        let file = finding_file(&s, "F1-sqli-login");
        let m = marker();
        let slow = format!("echo ran-2 >> count; sleep 30; echo never-{m}");
        let orig = format!(
            "echo ran-3 >> count; {}",
            command(&flaws()[0], "original", "kill")
        );
        let script = put(
            &s,
            "script.json",
            &json!({"turns": [
                {"tool_calls": [run_call("echo ran-1 >> count; curl -s http://kill:8080/", "look around")]},
                {"expect": ["output o1", "retie demo lab"],
                 "tool_calls": [{"name": "run_command", "arguments": {"command": slow, "rationale": "a slow probe", "timeout_seconds": 60}}]},
                {"expect": ["interrupted while this call ran"],
                 "tool_calls": [run_call(&orig, "replay the reported payload")]},
                {"expect": ["output o2", "Welcome admin"],
                 "tool_calls": [conclude("still_open", "the reported payload logs in as admin", json!([{"output_id": "o2", "excerpt": "Welcome admin"}]))]},
                {"text": "still open"}
            ]})
            .to_string(),
        );
        let mut c = s.retie();
        c.arg("retest")
            .arg(&file)
            .args(["--lab", "kill", "--provider", "script", "--script"])
            .arg(&script)
            .args(["--json", "--yes"])
            .env_remove("RETIE_PROVIDER")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().expect("spawn retest");
        let running = wait_until(60.0, || !pids_with(&format!("never-{m}")).is_empty());
        let _ = child.kill();
        let _ = child.wait();
        assert!(running, "{leg:?}: the slow command never started");
        assert!(
            wait_until(30.0, || pids_with(&format!("never-{m}")).is_empty()),
            "{leg:?}: the sandbox outlived its killed supervisor"
        );
        verify(&s, "after the kill");
        let sid = only_session(&s);
        let o = {
            let mut c = s.retie();
            c.args(["retest", "--resume", &sid, "--script"])
                .arg(&script)
                .args(["--json", "--yes"])
                .env_remove("RETIE_PROVIDER")
                .stdin(Stdio::null());
            c.output().expect("resume")
        };
        assert_code(&o, 0, &format!("{leg:?} resumed"));
        let r = result(&o);
        assert_eq!(r["status"], "still_open", "{r}\n{}", stderr(&o));
        assert_eq!(r["verdict"]["evidence"][0]["output_id"], "o2", "{r}");
        verify(&s, "after the resume");

        let es: Vec<_> = entries(&s).into_iter().filter(|e| e.0 == sid).collect();
        let intents: Vec<(String, String)> = es
            .iter()
            .filter(|e| e.2 == "intent")
            .map(|e| (e.3["tool"].to_string(), e.3["command"].to_string()))
            .collect();
        let mut unique = intents.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            intents.len(),
            "{leg:?}: an intent recorded twice: {intents:?}"
        );
        assert_eq!(
            intents.len(),
            4,
            "{leg:?}: three commands and the conclusion: {intents:?}"
        );
        let mut outcomes: Vec<i64> = es
            .iter()
            .filter(|e| e.2 == "outcome")
            .filter_map(|e| e.3["action"].as_i64())
            .collect();
        let n = outcomes.len();
        outcomes.sort();
        outcomes.dedup();
        assert_eq!(outcomes.len(), n, "{leg:?}: an action with two outcomes");
        let scratch = std::fs::read_dir(s.home.join(".local/state/retie/retest"))
            .expect("retest dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.join("count").exists())
            .expect("a scratch directory with the count");
        assert_eq!(
            std::fs::read_to_string(scratch.join("count")).expect("count"),
            "ran-1\nran-2\nran-3\n",
            "{leg:?}: a command ran twice or not at all"
        );
    }
}
