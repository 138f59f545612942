//! Calls the supervisor performs itself, on its own copies: connecting and installing host
//! sockets, connecting the caller's own socket, and sends. Every operation here is
//! non-blocking; a call that must wait comes back to the loop ([`super::serve`]) as a
//! [`Waiting`], and goes on with [`Waiting::progress`] when its socket is ready.

use super::call::Call;
use super::control::{audit_control, audit_flags};
use super::decide::Sock;
use super::relay::Relayed;
use super::{Shared, MAX_SEND};
use crate::sys::Errno;
use crate::sys::{self as sysnet, Notif};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// What the loop does next with a call.
pub(super) enum Outcome {
    /// Answer the caller.
    Answer(Result<i64, i32>),
    /// Wait for the socket (takes a slot of the call's kind).
    Wait(Box<Waiting>),
    /// The caller is gone (its notification is no longer valid): nothing to answer.
    Gone,
}

/// The two kinds of waiting calls, each with slots of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Connect,
}

/// What the supervisor knows of the caller while it performs a call.
pub(super) struct Caller<'a> {
    pub(super) shared: &'a Shared,
    pub(super) listener: &'a OwnedFd,
    pub(super) notif: &'a Notif,
}

impl Caller<'_> {
    fn tid(&self) -> libc::pid_t {
        self.notif.pid as libc::pid_t
    }

    fn fd(&self) -> RawFd {
        self.notif.args[0] as RawFd
    }

    fn valid(&self) -> bool {
        sysnet::notif_id_valid(self.listener, self.notif.id)
    }

    /// Installs `fresh` as the caller's descriptor; `Ok(())` or what to answer instead.
    fn install(&self, fresh: &OwnedFd) -> Result<(), Outcome> {
        let (tid, fd) = (self.tid(), self.fd());
        match sysnet::notif_addfd(self.listener, self.notif.id, fresh, fd, cloexec(tid, fd)) {
            Ok(()) => {
                if let Ok(mut r) = self.shared.report.lock() {
                    r.host_connections += 1;
                }
                Ok(())
            }
            Err(Errno(libc::ENOENT)) => Err(Outcome::Gone),
            Err(e) => Err(Outcome::Answer(Err(e.0))),
        }
    }

    /// A socket like the caller's `sock`, in the host's namespace, non-blocking.
    fn host_socket(&self, sock: &Sock) -> Result<OwnedFd, i32> {
        let ty = if sock.stream {
            libc::SOCK_STREAM
        } else {
            libc::SOCK_DGRAM
        };
        let s = sysnet::socket(sock.domain, ty | libc::SOCK_NONBLOCK, 0).map_err(|e| e.0)?;
        if sock.stream {
            // Options set before connect would be lost with the old socket; keep the
            // one latency-sensitive clients set. Any process may set it.
            if let Ok(v) = sysnet::sockopt_int(&sock.file, libc::IPPROTO_TCP, libc::TCP_NODELAY) {
                let _ = sysnet::set_sockopt_int(&s, libc::IPPROTO_TCP, libc::TCP_NODELAY, v);
            }
        }
        Ok(s)
    }
}

/// A call that waits for its socket.
pub(super) struct Waiting {
    pub(super) notif: Notif,
    /// The calling thread (or, before Linux 6.9, its leader): readable once it exited.
    pub(super) pidfd: OwnedFd,
    /// When the caller's `SO_SNDTIMEO` runs out.
    pub(super) deadline: Option<Instant>,
    state: State,
}

enum State {
    /// A new host socket connecting, installed in place of the caller's when done (or, for
    /// a relayed connection, handed to the relay with a pair's end installed instead).
    Installing {
        fresh: OwnedFd,
        relay: Option<Box<Relayed>>,
    },
    /// The caller's own socket connecting (our copy of it).
    Connecting { sock: OwnedFd },
    /// A send waiting for room on the caller's socket (our copy), `sent` bytes of it done.
    Sending {
        sock: OwnedFd,
        send: Send,
        sent: usize,
    },
}

impl Waiting {
    pub(super) fn kind(&self) -> Kind {
        match self.state {
            State::Sending { .. } => Kind::Send,
            State::Installing { .. } | State::Connecting { .. } => Kind::Connect,
        }
    }

