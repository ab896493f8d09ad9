//! retie's network proxy (ADR 0310): the only thing a `--net allow:...`
//! sandbox can reach. The sandbox's init makes a listening socket on
//! 127.0.0.1:3128 *in the sandbox's own network namespace* and hands it
//! out; the proxy, a process of its own on the host side (`retie
//! __net-proxy`, confined by [`confine`]), accepts on it and dials out
//! from the host's namespace. A socket keeps the namespace it was made
//! in, so the sandbox needs no route, no DNS and no veth.
//!
//! It speaks HTTP `CONNECT` (checked by the requested host, then by the
//! server name in the TLS ClientHello, read without terminating TLS) and
//! plain HTTP forwarding (checked by the request's absolute URI or Host).
//! It resolves names itself; every decision is
//! [`retie_policy::netguard`]'s. Each connection is logged as JSON lines
//! to a file the parent reads when the run ends ([`Running::finish`]).

#![deny(missing_docs)]

mod confine;
mod http;
mod spawn;
mod tls;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use retie_policy::netguard::{self, AllowList, Host, NetRefusal};
use serde_json::{json, Value};

pub use confine::confine;
pub use spawn::{spawn, Connection, Finished, Running, LISTEN_FD, LOG_FD};

/// The proxy's port inside the sandbox (its own network namespace: no
/// clash with anything).
pub const PROXY_PORT: u16 = 3128;

/// The environment a proxied sandbox gets: every client's proxy setting
/// pointed at the proxy, and an empty `NO_PROXY` (nothing bypasses it;
/// nothing else is reachable anyway).
pub fn proxy_env(port: u16) -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut v: Vec<(&'static str, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "npm_config_proxy",
        "npm_config_https_proxy",
        "PIP_PROXY",
    ]
    .into_iter()
    .map(|k| (k, url.clone()))
    .collect();
    v.push(("NO_PROXY", String::new()));
    v.push(("no_proxy", String::new()));
    v
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The person's allow-list or resolver override is bad.
    #[error("{0}")]
    Config(String),
}

impl NetError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> NetError {
        NetError::Io {
            what: what.into(),
            source,
        }
    }
}

/// What the proxy enforces.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Who may be reached.
    pub allow: AllowList,
    /// The person's resolver override: names answered without DNS, whose
    /// addresses pass the private-address rule (the person named them).
    pub hosts: BTreeMap<String, IpAddr>,
}

/// Connections served at once; more are refused (closed at once,
/// logged), so a sandbox cannot make the proxy spawn threads without end.
pub const MAX_CONNECTIONS: u64 = 256;

/// Events logged per run; later ones are counted, not written, so a
/// sandbox cannot grow the log (a memfd: memory) without end.
pub const MAX_EVENTS: u64 = 20_000;

/// The connection log (JSON lines).
struct Log(Mutex<(std::fs::File, u64)>);

impl Log {
    fn write(&self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        if let Ok(mut g) = self.0.lock() {
            let (f, n) = &mut *g;
            *n += 1;
            if *n < MAX_EVENTS {
                let _ = f.write_all(line.as_bytes());
            } else if *n == MAX_EVENTS {
                let _ = f.write_all(
                    format!(
                        "{}\n",
                        json!({"id": 0, "event": "truncated", "after": MAX_EVENTS})
                    )
                    .as_bytes(),
                );
            }
        }
    }
}

/// Accept and serve until the process is killed (the parent does, when
/// the run ends). One thread per connection.
pub fn serve(listener: TcpListener, cfg: Config, log: std::fs::File) -> Result<(), NetError> {
    let cfg = Arc::new(cfg);
    let log = Arc::new(Log(Mutex::new((log, 0))));
    let live = Arc::new(AtomicU64::new(0));
    let mut id: u64 = 0;
    loop {
        let (client, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
            Err(e) => return Err(NetError::io("accepting on the sandbox's proxy socket", e)),
        };
        id += 1;
        if live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            log.write(
                json!({"id": id, "event": "refused", "method": "?", "target": "?",
                "reason": "too_many_connections",
                "detail": format!("more than {MAX_CONNECTIONS} connections at once")}),
            );
            drop(client);
            continue;
        }
        live.fetch_add(1, Ordering::SeqCst);
        let (cfg, log2, live2) = (cfg.clone(), log.clone(), live.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("conn{id}"))
            .spawn(move || {
                handle(client, id, &cfg, &log2);
                live2.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            live.fetch_sub(1, Ordering::SeqCst);
            log.write(json!({"id": id, "event": "failed", "error": format!("no thread: {e}")}));
        }
    }
}

