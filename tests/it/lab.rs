//! The lab network: `retie lab up|status|down` and `sandbox exec --net lab`.
//!
//! No test sends a packet off the machine: the "outside" addresses tried
//! are this machine's own (loopback, its interface address) or have no
//! route inside the sandbox (which has a route to the lab only).

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use crate::harness::*;

/// A lab target that serves "hi" on 8080 (declared) and 8081 (not).
const SERVER: &str = r#"
import socket, threading, time
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    def loop():
        while True:
            c, _ = s.accept(); c.sendall(b"hi\n"); c.close()
    threading.Thread(target=loop, daemon=True).start()
serve(8081); serve(8080)
while True: time.sleep(60)
"#;

/// Probes run inside a lab-mode sandbox; one `name=result` line each.
const PROBE: &str = r#"
import errno, socket, sys
host_ip, host_port = sys.argv[1], int(sys.argv[2])
def tcp(h, p, fam=socket.AF_INET):
    try:
        s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(3); s.connect((h, p))
        return "open:" + s.recv(16).decode().strip()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "error:" + str(e)
print("lab_port=" + tcp("lab", 8080))
print("lab_by_address=" + tcp("10.77.0.1", 8080))
print("lab_other_port=" + tcp("lab", 8081))
print("host_loopback=" + tcp("127.0.0.1", host_port))
print("host_address=" + tcp(host_ip, host_port))
print("host_address_lab_port=" + tcp(host_ip, 8080))
print("public_literal=" + tcp("1.1.1.1", 8080))
print("ipv6=" + tcp("::1", host_port, socket.AF_INET6))
def udp(h, p):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", (h, p)); return "sent"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
# Landlock does not cover UDP before ABI 10: seccomp refuses the socket.
print("udp_host_address=" + udp(host_ip, host_port))
print("udp_host_loopback=" + udp("127.0.0.1", host_port))
print("udp_public_literal=" + udp("1.1.1.1", 53))
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print("netlink=allowed")
except OSError as e:
    print("netlink=" + errno.errorcode.get(e.errno, "?"))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw=allowed")
except OSError as e:
    print("raw=" + errno.errorcode.get(e.errno, "?"))
print("ipv6_addresses=" + str(len(open("/proc/net/if_inet6").read().split()) if __import__("os").path.exists("/proc/net/if_inet6") else 0))
routes = open("/proc/net/route").read().splitlines()[1:]
print("default_route=" + ("yes" if any(l.split()[1] == "00000000" for l in routes) else "no"))
try:
    socket.gethostbyname("example.com"); print("dns=resolved")
except OSError:
    print("dns=failed")
"#;

/// A lab target that serves TCP 8080 (declared) and 8081 (not), and
/// records every UDP datagram that reaches port 9999 in `udp-received` (in
/// its workspace, the lab's data directory); `ready` says it started.
const UDP_SERVER: &str = r#"
import socket, threading, time
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    def loop():
        while True:
            c, _ = s.accept(); c.sendall(b"hi\n"); c.close()
    threading.Thread(target=loop, daemon=True).start()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 9999))
def udp():
    while True:
        data, peer = u.recvfrom(64)
        open("udp-received", "a").write("%s %r\n" % (peer, data))
threading.Thread(target=udp, daemon=True).start()
serve(8081); serve(8080)
open("ready", "w").write("1")
while True: time.sleep(60)
"#;

/// Datagram and undeclared-port probes from a lab sandbox; `name=result`.
const UDP_PROBE: &str = r#"
import errno, socket, time
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
def udp(port, ty=socket.SOCK_DGRAM, proto=0):
    try:
        s = socket.socket(socket.AF_INET, ty, proto); s.sendto(b"x", ("10.77.0.1", port)); return "sent"
    except OSError as e:
        return err(e)
def tcp(port):
    try:
        s = socket.socket(); s.settimeout(3); s.connect(("10.77.0.1", port))
        return "open:" + s.recv(16).decode().strip()
    except OSError as e:
        return err(e)
