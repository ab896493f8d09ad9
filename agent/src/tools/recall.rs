//! Large tool results: the model reads a preview and a reference; `recall`
//! returns a byte range of the rest.

use std::collections::BTreeMap;

use retie_dispatch::{Error, Executor, Step, UndoPlan};
use retie_policy::Action;
use serde_json::{Map, Value};

use super::ToolOutput;

/// Bytes of a tool result the model sees before it is shortened. Measured
/// on the demo and the tests: see docs/agent.md.
pub const PREVIEW_BYTES: usize = 8 * 1024;

/// The results kept out of the transcript, by reference.
#[derive(Debug, Default)]
pub struct Recall {
    kept: BTreeMap<String, String>,
    /// How many results were shortened (for the preview-size figure).
    pub shortened: usize,
    /// How many recalls the model made.
    pub recalls: usize,
}

impl Recall {
    /// `text` as the model will read it: whole, or a preview and a
    /// reference when longer than [`PREVIEW_BYTES`].
    pub fn shorten(&mut self, text: String) -> String {
        if text.len() <= PREVIEW_BYTES {
            return text;
        }
        self.shortened += 1;
        let id = format!("r{}", self.kept.len() + 1);
        let cut = floor_char_boundary(&text, PREVIEW_BYTES);
        let out = format!(
            "{}\n[... {} more bytes not shown (total {}). Call recall with ref \"{id}\", offset {cut} to read on.]\n",
            &text[..cut],
            text.len() - cut,
            text.len()
        );
        self.kept.insert(id, text);
        out
    }

    fn get(&mut self, id: &str, offset: usize, length: usize) -> ToolOutput {
        let Some(t) = self.kept.get(id) else {
            return Err(format!("recall: no result {id:?} is kept").into());
        };
        if offset >= t.len() {
            return Err(format!(
                "recall: offset {offset} is past the end ({} bytes)",
                t.len()
            )
            .into());
        }
        let start = floor_char_boundary(t, offset);
        let end = floor_char_boundary(t, offset.saturating_add(length).min(t.len()));
        let end = if end <= start {
            t.len().min(start + 4)
        } else {
            end
        };
        let end = floor_char_boundary(t, end).max(start);
        let more = t.len() - end;
        Ok(format!(
            "{}{}",
            &t[start..end],
            if more > 0 {
                format!("\n[{more} more bytes; next offset {end}]\n")
            } else {
                "\n[end]\n".into()
            }
        ))
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The recall tool's executor.
pub(crate) struct RecallExec<'a> {
    pub recall: &'a mut Recall,
    pub args: &'a Map<String, Value>,
}

impl Executor for RecallExec<'_> {
    type Output = ToolOutput;
    fn plan(&self, _: &Action) -> UndoPlan {
        super::no_effect_plan()
    }
    fn execute(&mut self, _: &Action, step: &mut Step<'_>) -> Result<ToolOutput, Error> {
        let id = self.args.get("ref").and_then(Value::as_str).unwrap_or("");
        let off = self.args.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
        let len = self
            .args
            .get("length")
            .and_then(Value::as_u64)
            .map_or(PREVIEW_BYTES, |l| (l as usize).min(PREVIEW_BYTES));
        self.recall.recalls += 1;
        let out = self.recall.get(id, off, len);
        super::read_outcome(step, &out);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_result_is_a_preview_and_recall_reads_the_rest() {
        let mut r = Recall::default();
        let long = "x".repeat(PREVIEW_BYTES + 100);
        let s = r.shorten(long);
        assert!(s.contains("ref \"r1\""), "{s}");
        let rest = r.get("r1", PREVIEW_BYTES, 1000).unwrap_or_default();
        assert!(
            rest.starts_with(&"x".repeat(100)) && rest.contains("[end]"),
            "{rest}"
        );
        assert!(r.get("r9", 0, 1).is_err());
        assert_eq!(r.shorten("short".into()), "short");
    }
}
