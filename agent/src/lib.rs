//! retie's agent: what only the agent needs.
//!
//! - [`model`]: the conversation as the agent keeps it, independent of
//!   any wire format (messages, tool calls, usage, stream events);
//! - [`provider`]: one thin client per wire format (OpenAI-compatible chat
//!   completions, Ollama's native API, Anthropic Messages, a script of
//!   turns). Providers only speak the wire format: they never execute
//!   anything;
//! - tools and the session loop hand every tool call to `retie-dispatch`,
//!   the one chokepoint (classify, gate, plan the undo, record, execute,
//!   confirm).
//!
//! The data flows one way: model → provider → dispatch → policy → ledger
//! → runtime → ledger → provider.

pub mod catalogue;
pub mod ladder;
pub mod model;
pub mod provider;
pub mod retry;
pub mod session;
pub mod tools;

pub use model::{
    Cause, Message, ProviderError, Role, StreamEvent, ToolCall, ToolSpec, Transient, Turn,
    TurnRequest, Usage,
};
pub use provider::Provider;
