//! The audit log of a supervisor's decisions: one [`NetEvent`] per intercepted call sent
//! towards the host's network (allowed or denied) and per DNS query lockbox's resolver
//! answers, handed to an [`AuditSink`] the caller of `lockbox_confine::Spawn::audit` gave.
//!
//! **Never blocking.** The sink is a bounded channel the supervisor only `try_send`s on: when
//! the consumer falls behind, events are dropped and counted, and a `dropped` event with the
//! count goes out as soon as there is room again (and once more when the supervisor ends).
//!
//! **Who asked.** Each event names the calling process (`pid`, its thread-group id as the
//! caller of lockbox sees it) and its command line, read from `/proc/PID/cmdline` when the
//! notification arrives: best effort, since the process may be gone by then. A DNS query
//! carries no pid: the supervisor remembers the last [`MAX_DNS_ASKERS`] sockets that were
//! connected or sent to lockbox's resolver (those calls are intercepted too) and matches the
//! query's source port against them.
//!
//! Not logged: calls that stay on the sandbox's own loopback (they never leave it), and
//! sends on a socket already connected (its connect was logged).

use lockbox_policy::time::now_rfc3339;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;

/// Longest command line kept in an event, in bytes.
pub const MAX_COMMAND: usize = 256;
/// Sockets of the sandbox remembered as asking lockbox's resolver (for a DNS event's pid).
pub const MAX_DNS_ASKERS: usize = 32;

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A `connect` towards the host's network.
    Connect,
    /// A `sendto`/`sendmsg`/`sendmmsg` with a destination address.
    Send,
    /// A query to lockbox's resolver.
    Dns,
    /// The TLS ClientHello of a relayed (name-allowed) connection: its SNI checked.
    Tls,
    /// The HTTP/1 request of a relayed (name-allowed) connection: its `Host` checked.
    Http,
    /// A request on a connection lockbox intercepts (`--http-auth`, `--http-allow`): its
    /// method and path checked, a credential set.
    Request,
    /// Events the consumer had no room for (`count` of them).
    Dropped,
}

/// What lockbox decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Sent to the host's network / answered.
    Allowed,
    /// Refused (`EACCES`) / answered `NXDOMAIN`, `SERVFAIL` or without the refused addresses.
    Denied,
    /// Not listed, so asked (`--net-ask`): the call waits for question `question`'s verdict,
    /// logged by a later `allowed`/`denied` event with the same `question`.
    Asked,
}

/// The transport of the call or query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// One decision of the network supervisor (a line of `--audit`'s JSON Lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetEvent {
    /// When, RFC 3339 UTC with milliseconds.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub ts: String,
    /// The sandbox's id, when the sink was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub sandbox: Option<String>,
    /// What the event is about.
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub kind: EventKind,
    /// Allowed or denied (absent on `dropped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(inline, nullable = false))]
    pub decision: Option<Decision>,
    /// lockbox's reason: `address rule tcp 1.2.3.4/32:443`, `name a.test:443 answered`,
    /// `not in the allow-list`, `nxdomain: name not listed`, `rebinding: loopback answer
    /// refused`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub reason: Option<String>,
    /// TCP or UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(inline, nullable = false))]
    pub protocol: Option<Protocol>,
    /// The destination address (connect, send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable = false))]
    pub address: Option<IpAddr>,
    /// The destination port (connect, send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 65535, nullable = false))]
    pub port: Option<u16>,
    /// The name asked (dns), or the name whose answer allowed the address (connect, send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub name: Option<String>,
    /// The server name the TLS client asked for (tls), as sent, at most 253 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub sni: Option<String>,
    /// The `Host` the HTTP/1 request named (http), as sent without its port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub host: Option<String>,
    /// The request's method (request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub method: Option<String>,
    /// The request's path, without its query (request), at most 1024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub path: Option<String>,
    /// The name of the credential lockbox set on the request (request); never its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub credential: Option<String>,
    /// The HTTP status the sandbox got (request): lockbox's own 403 when refused, else the
    /// server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 100, maximum = 599, nullable = false)
    )]
    pub status: Option<u16>,
    /// The query type (dns): `A`, `AAAA`, `TXT`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub qtype: Option<String>,
    /// The addresses answered (dns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>, nullable = false))]
    pub answers: Option<Vec<IpAddr>>,
    /// Addresses the host resolved the name to and lockbox left out (dns, rebinding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<String>>, nullable = false))]
    pub refused: Option<Vec<IpAddr>>,
    /// The asking process, as the caller of lockbox sees it (0: not found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub pid: Option<u32>,
    /// Its command line, arguments joined with spaces, at most [`MAX_COMMAND`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub command: Option<String>,
    /// Events dropped (`dropped` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub count: Option<u64>,
    /// The approval question this event poses or settles (`--net-ask` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, nullable = false))]
    pub question: Option<u64>,
}

