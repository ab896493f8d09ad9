//! The URL guard against a table of tricky addresses.

use retie_policy::urlguard::{check, check_redirect, target, Refusal, Target, MAX_REDIRECTS};
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const PUBLIC: &str = "93.184.215.14";

/// (url, what its host resolves to, expected: Ok(pinned ip) or Err(code)).
const TABLE: &[(&str, &[&str], Result<&str, &str>)] = &[
    ("https://example.com/", &[PUBLIC], Ok(PUBLIC)),
    ("http://example.com:8080/x", &[PUBLIC], Ok(PUBLIC)),
    (
        "https://example.com/",
        &["2606:2800:21f:cb07:6820:80da:af6b:8b2c"],
        Ok("2606:2800:21f:cb07:6820:80da:af6b:8b2c"),
    ),
    // names resolving to internal addresses
    ("https://example.com/", &["127.0.0.1"], Err("address")),
    (
        "https://example.com/",
        &[PUBLIC, "10.0.0.1"],
        Err("address"),
    ),
    ("https://example.com/", &["169.254.169.254"], Err("address")),
    ("https://example.com/", &["100.64.0.1"], Err("address")),
    ("https://example.com/", &["192.168.1.1"], Err("address")),
    ("https://example.com/", &["172.16.5.4"], Err("address")),
    ("https://example.com/", &["fd00::1"], Err("address")),
    ("https://example.com/", &["fe80::1"], Err("address")),
    ("https://example.com/", &["::1"], Err("address")),
    (
        "https://example.com/",
        &["::ffff:127.0.0.1"],
        Err("address"),
    ),
    (
        "https://example.com/",
        &["::ffff:93.184.215.14"],
        Err("address"),
    ),
    ("https://example.com/", &["::127.0.0.1"], Err("address")),
    ("https://example.com/", &["224.0.0.1"], Err("address")),
    ("https://example.com/", &["ff02::1"], Err("address")),
    ("https://example.com/", &["0.0.0.0"], Err("address")),
    ("https://example.com/", &["::"], Err("address")),
    ("https://example.com/", &["255.255.255.255"], Err("address")),
    ("https://example.com/", &["64:ff9b::7f00:1"], Err("address")),
    ("https://example.com/", &["2002:7f00:1::"], Err("address")),
    ("https://example.com/", &[], Err("no_addresses")),
    // literal addresses, in every spelling the WHATWG parser accepts
    ("http://127.0.0.1/", &[PUBLIC], Err("address")),
    ("http://2130706433/", &[], Err("address")),
    ("http://0x7f000001/", &[], Err("address")),
    ("http://0x7f.0.0.1/", &[], Err("address")),
    ("http://0177.0.0.1/", &[], Err("address")),
    ("http://0177.1/", &[], Err("address")),
    ("http://127.1/", &[], Err("address")),
    ("http://0/", &[], Err("address")),
    ("http://0.0.0.0:8080/", &[], Err("address")),
    ("http://[::1]/", &[], Err("address")),
    ("http://[::ffff:127.0.0.1]/", &[], Err("address")),
    ("http://[::ffff:7f00:1]/", &[], Err("address")),
    ("http://[0:0:0:0:0:ffff:a9fe:a9fe]/", &[], Err("address")),
    (
        "http://169.254.169.254/latest/meta-data/",
        &[],
        Err("address"),
    ),
    ("http://[fd12:3456::1]/", &[], Err("address")),
    ("http://93.184.215.14/", &[], Ok(PUBLIC)),
    ("http://1572394766/", &[], Ok(PUBLIC)),
    // names
    ("http://localhost/", &[PUBLIC], Err("local_name")),
    ("http://LOCALHOST./", &[PUBLIC], Err("local_name")),
    ("http://api.localhost/", &[PUBLIC], Err("local_name")),
    ("http://ⓛocalhost/", &[PUBLIC], Err("local_name")),
    ("http://locａlhost/", &[PUBLIC], Err("local_name")),
    ("https://bücher.example/", &[PUBLIC], Ok(PUBLIC)),
    // userinfo
    ("http://a@127.0.0.1/", &[], Err("userinfo")),
    ("http://example.com@127.0.0.1/", &[], Err("userinfo")),
    ("http://user:pw@example.com/", &[PUBLIC], Err("userinfo")),
    // schemes
    ("file:///etc/passwd", &[], Err("scheme")),
    ("ftp://example.com/", &[PUBLIC], Err("scheme")),
    ("gopher://127.0.0.1:6379/_INFO", &[], Err("scheme")),
    ("javascript:alert(1)", &[], Err("scheme")),
    ("data:text/plain,hi", &[], Err("scheme")),
    ("//example.com/", &[PUBLIC], Err("unparseable")),
    ("not a url", &[], Err("unparseable")),
    ("http://", &[], Err("unparseable")),
];

