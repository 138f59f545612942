//! lockbox's resolver for an allow-list sandbox: the sandbox's `/etc/resolv.conf` names
//! [`crate::DNS_ADDR`], where the supervisor holds a UDP socket and a TCP listener bound in
//! the sandbox's own namespace (made by the init's helper, handed over with the filter).
//!
//! A query for a name of the allow-list ([`NetSpec::matches_name`]) is resolved with the
//! host's resolver (getaddrinfo: the host's `/etc/hosts`, then its DNS), after the hosts file
//! of `LOCKBOX_NET_HOSTS_FILE` (read by `lockbox-confine`) if one is set; every other name is
//! answered `NXDOMAIN` here and never leaves the supervisor. Each address answered becomes a
//! rule of *this* sandbox ([`Learned`]): a connection to it is allowed on the ports of the specs
//! whose name was asked. An answer never carries, and nothing learns, an address of the
//! host's own or one that reaches the host's services ([`super::internal`]: loopback,
//! link-local, metadata ranges, the host's interface addresses read again for each answer,
//! in any IPv6 form that carries them) unless an address rule of the list allows it: a
//! listed name cannot be rebound onto the host.
//!
//! **Bounded and non-blocking.** Host resolution can block, so it runs on one resolver
//! thread fed through a queue of [`MAX_PENDING`] queries (a query beyond that is answered
//! `SERVFAIL` at once); the supervisor's loop only polls this module's sockets. At most
//! [`MAX_TCP`] TCP clients at once, each with one query of at most [`MAX_QUERY`] bytes in
//! hand and closed after [`TCP_IDLE`] without a complete query. [`MAX_LEARNED`] rules at most
//! (the oldest go first).

use super::ask::{self, Asking, Question, Verdict as AskVerdict};
use super::audit::{Asker, AuditSink, Decision, EventKind, NetEvent, Protocol};
use super::internal::{self, Internal};
use super::Shared;
use lockbox_policy::{canonical, normalize_name, ListKind, NetRule, NetSpec};
use simple_dns::rdata::{RData, A, AAAA};
use simple_dns::{Name, Packet, PacketFlag, QTYPE, RCODE, TYPE};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::{Duration, Instant};

/// Queries waiting for the host's resolver at once.
pub const MAX_PENDING: usize = 64;
/// TCP clients at once.
pub const MAX_TCP: usize = 16;
/// Largest query taken (UDP datagram or TCP message); DNS queries are a few dozen bytes.
pub const MAX_QUERY: usize = 4096;
/// A TCP client without a complete query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// Most learned (address, ports) rules a sandbox holds; the oldest are forgotten first.
pub const MAX_LEARNED: usize = 4096;
/// Most addresses in one answer.
const MAX_ANSWERS: usize = 16;
/// TTL of the answers: short, so clients ask again and get the host's current addresses.
const TTL: u32 = 5;

/// The addresses this sandbox's answers allowed, as rules (oldest first), each with the
/// spec and the name it was answered for (for the audit log).
#[derive(Debug, Default)]
pub(super) struct Learned {
    rules: VecDeque<(NetRule, String, String)>,
}

impl Learned {
    #[cfg(test)]
    pub(super) fn rules(&self) -> impl Iterator<Item = &NetRule> {
        self.rules.iter().map(|(r, _, _)| r)
    }

    /// The spec and name whose answer allows a `proto` connection to `dest`, if one did.
    pub(super) fn why(
        &self,
        proto: lockbox_policy::Proto,
        dest: SocketAddr,
    ) -> Option<(String, String)> {
        self.rules
            .iter()
            .find(|(r, _, _)| r.matches(proto, dest))
            .map(|(_, spec, name)| (spec.clone(), name.clone()))
    }

    /// Forgets every rule (the list they were learned under was replaced).
    pub(super) fn clear(&mut self) {
        self.rules.clear();
    }

    fn add(&mut self, rule: NetRule, spec: &NetSpec, name: &str) {
        if self.rules.iter().any(|(r, _, _)| *r == rule) {
            return;
        }
        if self.rules.len() >= MAX_LEARNED {
            self.rules.pop_front();
        }
        self.rules
            .push_back((rule, spec.to_string(), name.to_owned()));
    }
}

/// Where an answer goes.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Udp(SocketAddr),
    Tcp(u64),
}

struct Pending {
    token: u64,
    query: Vec<u8>,
    reply: Reply,
    /// Who asked (kept only with an audit sink).
    asker: Option<Who>,
    /// Not listed but approved: the reason logged (`approved once`...).
    approved: Option<String>,
}

/// A query for an unlisted name waiting for its question's verdict (`--net-ask`).
struct AskedQuery {
    question: Question,
    deadline: Instant,
    name: String,
    query: Vec<u8>,
    reply: Reply,
    asker: Option<Who>,
}

/// Who sent a query, for the audit log.
#[derive(Debug, Clone)]
struct Who {
    asker: Asker,
    protocol: Protocol,
}

