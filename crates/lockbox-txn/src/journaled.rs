//! Journaled sandbox work: the edge between `lockbox-journal` (which knows nothing of
//! sandboxes) and this crate.
//!
//! - [`record_exec`]: runs one command in a sandbox as a journal step; a replay returns the
//!   journaled [`ExecResult`] without running it again;
//! - [`record_transaction`]: runs a [`Transaction`] as a journal step, exactly once on the
//!   workspace. The transaction runs under the id [`TxnId::for_key`] of the journal's
//!   transaction key (`RUN/STEP_ID`, the same on every replay), and its outcome is recorded in
//!   its own commit record ([`PreparedTxn::commit_recording`]). If the process dies after the
//!   commit but before the journal append, the replay finds the commit through [`TxnStore`]
//!   and journals the recorded outcome instead of committing again.
//!
//! Failures of the machinery ([`TxnError`]: busy workdir, stale base, store errors) are
//! returned as [`JournaledError`] and not journaled, so a retry runs the step again; a
//! transaction that ran and aborted (a stage failed, a conflict) is a result and is journaled.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use lockbox_journal::{RecordOptions, Run, StepError, TxnOutcomeStore, TxnStoreError};
use lockbox_policy::Policy;

use crate::record::TxnState;
use crate::stage::{self, Input, Stage, StageResult};
use crate::store::TxnDir;
use crate::{PreparedTxn, Transaction, TxnError, TxnId, TxnOutcome};

/// What a journaled exec returned.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecResult {
    /// Exit code, signal, timeout, duration, stderr tail, setup error.
    pub result: StageResult,
    /// The command's stdout, decoded as UTF-8 (invalid sequences replaced).
    pub stdout: String,
}

/// A failure of the machinery around a journaled step: not journaled, so retrying the step
/// runs it again.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct JournaledError {
    /// [`TxnError::code`], or `JOURNAL_TASK` if the blocking task died.
    pub code: lockbox_policy::ErrorCode,
    /// The error's message.
    pub message: String,
    /// [`TxnError::exit_code`] (the CLI's convention).
    pub exit_code: u8,
}

impl From<TxnError> for JournaledError {
    fn from(e: TxnError) -> JournaledError {
        JournaledError {
            code: e.code(),
            message: e.to_string(),
            exit_code: e.exit_code(),
        }
    }
}

fn task_died(e: tokio::task::JoinError) -> JournaledError {
    JournaledError {
        code: lockbox_policy::ErrorCode::JournalTask,
        message: format!("the blocking task of a journaled step failed: {e}"),
        exit_code: 125,
    }
}

/// The largest stdout a journaled exec keeps in memory; more spills to a temporary file
/// while it runs (the journal's entry size bound still applies to the result).
const EXEC_MEMORY_BOUND: usize = 8 << 20;

/// Runs `argv` under `policy` as the journal step `name` (see the module doc).
pub async fn record_exec(
    run: &Run,
    name: &str,
    policy: Policy,
    argv: Vec<OsString>,
) -> Result<ExecResult, StepError<JournaledError>> {
    let retry_all = RecordOptions::retry_when(|_: &JournaledError| true);
    run.record_with(name, retry_all, || async move {
        let stage = Stage::new(policy, argv).named(name);
        blocking(move || exec(&stage)).await
    })
    .await
}

/// Runs blocking sandbox work off the async runtime's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, TxnError> + Send + 'static,
) -> Result<T, JournaledError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(task_died)?
        .map_err(JournaledError::from)
}

fn exec(stage: &Stage) -> Result<ExecResult, TxnError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let spill = std::env::temp_dir().join(format!(
        "lockbox-exec-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let ran = stage::run(
        stage,
        None,
        Input::Null,
        &spill,
        EXEC_MEMORY_BOUND,
        &[],
        &[],
    );
    let stdout = match &ran {
        Ok(r) => r.stdout.read_all(),
        Err(_) => Ok(Vec::new()),
    };
    let _ = std::fs::remove_file(&spill);
    let ran = ran?;
    let stdout = stdout.map_err(stage::stdio_err(&stage.name))?;
    Ok(ExecResult {
        result: ran.result,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
    })
}

/// Runs `txn` as the journal step `name`, exactly once on the workspace (see the module
/// doc). The returned outcome has no `stdout` (it is not journaled) and, when a replay found
/// the commit in the store, no `report`.
pub async fn record_transaction(
    run: &Run,
    name: &str,
    state_dir: &Path,
    txn: Transaction,
) -> Result<TxnOutcome, StepError<JournaledError>> {
    let store = TxnStore::new(state_dir);
    let retry_all = RecordOptions::retry_when(|_: &JournaledError| true);
    run.record_txn_with(name, &store, retry_all, |key| async move {
        let txn = txn.key(key.as_str());
        blocking(move || prepare_and_commit(&txn)).await
    })
    .await
}

fn prepare_and_commit(txn: &Transaction) -> Result<TxnOutcome, TxnError> {
    let prepared: PreparedTxn = txn.prepare()?;
    if !prepared.all_succeeded() {
        return Ok(prepared.outcome().clone());
    }
    let mut value = prepared.outcome().clone();
    value.committed = true;
    let value = serde_json::to_value(&value).map_err(|e| TxnError::Usage {
        reason: format!("the outcome does not serialise: {e}"),
    })?;
    prepared.commit_recording(value)
}

/// The transaction store of a state directory, as the journal asks it: has the transaction
/// keyed by a journal's [`lockbox_journal::TxnId`] committed, and with which value?
#[derive(Debug, Clone)]
pub struct TxnStore {
    state_dir: PathBuf,
}

impl TxnStore {
    /// The store in `state_dir`.
    pub fn new(state_dir: &Path) -> TxnStore {
        TxnStore {
            state_dir: state_dir.to_owned(),
        }
    }

    /// The outcome of the transaction keyed `key`: the recorded value if it committed.
    /// A commit a crash interrupted is first finished (or rolled back) by recovery.
    pub fn committed_value(&self, key: &str) -> Result<Option<serde_json::Value>, TxnError> {
        let id = TxnId::for_key(key);
        let mut txn = match TxnDir::open(&self.state_dir, &id) {
            Ok(t) => t,
            Err(TxnError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if txn.record.key.as_deref() != Some(key) {
            return Err(TxnError::CorruptRecord {
                path: txn.dir.join("record.json"),
                reason: format!(
                    "keyed {:?}, not {key:?} (a different transaction has its id)",
                    txn.record.key
                ),
            });
        }
        if txn.record.state == TxnState::Committing {
            crate::recover(&self.state_dir, Some(txn.workdir()))?;
            txn = TxnDir::open(&self.state_dir, &id)?;
        }
        Ok(match txn.record.state {
            TxnState::Committed => Some(txn.record.value.unwrap_or_default()),
            _ => None,
        })
    }
}

#[async_trait]
impl TxnOutcomeStore for TxnStore {
    async fn outcome(
        &self,
        txn: &lockbox_journal::TxnId,
    ) -> Result<Option<lockbox_journal::TxnOutcome>, TxnStoreError> {
        let store = self.clone();
        let key = txn.as_str().to_owned();
        let value = tokio::task::spawn_blocking(move || store.committed_value(&key)).await??;
        Ok(value.map(lockbox_journal::TxnOutcome::Committed))
    }
}
