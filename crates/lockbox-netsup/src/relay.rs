//! The relay of name-allowed TCP connections: the name the client asks for (TLS SNI, HTTP
//! `Host`) must be on the allow-list too, not only the address it connects to.
//!
//! An address answered for a listed name may serve other names (a CDN, a shared host). So
//! the sandbox's descriptor is not the upstream socket but one end of a TCP pair on the
//! host's loopback ([`Relay::pair`]); the supervisor connects upstream itself, and this
//! module's thread holds the other end of the pair and the upstream socket:
//!
//! 1. **First flight.** It reads what the client sends first (at most
//!    [`FIRST_FLIGHT_MAX`] bytes, within [`FIRST_FLIGHT_TIMEOUT`]) and sends nothing
//!    upstream meanwhile. A TLS ClientHello must carry a server name the list allows, an
//!    HTTP/1 request a `Host` it allows ([`super::first`]); anything else TLS- or HTTP-like
//!    is refused. Refused: both sockets are reset, no byte went upstream, an event is logged.
//!    A server that speaks first (SSH, SMTP...) and a client whose bytes are neither TLS
//!    nor HTTP ask for no name: their connection is relayed as it is.
//! 2. **Data.** From then on bytes move with `splice(2)` through a pipe per direction, never
//!    copied to user space. A half-close (`shutdown(SHUT_WR)`) is passed on once the pipe
//!    is drained; an error on either side resets both.
//!
//! 3. **Intercepted.** A TLS connection whose server name an [`Interceptor`] claims
//!    (`--http-auth`, `--http-allow`) is handed to it after the check instead of being
//!    spliced ([`super::intercept`]); plain HTTP to such a name is refused.
//!
//! **Bounded.** One thread for every relayed connection of the sandbox, started with the
//! first; at most [`RELAY_SLOTS`] connections whose sandbox side is open (six descriptors
//! each: two sockets, two pipes), reserved before the supervisor connects upstream
//! ([`Relay::reserve`]): a blocking connect beyond the cap waits for a slot (parked, tried
//! again every [`RELAY_RETRY`]), a non-blocking one fails at once with `ENOBUFS`. Once the
//! sandbox's side has closed or shut its sending side, the connection gives its slot back
//! and drains (upstream's last bytes, its close): at most [`DRAINING_MAX`] of those, each
//! for at most [`DRAIN_TIMEOUT`], the oldest reset first. The thread ends, closing every
//! connection, when the supervisor does (the sandbox ended).

use super::audit::{AuditSink, Decision, EventKind, NetEvent, Protocol as AuditProtocol};
use super::first::{classify, FirstFlight, Protocol, FIRST_FLIGHT_MAX};
use super::intercept::{Intercepted, Interceptor};
use super::list::Current;
use super::NetReport;
use crate::sys::Errno;
use lockbox_policy::{ListKind, Proto};
use rustix::pipe::{splice, SpliceFlags};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Relayed connections of one sandbox at once whose sandbox side is open. A blocking
/// connect beyond waits for a slot (until its `SO_SNDTIMEO`), a non-blocking one gets
/// `ENOBUFS`.
pub const RELAY_SLOTS: usize = 64;
/// How often connects waiting for a relay slot are tried again.
pub const RELAY_RETRY: Duration = Duration::from_millis(5);
/// Connections whose sandbox side closed (or shut its sending side) and that still pass on
/// what upstream sends: they hold no slot, but at most this many are kept (the oldest is
/// reset first), each at most [`DRAIN_TIMEOUT`].
pub const DRAINING_MAX: usize = 64;
/// How long a draining connection may wait for upstream to finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client has to send its first flight (or a server to speak first).
pub const FIRST_FLIGHT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pipe size asked for each direction (best effort: the kernel may give less).
const PIPE_SIZE: usize = 256 << 10;
/// Bytes moved for one direction of one connection per wake-up, so one busy connection
/// cannot starve the others.
const BUDGET: usize = 4 << 20;

/// A reserved relay slot, given back when dropped.
#[derive(Debug)]
pub(super) struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who asked for a relayed connection, and to where (for the decision and its event).
#[derive(Debug)]
pub(super) struct Relayed {
    /// The slot, given back once the sandbox's side is done (the connection drains).
    pub(super) ticket: Option<Ticket>,
    pub(super) dest: SocketAddr,
    /// The name whose answer allowed `dest`.
    pub(super) answered: Option<String>,
    pub(super) pid: Option<u32>,
    pub(super) command: Option<String>,
}

