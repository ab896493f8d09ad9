//! Showing untrusted text on a terminal.
//!
//! A command line or a file comes from the model, a repository or a web page.
//! Printed raw, its control characters can move the cursor, erase what a
//! person just read (`\r`, `\x1b[2K`), or reorder it (bidirectional
//! overrides). [`escape_for_terminal`] makes every such character visible.

use std::fmt::Write as _;

/// `text` with every character that a terminal would act on, or that a
/// person could not see, written as a visible escape: `\n`, `\r`, `\t`,
/// `\x1b` (other C0 controls and DEL as `\xNN`), C1 controls, zero-width and
/// bidirectional formatting characters as `\u{NNNN}`. Everything else,
/// including backslashes, is kept as it is, so ordinary commands read as
/// written. Pure.
///
/// ```
/// use retie_policy::escape_for_terminal;
/// assert_eq!(escape_for_terminal("ls\r# ; curl x\x1b[2K"), r"ls\r# ; curl x\x1b[2K");
/// assert_eq!(escape_for_terminal("cargo test"), "cargo test");
/// ```
pub fn escape_for_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str(r"\n"),
            '\r' => out.push_str(r"\r"),
            '\t' => out.push_str(r"\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, r"\x{:02x}", c as u32);
            }
            c if is_invisible(c) => {
                let _ = write!(out, r"\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// C1 controls, zero-width and bidirectional formatting characters, line and
/// paragraph separators, and the byte-order mark: the display crate's one
/// table (`retie_display::needs_escape`), less the C0 controls and DEL,
/// which [`escape_for_terminal`] writes its own way.
fn is_invisible(c: char) -> bool {
    (c as u32) >= 0x80 && retie_display::needs_escape(c)
}

/// Whether `text` holds a character [`escape_for_terminal`] would escape.
pub fn needs_escape(text: &str) -> bool {
    text.chars()
        .any(|c| (c as u32) < 0x20 || c as u32 == 0x7f || is_invisible(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_and_invisible_character_is_escaped() {
        for c in (0u32..0x20).chain([0x7f, 0x85, 0x9b, 0x200b, 0x202e, 0x2066, 0xfeff]) {
            let Some(c) = char::from_u32(c) else { continue };
            let s = format!("a{c}b");
            let e = escape_for_terminal(&s);
            assert!(!e.contains(c), "{c:?} -> {e:?}");
            assert!(needs_escape(&s));
        }
        assert_eq!(escape_for_terminal("a\nb\tc\x1b"), r"a\nb\tc\x1b");
        assert_eq!(escape_for_terminal("\u{202e}"), r"\u{202e}");
        assert_eq!(escape_for_terminal("héllo wörld ✓"), "héllo wörld ✓");
        assert!(!needs_escape("cargo test --workspace"));
    }
}
