//! Filesystem profiles: which parts of the host a sandbox sees, read-only,
//! and the floor of kernel features it refuses to run below.
//!
//! Profiles are TOML files (see `rootfs/host.toml`, compiled in as the
//! default). Unknown keys are errors, so a typo never silently weakens a
//! sandbox.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

/// The default profile, compiled in from `rootfs/host.toml`.
pub const HOST_PROFILE_TOML: &str = include_str!("../../rootfs/host.toml");

/// The same, converted to JSON at build time (build.rs): what
/// [`Profile::host`] reads.
const HOST_PROFILE_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/host-profile.json"));

/// A parsed, validated filesystem profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name, e.g. `host`.
    pub name: String,
    /// One line saying what the profile is for.
    #[serde(default)]
    pub description: String,
    /// Landlock requirements.
    pub landlock: LandlockReq,
    /// What of the host filesystem is visible.
    pub filesystem: Filesystem,
    /// Resource limits for the command.
    #[serde(default)]
    pub limits: Limits,
    /// Which host toolchains the sandbox sees (see `crate::toolchain`).
    #[serde(default)]
    pub toolchain: ToolchainSection,
}

/// The `[toolchain]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolchainSection {
    /// `["auto"]` (the default), `["none"]`, or names: `rust`, `python`,
    /// `node`, `go`, `local-bin`. `--toolchain` on the command line wins.
    #[serde(rename = "use", default = "auto")]
    pub use_: Vec<String>,
}

impl Default for ToolchainSection {
    fn default() -> Self {
        ToolchainSection { use_: auto() }
    }
}

fn auto() -> Vec<String> {
    vec!["auto".into()]
}

/// The Landlock floor a profile demands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockReq {
    /// Minimum Landlock ABI; retie refuses to run below it.
    pub min_abi: i32,
}

/// The filesystem view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    /// Host paths bound read-only at the same path; must exist.
    pub ro: Vec<PathBuf>,
    /// Host paths bound read-only if they exist.
    #[serde(default)]
    pub ro_optional: Vec<PathBuf>,
    /// Names under the host's /etc bound read-only if they exist.
    #[serde(default)]
    pub etc: Vec<String>,
    /// Fresh writable tmpfs directories.
    #[serde(default)]
    pub tmpfs: Vec<PathBuf>,
    /// The size cap, in MiB, of each writable tmpfs: `$HOME`, every
    /// `tmpfs` entry, and the toolchains' throwaway directories. Without a
    /// cap a tmpfs may take half the machine's memory, each. Issue 26,
    /// item 7; ADR 0418.
    #[serde(default = "default_tmpfs_size_mib")]
    pub tmpfs_size_mib: u64,
    /// The size cap of `/dev/shm`, in MiB.
    #[serde(default = "default_shm_size_mib")]
    pub shm_size_mib: u64,
}

/// The default cap of each writable tmpfs (MiB).
pub const DEFAULT_TMPFS_SIZE_MIB: u64 = 256;
/// The default cap of `/dev/shm` (MiB).
pub const DEFAULT_SHM_SIZE_MIB: u64 = 64;
/// The largest cap a profile may ask for (MiB): 1 TiB.
const MAX_TMPFS_SIZE_MIB: u64 = 1 << 20;

fn default_tmpfs_size_mib() -> u64 {
    DEFAULT_TMPFS_SIZE_MIB
}
fn default_shm_size_mib() -> u64 {
    DEFAULT_SHM_SIZE_MIB
}

impl Filesystem {
    /// The `size=` option of a writable tmpfs mount.
    pub fn tmpfs_size(&self) -> String {
        format!("{}m", self.tmpfs_size_mib)
    }
    /// The `size=` option of `/dev/shm`.
    pub fn shm_size(&self) -> String {
        format!("{}m", self.shm_size_mib)
    }
}