struct Conn {
    id: u64,
    stream: TcpStream,
    /// The client's address, to find who asked.
    peer: Option<SocketAddr>,
    buf: Vec<u8>,
    since: Instant,
    /// A query of this client waits for the resolver: it is not read meanwhile.
    busy: bool,
}

/// The resolver's sockets and its queries in flight.
pub(super) struct Dns {
    udp: UdpSocket,
    tcp: TcpListener,
    conns: Vec<Conn>,
    pending: Vec<Pending>,
    asking: Vec<AskedQuery>,
    next_token: u64,
    to_resolver: SyncSender<(u64, String)>,
    from_resolver: Receiver<(u64, Resolved)>,
    wake: UnixStream,
}

/// What the host resolved a name to (`Err`: its resolver failed), and the addresses of the
/// host's interfaces just after, which the answer leaves out.
type Resolved = (Result<Vec<IpAddr>, ()>, Vec<IpAddr>);

/// How many of [`Dns::pollfds`]'s entries are fixed (UDP, listener, wake-up).
const FIXED: usize = 3;

impl Dns {
    /// Takes the handed-over sockets and starts the resolver thread (which inherits the
    /// calling thread's capabilities: call it from the supervisor's thread).
    pub(super) fn new(udp: OwnedFd, tcp: OwnedFd, hosts_file: Option<PathBuf>) -> Option<Dns> {
        let udp = UdpSocket::from(udp);
        let tcp = TcpListener::from(tcp);
        udp.set_nonblocking(true).ok()?;
        tcp.set_nonblocking(true).ok()?;
        let (wake, wake_tx) = UnixStream::pair().ok()?;
        wake.set_nonblocking(true).ok()?;
        wake_tx.set_nonblocking(true).ok()?;
        let (to_resolver, queries) = mpsc::sync_channel::<(u64, String)>(MAX_PENDING);
        let (results, from_resolver) = mpsc::channel();
        std::thread::Builder::new()
            .name("lockbox-dns".into())
            .spawn(move || {
                let mut wake_tx = wake_tx;
                // Ends when the supervisor drops its sender.
                while let Ok((token, name)) = queries.recv() {
                    let addrs = lookup(hosts_file.as_deref(), &name);
                    // Read for each answer, so interfaces that came since are known.
                    let host = internal::host_addresses();
                    if results.send((token, (addrs, host))).is_err() {
                        return;
                    }
                    // A full wake-up socket already says there is something to read.
                    let _ = wake_tx.write(&[1]);
                }
            })
            .ok()?;
        Some(Dns {
            udp,
            tcp,
            conns: Vec::new(),
            pending: Vec::new(),
            asking: Vec::new(),
            next_token: 0,
            to_resolver,
            from_resolver,
            wake,
        })
    }

    /// The descriptors to poll, appended to `fds`.
    pub(super) fn pollfds(&self, fds: &mut Vec<libc::pollfd>) {
        let pfd = |fd, events| libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        fds.push(pfd(self.udp.as_raw_fd(), libc::POLLIN));
        let accepting = self.conns.len() < MAX_TCP;
        fds.push(pfd(
            self.tcp.as_raw_fd(),
            if accepting { libc::POLLIN } else { 0 },
        ));
        fds.push(pfd(self.wake.as_raw_fd(), libc::POLLIN));
        for c in &self.conns {
            fds.push(pfd(
                c.stream.as_raw_fd(),
                if c.busy { 0 } else { libc::POLLIN },
            ));
        }
    }

