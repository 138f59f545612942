//! A sandbox's network audit log: the events of its network supervisor
//! ([`lockbox_netsup::NetEvent`], `--net-allow`/`--net-deny` sandboxes only), kept in a
//! ring of the last [`AUDIT_RING`] and sent live to every [`AuditStream`].
//!
//! The supervisor hands events to a bounded channel it never waits on (it drops and counts
//! beyond [`BACKLOG`]); a thread per instance moves them here. The log belongs to the
//! sandbox, not the instance: a workspace abort's new instance logs into the same ring.

use crate::sandbox::lock;
use crate::streams::AuditStream;
use crate::RuntimeError;
use lockbox_netsup::{AuditSink, NetEvent};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::broadcast;

/// Events a sandbox keeps for [`crate::Sandbox::audit_log`].
pub const AUDIT_RING: usize = 1000;
/// Events the supervisor may be ahead of the log by.
const BACKLOG: usize = 4096;
/// Events a live stream may lag behind by before it skips (and says how many).
const LIVE: usize = 1024;

/// One sandbox's audit log.
#[derive(Debug)]
pub(crate) struct AuditLog {
    ring: Mutex<VecDeque<NetEvent>>,
    /// Made by the first [`AuditLog::follow`]: a broadcast channel allocates all of its
    /// [`LIVE`] slots at once (about 400 KiB), and most sandboxes are never followed (most
    /// have no network list at all), so every sandbox held one for nothing (issue 34).
    live: OnceLock<broadcast::Sender<NetEvent>>,
}

impl AuditLog {
    pub fn new() -> Arc<AuditLog> {
        Arc::new(AuditLog {
            ring: Mutex::new(VecDeque::new()),
            live: OnceLock::new(),
        })
    }

    /// A sink for an instance of sandbox `id`; a thread moves what it receives into this
    /// log until the instance's supervisor is gone.
    pub fn sink(self: &Arc<Self>, id: &str) -> Result<AuditSink, RuntimeError> {
        let (sink, events) = AuditSink::channel(BACKLOG, Some(id.to_owned()));
        let log = Arc::clone(self);
        std::thread::Builder::new()
            .name("lockbox-audit".into())
            .spawn(move || {
                while let Ok(event) = events.recv() {
                    log.push(event);
                }
            })
            .map_err(RuntimeError::os("starting the audit thread"))?;
        Ok(sink)
    }

    fn push(&self, event: NetEvent) {
        let mut ring = lock(&self.ring);
        if ring.len() >= AUDIT_RING {
            ring.pop_front();
        }
        ring.push_back(event.clone());
        // Sent under the ring's lock, so a new stream sees each event once (see `follow`).
        if let Some(live) = self.live.get() {
            let _ = live.send(event);
        }
    }

    /// The events kept, oldest first.
    pub fn snapshot(&self) -> Vec<NetEvent> {
        lock(&self.ring).iter().cloned().collect()
    }

    /// The events kept, then the live ones.
    pub fn follow(&self) -> AuditStream {
        let (past, rx) = {
            let ring = lock(&self.ring);
            (
                ring.iter().cloned().collect::<Vec<_>>(),
                self.live
                    .get_or_init(|| broadcast::channel(LIVE).0)
                    .subscribe(),
            )
        };
        let live = futures_util::stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(event) => Some((event, rx)),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    Some((NetEvent::dropped(n, None), rx))
                }
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        AuditStream {
            inner: Box::pin(futures_util::StreamExt::chain(
                futures_util::stream::iter(past),
                live,
            )),
        }
    }
}
