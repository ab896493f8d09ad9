//! The shipped policy, read at build time (ADR 0406): `default.toml` as
//! JSON (`OUT_DIR/shipped.json`), which `Policy::shipped` reads in a fifth
//! of the time TOML takes, and its digest (`OUT_DIR/shipped.digest`),
//! computed as `Policy::parse` computes a file's: the content as a value,
//! in the canonical encoding of `src/value.rs`, after the domain
//! separator. The test
//! `policy_file::the_shipped_policy_reads_the_same_from_json_and_toml`
//! holds the two paths to the same policy and digest.

use sha2::{Digest, Sha256};

#[allow(dead_code)]
#[path = "src/value.rs"]
mod value;

/// As `POLICY_DOMAIN` in src/policy.rs.
const POLICY_DOMAIN: &[u8] = b"retie.policy.v2\0";

fn main() {
    println!("cargo::rerun-if-changed=default.toml");
    println!("cargo::rerun-if-changed=src/value.rs");
    let text = match std::fs::read_to_string("default.toml") {
        Ok(t) => t,
        Err(e) => fail(&format!("reading policy/default.toml: {e}")),
    };
    let raw: toml::Value = match toml::from_str(&text) {
        Ok(v) => v,
        Err(e) => fail(&format!("policy/default.toml: {e}")),
    };
    let json = match serde_json::to_value(&raw) {
        Ok(v) => v,
        Err(e) => fail(&format!("policy/default.toml as JSON: {e}")),
    };
    let Some(value) = value::Value::from_json(&json) else {
        fail("policy/default.toml: a number is not finite");
    };
    let mut bytes = Vec::new();
    value.encode(&mut bytes);
    let mut h = Sha256::new();
    h.update(POLICY_DOMAIN);
    h.update(&bytes);
    let digest: [u8; 32] = h.finalize().into();
    let Some(out) = std::env::var_os("OUT_DIR").map(std::path::PathBuf::from) else {
        fail("OUT_DIR is not set");
    };
    // The rules' examples stay out of the JSON: `Policy::shipped` trusts
    // the rules it reads and never looks at them (they are checked where
    // the TOML is read in full, by `Policy::parse` and the test above),
    // and they were a third of the text it parsed at every start.
    let mut json = json;
    if let Some(rules) = json.get_mut("rules").and_then(|r| r.as_array_mut()) {
        for rule in rules {
            if let Some(rule) = rule.as_object_mut() {
                rule.remove("examples");
            }
        }
    }
    let written = std::fs::write(out.join("shipped.json"), json.to_string())
        .and_then(|()| std::fs::write(out.join("shipped.digest"), digest));
    if let Err(e) = written {
        fail(&format!(
            "writing the shipped policy to {}: {e}",
            out.display()
        ));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("retie-policy build: {why}");
    std::process::exit(1)
}