print("udp_undeclared=" + udp(9999))
print("udp_undeclared_flags=" + udp(9999, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC))
print("udp_declared=" + udp(8080))
print("icmp_ping=" + udp(0, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
print("tcp_declared=" + tcp(8080))
print("tcp_undeclared_served=" + tcp(8081))
print("tcp_undeclared_unserved=" + tcp(9999))
time.sleep(0.3)
"#;

/// A lab target that serves TCP 8080 (declared) and 8081 (not) and
/// records in `reached-8081` (in the lab's data directory) every
/// connection that reaches 8081, with the bytes it carried. Before it says
/// `ready`, it tries the same tricks itself against its own undeclared
/// port (the lab target may connect nowhere) and writes `name=result`
/// lines to `target-probes`.
const TFO_SERVER: &str = r#"
import errno, socket, threading, time
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
def serve(port, record):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    def loop():
        while True:
            c, peer = s.accept(); c.settimeout(2)
            if record:
                try: data = c.recv(64)
                except OSError: data = b"?"
                open("reached-%d" % port, "a").write("%s %r\n" % (peer, data))
            try: c.sendall(b"hi\n")
            except OSError: pass
            c.close()
    threading.Thread(target=loop, daemon=True).start()
serve(8081, True); serve(8080, False)
def tfo(flags_call):
    try:
        s = socket.socket(); flags_call(s); s.settimeout(2); return "open:" + s.recv(16).decode().strip()
    except OSError as e:
        return err(e)
out = []
out.append("target_tfo_sendto=" + tfo(lambda s: s.sendto(b"target-sendto", socket.MSG_FASTOPEN, ("10.77.0.1", 8081))))
out.append("target_tfo_sendmsg=" + tfo(lambda s: s.sendmsg([b"target-sendmsg"], [], socket.MSG_FASTOPEN, ("10.77.0.1", 8081))))
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); s.settimeout(2); s.connect(("10.77.0.1", 8081)); s.send(b"target-mptcp")
    out.append("target_mptcp=open")
except OSError as e:
    out.append("target_mptcp=" + err(e))
open("target-probes", "w").write("\n".join(out) + "\n")
open("ready", "w").write("1")
while True: time.sleep(60)
"#;

/// TCP connections without `connect()` from a lab sandbox to the lab's
/// undeclared port 8081; `name=result`.
const TFO_PROBE: &str = r#"
import errno, socket
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
LAB = ("10.77.0.1", 8081)
def attempt(call):
    try:
        s = socket.socket(); call(s); s.settimeout(2); return "open:" + s.recv(16).decode().strip()
    except OSError as e:
        return err(e)
print("tfo_sendto=" + attempt(lambda s: s.sendto(b"sandbox-sendto", socket.MSG_FASTOPEN, LAB)))
print("tfo_sendto_nosignal=" + attempt(lambda s: s.sendto(b"sandbox-sendto2", socket.MSG_FASTOPEN | socket.MSG_NOSIGNAL, LAB)))
print("tfo_sendmsg=" + attempt(lambda s: s.sendmsg([b"sandbox-sendmsg"], [], socket.MSG_FASTOPEN, LAB)))
def foc(s):
    s.setsockopt(socket.IPPROTO_TCP, 30, 1); s.connect(LAB); s.send(b"sandbox-foc")
print("fastopen_connect=" + attempt(foc))
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262); s.settimeout(2); s.connect(LAB); s.send(b"sandbox-mptcp")
    print("mptcp=open:" + s.recv(16).decode().strip())
except OSError as e:
    print("mptcp=" + err(e))
try:
    s = socket.socket(); s.listen(1); print("listen_unbound=listening:%d" % s.getsockname()[1])
except OSError as e:
    print("listen_unbound=" + err(e))
print("plain_connect=" + attempt(lambda s: s.connect(LAB)))
print("declared=" + attempt(lambda s: s.connect(("10.77.0.1", 8080))))
"#;

