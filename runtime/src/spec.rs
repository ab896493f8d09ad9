//! The sandbox description: built with [`SandboxBuilder`], validated once,
//! then immutable. Everything the unsafe set-up needs is computed here,
//! before any fork, so the set-up itself only follows instructions.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Result, RuntimeError};
use crate::profile::{Limits, Profile};

/// Host uid/gid a sandbox runs as when retie itself is invoked as root.
/// The sandbox never runs as host root.
pub const ROOT_INVOKED_HOST_ID: u32 = 65534;

/// How the sandbox reaches the network.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// A fresh network namespace with only `lo`; AF_INET, AF_INET6 and
    /// AF_NETLINK sockets are refused by seccomp, TCP by Landlock.
    #[default]
    None,
    /// A fresh network namespace on a veth into a lab: a /30 of the lab
    /// pool, one host route to the lab, no default route, IPv6 off.
    /// seccomp allows AF_INET (stream and datagram) only; Landlock allows
    /// TCP connect to the lab's `ports` only. See `host::net_stage`.
    Lab(LabNet),
    /// The lab target itself: joins the lab's network namespace (no uplink
    /// of any kind); Landlock refuses every TCP connect.
    LabTarget(LabNet),
    /// The sandbox's own network namespace with `lo` up and one listening
    /// socket on 127.0.0.1:`port`, made by init and handed to the caller
    /// ([`crate::Started::take_net_listener`]), who serves a proxy on it
    /// from the host's side (ADR 0310). No route anywhere else, no DNS;
    /// the lab sandbox's seccomp tables; Landlock allows TCP connect to
    /// `port` only.
    Proxy(ProxyNet),
}

/// A proxied network, as a sandbox needs it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyNet {
    /// The proxy's port on the sandbox's loopback.
    pub port: u16,
}

/// A running lab, as a sandbox needs it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LabNet {
    /// The lab's name (also a host name inside the sandbox).
    pub name: String,
    /// pid of the lab's keeper, whose namespaces are the lab's.
    pub keeper_pid: i32,
    /// The lab's declared TCP ports.
    pub ports: Vec<u16>,
}

impl NetMode {
    /// The lab, in either lab mode.
    pub fn lab(&self) -> Option<&LabNet> {
        match self {
            NetMode::None | NetMode::Proxy(_) => None,
            NetMode::Lab(l) | NetMode::LabTarget(l) => Some(l),
        }
    }
}

/// What a SIGINT sent to the supervisor does to the sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interrupt {
    /// Passed on to the command, like every other forwarded signal (the
    /// command may catch or ignore it): `retie sandbox exec`.
    #[default]
    Forward,
    /// The whole sandbox is killed (SIGKILL to its init, so the kernel
    /// kills everything in its pid namespace) and the run ends at once
    /// with [`crate::Outcome::interrupted`] set: a person's Ctrl-C
    /// cancelling an agent's command, which nothing inside can ignore.
    Kill,
}

/// How the workspace is presented inside the sandbox. The mount step
/// dispatches on this; nothing else in the set-up depends on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceMode {
    /// The real workspace, bound read-write at its own path.
    Direct,
    /// An overlay at the workspace's path: the real workspace is the
    /// read-only lower layer, every write lands in `upper` (with overlay's
    /// scratch `work`), so the command's changes can be reviewed, applied
    /// or discarded afterwards. Both directories must exist, be empty, share
    /// one parent, and (with that parent) belong to the workspace's owner.
    Overlay { upper: PathBuf, work: PathBuf },
}

