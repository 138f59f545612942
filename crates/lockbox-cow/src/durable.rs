//! Crash-safe small-file writes: temp file + fsync + rename + fsync of the directory, the rule
//! for every record lockbox keeps (ARCHITECTURE.md, "On-disk state").

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Whether a write or removal is on disk when the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsynced: survives a crash.
    Durable,
    /// Left to the kernel's writeback: a crash may undo it. Only for state whose loss, or
    /// whose return, recovery handles.
    Lazy,
}

/// Writes `bytes` to `dir/name` so that after a crash the file holds either its old content or
/// all of `bytes`.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    write_replacing(dir, name, bytes, true)
}

/// Replaces `dir/name` with `bytes` by a rename, so readers see the old or the new content,
/// never a mix, but without waiting for the disk: after a power loss the file may hold the
/// old content (or be empty). For records whose loss recovery tolerates.
pub fn write_replace(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    write_replacing(dir, name, bytes, false)
}

fn write_replacing(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        fs::rename(&tmp, dir.join(name))?;
        if durable {
            fsync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Fsyncs a directory so entries created, renamed or removed in it are durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