/// What the relay thread needs of the supervisor.
#[derive(Debug, Clone)]
struct Context {
    /// The list in force: a first flight is checked against its names when it arrives.
    list: Current,
    audit: Option<AuditSink>,
    report: Arc<Mutex<NetReport>>,
    interceptor: Option<Arc<dyn Interceptor>>,
}

/// The relay of one sandbox: its slots, its loopback listeners, its thread (started with
/// the first connection).
#[derive(Debug)]
pub(super) struct Relay {
    context: Context,
    active: Arc<AtomicUsize>,
    listeners: Mutex<[Option<TcpListener>; 2]>,
    thread: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    tx: Sender<Conn>,
    wake: UnixStream,
    handle: JoinHandle<()>,
}

impl Relay {
    pub(super) fn new(
        list: Current,
        audit: Option<AuditSink>,
        report: Arc<Mutex<NetReport>>,
        interceptor: Option<Arc<dyn Interceptor>>,
    ) -> Relay {
        Relay {
            context: Context {
                list,
                audit,
                report,
                interceptor,
            },
            active: Arc::default(),
            listeners: Mutex::default(),
            thread: Mutex::default(),
        }
    }

    /// A slot, or `None` when [`RELAY_SLOTS`] connections are relayed already.
    pub(super) fn reserve(&self) -> Option<Ticket> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < RELAY_SLOTS).then_some(n + 1)
            })
            .ok()
            .map(|_| Ticket(self.active.clone()))
    }

    /// A connected TCP pair on the host's loopback (IPv6 for an IPv6 caller where the host
    /// has `::1`): (the sandbox's end, ours), both non-blocking. Our end is the one our
    /// listener accepted from exactly the sandbox end's address: another process of the
    /// host connecting to the listener meanwhile is dropped, never relayed.
    pub(super) fn pair(&self, domain: i32) -> Result<(OwnedFd, OwnedFd), Errno> {
        let io = |e: std::io::Error| Errno(e.raw_os_error().unwrap_or(libc::EIO));
        let mut listeners = self.listeners.lock().map_err(|_| Errno(libc::EIO))?;
        let mut v6 = domain == libc::AF_INET6;
        if v6 && listeners[1].is_none() {
            // No ::1 on this host: an IPv4 pair serves as well.
            match TcpListener::bind((Ipv6Addr::LOCALHOST, 0)) {
                Ok(l) => {
                    l.set_nonblocking(true).map_err(io)?;
                    listeners[1] = Some(l);
                }
                Err(_) => v6 = false,
            }
        }
        if !v6 && listeners[0].is_none() {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io)?;
            l.set_nonblocking(true).map_err(io)?;
            listeners[0] = Some(l);
        }
        let slot = usize::from(v6);
        let listener = listeners[slot].as_ref().ok_or(Errno(libc::EIO))?;
        let at = listener.local_addr().map_err(io)?;
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        let theirs = crate::sys::socket(family, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)?;
        match crate::sys::connect(&theirs, &sockaddr(at)) {
            Ok(()) | Err(Errno(libc::EINPROGRESS)) => {}
            Err(e) => return Err(e),
        }
        let theirs = TcpStream::from(theirs);
        let want = theirs.local_addr().map_err(io)?;
        // A loopback handshake completes within connect(): the connection is queued.
        loop {
            match listener.accept() {
                Ok((ours, from)) if from == want => {
                    ours.set_nonblocking(true).map_err(io)?;
                    let _ = ours.set_nodelay(true);
                    return Ok((OwnedFd::from(theirs), OwnedFd::from(ours)));
                }
                Ok(_) => continue,
                Err(e) => return Err(io(e)),
            }
        }
    }

    /// Hands a connection to the relay thread (starting it with the first): `client` is our
    /// end of the pair, `upstream` the host socket connected (or connecting) to `to.dest`.
    pub(super) fn start(&self, client: OwnedFd, upstream: OwnedFd, to: Relayed) {
        let Ok(mut thread) = self.thread.lock() else {
            return;
        };
        if thread.is_none() {
            *thread = self.spawn();
        }
        let Some(running) = thread.as_mut() else {
            return; // dropping the sockets closes the connection
        };
        let conn = Conn {
            client,
            upstream,
            to,
            phase: Phase::First {
                buf: Vec::new(),
                deadline: Instant::now() + FIRST_FLIGHT_TIMEOUT,
            },
            draining: None,
        };
        if running.tx.send(conn).is_ok() {
            let _ = running.wake.write(&[1]);
        }
    }

    fn spawn(&self) -> Option<Running> {
        let (tx, rx) = mpsc::channel();
        let (wake, wake_rx) = UnixStream::pair().ok()?;
        wake.set_nonblocking(true).ok()?;
        wake_rx.set_nonblocking(true).ok()?;
        let context = self.context.clone();
        let handle = std::thread::Builder::new()
            .name("lockbox-relay".into())
            .spawn(move || run(&context, &rx, wake_rx))
            .ok()?;
        Some(Running { tx, wake, handle })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let running = self.thread.get_mut().ok().and_then(Option::take);
        if let Some(Running { tx, wake, handle }) = running {
            drop(tx);
            // Closing our end wakes the thread's poll (POLLHUP); it closes every connection.
            drop(wake);
            let _ = handle.join();
        }
    }
}

