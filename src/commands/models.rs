//! `retie models`, `retie probe` and `retie usage` (issue 29): what the
//! provider serves, what this account may call (one-token probes, cached
//! in the state directory), and what was spent, from the ledger. Also
//! the ladder's construction for `retie run` with no model named. The
//! wire formats and the ladder's logic live in the agent crate
//! (`retie_agent::catalogue`, `retie_agent::ladder`); this module reads
//! the flags, keeps the cache file and renders.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use retie_agent::catalogue::{self, Cache, ModelInfo, ProbeVerdict, Probed, Standing};
use retie_agent::ladder::{self, Anchor, Ladder, Rung};
use retie_ledger::{payload, Kind, Ledger};
use serde::Deserialize;
use serde_json::{json, Value};

use super::run::ProviderArg;
use crate::error::CliError;
use crate::ui::visible;

/// `[ladder]` in config.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LadderConfig {
    /// Two sizes anchored to tiers, e.g.
    /// `[{params_b = 20, tier = 1}, {params_b = 671, tier = 4}]` (the
    /// default); tiers in between and beyond on a log scale.
    anchors: Option<Vec<Anchor>>,
    /// The highest tier the ladder climbs to (`--max-tier` overrides).
    max_tier: Option<u32>,
    /// A 429 asking a wait up to this many hours is a session limit (the
    /// ladder climbs); longer is the account's cap (it stops). Default 6.
    session_limit_hours: Option<f64>,
    /// Turns in a row that break the tool protocol before the ladder
    /// climbs. Default 3.
    malformed_turns: Option<u32>,
}

impl LadderConfig {
    fn anchors(&self) -> Result<[Anchor; 2], CliError> {
        match &self.anchors {
            None => Ok(ladder::DEFAULT_ANCHORS),
            Some(a) => ladder::check_anchors(a).map_err(CliError::Usage),
        }
    }
}

/// The endpoint flags every command here takes.
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// Which wire format to speak (default: RETIE_PROVIDER, else
    /// `[agent] provider`).
    #[arg(long, value_enum)]
    pub provider: Option<ProviderArg>,
    /// The provider's endpoint (default: RETIE_BASE_URL, else `[agent]
    /// base_url`, else the provider's public one).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The environment variable holding the API key.
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
}

/// An endpoint, resolved as `retie run` resolves it (flag, environment,
/// config, the provider's default).
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub kind: &'static str,
    pub base_url: String,
    pub api_key: Option<String>,
}

impl Endpoint {
    pub fn cache_key(&self) -> String {
        Cache::key(self.kind, &self.base_url)
    }
}

fn kind_of(p: ProviderArg) -> &'static str {
    match p {
        ProviderArg::Openai => "openai",
        ProviderArg::Anthropic => "anthropic",
        ProviderArg::Ollama => "ollama",
        ProviderArg::Script => "script",
    }
}

pub fn endpoint(a: &EndpointArgs) -> Result<Endpoint, CliError> {
    let file = super::gc::config()?.0.agent;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let provider = match (a.provider, env("RETIE_PROVIDER")) {
        (Some(p), _) => Some(p),
        (None, Some(e)) => Some(ProviderArg::from_str(&e, true).map_err(|_| {
            CliError::Usage(format!(
                "RETIE_PROVIDER={}: expected openai, anthropic or ollama",
                visible(&e)
            ))
        })?),
        (None, None) => file.provider(),
    }
    .ok_or_else(|| {
        CliError::Usage(
            "no provider: pass --provider (openai, anthropic, ollama), set RETIE_PROVIDER, or [agent] provider in config.toml".into(),
        )
    })?;
    if provider == ProviderArg::Script {
        return Err(CliError::Usage(
            "the script provider serves no catalogue: name openai, anthropic or ollama".into(),
        ));
    }
    let kind = kind_of(provider);
    let base_url = a
        .base_url
        .clone()
        .or_else(|| env("RETIE_BASE_URL"))
        .or(file.base_url.clone())
        .unwrap_or_else(|| {
            super::run::default_base_url(provider)
                .unwrap_or("")
                .to_string()
        });
    let key_env = a
        .api_key_env
        .clone()
        .or(file.api_key_env())
        .unwrap_or_else(|| format!("{}_API_KEY", kind.to_ascii_uppercase()));
    Ok(Endpoint {
        kind,
        base_url,
        api_key: env(&key_env),
    })
}

