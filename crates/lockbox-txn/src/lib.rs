//! Transactions over groups of lockbox sandboxes: all of their writes reach the workdir
//! together, or none do.
//!
//! Brief overview:
//! - [`Pipeline`]: sequential [`Stage`]s; stage N sees the writes of stages 1..N-1
//!   (read-committed, each stage its own overlayfs upper layer) and reads stage N-1's
//!   stdout; the last stdout is the pipeline's;
//! - [`Gather`]: named sources in parallel on snapshots of the workdir, merged under a
//!   [`ConflictPolicy`] ([`MergeConflict`]s, [`Marker`]s), then a consumer on the merged
//!   view reading `$LOCKBOX_INPUTS/<name>`;
//! - [`LayerGather`]: the same merge and commit over layers that exist already (running
//!   sandboxes' branches, forks of one snapshot), their shared layers as the common base;
//! - [`TxnOutcome`]: `committed`, every [`StageResult`] (even when aborted), the union of
//!   changes, the [`AbortReason`]; [`TxnOutcome::exit_code`] follows the CLI conventions;
//! - [`PreparedTxn`]: `prepare()` runs everything and keeps the layers; `commit()`,
//!   `abort()`, or dropped = aborted; [`PreparedTxn::open`] resumes one from another process;
//! - the commit protocol (module `commit`): staging + `syncfs`, a checksummed WAL intent as
//!   the commit point, apply by renames; [`recover`] rolls interrupted transactions forward
//!   or back and removes what a crash left half-made; the durable store is
//!   `STATE/txns/<id>/`, built aside and renamed into place ([`list`], [`TxnRecord`],
//!   [`remove_damaged`] for a record a power loss tore);
//! - [`Selection`]: commit only part of the changes (`only` / `exclude` paths);
//! - [`LockPolicy`]: optimistic base check at commit (exit 5: write-write conflicts; reads
//!   are not tracked) or a workdir lock held for the whole transaction; [`TxnOptions`]: everything a pipeline or gather is configured with
//!   besides its stages; [`Transaction`]: either of them;
//! - [`journaled`]: journal steps that run a sandbox ([`record_exec`]) or a transaction,
//!   exactly once ([`record_transaction`], [`TxnStore`]).
//!
//! ```no_run
//! # fn main() -> Result<(), lockbox_txn::TxnError> {
//! use lockbox_policy::Policy;
//! use lockbox_txn::{Pipeline, Stage};
//! use std::path::Path;
//! let outcome = Pipeline::new(Path::new("/var/lib/lockbox"), Path::new("/home/me/repo"))
//!     .stage(Stage::sh(Policy::default(), "cd /home/me/repo && echo hi > a.txt"))
//!     .stage(Stage::sh(Policy::default(), "cd /home/me/repo && cat a.txt > b.txt"))
//!     .run()?;
//! println!("committed: {}, exit {}", outcome.committed, outcome.exit_code());
//! # Ok(()) }
//! ```
//!
//! Not here: isolation itself (`lockbox-confine`), the layer/change-set/commit engine
//! (`lockbox-cow`), command-line parsing (`lockbox-cli`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use crate::capture::{Output, DEFAULT_MEMORY_BOUND, STDERR_TAIL};
pub use crate::commit::{recover, recover_workdir, remove_damaged, RecoveryReport};
pub use crate::error::TxnError;
pub use crate::gather::{ConflictPolicy, Gather};
pub use crate::id::TxnId;
#[cfg(feature = "journaled")]
pub use crate::journaled::{record_exec, record_transaction, ExecResult, JournaledError, TxnStore};
pub use crate::layer_gather::{LayerGather, LayerSource, PreparedGather};
pub use crate::lock::LockPolicy;
pub use crate::options::TxnOptions;
pub use crate::outcome::{stage_label, AbortReason, Marker, MergeConflict, TxnOutcome};
pub use crate::pipeline::Pipeline;
pub use crate::prepared::{PreparedTxn, Selection};
pub use crate::record::{Intent, TxnKind, TxnRecord, TxnState, RECORD_FORMAT_VERSION};
pub use crate::spec::{ImageResolver, StageImageError, StageSpec, Txn, TxnSpec};
pub use crate::stage::{Stage, StageResult};
pub use crate::store::{list, txns_dir, ListedTxn};
pub use crate::transaction::Transaction;

mod capture;
mod commit;
mod error;
mod gather;
#[cfg(test)]
mod history;
mod id;
#[cfg(feature = "journaled")]
pub mod journaled;
mod layer_gather;
mod lock;
mod options;
mod outcome;
mod pipeline;
mod prepared;
mod record;
mod scope;
mod spec;
mod stage;
mod store;
mod transaction;
