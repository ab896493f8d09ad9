//! The URL guard of the fetch tool.
//!
//! A pure function over a URL and the addresses its host resolved to. The
//! caller resolves (that is I/O, and lives outside this crate), passes the
//! addresses in, and connects only to the [`Pinned`] address returned, so a
//! second resolution cannot rebind the name to somewhere else. Redirects are
//! followed by hand and every hop goes through [`check_redirect`].
//!
//! URLs are parsed the WHATWG way (the `url` crate), which is how browsers
//! and most HTTP clients read them: `http://2130706433/`, `http://0x7f.1/`
//! and `http://0177.0.0.1/` all mean 127.0.0.1, and international names are
//! converted to their ASCII (IDNA) form before anything is compared.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;
use url::{Host, Url};

/// Most redirects one fetch follows.
pub const MAX_REDIRECTS: usize = 5;

/// Where a checked fetch must connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pinned {
    /// The URL, normalized (IDNA host, default port dropped).
    pub url: String,
    /// The host as it goes in the `Host` header (ASCII).
    pub host: String,
    /// Connect to this address and no other.
    pub addr: SocketAddr,
}

/// What the caller must resolve before calling [`check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Target {
    /// A name to resolve.
    Name {
        /// ASCII (IDNA) host name.
        host: String,
        /// Port to connect to.
        port: u16,
    },
    /// An address literal: nothing to resolve.
    Literal(SocketAddr),
}

/// Why a URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Refusal {
    /// The text is not a URL.
    Unparseable {
        /// The parser's words.
        problem: String,
    },
    /// Not http or https.
    Scheme {
        /// The scheme given.
        scheme: String,
    },
    /// The URL carries a user name or password.
    Userinfo,
    /// The URL has no host.
    NoHost,
    /// The name is one that always means this machine (`localhost`).
    LocalName {
        /// The name.
        host: String,
    },
    /// The name resolved to nothing.
    NoAddresses,
    /// An address the name resolved to (or the literal) is not public.
    Address {
        /// The address.
        addr: IpAddr,
        /// What kind of address it is.
        kind: &'static str,
    },
    /// Too many redirects.
    TooManyRedirects {
        /// The limit.
        limit: usize,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unparseable { problem } => write!(f, "not a URL: {problem}"),
            Refusal::Scheme { scheme } => {
                write!(f, "scheme {scheme:?} is not allowed (only http and https)")
            }
            Refusal::Userinfo => f.write_str("URLs with a user name or password are refused"),
            Refusal::NoHost => f.write_str("the URL has no host"),
            Refusal::LocalName { host } => write!(f, "{host:?} always names this machine"),
            Refusal::NoAddresses => f.write_str("the host resolved to no address"),
            Refusal::Address { addr, kind } => {
                write!(f, "{addr} is a {kind} address, not a public one")
            }
            Refusal::TooManyRedirects { limit } => {
                write!(f, "more than {limit} redirects")
            }
        }
    }
}

/// Parse `url` and say what must be resolved for it.
pub fn target(url: &str) -> Result<Target, Refusal> {
    let parsed = parse(url)?;
    target_of(&parsed)
}

fn parse(url: &str) -> Result<Url, Refusal> {
    let parsed = Url::parse(url.trim()).map_err(|e| Refusal::Unparseable {
        problem: e.to_string(),
    })?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => {
            return Err(Refusal::Scheme {
                scheme: other.to_owned(),
            })
        }
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Refusal::Userinfo);
    }
    Ok(parsed)
}

fn target_of(url: &Url) -> Result<Target, Refusal> {
    let port = url.port_or_known_default().unwrap_or(80);
    match url.host() {
        None => Err(Refusal::NoHost),
        Some(Host::Ipv4(a)) => Ok(Target::Literal(SocketAddr::new(IpAddr::V4(a), port))),
        Some(Host::Ipv6(a)) => Ok(Target::Literal(SocketAddr::new(IpAddr::V6(a), port))),
        Some(Host::Domain(d)) => {
            let host = d.trim_end_matches('.').to_ascii_lowercase();
            if host.is_empty() {
                return Err(Refusal::NoHost);
            }
            if host == "localhost" || host.ends_with(".localhost") {
                return Err(Refusal::LocalName { host });
            }
            Ok(Target::Name { host, port })
        }
    }
}