/// A request the proxy has decided to serve.
struct Decided {
    method: String,
    host: Host,
    port: u16,
    addr: SocketAddr,
}

fn refuse(client: &mut TcpStream, log: &Log, id: u64, method: &str, target: &str, r: &NetRefusal) {
    log.write(json!({
        "id": id,
        "event": "refused",
        "method": method,
        "target": target,
        "reason": r.code(),
        "detail": r.to_string(),
    }));
    let body = format!("retie: refused: {r}\n");
    let _ = client.write_all(
        format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nX-Retie-Refused: {}\r\nContent-Length: {}\r\n\r\n{body}",
            r.code(),
            body.len()
        )
        .as_bytes(),
    );
}

fn handle(mut client: TcpStream, id: u64, cfg: &Config, log: &Log) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok((head, extra)) = http::read_head(&mut client) else {
        return;
    };
    let req = match http::parse(&head) {
        Ok(r) => r,
        Err(r) => return refuse(&mut client, log, id, "?", "?", &r),
    };
    let target = req.target.clone();
    let connect = req.method.eq_ignore_ascii_case("CONNECT");
    let (host, port, forward) = match http::destination(&req, connect) {
        Ok(d) => d,
        Err(r) => return refuse(&mut client, log, id, &req.method, &target, &r),
    };
    let addr = match decide(cfg, &host, port) {
        Ok(a) => a,
        Err(r) => return refuse(&mut client, log, id, &req.method, &target, &r),
    };
    let d = Decided {
        method: req.method.clone(),
        host,
        port,
        addr,
    };
    if connect {
        tunnel(client, extra, id, &d, log);
    } else {
        let head = http::rewrite(&req, &forward);
        relay(client, head, extra, id, &d, log);
    }
}

/// The allow-list, then resolution and the address rule.
fn decide(cfg: &Config, host: &Host, port: u16) -> Result<SocketAddr, NetRefusal> {
    cfg.allow.permits(host, port)?;
    let (addrs, overridden) = match host {
        Host::Literal(a) => (vec![*a], true),
        Host::Name(n) => match cfg.hosts.get(n) {
            Some(a) => (vec![*a], true),
            None => {
                let found: Vec<IpAddr> = (n.as_str(), port)
                    .to_socket_addrs()
                    .map(|it| it.map(|s| s.ip()).collect())
                    .unwrap_or_default();
                (found, false)
            }
        },
    };
    netguard::check_resolved(&host.to_string(), &addrs, overridden)?;
    Ok(SocketAddr::new(addrs[0], port))
}

fn dial(d: &Decided) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&d.addr, Duration::from_secs(15))
}

fn opened(log: &Log, id: u64, d: &Decided) {
    log.write(json!({
        "id": id,
        "event": "open",
        "method": d.method,
        "host": d.host.to_string(),
        "port": d.port,
        "addr": d.addr.to_string(),
    }));
}

fn dial_failed(log: &Log, id: u64, d: &Decided, e: &std::io::Error) {
    log.write(json!({
        "id": id,
        "event": "failed",
        "method": d.method,
        "host": d.host.to_string(),
        "port": d.port,
        "addr": d.addr.to_string(),
        "error": e.to_string(),
    }));
}