    /// When the loop must wake for an idle TCP client or an unanswered question.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .filter(|c| !c.busy)
            .map(|c| c.since + TCP_IDLE)
            .chain(self.asking.iter().map(|a| a.deadline))
            .min()
    }

    /// Acts on what [`Dns::pollfds`]'s entries (`fds`, in the same order) report.
    pub(super) fn ready(&mut self, shared: &Shared, fds: &[libc::pollfd]) {
        let now = Instant::now();
        self.expire_asked(shared, now);
        let revents = |i: usize| fds.get(i).map_or(0, |f| f.revents);
        if revents(2) != 0 {
            let mut sink = [0u8; 64];
            while matches!(self.wake.read(&mut sink), Ok(n) if n > 0) {}
            while let Ok((token, resolved)) = self.from_resolver.try_recv() {
                self.resolved(shared, token, resolved);
            }
        }
        if revents(0) != 0 {
            self.read_udp(shared);
        }
        // Clients in the order they were polled; those added below were not.
        let polled: Vec<(u64, i16)> = self
            .conns
            .iter()
            .enumerate()
            .map(|(i, c)| (c.id, revents(FIXED + i)))
            .collect();
        for (id, ev) in polled {
            if ev != 0 {
                self.read_tcp(shared, id);
            }
        }
        self.conns
            .retain(|c| c.busy || now.saturating_duration_since(c.since) < TCP_IDLE);
        if revents(1) != 0 {
            self.accept(now);
        }
    }

    fn read_udp(&mut self, shared: &Shared) {
        let mut buf = [0u8; MAX_QUERY];
        // A bounded batch per wake-up, so TCP clients and calls get their turn.
        for _ in 0..32 {
            match self.udp.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let query = buf[..n].to_vec();
                    self.query(shared, query, Reply::Udp(from));
                }
                Err(_) => return,
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        while self.conns.len() < MAX_TCP {
            let Ok((stream, peer)) = self.tcp.accept() else {
                return;
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            self.next_token += 1;
            self.conns.push(Conn {
                id: self.next_token,
                stream,
                peer: Some(peer),
                buf: Vec::new(),
                since: now,
                busy: false,
            });
        }
    }

    fn read_tcp(&mut self, shared: &Shared, id: u64) {
        let Some(at) = self.conns.iter().position(|c| c.id == id) else {
            return;
        };
        let conn = &mut self.conns[at];
        let mut chunk = [0u8; 1024];
        let closed = loop {
            match conn.stream.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) if conn.buf.len() + n <= 2 + MAX_QUERY => {
                    conn.buf.extend_from_slice(&chunk[..n]);
                }
                Ok(_) => break true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        let query = tcp_message(&mut conn.buf);
        match query {
            Some(q) => {
                conn.busy = true;
                self.query(shared, q, Reply::Tcp(id));
            }
            None if closed => {
                self.conns.remove(at);
            }
            None => {}
        }
    }

    /// Answers a query at once, or hands it to the resolver thread.
    fn query(&mut self, shared: &Shared, query: Vec<u8>, reply: Reply) {
        let asker =
            (shared.audit.is_some() || shared.ask.is_some()).then(|| self.asker(shared, reply));
        let verdict = classify(shared, &query);
        let approved =
            matches!(verdict, Verdict::Approved(_)).then(|| "approved for the sandbox".to_owned());
        match verdict {
            Verdict::Answer(answer) => {
                if let Some(asker) = &asker {
                    audit_refusal(shared, &query, &answer, asker);
                }
                self.send(reply, answer);
            }
            Verdict::Drop => self.send_nothing(reply),
            Verdict::Ask(name) => self.ask(shared, name, query, reply, asker),
            Verdict::Resolve(name) | Verdict::Approved(name) => {
                self.resolve(shared, name, query, reply, asker, approved);
            }
        }
    }

    /// Hands a query to the resolver thread, or answers `SERVFAIL` when it is busy.
    fn resolve(
        &mut self,
        shared: &Shared,
        name: String,
        query: Vec<u8>,
        reply: Reply,
        asker: Option<Who>,
        approved: Option<String>,
    ) {
        self.next_token += 1;
        let token = self.next_token;
        let queued =
            self.pending.len() < MAX_PENDING && self.to_resolver.try_send((token, name)).is_ok();
        if queued {
            self.pending.push(Pending {
                token,
                query,
                reply,
                asker,
                approved,
            });
        } else if let Some(answer) = refusal(&query, RCODE::ServerFailure) {
            if let Some(asker) = &asker {
                audit_refusal(shared, &query, &answer, asker);
            }
            self.send(reply, answer);
        }
    }

    /// Poses the question for an unlisted name and holds the query; `NXDOMAIN` when
    /// [`ask::MAX_ASKED`] questions are pending already.
    fn ask(
        &mut self,
        shared: &Shared,
        name: String,
        query: Vec<u8>,
        reply: Reply,
        asker: Option<Who>,
    ) {
        let Some(desk) = &shared.ask else {
            return;
        };
        let who = asker.clone().unwrap_or(Who {
            asker: Asker::default(),
            protocol: Protocol::Udp,
        });
        let asking = Asking {
            kind: EventKind::Dns,
            name: Some(name.clone()),
            dest: None,
            protocol: who.protocol,
            pid: who.asker.pid,
            command: who.asker.command.clone(),
        };
        let Some((question, deadline)) = desk.pose(asking) else {
            let reason = format!(
                "nxdomain: name not listed; {} questions pending",
                ask::MAX_ASKED
            );
            self.refuse_asked(shared, &query, reply, asker.as_ref(), None, reason);
            super::decide::record_denied_name(shared, &name);
            return;
        };
        if let Some(audit) = &shared.audit {
            let reason = "name not listed; asked".to_owned();
            let mut e = ask::event(audit, &question, Decision::Asked, reason);
            if let Ok(packet) = Packet::parse(&query) {
                e.qtype = packet.questions.first().map(|q| qtype_name(q.qtype));
            }
            audit.emit(e);
        }
        self.asking.push(AskedQuery {
            question,
            deadline,
            name,
            query,
            reply,
            asker,
        });
    }

    /// Acts on the verdict of question `id`, if it is a query's.
    pub(super) fn answered(&mut self, shared: &Shared, id: u64, verdict: AskVerdict, by: &str) {
        let Some(at) = self.asking.iter().position(|a| a.question.id == id) else {
            return;
        };
        let a = self.asking.swap_remove(at);
        match verdict {
            AskVerdict::Deny => self.deny_asked(shared, a, ask::reason(verdict, by)),
            AskVerdict::Once | AskVerdict::Sandbox => {
                let reason = Some(ask::reason(verdict, by));
                self.resolve(shared, a.name, a.query, a.reply, a.asker, reason);
            }
        }
    }

    /// Answers `NXDOMAIN` to the queries whose question's time is up.
    fn expire_asked(&mut self, shared: &Shared, now: Instant) {
        if !self.asking.iter().any(|a| a.deadline <= now) {
            return;
        }
        let Some(desk) = shared.ask.clone() else {
            return;
        };
        for a in std::mem::take(&mut self.asking) {
            if a.deadline > now {
                self.asking.push(a);
                continue;
            }
            desk.withdraw(a.question.id);
            let reason = format!("nxdomain: {}", ask::timeout_reason(desk.timeout()));
            self.deny_asked(shared, a, reason);
        }
    }

    /// Refuses the query of a question denied (or timed out): `NXDOMAIN`, the name
    /// counted as denied, the reason logged with the question.
    fn deny_asked(&mut self, shared: &Shared, a: AskedQuery, reason: String) {
        super::decide::record_denied_name(shared, &a.name);
        self.refuse_asked(
            shared,
            &a.query,
            a.reply,
            a.asker.as_ref(),
            Some(&a.question),
            reason,
        );
    }

    /// Answers an asked (or unaskable) query `NXDOMAIN` and logs why.
    fn refuse_asked(
        &mut self,
        shared: &Shared,
        query: &[u8],
        reply: Reply,
        asker: Option<&Who>,
        question: Option<&Question>,
        reason: String,
    ) {
        let Some(answer) = refusal(query, RCODE::NameError) else {
            self.send_nothing(reply);
            return;
        };
        if let (Some(audit), Some(who)) = (&shared.audit, asker) {
            let mut e = match Packet::parse(query) {
                Ok(packet) => dns_event(audit, Decision::Denied, reason, &packet, who),
                Err(_) => audit.event(EventKind::Dns, Decision::Denied, reason),
            };
            e.answers = Some(Vec::new());
            e.question = question.map(|q| q.id);
            audit.emit(e);
        }
        self.send(reply, answer);
    }

    /// The process that sent a query from `reply`'s address (see [`super::audit`]).
    fn asker(&self, shared: &Shared, reply: Reply) -> Who {
        let (from, protocol) = match reply {
            Reply::Udp(from) => (Some(from), Protocol::Udp),
            Reply::Tcp(id) => (
                self.conns.iter().find(|c| c.id == id).and_then(|c| c.peer),
                Protocol::Tcp,
            ),
        };
        let tcp = protocol == Protocol::Tcp;
        let asker = from
            .and_then(|from| shared.dns_askers.lock().ok()?.find(from, tcp))
            .unwrap_or_default();
        Who { asker, protocol }
    }

    fn resolved(&mut self, shared: &Shared, token: u64, (addrs, host): Resolved) {
        let Some(at) = self.pending.iter().position(|p| p.token == token) else {
            return;
        };
        let p = self.pending.swap_remove(at);
        match answer(
            shared,
            &p.query,
            addrs,
            &host,
            p.asker.as_ref(),
            p.approved.as_deref(),
        ) {
            Some(a) => self.send(p.reply, a),
            None => self.send_nothing(p.reply),
        }
    }

    fn send(&mut self, reply: Reply, answer: Vec<u8>) {
        match reply {
            // Best effort, as UDP is: a client that went away loses its answer.
            Reply::Udp(to) => {
                let _ = self.udp.send_to(&answer, to);
            }
            Reply::Tcp(id) => {
                let Some(at) = self.conns.iter().position(|c| c.id == id) else {
                    return;
                };
                let conn = &mut self.conns[at];
                let Ok(len) = u16::try_from(answer.len()) else {
                    self.conns.remove(at);
                    return;
                };
                let mut msg = len.to_be_bytes().to_vec();
                msg.extend_from_slice(&answer);
                // The client waits for this answer with an empty receive buffer: a write
                // that does not fit at once is a client not reading, and is dropped.
                let whole = matches!(conn.stream.write(&msg), Ok(n) if n == msg.len());
                if whole {
                    conn.busy = false;
                    conn.since = Instant::now();
                } else {
                    self.conns.remove(at);
                }
            }
        }
    }

    fn send_nothing(&mut self, reply: Reply) {
        if let Reply::Tcp(id) = reply {
            self.conns.retain(|c| c.id != id);
        }
    }
}

