//! `--net allow:HOST[:PORT],...` and `--net registries` (ADR 0310), and
//! the hidden `__net-proxy`: the proxy process a networked sandbox's only
//! socket is served by.

use std::os::fd::FromRawFd;

use retie_policy::netguard::{self, AllowList, REGISTRIES};

use crate::error::CliError;

/// `[network]` in `$XDG_CONFIG_HOME/retie/config.toml`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// Replaces the shipped `--net registries` list (`HOST[:PORT]` each).
    pub registries: Option<Vec<String>>,
    /// The person's own list (`HOST[:PORT]` each): what `--net allow`
    /// (with no hosts after it) reaches. Never used unless asked for
    /// (ADR 0313).
    pub allow: Option<Vec<String>>,
    /// The network `retie run`'s bash gets when `--net` is not given:
    /// `none` (the default), `allow` (the `allow` list), `registries`, or
    /// `allow:HOST[:PORT],...`. `retie sandbox exec` never reads it.
    pub bash: Option<String>,
    /// The resolver override: `NAME = "ADDRESS"` (see `RETIE_NET_HOSTS`).
    #[serde(default)]
    pub hosts: std::collections::BTreeMap<String, String>,
}

fn network_config() -> Result<NetworkConfig, CliError> {
    Ok(super::gc::config()?.0.network)
}

/// The allow-list a `--net` value asks for: `None` for `none` and the lab
/// modes (not this module's), the checked entries otherwise.
/// `registries` is the shipped table unless `[network] registries` in the
/// config replaces it.
pub fn allow_list(spec: &str) -> Result<Option<Vec<String>>, CliError> {
    let items: Vec<String> = if spec == "registries" {
        match network_config()?.registries {
            Some(list) => list,
            None => REGISTRIES.iter().map(|r| r.entry.to_owned()).collect(),
        }
    } else if spec == "allow" {
        network_config()?.allow.ok_or_else(|| {
            CliError::Usage(
                "--net allow: no hosts given and no `[network] allow = [...]` in the config; use --net allow:HOST[:PORT],... or set the list in $XDG_CONFIG_HOME/retie/config.toml".into(),
            )
        })?
    } else if let Some(rest) = spec.strip_prefix("allow:") {
        rest.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    } else {
        return Ok(None);
    };
    if items.is_empty() {
        return Err(CliError::Usage(format!(
            "--net {spec}: no host after `allow:`; use --net allow:HOST[:PORT],... (e.g. allow:pypi.org,files.pythonhosted.org) or --net registries"
        )));
    }
    let list =
        AllowList::parse(&items).map_err(|e| CliError::Usage(format!("--net {spec}: {e}")))?;
    Ok(Some(list.texts()))
}

/// The network `retie run`'s bash tool gets (ADR 0313): `--net` when
/// given, else `[network] bash`, else none. `None`: no network. Lab modes
/// are `retie sandbox exec`'s only.
pub fn bash_net(flag: Option<&str>) -> Result<Option<retie_dispatch::sandbox::NetProxy>, CliError> {
    let (spec, from) = match flag {
        Some(f) => (f.to_owned(), "--net"),
        None => match network_config()?.bash {
            Some(b) => (b, "[network] bash"),
            None => return Ok(None),
        },
    };
    if spec == "none" {
        return Ok(None);
    }
    let Some(allow) = allow_list(&spec).map_err(|e| match e {
        CliError::Usage(m) => CliError::Usage(format!("{from}: {m}")),
        e => e,
    })?
    else {
        return Err(CliError::Usage(format!(
            "{from} {spec:?}: retie run's bash takes none, allow, allow:HOST[:PORT],... or registries (a lab is reached with retie sandbox exec --net lab:NAME)"
        )));
    };
    let exe = std::env::current_exe()
        .map_err(|e| CliError::io("locating this binary, to start the network proxy", e))?;
    Ok(Some(retie_dispatch::sandbox::NetProxy {
        exe,
        allow,
        hosts: hosts_override()?,
    }))
}

/// The person's resolver override, `[network] hosts` in the config with
/// `RETIE_NET_HOSTS=NAME=ADDR,...` on top, checked: names it answers skip
/// DNS, and their addresses skip the private-address rule, since the
/// person named them.
pub fn hosts_override() -> Result<String, CliError> {
    let mut map = std::collections::BTreeMap::new();
    for (name, addr) in network_config()?.hosts {
        let one = format!("{name}={addr}");
        let parsed = netguard::parse_hosts(&one)
            .map_err(|e| CliError::Usage(format!("[network] hosts: {e}")))?;
        map.extend(parsed);
    }
    let env = std::env::var("RETIE_NET_HOSTS").unwrap_or_default();
    map.extend(
        netguard::parse_hosts(&env)
            .map_err(|e| CliError::Usage(format!("RETIE_NET_HOSTS: {e}")))?,
    );
    Ok(map
        .iter()
        .map(|(n, a)| format!("{n}={a}"))
        .collect::<Vec<_>>()
        .join(","))
}

/// `retie __net-proxy`.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// An allow-list entry (repeatable).
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    pub allow: Vec<String>,
    /// The resolver override, `NAME=ADDR,...`.
    #[arg(long, value_name = "MAP", default_value = "")]
    pub hosts: String,
}

/// Serve the proxy on fd 3, log to fd 4; returns only on an error.
pub fn proxy(args: ProxyArgs) -> i32 {
    let fail = |m: String| {
        eprintln!("retie: the network proxy: {m}");
        retie_runtime::EXIT_SANDBOX_FAILED
    };
    for fd in [retie_net::LISTEN_FD, retie_net::LOG_FD] {
        if let Err(p) = retie_runtime::helper::check_passed_fd(fd) {
            return fail(format!("descriptor {fd} {p}"));
        }
    }
    let allow = match AllowList::parse(&args.allow) {
        Ok(a) => a,
        Err(e) => return fail(e.to_string()),
    };
    let hosts = match netguard::parse_hosts(&args.hosts) {
        Ok(h) => h,
        Err(e) => return fail(e.to_string()),
    };
    // SAFETY: both descriptors were checked open above and were put there
    // for this process by its parent (retie_net::spawn); nothing else in
    // this process owns them.
    let (listener, log) = unsafe {
        (
            std::net::TcpListener::from_raw_fd(retie_net::LISTEN_FD),
            std::fs::File::from_raw_fd(retie_net::LOG_FD),
        )
    };
    if let Err(e) = retie_net::confine() {
        return fail(e.to_string());
    }
    match retie_net::serve(listener, retie_net::Config { allow, hosts }, log) {
        Ok(()) => 0,
        Err(e) => fail(e.to_string()),
    }
}
