//! [`LayerGather`]: a gather of layers that exist already — the branches of running
//! sandboxes (forks of one snapshot, or any sandboxes over one workdir) — merged under a
//! [`ConflictPolicy`] and committed as one transaction, or not at all. The merge is
//! [`crate::Gather`]'s (its conflict rules, its markers), the commit protocol and recovery
//! are every transaction's; no stage runs.
//!
//! Layers all sources share (a common snapshot's, at the bottom of every stack) are their
//! common base. What a source changed is what its own layers change over that base
//! ([`lockbox_cow::diff_views`]): the base's changes, the same in every source, are no
//! conflict, and a path only one source changed over the base is that source's, whatever the
//! policy. The merged layer is the base with the sources' own layers on top of it, the
//! winner of every conflict uppermost.
//!
//! Stale base: each path is checked against the reference of the source its version comes
//! from (its branch's base, or a later one for a path that branch committed since:
//! [`LayerSource::rebased`]); a path only the shared base changes, against the latest of
//! the sources' references for it.

use std::path::{Path, PathBuf};

use lockbox_cow::{Change, Rebased, Timestamp};

use crate::gather::{check_names, conflicts, keep_markers, ConflictPolicy};
use crate::options::TxnOptions;
use crate::outcome::{AbortReason, TxnOutcome};
use crate::pipeline::{empty_outcome, finish_prepare};
use crate::prepared::PreparedTxn;
use crate::record::TxnKind;
use crate::store::TxnDir;
use crate::TxnError;

/// One source of a [`LayerGather`]: a branch's layers and its stale-base reference.
#[derive(Debug, Clone)]
pub struct LayerSource {
    /// Its name in conflicts and markers (letters, digits, `-`, `_`, `.`; unique).
    pub name: String,
    /// Its own layers above the shared ones, top first (a branch's upper, then the snapshot
    /// layers it does not share with every other source). Read once, while preparing.
    pub layers: Vec<PathBuf>,
    /// Its stale-base reference: when its branch began (for a fork, its snapshot's).
    pub base: Timestamp,
    /// Paths it committed since, each with its own later reference, sorted by path
    /// ([`lockbox_cow::BranchMeta::rebased`]).
    pub rebased: Vec<Rebased>,
}

impl LayerSource {
    /// The stale-base reference of `path` for this source.
    fn reference(&self, path: &Path) -> Timestamp {
        match self
            .rebased
            .binary_search_by(|r| r.path.as_path().cmp(path))
        {
            Ok(i) => self.rebased[i].at.max(self.base),
            Err(_) => self.base,
        }
    }
}

/// A transactional gather of existing layers over one workdir.
#[derive(Debug, Clone)]
pub struct LayerGather {
    options: TxnOptions,
    shared: Vec<PathBuf>,
    sources: Vec<LayerSource>,
    policy: ConflictPolicy,
}

/// A prepared [`LayerGather`]: the transaction, and what each source changed over the
/// shared layers (declaration order).
#[derive(Debug)]
pub struct PreparedGather {
    /// The transaction (already aborted, with [`AbortReason::Conflicts`], on an unresolved
    /// conflict).
    pub txn: PreparedTxn,
    /// Each source's own changes over the shared layers, sorted by path.
    pub contributions: Vec<Vec<Change>>,
}

impl PreparedGather {
    /// Commits (`force`: without the stale-base check); an aborted one returns its outcome.
    pub fn commit(self, force: bool) -> Result<TxnOutcome, TxnError> {
        if force {
            self.txn.commit_forced()
        } else {
            self.txn.commit()
        }
    }

    /// Discards it as a dry run: the outcome lists the merged changes, nothing is applied.
    pub fn dry_run(self) -> Result<TxnOutcome, TxnError> {
        crate::options::dry_run(self.txn)
    }
}

impl LayerGather {
    /// An empty gather over `workdir`, keeping its record in `state_dir`.
    pub fn new(state_dir: &Path, workdir: &Path) -> LayerGather {
        LayerGather {
            options: TxnOptions::new(state_dir, workdir),
            shared: Vec::new(),
            sources: Vec::new(),
            policy: ConflictPolicy::default(),
        }
    }

    /// The layers every source lies on, top first (a common snapshot's; none by default).
    pub fn shared(mut self, layers: Vec<PathBuf>) -> LayerGather {
        self.shared = layers;
        self
    }

    /// Adds a source.
    pub fn source(mut self, source: LayerSource) -> LayerGather {
        self.sources.push(source);
        self
    }