fn tunnel(mut client: TcpStream, extra: Vec<u8>, id: u64, d: &Decided, log: &Log) {
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    // Nothing reaches the server before the ClientHello has been read and
    // its server name checked.
    let hello = match tls::read_first_record(&mut client, extra) {
        Ok(h) => h,
        Err(_) => return,
    };
    let verdict = match tls::server_name(&hello) {
        Err(()) => Err(NetRefusal::NotTls),
        Ok(sni) => netguard::check_sni(&d.host, sni.as_deref()),
    };
    if let Err(r) = verdict {
        log.write(json!({
            "id": id,
            "event": "refused",
            "method": d.method,
            "target": format!("{}:{}", d.host, d.port),
            "reason": r.code(),
            "detail": r.to_string(),
        }));
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    let up = match dial(d) {
        Ok(u) => u,
        Err(e) => return dial_failed(log, id, d, &e),
    };
    opened(log, id, d);
    pump(client, up, hello, id, log);
}

fn relay(mut client: TcpStream, head: Vec<u8>, extra: Vec<u8>, id: u64, d: &Decided, log: &Log) {
    let up = match dial(d) {
        Ok(u) => u,
        Err(e) => {
            dial_failed(log, id, d, &e);
            let _ = client.write_all(
                b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            );
            return;
        }
    };
    opened(log, id, d);
    let mut first = head;
    first.extend_from_slice(&extra);
    pump(client, up, first, id, log);
}

/// Copy both ways until either side ends; log the byte counts.
fn pump(client: TcpStream, mut up: TcpStream, first: Vec<u8>, id: u64, log: &Log) {
    let _ = client.set_read_timeout(None);
    let sent = Arc::new(AtomicU64::new(0));
    let (Ok(mut c_read), Ok(mut u_write)) = (client.try_clone(), up.try_clone()) else {
        return;
    };
    let ok = u_write.write_all(&first).is_ok();
    sent.fetch_add(first.len() as u64, Ordering::Relaxed);
    let counter = sent.clone();
    let upward = ok.then(|| {
        std::thread::spawn(move || {
            let _ = copy(&mut c_read, &mut u_write, &counter);
            let _ = u_write.shutdown(Shutdown::Write);
        })
    });
    let received = AtomicU64::new(0);
    let mut c_write = client;
    if ok {
        let _ = copy(&mut up, &mut c_write, &received);
    }
    let _ = c_write.shutdown(Shutdown::Both);
    let _ = up.shutdown(Shutdown::Both);
    if let Some(t) = upward {
        let _ = t.join();
    }
    log.write(json!({
        "id": id,
        "event": "close",
        "sent": sent.load(Ordering::Relaxed),
        "received": received.load(Ordering::Relaxed),
    }));
}

fn copy(from: &mut TcpStream, to: &mut TcpStream, n: &AtomicU64) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let k = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..k])?;
        n.fetch_add(k as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_log(name: &str) -> (std::path::PathBuf, std::fs::File) {
        let p = std::env::temp_dir().join(format!("retie-net-{name}-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .expect("temp log");
        (p, f)
    }

    /// The log stops at MAX_EVENTS with one `truncated` line.
    #[test]
    fn the_log_is_bounded() {
        let (p, f) = temp_log("log");
        let log = Log(Mutex::new((f, 0)));
        for i in 0..MAX_EVENTS + 50 {
            log.write(json!({"id": i, "event": "refused"}));
        }
        let text = std::fs::read_to_string(&p).expect("read log");
        let _ = std::fs::remove_file(&p);
        let n = text.lines().count() as u64;
        assert_eq!(n, MAX_EVENTS);
        assert!(text.lines().last().is_some_and(|l| l.contains("truncated")));
    }

    /// Connections past MAX_CONNECTIONS at once are closed and logged,
    /// not given a thread each.
    #[test]
    fn connections_at_once_are_bounded() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (p, f) = temp_log("conns");
        std::thread::spawn(move || serve(listener, Config::default(), f));
        // Each holds its connection open without sending a request.
        let held: Vec<TcpStream> = (0..MAX_CONNECTIONS + 20)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .collect();
        assert_eq!(held.len() as u64, MAX_CONNECTIONS + 20);
        let mut refused = 0;
        for _ in 0..200 {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            refused = text.matches("too_many_connections").count();
            if refused >= 20 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(&p);
        assert_eq!(refused, 20);
    }
}
