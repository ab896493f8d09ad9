//! Escaping for anything shown to a person (see `retie_display`).

pub use retie_display::{shell_line, visible, visible_again, visible_line};
