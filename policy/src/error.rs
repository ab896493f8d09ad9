//! The one error type of this crate.
//!
//! Decisions (run / ask / deny, allowed / refused) are not errors: they are
//! values ([`crate::Decision`], [`crate::urlguard::Refusal`]). An [`Error`] means
//! the input itself could not be read: a policy file that does not parse, an
//! action that is not well formed, a shell line that does not tokenize, or an
//! approval that does not match what is about to run.

use crate::action::Digest;

/// Everything that can go wrong while reading the inputs this crate is given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The policy text is not valid TOML, or does not fit the policy schema
    /// (this includes unknown keys, which are rejected rather than ignored).
    #[error("policy line {line}, column {column}: {problem}")]
    PolicySyntax {
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What is wrong, in the parser's words.
        problem: String,
    },

    /// The policy parses but says something inconsistent or invalid.
    #[error("policy line {line}: {what}: {problem}")]
    PolicyInvalid {
        /// 1-based line of the item at fault (0 when it has no position).
        line: usize,
        /// The item at fault, e.g. `tool "bash"` or `rule "aws-access-key"`.
        what: String,
        /// What is wrong and, where possible, how to fix it.
        problem: String,
    },

    /// An action could not be read (bad JSON, arguments not an object, ...).
    #[error("action is not well formed: {problem}")]
    ActionInvalid {
        /// What is wrong.
        problem: String,
    },

    /// A digest string is not 64 hex digits.
    #[error("not a digest: expected 64 hex digits, got {got:?}")]
    DigestSyntax {
        /// The text that was given.
        got: String,
    },

    /// The action about to run is not the action that was approved.
    #[error("refusing to execute: approved digest {approved} but the action's digest is {actual}")]
    DigestMismatch {
        /// What the person approved.
        approved: Digest,
        /// What is about to run.
        actual: Digest,
    },

    /// A shell command line could not be split (unterminated quote, ...).
    #[error("shell command, character {offset}: {problem}")]
    ShellSyntax {
        /// 0-based character offset in the command line.
        offset: usize,
        /// What is wrong.
        problem: String,
    },
}
