//! The ledger lives in its own crate (`retie-ledger`); the binary adds
//! what only the CLI needs: the test and benchmark tools (the recorder
//! of every action is `retie_dispatch::record`).

pub mod dev;

pub use retie_ledger::*;
