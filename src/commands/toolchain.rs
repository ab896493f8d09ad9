//! Toolchains for `sandbox exec`, and `retie sandbox explain`: what a
//! sandbox will see of this host, and why.
//!
//! Detection itself lives in `retie_runtime::toolchain`; this module hands
//! it the invoking user's home and variables (the runtime never reads the
//! environment) and renders the plan.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use retie_runtime::toolchain::{self, Context, HostEnv, Plan, RealFs, Selection};
use retie_runtime::{Profile, RuntimeError, Sandbox};
use serde_json::json;

use crate::error::CliError;

/// `retie sandbox explain`.
#[derive(Args)]
pub struct ExplainArgs {
    /// Workspace directory (default: the current directory).
    #[arg(long, short = 'w', value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Filesystem profile: a built-in name (host) or a TOML file.
    #[arg(long, value_name = "NAME|PATH", default_value = "host")]
    pub profile: String,
    /// Toolchains: auto, none, or names (rust, python, node, go,
    /// local-bin); default: the profile's `[toolchain] use`.
    #[arg(long, value_name = "auto|none|NAME", num_args = 1.., value_delimiter = ',')]
    pub toolchain: Vec<String>,
    /// Network: `none` (default) or `lab[:NAME]`.
    #[arg(long, value_name = "none|lab[:NAME]")]
    pub net: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The selection in force: the command line's, else the profile's.
pub fn selection(cli: &[String], profile: &Profile) -> Result<Selection, CliError> {
    let words = if cli.is_empty() {
        &profile.toolchain.use_
    } else {
        cli
    };
    Ok(Selection::parse(words)?)
}

/// The invoking user's home and the variables detection reads.
pub fn host_env() -> HostEnv {
    let euid = rustix::process::geteuid().as_raw();
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .or_else(|| home_from_passwd(euid))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    let vars = HostEnv::VARS
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (k.to_string(), v)))
        .collect();
    HostEnv {
        home,
        vars,
        root_invoked: euid == 0,
        protected: crate::state::retie_dirs(None)
            .into_iter()
            .map(|(_, d)| d)
            .collect(),
    }
}

fn home_from_passwd(uid: u32) -> Option<PathBuf> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && f[2].parse::<u32>().ok()? == uid).then(|| PathBuf::from(f[5]))
    })
}

/// The plan for a canonical workspace. retie's own directories (and the
/// ledger's, when one is named) are never inside a bind; each refusal the
/// plan makes for a person's attention is said on stderr.
pub fn plan(ws: &Path, profile: &Profile, sel: &Selection, ledger: Option<&Path>) -> Plan {
    let mut env = host_env();
    if let Some(d) = ledger.and_then(Path::parent) {
        env.protected.push(d.to_path_buf());
    }
    let mut system: Vec<PathBuf> = profile.filesystem.ro.clone();
    system.extend(profile.filesystem.ro_optional.iter().cloned());
    let plan = toolchain::plan(
        sel,
        &Context {
            workspace: ws,
            env: &env,
            fs: &RealFs,
            system: &system,
        },
    );
    for w in &plan.warnings {
        eprintln!("retie: warning: toolchain: {}", crate::ui::visible(w));
    }
    plan
}

/// `retie sandbox explain`; returns the exit code.
pub fn explain(args: ExplainArgs) -> i32 {
    match explain_inner(&args) {
        Ok(()) => 0,
        Err(e) => {
            crate::ui::say_failure(&e);
            retie_runtime::EXIT_SANDBOX_FAILED
        }
    }
}

