//! The policy parser must return Ok or a typed error for any text, never
//! panic, and a policy that loads must have a stable digest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use retie_policy::Policy;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = Policy::parse(text) {
            let again = Policy::parse(text).map(|q| q.digest());
            assert_eq!(again.ok(), Some(p.digest()));
        }
    }
});