/// Where the command's standard streams come from.
#[derive(Debug, Default)]
pub enum Stdio {
    /// Inherit the caller's fds 0, 1 and 2.
    #[default]
    Inherit,
    /// Explicit fds for stdin, stdout and stderr (`None` = /dev/null).
    Fds {
        stdin: Option<OwnedFd>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    },
    /// A pseudo-terminal of the sandbox's own devpts, made by its init: the
    /// command's stdin and stdout (and stderr, when the caller's fd 2 is a
    /// terminal; else the caller's fd 2) and its session's controlling
    /// terminal. The supervisor relays between the caller's terminal (fds
    /// 0 and 1, in raw mode while the command runs) and the pty's master,
    /// which never stays inside the sandbox (ADR 0550). The caller's fds 0
    /// and 1 must be terminals; a supervisor in this process only (not
    /// through the helper).
    Terminal,
}

/// Who the sandboxed command is, inside and outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Host uid the command's credentials map to. Never 0.
    pub host_uid: u32,
    /// Host gid.
    pub host_gid: u32,
    /// uid the command sees for itself inside the sandbox.
    pub inner_uid: u32,
    /// gid inside.
    pub inner_gid: u32,
    /// Login name inside (synthesized passwd).
    pub user: String,
    /// Home directory inside (a fresh tmpfs).
    pub home: PathBuf,
    /// True when the workspace is presented through an idmapped mount
    /// (retie invoked as root: on-disk owner <-> sandbox user).
    pub idmap_workspace: bool,
}

/// An extra read-only bind (`host` appears at `inside`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoBind {
    pub host: PathBuf,
    pub inside: PathBuf,
}

/// What a hidden path is: a directory gets an empty read-only tmpfs over
/// it, a file an empty read-only file bound over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HideKind {
    Dir,
    File,
}

/// A path inside the sandbox covered so the command cannot read it, even
/// though it lies inside a bound directory. Applying it is checked: a hide
/// that cannot be applied fails the run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hide {
    pub path: PathBuf,
    pub kind: HideKind,
}

/// A validated, immutable sandbox description.
///
/// It crosses a process boundary (to the helper) as a [`SpecWire`], built
/// from and into it by exhaustive destructuring: a field added here that
/// the wire does not carry fails to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    pub(crate) argv: Vec<CString>,
    pub(crate) env: Vec<CString>,
    pub(crate) workspace: PathBuf,
    pub(crate) workspace_mode: WorkspaceMode,
    pub(crate) net: NetMode,
    pub(crate) profile: Profile,
    pub(crate) limits: Limits,
    pub(crate) timeout: Option<Duration>,
    pub(crate) interrupt: Interrupt,
    pub(crate) ro_binds: Vec<RoBind>,
    pub(crate) masks: Vec<PathBuf>,
    pub(crate) scratch: Vec<PathBuf>,
    pub(crate) layered_binds: Vec<RoBind>,
    pub(crate) hides: Vec<Hide>,
    pub(crate) identity: Identity,
    pub(crate) hostname: CString,
}

