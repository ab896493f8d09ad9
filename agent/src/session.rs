//! The session loop: a provider turn, then each tool call checked and
//! handed to the chokepoint, its result back to the model, until the model
//! answers without a call or a budget runs out.
//!
//! A call is executed only when: the turn was not cut off by a length
//! limit, the tool exists, its arguments are a complete JSON object that
//! passes the tool's schema, and the same call has not already failed
//! [`SessionConfig::repeat_limit`] times. Every other call is answered to
//! the model as an error and recorded as a refusal (decided by the call
//! check), never executed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use retie_dispatch::record::{Grant, SessionSpec};
use retie_dispatch::{Approval, ApprovalRequest, Approver, Cancel, Recorder};
use retie_ledger::{payload, Kind, Row};
use retie_policy::{Context, Tier};
use serde::Serialize;
use serde_json::{json, Value};

use crate::model::{Message, ProviderError, Role, StreamEvent, ToolCall, TurnRequest, Usage};
use crate::provider::Provider;
use crate::tools::Tools;
use retie_ledger::provider::{ProviderAttempt, SessionEnd};

pub use crate::retry::RetryPolicy;

/// The system prompt the agent runs with (its digest is recorded).
pub const SYSTEM_PROMPT: &str = "You are retie, a coding agent working in one project directory (the workspace). \
Use the tools to read, search, edit and test the project. Paths are relative to the workspace; nothing outside it can be reached. \
bash runs each command line in a fresh sandbox with no network; its changes to the workspace are applied afterwards and can be undone. \
Every call is recorded. When a call is refused, do not retry it unchanged: explain or try another way. \
When the task is done, answer with a short summary and no tool call.";

const SAID_CHARS: usize = 2000;

/// Limits and settings of one session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub model: String,
    pub system_prompt: String,
    pub tier: Tier,
    /// Provider turns at most.
    pub max_turns: u32,
    /// Input plus output tokens at most (as the provider counts them).
    pub max_tokens: u64,
    /// Wall time at most.
    pub timeout: Duration,
    /// Output tokens asked of the provider per turn.
    pub max_output_tokens: Option<u64>,
    /// The same failing call is not run again after this many failures.
    pub repeat_limit: usize,
    /// Set from outside (SIGINT) to stop between steps.
    pub interrupt: Option<&'static AtomicBool>,
    /// The person's `--fetch-allow` entries, as described at start;
    /// recorded in the session-open entry.
    pub fetch_allow: Vec<String>,
    /// The bash tool's network (`{"mode": "allow", "allow": [...],
    /// "hosts": ...}`), recorded in the session-open entry; `None`: none
    /// (ADR 0313).
    pub bash_net: Option<Value>,
    /// The endpoint the provider talks to (recorded at open, so a resume
    /// talks to the same one); `None` for the script provider.
    pub base_url: Option<String>,
    /// The environment variable the API key is read from (its name only:
    /// the key is never recorded).
    pub api_key_env: Option<String>,
    /// How a turn whose provider failed transiently is asked again.
    pub retry: RetryPolicy,
    /// No model named: the ladder the session climbs on failure
    /// (`model` is its current rung's).
    pub ladder: Option<crate::ladder::Ladder>,
}

impl SessionConfig {
    pub fn new(model: impl Into<String>) -> SessionConfig {
        SessionConfig {
            model: model.into(),
            system_prompt: SYSTEM_PROMPT.into(),
            tier: Tier::Gated,
            max_turns: 30,
            max_tokens: 400_000,
            timeout: Duration::from_secs(15 * 60),
            max_output_tokens: Some(4096),
            repeat_limit: 2,
            interrupt: None,
            fetch_allow: Vec::new(),
            bash_net: None,
            base_url: None,
            api_key_env: None,
            retry: RetryPolicy::default(),
            ladder: None,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The model answered without a tool call.
    Finished,
    TurnBudget,
    TokenBudget,
    TimeBudget,
    /// The provider refused permanently or stayed unavailable.
    ProviderFailed,
    Interrupted,
    /// An approval is pending and nobody could answer it now: the
    /// session is suspended in the ledger, to be decided and resumed.
    Suspended,
    /// retie itself failed (the ledger could not record...).
    Failed,
}

impl Status {
    /// The name recorded in the ledger (as in `--json`).
    pub fn name(self) -> &'static str {
        match self {
            Status::Finished => "finished",
            Status::TurnBudget => "turn_budget",
            Status::TokenBudget => "token_budget",
            Status::TimeBudget => "time_budget",
            Status::ProviderFailed => "provider_failed",
            Status::Interrupted => "interrupted",
            Status::Suspended => "suspended",
            Status::Failed => "failed",
        }
    }

    pub fn is_budget(self) -> bool {
        matches!(
            self,
            Status::TurnBudget | Status::TokenBudget | Status::TimeBudget
        )
    }
}

/// One tool call and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct CallRecord {
    pub call_id: String,
    pub tool: String,
    /// The action's id in the ledger (`retie log`), when it ran.
    pub action: Option<i64>,
    /// `ok`, `error`, `refused`, `invalid`.
    pub status: &'static str,
    pub summary: String,
    /// What the model was told (its first 2000 characters).
    pub said: String,
    /// The files it changed, both contents (for the person's diff).
    #[serde(skip)]
    pub changes: Vec<retie_dispatch::diffs::FileChange>,
}

/// What a session did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub session: String,
    pub status: Status,
    /// Why it stopped, for a person.
    pub message: String,
    pub turns: u32,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub actions: Vec<CallRecord>,
    pub answer: String,
    /// Results shortened to a preview, and recalls made.
    pub shortened: usize,
    pub recalls: usize,
    /// The approval the session is suspended at.
    pub pending: Option<PendingInfo>,
}

/// The terminal side: streamed text and one line per call.
pub trait Render: Send {
    fn event(&mut self, ev: &StreamEvent);
    /// A call is about to be checked and dispatched.
    fn call_started(&mut self, _call: &ToolCall) {}
    /// A call ended (ran, refused, invalid).
    fn call(&mut self, c: &CallRecord);
    /// The provider failed transiently (`why`); the turn is asked again
    /// after `wait`, and what this attempt streamed is dropped.
    fn retrying(&mut self, _why: &str, _wait: Duration) {}
    /// The ladder switched models (`line` says from, to and why).
    fn switched(&mut self, _line: &str) {}
}

