//! The connections of the server: what a client can hold open, and for how long.
//!
//! - **A cap** (`--max-connections`): at the cap, a new connection closes the oldest one
//!   that has not started a request yet (half-open, see [`Waiting`]) and takes its place.
//!   When every connection has started one, a connection beyond the cap is accepted, its
//!   request head read, answered `503 SERVER_BUSY` with `Retry-After: 1`, and closed, so a client learns
//!   at once that the server is full instead of waiting in the kernel's backlog. The cap
//!   holds for the connection's whole life, upgraded WebSockets included. At most
//!   [`REFUSING_AT_ONCE`] refusals are open at once (each for at most [`REFUSAL_TIME`]);
//!   one more closes the oldest.
//! - **A cap per peer** (`--max-connections-per-peer`): connections from one IP address
//!   beyond it are refused the same way (`details.what` is `max_connections_per_peer`), so
//!   one client holding half-open or idle connections cannot fill the cap for everyone
//!   else. Issue 32: 1,100 half-open connections locked every client out for ~10 s per
//!   wave behind the 512-connection cap. A connection that waits for its request head
//!   costs a task, a socket and hyper's read buffer (at most [`MAX_HEAD`]), so the cap can
//!   be in the tens of thousands (the CLI sets it from the open-files limit).
//! - **The header timeout** (`--header-timeout`): a connection must deliver its first
//!   request head within this long of being opened, and each later head within one to two
//!   times this long of its first byte, or it is closed. This ends half-sent heads
//!   (slowloris).
//! - **The idle timeout** (`--connection-idle-timeout`): a connection with no request in flight is
//!   closed after this long (HTTP/1.1: from the end of its previous response; HTTP/2: within
//!   one header timeout more). A connection that carries no request costs a descriptor like
//!   any other, but a client's pool keeps connections for reuse, and when the server closes
//!   one just as the client sends a request on it, that request fails (a reset or `EPIPE`
//!   on a kept-alive connection, which clients such as reqwest, and with it E2B's SDK, do
//!   not retry). So the default (120 s) is longer than common clients keep an idle
//!   connection (reqwest, Go: 90 s): the client closes first.
//! - **The stall timeout** (`--io-timeout`): a response the client does not read (nothing
//!   written for this long) ends the connection, and so does a request body that delivers
//!   nothing for this long (see [`crate::build`]). A request that is being handled
//!   (a long `exec`, an SSE or WebSocket stream, which have their own keepalives) is never
//!   cut for being quiet.
//!
//! Heads larger than [`MAX_HEAD`] are refused by hyper (431), so a half-open connection
//! holds at most that much memory.

use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Largest request head (request line and headers) a connection may send; also the most
/// a half-open connection makes the server buffer.
pub const MAX_HEAD: usize = 64 * 1024;

/// Refused connections open at once. One more closes the oldest of them (most likely one
/// that sends nothing), so refusals hold a bounded number of descriptors and a client that
/// sends its request promptly still gets its answer during a flood.
const REFUSING_AT_ONCE: usize = 64;

/// How long a refusal may take: reading the request head (an answer written before the
/// client sent its request is an error to HTTP clients), writing the answer, and reading
/// what else the client sent (closing a socket with unread data resets the connection,
/// which can destroy the answer before the client reads it).
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// How long to wait before accepting again after `accept` failed (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The bounds of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub max_per_peer: usize,
    /// See the module documentation.
    pub header_timeout: Duration,
    /// See the module documentation.
    pub idle_timeout: Duration,
    /// See the module documentation.
    pub io_timeout: Duration,
}

/// What the listeners of one server share: the connection cap, the count per peer, the
/// connections that may be evicted and the refusals, so [`Limits::max_connections`] and
/// [`Limits::max_per_peer`] bound the API's and the exposed ports' connections together.
#[derive(Debug, Clone)]
pub struct Gate {
    open: Arc<Semaphore>,
    peers: Arc<Peers>,
    waiting: Arc<Waiting>,
    refusing: Arc<Refusals>,
}

impl Gate {
    /// A gate for `limits`.
    pub fn new(limits: &Limits) -> Gate {
        Gate {
            open: Arc::new(Semaphore::new(limits.max_connections)),
            peers: Arc::new(Peers::default()),
            waiting: Arc::new(Waiting::default()),
            refusing: Arc::new(Refusals::default()),
        }
    }
}

