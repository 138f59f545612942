//! The stream types the API hands out: streamed exec events, followed logs, PTY output,
//! and file reads.

use crate::types::{ExecEvent, LogChunk};
use bytes::Bytes;
use futures_util::Stream;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncRead;

type BoxStream<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

/// The events of [`crate::Sandbox::exec_stream`]: `Start`, output, then `Exit` (or `Error`).
pub struct ExecStream {
    pub(crate) inner: BoxStream<ExecEvent>,
}

/// The events of [`crate::Sandbox::run_code_stream`]: output and results as they come,
/// then `End` with the whole execution.
pub struct CodeStream {
    pub(crate) inner: BoxStream<crate::types::CodeEvent>,
}

/// The chunks of [`crate::Sandbox::follow_logs`]: replay, then live; ends after the process
/// exited and all its output was sent (the last chunk has `eof: true`).
pub struct LogStream {
    pub(crate) inner: BoxStream<LogChunk>,
}

/// The entries of [`crate::Sandbox::list_stream`], read one at a time.
pub struct FileList {
    pub(crate) inner: BoxStream<Result<crate::types::FileStat, crate::RuntimeError>>,
}

/// Live PTY output for one viewer. A viewer too slow to keep up skips what it missed
/// (the log keeps it: read it with [`crate::Sandbox::read_logs`]).
pub struct PtyOutput {
    pub(crate) inner: BoxStream<Bytes>,
}

/// The events of [`crate::Sandbox::audit`]: those kept, then live ones as the network
/// supervisor decides. A consumer more than 1,024 events behind gets one `dropped` event
/// (with the count) where the skipped ones were (the last 1,000 stay in
/// [`crate::Sandbox::audit_log`]); the stream ends when the sandbox is gone.
pub struct AuditStream {
    pub(crate) inner: BoxStream<lockbox_netsup::NetEvent>,
}

/// The events of [`crate::Sandbox::watch`], oldest first. Dropping it stops the watch. A
/// consumer that falls more than 4,096 events behind gets one `Overflow` event where the
/// dropped ones were; the stream ends when the sandbox does.
pub struct WatchStream {
    /// The watched path as the sandbox sees it (absolute).
    pub path: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    pub(crate) inner: BoxStream<crate::WatchEvent>,
}

macro_rules! forward_stream {
    ($t:ty, $item:ty, $name:literal) => {
        impl Stream for $t {
            type Item = $item;
            fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<$item>> {
                self.inner.as_mut().poll_next(cx)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($name)
            }
        }
    };
}

forward_stream!(ExecStream, ExecEvent, "ExecStream");
forward_stream!(LogStream, LogChunk, "LogStream");
forward_stream!(CodeStream, crate::types::CodeEvent, "CodeStream");
forward_stream!(PtyOutput, Bytes, "PtyOutput");
forward_stream!(WatchStream, crate::WatchEvent, "WatchStream");
forward_stream!(AuditStream, lockbox_netsup::NetEvent, "AuditStream");
forward_stream!(
    FileList,
    Result<crate::types::FileStat, crate::RuntimeError>,
    "FileList"
);

/// An attachment to a process's PTY.
#[derive(Debug)]
pub struct PtyAttachment {
    /// What the PTY printed so far (the retained part of the log).
    pub scrollback: Bytes,
    /// Live output from the end of the scrollback on.
    pub output: PtyOutput,
    /// Keystrokes for the PTY.
    pub input: tokio::sync::mpsc::Sender<Bytes>,
}

/// An open file for reading.
pub struct FileRead {
    /// The file's whole size: its `stat` size at open, or for a `/proc` or `/sys` file
    /// (whose `stat` size is not its length) the length it gave when read to its end.
    pub size: u64,
    /// The bytes `body` yields: `start..end` (end exclusive).
    pub range: (u64, u64),
    /// The bytes.
    pub body: Pin<Box<dyn AsyncRead + Send>>,
    /// Whether the file was read to its end when opened (a `/proc` or `/sys` file): `body`
    /// then yields bytes already in memory, cheap to skip, and `size` is what it gave.
    pub read_whole: bool,
}

impl fmt::Debug for FileRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileRead")
            .field("size", &self.size)
            .field("range", &self.range)
            .field("read_whole", &self.read_whole)
            .finish_non_exhaustive()
    }
}