fn sockaddr(at: SocketAddr) -> Vec<u8> {
    let mut b = Vec::new();
    match at {
        SocketAddr::V4(a) => {
            b.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b.extend_from_slice(&a.port().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&[0; 8]);
        }
        SocketAddr::V6(a) => {
            b.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b.extend_from_slice(&a.port().to_be_bytes());
            b.extend_from_slice(&a.flowinfo().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    b
}

/// One relayed connection.
struct Conn {
    /// Our end of the pair whose other end the sandbox holds.
    client: OwnedFd,
    upstream: OwnedFd,
    to: Relayed,
    phase: Phase,
    /// Since when the sandbox's side is done (its slot given back).
    draining: Option<Instant>,
}

enum Phase {
    /// Reading the client's first flight; nothing sent upstream yet.
    First { buf: Vec<u8>, deadline: Instant },
    /// Relaying: client → upstream and upstream → client.
    Data { up: Flow, down: Flow },
}

/// One direction of a connection: a pipe, what is in it, and the first flight still to
/// write (upstream only).
struct Flow {
    read: OwnedFd,
    write: OwnedFd,
    in_pipe: usize,
    capacity: usize,
    head: Vec<u8>,
    head_sent: usize,
    eof: bool,
    shut: bool,
}

impl Flow {
    fn new(head: Vec<u8>) -> Result<Flow, Errno> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| Errno(e.raw_os_error()))?;
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, PIPE_SIZE)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))
            .map_err(|e| Errno(e.raw_os_error()))?;
        Ok(Flow {
            read,
            write,
            in_pipe: 0,
            capacity,
            head,
            head_sent: 0,
            eof: false,
            shut: false,
        })
    }

    fn pending(&self) -> bool {
        self.in_pipe > 0 || self.head_sent < self.head.len()
    }

    /// Poll events wanted on the source and on the destination.
    fn interest(&self) -> (i16, i16) {
        let head_sent = self.head_sent == self.head.len();
        let src = if !self.eof && head_sent && self.in_pipe < self.capacity {
            libc::POLLIN
        } else {
            0
        };
        let dst = if self.pending() { libc::POLLOUT } else { 0 };
        (src, dst)
    }

    /// Moves what can move without blocking; `Err` when either side failed.
    fn pump(&mut self, src: &OwnedFd, dst: &OwnedFd) -> Result<(), Errno> {
        let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
        let mut moved = 0;
        loop {
            let mut progress = false;
            while self.head_sent < self.head.len() {
                match rustix::io::write(dst, &self.head[self.head_sent..]) {
                    Ok(n) => {
                        self.head_sent += n;
                        progress = true;
                    }
                    Err(rustix::io::Errno::AGAIN) => return Ok(()),
                    Err(e) => return Err(Errno(e.raw_os_error())),
                }
            }
            if self.in_pipe > 0 {
                match splice(&self.read, None, dst, None, self.in_pipe, flags) {
                    Ok(n) => {
                        self.in_pipe -= n;
                        moved += n;
                        progress |= n > 0;
                    }
                    Err(rustix::io::Errno::AGAIN) => {}
                    Err(e) => return Err(Errno(e.raw_os_error())),
                }
            }
            if !self.eof && self.in_pipe < self.capacity {
                match splice(
                    src,
                    None,
                    &self.write,
                    None,
                    self.capacity - self.in_pipe,
                    flags,
                ) {
                    Ok(0) => {
                        self.eof = true;
                        progress = true;
                    }
                    Ok(n) => {
                        self.in_pipe += n;
                        progress = true;
                    }
                    Err(rustix::io::Errno::AGAIN) => {}
                    Err(e) => return Err(Errno(e.raw_os_error())),
                }
            }
            if self.eof && !self.pending() && !self.shut {
                // The source closed its sending side: pass the half-close on.
                let _ = rustix::net::shutdown(dst, rustix::net::Shutdown::Write);
                self.shut = true;
            }
            if !progress || moved >= BUDGET {
                return Ok(());
            }
        }
    }
}

