//! Where a session command's output goes, bounded either way: a buffered `exec` keeps the
//! first `cap` bytes of each stream (the rest is read and dropped, and the result says it
//! was truncated); a streamed `exec` sends events on a bounded channel and reads only while
//! it holds a slot, so a client that reads slowly slows the command down (its pipe fills, as
//! under a slow terminal) instead of growing a queue in the server.

use bytes::Bytes;
use std::os::fd::OwnedFd;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::error::SendError;
use tokio::sync::mpsc::{OwnedPermit, Sender};

use crate::types::{ExecEvent, ExecExit, ExecResult};
use crate::util::{pending, read_some, Read, READ_CHUNK};

/// Events of a streamed exec queued at most (each at most [`READ_CHUNK`] bytes of output):
/// a slow reader costs the server at most this much.
pub(crate) const EVENT_QUEUE: usize = 16;

/// One of a command's output pipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pipe {
    Stdout,
    Stderr,
}

/// The first `cap` bytes of one stream, and whether more came.
#[derive(Debug)]
pub(crate) struct Capture {
    bytes: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            bytes: Vec::new(),
            cap,
            truncated: false,
        }
    }

    fn push(&mut self, data: &[u8]) {
        let take = data.len().min(self.cap - self.bytes.len());
        self.truncated |= take < data.len();
        let need = self.bytes.len() + take;
        if need > self.bytes.capacity() {
            // Doubling, but never past the cap: the buffer's memory is what the cap says.
            let target = (self.bytes.capacity() * 2).clamp(need, self.cap.max(need));
            self.bytes.reserve_exact(target - self.bytes.len());
        }
        self.bytes.extend_from_slice(&data[..take]);
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) enum Sink {
    /// Kept for an [`ExecResult`].
    Buffer { stdout: Capture, stderr: Capture },
    /// Sent as [`ExecEvent`]s.
    Events(Events),
}

/// The sending half of a streamed exec.
#[derive(Debug)]
pub(crate) struct Events {
    tx: Sender<ExecEvent>,
    /// A reserved place in the channel: output is read only while one is held.
    permit: Option<OwnedPermit<ExecEvent>>,
    /// The receiver went away: output is read and dropped, so the command still finishes.
    gone: bool,
}

impl Events {
    async fn send(&mut self, event: ExecEvent) {
        if self.gone {
            return;
        }
        match self.permit.take() {
            Some(permit) => {
                permit.send(event);
            }
            None => self.gone = self.tx.send(event).await.is_err(),
        }
    }
}

fn output_event(pipe: Pipe, data: Vec<u8>) -> ExecEvent {
    let data = Bytes::from(data);
    match pipe {
        Pipe::Stdout => ExecEvent::Stdout { data },
        Pipe::Stderr => ExecEvent::Stderr { data },
    }
}

impl Sink {
    /// Keeps at most `cap` bytes of stdout and of stderr.
    pub fn buffer(cap: usize) -> Sink {
        Sink::Buffer {
            stdout: Capture::new(cap),
            stderr: Capture::new(cap),
        }
    }

    /// Sends events on `tx` (a channel of [`EVENT_QUEUE`] places).
    pub fn events(tx: Sender<ExecEvent>) -> Sink {
        Sink::Events(Events {
            tx,
            permit: None,
            gone: false,
        })
    }

    /// A sender to reserve a place on, when output waits for one.
    pub fn wants_slot(&self) -> Option<Sender<ExecEvent>> {
        match self {
            Sink::Events(e) if e.permit.is_none() && !e.gone => Some(e.tx.clone()),
            _ => None,
        }
    }

    /// Takes the place [`Sink::wants_slot`] asked for (or notes that the receiver is gone).
    pub fn slot(&mut self, permit: Result<OwnedPermit<ExecEvent>, SendError<()>>) {
        if let Sink::Events(e) = self {
            match permit {
                Ok(permit) => e.permit = Some(permit),
                Err(_) => e.gone = true,
            }
        }
    }