impl SandboxSpec {
    /// The command line.
    pub fn argv(&self) -> Vec<String> {
        self.argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
    /// The canonical workspace path.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }
    /// The environment, as `K=V` strings.
    pub fn env(&self) -> Vec<String> {
        self.env
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
    /// Who the command runs as.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }
    /// The profile in force.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
    /// The network mode.
    pub fn net(&self) -> &NetMode {
        &self.net
    }
    /// Directories hidden from the command.
    pub fn masks(&self) -> &[PathBuf] {
        &self.masks
    }
    /// Extra writable, throwaway tmpfs directories.
    pub fn scratch(&self) -> &[PathBuf] {
        &self.scratch
    }
    /// Read-only binds mounted after the scratch directories.
    pub fn layered_binds(&self) -> &[RoBind] {
        &self.layered_binds
    }
    /// Paths covered inside bound directories.
    pub fn hides(&self) -> &[Hide] {
        &self.hides
    }
    /// The time limit, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
    /// What a SIGINT to the supervisor does.
    pub fn interrupt(&self) -> Interrupt {
        self.interrupt
    }
    /// How the workspace is presented.
    pub fn workspace_mode(&self) -> &WorkspaceMode {
        &self.workspace_mode
    }
    /// The command's resource limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The checks every spec passes before anything runs, whether it was
    /// just built or arrived from another process (then nothing else has
    /// checked it). The workspace is already canonical.
    fn validate(&self) -> Result<()> {
        let invalid = |m: String| RuntimeError::InvalidSpec(m);
        match self.argv.first() {
            None => return Err(invalid("no command given".into())),
            Some(a) if a.as_bytes().is_empty() => {
                return Err(invalid("the command name is empty".into()))
            }
            Some(_) => {}
        }
        for kv in &self.env {
            let bytes = kv.as_bytes();
            let name = bytes
                .iter()
                .position(|b| *b == b'=')
                .and_then(|i| std::str::from_utf8(&bytes[..i]).ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "environment entry {:?} is not NAME=VALUE",
                        String::from_utf8_lossy(bytes)
                    ))
                })?;
            check_env_name(name)?;
        }
        let workspace = &self.workspace;
        if let WorkspaceMode::Overlay { upper, work } = &self.workspace_mode {
            if upper.parent() != work.parent() || upper == work {
                return Err(invalid(
                    "overlay upper and work must be two directories with the same parent (overlay wants them on one mount)".into(),
                ));
            }
            for (what, dir) in [("upper", upper), ("work", work)] {
                // The work directory may hold overlayfs's own `work` from
                // an earlier mount (a reused run directory): the kernel
                // empties and recreates it at every mount.
                let own = |e: &std::fs::DirEntry| what == "work" && e.file_name() == "work";
                let empty = std::fs::read_dir(dir)
                    .map(|d| d.flatten().all(|e| own(&e)))
                    .map_err(|e| RuntimeError::Workspace {
                        path: dir.clone(),
                        reason: format!("overlay {what} directory: {e}"),
                    })?;
                if !empty || !dir.is_absolute() {
                    return Err(RuntimeError::Workspace {
                        path: dir.clone(),
                        reason: format!("overlay {what} directory must be absolute and empty"),
                    });
                }
            }
        }
        for m in &self.masks {
            if !m.is_absolute() || !m.starts_with(workspace) || m == workspace {
                return Err(invalid(format!(
                    "mask {}: must be an absolute directory strictly inside the workspace",
                    m.display()
                )));
            }
        }
        for p in self
            .scratch
            .iter()
            .chain(self.hides.iter().map(|h| &h.path))
        {
            if !p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
                || p == Path::new("/")
            {
                return Err(invalid(format!(
                    "scratch or hidden path {}: must be absolute, not /, and free of `..`",
                    p.display()
                )));
            }
        }
        for b in self.ro_binds.iter().chain(&self.layered_binds) {
            if !b.inside.is_absolute() || !b.host.is_absolute() {
                return Err(invalid(format!(
                    "read-only bind {} -> {}: both paths must be absolute",
                    b.host.display(),
                    b.inside.display()
                )));
            }
        }

        if let NetMode::Proxy(p) = &self.net {
            if p.port == 0 {
                return Err(invalid("the proxy's port must be 1-65535".into()));
            }
        }
        let host = self.hostname.as_bytes();
        if host.is_empty()
            || host.len() > 64
            || !host
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
        {
            return Err(invalid(format!(
                "host name {:?}: 1 to 64 letters, digits, `-` or `.`",
                String::from_utf8_lossy(host)
            )));
        }
        Ok(())
    }
}