// ------------------------------------------------------------ the cache

/// `STATE/models.json`: each endpoint's models and what the last probe
/// (or a session's refusal) saw.
fn cache_path() -> Result<PathBuf, CliError> {
    Ok(crate::state::dir()?.join("models.json"))
}

pub fn load_cache() -> Result<Cache, CliError> {
    let path = cache_path()?;
    match std::fs::read_to_string(&path) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| {
            CliError::Usage(format!(
                "{} is not a probe cache ({e}): remove it and run `retie probe` again",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Cache::default()),
        Err(e) => Err(CliError::io(format!("reading {}", path.display()), e)),
    }
}

/// Written whole and atomically: a temporary file beside it, synced,
/// renamed over it.
pub fn save_cache(c: &Cache) -> Result<(), CliError> {
    let path = cache_path()?;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    let text = serde_json::to_string_pretty(c).unwrap_or_default();
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CliError::io(format!("writing {}", path.display()), e)
    })
}

/// A session's refusals, into the cache (dropped until re-probed).
pub fn remember_refusals(ep_key: &str, session: &str, refused: &[(String, String)]) {
    if refused.is_empty() {
        return;
    }
    let r = load_cache().and_then(|mut c| {
        for (model, why) in refused {
            c.set(
                ep_key,
                model,
                Probed {
                    status: Standing::Refused,
                    at_ms: now_ms(),
                    code: Some(403),
                    cause: why.clone(),
                    retry_after_ms: None,
                    by: format!("session {session}"),
                },
            );
        }
        save_cache(&c)
    });
    if let Err(e) = r {
        eprintln!("retie: the probe cache could not keep this session's refusals: {e}");
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::io("starting the async runtime", e))
}

fn catalogue(ep: &Endpoint) -> Result<Vec<ModelInfo>, CliError> {
    runtime()?
        .block_on(catalogue::list(
            ep.kind,
            &ep.base_url,
            ep.api_key.as_deref(),
        ))
        .map_err(|e| {
            CliError::Usage(format!(
                "the model list of {} ({}): {e}",
                visible(&ep.base_url),
                ep.kind
            ))
        })
}

// ------------------------------------------------------------ retie models

#[derive(Args, Debug)]
pub struct ModelsArgs {
    #[command(flatten)]
    pub endpoint: EndpointArgs,
    /// One JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn models(a: ModelsArgs) -> Result<i32, CliError> {
    let ep = endpoint(&a.endpoint)?;
    let anchors = super::gc::config()?.0.ladder.anchors()?;
    let list = catalogue(&ep)?;
    let cache = load_cache()?;
    let key = ep.cache_key();
    let rows: Vec<Value> = list
        .iter()
        .map(|m| {
            let p = cache.endpoints.get(&key).and_then(|c| c.get(&m.id));
            json!({
                "model": m.id,
                "params_b": m.params_b,
                "size_from": m.size_from,
                "tier": m.params_b.and_then(|p| ladder::tier_of(p, &anchors)),
                "context": m.context,
                "standing": p.map_or(Standing::Untested, |p| p.status).name(),
                "probed_ms": p.map(|p| p.at_ms),
                "cause": p.map(|p| p.cause.clone()),
            })
        })
        .collect();
    if a.json {
        println!(
            "{}",
            json!({"provider": ep.kind, "base_url": ep.base_url, "models": rows})
        );
        return Ok(0);
    }
    println!(
        "{} models at {} ({}); standing from the probe cache (`retie probe`)",
        rows.len(),
        visible(&ep.base_url),
        ep.kind
    );
    println!(
        "{:<40} {:>9} {:>4} {:>9}  STANDING",
        "MODEL", "PARAMS", "TIER", "CONTEXT"
    );
    for r in &rows {
        let params = r["params_b"].as_f64().map_or("-".to_string(), |p| {
            let s = format!("{p:.1}B");
            if r["size_from"] == "name" {
                format!("{s}*")
            } else {
                s
            }
        });
        println!(
            "{:<40} {:>9} {:>4} {:>9}  {}",
            visible(r["model"].as_str().unwrap_or("")),
            params,
            r["tier"].as_u64().map_or("-".into(), |t| t.to_string()),
            r["context"].as_u64().map_or("-".into(), |c| c.to_string()),
            r["standing"].as_str().unwrap_or("")
        );
    }
    if rows.iter().any(|r| r["size_from"] == "name") {
        println!("* the size the model's name states (the provider says none)");
    }
    Ok(0)
}

