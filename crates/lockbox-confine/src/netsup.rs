//! The network supervisor of `--net-allow` / `--net-deny` sandboxes.
//!
//! The sandbox keeps its own network namespace (loopback only). The command child installs
//! a second seccomp filter ([`filter`]) that hands `connect`, `sendto` with an address,
//! `sendmsg` and `sendmmsg` to this supervisor, a thread of the parent. For each call the
//! supervisor takes its own copy of the socket (`pidfd_getfd`) and of the address
//! (`process_vm_readv`, then `SECCOMP_IOCTL_NOTIF_ID_VALID`), decides on those copies with
//! [`lockbox_policy::route`], and acts on them itself:
//!
//! - to an allowed destination it connects a new socket in the host's namespace and
//!   installs it in place of the sandbox's descriptor (`SECCOMP_IOCTL_NOTIF_ADDFD`); from
//!   then on the data path is the kernel's own;
//! - a denied destination gets `EACCES`;
//! - a destination inside (loopback) stays in the sandbox's namespace.
//!
//! The kernel is asked to run a call itself (`CONTINUE`) only when nothing can change
//! what it does after our decision: the socket lives in the sandbox's namespace, so a
//! rewritten address can only reach the sandbox's own loopback, and the process has a
//! single thread (clones sharing the descriptor table are refused by the filter), so no
//! one can swap a host socket under the descriptor number meanwhile. Otherwise the
//! supervisor performs the call itself on its copies.

use crate::error::SetupError;
use crate::sys::Errno;
use crate::sysnet::{self, Notif};
use lockbox_policy::{route, ListKind, NetRule, Proto, Route};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// How many denied attempts a report lists (the count covers all).
const DENIED_LISTED: usize = 8;
/// Largest payload the supervisor sends for one intercepted call; a stream send may be
/// short, as the kernel's may be.
const MAX_SEND: usize = 1 << 20;
/// Largest `msg_controllen` copied.
const MAX_CONTROL: usize = 4096;
/// Largest iovec count (`UIO_MAXIOV`).
const MAX_IOV: usize = 1024;

/// What the supervisor saw, for the run report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetReport {
    /// Connections and datagrams sent to the host's network on the sandbox's behalf.
    pub host_connections: u64,
    /// Attempts refused by the policy.
    pub denied: u64,
    /// The first few refused attempts (`"connect tcp 10.0.0.1:80"`).
    pub denied_first: Vec<String>,
}

/// The rules a supervisor enforces.
#[derive(Debug, Clone)]
pub struct NetRules {
    /// Allow- or deny-list.
    pub kind: ListKind,
    /// Resolved rules.
    pub rules: Vec<NetRule>,
}

/// A running supervisor thread; dropping it stops the thread.
#[derive(Debug)]
pub struct Supervisor {
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
    report: Arc<Mutex<NetReport>>,
}