    /// Whether output may be read now.
    pub fn may_read(&self) -> bool {
        match self {
            Sink::Buffer { .. } => true,
            Sink::Events(e) => e.permit.is_some() || e.gone,
        }
    }

    /// Reads at most [`READ_CHUNK`] bytes of `pipe` (only when [`Sink::may_read`]).
    pub fn read(&mut self, fd: &OwnedFd, pipe: Pipe) -> Read {
        let (read, _, event) = self.take(fd, pipe, READ_CHUNK);
        if let (Some(event), Sink::Events(e)) = (event, self) {
            if let Some(permit) = e.permit.take() {
                permit.send(event);
            }
        }
        read
    }

    /// After the command: takes what both pipes hold now (everything it wrote), and only
    /// that, so a background job still writing cannot keep the command from finishing.
    pub async fn finish(&mut self, stdout: &AsyncFd<OwnedFd>, stderr: &AsyncFd<OwnedFd>) {
        for (fd, pipe) in [(stdout, Pipe::Stdout), (stderr, Pipe::Stderr)] {
            let mut left = pending(fd.get_ref());
            while left > 0 {
                let (read, n, event) = self.take(fd.get_ref(), pipe, left.min(READ_CHUNK));
                if let (Some(event), Sink::Events(e)) = (event, &mut *self) {
                    e.send(event).await;
                }
                left = left.saturating_sub(n);
                if read != Read::More || n == 0 {
                    break;
                }
            }
        }
    }

    /// Reads at most `max` bytes of `pipe`: into its capture, or as one event to send (none
    /// when the receiver is gone). Also how many bytes were read.
    fn take(&mut self, fd: &OwnedFd, pipe: Pipe, max: usize) -> (Read, usize, Option<ExecEvent>) {
        let mut n = 0;
        match self {
            Sink::Buffer { stdout, stderr } => {
                let capture = match pipe {
                    Pipe::Stdout => stdout,
                    Pipe::Stderr => stderr,
                };
                let read = read_some(fd, max, |data| {
                    n += data.len();
                    capture.push(data);
                });
                (read, n, None)
            }
            Sink::Events(e) => {
                let mut chunk = Vec::new();
                let keep = !e.gone;
                let read = read_some(fd, max, |data| {
                    n += data.len();
                    if keep {
                        chunk.extend_from_slice(data);
                    }
                });
                let event = (!chunk.is_empty()).then(|| output_event(pipe, chunk));
                (read, n, event)
            }
        }
    }

    /// Streamed: the `start` event.
    pub async fn start(&mut self, session: &str) {
        if let Sink::Events(e) = self {
            e.send(ExecEvent::Start {
                session: session.into(),
            })
            .await;
        }
    }

    /// Streamed: the `exit` event (after all output).
    pub async fn exit(&mut self, exit: &ExecExit) {
        if let Sink::Events(e) = self {
            e.send(ExecEvent::Exit(exit.clone())).await;
        }
    }

    /// The buffered result (output empty when streamed).
    pub fn into_result(self, exit: ExecExit) -> ExecResult {
        let (stdout, stderr) = match self {
            Sink::Buffer { stdout, stderr } => (stdout, stderr),
            Sink::Events(_) => (Capture::new(0), Capture::new(0)),
        };
        ExecResult {
            exit_code: exit.exit_code,
            stdout: Bytes::from(stdout.bytes),
            stderr: Bytes::from(stderr.bytes),
            timed_out: exit.timed_out,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            duration: exit.duration,
            session: exit.session,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_keeps_the_first_cap_bytes_in_a_buffer_no_larger() {
        let mut c = Capture::new(100_000);
        for _ in 0..50 {
            c.push(&[7u8; 4097]);
        }
        assert_eq!(c.bytes.len(), 100_000);
        assert!(c.truncated);
        assert!(c.bytes.capacity() <= 100_000, "{}", c.bytes.capacity());
        let mut exact = Capture::new(10);
        exact.push(b"0123456789");
        assert!(!exact.truncated);
        exact.push(b"");
        assert!(!exact.truncated);
        exact.push(b"x");
        assert!(exact.truncated);
    }
}
