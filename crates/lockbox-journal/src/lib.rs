//! A durable step journal: record/replay of an agent run's steps, so a crashed or redeployed
//! run resumes where it stopped without paying for — or repeating the side effects of — the
//! steps it already finished.
//!
//! # Overview
//!
//! - [`Journal`] sits on a [`Storage`] ([`SqliteStorage`], [`FileStorage`],
//!   [`PostgresStorage`], or any of them from a [`StorageUrl`]).
//! - [`Journal::start`] opens a new session of a run and returns a [`Run`]; each start takes a
//!   higher session number and fences older ones ([`StorageError::Fenced`]).
//! - [`Run::record`] memoises one step under a deterministic [`StepId`] (`llm`, `llm#2`, …);
//!   [`Run::parallel`] runs [`Branches`] whose step names are prefixed with their key.
//! - [`Run::suspend`] / [`Journal::resume`], [`Run::complete`], [`Journal::fork`] cover the
//!   run's lifecycle; [`Run::record_txn`] with a [`TxnOutcomeStore`] gives exactly-once
//!   transactions.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use lockbox_journal::{Journal, RunId, SqliteStorage, StartOptions, StepError};
//!
//! let dir = tempfile::tempdir()?;
//! let journal = Journal::open(Arc::new(SqliteStorage::open(dir.path().join("j.db"))?));
//! let id = RunId::parse("demo")?;
//!
//! let run = journal.start(&id, StartOptions::default()).await?;
//! let answer: u32 = run.record("llm", || async { Ok::<_, String>(42) }).await?;
//! drop(run);
//!
//! // After a crash: the same calls replay from the journal without running the closures.
//! let run = journal.start(&id, StartOptions::default()).await?;
//! let replayed: Result<u32, StepError<String>> =
//!     run.record("llm", || async { unreachable!("memoised") }).await;
//! assert_eq!(replayed?, answer);
//! # Ok(())
//! # }
//! ```
//!
//! Not here: running sandboxes or transactions (the journal only records their results, see
//! [`TxnOutcomeStore`]), CLI parsing beyond [`StorageUrl`], retry policies (callers decide;
//! [`JournalError::is_transient`] helps).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use crate::entry::{Entry, EntryBody, RawEntry, StepOutcome, FORMAT_VERSION};
pub use crate::error::{JournalError, StepError, StorageError, TerminalState};
pub use crate::id::{BranchKey, RunId, StepId};
pub use crate::journal::{
    ForkPoint, Journal, RunState, RunStatus, StartOptions, DEFAULT_MAX_ENTRY_BYTES,
};
pub use crate::run::{Branches, RecordOptions, Run, Suspension};
pub use crate::storage::{FileStorage, Storage, StorageUrl};
#[cfg(feature = "postgres")]
pub use crate::storage::{PostgresStorage, DEFAULT_POSTGRES_CONNECTIONS};
#[cfg(feature = "sqlite")]
pub use crate::storage::{SqliteStats, SqliteStorage};
pub use crate::txn::{TxnId, TxnOutcome, TxnOutcomeStore, TxnStoreError};

pub mod entry;
mod error;
mod id;
mod journal;
mod run;
mod storage;
mod txn;
