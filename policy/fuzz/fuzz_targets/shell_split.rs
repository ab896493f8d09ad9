//! The shell splitter must return Ok or a typed error for any line, never
//! panic or overflow the stack; the prefix rules must not panic on its output.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use retie_policy::{shell::split, Policy};

static POLICY: OnceLock<Option<Policy>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        if let Ok(parsed) = split(line) {
            if let Some(p) = POLICY.get_or_init(|| Policy::shipped().ok()) {
                let _ = p.shell_rules().coverage(&parsed);
                let _ = p.shell_rules().denied(&parsed);
            }
            for c in &parsed.commands {
                let _ = c.to_string();
            }
        }
    }
});
