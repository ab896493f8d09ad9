//! Argument schemas: one table per tool gives both the JSON schema sent to
//! the model and the strict check of what comes back.

use serde_json::{json, Map, Value};

/// The JSON type an argument must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Str,
    /// A non-negative integer.
    Int,
    Bool,
    /// An array of JSON objects (their fields checked by the tool).
    Objects,
}

impl ArgKind {
    fn name(self) -> &'static str {
        match self {
            ArgKind::Str => "string",
            ArgKind::Int => "integer",
            ArgKind::Bool => "boolean",
            ArgKind::Objects => "array",
        }
    }
    fn accepts(self, v: &Value) -> bool {
        match self {
            ArgKind::Str => v.is_string(),
            ArgKind::Int => v.as_u64().is_some(),
            ArgKind::Bool => v.is_boolean(),
            ArgKind::Objects => v.as_array().is_some_and(|a| a.iter().all(Value::is_object)),
        }
    }
}

/// One argument.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub kind: ArgKind,
    pub required: bool,
    pub description: &'static str,
}

impl Param {
    pub const fn req(name: &'static str, kind: ArgKind, description: &'static str) -> Param {
        Param {
            name,
            kind,
            required: true,
            description,
        }
    }
    pub const fn opt(name: &'static str, kind: ArgKind, description: &'static str) -> Param {
        Param {
            name,
            kind,
            required: false,
            description,
        }
    }
}

/// The JSON schema of a parameter table (`additionalProperties: false`).
pub fn to_schema(params: &[Param]) -> Value {
    let props: Map<String, Value> = params
        .iter()
        .map(|p| {
            let mut s = json!({"type": p.kind.name(), "description": p.description});
            if p.kind == ArgKind::Int {
                s["minimum"] = json!(0);
            }
            if p.kind == ArgKind::Objects {
                s["items"] = json!({"type": "object"});
            }
            (p.name.to_string(), s)
        })
        .collect();
    let required: Vec<&str> = params
        .iter()
        .filter(|p| p.required)
        .map(|p| p.name)
        .collect();
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

/// Check arguments against their table: every key known, of its type,
/// every required one present. The message says what was wrong.
pub fn check_args(params: &[Param], args: &Map<String, Value>) -> Result<(), String> {
    let mut unknown: Vec<&str> = args
        .keys()
        .filter(|k| !params.iter().any(|p| p.name == k.as_str()))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(format!(
            "unknown argument{} {} (accepted: {})",
            if unknown.len() > 1 { "s" } else { "" },
            unknown
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            params.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
        ));
    }
    for p in params {
        match args.get(p.name) {
            None | Some(Value::Null) if p.required => {
                return Err(format!("missing required argument {:?}", p.name))
            }
            Some(v) if !v.is_null() && !p.kind.accepts(v) => {
                return Err(format!(
                    "argument {:?} must be a {}, got {}",
                    p.name,
                    p.kind.name(),
                    kind_of(v)
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() => "integer",
        Value::Number(n) if n.is_i64() => "negative integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &[Param] = &[
        Param::req("path", ArgKind::Str, ""),
        Param::opt("limit", ArgKind::Int, ""),
    ];

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn unknown_missing_and_mistyped_arguments_are_refused() {
        assert!(check_args(P, &obj(json!({"path": "a"}))).is_ok());
        assert!(check_args(P, &obj(json!({"path": "a", "limit": 3}))).is_ok());
        let e = check_args(P, &obj(json!({"path": "a", "sandbox": false}))).expect_err("refused");
        assert!(e.contains("unknown argument \"sandbox\""), "{e}");
        assert!(check_args(P, &obj(json!({})))
            .expect_err("refused")
            .contains("missing"));
        assert!(check_args(P, &obj(json!({"path": 1})))
            .expect_err("refused")
            .contains("string"));
        assert!(check_args(P, &obj(json!({"path": "a", "limit": -1})))
            .expect_err("refused")
            .contains("negative"));
        assert_eq!(to_schema(P)["additionalProperties"], json!(false));
    }
}