fn code(r: &Refusal) -> &'static str {
    match r {
        Refusal::Unparseable { .. } => "unparseable",
        Refusal::Scheme { .. } => "scheme",
        Refusal::Userinfo => "userinfo",
        Refusal::NoHost => "no_host",
        Refusal::LocalName { .. } => "local_name",
        Refusal::NoAddresses => "no_addresses",
        Refusal::Address { .. } => "address",
        Refusal::TooManyRedirects { .. } => "too_many_redirects",
    }
}

#[test]
fn tricky_address_table() {
    for (url, resolved, want) in TABLE {
        let addrs: Vec<IpAddr> = resolved.iter().map(|s| ip(s)).collect();
        let got = check(url, &addrs);
        match (want, &got) {
            (Ok(pin), Ok(p)) => assert_eq!(p.addr.ip(), ip(pin), "{url}"),
            (Err(c), Err(r)) => assert_eq!(code(r), *c, "{url}: {r}"),
            _ => panic!("{url} with {resolved:?}: want {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn pinned_port_and_host() {
    let p = check("https://Example.COM/a?b", &[ip(PUBLIC)]).unwrap();
    assert_eq!(p.addr.port(), 443);
    assert_eq!(p.host, "example.com");
    let p = check("http://example.com:8080/", &[ip(PUBLIC)]).unwrap();
    assert_eq!(p.addr.port(), 8080);
    let p = check("https://bücher.example/", &[ip(PUBLIC)]).unwrap();
    assert_eq!(p.host, "xn--bcher-kva.example");
}

#[test]
fn target_says_what_to_resolve() {
    assert_eq!(
        target("https://bücher.example:444/").unwrap(),
        Target::Name {
            host: "xn--bcher-kva.example".into(),
            port: 444
        }
    );
    assert!(
        matches!(target("http://2130706433/").unwrap(), Target::Literal(sa) if sa.ip() == ip("127.0.0.1"))
    );
    assert!(target("file:///etc/passwd").is_err());
}

#[test]
fn every_redirect_hop_is_checked() {
    let from = "https://example.com/start";
    let pub_ = [ip(PUBLIC)];
    assert!(check_redirect(from, "/next", 1, &pub_).is_ok());
    assert!(check_redirect(from, "https://other.example/", 1, &pub_).is_ok());
    let refusals = [
        ("file:///etc/passwd", &pub_[..], "scheme"),
        ("http://127.0.0.1/admin", &pub_[..], "address"),
        ("http://[::ffff:127.0.0.1]/", &pub_[..], "address"),
        ("http://internal.example/", &[ip("10.1.2.3")][..], "address"),
        ("http://u@example.com/", &pub_[..], "userinfo"),
        ("//127.0.0.1/x", &pub_[..], "address"),
    ];
    for (loc, addrs, want) in refusals {
        let r = check_redirect(from, loc, 1, addrs).unwrap_err();
        assert_eq!(code(&r), want, "{loc}: {r}");
    }
    let r = check_redirect(from, "/again", MAX_REDIRECTS + 1, &pub_).unwrap_err();
    assert_eq!(code(&r), "too_many_redirects");
}

#[test]
fn refusals_read_as_sentences() {
    let r = check("http://169.254.169.254/", &[]).unwrap_err();
    assert!(r.to_string().contains("link-local"), "{r}");
}