    /// The descriptor whose `POLLOUT` means the call can go on.
    pub(super) fn fd(&self) -> RawFd {
        match &self.state {
            State::Installing { fresh, .. } => fresh.as_raw_fd(),
            State::Connecting { sock } | State::Sending { sock, .. } => sock.as_raw_fd(),
        }
    }

    /// Goes on once the socket is ready.
    pub(super) fn progress(self, shared: &Shared, listener: &OwnedFd, buf: &mut [u8]) -> Outcome {
        let notif = self.notif;
        let caller = Caller {
            shared,
            listener,
            notif: &notif,
        };
        match self.state {
            State::Installing { fresh, relay } => {
                let done = connect_result(&fresh);
                finish_install(&caller, fresh, done, relay)
            }
            State::Connecting { sock } => Outcome::Answer(connect_result(&sock).map(|()| 0)),
            State::Sending { sock, send, sent } => {
                match send_some(&caller, &sock, &send, sent, buf) {
                    Sent::Some(n) if sent + n < send.total && send.stream => {
                        Outcome::Wait(Box::new(Waiting {
                            state: State::Sending {
                                sock,
                                send,
                                sent: sent + n,
                            },
                            ..self
                        }))
                    }
                    Sent::Some(n) => send.finish(&caller, sent + n),
                    Sent::WouldBlock => Outcome::Wait(Box::new(Waiting {
                        state: State::Sending { sock, send, sent },
                        ..self
                    })),
                    Sent::Failed(_) if sent > 0 => send.finish(&caller, sent),
                    Sent::Failed(e) => Outcome::Answer(Err(e)),
                    Sent::Gone => Outcome::Gone,
                }
            }
        }
    }

    /// The answer when the call cannot wait any longer (its `SO_SNDTIMEO` ran out, or no
    /// slot is left), as the kernel gives it: a connect goes on in the background and the
    /// caller gets `EINPROGRESS`; a send returns what it sent, or `EAGAIN`.
    pub(super) fn give_up(self, shared: &Shared, listener: &OwnedFd) -> Outcome {
        let notif = self.notif;
        let caller = Caller {
            shared,
            listener,
            notif: &notif,
        };
        match self.state {
            State::Installing { fresh, relay } => {
                finish_install(&caller, fresh, Err(libc::EINPROGRESS), relay)
            }
            State::Connecting { .. } => Outcome::Answer(Err(libc::EINPROGRESS)),
            State::Sending { send, sent, .. } if sent > 0 => send.finish(&caller, sent),
            State::Sending { .. } => Outcome::Answer(Err(libc::EAGAIN)),
        }
    }
}

/// How a performed call may proceed.
pub(super) struct Job<'a> {
    pub(super) caller: Caller<'a>,
    pub(super) pidfd: OwnedFd,
    pub(super) sock: Sock,
    /// When the caller's `SO_SNDTIMEO` runs out.
    pub(super) deadline: Option<Instant>,
    /// Whether the caller waits for the outcome (a blocking socket whose timeout has not
    /// run out); otherwise the call must not wait.
    pub(super) wait: bool,
}

