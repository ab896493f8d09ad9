//! The network proxy's decisions, pure (ADR 0310): which `host:port` a
//! sandbox run with `--net allow:...` may reach, and whether an address a
//! name resolved to may be dialled. The proxy (crate `retie-net`) does the
//! I/O and asks these functions; the address rules are the URL guard's
//! ([`crate::urlguard::non_public`]), one table for both.
//!
//! - An entry is `HOST[:PORT]`: a DNS name (exact; `*.NAME` for every name
//!   below NAME), an IPv4 literal or a bracketed IPv6 literal. Without a
//!   port it allows 443 and 80.
//! - A request naming an IP literal is refused unless that literal is an
//!   entry (`CONNECT 1.2.3.4:443` needs `allow:1.2.3.4:443`).
//! - A name's addresses must all be public (not loopback, private,
//!   link-local/metadata, ...) unless they came from the person's resolver
//!   override (`[network] hosts`, `RETIE_NET_HOSTS`), which is how a person
//!   names a private address for a name on purpose.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use crate::urlguard::non_public;

/// Ports an entry without one allows.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllowEntry {
    /// Lower-case name without a trailing dot (`*.` kept for a wildcard),
    /// or the literal address as text.
    pub host: String,
    /// The literal address, when the entry is one.
    pub literal: Option<IpAddr>,
    /// `None`: [`DEFAULT_PORTS`].
    pub port: Option<u16>,
}

impl AllowEntry {
    fn port_ok(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    fn host_ok(&self, host: &Host) -> bool {
        match (host, self.literal) {
            (Host::Literal(a), Some(b)) => *a == b,
            (Host::Name(n), None) => match self.host.strip_prefix("*.") {
                Some(base) => n
                    .strip_suffix(base)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                None => *n == self.host,
            },
            _ => false,
        }
    }
}

impl AllowEntry {
    /// How it is printed at start and recorded: what the entry lets
    /// through.
    pub fn describe(&self) -> String {
        match self.literal.map(non_public) {
            Some(Some(kind)) => format!(
                "{self} (an address literal that is {kind}; honoured because given as a literal)"
            ),
            Some(None) => format!("{self} (an address literal)"),
            None => format!("{self} (a name: every address it resolves to must be public)"),
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.literal, self.port) {
            (Some(IpAddr::V6(a)), Some(p)) => write!(f, "[{a}]:{p}"),
            (Some(IpAddr::V6(a)), None) => write!(f, "[{a}]"),
            (_, Some(p)) => write!(f, "{}:{p}", self.host),
            (_, None) => f.write_str(&self.host),
        }
    }
}

/// A parsed allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AllowList {
    /// The entries, in the order given.
    pub entries: Vec<AllowEntry>,
}

/// A requested host: a name (lower case, no trailing dot) or a literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name.
    Name(String),
    /// An IP literal.
    Literal(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Literal(a) => write!(f, "{a}"),
        }
    }
}

/// Why the proxy refused a connection. `code()` is what the ledger keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum NetRefusal {
    /// The request's authority or URL could not be read.
    BadTarget {
        /// What was wrong.
        problem: String,
    },
    /// The host is not on the allow-list.
    NotListed {
        /// The host asked for.
        host: String,
    },
    /// The host is listed, but not with this port.
    PortNotListed {
        /// The host asked for.
        host: String,
        /// The port asked for.
        port: u16,
    },
    /// An IP literal that is not itself an entry.
    LiteralNotListed {
        /// The literal.
        addr: IpAddr,
    },
    /// The name resolved to no address.
    NoAddresses {
        /// The name.
        host: String,
    },
    /// The name resolved to a non-public address the person did not name.
    PrivateAddress {
        /// The name.
        host: String,
        /// The address.
        addr: IpAddr,
        /// What kind of address it is.
        kind: &'static str,
    },
    /// The TLS ClientHello named another host than the CONNECT did.
    SniMismatch {
        /// The CONNECT's host.
        host: String,
        /// The ClientHello's server name (`None`: it named none).
        sni: Option<String>,
    },
    /// What came through a CONNECT tunnel was not a TLS ClientHello.
    NotTls,
}

