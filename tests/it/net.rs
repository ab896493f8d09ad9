//! `--net allow:` and its proxy (ADR 0310): package installs through it,
//! and everything else refused.
//!
//! The "registries" are local stand-ins: a Python http.server on the
//! host's loopback, reached through the `.test` names the resolver
//! override (`RETIE_NET_HOSTS`) maps to 127.0.0.1. Nothing leaves the
//! machine.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use crate::harness::*;

/// A registry stand-in on 127.0.0.1:<free port>, serving `root`; every
/// request's path is appended to `root/requests.log`. `/redirect` answers
/// 302 to `http://unlisted.test:PORT/files/secret`; `/slow` sends 40 MB in
/// 64 KiB pieces, slowly, so a test can cut it off mid-transfer.
const SERVER: &str = r#"
import http.server, socketserver, sys, os, time
root = sys.argv[1]
os.chdir(root)
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        open(os.path.join(root, "requests.log"), "a").write(self.path + "\n")
        port = self.server.server_address[1]
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://unlisted.test:%d/files/secret" % port)
            self.send_header("Content-Length", "0")
            self.end_headers(); return
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", str(40 * 1024 * 1024))
            self.end_headers()
            open(os.path.join(root, "slow-started"), "w").write("1")
            try:
                for _ in range(640):
                    self.wfile.write(b"x" * 65536); self.wfile.flush(); time.sleep(0.05)
            except OSError:
                pass
            return
        return super().do_GET()
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// Build the stand-ins' files: a wheel (a zip with METADATA, WHEEL and
/// RECORD) under a PyPI simple index, and an npm package document with
/// its tarball.
const BUILD: &str = r#"
import base64, hashlib, io, json, os, sys, tarfile, zipfile
root, port = sys.argv[1], int(sys.argv[2])
def b64(d): return base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
files = {
  "tinypkg/__init__.py": b"VALUE = 42\n",
  "tinypkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
  "tinypkg-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: retie-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join("%s,sha256=%s,%d\n" % (n, b64(d), len(d)) for n, d in files.items())
record += "tinypkg-0.1.dist-info/RECORD,,\n"
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    for n, d in files.items(): z.writestr(n, d)
    z.writestr("tinypkg-0.1.dist-info/RECORD", record)
wheel = buf.getvalue()
os.makedirs(os.path.join(root, "files"), exist_ok=True)
os.makedirs(os.path.join(root, "simple/tinypkg"), exist_ok=True)
name = "tinypkg-0.1-py3-none-any.whl"
open(os.path.join(root, "files", name), "wb").write(wheel)
open(os.path.join(root, "files", "secret"), "w").write("secret\n")
open(os.path.join(root, "simple/tinypkg/index.html"), "w").write(
  '<html><body><a href="../../files/%s#sha256=%s">%s</a></body></html>' % (name, hashlib.sha256(wheel).hexdigest(), name))
# npm: a package document and its tarball.
tbuf = io.BytesIO()
with tarfile.open(fileobj=tbuf, mode="w:gz") as t:
    for n, d in {"package/package.json": json.dumps({"name": "tinynpm", "version": "1.0.0", "main": "index.js"}).encode(),
                 "package/index.js": b"module.exports = 42;\n"}.items():
        i = tarfile.TarInfo(n); i.size = len(d); i.mode = 0o644; t.addfile(i, io.BytesIO(d))
tgz = tbuf.getvalue()
os.makedirs(os.path.join(root, "tinynpm/-"), exist_ok=True)
open(os.path.join(root, "tinynpm/-/tinynpm-1.0.0.tgz"), "wb").write(tgz)
integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
doc = {"name": "tinynpm", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": {
  "name": "tinynpm", "version": "1.0.0",
  "dist": {"tarball": "http://npm.test:%d/tinynpm/-/tinynpm-1.0.0.tgz" % port,
           "shasum": hashlib.sha1(tgz).hexdigest(), "integrity": integrity}}}}
