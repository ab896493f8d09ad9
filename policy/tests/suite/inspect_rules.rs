//! Every inspection rule of the shipped policy fires on a positive case,
//! stays quiet on a negative one and on an in-place edit.

use super::*;
use retie_policy::inspect::FiresOn;
use retie_policy::{inspect, Category, RiskLevel};

/// (rule, a text that contains one guard/secret, an in-place edit of it that
/// keeps the count).
const CASES: &[(&str, &str, &str)] = &[
    (
        "dotenv-secret",
        "DB_PASSWORD=s3cr3tPassw0rd\n",
        "DB_PASSWORD=s3cr3tPassw0rd\nDEBUG=1\n",
    ),
    (
        "yaml-password",
        "db:\n  password: hunter22\n",
        "database:\n  password: hunter22\n",
    ),
    (
        "connection-string-password",
        "url = \"postgres://app:hunter22@db:5432/app\"\n",
        "DATABASE_URL = \"postgres://app:hunter22@db:5432/app\"\n",
    ),
    (
        "ai-and-cloud-api-keys",
        "key = \"sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123\"\n",
        "ANTHROPIC_KEY = \"sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123\"\n",
    ),
    (
        "jvm-dotnet-trust-all",
        "conn.setHostnameVerifier((h, s) -> true);\n",
        "connection.setHostnameVerifier((h, s) -> true);\n",
    ),
    (
        "ruby-php-rust-tls-off",
        "http.verify_mode = OpenSSL::SSL::VERIFY_NONE\n",
        "client.verify_mode = OpenSSL::SSL::VERIFY_NONE\n",
    ),
    (
        "aiohttp-git-kube-tls-off",
        "async with s.get(u, ssl=False) as r:\n",
        "async with session.get(url, ssl=False) as resp:\n",
    ),
    (
        "csrf-exempted",
        "@csrf_exempt\ndef hook(request): ...\n",
        "@csrf_exempt\ndef webhook(request): ...\n",
    ),
    (
        "csrf-guard",
        "app.use(csrf({ cookie: true }))\n",
        "app.use(csrf({ cookie: true, ignoreMethods: [] }))\n",
    ),
    (
        "fastapi-auth-dependency",
        "def read(user = Depends(get_current_user)): ...\n",
        "def read_items(user = Depends(get_current_user)): ...\n",
    ),
    (
        "express-auth-middleware",
        "app.use(requireAuth)\n",
        "app.use(requireAuth) // all routes\n",
    ),
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

/// Issue 13: inspection compares what matches, not only how often. (Checked
/// failing with comment removal disabled in `code_lines`, and with keys
/// replaced by a single per-rule key, i.e. counting.)
#[test]
fn swaps_comment_outs_and_moves_fire_placeholders_and_docs_do_not() {
    use retie_policy::inspect_file;
    let p = shipped();
    let fires = |path: &str, old: &str, new: &str| -> Vec<Category> {
        inspect_file(p.rules(), path, old, new)
            .findings
            .iter()
            .map(|f| f.category)
            .collect()
    };
    assert_eq!(
        fires(
            "config.py",
            "api_key = \"YOUR_API_KEY_HERE\"\n",
            "api_key = \"a8f5f167f44f4964e6c998dee827110c\"\n"
        ),
        [Category::HardcodedSecret]
    );
    assert_eq!(
        fires(
            "views.py",
            "@login_required\ndef admin(r): ...\n",
            "# @login_required\ndef admin(r): ...\n"
        ),
        [Category::AuthCheckRemoved]
    );
    assert_eq!(
        fires(
            "views.py",
            "@login_required\ndef admin(r): ...\ndef public(r): ...\n",
            "def admin(r): ...\n@login_required\ndef public(r): ...\n"
        ),
        [Category::AuthCheckRemoved]
    );
    for (path, new) in [
        ("settings.py", "API_KEY = \"YOUR_API_KEY_HERE\"\n"),
        ("settings.py", "PASSWORD = \"changeme\"\n"),
        ("settings.py", "PASSWORD = \"********\"\n"),
        ("docs/tls.md", "Never pass verify=False.\n"),
        ("client.py", "# never pass verify=False\n"),
        (
            "tests/fixtures/t.py",
            "T = \"ghp_16C7e42F292c6912E7710c838347Ae178B4a\"\n",
        ),
    ] {
        assert!(fires(path, "", new).is_empty(), "{path}: {new:?}");
    }
}

/// A finding names lines, never the matched secret.
#[test]
fn findings_name_lines_not_secrets() {
    let p = shipped();
    let i = retie_policy::inspect_file(
        p.rules(),
        "a.py",
        "x = 1\n",
        "x = 1\ntoken = \"ghp_16C7e42F292c6912E7710c838347Ae178B4a\"\n",
    );
    let f = &i.findings[0];
    assert_eq!(f.lines, [2]);
    let json = serde_json::to_string(&i).unwrap();
    assert!(!json.contains("ghp_16C7"), "{json}");
}
