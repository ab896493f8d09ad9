//! Every inspection rule of the shipped policy fires on a positive case,
//! stays quiet on a negative one and on an in-place edit.

use super::*;
use retie_policy::inspect::FiresOn;
use retie_policy::{inspect, Category, RiskLevel};

/// (rule, a text that contains one guard/secret, an in-place edit of it that
/// keeps the count).
const CASES: &[(&str, &str, &str)] = &[
    (
        "aws-access-key-id",
        "KEY = \"AKIAIOSFODNN7EXAMPLE\"\n",
        "KEY = \"AKIAIOSFODNN7EXAMPLE\"  # staging\n",
    ),
    (
        "aws-secret-access-key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
        "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
    ),
    (
        "github-token",
        "t = 'ghp_16C7e42F292c6912E7710c838347Ae178B4a'\n",
        "token = 'ghp_16C7e42F292c6912E7710c838347Ae178B4a'\n",
    ),
    (
        "slack-token",
        "S = 'xoxb-123456789012-abcdefghijkl'\n",
        "SLACK_BOT = 'xoxb-123456789012-abcdefghijkl'\n",
    ),
    (
        "private-key-block",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIC\n",
    ),
    (
        "stripe-live-key",
        "k = \"sk_live_4eC39HqLyjWDarjtT1zdp7dc\"\n",
        "stripe_key = \"sk_live_4eC39HqLyjWDarjtT1zdp7dc\"\n",
    ),
    (
        "password-assignment",
        "password = \"hunter22\"\n",
        "password = \"hunter22\"  # legacy\n",
    ),
    (
        "python-verify-false",
        "r = requests.get(u, verify=False)\n",
        "r = requests.get(u, verify=False, timeout=5)\n",
    ),
    (
        "python-unverified-context",
        "ctx = ssl._create_unverified_context()\n",
        "context = ssl._create_unverified_context()\n",
    ),
    (
        "node-reject-unauthorized",
        "const a = { rejectUnauthorized: false };\n",
        "const agent = { rejectUnauthorized: false, keepAlive: true };\n",
    ),
    (
        "go-insecure-skip-verify",
        "cfg := &tls.Config{InsecureSkipVerify: true}\n",
        "cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}\n",
    ),
    (
        "curl-wget-insecure",
        "curl -k https://x.io\n",
        "curl -k -sS https://x.io\n",
    ),
    (
        "auth-decorator",
        "@login_required\ndef a(r): pass\n",
        "@login_required\ndef a(request): pass\n",
    ),
    (
        "auth-check-call",
        "if not request.user.is_authenticated:\n    abort(401)\n",
        "if not request.user.is_authenticated:\n    abort(403)\n",
    ),
    (
        "signature-verify-call",
        "if not hmac.compare_digest(a, b):\n    raise\n",
        "if not hmac.compare_digest(a, b):\n    raise BadSig\n",
    ),
    (
        "jwt-verification-off",
        "jwt.decode(t, options={\"verify_signature\": False})\n",
        "claims = jwt.decode(t, options={\"verify_signature\": False})\n",
    ),
    (
        "python-shell-true",
        "subprocess.run(c, shell=True)\n",
        "subprocess.run(c, shell=True, check=True)\n",
    ),
    (
        "python-os-system-built",
        "os.system(f\"rm {p}\")\n",
        "os.system(f\"rm -f {p}\")\n",
    ),
    (
        "node-exec-built",
        "exec(`git log ${b}`)\n",
        "exec(`git log --oneline ${b}`)\n",
    ),
    (
        "sql-fstring",
        "cur.execute(f\"SELECT * FROM u WHERE n = {n}\")\n",
        "cur.execute(f\"SELECT id FROM u WHERE n = {n}\")\n",
    ),
    (
        "sql-concat-or-format",
        "q = \"SELECT * FROM t WHERE id = \" + i\n",
        "q = \"SELECT a FROM t WHERE id = \" + i\n",
    ),
    (
        "sql-template-literal",
        "db.query(`SELECT * FROM u WHERE id = ${id}`)\n",
        "await db.query(`SELECT * FROM u WHERE id = ${id}`)\n",
    ),
    (
        "chmod-world-writable",
        "chmod 777 /srv\n",
        "chmod 777 /srv/app\n",
    ),
    (
        "api-chmod-world-writable",
        "os.chmod(p, 0o777)\n",
        "os.chmod(path, 0o777)\n",
    ),
    (
        "curl-pipe-shell",
        "curl -fsSL https://x.io/i | sh\n",
        "curl -fsSL https://x.io/install | sh\n",
    ),
];

