//! Toolchains: which host directories a project's tools live in, and how a
//! sandbox sees them.
//!
//! [`plan`] looks at the workspace's marker files (`Cargo.toml`,
//! `pyproject.toml`, `package.json`, `go.mod`, a `Makefile`, ...) and at
//! where the invoking user's language managers keep their tools (rustup,
//! pyenv, a workspace venv, nvm/fnm/volta, `~/.local/bin`, Go). It returns a
//! [`Plan`]: read-only binds at their own (resolved) paths, throwaway
//! scratch directories for the tools' own state, the paths that must be
//! covered inside those binds ([`secrets`]), what was left out and why, and
//! the environment (PATH first) that makes the same command work inside as
//! outside. [`Plan::apply`] adds it to a [`SandboxBuilder`].
//!
//! This is host-side, read-only code. It never reads the process
//! environment: the caller passes the invoking user's home and variables in
//! a [`HostEnv`], and the filesystem through [`HostFs`].

pub mod secrets;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Result, RuntimeError};
use crate::spec::{HideKind, SandboxBuilder, DEFAULT_PATH};
use secrets::{Where, SECRETS};

/// A language or tool family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Rust,
    Python,
    Node,
    Go,
    /// Tools in `~/.local/bin` the project names (pipx, uv, scripts).
    LocalBin,
}

impl Kind {
    /// Every kind, in detection order.
    pub const ALL: [Kind; 5] = [
        Kind::Rust,
        Kind::Python,
        Kind::Node,
        Kind::Go,
        Kind::LocalBin,
    ];

    /// The name used on the command line and in profiles.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Rust => "rust",
            Kind::Python => "python",
            Kind::Node => "node",
            Kind::Go => "go",
            Kind::LocalBin => "local-bin",
        }
    }
}

/// Which toolchains a sandbox gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Those the workspace's marker files call for.
    Auto,
    /// None: the profile's system view only.
    None,
    /// Exactly these, whatever the markers say.
    Only(Vec<Kind>),
}

impl Selection {
    /// Parse `auto`, `none`, or names (each word may hold a comma list).
    pub fn parse<S: AsRef<str>>(words: &[S]) -> Result<Selection> {
        let words: Vec<&str> = words
            .iter()
            .flat_map(|w| w.as_ref().split(','))
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .collect();
        let bad = |m: String| RuntimeError::Toolchain(m);
        match words.as_slice() {
            [] | ["auto"] => return Ok(Selection::Auto),
            ["none"] => return Ok(Selection::None),
            _ => {}
        }
        let mut kinds = Vec::new();
        for w in words {
            let k = Kind::ALL.iter().find(|k| k.name() == w).ok_or_else(|| {
                bad(format!(
                    "unknown toolchain `{w}`: use auto, none, or names from: rust, python, node, go, local-bin"
                ))
            })?;
            if !kinds.contains(k) {
                kinds.push(*k);
            }
        }
        Ok(Selection::Only(kinds))
    }

    /// The selection as written.
    pub fn describe(&self) -> String {
        match self {
            Selection::Auto => "auto".into(),
            Selection::None => "none".into(),
            Selection::Only(k) => k.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
        }
    }
}

/// The invoking user, as the caller knows it.
#[derive(Debug, Clone, Default)]
pub struct HostEnv {
    /// The invoking user's home.
    pub home: PathBuf,
    /// The variables in [`HostEnv::VARS`] that are set.
    pub vars: BTreeMap<String, OsString>,
    /// True when retie runs as root (the sandbox user is then an
    /// unprivileged stranger to every host file).
    pub root_invoked: bool,
    /// Directories no bind may hold or lie in, whatever the rule: the
    /// caller's own state (for retie: its config, state, data and ledger
    /// directories). A bind that would is refused and said.
    pub protected: Vec<PathBuf>,
}

impl HostEnv {
    /// The variables detection reads.
    pub const VARS: &'static [&'static str] = &[
        "CARGO_HOME",
        "RUSTUP_HOME",
        "RUSTUP_TOOLCHAIN",
        "PYENV_ROOT",
        "PYENV_VERSION",
        "NVM_DIR",
        "FNM_DIR",
        "VOLTA_HOME",
        "GOROOT",
        "GOPATH",
        "GOMODCACHE",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "PATH",
    ];

    fn var(&self, k: &str) -> Option<PathBuf> {
        self.vars
            .get(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    }

    /// `$var` if set to an absolute path, else `~/rel`.
    fn dir_or(&self, var: &str, rel: &str) -> PathBuf {
        self.var(var).unwrap_or_else(|| self.home.join(rel))
    }

    fn cargo_home(&self) -> PathBuf {
        self.dir_or("CARGO_HOME", ".cargo")
    }
    fn rustup_home(&self) -> PathBuf {
        self.dir_or("RUSTUP_HOME", ".rustup")
    }
    fn pyenv_root(&self) -> PathBuf {
        self.dir_or("PYENV_ROOT", ".pyenv")
    }
    fn data_home(&self) -> PathBuf {
        self.dir_or("XDG_DATA_HOME", ".local/share")
    }
    fn cache_home(&self) -> PathBuf {
        self.dir_or("XDG_CACHE_HOME", ".cache")
    }
    fn nvm_dir(&self) -> PathBuf {
        self.dir_or("NVM_DIR", ".nvm")
    }
    fn fnm_dir(&self) -> PathBuf {
        self.var("FNM_DIR")
            .unwrap_or_else(|| self.data_home().join("fnm"))
    }
    fn volta_home(&self) -> PathBuf {
        self.dir_or("VOLTA_HOME", ".volta")
    }
    /// The first entry of `GOPATH`, else `~/go`.
    fn gopath(&self) -> PathBuf {
        self.vars
            .get("GOPATH")
            .and_then(|v| v.to_str())
            .and_then(|v| v.split(':').next())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| self.home.join("go"))
    }
    fn gomodcache(&self) -> PathBuf {
        self.var("GOMODCACHE")
            .unwrap_or_else(|| self.gopath().join("pkg/mod"))
    }

    fn var_str(&self, k: &str) -> Option<String> {
        self.vars
            .get(k)
            .and_then(|v| v.to_str())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    }
}

