//! The stdio transport: one JSON-RPC message per line in, one per line out (MCP's stdio
//! transport). Requests run concurrently, each in its own task, so a long `exec` does not
//! hold up a `ping`; replies are written whole, one line each, by a single writer.
//!
//! Bounded like the HTTP transport: a line longer than [`MAX_MESSAGE`] is answered with a
//! JSON-RPC error and skipped, and at most [`MAX_IN_FLIGHT`] calls run at once (the next line
//! is read when one ends, so a client that sends faster waits on its pipe).

use super::{error_response, McpServer, INVALID_REQUEST};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

/// The longest message line read (as `lockbox serve`'s default `--max-body`).
pub const MAX_MESSAGE: usize = 16 << 20;

/// Calls served at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// Serves `server` on `input` and `output` until `input` ends (the client closed it: calls
/// in flight are answered first) or `stop` resolves (calls in flight are abandoned). The caller shuts the runtime
/// down afterwards (that deletes the sandboxes). Errors: reading `input` or writing
/// `output` failed.
pub async fn serve_stdio(
    server: McpServer,
    input: impl AsyncRead + Unpin,
    output: impl AsyncWrite + Unpin + Send + 'static,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = rx.recv().await {
            output.write_all(line.as_bytes()).await?;
            output.write_all(b"\n").await?;
            output.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut calls = JoinSet::new();
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut lines = Lines::new(input);
    tokio::pin!(stop);
    let mut stopped = false;
    let read = loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot,
            () = &mut stop => {
                stopped = true;
                break Ok(());
            }
            // Reap finished calls so the set does not grow with the session.
            Some(_) = calls.join_next(), if !calls.is_empty() => continue,
        };
        let Ok(slot) = slot else { break Ok(()) };
        let line = tokio::select! {
            line = lines.next() => line,
            () = &mut stop => {
                stopped = true;
                break Ok(());
            }
            Some(_) = calls.join_next(), if !calls.is_empty() => continue,
        };
        let line = match line {
            Ok(Some(Line::Text(line))) => line,
            Ok(Some(Line::TooLong)) => {
                let message = format!("a message longer than {MAX_MESSAGE} bytes was skipped");
                let reply = error_response(serde_json::Value::Null, INVALID_REQUEST, &message);
                let _ = tx.send(reply.to_string());
                continue;
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        if line.trim().is_empty() {
            continue;
        }
        let server = server.clone();
        let tx = tx.clone();
        calls.spawn(async move {
            if let Some(reply) = server.handle_text(&line).await {
                let _ = tx.send(reply.to_string());
            }
            drop(slot);
        });
    };
    if !stopped {
        tokio::select! {
            () = async { while calls.join_next().await.is_some() {} } => {}
            () = &mut stop => {}
        }
    }
    calls.shutdown().await;
    drop(tx);
    let written = writer
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    read.and(written)
}

/// A line read by [`Lines`].
enum Line {
    /// Its text (bytes that are not UTF-8 replaced: the JSON parser then refuses it).
    Text(String),
    /// It was longer than [`MAX_MESSAGE`]; it was read to its end and dropped.
    TooLong,
}

/// Newline-delimited lines of at most [`MAX_MESSAGE`] bytes. Its state lives in the struct,
/// so a [`Lines::next`] dropped while waiting for input (a `select!`) loses nothing.
struct Lines<R> {
    input: BufReader<R>,
    line: Vec<u8>,
    too_long: bool,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(input: R) -> Lines<R> {
        Lines {
            input: BufReader::new(input),
            line: Vec::new(),
            too_long: false,
        }
    }

    /// The next line, without its newline; `None` at the end of the input.
    async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let buf = self.input.fill_buf().await?;
            if buf.is_empty() {
                if self.line.is_empty() && !self.too_long {
                    return Ok(None);
                }
                return Ok(Some(self.take()));
            }
            let (chunk, used, ended) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            if !self.too_long {
                if self.line.len() + chunk.len() > MAX_MESSAGE {
                    self.too_long = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            self.input.consume(used);
            if ended {
                return Ok(Some(self.take()));
            }
        }
    }

    fn take(&mut self) -> Line {
        let line = std::mem::take(&mut self.line);
        if std::mem::take(&mut self.too_long) {
            Line::TooLong
        } else {
            Line::Text(String::from_utf8_lossy(&line).into_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn an_over_long_line_is_answered_and_skipped_and_the_next_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let runtime =
            lockbox_runtime::Runtime::open(lockbox_runtime::RuntimeConfig::new(dir.path()))
                .unwrap();
        let mut input = vec![b'x'; MAX_MESSAGE + 1];
        input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}\n");
        let (output, mut replies) = tokio::io::duplex(1 << 16);
        let server = McpServer::new(runtime.clone(), std::sync::Arc::default(), false);
        serve_stdio(server, &input[..], output, std::future::pending())
            .await
            .unwrap();
        let mut text = String::new();
        replies.read_to_string(&mut text).await.unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["id"], serde_json::Value::Null);
        assert_eq!(lines[0]["error"]["code"], INVALID_REQUEST);
        assert_eq!(lines[1]["id"], 7);
        assert!(lines[1]["result"].is_object(), "{text}");
        runtime.shutdown().await;
    }
}