impl Job<'_> {
    fn waiting(notif: &Notif, pidfd: OwnedFd, deadline: Option<Instant>, state: State) -> Outcome {
        Outcome::Wait(Box::new(Waiting {
            notif: *notif,
            pidfd,
            deadline,
            state,
        }))
    }

    /// Connects a new host socket to the copied address and installs it in place of the
    /// caller's. The connect is non-blocking: one that completes at once (loopback, or
    /// refused) is answered right here; a blocking caller of a slow one waits. With
    /// `relay`, the caller gets one end of a loopback pair instead and the relay the rest.
    pub(super) fn connect_replacement(self, addr: &[u8], relay: Option<Box<Relayed>>) -> Outcome {
        let fresh = match self.caller.host_socket(&self.sock) {
            Ok(s) => s,
            Err(e) => return Outcome::Answer(Err(e)),
        };
        match sysnet::connect(&fresh, addr) {
            Ok(()) => finish_install(&self.caller, fresh, Ok(()), relay),
            Err(Errno(libc::EINPROGRESS)) if self.sock.nonblocking => {
                let installed = match relay {
                    // The pair is connected already: the client may write its first
                    // flight at once; the relay holds it until upstream is connected.
                    Some(to) => install_relayed(&self.caller, fresh, *to, false),
                    None => self.caller.install(&fresh),
                };
                match installed {
                    Ok(()) => Outcome::Answer(Err(libc::EINPROGRESS)),
                    Err(o) => o,
                }
            }
            Err(Errno(libc::EINPROGRESS)) if !self.wait => {
                finish_install(&self.caller, fresh, Err(libc::EINPROGRESS), relay)
            }
            Err(Errno(libc::EINPROGRESS)) => match connected_now(&fresh) {
                Some(done) => finish_install(&self.caller, fresh, done, relay),
                None => Self::waiting(
                    self.caller.notif,
                    self.pidfd,
                    self.deadline,
                    State::Installing { fresh, relay },
                ),
            },
            Err(e) => Outcome::Answer(Err(e.0)),
        }
    }

    /// Connects the caller's own socket (our copy of it) to the copied address. A blocking
    /// stream socket is made non-blocking for the one `connect` call (the flag belongs to
    /// the open file, which the caller's other threads see for that instant), and the
    /// caller waits for the result here instead of in the kernel.
    pub(super) fn connect_own(self, addr: &[u8]) -> Outcome {
        let file = &self.sock.file;
        if self.sock.nonblocking || !self.sock.stream {
            return Outcome::Answer(sysnet::connect(file, addr).map(|()| 0).map_err(|e| e.0));
        }
        if let Err(e) = sysnet::set_nonblocking(file, true) {
            return Outcome::Answer(Err(e.0));
        }
        let result = sysnet::connect(file, addr);
        if let Err(e) = sysnet::set_nonblocking(file, false) {
            return Outcome::Answer(Err(e.0));
        }
        match result {
            Ok(()) => Outcome::Answer(Ok(0)),
            Err(Errno(libc::EINPROGRESS)) if !self.wait => Outcome::Answer(Err(libc::EINPROGRESS)),
            Err(Errno(libc::EINPROGRESS)) => match connected_now(file) {
                Some(done) => Outcome::Answer(done.map(|()| 0)),
                None => Self::waiting(
                    self.caller.notif,
                    self.pidfd,
                    self.deadline,
                    State::Connecting {
                        sock: self.sock.file,
                    },
                ),
            },
            Err(e) => Outcome::Answer(Err(e.0)),
        }
    }

    /// Sends on the caller's own socket (our copy), or, with `replace`, sends the datagram
    /// through a new host socket and installs it in place of the caller's.
    pub(super) fn send(self, send: Send, replace: bool, buf: &mut [u8]) -> Outcome {
        let wait = self.wait && send.flags & libc::MSG_DONTWAIT == 0;
        if replace {
            // A datagram (decide() replaces only for UDP): it fits a fresh socket's buffer.
            let fresh = match self.caller.host_socket(&self.sock) {
                Ok(s) => s,
                Err(e) => return Outcome::Answer(Err(e)),
            };
            if !self.sock.nonblocking {
                if let Err(e) = sysnet::set_nonblocking(&fresh, false) {
                    return Outcome::Answer(Err(e.0));
                }
            }
            return match send_some(&self.caller, &fresh, &send, 0, buf) {
                Sent::Some(n) => match self.caller.install(&fresh) {
                    Ok(()) => send.finish(&self.caller, n),
                    Err(o) => o,
                },
                // No room in a new socket's buffer: memory is short. Not EAGAIN to a caller
                // that blocks.
                Sent::WouldBlock => {
                    Outcome::Answer(Err(if wait { libc::ENOBUFS } else { libc::EAGAIN }))
                }
                Sent::Failed(e) => Outcome::Answer(Err(e)),
                Sent::Gone => Outcome::Gone,
            };
        }
        let sent = match send_some(&self.caller, &self.sock.file, &send, 0, buf) {
            Sent::Some(n) if n == send.total || !send.stream || !wait => {
                return send.finish(&self.caller, n)
            }
            Sent::Some(n) => n,
            Sent::WouldBlock if wait => 0,
            Sent::WouldBlock => return Outcome::Answer(Err(libc::EAGAIN)),
            Sent::Failed(e) => return Outcome::Answer(Err(e)),
            Sent::Gone => return Outcome::Gone,
        };
        Self::waiting(
            self.caller.notif,
            self.pidfd,
            self.deadline,
            State::Sending {
                sock: self.sock.file,
                send,
                sent,
            },
        )
    }
}

