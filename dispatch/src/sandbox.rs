//! The sandbox as an [`Executor`]: one command in a fresh sandbox, its
//! workspace either behind an overlay (changes captured, then applied,
//! reviewed, discarded or kept) or bound directly.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use retie_ledger::payload::Status;
use retie_policy::Action;
use retie_runtime::{Outcome, RuntimeError, SandboxBuilder, Stdio, WorkspaceMode};
use retie_snapshot::{Changeset, Manifest};
use serde_json::{json, Value};

use crate::overlay::{
    self, ChangesHooks, ChangesMode, Handled, OverlayRun, Recording, RunMeta, Snapshots,
};
use crate::{Error, Executor, Step, UndoPlan};
use retie_display::visible;

/// How the workspace is presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobMode {
    /// The real workspace, read-write: nothing to undo.
    Direct {
        /// Run although the workspace holds paths a command could turn
        /// into code run later on the host ([`direct_plants`]): the
        /// person said so (`--accept-plants`).
        accept_plants: bool,
    },
    /// Behind an overlay; what happens to the changes.
    Overlay {
        changes: ChangesMode,
        allow_blocked: bool,
    },
}

/// The paths at the top of `workspace` through which a command run in
/// direct mode could plant code the host runs later, unchecked: a git
/// directory (hooks, config; or a `.git` file naming one) and a direnv
/// `.envrc`. Not followed if they are symlinks (their presence is enough).
pub fn direct_plants(workspace: &Path) -> Vec<&'static str> {
    [".git", ".envrc"]
        .into_iter()
        .filter(|name| std::fs::symlink_metadata(workspace.join(name)).is_ok())
        .collect()
}

/// Who sets the sandbox up. Namespaces can only be created from a
/// single-threaded process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// In this process ([`retie_runtime::run`]): the single-threaded CLI.
    InProcess,
    /// In a helper process, `exe __sandbox-helper`
    /// ([`retie_runtime::helper::run_via_helper_with`]): any caller,
    /// multi-threaded ones (the agent) included. Same spec, same stdio,
    /// same outcome and typed errors as in process.
    Helper { exe: PathBuf },
}

/// A networked run (`--net allow:...`, ADR 0310): the proxy that serves
/// the sandbox's only reachable socket, and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetProxy {
    /// The program whose `__net-proxy` subcommand is the proxy (retie).
    pub exe: PathBuf,
    /// The allow-list entries (`HOST[:PORT]`), already checked.
    pub allow: Vec<String>,
    /// The person's resolver override (`NAME=ADDR,...`), or empty.
    pub hosts: String,
}

pub use crate::overlay::{JobUi, Review};

/// Start the proxy on a networked sandbox's listening socket: the one way,
/// whether the sandbox was started in process or through the helper.
fn serve_proxy(
    np: &NetProxy,
    listener: std::os::fd::OwnedFd,
) -> Result<retie_net::Running, String> {
    retie_net::spawn(&np.exe, listener, &np.allow, &np.hosts)
        .map_err(|e| format!("the network proxy: {e}"))
}

/// One sandboxed command.
pub struct SandboxJob<'u> {
    /// The sandbox, described but for its workspace mode.
    pub builder: Option<SandboxBuilder>,
    pub workspace: PathBuf,
    pub mode: JobMode,
    /// retie's state directory (overlay runs, snapshots, locks).
    pub state: PathBuf,
    /// retie's own directories inside the workspace (masked, never applied).
    pub protect: Vec<PathBuf>,
    pub snaps: Snapshots,
    /// When retie runs as root for a workspace owned by someone else.
    pub owner: Option<(u32, u32)>,
    pub stdio: Option<Stdio>,
    /// In this process or through the helper.
    pub runner: Runner,
    pub ui: &'u mut dyn JobUi,
    /// The network proxy, when the sandbox's network is `NetMode::Proxy`.
    pub net: Option<NetProxy>,
}

/// What a sandboxed command did.
#[derive(Debug)]
pub struct SandboxOutput {
    pub outcome: Outcome,
    /// Overlay mode: what happened to the changes.
    pub changes: Option<Handled>,
}

impl Executor for SandboxJob<'_> {
    type Output = SandboxOutput;

    fn plan(&self, _action: &Action) -> UndoPlan {
        match self.mode {
            JobMode::Direct { .. } => UndoPlan {
                reversible: false,
                detail: json!({
                    "reversible": false,
                    "why": "direct mode: the command writes the workspace in place and no pre-images are kept",
                }),
            },
            JobMode::Overlay { .. } => UndoPlan {
                reversible: true,
                detail: json!({
                    "reversible": true,
                    "via": "snapshot",
                    "changeset": null,
                    "when": "the command's changes are captured in an overlay; the changeset and its pre-images are recorded right before they are applied",
                }),
            },
        }
    }

    fn execute(&mut self, _action: &Action, step: &mut Step<'_>) -> Result<SandboxOutput, Error> {
        let setup = self.setup(false)?;
        let mut tidying = Tidying(None);
        self.run_setup(setup, step, &mut tidying)
    }
}

