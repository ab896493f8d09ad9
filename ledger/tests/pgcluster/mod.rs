//! A throwaway PostgreSQL cluster for tests (issue 32): `initdb` into a
//! temporary directory, the server listening only on a unix socket in
//! that directory (no TCP port at all), trust authentication on that
//! socket, `fsync=off` (the tests crash clients, not the server).
//!
//! PostgreSQL refuses to run as root: when the test runs as root, the
//! cluster's directory is given to uid/gid 65534 and `initdb` and
//! `postgres` run as 65534 through `setpriv` (ADR 0460); as any other
//! user they run as that user. The binaries come from `RETIE_PG_BINDIR`,
//! else `/usr/lib/postgresql/*/bin` (Debian's `postgresql` package, which
//! `.ci/run` installs); none found is a loud failure naming the fix.
//! Shared by ledger/tests and tests/it (`#[path]`), one copy.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The directory holding `initdb` and `postgres`.
pub fn bindir() -> PathBuf {
    if let Some(d) = std::env::var_os("RETIE_PG_BINDIR") {
        return PathBuf::from(d);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|b| b.join("initdb").exists() && b.join("postgres").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries: install Debian's `postgresql` package (apt-get install postgresql; .ci/run does) or set RETIE_PG_BINDIR to the directory holding initdb and postgres"
        )
    })
}

/// A running throwaway cluster; stopped and removed on drop.
pub struct Cluster {
    dir: tempfile::TempDir,
    server: Child,
    /// The socket directory.
    pub socket: PathBuf,
}

/// The uid the server runs as when we are root.
const SERVER_UID: u32 = 65534;

fn as_server(bin: &Path) -> Command {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={SERVER_UID}"),
            format!("--regid={SERVER_UID}"),
            "--clear-groups".into(),
            "--".into(),
        ])
        .arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

fn chown_to_server(p: &Path) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(p, Some(SERVER_UID), Some(SERVER_UID)).expect("chown");
    }
}

impl Cluster {
    /// initdb, start, wait until it accepts connections.
    pub fn start() -> Cluster {
        let bin = bindir();
        let dir = tempfile::Builder::new()
            .prefix("retie-pg")
            .tempdir()
            .expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let data = dir.path().join("data");
        let socket = dir.path().join("s");
        std::fs::create_dir(&socket).expect("socket dir");
        chown_to_server(dir.path());
        chown_to_server(&socket);
        let out = as_server(&bin.join("initdb"))
            .args(["-D"])
            .arg(&data)
            .args(["-U", "retie", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .expect("running initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log");
        let server = as_server(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&socket)
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=60",
            ])
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting postgres");
        let c = Cluster {
            dir,
            server,
            socket,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if c.socket.join(".s.PGSQL.5432").exists() && c.admin("postgres").is_ok() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "postgres did not start: {}",
                std::fs::read_to_string(c.dir.path().join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        c
    }

    fn admin(&self, db: &str) -> Result<postgres::Client, postgres::Error> {
        postgres::Config::new()
            .host_path(&self.socket)
            .user("retie")
            .dbname(db)
            .connect(postgres::NoTls)
    }

    /// A superuser connection to `db` (tampering, setup).
    pub fn superuser(&self, db: &str) -> postgres::Client {
        self.admin(db).expect("superuser connection")
    }

    /// A new empty database; its ledger URL.
    pub fn database(&self, name: &str) -> String {
        self.superuser("postgres")
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        self.url(name)
    }

    /// The URL of database `name` over the socket.
    pub fn url(&self, name: &str) -> String {
        let host: String = self
            .socket
            .to_str()
            .expect("utf-8 path")
            .replace('/', "%2F");
        format!("postgres://retie@{host}/{name}")
    }

    /// A URL for a socket directory where no server listens.
    pub fn dead_url(&self) -> String {
        let host = self
            .dir
            .path()
            .join("nobody-here")
            .to_str()
            .expect("utf-8 path")
            .replace('/', "%2F");
        format!("postgres://retie@{host}/ledger")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SIGINT: the server's fast shutdown.
        // SAFETY: kill with a pid of our own child and a valid signal.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGINT) };
        let _ = self.server.wait();
    }
}