/// What became of a connection after a step.
enum Step {
    Keep,
    /// Close both sockets; reset them (`SO_LINGER` 0) if `reset`.
    Close {
        reset: bool,
    },
    /// Hand the connection to the interceptor: its server name is `sni`.
    Intercept {
        sni: String,
    },
}

fn run(context: &Context, rx: &Receiver<Conn>, wake: UnixStream) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let now = Instant::now();
        fds.clear();
        fds.push(pollfd(wake.as_raw_fd(), libc::POLLIN));
        for c in &conns {
            let (client, upstream) = c.interest();
            fds.push(pollfd(c.client.as_raw_fd(), client));
            fds.push(pollfd(c.upstream.as_raw_fd(), upstream));
        }
        let timeout = conns
            .iter()
            .filter_map(|c| match &c.phase {
                Phase::First { deadline, .. } => Some(*deadline),
                Phase::Data { .. } => c.draining.map(|d| d + DRAIN_TIMEOUT),
            })
            .min()
            .map_or(-1, |d| {
                let ms = d.saturating_duration_since(now).as_millis() + 1;
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            });
        match crate::sys::poll(&mut fds, timeout) {
            Ok(_) | Err(Errno(libc::EINTR)) => {}
            Err(_) => return,
        }
        let woken = fds[0].revents;
        let ready: Vec<(i16, i16)> = fds[1..]
            .chunks_exact(2)
            .map(|p| (p[0].revents, p[1].revents))
            .collect();
        let now = Instant::now();
        let mut kept = Vec::with_capacity(conns.len());
        for (mut c, (client, upstream)) in conns.into_iter().zip(ready) {
            match c.step(context, client, upstream, now) {
                Step::Keep => kept.push(c),
                Step::Close { reset } => c.close(reset),
                Step::Intercept { sni } => c.hand_over(context, sni),
            }
        }
        conns = kept;
        drain(&mut conns, now);
        if woken & libc::POLLIN != 0 {
            let mut sink = [0u8; 64];
            match (&wake).read(&mut sink) {
                // The supervisor is gone: the sandbox ended.
                Ok(0) => return,
                _ => conns.extend(rx.try_iter()),
            }
        } else if woken != 0 {
            return;
        }
    }
}

/// Gives back the slots of connections whose sandbox side is done, and resets draining ones
/// past [`DRAIN_TIMEOUT`] or beyond [`DRAINING_MAX`] (the oldest first).
fn drain(conns: &mut Vec<Conn>, now: Instant) {
    for c in conns.iter_mut() {
        if let Phase::Data { up, .. } = &c.phase {
            if up.eof && c.to.ticket.is_some() {
                c.to.ticket = None;
                c.draining = Some(now);
            }
        }
    }
    let mut draining: Vec<Instant> = conns.iter().filter_map(|c| c.draining).collect();
    if draining.is_empty() {
        return;
    }
    draining.sort();
    let excess = draining.len().saturating_sub(DRAINING_MAX);
    // Reset those that started draining at or before this instant (the excess oldest).
    let cutoff = excess.checked_sub(1).map(|i| draining[i]);
    let (keep, gone): (Vec<Conn>, Vec<Conn>) = std::mem::take(conns).into_iter().partition(|c| {
        c.draining.is_none_or(|d| {
            now.saturating_duration_since(d) < DRAIN_TIMEOUT && cutoff.is_none_or(|cut| d > cut)
        })
    });
    *conns = keep;
    for c in gone {
        c.close(true);
    }
}

fn pollfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

