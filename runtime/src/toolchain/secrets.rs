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
const NPM_GLOBAL: &str =
    "a node install's global npmrc ($PREFIX/etc/npmrc: nvm, fnm): registry auth tokens";
const PIP: &str = "pip's configuration: index URLs with logins, and passwords";
const YARN: &str = "yarn's npmAuthToken and registry logins";

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
    home(".config/pip", PIP),
    home(".pip", PIP),
    home(".yarnrc.yml", YARN),
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
    named("etc/npmrc", NPM_GLOBAL),
    named("pip.conf", PIP),
    named("pip.ini", PIP),
    named(".yarnrc.yml", YARN),
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

/// Names of configuration files whose contents the scan reads (besides
/// the named entries, which are covered whatever they hold): files of
/// these names, or with these extensions, inside a bind down to its scan
/// depth, and the few known deep places (`$CARGO_HOME/git/db/*/config`).
const CONFIG_NAMES: &[&str] = &[
    "config",
    "npmrc",
    ".yarnrc",
    ".gitconfig",
    "gitconfig",
    ".condarc",
    ".env",
];
const CONFIG_EXTS: &[&str] = &[".toml", ".conf", ".cfg", ".ini"];

/// Is a file of this name one whose contents are checked?
pub fn is_config_name(name: &str) -> bool {
    CONFIG_NAMES.contains(&name)
        || CONFIG_EXTS
            .iter()
            .any(|e| name.len() > e.len() && name.ends_with(e))
}

/// The most of a configuration file that is read; a larger one is
/// covered unread (fail closed).
pub const CONFIG_MAX: u64 = 256 * 1024;

/// The credential `text` holds, if any, named for people. The forms are
/// those of the policy's `hardcoded_secret` inspection rules, read the way
/// configuration files write them (unquoted INI and npmrc values, URLs of
/// any scheme): a URL with a password in its userinfo
/// (`https://user:pass@host`), npm's `_authToken`/`_auth`/`_password`
/// and yarn's `npmAuthToken`, a `password`/`passwd`/`token`/`secret`
/// setting with a value, a PEM, OpenSSH, PGP or PuTTY private key. Values
/// that name the environment (`${NPM_TOKEN}`, `$TOKEN`) are not
/// credentials. Linear in the text; allocates one lowercase copy per line.
pub fn credential_in(text: &str) -> Option<&'static str> {
    for line in text.lines() {
        if (line.contains("-----BEGIN ") && line.contains("PRIVATE KEY"))
            || line.trim_start().starts_with("PuTTY-User-Key-File-")
        {
            return Some("a private key");
        }
        if url_with_password(line) {
            return Some("a URL with a password in it (scheme://user:password@host)");
        }
        if let Some(what) = secret_setting(line) {
            return Some(what);
        }
    }
    None
}

/// A value that is a reference to the environment, or empty.
fn is_placeholder(v: &str) -> bool {
    let v = v.trim().trim_matches(|c| c == '"' || c == '\'').trim();
    v.is_empty() || v.starts_with('$') || v.starts_with("%(")
}

fn url_with_password(line: &str) -> bool {
    let mut rest = line;
    while let Some(at) = rest.find("://") {
        let scheme_ok = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        let after = &rest[at + 3..];
        let end = after
            .find(|c: char| {
                c == '/' || c == '?' || c == '#' || c.is_whitespace() || "\"'<>`".contains(c)
            })
            .unwrap_or(after.len());
        let authority = &after[..end];
        if scheme_ok {
            if let Some((userinfo, _host)) = authority.rsplit_once('@') {
                if let Some((_user, pass)) = userinfo.split_once(':') {
                    if !is_placeholder(pass) {
                        return true;
                    }
                }
            }
        }
        rest = after;
    }
    false
}

/// `key = value` or `key: value` where the key names a credential.
fn secret_setting(line: &str) -> Option<&'static str> {
    let t = line.trim_start();
    if t.starts_with('#') || t.starts_with(';') || t.starts_with("//") && !t.contains(":_") {
        return None;
    }
    let at = t.find(['=', ':'])?;
    // npmrc scopes its keys with a registry: `//host/path/:_authToken=`.
    let (key, value) = if t.starts_with("//") {
        let eq = t.find('=')?;
        (&t[..eq], &t[eq + 1..])
    } else {
        (&t[..at], &t[at + 1..])
    };
    let key = key
        .trim()
        .trim_matches(|c| c == '"' || c == '\'')
        .to_ascii_lowercase();
    if is_placeholder(value) {
        return None;
    }
    let last = key.rsplit([':', '/']).next().unwrap_or(&key);
    if [
        "_authtoken",
        "_auth",
        "_password",
        "npmauthtoken",
        "npmauthident",
    ]
    .contains(&last)
    {
        return Some("an npm or yarn registry auth setting (_authToken, _auth, _password)");
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        return None;
    }
    let named = ["password", "passwd", "token", "secret"]
        .iter()
        .any(|w| key.split(['_', '-', '.']).any(|part| part.contains(w)));
    named.then_some("a password, token or secret setting")
}

#[cfg(test)]
mod content_tests {
    use super::*;

    #[test]
    fn credentials_in_configuration_are_recognised() {
        for (text, found) in [
            ("//registry.npmjs.org/:_authToken=npm_abcdef123456\n", true),
            ("_auth = dXNlcjpwYXNz\n", true),
            ("npmAuthToken: \"abc123\"\n", true),
            (
                "[global]\nindex-url = https://alice:s3cret@pypi.example.test/simple\n",
                true,
            ),
            ("[global]\npassword = hunter22\n", true),
            ("[registry]\ntoken = \"x\"\n", true),
            (
                "[registries.corp]\nindex = \"sparse+https://u:p4ss@crates.example.test/\"\n",
                true,
            ),
            (
                "[remote \"origin\"]\n\turl = https://bob:ghp_xyz@git.example.test/r.git\n",
                true,
            ),
            ("-----BEGIN OPENSSH PRIVATE KEY-----\n", true),
            ("[build]\njobs = 4\n", false),
            (
                "[remote \"origin\"]\n\turl = ssh://git@github.com/x/y.git\n",
                false,
            ),
            ("url = https://github.com/x/y\n", false),
            ("//registry.npmjs.org/:_authToken=${NPM_TOKEN}\n", false),
            ("password = \"\"\n", false),
            ("# token = abc\n", false),
            ("-----BEGIN CERTIFICATE-----\n", false),
            ("prefix=/home/u/.nvm/versions/node/v20\n", false),
        ] {
            assert_eq!(credential_in(text).is_some(), found, "{text:?}");
        }
    }

    #[test]
    fn config_names() {
        assert!(is_config_name("config"));
        assert!(is_config_name("config.toml"));
        assert!(is_config_name("pip.conf"));
        assert!(!is_config_name("rustc"));
        assert!(!is_config_name(".toml"));
    }
}
