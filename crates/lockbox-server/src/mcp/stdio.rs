//! The stdio transport: one JSON-RPC message per line in, one per line out (MCP's stdio
//! transport). Requests run concurrently, each in its own task, so a long `exec` does not
//! hold up a `ping`; replies are written whole, one line each, by a single writer.

use super::McpServer;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

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
    let mut lines = BufReader::new(input).lines();
    tokio::pin!(stop);
    let mut stopped = false;
    let read = loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            () = &mut stop => {
                stopped = true;
                break Ok(());
            }
            // Reap finished calls so the set does not grow with the session.
            Some(_) = calls.join_next(), if !calls.is_empty() => continue,
        };
        let line = match line {
            Ok(Some(line)) => line,
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