impl NetRefusal {
    /// The stable code, for the ledger and tests.
    pub fn code(&self) -> &'static str {
        match self {
            NetRefusal::BadTarget { .. } => "bad_target",
            NetRefusal::NotListed { .. } => "not_listed",
            NetRefusal::PortNotListed { .. } => "port_not_listed",
            NetRefusal::LiteralNotListed { .. } => "literal_not_listed",
            NetRefusal::NoAddresses { .. } => "no_addresses",
            NetRefusal::PrivateAddress { .. } => "private_address",
            NetRefusal::SniMismatch { .. } => "sni_mismatch",
            NetRefusal::NotTls => "not_tls",
        }
    }
}

impl fmt::Display for NetRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetRefusal::BadTarget { problem } => write!(f, "unreadable request target: {problem}"),
            NetRefusal::NotListed { host } => write!(f, "{host} is not on the allow-list"),
            NetRefusal::PortNotListed { host, port } => {
                write!(f, "{host} is allowed, but not on port {port}")
            }
            NetRefusal::LiteralNotListed { addr } => write!(
                f,
                "{addr} is an IP literal; only a literal named in the allow-list may be reached"
            ),
            NetRefusal::NoAddresses { host } => write!(f, "{host} resolved to no address"),
            NetRefusal::PrivateAddress { host, addr, kind } => write!(
                f,
                "{host} resolved to {addr}, a {kind} address (allowed only when named literally, or through the resolver override)"
            ),
            NetRefusal::SniMismatch { host, sni: Some(s) } => {
                write!(f, "the tunnel to {host} sent a TLS hello for {s}")
            }
            NetRefusal::SniMismatch { host, sni: None } => {
                write!(f, "the tunnel to {host} sent a TLS hello naming no server")
            }
            NetRefusal::NotTls => f.write_str("a CONNECT tunnel carries TLS only"),
        }
    }
}

/// A bad allow-list entry or resolver override (the person's input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryError(pub String);

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Split `host[:port]` / `[v6][:port]` and read the host: the proxy's
/// reading of a request's authority. [`parse_authority`] with the error
/// as a [`NetRefusal`].
pub fn split_authority(s: &str) -> Result<(Host, Option<u16>), NetRefusal> {
    parse_authority(s).map_err(|problem| NetRefusal::BadTarget {
        problem: format!("{s:?}: {problem}"),
    })
}

/// The one `HOST[:PORT]` reader (ADR 0312), for every allow-list
/// (`--net allow:`, `[network] allow`, `--fetch-allow`) and for the
/// proxy's request targets:
///
/// - a name is ASCII, lower-cased, one trailing dot dropped, labels of
///   letters, digits, `-` and `_` (1-63 bytes, 253 in all); a non-ASCII
///   (international) name is refused with its IDNA (punycode) spelling,
///   which is what clients send and what is compared;
/// - an IPv4 literal is plain dotted decimal; numeric forms a resolver
///   would read as an address (`127.1`, `0x7f.1`, `2130706433`) are
///   refused, not taken as names;
/// - an IPv6 literal is bracketed, `[ADDR]` or `[ADDR]:PORT`; an
///   unbracketed one is refused (`::1:80` could be either);
/// - the port is decimal digits, 1-65535;
/// - anything with `/`, `?`, `#` or `@` is a URL, not an entry; nor is
///   anything with whitespace.
pub fn parse_authority(s: &str) -> Result<(Host, Option<u16>), String> {
    if s.is_empty() {
        return Err("empty; expected HOST[:PORT]".into());
    }
    if s.contains(['/', '?', '#', '@']) {
        return Err("expected HOST[:PORT], not a URL".into());
    }
    if s.contains(char::is_whitespace) {
        return Err("not a host name: it holds whitespace".into());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or("an unclosed `[`")?;
        let port = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or("expected :PORT after `]`")?),
        };
        let a: Ipv6Addr = h
            .parse()
            .map_err(|_| format!("{h:?} inside `[...]` is not an IPv6 literal"))?;
        (Host::Literal(IpAddr::V6(a)), port)
    } else {
        match s.split_once(':') {
            None => (parse_host(s)?, None),
            Some((h, p)) if !p.contains(':') => (parse_host(h)?, Some(p)),
            Some(_) => return Err(
                "an IPv6 literal goes in brackets ([ADDR] or [ADDR]:PORT); a name takes one :PORT"
                    .into(),
            ),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(parse_port(p)?),
    };
    Ok((host, port))
}