impl Supervisor {
    /// Stops the thread and returns what it saw.
    pub fn finish(mut self) -> NetReport {
        self.shutdown();
        self.report.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn shutdown(&mut self) {
        // Closing our end wakes the thread's poll (POLLHUP).
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Checks that the kernel has what the supervisor needs; names what is missing.
pub fn probe() -> Result<u64, SetupError> {
    let missing = |feature, problem: &str| SetupError::FeatureMissing {
        feature,
        problem: problem.into(),
        needed_for: "--net-allow/--net-deny (enforcing the list without races)",
    };
    if !crate::sys::seccomp_action_available(sysnet::RET_USER_NOTIF) {
        return Err(missing(
            "seccomp user notification",
            "is not available (Linux 5.9 or newer is required)",
        ));
    }
    let sock = sysnet::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).map_err(|errno| {
        SetupError::Supervise {
            what: "creating a probe socket",
            errno,
        }
    })?;
    let cookie = sysnet::netns_cookie(&sock).map_err(|_| {
        missing(
            "SO_NETNS_COOKIE",
            "is not available (Linux 5.14 or newer is required)",
        )
    })?;
    let me = sysnet::pidfd_open(std::process::id() as libc::pid_t, false).map_err(|_| {
        missing(
            "pidfd_open",
            "is not available (Linux 5.3 or newer is required)",
        )
    })?;
    sysnet::pidfd_getfd(&me, sock.as_raw_fd()).map_err(|_| {
        missing(
            "pidfd_getfd",
            "is not available (Linux 5.6 or newer is required)",
        )
    })?;
    Ok(cookie)
}

/// Starts the supervisor thread. `channel` is our end of the socket on which the command
/// child announces its listener.
pub fn start(
    rules: NetRules,
    host_cookie: u64,
    channel: OwnedFd,
) -> Result<Supervisor, SetupError> {
    let err = |errno| SetupError::Supervise {
        what: "starting the network supervisor",
        errno,
    };
    sysnet::set_passcred(&channel).map_err(err)?;
    let (stop, stop_rx) =
        UnixStream::pair().map_err(|e| err(Errno(e.raw_os_error().unwrap_or(libc::EIO))))?;
    let report = Arc::new(Mutex::new(NetReport::default()));
    let shared = Arc::new(Shared {
        rules,
        host_cookie,
        report: report.clone(),
    });
    let thread = std::thread::Builder::new()
        .name("lockbox-net".into())
        .spawn(move || {
            if let Some(listener) = accept_listener(&channel, &stop_rx) {
                serve(shared, Arc::new(listener), &stop_rx);
            }
        })
        .map_err(|e| err(Errno(e.raw_os_error().unwrap_or(libc::EAGAIN))))?;
    Ok(Supervisor {
        stop: Some(stop),
        thread: Some(thread),
        report,
    })
}

struct Shared {
    rules: NetRules,
    host_cookie: u64,
    report: Arc<Mutex<NetReport>>,
}

fn poll2(a: RawFd, b: RawFd) -> Option<(i16, i16)> {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        match crate::sys::poll(&mut fds, -1) {
            Err(Errno(libc::EINTR)) => continue,
            Err(_) => return None,
            Ok(_) => return Some((fds[0].revents, fds[1].revents)),
        }
    }
}

/// Receives the listener's number and the child's pid, takes a copy of the listener with
/// `pidfd_getfd`, and acknowledges (the child closes its copy and goes on to `execve`).
fn accept_listener(channel: &OwnedFd, stop: &UnixStream) -> Option<OwnedFd> {
    let (_, stopped) = poll2(channel.as_raw_fd(), stop.as_raw_fd())?;
    if stopped != 0 {
        return None;
    }
    let mut buf = [0u8; 4];
    let (n, pid) = sysnet::recv_with_pid(channel, &mut buf).ok()?;
    if n != 4 {
        return None;
    }
    let pidfd = sysnet::pidfd_open(pid?, false).ok()?;
    let listener = sysnet::pidfd_getfd(&pidfd, i32::from_ne_bytes(buf)).ok()?;
    // Best effort: a faster round trip where the kernel has it (Linux 6.6).
    let _ = sysnet::notif_sync_wakeup(&listener);
    crate::sys::write_all(channel.as_raw_fd(), b"k").ok()?;
    Some(listener)
}

fn serve(shared: Arc<Shared>, listener: Arc<OwnedFd>, stop: &UnixStream) {
    loop {
        let Some((ready, stopped)) = poll2(listener.as_raw_fd(), stop.as_raw_fd()) else {
            return;
        };
        if stopped != 0 {
            return;
        }
        if ready & libc::POLLIN != 0 {
            match sysnet::notif_recv(&listener) {
                Ok(notif) => handle(&shared, &listener, notif),
                // The caller died or was interrupted before we got it.
                Err(Errno(libc::ENOENT | libc::EINTR)) => {}
                Err(_) => return,
            }
        } else if ready != 0 {
            // POLLHUP: every process under the filter is gone.
            return;
        }
    }
}

/// The call being decided, with the supervisor's own copies of its arguments.
#[derive(Debug)]
enum Call {
    Connect {
        addr: Vec<u8>,
    },
    Send {
        name: Option<Vec<u8>>,
        /// Where the data iovecs are: (base, len) in the caller.
        iov: Vec<(u64, usize)>,
        control: Vec<u8>,
        flags: i32,
        /// For sendmmsg: where to store `msg_len` of the first message.
        mmsg_len_at: Option<u64>,
    },
}

impl Call {
    fn name(&self) -> &'static str {
        match self {
            Call::Connect { .. } => "connect",
            Call::Send { .. } => "send",
        }
    }
}