/// A send the supervisor performs: its arguments as copied and audited.
pub(super) struct Send {
    name: Option<Vec<u8>>,
    /// The caller's iovecs: (base, len) in its memory. The data is copied when it is sent.
    iov: Vec<(u64, usize)>,
    control: Vec<u8>,
    flags: i32,
    /// For sendmmsg: where to store `msg_len` of the first message.
    mmsg_len_at: Option<u64>,
    /// Bytes to send: the caller's, up to [`MAX_SEND`].
    total: usize,
    stream: bool,
}

impl Send {
    /// The send of `call`, or the errno to answer: control messages and flags that would
    /// borrow the supervisor's privilege or route are refused, a datagram too large to copy
    /// is refused with `EMSGSIZE`.
    pub(super) fn new(call: Call, sock: &Sock) -> Result<Send, i32> {
        let Call::Send {
            name,
            iov,
            control,
            flags,
            mmsg_len_at,
        } = call
        else {
            return Err(libc::EINVAL);
        };
        audit_control(&control)?;
        // MSG_ZEROCOPY does something only on a socket the caller enabled it on; there the
        // kernel would pin and transmit the supervisor's buffer (reused for the next call)
        // and queue completions for it. Refused with ENOBUFS, the kernel's answer when it
        // cannot take a zerocopy send (callers then copy); elsewhere ignored, as the kernel
        // ignores it.
        let zerocopy = flags & libc::MSG_ZEROCOPY != 0
            && sysnet::sockopt_int(&sock.file, libc::SOL_SOCKET, libc::SO_ZEROCOPY)
                .is_ok_and(|on| on != 0);
        if zerocopy {
            return Err(libc::ENOBUFS);
        }
        let flags = audit_flags(flags & !libc::MSG_ZEROCOPY)?;
        let len = iov.iter().fold(0usize, |a, &(_, l)| a.saturating_add(l));
        if !sock.stream && len > MAX_SEND {
            return Err(libc::EMSGSIZE);
        }
        Ok(Send {
            name,
            iov,
            control,
            flags,
            mmsg_len_at,
            total: len.min(MAX_SEND),
            stream: sock.stream,
        })
    }

    /// The answer once `sent` bytes went out: their count, or for `sendmmsg` one message
    /// (its `msg_len` written back to the caller).
    fn finish(&self, caller: &Caller, sent: usize) -> Outcome {
        let Some(at) = self.mmsg_len_at else {
            return Outcome::Answer(Ok(sent as i64));
        };
        // Through /proc/<tid>/mem opened *before* the validity check: the file stays bound
        // to the caller's memory even if its id were reused afterwards.
        let mem = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", caller.tid()));
        if !caller.valid() {
            return Outcome::Gone;
        }
        match mem.and_then(|m| m.write_all_at(&(sent as u32).to_ne_bytes(), at)) {
            Ok(()) => Outcome::Answer(Ok(1)),
            Err(e) => Outcome::Answer(Err(e.raw_os_error().unwrap_or(libc::EFAULT))),
        }
    }
}

enum Sent {
    Some(usize),
    WouldBlock,
    Failed(i32),
    Gone,
}

/// Copies the caller's data from byte `sent` on (at most what is left of `send.total`) and
/// sends it without blocking; control messages go with the first bytes only.
fn send_some(caller: &Caller, on: &OwnedFd, send: &Send, sent: usize, buf: &mut [u8]) -> Sent {
    let want = send.total.saturating_sub(sent).min(buf.len());
    let data = &mut buf[..want];
    if let Err(e) = gather(caller.tid(), &send.iov, sent, data) {
        return Sent::Failed(e);
    }
    // The caller may have died and its id been reused while we read: only a still valid
    // notification says the data is the caller's.
    if !caller.valid() {
        return Sent::Gone;
    }
    let control: &[u8] = if sent == 0 { &send.control } else { &[] };
    match sysnet::sendmsg(
        on,
        send.name.as_deref(),
        &[data],
        control,
        send.flags | libc::MSG_DONTWAIT,
    ) {
        Ok(n) => Sent::Some(n),
        Err(Errno(libc::EAGAIN)) => Sent::WouldBlock,
        Err(e) => Sent::Failed(e.0),
    }
}