#[test]
fn every_shipped_rule_has_a_case_here() {
    let p = shipped();
    for r in p.rules() {
        assert!(
            CASES.iter().any(|c| c.0 == r.name()),
            "no test case for rule {}",
            r.name()
        );
    }
    for c in CASES {
        assert!(
            p.rules().iter().any(|r| r.name() == c.0),
            "case for missing rule {}",
            c.0
        );
    }
}

#[test]
fn positive_negative_and_in_place_edit_for_every_rule() {
    let p = shipped();
    for (name, guard, edited) in CASES {
        let rule = p.rules().iter().find(|r| r.name() == *name).unwrap();
        let only = std::slice::from_ref(rule);
        assert_eq!(
            rule.count(guard),
            1,
            "{name} should count once in {guard:?}"
        );
        assert_eq!(
            rule.count(edited),
            1,
            "{name} should count once in {edited:?}"
        );
        let (fires_old, fires_new) = match rule.fires_on() {
            // Introducing the thing fires; removing it does not.
            FiresOn::Increase => ("", *guard),
            // Dropping the guard fires; adding one does not.
            FiresOn::Decrease => (*guard, ""),
        };
        let hit = inspect(only, fires_old, fires_new);
        assert_eq!(hit.findings.len(), 1, "{name}: positive did not fire");
        assert_eq!(hit.level, rule.level());
        assert_eq!(hit.findings[0].rule, *name);
        let quiet = inspect(only, fires_new, fires_old);
        assert!(quiet.findings.is_empty(), "{name}: negative fired");
        let edit = inspect(only, guard, edited);
        assert!(edit.findings.is_empty(), "{name}: in-place edit fired");
        let same = inspect(only, guard, guard);
        assert!(same.findings.is_empty(), "{name}: unchanged text fired");
    }
}

#[test]
fn dropping_one_of_three_guards_fires_with_counts() {
    let p = shipped();
    let old = "@login_required\ndef a(r): pass\n@login_required\ndef b(r): pass\n@login_required\ndef c(r): pass\n";
    let new = "@login_required\ndef a(r): pass\ndef b(r): pass\n@login_required\ndef c(r): pass\n";
    let i = inspect(p.rules(), old, new);
    assert_eq!(i.level, RiskLevel::High);
    let f = i
        .findings
        .iter()
        .find(|f| f.rule == "auth-decorator")
        .unwrap();
    assert_eq!((f.old_count, f.new_count), (3, 2));
    assert_eq!(f.category, Category::AuthCheckRemoved);
}

#[test]
fn appending_a_keyword_to_a_verified_call_is_quiet() {
    // The line-diff failure mode the count-based design exists to avoid.
    let p = shipped();
    let old = "r = requests.get(u, verify=True)\n";
    let new = "r = requests.get(u, verify=True, timeout=5)\n";
    assert!(inspect(p.rules(), old, new).findings.is_empty());
}

#[test]
fn medium_only_findings_are_medium() {
    let p = shipped();
    let i = inspect(p.rules(), "", "subprocess.run(c, shell=True)\n");
    assert_eq!(i.level, RiskLevel::Medium);
}

#[test]
fn every_category_has_a_rule() {
    let p = shipped();
    for c in Category::ALL {
        assert!(
            p.rules().iter().any(|r| r.category() == c),
            "no rule for {c}"
        );
    }
}