/// The socket behind the descriptor, as the supervisor's own copy.
struct Sock {
    file: OwnedFd,
    domain: i32,
    stream: bool,
    /// TCP or UDP proper (not raw, SCTP, MPTCP...).
    plain: bool,
    host: bool,
    nonblocking: bool,
}

/// What to do with a call.
#[derive(Debug)]
enum Action {
    Continue,
    Fail(i32),
    /// Run the call ourselves on the sandbox's own socket.
    Perform,
    /// Connect or send through a new host socket installed in place of the descriptor.
    Replace,
}

fn handle(shared: &Arc<Shared>, listener: &Arc<OwnedFd>, notif: Notif) {
    let respond = |r: Result<i64, i32>| {
        let _ = sysnet::notif_respond(listener, notif.id, r, false);
    };
    let tid = notif.pid as libc::pid_t;
    let fd = notif.args[0] as i32;
    let pidfd = match sysnet::pidfd_open(tid, true).or_else(|e| {
        // Before Linux 6.9 only a thread-group leader has a pidfd.
        if tgid(tid) == Some(tid) {
            sysnet::pidfd_open(tid, false)
        } else {
            Err(e)
        }
    }) {
        Ok(p) => p,
        Err(_) => return respond(Err(libc::EACCES)),
    };
    let sock = match inspect(shared, &pidfd, fd) {
        Ok(s) => s,
        Err(errno) => return respond(Err(errno)),
    };
    let call = match read_call(tid, &notif) {
        Ok(c) => c,
        Err(errno) => return respond(Err(errno)),
    };
    // The thread may have died and its id been reused while we read: only now are the
    // copies known to be the caller's.
    if !sysnet::notif_id_valid(listener, notif.id) {
        return;
    }
    let stable = || single_threaded(tid);
    let (action, dest) = decide(shared, &sock, &call, &stable);
    tracing::debug!(
        tid,
        host = sock.host,
        ?dest,
        ?action,
        nr = notif.nr,
        "net call"
    );
    match action {
        Action::Continue => {
            let _ = sysnet::notif_respond(listener, notif.id, Ok(0), true);
        }
        Action::Fail(errno) => {
            if errno == libc::EACCES {
                record_denied(shared, &call, &sock, dest);
            }
            respond(Err(errno))
        }
        Action::Perform | Action::Replace => {
            let job = Job {
                shared: shared.clone(),
                listener: listener.clone(),
                notif,
                sock,
                call,
                replace: matches!(action, Action::Replace),
            };
            // A blocking socket may block the call for long: do it off the supervisor's
            // thread, so other sandboxed threads are not held up.
            if job.replace && matches!(job.call, Call::Connect { .. }) {
                job.connect_replacement();
            } else if job.sock.nonblocking {
                job.run();
            } else if std::thread::Builder::new()
                .name("lockbox-net-call".into())
                .spawn(move || job.run())
                .is_err()
            {
                respond(Err(libc::EAGAIN));
            }
        }
    }
}

fn inspect(shared: &Shared, pidfd: &OwnedFd, fd: RawFd) -> Result<Sock, i32> {
    let file = sysnet::pidfd_getfd(pidfd, fd).map_err(|e| e.0)?;
    let domain = sysnet::sockopt_int(&file, libc::SOL_SOCKET, libc::SO_DOMAIN).map_err(|e| e.0)?;
    let ty = sysnet::sockopt_int(&file, libc::SOL_SOCKET, libc::SO_TYPE).map_err(|e| e.0)?;
    let protocol =
        sysnet::sockopt_int(&file, libc::SOL_SOCKET, libc::SO_PROTOCOL).map_err(|e| e.0)?;
    let host = sysnet::netns_cookie(&file).map_err(|e| e.0)? == shared.host_cookie;
    let nonblocking = sysnet::status_flags(&file).map_err(|e| e.0)? & libc::O_NONBLOCK != 0;
    let stream = ty == libc::SOCK_STREAM;
    let plain = (stream && protocol == libc::IPPROTO_TCP)
        || (ty == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP);
    Ok(Sock {
        file,
        domain,
        stream,
        plain,
        host,
        nonblocking,
    })
}

