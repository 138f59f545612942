//! Several running sandboxes committed together ([`Runtime::commit_together`]): typically
//! forks of one snapshot, or any sandboxes over the same workdir. Their branches are merged
//! under a [`ConflictPolicy`] and committed as one transaction (`lockbox_txn::LayerGather`:
//! the merge of `lockbox txn gather`, its journalled commit and its recovery), all or none.
//!
//! What each sandbox contributes is what it changed over the snapshot layers all of them
//! share (a common snapshot's changes are in every fork: no conflict, committed once). The
//! stale-base rule is a single commit's, per path: a path the workdir changed under since
//! the sandbox its version comes from began (for a fork, since its snapshot's sandbox began)
//! is refused unless forced.
//!
//! Afterwards every sandbox keeps running on its branch, as after a single commit: the
//! paths whose version went in agree with the workdir (they no longer show as changes, and
//! get a stale-base reference of their own), the others' commits land under it, and a
//! sandbox whose version of a path lost a conflict still sees its own, listed as a change
//! (which its own later commit refuses as stale unless forced).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lockbox_cow::{Branch, Change, CommitReport};
use lockbox_txn::{ConflictPolicy, LayerGather, LayerSource, Marker, TxnId};

use crate::sandbox::{lock, Instance};
use crate::types::SandboxId;
use crate::workspace::cow_error;
use crate::{Runtime, RuntimeError};

/// How [`Runtime::commit_together`] merges and applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatherOptions {
    /// What to do when sandboxes changed the same path (default: refuse).
    pub conflicts: ConflictPolicy,
    /// Compute and report the merged result; change nothing.
    pub dry_run: bool,
    /// Commit even where the workdir changed under a sandbox since it began.
    pub force: bool,
}

/// What one sandbox changed over the layers all gathered sandboxes share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contribution {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// Its changes, sorted by path.
    pub changes: Vec<Change>,
}

/// A path more than one sandbox changed, and how the policy resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherConflict {
    /// Relative to the workdir.
    pub path: PathBuf,
    /// The sandboxes that changed it (or, for a directory removed, something below it), in
    /// the order given.
    pub sandboxes: Vec<SandboxId>,
    /// The sandbox whose version went in (none under `Fail`).
    pub winner: Option<SandboxId>,
}

/// What [`Runtime::commit_together`] did.
#[derive(Debug, Clone)]
pub struct GatherOutcome {
    /// The transaction (listed by `lockbox txn list`, `GET /v1/transactions`).
    pub transaction: TxnId,
    /// Applied to the workdir (false for a dry run).
    pub committed: bool,
    /// A dry run: nothing changed.
    pub dry_run: bool,
    /// What each sandbox contributed, in the order given.
    pub contributions: Vec<Contribution>,
    /// The paths several sandboxes changed, and who won each.
    pub conflicts: Vec<GatherConflict>,
    /// Losing versions kept beside the winner (`ConflictPolicy::Markers`).
    pub markers: Vec<Marker>,
    /// The merged result against the workdir: what was (or, for a dry run, would be)
    /// applied.
    pub changes: Vec<Change>,
    /// The commit engine's report (none for a dry run).
    pub report: Option<CommitReport>,
}

/// One gathered sandbox: its id and instance, what its branch is made of.
struct Source {
    id: SandboxId,
    inst: Arc<Instance>,
    workdir: PathBuf,
    upper: PathBuf,
    /// Snapshot layers below its upper, top first.
    layers: Vec<PathBuf>,
    base: lockbox_cow::Timestamp,
    rebased: Vec<lockbox_cow::Rebased>,
}

/// Checks the ids: at least one, none twice.
fn check_ids(ids: &[SandboxId]) -> Result<(), RuntimeError> {
    if ids.is_empty() {
        return Err(RuntimeError::invalid(
            "sandboxes",
            "name at least one running sandbox",
        ));
    }
    for (i, id) in ids.iter().enumerate() {
        if ids[..i].contains(id) {
            return Err(RuntimeError::invalid(
                "sandboxes",
                format!("sandbox {id} is named twice"),
            ));
        }
    }
    Ok(())
}

