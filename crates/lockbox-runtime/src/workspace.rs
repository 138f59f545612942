//! Workspace operations on a running sandbox's branch.
//!
//! - `changes`: the branch against the workdir, live.
//! - `commit`: the selected changes (and hunks of files) are applied to the workdir with the
//!   commit engine (`Branch::commit_part`: staged + applied, under the workdir lock) from a
//!   snapshot of the upper layer; the sandbox keeps running on its branch, which now agrees
//!   with the workdir on those paths (so they no longer show as changes). The paths written
//!   get a stale-base reference of their own in the branch's record, so the next commit
//!   (here, or of the branch once kept) does not mistake this one's writes for concurrent
//!   edits, while a host edit elsewhere since the sandbox began is still refused.
//! - `abort`: a mounted overlay's upper layer cannot be emptied safely, so abort stops the
//!   sandbox's processes and sessions, discards the branch and restarts the sandbox on a
//!   fresh branch (same id, policy and workdir).

use lockbox_cow::{Branch, Change, CommitOptions, CowError};
use lockbox_policy::name::quoted;

use crate::types::{CommitSummary, Selection};
use crate::RuntimeError;

pub(crate) fn cow_error(e: CowError) -> RuntimeError {
    match e {
        CowError::StaleBase { paths } => RuntimeError::Conflict {
            message: format!(
                "the workdir changed under the branch at {} (commit with force to overwrite): {}",
                if paths.len() == 1 { "this path" } else { "these paths" },
                paths
                    .iter()
                    .map(|p| quoted(p).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            paths,
        },
        CowError::BadPath { path } => RuntimeError::invalid(
            "only/exclude/hunks",
            format!("{}: not a plain relative path of the workdir, or below a directory the branch replaces", quoted(&path)),
        ),
        e => RuntimeError::Branch(e),
    }
}

/// [`cow_error`] for the `path` of a diff.
pub(crate) fn diff_error(e: CowError) -> RuntimeError {
    match e {
        CowError::BadPath { path } => RuntimeError::invalid(
            "path",
            format!(
                "{}: not a plain relative path of the workdir",
                quoted(&path)
            ),
        ),
        e => cow_error(e),
    }
}

pub(crate) fn changes(branch: &Branch) -> Result<Vec<Change>, RuntimeError> {
    Ok(branch.change_set().map_err(cow_error)?.changes().to_vec())
}

/// Commits `sel` of `branch` (see `Branch::commit_part`: the paths it writes get their own
/// stale-base reference in the branch's record, the others keep the branch's).
pub(crate) fn commit(branch: &mut Branch, sel: &Selection) -> Result<CommitSummary, RuntimeError> {
    let opts = CommitOptions {
        force: sel.force,
        dry_run: false,
        defer_removal: false,
    };
    let report = branch
        .commit_part(&sel.to_cow(), &opts)
        .map_err(cow_error)?;
    let remaining = branch.change_set().map_err(cow_error)?.len();
    Ok(CommitSummary { report, remaining })
}