impl Conn {
    fn interest(&self) -> (i16, i16) {
        match &self.phase {
            // The upstream socket is watched for a server that speaks first (and for a
            // failed connect, which poll reports whatever is asked).
            Phase::First { buf, .. } => {
                (libc::POLLIN, if buf.is_empty() { libc::POLLIN } else { 0 })
            }
            Phase::Data { up, down } => {
                let (up_src, up_dst) = up.interest();
                let (down_src, down_dst) = down.interest();
                (up_src | down_dst, down_src | up_dst)
            }
        }
    }

    fn step(&mut self, context: &Context, client: i16, upstream: i16, now: Instant) -> Step {
        match &mut self.phase {
            Phase::First { buf, deadline } => {
                let failed = libc::POLLERR | libc::POLLHUP;
                if buf.is_empty() && upstream & libc::POLLIN != 0 {
                    // The server speaks first: no name is asked.
                    return self.begin(Vec::new());
                }
                if upstream & failed != 0 {
                    return Step::Close { reset: true };
                }
                if client != 0 {
                    let mut chunk = [0u8; 4096];
                    let room = FIRST_FLIGHT_MAX - buf.len();
                    match rustix::io::read(&self.client, &mut chunk[..room.min(4096)]) {
                        Ok(0) if buf.is_empty() => return Step::Close { reset: false },
                        Ok(0) => {
                            return self.refuse(context, None, "closed before a whole first flight")
                        }
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                        Err(_) => return Step::Close { reset: true },
                    }
                    return self.first_flight(context);
                }
                if now >= *deadline {
                    return self.refuse(context, None, "no first flight within 10 s");
                }
                Step::Keep
            }
            // Nothing happened to it: no syscall spent on it.
            Phase::Data { .. } if client == 0 && upstream == 0 => Step::Keep,
            Phase::Data { up, down } => {
                let bad = libc::POLLERR;
                if client & bad != 0 || upstream & bad != 0 {
                    return Step::Close { reset: true };
                }
                if up.pump(&self.client, &self.upstream).is_err()
                    || down.pump(&self.upstream, &self.client).is_err()
                {
                    return Step::Close { reset: true };
                }
                if up.shut && down.shut {
                    Step::Close { reset: false }
                } else {
                    Step::Keep
                }
            }
        }
    }

    /// Decides on the bytes read so far.
    fn first_flight(&mut self, context: &Context) -> Step {
        let Phase::First { buf, .. } = &self.phase else {
            return Step::Keep;
        };
        match classify(buf) {
            FirstFlight::Incomplete => Step::Keep,
            FirstFlight::Other => {
                let head = buf.clone();
                self.begin(head)
            }
            FirstFlight::Unreadable(why, protocol) => {
                self.refuse(context, Some((protocol, None)), why)
            }
            FirstFlight::Tls(name) => self.check(context, Protocol::Tls, name),
            FirstFlight::Http(name) => self.check(context, Protocol::Http, name),
        }
    }

    /// Lets the connection through if `name` is on the list for this port.
    fn check(&mut self, context: &Context, protocol: Protocol, name: Option<String>) -> Step {
        let what = match protocol {
            Protocol::Tls => "sni",
            Protocol::Http => "host",
        };
        let list = context.list.get();
        if list.kind == ListKind::Deny {
            // The allow-list this connection was allowed under was replaced by a deny-list
            // before its first flight: names are not checked any more, as for every
            // connection made under the new list (its address was allowed at connect).
            let shown = name.as_deref().map(printable);
            self.log(
                context,
                Some((protocol, shown)),
                Decision::Allowed,
                "the allow-list was replaced by a deny-list: names not checked".to_owned(),
            );
            let Phase::First { buf, .. } = &mut self.phase else {
                return Step::Keep;
            };
            let head = std::mem::take(buf);
            return self.begin(head);
        }
        let Some(name) = name else {
            let why = match protocol {
                Protocol::Tls => "no sni",
                Protocol::Http => "no host",
            };
            return self.refuse(context, Some((protocol, None)), why);
        };
        let port = self.to.dest.port();
        let spec = list.names.iter().find(|s| {
            s.proto.is_none_or(|p| p == Proto::Tcp)
                && s.ports.contains(port)
                && s.matches_name(&name)
        });
        let shown = printable(&name);
        let Some(spec) = spec else {
            let why = format!("{what} {shown} not in the allow-list");
            return self.refuse_owned(context, Some((protocol, Some(shown))), why);
        };
        let sni = name.trim_end_matches('.').to_ascii_lowercase();
        let intercepted = context
            .interceptor
            .as_ref()
            .is_some_and(|i| i.intercepts(&sni, port));
        if intercepted && protocol == Protocol::Http {
            let why = format!(
                "host {shown} is intercepted by lockbox (--http-auth/--http-allow): plain HTTP refused, TLS only"
            );
            return self.refuse_owned(context, Some((protocol, Some(shown))), why);
        }
        let mut reason = format!("{what} {shown} matches {spec}");
        if intercepted {
            reason.push_str("; intercepted by lockbox (--http-auth/--http-allow)");
        }
        self.log(
            context,
            Some((protocol, Some(shown))),
            Decision::Allowed,
            reason,
        );
        if intercepted {
            return Step::Intercept { sni };
        }
        let Phase::First { buf, .. } = &mut self.phase else {
            return Step::Keep;
        };
        let head = std::mem::take(buf);
        self.begin(head)
    }

