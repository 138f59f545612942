//! `lockbox run --audit FILE`: the network supervisor's decisions, one JSON line each,
//! appended to FILE by a thread of their own (the supervisor never waits for the disk).

use crate::error::CliError;
use lockbox_netsup::{AuditSink, NetEvent};
use lockbox_policy::name::quoted;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;

/// Events the supervisor may be ahead of the writer by; beyond it, it drops and counts.
const BACKLOG: usize = 4096;

/// A running writer of one audit file.
#[derive(Debug)]
pub struct AuditLog {
    thread: JoinHandle<()>,
}

impl AuditLog {
    /// Opens `path` for appending (created 0600) and starts the writer; the sink goes to the
    /// sandbox. Fails, naming the file, as a usage error.
    pub fn open(path: &Path) -> Result<(AuditLog, AuditSink), CliError> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                CliError::usage(format!("--audit {}: {}", quoted(path), super::os_error(&e)))
            })?;
        let (sink, events) = AuditSink::channel(BACKLOG, None);
        let thread = std::thread::Builder::new()
            .name("lockbox-audit".into())
            .spawn(move || write_all(file, &events))
            .map_err(|e| CliError::new(125, format!("starting the audit writer: {e}")))?;
        Ok((AuditLog { thread }, sink))
    }

    /// Waits for the writer to write what the supervisor sent (it ends when the sandbox's
    /// supervisor, the last sender, is gone).
    pub fn finish(self) {
        let _ = self.thread.join();
    }
}

/// Writes each event as a line; flushes whenever no more are waiting.
fn write_all(file: std::fs::File, events: &Receiver<NetEvent>) {
    let mut out = std::io::BufWriter::new(file);
    let mut failed = false;
    while let Ok(first) = events.recv() {
        for event in std::iter::once(first).chain(events.try_iter()) {
            if failed {
                continue;
            }
            let line = serde_json::to_string(&event).unwrap_or_default();
            failed = writeln!(out, "{line}").is_err();
        }
        if !failed {
            failed = out.flush().is_err();
        }
        if failed {
            // Keep draining, so the supervisor never finds the channel full on our account.
            continue;
        }
    }
}