/// Accepts connections on `listener` and serves `router` on them, through `gate`, until
/// `stop` is cancelled; then stops accepting, asks every connection to finish its request
/// in flight and close, and returns when all have.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    gate: Gate,
    stop: CancellationToken,
) {
    let Gate {
        open,
        peers,
        waiting,
        refusing,
    } = gate;
    let busy = busy_answer(limits.max_connections);
    let peer_busy = peer_busy_answer(limits.max_per_peer);
    let connections = TaskTracker::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's header timeout runs from the end of the previous response (or the opening),
    // so it is the idle timeout between requests; the header timeout proper is [`idle`]'s.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(MAX_HEAD)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD as u32)
        .max_concurrent_streams(MAX_STREAMS);
    let shared = Arc::new(Shared {
        builder,
        service: TowerToHyperService::new(router),
        stop: stop.clone(),
        header_timeout: limits.header_timeout,
        idle_timeout: limits.idle_timeout,
        io_timeout: limits.io_timeout,
        waiting,
    });
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.ip()),
            Err(e) => {
                // EMFILE/ENFILE and the like: the connection waits in the backlog; do not
                // spin on it.
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Without it, a response written while the client still delays its ACK of the last
        // one on a kept-alive connection can wait for that ACK (Nagle: up to 40 ms on Linux).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("setting TCP_NODELAY: {e}");
        }
        let Some(peer) = Peers::admit(&peers, peer, limits.max_per_peer) else {
            tokio::spawn(refuse(stream, peer_busy.clone(), Arc::clone(&refusing)));
            continue;
        };
        if let Ok(permit) = Arc::clone(&open).try_acquire_owned() {
            // Registered before its task runs: a connection accepted next may evict it.
            let entry = shared.waiting.add();
            connections.spawn(serve_one(Arc::clone(&shared), stream, permit, peer, entry));
            continue;
        }
        if !shared.waiting.evict_oldest() {
            drop(peer);
            tokio::spawn(refuse(stream, busy.clone(), Arc::clone(&refusing)));
            continue;
        }
        // The evicted connection gives its place back as its task ends. This one is
        // evictable at once, while it waits for that place: registered only once it had it,
        // a burst of half-open connections accepted faster than their tasks ran could empty
        // the queue, and the next client (accepted before those tasks ran) found nothing to
        // evict and got 503.
        let entry = shared.waiting.add();
        let (open, shared, busy, refusing) = (
            Arc::clone(&open),
            Arc::clone(&shared),
            busy.clone(),
            Arc::clone(&refusing),
        );
        connections.spawn(async move {
            let evicted = entry.1.clone();
            tokio::select! {
                waited = tokio::time::timeout(EVICTION_WAIT, open.acquire_owned()) => match waited {
                    Ok(Ok(permit)) => serve_one(shared, stream, permit, peer, entry).await,
                    _ => {
                        // Not a candidate any more (dropped as it reaches the front).
                        entry.0.store(true, Ordering::Relaxed);
                        drop(peer);
                        refuse(stream, busy, refusing).await;
                    }
                },
                // Evicted in turn before it had a place: closed, as a half-open one is.
                () = evicted.cancelled() => drop(peer),
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// What every connection's task shares.
struct Shared {
    builder: auto::Builder<TokioExecutor>,
    service: TowerToHyperService<Router>,
    stop: CancellationToken,
    header_timeout: Duration,
    idle_timeout: Duration,
    io_timeout: Duration,
    /// Shared by the server's listeners ([`Gate`]).
    waiting: Arc<Waiting>,
}

/// Serves one connection until it ends, the server stops, or it is evicted (while it has
/// not started a request, for a newer connection at the cap).
async fn serve_one(
    shared: Arc<Shared>,
    stream: TcpStream,
    permit: OwnedSemaphorePermit,
    peer: PeerSlot,
    (started, evicted): (Arc<AtomicBool>, CancellationToken),
) {
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Guarded {
        stream,
        stall: shared.io_timeout,
        stalled: None,
        activity: Arc::clone(&activity),
        _permit: permit,
        _peer: peer,
    });
    let service = shared.service.clone();
    let first = Arc::clone(&started);
    let active = Arc::clone(&activity);
    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
        first.store(true, Ordering::Relaxed);
        if request.version() == hyper::Version::HTTP_2 {
            active.h2.store(true, Ordering::Relaxed);
        }
        // In flight until its response body is dropped (streams included).
        let guard = InFlight::start(&active);
        let response = hyper::service::Service::call(&service, request);
        async move {
            let response = response.await?;
            Ok::<_, std::convert::Infallible>(response.map(move |body| {
                axum::body::Body::new(body.map_frame(move |frame| {
                    let _ = &guard;
                    frame
                }))
            }))
        }
    });
    let conn = shared.builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = evicted.cancelled() => Ok(()),
        // No request for a header timeout before the first one (the version preface or an
        // HTTP/2 client's first stream never came), a later HTTP/1.1 head that does not
        // complete, or an idle HTTP/2 connection: closed as hyper closes an idle HTTP/1.1
        // one (nothing is in flight; a graceful HTTP/2 shutdown would wait for the client
        // to answer a PING).
        () = idle(&activity, &started, shared.header_timeout, shared.idle_timeout) => Ok(()),
        () = shared.stop.cancelled() => {
            // Finish the request in flight, then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    // No longer a candidate for eviction.
    started.store(true, Ordering::Relaxed);
    if let Err(e) = ended {
        tracing::debug!("connection ended: {e}");
    }
}

/// Streams an HTTP/2 connection may have open at once (each is a request in flight).
const MAX_STREAMS: u32 = 128;

/// What a connection's requests are doing, for [`idle`].
#[derive(Debug, Default)]
struct Activity {
    /// The connection speaks HTTP/2 (prior knowledge).
    h2: AtomicBool,
    /// Requests whose response has not ended.
    in_flight: AtomicUsize,
    /// A request started since [`idle`] last looked.
    seen: AtomicBool,
    /// Requests started so far.
    requests: AtomicU64,
    /// HTTP/1.1: bytes arrived while no request was in flight, and no request started
    /// since: a request head is on its way ([`Guarded`] sets it).
    head_begun: AtomicBool,
}

/// One request in flight on a connection; ends when dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.seen.store(true, Ordering::Relaxed);
        activity.requests.fetch_add(1, Ordering::Relaxed);
        activity.head_begun.store(false, Ordering::Relaxed);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Resolves once the connection should close: no request started within `head` of its
/// opening; (HTTP/1.1) a request head that began to arrive and did not complete within one
/// to two times `head`; (HTTP/2) no request in flight and none started for `idle_for` (to
/// within `head`). An HTTP/1.1 connection idle between requests is closed by hyper, whose
/// header timeout is `idle_for` (see [`serve`]).
async fn idle(activity: &Activity, started: &AtomicBool, head: Duration, idle_for: Duration) {
    let mut busy_at = tokio::time::Instant::now();
    // The request count when a head was last seen on its way.
    let mut head_pending: Option<u64> = None;
    loop {
        tokio::time::sleep(head).await;
        if !started.load(Ordering::Relaxed) {
            return;
        }
        let now = tokio::time::Instant::now();
        let seen = activity.seen.swap(false, Ordering::Relaxed);
        let in_flight = activity.in_flight.load(Ordering::Relaxed);
        if activity.h2.load(Ordering::Relaxed) {
            if seen || in_flight > 0 {
                busy_at = now;
            } else if now.duration_since(busy_at) >= idle_for {
                return;
            }
            continue;
        }
        let requests = activity.requests.load(Ordering::Relaxed);
        if in_flight == 0 && activity.head_begun.load(Ordering::Relaxed) {
            // On its way at the last look too, and no request started since: a whole
            // `head` has passed since its first byte.
            if head_pending == Some(requests) {
                return;
            }
            head_pending = Some(requests);
        } else {
            head_pending = None;
        }
    }
}

/// How long a connection admitted by evicting another waits for the evicted one to give
/// back its place (its task ends at its next poll).
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// Connections that have not started a request yet (half-open: no complete head), oldest
/// first. At the cap, a new connection closes the oldest of them instead of being refused,
/// so that connections which send nothing cannot keep a client out, however many
/// addresses they come from; connections that started a request (idle keep-alive ones
/// too) are never evicted. Entries whose connection started or ended are dropped as they
/// reach the front.
#[derive(Debug, Default)]
struct Waiting {
    queue: std::sync::Mutex<std::collections::VecDeque<(Arc<AtomicBool>, CancellationToken)>>,
}

impl Waiting {
    /// Registers a new connection: its "started a request" flag, and its eviction.
    fn add(&self) -> (Arc<AtomicBool>, CancellationToken) {
        let entry = (Arc::new(AtomicBool::new(false)), CancellationToken::new());
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut queue);
        queue.push_back(entry.clone());
        entry
    }

    /// Closes the oldest connection that has not started a request; false if there is none.
    fn evict_oldest(&self) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        Self::prune(&mut queue);
        match queue.pop_front() {
            Some((_, evict)) => {
                evict.cancel();
                true
            }
            None => false,
        }
    }

    fn prune(queue: &mut std::collections::VecDeque<(Arc<AtomicBool>, CancellationToken)>) {
        while queue
            .front()
            .is_some_and(|(started, _)| started.load(Ordering::Relaxed))
        {
            queue.pop_front();
        }
    }
}