// ------------------------------------------------------------ retie probe

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// The models to probe (default: every model the provider lists).
    #[arg(value_name = "MODEL")]
    pub models: Vec<String>,
    #[command(flatten)]
    pub endpoint: EndpointArgs,
    /// The longest a probe waits for its answer, seconds; no answer is
    /// inconclusive, never a refusal.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub timeout: u64,
    /// The ledger the probe run is recorded in (default: RETIE_LEDGER,
    /// else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// One JSON object: each model's result.
    #[arg(long)]
    pub json: bool,
}

/// Exit 0: every model was judged; 4: the probe stopped (a wrong key,
/// the account's cap).
pub fn probe(a: ProbeArgs) -> Result<i32, CliError> {
    let ep = endpoint(&a.endpoint)?;
    let names: Vec<String> = if a.models.is_empty() {
        catalogue(&ep)?.into_iter().map(|m| m.id).collect()
    } else {
        a.models.clone()
    };
    let rt = runtime()?;
    let mut provider =
        retie_agent::provider::from_config(ep.kind, "", Some(&ep.base_url), ep.api_key.clone())
            .map_err(|e| CliError::Usage(e.to_string()))?;
    let mut cache = load_cache()?;
    let key = ep.cache_key();
    let mut results = Vec::new();
    let mut stopped = None;
    let (mut tin, mut tout) = (0u64, 0u64);
    for m in &names {
        let (answer, usage) = rt.block_on(catalogue::probe(
            &mut provider,
            m,
            Duration::from_secs(a.timeout.max(1)),
        ));
        tin += usage.input_tokens;
        tout += usage.output_tokens;
        let (p, stop) = match catalogue::judge(&answer, now_ms()) {
            ProbeVerdict::Record(p) => (p, None),
            ProbeVerdict::Stop(p, why) => (p, Some(why)),
        };
        if !a.json {
            println!(
                "{:<40} {:<13} {}",
                visible(m),
                p.status.name(),
                visible(&p.cause)
            );
        }
        results.push(json!({"model": m, "status": p.status.name(), "code": p.code, "cause": p.cause,
                            "retry_after_ms": p.retry_after_ms, "tokens_in": usage.input_tokens, "tokens_out": usage.output_tokens}));
        if stop.is_some() {
            // A wrong key or the account's cap says nothing of the model.
            stopped = stop;
            break;
        }
        cache.set(&key, m, p);
    }
    save_cache(&cache)?;
    record_probe(&a, &ep, &results, stopped.as_deref(), (tin, tout))?;
    if a.json {
        println!(
            "{}",
            json!({"provider": ep.kind, "base_url": ep.base_url, "results": results, "stopped": stopped})
        );
    } else if let Some(why) = &stopped {
        eprintln!("retie: probe stopped: {}", visible(why));
    } else {
        let callable = results.iter().filter(|r| r["status"] == "callable").count();
        println!(
            "{callable} of {} callable; cached in {}",
            results.len(),
            cache_path()?.display()
        );
    }
    Ok(if stopped.is_some() { 4 } else { 0 })
}