/// The filesystem seam: detection reads the host only through this.
pub trait HostFs {
    fn symlink_metadata(&self, p: &Path) -> io::Result<std::fs::Metadata>;
    /// Metadata through links.
    fn metadata(&self, p: &Path) -> io::Result<std::fs::Metadata>;
    fn canonicalize(&self, p: &Path) -> io::Result<PathBuf>;
    /// Entries of a directory with their types, as the directory reports
    /// them (no `stat` per entry).
    fn read_dir_typed(&self, p: &Path) -> io::Result<Vec<(String, EntryType)>>;
    /// Entry names of a directory.
    fn read_dir(&self, p: &Path) -> io::Result<Vec<String>> {
        Ok(self
            .read_dir_typed(p)?
            .into_iter()
            .map(|(n, _)| n)
            .collect())
    }
    fn read_to_string(&self, p: &Path) -> io::Result<String>;
}

/// What a directory entry is (not following links).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryType {
    Dir,
    File,
    Symlink,
    Other,
}

/// The real host filesystem.
pub struct RealFs;

impl HostFs for RealFs {
    fn symlink_metadata(&self, p: &Path) -> io::Result<std::fs::Metadata> {
        std::fs::symlink_metadata(p)
    }
    fn metadata(&self, p: &Path) -> io::Result<std::fs::Metadata> {
        std::fs::metadata(p)
    }
    fn canonicalize(&self, p: &Path) -> io::Result<PathBuf> {
        std::fs::canonicalize(p)
    }
    fn read_dir_typed(&self, p: &Path) -> io::Result<Vec<(String, EntryType)>> {
        std::fs::read_dir(p)?
            .map(|e| {
                let e = e?;
                let t = e.file_type()?;
                let kind = if t.is_dir() {
                    EntryType::Dir
                } else if t.is_file() {
                    EntryType::File
                } else if t.is_symlink() {
                    EntryType::Symlink
                } else {
                    EntryType::Other
                };
                Ok((e.file_name().to_string_lossy().into_owned(), kind))
            })
            .collect()
    }
    fn read_to_string(&self, p: &Path) -> io::Result<String> {
        std::fs::read_to_string(p)
    }
}

/// A read-only bind of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bind {
    /// The resolved host directory or file.
    pub source: PathBuf,
    /// Where it appears inside: the same path, except for a tool in
    /// `~/.local/bin` that links elsewhere (its target appears at its name).
    pub path: PathBuf,
    /// The rule that added it.
    pub rule: String,
    /// A package cache (read-only: writes fail, never reach the host).
    pub cache: bool,
}

/// A throwaway writable directory of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scratch {
    pub path: PathBuf,
    pub rule: String,
}

/// A path covered inside a bind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hidden {
    pub path: PathBuf,
    pub kind: HideKind,
    /// The never-bound entry it matched.
    pub pattern: String,
    pub reason: String,
}

/// Something deliberately left out of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Excluded {
    pub path: PathBuf,
    pub reason: String,
}

/// A toolchain the plan found, and the marker that called for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Detected {
    pub kind: Kind,
    pub marker: String,
}

/// What a sandbox sees of the host's toolchains.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    pub selection: String,
    pub detected: Vec<Detected>,
    pub binds: Vec<Bind>,
    pub scratch: Vec<Scratch>,
    pub hidden: Vec<Hidden>,
    pub excluded: Vec<Excluded>,
    /// Prepended to the default PATH, in order.
    pub path: Vec<PathBuf>,
    /// Variables set inside (PATH included once anything is prepended).
    pub env: BTreeMap<String, String>,
    /// Notes for people (a toolchain called for but not found).
    pub notes: Vec<String>,
    /// Refusals a person should see on every run, not only in `explain`:
    /// a workspace file that named a location outside every toolchain
    /// root, a bind that would have shown a protected directory.
    pub warnings: Vec<String>,
}

impl Plan {
    /// Add the plan to a sandbox description.
    pub fn apply(&self, mut b: SandboxBuilder) -> SandboxBuilder {
        for s in &self.scratch {
            b = b.scratch(&s.path);
        }
        for bind in &self.binds {
            b = b.layered_ro_bind(&bind.source, &bind.path);
        }
        for h in &self.hidden {
            b = b.hide(&h.path, h.kind);
        }
        for (k, v) in &self.env {
            b = b.env(k, v);
        }
        b
    }
}

/// What detection needs besides the host: the profile's read-only system
/// paths (anything under them is already visible).
pub struct Context<'a> {
    pub workspace: &'a Path,
    pub env: &'a HostEnv,
    pub fs: &'a dyn HostFs,
    pub system: &'a [PathBuf],
}

/// How deep the never-bound scan looks under a toolchain bind, and under
/// a package cache (published package contents are public by construction;
/// walking a whole registry on every run would cost milliseconds).
const SCAN_DEPTH: usize = 3;
const CACHE_SCAN_DEPTH: usize = 1;