/// Everything the resolver answers to `query` on its own, without a socket: the immediate
/// verdict's reply, the answer built as if the host resolved the name to `resolved` (with
/// `host` the host's interface addresses), the refusal, and the TCP framing of the bytes.
/// For the `dns_query` fuzz target (see [`crate::fuzzing`]).
pub(crate) fn exercise(
    names: Vec<NetSpec>,
    query: &[u8],
    resolved: Vec<IpAddr>,
    host: &[IpAddr],
) -> Vec<Vec<u8>> {
    let shared = Shared::bare(super::NetList {
        kind: lockbox_policy::ListKind::Allow,
        rules: Vec::new(),
        names,
    });
    let mut replies = Vec::new();
    if let Verdict::Answer(reply) = classify(&shared, query) {
        replies.push(reply);
    }
    replies.extend(answer(&shared, query, Ok(resolved), host, None, None));
    replies.extend(refusal(query, RCODE::Refused));
    let mut stream = query.to_vec();
    // Each message taken removes at least its two length bytes.
    while let Some(message) = tcp_message(&mut stream) {
        replies.extend(refusal(&message, RCODE::Refused));
    }
    replies
}

/// Takes one complete length-prefixed message off the front of `buf`.
fn tcp_message(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let len = usize::from(u16::from_be_bytes([*buf.first()?, *buf.get(1)?]));
    if buf.len() < 2 + len {
        return None;
    }
    let msg = buf[2..2 + len].to_vec();
    buf.drain(..2 + len);
    Some(msg)
}

