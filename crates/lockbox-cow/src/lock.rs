//! The per-workdir commit lock: commits into one workdir run one at a time, whichever
//! process makes them (`flock` on `STATE/locks/<hash of the workdir>.lock`; released when
//! the holder exits, even by `kill -9`).

use crate::error::CowError;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Held while committing into a workdir.
#[derive(Debug)]
pub struct WorkdirLock {
    _file: File,
}

impl WorkdirLock {
    /// Blocks until no other commit into `workdir` (canonical) runs.
    pub fn acquire(state_dir: &Path, workdir: &Path) -> Result<WorkdirLock, CowError> {
        let dir = state_dir.join("locks");
        let path = dir.join(format!(
            "{:016x}.lock",
            fnv1a(workdir.as_os_str().as_encoded_bytes())
        ));
        let err = |source| CowError::Lock {
            path: path.clone(),
            source,
        };
        fs::create_dir_all(&dir).map_err(err)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(err)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| err(e.into()))?;
        Ok(WorkdirLock { _file: file })
    }
}

/// FNV-1a: a stable name for the lock file (a collision only serialises two workdirs).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
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