/// A [`SandboxSpec`] in transferable form: the spec's own data, every field
/// but the identity, serialized with serde (what the helper receives).
///
/// **The identity is never taken from the wire.** [`SpecWire::into_spec`]
/// derives it again, in the receiving process, from that process's own
/// credentials and the workspace's owner, exactly as
/// [`SandboxBuilder::build`] does. A caller therefore cannot ask a helper
/// to map the sandbox to another uid: the helper runs as the caller (the
/// kernel would refuse most such maps anyway), and a root caller's helper
/// still runs the command as [`ROOT_INVOKED_HOST_ID`]. The rest of the
/// spec is validated again on arrival (the checks `build` makes), because
/// the receiver is what runs it. Unknown fields, an `identity` among
/// them, are refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecWire {
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub workspace: PathBuf,
    pub workspace_mode: WorkspaceMode,
    pub net: NetMode,
    pub profile: Profile,
    pub limits: Limits,
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub interrupt: Interrupt,
    pub ro_binds: Vec<RoBind>,
    pub masks: Vec<PathBuf>,
    pub scratch: Vec<PathBuf>,
    pub layered_binds: Vec<RoBind>,
    pub hides: Vec<Hide>,
    pub hostname: CString,
}

impl From<&SandboxSpec> for SpecWire {
    fn from(spec: &SandboxSpec) -> SpecWire {
        // Exhaustive: a field added to SandboxSpec must be carried (or
        // left out on purpose, like the identity) before this compiles.
        let SandboxSpec {
            argv,
            env,
            workspace,
            workspace_mode,
            net,
            profile,
            limits,
            timeout,
            interrupt,
            ro_binds,
            masks,
            scratch,
            layered_binds,
            hides,
            identity: _, // derived again by the receiver, see SpecWire
            hostname,
        } = spec;
        SpecWire {
            argv: argv.clone(),
            env: env.clone(),
            workspace: workspace.clone(),
            workspace_mode: workspace_mode.clone(),
            net: net.clone(),
            profile: profile.clone(),
            limits: limits.clone(),
            timeout: *timeout,
            interrupt: *interrupt,
            ro_binds: ro_binds.clone(),
            masks: masks.clone(),
            scratch: scratch.clone(),
            layered_binds: layered_binds.clone(),
            hides: hides.clone(),
            hostname: hostname.clone(),
        }
    }
}