/// The session-open entry: provider, model, the system prompt's digest.
pub fn session_spec(
    workspace: &std::path::Path,
    provider: &str,
    cfg: &SessionConfig,
    prompt: &str,
    policy_digest: &str,
    yes_flag: bool,
) -> SessionSpec {
    // The session's delegation: every effect one of its tools' actions may
    // have (fetch reads untrusted content). Each intent records its own
    // action's reach, which `retie verify` checks lies inside this list.
    let mut effects = vec![
        "reads_workspace",
        "writes_workspace",
        "runs_sandboxed",
        "reads_untrusted",
    ];
    // A networked bash sends out (ADR 0313).
    if cfg.bash_net.is_some() {
        effects.push("network_egress");
    }
    SessionSpec {
        join: None,
        workspace: workspace.to_path_buf(),
        opened: payload::SessionOpened {
            objective: Some(prompt.into()),
            origin: Some("retie run".into()),
            provider: Some(provider.into()),
            model: Some(cfg.model.clone()),
            system_prompt_digest: Some(
                blake3::hash(cfg.system_prompt.as_bytes())
                    .to_hex()
                    .to_string(),
            ),
            system_prompt: Some(cfg.system_prompt.clone()),
            pid: Some(std::process::id()),
            policy_digest: Some(policy_digest.into()),
            autonomy: Some(cfg.tier.name().into()),
            approvals_from_yes_flag: Some(yes_flag),
            fetch_allow: Some(cfg.fetch_allow.clone()),
            bash_net: cfg.bash_net.clone(),
            base_url: cfg.base_url.clone(),
            api_key_env: cfg.api_key_env.clone(),
            budget: Some(payload::Budget {
                max_turns: Some(cfg.max_turns),
                max_tokens: Some(cfg.max_tokens),
                timeout_s: Some(cfg.timeout.as_secs_f64()),
            }),
            ..payload::SessionOpened::default()
        },
        effects: effects.iter().map(|e| e.to_string()).collect(),
        intent_base: json!({
            "tool": "agent",
            "workspace": workspace.display().to_string(),
            "mode": "overlay",
            "effects": effects,
        }),
    }
}

/// Approves what the gate asks, because the person passed `--yes`. A deny
/// never reaches an approver, so it is never overridden.
pub struct YesFlag;

impl Approver for YesFlag {
    fn answers_at_once(&self) -> bool {
        true
    }
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval {
        Approval::Approved {
            by: "person (--yes flag)".into(),
            digest: req.action.digest(),
        }
    }
}

/// No terminal, no `--yes`: nobody can approve now. The approval stays
/// pending in the ledger and the session suspends.
pub struct NoOne;

impl Approver for NoOne {
    fn approve(&mut self, _: &ApprovalRequest<'_>) -> Approval {
        Approval::Suspend
    }
}

/// No terminal, and the person asked for refusals instead of a
/// suspension (`--on-ask refuse`): what the gate asks about is refused,
/// and the model is told.
pub struct NoOneRefuses;

impl Approver for NoOneRefuses {
    fn answers_at_once(&self) -> bool {
        true
    }
    fn approve(&mut self, _: &ApprovalRequest<'_>) -> Approval {
        Approval::Denied {
            by: "retie (no terminal)".into(),
            reason: "no one to approve".into(),
        }
    }
}

/// A pending approval the session stopped at, for the person.
#[derive(Debug, Clone, Serialize)]
pub struct PendingInfo {
    /// The pending entry's seq in the ledger.
    pub pending: i64,
    pub tool: String,
    /// The frozen arguments (JSON).
    pub arguments: Value,
    /// Their digest: what an approval binds.
    pub digest: String,
    pub summary: String,
    /// Why the gate asks.
    pub reason: String,
}

/// Everything a session can fail with before or between turns.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The chokepoint or the ledger failed.
    #[error(transparent)]
    Dispatch(#[from] retie_dispatch::Error),
    /// The ledger's record of the session cannot be read back into a
    /// conversation.
    #[error("session {session}: {why}")]
    Unreadable { session: String, why: String },
}

/// A conversation whose every message, decision and grant is in the
/// ledger: open a new one or resume one from the ledger, [`send`] turns,
/// [`close`] it.
///
/// [`send`]: Session::send
/// [`close`]: Session::close
pub struct Session<P: Provider> {
    provider: P,
    tools: Tools,
    rec: Option<Recorder>,
    cfg: SessionConfig,
    messages: Vec<Message>,
    usage: Usage,
    turns: u32,
    ctx: Context,
    failures: HashMap<(String, String), usize>,
    /// Calls of the last assistant turn not answered yet (after a resume
    /// or a suspension), and whether that turn was cut off.
    unanswered: Vec<ToolCall>,
    unanswered_truncated: bool,
    /// Calls whose intent is recorded but whose outcome was lost (the
    /// process died while they ran): call id → action id.
    ran_unconfirmed: HashMap<String, i64>,
    pending: Option<PendingInfo>,
    cancel: Cancel,
    /// A resume under another autonomy: (recorded, now).
    tier_change: Option<(Tier, Tier)>,
    /// How the last send ended, for the close (or suspension) entry.
    end: Option<SessionEnd>,
    /// Turns in a row that broke the tool protocol (for the ladder).
    broken_turns: u32,
    /// The ladder's start is recorded.
    ladder_recorded: bool,
}

impl<P: Provider> Session<P> {
    /// A new session. `rec` was opened with [`session_spec`]; nothing is
    /// written until the first durable point.
    pub fn open(provider: P, mut tools: Tools, rec: Recorder, cfg: SessionConfig) -> Session<P> {
        let ctx = Context::new(cfg.tier);
        let cancel = Cancel::new();
        tools.cancel = cancel.clone();
        let messages = vec![Message::system(&cfg.system_prompt)];
        Session {
            provider,
            tools,
            rec: Some(rec),
            ctx,
            messages,
            usage: Usage::default(),
            turns: 0,
            failures: HashMap::new(),
            unanswered: Vec::new(),
            unanswered_truncated: false,
            ran_unconfirmed: HashMap::new(),
            pending: None,
            cancel,
            cfg,
            tier_change: None,
            end: None,
            broken_turns: 0,
            ladder_recorded: false,
        }
    }

