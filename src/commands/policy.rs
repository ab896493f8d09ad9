//! `retie policy ...`: ask the policy why.
//!
//! This file is a thin adapter: every
//! decision is made by the `retie_policy` crate; the only I/O here is reading
//! files / stdin, printing, and (for `url` without `--resolve`) resolving a
//! host name with the system resolver.
//!
//! Exit codes: 0 = runs / asks / allowed / no high-risk finding;
//! 1 = denied (explain), refused (url), high-risk finding (inspect);
//! 2 = the input could not be read (bad policy, bad action JSON, missing file).
//! JSON shapes are documented in `docs/policy.md`.

use std::io::Read;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;

use retie_policy::urlguard::{self, Target};
use retie_policy::{
    escape_for_terminal, evaluate, inspect_file, Action, Context, Policy, RiskLevel, Taint, Tier,
    Verdict,
};

/// `retie policy` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCmd {
    /// Print the loaded policy and its digest.
    Show {
        /// Policy file to load instead of the shipped default.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Classify and gate one action (JSON from FILE, or stdin).
    Explain {
        /// Action JSON: {"tool": "...", "args": {...}, "effects": [...]}.
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        /// Policy file to load instead of the shipped default.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Autonomy tier: manual, gated or auto (default: the policy's).
        #[arg(long, value_parser = parse_tier)]
        autonomy: Option<Tier>,
        /// The session has taken in untrusted content.
        #[arg(long)]
        tainted: bool,
        /// Content risk of the write: none, medium or high.
        #[arg(long, value_parser = parse_risk, default_value = "none")]
        risk: RiskLevel,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The risk flags a write from OLD_FILE to NEW_FILE raises.
    Inspect {
        /// The file before the write (use /dev/null for a new file).
        old_file: PathBuf,
        /// The file after the write.
        new_file: PathBuf,
        /// Policy file to load instead of the shipped default.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Whether the fetch tool may fetch URL, and the address it pins.
    Url {
        /// The URL.
        url: String,
        /// Use these addresses instead of resolving the host (repeatable).
        #[arg(long = "resolve", value_name = "ADDR")]
        resolve: Vec<IpAddr>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_tier(s: &str) -> Result<Tier, String> {
    s.parse()
}

fn parse_risk(s: &str) -> Result<RiskLevel, String> {
    RiskLevel::ALL
        .into_iter()
        .find(|r| r.name() == s)
        .ok_or_else(|| format!("unknown risk {s:?} (expected none, medium or high)"))
}

/// Run a `retie policy` subcommand.
/// Exit 0, or 1 for a verdict that is "no" (a denial, a flagged write, a
/// refused URL); a failure of retie itself (a malformed action, an
/// unreadable policy) is 125 like every other (ADR 0005, 0501).
pub fn run(cmd: PolicyCmd) -> i32 {
    match run_inner(cmd) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("retie policy: {msg}");
            crate::error::EXIT_FAILED
        }
    }
}

fn load_policy(path: Option<&PathBuf>) -> Result<(Policy, String), String> {
    match path {
        None => Policy::shipped()
            .map(|p| (p, "default".to_owned()))
            .map_err(|e| format!("the shipped policy: {e}")),
        Some(p) => {
            let text = read(p)?;
            Policy::parse(&text)
                .map(|pol| (pol, p.display().to_string()))
                .map_err(|e| format!("{}: {e}", p.display()))
        }
    }
}

fn read(path: &PathBuf) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn print_json(v: &serde_json::Value) {
    let text = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    println!("{}", json_terminal_safe(&text));
}

/// serde_json escapes C0 controls in strings but prints DEL, C1 controls and
/// bidirectional or zero-width characters raw; write those as JSON `\uXXXX`
/// escapes too (they can only occur inside strings), so the output stays
/// valid JSON and nothing reaches the terminal raw.
fn json_terminal_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        // C0 controls only occur as the pretty-printer's newlines: serde_json
        // escapes them inside strings already.
        if (c as u32) >= 0x20 && retie_policy::display::needs_escape(c.encode_utf8(&mut [0; 4])) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn run_inner(cmd: PolicyCmd) -> Result<i32, String> {
    match cmd {
        PolicyCmd::Show { policy, json } => {
            let (p, source) = load_policy(policy.as_ref())?;
            if json {
                print_json(&serde_json::json!({
                    "source": source,
                    "digest": p.digest().to_hex(),
                    "policy": p.to_json(),
                }));
            } else {
                let g = p.gate_rules();
                println!("policy  {source}");
                println!("digest  {}", p.digest());
                println!("default tier  {}", p.default_tier());
                println!("unknown tools  {}", g.unknown_tools.name());
                println!("trifecta mode  {}", g.trifecta_mode.name());
                let names = |s: &std::collections::BTreeSet<retie_policy::AskOn>| {
                    s.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
                };
                println!(
                    "tiers  manual asks for everything; gated asks for {}; auto asks for {}",
                    names(&g.gated_ask),
                    names(&g.auto_ask)
                );
                println!("tools");
                for (name, t) in p.tools() {
                    let inv = t
                        .inverse
                        .map(|i| format!(" (inverse {})", i.name()))
                        .unwrap_or_default();
                    let ra = if t.requires_approval {
                        ", requires approval"
                    } else {
                        ""
                    };
                    println!("  {name:<14} {}{inv}{ra}: {}", t.class, t.why);
                }
                println!("inspection rules");
                for r in p.rules() {
                    println!(
                        "  {:<26} {:<6} fires on {:<8} {}",
                        r.name(),
                        r.level(),
                        r.fires_on().name(),
                        r.category()
                    );
                }
                println!(
                    "shell allow  {}",
                    p.shell_rules().allow_prefixes().join(", ")
                );
                println!(
                    "shell deny   {}",
                    p.shell_rules().deny_prefixes().join(", ")
                );
            }
            Ok(0)
        }
        PolicyCmd::Explain {
            file,
            policy,
            autonomy,
            tainted,
            risk,
            json,
        } => {
            let (p, _) = load_policy(policy.as_ref())?;
            let text = match &file {
                Some(f) => read(f)?,
                None => {
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .map_err(|e| format!("stdin: {e}"))?;
                    s
                }
            };
            let action = Action::from_json(&text).map_err(|e| e.to_string())?;
            let ctx = Context {
                tier: autonomy.unwrap_or(p.default_tier()),
                taint: if tainted {
                    Taint::tainted()
                } else {
                    Taint::clean()
                },
                risk,
            };
            let ev = evaluate(&p, &action, &ctx);
            if json {
                let mut v = ev.to_json();
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("tier".into(), serde_json::json!(ctx.tier));
                    obj.insert("tainted".into(), serde_json::json!(tainted));
                    obj.insert(
                        "policy_digest".into(),
                        serde_json::json!(p.digest().to_hex()),
                    );
                }
                print_json(&v);
            } else {
                println!(
                    "action    {}",
                    escape_for_terminal(&action.to_json().to_string())
                );
                println!("digest    {}", ev.digest);
                println!("class     {}", ev.class);
                println!("decision  {}", ev.decision.verdict);
                println!("reason    {}", ev.decision.reason());
                for r in ev.decision.reasons.iter().skip(1) {
                    println!("also      {r}");
                }
                if let Some(sh) = &ev.shell {
                    match &sh.error {
                        Some(e) => {
                            println!("shell     cannot read as bash: {}", escape_for_terminal(e));
                            println!("line      {}", escape_for_terminal(&sh.line));
                        }
                        None if !sh.plain => {
                            println!(
                                "shell     not plain ({}), never covered: {}",
                                sh.not_plain.join(", "),
                                escape_for_terminal(&sh.line)
                            );
                            for part in &sh.parts {
                                println!("runs      {part}");
                            }
                        }
                        None => {
                            let cov = sh.coverage.as_ref();
                            for (i, part) in sh.parts.iter().enumerate() {
                                let m = cov
                                    .and_then(|c| c.matched.get(i).cloned().flatten())
                                    .map(|m| format!("  [allowed prefix: {m}]"))
                                    .unwrap_or_else(|| "  [no allow prefix]".into());
                                println!("shell     {part}{m}");
                            }
                        }
                    }
                }
            }
            Ok(if ev.decision.verdict == Verdict::Deny {
                1
            } else {
                0
            })
        }
        PolicyCmd::Inspect {
            old_file,
            new_file,
            policy,
            json,
        } => {
            let (p, _) = load_policy(policy.as_ref())?;
            let old = read(&old_file)?;
            let new = read(&new_file)?;
            // The new file's path tells inspection its language (comments),
            // and whether it is documentation or a test fixture.
            let ins = inspect_file(p.rules(), &new_file.to_string_lossy(), &old, &new);
            if json {
                print_json(&serde_json::json!({
                    "level": ins.level,
                    "findings": ins.findings,
                }));
            } else {
                println!("risk  {}", ins.level);
                for f in &ins.findings {
                    println!("  {f}");
                }
            }
            Ok(if ins.level == RiskLevel::High { 1 } else { 0 })
        }
        PolicyCmd::Url { url, resolve, json } => {
            let mut resolved_by = "given";
            let addrs: Vec<IpAddr> = if !resolve.is_empty() {
                resolve
            } else {
                match urlguard::target(&url) {
                    Ok(Target::Name { host, port }) => {
                        resolved_by = "system resolver";
                        match (host.as_str(), port).to_socket_addrs() {
                            Ok(it) => it.map(|sa| sa.ip()).collect(),
                            Err(e) => return Err(format!("resolving {host}: {e}")),
                        }
                    }
                    // Literal or refused: the guard says which, no lookup needed.
                    _ => Vec::new(),
                }
            };
            let result = urlguard::check(&url, &addrs);
            if json {
                let v = match &result {
                    Ok(pin) => serde_json::json!({
                        "url": url, "allowed": true, "resolved": addrs, "resolved_by": resolved_by,
                        "pinned": pin,
                    }),
                    Err(r) => serde_json::json!({
                        "url": url, "allowed": false, "resolved": addrs, "resolved_by": resolved_by,
                        "refusal": r, "reason": r.to_string(),
                    }),
                };
                print_json(&v);
            } else {
                match &result {
                    Ok(pin) => println!(
                        "allowed  {} -> connect to {} (Host: {})",
                        pin.url, pin.addr, pin.host
                    ),
                    Err(r) => println!("refused  {url}: {r}"),
                }
            }
            Ok(if result.is_ok() { 0 } else { 1 })
        }
    }
}
