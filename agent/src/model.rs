//! The conversation, independent of any wire format.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool result, answering the call with the same id.
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    /// Text (for a tool result: the result as the model will read it).
    #[serde(default)]
    pub text: String,
    /// The assistant's tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a tool result: the tool's name (some formats need it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
}

impl Message {
    pub fn system(text: impl Into<String>) -> Message {
        Message::plain(Role::System, text)
    }
    pub fn user(text: impl Into<String>) -> Message {
        Message::plain(Role::User, text)
    }
    pub fn assistant(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls,
            ..Message::plain(Role::Assistant, text)
        }
    }
    pub fn tool_result(call: &ToolCall, text: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(call.id.clone()),
            tool_name: Some(call.name.clone()),
            ..Message::plain(Role::Tool, text)
        }
    }
    fn plain(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            text: text.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            tool_name: None,
        }
    }
}

/// A tool call as the model made it. `arguments` is what the model sent,
/// parsed leniently: `Ok` only when it is a complete JSON object; a call
/// whose arguments are not (truncated JSON, a string, cut off by a length
/// limit) is never executed: the model is told instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id, or one the client made up when it sent none.
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object, or why they are unusable.
    pub arguments: Result<serde_json::Map<String, Value>, String>,
    /// The raw argument text as received (kept for the ledger).
    pub raw_arguments: String,
}

/// A tool the model may call: name, description, JSON schema of its
/// arguments (an object schema with `additionalProperties: false`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// Tokens counted by the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// What a provider is asked for one turn.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: Option<u64>,
}

/// Something that arrived while a turn streamed (for live rendering).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Assistant text, as it comes.
    Text(String),
    /// Reasoning, shown dimmed, never sent back as assistant text.
    Reasoning(String),
    /// A tool call is complete (its arguments parsed or refused).
    ToolCall(ToolCall),
}

/// One finished turn.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Turn {
    /// The assistant's text (reasoning excluded).
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// Why it stopped, as the provider said (`stop`, `tool_calls`,
    /// `length`, `end_turn`, `max_tokens`...).
    pub stop_reason: Option<String>,
    /// True when the turn was cut off by a length limit: any tool call in
    /// it may be incomplete and is never executed.
    pub truncated: bool,
    /// The raw events/body as received, for the ledger.
    pub raw: Vec<String>,
}

/// How a provider failed: the one place a failure is classified, by the
/// provider that spoke the wire format. The session retries a
/// [`Transient`] failure (the whole turn, with backoff) and stops at
/// once on any other.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// Authentication, permission (entitlement), an invalid request, an
    /// unknown model, an exhausted quota or weekly cap: asking again
    /// cannot help. The session stops with the provider-failure code.
    #[error("the provider refused: {0}")]
    Permanent(String),
    /// The answer is not in the wire format (garbage, a line too long):
    /// asking again would get the same. Stops like `Permanent`.
    #[error("the provider's answer was malformed: {0}")]
    Malformed(String),
    /// Worth asking again: the turn is retried; what this attempt
    /// streamed is dropped.
    #[error("{0}")]
    Transient(Transient),
}

impl ProviderError {
    /// A transient failure with no wait asked.
    pub fn transient(cause: Cause, message: impl Into<String>) -> ProviderError {
        ProviderError::Transient(Transient {
            cause,
            status: None,
            message: message.into(),
            retry_after: None,
        })
    }

    /// The cause's name for the ledger (`refused`, `malformed` for the
    /// permanent ones).
    pub fn cause_name(&self) -> &'static str {
        match self {
            ProviderError::Permanent(_) => "refused",
            ProviderError::Malformed(_) => "malformed",
            ProviderError::Transient(t) => t.cause.name(),
        }
    }

    /// The HTTP status the failure was, when it was one (a permanent
    /// failure's message starts `HTTP NNN`, [`crate::provider::http::error_message`]).
    pub fn http_status(&self) -> Option<u16> {
        match self {
            ProviderError::Transient(t) => t.status,
            ProviderError::Permanent(m) | ProviderError::Malformed(m) => m
                .strip_prefix("HTTP ")
                .and_then(|r| r.get(..3))
                .and_then(|d| d.parse().ok()),
        }
    }

    /// An entitlement refusal: this model is not callable on this
    /// account (403, or Anthropic's `permission_error` event), as opposed
    /// to a wrong key (401) or the account's cap.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ProviderError::Permanent(m) if !crate::provider::http::is_quota(m)
            && (self.http_status() == Some(403) || m.starts_with("permission_error")))
    }

    /// The account's cap (weekly, monthly, quota, billing): every model
    /// of the account is out until it resets; trying another cannot help.
    pub fn is_account_cap(&self) -> bool {
        matches!(self, ProviderError::Permanent(m) if crate::provider::http::is_quota(m))
    }

    /// The provider's message, without the classification's words.
    pub fn message(&self) -> &str {
        match self {
            ProviderError::Permanent(m) | ProviderError::Malformed(m) => m,
            ProviderError::Transient(t) => &t.message,
        }
    }
}

/// A failure worth retrying, with its cause and the provider's hint.
#[derive(Debug, Clone, PartialEq)]
pub struct Transient {
    pub cause: Cause,
    /// The HTTP status, when the failure was one.
    pub status: Option<u16>,
    /// The provider's own message (plain text, capped).
    pub message: String,
    /// How long the provider asked to wait (Retry-After, reset headers).
    pub retry_after: Option<std::time::Duration>,
}

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause.describe(), self.message)
    }
}

/// Why a transient failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// An error event inside a stream that began with HTTP 200
    /// (OpenAI's error object, Anthropic's `event: error`, an Ollama
    /// error line).
    ErrorEvent,
    /// HTTP 5xx (529 overloaded included), 408, 409.
    ServerError,
    /// HTTP 429 that is a rate limit (not an exhausted quota).
    RateLimited,
    /// The connection could not be made or dropped mid-answer.
    Connection,
    /// The stream ended without its end marker (`[DONE]`,
    /// `message_stop`, `done: true`).
    CutOff,
}

impl Cause {
    /// The name recorded in the ledger.
    pub fn name(self) -> &'static str {
        match self {
            Cause::ErrorEvent => "error_event",
            Cause::ServerError => "server_error",
            Cause::RateLimited => "rate_limited",
            Cause::Connection => "connection",
            Cause::CutOff => "cut_off",
        }
    }

    /// In words, for a person.
    pub fn describe(self) -> &'static str {
        match self {
            Cause::ErrorEvent => "the provider reported an error mid-stream",
            Cause::ServerError => "the provider failed",
            Cause::RateLimited => "the provider is rate limiting",
            Cause::Connection => "the connection to the provider failed",
            Cause::CutOff => "the stream stopped before its end",
        }
    }
}