/// Build the plan for `sel` in `ctx.workspace`.
pub fn plan(sel: &Selection, ctx: &Context<'_>) -> Plan {
    let resolve = |p: &Path| ctx.fs.canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut p = Planner {
        ctx,
        plan: Plan {
            selection: sel.describe(),
            ..Plan::default()
        },
        real_home: resolve(&ctx.env.home),
        roots: Vec::new(),
        py_roots: Vec::new(),
        protected: ctx.env.protected.iter().map(|d| resolve(d)).collect(),
        goroot: None,
    };
    let kinds: Vec<Kind> = match sel {
        Selection::None => Vec::new(),
        Selection::Auto => Kind::ALL.to_vec(),
        Selection::Only(k) => k.clone(),
    };
    let forced = !matches!(sel, Selection::Auto);
    if !kinds.is_empty() {
        p.goroot = p.find_goroot();
        p.roots = p.known_roots();
        let env = ctx.env;
        p.py_roots = [
            env.pyenv_root().join("versions"),
            env.data_home().join("uv/python"),
        ]
        .iter()
        .filter(|r| p.exists(r))
        .filter_map(|r| ctx.fs.canonicalize(r).ok())
        .collect();
    }
    for k in kinds {
        let marker = p.marker(k);
        let marker = match (marker, forced) {
            (Some(m), _) => m,
            (None, true) => "named explicitly".to_string(),
            (None, false) => continue,
        };
        p.plan.detected.push(Detected { kind: k, marker });
        match k {
            Kind::Rust => p.rust(),
            Kind::Python => p.python(),
            Kind::Node => p.node(),
            Kind::Go => p.go(),
            Kind::LocalBin => p.local_bin(),
        }
    }
    p.secrets();
    if !p.plan.path.is_empty() {
        let mut path: Vec<String> = p
            .plan
            .path
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect();
        path.push(DEFAULT_PATH.to_string());
        p.plan.env.insert("PATH".into(), path.join(":"));
    }
    p.plan
}

/// The never-bound entry `path` is, or lies inside, if any: a home entry
/// it starts with, or a named entry matching one of its ancestors.
fn never_bound_ancestor(path: &Path, home: &Path) -> Option<&'static secrets::Secret> {
    if let Some(s) = SECRETS.iter().find(|s| match s.at {
        Where::Home(rel) => path.starts_with(home.join(rel)),
        _ => false,
    }) {
        return Some(s);
    }
    let comps: Vec<String> = path
        .components()
        .skip(1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    (1..=comps.len()).find_map(|k| SECRETS.iter().find(|s| s.matches_name(&comps[..k])))
}

/// Where a virtualenv's interpreter lives.
enum Interp {
    /// One install directory of pyenv or uv.
    Install(PathBuf),
    /// In the profile's system paths: visible already.
    System,
    /// No usable `home` line.
    Missing,
    /// Somewhere else: refused.
    Outside(PathBuf),
}

struct Planner<'a> {
    ctx: &'a Context<'a>,
    plan: Plan,
    /// The home, resolved once.
    real_home: PathBuf,
    /// Where toolchains may come from: the invoking user's variables and
    /// the managers' documented layouts, resolved. Nothing read from the
    /// workspace adds to it; every bind and scratch lies inside one.
    roots: Vec<PathBuf>,
    /// The roots a virtualenv's interpreter may be taken from (one install
    /// directory of one of them is bound): pyenv's versions, uv's pythons.
    py_roots: Vec<PathBuf>,
    /// [`HostEnv::protected`], resolved.
    protected: Vec<PathBuf>,
    /// GOROOT as the user's environment names it ([`Planner::find_goroot`]).
    goroot: Option<PathBuf>,
}