/// A job whose sandbox is being set up while its caller records the
/// intent: see [`SandboxJob::prepare`].
pub struct PreparedJob<'u> {
    job: SandboxJob<'u>,
    setup: Option<Setup>,
    /// The run's housekeeping thread, joined when the job drops: after
    /// the outcome is recorded, not before (issue 10). A fold of the WAL
    /// (two syncs) can outlast a short command; joined inside `execute`,
    /// it delayed that command's outcome.
    tidying: Tidying,
}

impl Executor for PreparedJob<'_> {
    type Output = SandboxOutput;

    fn plan(&self, action: &Action) -> UndoPlan {
        self.job.plan(action)
    }

    fn execute(&mut self, _action: &Action, step: &mut Step<'_>) -> Result<SandboxOutput, Error> {
        let setup = self
            .setup
            .take()
            .ok_or_else(|| Error::Invalid("a sandbox job runs once".into()))?;
        self.job.run_setup(setup, step, &mut self.tidying)
    }
}

/// Everything made before the command may start.
/// Fields drop in order: an early sandbox is killed and reaped before its
/// overlay run directory is removed.
struct Setup {
    /// In-process runs started early: init sets up and waits for the go.
    early: Option<retie_runtime::Started>,
    spec: retie_runtime::SandboxSpec,
    run: Option<OverlayRun>,
    /// The conflict check's clock, read before the sandbox existed.
    started: SystemTime,
}