/// What to do with a query.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Answer with these bytes now.
    Answer(Vec<u8>),
    /// Not even a DNS header: no answer.
    Drop,
    /// A listed name: resolve it (normalised) on the host.
    Resolve(String),
    /// An unlisted name approved for the sandbox (`--net-ask`): resolve it.
    Approved(String),
    /// An unlisted name, and approvals are on: ask.
    Ask(String),
}

fn classify(shared: &Shared, query: &[u8]) -> Verdict {
    let Ok(packet) = Packet::parse(query) else {
        return refusal(query, RCODE::FormatError).map_or(Verdict::Drop, Verdict::Answer);
    };
    let refuse = |rcode| refusal(query, rcode).map_or(Verdict::Drop, Verdict::Answer);
    if packet.has_flags(PacketFlag::RESPONSE) {
        return Verdict::Drop;
    }
    if packet.opcode() != simple_dns::OPCODE::StandardQuery {
        return refuse(RCODE::NotImplemented);
    }
    let [question] = packet.questions.as_slice() else {
        return refuse(RCODE::FormatError);
    };
    let asked = question.qname.to_string();
    let list = shared.list.get();
    let listed = list.answers(&asked);
    let address_query = matches!(
        question.qtype,
        QTYPE::TYPE(TYPE::A) | QTYPE::TYPE(TYPE::AAAA)
    );
    // Approvals are asked for an allow-list's unlisted names only.
    let desk = shared.ask.as_ref().filter(|_| list.kind == ListKind::Allow);
    let (name, approved) = match (normalize_name(&asked), desk) {
        (Some(name), _) if listed => (name, false),
        (Some(name), Some(desk)) if desk.name_approved(&name) => (name, true),
        // Asked for addresses only: other record types name nothing to connect to.
        (Some(name), Some(_)) if address_query => return Verdict::Ask(name),
        _ => {
            super::decide::record_denied_name(shared, &asked);
            return refuse(RCODE::NameError);
        }
    };
    match question.qtype {
        QTYPE::TYPE(TYPE::A) | QTYPE::TYPE(TYPE::AAAA) if approved => Verdict::Approved(name),
        QTYPE::TYPE(TYPE::A) | QTYPE::TYPE(TYPE::AAAA) => Verdict::Resolve(name),
        // Other record types of a listed name: none (they would need the host's DNS
        // itself, and name nothing a connection could use).
        _ => reply_with(&packet, RCODE::NoError, &[]).map_or(Verdict::Drop, Verdict::Answer),
    }
}

/// A reply with `rcode` and no records, built from the query's header and question alone.
fn refusal(query: &[u8], rcode: RCODE) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    let id = u16::from_be_bytes([query[0], query[1]]);
    let mut reply = Packet::new_reply(id);
    if let Ok(packet) = Packet::parse(query) {
        reply.questions = packet.questions.into_iter().take(1).collect();
    }
    reply.set_flags(PacketFlag::RECURSION_AVAILABLE);
    *reply.rcode_mut() = rcode;
    reply.build_bytes_vec_compressed().ok()
}

fn reply_with(query: &Packet<'_>, rcode: RCODE, addrs: &[IpAddr]) -> Option<Vec<u8>> {
    let mut reply = Packet::new_reply(query.id());
    let question = query.questions.first()?.clone();
    if query.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED);
    }
    reply.set_flags(PacketFlag::RECURSION_AVAILABLE);
    *reply.rcode_mut() = rcode;
    let name: Name<'_> = question.qname.clone();
    for ip in addrs.iter().take(MAX_ANSWERS) {
        let rdata = match ip {
            IpAddr::V4(a) => RData::A(A {
                address: u32::from(*a),
            }),
            IpAddr::V6(a) => RData::AAAA(AAAA {
                address: u128::from(*a),
            }),
        };
        reply.answers.push(simple_dns::ResourceRecord::new(
            name.clone(),
            simple_dns::CLASS::IN,
            TTL,
            rdata,
        ));
    }
    reply.questions.push(question);
    reply.build_bytes_vec_compressed().ok()
}