/// Copies the caller's data, skipping its first `skip` bytes, into `out` (filled whole
/// unless the iovecs end first).
fn gather(
    tid: libc::pid_t,
    iov: &[(u64, usize)],
    mut skip: usize,
    out: &mut [u8],
) -> Result<(), i32> {
    let mut at = 0;
    for &(base, len) in iov {
        if at == out.len() {
            break;
        }
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = (len - skip).min(out.len() - at);
        sysnet::vm_read(tid, base.wrapping_add(skip as u64), &mut out[at..at + take])
            .map_err(|e| e.0)?;
        at += take;
        skip = 0;
    }
    Ok(())
}

/// Installs the connected (or failed) `fresh` and answers: a socket the caller had
/// blocking is installed blocking. With `relay`, `fresh` goes to the relay instead.
fn finish_install(
    caller: &Caller,
    fresh: OwnedFd,
    done: Result<(), i32>,
    relay: Option<Box<Relayed>>,
) -> Outcome {
    let result = match done {
        Ok(()) => Ok(0),
        Err(libc::EINPROGRESS) => Err(libc::EINPROGRESS),
        Err(e) => return Outcome::Answer(Err(e)),
    };
    if let Some(to) = relay {
        return match install_relayed(caller, fresh, *to, true) {
            Ok(()) => Outcome::Answer(result),
            Err(o) => o,
        };
    }
    if let Err(e) = sysnet::set_nonblocking(&fresh, false) {
        return Outcome::Answer(Err(e.0));
    }
    match caller.install(&fresh) {
        Ok(()) => Outcome::Answer(result),
        Err(o) => o,
    }
}

/// Installs one end of a loopback pair in place of the caller's socket (blocking if
/// `blocking`, with `TCP_NODELAY` as the caller set it) and hands the other end and
/// `upstream` (with `TCP_NODELAY`: the relay forwards at once) to the relay.
fn install_relayed(
    caller: &Caller,
    upstream: OwnedFd,
    to: Relayed,
    blocking: bool,
) -> Result<(), Outcome> {
    let answer = |e: Errno| Outcome::Answer(Err(e.0));
    let domain =
        sysnet::sockopt_int(&upstream, libc::SOL_SOCKET, libc::SO_DOMAIN).map_err(answer)?;
    let (theirs, ours) = caller.shared.relay.pair(domain).map_err(answer)?;
    if blocking {
        sysnet::set_nonblocking(&theirs, false).map_err(answer)?;
    }
    // host_socket() copied the caller's choice onto the upstream socket: it goes to the
    // sandbox's end, where the caller's writes are (and where a later setsockopt lands).
    // Upstream, the relay forwards what already arrived: Nagle there would hold a second
    // piece of a flight (a TLS client's Finished, then its request) until the server ACKs
    // the first, which a server waiting for the rest delays by ~40 ms — measured by
    // bench/net/run as 40 ms added to every new HTTPS connection of a client that sets
    // TCP_NODELAY after connect (Go) or never (Python's http.client).
    if let Ok(v) = sysnet::sockopt_int(&upstream, libc::IPPROTO_TCP, libc::TCP_NODELAY) {
        let _ = sysnet::set_sockopt_int(&theirs, libc::IPPROTO_TCP, libc::TCP_NODELAY, v);
    }
    let _ = sysnet::set_sockopt_int(&upstream, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    caller.install(&theirs)?;
    caller.shared.relay.start(ours, upstream, to);
    Ok(())
}

/// Whether a non-blocking connect has finished already, and how.
fn connected_now(fd: &OwnedFd) -> Option<Result<(), i32>> {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    }];
    match crate::sys::poll(&mut fds, 0) {
        Ok(0) | Err(Errno(libc::EINTR)) => None,
        Ok(_) => Some(connect_result(fd)),
        Err(e) => Some(Err(e.0)),
    }
}

/// The outcome of a finished non-blocking connect (`SO_ERROR`).
fn connect_result(fd: &OwnedFd) -> Result<(), i32> {
    match sysnet::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
        Ok(0) => Ok(()),
        Ok(e) => Err(e),
        Err(e) => Err(e.0),
    }
}

/// Whether the caller's descriptor `fd` is close-on-exec (from `/proc/<tid>/fdinfo`).
fn cloexec(tid: libc::pid_t, fd: RawFd) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| i64::from_str_radix(v.trim(), 8).ok())
        })
        .is_some_and(|f| f & i64::from(libc::O_CLOEXEC) != 0)
}