fn read_bytes(tid: libc::pid_t, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; len];
    sysnet::vm_read(tid, addr, &mut buf).map_err(|e| e.0)?;
    Ok(buf)
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// Copies the arguments the decision depends on.
fn read_call(tid: libc::pid_t, n: &Notif) -> Result<Call, i32> {
    let a = n.args;
    let sockaddr = |ptr: u64, len: u64| -> Result<Option<Vec<u8>>, i32> {
        if ptr == 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > std::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        read_bytes(tid, ptr, len).map(Some)
    };
    match i64::from(n.nr) {
        libc::SYS_connect => Ok(Call::Connect {
            addr: sockaddr(a[1], a[2])?.unwrap_or_default(),
        }),
        libc::SYS_sendto => Ok(Call::Send {
            name: sockaddr(a[4], a[5])?,
            iov: vec![(a[1], usize::try_from(a[2]).unwrap_or(usize::MAX))],
            control: Vec::new(),
            flags: a[3] as i32,
            mmsg_len_at: None,
        }),
        libc::SYS_sendmsg => read_msghdr(tid, a[1], a[2] as i32, None),
        libc::SYS_sendmmsg => {
            if a[2] == 0 {
                return Err(libc::EINVAL);
            }
            // Only the first message: sendmmsg may send fewer than asked.
            let len_at = a[1] + std::mem::size_of::<libc::msghdr>() as u64;
            read_msghdr(tid, a[1], a[3] as i32, Some(len_at))
        }
        _ => Err(libc::ENOSYS),
    }
}

fn read_msghdr(
    tid: libc::pid_t,
    at: u64,
    flags: i32,
    mmsg_len_at: Option<u64>,
) -> Result<Call, i32> {
    // struct msghdr on 64-bit: name, namelen(+pad), iov, iovlen, control, controllen, flags.
    let h = read_bytes(tid, at, std::mem::size_of::<libc::msghdr>())?;
    let (name_ptr, name_len) = (word(&h, 0), word(&h, 8) & 0xffff_ffff);
    let (iov_ptr, iov_len) = (word(&h, 16), word(&h, 24));
    let (control_ptr, control_len) = (word(&h, 32), word(&h, 40));
    if iov_len as usize > MAX_IOV || control_len as usize > MAX_CONTROL {
        return Err(libc::EMSGSIZE);
    }
    let name = if name_ptr == 0 || name_len == 0 {
        None
    } else if name_len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL);
    } else {
        Some(read_bytes(tid, name_ptr, name_len as usize)?)
    };
    let raw = read_bytes(tid, iov_ptr, iov_len as usize * 16)?;
    let iov = raw
        .chunks_exact(16)
        .map(|c| (word(c, 0), word(c, 8) as usize))
        .collect();
    let control = if control_ptr == 0 {
        Vec::new()
    } else {
        read_bytes(tid, control_ptr, control_len as usize)?
    };
    Ok(Call::Send {
        name,
        iov,
        control,
        flags,
        mmsg_len_at,
    })
}

/// Parses an AF_INET/AF_INET6 sockaddr; `None` for anything else (AF_UNSPEC included).
pub fn parse_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match family {
        libc::AF_INET if b.len() >= 8 => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::new(IpAddr::V4(ip), port))
        }
        libc::AF_INET6 if b.len() >= 24 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port))
        }
        _ => None,
    }
}