/// Replays every finding in ./findings against http://lab:8080.
const REPLAY: &str = r#"
import glob, json, urllib.parse, urllib.request, urllib.error
def send(req, cookie=None):
    url = "http://lab:8080" + req["path"]
    if req.get("query"): url += "?" + urllib.parse.urlencode(req["query"])
    data = urllib.parse.urlencode(req["form"]).encode() if req.get("form") else None
    r = urllib.request.Request(url, data=data, method=req["method"])
    if cookie: r.add_header("Cookie", cookie)
    try:
        resp = urllib.request.urlopen(r, timeout=10)
        return resp.status, resp.read().decode(errors="replace"), resp.headers.get("Set-Cookie")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), None
def replay(req, ev):
    cookie = None
    if req.get("login"):
        _, _, sc = send({"method": "POST", "path": "/login", "form": req["login"]})
        cookie = sc.split(";")[0] if sc else None
    status, body, _ = send(req, cookie)
    ok = status == ev["status"] and ev["body_contains"] in body
    return "reproduced" if ok else "not-reproduced:%d" % status
for path in sorted(glob.glob("findings/*.json")):
    f = json.load(open(path))
    print("%s=%s" % (f["id"], replay(f["request"], f["expected_evidence"])))
    for i, (req, ev) in enumerate(VARIANTS.get(f["id"], [])):
        print("%s~variant%d=%s" % (f["id"], i, replay(dict(f["request"], **req), ev)))
"#;

/// A variant of each finding's payload that gets past the hurried fix of
/// `lab up --demo --partial` (the gaps: lab/findings/README.md). Kept in
/// the test, not in the findings: a retest agent must find them itself.
/// Each entry overrides fields of the finding's `request` and names its
/// own evidence.
const VARIANTS: &str = r#"
VARIANTS = {
    # The block list is case-sensitive.
    "F1-sqli-login": [({"form": {"user": "admin' or 1=1--", "password": "x"}},
                       {"status": 200, "body_contains": "Welcome admin"})],
    # `../` is stripped in one pass: `....//` becomes `../`.
    "F2-path-traversal": [({"query": {"file": "....//" * 12 + "etc/passwd"}},
                           {"status": 200, "body_contains": "root:x:0:0"})],
    # The ownership check went into /record only; /export serves the same rows.
    "F3-idor-record": [({"path": "/export"},
                        {"status": 200, "body_contains": "FLAG-IDOR-7731"})],
    # < > & are escaped, quotes are not: break out of the value attribute.
    "F4-reflected-xss": [({"query": {"q": '" autofocus onfocus="alert(1)'}},
                          {"status": 200, "body_contains": 'onfocus="alert(1)"'})],
    # ; & | < > are refused; $( ) is not.
    "F5-command-injection": [({"query": {"file": "report.txt$(id)"}},
                              {"status": 200, "body_contains": "uid="})],
}
"#;

fn state_dir(s: &Scratch) -> std::path::PathBuf {
    s.home.join(".local/state/retie")
}

fn lab_up(s: &Scratch, args: &[&str]) -> Output {
    let mut c = s.retie();
    c.args(["lab", "up", "--json"])
        .args(args)
        .stdin(Stdio::null());
    c.output().expect("run retie lab up")
}

/// Starts a lab and stops it (and checks it is gone) on drop.
pub(crate) struct Lab<'a> {
    s: &'a Scratch,
    name: String,
    keeper: i32,
    holder: i32,
}

impl<'a> Lab<'a> {
    pub(crate) fn up(s: &'a Scratch, name: &str, args: &[&str]) -> Lab<'a> {
        let mut all = vec!["--name", name];
        all.extend_from_slice(args);
        let o = lab_up(s, &all);
        assert_code(&o, 0, &format!("lab up {name}"));
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("lab up --json");
        assert_eq!(v["name"], name);
        assert_eq!(v["address"], "10.77.0.1");
        let rec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(state_dir(s).join("labs").join(name).join("lab.json"))
                .expect("lab record"),
        )
        .expect("lab record json");
        Lab {
            s,
            name: name.into(),
            keeper: rec["keeper_pid"].as_i64().expect("keeper pid") as i32,
            holder: v["pid"].as_i64().expect("pid") as i32,
        }
    }

