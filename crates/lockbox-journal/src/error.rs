//! Errors: [`JournalError`] for everything the journal API returns, [`StorageError`] for what a
//! backend reports, and [`StepError`] which a `record` call returns (the step's own failure or a
//! journal failure). Each has a stable `code()`; `docs/journal.md` says what a dispatcher should
//! do with each.

use std::path::PathBuf;

use crate::id::{RunId, StepId};
use lockbox_codes::ErrorCode;

/// Why a run is finished and cannot be started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TerminalState {
    /// `complete` was journaled.
    Completed,
    /// `error` was journaled.
    Failed,
    /// `cancel` was journaled.
    Cancelled,
}

impl std::fmt::Display for TerminalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        })
    }
}

/// An error from the journal API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// A run id failed validation.
    #[error("invalid run id {input:?}: {reason}")]
    InvalidRunId {
        /// The rejected text.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A step name (or step id) failed validation.
    #[error("invalid step name {name:?}: {reason}")]
    InvalidStepName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `parallel` branch key failed validation.
    #[error("invalid branch key {key:?}: {reason}")]
    InvalidBranchKey {
        /// The rejected key.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two `parallel` branches share a key.
    #[error("duplicate branch key {key:?}")]
    DuplicateBranchKey {
        /// The repeated key.
        key: String,
    },
    /// On replay, the step journaled under this id had another name than the current call:
    /// the code changed or branches ran in another order.
    #[error(
        "replay mismatch in run {run_id} at step {step_id} (entry offset {offset}): \
         journaled {journaled_name:?}, called {called_name:?}"
    )]
    ReplayMismatch {
        /// The run.
        run_id: RunId,
        /// The step id both calls produced.
        step_id: StepId,
        /// The name stored in the journal.
        journaled_name: String,
        /// The name the current code passed.
        called_name: String,
        /// Offset of the journaled entry in the run.
        offset: u64,
    },
    /// `start` was given another version than the run's first start.
    #[error("version mismatch for run {run_id}: journaled {journaled:?}, requested {requested:?}")]
    VersionMismatch {
        /// The run.
        run_id: RunId,
        /// The version of the first start.
        journaled: Option<String>,
        /// The version passed now.
        requested: Option<String>,
    },
    /// `start` was given other metadata than the run's first start.
    #[error("metadata mismatch for run {run_id}: journaled {journaled}, requested {requested}")]
    MetadataMismatch {
        /// The run.
        run_id: RunId,
        /// The metadata of the first start.
        journaled: serde_json::Value,
        /// The metadata passed now.
        requested: serde_json::Value,
    },
    /// The run already finished; it can be read or forked but not continued.
    #[error("run {run_id} is {state}; it cannot be continued (fork it instead)")]
    TerminalRun {
        /// The run.
        run_id: RunId,
        /// How it finished.
        state: TerminalState,
    },
    /// An entry was written in a format this build does not read.
    #[error(
        "run {run_id} entry {offset} has format version {found}; this build reads {supported}"
    )]
    UnsupportedFormat {
        /// The run.
        run_id: RunId,
        /// Entry offset.
        offset: u64,
        /// The entry's format version.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// A step's journaled value exceeds the configured limit; it was not journaled.
    #[error(
        "step {step_id} of run {run_id}: entry is {size} bytes, over the limit of {limit} bytes"
    )]
    StepTooLarge {
        /// The run.
        run_id: RunId,
        /// The step.
        step_id: StepId,
        /// Size of the encoded entry.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A value could not be turned into JSON.
    #[error("step {step_id} of run {run_id}: cannot encode value: {source}")]
    EncodeValue {
        /// The run.
        run_id: RunId,
        /// The step (or lifecycle event).
        step_id: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A journaled value does not decode into the type the current code asks for.
    #[error("step {step_id} of run {run_id} (entry offset {offset}): cannot decode journaled value: {source}")]
    DecodeValue {
        /// The run.
        run_id: RunId,
        /// The step.
        step_id: String,
        /// Offset of the entry.
        offset: u64,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A read of a journal that does not exist (nothing is created for a read).
    #[error("no journal at {url}: {why}")]
    NoJournal {
        /// The storage URL as given.
        url: String,
        /// What is missing.
        why: String,
    },
    /// The run has no entries.
    #[error("run {run_id} not found")]
    RunNotFound {
        /// The run.
        run_id: RunId,
    },
    /// A fork target already has entries.
    #[error("run {run_id} already exists")]
    RunExists {
        /// The run.
        run_id: RunId,
    },
    /// `fork --from-step` named a step the run does not have.
    #[error("run {run_id} has no step {step_id}")]
    StepNotFound {
        /// The run.
        run_id: RunId,
        /// The missing step.
        step_id: StepId,
    },
    /// `fork --from-offset` named an offset past the end of the run.
    #[error("run {run_id} has {len} entries; cannot fork at offset {offset}")]
    OffsetOutOfRange {
        /// The run.
        run_id: RunId,
        /// The requested offset.
        offset: u64,
        /// How many entries the run holds.
        len: u64,
    },
    /// `resume` found no suspension waiting for a value.
    #[error("run {run_id} is not suspended")]
    NotSuspended {
        /// The run.
        run_id: RunId,
    },
    /// The transaction store could not say whether a transaction committed.
    #[error("run {run_id}: cannot look up outcome of transaction {txn_id}: {source}")]
    TxnOutcomeLookup {
        /// The run.
        run_id: RunId,
        /// The transaction.
        txn_id: String,
        /// The store's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The storage URL could not be parsed.
    #[error("invalid journal url {input:?}: {reason} (expected sqlite:PATH, file:DIR or postgres://...)")]
    InvalidStorageUrl {
        /// The rejected text.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The storage backend failed, or refused the append: a newer session fenced this one
    /// ([`StorageError::Fenced`]), another writer raced it ([`StorageError::OffsetConflict`]),
    /// or stored data is damaged ([`StorageError::Corruption`]). Match these through
    /// [`JournalError::storage`].
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl JournalError {
    /// A stable `SCREAMING_SNAKE` code for the wire and for dispatchers.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidRunId { .. } => ErrorCode::InvalidRunId,
            Self::InvalidStepName { .. } => ErrorCode::InvalidStepName,
            Self::InvalidBranchKey { .. } => ErrorCode::InvalidBranchKey,
            Self::DuplicateBranchKey { .. } => ErrorCode::DuplicateBranchKey,
            Self::ReplayMismatch { .. } => ErrorCode::ReplayMismatch,
            Self::VersionMismatch { .. } => ErrorCode::VersionMismatch,
            Self::MetadataMismatch { .. } => ErrorCode::MetadataMismatch,
            Self::TerminalRun { .. } => ErrorCode::TerminalRun,
            Self::UnsupportedFormat { .. } => ErrorCode::UnsupportedFormat,
            Self::StepTooLarge { .. } => ErrorCode::StepTooLarge,
            Self::EncodeValue { .. } => ErrorCode::EncodeValue,
            Self::DecodeValue { .. } => ErrorCode::DecodeValue,
            Self::RunNotFound { .. } => ErrorCode::RunNotFound,
            Self::NoJournal { .. } => ErrorCode::NoJournal,
            Self::RunExists { .. } => ErrorCode::RunExists,
            Self::StepNotFound { .. } => ErrorCode::StepNotFound,
            Self::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            Self::NotSuspended { .. } => ErrorCode::NotSuspended,
            Self::TxnOutcomeLookup { .. } => ErrorCode::TxnOutcomeLookup,
            Self::InvalidStorageUrl { .. } => ErrorCode::InvalidStorageUrl,
            Self::Storage(e) => e.code(),
        }
    }

    /// The backend's error, if this is one (fencing, races and damage included).
    pub fn storage(&self) -> Option<&StorageError> {
        match self {
            Self::Storage(e) => Some(e),
            _ => None,
        }
    }

    /// Whether trying the same operation again later may succeed (storage outages). Everything
    /// else needs a code change, a fork or a human.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Storage(e) => e.is_transient(),
            Self::TxnOutcomeLookup { .. } => true,
            _ => false,
        }
    }
}

/// An error reported by a [`Storage`](crate::Storage) backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The append's session is older than the run's newest session.
    #[error("run {run_id}: session {session} is fenced by newer session {current}")]
    Fenced {
        /// The run.
        run_id: RunId,
        /// The session of the rejected append.
        session: u64,
        /// The newest session.
        current: u64,
    },
    /// The append's offset is not the run's length.
    #[error("run {run_id}: append at offset {offset} but the run has {len} entries")]
    OffsetConflict {
        /// The run.
        run_id: RunId,
        /// Where the append was meant to go.
        offset: u64,
        /// How many entries the run holds.
        len: u64,
    },
    /// Stored data is damaged.
    #[error("journal corruption in run {run_id} at offset {offset}: {detail}")]
    Corruption {
        /// The run.
        run_id: RunId,
        /// Byte offset (file backend) or entry offset (database backends).
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`open`, `fsync`, …).
        op: &'static str,
        /// On which file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An SQLite call failed.
    #[cfg(feature = "sqlite")]
    #[error("sqlite {op} on {path}: {source}")]
    Sqlite {
        /// What was being done.
        op: &'static str,
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        source: rusqlite::Error,
    },
    /// A batched SQLite transaction failed; every request in the batch failed with it.
    #[error("sqlite {op} on {path}: {detail}")]
    SqliteBatch {
        /// What was being done (`begin`, `commit`).
        op: &'static str,
        /// The database file.
        path: PathBuf,
        /// The SQLite error, as text (one error is shared by the whole batch).
        detail: String,
    },
    /// A PostgreSQL call failed.
    #[cfg(feature = "postgres")]
    #[error("postgres {op}: {source}")]
    Postgres {
        /// What was being done.
        op: &'static str,
        /// The driver error.
        source: tokio_postgres::Error,
    },
    /// A PostgreSQL schema name is not a plain identifier.
    #[error("invalid postgres schema {schema:?}: must match [a-z_][a-z0-9_]*")]
    InvalidSchema {
        /// The rejected name.
        schema: String,
    },
    /// The storage was asked for something this build does not do (e.g. TLS to PostgreSQL).
    #[error("not supported: {what}")]
    Unsupported {
        /// What, and what to do instead.
        what: String,
    },
    /// The backend's worker thread or task is gone (it panicked or the runtime shut down).
    #[error("{backend} storage worker stopped")]
    WorkerGone {
        /// Which backend.
        backend: &'static str,
    },
}

