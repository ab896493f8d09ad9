//! One module per subcommand.

pub mod changes;
pub mod helper;
pub mod lab;
pub mod policy;
pub mod probe;
pub mod sandbox;
pub mod selftest;
