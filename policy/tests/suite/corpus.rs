//! Precision and recall of the shipped inspection rules on the labelled
//! corpus in `policy/corpus/`. The floors are the figures published in
//! `docs/policy.md` (`<!-- corpus: ... -->`); measuring below them fails.

use super::*;
use retie_policy::{inspect_file, Category};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    case: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    path: String,
    old: String,
    new: String,
    expect: BTreeSet<Category>,
    #[serde(default)]
    #[allow(dead_code)]
    note: String,
}

fn load() -> Vec<Case> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut cases = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(&p).unwrap();
        let f: File = toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        cases.extend(f.case);
    }
    cases
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    tp: usize,
    fp: usize,
    fn_: usize,
}

impl Counts {
    fn precision(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fp).max(1) as f64
    }
    fn recall(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fn_).max(1) as f64
    }
}

fn measure() -> (usize, Counts, BTreeMap<Category, Counts>, Vec<String>) {
    let policy = shipped();
    let cases = load();
    let mut names = BTreeSet::new();
    let mut total = Counts::default();
    let mut per: BTreeMap<Category, Counts> = BTreeMap::new();
    let mut misses = Vec::new();
    for c in &cases {
        assert!(
            names.insert(c.name.clone()),
            "duplicate case name {}",
            c.name
        );
        let got: BTreeSet<Category> = inspect_file(policy.rules(), &c.path, &c.old, &c.new)
            .findings
            .iter()
            .map(|f| f.category)
            .collect();
        for cat in Category::ALL {
            let (e, g) = (c.expect.contains(&cat), got.contains(&cat));
            let slot = per.entry(cat).or_default();
            match (e, g) {
                (true, true) => {
                    total.tp += 1;
                    slot.tp += 1;
                }
                (false, true) => {
                    total.fp += 1;
                    slot.fp += 1;
                    misses.push(format!("FP {} ({cat})", c.name));
                }
                (true, false) => {
                    total.fn_ += 1;
                    slot.fn_ += 1;
                    misses.push(format!("FN {} ({cat})", c.name));
                }
                (false, false) => {}
            }
        }
    }
    (cases.len(), total, per, misses)
}

fn published() -> (f64, f64, usize) {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md")).unwrap();
    let line = doc
        .lines()
        .find(|l| l.starts_with("<!-- corpus:"))
        .expect("docs/policy.md must publish <!-- corpus: precision=.. recall=.. cases=.. -->");
    let field = |k: &str| -> String {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} missing in {line}"))
            .to_owned()
    };
    (
        field("precision").parse().unwrap(),
        field("recall").parse().unwrap(),
        field("cases").parse().unwrap(),
    )
}

#[test]
fn corpus_has_at_least_100_cases_with_positives_negatives_and_in_place_edits() {
    let cases = load();
    assert!(cases.len() >= 120, "{}", cases.len());
    // At least 8 languages and formats, by file extension (or name).
    let kinds: BTreeSet<String> = cases
        .iter()
        .map(|c| {
            let base = c.path.rsplit('/').next().unwrap_or(&c.path);
            base.rsplit_once('.').map_or(base, |(_, e)| e).to_owned()
        })
        .collect();
    assert!(kinds.len() >= 8, "{kinds:?}");
    let positives = cases.iter().filter(|c| !c.expect.is_empty()).count();
    let negatives = cases.len() - positives;
    let in_place = cases
        .iter()
        .filter(|c| !c.old.is_empty() && c.expect.is_empty())
        .count();
    assert!(
        positives >= 40 && negatives >= 40 && in_place >= 20,
        "{positives} {negatives} {in_place}"
    );
    for cat in Category::ALL {
        assert!(
            cases.iter().filter(|c| c.expect.contains(&cat)).count() >= 4,
            "few positives for {cat}"
        );
    }
}

#[test]
fn precision_and_recall_stay_at_or_above_the_published_figures() {
    let (n, total, per, misses) = measure();
    println!("cases={n} tp={} fp={} fn={}", total.tp, total.fp, total.fn_);
    println!(
        "precision={:.3} recall={:.3}",
        total.precision(),
        total.recall()
    );
    for (cat, c) in &per {
        println!(
            "| {cat} | {} | {} | {} | {:.2} | {:.2} |",
            c.tp,
            c.fp,
            c.fn_,
            c.precision(),
            c.recall()
        );
    }
    for m in &misses {
        println!("{m}");
    }
    let (p, r, cases) = published();
    assert_eq!(
        n, cases,
        "docs/policy.md reports {cases} cases, the corpus has {n}"
    );
    assert!(
        total.precision() + 1e-9 >= p,
        "precision {:.3} < published {p}",
        total.precision()
    );
    assert!(
        total.recall() + 1e-9 >= r,
        "recall {:.3} < published {r}",
        total.recall()
    );
}
