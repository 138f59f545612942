//! [`TxnError`]: what failed while running, committing or recovering a transaction.

use std::io;
use std::path::PathBuf;

use lockbox_policy::name::quoted;

use crate::TxnId;
use lockbox_policy::ErrorCode;

/// A failure of the transaction machinery (a stage that fails is not an error: it aborts the
/// transaction and is reported in [`crate::TxnOutcome`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// A transaction id is empty, too long or not a plain name.
    #[error("invalid transaction id {id:?}: {reason}")]
    InvalidId {
        /// The rejected id.
        id: String,
        /// Why.
        reason: &'static str,
    },
    /// No transaction with this id in the state directory.
    #[error("transaction {id} not found in {}", quoted(.state_dir))]
    NotFound {
        /// The id asked for.
        id: TxnId,
        /// The state directory searched.
        state_dir: PathBuf,
    },
    /// A pipeline without stages, a gather without sources or a duplicate source name.
    #[error("bad transaction: {reason}")]
    Usage {
        /// What is wrong.
        reason: String,
    },
    /// The transaction is not in a state that allows the operation.
    #[error("transaction {id} is {state}, cannot {operation}")]
    WrongState {
        /// The transaction.
        id: TxnId,
        /// Its state.
        state: &'static str,
        /// What was asked.
        operation: &'static str,
    },
    /// Creating or reading the transaction store failed.
    #[error("transaction store {}: {source}", quoted(.path))]
    Store {
        /// The directory or file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing a durable record (transaction record or WAL intent) failed.
    #[error("write {}: {source}", quoted(.path))]
    WriteRecord {
        /// The record file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A durable record could not be read.
    #[error("read {}: {source}", quoted(.path))]
    ReadRecord {
        /// The record file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A durable record is damaged or of an unknown format version.
    #[error("corrupt record {}: {reason}", quoted(.path))]
    CorruptRecord {
        /// The record file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Capturing or feeding a stage's standard streams failed.
    #[error("stage {stage} stdio: {source}")]
    Stdio {
        /// The stage (or source) name.
        stage: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A stage's image could not be resolved (not in the store, a failed pull, a bad
    /// config).
    #[error("{stage}: image {image:?}: {reason}")]
    Image {
        /// The stage (`stage 2`, `source "lint"`, `the consumer`).
        stage: String,
        /// The reference its policy names.
        image: String,
        /// The image store's message.
        reason: String,
        /// Its code (`IMAGE_NOT_FOUND`, ...).
        code: ErrorCode,
        /// Its exit code.
        exit: u8,
    },
    /// Another transaction holds the workdir lock (`LockPolicy::FailIfBusy`, or the wait
    /// timed out).
    #[error("workdir {} is busy: another transaction holds its lock", quoted(.workdir))]
    Busy {
        /// The workdir.
        workdir: PathBuf,
    },
    /// Building the view or change set, or staging, failed before the commit point; nothing
    /// was applied. Also carries [`lockbox_cow::CowError::StaleBase`] (exit code 5).
    #[error(transparent)]
    Cow(#[from] lockbox_cow::CowError),
    /// Applying failed after the commit point: the transaction is durable and
    /// `recover` finishes it.
    #[error("commit of {id} failed after its commit point (run recovery to finish it): {source}")]
    Apply {
        /// The transaction.
        id: TxnId,
        /// The underlying error.
        source: lockbox_cow::CowError,
    },
}

impl TxnError {
    /// A stable, `SCREAMING_SNAKE` code for the wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            TxnError::InvalidId { .. } => ErrorCode::InvalidTxnId,
            TxnError::NotFound { .. } => ErrorCode::TxnNotFound,
            TxnError::Usage { .. } => ErrorCode::TxnUsage,
            TxnError::WrongState { .. } => ErrorCode::TxnWrongState,
            TxnError::Store { .. } => ErrorCode::TxnStore,
            TxnError::WriteRecord { .. } => ErrorCode::TxnWriteRecord,
            TxnError::ReadRecord { .. } => ErrorCode::TxnReadRecord,
            TxnError::CorruptRecord { .. } => ErrorCode::TxnCorruptRecord,
            TxnError::Stdio { .. } => ErrorCode::TxnStdio,
            TxnError::Busy { .. } => ErrorCode::WorkdirBusy,
            TxnError::Image { code, .. } => *code,
            TxnError::Cow(e) => e.code(),
            TxnError::Apply { .. } => ErrorCode::TxnApply,
        }
    }

    /// The exit code (ARCHITECTURE.md): 2 usage, 4 commit failed (recoverable), 5 workdir
    /// busy or stale base, 125 the transaction could not be set up.
    pub fn exit_code(&self) -> u8 {
        match self {
            TxnError::InvalidId { .. }
            | TxnError::NotFound { .. }
            | TxnError::Usage { .. }
            | TxnError::WrongState { .. } => 2,
            TxnError::Busy { .. } => 5,
            TxnError::Image { exit, .. } => *exit,
            TxnError::Cow(e) if e.exit_code() == 5 => 5,
            TxnError::Store { .. } | TxnError::Stdio { .. } => 125,
            _ => 4,
        }
    }
}
