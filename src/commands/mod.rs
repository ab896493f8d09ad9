//! One module per subcommand.

pub mod changes;
pub mod chat;
pub mod demo;
pub mod gc;
pub mod generate;
pub mod helper;
pub mod lab;
pub mod log;
pub mod pending;
pub mod policy;
pub mod probe;
pub mod replay;
pub mod report;
pub mod retest;
pub mod run;
pub mod runs;
pub mod sandbox;
pub mod scope;
pub mod selftest;
pub mod sessions;
pub mod toolchain;
pub mod undo;
pub mod verify;
