//! The gate's truth table: `docs/policy.md` publishes it, this checks every
//! row of it against `gate()`, and checks that no combination is missing.
//! Run with `RETIE_BLESS=1` to regenerate the tables in the doc.

use super::*;
use retie_policy::{
    gate, truth_table, truth_table_markdown, ClassKind, GateInput, GateRules, Reason, RiskLevel,
    Tier, TrifectaMode, UnknownTools, Verdict,
};
use std::collections::BTreeSet;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md");

/// The variants published in the doc: marker name, rules, row filter.
type Variant = (&'static str, GateRules, fn(&GateInput) -> bool);

fn variants() -> Vec<Variant> {
    let shipped = shipped().gate_rules().clone();
    let mut unknown_gate = shipped.clone();
    unknown_gate.unknown_tools = UnknownTools::Gate;
    let mut trifecta_deny = shipped.clone();
    trifecta_deny.trifecta_mode = TrifectaMode::Deny;
    vec![
        ("shipped", shipped, |_| true),
        ("unknown-gate", unknown_gate, |i| {
            i.class == ClassKind::Unknown
        }),
        ("trifecta-deny", trifecta_deny, |i| i.trifecta),
    ]
}

fn block(doc: &str, name: &str) -> (usize, usize) {
    let open = format!("<!-- truth-table:{name} -->\n");
    let close = "<!-- /truth-table -->";
    let start = doc
        .find(&open)
        .unwrap_or_else(|| panic!("marker {open:?} missing in docs/policy.md"))
        + open.len();
    let end = start + doc[start..].find(close).expect("closing marker");
    (start, end)
}

fn parse_row(line: &str) -> (GateInput, Verdict, String) {
    let cells: Vec<&str> = line
        .trim()
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect();
    assert_eq!(cells.len(), 7, "row {line:?}");
    let yes = |s: &str| match s {
        "yes" => true,
        "no" => false,
        _ => panic!("yes/no expected in {line:?}"),
    };
    let class = *ClassKind::ALL
        .iter()
        .find(|c| c.name() == cells[1])
        .expect("class");
    let risk = *RiskLevel::ALL
        .iter()
        .find(|r| r.name() == cells[3])
        .expect("risk");
    let verdict = match cells[5] {
        "run" => Verdict::Run,
        "ask" => Verdict::Ask,
        "deny" => Verdict::Deny,
        v => panic!("verdict {v:?}"),
    };
    let input = GateInput {
        tier: cells[0].parse().expect("tier"),
        class,
        requires_approval: yes(cells[2]),
        risk,
        trifecta: yes(cells[4]),
    };
    (input, verdict, cells[6].to_owned())
}

#[test]
fn every_row_of_the_published_truth_tables_holds() {
    let mut doc = std::fs::read_to_string(DOC).expect("docs/policy.md");
    if std::env::var_os("RETIE_BLESS").is_some() {
        for (name, rules, keep) in variants() {
            let rows: Vec<_> = truth_table(&rules)
                .into_iter()
                .filter(|r| keep(&r.input))
                .collect();
            let (s, e) = block(&doc, name);
            doc.replace_range(s..e, &truth_table_markdown(&rows));
        }
        std::fs::write(DOC, &doc).expect("write doc");
    }
    for (name, rules, keep) in variants() {
        let (s, e) = block(&doc, name);
        let mut seen = BTreeSet::new();
        let mut checked = 0;
        for line in doc[s..e].lines().skip(2).filter(|l| l.starts_with('|')) {
            let (input, verdict, reason) = parse_row(line);
            let d = gate(&rules, &input);
            assert_eq!(
                d.verdict, verdict,
                "table {name}, row {line:?}: gate says {d}"
            );
            assert_eq!(
                d.codes(),
                reason,
                "table {name}, row {line:?}: gate says {d}"
            );
            assert!(seen.insert(format!("{input:?}")), "duplicate row {line:?}");
            checked += 1;
        }
        let expected = truth_table(&rules)
            .into_iter()
            .filter(|r| keep(&r.input))
            .count();
        assert_eq!(
            checked, expected,
            "table {name} must list every combination"
        );
    }
}

#[test]
fn the_full_table_has_144_rows() {
    assert_eq!(truth_table(shipped().gate_rules()).len(), 3 * 4 * 2 * 3 * 2);
}

// Invariants stated by the issue, checked over every combination, written
// independently of the gate's code.

fn all_inputs() -> Vec<GateInput> {
    truth_table(&GateRules::shipped())
        .into_iter()
        .map(|r| r.input)
        .collect()
}

#[test]
fn manual_tier_never_runs() {
    let rules = shipped().gate_rules().clone();
    for i in all_inputs().into_iter().filter(|i| i.tier == Tier::Manual) {
        assert_ne!(gate(&rules, &i).verdict, Verdict::Run, "{i:?}");
    }
}

#[test]
fn requires_approval_always_asks_or_denies_in_every_tier() {
    let rules = shipped().gate_rules().clone();
    for i in all_inputs().into_iter().filter(|i| i.requires_approval) {
        let d = gate(&rules, &i);
        assert_ne!(d.verdict, Verdict::Run, "{i:?}");
        assert!(d.reasons.contains(&Reason::RequiresApproval) || d.verdict == Verdict::Deny);
    }
}

#[test]
fn trifecta_asks_in_every_tier_and_denies_in_deny_mode() {
    let flag = shipped().gate_rules().clone();
    let mut deny = flag.clone();
    deny.trifecta_mode = TrifectaMode::Deny;
    for i in all_inputs().into_iter().filter(|i| i.trifecta) {
        assert_ne!(gate(&flag, &i).verdict, Verdict::Run, "{i:?}");
        assert_eq!(gate(&deny, &i).verdict, Verdict::Deny, "{i:?}");
    }
}

#[test]
fn unknown_is_denied_by_default_and_asks_when_gated() {
    let rules = shipped().gate_rules().clone();
    let mut open = rules.clone();
    open.unknown_tools = UnknownTools::Gate;
    for i in all_inputs()
        .into_iter()
        .filter(|i| i.class == ClassKind::Unknown)
    {
        assert_eq!(gate(&rules, &i).verdict, Verdict::Deny, "{i:?}");
        assert_ne!(gate(&open, &i).verdict, Verdict::Run, "{i:?}");
    }
}

#[test]
fn gated_asks_for_irreversible_and_high_risk_and_runs_the_rest() {
    let rules = shipped().gate_rules().clone();
    for i in all_inputs().into_iter().filter(|i| i.tier == Tier::Gated) {
        let v = gate(&rules, &i).verdict;
        let must_ask = i.requires_approval
            || i.trifecta
            || i.class >= ClassKind::Irreversible
            || i.risk == RiskLevel::High;
        if must_ask {
            assert_ne!(v, Verdict::Run, "{i:?}");
        } else {
            assert_eq!(v, Verdict::Run, "{i:?}");
        }
    }
}

#[test]
fn auto_asks_only_for_must_ask() {
    let rules = shipped().gate_rules().clone();
    for i in all_inputs().into_iter().filter(|i| i.tier == Tier::Auto) {
        let v = gate(&rules, &i).verdict;
        let must_ask = i.requires_approval || i.trifecta || i.class >= ClassKind::Irreversible;
        assert_eq!(v != Verdict::Run, must_ask, "{i:?}");
    }
}

#[test]
fn medium_risk_is_recorded_and_runs() {
    let rules = shipped().gate_rules().clone();
    let i = GateInput {
        tier: Tier::Gated,
        class: ClassKind::Reversible,
        requires_approval: false,
        risk: RiskLevel::Medium,
        trifecta: false,
    };
    let d = gate(&rules, &i);
    assert_eq!(d.verdict, Verdict::Run);
    assert!(d.reasons.contains(&Reason::RiskRecorded));
}

#[test]
fn every_reason_reads_as_a_sentence() {
    let rules = shipped().gate_rules().clone();
    for row in truth_table(&rules) {
        for r in &row.decision.reasons {
            let s = r.to_string();
            assert!(
                s.len() > 15 && !s.contains("Tier") && !s.contains("ClassKind"),
                "{s}"
            );
        }
    }
}