    /// Take a session up again from its rows (`Recorder::resume` verified
    /// the ledger and took the lock): the exact message list, usage and
    /// turns, the taint of what ran, and the calls of the last turn still
    /// to answer (an open pending approval among them is decided or asked
    /// again with the same digest).
    pub fn resume(
        provider: P,
        mut tools: Tools,
        rec: Recorder,
        mut cfg: SessionConfig,
        rows: &[Row],
    ) -> Result<Session<P>, SessionError> {
        let sid = rec.session_id().to_string();
        let bad = |why: String| SessionError::Unreadable {
            session: sid.clone(),
            why,
        };
        let mut messages = Vec::new();
        let mut usage = Usage::default();
        let mut turns = 0u32;
        let mut truncated_last = false;
        let mut ctx = Context::new(cfg.tier);
        let mut proposals: HashMap<i64, payload::Proposed> = HashMap::new();
        let mut intents_by_call: HashMap<String, i64> = HashMap::new();
        let mut awaiting_outcome: std::collections::BTreeMap<i64, retie_policy::Action> =
            std::collections::BTreeMap::new();
        let mut recorded_tier: Option<Tier> = None;
        for r in rows {
            let Some(k) = Kind::parse(&r.kind) else {
                continue;
            };
            let p = r.payload_json();
            let typed = |why: String| bad(format!("entry {} is ill-typed: {why}", r.seq));
            match k {
                Kind::Note => {
                    let n = payload::parse::<payload::Note>(&p).map_err(typed)?;
                    if let Some(("autonomy", v)) = n.setting_value() {
                        recorded_tier = v.as_str().and_then(|t| t.parse().ok()).or(recorded_tier);
                    }
                }
                Kind::SessionOpened => {
                    let o = payload::parse::<payload::SessionOpened>(&p).map_err(typed)?;
                    recorded_tier = o.autonomy.as_deref().and_then(|t| t.parse().ok());
                    // `retie retest` sessions (issue 28) are agent sessions
                    // with another tool set: the same resume.
                    if !matches!(o.origin.as_deref(), Some("retie run" | "retie retest")) {
                        return Err(bad(
                            "it is not an agent session (`retie run`); only those resume".into(),
                        ));
                    }
                    if let Some(sp) = o.system_prompt {
                        cfg.system_prompt = sp;
                    }
                    messages.push(Message::system(&cfg.system_prompt));
                }
                Kind::Message => {
                    let pm = payload::parse::<payload::Message>(&p).map_err(typed)?;
                    let m: Message = serde_json::from_value(pm.message)
                        .map_err(|_| bad(format!("message entry {} is unreadable", r.seq)))?;
                    if m.role == Role::Assistant {
                        turns += 1;
                        truncated_last = pm.truncated == Some(true);
                        if let Some(u) = pm.usage {
                            usage.input_tokens += u.input_tokens;
                            usage.output_tokens += u.output_tokens;
                        }
                    }
                    messages.push(m);
                }
                Kind::Proposed => {
                    let pp = payload::parse::<payload::Proposed>(&p).map_err(typed)?;
                    proposals.insert(r.seq, pp);
                }
                Kind::Intent => {
                    let i = payload::parse::<payload::Intent>(&p).map_err(typed)?;
                    // What ran taints the session as it did then: judged
                    // at its outcome, by the live session's rule (content
                    // that reached the model: a result that ran, or any
                    // bash output; a refused fetch brought nothing in).
                    if let Some(a) = i
                        .call
                        .proposal
                        .and_then(|s| proposals.get(&s))
                        .and_then(|pp| pp.action.clone())
                        .and_then(|a| {
                            retie_policy::Action::from_json(&Value::Object(a).to_string()).ok()
                        })
                    {
                        awaiting_outcome.insert(r.seq, a);
                    }
                    if let Some(c) = i.call.call {
                        intents_by_call.insert(c, r.seq);
                    }
                }
                Kind::Outcome => {
                    if let Some(a) = p
                        .get("action")
                        .and_then(Value::as_i64)
                        .and_then(|seq| awaiting_outcome.remove(&seq))
                    {
                        let ran = p.get("status").and_then(Value::as_str) == Some("ran");
                        if ran || a.tool() == "bash" {
                            ctx.taint = ctx.taint.after(&tools.policy, &a);
                        }
                    }
                }
                _ => {}
            }
        }
        // An intent with no outcome (a crash while it ran): what it took
        // in cannot be known, so it taints, as if it had reached the model.
        for a in awaiting_outcome.values() {
            ctx.taint = ctx.taint.after(&tools.policy, a);
        }
        if messages.is_empty() {
            return Err(bad("its opening entry is missing".into()));
        }
        // The last assistant turn's calls that no tool result answers.
        let mut unanswered = Vec::new();
        if let Some(i) = messages.iter().rposition(|m| m.role == Role::Assistant) {
            let answered: Vec<&str> = messages[i + 1..]
                .iter()
                .filter_map(|m| m.tool_call_id.as_deref())
                .collect();
            unanswered = messages[i]
                .tool_calls
                .iter()
                .filter(|c| !answered.contains(&c.id.as_str()))
                .cloned()
                .collect();
        }
        // Another autonomy than the session's last recorded one (`--resume
        // --autonomy`): recorded before anything is decided under it. It
        // never reaches past a decision already recorded: dispatch holds a
        // resumed pending approval to the person's answer whatever the tier.
        let mut rec = rec;
        let tier_change = match recorded_tier {
            Some(t) if t != cfg.tier => {
                rec.setting(
                    "autonomy",
                    json!(cfg.tier.name()),
                    "person (--autonomy on resume)",
                )?;
                Some((t, cfg.tier))
            }
            _ => None,
        };
        let cancel = Cancel::new();
        tools.cancel = cancel.clone();
        let ran_unconfirmed = unanswered
            .iter()
            .filter_map(|c| intents_by_call.get(&c.id).map(|a| (c.id.clone(), *a)))
            .collect();
        Ok(Session {
            provider,
            tools,
            rec: Some(rec),
            messages,
            usage,
            turns,
            ctx,
            failures: HashMap::new(),
            unanswered,
            unanswered_truncated: truncated_last,
            ran_unconfirmed,
            pending: None,
            cancel,
            cfg,
            tier_change,
            end: None,
            broken_turns: 0,
            ladder_recorded: false,
        })
    }