/// Reads what `inst`'s branch is made of (`NO_WORKDIR` without one; a partial commit a
/// crash interrupted is finished first, as any commit of the branch does).
fn source_of(id: &SandboxId, inst: Arc<Instance>) -> Result<Source, RuntimeError> {
    let mut guard = lock(&inst.branch);
    let Some(branch) = guard.as_mut() else {
        return Err(RuntimeError::NoWorkdir { id: id.to_string() });
    };
    branch.finish_interrupted_part().map_err(cow_error)?;
    let source = Source {
        id: id.clone(),
        workdir: branch.workdir().to_owned(),
        upper: branch.upper_dir(),
        layers: branch.layers().to_vec(),
        base: branch.meta().base_ctime,
        rebased: branch.meta().rebased.clone(),
        inst: inst.clone(),
    };
    drop(guard);
    Ok(source)
}

/// The layers at the bottom of every source's stack (a common snapshot's), top first.
fn shared_layers(sources: &[Source]) -> Vec<PathBuf> {
    let Some(first) = sources.first() else {
        return Vec::new();
    };
    let mut n = 0;
    while n < first.layers.len()
        && sources.iter().all(|s| {
            s.layers.len() > n
                && s.layers[s.layers.len() - 1 - n] == first.layers[first.layers.len() - 1 - n]
        })
    {
        n += 1;
    }
    first.layers[first.layers.len() - n..].to_vec()
}

/// Merges and commits (or, dry, only merges) on a blocking thread.
fn gather(
    state_dir: &Path,
    sources: &[Source],
    opts: GatherOptions,
) -> Result<GatherOutcome, RuntimeError> {
    let shared = shared_layers(sources);
    let workdir = &sources[0].workdir;
    let mut gather = LayerGather::new(state_dir, workdir)
        .shared(shared.clone())
        .conflict_policy(opts.conflicts);
    for s in sources {
        let mut layers = vec![s.upper.clone()];
        layers.extend_from_slice(&s.layers[..s.layers.len() - shared.len()]);
        gather = gather.source(LayerSource {
            name: s.id.to_string(),
            layers,
            base: s.base,
            rebased: s.rebased.clone(),
        });
    }
    let prepared = gather.prepare().map_err(txn_error)?;
    let contributions = prepared.contributions.clone();
    let outcome = if opts.dry_run {
        prepared.dry_run()
    } else {
        prepared.commit(opts.force)
    }
    .map_err(txn_error)?;
    let conflicts: Vec<GatherConflict> = outcome
        .conflicts
        .iter()
        .map(|c| GatherConflict {
            path: c.path.clone(),
            sandboxes: c
                .stages
                .iter()
                .map(|s| SandboxId::from(s.clone()))
                .collect(),
            winner: winner_of(&c.stages, opts.conflicts).map(|s| SandboxId::from(s.to_owned())),
        })
        .collect();
    if outcome.abort_reason.is_some() && !opts.dry_run {
        return Err(RuntimeError::MergeConflicts { conflicts });
    }
    if outcome.committed {
        rebase_written(
            sources,
            &contributions,
            outcome.changes.changes(),
            opts.conflicts,
        )?;
    }
    Ok(GatherOutcome {
        transaction: outcome.id.clone(),
        committed: outcome.committed,
        dry_run: opts.dry_run,
        contributions: sources
            .iter()
            .zip(contributions)
            .map(|(s, changes)| Contribution {
                sandbox: s.id.clone(),
                changes,
            })
            .collect(),
        conflicts,
        markers: outcome.markers.clone(),
        changes: outcome.changes.changes().to_vec(),
        report: outcome.report.clone(),
    })
}

/// Whose version of a conflicting path `policy` keeps (`stages` in the order given).
fn winner_of(stages: &[String], policy: ConflictPolicy) -> Option<&str> {
    match policy {
        ConflictPolicy::Fail => None,
        ConflictPolicy::LastWriterWins => stages.last().map(String::as_str),
        ConflictPolicy::FirstWriterWins | ConflictPolicy::Markers => {
            stages.first().map(String::as_str)
        }
    }
}

