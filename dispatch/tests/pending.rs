//! Pending approvals at the chokepoint, with a fake executor: durable
//! before the approver is asked, carried out once after a resume, the
//! first decision written stands when a prompt races `retie approve`,
//! and an approval binds the digest that was shown.
//!
//! One test function: the user key's location is process-wide
//! (`XDG_CONFIG_HOME`).

use retie_dispatch::record::{Recorder, SessionSpec};
use retie_dispatch::{
    dispatch, Approval, ApprovalRequest, Approver, Dispatched, Error, Executor, Proposal, Step,
    UndoPlan,
};
use retie_ledger::{keys, Actor, Guard, Kind, Ledger, NewEntry};
use retie_policy::{Action, Context, Effect, Policy, Tier, Value};
use serde_json::json;

struct Fake {
    ran: usize,
}

impl Executor for Fake {
    type Output = ();
    fn plan(&self, _: &Action) -> UndoPlan {
        UndoPlan {
            reversible: true,
            detail: json!({"reversible": true}),
        }
    }
    fn execute(&mut self, _: &Action, _: &mut Step<'_>) -> Result<(), Error> {
        self.ran += 1;
        Ok(())
    }
}

/// Answers with a fixed approval; can run something first (the race).
struct Scripted<F: FnMut(&ApprovalRequest<'_>)> {
    answer: Approval,
    before: F,
    asked: usize,
}

impl<F: FnMut(&ApprovalRequest<'_>)> Approver for Scripted<F> {
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval {
        self.asked += 1;
        (self.before)(req);
        self.answer.clone()
    }
}

fn spec(ws: &std::path::Path) -> SessionSpec {
    SessionSpec {
        join: None,
        workspace: ws.to_path_buf(),
        opened: retie_ledger::payload::SessionOpened {
            objective: Some("test".into()),
            origin: Some("test".into()),
            ..Default::default()
        },
        effects: vec![
            "reads_workspace".into(),
            "writes_workspace".into(),
            "runs_sandboxed".into(),
        ],
        intent_base: json!({"tool": "test", "effects": ["reads_workspace"]}),
    }
}

fn bash(cmd: &str) -> Action {
    let args = Value::from_json(&json!({ "command": cmd })).expect("args");
    Action::new(
        "bash",
        args,
        [
            Effect::ReadsWorkspace,
            Effect::WritesWorkspace,
            Effect::RunsSandboxed,
        ],
    )
    .expect("action")
}

fn proposal(a: &Action) -> Proposal {
    Proposal {
        action: a.clone(),
        origin: "agent".into(),
        edit_of: None,
    }
}

fn kinds(l: &std::path::Path, session: &str) -> Vec<String> {
    Ledger::open(l, false, None)
        .expect("open")
        .session_rows(session)
        .expect("rows")
        .iter()
        .map(|r| r.kind_str())
        .collect()
}

