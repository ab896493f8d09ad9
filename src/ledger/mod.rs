//! The ledger lives in its own crate (`retie-ledger`); the binary adds
//! what only the CLI needs: the recorder of `sandbox exec` and the test
//! and benchmark tools.

pub mod dev;
pub mod record;

pub use retie_ledger::*;