/// Check `url` given the addresses its host resolved to. For an address
/// literal `resolved` is ignored. Every address must be public (a name that
/// also resolves to a private address is refused, not filtered); the first
/// one is pinned.
pub fn check(url: &str, resolved: &[IpAddr]) -> Result<Pinned, Refusal> {
    let parsed = parse(url)?;
    check_parsed(&parsed, resolved)
}

fn check_parsed(url: &Url, resolved: &[IpAddr]) -> Result<Pinned, Refusal> {
    let (host, addrs, port) = match target_of(url)? {
        Target::Literal(sa) => (sa.ip().to_string(), vec![sa.ip()], sa.port()),
        Target::Name { host, port } => (host, resolved.to_vec(), port),
    };
    let Some(first) = addrs.first().copied() else {
        return Err(Refusal::NoAddresses);
    };
    for addr in &addrs {
        if let Some(kind) = non_public(*addr) {
            return Err(Refusal::Address { addr: *addr, kind });
        }
    }
    Ok(Pinned {
        url: url.to_string(),
        host,
        addr: SocketAddr::new(first, port),
    })
}

/// Check one redirect hop: `location` (absolute or relative to `from`) with
/// the addresses its host resolved to. `hop` counts from 1.
pub fn check_redirect(
    from: &str,
    location: &str,
    hop: usize,
    resolved: &[IpAddr],
) -> Result<Pinned, Refusal> {
    if hop > MAX_REDIRECTS {
        return Err(Refusal::TooManyRedirects {
            limit: MAX_REDIRECTS,
        });
    }
    let base = parse(from)?;
    let next = base
        .join(location.trim())
        .map_err(|e| Refusal::Unparseable {
            problem: e.to_string(),
        })?;
    // Re-parse the joined URL so every rule of `check` applies to it too.
    let next = parse(next.as_str())?;
    check_parsed(&next, resolved)
}

/// What the redirect target of `location` from `from` needs resolved.
pub fn redirect_target(from: &str, location: &str) -> Result<Target, Refusal> {
    let base = parse(from)?;
    let next = base
        .join(location.trim())
        .map_err(|e| Refusal::Unparseable {
            problem: e.to_string(),
        })?;
    target(next.as_str())
}

/// `None` for a public address, else what kind of address it is.
pub fn non_public(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) => non_public_v4(a),
        IpAddr::V6(a) => non_public_v6(a),
    }
}

fn in_v4(a: Ipv4Addr, net: [u8; 4], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    (u32::from(a) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn non_public_v4(a: Ipv4Addr) -> Option<&'static str> {
    const TABLE: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "unspecified (\"this network\")"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "carrier-grade NAT"),
        ([127, 0, 0, 0], 8, "loopback"),
        (
            [169, 254, 0, 0],
            16,
            "link-local (cloud metadata lives here)",
        ),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "IETF protocol assignment"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "6to4 relay anycast"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved (and broadcast)"),
    ];
    TABLE
        .iter()
        .find(|(net, bits, _)| in_v4(a, *net, *bits))
        .map(|(_, _, kind)| *kind)
}

fn in_v6(a: Ipv6Addr, net: [u16; 8], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u128::MAX << (128 - bits)
    };
    (u128::from(a) & mask) == (u128::from(Ipv6Addr::from(net)) & mask)
}

fn non_public_v6(a: Ipv6Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        return Some("unspecified");
    }
    if a.is_loopback() {
        return Some("loopback");
    }
    const TABLE: &[([u16; 8], u32, &str)] = &[
        ([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, "IPv4-mapped IPv6"),
        ([0, 0, 0, 0, 0, 0, 0, 0], 96, "IPv4-compatible IPv6"),
        ([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, "NAT64 (embeds IPv4)"),
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use NAT64"),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only"),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "Teredo (embeds IPv4)"),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
        ([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, "6to4 (embeds IPv4)"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique-local"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local (deprecated)"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
    ];
    TABLE
        .iter()
        .find(|(net, bits, _)| in_v6(a, *net, *bits))
        .map(|(_, _, kind)| *kind)
}
