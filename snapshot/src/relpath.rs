//! Normalized workspace-relative paths.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Longest path accepted (PATH_MAX less the terminating NUL).
const MAX_PATH: usize = 4095;
/// Longest single component accepted (NAME_MAX).
const MAX_NAME: usize = 255;

/// A normalized, UTF-8, relative path inside the workspace: one or more
/// `/`-separated components, none empty, `.` or `..`, no NUL, no leading or
/// trailing `/`. The workspace root itself is never a `RelPath`.
///
/// Ordering is byte order, which puts every directory before its
/// descendants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RelPath(String);

impl RelPath {
    /// Validates and wraps `s`.
    pub fn new(s: &str) -> Result<RelPath> {
        let bad = |reason| Error::InvalidPath {
            name: s.to_owned(),
            reason,
        };
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s.len() > MAX_PATH {
            return Err(bad("too long"));
        }
        if s.starts_with('/') {
            return Err(bad("absolute"));
        }
        for c in s.split('/') {
            check_name(c).map_err(bad)?;
        }
        Ok(RelPath(s.to_owned()))
    }

    /// Validates a single directory entry name read from a directory, given
    /// as raw bytes, and appends it to `parent` (`None`: the root).
    pub fn child(parent: Option<&RelPath>, name: &[u8]) -> Result<RelPath> {
        let lossy = || String::from_utf8_lossy(name).into_owned();
        let name = std::str::from_utf8(name).map_err(|_| Error::InvalidPath {
            name: lossy(),
            reason: "not UTF-8",
        })?;
        check_name(name).map_err(|reason| Error::InvalidPath {
            name: name.to_owned(),
            reason,
        })?;
        let s = match parent {
            Some(p) => format!("{}/{}", p.0, name),
            None => name.to_owned(),
        };
        if s.len() > MAX_PATH {
            return Err(Error::InvalidPath {
                name: s,
                reason: "too long",
            });
        }
        Ok(RelPath(s))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent directory (`None` for a top-level entry).
    pub fn parent(&self) -> Option<RelPath> {
        self.0.rfind('/').map(|i| RelPath(self.0[..i].to_owned()))
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        match self.0.rfind('/') {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
    }

    /// The components in order.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Whether `self` equals `other` or lies beneath it.
    pub fn starts_with(&self, other: &RelPath) -> bool {
        self.0 == other.0
            || (self.0.len() > other.0.len()
                && self.0.starts_with(&other.0)
                && self.0.as_bytes()[other.0.len()] == b'/')
    }
}

fn check_name(c: &str) -> Result<(), &'static str> {
    if c.is_empty() {
        return Err("empty component");
    }
    if c == "." || c == ".." {
        return Err("`.` or `..` component");
    }
    if c.contains('\0') {
        return Err("NUL byte");
    }
    if c.contains('/') {
        return Err("`/` in a name");
    }
    if c.len() > MAX_NAME {
        return Err("component too long");
    }
    Ok(())
}

impl TryFrom<String> for RelPath {
    type Error = Error;
    fn try_from(s: String) -> Result<RelPath> {
        RelPath::new(&s)
    }
}

impl From<RelPath> for String {
    fn from(p: RelPath) -> String {
        p.0
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escaping_and_odd_names() {
        for bad in [
            "",
            "/etc/passwd",
            "..",
            "a/../b",
            "a/./b",
            "a//b",
            "a/",
            "./a",
            "a\0b",
        ] {
            assert!(RelPath::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(RelPath::new(&"x".repeat(256)).is_err());
        assert!(RelPath::child(None, b"..").is_err());
        assert!(RelPath::child(None, b"a/b").is_err());
        assert!(RelPath::child(None, b"\xff").is_err());
    }

    #[test]
    fn accepts_and_orders_parents_first() {
        let a = RelPath::new("a").expect("valid");
        let ab = RelPath::new("a/b").expect("valid");
        let adot = RelPath::new("a.txt").expect("valid");
        assert!(a < ab && a < adot);
        assert!(ab.starts_with(&a));
        assert!(!adot.starts_with(&a));
        assert_eq!(ab.parent(), Some(a.clone()));
        assert_eq!(ab.file_name(), "b");
        assert_eq!(a.parent(), None);
        assert_eq!(
            RelPath::child(Some(&a), b"b").expect("valid").as_str(),
            "a/b"
        );
    }
}