impl SpecWire {
    /// The spec again, checked as `build` checks it, with the identity
    /// derived here from this process's own credentials.
    pub fn into_spec(self) -> Result<SandboxSpec> {
        let SpecWire {
            argv,
            env,
            workspace,
            workspace_mode,
            net,
            profile,
            limits,
            timeout,
            interrupt,
            ro_binds,
            masks,
            scratch,
            layered_binds,
            hides,
            hostname,
        } = self;
        let canonical = canonical_workspace(&workspace)?;
        if canonical != workspace {
            return Err(RuntimeError::Workspace {
                path: workspace,
                reason: format!(
                    "is not canonical (it resolves to {}); a spec names its workspace canonically",
                    canonical.display()
                ),
            });
        }
        let meta = std::fs::metadata(&workspace).map_err(|e| RuntimeError::Workspace {
            path: workspace.clone(),
            reason: e.to_string(),
        })?;
        let identity = identity_for(meta.uid(), meta.gid());
        let spec = SandboxSpec {
            argv,
            env,
            workspace,
            workspace_mode,
            net,
            profile,
            limits,
            timeout,
            interrupt,
            ro_binds,
            masks,
            scratch,
            layered_binds,
            hides,
            identity,
            hostname,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Builds a [`SandboxSpec`].
///
/// ```no_run
/// use retie_runtime::{Sandbox, Stdio};
/// let spec = Sandbox::builder(["sh", "-c", "echo hi > out.txt"])
///     .workspace("/tmp/project")
///     .timeout(std::time::Duration::from_secs(10))
///     .build()?;
/// let outcome = retie_runtime::run(&spec, Stdio::Inherit)?;
/// assert_eq!(outcome.exit_code, 0);
/// # Ok::<(), retie_runtime::RuntimeError>(())
/// ```
#[derive(Debug)]
pub struct SandboxBuilder {
    argv: Vec<OsString>,
    workspace: Option<PathBuf>,
    workspace_mode: WorkspaceMode,
    net: NetMode,
    profile: Option<Profile>,
    limits: Option<Limits>,
    timeout: Option<Duration>,
    interrupt: Interrupt,
    env_set: BTreeMap<String, OsString>,
    env_pass: Vec<String>,
    ro_binds: Vec<RoBind>,
    masks: Vec<PathBuf>,
    scratch: Vec<PathBuf>,
    layered_binds: Vec<RoBind>,
    hides: Vec<Hide>,
}

/// Entry point of the builder API.
pub struct Sandbox;

impl Sandbox {
    /// Start describing a sandbox that runs `argv`.
    pub fn builder<I, S>(argv: I) -> SandboxBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        SandboxBuilder {
            argv: argv
                .into_iter()
                .map(|a| a.as_ref().to_os_string())
                .collect(),
            workspace: None,
            workspace_mode: WorkspaceMode::Direct,
            net: NetMode::None,
            profile: None,
            limits: None,
            timeout: None,
            interrupt: Interrupt::Forward,
            env_set: BTreeMap::new(),
            env_pass: Vec::new(),
            ro_binds: Vec::new(),
            masks: Vec::new(),
            scratch: Vec::new(),
            layered_binds: Vec::new(),
            hides: Vec::new(),
        }
    }
}

const ENV_BASE: &[&str] = &["PATH", "HOME", "TERM", "LANG", "USER"];
/// The command's PATH unless the caller sets one.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin";

impl SandboxBuilder {
    /// The workspace directory (default: the current directory).
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }
    /// How the workspace is mounted.
    pub fn workspace_mode(mut self, mode: WorkspaceMode) -> Self {
        self.workspace_mode = mode;
        self
    }
    /// The network mode.
    pub fn network(mut self, net: NetMode) -> Self {
        self.net = net;
        self
    }
    /// The filesystem profile (default: the built-in `host`).
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = Some(profile);
        self
    }
    /// Resource limits (default: the profile's).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }
    /// Kill the whole sandbox after this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// What a SIGINT to the supervisor does (default: forwarded).
    pub fn interrupt(mut self, interrupt: Interrupt) -> Self {
        self.interrupt = interrupt;
        self
    }
    /// Set one environment variable inside.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<OsString>) -> Self {
        self.env_set.insert(key.into(), value.into());
        self
    }
    /// Pass one variable through from the caller's environment (if set).
    pub fn env_pass(mut self, name: impl Into<String>) -> Self {
        self.env_pass.push(name.into());
        self
    }
    /// Bind a host file or directory read-only at `inside`.
    pub fn ro_bind(mut self, host: impl Into<PathBuf>, inside: impl Into<PathBuf>) -> Self {
        self.ro_binds.push(RoBind {
            host: host.into(),
            inside: inside.into(),
        });
        self
    }

    /// Hide a directory inside the workspace from the command: an empty,
    /// read-only tmpfs covers it (retie's ledger or state, when they live
    /// in the workspace).
    pub fn mask(mut self, dir: impl Into<PathBuf>) -> Self {
        self.masks.push(dir.into());
        self
    }

    /// A fresh, writable, throwaway tmpfs at `dir`, owned by the sandbox
    /// user. Mounted after `$HOME`, the profile's tmpfs directories and the
    /// profile's read-only view, so it may lie beneath any of them; what
    /// the command writes there is gone when the sandbox ends.
    pub fn scratch(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch.push(dir.into());
        self
    }

    /// Bind a host file or directory read-only at `inside`, layered after
    /// the scratch directories (shallowest first), so it may lie beneath
    /// `$HOME`, `/tmp` or a [`scratch`](Self::scratch) directory. Invoked
    /// as root, the supervisor opens it as a detached tree (the sandbox
    /// user may not be able to walk to it).
    pub fn layered_ro_bind(mut self, host: impl Into<PathBuf>, inside: impl Into<PathBuf>) -> Self {
        self.layered_binds.push(RoBind {
            host: host.into(),
            inside: inside.into(),
        });
        self
    }

    /// Cover `path` (inside the sandbox) after the layered binds: a
    /// directory with an empty read-only tmpfs, a file with an empty
    /// read-only file. If it cannot be applied (missing, not of that kind,
    /// mount refused) the run fails.
    pub fn hide(mut self, path: impl Into<PathBuf>, kind: HideKind) -> Self {
        self.hides.push(Hide {
            path: path.into(),
            kind,
        });
        self
    }

    /// Validate and freeze the description. Nothing is started.
    pub fn build(self) -> Result<SandboxSpec> {
        let invalid = |m: String| RuntimeError::InvalidSpec(m);
        if self.argv.is_empty() {
            return Err(invalid("no command given".into()));
        }
        let argv = self
            .argv
            .iter()
            .map(|a| cstring(a.as_bytes(), "command argument"))
            .collect::<Result<Vec<_>>>()?;
        if argv[0].as_bytes().is_empty() {
            return Err(invalid("the command name is empty".into()));
        }

        let ws_given = match self.workspace {
            Some(w) => w,
            None => std::env::current_dir()
                .map_err(|e| RuntimeError::host("reading the current directory", e))?,
        };
        let workspace = canonical_workspace(&ws_given)?;
        let meta = std::fs::metadata(&workspace).map_err(|e| RuntimeError::Workspace {
            path: workspace.clone(),
            reason: e.to_string(),
        })?;

        let profile = match self.profile {
            Some(p) => p,
            None => Profile::host()?,
        };
        let limits = self.limits.unwrap_or_else(|| profile.limits.clone());

        let identity = identity_for(meta.uid(), meta.gid());

        // The environment: the five base variables and nothing else unless
        // asked for by name.
        let mut env: BTreeMap<String, OsString> = BTreeMap::new();
        env.insert("PATH".into(), DEFAULT_PATH.into());
        env.insert("HOME".into(), identity.home.clone().into_os_string());
        env.insert("USER".into(), identity.user.clone().into());
        env.insert(
            "TERM".into(),
            std::env::var_os("TERM").unwrap_or_else(|| "dumb".into()),
        );
        env.insert(
            "LANG".into(),
            std::env::var_os("LANG").unwrap_or_else(|| "C.UTF-8".into()),
        );
        for name in &self.env_pass {
            check_env_name(name)?;
            if let Some(v) = std::env::var_os(name) {
                env.insert(name.clone(), v);
            }
        }
        for (k, v) in self.env_set {
            check_env_name(&k)?;
            env.insert(k, v);
        }
        let env = env
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k.into_bytes();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                cstring(&kv, "environment variable")
            })
            .collect::<Result<Vec<_>>>()?;

        let spec = SandboxSpec {
            argv,
            env,
            workspace,
            workspace_mode: self.workspace_mode,
            net: self.net,
            profile,
            limits,
            timeout: self.timeout,
            interrupt: self.interrupt,
            ro_binds: self.ro_binds,
            masks: self.masks,
            scratch: self.scratch,
            layered_binds: self.layered_binds,
            hides: self.hides,
            identity,
            hostname: c"retie".to_owned(),
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Names of the variables a sandbox always gets.
pub fn base_env_names() -> &'static [&'static str] {
    ENV_BASE
}

