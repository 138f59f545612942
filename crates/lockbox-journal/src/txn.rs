//! Exactly-once transactions: the seam between the journal and the (future) transaction
//! engine in `lockbox-txn`.
//!
//! A transaction step can die *after* the transaction committed but *before* its journal
//! append. A plain `record` would then run it again on replay and commit twice.
//! [`Run::record_txn`] closes that window: the transaction's id is derived from the run and
//! step ids (so it is the same on every replay), and before running the step it asks the
//! transaction store, through [`TxnOutcomeStore`], whether that id already has a durable
//! outcome. If so it journals that outcome instead of running the step.
//!
//! The engine must (1) use the [`TxnId`] it is handed as its transaction's key and (2) record
//! the outcome durably in the same commit that applies the transaction.

use std::future::Future;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::entry::StepOutcome;
use crate::error::{JournalError, StepError};
use crate::journal::to_json;
use crate::run::{RecordOptions, Run};

/// The key of a journaled transaction: `RUN/STEP_ID`, identical on every replay.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxnId(String);

impl TxnId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TxnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A transaction's durable outcome, as the transaction store knows it.
#[derive(Debug, Clone, PartialEq)]
pub enum TxnOutcome {
    /// Committed; the value is what the step returned (JSON of its `T`).
    Committed(serde_json::Value),
    /// Rolled back for good; the value is the step's error (JSON of its `E`).
    Aborted(serde_json::Value),
}

/// The error type a [`TxnOutcomeStore`] returns.
pub type TxnStoreError = Box<dyn std::error::Error + Send + Sync>;

/// What the journal needs from the transaction engine: the outcome of a transaction by id.
#[async_trait]
pub trait TxnOutcomeStore: Send + Sync {
    /// The durable outcome of `txn`, or `None` if it never committed or aborted (it may be
    /// run, and must be safe to run, again).
    async fn outcome(&self, txn: &TxnId) -> Result<Option<TxnOutcome>, TxnStoreError>;
}

impl Run {
    /// Like [`Run::record`] for a step that runs a transaction: `f` gets the transaction id
    /// to use. On replay without a journaled outcome, `store` is asked first, so a transaction
    /// that committed just before a crash is not committed again.
    pub async fn record_txn<T, E, F, Fut, S>(
        &self,
        name: &str,
        store: &S,
        f: F,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        S: TxnOutcomeStore + ?Sized,
        F: FnOnce(TxnId) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.record_txn_with(name, store, RecordOptions::default(), f)
            .await
    }

    /// [`Run::record_txn`] with options: errors for which `opts` says retryable are returned
    /// but not journaled (e.g. the transaction engine failed before committing anything).
    pub async fn record_txn_with<T, E, F, Fut, S>(
        &self,
        name: &str,
        store: &S,
        opts: RecordOptions<E>,
        f: F,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        S: TxnOutcomeStore + ?Sized,
        F: FnOnce(TxnId) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (full, step_id) = self.next_step_id(name)?;
        if let Some(memo) = self.memo(&step_id) {
            let outcome = self.replayed_step(&step_id, &full, memo)?;
            tokio::task::yield_now().await;
            return match outcome {
                StepOutcome::Ok(v) => Ok(self.decode(&step_id, memo.offset, v)?),
                StepOutcome::Err(v) => {
                    Err(StepError::Failed(self.decode(&step_id, memo.offset, v)?))
                }
            };
        }
        let txn = TxnId(format!("{}/{}", self.id(), step_id));
        let known = store
            .outcome(&txn)
            .await
            .map_err(|source| JournalError::TxnOutcomeLookup {
                run_id: self.id().clone(),
                txn_id: txn.to_string(),
                source,
            })?;
        let outcome = match known {
            Some(TxnOutcome::Committed(v)) => {
                tracing::debug!(%txn, "transaction already committed; journaling its outcome");
                let value: T = self.decode(&step_id, 0, &v)?;
                self.append_step(step_id, full, StepOutcome::Ok(v)).await?;
                return Ok(value);
            }
            Some(TxnOutcome::Aborted(v)) => {
                let err: E = self.decode(&step_id, 0, &v)?;
                self.append_step(step_id, full, StepOutcome::Err(v)).await?;
                return Err(StepError::Failed(err));
            }
            None => f(txn).await,
        };
        match outcome {
            Ok(value) => {
                let json = to_json(self.id(), step_id.as_str(), &value)?;
                self.append_step(step_id, full, StepOutcome::Ok(json))
                    .await?;
                Ok(value)
            }
            Err(err) if (opts.retryable)(&err) => {
                self.release_step_id(&full, &step_id);
                Err(StepError::Failed(err))
            }
            Err(err) => {
                let json = to_json(self.id(), step_id.as_str(), &err)?;
                self.append_step(step_id, full, StepOutcome::Err(json))
                    .await?;
                Err(StepError::Failed(err))
            }
        }
    }
}