impl<'u> SandboxJob<'u> {
    /// Start setting the sandbox up now (in process only: the helper runs
    /// a whole request at once), while the caller goes on to the policy
    /// and the ledger. The command itself waits: it starts only from
    /// `execute`, after the chokepoint has made the intent durable, and
    /// never if the job is dropped first (a refusal): init is killed
    /// without running it. Building the sandbox then overlaps the
    /// recording instead of following it (issue 10's start-up cost).
    pub fn prepare(mut self) -> Result<PreparedJob<'u>, Error> {
        let setup = self.setup(true)?;
        Ok(PreparedJob {
            job: self,
            setup: Some(setup),
            tidying: Tidying(None),
        })
    }

    fn setup(&mut self, early: bool) -> Result<Setup, Error> {
        let mut builder = self
            .builder
            .take()
            .ok_or_else(|| Error::Invalid("a sandbox job runs once".into()))?;
        // A networked run (ADR 0310): the sandbox's only socket is the
        // proxy's, and every client's proxy setting points at it. Set here,
        // for every caller (`sandbox exec`, the agent's bash).
        if self.net.is_some() {
            let port = retie_net::PROXY_PORT;
            builder = builder.network(retie_runtime::NetMode::Proxy(retie_runtime::ProxyNet {
                port,
            }));
            for (k, v) in retie_net::proxy_env(port) {
                builder = builder.env(k, v);
            }
        }
        // In direct mode the command works on the real tree: it cannot see
        // a masked directory, but it can rename one of its ancestors, and
        // the next run would then start a new ledger and key where the
        // command chose (an attack pass did). Refused, not weakened.
        if let (JobMode::Direct { .. }, Some(dir)) = (&self.mode, self.protect.first()) {
            return Err(Error::Invalid(format!(
                "retie's own directory {} lies inside the workspace: a command run in direct mode could move it away and have retie start a new ledger and key where the command chose. Use the overlay mode (the default), or keep retie's state, config and ledger outside the workspace (XDG_STATE_HOME, XDG_CONFIG_HOME, --ledger)",
                visible(&dir.to_string_lossy())
            )));
        }
        // In direct mode nothing is checked on the way back: a command
        // writes `.git/hooks`, `.git/config` or `.envrc` in place, and the
        // person's next `git commit` or `cd` runs what it wrote (the plant
        // table guards only the overlay's apply). Where a workspace holds
        // such paths, direct mode needs the person's word.
        if let JobMode::Direct {
            accept_plants: false,
        } = self.mode
        {
            let found = direct_plants(&self.workspace);
            if !found.is_empty() {
                return Err(Error::Invalid(format!(
                    "the workspace holds {}: in direct mode a command writes these in place, unchecked, and git or direnv runs what it wrote the next time you use them. Use the overlay mode (the default: such changes are blocked before they reach the workspace), or pass --accept-plants with --workspace-mode direct if you accept that",
                    found
                        .iter()
                        .map(|p| visible(p))
                        .collect::<Vec<_>>()
                        .join(" and ")
                )));
            }
        }
        // Changes to apply need a workspace this process can write: found
        // out after the command ran, the apply failed part-way and was
        // rolled back, with no word of why (issue 33 item 6). Asked of the
        // kernel with the real ids, before anything runs.
        if let JobMode::Overlay {
            changes: ChangesMode::Apply,
            ..
        } = self.mode
        {
            if let Err(e) = rustix::fs::access(&self.workspace, rustix::fs::Access::WRITE_OK) {
                // SAFETY: getuid has no preconditions and cannot fail.
                let uid = unsafe { libc::getuid() };
                return Err(Error::Invalid(format!(
                    "cannot write the workspace {} ({}), so the command's changes could not be applied; nothing ran. Use --changes review or --changes discard (the changes are then kept or dropped, never written), or make the workspace writable by this user (uid {}), e.g. chown it",
                    visible(&self.workspace.to_string_lossy()),
                    std::io::Error::from(e),
                    uid
                )));
            }
        }
        for dir in &self.protect {
            builder = builder.mask(dir);
        }
        let mut run = None;
        if let JobMode::Overlay { .. } = self.mode {
            let mut r = OverlayRun::create(&self.state, self.owner)?;
            r.in_process = self.runner == Runner::InProcess;
            builder = builder.workspace_mode(WorkspaceMode::Overlay {
                upper: r.upper.clone(),
                work: r.work.clone(),
            });
            run = Some(r);
        }
        let spec = builder.build()?;
        // Every change to the real workspace from here on carries a ctime
        // at or after this (see overlay::changed_during_run).
        let started = if run.is_some() {
            overlay::run_start(&self.state, &self.workspace)
        } else {
            overlay::coarse_now()
        };
        if let Some(r) = &run {
            r.write_meta(&RunMeta {
                workspace: self.workspace.clone(),
                command: spec.argv(),
                started_ns: nanos(started),
                created_ms: nanos(SystemTime::now()) / 1_000_000,
                kept: None,
            })?;
        }
        let early = if early && self.runner == Runner::InProcess {
            let stdio = self.stdio.take().unwrap_or_default();
            Some(retie_runtime::start(&spec, stdio)?)
        } else {
            None
        };
        Ok(Setup {
            early,
            spec,
            run,
            started,
        })
    }

    fn run_setup(
        &mut self,
        setup: Setup,
        step: &mut Step<'_>,
        tidying: &mut Tidying,
    ) -> Result<SandboxOutput, Error> {
        let Setup {
            early,
            spec,
            run,
            started,
        } = setup;
        // A proxied network is served from this process's side, one way
        // whichever runner starts the sandbox: the listening socket init
        // made is taken (in process from `Started`, through the helper
        // from its reply socket, ADR 0313) and given to the proxy before
        // the command is released.
        let early = match (early, &self.runner, &self.net) {
            (None, Runner::InProcess, Some(_)) => Some(retie_runtime::start(
                &spec,
                self.stdio.take().unwrap_or_default(),
            )?),
            (e, _, _) => e,
        };
        let mut proxy = None;
        let early = match (&self.net, early) {
            (Some(np), Some(mut s)) => {
                if let Some(listener) = s.take_net_listener()? {
                    proxy = Some(serve_proxy(np, listener).map_err(Error::Invalid)?);
                }
                Some(s)
            }
            (_, e) => e,
        };
        self.run_started_or_not(early, proxy, spec, run, started, step, tidying)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_started_or_not(
        &mut self,
        early: Option<retie_runtime::Started>,
        proxy: Option<retie_net::Running>,
        spec: retie_runtime::SandboxSpec,
        mut run: Option<OverlayRun>,
        started: SystemTime,
        step: &mut Step<'_>,
        tidying: &mut Tidying,
    ) -> Result<SandboxOutput, Error> {
        // On a thread while this command runs (joined when `tidying`
        // drops, on every path: after this returns for a prepared job, whose
        // caller records the outcome meanwhile): the ledger's WAL folded
        // when due, earlier runs' directories removed, a spare made when
        // few are left. It writes nothing the outcome depends on: a fold
        // only moves committed pages (SQLite lets a writer append while a
        // PASSIVE checkpoint runs), and the run directories it touches are
        // earlier runs'.
        let state = self.state.as_path();
        let mut served = None;
        let ran = match (early, &self.runner) {
            (Some(s), _) => s.run_while(|| {
                let (state, owner) = (self.state.clone(), self.owner);
                let fold = step.take_fold();
                tidying.0 = std::thread::Builder::new()
                    .name("tidy".into())
                    .spawn(move || {
                        if let Some(fold) = fold {
                            let _ = fold.run();
                        }
                        overlay::tidy(&state, owner);
                    })
                    .ok();
                step.checkpoint_meanwhile();
            }),
            (None, Runner::InProcess) => {
                let ran = retie_runtime::run(&spec, self.stdio.take().unwrap_or_default());
                overlay::sweep_trash(state);
                ran
            }
            (None, Runner::Helper { exe }) => {
                let stdio = self.stdio.take().unwrap_or_default();
                // The helper runs the sandbox in its own process: this one
                // may have threads, and the sweep is joined before return.
                std::thread::scope(|sc| {
                    sc.spawn(|| overlay::sweep_trash(state));
                    match &self.net {
                        None => retie_runtime::helper::run_via_helper_with(exe, &spec, stdio),
                        Some(np) => retie_runtime::helper::run_via_helper_serving(
                            exe,
                            &spec,
                            stdio,
                            &mut |listener| {
                                served = Some(serve_proxy(np, listener)?);
                                Ok(())
                            },
                        ),
                    }
                })
            }
        };
        let proxy = proxy.or(served);
        // The proxy stops with the run; what it saw goes to the outcome. A
        // proxy that ended by itself cut the command off mid-transfer.
        let net = proxy.map(retie_net::Running::finish);
        let proxy_died = net.as_ref().and_then(|n| n.died.clone());
        if self.net.is_some() && net.is_none() && ran.is_ok() {
            return Err(Error::Invalid(
                "the sandbox never handed out its proxy socket, yet its command ran".into(),
            ));
        }
        let outcome = match ran {
            Ok(o) => o,
            Err(e) => {
                // Whatever went wrong, the command may have written into
                // the upper layer first (a tampered status channel is only
                // seen after the command ended): keep those writes.
                if let Some(r) = run.as_mut() {
                    if r.has_writes() {
                        r.keep_because("the run failed");
                        self.ui.say(&format!(
                            "the run failed; the command's writes were not applied and are kept as run {} (`retie changes show {}`)",
                            r.id, r.id
                        ));
                    }
                }
                return Err(e.into());
            }
        };
        let mut result = json!({
            "status": Status::Ran.word(),
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "timed_out": outcome.timed_out,
            "interrupted": outcome.interrupted,
        });
        if let (Some(n), Some(np)) = (&net, &self.net) {
            set(
                &mut result,
                "net",
                json!({
                    "allow": np.allow,
                    "connections": n.connections,
                    "proxy_died": n.died,
                }),
            );
        }
        let changes = match (run, self.mode) {
            (_, JobMode::Direct { .. }) if proxy_died.is_some() => Some(Handled {
                json: json!({ "applied": null }),
                failure: proxy_died.clone(),
            }),
            (None, _) | (_, JobMode::Direct { .. }) => None,
            (Some(mut r), _)
                if outcome.timed_out
                    || outcome.interrupted
                    || proxy_died.is_some()
                    || (outcome.stop_signal.is_some() && r.has_writes()) =>
            {
                // A timed-out or interrupted command's half-done changes
                // are not applied, and not thrown away either: one rule
                // for the agent's Ctrl-C (the sandbox killed) and for a
                // Ctrl-C or SIGTERM to `retie sandbox exec` (forwarded to
                // the command, which may die of it or catch it; a command
                // stopped so that wrote nothing leaves no run behind).
                let why = if outcome.timed_out {
                    "timed out"
                } else if proxy_died.is_some() {
                    "cut off from the network (its proxy ended during the run)"
                } else {
                    "interrupted"
                };
                r.keep_because(why);
                self.ui.say(&format!(
                    "the command was {why}; its changes were not applied and are kept as run {id}: see them with `retie changes show {id}`, apply them with `retie changes apply {id}`, or throw them away with `retie changes discard {id}`",
                    id = r.id
                ));
                set(&mut result, "status", json!(Status::NotApplied.word()));
                set(&mut result, "kept", json!(r.id));
                Some(Handled {
                    json: json!({
                        "applied": false,
                        "kept": {"run": r.id, "upper": r.upper.display().to_string(), "why": why},
                    }),
                    failure: proxy_died.clone(),
                })
            }
            (
                Some(mut r),
                JobMode::Overlay {
                    changes,
                    allow_blocked,
                },
            ) => {
                let t = std::time::Instant::now();
                let mut hooks = Hooks {
                    ui: &mut *self.ui,
                    step,
                    allow_blocked,
                };
                let mut h = overlay::handle(
                    changes,
                    allow_blocked,
                    &self.protect,
                    &self.state,
                    &self.snaps,
                    &mut r,
                    self.owner,
                    started,
                    overlay::OnConflict::Refuse,
                    &mut hooks,
                )?;
                let applied = h.json["applied"] == json!(true);
                let n = overlay::changes_count(&h.json);
                let status = if applied {
                    Status::Applied
                } else if h.failure.is_some() {
                    Status::RefusedByGuard
                } else if n == 0 && h.json["blocked"].as_array().map_or(true, Vec::is_empty) {
                    Status::Unchanged
                } else {
                    Status::NotApplied
                }
                .word();
                set(&mut result, "status", json!(status));
                set(&mut result, "changes", json!(n));
                set(
                    &mut result,
                    "conflicts",
                    h.json.get("conflicts").cloned().unwrap_or(Value::Null),
                );
                set(&mut result, "failure", json!(h.failure));
                if let Some(o) = h.json.as_object_mut() {
                    if r.kept() {
                        o.insert(
                            "kept".into(),
                            json!({"run": r.id, "upper": r.upper.display().to_string()}),
                        );
                        set(&mut result, "kept", json!(r.id));
                    }
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    o.insert("handled_ms".into(), json!((ms * 1000.0).round() / 1000.0));
                }
                Some(h)
            }
        };
        // The outcome rides on the next durable point (docs/ledger.md):
        // nothing retie does later depends on it being on disk now. An
        // applied changeset is undone from its durable point 2 (the exact
        // changes) and the snapshot journal's complete entry, both synced
        // before this; `retie undo` needs no outcome (proved by
        // ledger::crash_between_intent_and_outcome_leaves_an_honest_ledger,
        // killed after the apply and before the outcome).
        step.set_outcome_deferred(result);
        Ok(SandboxOutput { outcome, changes })
    }
}