fn cstring(bytes: &[u8], what: &str) -> Result<CString> {
    CString::new(bytes).map_err(|_| {
        RuntimeError::InvalidSpec(format!(
            "{what} contains a NUL byte: {:?}",
            String::from_utf8_lossy(bytes)
        ))
    })
}

fn check_env_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidSpec(format!(
            "`{name}` is not a valid environment variable name"
        )))
    }
}

fn canonical_workspace(given: &Path) -> Result<PathBuf> {
    let path = std::fs::canonicalize(given).map_err(|e| RuntimeError::Workspace {
        path: given.to_path_buf(),
        reason: match e.kind() {
            std::io::ErrorKind::NotFound => "does not exist".to_string(),
            _ => e.to_string(),
        },
    })?;
    if !path.is_dir() {
        return Err(RuntimeError::Workspace {
            path,
            reason: "is not a directory".into(),
        });
    }
    if path == Path::new("/") {
        return Err(RuntimeError::Workspace {
            path,
            reason: "the root directory cannot be a workspace".into(),
        });
    }
    for forbidden in ["/proc", "/sys", "/dev"] {
        if path.starts_with(forbidden) {
            return Err(RuntimeError::Workspace {
                path,
                reason: format!("a workspace cannot live under {forbidden}"),
            });
        }
    }
    Ok(path)
}