/// The answer to a listed name's query, given what the host resolved it to and the
/// addresses of the host's interfaces; learns what it answers.
fn answer(
    shared: &Shared,
    query: &[u8],
    addrs: Result<Vec<IpAddr>, ()>,
    host: &[IpAddr],
    asker: Option<&Who>,
    approved: Option<&str>,
) -> Option<Vec<u8>> {
    let packet = Packet::parse(query).ok()?;
    let question = packet.questions.first()?;
    let Ok(addrs) = addrs else {
        let reply = refusal(query, RCODE::ServerFailure);
        if let (Some(asker), Some(reply)) = (asker, &reply) {
            audit_refusal(shared, query, reply, asker);
        }
        return reply;
    };
    let want_v4 = question.qtype == QTYPE::TYPE(TYPE::A);
    let asked = question.qname.to_string();
    // Read once for the filter; the learning below reads the list again under its lock.
    let list = shared.list.get();
    let specs: Vec<&NetSpec> = match list.kind {
        ListKind::Allow => list
            .names
            .iter()
            .filter(|s| s.matches_name(&asked))
            .collect(),
        ListKind::Deny => Vec::new(),
    };
    // Under a deny-list (a list that replaced the allow-list the sandbox started with) the
    // resolver answers as the host's resolver would, which the sandbox would otherwise ask
    // itself: every address but a denied one is reachable anyway, and the host's own are
    // the sandbox's loopback (`route`), so there is nothing to rebind onto.
    let filtered = list.kind == ListKind::Allow;
    let allowed_address = |ip: IpAddr| list.rules.iter().any(|r| r.block.contains(ip));
    let mut answered: Vec<IpAddr> = Vec::new();
    let mut refused: Vec<(IpAddr, Internal)> = Vec::new();
    for ip in addrs.into_iter().map(canonical) {
        if ip.is_ipv4() != want_v4 || answered.contains(&ip) {
            continue;
        }
        match internal::classify(ip, host) {
            Some(kind) if filtered && !allowed_address(ip) => {
                super::decide::record_rebinding(shared, &asked, ip);
                refused.push((ip, kind));
                continue;
            }
            _ => {}
        }
        answered.push(ip);
    }
    answered.truncate(MAX_ANSWERS);
    if let (Some(audit), Some(asker)) = (&shared.audit, asker) {
        let spec = specs.first().map_or_else(String::new, ToString::to_string);
        let (decision, reason) = match refused.first() {
            None => match approved {
                Some(reason) => (Decision::Allowed, reason.to_owned()),
                None => (Decision::Allowed, format!("name {spec} listed")),
            },
            Some((_, kind)) => (
                if answered.is_empty() {
                    Decision::Denied
                } else {
                    Decision::Allowed
                },
                format!("rebinding: {} answer refused", kind.as_str()),
            ),
        };
        let mut e = dns_event(audit, decision, reason, &packet, asker);
        e.answers = Some(answered.clone());
        e.refused = (!refused.is_empty()).then(|| refused.iter().map(|(ip, _)| *ip).collect());
        audit.emit(e);
    }
    if let (Some(desk), Some(_)) = (&shared.ask, approved) {
        if let Some(name) = normalize_name(&asked) {
            desk.answered(&name, &answered);
        }
    }
    {
        // Under the lock a replacement takes: the list read here is the one in force, and
        // one replaced meanwhile already forgot what this would otherwise add.
        let mut learned = shared.list.learned();
        let now = shared.list.get();
        if now.kind == ListKind::Allow {
            for spec in now.names.iter().filter(|s| s.matches_name(&asked)) {
                for rule in spec.rules(&answered) {
                    learned.add(rule, spec, &asked);
                }
            }
        }
    }
    if let Ok(mut r) = shared.report.lock() {
        r.dns_answered += 1;
    }
    reply_with(&packet, RCODE::NoError, &answered)
}

/// A `dns` event about `query` (its first question).
fn dns_event(
    audit: &AuditSink,
    decision: Decision,
    reason: String,
    query: &Packet<'_>,
    who: &Who,
) -> NetEvent {
    let mut e = audit.event(EventKind::Dns, decision, reason);
    if let Some(q) = query.questions.first() {
        e.name = Some(q.qname.to_string());
        e.qtype = Some(qtype_name(q.qtype));
    }
    e.protocol = Some(who.protocol);
    e.pid = Some(who.asker.pid);
    e.command = Some(who.asker.command.clone());
    e
}