/// `stable` says whether the caller's descriptor table cannot change meanwhile (asked only
/// when it matters: it reads `/proc`).
fn decide(
    shared: &Shared,
    sock: &Sock,
    call: &Call,
    stable: &dyn Fn() -> bool,
) -> (Action, Option<SocketAddr>) {
    let inet = sock.domain == libc::AF_INET || sock.domain == libc::AF_INET6;
    let local_or_own = |stable: &dyn Fn() -> bool| {
        if stable() {
            Action::Continue
        } else {
            Action::Perform
        }
    };
    if !inet {
        // Unix, netlink...: no route to the host's network, but a unix socket of the host's
        // namespace (an inherited one) would name the host's abstract sockets.
        let (named, control) = match call {
            Call::Connect { .. } => (true, false),
            Call::Send { name, control, .. } => (name.is_some(), !control.is_empty()),
        };
        if sock.host && named {
            return (Action::Fail(libc::EACCES), None);
        }
        if stable() {
            return (Action::Continue, None);
        }
        // Unix addresses are paths in the sandbox's mount namespace, and control
        // messages carry its descriptors: only the kernel can do these for the caller.
        if sock.domain == libc::AF_UNIX && (named || control) {
            return (Action::Fail(libc::EACCES), None);
        }
        return (Action::Perform, None);
    }
    if !sock.plain {
        // Raw, SCTP, MPTCP...: only inside the sandbox.
        return (
            if sock.host {
                Action::Fail(libc::EACCES)
            } else {
                local_or_own(stable)
            },
            None,
        );
    }
    let proto = if sock.stream { Proto::Tcp } else { Proto::Udp };
    let addr = match call {
        Call::Connect { addr } => Some(addr.as_slice()),
        // Stream sockets ignore the address (fast open is refused by the filter).
        Call::Send { name, .. } if !sock.stream => name.as_deref(),
        Call::Send { .. } => None,
    };
    let Some(addr) = addr else {
        // A send on a connected socket: wherever it was allowed to connect to.
        return match (sock.host, sock.stream) {
            (false, _) | (true, true) => (local_or_own(stable), None),
            (true, false) => (Action::Perform, None),
        };
    };
    let Some(dest) = parse_sockaddr(addr) else {
        // AF_UNSPEC (disconnect) or garbage: a host socket keeps its allowed peer.
        return if sock.host {
            (Action::Fail(libc::EACCES), None)
        } else {
            (local_or_own(stable), None)
        };
    };
    let action = match (
        route(shared.rules.kind, &shared.rules.rules, proto, dest),
        sock.host,
    ) {
        (Route::Denied, _) | (Route::Inside, true) => Action::Fail(libc::EACCES),
        (Route::Inside, false) => local_or_own(stable),
        (Route::Host, true) => Action::Perform,
        (Route::Host, false) => Action::Replace,
    };
    (action, Some(dest))
}

fn record_denied(shared: &Shared, call: &Call, sock: &Sock, dest: Option<SocketAddr>) {
    let Ok(mut r) = shared.report.lock() else {
        return;
    };
    r.denied += 1;
    if r.denied_first.len() < DENIED_LISTED {
        let proto = if sock.stream { "tcp" } else { "udp" };
        let dest = dest.map_or("(no address)".to_owned(), |d| d.to_string());
        r.denied_first
            .push(format!("{} {proto} {dest}", call.name()));
    }
}

/// A call the supervisor performs itself.
struct Job {
    shared: Arc<Shared>,
    listener: Arc<OwnedFd>,
    notif: Notif,
    sock: Sock,
    call: Call,
    replace: bool,
}

impl Job {
    fn run(self) {
        let result = self.perform();
        self.respond(result);
    }

    fn respond(&self, result: Result<i64, i32>) {
        let _ = sysnet::notif_respond(&self.listener, self.notif.id, result, false);
    }

    /// Connects a new host socket to the copied address and installs it. The connect is
    /// non-blocking, so a connection that completes at once (loopback, or refused) is
    /// answered right here; only a blocking caller waiting for a slow handshake gets a
    /// thread of its own.
    fn connect_replacement(self) {
        let Call::Connect { addr } = &self.call else {
            return;
        };
        let fresh = match self.host_socket(true) {
            Ok(s) => s,
            Err(e) => return self.respond(Err(e)),
        };
        match sysnet::connect(&fresh, addr) {
            Ok(()) => self.install(fresh, Ok(0)),
            Err(Errno(libc::EINPROGRESS)) if self.sock.nonblocking => {
                self.install(fresh, Err(libc::EINPROGRESS))
            }
            Err(Errno(libc::EINPROGRESS)) => match wait_connected(&fresh, 0) {
                Some(done) => self.finish_blocking(fresh, done),
                None => {
                    let (listener, id) = (self.listener.clone(), self.notif.id);
                    let spawned = std::thread::Builder::new()
                        .name("lockbox-net-connect".into())
                        .spawn(move || {
                            let done = wait_connected(&fresh, -1).unwrap_or(Err(libc::EIO));
                            self.finish_blocking(fresh, done)
                        });
                    if spawned.is_err() {
                        let _ = sysnet::notif_respond(&listener, id, Err(libc::EAGAIN), false);
                    }
                }
            },
            Err(e) => self.respond(Err(e.0)),
        }
    }

