//! The runtime's end of a sandbox's agent: requests with ids, replies matched by a reader
//! task, exit events of spawned commands kept until someone asks.

use lockbox_agent::{wire, AgentError, Body, Message, Op, Reply, Request, WatchEvent};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{oneshot, Notify};

use crate::RuntimeError;

/// How a spawned command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

type Pending = oneshot::Sender<(Result<Body, AgentError>, Vec<OwnedFd>)>;

#[derive(Debug, Default)]
struct State {
    pending: HashMap<u64, Pending>,
    exits: HashMap<i32, ExitStatus>,
    watches: HashMap<u64, Arc<WatchSink>>,
    closed: bool,
}

/// Most events a watch keeps for its consumer; beyond, one `overflow` event counts the
/// dropped ones.
pub(crate) const WATCH_QUEUE: usize = 4096;

/// Where the reader task puts the events of one watch for its stream.
#[derive(Debug, Default)]
pub(crate) struct WatchSink {
    /// The events, and whether no more will come (the agent is gone).
    queue: Mutex<(VecDeque<WatchEvent>, bool)>,
    changed: Notify,
}

impl WatchSink {
    /// The next event; `None` once the agent is gone and everything was taken.
    pub async fn next(&self) -> Option<WatchEvent> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = lock(&self.queue);
                if let Some(ev) = q.0.pop_front() {
                    return Some(ev);
                }
                if q.1 {
                    return None;
                }
            }
            notified.await;
        }
    }

    fn push(&self, events: Vec<WatchEvent>) {
        let mut q = lock(&self.queue);
        for ev in events {
            lockbox_agent::push_bounded(&mut q.0, ev, WATCH_QUEUE);
        }
        drop(q);
        self.changed.notify_waiters();
    }

    fn close(&self) {
        lock(&self.queue).1 = true;
        self.changed.notify_waiters();
    }
}

/// A connection to one agent. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct AgentClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sock: AsyncFd<OwnedFd>,
    next: AtomicU64,
    state: Mutex<State>,
    changed: Notify,
}

impl AgentClient {
    /// Wraps our end of the control socket and starts the reader task.
    pub fn new(sock: OwnedFd) -> Result<AgentClient, RuntimeError> {
        let sock = crate::util::async_fd(sock)?;
        let client = AgentClient {
            inner: Arc::new(Inner {
                sock,
                next: AtomicU64::new(1),
                state: Mutex::new(State::default()),
                changed: Notify::new(),
            }),
        };
        let reader = client.inner.clone();
        tokio::spawn(async move { read_loop(reader).await });
        Ok(client)
    }

    /// Sends `op` and waits for its reply.
    pub async fn call(
        &self,
        op: Op,
    ) -> Result<(Result<Body, AgentError>, Vec<OwnedFd>), RuntimeError> {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = lock(&self.inner.state);
            if st.closed {
                return Err(gone());
            }
            st.pending.insert(id, tx);
        }
        let data = serde_json::to_vec(&Request { id, op })
            .map_err(RuntimeError::json("a request to the agent"))?;
        let sent = self
            .inner
            .sock
            .async_io(Interest::WRITABLE, |fd| {
                wire::send(fd.as_fd(), &data, &[] as &[BorrowedFd<'_>])
            })
            .await;
        if let Err(e) = sent {
            lock(&self.inner.state).pending.remove(&id);
            return Err(if e.kind() == std::io::ErrorKind::BrokenPipe {
                gone()
            } else {
                RuntimeError::os("sending to the sandbox agent")(e)
            });
        }
        rx.await.map_err(|_| gone())
    }

    /// Waits until the command `pid` has ended (and its tree is gone).
    pub async fn wait_exit(&self, pid: i32) -> Result<ExitStatus, RuntimeError> {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = lock(&self.inner.state);
                if let Some(s) = st.exits.get(&pid) {
                    return Ok(*s);
                }
                if st.closed {
                    return Err(gone());
                }
            }
            notified.await;
        }
    }

    /// The exit of `pid`, if it has ended.
    pub fn exit_of(&self, pid: i32) -> Option<ExitStatus> {
        lock(&self.inner.state).exits.get(&pid).copied()
    }

    /// Forgets the exit of `pid` (once its owner has recorded it).
    pub fn forget(&self, pid: i32) {
        lock(&self.inner.state).exits.remove(&pid);
    }

    /// A new watch id and the sink its events will go to (before the agent is asked, so
    /// that no event can come before there is somewhere to put it).
    pub fn register_watch(&self) -> (u64, Arc<WatchSink>) {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let sink = Arc::new(WatchSink::default());
        let mut st = lock(&self.inner.state);
        if st.closed {
            sink.close();
        }
        st.watches.insert(id, sink.clone());
        (id, sink)
    }

    /// Drops the sink of watch `id`: its later events are discarded.
    pub fn unregister_watch(&self, id: u64) {
        lock(&self.inner.state).watches.remove(&id);
    }

    /// True once the agent hung up (the sandbox ended).
    pub fn is_closed(&self) -> bool {
        lock(&self.inner.state).closed
    }

    /// Waits until the agent hangs up.
    pub async fn closed(&self) {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) fn gone() -> RuntimeError {
    RuntimeError::AgentGone
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn read_loop(inner: Arc<Inner>) {
    let mut buf = wire::RecvBuf::default();
    loop {
        let got = inner
            .sock
            .async_io(Interest::READABLE, |fd| buf.recv(fd.as_fd()))
            .await;
        let (n, fds) = match got {
            Ok(Some(x)) => x,
            Ok(None) | Err(_) => break,
        };
        let Ok(msg) = serde_json::from_slice::<Message>(&buf.record()[..n]) else {
            tracing::warn!("unreadable message from a sandbox agent");
            continue;
        };
        match msg {
            Message::Reply(Reply { id, result }) => {
                let tx = lock(&inner.state).pending.remove(&id);
                if let Some(tx) = tx {
                    let _ = tx.send((result, fds));
                }
            }
            Message::WatchEvents { watch, events } => {
                let sink = lock(&inner.state).watches.get(&watch).cloned();
                if let Some(sink) = sink {
                    sink.push(events);
                }
            }
            Message::Exit { pid, code, signal } => {
                lock(&inner.state)
                    .exits
                    .insert(pid, ExitStatus { code, signal });
                inner.changed.notify_waiters();
            }
        }
    }
    let mut st = lock(&inner.state);
    st.closed = true;
    st.pending.clear();
    let sinks: Vec<Arc<WatchSink>> = st.watches.drain().map(|(_, s)| s).collect();
    drop(st);
    for s in sinks {
        s.close();
    }
    inner.changed.notify_waiters();
}
