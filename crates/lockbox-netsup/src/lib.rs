//! The network supervisor of `--net-allow` / `--net-deny` sandboxes.
//!
//! The sandbox keeps its own network namespace (loopback only). The command child installs
//! a second seccomp filter (`lockbox-confine`'s, which owns every filter a sandbox installs)
//! that hands `connect`, `sendto` with an address, `sendmsg` and `sendmmsg` to this
//! supervisor, a thread of the parent (and, in a sandbox with a writable overlay view,
//! `lockbox-confine`'s directory renames, which it passes on ([`PassOn`]): a process has one
//! notification listener). For each call the
//! supervisor takes its own copy of the socket (`pidfd_getfd`) and of the address
//! (`process_vm_readv`, then `SECCOMP_IOCTL_NOTIF_ID_VALID`), decides on those copies with
//! [`lockbox_policy::route`] (`decide`), and acts on them itself (`perform`):
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
//!
//! **Bounded.** One thread does everything (`serve`): every socket operation it performs
//! is non-blocking, and a call that must wait (a blocking `connect` in progress, a blocking
//! send on a full socket) waits in a bounded set polled with the listener, together with
//! the caller's pidfd, so it is dropped the moment its caller dies. It copies at most
//! [`MAX_SEND`] bytes of data per call, into one buffer. What it can hold at most does not
//! depend on what the command does: see [`SEND_SLOTS`], [`CONNECT_SLOTS`], [`MAX_PARKED`].
//!
//! **Names.** Under an allow-list the sandbox's resolver is this supervisor (`dns`): it
//! answers the listed names with the host's resolver and every other name `NXDOMAIN`, and a
//! connection to an address it answered is allowed on the ports of the name's specs, for
//! this sandbox only. Address rules are matched as they are; names never pin addresses.
//!
//! **Replacing the list.** [`Supervisor::replace`] puts another [`NetList`] in force while
//! the sandbox runs (`list`): each decision reads the list once, what DNS answers taught is
//! forgotten with the old list, established connections stay. Under a deny-list that
//! replaced an allow-list, lockbox's resolver answers every name but the denied ones.
//!
//! **Approvals.** With an [`Approvals`] desk (`--net-ask`), an allow-list's unlisted
//! destination or name is asked instead of refused (`ask`): the call waits, parked like
//! the waiting calls, for a verdict, at most [`MAX_ASKED`] at once and each for the desk's
//! timeout; then it is denied.
//!
//! **Nothing borrowed.** The thread drops its capabilities before it takes the first call,
//! and forwards only the control messages and flags that need no privilege (`control`).
//!
//! **Where it fits.** `lockbox-confine` starts the supervisor ([`probe`], [`start`]) for a
//! sandbox with a network list and hands it the command's listener ([`handover`]);
//! `lockbox-intercept` implements [`Interceptor`] for hosts whose credentials lockbox
//! holds. The filter this supervisor relies on (a clone sharing the descriptor table is
//! refused, fast open is refused, a source route cannot be set) is `lockbox-confine`'s.
//!
//! **`unsafe`.** Besides `lockbox-confine`, this is the only crate of lockbox that uses
//! `unsafe`, and only in [`sys`]: one small safe function per kernel call, each block with
//! its `// SAFETY:` reasoning. The rest of the crate denies `unsafe_code`.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod ask;
mod audit;
mod call;
mod control;
mod decide;
mod dns;
mod error;
mod first;
pub mod handover;
mod hello;
mod intercept;
mod internal;
mod list;
mod perform;
mod relay;
mod serve;
#[allow(unsafe_code)]
pub mod sys;

/// Entry points for the fuzz targets in `fuzz/` (not an API: no other crate calls them).
#[doc(hidden)]
pub mod fuzzing {
    use lockbox_policy::NetSpec;
    use std::net::IpAddr;

