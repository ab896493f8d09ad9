//! Property tests: digest stability and sensitivity, the shell splitter, the
//! URL guard and the policy parser never panicking.

use super::*;
use proptest::prelude::*;
use retie_policy::shell::split;
use retie_policy::{evaluate, Action, Context, Effect, Policy, Tier, Value};
use std::collections::BTreeMap;

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        (i64::MAX as u64 + 1..=u64::MAX).prop_map(Value::UInt),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::Float),
        ".{0,12}".prop_map(Value::Str),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::array),
            prop::collection::btree_map(".{0,6}", inner, 0..4).prop_map(Value::object),
        ]
    })
}

fn args() -> impl Strategy<Value = BTreeMap<String, Value>> {
    prop::collection::btree_map("[a-z]{1,6}", value(), 0..5)
}

fn effects() -> impl Strategy<Value = Vec<Effect>> {
    prop::collection::vec(prop::sample::select(Effect::ALL.to_vec()), 0..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn digest_is_stable_under_key_and_effect_order(tool in "[a-z]{1,8}", a in args(), mut e in effects()) {
        let one = Action::new(tool.clone(), Value::object(a.clone()), e.clone()).unwrap();
        // Same pairs inserted in reverse order, effects reversed and duplicated.
        let reversed: Vec<(String, Value)> = a.into_iter().rev().collect();
        let mut e2 = e.clone();
        e2.reverse();
        e2.append(&mut e);
        let two = Action::new(tool, Value::object(reversed), e2).unwrap();
        prop_assert_eq!(one.digest(), two.digest());
        // And through JSON.
        let three = Action::from_json(&one.to_json().to_string()).unwrap();
        prop_assert_eq!(one.digest(), three.digest());
    }

    #[test]
    fn any_argument_change_changes_the_digest(tool in "[a-z]{1,8}", a in args(), key in "[a-z]{1,6}", v in value(), e in effects()) {
        let base = Action::new(tool.clone(), Value::object(a.clone()), e.clone()).unwrap();
        let mut changed = a.clone();
        let before = changed.insert(key, v.clone());
        prop_assume!(before.as_ref() != Some(&v));
        let other = Action::new(tool, Value::object(changed), e).unwrap();
        prop_assert_ne!(base.digest(), other.digest());
    }

    #[test]
    fn different_values_encode_differently(a in value(), b in value()) {
        prop_assume!(a != b);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        a.encode(&mut x);
        b.encode(&mut y);
        prop_assert_ne!(x, y);
    }

    #[test]
    fn effect_or_tool_change_changes_the_digest(a in args(), e in effects(), extra in prop::sample::select(Effect::ALL.to_vec())) {
        let base = Action::new("t", Value::object(a.clone()), e.clone()).unwrap();
        if !e.contains(&extra) {
            let mut e2 = e.clone();
            e2.push(extra);
            let more = Action::new("t", Value::object(a.clone()), e2).unwrap();
            prop_assert_ne!(base.digest(), more.digest());
        }
        let renamed = Action::new("u", Value::object(a), e).unwrap();
        prop_assert_ne!(base.digest(), renamed.digest());
    }

    #[test]
    fn splitter_never_panics(s in "\\PC{0,80}") {
        let _ = split(&s);
    }

    #[test]
    fn splitter_never_panics_on_shell_alphabet(s in "[a-z &|;()$`'\"\\\\<>#\n{}*0-9=-]{0,60}") {
        let _ = split(&s);
    }

    #[test]
    fn joining_two_commands_gives_both(a in "[a-z]{1,6}( [a-z0-9.-]{1,6}){0,3}", b in "[a-z]{1,6}( [a-z0-9.-]{1,6}){0,3}", op in prop::sample::select(vec!["|", "&&", "||", ";", "&", "\n"])) {
        prop_assume!(!starts_reserved(&a) && !starts_reserved(&b));
        let whole = split(&format!("{a} {op} {b}")).unwrap();
        prop_assert_eq!(whole.commands.len(), 2);
        prop_assert_eq!(whole.commands[0].to_string(), a);
        prop_assert_eq!(whole.commands[1].to_string(), b);
    }

    #[test]
    fn an_appended_command_is_never_covered_by_its_prefix(tail in "[a-z]{1,8}( [a-z0-9.-]{1,6}){0,3}", op in prop::sample::select(vec!["|", "&&", "||", ";", "&", "\n"])) {
        prop_assume!(!starts_reserved(&tail));
        let policy = shipped();
        prop_assume!(!policy.shell_rules().allow_prefixes().iter().any(|p| tail.starts_with(p.as_str())));
        let line = split(&format!("cargo test {op} {tail}")).unwrap();
        prop_assert!(!policy.shell_rules().coverage(&line).all_allowed);
    }

    #[test]
    fn quoting_a_word_keeps_it_one_word(w in "[a-z &|;()<>]{1,12}") {
        let quoted = format!("echo '{w}'");
        let line = split(&quoted).unwrap();
        prop_assert_eq!(line.commands.len(), 1);
        prop_assert_eq!(&line.commands[0].words[1].text, &w);
    }

    #[test]
    fn policy_parser_never_panics(s in "\\PC{0,200}") {
        let _ = Policy::parse(&s);
    }

    #[test]
    fn url_guard_never_panics_and_never_pins_a_private_address(s in "(https?|file)://[a-z0-9.:@\\[\\]%/-]{0,30}", v4 in any::<u32>()) {
        let addr = std::net::IpAddr::V4(std::net::Ipv4Addr::from(v4));
        if let Ok(pin) = retie_policy::urlguard::check(&s, &[addr]) {
            prop_assert!(retie_policy::urlguard::non_public(pin.addr.ip()).is_none());
        }
    }

    #[test]
    fn evaluate_is_deterministic(tool in prop::sample::select(vec!["read", "write", "bash", "fetch", "lab", "nope"]), a in args(), e in effects(), tier in prop::sample::select(Tier::ALL.to_vec())) {
        let p = shipped();
        let action = Action::new(tool, Value::object(a), e).unwrap();
        let ctx = Context::new(tier);
        prop_assert_eq!(evaluate(&p, &action, &ctx), evaluate(&p, &action, &ctx));
    }
}

/// Reserved words are not commands (`fi x` is a syntax error in bash): a
/// generated command must not start with one.
fn starts_reserved(cmd: &str) -> bool {
    const RESERVED: &[&str] = &[
        "if", "then", "else", "elif", "fi", "do", "done", "case", "esac", "while", "until", "for",
        "in", "function", "select", "time", "coproc",
    ];
    RESERVED.iter().any(|r| cmd.split(' ').next() == Some(r))
}