/// Decide who the command runs as.
///
/// Ordinary user: the user's own uid/gid, mapped 1:1.
/// Root: the sandbox runs as an unprivileged host uid
/// ([`ROOT_INVOKED_HOST_ID`]) and sees itself as the workspace's owner; an
/// idmapped mount makes the workspace's files its own, so what it writes
/// lands on disk owned by the workspace's owner.
fn identity_for(ws_uid: u32, ws_gid: u32) -> Identity {
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (host_uid, host_gid, inner_uid, inner_gid, idmap) = if euid == 0 {
        (
            ROOT_INVOKED_HOST_ID,
            ROOT_INVOKED_HOST_ID,
            ws_uid,
            ws_gid,
            true,
        )
    } else {
        (euid, egid, euid, egid, false)
    };
    let user = user_name(inner_uid).unwrap_or_else(|| {
        if inner_uid == 0 {
            "root".into()
        } else {
            "user".into()
        }
    });
    let home = if inner_uid == 0 {
        PathBuf::from("/root")
    } else {
        PathBuf::from("/home").join(&user)
    };
    Identity {
        host_uid,
        host_gid,
        inner_uid,
        inner_gid,
        user,
        home,
        idmap_workspace: idmap,
    }
}

/// Look a uid up in the host's /etc/passwd (names only; nothing else of the
/// host's account database reaches the sandbox).
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let _pw = f.next()?;
        let id: u32 = f.next()?.parse().ok()?;
        let safe = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
        (id == uid && safe).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_clean_by_default() {
        std::env::set_var("RETIE_TEST_SECRET_KEY", "sk-should-not-leak");
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Sandbox::builder(["true"])
            .workspace(dir.path())
            .build()
            .expect("spec");
        let names: Vec<String> = spec
            .env()
            .iter()
            .map(|kv| kv.split('=').next().unwrap_or_default().to_string())
            .collect();
        assert_eq!(names, vec!["HOME", "LANG", "PATH", "TERM", "USER"]);
    }

    #[test]
    fn env_pass_and_set() {
        std::env::set_var("RETIE_TEST_PASSED", "yes");
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Sandbox::builder(["true"])
            .workspace(dir.path())
            .env_pass("RETIE_TEST_PASSED")
            .env("FOO", "bar")
            .build()
            .expect("spec");
        assert!(spec.env().contains(&"RETIE_TEST_PASSED=yes".to_string()));
        assert!(spec.env().contains(&"FOO=bar".to_string()));
    }

    #[test]
    fn bad_env_name_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Sandbox::builder(["true"])
            .workspace(dir.path())
            .env("A=B", "x")
            .build()
            .expect_err("bad name");
        assert!(err
            .to_string()
            .contains("not a valid environment variable name"));
    }

    #[test]
    fn missing_workspace_is_clear() {
        let err = Sandbox::builder(["true"])
            .workspace("/nonexistent/retie-ws")
            .build()
            .expect_err("missing");
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn empty_command_refused() {
        let none: [&str; 0] = [];
        assert!(Sandbox::builder(none).build().is_err());
    }

    #[test]
    fn never_host_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = Sandbox::builder(["true"])
            .workspace(dir.path())
            .build()
            .expect("spec");
        assert_ne!(spec.identity().host_uid, 0);
        assert_ne!(spec.identity().host_gid, 0);
    }
}
