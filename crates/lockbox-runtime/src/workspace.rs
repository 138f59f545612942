//! Workspace operations on a running sandbox's branch.
//!
//! - `changes`: the branch against the workdir, live.
//! - `commit`: the selected changes (and hunks of files: `lockbox_cow::select_hunks`) are applied to the workdir with the commit engine
//!   (staged + applied, under the workdir lock) from a snapshot of the upper layer; the
//!   sandbox keeps running on its branch, which now agrees with the workdir on those paths
//!   (so they no longer show as changes). The stale-base reference then moves to the
//!   commit, so the next commit does not mistake this one's writes for concurrent edits.
//! - `abort`: a mounted overlay's upper layer cannot be emptied safely, so abort stops the
//!   sandbox's processes and sessions, discards the branch and restarts the sandbox on a
//!   fresh branch (same id, policy and workdir).

use lockbox_cow::{
    apply_staged, discard_staging, flatten, restrict, select_hunks, stage_upper, Branch, Change,
    ChangeSet, CommitOptions, CowError, Timestamp, WorkdirLock,
};
use lockbox_policy::name::quoted;
use std::path::Path;

use crate::types::{CommitSummary, Selection};
use crate::RuntimeError;

pub(crate) fn cow_error(e: CowError) -> RuntimeError {
    match e {
        CowError::StaleBase { paths } => RuntimeError::Conflict(format!(
            "the workdir changed under the branch at {} (commit with force to overwrite): {}",
            if paths.len() == 1 { "this path" } else { "these paths" },
            paths
                .iter()
                .map(|p| quoted(p).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        CowError::BadPath { path } => RuntimeError::invalid(
            "only/exclude/hunks",
            format!("{}: not a plain relative path of the workdir, or below a directory the branch replaces", quoted(&path)),
        ),
        e => RuntimeError::Branch(e),
    }
}

pub(crate) fn changes(branch: &Branch) -> Result<Vec<Change>, RuntimeError> {
    Ok(branch.change_set().map_err(cow_error)?.changes().to_vec())
}

/// Commits `sel` of `branch`; returns the summary and the new stale-base reference.
pub(crate) fn commit(
    state_dir: &Path,
    branch: &Branch,
    base: Option<Timestamp>,
    sel: &Selection,
) -> Result<(CommitSummary, Timestamp), RuntimeError> {
    let workdir = branch.workdir().to_owned();
    let _lock = WorkdirLock::acquire(state_dir, &workdir).map_err(cow_error)?;
    // A snapshot of the upper layer, narrowed to the selection.
    let snap = branch
        .dir()
        .join(format!("commit-{}", crate::util::random_id()));
    std::fs::create_dir(&snap).map_err(RuntimeError::internal)?;
    let result = (|| {
        flatten(&[branch.upper_dir()], &snap).map_err(cow_error)?;
        let cow = sel.to_cow();
        select_hunks(&snap, &workdir, &cow.hunks).map_err(cow_error)?;
        restrict(&snap, &cow.only_paths(), &cow.exclude).map_err(cow_error)?;
        let key = format!("rt-{}", crate::util::random_id());
        let opts = CommitOptions {
            force: sel.force,
            dry_run: false,
            defer_removal: false,
        };
        let (plan, report) = stage_upper(&snap, &workdir, &key, base, &opts).map_err(cow_error)?;
        if let Err(e) = apply_staged(&workdir, &key, &plan) {
            let _ = discard_staging(&workdir, &key);
            return Err(cow_error(e));
        }
        Ok(report)
    })();
    let _ = std::fs::remove_dir_all(&snap);
    let report = result?;
    let new_base = next_base(branch.dir())?;
    let remaining = ChangeSet::compute(&branch.upper_dir(), &workdir)
        .map_err(cow_error)?
        .len();
    Ok((CommitSummary { report, remaining }, new_base))
}

/// The next stale-base reference, by lockbox-cow's one rule (`stamp_base`: a fresh directory
/// re-stamped one file-clock tick after its creation), so that this commit's own writes are
/// strictly older than it: they stay in the upper layer, equal to the workdir, and the base
/// check sees them again at the next commit.
fn next_base(dir: &Path) -> Result<Timestamp, RuntimeError> {
    let marker = dir.join(format!(".commit-base-{}", crate::util::random_id()));
    std::fs::create_dir(&marker).map_err(RuntimeError::internal)?;
    let base = lockbox_cow::stamp_base(&marker);
    let _ = std::fs::remove_dir(&marker);
    base.map_err(RuntimeError::internal)
}