    /// Sets the conflict policy (default [`ConflictPolicy::Fail`]).
    pub fn conflict_policy(mut self, policy: ConflictPolicy) -> LayerGather {
        self.policy = policy;
        self
    }

    /// Reads the layers, merges them, keeps the result in a prepared transaction.
    pub fn prepare(&self) -> Result<PreparedGather, TxnError> {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        check_names(&names)?;
        let mut contributions = Vec::new();
        let txn = self.options.prepare(TxnKind::Gather, |txn| {
            let (outcome, ok, own) = self.run(txn)?;
            contributions = own;
            Ok((outcome, ok))
        })?;
        Ok(PreparedGather { txn, contributions })
    }

    #[allow(clippy::type_complexity)]
    fn run(&self, txn: &mut TxnDir) -> Result<(TxnOutcome, bool, Vec<Vec<Change>>), TxnError> {
        let mut outcome = empty_outcome(txn);
        let layers = txn.dir.join("layers");
        let shared = flattened(&layers.join("shared"), &self.shared)?;
        let mut owns = Vec::new();
        let mut views = Vec::new();
        let mut sets = Vec::new();
        for (i, source) in self.sources.iter().enumerate() {
            let own = flattened(&layers.join(i.to_string()), &source.layers)?;
            let view = flattened(
                &layers.join(format!("view-{i}")),
                &[own.clone(), shared.clone()],
            )?;
            sets.push(lockbox_cow::diff_views(&shared, &view, txn.workdir())?);
            owns.push(own);
            views.push(view);
        }
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        let set_refs: Vec<&[Change]> = sets.iter().map(Vec::as_slice).collect();
        outcome.conflicts = conflicts(&names, &set_refs);
        if self.policy == ConflictPolicy::Fail && !outcome.conflicts.is_empty() {
            outcome.abort_reason = Some(AbortReason::Conflicts {
                count: outcome.conflicts.len(),
            });
            return Ok((outcome, false, sets));
        }
        // `flatten` takes the top first: the winner of every conflict goes on top (the first
        // source, except under last-writer-wins), the shared layers at the bottom.
        let mut top_first = owns;
        if self.policy == ConflictPolicy::LastWriterWins {
            top_first.reverse();
        }
        top_first.push(shared);
        let merged = flattened(&txn.merged_dir(), &top_first)?;
        if self.policy == ConflictPolicy::Markers {
            outcome.markers = keep_markers(
                &names,
                &outcome.conflicts,
                &views,
                &set_refs,
                txn.workdir(),
                &merged,
            )?;
        }
        finish_prepare(txn, &[], &mut outcome)?;
        self.set_references(txn, &outcome, &set_refs);
        Ok((outcome, true, sets))
    }

    /// Gives every path of the merged result the stale-base reference of the source its
    /// version comes from (see the module's doc).
    fn set_references(&self, txn: &mut TxnDir, outcome: &TxnOutcome, sets: &[&[Change]]) {
        let Some(at) = self.sources.iter().map(|s| s.base).min() else {
            return;
        };
        let mut rebased = Vec::new();
        for change in outcome.changes.changes() {
            let path = &change.path;
            let writers: Vec<&LayerSource> = self
                .sources
                .iter()
                .zip(sets)
                .filter(|(_, set)| set.binary_search_by(|c| c.path.as_path().cmp(path)).is_ok())
                .map(|(s, _)| s)
                .collect();
            let winner = match self.policy {
                ConflictPolicy::LastWriterWins => writers.last(),
                _ => writers.first(),
            };
            let reference = match winner {
                Some(w) => w.reference(path),
                None => self
                    .sources
                    .iter()
                    .map(|s| s.reference(path))
                    .max()
                    .unwrap_or(at),
            };
            if reference != at {
                rebased.push(Rebased {
                    path: path.clone(),
                    at: reference,
                });
            }
        }
        rebased.sort_by(|a, b| a.path.cmp(&b.path));
        txn.record.base_ctime = at;
        txn.rebased = rebased;
    }
}

/// Flattens `layers` (top first) into the new directory `into`, which it returns.
fn flattened(into: &Path, layers: &[PathBuf]) -> Result<PathBuf, TxnError> {
    std::fs::create_dir_all(into).map_err(|source| TxnError::Store {
        path: into.to_owned(),
        source,
    })?;
    lockbox_cow::flatten(layers, into)?;
    Ok(into.to_owned())
}