fn parse_port(p: &str) -> Result<u16, String> {
    let bad = || format!("the port {p:?} must be a number 1-65535");
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)
}

/// Read a host alone (no port, no brackets): a plain dotted IPv4 literal
/// or an ASCII name, by the rules of [`parse_authority`].
pub fn parse_host(h: &str) -> Result<Host, String> {
    if h.is_empty() {
        return Err("no host".into());
    }
    if !h.is_ascii() {
        return Err(match url::Host::parse(h) {
            Ok(url::Host::Domain(d)) => {
                format!("{h:?} is not ASCII: write an international name in its IDNA form, {d:?}")
            }
            _ => format!("{h:?} is not ASCII and not a valid international name"),
        });
    }
    if let Ok(a) = h.parse::<Ipv4Addr>() {
        return Ok(Host::Literal(IpAddr::V4(a)));
    }
    let n = h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if n.is_empty() || n.len() > 253 || !n.split('.').all(label_ok) {
        return Err(format!("{h:?} is not a host name"));
    }
    // A dotted-number form getaddrinfo would read as an address
    // (`0x7f.1`, `2130706433`): a literal in disguise, refused.
    if n.split('.').all(|l| {
        l.bytes().all(|b| b.is_ascii_digit())
            || (l.starts_with("0x") && l[2..].bytes().all(|b| b.is_ascii_hexdigit()))
    }) {
        return Err(format!(
            "{h:?} is a numeric host that is not a plain dotted IPv4 literal"
        ));
    }
    Ok(Host::Name(n))
}