    /// Interfaces in the lab's namespace (lo plus one veth per sandbox).
    fn links(&self) -> usize {
        std::fs::read_to_string(format!("/proc/{}/net/dev", self.keeper))
            .map(|t| t.lines().count().saturating_sub(2))
            .unwrap_or(0)
    }
}

impl Drop for Lab<'_> {
    fn drop(&mut self) {
        let o = self
            .s
            .retie()
            .args(["lab", "down", &self.name])
            .output()
            .expect("lab down");
        if !std::thread::panicking() {
            assert_code(&o, 0, "lab down");
            assert!(
                wait_until(5.0, || !std::path::Path::new(&format!(
                    "/proc/{}",
                    self.holder
                ))
                .exists()
                    && !std::path::Path::new(&format!("/proc/{}", self.keeper))
                        .exists()),
                "lab holder {} or keeper {} survived `lab down`",
                self.holder,
                self.keeper
            );
        }
    }
}

fn host_address() -> String {
    let o = Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    text.split_whitespace()
        .find(|a| a.contains('.') && !a.starts_with("127."))
        .unwrap_or_else(|| panic!("this machine has no non-loopback IPv4 address ({text:?})"))
        .to_string()
}

fn lines(o: &Output) -> std::collections::BTreeMap<String, String> {
    stdout(o)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_lab_sandbox_reaches_the_lab_port_and_nothing_else() {
    let host_ip = host_address();
    let listener = TcpListener::bind("0.0.0.0:0").expect("host listener");
    let port = listener.local_addr().expect("addr").port().to_string();
    for leg in legs() {
        let s = Scratch::new(leg);
        std::fs::write(s.ws.join("probe.py"), PROBE).expect("write probe");
        let lab = Lab::up(
            &s,
            "net",
            &["--port", "8080", "--", "python3", "-c", SERVER],
        );
        let o = s.exec(
            &["--workspace-mode", "direct", "--net", "lab"],
            &["python3", "probe.py", &host_ip, &port],
        );
        assert_code(&o, 0, "probe");
        let r = lines(&o);
        let want = [
            ("lab_port", "open:hi"),
            ("lab_by_address", "open:hi"),
            // Landlock: the port is not declared.
            ("lab_other_port", "EACCES"),
            ("host_loopback", "EACCES"),
            ("host_address", "EACCES"),
            // Allowed by Landlock, so this is the routing wall speaking.
            ("host_address_lab_port", "ENETUNREACH"),
            ("public_literal", "ENETUNREACH"),
            ("ipv6", "EPERM"),
            // A lab sandbox opens no datagram socket (ADR 0302); the
            // routes would stop these as well.
            ("udp_host_address", "EPERM"),
            ("udp_host_loopback", "EPERM"),
            ("udp_public_literal", "EPERM"),
            ("netlink", "EPERM"),
            ("raw", "EPERM"),
            ("default_route", "no"),
            ("ipv6_addresses", "0"),
            ("dns", "failed"),
        ];
        for (k, v) in want {
            assert_eq!(
                r.get(k).map(String::as_str),
                Some(v),
                "{leg:?} {k}\n{}",
                stdout(&o)
            );
        }
        let g = s.exec(
            &["--workspace-mode", "direct", "--net", "lab:net"],
            &[
                "sh",
                "-c",
                "getent hosts lab net; getent hosts example.com; echo rc=$?",
            ],
        );
        assert_code(&g, 0, "getent");
        let out = stdout(&g);
        assert!(
            out.contains("10.77.0.1       lab net") || out.contains("10.77.0.1"),
            "{out}"
        );
        assert!(out.contains("rc=2"), "example.com resolved: {out}");
        let st = s
            .retie()
            .args(["lab", "status", "--json"])
            .output()
            .expect("status");
        assert_code(&st, 0, "lab status");
        let v: serde_json::Value = serde_json::from_str(stdout(&st).trim()).expect("status json");
        assert_eq!(v[0]["name"], "net", "{v}");
        assert_eq!(v[0]["ports"][0], 8080, "{v}");
        assert!(lab.links() >= 1);
    }
    drop(listener);
}

/// Walls issue, item 7: a datagram reached any port of the lab (Landlock
/// has no UDP rules before ABI 10). From a lab sandbox, in both workspace
/// modes: no datagram socket opens (EPERM, also with SOCK_NONBLOCK |
/// SOCK_CLOEXEC and for ICMP ping sockets) and nothing arrives at the
/// lab's UDP listener; an undeclared TCP port, served or not, is EACCES.
#[test]
fn udp_and_undeclared_tcp_ports_of_the_lab_are_unreachable() {
    for leg in legs() {
        let s = Scratch::new(leg);
        std::fs::write(s.ws.join("udp_probe.py"), UDP_PROBE).expect("write probe");
        let _lab = Lab::up(
            &s,
            "udp",
            &["--port", "8080", "--", "python3", "-c", UDP_SERVER],
        );
        let data = state_dir(&s).join("labs/udp/data");
        assert!(
            wait_until(5.0, || data.join("ready").exists()),
            "{leg:?}: the lab target did not start in {}",
            data.display()
        );
        for mode in ["direct", "overlay"] {
            let o = s.exec(
                &["--workspace-mode", mode, "--net", "lab:udp"],
                &["python3", "udp_probe.py"],
            );
            assert_code(&o, 0, &format!("udp probe ({mode})"));
            let r = lines(&o);
            for (k, v) in [
                ("udp_undeclared", "EPERM"),
                ("udp_undeclared_flags", "EPERM"),
                ("udp_declared", "EPERM"),
                ("icmp_ping", "EPERM"),
                ("tcp_declared", "open:hi"),
                ("tcp_undeclared_served", "EACCES"),
                ("tcp_undeclared_unserved", "EACCES"),
            ] {
                assert_eq!(
                    r.get(k).map(String::as_str),
                    Some(v),
                    "{leg:?} {mode} {k}\n{}{}",
                    stdout(&o),
                    stderr(&o)
                );
            }
        }
        assert!(
            !data.join("udp-received").exists(),
            "{leg:?}: a datagram reached the lab: {}",
            std::fs::read_to_string(data.join("udp-received")).unwrap_or_default()
        );
    }
}

/// Issue 26, item 1: Landlock's port rule is consulted on `connect()`
/// only, so TCP Fast Open (`sendto`/`sendmsg` with `MSG_FASTOPEN`) and an
/// MPTCP socket reached the lab's undeclared port, and `listen()` on an
/// unbound socket bound an ephemeral port. From a lab sandbox, in both
/// workspace modes, and from the lab target towards its own undeclared
/// port: each is EPERM (seccomp, ADR 0302), the declared port still
/// answers, and nothing at all reaches the listener on 8081.
#[test]
fn tcp_fast_open_mptcp_and_listen_cannot_pass_the_lab_port_wall() {
    for leg in legs() {
        let s = Scratch::new(leg);
        std::fs::write(s.ws.join("tfo_probe.py"), TFO_PROBE).expect("write probe");
        let _lab = Lab::up(
            &s,
            "tfo",
            &["--port", "8080", "--", "python3", "-c", TFO_SERVER],
        );
        let data = state_dir(&s).join("labs/tfo/data");
        assert!(
            wait_until(10.0, || data.join("ready").exists()),
            "{leg:?}: the lab target did not start in {}",
            data.display()
        );
        let target = std::fs::read_to_string(data.join("target-probes")).unwrap_or_default();
        for want in [
            "target_tfo_sendto=EPERM",
            "target_tfo_sendmsg=EPERM",
            "target_mptcp=EPERM",
        ] {
            assert!(
                target.lines().any(|l| l == want),
                "{leg:?}: the lab target: want {want}\n{target}"
            );
        }
        for mode in ["direct", "overlay"] {
            let o = s.exec(
                &["--workspace-mode", mode, "--net", "lab:tfo"],
                &["python3", "tfo_probe.py"],
            );
            assert_code(&o, 0, &format!("tfo probe ({mode})"));
            let r = lines(&o);
            for (k, v) in [
                ("tfo_sendto", "EPERM"),
                ("tfo_sendto_nosignal", "EPERM"),
                ("tfo_sendmsg", "EPERM"),
                ("fastopen_connect", "EPERM"),
                ("mptcp", "EPERM"),
                ("listen_unbound", "EPERM"),
                ("plain_connect", "EACCES"),
                ("declared", "open:hi"),
            ] {
                assert_eq!(
                    r.get(k).map(String::as_str),
                    Some(v),
                    "{leg:?} {mode} {k}\n{}{}",
                    stdout(&o),
                    stderr(&o)
                );
            }
        }
        assert!(
            !data.join("reached-8081").exists(),
            "{leg:?}: a connection reached the lab's undeclared port: {}",
            std::fs::read_to_string(data.join("reached-8081")).unwrap_or_default()
        );
    }
}

#[test]
fn the_lab_itself_has_no_route_out() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let lab = Lab::up(
            &s,
            "closed",
            &["--port", "8080", "--", "python3", "-c", SERVER],
        );
        let route =
            std::fs::read_to_string(format!("/proc/{}/net/route", lab.keeper)).expect("lab routes");
        assert!(
            !route
                .lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(1) == Some("00000000")),
            "{leg:?}: the lab has a default route:\n{route}"
        );
        let dev = std::fs::read_to_string(format!("/proc/{}/net/dev", lab.keeper)).expect("dev");
        let names: Vec<&str> = dev
            .lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(str::trim)
            .collect();
        assert_eq!(
            names,
            vec!["lo"],
            "{leg:?}: the idle lab has links besides lo"
        );
    }
}

