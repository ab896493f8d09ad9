//! Classifying and gating one action must take well under 20 µs, so the gate
//! is never the slow part. Run: `cargo bench -p retie-policy --bench gate`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use retie_policy::{
    classify, evaluate, gate, Action, Context, Effect, GateInput, Policy, RiskLevel, Taint, Tier,
    Value,
};

fn bench(c: &mut Criterion) {
    c.bench_function("load: Policy::shipped", |b| {
        b.iter(|| black_box(Policy::shipped().expect("shipped policy")))
    });
    c.bench_function(
        "load: Policy::parse (patterns compiled, examples checked)",
        |b| b.iter(|| black_box(Policy::parse(retie_policy::DEFAULT_POLICY).expect("parses"))),
    );
    let policy = Policy::shipped().expect("shipped policy");
    let write = Action::new(
        "write",
        Value::object([
            ("path", Value::from("src/lib.rs")),
            (
                "content",
                Value::from("pub fn add(a: i32, b: i32) -> i32 { a + b }\n"),
            ),
        ]),
        [Effect::WritesWorkspace],
    )
    .unwrap();
    let bash = Action::new(
        "bash",
        Value::object([(
            "command",
            Value::from("cargo test --workspace 2>&1 | tail -n 50 && git status"),
        )]),
        [Effect::RunsSandboxed],
    )
    .unwrap();
    let ctx = Context {
        tier: Tier::Gated,
        taint: Taint::tainted(),
        risk: RiskLevel::Medium,
    };

    c.bench_function("classify+gate write", |b| {
        b.iter(|| {
            let cls = classify(&policy, black_box(&write));
            let input = GateInput {
                tier: ctx.tier,
                class: cls.class.kind(),
                requires_approval: false,
                risk: ctx.risk,
                trifecta: false,
            };
            gate(policy.gate_rules(), black_box(&input))
        })
    });
    c.bench_function("evaluate write", |b| {
        b.iter(|| evaluate(&policy, black_box(&write), black_box(&ctx)))
    });
    c.bench_function("evaluate bash (shell split + prefixes)", |b| {
        b.iter(|| evaluate(&policy, black_box(&bash), black_box(&ctx)))
    });
    c.bench_function("action digest (new)", |b| {
        b.iter(|| {
            Action::new(
                "bash",
                Value::object([("command", Value::from(black_box("cargo test")))]),
                [Effect::RunsSandboxed],
            )
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