/// One ledger entry per probe run: its requests went out with the
/// person's key (ADR 0531). A session of its own (origin `retie probe`),
/// opened, noted and closed.
fn record_probe(
    a: &ProbeArgs,
    ep: &Endpoint,
    results: &[Value],
    stopped: Option<&str>,
    (tin, tout): (u64, u64),
) -> Result<(), CliError> {
    let ledger_path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let spec = retie_dispatch::record::SessionSpec {
        join: None,
        workspace: crate::state::dir()?,
        opened: retie_ledger::payload::SessionOpened {
            objective: Some(format!("probe {} models", results.len())),
            origin: Some("retie probe".into()),
            provider: Some(ep.kind.into()),
            base_url: Some(ep.base_url.clone()),
            ..Default::default()
        },
        effects: Vec::new(),
        intent_base: json!({"tool": "probe"}),
    };
    let mut rec = retie_dispatch::Recorder::open(&ledger_path, spec)?;
    rec.record_note(
        true,
        &retie_ledger::payload::Note {
            probe: Some(
                results
                    .iter()
                    .map(|r| r.as_object().cloned().unwrap_or_default())
                    .collect(),
            ),
            provider: Some(ep.kind.into()),
            base_url: Some(ep.base_url.clone()),
            stopped: stopped.map(String::from),
            requests: Some(results.len() as u64),
            usage: Some(retie_ledger::payload::TokenUsage {
                input_tokens: tin,
                output_tokens: tout,
            }),
            ..Default::default()
        },
    )?;
    rec.finish_as(&retie_ledger::provider::SessionEnd {
        outcome: if stopped.is_some() {
            "provider_failed".into()
        } else {
            "finished".into()
        },
        message: stopped.unwrap_or("probed").to_string(),
        turns: 0,
    })?;
    Ok(())
}

// ------------------------------------------------------------ the ladder

/// The ladder for `retie run` with no model named: the models the
/// provider lists, with a size (so a tier) and probed callable, capped
/// at `max_tier` (flag, else `[ladder] max_tier`).
pub fn ladder_for(
    kind: &str,
    base_url: &str,
    api_key: Option<&str>,
    max_tier: Option<u32>,
) -> Result<Ladder, CliError> {
    let cfg = super::gc::config()?.0.ladder;
    let anchors = cfg.anchors()?;
    let list = runtime()?
        .block_on(catalogue::list(kind, base_url, api_key))
        .map_err(|e| {
            CliError::Usage(format!(
                "the model list of {} could not be read: {e}",
                visible(base_url)
            ))
        })?;
    let cache = load_cache()?;
    let key = Cache::key(kind, base_url);
    let rungs = list
        .iter()
        .filter(|m| cache.standing(&key, &m.id) == Standing::Callable)
        .filter_map(|m| {
            Some(Rung {
                model: m.id.clone(),
                tier: ladder::tier_of(m.params_b?, &anchors)?,
            })
        })
        .collect();
    let mut l = Ladder::new(rungs, max_tier.or(cfg.max_tier)).map_err(CliError::Usage)?;
    if let Some(h) = cfg.session_limit_hours {
        if !(h.is_finite() && h > 0.0) {
            return Err(CliError::Usage(
                "[ladder] session_limit_hours must be a positive number of hours".into(),
            ));
        }
        l.session_limit = Duration::from_secs_f64(h * 3600.0);
    }
    if let Some(n) = cfg.malformed_turns {
        l.malformed_turns = n.max(1);
    }
    Ok(l)
}

// ------------------------------------------------------------ retie usage

#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Only the last DAYS days.
    #[arg(long, value_name = "DAYS")]
    pub since: Option<u64>,
    /// The ledger to read (default: RETIE_LEDGER, else STATE/ledger.db).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// One JSON object: the rows and their totals.
    #[arg(long)]
    pub json: bool,
    /// How the per-model figures are grouped.
    #[arg(long, value_enum, default_value_t = GroupBy::Model)]
    pub by: GroupBy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    Model,
    Day,
    Session,
}