    /// The ladder, when the session climbs one (the models it refused
    /// are there, for the probe cache).
    pub fn ladder(&self) -> Option<&crate::ladder::Ladder> {
        self.cfg.ladder.as_ref()
    }

    /// How the ladder reads a provider failure (`None`: not the
    /// ladder's, or no ladder): a refusal, the account's cap, a rate
    /// limit asking a longer wait than retie waits (a session limit
    /// within the window, else the cap), a malformed answer (a turn
    /// that broke the protocol).
    fn ladder_failure(&mut self, e: &ProviderError) -> Option<crate::ladder::Failure> {
        use crate::ladder::Failure;
        let ladder = self.cfg.ladder.as_ref()?;
        if e.is_refusal() {
            return Some(Failure::Refused(e.message().to_string()));
        }
        if e.is_account_cap() {
            return Some(Failure::AccountCap {
                message: e.message().to_string(),
                resets_in: None,
            });
        }
        match e {
            ProviderError::Transient(t) if t.cause == crate::model::Cause::RateLimited => {
                let w = t.retry_after?;
                (w > self.cfg.retry.max_delay).then(|| ladder.rate_limit(&t.message, w))
            }
            ProviderError::Malformed(_) => {
                self.broken_turns += 1;
                (self.broken_turns >= ladder.malformed_turns).then_some(Failure::BrokeProtocol {
                    turns: self.broken_turns,
                })
            }
            _ => None,
        }
    }

    /// Climb (or stop) on `f`: the switch is recorded (a model setting
    /// by the ladder, so a resume asks the same model) before the next
    /// request. `Ok(None)`: switched; `Ok(Some(m))`: stop with `m`.
    fn climb(
        &mut self,
        f: &crate::ladder::Failure,
        ui: &mut dyn Render,
    ) -> Result<Option<String>, String> {
        let Some(ladder) = self.cfg.ladder.as_mut() else {
            return Ok(Some(f.describe()));
        };
        match ladder.on_failure(f) {
            crate::ladder::Step::Stop(m) => {
                if let Some(rec) = self.rec.as_mut() {
                    rec.record_note(
                        false,
                        &payload::Note {
                            ladder: Some("stop".into()),
                            model: Some(self.cfg.model.clone()),
                            reason: Some(f.name().into()),
                            why: Some(m.clone()),
                            ..payload::Note::default()
                        },
                    )
                    .map_err(|e| format!("the ledger failed: {e}"))?;
                }
                Ok(Some(m))
            }
            crate::ladder::Step::Switch { from, to, reason } => {
                if let Some(rec) = self.rec.as_mut() {
                    rec.record_note(
                        false,
                        &payload::Note {
                            ladder: Some("switch".into()),
                            from: Some(from.model.clone()),
                            from_tier: Some(from.tier),
                            to: Some(to.model.clone()),
                            to_tier: Some(to.tier),
                            reason: Some(f.name().into()),
                            why: Some(reason.clone()),
                            ..payload::Note::setting("model", json!(to.model), "ladder")
                        },
                    )
                    .map_err(|e| format!("the ledger failed: {e}"))?;
                }
                self.broken_turns = 0;
                self.cfg.model = to.model.clone();
                ui.switched(&format!(
                    "{} (tier {}) → {} (tier {}): {}",
                    visible(&from.model),
                    from.tier,
                    visible(&to.model),
                    to.tier,
                    visible(&reason)
                ));
                Ok(None)
            }
        }
    }

    /// The autonomy this resume changed, (recorded before, now), if it
    /// differs from the session's last recorded one.
    pub fn tier_change(&self) -> Option<(Tier, Tier)> {
        self.tier_change
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        self.rec.as_ref().map(|r| r.session_id()).unwrap_or("")
    }

    /// The conversation as the model sees it.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Tokens so far (the provider's counts), this process and before.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Provider turns so far.
    pub fn turns(&self) -> u32 {
        self.turns
    }

    /// Nothing left to do without a new message from the person: no call
    /// unanswered and the model's last word was an answer.
    pub fn waiting_for_input(&self) -> bool {
        self.unanswered.is_empty()
            && self
                .messages
                .last()
                .is_some_and(|m| m.role != Role::User && m.role != Role::Tool)
    }

    /// The approval the session stopped at, if it is suspended.
    pub fn pending(&self) -> Option<&PendingInfo> {
        self.pending.as_ref()
    }

    /// The open pending approval this session was resumed at, before the
    /// first `send` takes it up (for showing it: same digest).
    pub fn resumed_pending(&self) -> Option<PendingInfo> {
        let op = self.rec.as_ref()?.resumed_pending()?;
        Some(pending_info(op.seq, &op.payload))
    }

    /// The grants in force ("always for this session").
    pub fn grants(&self) -> Vec<Grant> {
        self.rec
            .as_ref()
            .map(|r| r.grants().to_vec())
            .unwrap_or_default()
    }

    /// Take back grant `seq` (a `revoke` entry, durable at once).
    /// Change the autonomy tier from the next task on, recorded first.
    pub fn set_tier(&mut self, tier: Tier) -> Result<(), SessionError> {
        if let Some(r) = self.rec.as_mut() {
            r.setting("autonomy", json!(tier.name()), "person")?;
        }
        self.cfg.tier = tier;
        // The gate reads the context's tier: without this the change was
        // recorded but the next tasks still asked under the old tier.
        self.ctx.tier = tier;
        Ok(())
    }

    /// Change the model asked from the next task on, recorded first.
    pub fn set_model(&mut self, model: &str) -> Result<(), SessionError> {
        if let Some(r) = self.rec.as_mut() {
            r.setting("model", json!(model), "person")?;
        }
        self.cfg.model = model.to_string();
        Ok(())
    }

    /// Record a note of the session now (durable at once): a retest's
    /// verdict, an operator's adjudication.
    pub fn record_note(
        &mut self,
        by_person: bool,
        note: &payload::Note,
    ) -> Result<(), SessionError> {
        if let Some(r) = self.rec.as_mut() {
            r.record_note(by_person, note)?;
        }
        Ok(())
    }