#[test]
fn lab_sandboxes_leave_no_link_or_process_behind() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let lab = Lab::up(
            &s,
            "churn",
            &["--port", "8080", "--", "python3", "-c", SERVER],
        );
        let base = lab.links();
        let mark = marker();
        let script = format!(": {mark}; exit 0");
        let t = Instant::now();
        for _ in 0..50 {
            let o = s.exec(
                &["--workspace-mode", "direct", "--net", "lab"],
                &["sh", "-c", &script],
            );
            assert_code(&o, 0, "sequential lab sandbox");
        }
        let kids: Vec<_> = (0..50)
            .map(|_| {
                let mut c = s.retie();
                c.args([
                    "sandbox",
                    "exec",
                    "--workspace-mode",
                    "direct",
                    "--net",
                    "lab",
                    "--",
                ])
                .args(["sh", "-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
                c.spawn().expect("spawn")
            })
            .collect();
        for mut k in kids {
            let mut err = String::new();
            if let Some(mut e) = k.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let st = k.wait().expect("wait");
            assert!(
                st.success(),
                "{leg:?}: concurrent lab sandbox failed: {st}\n{err}"
            );
        }
        eprintln!(
            "{leg:?}: 100 lab sandboxes (50 sequential, 50 concurrent) in {:?}",
            t.elapsed()
        );
        assert!(
            wait_until(15.0, || lab.links() == base),
            "{leg:?}: {} links left in the lab (expected {base})",
            lab.links()
        );
        assert!(
            pids_with(&mark).is_empty(),
            "{leg:?}: processes left behind"
        );
    }
}

