//! What an applied changeset did to each file, with the contents on both
//! sides, for the diffs a person reads (issue 31): after a call, in
//! `/diff` and `retie replay --diff`. Nothing here writes.
//!
//! The old side is the pre-image the apply kept (in the journal entry for
//! a small file, else in the snapshot store), the new side the content
//! the entry set, found where it still is: the workspace (read through the
//! workspace's guarded read, [`crate::write`]'s `current`, as a write's
//! "changed since it was read" check reads it) when it still holds it,
//! else the store (a later change's pre-image). There is no other read of
//! the workspace here.

use std::path::Path;

use retie_snapshot::{Hash, Journal, Node, Store, Workspace};

use crate::Error;

/// One file a changeset changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Workspace-relative path (raw: escape to show it).
    pub path: String,
    /// The content before (`None`: there was no file).
    pub before: Option<Vec<u8>>,
    /// The content after (`None`: the file was removed).
    pub after: Option<Vec<u8>>,
    /// What stands in for a side that is not a file's content: a symlink,
    /// a content no longer kept anywhere. `None` for two plain contents.
    pub note: Option<String>,
    /// A side's content is no longer kept anywhere (`retie gc`): no diff
    /// can be shown, only the note.
    pub missing: bool,
}

/// The snapshot state of `workspace` under retie's `state` directory,
/// opened to read (no recovery, no lock: nothing is changed).
pub struct Reader {
    store: Store,
    journal: Journal,
    ws: Workspace,
}

impl Reader {
    pub fn open(state: &Path, workspace: &Path) -> Result<Reader, Error> {
        let dir = state.join("snapshots");
        Ok(Reader {
            store: Store::open(&dir)?,
            journal: Journal::open(&dir)?,
            ws: Workspace::open(workspace)?,
        })
    }

    /// The files changeset `id` changed, in path order; directories left
    /// out. Without `with_after` only the old side is read (`after` is
    /// `None`): a caller pairing the pre-image with the workspace now.
    pub fn changeset(&self, id: &str, with_after: bool) -> Result<Vec<FileChange>, Error> {
        let entry = self.journal.get(id)?;
        let mut out = Vec::new();
        for step in &entry.steps {
            let is_dir = |n: &Option<Node>| matches!(n, Some(Node::Dir { .. }));
            if (is_dir(&step.before) || step.before.is_none())
                && (is_dir(&step.after) || step.after.is_none())
            {
                continue;
            }
            let mut notes = Vec::new();
            let mut missing = false;
            let before = match &step.before {
                Some(Node::File { hash, .. }) => match &step.before_content {
                    Some(b) => Some(b.clone()),
                    None => self.blob(hash, &mut notes, &mut missing, "old"),
                },
                other => self.not_a_file(other, &mut notes, "old"),
            };
            let after = match &step.after {
                _ if !with_after => None,
                Some(Node::File { hash, .. }) => {
                    self.after(&step.path, hash, &mut notes, &mut missing)
                }
                other => self.not_a_file(other, &mut notes, "new"),
            };
            out.push(FileChange {
                path: step.path.as_str().to_string(),
                before,
                after,
                note: (!notes.is_empty()).then(|| notes.join("; ")),
                missing,
            });
        }
        Ok(out)
    }

    /// The content `path` holds now in the workspace (`None`: no file, or
    /// not one that can be read here: a symlink, too large).
    pub fn now(&self, path: &str) -> Option<Vec<u8>> {
        let rel = retie_snapshot::RelPath::new(path).ok()?;
        crate::write::current(&self.ws, &rel).ok().flatten()
    }

    /// The content `hash` the store keeps (a pre-image), if it does.
    pub fn kept(&self, hash: &Hash) -> Option<Vec<u8>> {
        self.store.read(hash).ok()
    }

    /// Content `h`: in the store, else carried in a journal entry as the
    /// pre-image of a later change (small files are kept there, ADR 0408).
    fn blob(
        &self,
        h: &Hash,
        notes: &mut Vec<String>,
        missing: &mut bool,
        side: &str,
    ) -> Option<Vec<u8>> {
        let b = self.kept(h).or_else(|| {
            self.journal.entries().ok()?.into_iter().find_map(|e| {
                e.steps
                    .into_iter()
                    .find_map(|st| match (&st.before, st.before_content) {
                        (Some(Node::File { hash, .. }), Some(c)) if hash == h => Some(c),
                        _ => None,
                    })
            })
        });
        if b.is_none() {
            notes.push(format!("the {side} content is no longer kept (retie gc)"));
            *missing = true;
        }
        b
    }

    fn after(
        &self,
        path: &retie_snapshot::RelPath,
        h: &Hash,
        notes: &mut Vec<String>,
        missing: &mut bool,
    ) -> Option<Vec<u8>> {
        if let Ok(Some(now)) = crate::write::current(&self.ws, path) {
            if Hash::of(&now) == *h {
                return Some(now);
            }
        }
        self.blob(h, notes, missing, "new")
    }

    fn not_a_file(&self, n: &Option<Node>, notes: &mut Vec<String>, side: &str) -> Option<Vec<u8>> {
        match n {
            Some(Node::Symlink { target, .. }) => notes.push(format!(
                "{side}: a symlink to {}",
                retie_display::visible(target)
            )),
            Some(other) => notes.push(format!("{side}: a {}", other.kind_name())),
            None => {}
        }
        None
    }
}