fn qtype_name(qtype: QTYPE) -> String {
    match qtype {
        QTYPE::TYPE(TYPE::A) => "A".into(),
        QTYPE::TYPE(TYPE::AAAA) => "AAAA".into(),
        QTYPE::TYPE(t) => {
            let text = format!("{t:?}");
            if text.starts_with("Unknown") {
                format!("TYPE{}", u16::from(qtype))
            } else {
                text
            }
        }
        other => format!("TYPE{}", u16::from(other)),
    }
}

/// Logs a query answered at once (refused, or a listed name's other record types), or
/// answered `SERVFAIL`; the decision and reason follow the answer's rcode.
fn audit_refusal(shared: &Shared, query: &[u8], reply: &[u8], who: &Who) {
    let Some(audit) = &shared.audit else {
        return;
    };
    let rcode = reply.get(3).map_or(0, |b| b & 0xf);
    let (decision, reason) = match rcode {
        0 => (
            Decision::Allowed,
            "name listed; no records of this type given",
        ),
        2 => (
            Decision::Denied,
            "servfail: the host's resolver failed or is busy",
        ),
        3 => (Decision::Denied, "nxdomain: name not listed"),
        4 => (Decision::Denied, "notimp: not a standard query"),
        _ => (Decision::Denied, "formerr: not one question"),
    };
    let e = match Packet::parse(query) {
        Ok(packet) => {
            let mut e = dns_event(audit, decision, reason.into(), &packet, who);
            e.answers = Some(Vec::new());
            e
        }
        Err(_) => {
            let mut e = audit.event(EventKind::Dns, decision, reason.into());
            e.protocol = Some(who.protocol);
            e.pid = Some(who.asker.pid);
            e.command = Some(who.asker.command.clone());
            e
        }
    };
    audit.emit(e);
}

/// What `name` resolves to: the hosts file of the test hook first, then the host's resolver.
fn lookup(hosts_file: Option<&Path>, name: &str) -> Result<Vec<IpAddr>, ()> {
    if let Some(path) = hosts_file {
        let found = hosts_lookup(&std::fs::read_to_string(path).unwrap_or_default(), name);
        if !found.is_empty() {
            return Ok(found);
        }
    }
    (name, 0)
        .to_socket_addrs()
        .map(|addrs| addrs.map(|a| a.ip()).collect())
        .map_err(|_| ())
}