    /// Gives the connection, its first flight and its slot to the interceptor.
    fn hand_over(self, context: &Context, sni: String) {
        let Some(interceptor) = &context.interceptor else {
            return self.close(true);
        };
        let Phase::First { buf, .. } = self.phase else {
            return self.close(true);
        };
        interceptor.take(Intercepted {
            client: self.client,
            first_flight: buf,
            upstream: self.upstream,
            dest: self.to.dest,
            sni,
            pid: self.to.pid,
            command: self.to.command,
            slot: super::intercept::RelaySlot(self.to.ticket),
        });
    }

    fn refuse(
        &mut self,
        context: &Context,
        asked: Option<(Protocol, Option<String>)>,
        why: &str,
    ) -> Step {
        self.refuse_owned(context, asked, why.to_owned())
    }

    fn refuse_owned(
        &mut self,
        context: &Context,
        asked: Option<(Protocol, Option<String>)>,
        why: String,
    ) -> Step {
        if let Ok(mut r) = context.report.lock() {
            r.denied += 1;
            if r.denied_first.len() < super::DENIED_LISTED {
                let what = match &asked {
                    Some((Protocol::Tls, _)) => "tls",
                    Some((Protocol::Http, _)) => "http",
                    None => "connect",
                };
                r.denied_first
                    .push(format!("{what} tcp {}: {why}", self.to.dest));
            }
        }
        self.log(context, asked, Decision::Denied, why);
        Step::Close { reset: true }
    }

    fn log(
        &self,
        context: &Context,
        asked: Option<(Protocol, Option<String>)>,
        decision: Decision,
        reason: String,
    ) {
        let Some(sink) = &context.audit else {
            return;
        };
        let kind = match &asked {
            Some((Protocol::Tls, _)) => EventKind::Tls,
            Some((Protocol::Http, _)) => EventKind::Http,
            None => EventKind::Connect,
        };
        let mut e: NetEvent = sink.event(kind, decision, reason);
        e.protocol = Some(AuditProtocol::Tcp);
        e.address = Some(lockbox_policy::canonical(self.to.dest.ip()));
        e.port = Some(self.to.dest.port());
        e.name = self.to.answered.clone();
        match asked {
            Some((Protocol::Tls, sni)) => e.sni = sni,
            Some((Protocol::Http, host)) => e.host = host,
            None => {}
        }
        e.pid = self.to.pid;
        e.command = self.to.command.clone();
        sink.emit(e);
    }

    /// Starts relaying, `head` first.
    fn begin(&mut self, head: Vec<u8>) -> Step {
        match (Flow::new(head), Flow::new(Vec::new())) {
            (Ok(mut up), Ok(mut down)) => {
                // Move at once what is there already.
                if up.pump(&self.client, &self.upstream).is_err()
                    || down.pump(&self.upstream, &self.client).is_err()
                {
                    return Step::Close { reset: true };
                }
                self.phase = Phase::Data { up, down };
                Step::Keep
            }
            _ => Step::Close { reset: true },
        }
    }

    fn close(self, reset: bool) {
        if reset {
            for s in [&self.client, &self.upstream] {
                let _ = rustix::net::sockopt::set_socket_linger(s.as_fd(), Some(Duration::ZERO));
            }
        }
    }
}

/// A name as logged: printable ASCII, at most 253 bytes.
fn printable(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .take(253)
        .collect()
}