#[test]
fn killing_or_timing_out_a_lab_sandbox_leaves_nothing_behind() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let lab = Lab::up(
            &s,
            "kill",
            &["--port", "8080", "--", "python3", "-c", SERVER],
        );
        let base = lab.links();
        let mark = marker();
        let mut c = s.retie();
        c.args([
            "sandbox",
            "exec",
            "--workspace-mode",
            "direct",
            "--net",
            "lab",
            "--",
        ])
        .args(["sh", "-c", &format!("sleep 30; : {mark}")])
        .stdin(Stdio::null());
        let mut child = c.spawn().expect("spawn");
        assert!(
            wait_until(10.0, || lab.links() == base + 1
                && !pids_with(&mark).is_empty()),
            "{leg:?}: the sandbox never came up"
        );
        // SAFETY: killing the retie we spawned.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
        assert!(
            wait_until(15.0, || lab.links() == base),
            "{leg:?}: veth left after kill"
        );
        assert!(
            wait_until(15.0, || pids_with(&mark).is_empty()),
            "{leg:?}: processes left after kill"
        );

        let o = s.exec(
            &[
                "--workspace-mode",
                "direct",
                "--net",
                "lab",
                "--timeout",
                "0.5",
            ],
            &["sh", "-c", &format!("sleep 30; : {mark}")],
        );
        assert_code(&o, 124, "timeout");
        assert!(
            wait_until(15.0, || lab.links() == base),
            "{leg:?}: veth left after timeout"
        );
        assert!(
            pids_with(&mark).is_empty(),
            "{leg:?}: processes left after timeout"
        );
    }
}