/// The answer to a connection beyond the cap: 503 `SERVER_BUSY`, `Retry-After: 1`, close.
fn busy_answer(max: usize) -> bytes::Bytes {
    busy(
        format!(
            "the server has its maximum of {max} connections open (--max-connections); retry later"
        ),
        "max_connections",
        max,
    )
}

/// The answer to a connection beyond the cap per peer: as [`busy_answer`].
fn peer_busy_answer(max: usize) -> bytes::Bytes {
    busy(
        format!("this address has its maximum of {max} connections open (--max-connections-per-peer); retry later"),
        "max_connections_per_peer",
        max,
    )
}

/// A whole 503 `SERVER_BUSY` reply naming the bound `what` and its `limit`.
fn busy(message: String, what: &str, limit: usize) -> bytes::Bytes {
    let body = serde_json::json!({
        "code": "SERVER_BUSY",
        "message": message,
        "details": { "what": what, "limit": limit },
    })
    .to_string();
    bytes::Bytes::from(format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ))
}

/// Connections open per peer address.
#[derive(Debug, Default)]
struct Peers {
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl Peers {
    /// Counts a connection from `ip`, unless it has `max` open already.
    fn admit(peers: &Arc<Peers>, ip: std::net::IpAddr, max: usize) -> Option<PeerSlot> {
        let mut open = peers.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: Arc::clone(peers),
            ip,
        })
    }
}

