//! Escaping for anything shown to a person (see `retie_ledger::display`).

pub use retie_ledger::display::{shell_line, visible, visible_line};