impl NetEvent {
    /// The event that stands for `count` events dropped on the way (stamped now).
    pub fn dropped(count: u64, sandbox: Option<String>) -> NetEvent {
        let mut event = NetEvent::new(EventKind::Dropped, sandbox);
        event.count = Some(count);
        event
    }

    /// An event of `kind` stamped now, all else empty.
    fn new(kind: EventKind, sandbox: Option<String>) -> NetEvent {
        NetEvent {
            ts: now_rfc3339(),
            sandbox,
            kind,
            decision: None,
            reason: None,
            protocol: None,
            address: None,
            port: None,
            name: None,
            sni: None,
            host: None,
            method: None,
            path: None,
            credential: None,
            status: None,
            qtype: None,
            answers: None,
            refused: None,
            pid: None,
            command: None,
            count: None,
            question: None,
        }
    }
}

/// Where a supervisor sends its events: a bounded channel it never waits on.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: SyncSender<NetEvent>,
    dropped: Arc<AtomicU64>,
    sandbox: Option<String>,
}

impl AuditSink {
    /// A sink holding at most `capacity` unread events, and its receiving end. `sandbox`
    /// goes into every event.
    pub fn channel(capacity: usize, sandbox: Option<String>) -> (AuditSink, Receiver<NetEvent>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let sink = AuditSink {
            tx,
            dropped: Arc::default(),
            sandbox,
        };
        (sink, rx)
    }

