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

use retie_dispatch::record::SessionSpec;
use retie_dispatch::{Approval, ApprovalRequest, Approver, Recorder};
use retie_policy::{Context, Tier};
use serde::Serialize;
use serde_json::{json, Value};

use crate::model::{Message, ProviderError, StreamEvent, ToolCall, TurnRequest, Usage};
use crate::provider::Provider;
use crate::tools::{self, Tools};

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
    /// retie itself failed (the ledger could not record...).
    Failed,
}

impl Status {
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
}

/// The terminal side: streamed text and one line per call.
pub trait Render: Send {
    fn event(&mut self, ev: &StreamEvent);
    fn call(&mut self, c: &CallRecord);
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
    let effects = ["reads_workspace", "writes_workspace", "runs_sandboxed"];
    SessionSpec {
        join: None,
        workspace: workspace.to_path_buf(),
        opened: json!({
            "objective": prompt,
            "origin": "retie run",
            "provider": provider,
            "model": cfg.model,
            "system_prompt_digest": blake3::hash(cfg.system_prompt.as_bytes()).to_hex().to_string(),
            "policy_digest": policy_digest,
            "autonomy": cfg.tier.name(),
            "approvals_from_yes_flag": yes_flag,
            "fetch_allow": cfg.fetch_allow,
            "budget": {"max_turns": cfg.max_turns, "max_tokens": cfg.max_tokens, "timeout_s": cfg.timeout.as_secs_f64()},
        }),
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
    fn approve(&mut self, req: &ApprovalRequest<'_>) -> Approval {
        Approval::Approved {
            by: "person (--yes flag)".into(),
            digest: req.action.digest(),
        }
    }
}

/// No terminal, no `--yes`: nobody can approve.
pub struct NoOne;

impl Approver for NoOne {
    fn approve(&mut self, _: &ApprovalRequest<'_>) -> Approval {
        Approval::Denied {
            by: "retie (no terminal)".into(),
            reason: "no one to approve".into(),
        }
    }
}

/// Run one task to its end.
pub async fn run<P: Provider>(
    provider: &mut P,
    tools: &mut Tools,
    rec: &mut Recorder,
    approver: &mut dyn Approver,
    cfg: &SessionConfig,
    prompt: &str,
    ui: &mut dyn Render,
) -> Report {
    let started = Instant::now();
    let mut ctx = Context::new(cfg.tier);
    let mut messages = vec![Message::system(&cfg.system_prompt), Message::user(prompt)];
    let specs = tools::specs();
    let mut usage = Usage::default();
    let mut turns = 0u32;
    let mut actions = Vec::new();
    let mut failures: HashMap<(String, String), usize> = HashMap::new();
    let interrupted = || {
        cfg.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
    };
    let end = |status: Status,
               message: String,
               answer: String,
               usage: Usage,
               turns,
               actions,
               tools: &Tools| Report {
        session: String::new(),
        status,
        message,
        turns,
        tokens_in: usage.input_tokens,
        tokens_out: usage.output_tokens,
        actions,
        answer,
        shortened: tools.recall.shortened,
        recalls: tools.recall.recalls,
    };
    let mut report = loop {
        if interrupted() {
            break end(
                Status::Interrupted,
                "interrupted".into(),
                String::new(),
                usage,
                turns,
                actions,
                tools,
            );
        }
        if turns >= cfg.max_turns {
            break end(
                Status::TurnBudget,
                format!(
                    "stopped: the turn budget ({} turns) is spent and the model had not finished",
                    cfg.max_turns
                ),
                String::new(),
                usage,
                turns,
                actions,
                tools,
            );
        }
        if usage.input_tokens + usage.output_tokens >= cfg.max_tokens {
            break end(
                Status::TokenBudget,
                format!(
                    "stopped: the token budget ({} tokens) is spent ({} in, {} out) and the model had not finished",
                    cfg.max_tokens, usage.input_tokens, usage.output_tokens
                ),
                String::new(), usage, turns, actions, tools,
            );
        }
        let Some(left) = cfg.timeout.checked_sub(started.elapsed()) else {
            break end(
                Status::TimeBudget,
                format!(
                    "stopped: the time budget ({} s) is spent",
                    cfg.timeout.as_secs()
                ),
                String::new(),
                usage,
                turns,
                actions,
                tools,
            );
        };
        let req = TurnRequest {
            model: cfg.model.clone(),
            messages: messages.clone(),
            tools: specs.clone(),
            max_tokens: cfg.max_output_tokens,
        };
        turns += 1;
        let mut on_event = |e: StreamEvent| ui.event(&e);
        let turn = match tokio::time::timeout(left, provider.turn(&req, &mut on_event)).await {
            Err(_) => {
                break end(
                    Status::TimeBudget,
                    format!(
                        "stopped: the time budget ({} s) ran out while the model answered",
                        cfg.timeout.as_secs()
                    ),
                    String::new(),
                    usage,
                    turns,
                    actions,
                    tools,
                )
            }
            Ok(Err(e)) => {
                let status = match e {
                    ProviderError::Permanent(_) | ProviderError::Unavailable(_) => {
                        Status::ProviderFailed
                    }
                    ProviderError::Malformed(_) | ProviderError::Transport(_) => {
                        Status::ProviderFailed
                    }
                };
                break end(
                    status,
                    format!("the provider failed: {e}"),
                    String::new(),
                    usage,
                    turns,
                    actions,
                    tools,
                );
            }
            Ok(Ok(t)) => t,
        };
        usage.input_tokens += turn.usage.input_tokens;
        usage.output_tokens += turn.usage.output_tokens;
        messages.push(Message::assistant(&turn.text, turn.tool_calls.clone()));
        if turn.tool_calls.is_empty() {
            if turn.truncated {
                messages.push(Message::user(
                    "Your answer was cut off by the length limit. Continue, more briefly.",
                ));
                continue;
            }
            break end(
                Status::Finished,
                "finished".into(),
                turn.text.clone(),
                usage,
                turns,
                actions,
                tools,
            );
        }
        for call in &turn.tool_calls {
            if interrupted() {
                messages.push(Message::tool_result(
                    call,
                    "not run: the session was interrupted",
                ));
                continue;
            }
            let key = (call.name.clone(), call.raw_arguments.clone());
            let checked = check_call(call, turn.truncated, &failures, cfg.repeat_limit)
                .and_then(|args| tools.prepare(&call.name, &args));
            let rec_line = match checked {
                Err(msg) => {
                    if let Err(e) = refuse_call(rec, call, &msg) {
                        eprintln!("retie: the ledger could not record a refused call: {e}");
                        return with_session(
                            rec,
                            end(
                                Status::Failed,
                                format!("the ledger failed: {e}"),
                                String::new(),
                                usage,
                                turns,
                                actions,
                                tools,
                            ),
                        );
                    }
                    *failures.entry(key).or_default() += 1;
                    messages.push(Message::tool_result(call, format!("error: {msg}")));
                    CallRecord {
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        action: None,
                        status: "invalid",
                        summary: call.name.clone(),
                        said: msg,
                    }
                }
                Ok(prepared) => {
                    let action = prepared.action.clone();
                    match tools.run(rec, &ctx, prepared, approver) {
                        Err(e) => {
                            return with_session(
                                rec,
                                end(
                                    Status::Failed,
                                    format!("retie failed at the chokepoint: {e}"),
                                    String::new(),
                                    usage,
                                    turns,
                                    actions,
                                    tools,
                                ),
                            );
                        }
                        Ok(r) => {
                            if r.action.is_some() {
                                // What the action brought in taints the
                                // session from now on.
                                ctx.taint = ctx.taint.after(&tools.policy, &action);
                            }
                            if r.status != "ok" {
                                *failures.entry(key).or_default() += 1;
                            }
                            messages.push(Message::tool_result(call, &r.text));
                            CallRecord {
                                call_id: call.id.clone(),
                                tool: call.name.clone(),
                                action: r.action,
                                status: r.status,
                                summary: r.summary,
                                said: r.text.chars().take(SAID_CHARS).collect(),
                            }
                        }
                    }
                }
            };
            ui.call(&rec_line);
            actions.push(rec_line);
        }
    };
    report.session = rec.session_id().to_string();
    report
}

fn with_session(rec: &Recorder, mut r: Report) -> Report {
    r.session = rec.session_id().to_string();
    r
}

/// The checks before a call may be prepared; `Err` is for the model.
fn check_call(
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
    if tools::declaration(&call.name).is_none() {
        return Err(format!(
            "there is no tool named {:?}; the tools are: {}",
            call.name,
            tools::TOOL_NAMES.join(", ")
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
        json!({
            "origin": "agent",
            "call": {"id": call.id, "name": call.name, "raw_arguments": call.raw_arguments},
            "checked": false,
        }),
        json!({
            "verdict": "deny",
            "decided_by": by,
            "class": "unknown",
            "reason": why,
            "approved_digest": null,
        }),
        json!({"reason": why, "by": by}),
    )
}
