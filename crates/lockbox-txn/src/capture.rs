//! Standard streams of stages: [`Output`] (a stage's stdout, kept in memory up to a bound
//! and spilled to a file beyond it), feeding an output to the next stage's stdin, and the
//! bounded tail of stderr.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Default memory bound of a captured stdout: beyond it the bytes go to a file.
pub const DEFAULT_MEMORY_BOUND: usize = 1 << 20;

/// How many trailing bytes of each stage's stderr the outcome keeps.
pub const STDERR_TAIL: usize = 8 * 1024;

/// A captured stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// All of it, in memory (at most the memory bound).
    Memory(Vec<u8>),
    /// Spilled: the whole output is in this file.
    File {
        /// The file (under the transaction's `out/`, removed with the transaction's data).
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
}

impl Default for Output {
    fn default() -> Output {
        Output::Memory(Vec::new())
    }
}

impl Output {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Output::Memory(v) => v.len() as u64,
            Output::File { len, .. } => *len,
        }
    }

    /// True if nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the whole output into memory.
    pub fn read_all(&self) -> io::Result<Vec<u8>> {
        match self {
            Output::Memory(v) => Ok(v.clone()),
            Output::File { path, .. } => std::fs::read(path),
        }
    }

    /// Moves a spilled output's file to `to` (so it outlives the transaction's data), or
    /// writes an in-memory one there.
    pub(crate) fn persist(self, to: &Path) -> io::Result<Output> {
        match self {
            Output::Memory(v) => {
                std::fs::write(to, &v)?;
                Ok(Output::Memory(v))
            }
            Output::File { path, len } => {
                std::fs::rename(&path, to)?;
                Ok(Output::File {
                    path: to.to_owned(),
                    len,
                })
            }
        }
    }
}

/// A pipe whose ends are close-on-exec (the sandbox gets its end by `dup2`).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Reads `from` to its end: into memory up to `bound` bytes, then everything into `spill`.
pub(crate) fn capture(from: OwnedFd, bound: usize, spill: &Path) -> io::Result<Output> {
    let mut from = File::from(from);
    let mut mem = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(Output::Memory(mem)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if mem.len() + n <= bound {
            mem.extend_from_slice(&buf[..n]);
            continue;
        }
        if let Some(parent) = spill.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = File::create(spill)?;
        file.write_all(&mem)?;
        file.write_all(&buf[..n])?;
        drop(mem);
        let rest = io::copy(&mut from, &mut file)?;
        let len = file.metadata()?.len();
        debug_assert!(len >= rest);
        return Ok(Output::File {
            path: spill.to_owned(),
            len,
        });
    }
}

/// Reads `from` to its end, keeping the last [`STDERR_TAIL`] bytes.
pub(crate) fn tail(from: OwnedFd) -> io::Result<Vec<u8>> {
    let mut from = File::from(from);
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * STDERR_TAIL {
                    kept.drain(..kept.len() - STDERR_TAIL);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    if kept.len() > STDERR_TAIL {
        kept.drain(..kept.len() - STDERR_TAIL);
    }
    Ok(kept)
}

/// Writes `bytes` into `to`; a reader that stops early (EPIPE) is not an error.
pub(crate) fn feed(to: OwnedFd, bytes: &[u8]) -> io::Result<()> {
    let mut to = File::from(to);
    match to.write_all(bytes) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
