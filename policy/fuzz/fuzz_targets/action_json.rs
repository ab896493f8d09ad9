//! Reading an action from JSON must never panic, and its digest must survive
//! a JSON round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use retie_policy::Action;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(a) = Action::from_json(text) {
            let b = Action::from_json(&a.to_json().to_string()).expect("round trip parses");
            assert_eq!(a.digest(), b.digest());
        }
    }
});
