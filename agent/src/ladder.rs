//! The model ladder (issue 29, ADR 0532): with no model named, a session
//! starts on the lowest tier among the models this account may call and
//! climbs only when the model in use fails: a refusal (403), a session
//! limit (a 429 that resets within hours), a model that breaks the tool
//! protocol turn after turn. Never on a guess that a task looks hard.
//! An account cap stops at once: every model of the account is out.
//!
//! Pure: the session asks it what to do, records the answer, and acts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A size anchored to a tier (`params_b` billions of parameters are tier
/// `tier`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    pub params_b: f64,
    pub tier: u32,
}

/// The default anchors: Ollama's pricing page weighs usage by model
/// size, level 1 for light models like gpt-oss:20b and level 4 for the
/// largest (deepseek, 671 B). Defaults, not a table of names: any model
/// whose size the provider states gets a tier the day it appears;
/// `[ladder] anchors` in config.toml replaces them.
pub const DEFAULT_ANCHORS: [Anchor; 2] = [
    Anchor {
        params_b: 20.0,
        tier: 1,
    },
    Anchor {
        params_b: 671.0,
        tier: 4,
    },
];

/// A model's tier from its size: log-scale interpolation (and
/// extrapolation) through the two anchors, rounded, at least 1.
/// `None` when the anchors cannot define a scale (same size, not
/// positive) or the size is not positive.
pub fn tier_of(params_b: f64, anchors: &[Anchor; 2]) -> Option<u32> {
    let [a, b] = anchors;
    if !(params_b > 0.0 && a.params_b > 0.0 && b.params_b > 0.0) || a.params_b == b.params_b {
        return None;
    }
    let x = (params_b.ln() - a.params_b.ln()) / (b.params_b.ln() - a.params_b.ln());
    let t = a.tier as f64 + x * (b.tier as f64 - a.tier as f64);
    t.is_finite().then(|| t.round().max(1.0) as u32)
}

/// Check anchors from config: two distinct positive sizes, tiers 1 or more.
pub fn check_anchors(anchors: &[Anchor]) -> Result<[Anchor; 2], String> {
    match anchors {
        [a, b] if a.params_b > 0.0
            && b.params_b > 0.0
            && a.params_b != b.params_b
            && a.tier >= 1
            && b.tier >= 1 =>
        {
            Ok([*a, *b])
        }
        _ => Err(
            "[ladder] anchors must be two entries like {params_b = 20, tier = 1}, {params_b = 671, tier = 4}: distinct positive sizes, tiers 1 or more"
                .into(),
        ),
    }
}

/// One model on the ladder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rung {
    pub model: String,
    pub tier: u32,
}

/// Why the model in use failed, as the session saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// 403: this account may not call this model.
    Refused(String),
    /// A 429 whose reset is within the session-limit window.
    SessionLimit {
        message: String,
        resets_in: Duration,
    },
    /// A weekly/monthly/quota cap (the 429 body or headers say so, or a
    /// reset farther than the session-limit window).
    AccountCap {
        message: String,
        resets_in: Option<Duration>,
    },
    /// `turns` turns in a row broke the tool protocol (malformed
    /// answers, calls with arguments that are not a JSON object, unknown
    /// tools).
    BrokeProtocol { turns: u32 },
}

impl Failure {
    /// The reason's name in the ledger.
    pub fn name(&self) -> &'static str {
        match self {
            Failure::Refused(_) => "refused",
            Failure::SessionLimit { .. } => "session_limit",
            Failure::AccountCap { .. } => "account_cap",
            Failure::BrokeProtocol { .. } => "broke_tool_protocol",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Failure::Refused(m) => format!("refused: {m}"),
            Failure::SessionLimit { message, resets_in } => format!(
                "session limit (resets in {}): {message}",
                crate::provider::http::human(*resets_in)
            ),
            Failure::AccountCap { message, .. } => format!("the account's cap: {message}"),
            Failure::BrokeProtocol { turns } => {
                format!("{turns} turns in a row broke the tool protocol")
            }
        }
    }
}

/// What the session does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Ask `to` instead, from this turn on.
    Switch {
        from: Rung,
        to: Rung,
        reason: String,
    },
    /// Stop the session with this message.
    Stop(String),
}

/// The ladder of one session.
#[derive(Debug, Clone, PartialEq)]
pub struct Ladder {
    rungs: Vec<Rung>,
    at: usize,
    /// A 429 whose reset is at most this far is a session limit; farther
    /// is the account's cap.
    pub session_limit: Duration,
    /// Turns in a row that break the tool protocol before the ladder
    /// climbs.
    pub malformed_turns: u32,
    /// Models refused during this session (to drop from the cache too).
    refused: Vec<(String, String)>,
}

impl Ladder {
    /// The callable models, each with its tier, capped at `max_tier`:
    /// ordered by tier (then as given); the session starts on the first.
    /// `Err` says why there is no ladder.
    pub fn new(mut rungs: Vec<Rung>, max_tier: Option<u32>) -> Result<Ladder, String> {
        let all = rungs.len();
        if let Some(m) = max_tier {
            rungs.retain(|r| r.tier <= m);
        }
        rungs.sort_by_key(|r| r.tier);
        if rungs.is_empty() {
            return Err(match (all, max_tier) {
                (0, _) => "no callable model with a known size: run `retie probe` (and `retie models` to see sizes), or name one with --model".into(),
                (_, Some(m)) => format!("no callable model at tier {m} or below (--max-tier {m}); raise it or name one with --model"),
                _ => "no callable model".into(),
            });
        }
        Ok(Ladder {
            rungs,
            at: 0,
            session_limit: Duration::from_secs(6 * 3600),
            malformed_turns: 3,
            refused: Vec::new(),
        })
    }