/// The addresses of `name` in a hosts(5) text.
fn hosts_lookup(text: &str, name: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let ip: IpAddr = words.next()?.parse().ok()?;
            words
                .any(|w| normalize_name(w).as_deref() == Some(name))
                .then_some(ip)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn hosts_files_are_read_as_hosts5_with_names_normalised() {
        let text = "# c\n198.18.0.2 a.test B.test. # x\n198.18.0.3\tb.test\nnot-an-ip b.test\n";
        let want: Vec<IpAddr> = vec!["198.18.0.2".parse().unwrap(), "198.18.0.3".parse().unwrap()];
        assert_eq!(hosts_lookup(text, "b.test"), want);
        assert_eq!(hosts_lookup(text, "c.test"), Vec::<IpAddr>::new());
    }

    #[test]
    fn tcp_messages_are_taken_whole_and_in_order() {
        let mut buf = vec![0, 2, 9, 9, 0, 1];
        assert_eq!(tcp_message(&mut buf), Some(vec![9, 9]));
        assert_eq!(tcp_message(&mut buf), None);
        buf.push(7);
        assert_eq!(tcp_message(&mut buf), Some(vec![7]));
        assert!(buf.is_empty());
    }

    fn shared(specs: &[&str]) -> Shared {
        Shared::bare(super::super::NetList {
            kind: ListKind::Allow,
            rules: Vec::new(),
            names: specs.iter().map(|s| NetSpec::parse(s).unwrap()).collect(),
        })
    }

    fn query(name: &str, qtype: TYPE) -> Vec<u8> {
        let mut p = Packet::new_query(7);
        p.questions.push(simple_dns::Question::new(
            Name::new_unchecked(name),
            QTYPE::TYPE(qtype),
            simple_dns::QCLASS::CLASS(simple_dns::CLASS::IN),
            false,
        ));
        p.build_bytes_vec().unwrap()
    }

    #[test]
    fn listed_names_are_resolved_others_get_nxdomain_and_answers_teach_only_their_ports() {
        let s = shared(&["tcp://*.example.org:443"]);
        assert_eq!(
            classify(&s, &query("A.Example.ORG", TYPE::A)),
            Verdict::Resolve("a.example.org".into())
        );
        let Verdict::Answer(nx) = classify(&s, &query("example.org", TYPE::A)) else {
            panic!("the apex is not listed");
        };
        assert_eq!(Packet::parse(&nx).unwrap().rcode(), RCODE::NameError);
        let Verdict::Answer(txt) = classify(&s, &query("a.example.org", TYPE::TXT)) else {
            panic!("other types of a listed name are answered empty");
        };
        let txt = Packet::parse(&txt).unwrap();
        assert_eq!((txt.rcode(), txt.answers.len()), (RCODE::NoError, 0));

        let addrs = vec![
            "198.18.0.7".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
            "169.254.169.254".parse().unwrap(),
            // issue 32: the host's own interface and a metadata service outside 169.254/16.
            "198.18.0.1".parse().unwrap(),
            "100.100.100.200".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
        ];
        let host = ["198.18.0.1".parse().unwrap()];
        let q = query("a.example.org", TYPE::A);
        let reply = answer(&s, &q, Ok(addrs), &host, None, None).unwrap();
        let reply = Packet::parse(&reply).unwrap();
        assert_eq!(reply.answers.len(), 1, "only the one IPv4 non-host address");
        let learned = s.list.learned();
        let dest = |d: &str| d.parse::<SocketAddr>().unwrap();
        let allowed = |p, d: &str| learned.rules().any(|r| r.matches(p, dest(d)));
        assert!(allowed(lockbox_policy::Proto::Tcp, "198.18.0.7:443"));
        assert!(!allowed(lockbox_policy::Proto::Tcp, "198.18.0.7:80"));
        assert!(!allowed(lockbox_policy::Proto::Udp, "198.18.0.7:443"));
        assert!(!allowed(lockbox_policy::Proto::Tcp, "127.0.0.1:443"));
        assert_eq!(s.report.lock().unwrap().dns_rebinding_refused, 4);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_resolver() {
        let s = shared(&["*.example.org:*", "example.org:*"]);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = query("a.example.org", TYPE::A);
        for i in 0..20_000 {
            let mut msg = if i % 2 == 0 {
                base.clone()
            } else {
                vec![0u8; (next() % 600) as usize]
            };
            // Flip a few bytes (or fill the random-length buffer).
            for _ in 0..(1 + next() % 8) {
                if msg.is_empty() {
                    break;
                }
                let at = (next() as usize) % msg.len();
                msg[at] = next() as u8;
            }
            let _ = classify(&s, &msg);
            let _ = answer(
                &s,
                &msg,
                Ok(vec!["198.18.0.1".parse().unwrap()]),
                &[],
                None,
                None,
            );
            let _ = refusal(&msg, RCODE::Refused);
            let mut buf = msg.clone();
            let _ = tcp_message(&mut buf);
        }
    }

    #[test]
    fn replacing_the_list_forgets_learned_rules_and_a_deny_list_resolves_every_name_but_its_own() {
        let s = shared(&["tcp://a.example.org:443"]);
        let q = query("a.example.org", TYPE::A);
        let addrs = vec!["198.18.0.7".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        answer(&s, &q, Ok(addrs.clone()), &[], None, None).unwrap();
        let dest: SocketAddr = "198.18.0.7:443".parse().unwrap();
        assert!(s
            .list
            .learned()
            .why(lockbox_policy::Proto::Tcp, dest)
            .is_some());

        // Another allow-list: the old name's answer is forgotten, the old name refused.
        let spec = |t: &str| NetSpec::parse(t).unwrap();
        s.list.replace(crate::NetList {
            kind: ListKind::Allow,
            rules: Vec::new(),
            names: vec![spec("b.example.org:443")],
        });
        assert!(s
            .list
            .learned()
            .why(lockbox_policy::Proto::Tcp, dest)
            .is_none());
        let Verdict::Answer(nx) = classify(&s, &q) else {
            panic!("a name the new list does not hold is refused");
        };
        assert_eq!(Packet::parse(&nx).unwrap().rcode(), RCODE::NameError);
        assert_eq!(
            classify(&s, &query("b.example.org", TYPE::A)),
            Verdict::Resolve("b.example.org".into())
        );

        // A deny-list: every name but the denied ones is resolved, answered as the host
        // answers it, and teaches nothing (a deny-list allows by address).
        s.list.replace(crate::NetList {
            kind: ListKind::Deny,
            rules: Vec::new(),
            names: vec![spec("*.denied.test:*")],
        });
        assert_eq!(classify(&s, &q), Verdict::Resolve("a.example.org".into()));
        let Verdict::Answer(nx) = classify(&s, &query("x.denied.test", TYPE::A)) else {
            panic!("a denied name is refused");
        };
        assert_eq!(Packet::parse(&nx).unwrap().rcode(), RCODE::NameError);
        let reply = answer(&s, &q, Ok(addrs), &[], None, None).unwrap();
        assert_eq!(Packet::parse(&reply).unwrap().answers.len(), 2);
        assert!(s
            .list
            .learned()
            .why(lockbox_policy::Proto::Tcp, dest)
            .is_none());
    }

    #[test]
    fn learned_rules_are_bounded_and_deduplicated() {
        let mut l = Learned::default();
        let spec = NetSpec::parse("a.test:443").unwrap();
        for i in 0..(MAX_LEARNED as u32 + 10) {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0xc612_0000 + i));
            for r in spec.rules(&[ip, ip]) {
                l.add(r, &spec, "a.test");
                l.add(r, &spec, "a.test");
            }
        }
        assert_eq!(l.rules().count(), MAX_LEARNED);
    }
}