    fn finish_blocking(&self, fresh: OwnedFd, done: Result<(), i32>) {
        match done.and_then(|()| sysnet::set_blocking(&fresh).map_err(|e| e.0)) {
            Ok(()) => self.install(fresh, Ok(0)),
            Err(e) => self.respond(Err(e)),
        }
    }

    /// Installs `fresh` as the caller's descriptor, then answers with `result`.
    fn install(&self, fresh: OwnedFd, result: Result<i64, i32>) {
        let tid = self.notif.pid as libc::pid_t;
        let fd = self.notif.args[0] as RawFd;
        match sysnet::notif_addfd(&self.listener, self.notif.id, &fresh, fd, cloexec(tid, fd)) {
            Ok(()) => {
                if let Ok(mut r) = self.shared.report.lock() {
                    r.host_connections += 1;
                }
                self.respond(result)
            }
            Err(e) => self.respond(Err(e.0)),
        }
    }

    fn perform(&self) -> Result<i64, i32> {
        let tid = self.notif.pid as libc::pid_t;
        let target = if self.replace {
            let fresh = self.host_socket(self.sock.nonblocking)?;
            Some(fresh)
        } else {
            None
        };
        let on = target.as_ref().unwrap_or(&self.sock.file);
        let result = match &self.call {
            Call::Connect { addr } => match sysnet::connect(on, addr) {
                Ok(()) => Ok(0),
                Err(Errno(libc::EINPROGRESS)) if target.is_some() => Err(libc::EINPROGRESS),
                Err(e) => return Err(e.0),
            },
            Call::Send {
                name,
                iov,
                control,
                flags,
                mmsg_len_at,
            } => {
                let data = gather(tid, iov)?;
                let parts: Vec<&[u8]> = vec![data.as_slice()];
                let n = sysnet::sendmsg(on, name.as_deref(), &parts, control, *flags)
                    .map_err(|e| e.0)?;
                if let Some(at) = mmsg_len_at {
                    sysnet::vm_write(tid, *at, &(n as u32).to_ne_bytes()).map_err(|e| e.0)?;
                    Ok(1)
                } else {
                    Ok(n as i64)
                }
            }
        };
        if let Some(fresh) = &target {
            let fd = self.notif.args[0] as RawFd;
            sysnet::notif_addfd(&self.listener, self.notif.id, fresh, fd, cloexec(tid, fd))
                .map_err(|e| e.0)?;
            if let Ok(mut r) = self.shared.report.lock() {
                r.host_connections += 1;
            }
        }
        result
    }

    /// A socket like the sandbox's, in the host's namespace.
    fn host_socket(&self, nonblocking: bool) -> Result<OwnedFd, i32> {
        let ty = if self.sock.stream {
            libc::SOCK_STREAM
        } else {
            libc::SOCK_DGRAM
        } | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
        let s = sysnet::socket(self.sock.domain, ty, 0).map_err(|e| e.0)?;
        if self.sock.stream {
            // Options set before connect would be lost with the old socket; keep the
            // one latency-sensitive clients set.
            if let Ok(v) =
                sysnet::sockopt_int(&self.sock.file, libc::IPPROTO_TCP, libc::TCP_NODELAY)
            {
                let _ = sysnet::set_sockopt_int(&s, libc::IPPROTO_TCP, libc::TCP_NODELAY, v);
            }
        }
        Ok(s)
    }
}

