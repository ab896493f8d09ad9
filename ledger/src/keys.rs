//! Keys: the persistent user key (XDG config dir, 0600), per-session agent
//! keys, and delegations (user → session key, or parent → sub-agent key).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{hex, mkdir_private, unhex, xdg_dir, Error, Result, DOMAIN_DELEGATION};

/// `$XDG_CONFIG_HOME/retie/user.key` (else `~/.config/retie/user.key`).
pub fn user_key_path() -> Result<PathBuf> {
    Ok(xdg_dir("XDG_CONFIG_HOME", ".config")?
        .join("retie")
        .join("user.key"))
}

/// A fresh key from the OS's random source.
pub fn generate() -> Result<SigningKey> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| Error::Invalid(format!("no randomness: {e}")))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Read a key file (hex seed); refuses one readable by others.
pub fn read_key(path: &Path) -> Result<SigningKey> {
    let bad = |why: String| Error::Key {
        path: path.to_path_buf(),
        why,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!(
            "mode {:o} lets others read it; chmod 600 it",
            meta.permissions().mode() & 0o777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let bytes = unhex(text.trim()).ok_or_else(|| bad("not a hex key".into()))?;
    let seed: [u8; 32] = bytes
        .try_into()
        .map_err(|_| bad("not a 32-byte ed25519 seed".into()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Write a key file with mode 0600 (refusing to overwrite one). The key
/// appears whole or not at all: it is written and fsynced under a
/// temporary name, then linked to its name (`link` fails if the name
/// exists), so a second process that finds the file never reads it half
/// written.
pub fn write_key(path: &Path, key: &SigningKey) -> Result<()> {
    let dir = match path.parent() {
        Some(d) => {
            mkdir_private(d)?;
            d
        }
        None => Path::new("."),
    };
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| Error::Invalid(format!("no randomness: {e}")))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        hex(&nonce)
    ));
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(format!("{}\n", hex(&key.to_bytes())).as_bytes())?;
        f.sync_all()?;
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The user key, created on first use.
pub fn user_key() -> Result<SigningKey> {
    let p = user_key_path()?;
    if p.exists() {
        return read_key(&p);
    }
    let k = generate()?;
    match write_key(&p, &k) {
        Ok(()) => Ok(k),
        // Another process created it first: use theirs.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
            read_key(&p)
        }
        Err(e) => Err(e),
    }
}

/// The user's public key if a key file exists (never creates one).
pub fn user_public() -> Option<VerifyingKey> {
    let p = user_key_path().ok()?;
    read_key(&p).ok().map(|k| k.verifying_key())
}

/// The key a session signs with: derived from the user key and the session
/// id (domain-separated SHA-256 as the ed25519 seed), so it needs no file
/// of its own, and rejoining a session re-derives it. Whoever holds the
/// user key could sign for any session anyway, through a delegation; the
/// delegation, signed by the user key and recorded in the ledger, still
/// says which key acts for which session, with which effects, until when.
pub fn session_key(user: &SigningKey, session: &str) -> SigningKey {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"retie/ledger/session-key/v1\0");
    h.update(user.to_bytes());
    h.update(session.as_bytes());
    SigningKey::from_bytes(&h.finalize().into())
}

/// Where session keys of a ledger live: `LEDGER.keys/` (ledgers written
/// before session keys were derived).
pub fn session_key_dir(ledger: &Path) -> PathBuf {
    crate::sidecar(ledger, ".keys")
}

/// A delegation: `parent` lets `key` act for `session` in `workspace`,
/// with `effects`, until `not_after_ms`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Delegation {
    pub session: String,
    pub workspace: String,
    pub key: String,
    pub parent: String,
    pub effects: Vec<String>,
    pub not_after_ms: i64,
    pub sig: String,
}

impl Delegation {
    /// Make and sign one.
    pub fn issue(
        parent: &SigningKey,
        key: &VerifyingKey,
        session: &str,
        workspace: &str,
        effects: &[&str],
        not_after_ms: i64,
    ) -> Delegation {
        let mut d = Delegation {
            session: session.into(),
            workspace: workspace.into(),
            key: hex(key.as_bytes()),
            parent: hex(parent.verifying_key().as_bytes()),
            effects: effects.iter().map(|s| s.to_string()).collect(),
            not_after_ms,
            sig: String::new(),
        };
        d.sig = hex(&parent.sign(&d.digest()).to_bytes());
        d
    }

    /// What the signature covers: the domain, then each field length-
    /// prefixed (keys as raw bytes), the effect count, the expiry.
    pub fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(DOMAIN_DELEGATION);
        let key = unhex(&self.key).unwrap_or_default();
        let parent = unhex(&self.parent).unwrap_or_default();
        for f in [
            self.session.as_bytes(),
            self.workspace.as_bytes(),
            &key,
            &parent,
        ] {
            h.update((f.len() as u64).to_be_bytes());
            h.update(f);
        }
        h.update((self.effects.len() as u64).to_be_bytes());
        for e in &self.effects {
            h.update((e.len() as u64).to_be_bytes());
            h.update(e.as_bytes());
        }
        h.update(self.not_after_ms.to_be_bytes());
        h.finalize().into()
    }

    /// Check the signature against the named parent key.
    pub fn check_signature(&self) -> std::result::Result<(), String> {
        let parent = parse_key(&self.parent).ok_or("the parent key is malformed")?;
        let sig = unhex(&self.sig)
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .ok_or("the signature is malformed")?;
        parent
            .verify_strict(&self.digest(), &Signature::from_bytes(&sig))
            .map_err(|_| "its signature does not verify".to_string())
    }
}

pub fn parse_key(s: &str) -> Option<VerifyingKey> {
    let b: [u8; 32] = unhex(s)?.try_into().ok()?;
    VerifyingKey::from_bytes(&b).ok()
}

/// Save a session key next to the ledger (so `--session S` can rejoin).
pub fn save_session_key(ledger: &Path, session: &str, key: &SigningKey) -> Result<()> {
    let dir = session_key_dir(ledger);
    mkdir_private(&dir)?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    write_key(&dir.join(format!("{session}.key")), key)
}

pub fn load_session_key(ledger: &Path, session: &str) -> Result<SigningKey> {
    read_key(&session_key_dir(ledger).join(format!("{session}.key")))
}