    /// The operator's own command in a retest (`!CMD` at the prompt),
    /// dispatched now through the chokepoint in the same kind of lab
    /// sandbox as the model's `run_command`, recorded as the person's
    /// ([`Tools::operator_command`]). Returns the text to show (and to
    /// give the model with the operator's next message); `Err` is the
    /// ledger's failure.
    pub fn operator_command(&mut self, command: &str) -> Result<String, SessionError> {
        let Some(rec) = self.rec.as_mut() else {
            return Ok("no ledger session: nothing ran".into());
        };
        let text = match self.tools.operator_command(rec, &self.ctx, command)? {
            Err(why) => format!("not run: {why}"),
            Ok((r, action)) => {
                if r.took_in {
                    // What it brought in reaches the model next.
                    self.ctx.taint = self.ctx.taint.after(&self.tools.policy, &action);
                }
                r.text
            }
        };
        Ok(text)
    }

    pub fn revoke(&mut self, seq: i64) -> Result<(), SessionError> {
        match self.rec.as_mut() {
            Some(r) => Ok(r.revoke(seq, "person")?),
            None => Ok(()),
        }
    }

    /// The cancel token of the running turn: `cancel()` stops the turn
    /// between steps (and is handed to the tools for a running sandbox).
    pub fn cancel_token(&self) -> Cancel {
        self.cancel.clone()
    }

    /// The tools (the workspace, the policy, settings).
    pub fn tools(&mut self) -> &mut Tools {
        &mut self.tools
    }

    /// The settings (the model name, the tier...), changeable between
    /// sends.
    pub fn config(&mut self) -> &mut SessionConfig {
        &mut self.cfg
    }

    fn interrupted(&self) -> bool {
        interrupt_raised(&self.cancel, self.cfg.interrupt)
    }

    fn report(
        &self,
        status: Status,
        message: String,
        answer: String,
        actions: Vec<CallRecord>,
    ) -> Report {
        Report {
            session: self.id().to_string(),
            status,
            message,
            turns: self.turns,
            tokens_in: self.usage.input_tokens,
            tokens_out: self.usage.output_tokens,
            actions,
            answer,
            shortened: self.tools.recall.shortened,
            recalls: self.tools.recall.recalls,
            pending: self.pending.clone(),
        }
    }

    /// Keep `m` and record it, with what is known of its turn (`turn`:
    /// its `message` is set here).
    fn push(&mut self, m: Message, mut turn: payload::Message) {
        let person = m.role == Role::User;
        if let Some(r) = self.rec.as_mut() {
            turn.message = serde_json::to_value(&m).unwrap_or(Value::Null);
            r.message(person, &turn);
        }
        self.messages.push(m);
    }

    /// Run turns on `user_text` (none: continue where the session stood,
    /// after a resume) until the model answers without a tool call, a
    /// budget runs out, the turn is cancelled, or an approval is pending
    /// that nobody can answer now (status `suspended`: [`close`] then
    /// records the suspension).
    ///
    /// [`close`]: Session::close
    pub async fn send(
        &mut self,
        user_text: Option<&str>,
        approver: &mut dyn Approver,
        ui: &mut dyn Render,
    ) -> Report {
        let report = self.send_turns(user_text, approver, ui).await;
        self.end = Some(SessionEnd {
            outcome: report.status.name().into(),
            message: report.message.clone(),
            turns: self.turns,
        });
        report
    }