    /// Events dropped so far and not yet reported by a `dropped` event.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Sends `event`, or counts it dropped; first reports earlier drops if there is room.
    pub fn emit(&self, event: NetEvent) {
        if !self.flush_dropped() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.tx.try_send(event) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Reports the drops counted so far, if any; false when there is still no room.
    pub(super) fn flush_dropped(&self) -> bool {
        let count = self.dropped.load(Ordering::Relaxed);
        if count == 0 {
            return true;
        }
        match self
            .tx
            .try_send(NetEvent::dropped(count, self.sandbox.clone()))
        {
            Ok(()) => {
                self.dropped.fetch_sub(count, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Disconnected(_)) => true,
            Err(TrySendError::Full(_)) => false,
        }
    }

    /// A decision event of `kind` for this sink's sandbox, stamped now.
    pub fn event(&self, kind: EventKind, decision: Decision, reason: String) -> NetEvent {
        let mut e = NetEvent::new(kind, self.sandbox.clone());
        e.decision = Some(decision);
        e.reason = Some(reason);
        e
    }
}

/// The decision on a call towards the host, for the log: `None` from
/// [`super::decide::decide`] for calls that stay inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Why {
    pub(super) allowed: bool,
    pub(super) reason: String,
    /// The name whose answer allowed the address.
    pub(super) name: Option<String>,
}

/// The process behind a notification.
#[derive(Debug, Clone, Default)]
pub(super) struct Asker {
    pub(super) pid: u32,
    pub(super) command: String,
}

impl Asker {
    /// Reads `/proc/TID` now; empty fields if the thread is gone.
    pub(super) fn of(tid: libc::pid_t) -> Asker {
        let pid = super::decide::tgid(tid).unwrap_or(tid);
        Asker {
            pid: u32::try_from(pid).unwrap_or(0),
            command: command_line(tid),
        }
    }
}

/// `/proc/TID/cmdline`, arguments joined with spaces, cut to [`MAX_COMMAND`] bytes.
fn command_line(tid: libc::pid_t) -> String {
    use std::io::Read;
    let mut raw = Vec::new();
    if let Ok(f) = std::fs::File::open(format!("/proc/{tid}/cmdline")) {
        let _ = f.take(MAX_COMMAND as u64 + 4).read_to_end(&mut raw);
    }
    while raw.last() == Some(&0) {
        raw.pop();
    }
    for b in &mut raw {
        if *b == 0 {
            *b = b' ';
        }
    }
    let mut text = String::from_utf8_lossy(&raw).into_owned();
    if text.len() > MAX_COMMAND {
        let mut end = MAX_COMMAND;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Sockets of the sandbox that asked lockbox's resolver (by inode), newest last. Only
/// their inodes are kept: holding the sockets would keep their ports bound and their TCP
/// connections open after the sandbox closed them.
#[derive(Debug, Default)]
pub(super) struct DnsAskers {
    askers: VecDeque<(u64, Asker)>,
}

impl DnsAskers {
    /// Remembers `socket` (the supervisor's copy of the caller's) as `asker`'s.
    pub(super) fn add(&mut self, socket: &OwnedFd, asker: &Asker) {
        let Ok(stat) = rustix::fs::fstat(socket) else {
            return;
        };
        let inode = stat.st_ino;
        self.askers.retain(|(i, _)| *i != inode);
        if self.askers.len() >= MAX_DNS_ASKERS {
            self.askers.pop_front();
        }
        self.askers.push_back((inode, asker.clone()));
    }

    /// The process whose socket (of the sandbox's namespace) has the local port of `from`:
    /// found in `/proc/PID/net/{udp,tcp}{,6}` of a process that asked before.
    pub(super) fn find(&self, from: SocketAddr, tcp: bool) -> Option<Asker> {
        let files: [&str; 2] = if tcp {
            ["tcp", "tcp6"]
        } else {
            ["udp", "udp6"]
        };
        for (_, seen) in self.askers.iter().rev() {
            let mut readable = false;
            for file in files {
                let Ok(text) = std::fs::read_to_string(format!("/proc/{}/net/{file}", seen.pid))
                else {
                    continue;
                };
                readable = true;
                for inode in inodes_on_port(&text, from.port()) {
                    if let Some((_, asker)) = self.askers.iter().rev().find(|(i, _)| *i == inode) {
                        return Some(asker.clone());
                    }
                }
            }
            if readable {
                // One process's view is the whole namespace's.
                return None;
            }
        }
        None
    }
}

/// The inodes of the sockets bound to local `port` in a `/proc/net/{tcp,udp}` table.
fn inodes_on_port(table: &str, port: u16) -> impl Iterator<Item = u64> + '_ {
    table.lines().skip(1).filter_map(move |line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local = fields.get(1)?;
        let (_, hex) = local.rsplit_once(':')?;
        (u16::from_str_radix(hex, 16).ok()? == port).then_some(())?;
        fields.get(9)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_sink_drops_counts_and_reports_the_count_when_room_returns() {
        let (sink, rx) = AuditSink::channel(2, Some("sb".into()));
        for _ in 0..5 {
            sink.emit(sink.event(EventKind::Connect, Decision::Denied, "x".into()));
        }
        assert_eq!(sink.dropped(), 3);
        assert_eq!(rx.try_iter().count(), 2);
        sink.emit(sink.event(EventKind::Dns, Decision::Allowed, "y".into()));
        let got: Vec<NetEvent> = rx.try_iter().collect();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].kind, got[0].count), (EventKind::Dropped, Some(3)));
        assert_eq!(got[1].kind, EventKind::Dns);
        assert_eq!(sink.dropped(), 0);
        let line = serde_json::to_string(&got[0]).unwrap_or_default();
        assert!(line.contains(r#""kind":"dropped","count":3"#), "{line}");
    }

    #[test]
    fn proc_net_tables_give_the_inodes_on_a_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 9900007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 111 2 0\n\
            1: 0100007F:9C40 9900007F:0035 01 00000000:00000000 00:00000000 00000000  1000        0 222 2 0\n";
        assert_eq!(inodes_on_port(table, 53).collect::<Vec<_>>(), vec![111]);
        assert_eq!(inodes_on_port(table, 0x9c40).collect::<Vec<_>>(), vec![222]);
        assert_eq!(inodes_on_port(table, 1).count(), 0);
    }

    #[test]
    fn command_lines_are_joined_and_cut() {
        let me = command_line(std::process::id() as libc::pid_t);
        assert!(!me.is_empty() && me.len() <= MAX_COMMAND && !me.contains('\0'));
    }
}
