//! Workspace snapshots for retie: capture what a sandboxed command changed,
//! apply it to the real workspace crash-safely, and undo it.
//!
//! The principal type is [`Changeset`], computed by [`Changeset::compute`]
//! from an overlay *upper* layer (after the command exited and the overlay
//! was unmounted) against the *lower*, the real workspace. It lists created,
//! modified, deleted, mode-changed and type-changed paths with blake3 hashes
//! of the new content and of the base the command saw; special files are
//! refused; code-running plants ([`PLANTS`]: git hooks and config wherever a
//! git dir is, `.envrc`, editors' auto-run files, setuid/setgid entries, a
//! home directory's start-up files) and protected paths are blocked.
//!
//! [`apply`] checks the base is still there (else [`Error::Conflict`], nothing
//! applied), stores the pre-image of every affected path in the
//! content-addressed [`Store`], writes a [`Journal`] entry, applies each change
//! through a temp file + fsync + rename, and marks the entry complete.
//! [`undo`] reverses any complete entry (undo of an undo is a redo), refusing
//! when a path was edited since unless forced. The agent's file tools write
//! through an overlay run and [`apply`] too (`retie_dispatch::write`): there
//! is no second write path. [`recover`] rolls back entries a crash left
//! pending.
//!
//! Every path operation on the workspace goes through the boundary guard in
//! `fsx`: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS` for the parent, `*at` calls on a single name for the
//! last component; nothing follows a symlink.
//!
//! ```no_run
//! use retie_snapshot::*;
//! # fn main() -> Result<()> {
//! # let (workspace, upper, state) = (std::path::Path::new("/w"), std::path::Path::new("/u"), std::path::Path::new("/s"));
//! let store = Store::open(state)?;
//! let journal = Journal::open(state)?;
//! let ws = Workspace::open(workspace)?;
//! recover(&ws, &store, &journal)?; // at start-up
//! let cs = Changeset::compute(workspace, upper)?;
//! let entry = apply(&cs, &ws, &store, &journal, &ApplyOptions::default())?;
//! undo(&entry.id, &ws, &store, &journal, &UndoOptions::default())?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod changeset;
mod engine;
mod error;
mod fsx;
mod gc;
mod hash;
mod journal;
mod kept;
mod manifest;
mod node;
mod pack;
pub mod plants;
mod relpath;
mod store;
mod tree;

pub use changeset::{
    plant_of_file_write, BlockReason, Blocked, Change, ChangeKind, Changeset, ComputeOptions,
    RefuseReason, Refused,
};
pub use engine::{
    apply, apply_alongside, recover, undo, ApplyOptions, DirEntryKind, RecoveryReport, UndoOptions,
    Workspace, BATCH_SYNC_FROM,
};
pub use error::{Error, Mismatch, Result};
pub use gc::{gc, GcOptions, GcReport};
pub use hash::Hash;
pub use journal::{
    new_id, Entry, EntryState, Journal, JournalLock, Op, Raced, Step, JOURNAL_VERSION,
};
pub use kept::sweep_kept;
pub use manifest::{Manifest, ManifestLine};
pub use node::Node;
pub use plants::{NotPlant, Plant, Rule, Scope, NOT_PLANTS, PLANTS};
pub use relpath::RelPath;
pub use store::Store;