    /// Every reply lockbox's resolver builds for `query` by itself, under an allow-list of
    /// `names`, as if the host resolved the asked name to `resolved` and had the interface
    /// addresses `host`: the immediate answer (`NXDOMAIN`, `FORMERR`, ...), the answer with
    /// addresses, a refusal, and what the TCP framing takes from the same bytes.
    pub fn dns_query(
        names: Vec<NetSpec>,
        query: &[u8],
        resolved: Vec<IpAddr>,
        host: &[IpAddr],
    ) -> Vec<Vec<u8>> {
        crate::dns::exercise(names, query, resolved, host)
    }
}

pub use self::ask::{Approvals, DecideError, Question, Verdict, DEFAULT_ASK_TIMEOUT, MAX_ASKED};
pub use self::audit::{AuditSink, Decision, EventKind, NetEvent, Protocol, MAX_COMMAND};
pub use self::call::parse_sockaddr;
pub use self::error::{Error, ReplaceError};
pub use self::first::FIRST_FLIGHT_MAX;
pub use self::hello::{server_name as client_hello_server_name, Hello as ClientHello};
pub use self::intercept::{
    trust_files, Intercepted, Interceptor, RelaySlot, SANDBOX_BUNDLE, TRUST_BUNDLES,
};
pub use self::list::NetList;
pub use self::relay::{FIRST_FLIGHT_TIMEOUT, RELAY_SLOTS};

use crate::handover::{NetHandover, NetTaken, RECORD_LEN};
use crate::sys::{self as sysnet, Errno, Notif};
use lockbox_policy::ListKind;
use serde::Serialize;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The sandbox's nameserver under an allow-list (its `/etc/resolv.conf`): lockbox's
/// resolver, a socket of the network supervisor bound in the sandbox's own namespace.
pub const DNS_ADDR: [u8; 4] = [127, 0, 0, 153];

