use super::*;
use retie_policy::{
    evaluate, Action, Context, Effect, Reason, Taint, Tier, TrifectaMode, Value, Verdict,
};

fn act(tool: &str, args: Value, effects: &[Effect]) -> Action {
    Action::new(tool, args, effects.iter().copied()).unwrap()
}

#[test]
fn fetch_taints_the_session_and_later_egress_asks_in_every_tier() {
    let p = shipped();
    let fetch = act(
        "fetch",
        Value::object([("url", Value::from("https://example.com"))]),
        &[Effect::ReadsUntrusted],
    );
    let taint = Taint::clean().after(&p, &fetch);
    assert!(taint.untrusted);
    let read = act(
        "read",
        Value::object([("path", Value::from("src/lib.rs"))]),
        &[Effect::ReadsWorkspace],
    );
    assert_eq!(
        taint.after(&p, &read),
        taint,
        "taint only grows and read adds none"
    );

    let egress = [
        fetch.clone(),
        act(
            "bash",
            Value::object([("command", Value::from("ls"))]),
            &[Effect::RunsUnsandboxed],
        ),
        act(
            "lab",
            Value::object([("cmd", Value::from("nmap"))]),
            &[Effect::LabAccess],
        ),
        act("mystery", Value::Null, &[]),
    ];
    for a in &egress {
        for tier in Tier::ALL {
            let clean = evaluate(
                &p,
                a,
                &Context {
                    taint: Taint::clean(),
                    ..Context::new(tier)
                },
            );
            let dirty = evaluate(
                &p,
                a,
                &Context {
                    taint,
                    ..Context::new(tier)
                },
            );
            assert!(!clean.trifecta, "{a:?}");
            assert!(dirty.trifecta, "{a:?}");
            assert_ne!(dirty.decision.verdict, Verdict::Run, "{tier} {a:?}");
        }
    }
}

#[test]
fn tainted_session_still_runs_what_cannot_send_data_out() {
    let p = shipped();
    let ctx = Context {
        taint: Taint::tainted(),
        ..Context::new(Tier::Gated)
    };
    for a in [
        act("read", Value::Null, &[Effect::ReadsWorkspace]),
        act(
            "write",
            Value::object([("path", Value::from("a"))]),
            &[Effect::WritesWorkspace],
        ),
        act(
            "bash",
            Value::object([("command", Value::from("cargo test"))]),
            &[Effect::RunsSandboxed],
        ),
    ] {
        let ev = evaluate(&p, &a, &ctx);
        // bash has the egress capability (it could be run unsandboxed), so it
        // is flagged even sandboxed; read and write are not.
        if a.tool() == "bash" {
            assert!(ev.trifecta);
        } else {
            assert!(!ev.trifecta, "{a:?}");
            assert_eq!(ev.decision.verdict, Verdict::Run, "{a:?}");
        }
    }
}

#[test]
fn deny_mode_denies() {
    let text = retie_policy::DEFAULT_POLICY.replace("mode = \"flag\"", "mode = \"deny\"");
    let p = retie_policy::Policy::parse(&text).unwrap();
    assert_eq!(p.gate_rules().trifecta_mode, TrifectaMode::Deny);
    let a = act("fetch", Value::Null, &[]);
    let ev = evaluate(
        &p,
        &a,
        &Context {
            taint: Taint::tainted(),
            ..Context::new(Tier::Auto)
        },
    );
    assert_eq!(ev.decision.verdict, Verdict::Deny);
    assert_eq!(ev.decision.reason(), &Reason::TrifectaDenied);
}

#[test]
fn private_data_is_tracked() {
    let p = shipped();
    let a = act("read", Value::Null, &[Effect::ReadsWorkspace]);
    assert!(!Taint::clean().after(&p, &a).private);
    let text = format!(
        "{}\n[tools.logs]\nclass = \"no_effect\"\ncapabilities = [\"private_data\"]\n",
        retie_policy::DEFAULT_POLICY
    );
    let p2 = retie_policy::Policy::parse(&text).unwrap();
    let logs = act("logs", Value::Null, &[]);
    assert!(Taint::clean().after(&p2, &logs).private);
}

/// Issue 13: taint can come from bash. A lab-mode run, a run with network
/// and a run whose input the person marked untrusted taint the session; a
/// later fetch (which can carry data out in its URL) then asks. A plain
/// sandboxed run does not taint. (Checked failing with `brings_untrusted`
/// back to the capability and `reads_untrusted` only.)
#[test]
fn bash_runs_with_network_lab_or_untrusted_input_taint_the_session() {
    let p = shipped();
    let bash = |effects: &[Effect]| {
        act(
            "bash",
            Value::object([("command", Value::from("curl -s https://x.test/"))]),
            effects,
        )
    };
    let fetch = act(
        "fetch",
        Value::object([("url", Value::from("https://y.test/?q=SECRET"))]),
        &[],
    );
    let ctx = |taint| Context {
        taint,
        ..Context::new(Tier::Auto)
    };
    for effects in [
        &[Effect::RunsSandboxed, Effect::NetworkEgress][..],
        &[Effect::RunsSandboxed, Effect::LabAccess],
        &[Effect::RunsSandboxed, Effect::ReadsUntrusted],
        &[Effect::RunsUnsandboxed, Effect::NetworkEgress],
    ] {
        let run = bash(effects);
        let ev = evaluate(&p, &run, &ctx(Taint::clean()));
        assert!(
            !ev.decision
                .reasons
                .iter()
                .any(|r| matches!(r, Reason::EffectNotPermitted { .. })),
            "{effects:?}: {:?}",
            ev.decision
        );
        let taint = Taint::clean().after(&p, &run);
        assert!(taint.untrusted, "{effects:?} did not taint");
        let later = evaluate(&p, &fetch, &ctx(taint));
        assert!(later.trifecta, "{effects:?}");
        assert_eq!(later.decision.verdict, Verdict::Ask, "{effects:?}");
    }
    let sandboxed = bash(&[Effect::RunsSandboxed]);
    assert!(!Taint::clean().after(&p, &sandboxed).untrusted);
    assert_eq!(
        evaluate(&p, &fetch, &ctx(Taint::clean())).decision.verdict,
        Verdict::Run
    );
}