/// The housekeeping thread of a run, joined when this is dropped.
struct Tidying(Option<std::thread::JoinHandle<()>>);

impl Drop for Tidying {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

/// The undo plan of a changeset about to be applied: its paths listed,
/// or, past [`LISTED_PATHS_MAX`](crate::overlay::LISTED_PATHS_MAX), its
/// manifest named (ADR 0209).
pub fn plan_for(cs: &Changeset, allow_blocked: bool, manifest: Option<&Manifest>) -> Value {
    let mut plan = json!({
        "reversible": true,
        "via": "snapshot",
        "changeset": cs.id,
    });
    match manifest {
        Some(m) => set(&mut plan, "manifest", manifest_json(m)),
        None => {
            let paths: Vec<&str> = cs
                .to_apply(allow_blocked)
                .map(|c| c.path.as_str())
                .collect();
            set(&mut plan, "paths", json!(paths));
        }
    }
    plan
}

/// How the ledger names a manifest: its blake3 (the blob in the state
/// directory's store holding every path) and its counts.
pub fn manifest_json(m: &Manifest) -> Value {
    json!({
        "blake3": m.hash.to_hex(),
        "paths": m.paths,
        "created": m.created,
        "modified": m.modified,
        "deleted": m.deleted,
        "bytes": m.new_bytes,
        "where": "the state directory's blob store, named by its blake3; one JSON object a line: path, before, after",
    })
}

/// The job's hooks while its changes are handled: what the person sees
/// and answers through its [`JobUi`], the recording through its step
/// (also the file write's, `crate::write`).
pub struct Hooks<'a, 'r> {
    pub ui: &'a mut dyn JobUi,
    pub step: &'a mut Step<'r>,
    pub allow_blocked: bool,
}

impl JobUi for Hooks<'_, '_> {
    fn say(&mut self, line: &str) {
        self.ui.say(line);
    }
    fn review(&mut self, r: &Review<'_>) -> Option<bool> {
        self.ui.review(r)
    }
}

impl ChangesHooks for Hooks<'_, '_> {
    fn before_apply<'s>(
        &'s mut self,
        cs: &Changeset,
        manifest: Option<&Manifest>,
    ) -> Recording<'s> {
        let changes = json!({ "undo": plan_for(cs, self.allow_blocked, manifest) });
        let step = &mut *self.step;
        Box::new(move || step.before_effect(changes))
    }
}

fn set(v: &mut Value, key: &str, val: Value) {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.into(), val);
    }
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A runtime error's exit code for `retie sandbox exec`.
pub fn exit_code_of(e: &RuntimeError) -> i32 {
    e.exit_code()
}
