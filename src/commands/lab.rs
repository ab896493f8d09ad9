//! `retie lab up|status|down` and the hidden `__lab-holder`.
//!
//! A lab is a target (a command) running in a sandbox of its own inside a
//! network namespace with no uplink. Its **holder** (`retie __lab-holder`,
//! detached) spawns the lab's namespace keeper (`retie_runtime::lab`), runs
//! the target in a `NetMode::LabTarget` sandbox whose workspace is the
//! lab's own state directory, and removes everything when the target ends.
//! Labs are recorded in `STATE/labs/NAME/lab.json`; a record whose holder
//! is gone is stale, and the next `lab` or `--net lab` command cleans it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use retie_runtime::LAB_ADDRESS;
use retie_runtime::{LabNet, NetMode, Sandbox, Stdio};
use serde::{Deserialize, Serialize};

use crate::error::CliError;

/// The bundled demo target (lab/demo/app.py).
const DEMO_APP: &str = include_str!("../../lab/demo/app.py");
const DEMO_PORT: u16 = 8080;

#[derive(Subcommand)]
pub enum LabCmd {
    /// Start a lab: CMD runs in its own sandbox inside a network namespace
    /// with no uplink; lab-mode sandboxes (`sandbox exec --net lab[:NAME]`)
    /// reach it on its declared ports and nothing else.
    Up(UpArgs),
    /// List running labs (address, ports, pid, uptime).
    Status(StatusArgs),
    /// Stop a lab and remove everything it created.
    Down(DownArgs),
}

#[derive(Args)]
pub struct UpArgs {
    /// The lab's name (also a host name inside lab-mode sandboxes).
    #[arg(long)]
    pub name: Option<String>,
    /// A TCP port the target serves (repeatable). Lab-mode sandboxes may
    /// connect to these ports only.
    #[arg(long = "port", value_name = "PORT")]
    pub ports: Vec<u16>,
    /// Start the bundled, deliberately vulnerable demo web app.
    #[arg(long, conflicts_with = "command")]
    pub demo: bool,
    /// With --demo: the build with every flaw fixed.
    #[arg(long, requires = "demo")]
    pub fixed: bool,
    /// With --demo: the build with every flaw fixed the way a hurried
    /// patch fixes it: each finding's original payload fails and a variant
    /// still works (the gaps: lab/findings/README.md).
    #[arg(long, requires = "demo", conflicts_with = "fixed")]
    pub partial: bool,
    /// Print one JSON object {name, address, ports, pid}.
    #[arg(long)]
    pub json: bool,
    /// The target command.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args)]
pub struct StatusArgs {
    /// Print a JSON list.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DownArgs {
    /// The lab to stop (default: the only running one).
    pub name: Option<String>,
}

#[derive(Args)]
pub struct HolderArgs {
    #[arg(long)]
    pub name: String,
    #[arg(long = "port")]
    pub ports: Vec<u16>,
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// What `STATE/labs/NAME/lab.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabRecord {
    pub name: String,
    pub address: String,
    pub ports: Vec<u16>,
    /// The holder's pid.
    pub pid: i32,
    /// The holder's start time (/proc/PID/stat field 22), against pid reuse.
    pub pid_start: u64,
    pub keeper_pid: i32,
    /// Unix seconds.
    pub started: u64,
}

pub fn run(cmd: LabCmd) -> i32 {
    let r = match cmd {
        LabCmd::Up(a) => up(a),
        LabCmd::Status(a) => status(a),
        LabCmd::Down(a) => down(a),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            crate::ui::say_failure(&e);
            retie_runtime::EXIT_SANDBOX_FAILED
        }
    }
}

fn labs_dir() -> Result<PathBuf, CliError> {
    let d = crate::state::dir()?.join("labs");
    std::fs::create_dir_all(&d)
        .map_err(|e| CliError::io(format!("creating {}", d.display()), e))?;
    Ok(d)
}