    pub fn current(&self) -> &Rung {
        &self.rungs[self.at]
    }

    pub fn rungs(&self) -> &[Rung] {
        &self.rungs
    }

    /// Models refused during the session, with the provider's message.
    pub fn refused(&self) -> &[(String, String)] {
        &self.refused
    }

    /// Read a 429's wait: a session limit within the window, else the
    /// account's cap.
    pub fn rate_limit(&self, message: &str, resets_in: Duration) -> Failure {
        if resets_in <= self.session_limit {
            Failure::SessionLimit {
                message: message.into(),
                resets_in,
            }
        } else {
            Failure::AccountCap {
                message: message.into(),
                resets_in: Some(resets_in),
            }
        }
    }

    /// The model in use failed: climb to the next model (the next tier
    /// for a session limit or a broken protocol; any other model for a
    /// refusal, which is that model's alone), or stop (the account's
    /// cap; nothing left under the cap).
    pub fn on_failure(&mut self, f: &Failure) -> Step {
        let from = self.current().clone();
        if let Failure::AccountCap { resets_in, .. } = f {
            let said = f.describe();
            let when = match resets_in {
                Some(d) => format!(" (it resets in {})", crate::provider::http::human(*d)),
                // The provider's message may say it (the 429's headers).
                None if said.contains("resets in") => String::new(),
                None => " (the provider does not say when it resets)".to_string(),
            };
            return Step::Stop(format!(
                "stopped: {said}{when}; every model of the account is out, so no other was tried"
            ));
        }
        if let Failure::Refused(m) = f {
            self.refused.push((from.model.clone(), m.clone()));
        }
        let next = self.rungs[self.at + 1..].iter().position(|r| match f {
            Failure::Refused(_) => true,
            _ => r.tier > from.tier,
        });
        match next {
            Some(i) => {
                self.at += 1 + i;
                Step::Switch {
                    from,
                    to: self.current().clone(),
                    reason: f.describe(),
                }
            }
            None => Step::Stop(format!(
                "stopped: {} on {} (tier {}), and no model is left above it on the ladder (highest tier {})",
                f.describe(),
                from.model,
                from.tier,
                self.rungs.last().map_or(0, |r| r.tier)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(m: &str, t: u32) -> Rung {
        Rung {
            model: m.into(),
            tier: t,
        }
    }

    #[test]
    fn tiers_come_from_size_on_a_log_scale_through_the_anchors() {
        let a = DEFAULT_ANCHORS;
        assert_eq!(tier_of(20.0, &a), Some(1));
        assert_eq!(tier_of(671.0, &a), Some(4));
        assert_eq!(tier_of(8.0, &a), Some(1));
        assert_eq!(tier_of(0.135, &a), Some(1));
        assert_eq!(tier_of(120.0, &a), Some(3));
        assert_eq!(tier_of(70.0, &a), Some(2));
        assert_eq!(tier_of(1000.0, &a), Some(4));
        let b = [
            Anchor {
                params_b: 8.0,
                tier: 1,
            },
            Anchor {
                params_b: 70.0,
                tier: 3,
            },
        ];
        assert_eq!(tier_of(8.0, &b), Some(1));
        assert_eq!(tier_of(70.0, &b), Some(3));
        assert_eq!(tier_of(24.0, &b), Some(2));
        assert!(check_anchors(&[b[0], b[0]]).is_err());
        assert!(check_anchors(&[b[0]]).is_err());
        assert!(check_anchors(&b).is_ok());
    }

    #[test]
    fn the_ladder_starts_lowest_climbs_on_failure_and_stops_on_a_cap() {
        let mut l = Ladder::new(
            vec![
                rung("big", 3),
                rung("small", 1),
                rung("small2", 1),
                rung("mid", 2),
            ],
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.current().model, "small");
        // A refusal is that model's: the next one, same tier allowed.
        match l.on_failure(&Failure::Refused("subscription".into())) {
            Step::Switch { to, .. } => assert_eq!(to.model, "small2"),
            s => panic!("{s:?}"),
        }
        assert_eq!(l.refused().len(), 1);
        // A session limit climbs a tier.
        let f = l.rate_limit("slow down", Duration::from_secs(3600));
        assert_eq!(f.name(), "session_limit");
        match l.on_failure(&f) {
            Step::Switch { to, .. } => assert_eq!(to.model, "mid"),
            s => panic!("{s:?}"),
        }
        // A reset days away is the account's cap: stop, say when.
        let f = l.rate_limit("limit", Duration::from_secs(3 * 86_400));
        match l.on_failure(&f) {
            Step::Stop(m) => assert!(m.contains("resets in 3 d"), "{m}"),
            s => panic!("{s:?}"),
        }
        assert_eq!(l.current().model, "mid");
        match l.on_failure(&Failure::BrokeProtocol { turns: 3 }) {
            Step::Switch { to, .. } => assert_eq!(to.model, "big"),
            s => panic!("{s:?}"),
        }
        match l.on_failure(&Failure::BrokeProtocol { turns: 3 }) {
            Step::Stop(m) => assert!(m.contains("no model is left"), "{m}"),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn max_tier_caps_the_ladder() {
        let mut l = Ladder::new(vec![rung("a", 1), rung("b", 2), rung("c", 3)], Some(2))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.rungs().len(), 2);
        let f = Failure::SessionLimit {
            message: String::new(),
            resets_in: Duration::from_secs(60),
        };
        assert!(matches!(l.on_failure(&f), Step::Switch { .. }));
        assert!(matches!(l.on_failure(&f), Step::Stop(_)));
        assert_eq!(l.current().model, "b");
        assert!(Ladder::new(vec![rung("c", 3)], Some(2)).is_err());
        assert!(Ladder::new(vec![], None).is_err());
    }
}