/// `setrlimit` values (soft = hard) for the command; `None` = inherited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// RLIMIT_AS, bytes.
    pub address_space: Option<u64>,
    /// RLIMIT_CORE, bytes.
    pub core: Option<u64>,
    /// RLIMIT_CPU, seconds.
    pub cpu: Option<u64>,
    /// RLIMIT_FSIZE, bytes.
    pub fsize: Option<u64>,
    /// RLIMIT_NOFILE.
    pub nofile: Option<u64>,
    /// RLIMIT_NPROC: processes and threads of the sandbox's user. The
    /// kernel counts them per user namespace (ucounts), so the cap is the
    /// sandbox's own, as root and as any user (ADR 0418).
    pub nproc: Option<u64>,
    /// A memory limit, MiB. Needs a cgroup v2 subtree per sandbox, which
    /// retie does not build yet: a profile that asks for one is refused
    /// when it loads (fail closed, ADR 0418).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
}

/// Names under /etc that are synthesized and must never come from the host.
const SYNTHESIZED_ETC: &[&str] = &["passwd", "group", "hosts", "hostname", "resolv.conf"];

/// Paths a profile may never expose, even read-only.
const FORBIDDEN: &[&str] = &[
    "/",
    "/home",
    "/root",
    "/mnt",
    "/media",
    "/run",
    "/run/user",
    "/var",
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/tmp",
];

impl Profile {
    /// The built-in `host` profile.
    pub fn host() -> Result<Profile> {
        const ORIGIN: &str = "rootfs/host.toml (built in)";
        let profile: Profile =
            serde_json::from_str(HOST_PROFILE_JSON).map_err(|e| RuntimeError::Profile {
                path: ORIGIN.into(),
                reason: format!("its build-time JSON: {e}"),
            })?;
        profile.validate(ORIGIN)?;
        Ok(profile)
    }

    /// Load by name (`host`) or from a TOML file path.
    pub fn load(name_or_path: &str) -> Result<Profile> {
        if name_or_path == "host" {
            return Self::host();
        }
        if !name_or_path.contains('/') && !name_or_path.ends_with(".toml") {
            return Err(RuntimeError::Profile {
                path: name_or_path.to_string(),
                reason:
                    "no built-in profile of that name (built in: host); give a path to a .toml file"
                        .into(),
            });
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| RuntimeError::Profile {
            path: name_or_path.to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, name_or_path)
    }

    /// Parse and validate profile text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Profile> {
        let profile: Profile = toml::from_str(text).map_err(|e| RuntimeError::Profile {
            path: origin.to_string(),
            reason: e.to_string().trim_end().to_string(),
        })?;
        profile.validate(origin)?;
        Ok(profile)
    }