fn check_name(name: &str) -> Result<(), CliError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "lab name {name:?}: use 1-32 characters of a-z, 0-9 and '-' (it becomes a host name)"
        )))
    }
}

/// Start time of `pid` (field 22 of /proc/PID/stat), if it runs.
fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    if matches!(f.next(), Some("Z" | "X")) {
        return None; // dead, not yet reaped
    }
    f.nth(18)?.parse().ok()
}

/// Parent pid of `pid` (field 4 of /proc/PID/stat).
fn ppid(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
}

fn alive(r: &LabRecord) -> bool {
    start_time(r.pid) == Some(r.pid_start)
}

fn read_record(dir: &Path) -> Option<LabRecord> {
    let text = std::fs::read_to_string(dir.join("lab.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Every lab record; stale ones (holder gone) are removed and reported.
fn running_labs() -> Result<Vec<LabRecord>, CliError> {
    let dir = labs_dir()?;
    let mut out = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| CliError::io(format!("listing {}", dir.display()), e))?;
    for e in entries.flatten() {
        let p = e.path();
        match read_record(&p) {
            Some(r) if alive(&r) => out.push(r),
            Some(r) => {
                eprintln!(
                    "retie: lab {} was stale (its holder {} is gone); cleaned",
                    r.name, r.pid
                );
                kill_record(&r);
                let _ = std::fs::remove_dir_all(&p);
            }
            // A lab still starting (no record yet) or a leftover: only a
            // directory older than a minute without a record is removed.
            None => {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|d| d > Duration::from_secs(60));
                if old {
                    let _ = std::fs::remove_dir_all(&p);
                }
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn kill_record(r: &LabRecord) {
    // The keeper dies with its holder (PDEATHSIG); this covers a keeper
    // whose holder was SIGKILLed before the death signal was armed.
    if let Ok(cmd) = std::fs::read(format!("/proc/{}/cmdline", r.keeper_pid)) {
        if cmd.windows(12).any(|w| w == b"__lab-holder") {
            signal(r.keeper_pid, rustix::process::Signal::KILL);
        }
    }
}

/// Send `sig` to the process `pid` (a recorded lab process; nothing for a
/// pid that is not a positive number).
fn signal(pid: i32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// The lab a `--net lab[:NAME]` sandbox joins.
pub fn resolve_net(spec: &str) -> Result<NetMode, CliError> {
    let name = match spec {
        "none" => return Ok(NetMode::None),
        "lab" => None,
        s => match s.strip_prefix("lab:") {
            Some(n) => {
                if n.is_empty() {
                    return Err(CliError::Usage(format!(
                        "--net {s}: no lab name after `lab:`; use --net lab (the only running lab) or --net lab:NAME"
                    )));
                }
                if check_name(n).is_err() {
                    return Err(CliError::Usage(format!(
                        "--net {s}: {n:?} is not a lab name: use 1-32 characters of a-z, 0-9 and '-', not starting with '-' (see `retie lab status`)"
                    )));
                }
                Some(n)
            }
            None => {
                return Err(CliError::Usage(format!(
                    "--net {s}: expected none, lab or lab:NAME"
                )))
            }
        },
    };
    let r = find(name)?;
    // The keeper must still be the holder's child (not a reused pid).
    if ppid(r.keeper_pid) != Some(r.pid) {
        return Err(CliError::Usage(format!(
            "lab {}: its namespace keeper {} is gone; `retie lab down {}` and start it again",
            r.name, r.keeper_pid, r.name
        )));
    }
    Ok(NetMode::Lab(LabNet {
        name: r.name,
        keeper_pid: r.keeper_pid,
        ports: r.ports,
    }))
}

fn find(name: Option<&str>) -> Result<LabRecord, CliError> {
    let labs = running_labs()?;
    match name {
        Some(n) => labs.into_iter().find(|r| r.name == n).ok_or_else(|| {
            CliError::Usage(format!(
                "no lab named {n:?} is running; start one with `retie lab up --name {n} -- CMD` (see `retie lab status`)"
            ))
        }),
        None => match labs.len() {
            1 => Ok(labs.into_iter().next().ok_or_else(|| CliError::Usage("no lab".into()))?),
            0 => Err(CliError::Usage(
                "no lab is running; start one with `retie lab up --demo` or `retie lab up -- CMD`".into(),
            )),
            _ => Err(CliError::Usage(format!(
                "{} labs are running ({}); name one: lab:NAME",
                labs.len(),
                labs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

fn record_json(r: &LabRecord) -> serde_json::Value {
    serde_json::json!({
        "name": r.name, "address": r.address, "ports": r.ports, "pid": r.pid,
    })
}

fn up(a: UpArgs) -> Result<(), CliError> {
    let name = a
        .name
        .clone()
        .unwrap_or_else(|| if a.demo { "demo".into() } else { "lab".into() });
    check_name(&name)?;
    let mut ports = a.ports.clone();
    let labs = running_labs()?;
    if labs.iter().any(|r| r.name == name) {
        return Err(CliError::Usage(format!(
            "a lab named {name:?} is already running; `retie lab down {name}` first"
        )));
    }
    let dir = labs_dir()?.join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.join("data");
    std::fs::create_dir_all(&data)
        .map_err(|e| CliError::io(format!("creating {}", data.display()), e))?;
    let command = if a.demo {
        if ports.is_empty() {
            ports.push(DEMO_PORT);
        }
        let app = data.join("app.py");
        std::fs::write(&app, DEMO_APP)
            .map_err(|e| CliError::io(format!("writing {}", app.display()), e))?;
        let mut c = vec![
            "python3".to_string(),
            app.display().to_string(),
            "--port".into(),
            ports[0].to_string(),
            "--data".into(),
            data.display().to_string(),
        ];
        if a.fixed {
            c.push("--fixed".into());
        }
        if a.partial {
            c.push("--partial".into());
        }
        c
    } else {
        if a.command.is_empty() {
            return Err(CliError::Usage(
                "lab up: give the target as `-- CMD [ARGS...]`, or --demo".into(),
            ));
        }
        a.command.clone()
    };
    if ports.is_empty() {
        return Err(CliError::Usage(
            "lab up: declare the target's ports with --port PORT (sandboxes may reach those only)"
                .into(),
        ));
    }
    let log = dir.join("holder.log");
    let logf = std::fs::File::create(&log)
        .map_err(|e| CliError::io(format!("creating {}", log.display()), e))?;
    let exe = std::env::current_exe().map_err(|e| CliError::io("locating retie", e))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__lab-holder").arg("--name").arg(&name);
    for p in &ports {
        cmd.arg("--port").arg(p.to_string());
    }
    cmd.arg("--").args(&command);
    cmd.current_dir(&data)
        .stdin(std::process::Stdio::null())
        .stdout(
            logf.try_clone()
                .map_err(|e| CliError::io("duplicating the log fd", e))?,
        )
        .stderr(logf);
    // Its own session: the terminal's signals and hang-up do not reach it.
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    };
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::io("starting the lab holder", e))?;
    // Wait for the record, then for every port to listen in the lab.
    let deadline = Instant::now() + Duration::from_secs(15);
    let fail = |why: String| {
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        CliError::Usage(format!(
            "lab {name}: {why}\n--- {} ---\n{tail}",
            log.display()
        ))
    };
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let e = fail(format!("the target exited during start-up ({st})"));
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        if let Some(r) = read_record(&dir) {
            if listening(r.keeper_pid, &ports) {
                if a.json {
                    println!("{}", record_json(&r));
                } else {
                    println!(
                        "lab {} up: address {} (`lab` and `{}` inside lab-mode sandboxes), ports {}, pid {}",
                        r.name,
                        r.address,
                        r.name,
                        ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(","),
                        r.pid
                    );
                }
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            // Terminate the holder we spawned.
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&child),
                rustix::process::Signal::TERM,
            );
            let _ = child.wait();
            let e = fail(format!(
                "the target did not listen on port(s) {ports:?} within 15 s"
            ));
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Are all `ports` in LISTEN state in the network namespace of `pid`?
pub fn listening(pid: i32, ports: &[u16]) -> bool {
    let Ok(tcp) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    ports.iter().all(|p| {
        let want = format!(":{p:04X}");
        tcp.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
        })
    })
}

fn status(a: StatusArgs) -> Result<(), CliError> {
    let labs = running_labs()?;
    let now = now_secs();
    if a.json {
        let v: Vec<_> = labs
            .iter()
            .map(|r| {
                let mut j = record_json(r);
                if let Some(o) = j.as_object_mut() {
                    o.insert("uptime_s".into(), now.saturating_sub(r.started).into());
                }
                j
            })
            .collect();
        println!("{}", serde_json::Value::from(v));
        return Ok(());
    }
    if labs.is_empty() {
        println!("no lab is running");
    }
    for r in &labs {
        println!(
            "{}\taddress {}\tports {}\tpid {}\tup {} s",
            r.name,
            r.address,
            r.ports
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
            r.pid,
            now.saturating_sub(r.started)
        );
    }
    Ok(())
}

fn down(a: DownArgs) -> Result<(), CliError> {
    let r = find(a.name.as_deref())?;
    // The recorded holder, checked alive just now.
    signal(r.pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(&r) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if alive(&r) {
        // Its sandbox and keeper die with it.
        signal(r.pid, rustix::process::Signal::KILL);
    }
    let _ = std::fs::remove_dir_all(labs_dir()?.join(&r.name));
    println!("lab {} down", r.name);
    Ok(())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `retie __lab-holder`: keeper, record, target, clean-up.
pub fn holder(a: HolderArgs) -> i32 {
    match holder_inner(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("retie lab holder: {e}");
            retie_runtime::EXIT_SANDBOX_FAILED
        }
    }
}

fn holder_inner(a: HolderArgs) -> Result<i32, CliError> {
    let dir = labs_dir()?.join(&a.name);
    let data = dir.join("data");
    let (uid, gid) = retie_runtime::lab::owner();
    let keeper = retie_runtime::lab::spawn_keeper(uid, gid)?;
    let pid = std::process::id() as i32;
    let record = LabRecord {
        name: a.name.clone(),
        address: LAB_ADDRESS.to_string(),
        ports: a.ports.clone(),
        pid,
        pid_start: start_time(pid).unwrap_or(0),
        keeper_pid: keeper.pid,
        started: now_secs(),
    };
    let tmp = dir.join("lab.json.tmp");
    let written = serde_json::to_vec(&record)
        .map_err(|e| CliError::Usage(e.to_string()))
        .and_then(|j| {
            std::fs::write(&tmp, j).map_err(|e| CliError::io("writing the lab record", e))
        })
        .and_then(|()| {
            std::fs::rename(&tmp, dir.join("lab.json"))
                .map_err(|e| CliError::io("writing the lab record", e))
        });
    if let Err(e) = written {
        keeper.stop();
        return Err(e);
    }
    let spec = Sandbox::builder(&a.command)
        .workspace(&data)
        .network(NetMode::LabTarget(LabNet {
            name: a.name.clone(),
            keeper_pid: keeper.pid,
            ports: a.ports.clone(),
        }))
        .build();
    let outcome = spec.and_then(|s| retie_runtime::run(&s, Stdio::Inherit));
    keeper.stop();
    // The record goes first (the lab is down); the log stays for `lab up`
    // to show, and the next lab command removes the directory.
    let _ = std::fs::remove_file(dir.join("lab.json"));
    let _ = std::fs::remove_dir_all(&data);
    let o = outcome?;
    eprintln!("retie lab holder: target exited with {}", o.exit_code);
    Ok(o.exit_code)
}