    async fn send_turns(
        &mut self,
        user_text: Option<&str>,
        approver: &mut dyn Approver,
        ui: &mut dyn Render,
    ) -> Report {
        let started = Instant::now();
        let mut actions = Vec::new();
        let mut turns_here = 0u32;
        self.pending = None;
        if let Some(t) = user_text {
            self.push(Message::user(t), payload::Message::default());
        }
        if let (Some(l), false) = (&self.cfg.ladder, self.ladder_recorded) {
            let start = payload::Note {
                ladder: Some("start".into()),
                model: Some(l.current().model.clone()),
                tier: Some(l.current().tier),
                rungs: Some(
                    l.rungs()
                        .iter()
                        .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
                        .collect(),
                ),
                ..payload::Note::default()
            };
            if let Some(rec) = self.rec.as_mut() {
                if let Err(e) = rec.record_note(false, &start) {
                    return self.report(
                        Status::Failed,
                        format!("the ledger failed: {e}"),
                        String::new(),
                        actions,
                    );
                }
            }
            self.ladder_recorded = true;
        }
        // First the calls a resume found unanswered.
        if !self.unanswered.is_empty() {
            let calls = std::mem::take(&mut self.unanswered);
            let truncated = self.unanswered_truncated;
            if let Err(r) = self.calls(&calls, truncated, approver, ui, &mut actions) {
                return r.into_report(self, actions);
            }
        }
        loop {
            if self.interrupted() {
                return self.report(
                    Status::Interrupted,
                    "interrupted".into(),
                    String::new(),
                    actions,
                );
            }
            if turns_here >= self.cfg.max_turns {
                let m = format!(
                    "stopped: the turn budget ({} turns) is spent and the model had not finished",
                    self.cfg.max_turns
                );
                return self.report(Status::TurnBudget, m, String::new(), actions);
            }
            if self.usage.input_tokens + self.usage.output_tokens >= self.cfg.max_tokens {
                let m = format!(
                    "stopped: the token budget ({} tokens) is spent ({} in, {} out) and the model had not finished",
                    self.cfg.max_tokens, self.usage.input_tokens, self.usage.output_tokens
                );
                return self.report(Status::TokenBudget, m, String::new(), actions);
            }
            let Some(left) = self.cfg.timeout.checked_sub(started.elapsed()) else {
                let m = format!(
                    "stopped: the time budget ({} s) is spent",
                    self.cfg.timeout.as_secs()
                );
                return self.report(Status::TimeBudget, m, String::new(), actions);
            };
            let mut req = TurnRequest {
                model: self.cfg.model.clone(),
                messages: self.messages.clone(),
                tools: self.tools.specs(),
                max_tokens: self.cfg.max_output_tokens,
            };
            // What the model is about to read is durable before it is
            // asked: a crash while it answers (seconds to minutes) loses
            // only that answer, never the last results or outcomes. One
            // transaction, and only when something is queued.
            if let Err(e) = self.flush() {
                return self.report(
                    Status::Failed,
                    format!("the ledger failed: {e}"),
                    String::new(),
                    actions,
                );
            }
            turns_here += 1;
            // The turn, asked again while the provider fails
            // transiently: each failed attempt is recorded with its
            // cause; what it streamed is dropped (its calls were never
            // complete: a provider reports calls only after a clean
            // end); after `retry.max_attempts` the session suspends.
            let mut attempt = 0u32;
            let mut left = left;
            let turn = loop {
                attempt += 1;
                let mut streamed = 0u64;
                let answer = {
                    let mut on_event = |e: StreamEvent| {
                        if let StreamEvent::Text(t) = &e {
                            streamed += t.chars().count() as u64;
                        }
                        ui.event(&e)
                    };
                    // A person's Ctrl-C (the session's cancel token, or
                    // the process's interrupt flag) ends the wait for the
                    // model at once: the request is dropped, the turn
                    // ends interrupted.
                    let (cancel, flag) = (self.cancel.clone(), self.cfg.interrupt);
                    let asked = async {
                        tokio::select! {
                            t = tokio::time::timeout(left, self.provider.turn(&req, &mut on_event)) => Some(t),
                            () = cancelled(cancel, flag) => None,
                        }
                    };
                    asked.await
                };
                let Some(answer) = answer else {
                    return self.report(
                        Status::Interrupted,
                        "interrupted while the model answered; the request was dropped".into(),
                        String::new(),
                        actions,
                    );
                };
                let e = match answer {
                    Err(_) => {
                        let m = format!(
                            "stopped: the time budget ({} s) ran out while the model answered",
                            self.cfg.timeout.as_secs()
                        );
                        return self.report(Status::TimeBudget, m, String::new(), actions);
                    }
                    Ok(Ok(t)) => break t,
                    Ok(Err(e)) => e,
                };
                let transient = match &e {
                    ProviderError::Transient(t) => Some(t.clone()),
                    _ => None,
                };
                let retry = self.cfg.retry;
                let wait = transient
                    .as_ref()
                    .filter(|_| attempt < retry.max_attempts)
                    .and_then(|t| retry.wait(attempt, t.retry_after));
                let in_budget = wait.is_some_and(|w| started.elapsed() + w < self.cfg.timeout);
                let record = ProviderAttempt {
                    turn: self.turns + 1,
                    attempt,
                    cause: e.cause_name().into(),
                    transient: transient.is_some(),
                    status: transient.as_ref().and_then(|t| t.status),
                    message: e.message().to_string(),
                    retry_after_ms: transient
                        .as_ref()
                        .and_then(|t| t.retry_after)
                        .map(|d| d.as_millis() as u64),
                    // Under the ladder a malformed answer is asked again
                    // (a broken turn) until the ladder climbs.
                    retried: in_budget
                        || (self.cfg.ladder.is_some() && matches!(e, ProviderError::Malformed(_))),
                    wait_ms: wait.filter(|_| in_budget).map(|d| d.as_millis() as u64),
                    dropped_text_chars: streamed,
                };
                if let Some(rec) = self.rec.as_mut() {
                    if let Err(err) = rec.provider_attempt(&record) {
                        return self.report(
                            Status::Failed,
                            format!("the ledger failed: {err}"),
                            String::new(),
                            actions,
                        );
                    }
                }
                if let Some(f) = self.ladder_failure(&e) {
                    match self.climb(&f, ui) {
                        Ok(None) => {
                            req.model = self.cfg.model.clone();
                            attempt = 0;
                            continue;
                        }
                        Ok(Some(m)) => {
                            return self.report(Status::ProviderFailed, m, String::new(), actions)
                        }
                        Err(m) => return self.report(Status::Failed, m, String::new(), actions),
                    }
                }
                if self.cfg.ladder.is_some() && matches!(e, ProviderError::Malformed(_)) {
                    // Under the ladder a malformed answer is a broken
                    // turn: asked again until the ladder climbs.
                    attempt = 0;
                    continue;
                }
                let Some(t) = transient else {
                    return self.report(
                        Status::ProviderFailed,
                        format!("the provider failed: {e}"),
                        String::new(),
                        actions,
                    );
                };
                let Some(w) = wait.filter(|_| in_budget) else {
                    let why = if attempt >= retry.max_attempts {
                        format!("the provider failed {attempt} times in a row")
                    } else if wait.is_none() {
                        format!(
                            "the provider asks to wait {} s, more than the {} s retie waits",
                            t.retry_after.map(|d| d.as_secs()).unwrap_or(0),
                            retry.max_delay.as_secs()
                        )
                    } else {
                        "the time budget would run out while waiting to retry".into()
                    };
                    let m = format!(
                        "suspended: {why} (last: {t}); nothing of the failed attempts was kept. Continue with `retie run --resume {}` once it answers",
                        self.id()
                    );
                    return self.report(Status::Suspended, m, String::new(), actions);
                };
                ui.retrying(&t.to_string(), w);
                let (cancel, flag) = (self.cancel.clone(), self.cfg.interrupt);
                tokio::select! {
                    () = tokio::time::sleep(w) => {}
                    () = cancelled(cancel, flag) => {
                        return self.report(
                            Status::Interrupted,
                            "interrupted while waiting to ask the model again".into(),
                            String::new(),
                            actions,
                        );
                    }
                }
                let Some(l) = self.cfg.timeout.checked_sub(started.elapsed()) else {
                    let m = format!(
                        "stopped: the time budget ({} s) is spent",
                        self.cfg.timeout.as_secs()
                    );
                    return self.report(Status::TimeBudget, m, String::new(), actions);
                };
                left = l;
            };
            // A turn counts once answered (as `retie sessions` counts
            // the assistant messages); failed attempts are entries of
            // their own.
            self.turns += 1;
            self.usage.input_tokens += turn.usage.input_tokens;
            self.usage.output_tokens += turn.usage.output_tokens;
            self.push(
                Message::assistant(&turn.text, turn.tool_calls.clone()),
                payload::Message {
                    usage: Some(payload::TokenUsage {
                        input_tokens: turn.usage.input_tokens,
                        output_tokens: turn.usage.output_tokens,
                    }),
                    truncated: Some(turn.truncated),
                    stop_reason: turn.stop_reason.clone(),
                    attempt: Some(attempt),
                    model: Some(self.cfg.model.clone()),
                    tier: self.cfg.ladder.as_ref().map(|l| l.current().tier),
                    ..payload::Message::default()
                },
            );
            // A turn breaks the tool protocol when a call's arguments are
            // not a JSON object (the turn was not cut off) or it names no
            // tool of the session; N in a row climb the ladder.
            let broke = turn.tool_calls.iter().any(|c| {
                (c.arguments.is_err() && !turn.truncated)
                    || !req.tools.iter().any(|t| t.name == c.name)
            });
            self.broken_turns = if broke { self.broken_turns + 1 } else { 0 };
            if turn.tool_calls.is_empty() {
                if turn.truncated {
                    self.push(
                        Message::user(
                            "Your answer was cut off by the length limit. Continue, more briefly.",
                        ),
                        payload::Message {
                            from: Some("retie".into()),
                            ..payload::Message::default()
                        },
                    );
                    continue;
                }
                return self.report(Status::Finished, "finished".into(), turn.text, actions);
            }
            if let Err(r) = self.calls(&turn.tool_calls, turn.truncated, approver, ui, &mut actions)
            {
                return r.into_report(self, actions);
            }
            let limit = self.cfg.ladder.as_ref().map(|l| l.malformed_turns);
            if limit.is_some_and(|n| self.broken_turns >= n) {
                let f = crate::ladder::Failure::BrokeProtocol {
                    turns: self.broken_turns,
                };
                match self.climb(&f, ui) {
                    Ok(None) => {}
                    Ok(Some(m)) => {
                        return self.report(Status::ProviderFailed, m, String::new(), actions)
                    }
                    Err(m) => return self.report(Status::Failed, m, String::new(), actions),
                }
            }
            if self.tools.concluded() {
                // A retest's valid conclusion ends it (issue 28).
                return self.report(Status::Finished, "concluded".into(), String::new(), actions);
            }
        }
    }

