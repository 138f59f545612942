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

mod call;
mod filter;
mod perform;

pub use self::call::parse_sockaddr;
pub use self::filter::filter;

use self::call::{read_call, Call};
use self::perform::Job;
use crate::error::SetupError;
use crate::sys::Errno;
use crate::sysnet::{self, Notif};
use lockbox_policy::{route, ListKind, NetRule, Proto, Route};
use serde::Serialize;
use std::net::SocketAddr;
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
            job.start(respond);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