/// One connection's place in its peer's count, given back when dropped.
#[derive(Debug)]
struct PeerSlot {
    peers: Arc<Peers>,
    ip: std::net::IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The refused connections being answered, oldest first.
#[derive(Debug, Default)]
struct Refusals {
    pending: std::sync::Mutex<std::collections::VecDeque<(u64, CancellationToken)>>,
    next: std::sync::atomic::AtomicU64,
}

impl Refusals {
    /// Registers a refusal, closing the oldest one beyond [`REFUSING_AT_ONCE`].
    fn admit(&self) -> (u64, CancellationToken) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = CancellationToken::new();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push_back((id, token.clone()));
        if pending.len() > REFUSING_AT_ONCE {
            if let Some((_, oldest)) = pending.pop_front() {
                oldest.cancel();
            }
        }
        (id, token)
    }

    fn done(&self, id: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|(i, _)| *i != id);
    }
}

/// Answers a refused connection: after its request head, within [`REFUSAL_TIME`], unless
/// newer refusals push it out first.
async fn refuse(mut stream: TcpStream, answer: bytes::Bytes, refusals: Arc<Refusals>) {
    let (id, pushed_out) = refusals.admit();
    let answered = async {
        read_head(&mut stream).await?;
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        // Read (and drop) what else the client sent, until it closes.
        let mut sink = [0u8; 4096];
        let mut left = MAX_HEAD;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        io::Result::Ok(())
    };
    tokio::select! {
        _ = tokio::time::timeout(REFUSAL_TIME, answered) => {}
        () = pushed_out.cancelled() => {}
    }
    refusals.done(id);
}

/// Reads until the end of a request head (an empty line), at most [`MAX_HEAD`] bytes.
async fn read_head(stream: &mut TcpStream) -> io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if head[from..].windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(());
        }
    }
    Ok(())
}

/// A connection's socket, holding its place under the cap, with the stall timeout on
/// writes.
#[derive(Debug)]
struct Guarded {
    stream: TcpStream,
    stall: Duration,
    /// Running while a write waits for the client to read.
    stalled: Option<Pin<Box<Sleep>>>,
    /// The connection's requests: bytes read while none is in flight begin a head.
    activity: Arc<Activity>,
    _permit: OwnedSemaphorePermit,
    _peer: PeerSlot,
}

impl Guarded {
    /// A write could not proceed: fails once it has waited [`Guarded::stall`].
    fn poll_stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let stall = self.stall;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {stall:?} (--io-timeout)"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(
        &mut self,
        polled: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.poll_stalled(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(())))
            && buf.filled().len() > before
            && self.activity.in_flight.load(Ordering::Relaxed) == 0
        {
            self.activity.head_begun.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.progress(polled, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.progress(polled, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.progress(polled, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