    /// Handle one turn's calls in order. `Err` stops the send.
    fn calls(
        &mut self,
        calls: &[ToolCall],
        truncated: bool,
        approver: &mut dyn Approver,
        ui: &mut dyn Render,
        actions: &mut Vec<CallRecord>,
    ) -> Result<(), Stop> {
        for (i, call) in calls.iter().enumerate() {
            if self.interrupted() {
                self.push(
                    Message::tool_result(call, "not run: the session was interrupted"),
                    payload::Message::default(),
                );
                continue;
            }
            if let Some(action) = self.ran_unconfirmed.remove(&call.id) {
                let text = format!(
                    "the session was interrupted while this call ran (action {action}); its outcome was not recorded. Check the workspace before relying on it"
                );
                self.push(
                    Message::tool_result(call, &text),
                    payload::Message::default(),
                );
                continue;
            }
            ui.call_started(call);
            let key = (call.name.clone(), call.raw_arguments.clone());
            let rec = self.rec.as_mut().ok_or(Stop::Closed)?;
            rec.note("call", json!(call.id));
            let checked = check_call(
                &self.tools,
                call,
                truncated,
                &self.failures,
                self.cfg.repeat_limit,
            )
            .and_then(|args| self.tools.prepare(&call.name, &args));
            let line = match checked {
                Err(msg) => {
                    if let Err(e) = refuse_call(rec, call, &msg) {
                        return Err(Stop::Failed(format!("the ledger failed: {e}")));
                    }
                    *self.failures.entry(key).or_default() += 1;
                    self.push(
                        Message::tool_result(call, format!("error: {msg}")),
                        payload::Message::default(),
                    );
                    CallRecord {
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        action: None,
                        status: "invalid",
                        summary: retie_dispatch::display::shell_line(&[&call.name]),
                        said: msg,
                        changes: Vec::new(),
                    }
                }
                Ok(prepared) => {
                    let action = prepared.action.clone();
                    // The call a resumed pending approval belongs to must
                    // freeze to the same digest, or the decision would
                    // not be for what runs: stop instead.
                    if let Some(op) = rec.resumed_pending() {
                        let for_this = op.payload.get("call").and_then(Value::as_str)
                            == Some(call.id.as_str());
                        if for_this && op.digest != action.digest().to_hex() {
                            return Err(Stop::Failed(format!(
                                "the call {} rebuilt from the ledger freezes to digest {}, but its pending approval {} is for {}: nothing was run",
                                visible(&call.id),
                                action.digest().to_hex(),
                                op.seq,
                                op.digest
                            )));
                        }
                    }
                    // A tool's own failure comes back as its result (the
                    // model reads it, the session goes on); an error here
                    // is the ledger's, and nothing may run unrecorded.
                    let r = match self.tools.run(rec, &self.ctx, prepared, approver) {
                        Err(e) => {
                            return Err(Stop::Failed(format!(
                                "retie failed at the chokepoint: {e}"
                            )))
                        }
                        Ok(r) => r,
                    };
                    if let Some(pending) = r.pending {
                        // Suspended: this call and the ones after it stay
                        // unanswered until the session resumes.
                        let payload = self
                            .rec
                            .as_ref()
                            .and_then(|r| r.pending_payload(pending))
                            .unwrap_or_else(|| {
                                json!({"action": action.to_json(), "digest": action.digest().to_hex()})
                            });
                        let mut info = pending_info(pending, &payload);
                        info.summary = r.summary.clone();
                        self.pending = Some(info);
                        self.unanswered = calls[i..].to_vec();
                        self.unanswered_truncated = truncated;
                        return Err(Stop::Suspended);
                    }
                    if r.took_in {
                        // What the action brought in taints the session
                        // from now on; an attempt that brought in nothing
                        // (a refused fetch) taints nothing.
                        self.ctx.taint = self.ctx.taint.after(&self.tools.policy, &action);
                    }
                    if r.failed {
                        *self.failures.entry(key).or_default() += 1;
                    }
                    self.push(
                        Message::tool_result(call, &r.text),
                        payload::Message::default(),
                    );
                    CallRecord {
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        action: r.action,
                        status: r.status,
                        summary: r.summary,
                        said: r.text.chars().take(SAID_CHARS).collect(),
                        changes: r.changes,
                    }
                }
            };
            ui.call(&line);
            actions.push(line);
        }
        Ok(())
    }

