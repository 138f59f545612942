//! Long-lived sandboxes driven through an API: persistent shell sessions, background
//! processes with bounded cursor-addressed logs, PTYs, file operations resolved inside the
//! sandbox, and workspace operations on the sandbox's copy-on-write branch.
//!
//! Not here: HTTP (`lockbox-server`), confinement itself (`lockbox-confine`), branches and
//! the commit engine (`lockbox-cow`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod streams;
mod types;

pub use crate::error::RuntimeError;
pub use crate::streams::{ExecStream, FileRead, LogStream, PtyAttachment, PtyOutput};
pub use crate::types::*;

use bytes::Bytes;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncRead;

fn not_yet<T>() -> Result<T, RuntimeError> {
    Err(RuntimeError::Internal("not yet".into()))
}

/// The runtime: all sandboxes of one state directory. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

#[derive(Debug)]
struct RuntimeInner {
    _config: RuntimeConfig,
}

impl Runtime {
    /// Opens the state directory; sandboxes a previous runtime left running become `Lost`.
    pub async fn open(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        Ok(Runtime {
            inner: Arc::new(RuntimeInner { _config: config }),
        })
    }

    /// Creates and starts a sandbox.
    pub async fn create_sandbox(&self, spec: SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        let _ = (spec, &self.inner);
        not_yet()
    }

    /// All sandboxes, running and recorded (stopped, lost), oldest first.
    pub async fn list_sandboxes(&self) -> Vec<SandboxInfo> {
        Vec::new()
    }

    /// A handle to a running sandbox.
    pub async fn sandbox(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        Err(RuntimeError::SandboxNotFound { id: id.to_owned() })
    }

    /// What a sandbox is.
    pub async fn sandbox_info(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        Err(RuntimeError::SandboxNotFound { id: id.to_owned() })
    }

    /// Kills everything in the sandbox and applies its `on_exit`.
    pub async fn delete_sandbox(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        Err(RuntimeError::SandboxNotFound { id: id.to_owned() })
    }

    /// Deletes every running sandbox (each with its `on_exit`).
    pub async fn shutdown(&self) {}
}

/// A handle to a running sandbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sandbox {
    id: Arc<str>,
}

impl Sandbox {
    /// The sandbox's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Starts a session (a persistent bash).
    pub async fn create_session(&self, opts: SessionOptions) -> Result<SessionInfo, RuntimeError> {
        let _ = opts;
        not_yet()
    }

    /// Ends a session, killing what runs in it.
    pub async fn delete_session(&self, session: &str) -> Result<(), RuntimeError> {
        let _ = session;
        not_yet()
    }

    /// The live sessions.
    pub async fn list_sessions(&self) -> Vec<SessionInfo> {
        Vec::new()
    }

    /// Runs a command in a session and returns its buffered result.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecResult, RuntimeError> {
        let _ = req;
        not_yet()
    }

    /// Runs a command in a session, streaming its output. Dropping the stream does not kill
    /// the command.
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream, RuntimeError> {
        let _ = req;
        not_yet()
    }

    /// Sends `signal` to the session's running command (its whole tree); bypasses the
    /// session's queue.
    pub async fn interrupt(&self, session: &str, signal: i32) -> Result<(), RuntimeError> {
        let _ = (session, signal);
        not_yet()
    }

    /// Starts a background process; returns at once.
    pub async fn start_process(&self, spec: ProcessSpec) -> Result<ProcessInfo, RuntimeError> {
        let _ = spec;
        not_yet()
    }

    /// All processes, running and exited.
    pub async fn list_processes(&self) -> Vec<ProcessInfo> {
        Vec::new()
    }

    /// One process.
    pub async fn process(&self, id: &str) -> Result<ProcessInfo, RuntimeError> {
        Err(RuntimeError::ProcessNotFound { id: id.to_owned() })
    }

    /// Sends `signal` to the process's whole tree.
    pub async fn signal_process(&self, id: &str, signal: i32) -> Result<(), RuntimeError> {
        let _ = (id, signal);
        not_yet()
    }

    /// TERM, `grace`, KILL of the process's whole tree; waits until it is gone.
    pub async fn kill_process(
        &self,
        id: &str,
        grace: Duration,
    ) -> Result<ProcessInfo, RuntimeError> {
        let _ = (id, grace);
        not_yet()
    }

    /// Writes to the process's stdin (started with `stdin: true`, or a PTY).
    pub async fn write_stdin(&self, id: &str, data: Bytes) -> Result<(), RuntimeError> {
        let _ = (id, data);
        not_yet()
    }

    /// Closes the process's stdin.
    pub async fn close_stdin(&self, id: &str) -> Result<(), RuntimeError> {
        let _ = id;
        not_yet()
    }

    /// Reads the process's log from cursor `since`, at most `max_bytes`.
    pub async fn read_logs(
        &self,
        id: &str,
        since: u64,
        max_bytes: usize,
    ) -> Result<LogChunk, RuntimeError> {
        let _ = (id, since, max_bytes);
        not_yet()
    }

    /// Replays the log from `since`, then follows it live; ends after the process exited
    /// and everything was sent.
    pub async fn follow_logs(&self, id: &str, since: u64) -> Result<LogStream, RuntimeError> {
        let _ = (id, since);
        not_yet()
    }

    /// Attaches to the process's PTY.
    pub async fn attach_pty(&self, id: &str) -> Result<PtyAttachment, RuntimeError> {
        let _ = id;
        not_yet()
    }

    /// Resizes the process's PTY.
    pub async fn resize_pty(&self, id: &str, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        let _ = (id, cols, rows);
        not_yet()
    }

    /// Opens a file inside the sandbox for reading (whole, or a range).
    pub async fn read_file(
        &self,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<FileRead, RuntimeError> {
        let _ = (path, range);
        not_yet()
    }

    /// Writes a file inside the sandbox atomically (temp file + rename) from a stream.
    pub async fn write_file(
        &self,
        path: &str,
        body: Pin<Box<dyn AsyncRead + Send>>,
        opts: WriteOptions,
    ) -> Result<FileStat, RuntimeError> {
        let _ = (path, body, opts);
        not_yet()
    }

    /// Stats a path (symlinks not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat, RuntimeError> {
        let _ = path;
        not_yet()
    }

    /// Lists a directory.
    pub async fn list(
        &self,
        path: &str,
        recursive: bool,
        hidden: bool,
    ) -> Result<Vec<FileStat>, RuntimeError> {
        let _ = (path, recursive, hidden);
        not_yet()
    }

    /// Creates a directory.
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<FileStat, RuntimeError> {
        let _ = (path, parents);
        not_yet()
    }

    /// Removes a file or (with `recursive`) a directory tree.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), RuntimeError> {
        let _ = (path, recursive);
        not_yet()
    }

    /// Renames `from` to `to`.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<FileStat, RuntimeError> {
        let _ = (from, to, overwrite);
        not_yet()
    }

    /// The changes of the sandbox's branch.
    pub async fn changes(&self) -> Result<Vec<lockbox_cow::Change>, RuntimeError> {
        not_yet()
    }

    /// Commits (the selected part of) the branch to the workdir; the sandbox keeps running
    /// on a branch that no longer holds the committed changes.
    pub async fn commit(&self, sel: Selection) -> Result<CommitSummary, RuntimeError> {
        let _ = sel;
        not_yet()
    }

    /// Discards the branch's changes; the sandbox keeps running on the unchanged workdir.
    pub async fn abort(&self) -> Result<(), RuntimeError> {
        not_yet()
    }
}
