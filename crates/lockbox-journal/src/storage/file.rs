//! JSONL backend: one human-readable file per run, `DIR/RUN.jsonl`, one entry per line.
//!
//! Append is one `write(2)` of the whole line (with its newline) on an `O_APPEND` descriptor,
//! then `fdatasync`. A crash can therefore leave at most one torn line, and only at the end of
//! the file, without its newline: readers ignore it and the next writer truncates it away. Any
//! other damage (bad checksum or JSON on a complete line, a gap in offsets) is
//! [`StorageError::Corruption`] with the line's byte offset.
//!
//! The session counter lives in `DIR/RUN.lock`, a 20-digit number rewritten in place by one
//! `pwrite` and fsynced. Every append and session change holds an exclusive `flock(2)` on that
//! file, which makes the fencing check atomic with the write across processes.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rustix::fs::{flock, FlockOperation};

use super::Storage;
use crate::entry::{self, RawEntry};
use crate::error::StorageError;
use crate::id::RunId;

const SESSION_WIDTH: usize = 20;

/// JSONL files in one directory, one per run.
#[derive(Debug, Clone)]
pub struct FileStorage {
    dir: PathBuf,
    /// Open files per run, so an append costs no `open(2)`. Bounded by [`MAX_OPEN_RUNS`].
    open: Arc<Mutex<HashMap<RunId, Arc<Mutex<RunFiles>>>>>,
}

/// Most runs whose files stay open; past it the cache is emptied (files close when unused).
const MAX_OPEN_RUNS: usize = 256;

#[derive(Debug)]
struct RunFiles {
    lock: File,
    lock_path: PathBuf,
    data: DataFile,
}

#[derive(Debug)]
struct DataFile {
    file: File,
    path: PathBuf,
    /// What this handle last saw of the file, so appends need not rescan it.
    tail: Option<Tail>,
}

#[derive(Debug, Clone, Copy)]
struct Tail {
    /// Length of the file's valid part (ends with a newline).
    len: u64,
    /// Number of entries in it.
    count: u64,
}

/// Holds `flock(LOCK_EX)` on a run's lock file; unlocks on drop (the descriptor stays open).
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn exclusive(file: &'a File, path: &Path) -> Result<Self, StorageError> {
        flock(file, FlockOperation::LockExclusive).map_err(|e| StorageError::Io {
            op: "flock",
            path: path.to_owned(),
            source: e.into(),
        })?;
        Ok(Self(file))
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // Closing the descriptor would release it too; an error here leaves nothing to undo.
        let _ = flock(self.0, FlockOperation::Unlock);
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
    move |source| StorageError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

impl FileStorage {
    /// Uses `dir` (created if missing) as the journal.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StorageError> {
        let dir = dir.as_ref().to_owned();
        std::fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
        Ok(Self {
            dir,
            open: Arc::default(),
        })
    }

    /// The directory holding the run files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data_path(&self, run: &RunId) -> PathBuf {
        self.dir.join(format!("{run}.jsonl"))
    }

    /// The run's open files, opening (and creating) them on first use.
    fn files(&self, run: &RunId) -> Result<Arc<Mutex<RunFiles>>, StorageError> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(files) = open.get(run) {
            return Ok(Arc::clone(files));
        }
        let lock_path = self.dir.join(format!("{run}.lock"));
        let data_path = self.data_path(run);
        let created = !lock_path.exists() || !data_path.exists();
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io("open", &lock_path))?;
        let data = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&data_path)
            .map_err(io("open", &data_path))?;
        if created {
            // The new names must survive a crash along with the first fsynced write.
            self.sync_dir()?;
        }
        if open.len() >= MAX_OPEN_RUNS {
            open.clear();
        }
        let files = Arc::new(Mutex::new(RunFiles {
            lock,
            lock_path,
            data: DataFile {
                file: data,
                path: data_path,
                tail: None,
            },
        }));
        open.insert(run.clone(), Arc::clone(&files));
        Ok(files)
    }

    fn sync_dir(&self) -> Result<(), StorageError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync directory", &self.dir))
    }

    fn acquire_blocking(&self, run: &RunId) -> Result<u64, StorageError> {
        let files = self.files(run)?;
        let files = files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _flock = Flock::exclusive(&files.lock, &files.lock_path)?;
        let next = files.read_session()? + 1;
        let text = format!("{next:0width$}", width = SESSION_WIDTH);
        files
            .lock
            .write_all_at(text.as_bytes(), 0)
            .map_err(io("write", &files.lock_path))?;
        files
            .lock
            .sync_data()
            .map_err(io("fsync", &files.lock_path))?;
        Ok(next)
    }

    fn append_blocking(&self, run: &RunId, entry: &RawEntry) -> Result<(), StorageError> {
        let files = self.files(run)?;
        let mut files = files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let files = &mut *files;
        let _flock = Flock::exclusive(&files.lock, &files.lock_path)?;
        let current = files.read_session()?;
        if entry.session != current {
            return Err(StorageError::Fenced {
                run_id: run.clone(),
                session: entry.session,
                current,
            });
        }
        let data = &mut files.data;
        let tail = data.valid_tail(run)?;
        if entry.offset != tail.count {
            return Err(StorageError::OffsetConflict {
                run_id: run.clone(),
                offset: entry.offset,
                len: tail.count,
            });
        }
        let mut line = Vec::with_capacity(entry.line.len() + 1);
        line.extend_from_slice(entry.line.as_bytes());
        line.push(b'\n');
        // One write for the whole line: a crash leaves it whole or torn at the end.
        data.tail = None;
        data.file
            .write_all(&line)
            .map_err(io("write", &data.path))?;
        data.file.sync_data().map_err(io("fsync", &data.path))?;
        data.tail = Some(Tail {
            len: tail.len + line.len() as u64,
            count: tail.count + 1,
        });
        Ok(())
    }

    fn read_blocking(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError> {
        let path = self.data_path(run);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("read", &path)(e)),
        };
        Ok(scan(run, &bytes, from)?.entries)
    }

    fn list_blocking(&self) -> Result<Vec<RunId>, StorageError> {
        let mut runs = Vec::new();
        let dir = std::fs::read_dir(&self.dir).map_err(io("read directory", &self.dir))?;
        for item in dir {
            let item = item.map_err(io("read directory", &self.dir))?;
            let name = item.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) else {
                continue;
            };
            let Ok(run) = RunId::parse(stem) else {
                continue;
            };
            let non_empty = item.metadata().map(|m| m.len() > 0).unwrap_or(false);
            if non_empty && !self.read_blocking(&run, 0)?.is_empty() {
                runs.push(run);
            }
        }
        runs.sort();
        Ok(runs)
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(Self) -> Result<T, StorageError> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(this))
            .await
            .map_err(|_| StorageError::WorkerGone { backend: "file" })?
    }
}