/// Whether a non-blocking connect has finished within `timeout_ms` (`-1`: wait), and how.
fn wait_connected(fd: &OwnedFd, timeout_ms: i32) -> Option<Result<(), i32>> {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    }];
    loop {
        match crate::sys::poll(&mut fds, timeout_ms) {
            Err(Errno(libc::EINTR)) => continue,
            Err(e) => return Some(Err(e.0)),
            Ok(0) => return None,
            Ok(_) => break,
        }
    }
    Some(
        match sysnet::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) => Ok(()),
            Ok(e) => Err(e),
            Err(e) => Err(e.0),
        },
    )
}

/// Copies the caller's data (at most [`MAX_SEND`] bytes).
fn gather(tid: libc::pid_t, iov: &[(u64, usize)]) -> Result<Vec<u8>, i32> {
    let mut data = Vec::new();
    for &(base, len) in iov {
        let take = len.min(MAX_SEND - data.len());
        if take == 0 {
            break;
        }
        let start = data.len();
        data.resize(start + take, 0);
        sysnet::vm_read(tid, base, &mut data[start..]).map_err(|e| e.0)?;
    }
    Ok(data)
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

fn status_field(tid: libc::pid_t, field: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().parse().ok())
}

fn tgid(tid: libc::pid_t) -> Option<libc::pid_t> {
    status_field(tid, "Tgid:").map(|v| v as libc::pid_t)
}

/// Whether the caller is its process's only thread: then nothing can change its
/// descriptor table while it waits for us (the filter refuses `CLONE_FILES` without
/// `CLONE_THREAD`).
fn single_threaded(tid: libc::pid_t) -> bool {
    status_field(tid, "Threads:") == Some(1)
}