impl AllowList {
    /// Parse entries (`HOST[:PORT]`, `*.NAME[:PORT]`, `[V6][:PORT]`).
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<AllowList, EntryError> {
        let mut entries = Vec::new();
        for item in items {
            let s = item.as_ref().trim();
            let (wild, rest) = match s.strip_prefix("*.") {
                Some(r) => (true, r),
                None => (false, s),
            };
            let (host, port) =
                parse_authority(rest).map_err(|e| EntryError(format!("allow entry {s:?}: {e}")))?;
            let entry = match host {
                Host::Literal(_) if wild => {
                    return Err(EntryError(format!(
                        "allow entry {s:?}: `*.` goes before a name, not an address"
                    )))
                }
                Host::Literal(a) => AllowEntry {
                    host: a.to_string(),
                    literal: Some(a),
                    port,
                },
                Host::Name(n) => AllowEntry {
                    host: if wild { format!("*.{n}") } else { n },
                    literal: None,
                    port,
                },
            };
            if !entries.contains(&entry) {
                entries.push(entry);
            }
        }
        Ok(AllowList { entries })
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries as text, for the ledger.
    pub fn texts(&self) -> Vec<String> {
        self.entries.iter().map(ToString::to_string).collect()
    }

    /// May `host:port` be asked for at all (before any resolution)?
    pub fn permits(&self, host: &Host, port: u16) -> Result<(), NetRefusal> {
        let matching: Vec<&AllowEntry> = self.entries.iter().filter(|e| e.host_ok(host)).collect();
        if matching.is_empty() {
            return Err(match host {
                Host::Literal(addr) => NetRefusal::LiteralNotListed { addr: *addr },
                Host::Name(n) => NetRefusal::NotListed { host: n.clone() },
            });
        }
        if matching.iter().any(|e| e.port_ok(port)) {
            Ok(())
        } else {
            Err(NetRefusal::PortNotListed {
                host: host.to_string(),
                port,
            })
        }
    }
}

/// Check what a name resolved to. `overridden`: the addresses came from
/// the person's resolver override, so non-public ones are allowed (the
/// person named them). Every address must pass, not only the first: the
/// proxy dials the first that passes, and a name answering with one
/// public and one private address is refused outright.
pub fn check_resolved(host: &str, addrs: &[IpAddr], overridden: bool) -> Result<(), NetRefusal> {
    if addrs.is_empty() {
        return Err(NetRefusal::NoAddresses { host: host.into() });
    }
    if overridden {
        return Ok(());
    }
    for a in addrs {
        if let Some(kind) = non_public(*a) {
            return Err(NetRefusal::PrivateAddress {
                host: host.into(),
                addr: *a,
                kind,
            });
        }
    }
    Ok(())
}

/// Whether the ClientHello's server name fits the CONNECT's host. A
/// literal CONNECT (allowed only when listed) may carry no name.
pub fn check_sni(host: &Host, sni: Option<&str>) -> Result<(), NetRefusal> {
    let fits = match (host, sni) {
        (Host::Name(n), Some(s)) => s.trim_end_matches('.').eq_ignore_ascii_case(n),
        (Host::Literal(_), None) => true,
        (Host::Literal(a), Some(s)) => s.parse::<IpAddr>().is_ok_and(|b| b == *a),
        (Host::Name(_), None) => false,
    };
    if fits {
        Ok(())
    } else {
        Err(NetRefusal::SniMismatch {
            host: host.to_string(),
            sni: sni.map(str::to_owned),
        })
    }
}

/// Parse a resolver override: `NAME=ADDR` items, separated by commas or
/// whitespace (`RETIE_NET_HOSTS=pypi.test=127.0.0.1`).
pub fn parse_hosts(s: &str) -> Result<BTreeMap<String, IpAddr>, EntryError> {
    let mut out = BTreeMap::new();
    for item in s.split(|c: char| c == ',' || c.is_whitespace()) {
        if item.is_empty() {
            continue;
        }
        let (n, a) = item.split_once('=').ok_or_else(|| {
            EntryError(format!("resolver override {item:?}: expected NAME=ADDRESS"))
        })?;
        let name = match parse_host(n) {
            Ok(Host::Name(n)) => n,
            _ => {
                return Err(EntryError(format!(
                    "resolver override {item:?}: {n:?} is not a host name"
                )))
            }
        };
        let addr: IpAddr = a
            .trim_matches(|c| c == '[' || c == ']')
            .parse()
            .map_err(|_| {
                EntryError(format!(
                    "resolver override {item:?}: {a:?} is not an IP address"
                ))
            })?;
        out.insert(name, addr);
    }
    Ok(out)
}

/// One named registry host: `--net registries`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RegistryHost {
    /// The toolchain it serves.
    pub toolchain: &'static str,
    /// The allow entry.
    pub entry: &'static str,
    /// Why it is on the list.
    pub reason: &'static str,
}