#[test]
fn pending_approvals_at_the_chokepoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::set_var("XDG_CONFIG_HOME", dir.path().join("config"));
    std::env::set_var("XDG_STATE_HOME", dir.path().join("state"));
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).expect("ws");
    let ledger = dir.path().join("ledger.db");
    let policy = Policy::shipped().expect("policy");
    let ctx = Context::new(Tier::Manual);
    let action = bash("echo hi");

    // 1. Suspend: the pending entry is durable before the approver is
    // asked (it is read back from another connection inside the call).
    let mut rec = Recorder::open(&ledger, spec(&ws)).expect("recorder");
    let sid = rec.session_id().to_string();
    let mut exec = Fake { ran: 0 };
    let ledger2 = ledger.clone();
    let sid2 = sid.clone();
    let mut nobody = Scripted {
        answer: Approval::Suspend,
        before: move |req: &ApprovalRequest<'_>| {
            let k = kinds(&ledger2, &sid2);
            assert!(
                k.iter().any(|k| k == "pending"),
                "asked before the pending entry was durable: {k:?}"
            );
            assert!(req.pending.is_some());
        },
        asked: 0,
    };
    let d = dispatch(
        &mut rec,
        &policy,
        &ctx,
        proposal(&action),
        &mut nobody,
        &mut exec,
    )
    .expect("dispatch");
    let Dispatched::Suspended { pending } = d else {
        panic!("not suspended: {d:?}")
    };
    rec.suspend(pending).expect("suspend");
    assert_eq!(exec.ran, 0);

    // 2. Decided from outside (as `retie approve` does), then resumed:
    // carried out once, the approver never asked.
    let user = keys::user_key().expect("user key");
    let mut l = Ledger::open(&ledger, false, Some(&user)).expect("open");
    let decide = |l: &mut Ledger, verdict: &str, digest: Option<String>| {
        l.append_batch_guarded(
            Some(&Guard::OpenPending {
                session: sid.clone(),
                pending,
            }),
            |_| {
                vec![NewEntry {
                    session: sid.clone(),
                    actor: Actor::Person,
                    kind: Kind::Decision,
                    payload: json!({"pending": pending, "verdict": verdict, "decided_by": "person (test)", "class": "irreversible", "reason": "asks", "approved_digest": digest, "deny_reason": "outside said no"}),
                    key: user.clone(),
                }]
            },
        )
    };
    decide(&mut l, "approve", Some(action.digest().to_hex())).expect("decide");
    assert!(
        matches!(
            decide(&mut l, "deny", None),
            Err(retie_ledger::Error::Conflict { .. })
        ),
        "a second decision was written"
    );
    let (mut rec, _) = Recorder::resume(&ledger, &sid, spec(&ws).intent_base).expect("resume");
    let mut never = Scripted {
        answer: Approval::Denied {
            by: "x".into(),
            reason: "x".into(),
        },
        before: |_: &ApprovalRequest<'_>| panic!("asked again although decided"),
        asked: 0,
    };
    let d = dispatch(
        &mut rec,
        &policy,
        &ctx,
        proposal(&action),
        &mut never,
        &mut exec,
    )
    .expect("dispatch");
    assert!(matches!(d, Dispatched::Ran { .. }), "{d:?}");
    assert_eq!(exec.ran, 1);
    rec.finish().expect("finish");
    assert!(
        Recorder::resume(&ledger, &sid, json!({})).is_err(),
        "a finished session resumed"
    );

    // 3. A prompt racing `retie approve`: the outside deny is written
    // while the person at the prompt says yes; the deny stands.
    let mut rec = Recorder::open(&ledger, spec(&ws)).expect("recorder");
    let sid3 = rec.session_id().to_string();
    let ledger3 = ledger.clone();
    let mut racing = Scripted {
        answer: Approval::Approved {
            by: "person (terminal)".into(),
            digest: action.digest(),
        },
        before: move |req: &ApprovalRequest<'_>| {
            let user = keys::user_key().expect("user key");
            let mut l = Ledger::open(&ledger3, false, Some(&user)).expect("open");
            let pending = req.pending.expect("pending");
            l.append_batch_guarded(
                Some(&Guard::OpenPending {
                    session: sid3.clone(),
                    pending,
                }),
                |_| {
                    vec![NewEntry {
                        session: sid3.clone(),
                        actor: Actor::Person,
                        kind: Kind::Decision,
                        payload: json!({"pending": pending, "verdict": "deny", "decided_by": "person (retie deny)", "class": "irreversible", "reason": "asks", "approved_digest": null, "deny_reason": "outside said no"}),
                        key: user.clone(),
                    }]
                },
            )
            .expect("the outside decision");
        },
        asked: 0,
    };
    let mut exec = Fake { ran: 0 };
    let d = dispatch(
        &mut rec,
        &policy,
        &ctx,
        proposal(&action),
        &mut racing,
        &mut exec,
    )
    .expect("dispatch");
    match d {
        Dispatched::Refused { reason, .. } => assert_eq!(reason, "outside said no"),
        other => panic!("the later decision won: {other:?}"),
    }
    assert_eq!(exec.ran, 0);
    let decisions = kinds(&ledger, rec.session_id())
        .iter()
        .filter(|k| *k == "decision")
        .count();
    assert_eq!(decisions, 1, "two decisions for one pending approval");

    // 4. An approval binds the digest that was shown: another digest is
    // refused and nothing runs.
    let mut wrong = Scripted {
        answer: Approval::Approved {
            by: "person".into(),
            digest: bash("echo other").digest(),
        },
        before: |_: &ApprovalRequest<'_>| {},
        asked: 0,
    };
    let r = dispatch(
        &mut rec,
        &policy,
        &ctx,
        proposal(&action),
        &mut wrong,
        &mut exec,
    );
    assert!(matches!(r, Err(Error::Policy(_))), "{r:?}");
    assert_eq!(exec.ran, 0);
    assert_eq!(wrong.asked, 1);
    let sid4 = rec.session_id().to_string();
    // Open until the session closes (a closed session has none).
    let open = retie_dispatch::record::SessionState::of(
        &Ledger::open(&ledger, false, None)
            .expect("open")
            .session_rows(&sid4)
            .expect("rows"),
    )
    .open_pending
    .expect("the wrong-digest approval left its pending approval open");
    rec.finish().expect("finish");

    // 5. The verifier reads the same bindings: everything so far checks
    // out; a decision (validly signed) that approves another digest than
    // its pending approval showed, or a second decision, does not.
    let report = retie_ledger::verify::verify(&ledger).expect("verify");
    assert!(report.intact, "{:?}", report.problems);
    let user = keys::user_key().expect("user key");
    let mut l = Ledger::open(&ledger, false, Some(&user)).expect("open");
    for _ in 0..2 {
        l.append(
            &sid4,
            Actor::Person,
            Kind::Decision,
            &json!({"pending": open.seq, "verdict": "approve", "approved_digest": bash("echo other").digest().to_hex()}),
            &user,
        )
        .expect("append");
    }
    let report = retie_ledger::verify::verify(&ledger).expect("verify");
    let all: Vec<String> = report.problems.iter().map(|p| p.what.clone()).collect();
    assert!(!report.intact, "a decision for another digest verified");
    assert!(
        all.iter().any(|w| w.contains("but pending approval"))
            && all.iter().any(|w| w.contains("a second decision")),
        "{all:?}"
    );
}