impl Planner<'_> {
    fn fs(&self) -> &dyn HostFs {
        self.ctx.fs
    }
    fn home(&self) -> &Path {
        &self.ctx.env.home
    }
    fn ws(&self) -> &Path {
        self.ctx.workspace
    }
    fn exists(&self, p: &Path) -> bool {
        self.fs().symlink_metadata(p).is_ok()
    }
    fn is_dir(&self, p: &Path) -> bool {
        self.fs().metadata(p).map(|m| m.is_dir()).unwrap_or(false)
    }

    /// The first marker for `k` in the workspace, if any.
    fn marker(&self, k: Kind) -> Option<String> {
        let names: &[&str] = match k {
            Kind::Rust => &["Cargo.toml", "rust-toolchain.toml", "rust-toolchain"],
            Kind::Python => &[
                "pyproject.toml",
                "setup.py",
                "setup.cfg",
                "Pipfile",
                ".python-version",
                "requirements.txt",
            ],
            Kind::Node => &["package.json", ".nvmrc", ".node-version"],
            Kind::Go => &["go.mod"],
            Kind::LocalBin => &[],
        };
        if let Some(n) = names.iter().find(|n| self.exists(&self.ws().join(n))) {
            return Some((*n).to_string());
        }
        match k {
            Kind::Python => {
                if let Some(v) = self.venv() {
                    return Some(format!("{} (a virtualenv)", self.rel(&v)));
                }
                self.top_entries()
                    .into_iter()
                    .find(|n| n.starts_with("requirements") && n.ends_with(".txt"))
            }
            Kind::LocalBin => {
                let tools = self.named_local_tools();
                (!tools.is_empty()).then(|| {
                    format!(
                        "{} named in the project",
                        tools
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
            }
            _ => None,
        }
    }

    fn rel(&self, p: &Path) -> String {
        p.strip_prefix(self.ws())
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    }

    fn top_entries(&self) -> Vec<String> {
        let mut v = self.fs().read_dir(self.ws()).unwrap_or_default();
        v.sort();
        v
    }

    fn note(&mut self, n: String) {
        self.plan.notes.push(n);
    }

    fn warn(&mut self, w: String) {
        if !self.plan.warnings.contains(&w) {
            self.plan.warnings.push(w);
        }
    }

    fn exclude(&mut self, path: &Path, reason: impl Into<String>) {
        let reason = reason.into();
        if !self
            .plan
            .excluded
            .iter()
            .any(|e| e.path == path && e.reason == reason)
        {
            self.plan.excluded.push(Excluded {
                path: path.to_path_buf(),
                reason,
            });
        }
    }

    /// Resolve `p`; None (with a reason recorded) when it must not or need
    /// not be bound.
    fn admissible(&mut self, p: &Path, rule: &str) -> Option<PathBuf> {
        let real = self.fs().canonicalize(p).ok()?;
        if real == Path::new("/") || self.real_home.starts_with(&real) {
            self.exclude(
                &real,
                format!("{rule}: refused, it is the home directory or holds it (the whole home is never bound)"),
            );
            return None;
        }
        for sys in ["/proc", "/sys", "/dev", "/etc", "/run", "/boot"] {
            if real.starts_with(sys) {
                self.exclude(&real, format!("{rule}: refused, {sys} is never bound"));
                return None;
            }
        }
        // A toolchain directory that is, or lies inside, a never-bound
        // entry (`NVM_DIR=~/.config/gh/...`) is refused whole.
        if let Some(s) = never_bound_ancestor(&real, &self.real_home) {
            self.exclude(
                &real,
                format!("{rule}: refused, it lies in {} ({})", s.pattern(), s.reason),
            );
            return None;
        }
        // The caller's own directories (retie's ledger, snapshots, keys):
        // neither inside a bind nor holding one.
        if let Some(d) = self
            .protected
            .iter()
            .find(|d| d.starts_with(&real) || real.starts_with(d))
            .cloned()
        {
            let why = format!(
                "{rule}: refused, it holds or lies in {}, retie's own directory (ledger, snapshots, keys are never bound)",
                d.display()
            );
            self.exclude(&real, why.clone());
            self.warn(format!("{}: {why}", real.display()));
            return None;
        }
        if self.ctx.system.iter().any(|s| real.starts_with(s)) {
            return None; // already visible through the profile
        }
        if real.starts_with(self.ws()) {
            return None; // the workspace itself
        }
        // Only inside a known toolchain location: whatever named this path
        // (a variable, a link, a file), it can select among the user's own
        // toolchains but never add a directory of the host.
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            self.exclude(
                &real,
                format!("{rule}: refused, it lies outside every known toolchain location (rustup, pyenv, uv, pipx, nvm, fnm, volta, Go, ~/.local/bin and their variables)"),
            );
            return None;
        }
        Some(real)
    }

    /// The toolchain locations, from the invoking user's variables and the
    /// managers' documented layouts only (never from the workspace),
    /// resolved; those that do not exist are left out.
    fn known_roots(&self) -> Vec<PathBuf> {
        let env = self.ctx.env;
        let home = self.home();
        let mut roots = vec![
            env.cargo_home(),
            env.rustup_home(),
            env.pyenv_root(),
            env.data_home().join("uv"),
            env.data_home().join("pipx"),
            home.join(".local/pipx"),
            env.cache_home().join("pip"),
            env.cache_home().join("uv"),
            env.nvm_dir(),
            env.fnm_dir(),
            env.volta_home(),
            home.join(".npm"),
            env.gopath(),
            env.gomodcache(),
            home.join(".local/bin"),
        ];
        roots.extend(self.goroot.clone());
        let mut out: Vec<PathBuf> = Vec::new();
        for r in roots {
            if !self.exists(&r) {
                continue;
            }
            if let Ok(real) = self.fs().canonicalize(&r) {
                if !out.contains(&real) {
                    out.push(real);
                }
            }
        }
        out
    }

    /// GOROOT: the user's variable, else the root of the first `go` on
    /// the user's PATH. Only absolute PATH entries outside the workspace
    /// count (an empty entry means the current directory, which a
    /// sandboxed command can write), and the `go` found must sit in the
    /// `bin` of a directory laid out as a Go root (`pkg/tool`).
    fn find_goroot(&self) -> Option<PathBuf> {
        let env = self.ctx.env;
        if let Some(r) = env.var("GOROOT") {
            return Some(r);
        }
        let path = env.vars.get("PATH")?.to_string_lossy().into_owned();
        path.split(':').find_map(|d| {
            let d = Path::new(d);
            if !d.is_absolute() {
                return None;
            }
            // Most entries hold no `go`: one failed lstat each.
            self.fs().symlink_metadata(&d.join("go")).ok()?;
            let dir = self.fs().canonicalize(d).ok()?;
            if dir.starts_with(self.ws()) {
                return None;
            }
            let real = self.fs().canonicalize(&dir.join("go")).ok()?;
            let bin = real.parent()?;
            let root = bin.parent()?;
            (bin.file_name()? == "bin" && self.is_dir(&root.join("pkg/tool")))
                .then(|| root.to_path_buf())
        })
    }

    fn bind(&mut self, p: &Path, rule: &str, cache: bool) -> Option<PathBuf> {
        let real = self.admissible(p, rule)?;
        if self.bound(&real) {
            return Some(real);
        }
        // A new bind that covers earlier ones replaces them.
        self.plan.binds.retain(|b| !b.path.starts_with(&real));
        self.plan.binds.push(Bind {
            source: real.clone(),
            path: real.clone(),
            rule: rule.to_string(),
            cache,
        });
        Some(real)
    }

    fn scratch(&mut self, p: &Path, rule: &str) -> Option<PathBuf> {
        let real = self.admissible(p, rule)?;
        if !self.plan.scratch.iter().any(|s| s.path == real) {
            self.plan.scratch.push(Scratch {
                path: real.clone(),
                rule: rule.to_string(),
            });
        }
        Some(real)
    }

    fn path_first(&mut self, dir: PathBuf) {
        if !self.plan.path.contains(&dir) {
            self.plan.path.push(dir);
        }
    }

    fn set(&mut self, k: &str, v: &Path) {
        self.plan
            .env
            .insert(k.to_string(), v.to_string_lossy().into_owned());
    }

    fn rust(&mut self) {
        let env = self.ctx.env;
        let cargo = env.cargo_home();
        let rustup = env.rustup_home();
        if !self.is_dir(&cargo) && !self.is_dir(&rustup) {
            self.note(format!(
                "rust: no rustup install at {} or {}; the system toolchain (if any) is used",
                cargo.display(),
                rustup.display()
            ));
            return;
        }
        if self.is_dir(&cargo) {
            // CARGO_HOME itself is a throwaway tmpfs: cargo takes its locks
            // and keeps its last-use database there. Only what a build
            // reads is bound into it.
            if let Some(c) =
                self.scratch(&cargo, "rust: CARGO_HOME (throwaway: locks, last-use db)")
            {
                self.set("CARGO_HOME", &c);
                if let Some(bin) = self.bind(
                    &c.join("bin"),
                    "rust: $CARGO_HOME/bin (cargo, rustup proxies, installed tools)",
                    false,
                ) {
                    self.path_first(bin);
                }
                for (sub, what) in [
                    ("registry", "registry index, .crate files and sources"),
                    ("git", "git dependencies' checkouts"),
                ] {
                    if self.is_dir(&c.join(sub)) {
                        self.bind(
                            &c.join(sub),
                            &format!("rust: $CARGO_HOME/{sub} (cache: {what}; read-only)"),
                            true,
                        );
                    }
                }
                for cfg in ["config.toml", "config"] {
                    let f = c.join(cfg);
                    if let Ok(text) = self.fs().read_to_string(&f) {
                        match secrets::credential_in(&text) {
                            Some(what) => self.exclude(
                                &f,
                                format!("rust: cargo config holds {what} (registry credentials); not bound"),
                            ),
                            None => {
                                self.bind(&f, "rust: cargo configuration", false);
                            }
                        }
                    }
                }
                // The bare repositories of git dependencies keep the URL
                // they were fetched from, a login in it included; the
                // cache scan stops above them.
                let db = c.join("git/db");
                let mut repos = self.fs().read_dir(&db).unwrap_or_default();
                repos.sort();
                for r in repos {
                    self.check_content(&db.join(r).join("config"), false);
                }
            }
        }
        if self.is_dir(&rustup) {
            if let Some(r) = self.scratch(
                &rustup,
                "rust: RUSTUP_HOME (throwaway: rustup's tmp and downloads)",
            ) {
                self.set("RUSTUP_HOME", &r);
                if self.is_dir(&r.join("toolchains")) {
                    self.bind(
                        &r.join("toolchains"),
                        "rust: installed toolchains (rustc, cargo, std)",
                        false,
                    );
                }
                if self.exists(&r.join("settings.toml")) {
                    self.bind(
                        &r.join("settings.toml"),
                        "rust: rustup's default toolchain and overrides",
                        false,
                    );
                }
            }
        }
        if let Some(t) = env.var_str("RUSTUP_TOOLCHAIN") {
            self.plan.env.insert("RUSTUP_TOOLCHAIN".into(), t);
        }
    }

    /// The install directory of a venv's interpreter, from `pyvenv.cfg`'s
    /// `home`. The file is data a sandboxed command can write: it selects
    /// one install directly inside pyenv's versions or uv's pythons (the
    /// roots come from the user's variables), never a place of its own.
    fn venv_interpreter(&self, venv: &Path) -> Interp {
        let Ok(cfg) = self.fs().read_to_string(&venv.join("pyvenv.cfg")) else {
            return Interp::Missing;
        };
        let Some(home) = cfg.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "home").then(|| PathBuf::from(v.trim()))
        }) else {
            return Interp::Missing;
        };
        if !home.is_absolute() {
            return Interp::Missing;
        }
        let Ok(real) = self.fs().canonicalize(&home) else {
            return Interp::Missing;
        };
        if self.ctx.system.iter().any(|s| real.starts_with(s)) {
            return Interp::System;
        }
        for r in &self.py_roots {
            if let Some(std::path::Component::Normal(first)) = real
                .strip_prefix(r)
                .ok()
                .and_then(|rest| rest.components().next())
            {
                return Interp::Install(r.join(first));
            }
        }
        Interp::Outside(real)
    }

    /// A virtualenv at the workspace's top level.
    fn venv(&self) -> Option<PathBuf> {
        for name in [".venv", "venv", "env", ".env"] {
            let d = self.ws().join(name);
            if self.exists(&d.join("pyvenv.cfg")) {
                return Some(d);
            }
        }
        self.top_entries()
            .into_iter()
            .map(|n| self.ws().join(n))
            .find(|d| self.exists(&d.join("pyvenv.cfg")))
    }

    fn python(&mut self) {
        let mut found = false;
        let venv = self.venv();
        if let Some(v) = &venv {
            found = true;
            match self.venv_interpreter(v) {
                Interp::Install(root) => {
                    self.bind(
                        &root,
                        "python: the workspace venv's interpreter (pyvenv.cfg `home`, one install of pyenv or uv)",
                        false,
                    );
                }
                Interp::System => {}
                Interp::Missing => self.note(format!(
                    "python: {} has no absolute, existing `home` in pyvenv.cfg; its interpreter is not bound",
                    v.display()
                )),
                Interp::Outside(real) => {
                    let why = format!(
                        "python: refused, {}/pyvenv.cfg names an interpreter outside pyenv's versions and uv's pythons (a workspace file selects among the user's toolchains, never adds a directory); install it with pyenv or uv, or use a system python",
                        self.rel(v)
                    );
                    self.exclude(&real, why.clone());
                    self.warn(format!("{}: {why}", real.display()));
                }
            }
            self.path_first(v.join("bin"));
            self.set("VIRTUAL_ENV", v);
        }
        let pyenv = self.ctx.env.pyenv_root();
        let wants_pyenv = venv.is_none() || self.exists(&self.ws().join(".python-version"));
        if wants_pyenv && self.is_dir(&pyenv) {
            found = true;
            if let Some(root) =
                self.bind(&pyenv, "python: pyenv (PYENV_ROOT: versions, shims)", false)
            {
                self.set("PYENV_ROOT", &root);
                self.path_first(root.join("shims"));
                self.path_first(root.join("bin"));
            }
            if let Some(v) = self.ctx.env.var_str("PYENV_VERSION") {
                self.plan.env.insert("PYENV_VERSION".into(), v);
            }
        }
        let cache = self.ctx.env.cache_home();
        for (sub, var) in [("pip", "PIP_CACHE_DIR"), ("uv", "UV_CACHE_DIR")] {
            if self.is_dir(&cache.join(sub)) {
                if let Some(d) = self.bind(
                    &cache.join(sub),
                    &format!("python: {sub} cache (read-only)"),
                    true,
                ) {
                    self.set(var, &d);
                }
            }
        }
        if !found {
            self.note("python: no workspace venv and no pyenv; the system python3 is used".into());
        }
    }

    fn wanted_node(&self) -> Option<String> {
        [".nvmrc", ".node-version"].iter().find_map(|n| {
            let t = self.fs().read_to_string(&self.ws().join(n)).ok()?;
            let t = t.trim().trim_start_matches('v').to_string();
            (!t.is_empty()).then_some(t)
        })
    }

    /// The installed version directory best matching `wanted`, among
    /// `dir`'s entries named `vX.Y.Z`.
    fn pick_version(&self, dir: &Path, wanted: Option<&str>) -> Option<PathBuf> {
        let mut versions: Vec<(Vec<u64>, String)> = self
            .fs()
            .read_dir(dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| {
                let nums = n
                    .trim_start_matches('v')
                    .split('.')
                    .map(|x| x.parse::<u64>().ok())
                    .collect::<Option<Vec<_>>>()?;
                Some((nums, n))
            })
            .collect();
        versions.sort();
        let fits = |n: &str| match wanted {
            None => true,
            Some(w) => {
                let n = n.trim_start_matches('v');
                n == w || n.starts_with(&format!("{w}."))
            }
        };
        versions
            .iter()
            .rev()
            .find(|(_, n)| fits(n))
            .map(|(_, n)| dir.join(n))
    }

    fn node(&mut self) {
        let wanted = self.wanted_node();
        let nvm = self.ctx.env.nvm_dir();
        let fnm = self.ctx.env.fnm_dir();
        let volta = self.ctx.env.volta_home();
        let mut version_dir = None;
        if self.is_dir(&nvm.join("versions/node")) {
            let alias = self
                .fs()
                .read_to_string(&nvm.join("alias/default"))
                .ok()
                .map(|a| a.trim().trim_start_matches('v').to_string());
            let versions = nvm.join("versions/node");
            version_dir = self
                .pick_version(&versions, wanted.as_deref())
                .or_else(|| {
                    // `lts/*`, `node`, or a version not installed: nvm's
                    // default alias, else the newest installed.
                    self.pick_version(&versions, alias.as_deref())
                        .or_else(|| self.pick_version(&versions, None))
                })
                .map(|d| (d, "node: nvm version"));
            if let (Some(w), Some((d, _))) = (&wanted, &version_dir) {
                if self.pick_version(&versions, Some(w)).as_ref() != Some(d) {
                    self.note(format!(
                        "node: {w} is not installed in nvm (or not a version number); using {}",
                        d.display()
                    ));
                }
            }
        }
        if version_dir.is_none() && self.is_dir(&fnm.join("node-versions")) {
            version_dir = self
                .pick_version(&fnm.join("node-versions"), wanted.as_deref())
                .map(|d| (d.join("installation"), "node: fnm version"));
        }
        if let Some((d, rule)) = version_dir {
            let rule = format!(
                "{rule} ({})",
                wanted
                    .as_deref()
                    .map_or("newest installed".to_string(), |w| format!("wanted {w}"))
            );
            if let Some(real) = self.bind(&d, &rule, false) {
                self.path_first(real.join("bin"));
                // A version whose node is a link elsewhere (a system node
                // registered with nvm): bind where it leads too.
                if let Ok(node) = self.fs().canonicalize(&real.join("bin/node")) {
                    if let Some(root) = node.parent().and_then(Path::parent) {
                        let root = root.to_path_buf();
                        self.bind(&root, "node: where the version's node binary leads", false);
                    }
                }
            } else if let Ok(real) = self.fs().canonicalize(&d) {
                // Visible already (profile): still put it first on PATH.
                self.path_first(real.join("bin"));
            }
        } else if self.is_dir(&volta.join("bin")) {
            if let Some(v) = self.bind(&volta.join("bin"), "node: volta shims", false) {
                self.path_first(v);
            }
            if self.is_dir(&volta.join("tools/image")) {
                self.bind(
                    &volta.join("tools/image"),
                    "node: volta's installed tools",
                    false,
                );
            }
            if let Ok(v) = self.fs().canonicalize(&volta) {
                self.set("VOLTA_HOME", &v);
            }
        } else {
            self.note(
                "node: no nvm, fnm or volta install found; the system node (if any) is used".into(),
            );
        }
        let npm = self.home().join(".npm");
        if self.is_dir(&npm.join("_cacache")) {
            if let Some(n) = self.scratch(
                &npm,
                "node: npm's directory (throwaway: logs, cache writes)",
            ) {
                self.bind(&n.join("_cacache"), "node: npm cache (read-only)", true);
                self.set("npm_config_cache", &n);
            }
        }
    }

    fn go(&mut self) {
        let env = self.ctx.env;
        let goroot = self.goroot.clone();
        match goroot {
            Some(r) => {
                if let Some(real) = self.bind(&r, "go: GOROOT (the go command and std)", false) {
                    self.path_first(real.join("bin"));
                    self.set("GOROOT", &real);
                }
            }
            None => self.note("go: no go command found on PATH and no GOROOT".into()),
        }
        let gopath = env.gopath();
        if self.is_dir(&gopath) {
            if let Some(g) = self.scratch(&gopath, "go: GOPATH (throwaway)") {
                self.set("GOPATH", &g);
                if self.is_dir(&g.join("bin")) {
                    if let Some(b) =
                        self.bind(&g.join("bin"), "go: $GOPATH/bin (installed tools)", false)
                    {
                        self.path_first(b);
                    }
                }
            }
        }
        let modcache = env.gomodcache();
        if self.is_dir(&modcache) {
            if let Some(m) = self.bind(&modcache, "go: module cache (read-only)", true) {
                self.set("GOMODCACHE", &m);
            }
        }
        self.plan.env.insert("GOTOOLCHAIN".into(), "local".into());
        self.plan.env.insert("GOPROXY".into(), "off".into());
    }

    /// Tools in `~/.local/bin` whose names appear in the project's build
    /// files, with their paths.
    fn named_local_tools(&self) -> Vec<(String, PathBuf)> {
        let dir = self.home().join(".local/bin");
        let tools = self.fs().read_dir(&dir).unwrap_or_default();
        if tools.is_empty() {
            return Vec::new();
        }
        let mut words = std::collections::BTreeSet::new();
        for f in [
            "Makefile",
            "makefile",
            "GNUmakefile",
            "justfile",
            "Justfile",
            "package.json",
            "pyproject.toml",
            "tox.ini",
        ] {
            if let Ok(text) = self.fs().read_to_string(&self.ws().join(f)) {
                for w in text.split(|c: char| !(c.is_ascii_alphanumeric() || "._+-".contains(c))) {
                    if !w.is_empty() {
                        words.insert(w.to_string());
                    }
                }
            }
        }
        let mut named: Vec<(String, PathBuf)> = tools
            .into_iter()
            .filter(|t| words.contains(t))
            .map(|t| {
                let p = dir.join(&t);
                (t, p)
            })
            .collect();
        named.sort();
        named
    }

    fn local_bin(&mut self) {
        let tools = self.named_local_tools();
        if tools.is_empty() {
            self.note("local-bin: no tool in ~/.local/bin is named by the project".into());
            return;
        }
        let dir = self.home().join(".local/bin");
        let dir = self.fs().canonicalize(&dir).unwrap_or(dir);
        for (name, path) in tools {
            let Ok(target) = self.fs().canonicalize(&path) else {
                self.note(format!("local-bin: {} is a dangling link", path.display()));
                continue;
            };
            let rule = format!("local-bin: `{name}`, named by the project");
            // The tool at its own name: a link's target is bound over it.
            let visible = self.ctx.system.iter().any(|s| target.starts_with(s));
            if visible || self.admissible(&target, &rule).is_some() {
                let inside = dir.join(&name);
                if !self.bound(&inside) {
                    self.plan.binds.push(Bind {
                        source: target.clone(),
                        path: inside,
                        rule: rule.clone(),
                        cache: false,
                    });
                }
                // A tool installed in a venv (pipx, uv tool): the venv and
                // its interpreter.
                for anc in target.ancestors().skip(1).take(3) {
                    if self.exists(&anc.join("pyvenv.cfg")) {
                        // A venv that may not be bound (in the workspace,
                        // outside every root): its pyvenv.cfg is not read.
                        let venv = format!("local-bin: the venv `{name}` runs in");
                        if self.bind(anc, &venv, false).is_some() {
                            let rule = format!("local-bin: the interpreter of `{name}`'s venv");
                            match self.venv_interpreter(anc) {
                                Interp::Install(root) => {
                                    self.bind(&root, &rule, false);
                                }
                                Interp::Outside(real) => self.exclude(
                                    &real,
                                    format!("{rule}: refused, outside pyenv's versions and uv's pythons"),
                                ),
                                Interp::System | Interp::Missing => {}
                            }
                        }
                        break;
                    }
                }
            }
        }
        self.path_first(dir);
    }

    /// The never-bound list against the plan: every home entry is listed
    /// (covered when a bind holds it), every bind is scanned for names.
    fn secrets(&mut self) {
        let home = self.home().to_path_buf();
        let cargo = self
            .ctx
            .env
            .var("CARGO_HOME")
            .unwrap_or_else(|| home.join(".cargo"));
        for s in SECRETS {
            let found: Vec<PathBuf> = match s.at {
                Where::Home(rel) => vec![home.join(rel)],
                Where::CargoHome(glob) => self
                    .fs()
                    .read_dir(&cargo)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|n| secrets::glob(glob, n))
                    .map(|n| cargo.join(n))
                    .collect(),
                Where::Named(_) => continue,
            };
            for p in found {
                if !self.exists(&p) {
                    continue;
                }
                let real = self.fs().canonicalize(&p).unwrap_or_else(|_| p.clone());
                if self.bound(&real) {
                    self.hide(&real, s.pattern(), s.reason);
                } else {
                    self.exclude(
                        &p,
                        format!("{}: {}; outside every bind", s.pattern(), s.reason),
                    );
                }
            }
        }
        let binds: Vec<(PathBuf, bool)> = self
            .plan
            .binds
            .iter()
            .map(|b| (b.path.clone(), b.cache))
            .collect();
        for (root, cache) in binds {
            let depth = if cache { CACHE_SCAN_DEPTH } else { SCAN_DEPTH };
            let mut comps: Vec<String> = Vec::new();
            self.scan(&root, depth, &mut comps);
        }
    }

    /// Read a configuration file inside a bind (through a link: its target,
    /// when that is inside a bind too) and cover it if it holds a
    /// credential, or if it is too large or not text to be checked.
    /// `resolved`: `p` is known to be a regular file at its real path (an
    /// entry the walk of a resolved bind found), so it is not resolved again.
    fn check_content(&mut self, p: &Path, resolved: bool) -> bool {
        let real = if resolved {
            p.to_path_buf()
        } else {
            match self.fs().canonicalize(p) {
                Ok(r) => r,
                Err(_) => return false,
            }
        };
        let Ok(meta) = self.fs().metadata(&real) else {
            return false;
        };
        if !meta.is_file() || !self.bound(&real) {
            return false;
        }
        let found = if meta.len() > secrets::CONFIG_MAX {
            Some("too large to check (covered unread)")
        } else {
            match self.fs().read_to_string(&real) {
                Ok(text) => secrets::credential_in(&text),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    Some("not text, so not checked (covered unread)")
                }
                // What retie cannot read, the command (same user, or a
                // stranger when invoked as root) cannot either.
                Err(_) => None,
            }
        };
        match found {
            Some(what) => {
                self.hide(
                    &real,
                    "a configuration file holding a credential".into(),
                    what,
                );
                true
            }
            None => false,
        }
    }

    fn bound(&self, p: &Path) -> bool {
        self.plan.binds.iter().any(|b| p.starts_with(&b.path))
    }

    fn hide(&mut self, p: &Path, pattern: String, reason: &str) {
        if self.plan.hidden.iter().any(|h| p.starts_with(&h.path)) {
            return;
        }
        let kind = match self.fs().symlink_metadata(p) {
            Ok(m) if m.is_dir() => HideKind::Dir,
            Ok(m) if m.is_file() => HideKind::File,
            _ => return,
        };
        self.plan.hidden.retain(|h| !h.path.starts_with(p));
        self.plan.hidden.push(Hidden {
            path: p.to_path_buf(),
            kind,
            pattern,
            reason: reason.to_string(),
        });
    }

    /// Walk `dir` (inside a bind) to `depth`, covering every match. Entry
    /// types come from the directory itself: no `stat` per entry.
    fn scan(&mut self, dir: &Path, depth: usize, comps: &mut Vec<String>) {
        let Ok(meta) = self.fs().symlink_metadata(dir) else {
            return;
        };
        if !meta.is_dir() {
            // A bound file: match its own name.
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            comps.push(name);
            let kind = if meta.is_file() {
                EntryType::File
            } else {
                EntryType::Other
            };
            self.check(dir, comps, kind);
            comps.pop();
            return;
        }
        self.scan_dir(dir, meta.permissions().mode(), depth, comps);
    }

    fn scan_dir(&mut self, dir: &Path, mode: u32, depth: usize, comps: &mut Vec<String>) {
        if depth == 0 {
            return;
        }
        // Invoked as root, the sandbox user is a stranger to every host
        // file: what it cannot enter it cannot read either.
        if self.ctx.env.root_invoked && mode & 0o001 == 0 {
            return;
        }
        let mut entries = self.fs().read_dir_typed(dir).unwrap_or_default();
        entries.sort();
        for (n, kind) in entries {
            let p = dir.join(&n);
            comps.push(n);
            let hit = self.check(&p, comps, kind);
            if !hit && kind == EntryType::Dir && depth > 1 {
                let mode = if self.ctx.env.root_invoked {
                    self.fs()
                        .symlink_metadata(&p)
                        .map(|m| m.permissions().mode())
                        .unwrap_or(0)
                } else {
                    0o755
                };
                self.scan_dir(&p, mode, depth - 1, comps);
            }
            comps.pop();
        }
    }

    /// Cover `p` if it matches a named entry, or if it is a configuration
    /// file that holds a credential; true if it was covered.
    fn check(&mut self, p: &Path, comps: &[String], kind: EntryType) -> bool {
        let Some(s) = SECRETS.iter().find(|s| s.matches_name(comps)) else {
            let name = comps.last().map(String::as_str).unwrap_or_default();
            return kind != EntryType::Dir
                && secrets::is_config_name(name)
                && self.check_content(p, kind == EntryType::File);
        };
        let Ok(meta) = self.fs().symlink_metadata(p) else {
            return false;
        };
        if meta.file_type().is_symlink() {
            // A cover is mounted through a link onto its target: cover the
            // target if the sandbox can reach it, else it dangles inside.
            match self.fs().canonicalize(p) {
                Ok(t) if self.bound(&t) => self.hide(&t, s.pattern(), s.reason),
                _ => self.exclude(
                    p,
                    format!(
                        "{}: {}; a link leading outside every bind (dangles inside)",
                        s.pattern(),
                        s.reason
                    ),
                ),
            }
        } else {
            self.hide(p, s.pattern(), s.reason);
        }
        true
    }
}

#[cfg(test)]
mod tests;
