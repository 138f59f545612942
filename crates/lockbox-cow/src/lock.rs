//! The per-workdir commit lock: commits into one workdir run one at a time, whichever
//! process makes them, branch commits and transactions alike (`flock` on
//! `STATE/locks/<crc32 of the workdir>.lock`; released when the holder exits, even by
//! `kill -9`).

use crate::error::CowError;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Held while committing into a workdir.
#[derive(Debug)]
pub struct WorkdirLock {
    _file: File,
}

impl WorkdirLock {
    /// Blocks until no other commit into `workdir` (canonical) runs.
    pub fn acquire(state_dir: &Path, workdir: &Path) -> Result<WorkdirLock, CowError> {
        let (file, path) = open(state_dir, workdir)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
            CowError::Lock {
                path,
                source: e.into(),
            }
        })?;
        Ok(WorkdirLock { _file: file })
    }

    /// Like [`WorkdirLock::acquire`], but gives up after `wait` (zero: do not wait) with
    /// `Ok(None)`.
    pub fn acquire_within(
        state_dir: &Path,
        workdir: &Path,
        wait: Duration,
    ) -> Result<Option<WorkdirLock>, CowError> {
        let (file, path) = open(state_dir, workdir)?;
        let until = Instant::now() + wait;
        loop {
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Some(WorkdirLock { _file: file })),
                Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => {
                    return Err(CowError::Lock {
                        path,
                        source: e.into(),
                    })
                }
            }
        }
    }
}

fn open(state_dir: &Path, workdir: &Path) -> Result<(File, PathBuf), CowError> {
    let path = lock_path(state_dir, workdir);
    let err = |source| CowError::Lock {
        path: path.clone(),
        source,
    };
    fs::create_dir_all(state_dir.join("locks")).map_err(err)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(err)?;
    Ok((file, path))
}

/// The lock file of `workdir` (canonical) under `state_dir`.
pub fn lock_path(state_dir: &Path, workdir: &Path) -> PathBuf {
    let sum = crate::meta::crc32(workdir.as_os_str().as_encoded_bytes());
    state_dir.join("locks").join(format!("{sum:08x}.lock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_waits_for_the_first() {
        let state = tempfile::tempdir().unwrap();
        let first = WorkdirLock::acquire(state.path(), Path::new("/w")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = state.path().to_owned();
        let waiter = std::thread::spawn(move || {
            let _second = WorkdirLock::acquire(&dir, Path::new("/w")).unwrap();
            tx.send(()).unwrap();
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        waiter.join().unwrap();
        // Another workdir is independent.
        let _a = WorkdirLock::acquire(state.path(), Path::new("/w")).unwrap();
        let _b = WorkdirLock::acquire(state.path(), Path::new("/other")).unwrap();
    }
}