/// How many denied attempts a report lists (the count covers all).
const DENIED_LISTED: usize = 8;
/// Largest payload the supervisor copies and sends for one intercepted call. A stream send
/// may be short, as the kernel's may be (callers loop); a datagram larger than this is
/// refused with `EMSGSIZE`, as the kernel refuses any UDP datagram over 65,507 bytes.
pub const MAX_SEND: usize = 64 << 10;
/// Largest `msg_controllen` copied.
const MAX_CONTROL: usize = 4096;
/// Largest iovec count (`UIO_MAXIOV`).
const MAX_IOV: usize = 1024;
/// Blocking sends waiting for room at once. Each holds two descriptors (its socket, the
/// caller's pidfd) and its copied arguments (at most 16 KiB of iovecs, 4 KiB of control);
/// its data is copied only when the socket can take it.
pub const SEND_SLOTS: usize = 32;
/// Blocking connects in progress at once, each holding two descriptors. Separate from
/// [`SEND_SLOTS`], so sends that never complete cannot starve connects.
pub const CONNECT_SLOTS: usize = 32;
/// Blocking calls received while their kind's slots are full: they wait, as a notification
/// and nothing else (80 bytes, no descriptor), and are started in order as slots free
/// (sends are also retried every `RETRY`, so one whose socket drained goes through even
/// while the slots stay taken). Beyond this many, further calls wait in the kernel's queue.
pub const MAX_PARKED: usize = 1024;
/// How often waiting calls are checked for a caller that went away without its pidfd
/// saying so (a signal interrupted the call: the notification is gone, the thread lives).
const SWEEP: std::time::Duration = std::time::Duration::from_millis(250);
/// How often parked sends are tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// `CAP_SYS_PTRACE` (capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// What the supervisor saw, for the run report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NetReport {
    /// Connections and datagrams sent to the host's network on the sandbox's behalf.
    pub host_connections: u64,
    /// Attempts refused by the policy.
    pub denied: u64,
    /// The first few refused attempts (`"connect tcp 10.0.0.1:80"`, `"dns evil.example"`).
    pub denied_first: Vec<String>,
    /// DNS queries for listed names that lockbox's resolver answered.
    pub dns_answered: u64,
    /// Addresses of the host's own (loopback, link-local...) that listed names resolved to
    /// and lockbox left out of its answers.
    pub dns_rebinding_refused: u64,
    /// Audit events the consumer of [`AuditSink`] had no room for, never reported to it by a
    /// `dropped` event.
    #[serde(skip_serializing_if = "is_zero")]
    pub audit_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The rules a supervisor enforces: its list (which [`Supervisor::replace`] may replace
/// later) and what stays as it started.
#[derive(Debug, Clone)]
pub struct NetRules {
    /// The list it starts with.
    pub list: NetList,
    /// The hosts file the resolver reads first (the test hook of `lockbox-confine`'s
    /// `LOCKBOX_NET_HOSTS_FILE`).
    pub hosts_file: Option<std::path::PathBuf>,
    /// What terminates the TLS connections of some allowed names (credentials).
    pub interceptor: Option<Arc<dyn Interceptor>>,
    /// Calls of another supervisor that reach this one's listener.
    pub pass_on: Option<PassOn>,
}

/// Calls of another supervisor's filter that reach this supervisor's listener, and how that
/// supervisor answers them: `lockbox-confine`'s directory renames (a process has one
/// notification listener, so under a network list the renames come here).
#[derive(Debug, Clone, Copy)]
pub struct PassOn {
    /// Whether a notification is one of those calls.
    pub wants: fn(&Notif) -> bool,
    /// Answers one, as [`sys::notif_respond`] takes it: `Ok` lets the kernel run the call,
    /// `Err` fails it with that errno.
    pub handle: fn(&OwnedFd, &Notif) -> Result<i64, i32>,
}

/// A running supervisor thread; dropping it stops the thread.
#[derive(Debug)]
pub struct Supervisor {
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
    report: Arc<Mutex<NetReport>>,
    /// The list in force, shared with the thread.
    list: list::Current,
    /// Whether the sandbox's resolver is lockbox's (it started with an allow-list: its
    /// `/etc/resolv.conf` names [`DNS_ADDR`]).
    resolver: bool,
    /// Whether an [`Interceptor`] terminates some allowed names' TLS.
    intercepted: bool,
}

impl Supervisor {
    /// Puts `list` in force from the next decision on, atomically: every decision reads the
    /// list once, so none mixes the old list and the new. What DNS answers taught under the
    /// old list is forgotten (a name the new list does not hold is not reachable through an
    /// earlier answer); name-allowed connections not yet past their first flight are
    /// checked against the new list's names. Connections already established (a socket
    /// connected on the host, a relayed connection past its first flight) stay as they are:
    /// the supervisor decides on calls, and an established connection makes none.
    ///
    /// Refused (nothing changes) when the new list needs what the sandbox was not started
    /// with: an allow-list naming hosts needs lockbox's resolver, which only a sandbox
    /// started with an allow-list has; and a sandbox whose TLS lockbox intercepts keeps its
    /// list (the interceptor's names were checked against it at the start).
    pub fn replace(&self, list: NetList) -> Result<(), ReplaceError> {
        replaceable(&list, self.resolver, self.intercepted)?;
        self.list.replace(list);
        Ok(())
    }

    /// The list in force.
    pub fn list(&self) -> NetList {
        (*self.list.get()).clone()
    }

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

/// Whether `list` may replace the list of a supervisor with (`resolver`) or without
/// lockbox's resolver, whose TLS is `intercepted` or not ([`Supervisor::replace`]).
fn replaceable(list: &NetList, resolver: bool, intercepted: bool) -> Result<(), ReplaceError> {
    if intercepted {
        return Err(ReplaceError::Intercepted);
    }
    if list.kind == ListKind::Allow && !list.names.is_empty() && !resolver {
        return Err(ReplaceError::NoResolver {
            names: list.names.iter().map(ToString::to_string).collect(),
        });
    }
    Ok(())
}

/// Checks that the kernel has what the supervisor needs; names what is missing.
pub fn probe() -> Result<u64, Error> {
    let missing = |feature, problem: &str| Error::FeatureMissing {
        feature,
        problem: problem.into(),
        needed_for: "--net-allow/--net-deny (enforcing the list without races)",
    };
    if !sysnet::seccomp_action_available(sysnet::RET_USER_NOTIF) {
        return Err(missing(
            "seccomp user notification",
            "is not available (Linux 5.9 or newer is required)",
        ));
    }
    let sock =
        sysnet::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).map_err(|errno| Error::Supervise {
            what: "creating a probe socket",
            errno,
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
/// child announces its listener; `audit` receives an event per decision; `ask`: an
/// allow-list's unlisted destinations are asked there instead of refused.
pub fn start(
    rules: NetRules,
    audit: Option<AuditSink>,
    ask: Option<Approvals>,
    host_cookie: u64,
    channel: OwnedFd,
) -> Result<Supervisor, Error> {
    let err = |errno| Error::Supervise {
        what: "starting the network supervisor",
        errno,
    };
    sysnet::set_passcred(&channel).map_err(err)?;
    let (stop, stop_rx) =
        UnixStream::pair().map_err(|e| err(Errno(e.raw_os_error().unwrap_or(libc::EIO))))?;
    let report = Arc::new(Mutex::new(NetReport::default()));
    let resolver = rules.list.kind == ListKind::Allow;
    let intercepted = rules.interceptor.is_some();
    let list = list::Current::new(rules.list);
    let relay = relay::Relay::new(
        list.clone(),
        audit.clone(),
        report.clone(),
        rules.interceptor,
    );
    let shared = Shared {
        relay,
        list: list.clone(),
        hosts_file: rules.hosts_file,
        pass_on: rules.pass_on,
        host_cookie,
        report: report.clone(),
        audit,
        dns_askers: Mutex::default(),
        ask,
    };
    let (dropped_tx, dropped_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("lockbox-net".into())
        .spawn(move || {
            // The kernel checks what this thread sends (control messages, netlink
            // requests, credentials) against *its* capabilities: keep none but
            // CAP_SYS_PTRACE, which reading a caller's memory and descriptors may need
            // (Yama's ptrace_scope 2). Root's capabilities stay with the other threads.
            let dropped = sysnet::drop_thread_capabilities(&[CAP_SYS_PTRACE]);
            let ok = dropped.is_ok();
            let _ = dropped_tx.send(dropped);
            if !ok {
                return;
            }
            let ask = shared.ask.clone();
            if let Some((listener, dns)) = accept_listener(&channel, &stop_rx) {
                // Started here, so the resolver thread has this thread's capabilities.
                let dns =
                    dns.and_then(|(udp, tcp)| dns::Dns::new(udp, tcp, shared.hosts_file.clone()));
                let (audit, report) = (shared.audit.clone(), shared.report.clone());
                serve::serve(shared, listener, dns, &stop_rx);
                if let Some(audit) = audit {
                    audit.flush_dropped();
                    if let Ok(mut r) = report.lock() {
                        r.audit_dropped = audit.dropped();
                    }
                }
            }
            // Nothing more will be asked: whoever waits for questions stops waiting.
            if let Some(ask) = ask {
                ask.close();
            }
        })
        .map_err(|e| err(Errno(e.raw_os_error().unwrap_or(libc::EAGAIN))))?;
    match dropped_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(errno)) => {
            let _ = thread.join();
            return Err(Error::Supervise {
                what: "dropping the network supervisor's capabilities",
                errno,
            });
        }
        Err(_) => return Err(err(Errno(libc::EIO))),
    }
    Ok(Supervisor {
        stop: Some(stop),
        thread: Some(thread),
        report,
        list,
        resolver,
        intercepted,
    })
}

struct Shared {
    /// The list in force and what this sandbox's DNS answers allowed under it.
    list: list::Current,
    /// The hosts file the resolver reads first ([`NetRules::hosts_file`]).
    hosts_file: Option<std::path::PathBuf>,
    /// Calls of another supervisor that reach this one's listener.
    pass_on: Option<PassOn>,
    host_cookie: u64,
    report: Arc<Mutex<NetReport>>,
    /// Where decisions are logged, if anywhere.
    audit: Option<AuditSink>,
    /// Sockets that asked lockbox's resolver (kept with `audit` or `ask`: the pid of a query).
    dns_askers: Mutex<audit::DnsAskers>,
    /// Where unlisted destinations are asked (`--net-ask`), if anywhere.
    ask: Option<Approvals>,
    /// Name-allowed TCP connections, whose first flight must ask for a listed name.
    relay: relay::Relay,
}

impl Shared {
    /// A supervisor's state for `list` with nothing else (no audit, no desk, no relay
    /// thread until used): what the resolver's fuzz entry point and the unit tests decide
    /// with.
    fn bare(list: NetList) -> Shared {
        let list = list::Current::new(list);
        let report = Arc::<Mutex<NetReport>>::default();
        Shared {
            relay: relay::Relay::new(list.clone(), None, report.clone(), None),
            list,
            hosts_file: None,
            pass_on: None,
            host_cookie: 0,
            report,
            audit: None,
            dns_askers: Mutex::default(),
            ask: None,
        }
    }
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
        match sysnet::poll(&mut fds, -1) {
            Err(Errno(libc::EINTR)) => continue,
            Err(_) => return None,
            Ok(_) => return Some((fds[0].revents, fds[1].revents)),
        }
    }
}

/// Receives the listener's number ([`NetHandover`]) and the child's pid, takes a copy of the
/// listener with `pidfd_getfd`, and answers [`NetTaken`] (the child closes its copy and goes
/// on to `execve`). With it come copies of the resolver's sockets, when there are any.
/// `None` when `stop` is closed first or the handover is not one. `lockbox-confine`'s rename
/// supervisor takes its listeners this way too.
pub fn accept_listener(
    channel: &OwnedFd,
    stop: &UnixStream,
) -> Option<(OwnedFd, Option<(OwnedFd, OwnedFd)>)> {
    let (_, stopped) = poll2(channel.as_raw_fd(), stop.as_raw_fd())?;
    if stopped != 0 {
        return None;
    }
    let mut buf = [0u8; RECORD_LEN];
    let (n, pid) = sysnet::recv_with_pid(channel, &mut buf).ok()?;
    let handover = NetHandover::decode(&buf).filter(|_| n == RECORD_LEN)?;
    let pidfd = sysnet::pidfd_open(pid?, false).ok()?;
    let listener = sysnet::pidfd_getfd(&pidfd, handover.listener).ok()?;
    let dns = if handover.dns_udp >= 0 && handover.dns_tcp >= 0 {
        Some((
            sysnet::pidfd_getfd(&pidfd, handover.dns_udp).ok()?,
            sysnet::pidfd_getfd(&pidfd, handover.dns_tcp).ok()?,
        ))
    } else {
        None
    };
    // Best effort: a faster round trip where the kernel has it (Linux 6.6).
    let _ = sysnet::notif_sync_wakeup(&listener);
    sysnet::write_all(channel, &NetTaken.encode()).ok()?;
    Some((listener, dns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockbox_policy::NetSpec;

    fn list(kind: ListKind, specs: &[&str]) -> NetList {
        let specs: Vec<NetSpec> = specs.iter().map(|s| NetSpec::parse(s).unwrap()).collect();
        NetList {
            kind,
            rules: specs.iter().flat_map(|s| s.rules(&[])).collect(),
            names: specs
                .into_iter()
                .filter(|s| !matches!(s.host, lockbox_policy::NetHost::Block(_)))
                .collect(),
        }
    }

    #[test]
    fn a_list_naming_hosts_needs_lockboxs_resolver_and_an_intercepted_sandbox_keeps_its_list() {
        let named = list(ListKind::Allow, &["example.org:443", "10.0.0.0/8:*"]);
        let addresses = list(ListKind::Allow, &["10.0.0.0/8:*"]);
        let denied = list(ListKind::Deny, &["example.org:*"]);
        assert!(replaceable(&named, true, false).is_ok());
        let err = replaceable(&named, false, false).unwrap_err();
        assert!(matches!(err, ReplaceError::NoResolver { .. }));
        assert!(err.to_string().contains("example.org:443"), "{err}");
        assert!(replaceable(&addresses, false, false).is_ok());
        assert!(replaceable(&denied, false, false).is_ok());
        assert!(matches!(
            replaceable(&addresses, true, true),
            Err(ReplaceError::Intercepted)
        ));
    }
}
