//! blake3 content hashes, serialized as lowercase hex.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A blake3 hash of a file's content or a symlink's target.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// Hashes a byte slice.
    pub fn of(bytes: &[u8]) -> Hash {
        Hash(*blake3::hash(bytes).as_bytes())
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Option<Hash> {
        blake3::Hash::from_hex(s).ok().map(|h| Hash(*h.as_bytes()))
    }
}

impl From<blake3::Hash> for Hash {
    fn from(h: blake3::Hash) -> Hash {
        Hash(*h.as_bytes())
    }
}

impl TryFrom<String> for Hash {
    type Error = String;
    fn try_from(s: String) -> Result<Hash, String> {
        Hash::from_hex(&s).ok_or_else(|| format!("not a blake3 hex hash: {s:?}"))
    }
}

impl From<Hash> for String {
    fn from(h: Hash) -> String {
        h.to_hex()
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", &self.to_hex()[..16])
    }
}