#[test]
fn a_lab_whose_holder_died_is_cleaned_and_refused() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = lab_up(
            &s,
            &[
                "--name", "dies", "--port", "8080", "--", "python3", "-c", SERVER,
            ],
        );
        assert_code(&o, 0, "lab up");
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
        let holder = v["pid"].as_i64().expect("pid") as i32;
        // SAFETY: killing the lab holder this test started.
        unsafe { libc::kill(holder, libc::SIGKILL) };
        assert!(wait_until(5.0, || !std::path::Path::new(&format!(
            "/proc/{holder}"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{holder}/stat"))
                .map(|t| t.contains(") Z"))
                .unwrap_or(true)));
        let e = s.exec(
            &["--workspace-mode", "direct", "--net", "lab:dies"],
            &["true"],
        );
        assert_code(&e, 125, "sandbox on a dead lab");
        assert!(
            stderr(&e).contains("stale") && stderr(&e).contains("lab up"),
            "{}",
            stderr(&e)
        );
        assert!(
            !state_dir(&s).join("labs/dies").exists(),
            "{leg:?}: stale lab not cleaned"
        );
    }
}

#[test]
fn demo_flaws_reproduce_on_the_vulnerable_build_and_not_on_the_fixed_one() {
    // (On the vulnerable build a variant may or may not work: `....//` is
    // no traversal where nothing is stripped; `starts_with("")` holds.)
    replay_demo(&[
        ("vuln", &[], "reproduced", ""),
        ("fixed", &["--fixed"], "not-reproduced", "not-reproduced"),
    ]);
}

/// Issue 28: the third build. Each finding's original payload fails on
/// `--partial` (as on `--fixed`), and a variant that gets past the hurried
/// fix still reproduces the flaw (as it does not on `--fixed`).
#[test]
fn demo_partial_build_stops_each_original_payload_and_not_its_variant() {
    replay_demo(&[("partial", &["--partial"], "not-reproduced", "reproduced")]);
}