/// The filter of the sandboxed command: which calls reach the supervisor.
pub fn filter() -> Vec<seccompiler::sock_filter> {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JSET_K: u16 = 0x45;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;
    const NOTIF: u32 = sysnet::RET_USER_NOTIF;
    const FASTOPEN: u32 = 0x2000_0000; // MSG_FASTOPEN: connects from a send
    let arg_lo = |i: u32| 16 + 8 * i;
    let arg_hi = |i: u32| 16 + 8 * i + 4;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    let ld = |k| ins(LD_W_ABS, 0, 0, k);
    let ret = |k| ins(RET_K, 0, 0, k);
    // Refuse fast open (its address is in memory we cannot pin), else notify.
    let flags_then_notify = |flags_arg: u32| {
        vec![
            ld(arg_lo(flags_arg)),
            ins(JSET_K, 0, 1, FASTOPEN),
            ret(ERRNO | libc::EOPNOTSUPP as u32),
            ret(NOTIF),
        ]
    };
    let blocks: Vec<(i64, Vec<sock_filter>)> = vec![
        (libc::SYS_connect, vec![ret(NOTIF)]),
        (libc::SYS_sendmsg, flags_then_notify(2)),
        (libc::SYS_sendmmsg, flags_then_notify(3)),
        (
            libc::SYS_sendto,
            vec![
                ld(arg_lo(3)),
                ins(JSET_K, 0, 1, FASTOPEN),
                ret(ERRNO | libc::EOPNOTSUPP as u32),
                // No address (a connected socket): the kernel's own path.
                ld(arg_lo(4)),
                ins(JEQ_K, 0, 2, 0),
                ld(arg_hi(4)),
                ins(JEQ_K, 1, 0, 0),
                ret(NOTIF),
                ret(ALLOW),
            ],
        ),
        (
            libc::SYS_clone,
            vec![
                // Sharing the descriptor table outside a thread group would let another
                // process swap a socket under a call we let the kernel continue.
                ld(arg_lo(0)),
                ins(JSET_K, 0, 2, libc::CLONE_FILES as u32),
                ins(JSET_K, 1, 0, libc::CLONE_THREAD as u32),
                ret(ERRNO | libc::EPERM as u32),
                ret(ALLOW),
            ],
        ),
    ];
    let mut program = vec![ld(0)];
    for (nr, body) in blocks {
        program.push(ins(JEQ_K, 0, body.len() as u8, nr as u32));
        program.extend(body);
        // Bodies end in a return, except that A was overwritten: reload the number.
        program.push(ld(0));
    }
    program.push(ret(ALLOW));
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddrs_parse_v4_and_v6_and_reject_others() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&8080u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 2]);
        assert_eq!(parse_sockaddr(&v4), Some("127.0.0.2:8080".parse().unwrap()));
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&53u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(parse_sockaddr(&v6), Some("[::1]:53".parse().unwrap()));
        assert_eq!(parse_sockaddr(&v6[..20]), None);
        assert_eq!(parse_sockaddr(&[0, 0]), None);
        assert_eq!(parse_sockaddr(&[]), None);
    }

    fn v4(addr: &str) -> Vec<u8> {
        let a: SocketAddr = addr.parse().unwrap();
        let SocketAddr::V4(a) = a else { panic!() };
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&a.port().to_be_bytes());
        b[4..8].copy_from_slice(&a.ip().octets());
        b
    }

    /// A real socket; `host` says whether the decision treats it as a host socket.
    fn sock(domain: i32, ty: i32, host: bool) -> Sock {
        let file = sysnet::socket(domain, ty, 0).unwrap();
        Sock {
            file,
            domain,
            stream: ty == libc::SOCK_STREAM,
            plain: domain != libc::AF_UNIX,
            host,
            nonblocking: false,
        }
    }

    fn name(a: &Action) -> String {
        format!("{a:?}")
    }

    #[test]
    fn decisions_continue_only_sandbox_sockets_of_single_threaded_callers() {
        let shared = Shared {
            rules: NetRules {
                kind: ListKind::Allow,
                rules: lockbox_policy::NetSpec::parse("127.0.0.2:80")
                    .unwrap()
                    .rules(&[]),
            },
            host_cookie: 0,
            report: Arc::default(),
        };
        let connect = |a: &str| Call::Connect { addr: v4(a) };
        let send = |a: Option<&str>| Call::Send {
            name: a.map(v4),
            iov: Vec::new(),
            control: Vec::new(),
            flags: 0,
            mmsg_len_at: None,
        };
        let yes = || true;
        let no = || false;
        let tcp = |host| sock(libc::AF_INET, libc::SOCK_STREAM, host);
        let udp = |host| sock(libc::AF_INET, libc::SOCK_DGRAM, host);
        let unix = |host| sock(libc::AF_UNIX, libc::SOCK_STREAM, host);
        let cases: Vec<(Sock, Call, &dyn Fn() -> bool, &str)> = vec![
            (tcp(false), connect("127.0.0.2:80"), &yes, "Replace"),
            (tcp(false), connect("127.0.0.2:80"), &no, "Replace"),
            (tcp(false), connect("127.0.0.3:80"), &yes, "Continue"),
            (tcp(false), connect("127.0.0.3:80"), &no, "Perform"),
            (tcp(false), connect("192.0.2.1:80"), &yes, "Fail(13)"),
            (tcp(true), connect("127.0.0.2:80"), &yes, "Perform"),
            (tcp(true), connect("127.0.0.3:80"), &yes, "Fail(13)"),
            (
                tcp(true),
                Call::Connect { addr: vec![0, 0] },
                &yes,
                "Fail(13)",
            ),
            (tcp(true), send(None), &yes, "Continue"),
            (tcp(true), send(None), &no, "Perform"),
            (udp(true), send(None), &yes, "Perform"),
            (udp(true), send(Some("192.0.2.1:53")), &yes, "Fail(13)"),
            (udp(false), send(Some("127.0.0.2:80")), &yes, "Replace"),
            (unix(false), connect("127.0.0.2:80"), &yes, "Continue"),
            (unix(false), connect("127.0.0.2:80"), &no, "Fail(13)"),
            (unix(false), send(None), &no, "Perform"),
            (unix(true), connect("127.0.0.2:80"), &yes, "Fail(13)"),
        ];
        for (i, (s, c, stable, want)) in cases.iter().enumerate() {
            let (action, _) = decide(&shared, s, c, *stable);
            assert_eq!(name(&action), *want, "case {i}");
        }
    }

    #[test]
    fn filter_jumps_stay_inside_the_program() {
        let p = filter();
        for (i, ins) in p.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < p.len(), "at {i}");
            }
        }
        assert_eq!(p.last().map(|i| i.code), Some(0x06));
    }
}
