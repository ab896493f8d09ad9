//! What is never bound into a sandbox, even when it lies inside a bound
//! toolchain directory: the list is data, each entry with its reason.
//!
//! Two kinds of entry:
//! - [`Where::Home`]: a path under the invoking user's home (or, for
//!   cargo's credentials, under `CARGO_HOME`). `explain` always lists it;
//!   when it lies inside a bind it is covered inside the sandbox.
//! - [`Where::Named`]: a name pattern, matched on every entry of every
//!   bound directory down to the bind's scan depth. A match is covered.
//!
//! Broad patterns (`id_*`, `*token*`) spare source code and compiled
//! modules (`id_map.rs`, `tokenize.py`): those are a toolchain's own files,
//! and covering them would break it.

/// Where an entry is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// A path relative to the home directory.
    Home(&'static str),
    /// A glob (only `*`) on file names directly in `CARGO_HOME`.
    CargoHome(&'static str),
    /// A glob on the last path components of any entry inside a bind
    /// (`a/b` matches an entry `b` inside a directory `a`).
    Named(&'static str),
}

/// One entry of the never-bound list.
#[derive(Debug, Clone, Copy)]
pub struct Secret {
    pub at: Where,
    pub reason: &'static str,
    /// Spare files that look like source code or compiled modules.
    pub spare_code: bool,
}

const fn home(p: &'static str, reason: &'static str) -> Secret {
    Secret {
        at: Where::Home(p),
        reason,
        spare_code: false,
    }
}

const fn named(p: &'static str, reason: &'static str) -> Secret {
    Secret {
        at: Where::Named(p),
        reason,
        spare_code: false,
    }
}

const fn broad(p: &'static str, reason: &'static str) -> Secret {
    Secret {
        at: Where::Named(p),
        reason,
        spare_code: true,
    }
}

const NPM: &str = "npm registry auth tokens";
const PYPI: &str = "PyPI upload credentials";
const NETRC: &str = "machine logins and passwords read by curl, git, pip and ftp";
const GITCRED: &str = "git's stored HTTPS passwords and tokens";
const SSH: &str = "SSH private keys, agent sockets and known hosts";
const GPG: &str = "GPG private keys";
const AWS: &str = "AWS access keys";
const AZURE: &str = "Azure CLI tokens";
const GCLOUD: &str = "Google Cloud credentials";
const GH: &str = "GitHub CLI OAuth token";
const DOCKER: &str = "container registry auth";
const KUBE: &str = "Kubernetes cluster credentials";

/// The never-bound list.
pub const SECRETS: &[Secret] = &[
    Secret {
        at: Where::CargoHome("credentials*"),
        reason: "crates.io and registry publish tokens (cargo login)",
        spare_code: false,
    },
    home(".npmrc", NPM),
    home(".pypirc", PYPI),
    home(".netrc", NETRC),
    home(".git-credentials", GITCRED),
    home(".ssh", SSH),
    home(".gnupg", GPG),
    home(".aws", AWS),
    home(".azure", AZURE),
    home(".config/gcloud", GCLOUD),
    home(".config/gh", GH),
    home(".docker/config.json", DOCKER),
    home(".kube", KUBE),
    // The same names wherever they sit inside a bound directory.
    named(".npmrc", NPM),
    named(".pypirc", PYPI),
    named(".netrc", NETRC),
    named("_netrc", NETRC),
    named(".git-credentials", GITCRED),
    named(".ssh", SSH),
    named(".gnupg", GPG),
    named(".aws", AWS),
    named(".azure", AZURE),
    named(".config/gcloud", GCLOUD),
    named(".config/gh", GH),
    named(".docker/config.json", DOCKER),
    named(".kube", KUBE),
    // Files named like a key or token store.
    named(
        "credentials*",
        "a credentials store (cargo, aws, gcloud and others)",
    ),
    named("*.pem", "a private key or certificate bundle"),
    named("*.key", "a private key"),
    named("*.p12", "a PKCS#12 key store"),
    named("*.pfx", "a PKCS#12 key store"),
    named("*.jks", "a Java key store"),
    named("*.keystore", "a key store"),
    named("*.kdbx", "a password database"),
    broad("id_*", "an SSH identity (id_rsa, id_ed25519, ...)"),
    broad("*token*", "a token store (gh, npm, cloud CLIs, API keys)"),
];

/// Extensions of source code and compiled modules, spared by broad patterns.
const CODE: &[&str] = &[
    "rs", "py", "pyc", "pyi", "pyo", "js", "mjs", "cjs", "ts", "mts", "d.ts", "go", "c", "h", "cc",
    "hpp", "cpp", "rb", "java", "class", "so", "html", "md", "rst", "json.gz", "map",
];

impl Secret {
    /// The entry as people write it (`~/.ssh`, `*.pem`, ...).
    pub fn pattern(&self) -> String {
        match self.at {
            Where::Home(p) => format!("~/{p}"),
            Where::CargoHome(p) => format!("$CARGO_HOME/{p}"),
            Where::Named(p) => format!("any {p} inside a bind"),
        }
    }

    /// Does an entry whose path ends in `components` (last = its own name)
    /// match this named entry? Allocates nothing: it runs on every entry
    /// of every bind on every `exec`.
    pub fn matches_name<S: AsRef<str>>(&self, components: &[S]) -> bool {
        let Where::Named(pat) = self.at else {
            return false;
        };
        let mut comps = components.iter().rev();
        for part in pat.rsplit('/') {
            match comps.next() {
                Some(c) if glob(part, c.as_ref()) => {}
                _ => return false,
            }
        }
        let name = components.last().map(AsRef::as_ref).unwrap_or_default();
        !(self.spare_code && is_code(name))
    }
}

fn is_code(name: &str) -> bool {
    CODE.iter().any(|ext| {
        name.len() > ext.len() + 1 && name.ends_with(ext) && {
            let dot = name.len() - ext.len() - 1;
            name.as_bytes()[dot] == b'.'
        }
    })
}

/// A glob with `*` only (any run of characters, including none).
pub fn glob(pat: &str, s: &str) -> bool {
    let Some((first, rest_pat)) = pat.split_once('*') else {
        return pat == s;
    };
    let Some(mut rest) = s.strip_prefix(first) else {
        return false;
    };
    let mut pieces = rest_pat.split('*').peekable();
    while let Some(piece) = pieces.next() {
        if pieces.peek().is_none() {
            return rest.ends_with(piece);
        }
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(components: &[&str]) -> bool {
        SECRETS.iter().any(|s| s.matches_name(components))
    }

    #[test]
    fn globs() {
        assert!(glob("credentials*", "credentials.toml"));
        assert!(glob("credentials*", "credentials"));
        assert!(glob("*.pem", "server.pem"));
        assert!(!glob("*.pem", "pem"));
        assert!(glob("*token*", "gh_token"));
        assert!(glob("*token*", "token"));
        assert!(!glob("id_*", "xid_rsa"));
    }

    #[test]
    fn names_match_and_code_is_spared() {
        assert!(hit(&["x", "id_rsa"]));
        assert!(hit(&["id_ed25519.pub"]));
        assert!(hit(&["deploy.pem"]));
        assert!(hit(&["credentials.toml"]));
        assert!(hit(&["api_token"]));
        assert!(hit(&["token.txt"]));
        assert!(hit(&[".config", "gh"]));
        assert!(!hit(&["gh"]));
        assert!(hit(&[".docker", "config.json"]));
        assert!(!hit(&["config.json"]));
        assert!(!hit(&["id_map.rs"]));
        assert!(!hit(&["tokenize.py"]));
        assert!(!hit(&["tokenize.cpython-311.pyc"]));
        assert!(!hit(&["rustc"]));
    }

    #[test]
    fn every_entry_has_a_reason() {
        for s in SECRETS {
            assert!(!s.reason.is_empty(), "{}", s.pattern());
        }
    }
}