/// Tokens and requests of one (model, tier, day, session).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UsageRow {
    pub session: String,
    pub day: String,
    pub model: String,
    pub tier: Option<u64>,
    /// Requests the provider answered or failed (answered turns, failed
    /// attempts, probes).
    pub requests: u64,
    pub failed: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
}

/// The one computation of usage from ledger rows (`retie usage` and
/// `/cost`): each answered turn (an assistant message with its usage and
/// model), each failed attempt (a request too, no tokens), each probe
/// run's requests. The model of a turn recorded before messages named it
/// is the session's as last set.
pub fn usage_rows(rows: &[retie_ledger::Row]) -> Vec<UsageRow> {
    let mut acc: BTreeMap<(String, String, String, Option<u64>), UsageRow> = BTreeMap::new();
    let mut model_of: BTreeMap<String, (String, Option<u64>)> = BTreeMap::new();
    for r in rows {
        let sid = r.session_str();
        let day = day_of(r.time_ms);
        let mut add = |model: &str, tier: Option<u64>, req: u64, failed: u64, i: u64, o: u64| {
            let e = acc
                .entry((sid.clone(), day.clone(), model.to_string(), tier))
                .or_insert_with(|| UsageRow {
                    session: sid.clone(),
                    day: day.clone(),
                    model: model.to_string(),
                    tier,
                    ..UsageRow::default()
                });
            e.requests += req;
            e.failed += failed;
            e.tokens_in += i;
            e.tokens_out += o;
        };
        // An ill-typed entry counts for nothing here (`retie verify`
        // names it).
        let kind = r.kind.as_slice();
        if kind == Kind::SessionOpened.as_bytes() {
            if let Some(m) = payload::of_row::<payload::SessionOpened>(r)
                .ok()
                .and_then(|o| o.model)
            {
                model_of.insert(sid.clone(), (m, None));
            }
        } else if kind == Kind::Note.as_bytes() {
            let Ok(n) = payload::of_row::<payload::Note>(r) else {
                continue;
            };
            if let Some(results) = &n.probe {
                for x in results {
                    let num = |k: &str| x.get(k).and_then(Value::as_u64).unwrap_or(0);
                    add(
                        x.get("model").and_then(Value::as_str).unwrap_or("?"),
                        None,
                        1,
                        u64::from(x.get("status").and_then(Value::as_str) != Some("callable")),
                        num("tokens_in"),
                        num("tokens_out"),
                    );
                }
            } else if n.ladder.is_some() {
                if let Some(m) = n.to.as_ref().or(n.model.as_ref()) {
                    let tier = n.to_tier.or(n.tier).map(u64::from);
                    model_of.insert(sid.clone(), (m.clone(), tier));
                }
            } else if let Some(("model", Value::String(m))) = n.setting_value() {
                model_of.insert(sid.clone(), (m.clone(), None));
            }
        } else if kind == Kind::ProviderAttempt.as_bytes() {
            let (m, t) = model_of.get(&sid).cloned().unwrap_or_default();
            add(&m, t, 1, 1, 0, 0);
        } else if kind == Kind::Message.as_bytes() {
            let Ok(msg) = payload::of_row::<payload::Message>(r) else {
                continue;
            };
            if msg.role() != Some("assistant") {
                continue;
            }
            let (m, t) = match &msg.model {
                Some(m) => (m.clone(), msg.tier.map(u64::from)),
                None => model_of.get(&sid).cloned().unwrap_or_default(),
            };
            let u = msg.usage.unwrap_or_default();
            add(&m, t, 1, 0, u.input_tokens, u.output_tokens);
        }
    }
    acc.into_values().collect()
}

/// `YYYY-MM-DD` (UTC) of a time in ms.
fn day_of(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    format!("{:04}-{:02}-{:02}", if m <= 2 { y + 1 } else { y }, m, d)
}

