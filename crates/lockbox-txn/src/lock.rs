//! The per-workdir lock ([`lockbox_cow::WorkdirLock`]: `STATE/locks/<crc32 of the workdir
//! path>.lock`, held with `flock(2)`, the same lock branch commits take) while a transaction
//! commits (the short optimistic window) or, with
//! [`LockPolicy::FailIfBusy`] / [`LockPolicy::Wait`], for the whole transaction. The kernel
//! drops it when the holder dies, so a crashed holder never blocks anyone.

use std::path::Path;
use std::time::Duration;

use crate::TxnError;

/// Concurrency control between transactions over one workdir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockPolicy {
    /// Run freely; at commit, under a short lock, refuse (exit 5) if a path the transaction
    /// changes was changed in the workdir since the transaction began.
    #[default]
    Optimistic,
    /// Hold the workdir lock for the whole transaction; fail at once (exit 5) if it is held.
    FailIfBusy,
    /// Hold the workdir lock for the whole transaction; wait for it (at most this long, or
    /// forever with `None`), then fail with exit 5.
    Wait(Option<Duration>),
}

/// A held workdir lock (lockbox-cow's, shared with branch commits); dropping it releases it.
pub(crate) type WorkdirLock = lockbox_cow::WorkdirLock;

/// Takes the lock of `workdir` (canonical). `wait`: `None` blocks, `Some(d)` gives up after
/// `d` (zero: do not wait) with [`TxnError::Busy`].
pub(crate) fn acquire(
    state_dir: &Path,
    workdir: &Path,
    wait: Option<Duration>,
) -> Result<WorkdirLock, TxnError> {
    let lock = match wait {
        None => Some(WorkdirLock::acquire(state_dir, workdir)?),
        Some(wait) => WorkdirLock::acquire_within(state_dir, workdir, wait)?,
    };
    lock.ok_or_else(|| TxnError::Busy {
        workdir: workdir.to_owned(),
    })
}
