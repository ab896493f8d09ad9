//! The little HTTP/1 the proxy reads: a request head, its destination,
//! and the head rewritten for the server.

use std::io::Read;
use std::net::TcpStream;

use retie_policy::netguard::{split_authority, Host, NetRefusal};

/// The largest request head read.
const MAX_HEAD: usize = 32 * 1024;

/// A request head.
pub struct Request {
    pub method: String,
    pub target: String,
    pub version: String,
    pub headers: Vec<(String, String)>,
}

/// Read up to the blank line; returns the head and what came after it.
pub fn read_head(s: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let extra = buf.split_off(end + 4);
            return Ok((buf, extra));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too long"));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn bad(problem: &str) -> NetRefusal {
    NetRefusal::BadTarget {
        problem: problem.into(),
    }
}

pub fn parse(head: &[u8]) -> Result<Request, NetRefusal> {
    let text = std::str::from_utf8(head).map_err(|_| bad("request head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || target.is_empty() {
        return Err(bad("not an HTTP/1 request"));
    }
    let mut headers = Vec::new();
    for l in lines {
        if l.is_empty() {
            continue;
        }
        let (k, v) = l.split_once(':').ok_or_else(|| bad("malformed header"))?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    Ok(Request {
        method: method.to_owned(),
        target: target.to_owned(),
        version: version.to_owned(),
        headers,
    })
}

fn header<'a>(r: &'a Request, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Where a request goes: host, port, and (plain HTTP) the authority and
/// path to put in the forwarded head.
pub fn destination(r: &Request, connect: bool) -> Result<(Host, u16, Forward), NetRefusal> {
    if connect {
        let (host, port) = split_authority(&r.target)?;
        let port = port.ok_or_else(|| bad("CONNECT needs host:port"))?;
        return Ok((host, port, Forward::default()));
    }
    let (authority, path) = if let Some(rest) = strip_scheme(&r.target, "http://") {
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let path = match &rest[end..] {
            "" => "/".to_owned(),
            p if p.starts_with('/') => p.to_owned(),
            p => format!("/{p}"),
        };
        (rest[..end].to_owned(), path)
    } else if strip_scheme(&r.target, "https://").is_some() {
        return Err(bad("https:// goes through CONNECT"));
    } else if r.target.starts_with('/') {
        let host = header(r, "host").ok_or_else(|| bad("no Host header"))?;
        (host.to_owned(), r.target.clone())
    } else {
        return Err(bad("the request target is neither a URL nor a path"));
    };
    if authority.contains('@') {
        return Err(bad("credentials in the URL"));
    }
    let (host, port) = split_authority(&authority)?;
    Ok((host, port.unwrap_or(80), Forward { authority, path }))
}

fn strip_scheme<'a>(s: &'a str, scheme: &str) -> Option<&'a str> {
    (s.len() >= scheme.len() && s[..scheme.len()].eq_ignore_ascii_case(scheme))
        .then(|| &s[scheme.len()..])
}

/// The parts of a plain-HTTP destination that go into the forwarded head.
#[derive(Default)]
pub struct Forward {
    authority: String,
    path: String,
}

/// The head sent to the server: origin-form target, the Host the proxy
/// checked, no proxy headers, one request per connection.
pub fn rewrite(r: &Request, f: &Forward) -> Vec<u8> {
    let mut out = format!("{} {} {}\r\n", r.method, f.path, r.version);
    for (k, v) in &r.headers {
        let drop = [
            "host",
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authorization",
        ]
        .iter()
        .any(|h| k.eq_ignore_ascii_case(h));
        if !drop {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    out.push_str(&format!(
        "Host: {}\r\nConnection: close\r\n\r\n",
        f.authority
    ));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_destination_and_rewrite() {
        let r = parse(b"GET http://Pypi.test:8080/simple/x/?a=1 HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n").expect("parses");
        let (h, p, f) = destination(&r, false).expect("dest");
        assert_eq!(h, Host::Name("pypi.test".into()));
        assert_eq!(p, 8080);
        let out = String::from_utf8(rewrite(&r, &f)).expect("utf8");
        assert!(out.starts_with("GET /simple/x/?a=1 HTTP/1.1\r\n"), "{out}");
        assert!(out.contains("Host: Pypi.test:8080\r\n"));
        assert!(!out.contains("evil.test"));
        assert!(!out.to_ascii_lowercase().contains("proxy-connection"));
    }

    #[test]
    fn connect_needs_a_port_and_https_urls_are_refused() {
        let r = parse(b"CONNECT pypi.org HTTP/1.1\r\n\r\n").expect("parses");
        assert!(destination(&r, true).is_err());
        let r = parse(b"GET https://pypi.org/ HTTP/1.1\r\n\r\n").expect("parses");
        assert!(destination(&r, false).is_err());
        let r = parse(b"GET http://u:p@pypi.org/ HTTP/1.1\r\n\r\n").expect("parses");
        assert!(destination(&r, false).is_err());
    }
}