impl RunFiles {
    fn read_session(&self) -> Result<u64, StorageError> {
        let mut buf = [0u8; SESSION_WIDTH];
        let n = self
            .lock
            .read_at(&mut buf, 0)
            .map_err(io("read", &self.lock_path))?;
        if n == 0 {
            return Ok(0);
        }
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| StorageError::Io {
                op: "parse session counter",
                path: self.lock_path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not a number"),
            })
    }
}

impl DataFile {
    /// The valid part of the data file, under the flock. Uses the cached tail while the file
    /// length still matches it (no other process appended); otherwise rescans, truncating a
    /// torn last line left by a crash.
    fn valid_tail(&mut self, run: &RunId) -> Result<Tail, StorageError> {
        let len = self.file.metadata().map_err(io("stat", &self.path))?.len();
        if let Some(tail) = self.tail.filter(|t| t.len == len) {
            return Ok(tail);
        }
        let mut bytes = Vec::new();
        let mut reader = File::open(&self.path).map_err(io("open", &self.path))?;
        reader
            .read_to_end(&mut bytes)
            .map_err(io("read", &self.path))?;
        let scan = scan(run, &bytes, u64::MAX)?;
        if scan.valid_len != bytes.len() as u64 {
            tracing::debug!(run = %run, path = ?self.path, torn_at = scan.valid_len, "truncating torn last line");
            self.file
                .set_len(scan.valid_len)
                .map_err(io("truncate", &self.path))?;
            self.file.sync_data().map_err(io("fsync", &self.path))?;
        }
        let tail = Tail {
            len: scan.valid_len,
            count: scan.count,
        };
        self.tail = Some(tail);
        Ok(tail)
    }
}

struct Scan {
    entries: Vec<RawEntry>,
    /// Number of complete entries in the file.
    count: u64,
    /// Byte length of the complete lines.
    valid_len: u64,
}

/// Splits a run file into entries with offset `>= from`, checking each complete line; a last
/// line without its newline is a torn append and is left out of `valid_len`.
fn scan(run: &RunId, bytes: &[u8], from: u64) -> Result<Scan, StorageError> {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    let mut expected = 0u64;
    while pos < bytes.len() {
        let Some(nl) = bytes[pos..].iter().position(|&b| b == b'\n') else {
            break; // torn last line
        };
        let corrupt = |detail: String| StorageError::Corruption {
            run_id: run.clone(),
            offset: pos as u64,
            detail,
        };
        let line = std::str::from_utf8(&bytes[pos..pos + nl])
            .map_err(|e| corrupt(format!("not UTF-8: {e}")))?;
        let decoded = entry::decode(line).map_err(|e| corrupt(e.to_string()))?;
        if decoded.offset != expected || &decoded.run != run {
            return Err(corrupt(format!(
                "entry says run {} offset {}, expected run {run} offset {expected}",
                decoded.run, decoded.offset
            )));
        }
        if decoded.offset >= from {
            entries.push(RawEntry {
                offset: decoded.offset,
                session: decoded.session,
                line: line.to_owned(),
            });
        }
        expected += 1;
        pos += nl + 1;
    }
    Ok(Scan {
        entries,
        count: expected,
        valid_len: pos as u64,
    })
}

#[async_trait]
impl Storage for FileStorage {
    async fn acquire_session(&self, run: &RunId) -> Result<u64, StorageError> {
        let run = run.clone();
        self.blocking(move |s| s.acquire_blocking(&run)).await
    }

    async fn append(&self, run: &RunId, entry: RawEntry) -> Result<(), StorageError> {
        let run = run.clone();
        self.blocking(move |s| s.append_blocking(&run, &entry))
            .await
    }

    async fn read(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError> {
        let run = run.clone();
        self.blocking(move |s| s.read_blocking(&run, from)).await
    }

    async fn list_runs(&self) -> Result<Vec<RunId>, StorageError> {
        self.blocking(|s| s.list_blocking()).await
    }
}
