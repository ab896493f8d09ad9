use super::*;
use retie_policy::{
    classify, evaluate, Action, Class, ClassKind, Context, Effect, Inverse, Reason, Tier, Value,
    Verdict,
};

fn act(tool: &str, effects: &[Effect]) -> Action {
    Action::new(tool, Value::Null, effects.iter().copied()).unwrap()
}

#[test]
fn shipped_tools_get_the_documented_classes() {
    let p = shipped();
    let cases: &[(&str, &[Effect], ClassKind)] = &[
        ("read", &[Effect::ReadsWorkspace], ClassKind::NoEffect),
        ("glob", &[], ClassKind::NoEffect),
        ("grep", &[], ClassKind::NoEffect),
        ("recall", &[], ClassKind::NoEffect),
        ("fetch", &[Effect::ReadsUntrusted], ClassKind::NoEffect),
        ("write", &[Effect::WritesWorkspace], ClassKind::Reversible),
        ("edit", &[Effect::WritesWorkspace], ClassKind::Reversible),
        ("bash", &[Effect::RunsSandboxed], ClassKind::Reversible),
        ("bash", &[Effect::RunsUnsandboxed], ClassKind::Irreversible),
        (
            "bash",
            &[Effect::RunsSandboxed, Effect::RunsUnsandboxed],
            ClassKind::Irreversible,
        ),
        ("lab", &[Effect::LabAccess], ClassKind::Irreversible),
        ("lab", &[], ClassKind::Irreversible),
        ("rm_rf", &[], ClassKind::Unknown),
    ];
    for (tool, effects, want) in cases {
        let c = classify(&p, &act(tool, effects));
        assert_eq!(c.class.kind(), *want, "{tool} {effects:?}: {}", c.class);
    }
    assert_eq!(
        classify(&p, &act("write", &[])).class,
        Class::Reversible(Inverse::RestorePreImage)
    );
    assert_eq!(
        classify(&p, &act("bash", &[])).class,
        Class::Reversible(Inverse::DiscardChangeset)
    );
}

#[test]
fn unknown_tool_is_denied_in_every_tier() {
    let p = shipped();
    for tier in Tier::ALL {
        let ev = evaluate(&p, &act("delete_prod", &[]), &Context::new(tier));
        assert_eq!(ev.decision.verdict, Verdict::Deny);
        assert_eq!(ev.decision.reason(), &Reason::UnknownDenied);
    }
}

#[test]
fn an_effect_the_tool_may_not_declare_is_denied() {
    let p = shipped();
    // read may not write; fetch may not declare network_egress in its effects list.
    for (tool, e) in [
        ("read", Effect::WritesWorkspace),
        ("write", Effect::NetworkEgress),
        ("fetch", Effect::RunsUnsandboxed),
    ] {
        let ev = evaluate(&p, &act(tool, &[e]), &Context::new(Tier::Auto));
        assert_eq!(ev.decision.verdict, Verdict::Deny, "{tool} {e}");
        assert!(
            matches!(ev.decision.reason(), Reason::EffectNotPermitted { effect, .. } if *effect == e)
        );
        assert!(!ev
            .decision
            .reasons
            .iter()
            .any(|r| matches!(r, Reason::Allowed { .. })));
    }
}

#[test]
fn requires_approval_tool_asks_even_in_auto() {
    let text = format!(
        "{}\n[tools.deploy]\nclass = \"no_effect\"\nrequires_approval = true\n",
        retie_policy::DEFAULT_POLICY
    );
    let p = retie_policy::Policy::parse(&text).unwrap();
    let ev = evaluate(&p, &act("deploy", &[]), &Context::new(Tier::Auto));
    assert_eq!(ev.decision.verdict, Verdict::Ask);
    assert_eq!(ev.decision.reason(), &Reason::RequiresApproval);
}

#[test]
fn gated_default_decisions_for_everyday_actions() {
    let p = shipped();
    let ctx = Context::new(Tier::Gated);
    assert_eq!(
        evaluate(&p, &act("read", &[Effect::ReadsWorkspace]), &ctx)
            .decision
            .verdict,
        Verdict::Run
    );
    assert_eq!(
        evaluate(&p, &act("write", &[Effect::WritesWorkspace]), &ctx)
            .decision
            .verdict,
        Verdict::Run
    );
    assert_eq!(
        evaluate(&p, &act("bash", &[Effect::RunsSandboxed]), &ctx)
            .decision
            .verdict,
        Verdict::Run
    );
    assert_eq!(
        evaluate(&p, &act("bash", &[Effect::RunsUnsandboxed]), &ctx)
            .decision
            .verdict,
        Verdict::Ask
    );
    assert_eq!(
        evaluate(&p, &act("lab", &[Effect::LabAccess]), &ctx)
            .decision
            .verdict,
        Verdict::Ask
    );
    let risky = Context {
        risk: retie_policy::RiskLevel::High,
        ..ctx
    };
    assert_eq!(
        evaluate(&p, &act("write", &[Effect::WritesWorkspace]), &risky)
            .decision
            .verdict,
        Verdict::Ask
    );
}