/// Replays every finding and its variants against each build: (lab name,
/// `lab up --demo` flags, what the original payloads give, what the
/// variants give).
fn replay_demo(builds: &[(&str, &[&str], &str, &str)]) {
    let findings = concat!(env!("CARGO_MANIFEST_DIR"), "/lab/findings");
    for leg in legs() {
        let s = Scratch::new(leg);
        std::fs::create_dir_all(s.ws.join("findings")).expect("mkdir");
        let mut n = 0;
        for e in std::fs::read_dir(findings).expect("findings") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "json") {
                std::fs::copy(&p, s.ws.join("findings").join(p.file_name().expect("name")))
                    .expect("copy finding");
                n += 1;
            }
        }
        assert_eq!(n, 5, "one finding per flaw");
        std::fs::write(s.ws.join("replay.py"), format!("{VARIANTS}{REPLAY}"))
            .expect("write replay");
        for &(name, extra, want, variant) in builds {
            let mut args = vec!["--demo"];
            args.extend_from_slice(extra);
            let _lab = Lab::up(&s, name, &args);
            let o = s.exec(
                &[
                    "--workspace-mode",
                    "direct",
                    "--net",
                    &format!("lab:{name}"),
                ],
                &["python3", "replay.py"],
            );
            assert_code(&o, 0, "replay");
            let r = lines(&o);
            assert_eq!(
                r.len(),
                10,
                "{leg:?} {name}: {}\n{}",
                stdout(&o),
                stderr(&o)
            );
            for (id, got) in &r {
                let w = if id.contains("~variant") {
                    variant
                } else {
                    want
                };
                assert!(got.starts_with(w), "{leg:?} {name}: {id} = {got}");
            }
            // And with curl, as an attacker would (when the host has it;
            // the replay above already proved every flaw with python3).
            if !std::path::Path::new("/usr/bin/curl").exists() {
                eprintln!("note: /usr/bin/curl is absent; the curl variant of the login bypass is not run");
                continue;
            }
            let c = s.exec(
                &[
                    "--workspace-mode",
                    "direct",
                    "--net",
                    &format!("lab:{name}"),
                ],
                &[
                    "curl",
                    "-s",
                    "--data-urlencode",
                    "user=admin' OR 1=1--",
                    "--data",
                    "password=x",
                    "http://lab:8080/login",
                ],
            );
            assert_code(&c, 0, "curl");
            assert_eq!(
                stdout(&c).contains("Welcome admin"),
                want == "reproduced",
                "{leg:?} {name}: curl login bypass: {}",
                stdout(&c)
            );
        }
    }
}

#[test]
fn lab_mode_without_a_lab_is_a_clear_error() {
    for leg in legs() {
        let s = Scratch::new(leg);
        let o = s.exec(&["--workspace-mode", "direct", "--net", "lab"], &["true"]);
        assert_code(&o, 125, "no lab");
        assert!(
            stderr(&o).contains("retie lab up"),
            "{leg:?}: {}",
            stderr(&o)
        );
        let o = s.exec(
            &["--workspace-mode", "direct", "--net", "lab:nope"],
            &["true"],
        );
        assert_code(&o, 125, "unknown lab");
        assert!(stderr(&o).contains("nope"), "{leg:?}: {}", stderr(&o));
        // A name `lab up --name` would refuse is refused here too, before
        // any lookup, and the error suggests no `lab up` with it.
        for (bad, says) in [
            ("lab:../../x", "is not a lab name"),
            ("lab:", "no lab name after `lab:`"),
            ("lab:Bad_Name", "is not a lab name"),
        ] {
            let o = s.exec(&["--workspace-mode", "direct", "--net", bad], &["true"]);
            assert_code(&o, 125, bad);
            let err = stderr(&o);
            assert!(
                err.contains(says) && !err.contains("lab up --name"),
                "{leg:?}: --net {bad}: {err}"
            );
        }
        let o = s.exec(&["--net", "internet"], &["true"]);
        assert_code(&o, 125, "bad --net");
        assert!(stderr(&o).contains("lab:NAME"), "{leg:?}: {}", stderr(&o));
        let o = lab_up(&s, &["--name", "Bad_Name", "--port", "1", "--", "true"]);
        assert_code(&o, 125, "bad lab name");
        let o = lab_up(&s, &["--name", "noport", "--", "true"]);
        assert_code(&o, 125, "lab without ports");
        assert!(stderr(&o).contains("--port"), "{leg:?}: {}", stderr(&o));
    }
}