/// Rows summed by `key` (model and tier, day, or session).
pub fn grouped(rows: &[UsageRow], by: GroupBy) -> Vec<UsageRow> {
    let mut out: BTreeMap<(String, Option<u64>), UsageRow> = BTreeMap::new();
    for r in rows {
        let k = match by {
            GroupBy::Model => (r.model.clone(), r.tier),
            GroupBy::Day => (r.day.clone(), None),
            GroupBy::Session => (r.session.clone(), None),
        };
        let e = out.entry(k).or_insert_with(|| UsageRow {
            model: if by == GroupBy::Model {
                r.model.clone()
            } else {
                String::new()
            },
            tier: if by == GroupBy::Model { r.tier } else { None },
            day: if by == GroupBy::Day {
                r.day.clone()
            } else {
                String::new()
            },
            session: if by == GroupBy::Session {
                r.session.clone()
            } else {
                String::new()
            },
            ..UsageRow::default()
        });
        e.requests += r.requests;
        e.failed += r.failed;
        e.tokens_in += r.tokens_in;
        e.tokens_out += r.tokens_out;
    }
    out.into_values().collect()
}

/// One line per group, for a person (`retie usage`, `/cost`).
pub fn render(rows: &[UsageRow], by: GroupBy) -> String {
    let mut s = format!(
        "{:<40} {:>4} {:>8} {:>7} {:>12} {:>12}\n",
        match by {
            GroupBy::Model => "MODEL",
            GroupBy::Day => "DAY",
            GroupBy::Session => "SESSION",
        },
        "TIER",
        "REQUESTS",
        "FAILED",
        "TOKENS IN",
        "TOKENS OUT"
    );
    for r in grouped(rows, by) {
        let name = match by {
            GroupBy::Model => &r.model,
            GroupBy::Day => &r.day,
            GroupBy::Session => &r.session,
        };
        s.push_str(&format!(
            "{:<40} {:>4} {:>8} {:>7} {:>12} {:>12}\n",
            visible(if name.is_empty() { "?" } else { name }),
            r.tier.map_or("-".into(), |t| t.to_string()),
            r.requests,
            r.failed,
            r.tokens_in,
            r.tokens_out
        ));
    }
    s
}

pub fn usage(a: UsageArgs) -> Result<i32, CliError> {
    let path = crate::ledger::resolve_path(a.ledger.as_deref())?;
    let mut rows = Ledger::open(&path, false, None)?.rows()?;
    if let Some(d) = a.since {
        let from = now_ms() - (d as i64).saturating_mul(86_400_000);
        rows.retain(|r| r.time_ms >= from);
    }
    let u = usage_rows(&rows);
    let total = grouped(&u, GroupBy::Day).iter().fold((0, 0, 0, 0), |t, r| {
        (
            t.0 + r.requests,
            t.1 + r.failed,
            t.2 + r.tokens_in,
            t.3 + r.tokens_out,
        )
    });
    if a.json {
        println!(
            "{}",
            json!({
                "rows": u,
                "by_model": grouped(&u, GroupBy::Model),
                "by_day": grouped(&u, GroupBy::Day),
                "by_session": grouped(&u, GroupBy::Session),
                "total": {"requests": total.0, "failed": total.1, "tokens_in": total.2, "tokens_out": total.3},
                "note": "consumption as the ledger recorded it; no provider publishes a balance retie could show",
            })
        );
        return Ok(0);
    }
    print!("{}", render(&u, a.by));
    println!(
        "total: {} requests ({} failed), {} tokens in, {} out (consumption from the ledger; no remaining balance is shown: the provider publishes none)",
        total.0, total.1, total.2, total.3
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_civil_dates() {
        assert_eq!(day_of(0), "1970-01-01");
        assert_eq!(day_of(951_782_400_000), "2000-02-29");
        assert_eq!(day_of(1_796_169_600_000), "2026-12-02");
    }
}
