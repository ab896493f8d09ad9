//! The importers against fixtures written from each format's schema
//! (`tests/fixtures/findings/`), the lab's own findings, and broken files.

use super::*;

fn fixture(name: &str) -> (String, String) {
    let path = format!(
        "{}/../tests/fixtures/findings/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (name.to_string(), text)
}

fn parsed(name: &str) -> Vec<Finding> {
    let (file, text) = fixture(name);
    parse(&file, &text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn broken(name: &str) -> String {
    let (file, text) = fixture(name);
    match parse(&file, &text) {
        Ok(f) => panic!("{name} parsed: {f:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_lab_findings_read_as_retie_finding_1() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../lab/findings");
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("lab/findings") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "json") {
            let f = load(&p).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(f.len(), 1);
            assert_eq!(f[0].source.format, Format::RetieFinding1);
            assert!(f[0].instances[0].url.starts_with("http://lab/"), "{f:?}");
            assert!(!f[0].instances[0].evidence.is_empty(), "{f:?}");
            n += 1;
        }
    }
    assert_eq!(n, 5);
    let f = &load(std::path::Path::new(&format!("{dir}/F1-sqli-login.json"))).expect("F1")[0];
    assert_eq!(f.id, "F1-sqli-login");
    assert_eq!(f.cwe.as_deref(), Some("CWE-89"));
    assert_eq!(f.severity.as_deref(), Some("high"));
    let x = &f.instances[0];
    assert_eq!(x.method, "POST");
    assert_eq!(x.url, "http://lab/login");
    assert_eq!(
        x.body.as_deref(),
        Some("password=x&user=admin%27+OR+1%3D1--")
    );
    let f3 = &load(std::path::Path::new(&format!("{dir}/F3-idor-record.json"))).expect("F3")[0];
    assert_eq!(f3.instances[0].url, "http://lab/record?id=1");
    assert!(f3.instances[0]
        .precondition
        .as_deref()
        .is_some_and(|p| p.contains("user=alice")));
}

#[test]
fn sarif_results_become_findings_with_their_places() {
    let f = parsed("staging-dast.sarif");
    assert_eq!(f.len(), 4, "{f:#?}");
    assert!(f.iter().all(|x| x.source.format == Format::Sarif210));
    // The webRequest and webResponse of the first result.
    let sqli = &f[0];
    assert_eq!(sqli.id, "WEB-SQLI-001");
    assert_eq!(sqli.title, "SqlInjectionLoginForm");
    assert_eq!(sqli.severity.as_deref(), Some("critical")); // 9.1
    assert_eq!(sqli.cwe.as_deref(), Some("CWE-89"));
    assert_eq!(sqli.source.at, "$.runs[0].results[0]");
    assert_eq!(sqli.instances.len(), 1);
    let x = &sqli.instances[0];
    assert_eq!(x.url, "https://staging.example/login");
    assert_eq!(x.method, "POST");
    assert_eq!(
        x.body.as_deref(),
        Some("user=admin%27+OR+1%3D1--&password=x")
    );
    assert_eq!(x.param.as_deref(), Some("user"));
    assert!(x.evidence.contains(&"HTTP status 200".to_string()), "{x:?}");
    assert!(x
        .request
        .as_deref()
        .is_some_and(|r| r.contains("Host: staging.example")));
    // Two web locations (the logical one is no place), one rule twice.
    let xss = &f[1];
    assert_eq!(xss.id, "WEB-XSS-004#1");
    assert_eq!(f[3].id, "WEB-XSS-004#2");
    assert_eq!(xss.instances.len(), 2);
    assert_eq!(xss.severity.as_deref(), Some("medium")); // 6.1
    assert_eq!(xss.cwe.as_deref(), Some("CWE-79"));
    assert_eq!(
        xss.instances[0].payload.as_deref(),
        Some("<script>alert(1)</script>")
    );
    // By ruleIndex, message by id, a base id chained through another.
    let path = &f[2];
    assert_eq!(path.id, "WEB-PATH-002");
    assert_eq!(path.cwe.as_deref(), Some("CWE-22"));
    assert_eq!(path.severity.as_deref(), Some("high")); // 7.5
    assert_eq!(
        path.instances[0].url,
        "https://staging.example/app/download?file=..%2F..%2F..%2Fetc%2Fpasswd"
    );
    assert_eq!(path.instances[0].param.as_deref(), Some("file"));
    assert!(path.description.contains("walks out"), "{path:?}");
    // A webRequest alone is a place.
    assert_eq!(f[3].instances[0].method, "GET");
    assert!(f[3].instances[0]
        .url
        .starts_with("https://staging.example/search"));
}

#[test]
fn zap_alerts_become_findings_with_their_instances() {
    let f = parsed("zap-report.json");
    assert_eq!(f.len(), 4, "{f:#?}");
    let sqli = &f[0];
    assert_eq!(sqli.id, "40018");
    assert_eq!(sqli.title, "SQL Injection");
    assert_eq!(sqli.severity.as_deref(), Some("high"));
    assert_eq!(sqli.cwe.as_deref(), Some("CWE-89"));
    assert_eq!(sqli.rule.as_deref(), Some("zap:40018"));
    assert_eq!(sqli.source.at, "$.site[0].alerts[0]");
    assert_eq!(sqli.instances.len(), 2);
    assert_eq!(sqli.instances[0].method, "POST");
    assert_eq!(sqli.instances[0].param.as_deref(), Some("user"));
    assert_eq!(
        sqli.instances[0].payload.as_deref(),
        Some("admin' OR 1=1--")
    );
    assert_eq!(sqli.instances[0].evidence[0], "Welcome admin");
    assert!(!sqli.description.contains("<p>"));
    assert_eq!(f[1].instances.len(), 3);
    assert_eq!(f[1].instances[1].param, None);
    assert_eq!(
        f[2].instances[0].url.split('/').nth(2),
        Some("staging.example")
    );
    // riskcode and confidence as numbers; cweid -1 is no CWE.
    assert_eq!(f[3].severity.as_deref(), Some("low"));
    assert_eq!(f[3].cwe, None);
    assert_eq!(f[3].id, "10202");
}

#[test]
fn nuclei_lines_of_one_template_become_one_finding() {
    let f = parsed("nuclei.jsonl");
    assert_eq!(f.len(), 3, "{f:#?}");
    let cmdi = &f[0];
    assert_eq!(cmdi.id, "diag-command-injection");
    assert_eq!(cmdi.title, "Command injection in /diag");
    assert_eq!(cmdi.severity.as_deref(), Some("critical"));
    assert_eq!(cmdi.cwe.as_deref(), Some("CWE-78"));
    assert_eq!(cmdi.source.at, "line 1");
    assert_eq!(cmdi.instances.len(), 2);
    assert_eq!(
        cmdi.instances[0].url,
        "http://localhost:8080/diag?file=report.txt;id"
    );
    assert_eq!(
        cmdi.instances[0].evidence[0],
        "uid=0(root) gid=0(root) groups=0(root)"
    );
    assert!(cmdi.instances[1]
        .url
        .starts_with("https://staging.example/"));
    let idor = &f[1];
    assert_eq!(idor.cwe.as_deref(), Some("CWE-639"));
    assert_eq!(idor.instances[0].method, "POST");
    assert_eq!(
        idor.instances[0].body.as_deref(),
        Some("user=alice&password=alice-pw")
    );
    assert_eq!(idor.source.at, "line 4");
    assert_eq!(f[2].severity.as_deref(), Some("info"));
}

#[test]
fn broken_files_are_refused_naming_the_file_the_place_and_the_field() {
    let e = broken("broken-truncated.sarif");
    assert!(
        e.starts_with("broken-truncated.sarif: line ")
            && e.contains("not valid JSON")
            && e.contains("EOF"),
        "{e}"
    );
    let e = broken("broken-no-location.sarif");
    assert!(
        e.starts_with(
            "broken-no-location.sarif: $.runs[0].results[1]: field `locations`: no location"
        ),
        "{e}"
    );
    let e = broken("broken-line.jsonl");
    assert!(
        e.starts_with("broken-line.jsonl: line 3, column ") && e.contains("not JSON"),
        "{e}"
    );
    let e = broken("broken-unknown.json");
    assert!(
        e.starts_with("broken-unknown.json: ")
            && e.contains("retie reads retie-finding/1, SARIF 2.1.0"),
        "{e}"
    );
    let e = broken("broken-riskcode.json");
    assert!(
        e.starts_with("broken-riskcode.json: $.site[1].alerts[0]: field `riskcode`: \"7\""),
        "{e}"
    );
    let e = broken("broken-no-method.json");
    assert_eq!(
        e,
        "broken-no-method.json: $.request: field `method`: missing"
    );
}

#[test]
fn small_breakages_each_get_their_own_error() {
    let cases: &[(&str, &str)] = &[
        ("", "line 1, column 0: not valid JSON"),
        ("[]", "its top level is an array"),
        (r#"{"format": "retie-finding/2"}"#, "$: field `format`: \"retie-finding/2\""),
        (r#"{"version": "2.0.0", "runs": []}"#, "$: field `version`: \"2.0.0\": retie reads SARIF 2.1.0 only"),
        (r#"{"version": "2.1.0", "runs": []}"#, "holds no finding"),
        (
            r#"{"version": "2.1.0", "runs": [{"results": [{"ruleId": "r", "locations": [{"physicalLocation": {"artifactLocation": {"uri": "http://a/"}}}]}]}]}"#,
            "$.runs[0].results[0]: field `message`: missing",
        ),
        (
            r#"{"version": "2.1.0", "runs": [{"results": [{"message": {"text": "m"}}]}]}"#,
            "$.runs[0].results[0]: field `ruleId`: missing",
        ),
        (
            r#"{"version": "2.1.0", "runs": [{"results": [{"ruleId": "r", "message": {"text": "m"}, "locations": [{"physicalLocation": {"artifactLocation": {"uri": "src/app.py"}}}]}]}]}"#,
            "field `locations[0].physicalLocation.artifactLocation.uri`: \"src/app.py\" is not an http(s) URL",
        ),
        (
            r#"{"version": "2.1.0", "runs": [{"results": [{"ruleId": "r", "message": {"text": "m"}, "locations": [{"physicalLocation": {"artifactLocation": {"uri": "x", "uriBaseId": "NOPE"}}}]}]}]}"#,
            "uriBaseId`: \"NOPE\" is not in the run's originalUriBaseIds",
        ),
        (
            r#"{"site": [{"alerts": [{"pluginid": "1", "alert": "a", "instances": []}]}]}"#,
            "$.site[0].alerts[0]: field `instances`: empty",
        ),
        (
            r#"{"site": [{"alerts": [{"pluginid": "1", "alert": "a", "instances": [{"uri": "file:///etc/passwd"}]}]}]}"#,
            "$.site[0].alerts[0].instances[0]: field `uri`",
        ),
        (
            "{\"template-id\": \"t\", \"matched-at\": \"http://a/\"}\n{\"template-id\": \"u\"}\n",
            "line 2: field `matched-at`: missing",
        ),
        (
            "{\"template-id\": \"t\", \"matched-at\": \"http://a/\"}\n{\"template-id\": \"u\", \"matched-at\": 3}\n",
            "line 2: field `matched-at`: a number, not a string",
        ),
        (
            r#"{"format": "retie-finding/1", "id": "a", "title": "t", "request": {"method": "GET", "path": "/", "query": {"x": [1]}}}"#,
            "$.request: field `query.x`: an array, not a string",
        ),
    ];
    for (text, want) in cases {
        match parse("f", text) {
            Ok(f) => panic!("{text}: parsed: {f:?}"),
            Err(e) => assert!(
                e.to_string().contains(want),
                "{text}:\n  got  {e}\n  want {want}"
            ),
        }
    }
}

#[test]
fn the_origin_is_mapped_onto_the_lab_and_the_mapping_is_returned() {
    let f = parsed("zap-report.json");
    let (m, map) = onto_lab(&f[0], "demo", &[8080]).expect("maps");
    assert_eq!(m.instances[0].url, "http://demo:8080/login");
    assert_eq!(
        map,
        vec![OriginMap {
            from: "http://localhost:8080".into(),
            to: "http://demo:8080".into()
        }]
    );
    // https on 443 onto a lab's only port; the query kept as it was.
    let (m, map) = onto_lab(&f[2], "demo", &[8080]).expect("maps");
    assert_eq!(map[0].from, "https://staging.example");
    assert_eq!(
        m.instances[0].url,
        "http://demo:8080/search?q=%3CscrIpt%3Ealert%281%29%3B%3C%2FscRipt%3E"
    );
    // Two origins in one finding: both shown.
    let n = parsed("nuclei.jsonl");
    let (m, map) = onto_lab(&n[0], "lab1", &[8080]).expect("maps");
    assert_eq!(map.len(), 2);
    assert!(m
        .instances
        .iter()
        .all(|x| x.url.starts_with("http://lab1:8080/")));
    // The raw request's Host header follows.
    let r = m.instances[1].request.as_deref().expect("a raw request");
    assert!(
        r.contains("Host: lab1:8080\r\n") && !r.contains("staging"),
        "{r:?}"
    );
    // The origin's own port when the lab declares it; none fits: an error.
    let (m, _) = onto_lab(&f[0], "two", &[9090, 8080]).expect("maps");
    assert_eq!(m.instances[0].url, "http://two:8080/login");
    let e = onto_lab(&f[2], "two", &[9090, 8080]).expect_err("ambiguous");
    assert!(e.to_string().contains("does not declare"), "{e}");
}
