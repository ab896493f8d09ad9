//! The parent's side: start `EXE __net-proxy` on the sandbox's listening
//! socket, and read its connection log when the run ends.

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

use crate::NetError;

/// The descriptor numbers the proxy finds its socket and log at.
pub const LISTEN_FD: i32 = 3;
/// See [`LISTEN_FD`].
pub const LOG_FD: i32 = 4;

/// A running proxy.
pub struct Running {
    child: Option<Child>,
    log: std::fs::File,
}

/// One connection, as the ledger records it.
pub type Connection = Value;

/// What the proxy did during the run.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Every connection, in the order they were made.
    pub connections: Vec<Connection>,
    /// The proxy ended before the run did (killed, crashed): the run's
    /// downloads may be cut short.
    pub died: Option<String>,
}

/// Start the proxy. `listener` is the sandbox's listening socket; the
/// parent's copy is closed when this returns, so once the proxy is gone
/// nothing accepts on it.
pub fn spawn(
    exe: &Path,
    listener: OwnedFd,
    allow: &[String],
    hosts: &str,
) -> Result<Running, NetError> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; it
    // returns a new descriptor that we own, or -1.
    let raw = unsafe { libc::memfd_create(c"retie-net-log".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(NetError::io(
            "creating the proxy's log",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let log = unsafe { std::fs::File::from_raw_fd(raw) };
    let mut cmd = Command::new(exe);
    cmd.arg("__net-proxy");
    for a in allow {
        cmd.arg("--allow").arg(a);
    }
    if !hosts.is_empty() {
        cmd.arg("--hosts").arg(hosts);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    cmd.env_clear();
    let (l, g) = (listener.as_raw_fd(), log.as_raw_fd());
    // SAFETY: runs in the child between fork and exec; it calls only
    // dup2 and fcntl, which are async-signal-safe, on descriptors the
    // parent keeps open until `spawn` returns. dup2 clears CLOEXEC on the
    // copies; when a source already sits at its target number, its
    // CLOEXEC flag is cleared by hand.
    unsafe {
        cmd.pre_exec(move || {
            // Move the log out of the way first if it sits on LISTEN_FD.
            let g = if g == LISTEN_FD {
                let moved = libc::fcntl(g, libc::F_DUPFD_CLOEXEC, 10);
                if moved < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                moved
            } else {
                g
            };
            for (from, to) in [(l, LISTEN_FD), (g, LOG_FD)] {
                let r = if from == to {
                    libc::fcntl(from, libc::F_SETFD, 0)
                } else {
                    libc::dup2(from, to)
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| NetError::io(format!("starting the proxy {}", exe.display()), e))?;
    drop(listener);
    Ok(Running {
        child: Some(child),
        log,
    })
}

impl Running {
    /// The proxy's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stop the proxy (if it still runs) and read what it logged.
    pub fn finish(mut self) -> Finished {
        let mut died = None;
        if let Some(mut c) = self.child.take() {
            match c.try_wait() {
                Ok(Some(st)) => {
                    died = Some(format!("the network proxy ended during the run ({st})"))
                }
                Ok(None) => {}
                Err(e) => died = Some(format!("the network proxy could not be watched: {e}")),
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut text = String::new();
        let _ = self.log.rewind();
        let _ = self.log.read_to_string(&mut text);
        Finished {
            connections: merge(&text),
            died,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Fold the log's events into one record per connection.
fn merge(text: &str) -> Vec<Connection> {
    let mut order: Vec<u64> = Vec::new();
    let mut by_id: BTreeMap<u64, Value> = BTreeMap::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(id) = ev["id"].as_u64() else {
            continue;
        };
        let entry = by_id.entry(id).or_insert_with(|| {
            order.push(id);
            json!({ "id": id })
        });
        let Some(o) = entry.as_object_mut() else {
            continue;
        };
        match ev["event"].as_str() {
            Some("refused") => {
                o.insert("allowed".into(), json!(false));
                for k in ["method", "target", "reason", "detail"] {
                    o.insert(k.into(), ev[k].clone());
                }
            }
            Some("open") => {
                o.insert("allowed".into(), json!(true));
                for k in ["method", "host", "port", "addr"] {
                    o.insert(k.into(), ev[k].clone());
                }
                o.insert("closed".into(), json!(false));
            }
            Some("failed") => {
                o.insert("allowed".into(), json!(true));
                for k in ["method", "host", "port", "addr", "error"] {
                    o.insert(k.into(), ev[k].clone());
                }
            }
            Some("truncated") => {
                o.insert("truncated_after".into(), ev["after"].clone());
            }
            Some("close") => {
                o.insert("closed".into(), json!(true));
                o.insert("sent".into(), ev["sent"].clone());
                o.insert("received".into(), ev["received"].clone());
            }
            _ => {}
        }
    }
    order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn events_fold_into_connections() {
        let log = concat!(
            r#"{"id":1,"event":"open","method":"CONNECT","host":"a.test","port":443,"addr":"127.0.0.1:443"}"#,
            "\n",
            r#"{"id":2,"event":"refused","method":"CONNECT","target":"b.test:443","reason":"not_listed","detail":"x"}"#,
            "\n",
            r#"{"id":1,"event":"close","sent":10,"received":20}"#,
            "\n",
        );
        let c = super::merge(log);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0]["allowed"], true);
        assert_eq!(c[0]["received"], 20);
        assert_eq!(c[1]["reason"], "not_listed");
    }
}
