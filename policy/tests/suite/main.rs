//! All of retie-policy's integration tests, built as one binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod action_digest;
mod classify;
mod corpus;
mod gate_table;
mod inspect_rules;
mod policy_file;
mod props;
mod shell_bash;
mod shell_split;
mod trifecta;
mod url_guard;

use retie_policy::Policy;

/// The shipped policy; every test that needs one starts here.
pub fn shipped() -> Policy {
    static SHIPPED: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    SHIPPED
        .get_or_init(|| Policy::shipped().expect("the shipped policy loads"))
        .clone()
}
