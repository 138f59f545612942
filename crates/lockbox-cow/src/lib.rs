//! Copy-on-write branches of a directory.
//!
//! A sandbox sees a workdir through an overlayfs mount (lower = the real workdir, upper = a
//! [`Branch`]'s `upper/`). Afterwards the branch's [`ChangeSet`] says what it would do, and
//! [`commit`] applies it to the real workdir, safely (never outside it, never through a
//! symlink, special files refused up front) and durably (staged, `syncfs`, renamed). Or the
//! branch is aborted ([`Branch::abort`]) or kept ([`Branch::keep`]) for review.
//!
//! Brief overview:
//! - [`Branch`]: `STATE/branches/<id>/{upper,work,meta.json}`; [`list`], [`abort_id`];
//! - [`ChangeSet`] / [`ChangeIter`] of [`Change`]s (`Added | Modified | Deleted |
//!   TypeChanged`); [`Branch::diff`] gives a [`FileDiff`] per path;
//! - [`commit`] with [`CommitOptions`] (`force`, `dry_run`) returns a [`CommitReport`], or
//!   [`CowError::StaleBase`] (exit code 5) when the workdir changed, since the base, at a
//!   path the branch writes (also one it wrote with what the workdir holds now); the base is
//!   taken by [`stamp_base`], the one rule branches and transactions share; a failed
//!   [`Branch::commit`] is recorded in the branch's state ([`ListedBranch::status`] says what
//!   to do);
//! - part of a branch: [`Branch::hunks`] gives a file's diff as numbered [`Hunk`]s
//!   ([`FileHunks`]); [`Branch::commit_selected`] commits a [`Selection`] (paths, and
//!   [`HunkChoice`]s: some hunks of a file) and keeps the rest in the branch; the paths it
//!   wrote get a stale-base reference of their own ([`BranchMeta::rebased`]), the others keep
//!   the branch's; [`select_hunks`] does the hunk part on a flattened snapshot (a running
//!   sandbox's commit); [`text_hunks`] / [`apply_hunks`] on two texts;
//! - a commit bound to the review it follows: [`Branch::review`] lists the changes with a
//!   [`ContentDigest`] each, [`file_review`] / [`Branch::hunks_reviewed`] a file's hunks with
//!   the digest they were made from; [`Selection::review`] ([`Reviewed`]) names what was
//!   shown and the commit refuses ([`CowError::StaleReview`]) to write anything else;
//! - for callers with their own write-ahead log (`lockbox-txn`): [`flatten`] a stack of
//!   upper layers into one, [`stage_upper`] (validate + stage, durable) returning a
//!   [`CommitPlan`], then [`apply_staged`] (redo-safe) or [`discard_staging`].
//!
//! ```no_run
//! # fn main() -> Result<(), lockbox_cow::CowError> {
//! use lockbox_cow::{Branch, CommitOptions};
//! use std::path::Path;
//! let branch = Branch::create(Path::new("/var/lib/lockbox"), Path::new("/home/me/repo"),
//!     serde_json::json!({"command": ["make"]}))?;
//! // mount -t overlay overlay -o lowerdir=/home/me/repo,upperdir={upper},workdir={work},userxattr
//! let (_upper, _work) = (branch.upper_dir(), branch.work_dir());
//! // ... run the sandbox ...
//! for change in branch.changes()? {
//!     let change = change?;
//!     // Quoted: a name with a newline or an escape sequence cannot forge a line.
//!     println!("{} {}", change.kind.letter(), lockbox_policy::name::quoted(&change.path));
//! }
//! let report = branch.commit(&CommitOptions::default())?;
//! # let _ = report; Ok(()) }
//! ```
//!
//! - snapshots ([`SnapshotStore`]): an upper captured into an immutable layer, stacked on
//!   its parent's; [`SnapshotStore::layers`] is the `lowerdir=` list of a fork.
//!
//! Not here: mounting the overlay and running processes (`lockbox-confine`, the CLI),
//! transactions over several branches and their WAL (`lockbox-txn`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use crate::branch::{abort_id, branches_dir, list, Branch, ListedBranch};
pub use crate::changes::{Change, ChangeIter, ChangeKind, ChangeSet, FileType};
pub use crate::commit::{
    commit, CommitOptions, CommitPlan, CommitReport, PlanDir, PlanOp, SkipReason, Skipped,
    STAGING_PREFIX,
};
pub use crate::diff::{file_hunks, file_review, FileDiff, FileHunks, Side, MAX_DIFF_BYTES};
pub use crate::durable::{fsync_dir, write_atomic, write_replace};
pub use crate::error::CowError;
pub use crate::hunks::{
    apply_hunks, text_hunks, Hunk, HunkLine, LineOp, NoSuchHunk, CONTEXT_LINES,
};
pub use crate::id::BranchId;
pub use crate::import::import_upper;
pub use crate::init::SandboxInit;
pub use crate::layers::{
    copy_tree, copy_view, entry_cost, flatten, restrict, DIR_MIN_COST, INODE_COST,
};
pub use crate::lock::{lock_path, WorkdirLock};
pub use crate::meta::{crc32, BranchMeta, BranchState, Rebased, Timestamp, META_FORMAT_VERSION};
pub use crate::review::{BadDigest, ContentDigest, Review, Reviewed, ReviewedChange, ReviewedPath};
pub use crate::select::{select_hunks, HunkChoice, Selection};
pub use crate::snapshot::{
    is_spare, process_hold, IncomingSnapshot, NewSnapshot, Received, SnapshotId, SnapshotLimit,
    SnapshotLimits, SnapshotMeta, SnapshotStore, SnapshotUsage, MAX_DEPTH, SNAPSHOT_FORMAT_VERSION,
    SPARE,
};
pub use crate::staged::{
    apply_staged, discard_staging, stage_upper, stage_upper_rebased, staging_exists, staging_keys,
    sweep_branch_staging,
};
pub use crate::stale::stamp_base;
pub use crate::state_dir::{default_state_dir, STATE_DIR_ENV};
pub use crate::view::View;
pub use crate::viewdiff::diff_views;

mod beneath;
mod branch;
mod changes;
mod commit;
mod data;
mod diff;
mod durable;
mod error;
mod hunks;
mod id;
mod import;
mod init;
mod layers;
mod lock;
mod meta;
mod overlay;
mod review;
mod select;
mod snapshot;
mod staged;
mod stale;
mod state_dir;
mod view;
mod viewdiff;
