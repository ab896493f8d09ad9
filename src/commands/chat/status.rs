//! The status line of the interactive terminal (issue 31): one dim line
//! printed before each prompt, on a terminal only: the model, the
//! autonomy, the turn, the tokens in and out, the cost when the model has
//! a price in config, and whether an approval is pending. A line above
//! the prompt, not a bar pinned to the bottom: the line editor owns the
//! prompt's line and redraws it, and a pinned bar would need a scroll
//! region it would fight (ADR 0541).

use std::io::IsTerminal;

use retie_agent::provider::AnyProvider;
use retie_agent::session::Session;

use crate::ui::{visible, Style};

/// Whether the status line is shown: stdout and stderr both a terminal.
pub fn enabled() -> bool {
    std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

/// The line itself (without the colour, which the caller adds).
pub fn line(s: &mut Session<AnyProvider>, price: Option<(f64, f64)>) -> String {
    let u = s.usage();
    let (model, tier) = (visible(&s.config().model), s.config().tier);
    let mut parts = vec![
        format!("model {model}"),
        format!("autonomy {tier}"),
        format!("turn {}", s.turns()),
        format!("tokens {} in / {} out", u.input_tokens, u.output_tokens),
    ];
    if let Some((i, o)) = price {
        parts.push(format!(
            "${:.4}",
            u.input_tokens as f64 / 1e6 * i + u.output_tokens as f64 / 1e6 * o
        ));
    }
    parts.push(match s.pending() {
        Some(p) => format!("approval {} pending", p.pending),
        None => "no approval pending".into(),
    });
    format!("── {}", parts.join(" · "))
}

/// Print it on stderr when [`enabled`].
pub fn show(s: &mut Session<AnyProvider>, price: Option<(f64, f64)>, st: Style) {
    if enabled() {
        eprintln!("{}", st.dim(&line(s, price)));
    }
}
