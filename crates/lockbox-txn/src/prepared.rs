//! [`PreparedTxn`]: a transaction whose stages all ran, with its layers kept, waiting for
//! [`PreparedTxn::commit`] or [`PreparedTxn::abort`]. Dropping it unresolved aborts it, so a
//! forgotten commit never commits; [`PreparedTxn::keep`] leaves it in the store for a later
//! [`PreparedTxn::open`] (another process, after a reboot).

use std::path::{Path, PathBuf};

use lockbox_cow::ChangeSet;

use crate::commit;
use crate::lock::WorkdirLock;
use crate::outcome::{AbortReason, TxnOutcome};
use crate::record::TxnState;
use crate::store::TxnDir;
use crate::{Output, TxnError, TxnId};

/// Which part of a transaction's changes to commit (selective commit): only the changes at
/// or below an `only` path (all when empty), plus new directories on the way to them, and
/// none at or below an `exclude` path. Paths are relative to the workdir. The rest is
/// discarded with the transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Keep only changes at or below these paths (all when empty).
    pub only: Vec<PathBuf>,
    /// Drop changes at or below these paths.
    pub exclude: Vec<PathBuf>,
}

impl Selection {
    /// True if it selects everything.
    pub fn is_all(&self) -> bool {
        self.only.is_empty() && self.exclude.is_empty()
    }
}

/// A prepared (or, if a stage failed, already aborted) transaction.
#[derive(Debug)]
pub struct PreparedTxn {
    /// `None` once resolved.
    txn: Option<TxnDir>,
    outcome: TxnOutcome,
    lock: Option<WorkdirLock>,
}

impl PreparedTxn {
    pub(crate) fn new(txn: Option<TxnDir>, outcome: TxnOutcome, lock: Option<WorkdirLock>) -> Self {
        PreparedTxn { txn, outcome, lock }
    }

    /// Opens a transaction another process prepared and kept.
    pub fn open(state_dir: &Path, id: &TxnId) -> Result<PreparedTxn, TxnError> {
        let txn = TxnDir::open(state_dir, id)?;
        if txn.record.state != TxnState::Prepared {
            return Err(TxnError::WrongState {
                id: id.clone(),
                state: txn.record.state.name(),
                operation: "open it as prepared",
            });
        }
        let changes = ChangeSet::compute(&txn.merged_dir(), txn.workdir())?;
        let stdout_file = txn.dir.join("stdout");
        let stdout = match std::fs::metadata(&stdout_file) {
            Ok(m) => Output::File {
                path: stdout_file,
                len: m.len(),
            },
            Err(_) => Output::default(),
        };
        let outcome = TxnOutcome {
            id: id.clone(),
            committed: false,
            stages: txn.record.stages.clone(),
            changes,
            conflicts: Vec::new(),
            markers: Vec::new(),
            abort_reason: None,
            report: None,
            stdout,
        };
        Ok(PreparedTxn::new(Some(txn), outcome, None))
    }

    /// The transaction's id.
    pub fn id(&self) -> &TxnId {
        &self.outcome.id
    }

    /// The workdir it commits to (canonical; `None` once resolved or if it aborted).
    pub fn workdir(&self) -> Option<&Path> {
        self.txn.as_ref().map(|t| t.workdir())
    }

    /// Stages, changes, conflicts so far (`committed` is false).
    pub fn outcome(&self) -> &TxnOutcome {
        &self.outcome
    }

    /// Every stage succeeded (and, for a gather, no unresolved conflict): commit can apply.
    pub fn all_succeeded(&self) -> bool {
        self.outcome.abort_reason.is_none()
    }

    /// Some gather sources wrote the same paths.
    pub fn has_conflicts(&self) -> bool {
        !self.outcome.conflicts.is_empty()
    }

    /// Narrows what [`PreparedTxn::commit`] will apply (and `outcome().changes`) to
    /// `selection`. Refused for a path below a directory the transaction deletes, replaces
    /// or makes opaque (see [`lockbox_cow::restrict`]).
    pub fn select(&mut self, selection: &Selection) -> Result<(), TxnError> {
        let Some(txn) = &self.txn else {
            return Err(TxnError::WrongState {
                id: self.outcome.id.clone(),
                state: "aborted",
                operation: "select changes of it",
            });
        };
        lockbox_cow::restrict(&txn.merged_dir(), &selection.only, &selection.exclude)?;
        self.outcome.changes = ChangeSet::compute(&txn.merged_dir(), txn.workdir())?;
        Ok(())
    }

    /// Applies the union of the layers to the workdir as one unit (see [`crate::recover`]
    /// for the crash guarantees). A transaction that did not prepare cleanly returns its
    /// outcome uncommitted.
    pub fn commit(self) -> Result<TxnOutcome, TxnError> {
        self.commit_inner(false)
    }

    /// Like [`PreparedTxn::commit`], and records `value` durably with the commit: it is in
    /// the transaction record before the commit point, so whoever finds the transaction
    /// committed (this process, or recovery after a crash) finds the value too. Used for a
    /// journaled step's result ([`crate::journaled`]).
    pub fn commit_recording(mut self, value: serde_json::Value) -> Result<TxnOutcome, TxnError> {
        if let Some(txn) = &mut self.txn {
            txn.record.value = Some(value);
        }
        self.commit_inner(false)
    }

    /// Like [`PreparedTxn::commit`], but without the optimistic base check: paths the
    /// transaction changes that were changed in the workdir since it began are overwritten.
    pub fn commit_forced(self) -> Result<TxnOutcome, TxnError> {
        self.commit_inner(true)
    }

    fn commit_inner(mut self, force: bool) -> Result<TxnOutcome, TxnError> {
        let Some(mut txn) = self.txn.take() else {
            return Ok(self.outcome.clone());
        };
        let holding = self.lock.is_some();
        let result = commit::commit(&mut txn, holding, force);
        self.lock.take();
        let report = result?;
        tracing::debug!(id = %self.outcome.id, "transaction committed");
        let mut outcome = self.outcome.clone();
        outcome.committed = true;
        outcome.report = Some(report);
        Ok(outcome)
    }

    /// Discards the layers; the workdir is not touched.
    pub fn abort(mut self) -> Result<TxnOutcome, TxnError> {
        self.abort_with(AbortReason::Aborted)
    }

    pub(crate) fn abort_with(&mut self, reason: AbortReason) -> Result<TxnOutcome, TxnError> {
        if let Some(mut txn) = self.txn.take() {
            txn.record.abort_reason = Some(reason.clone());
            commit::abort(&mut txn)?;
            self.outcome.abort_reason = Some(reason);
        }
        self.lock.take();
        Ok(self.outcome.clone())
    }

    /// Leaves the transaction prepared in the store, to be committed or aborted later by id
    /// (from any process; it survives this one, and a crash). Until kept, a prepared
    /// transaction belongs to this process: dropped, or left behind by a crash, it is aborted.
    pub fn keep(mut self) -> Result<TxnId, TxnError> {
        if let Some(mut txn) = self.txn.take() {
            txn.record.held = false;
            if let Err(e) = txn.settle().and_then(|()| txn.make_durable()) {
                // Dropping `self` with it aborts the transaction.
                self.txn = Some(txn);
                return Err(e);
            }
        }
        Ok(self.outcome.id.clone())
    }
}

impl Drop for PreparedTxn {
    fn drop(&mut self) {
        if let Some(mut txn) = self.txn.take() {
            // Best effort: a failure leaves it prepared, and `lockbox txn abort` finishes.
            let _ = commit::abort(&mut txn);
        }
    }
}
