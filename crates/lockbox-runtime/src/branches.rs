//! Kept branches of the state directory (`GET /v1/branches`, ...): the ones `lockbox run
//! --workdir --on-exit keep` or a failed run leaves, and those of sandboxes whose runtime
//! died. Listed, diffed hunk by hunk, committed in whole or in part, aborted. A branch in use
//! (a live sandbox's of this or another process) is neither listed nor touched.

use std::path::{Path, PathBuf};

use lockbox_cow::{
    abort_id, list, Branch, BranchId, BranchState, CommitOptions, ContentDigest, FileHunks,
    ListedBranch,
};

use crate::types::{CommitSummary, KeptBranch, KeptBranchDetail, Rest, Selection};
use crate::workspace::cow_error;
use crate::{Runtime, RuntimeError};

/// Whether a live process still owns the branch (a running sandbox's, or one being
/// committed).
fn in_use(b: &ListedBranch) -> bool {
    matches!(&b.meta, Ok(m) if matches!(m.state, BranchState::Active | BranchState::Committing))
        && !b.is_orphan()
}

fn describe(b: &ListedBranch) -> KeptBranch {
    let (workdir, state, created, command) = match &b.meta {
        Ok(m) => (
            Some(m.workdir.clone()),
            Some(m.state),
            Some(lockbox_policy::time::from_unix(
                m.created.secs,
                u32::try_from(m.created.nanos).unwrap_or(0),
            )),
            m.context.get("command").cloned(),
        ),
        Err(_) => (None, None, None, None),
    };
    let changes = b
        .meta
        .as_ref()
        .ok()
        .and_then(|_| Branch::open(b.dir.parent()?.parent()?, &b.id).ok())
        .and_then(|br| br.change_set().ok())
        .map(|c| c.len());
    KeptBranch {
        id: b.id.clone(),
        workdir,
        state,
        status: b.status(),
        created,
        command,
        changes,
    }
}

fn not_found(state_dir: &Path, id: &str) -> RuntimeError {
    cow_error(lockbox_cow::CowError::BranchNotFound {
        id: id.to_owned(),
        path: lockbox_cow::branches_dir(state_dir),
    })
}

/// The kept branch `id` (not one in use), as listed.
fn find(state_dir: &Path, id: &str) -> Result<ListedBranch, RuntimeError> {
    let parsed = BranchId::parse(id).map_err(cow_error)?;
    list(state_dir)
        .map_err(cow_error)?
        .into_iter()
        .find(|b| b.id == parsed && !in_use(b))
        .ok_or_else(|| not_found(state_dir, id))
}

fn open(state_dir: &Path, id: &str) -> Result<Branch, RuntimeError> {
    let listed = find(state_dir, id)?;
    Branch::open(state_dir, &listed.id).map_err(cow_error)
}

impl Runtime {
    /// The state directory (branches, transactions, sandboxes' records).
    pub fn state_dir(&self) -> PathBuf {
        self.inner.config.state_dir.clone()
    }

    /// The kept branches, by id.
    pub async fn branches(&self) -> Result<Vec<KeptBranch>, RuntimeError> {
        let state_dir = self.state_dir();
        blocking(move || {
            Ok(list(&state_dir)
                .map_err(cow_error)?
                .iter()
                .filter(|b| !in_use(b))
                .map(describe)
                .collect())
        })
        .await
    }

    /// One kept branch and its changes.
    pub async fn branch(&self, id: String) -> Result<KeptBranchDetail, RuntimeError> {
        let state_dir = self.state_dir();
        blocking(move || {
            let listed = find(&state_dir, &id)?;
            let branch = Branch::open(&state_dir, &listed.id).map_err(cow_error)?;
            let change_list = branch.review().map_err(cow_error)?;
            Ok(KeptBranchDetail {
                branch: describe(&listed),
                change_list,
            })
        })
        .await
    }

    /// The diff of one path of a kept branch, as numbered hunks, with the digest of the
    /// branch side they were made from (what a commit of them names).
    pub async fn branch_diff(
        &self,
        id: String,
        path: PathBuf,
    ) -> Result<(FileHunks, ContentDigest), RuntimeError> {
        let state_dir = self.state_dir();
        blocking(move || {
            open(&state_dir, &id)?
                .hunks_reviewed(&path)
                .map_err(crate::workspace::diff_error)
        })
        .await
    }

    /// Commits `sel` of a kept branch; the rest stays in it (`Rest::Keep`) or is dropped
    /// with it. `remaining` counts the changes left (0 when dropped).
    pub async fn branch_commit(
        &self,
        id: String,
        sel: Selection,
        rest: Rest,
    ) -> Result<CommitSummary, RuntimeError> {
        let state_dir = self.state_dir();
        blocking(move || {
            let mut branch = open(&state_dir, &id)?;
            let opts = CommitOptions {
                force: sel.force,
                ..CommitOptions::default()
            };
            let everything = sel.only.is_empty() && sel.exclude.is_empty() && sel.hunks.is_empty();
            // A commit bound to a review takes the partial path, whose snapshot is what the
            // review is checked against.
            if everything && rest == Rest::Drop && sel.review.is_none() {
                // The whole branch: the full commit, which also finishes one a crash
                // interrupted (state `committing`) and removes the branch.
                let report = branch.commit(&opts).map_err(cow_error)?;
                return Ok(CommitSummary {
                    report,
                    remaining: 0,
                });
            }
            let report = branch
                .commit_selected(&sel.to_cow(), &opts)
                .map_err(cow_error)?;
            let remaining = match rest {
                Rest::Drop => {
                    branch.abort().map_err(cow_error)?;
                    0
                }
                Rest::Keep => branch.change_set().map_err(cow_error)?.len(),
            };
            Ok(CommitSummary { report, remaining })
        })
        .await
    }

    /// Removes a kept branch (whatever its state, even a damaged one).
    pub async fn branch_abort(&self, id: String) -> Result<(), RuntimeError> {
        let state_dir = self.state_dir();
        blocking(move || {
            let listed = find(&state_dir, &id)?;
            abort_id(&state_dir, &listed.id).map_err(cow_error)
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(RuntimeError::Task)?
}