impl StorageError {
    /// A stable `SCREAMING_SNAKE` code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Fenced { .. } => ErrorCode::Fenced,
            Self::OffsetConflict { .. } => ErrorCode::OffsetConflict,
            Self::Corruption { .. } => ErrorCode::JournalCorruption,
            Self::Io { .. } => ErrorCode::StorageIo,
            #[cfg(feature = "sqlite")]
            Self::Sqlite { .. } => ErrorCode::StorageSqlite,
            Self::SqliteBatch { .. } => ErrorCode::StorageSqlite,
            #[cfg(feature = "postgres")]
            Self::Postgres { .. } => ErrorCode::StoragePostgres,
            Self::InvalidSchema { .. } => ErrorCode::InvalidSchema,
            Self::Unsupported { .. } => ErrorCode::StorageUnsupported,
            Self::WorkerGone { .. } => ErrorCode::StorageWorkerGone,
        }
    }

    /// Whether the operation may succeed if tried again (I/O, lock timeouts, lost connections).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Io { .. } | Self::SqliteBatch { .. } => true,
            #[cfg(feature = "sqlite")]
            Self::Sqlite { .. } => true,
            #[cfg(feature = "postgres")]
            Self::Postgres { .. } => true,
            _ => false,
        }
    }
}

/// What `record` returns when it does not return the step's value.
#[derive(Debug, thiserror::Error)]
pub enum StepError<E> {
    /// The step itself failed (now, or when it was first run and journaled).
    #[error("step failed: {0}")]
    Failed(E),
    /// The journal failed; the step's outcome may not be recorded.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl<E> StepError<E> {
    /// A stable code: `STEP_FAILED` or the journal error's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Failed(_) => ErrorCode::StepFailed,
            Self::Journal(e) => e.code(),
        }
    }

    /// The step's own error, if that is what this is.
    pub fn into_failed(self) -> Option<E> {
        match self {
            Self::Failed(e) => Some(e),
            Self::Journal(_) => None,
        }
    }
}