fn explain_inner(args: &ExplainArgs) -> Result<(), CliError> {
    let profile = Profile::load(&args.profile)?;
    let ws = match &args.workspace {
        Some(w) => w.clone(),
        None => {
            std::env::current_dir().map_err(|e| CliError::io("reading the current directory", e))?
        }
    };
    let ws = std::fs::canonicalize(&ws).map_err(|e| {
        CliError::Runtime(RuntimeError::Workspace {
            path: ws.clone(),
            reason: e.to_string(),
        })
    })?;
    let sel = selection(&args.toolchain, &profile)?;
    let plan = plan(&ws, &profile, &sel, None);
    let net = match &args.net {
        Some(n) => super::lab::resolve_net(n)?,
        None => retie_runtime::NetMode::None,
    };
    let net_name = match &net {
        retie_runtime::NetMode::None => "none".to_string(),
        retie_runtime::NetMode::Lab(l) => format!("lab:{} (ports {:?})", l.name, l.ports),
        retie_runtime::NetMode::LabTarget(l) => format!("lab target {}", l.name),
        retie_runtime::NetMode::Proxy(p) => format!("proxy on 127.0.0.1:{}", p.port),
    };
    // The final environment, exactly as `exec` builds it.
    let spec = plan
        .apply(
            Sandbox::builder(["true"])
                .workspace(&ws)
                .profile(profile.clone()),
        )
        .network(net)
        .build()?;
    let env: BTreeMap<String, String> = spec
        .env()
        .into_iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let fs = &profile.filesystem;
    if args.json {
        let v = json!({
            "workspace": ws,
            "profile": profile.name,
            "network": net_name,
            "system": {
                "ro": fs.ro, "ro_optional": fs.ro_optional, "etc": fs.etc, "tmpfs": fs.tmpfs,
                "home": spec.identity().home,
            },
            "toolchain": plan,
            "env": env,
        });
        println!("{v}");
        return Ok(());
    }
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("workspace   {}", ws.display()));
    line(format!("profile     {}", profile.name));
    line(format!("network     {net_name}"));
    line(format!(
        "system      read-only {}; tmpfs {} and $HOME ({})",
        list(fs.ro.iter().chain(&fs.ro_optional)),
        list(fs.tmpfs.iter()),
        spec.identity().home.display()
    ));
    let found = if plan.detected.is_empty() {
        "nothing".to_string()
    } else {
        plan.detected
            .iter()
            .map(|d| format!("{} ({})", d.kind.name(), d.marker))
            .collect::<Vec<_>>()
            .join(", ")
    };
    line(format!("toolchain   {}: {found}", plan.selection));
    section(
        &mut line,
        "binds (read-only, at the same path inside)",
        plan.binds.iter().map(|b| {
            let src = if b.source == b.path {
                String::new()
            } else {
                format!(" <- {}", b.source.display())
            };
            (format!("{}{src}", b.path.display()), b.rule.clone())
        }),
    );
    section(
        &mut line,
        "scratch (writable, thrown away)",
        plan.scratch
            .iter()
            .map(|s| (s.path.display().to_string(), s.rule.clone())),
    );
    section(
        &mut line,
        "hidden inside binds (covered, never readable)",
        plan.hidden.iter().map(|h| {
            (
                h.path.display().to_string(),
                format!("{}: {}", h.pattern, h.reason),
            )
        }),
    );
    section(
        &mut line,
        "excluded (never bound)",
        plan.excluded
            .iter()
            .map(|e| (e.path.display().to_string(), e.reason.clone())),
    );
    section(
        &mut line,
        "environment",
        env.iter().map(|(k, v)| (format!("{k}={v}"), String::new())),
    );
    section(
        &mut line,
        "notes",
        plan.notes.iter().map(|n| (n.clone(), String::new())),
    );
    print!("{out}");
    Ok(())
}

fn list<'a>(it: impl Iterator<Item = &'a PathBuf>) -> String {
    it.map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn section(
    line: &mut impl FnMut(String),
    title: &str,
    rows: impl Iterator<Item = (String, String)>,
) {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return;
    }
    line(format!("{title}:"));
    for (a, b) in rows {
        if b.is_empty() {
            line(format!("  {a}"));
        } else {
            line(format!("  {a}\n      {b}"));
        }
    }
}