    /// Make what the session queued (messages) durable now: one
    /// transaction. The interactive front calls it after each exchange;
    /// otherwise messages ride on the next durable point (an action's,
    /// the suspension, the close) and cost no fsync of their own.
    pub fn flush(&mut self) -> Result<(), SessionError> {
        if let Some(r) = self.rec.as_mut() {
            r.flush()?;
        }
        Ok(())
    }

    /// End this process's part: a suspended session records its
    /// suspension (it stays open, to be resumed); any other is closed.
    /// Either way what is queued is written and a checkpoint follows.
    pub fn close(mut self) -> Result<(), SessionError> {
        let Some(rec) = self.rec.take() else {
            return Ok(());
        };
        match (&self.pending, &self.end) {
            (Some(p), _) => rec.suspend(p.pending)?,
            // Suspended with no approval pending: the provider stayed
            // unavailable. The session stays open, to be resumed.
            (None, Some(end)) if end.outcome == Status::Suspended.name() => {
                rec.suspend_on_provider(end)?
            }
            (None, Some(end)) => rec.finish_as(end)?,
            (None, None) => rec.finish_as(&SessionEnd {
                outcome: Status::Finished.name().into(),
                message: "closed before any task".into(),
                turns: self.turns,
            })?,
        }
        Ok(())
    }
}

/// Why a send stopped inside a turn's calls.
enum Stop {
    Suspended,
    Failed(String),
    Closed,
}

impl Stop {
    fn into_report<P: Provider>(self, s: &Session<P>, actions: Vec<CallRecord>) -> Report {
        match self {
            Stop::Suspended => {
                let m = match &s.pending {
                    Some(p) => format!(
                        "suspended: approval {} is pending ({}); decide it with `retie approve {}` or `retie deny {} --reason TEXT`, then `retie run --resume {}`",
                        p.pending,
                        retie_dispatch::display::visible_again(&p.summary, false),
                        s.id(),
                        s.id(),
                        s.id()
                    ),
                    None => "suspended".into(),
                };
                s.report(Status::Suspended, m, String::new(), actions)
            }
            Stop::Failed(m) => s.report(Status::Failed, m, String::new(), actions),
            Stop::Closed => s.report(
                Status::Failed,
                "the session is closed".into(),
                String::new(),
                actions,
            ),
        }
    }
}

/// A pending entry's payload as [`PendingInfo`].
pub fn pending_info(seq: i64, p: &Value) -> PendingInfo {
    let action = p.get("action").cloned().unwrap_or(Value::Null);
    PendingInfo {
        pending: seq,
        tool: action
            .get("tool")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string(),
        arguments: action.get("args").cloned().unwrap_or(Value::Null),
        digest: p
            .get("digest")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        summary: p
            .get("command")
            .and_then(Value::as_array)
            .map(|a| {
                retie_dispatch::display::shell_line(
                    &a.iter().filter_map(Value::as_str).collect::<Vec<_>>(),
                )
            })
            .unwrap_or_default(),
        reason: p
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    }
}

/// Control characters escaped, for text a model or a file controls.
pub fn visible(s: &str) -> String {
    retie_policy::escape_for_terminal(s)
}

/// Run one task to its end: open, one send, close (`retie run -p`).
pub async fn run<P: Provider>(
    provider: P,
    tools: Tools,
    rec: Recorder,
    approver: &mut dyn Approver,
    cfg: SessionConfig,
    prompt: &str,
    ui: &mut dyn Render,
) -> Report {
    let mut s = Session::open(provider, tools, rec, cfg);
    let mut report = s.send(Some(prompt), approver, ui).await;
    if let Err(e) = s.close() {
        report.message = format!(
            "{}; the ledger could not close the session: {e}",
            report.message
        );
        report.status = Status::Failed;
    }
    report
}

/// The checks before a call may be prepared; `Err` is for the model.
fn check_call(
    tools: &Tools,
    call: &ToolCall,
    truncated: bool,
    failures: &HashMap<(String, String), usize>,
    repeat_limit: usize,
) -> Result<serde_json::Map<String, Value>, String> {
    if truncated {
        return Err(format!(
            "your call to {:?} was cut off by the length limit, so its arguments may be incomplete; it was not run. Make it again, shorter",
            call.name
        ));
    }
    if tools.lookup(&call.name).is_none() {
        return Err(format!(
            "there is no tool named {:?}; the tools are: {}",
            call.name,
            tools.names().join(", ")
        ));
    }
    let n = failures
        .get(&(call.name.clone(), call.raw_arguments.clone()))
        .copied()
        .unwrap_or(0);
    if n >= repeat_limit {
        return Err(format!(
            "this exact call already failed {n} times; it was not run again. Change approach"
        ));
    }
    match &call.arguments {
        Ok(a) => Ok(a.clone()),
        Err(why) => Err(format!(
            "the arguments of your call to {:?} are not a complete JSON object ({why}); it was not run",
            call.name
        )),
    }
}

/// Record a call that is never executed: proposed, decision (deny, by the
/// call check) and refusal, one durable transaction.
fn refuse_call(
    rec: &mut Recorder,
    call: &ToolCall,
    why: &str,
) -> Result<(), retie_dispatch::Error> {
    rec.note("tool", json!(format!("agent.{}", call.name)));
    rec.note("command", json!([call.name]));
    rec.note("inspection", Value::Null);
    let by = "retie (call check)";
    rec.refuse(
        &payload::Proposed::unchecked(
            "agent",
            payload::ProposedCall {
                id: Some(call.id.clone()),
                name: call.name.clone(),
                arguments: None,
                raw_arguments: Some(call.raw_arguments.clone()),
            },
        ),
        payload::to_value(&payload::Decision::refused_by_retie(by, why)),
        &payload::Refusal::of_action(why, by),
    )
}

fn interrupt_raised(cancel: &Cancel, flag: Option<&'static AtomicBool>) -> bool {
    cancel.is_cancelled() || flag.is_some_and(|f| f.load(Ordering::SeqCst))
}

/// Resolves once the turn is cancelled (checked every 20 ms: a signal
/// handler can only raise a flag).
async fn cancelled(cancel: Cancel, flag: Option<&'static AtomicBool>) {
    while !interrupt_raised(&cancel, flag) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