/// The hosts `--net registries` allows (HTTPS only), kept as data; a
/// `[network] registries = [...]` list in the config replaces it.
pub const REGISTRIES: &[RegistryHost] = &[
    RegistryHost {
        toolchain: "npm",
        entry: "registry.npmjs.org:443",
        reason: "npm's registry: package documents and tarballs",
    },
    RegistryHost {
        toolchain: "pip",
        entry: "pypi.org:443",
        reason: "PyPI's simple index and JSON API",
    },
    RegistryHost {
        toolchain: "pip",
        entry: "files.pythonhosted.org:443",
        reason: "PyPI's file host: the wheels and sdists the index links to",
    },
    RegistryHost {
        toolchain: "cargo",
        entry: "index.crates.io:443",
        reason: "crates.io's sparse index",
    },
    RegistryHost {
        toolchain: "cargo",
        entry: "static.crates.io:443",
        reason: "crates.io's crate downloads",
    },
    RegistryHost {
        toolchain: "go",
        entry: "proxy.golang.org:443",
        reason: "the Go module proxy (GOPROXY's default)",
    },
    RegistryHost {
        toolchain: "go",
        entry: "sum.golang.org:443",
        reason: "the Go checksum database (GOSUMDB's default)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> AllowList {
        AllowList::parse(items).expect("parses")
    }
    fn name(n: &str) -> Host {
        Host::Name(n.into())
    }

    #[test]
    fn names_ports_and_wildcards() {
        let l = list(&["pypi.test:8080", "Registry.NPMjs.org.", "*.example.com:443"]);
        assert!(l.permits(&name("pypi.test"), 8080).is_ok());
        assert_eq!(
            l.permits(&name("pypi.test"), 8081).map_err(|e| e.code()),
            Err("port_not_listed")
        );
        assert!(l.permits(&name("registry.npmjs.org"), 443).is_ok());
        assert!(l.permits(&name("registry.npmjs.org"), 80).is_ok());
        assert!(l.permits(&name("registry.npmjs.org"), 8443).is_err());
        assert!(l.permits(&name("a.example.com"), 443).is_ok());
        assert!(l.permits(&name("a.b.example.com"), 443).is_ok());
        assert_eq!(
            l.permits(&name("example.com"), 443).map_err(|e| e.code()),
            Err("not_listed")
        );
        assert!(l.permits(&name("xexample.com"), 443).is_err());
        assert!(l.permits(&name("evil.test"), 8080).is_err());
    }

    #[test]
    fn literals_only_when_listed_literally() {
        let l = list(&["pypi.test:8080", "127.0.0.1:9000", "[::1]:9001"]);
        let lit = |s: &str| Host::Literal(s.parse().expect("addr"));
        assert_eq!(
            l.permits(&lit("127.0.0.1"), 8080).map_err(|e| e.code()),
            Err("port_not_listed")
        );
        assert_eq!(
            l.permits(&lit("10.0.0.1"), 8080).map_err(|e| e.code()),
            Err("literal_not_listed")
        );
        assert!(l.permits(&lit("127.0.0.1"), 9000).is_ok());
        assert!(l.permits(&lit("::1"), 9001).is_ok());
        // Numeric disguises of a literal are no names.
        assert!(split_authority("2130706433:80").is_err());
        assert!(split_authority("0x7f.1:80").is_err());
        assert!(split_authority("127.1:80").is_err());
    }

    #[test]
    fn resolved_addresses_must_be_public_unless_overridden() {
        let a = |s: &str| -> IpAddr { s.parse().expect("addr") };
        assert!(check_resolved("x.test", &[a("93.184.216.34")], false).is_ok());
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "192.168.1.1",
            "::1",
        ] {
            assert_eq!(
                check_resolved("x.test", &[a("93.184.216.34"), a(private)], false)
                    .map_err(|e| e.code()),
                Err("private_address"),
                "{private}"
            );
        }
        assert!(check_resolved("x.test", &[a("127.0.0.1")], true).is_ok());
        assert_eq!(
            check_resolved("x.test", &[], true).map_err(|e| e.code()),
            Err("no_addresses")
        );
    }

    #[test]
    fn sni_must_name_the_connect_host() {
        assert!(check_sni(&name("pypi.org"), Some("PyPI.org")).is_ok());
        assert!(check_sni(&name("pypi.org"), Some("evil.com")).is_err());
        assert!(check_sni(&name("pypi.org"), None).is_err());
    }

    #[test]
    fn bad_entries_and_overrides_are_clear_errors() {
        for bad in [
            "",
            "a b",
            "host:0",
            "host:99999",
            "[::1",
            "*.1.2.3.4",
            "x:y",
        ] {
            assert!(AllowList::parse(&[bad]).is_err(), "{bad}");
        }
        let h = parse_hosts("pypi.test=127.0.0.1, npm.test=127.0.0.1").expect("parses");
        assert_eq!(h.len(), 2);
        assert!(parse_hosts("pypi.test").is_err());
        assert!(parse_hosts("pypi.test=nope").is_err());
    }

    /// The rules of the one `HOST[:PORT]` reader (ADR 0312), entry by
    /// entry: what each input reads as, or that it is refused.
    #[test]
    fn one_host_port_reader_edge_cases() {
        let ok = |s: &str| parse_authority(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let lit = |s: &str| Host::Literal(s.parse().expect("addr"));
        // Lower case, one trailing dot dropped.
        assert_eq!(ok("PyPI.Org."), (name("pypi.org"), None));
        assert_eq!(ok("pypi.org:8080"), (name("pypi.org"), Some(8080)));
        assert_eq!(ok("a_b.test:1"), (name("a_b.test"), Some(1)));
        assert_eq!(ok("127.0.0.1:65535"), (lit("127.0.0.1"), Some(65535)));
        // IPv6 in brackets only.
        assert_eq!(ok("[::1]"), (lit("::1"), None));
        assert_eq!(ok("[::1]:9"), (lit("::1"), Some(9)));
        assert_eq!(ok("[FE80::1]:443"), (lit("fe80::1"), Some(443)));
        for (bad, why) in [
            ("", "empty"),
            ("::1", "brackets"),
            ("::1:80", "brackets"),
            ("2001:db8::1", "brackets"),
            ("[::1", "unclosed"),
            ("[::1]80", "after `]`"),
            ("[pypi.org]:80", "not an IPv6"),
            ("[1.2.3.4]:80", "not an IPv6"),
            ("pypi.org:", "port"),
            ("pypi.org:0", "port"),
            ("pypi.org:65536", "port"),
            ("pypi.org:+80", "port"),
            ("pypi.org:0x50", "port"),
            ("pypi.org:080000", "port"),
            ("pypi.org..", "not a host name"),
            (".pypi.org", "not a host name"),
            ("pypi..org", "not a host name"),
            ("a b", "whitespace"),
            ("http://pypi.org/", "URL"),
            ("user@pypi.org", "URL"),
            ("pypi.org/simple", "URL"),
            ("bücher.example", "xn--bcher-kva.example"),
            ("127.1", "numeric"),
            ("0x7f.1:80", "numeric"),
            ("2130706433", "numeric"),
            ("x:y", "port"),
        ] {
            let e = parse_authority(bad).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let long = format!("{}.test", "a".repeat(64));
        assert!(parse_authority(&long).is_err());
        // The forms the old `--fetch-allow` parser read otherwise: it took
        // `::1:80` as the address ::1:80 (no port), `0x7f.1` as 127.0.0.1
        // and `bücher.example` as its punycode; each is refused now.
        for old in ["::1:80", "0x7f.1:8080", "bücher.example"] {
            assert!(AllowList::parse(&[old]).is_err(), "{old}");
        }
    }

    #[test]
    fn the_registries_table_parses() {
        let entries: Vec<&str> = REGISTRIES.iter().map(|r| r.entry).collect();
        assert_eq!(list(&entries).entries.len(), REGISTRIES.len());
    }
}

#[cfg(test)]
mod policy_tests {
    use crate::{trifecta, Action, Policy, Taint};

    /// What `retie sandbox exec --net allow:` declares: the trifecta rule
    /// fires for it in a session that took in untrusted content, and it
    /// taints a clean session.
    #[test]
    fn a_networked_run_sends_out_and_brings_untrusted_content() {
        let policy = Policy::shipped().expect("shipped policy");
        let action = Action::from_json(
            r#"{"tool":"bash","args":{"command":"pip install x"},"effects":["reads_workspace","writes_workspace","runs_sandboxed","network_egress","reads_untrusted"]}"#,
        )
        .expect("action");
        assert!(trifecta::fires(Taint::tainted(), &policy, &action));
        assert!(Taint::default().after(&policy, &action).untrusted);
        assert!(trifecta::can_send_out(&policy, &action));
    }
}