/// After the commit: each branch's paths whose version went in (its own, or the shared
/// snapshot's) get a stale-base reference of their own, as after a single commit.
fn rebase_written(
    sources: &[Source],
    contributions: &[Vec<Change>],
    written: &[Change],
    policy: ConflictPolicy,
) -> Result<(), RuntimeError> {
    let mut theirs: Vec<BTreeSet<PathBuf>> = vec![BTreeSet::new(); sources.len()];
    for change in written {
        let writers: Vec<usize> = contributions
            .iter()
            .enumerate()
            .filter(|(_, own)| own.binary_search_by(|c| c.path.cmp(&change.path)).is_ok())
            .map(|(i, _)| i)
            .collect();
        let winner = match policy {
            ConflictPolicy::LastWriterWins => writers.last(),
            _ => writers.first(),
        };
        match winner {
            Some(&i) => {
                theirs[i].insert(change.path.clone());
            }
            None => theirs.iter_mut().for_each(|t| {
                t.insert(change.path.clone());
            }),
        }
    }
    for (source, paths) in sources.iter().zip(theirs) {
        let paths: Vec<PathBuf> = paths.into_iter().collect();
        let mut guard = lock(&source.inst.branch);
        if let Some(branch) = guard.as_mut() {
            Branch::rebase_paths(branch, &paths).map_err(cow_error)?;
        }
    }
    Ok(())
}

fn txn_error(e: lockbox_txn::TxnError) -> RuntimeError {
    match e {
        lockbox_txn::TxnError::Cow(e) => cow_error(e),
        e => RuntimeError::Transaction(e),
    }
}

impl Runtime {
    /// Commits several running sandboxes together, as one transaction: their branches
    /// (typically forks of one snapshot; any sandboxes over the same workdir) are merged under
    /// `opts.conflicts` and applied all or none (see the module doc, and `docs/runtime.md`).
    ///
    /// Refused, changing nothing: `INVALID_REQUEST` (field `sandboxes`) for no ids, an id
    /// named twice, or sandboxes over different workdirs; `SANDBOX_NOT_FOUND` /
    /// `SANDBOX_NOT_RUNNING`; `NO_WORKDIR`; `WORKDIR_BUSY` for a sandbox whose commit, abort,
    /// restore or snapshot is under way; `CONFLICT` for paths several sandboxes changed under
    /// `ConflictPolicy::Fail` ([`RuntimeError::MergeConflicts`], a dry run reports them
    /// instead) or a stale base without `force`.
    pub async fn commit_together(
        &self,
        ids: &[SandboxId],
        opts: GatherOptions,
    ) -> Result<GatherOutcome, RuntimeError> {
        check_ids(ids)?;
        let mut sandboxes = Vec::with_capacity(ids.len());
        for id in ids {
            sandboxes.push(self.sandbox(id)?);
        }
        // Taken in id order (two gathers of the same sandboxes cannot deadlock), and not
        // waited for: a sandbox busy with a commit of its own is refused, not queued.
        let mut order: Vec<usize> = (0..sandboxes.len()).collect();
        order.sort_by(|&a, &b| ids[a].cmp(&ids[b]));
        let mut held = Vec::with_capacity(order.len());
        for &i in &order {
            match sandboxes[i].inner.lifecycle.try_lock() {
                Ok(guard) => held.push(guard),
                Err(_) => {
                    return Err(RuntimeError::SandboxBusy {
                        id: ids[i].to_string(),
                    })
                }
            }
        }
        let mut sources = Vec::with_capacity(sandboxes.len());
        for (id, sb) in ids.iter().zip(&sandboxes) {
            let inst = sb.live()?;
            if lock(&inst.branch).is_none() {
                return Err(RuntimeError::NoWorkdir { id: id.to_string() });
            }
            sources.push((id.clone(), inst));
        }
        let state_dir = self.state_dir();
        let result = tokio::task::spawn_blocking(move || {
            let sources = sources
                .into_iter()
                .map(|(id, inst)| source_of(&id, inst))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(other) = sources.iter().find(|s| s.workdir != sources[0].workdir) {
                return Err(RuntimeError::invalid(
                    "sandboxes",
                    format!(
                        "sandbox {} works on {}, sandbox {} on {}: a gather commits to one workdir",
                        sources[0].id,
                        sources[0].workdir.display(),
                        other.id,
                        other.workdir.display()
                    ),
                ));
            }
            gather(&state_dir, &sources, opts)
        })
        .await
        .map_err(RuntimeError::Task)?;
        drop(held);
        result
    }
}