    fn validate(&self, origin: &str) -> Result<()> {
        let bad = |reason: String| RuntimeError::Profile {
            path: origin.to_string(),
            reason,
        };
        if self.landlock.min_abi < 1 {
            return Err(bad(format!(
                "landlock.min_abi = {} but retie never runs without Landlock (minimum 1)",
                self.landlock.min_abi
            )));
        }
        for (key, mib) in [
            ("filesystem.tmpfs_size_mib", self.filesystem.tmpfs_size_mib),
            ("filesystem.shm_size_mib", self.filesystem.shm_size_mib),
        ] {
            // size=0 would mean "no limit" to tmpfs.
            if mib == 0 || mib > MAX_TMPFS_SIZE_MIB {
                return Err(bad(format!(
                    "{key} = {mib}: a tmpfs cap must be 1 to {MAX_TMPFS_SIZE_MIB} MiB (0 would mean no cap)"
                )));
            }
        }
        if let Some(mib) = self.limits.memory_mib {
            return Err(bad(format!(
                "limits.memory_mib = {mib} cannot be applied: a memory limit needs a cgroup v2 subtree per sandbox (a delegated one as a user), which retie does not build yet (ADR 0418; `retie selftest` says what this host offers). Remove the key; cap what a sandbox can hold with filesystem.tmpfs_size_mib, filesystem.shm_size_mib, limits.nproc and limits.address_space (RLIMIT_AS, per process)"
            )));
        }
        if self.limits.nproc == Some(0) {
            return Err(bad(
                "limits.nproc = 0 would let the command start nothing".into()
            ));
        }
        crate::toolchain::Selection::parse(&self.toolchain.use_)
            .map_err(|e| bad(format!("toolchain.use: {e}")))?;
        let fs = &self.filesystem;
        for p in fs.ro.iter().chain(&fs.ro_optional).chain(&fs.tmpfs) {
            if !p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(bad(format!(
                    "{}: paths must be absolute and must not contain `..`",
                    p.display()
                )));
            }
        }
        for p in fs.ro.iter().chain(&fs.ro_optional) {
            if FORBIDDEN.iter().any(|f| Path::new(f) == p)
                || p.starts_with("/home")
                || p.starts_with("/root")
                || p.starts_with("/run/user")
            {
                return Err(bad(format!(
                    "{} may not be exposed to a sandbox (it holds people's files or the host's live state)",
                    p.display()
                )));
            }
        }
        for name in &fs.etc {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(bad(format!(
                    "etc entry `{name}` must be a single name under /etc"
                )));
            }
            if SYNTHESIZED_ETC.contains(&name.as_str()) {
                return Err(bad(format!(
                    "etc entry `{name}` is synthesized by retie and cannot come from the host"
                )));
            }
            if name == "shadow" || name == "gshadow" || name == "sudoers" {
                return Err(bad(format!(
                    "etc entry `{name}` holds credentials and may not be exposed"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Profile::host` reads the JSON build.rs made of `rootfs/host.toml`:
    /// the same profile as parsing the TOML itself.
    #[test]
    fn the_built_in_profile_reads_the_same_from_json_and_toml() {
        let from_json = Profile::host().expect("host profile");
        let from_toml = Profile::parse(HOST_PROFILE_TOML, "host.toml").expect("host.toml");
        assert_eq!(from_json, from_toml);
    }

    #[test]
    fn builtin_host_profile_parses() {
        let p = Profile::host().expect("host profile");
        assert_eq!(p.name, "host");
        assert!(p.landlock.min_abi >= 1);
        assert!(p.filesystem.ro.contains(&PathBuf::from("/usr")));
    }

    #[test]
    fn unknown_key_is_an_error() {
        let text = HOST_PROFILE_TOML.replace("[limits]", "[limits]\nnofiles = 3");
        let err = Profile::parse(&text, "t").expect_err("typo must fail");
        assert!(err.to_string().contains("nofiles"), "{err}");
    }

    /// Issue 26, item 7: the built-in profile caps every tmpfs; a cap of 0
    /// (no cap to tmpfs) and a memory limit retie cannot apply are refused.
    #[test]
    fn tmpfs_caps_default_small_and_limits_that_cannot_hold_are_refused() {
        let p = Profile::host().expect("host profile");
        assert_eq!(p.filesystem.tmpfs_size_mib, DEFAULT_TMPFS_SIZE_MIB);
        assert_eq!(p.filesystem.shm_size_mib, DEFAULT_SHM_SIZE_MIB);
        assert_eq!(p.filesystem.tmpfs_size(), "256m");
        assert!(p.limits.nproc.is_some_and(|n| n > 0));
        let no_keys = HOST_PROFILE_TOML
            .replace("tmpfs_size_mib = 256\n", "")
            .replace("shm_size_mib = 64\n", "");
        let q = Profile::parse(&no_keys, "t").expect("defaults");
        assert_eq!(q.filesystem.tmpfs_size_mib, DEFAULT_TMPFS_SIZE_MIB);
        assert_eq!(q.filesystem.shm_size_mib, DEFAULT_SHM_SIZE_MIB);
        for (from, to) in [
            ("tmpfs_size_mib = 256", "tmpfs_size_mib = 0"),
            ("shm_size_mib = 64", "shm_size_mib = 0"),
            ("tmpfs_size_mib = 256", "tmpfs_size_mib = 2000000"),
        ] {
            let text = HOST_PROFILE_TOML.replace(from, to);
            let err = Profile::parse(&text, "t").expect_err(to);
            assert!(err.to_string().contains("no cap"), "{err}");
        }
        let text = HOST_PROFILE_TOML.replace("[limits]", "[limits]\nmemory_mib = 512");
        let err = Profile::parse(&text, "t").expect_err("memory limit");
        assert!(err.to_string().contains("cgroup v2"), "{err}");
    }

    #[test]
    fn home_cannot_be_exposed() {
        let text = HOST_PROFILE_TOML.replace("ro = [\"/usr\"]", "ro = [\"/usr\", \"/home/alice\"]");
        let err = Profile::parse(&text, "t").expect_err("home must be refused");
        assert!(err.to_string().contains("/home/alice"), "{err}");
    }

    #[test]
    fn synthesized_etc_cannot_come_from_host() {
        let text = HOST_PROFILE_TOML.replace("\"alternatives\",", "\"alternatives\", \"passwd\",");
        let err = Profile::parse(&text, "t").expect_err("passwd must be refused");
        assert!(err.to_string().contains("synthesized"), "{err}");
    }

    /// Every entry of the refused lists, not a sample: each path in
    /// FORBIDDEN and beneath the personal trees, exposed as `ro` and as
    /// `ro_optional`, and every refused /etc name.
    #[test]
    fn every_refused_path_and_etc_name_is_refused() {
        let under = [
            "/home/alice",
            "/home/alice/.ssh",
            "/root/.cargo",
            "/run/user/1000",
        ];
        for p in FORBIDDEN.iter().chain(under.iter()) {
            for (key, from, to) in [
                ("ro", "ro = [\"/usr\"]", format!("ro = [\"/usr\", \"{p}\"]")),
                (
                    "ro_optional",
                    "ro_optional = [\"/bin\",",
                    format!("ro_optional = [\"{p}\", \"/bin\","),
                ),
            ] {
                let text = HOST_PROFILE_TOML.replace(from, &to);
                assert_ne!(text, HOST_PROFILE_TOML, "the test did not place {p}");
                let err = Profile::parse(&text, "t").expect_err(p);
                assert!(
                    err.to_string().contains("may not be exposed"),
                    "{key} {p}: {err}"
                );
            }
        }
        for name in SYNTHESIZED_ETC
            .iter()
            .chain(["shadow", "gshadow", "sudoers", "../shadow", "a/b"].iter())
        {
            let text = HOST_PROFILE_TOML.replace(
                "\"alternatives\",",
                &format!("\"alternatives\", \"{name}\","),
            );
            assert!(
                Profile::parse(&text, "t").is_err(),
                "etc entry {name} accepted"
            );
        }
    }

    #[test]
    fn toolchain_section_is_checked() {
        assert_eq!(Profile::host().expect("host").toolchain.use_, vec!["auto"]);
        let text = HOST_PROFILE_TOML.replace("use = [\"auto\"]", "use = [\"rust\", \"node\"]");
        let p = Profile::parse(&text, "t").expect("names");
        assert_eq!(p.toolchain.use_, vec!["rust", "node"]);
        let bad = text.replace("\"node\"", "\"ruby\"");
        let err = Profile::parse(&bad, "t").expect_err("unknown name");
        assert!(err.to_string().contains("ruby"), "{err}");
        let typo = text.replace("use =", "uses =");
        let err = Profile::parse(&typo, "t").expect_err("unknown key");
        assert!(err.to_string().contains("uses"), "{err}");
    }

    #[test]
    fn zero_landlock_floor_refused() {
        let text = HOST_PROFILE_TOML.replace("min_abi = 1", "min_abi = 0");
        assert!(Profile::parse(&text, "t").is_err());
    }
}
