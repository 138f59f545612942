//! [`TxnOptions`]: what every transaction (pipeline or gather) is configured with besides its
//! stages, and the prepare/run/dry-run driver both share.

use std::path::{Path, PathBuf};

use crate::capture::DEFAULT_MEMORY_BOUND;
use crate::lock::{self, LockPolicy, WorkdirLock};
use crate::outcome::{AbortReason, TxnOutcome};
use crate::prepared::{PreparedTxn, Selection};
use crate::record::TxnKind;
use crate::store::TxnDir;
use crate::{commit, TxnError};

/// Where a transaction runs and how it commits. [`crate::Pipeline`] and [`crate::Gather`]
/// hold one each and forward their builder setters to it.
#[derive(Debug, Clone)]
pub struct TxnOptions {
    /// The state directory (transaction records, layers, locks).
    pub state_dir: PathBuf,
    /// The directory the transaction commits to.
    pub workdir: PathBuf,
    /// How many bytes of a stage's stdout are kept in memory before spilling to a file.
    pub memory_bound: usize,
    /// Concurrency control against other transactions on the workdir.
    pub lock: LockPolicy,
    /// Commit only part of the changes.
    pub selection: Selection,
    /// Run under the id derived from this key instead of a fresh one (see
    /// [`TxnOptions::key`]).
    pub key: Option<String>,
}

impl TxnOptions {
    /// Defaults for `workdir`, records in `state_dir`.
    pub fn new(state_dir: &Path, workdir: &Path) -> TxnOptions {
        TxnOptions {
            state_dir: state_dir.to_owned(),
            workdir: workdir.to_owned(),
            memory_bound: DEFAULT_MEMORY_BOUND,
            lock: LockPolicy::default(),
            selection: Selection::default(),
            key: None,
        }
    }

    /// Runs the transaction under the id [`crate::TxnId::for_key`]`(key)` (the key is kept in its
    /// record), so that whether it committed can be looked up by the key after a crash — how
    /// a journaled transaction step stays exactly-once. An earlier transaction with that key
    /// that did not commit (aborted, or abandoned by a dead process) is replaced; one that
    /// committed, is committing, or is still owned by a live process makes `prepare` fail
    /// with [`TxnError::WrongState`].
    pub fn key(mut self, key: &str) -> TxnOptions {
        self.key = Some(key.to_owned());
        self
    }

    /// Runs `stages` in a new transaction directory and turns the result into a
    /// [`PreparedTxn`] (aborted at once if a stage failed).
    pub(crate) fn prepare(
        &self,
        kind: TxnKind,
        stages: impl FnOnce(&mut TxnDir) -> Result<(TxnOutcome, bool), TxnError>,
    ) -> Result<PreparedTxn, TxnError> {
        let lock = self.hold_lock()?;
        let mut txn = TxnDir::begin(&self.state_dir, &self.workdir, kind, self.key.as_deref())?;
        tracing::debug!(id = %txn.id(), "transaction begun");
        match stages(&mut txn) {
            Ok((outcome, true)) => {
                let mut prepared = PreparedTxn::new(Some(txn), outcome, lock);
                if !self.selection.is_all() {
                    // On error the prepared transaction is dropped, which aborts it.
                    prepared.select(&self.selection)?;
                }
                Ok(prepared)
            }
            Ok((outcome, false)) => {
                txn.record.abort_reason = outcome.abort_reason.clone();
                commit::abort(&mut txn)?;
                Ok(PreparedTxn::new(None, outcome, None))
            }
            Err(e) => {
                // The error that matters is `e`; the record stays `running` if this fails
                // too, and recovery aborts it once this process is gone.
                let _ = commit::abort(&mut txn);
                Err(e)
            }
        }
    }

    fn hold_lock(&self) -> Result<Option<WorkdirLock>, TxnError> {
        let wait = match self.lock {
            LockPolicy::Optimistic => return Ok(None),
            LockPolicy::FailIfBusy => Some(std::time::Duration::ZERO),
            LockPolicy::Wait(d) => d,
        };
        let workdir = std::fs::canonicalize(&self.workdir).map_err(|source| TxnError::Store {
            path: self.workdir.clone(),
            source,
        })?;
        lock::acquire(&self.state_dir, &workdir, wait).map(Some)
    }
}

/// Commits a prepared transaction whose stages all succeeded.
pub(crate) fn run(prepared: PreparedTxn) -> Result<TxnOutcome, TxnError> {
    if prepared.all_succeeded() {
        prepared.commit()
    } else {
        Ok(prepared.outcome().clone())
    }
}

/// Aborts a prepared transaction as a dry run.
pub(crate) fn dry_run(mut prepared: PreparedTxn) -> Result<TxnOutcome, TxnError> {
    if prepared.all_succeeded() {
        prepared.abort_with(AbortReason::DryRun)
    } else {
        Ok(prepared.outcome().clone())
    }
}

/// The builder setters [`crate::Pipeline`] and [`crate::Gather`] share, forwarded to their
/// `options` field.
macro_rules! option_setters {
    ($builder:ty) => {
        /// Replaces every option at once (the state directory and workdir included).
        pub fn options(mut self, options: $crate::TxnOptions) -> $builder {
            self.options = options;
            self
        }

        /// How many bytes of each stdout are kept in memory before spilling to a file.
        pub fn memory_bound(mut self, bytes: usize) -> $builder {
            self.options.memory_bound = bytes;
            self
        }

        /// Commit only part of the changes (see [`crate::Selection`]).
        pub fn select(mut self, selection: $crate::Selection) -> $builder {
            self.options.selection = selection;
            self
        }

        /// Concurrency control against other transactions on the workdir.
        pub fn lock(mut self, lock: $crate::LockPolicy) -> $builder {
            self.options.lock = lock;
            self
        }

        /// Runs under the id derived from `key` (see [`crate::TxnOptions::key`]).
        pub fn key(mut self, key: &str) -> $builder {
            self.options.key = Some(key.to_owned());
            self
        }

        /// Runs everything and commits on success.
        pub fn run(&self) -> Result<$crate::TxnOutcome, $crate::TxnError> {
            $crate::options::run(self.prepare()?)
        }

        /// Runs everything, reports the union of changes, commits nothing.
        pub fn dry_run(&self) -> Result<$crate::TxnOutcome, $crate::TxnError> {
            $crate::options::dry_run(self.prepare()?)
        }
    };
}
pub(crate) use option_setters;
