//! The per-workdir lock: `STATE/locks/<crc32 of the workdir path>.lock`, held with `flock(2)`
//! while a transaction commits (the short optimistic window) or, with
//! [`LockPolicy::FailIfBusy`] / [`LockPolicy::Wait`], for the whole transaction. The kernel
//! drops it when the holder dies, so a crashed holder never blocks anyone.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use rustix::io::Errno;

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

/// A held workdir lock; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct WorkdirLock {
    _file: File,
}

pub(crate) fn lock_path(state_dir: &Path, workdir: &Path) -> PathBuf {
    let sum = lockbox_cow::crc32(workdir.as_os_str().as_bytes());
    state_dir.join("locks").join(format!("{sum:08x}.lock"))
}

impl WorkdirLock {
    /// Takes the lock of `workdir` (canonical). `wait`: `None` blocks, `Some(d)` gives up
    /// after `d` (zero: do not wait) with [`TxnError::Busy`].
    pub(crate) fn acquire(
        state_dir: &Path,
        workdir: &Path,
        wait: Option<Duration>,
    ) -> Result<WorkdirLock, TxnError> {
        let path = lock_path(state_dir, workdir);
        let err = |source| TxnError::Lock {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(err)?;
        let Some(wait) = wait else {
            rustix::fs::flock(&file, FlockOperation::LockExclusive).map_err(|e| err(e.into()))?;
            return Ok(WorkdirLock { _file: file });
        };
        let until = Instant::now() + wait;
        loop {
            match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(WorkdirLock { _file: file }),
                Err(Errno::WOULDBLOCK) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(Errno::WOULDBLOCK) => {
                    return Err(TxnError::Busy {
                        workdir: workdir.to_owned(),
                    })
                }
                Err(e) => return Err(err(e.into())),
            }
        }
    }
}
