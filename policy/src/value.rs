//! Frozen, JSON-like argument values and their canonical encoding.
//!
//! A [`Value`] has no mutating methods and its containers are private, so once
//! an [`crate::Action`] holds its arguments nothing can change them between the
//! approval prompt and execution. Object keys are kept sorted (a `BTreeMap`),
//! which makes the canonical encoding independent of the order keys arrived in.

use std::collections::BTreeMap;
use std::fmt;

/// An immutable JSON-like value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// An integer that fits in `i64`.
    Int(i64),
    /// An integer above `i64::MAX` (only ever used for those).
    UInt(u64),
    /// A finite floating point number (JSON has no NaN or infinity).
    Float(f64),
    /// A string.
    Str(String),
    /// An array, frozen.
    Array(Frozen<Vec<Value>>),
    /// An object with sorted keys, frozen.
    Object(Frozen<BTreeMap<String, Value>>),
}

/// A container that can be read but not changed: it derefs to `&T` only.
#[derive(Debug, Clone, PartialEq)]
pub struct Frozen<T>(T);

impl<T> Frozen<T> {
    /// Freeze a value.
    pub fn new(inner: T) -> Self {
        Frozen(inner)
    }
}

impl<T> std::ops::Deref for Frozen<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl Value {
    /// Convert from `serde_json`, refusing non-finite floats.
    pub fn from_json(json: &serde_json::Value) -> Option<Value> {
        Some(match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::Int(i)
                } else if let Some(u) = n.as_u64() {
                    Value::UInt(u)
                } else {
                    let f = n.as_f64()?;
                    if !f.is_finite() {
                        return None;
                    }
                    Value::Float(f)
                }
            }
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Array(items) => Value::Array(Frozen(
                items
                    .iter()
                    .map(Value::from_json)
                    .collect::<Option<Vec<_>>>()?,
            )),
            serde_json::Value::Object(map) => {
                let mut out = BTreeMap::new();
                for (k, v) in map {
                    out.insert(k.clone(), Value::from_json(v)?);
                }
                Value::Object(Frozen(out))
            }
        })
    }

    /// Convert to `serde_json` (for printing).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::UInt(u) => serde_json::Value::from(*u),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(Value::to_json).collect())
            }
            Value::Object(map) => serde_json::Value::Object(
                map.iter().map(|(k, v)| (k.clone(), v.to_json())).collect(),
            ),
        }
    }

    /// Build an object value from pairs (later duplicates win).
    pub fn object<I, K>(pairs: I) -> Value
    where
        I: IntoIterator<Item = (K, Value)>,
        K: Into<String>,
    {
        Value::Object(Frozen(
            pairs.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        ))
    }

    /// Build an array value.
    pub fn array<I: IntoIterator<Item = Value>>(items: I) -> Value {
        Value::Array(Frozen(items.into_iter().collect()))
    }

    /// The string inside, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The field `key`, if this is an object that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(map) => map.get(key),
            _ => None,
        }
    }

    /// Append the canonical encoding of this value to `out`.
    ///
    /// The encoding is a tag byte followed by a fixed-width or
    /// length-prefixed payload, so it is injective: two different values
    /// never encode to the same bytes (the property tests check this).
    /// Floats are encoded by their IEEE-754 bits, so `0.0` and `-0.0` differ.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.push(b'n'),
            Value::Bool(false) => out.push(b'f'),
            Value::Bool(true) => out.push(b't'),
            Value::Int(i) => {
                out.push(b'i');
                out.extend_from_slice(&i.to_be_bytes());
            }
            Value::UInt(u) => {
                out.push(b'u');
                out.extend_from_slice(&u.to_be_bytes());
            }
            Value::Float(f) => {
                out.push(b'd');
                out.extend_from_slice(&f.to_bits().to_be_bytes());
            }
            Value::Str(s) => {
                out.push(b's');
                encode_bytes(s.as_bytes(), out);
            }
            Value::Array(items) => {
                out.push(b'a');
                encode_len(items.len(), out);
                for item in items.iter() {
                    item.encode(out);
                }
            }
            Value::Object(map) => {
                out.push(b'o');
                encode_len(map.len(), out);
                for (k, v) in map.iter() {
                    encode_bytes(k.as_bytes(), out);
                    v.encode(out);
                }
            }
        }
    }
}

/// Append a length as 8 big-endian bytes.
pub(crate) fn encode_len(len: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&(len as u64).to_be_bytes());
}

/// Append a length-prefixed byte string.
pub(crate) fn encode_bytes(bytes: &[u8], out: &mut Vec<u8>) {
    encode_len(bytes.len(), out);
    out.extend_from_slice(bytes);
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_json())
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
