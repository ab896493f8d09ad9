//! Typed payloads of what a session's provider did (issues 29, 35): each
//! failed attempt at a turn (`provider_attempt` entries), why a session
//! suspended on its provider, and how a session ended (the
//! `session_closed` payload). Written and read by this one definition.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One failed attempt at a model turn. A successful attempt is the
/// assistant `message` entry that follows (its payload says `attempt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderAttempt {
    /// The session's turn this attempt was for (1-based).
    pub turn: u32,
    /// The attempt's number within the turn (1-based).
    pub attempt: u32,
    /// `error_event`, `server_error`, `rate_limited`, `connection`,
    /// `cut_off` (transient), or `refused`, `malformed` (permanent).
    pub cause: String,
    /// Worth retrying (the cause is transient).
    pub transient: bool,
    /// The HTTP status, when the failure was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's own message (plain text, capped).
    pub message: String,
    /// What the provider asked to wait (Retry-After, reset headers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The turn is asked again after `wait_ms`.
    pub retried: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Characters of text the failed attempt streamed, dropped (never the
    /// model's answer, never sent back to it). Tool calls of a failed
    /// attempt are never complete, so none is kept or run.
    pub dropped_text_chars: u64,
}

impl ProviderAttempt {
    /// The entry's payload.
    pub fn to_payload(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    pub fn from_payload(p: &Value) -> Option<ProviderAttempt> {
        serde_json::from_value(p.clone()).ok()
    }

    /// One line for a person (control characters escaped).
    pub fn line(&self) -> String {
        let status = self
            .status
            .map(|s| format!(" (HTTP {s})"))
            .unwrap_or_default();
        let then = if self.retried {
            match self.wait_ms {
                Some(ms) => format!("retried after {:.1} s", ms as f64 / 1000.0),
                None => "retried".into(),
            }
        } else {
            "not retried".into()
        };
        retie_display::visible(&format!(
            "turn {} attempt {}: {}{}: {}; {}",
            self.turn, self.attempt, self.cause, status, self.message, then
        ))
    }
}

/// How a session ended: the payload of its `session_closed` entry, or
/// of its `suspended` entry when the provider stayed unavailable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionEnd {
    /// `finished`, `turn_budget`, `token_budget`, `time_budget`,
    /// `provider_failed`, `suspended`, `interrupted`, `failed`.
    pub outcome: String,
    /// Why, for a person.
    pub message: String,
    /// Model turns, all processes of the session.
    pub turns: u32,
}

impl SessionEnd {
    pub fn to_payload(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The end a `session_closed` (or `suspended`) payload carries;
    /// `None` for older entries (an empty payload).
    pub fn from_payload(p: &Value) -> Option<SessionEnd> {
        serde_json::from_value(p.clone()).ok()
    }

    /// The outcome in words: `finished`, `budget spent`, `provider
    /// failed`, `suspended`, `interrupted`, `failed`.
    pub fn words(&self) -> &'static str {
        outcome_words(&self.outcome)
    }
}

/// An outcome's words for a person.
pub fn outcome_words(outcome: &str) -> &'static str {
    match outcome {
        "finished" => "finished",
        "turn_budget" | "token_budget" | "time_budget" => "budget spent",
        "provider_failed" => "provider failed",
        "suspended" => "suspended",
        "interrupted" => "interrupted",
        _ => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let a = ProviderAttempt {
            turn: 2,
            attempt: 1,
            cause: "error_event".into(),
            transient: true,
            status: None,
            message: "overloaded_error: Overloaded".into(),
            retry_after_ms: None,
            retried: true,
            wait_ms: Some(1200),
            dropped_text_chars: 12,
        };
        assert_eq!(
            ProviderAttempt::from_payload(&a.to_payload()),
            Some(a.clone())
        );
        assert!(a.line().contains("retried after 1.2 s"), "{}", a.line());
        let e = SessionEnd {
            outcome: "provider_failed".into(),
            message: "HTTP 401".into(),
            turns: 1,
        };
        assert_eq!(SessionEnd::from_payload(&e.to_payload()), Some(e.clone()));
        assert_eq!(e.words(), "provider failed");
        assert_eq!(SessionEnd::from_payload(&serde_json::json!({})), None);
    }
}