os.makedirs(os.path.join(root, "tinynpm"), exist_ok=True)
open(os.path.join(root, "tinynpm/index.html"), "w").write(json.dumps(doc))
"#;

/// The stand-in registry, killed when dropped.
struct Registry {
    child: Child,
    port: u16,
    root: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        let root = tempfile::Builder::new()
            .prefix("retie-reg-")
            .tempdir()
            .expect("tempdir");
        let py = |args: &[&str], script: &str| {
            let mut c = Command::new("/usr/bin/python3");
            c.arg("-c").arg(script).args(args);
            c
        };
        let mut child = py(&[path_str(root.path())], SERVER)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the registry stand-in");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("its port");
        let port: u16 = line.trim().parse().expect("a port");
        let st = py(&[path_str(root.path()), &port.to_string()], BUILD)
            .status()
            .expect("build the packages");
        assert!(st.success(), "building the stand-ins' packages failed");
        Registry { child, port, root }
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(self.root.path().join("requests.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `retie sandbox exec --net NET --json ...` with the resolver override.
fn exec_net(s: &Scratch, net: &str, extra: &[&str], argv: &[&str]) -> Output {
    let mut cmd = s.retie();
    cmd.env(
        "RETIE_NET_HOSTS",
        "pypi.test=127.0.0.1,npm.test=127.0.0.1,unlisted.test=127.0.0.1",
    )
    .args(["sandbox", "exec", "--json", "-w"])
    .arg(&s.ws)
    .arg("--net")
    .arg(net)
    .args(extra)
    .arg("--")
    .args(argv)
    .stdin(Stdio::null());
    cmd.output().expect("run retie")
}

/// The last action's outcome, from `retie replay --json`.
fn last_outcome(s: &Scratch) -> serde_json::Value {
    let o = s
        .retie()
        .args(["replay", "--json"])
        .output()
        .expect("replay");
    assert_code(&o, 0, "replay");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("replay json");
    v["actions"]
        .as_array()
        .and_then(|a| a.last())
        .map(|a| a["outcome"].clone())
        .expect("an action")
}

fn connections(outcome: &serde_json::Value) -> Vec<serde_json::Value> {
    outcome["net"]["connections"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn lines(o: &Output) -> std::collections::BTreeMap<String, String> {
    stdout(o)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn pip_installs_through_the_proxy_into_the_overlay_and_undoes() {
    let reg = Registry::start();
    let port = reg.port.to_string();
    for leg in legs() {
        let s = Scratch::new(leg);
        let index = format!("http://pypi.test:{port}/simple/");
        let o = exec_net(
            &s,
            &format!("allow:pypi.test:{port}"),
            &[],
            &[
                "/usr/bin/python3",
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--no-input",
                "--target",
                "site",
                "--index-url",
                &index,
                "--trusted-host",
                "pypi.test",
                "tinypkg",
            ],
        );
        assert_code(&o, 0, &format!("{leg:?}: pip install through the proxy"));
        let init = s.ws.join("site/tinypkg/__init__.py");
        assert_eq!(
            std::fs::read_to_string(&init).ok().as_deref(),
            Some("VALUE = 42\n"),
            "{leg:?}: the installed package was applied to the workspace"
        );
        let out = last_outcome(&s);
        assert_eq!(out["status"], "applied", "{leg:?}: {out}");
        let conns = connections(&out);
        assert!(
            conns.iter().any(|c| c["allowed"] == true
                && c["host"] == "pypi.test"
                && c["received"].as_u64().unwrap_or(0) > 0),
            "{leg:?}: the ledger lists the index and file downloads: {conns:?}"
        );
        assert_eq!(
            out["net"]["allow"],
            serde_json::json!([format!("pypi.test:{port}")])
        );
        // Undone like any change.
        let u = s.retie().args(["undo", "last"]).output().expect("undo");
        assert_code(&u, 0, &format!("{leg:?}: undo"));
        assert!(!init.exists(), "{leg:?}: undo removed the installed files");
    }
}

#[test]
fn npm_installs_through_the_proxy_into_the_overlay() {
    if !std::path::Path::new("/usr/bin/npm").exists() {
        eprintln!("skipped: no /usr/bin/npm on this machine (Debian: npm)");
        return;
    }
    let reg = Registry::start();
    let port = reg.port.to_string();
    for leg in legs() {
        let s = Scratch::new(leg);
        write(
            &s,
            "package.json",
            "{\"name\":\"app\",\"version\":\"1.0.0\"}\n",
        );
        let registry = format!("http://npm.test:{port}/");
        let o = exec_net(
            &s,
            &format!("allow:npm.test:{port}"),
            &[],
            &[
                "/usr/bin/npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                "--registry",
                &registry,
                "tinynpm",
            ],
        );
        assert_code(&o, 0, &format!("{leg:?}: npm install through the proxy"));
        assert_eq!(
            std::fs::read_to_string(s.ws.join("node_modules/tinynpm/index.js"))
                .ok()
                .as_deref(),
            Some("module.exports = 42;\n"),
            "{leg:?}: the package was applied to the workspace"
        );
        let conns = connections(&last_outcome(&s));
        assert!(
            conns
                .iter()
                .any(|c| c["allowed"] == true && c["host"] == "npm.test"),
            "{leg:?}: {conns:?}"
        );
    }
}

/// Probes from inside a proxied sandbox; `name=result` lines.
const PROBE: &str = r#"
import errno, os, socket, ssl, subprocess, sys
port = int(sys.argv[1])
def err(e): return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "error:" + str(e)
def curl(*args):
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}/%{http_connect}"] + list(args),
                       capture_output=True, text=True)
    return r.stdout.strip()
u = "http://%s:%d/files/secret"
print("listed=" + curl(u % ("pypi.test", port)))
print("unlisted_host=" + curl(u % ("unlisted.test", port)))
print("unlisted_port=" + curl(u % ("pypi.test", port + 1)))
print("private_by_dns=" + curl(u % ("localhost", port)))
print("literal_plain=" + curl(u % ("127.0.0.1", port)))
print("literal_connect=" + curl("https://127.0.0.1:%d/" % port))
print("redirect=" + curl("-L", "http://pypi.test:%d/redirect" % port))
print("direct=" + curl("--noproxy", "*", u % ("127.0.0.1", port)))
# A CONNECT to the listed host whose TLS hello names another.
try:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(b"CONNECT pypi.test:%d HTTP/1.1\r\nHost: pypi.test:%d\r\n\r\n" % (port, port))
    head = s.recv(4096)
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    try:
        ctx.wrap_socket(s, server_hostname="evil.test"); print("sni_mismatch=handshake")
    except (OSError, ssl.SSLError) as e:
        print("sni_mismatch=closed")
except OSError as e:
    print("sni_mismatch=" + err(e))
try:
    socket.getaddrinfo("pypi.test", 80); print("dns=resolved")
except OSError:
    print("dns=failed")
r = subprocess.run(["getent", "hosts", "example.com"], capture_output=True)
print("getent=" + ("resolved" if r.returncode == 0 else "failed"))
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 53)); print("udp=sent")
except OSError as e:
    print("udp=" + err(e))
try:
    t = socket.socket(); t.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", 3128)); print("tfo=sent")
except OSError as e:
    print("tfo=" + err(e))
try:
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM); print("ipv6=allowed")
except OSError as e:
    print("ipv6=" + err(e))
try:
    l = socket.socket(); l.listen(1); print("listen=listening")
except OSError as e:
    print("listen=" + err(e))
"#;

#[test]
fn everything_off_the_allow_list_is_refused_and_recorded() {
    let reg = Registry::start();
    let port = reg.port;
    for leg in legs() {
        let s = Scratch::new(leg);
        std::fs::write(s.ws.join("probe.py"), PROBE).expect("write probe");
        s.give(&s.ws.join("probe.py"));
        let o = exec_net(
            &s,
            &format!("allow:pypi.test:{port},localhost:{port}"),
            &["--changes", "discard"],
            &["python3", "probe.py", &port.to_string()],
        );
        assert_code(&o, 0, &format!("{leg:?}: probe"));
        let r = lines(&o);
        let want = [
            ("listed", "200/000"),
            ("unlisted_host", "403/000"),
            ("unlisted_port", "403/000"),
            ("private_by_dns", "403/000"),
            ("literal_plain", "403/000"),
            ("literal_connect", "000/403"),
            ("redirect", "403/000"),
            ("direct", "000/000"),
            ("sni_mismatch", "closed"),
            ("dns", "failed"),
            ("getent", "failed"),
            ("udp", "EPERM"),
            ("tfo", "EPERM"),
            ("ipv6", "EPERM"),
            ("listen", "EPERM"),
        ];
        // Every probe is checked before the test fails, so that one run
        // with a wall removed shows each probe that wall holds.
        let wrong: Vec<String> = want
            .iter()
            .filter(|(k, v)| r.get(*k).map(String::as_str) != Some(*v))
            .map(|(k, v)| format!("{k}: want {v}, got {:?}", r.get(*k)))
            .collect();
        assert!(
            wrong.is_empty(),
            "{leg:?}: {wrong:#?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            stdout(&o),
            stderr(&o)
        );
        // The redirect's target was never fetched: only the listed
        // request and the redirect itself reached the server.
        let reqs = reg.requests();
        assert_eq!(
            reqs.lines().filter(|l| *l == "/files/secret").count(),
            1,
            "{leg:?}: {reqs}"
        );
        std::fs::remove_file(reg.root.path().join("requests.log")).expect("reset log");
        // Every connection is in the ledger, with its reason.
        let conns = connections(&last_outcome(&s));
        let reasons: Vec<&str> = conns.iter().filter_map(|c| c["reason"].as_str()).collect();
        let missing: Vec<&str> = [
            "not_listed",
            "port_not_listed",
            "private_address",
            "literal_not_listed",
            "sni_mismatch",
        ]
        .into_iter()
        .filter(|w| !reasons.contains(w))
        .collect();
        assert!(
            missing.is_empty(),
            "{leg:?}: {missing:?} missing in {conns:?}"
        );
        assert!(
            conns.iter().filter(|c| c["allowed"] == true).count() >= 2,
            "{leg:?}: the listed request and the redirect: {conns:?}"
        );
    }
}

#[test]
fn the_proxy_killed_mid_download_fails_the_run_and_applies_nothing() {
    let reg = Registry::start();
    let port = reg.port;
    for leg in legs() {
        let s = Scratch::new(leg);
        let allow = format!("allow:pypi.test:{port}");
        let mut cmd = s.retie();
        cmd.env("RETIE_NET_HOSTS", "pypi.test=127.0.0.1")
            .args(["sandbox", "exec", "--json", "-w"])
            .arg(&s.ws)
            .args(["--net", &allow, "--"])
            // The command's own exit says nothing: it ends 0 either way.
            .args([
                "sh",
                "-c",
                &format!("curl -s -o big.bin http://pypi.test:{port}/slow; echo partial > note.txt; exit 0"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn retie");
        let started = reg.root.path().join("slow-started");
        assert!(
            wait_until(60.0, || started.exists()),
            "{leg:?}: the download began"
        );
        let proxies = pids_with(&format!("pypi.test:{port}"))
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains("__net-proxy"))
                    .unwrap_or(false)
            })
            .collect::<Vec<_>>();
        assert_eq!(proxies.len(), 1, "{leg:?}: one proxy: {proxies:?}");
        // SAFETY: kill takes a pid and a signal number; no memory.
        assert_eq!(unsafe { libc::kill(proxies[0], libc::SIGKILL) }, 0);
        let o = child.wait_with_output().expect("retie ends");
        std::fs::remove_file(&started).expect("reset");
        assert_code(&o, 125, &format!("{leg:?}: the run fails"));
        assert!(
            stderr(&o).contains("proxy"),
            "{leg:?}: says why: {}",
            stderr(&o)
        );
        for f in ["big.bin", "note.txt"] {
            assert!(!s.ws.join(f).exists(), "{leg:?}: {f} was not applied");
        }
        let out = last_outcome(&s);
        assert_eq!(out["status"], "not_applied", "{leg:?}: {out}");
        assert!(out["net"]["proxy_died"].is_string(), "{leg:?}: {out}");
    }
}

#[test]
fn bad_allow_lists_are_clear_errors() {
    for leg in legs() {
        let s = Scratch::new(leg);
        for (net, says) in [
            ("allow:", "no host"),
            ("allow:a b", "not a host name"),
            ("allow:pypi.org:0", "1-65535"),
            ("allow:*.1.2.3.4", "before a name"),
        ] {
            let o = s.exec(&["--net", net], &["true"]);
            assert_code(&o, 125, &format!("{leg:?}: --net {net}"));
            assert!(stderr(&o).contains(says), "{leg:?}: {net}: {}", stderr(&o));
        }
    }
}

#[test]
fn registries_come_from_the_config_when_it_names_them() {
    let reg = Registry::start();
    let port = reg.port;
    for leg in legs() {
        let s = Scratch::new(leg);
        // registry.npmjs.org (on the shipped list) is mapped to this
        // machine too: were the config not read, the proxy would dial
        // 127.0.0.1:443, never the real registry.
        s.write_config(&format!("[network]\nregistries = [\"pypi.test:{port}\"]\nhosts = {{ \"pypi.test\" = \"127.0.0.1\", \"registry.npmjs.org\" = \"127.0.0.1\" }}\n"));
        let script = format!(
            "curl -s -o /dev/null -w 'listed=%{{http_code}}\\n' http://pypi.test:{port}/files/secret; \
             curl -s -o /dev/null -w 'shipped=%{{http_code}}/%{{http_connect}}\\n' https://registry.npmjs.org/; exit 0"
        );
        let o = s.exec(
            &["--net", "registries", "--changes", "discard"],
            &["sh", "-c", &script],
        );
        assert_code(&o, 0, &format!("{leg:?}: --net registries"));
        let r = lines(&o);
        assert_eq!(
            r.get("listed").map(String::as_str),
            Some("200"),
            "{leg:?}: {}",
            stderr(&o)
        );
        assert_eq!(
            r.get("shipped").map(String::as_str),
            Some("000/403"),
            "{leg:?}"
        );
    }
}

/// What the agent's bash runs: the listed stand-in, then an unlisted
/// name, with Python's urllib (which honours HTTP_PROXY), results into
/// `probe.txt` in the workspace.
const AGENT_PROBE: &str = r#"
import sys, urllib.request
port = int(sys.argv[1])
out = []
for h in ("pypi.test", "unlisted.test"):
    try:
        body = urllib.request.urlopen("http://%s:%d/files/secret" % (h, port), timeout=20).read()
        out.append("%s=%s" % (h, body.decode().strip()))
    except Exception as e:
        out.append("%s=refused:%s" % (h, getattr(e, "code", type(e).__name__)))
open("probe.txt", "w").write("\n".join(out) + "\n")
"#;

/// How `retie run` gets its model in
/// [`the_agents_bash_reaches_what_the_person_allowed_and_nothing_else`].
#[derive(Clone, Copy, Debug)]
enum Model {
    /// The script provider: a single-threaded process, the sandbox
    /// started in process.
    Script,
    /// An OpenAI-format server on loopback: the process talks HTTP, so
    /// its sandboxes start through the helper process, which hands the
    /// proxy socket back (ADR 0313).
    OpenAi,
}

/// `retie run --autonomy auto` whose one bash call runs the probe;
/// `extra`: `--net`, `--yes`.
fn agent_probe(s: &Scratch, model: Model, port: u16, extra: &[&str]) -> Output {
    let call = serde_json::json!({"command": format!("/usr/bin/python3 probe.py {port}")});
    let mut c = s.retie();
    c.env(
        "RETIE_NET_HOSTS",
        "pypi.test=127.0.0.1,unlisted.test=127.0.0.1",
    )
    .args(["run", "--json", "--autonomy", "auto", "-p", "probe"])
    .args(extra)
    .env_remove("RETIE_PROVIDER")
    .stdin(Stdio::null());
    // Held until the run ends: the model server's thread.
    match model {
        Model::Script => {
            let script = s.root.path().join("script.json");
            std::fs::write(
                &script,
                serde_json::json!({"turns": [
                    {"tool_calls": [{"name": "bash", "arguments": call}]},
                    {"text": "done"}
                ]})
                .to_string(),
            )
            .expect("script");
            c.args(["--provider", "script", "--script"]).arg(&script);
            c.output().expect("run retie")
        }
        Model::OpenAi => {
            use crate::providers::{oa, oa_call, oa_finish, oa_text, ok, server};
            let (addr, _seen) = server(vec![
                ok(
                    "text/event-stream",
                    oa(
                        &[
                            oa_call("c1", "bash", &call.to_string()),
                            oa_finish("tool_calls"),
                        ],
                        true,
                    ),
                ),
                ok(
                    "text/event-stream",
                    oa(&[oa_text("done"), oa_finish("stop")], true),
                ),
            ]);
            c.args([
                "--provider",
                "openai",
                "--model",
                "test-model",
                "--base-url",
            ])
            .arg(format!("{addr}/v1"))
            .env_remove("OPENAI_API_KEY");
            c.output().expect("run retie")
        }
    }
}

/// `retie run`'s bash with the proxied network (issue 34, ADR 0313), in
/// process (script provider) and through the sandbox helper (a provider
/// over HTTP): the listed stand-in answers, an unlisted name is refused by
/// the proxy, the ledger lists both connections, and the session's
/// delegation and the action declare the network. Without `--net` (and
/// with none in the config) the same call reaches nothing.
#[test]
fn the_agents_bash_reaches_what_the_person_allowed_and_nothing_else() {
    let reg = Registry::start();
    let port = reg.port;
    for model in [Model::Script, Model::OpenAi] {
        for leg in legs() {
            let label = format!("{model:?} {leg:?}");
            // Through `[network] bash = "allow"` and the config's list on
            // one leg, `--net allow:` on the other: both ways in.
            let s = Scratch::new(leg);
            write(&s, "probe.py", AGENT_PROBE);
            let net: Vec<String> = if leg == Leg::Invoker {
                vec!["--net".into(), format!("allow:pypi.test:{port}")]
            } else {
                s.write_config(&format!(
                    "[network]\nbash = \"allow\"\nallow = [\"pypi.test:{port}\"]\n"
                ));
                vec![]
            };
            let mut net: Vec<&str> = net.iter().map(String::as_str).collect();
            // The policy sees the reach: network egress cannot be undone,
            // so the auto tier asks (no one here: suspended, exit 5).
            let o = agent_probe(&s, model, port, &net);
            assert_code(&o, 5, &format!("{label}: a networked bash asks"));
            assert!(
                stdout(&o).contains("irreversible"),
                "{label}: {}",
                stdout(&o)
            );
            let s = Scratch::new(leg);
            write(&s, "probe.py", AGENT_PROBE);
            if leg == Leg::Nobody {
                s.write_config(&format!(
                    "[network]\nbash = \"allow\"\nallow = [\"pypi.test:{port}\"]\n"
                ));
            }
            net.push("--yes");
            let served = reg.requests().matches("/files/secret").count();
            let o = agent_probe(&s, model, port, &net);
            assert_code(&o, 0, &format!("{label}: retie run"));
            assert!(
                stderr(&o).contains(&format!(
                    "bash may reach, through the proxy only: pypi.test:{port}"
                )),
                "{label}: the start says what bash may reach:\n{}",
                stderr(&o)
            );
            let probe = std::fs::read_to_string(s.ws.join("probe.txt")).unwrap_or_default();
            assert!(
                probe.contains("pypi.test=secret"),
                "{label}: the listed host answered through the proxy: {probe:?}\n{}",
                stderr(&o)
            );
            assert!(
                probe.contains("unlisted.test=refused:403"),
                "{label}: the proxy refused the unlisted name: {probe:?}"
            );
            let out = last_outcome(&s);
            let conns = connections(&out);
            assert!(
                conns.iter().any(|c| c["allowed"] == true
                    && c["host"] == "pypi.test"
                    && c["received"].as_u64().unwrap_or(0) > 0),
                "{label}: the ledger lists the allowed connection: {out}"
            );
            assert!(
                conns.iter().any(|c| c["allowed"] == false
                    && c["reason"] == "not_listed"
                    && c["target"].as_str().unwrap_or("").contains("unlisted.test")),
                "{label}: the ledger lists the refused connection: {out}"
            );
            assert_eq!(
                out["net"]["allow"],
                serde_json::json!([format!("pypi.test:{port}")]),
                "{label}"
            );
            let v = s.retie().arg("verify").output().expect("verify");
            assert_code(&v, 0, &format!("{label}: retie verify"));
            assert_eq!(
                reg.requests().matches("/files/secret").count(),
                served + 1,
                "{label}: only the listed request reached the stand-in"
            );

            // No --net and no config: the same call reaches nothing.
            let s = Scratch::new(leg);
            write(&s, "probe.py", AGENT_PROBE);
            let before = reg.requests().len();
            let o = agent_probe(&s, model, port, &["--yes"]);
            assert_code(&o, 0, &format!("{label}: retie run without --net"));
            let probe = std::fs::read_to_string(s.ws.join("probe.txt")).unwrap_or_default();
            assert!(
                probe.contains("pypi.test=refused:URLError")
                    && probe.contains("unlisted.test=refused:URLError"),
                "{label}: without --net nothing is reachable: {probe:?}"
            );
            assert_eq!(reg.requests().len(), before, "{label}: nothing reached");
        }
    }
}

/// The config's network widens only what the person asked for (ADR
/// 0313): `[network] allow` is reached by `sandbox exec --net allow`, and
/// neither it nor `[network] bash` gives a `sandbox exec` without `--net`
/// any network.
#[test]
fn the_configs_allow_list_is_used_only_when_asked_for() {
    let reg = Registry::start();
    let port = reg.port;
    for leg in legs() {
        let s = Scratch::new(leg);
        s.write_config(&format!(
            "[network]\nbash = \"allow\"\nallow = [\"pypi.test:{port}\"]\n"
        ));
        let script = format!(
            "curl -s -o /dev/null -w 'listed=%{{http_code}}\\n' http://pypi.test:{port}/files/secret; \
             curl -s -o /dev/null -w 'unlisted=%{{http_code}}\\n' http://unlisted.test:{port}/files/secret; exit 0"
        );
        let o = exec_net(
            &s,
            "allow",
            &["--changes", "discard"],
            &["sh", "-c", &script],
        );
        assert_code(&o, 0, &format!("{leg:?}: --net allow"));
        let r = lines(&o);
        assert_eq!(
            r.get("listed").map(String::as_str),
            Some("200"),
            "{leg:?}: {}",
            stderr(&o)
        );
        assert_eq!(
            r.get("unlisted").map(String::as_str),
            Some("403"),
            "{leg:?}"
        );
        // No --net: no network, whatever the config says.
        let served = reg.requests().len();
        let o = s.exec(&["--changes", "discard"], &["sh", "-c", &script]);
        assert_code(&o, 0, &format!("{leg:?}: no --net"));
        let r = lines(&o);
        assert_eq!(r.get("listed").map(String::as_str), Some("000"), "{leg:?}");
        assert_eq!(reg.requests().len(), served, "{leg:?}: nothing reached");
    }
}
