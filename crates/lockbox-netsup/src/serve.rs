//! The supervisor's loop: one thread takes every notification, answers what can be answered
//! at once, and keeps the calls that must wait in a bounded set it polls together with the
//! listener and each caller's pidfd.
//!
//! Bounds, whatever the command does: one thread; one data buffer of [`MAX_SEND`] bytes;
//! at most [`SEND_SLOTS`] + [`CONNECT_SLOTS`] waiting calls (two descriptors and a few KiB
//! of copied arguments each); at most [`MAX_PARKED`] parked notifications (80 bytes each).
//! A waiting call is dropped as soon as its caller cannot take the answer any more: its
//! pidfd becomes readable when the thread exits, and a sweep every [`SWEEP`] checks
//! `SECCOMP_IOCTL_NOTIF_ID_VALID` for the rest (a signal interrupting the call on a kernel
//! without killable waits).

use super::ask::{self, AskedCall, Asking, Verdict};
use super::audit::{Asker, Decision, EventKind, Protocol, Why};
use super::call::{read_call, Call};
use super::decide::{decide, inspect, record_denied, single_threaded, tgid, Action, Decided, Sock};
use super::dns::Dns;
use super::perform::{Caller, Job, Kind, Outcome, Send, Waiting};
use super::relay::{Relayed, RELAY_RETRY, RELAY_SLOTS};
use super::{Shared, CONNECT_SLOTS, MAX_PARKED, MAX_SEND, RETRY, SEND_SLOTS, SWEEP};
use crate::sys::Errno;
use crate::sys::{self as sysnet, Notif};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Runs until `stop` is closed or every process under the filter is gone.
pub(super) fn serve(shared: Shared, listener: OwnedFd, mut dns: Option<Dns>, stop: &UnixStream) {
    let pass_on = shared.pass_on;
    let mut calls = Calls {
        shared,
        listener,
        waiting: Vec::new(),
        parked: VecDeque::new(),
        asked: Vec::new(),
        buf: vec![0; MAX_SEND],
        next_sweep: None,
        next_retry: None,
        next_relay_retry: None,
    };
    let mut fds = Vec::new();
    loop {
        calls.expire(Instant::now());
        let mut timeout = calls.timeout(Instant::now());
        if let Some(at) = dns.as_ref().and_then(Dns::next_deadline) {
            let ms = at.saturating_duration_since(Instant::now()).as_millis() + 1;
            let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
            timeout = if timeout < 0 { ms } else { timeout.min(ms) };
        }
        fds.clear();
        fds.push(pollfd(stop.as_raw_fd(), libc::POLLIN));
        let accepting = calls.parked.len() < MAX_PARKED;
        fds.push(pollfd(
            calls.listener.as_raw_fd(),
            if accepting { libc::POLLIN } else { 0 },
        ));
        for w in &calls.waiting {
            fds.push(pollfd(w.fd(), libc::POLLOUT));
            fds.push(pollfd(w.pidfd.as_raw_fd(), libc::POLLIN));
        }
        // Calls asked while this round's events are handled are appended after these.
        let (asked_at, asked_n) = (fds.len(), calls.asked.len());
        for a in &calls.asked {
            fds.push(pollfd(a.pidfd.as_raw_fd(), libc::POLLIN));
        }
        if let Some(desk) = &calls.shared.ask {
            fds.push(pollfd(desk.wake_fd(), libc::POLLIN));
        }
        let dns_at = fds.len();
        if let Some(d) = &dns {
            d.pollfds(&mut fds);
        }
        match crate::sys::poll(&mut fds, timeout) {
            Ok(_) | Err(Errno(libc::EINTR)) => {}
            Err(_) => break,
        }
        if fds[0].revents != 0 {
            break;
        }
        if let Some(d) = &mut dns {
            d.ready(&calls.shared, &fds[dns_at..]);
        }
        let ready: Vec<(bool, bool)> = fds[2..asked_at]
            .chunks_exact(2)
            .map(|p| (p[0].revents != 0, p[1].revents != 0))
            .collect();
        calls.progress(&ready);
        let gone: Vec<bool> = fds[asked_at..asked_at + asked_n]
            .iter()
            .map(|p| p.revents != 0)
            .collect();
        calls.callers_gone(&gone);
        // The wake-up socket follows the asked calls' pidfds.
        let woken = fds
            .get(asked_at + asked_n)
            .is_some_and(|f| f.revents != 0 && calls.shared.ask.is_some());
        let verdicts = calls
            .shared
            .ask
            .as_ref()
            .filter(|_| woken)
            .map(|desk| desk.take_verdicts());
        for (id, verdict, by) in verdicts.unwrap_or_default() {
            if !calls.answered(id, verdict, &by) {
                if let Some(d) = &mut dns {
                    d.answered(&calls.shared, id, verdict, &by);
                }
            }
        }
        let listener = fds[1].revents;
        if listener & libc::POLLIN != 0 {
            match sysnet::notif_recv(&calls.listener) {
                // This thread kept no capability to move entries with: as unprivileged.
                Ok(notif) if pass_on.is_some_and(|p| (p.wants)(&notif)) => {
                    let result = pass_on.map_or(Ok(0), |p| (p.handle)(&calls.listener, &notif));
                    let _ =
                        sysnet::notif_respond(&calls.listener, notif.id, result, result.is_ok());
                }
                Ok(notif) => calls.handle(notif, Instant::now(), true, None),
                // The caller died or was interrupted before we got it.
                Err(Errno(libc::ENOENT | libc::EINTR)) => {}
                Err(_) => break,
            }
        } else if listener != 0 {
            // POLLHUP: every process under the filter is gone.
            break;
        }
    }
    calls.end_asked();
}

/// Logs a call's decision, if there is a sink: calls towards the host (`why`), and calls to
/// lockbox's resolver, remembered so that the query they carry names its sender.
fn audit(
    shared: &Shared,
    tid: libc::pid_t,
    sock: &Sock,
    call: &Call,
    dest: Option<std::net::SocketAddr>,
    why: Option<Why>,
) {
    let Some(why) = why else {
        // Who asks lockbox's resolver is wanted by the log and by approvals' questions.
        if shared.audit.is_none() && shared.ask.is_none() {
            return;
        }
        let resolver = std::net::SocketAddr::from((crate::DNS_ADDR, 53));
        if dest
            .is_some_and(|d| lockbox_policy::canonical(d.ip()) == resolver.ip() && d.port() == 53)
        {
            if let Ok(mut askers) = shared.dns_askers.lock() {
                askers.add(&sock.file, &Asker::of(tid));
            }
        }
        return;
    };
    let Some(sink) = &shared.audit else {
        return;
    };
    let kind = match call {
        Call::Connect { .. } => EventKind::Connect,
        Call::Send { .. } => EventKind::Send,
    };
    let decision = if why.allowed {
        Decision::Allowed
    } else {
        Decision::Denied
    };
    let mut e = sink.event(kind, decision, why.reason);
    e.protocol = Some(if sock.stream {
        Protocol::Tcp
    } else {
        Protocol::Udp
    });
    e.address = dest.map(|d| lockbox_policy::canonical(d.ip()));
    e.port = dest.map(|d| d.port());
    e.name = why.name;
    let asker = Asker::of(tid);
    e.pid = Some(asker.pid);
    e.command = Some(asker.command);
    sink.emit(e);
}

fn pollfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// A blocking call received while the slots of its kind were taken: only the notification
/// is kept (no descriptor, no copy); it starts over from the beginning later.
struct Parked {
    notif: Notif,
    kind: Kind,
    since: Instant,
    deadline: Option<Instant>,
    /// Approved once for this destination (see [`ask`]).
    once: Option<SocketAddr>,
}

struct Calls {
    shared: Shared,
    listener: OwnedFd,
    waiting: Vec<Waiting>,
    parked: VecDeque<Parked>,
    /// Calls waiting for a verdict (at most [`ask::MAX_ASKED`]).
    asked: Vec<AskedCall>,
    /// The one buffer data is copied into.
    buf: Vec<u8>,
    next_sweep: Option<Instant>,
    next_retry: Option<Instant>,
    /// When connects parked for a relay slot are tried again.
    next_relay_retry: Option<Instant>,
}

/// What [`Calls::start`] makes of a notification.
enum Start {
    Continue,
    Outcome(Outcome),
    /// Wait for a slot of this kind.
    Park(Kind, Option<Instant>),
    /// Wait for a verdict.
    Ask(Box<AskedCall>),
}

impl Calls {
    fn respond(&self, id: u64, result: Result<i64, i32>) {
        // Fails only when the caller is gone meanwhile.
        let _ = sysnet::notif_respond(&self.listener, id, result, false);
    }

    fn free(&self, kind: Kind) -> bool {
        let slots = match kind {
            Kind::Send => SEND_SLOTS,
            Kind::Connect => CONNECT_SLOTS,
        };
        self.waiting.iter().filter(|w| w.kind() == kind).count() < slots
    }

    /// Takes one notification: `since` is when it first arrived (a parked one keeps it,
    /// for the caller's `SO_SNDTIMEO`); `fresh`: it was not taken before (its decision is
    /// logged once, the first time); `once`: approved once for this destination.
    fn handle(&mut self, notif: Notif, since: Instant, fresh: bool, once: Option<SocketAddr>) {
        match self.start(&notif, since, fresh, once) {
            Start::Continue => {
                let _ = sysnet::notif_respond(&self.listener, notif.id, Ok(0), true);
            }
            Start::Park(kind, deadline) => self.parked.push_back(Parked {
                notif,
                kind,
                since,
                deadline,
                once,
            }),
            Start::Ask(asked) => self.asked.push(*asked),
            Start::Outcome(outcome) => self.settle(notif.id, outcome, since, once),
        }
    }

    fn settle(&mut self, id: u64, outcome: Outcome, since: Instant, once: Option<SocketAddr>) {
        match outcome {
            Outcome::Answer(result) => self.respond(id, result),
            Outcome::Gone => {}
            Outcome::Wait(w) if self.free(w.kind()) => {
                self.waiting.push(*w);
                self.next_sweep
                    .get_or_insert_with(|| Instant::now() + SWEEP);
            }
            // Only a send comes back without its slot checked first: answer what was sent,
            // or park it (nothing was sent, so it can start over).
            Outcome::Wait(w) => {
                let (notif, deadline) = (w.notif, w.deadline);
                match (*w).give_up(&self.shared, &self.listener) {
                    Outcome::Answer(Err(libc::EAGAIN)) => self.parked.push_back(Parked {
                        notif,
                        kind: Kind::Send,
                        since,
                        deadline,
                        once,
                    }),
                    other => self.settle(id, other, since, once),
                }
            }
        }
    }

    fn start(
        &mut self,
        notif: &Notif,
        since: Instant,
        fresh: bool,
        once: Option<SocketAddr>,
    ) -> Start {
        let tid = notif.pid as libc::pid_t;
        let fd = notif.args[0] as i32;
        let Ok(pidfd) = sysnet::pidfd_open(tid, true).or_else(|e| {
            // Before Linux 6.9 only a thread-group leader has a pidfd.
            if tgid(tid) == Some(tid) {
                sysnet::pidfd_open(tid, false)
            } else {
                Err(e)
            }
        }) else {
            return Start::Outcome(Outcome::Answer(Err(libc::EACCES)));
        };
        let sock = match inspect(&self.shared, &pidfd, fd) {
            Ok(s) => s,
            Err(errno) => return Start::Outcome(Outcome::Answer(Err(errno))),
        };
        let call = match read_call(tid, notif) {
            Ok(c) => c,
            Err(errno) => return Start::Outcome(Outcome::Answer(Err(errno))),
        };
        // The thread may have died and its id been reused while we read: only now are the
        // copies known to be the caller's.
        if !sysnet::notif_id_valid(&self.listener, notif.id) {
            return Start::Outcome(Outcome::Gone);
        }
        let Decided {
            mut action,
            dest,
            why,
        } = decide(&self.shared, &sock, &call, &|| single_threaded(tid));
        if let (Action::Ask, Some(dest)) = (&action, dest) {
            // The address is read again after the verdict: another thread of the caller
            // may have changed it meanwhile, so an approval once holds for what was asked.
            if once != Some(dest) {
                return self.ask(notif, since, tid, &sock, &call, dest, pidfd);
            }
            action = if sock.host {
                Action::Perform
            } else {
                Action::Replace
            };
        }
        let answered = why.as_ref().and_then(|w| w.name.clone());
        if fresh {
            audit(&self.shared, tid, &sock, &call, dest, why);
        }
        tracing::debug!(
            tid,
            host = sock.host,
            ?dest,
            ?action,
            nr = notif.nr,
            "net call"
        );
        let replace = match action {
            Action::Continue => return Start::Continue,
            // Only with a destination (above).
            Action::Ask => return Start::Outcome(Outcome::Answer(Err(libc::EACCES))),
            Action::Fail(errno) => {
                if errno == libc::EACCES {
                    record_denied(&self.shared, &call, &sock, dest);
                }
                return Start::Outcome(Outcome::Answer(Err(errno)));
            }
            Action::Perform => false,
            Action::Replace | Action::Relay => true,
        };
        // A blocking socket's SO_SNDTIMEO bounds a send's and a connect's wait, counted
        // from the call's arrival.
        let deadline = if sock.nonblocking {
            None
        } else {
            sysnet::send_timeout(&sock.file)
                .ok()
                .flatten()
                .map(|t| since + t)
        };
        let wait = !sock.nonblocking && deadline.is_none_or(|d| Instant::now() < d);
        let kind = match call {
            Call::Connect { .. } => Kind::Connect,
            Call::Send { .. } => Kind::Send,
        };
        // Only a stream connect can take long; it must find a slot before it starts (the
        // caller's own socket cannot be un-started).
        if wait && kind == Kind::Connect && sock.stream && !self.free(kind) {
            return Start::Park(kind, deadline);
        }
        let relay = match (&action, dest) {
            (Action::Relay, Some(dest)) => match self.relayed(tid, &sock, dest, answered, wait) {
                Some(r) => Some(r),
                // Every slot is taken: a blocking caller waits for one (the relay may only
                // lag behind closed connections), tried again every RELAY_RETRY.
                None if wait => {
                    self.next_relay_retry
                        .get_or_insert_with(|| Instant::now() + RELAY_RETRY);
                    return Start::Park(kind, deadline);
                }
                None => return Start::Outcome(Outcome::Answer(Err(libc::ENOBUFS))),
            },
            _ => None,
        };
        let job = Job {
            caller: Caller {
                shared: &self.shared,
                listener: &self.listener,
                notif,
            },
            pidfd,
            sock,
            deadline,
            wait,
        };
        Start::Outcome(match call {
            Call::Connect { addr } if replace => job.connect_replacement(&addr, relay),
            Call::Connect { addr } => job.connect_own(&addr),
            call @ Call::Send { .. } => match Send::new(call, &job.sock) {
                Ok(send) => job.send(send, replace, &mut self.buf),
                Err(errno) => Outcome::Answer(Err(errno)),
            },
        })
    }

    /// A relay slot for a connection to `dest`, or `None` when every slot is taken (logged
    /// as a refusal unless the caller will `wait` for one).
    fn relayed(
        &self,
        tid: libc::pid_t,
        sock: &Sock,
        dest: std::net::SocketAddr,
        answered: Option<String>,
        wait: bool,
    ) -> Option<Box<Relayed>> {
        let asker = self.shared.audit.as_ref().map(|_| Asker::of(tid));
        let Some(ticket) = self.shared.relay.reserve() else {
            if wait {
                return None;
            }
            let reason = format!("relay full ({RELAY_SLOTS} connections)");
            record_denied(
                &self.shared,
                &Call::Connect { addr: Vec::new() },
                sock,
                Some(dest),
            );
            if let Some(sink) = &self.shared.audit {
                let mut e = sink.event(EventKind::Connect, Decision::Denied, reason);
                e.protocol = Some(Protocol::Tcp);
                e.address = Some(lockbox_policy::canonical(dest.ip()));
                e.port = Some(dest.port());
                e.name = answered;
                e.pid = asker.as_ref().map(|a| a.pid);
                e.command = asker.map(|a| a.command);
                sink.emit(e);
            }
            return None;
        };
        Some(Box::new(Relayed {
            ticket: Some(ticket),
            dest,
            answered,
            pid: asker.as_ref().map(|a| a.pid),
            command: asker.map(|a| a.command),
        }))
    }

    /// Moves on the waiting calls: `ready[i]` is (socket ready, caller exited) for
    /// `waiting[i]`.
    fn progress(&mut self, ready: &[(bool, bool)]) {
        if !ready.iter().any(|&(r, e)| r || e) {
            return;
        }
        let mut freed = Vec::new();
        let waiting = std::mem::take(&mut self.waiting);
        for (w, &(ready, exited)) in waiting.into_iter().zip(ready) {
            let kind = w.kind();
            if exited {
                // Its thread exited: the notification went with it.
                freed.push(kind);
                continue;
            }
            if !ready {
                self.waiting.push(w);
                continue;
            }
            let id = w.notif.id;
            match w.progress(&self.shared, &self.listener, &mut self.buf) {
                Outcome::Wait(w) => self.waiting.push(*w),
                Outcome::Answer(result) => {
                    self.respond(id, result);
                    freed.push(kind);
                }
                Outcome::Gone => freed.push(kind),
            }
        }
        for kind in freed {
            self.unpark(kind);
        }
    }

    /// Starts parked calls of `kind` in order while a slot is free.
    fn unpark(&mut self, kind: Kind) {
        let mut tries = self.parked.len();
        while tries > 0 && self.free(kind) {
            tries -= 1;
            let Some(at) = self.parked.iter().position(|p| p.kind == kind) else {
                return;
            };
            if let Some(p) = self.parked.remove(at) {
                self.handle(p.notif, p.since, false, p.once);
            }
        }
    }

    /// Deadlines, the validity sweep, and the retry of parked sends.
    fn expire(&mut self, now: Instant) {
        self.expire_asked(now);
        if self
            .waiting
            .iter()
            .any(|w| w.deadline.is_some_and(|d| d <= now))
        {
            let mut freed = Vec::new();
            for w in std::mem::take(&mut self.waiting) {
                if w.deadline.is_some_and(|d| d <= now) {
                    let (id, kind) = (w.notif.id, w.kind());
                    match w.give_up(&self.shared, &self.listener) {
                        Outcome::Answer(result) => self.respond(id, result),
                        Outcome::Wait(_) | Outcome::Gone => {}
                    }
                    freed.push(kind);
                } else {
                    self.waiting.push(w);
                }
            }
            for kind in freed {
                self.unpark(kind);
            }
        }
        if self
            .parked
            .iter()
            .any(|p| p.deadline.is_some_and(|d| d <= now))
        {
            // Started now, they find their time up: a connect goes on in the background
            // (EINPROGRESS), a send that still finds no room gets EAGAIN.
            for p in std::mem::take(&mut self.parked) {
                if p.deadline.is_some_and(|d| d <= now) {
                    self.handle(p.notif, p.since, false, p.once);
                } else {
                    self.parked.push_back(p);
                }
            }
        }
        if self.next_sweep.is_some_and(|t| t <= now) {
            self.sweep();
            self.next_sweep =
                (!self.waiting.is_empty() || !self.parked.is_empty() || !self.asked.is_empty())
                    .then(|| now + SWEEP);
        }
        if self.parked.is_empty() {
            self.next_retry = None;
        } else if self.next_retry.is_none() {
            self.next_retry = Some(now + RETRY);
        } else if self.next_retry.is_some_and(|t| t <= now) {
            self.retry_parked();
            self.next_retry = (!self.parked.is_empty()).then(|| now + RETRY);
        }
        if self.next_relay_retry.is_some_and(|t| t <= now) {
            self.next_relay_retry = None;
            // Parked connects start over: those still without a slot park again.
            for p in std::mem::take(&mut self.parked) {
                if p.kind == Kind::Connect {
                    self.handle(p.notif, p.since, false, None);
                } else {
                    self.parked.push_back(p);
                }
            }
        }
        if self.next_sweep.is_none() && !(self.parked.is_empty() && self.asked.is_empty()) {
            self.next_sweep = Some(now + SWEEP);
        }
    }

    /// Drops waiting and parked calls whose notification is gone.
    fn sweep(&mut self) {
        let listener = &self.listener;
        let before = self.waiting.len();
        let mut freed = Vec::new();
        self.waiting.retain(|w| {
            let valid = sysnet::notif_id_valid(listener, w.notif.id);
            if !valid {
                freed.push(w.kind());
            }
            valid
        });
        debug_assert!(self.waiting.len() + freed.len() == before);
        self.parked
            .retain(|p| sysnet::notif_id_valid(listener, p.notif.id));
        let (valid, gone): (Vec<AskedCall>, Vec<AskedCall>) = std::mem::take(&mut self.asked)
            .into_iter()
            .partition(|a| sysnet::notif_id_valid(listener, a.notif.id));
        self.asked = valid;
        for a in gone {
            self.drop_asked(&a);
        }
        for kind in freed {
            self.unpark(kind);
        }
    }

    /// Tries the parked sends again: one whose socket has room now goes through even
    /// while every send slot is held by sends that never complete.
    fn retry_parked(&mut self) {
        for p in std::mem::take(&mut self.parked) {
            if p.kind == Kind::Send {
                self.handle(p.notif, p.since, false, p.once);
            } else {
                self.parked.push_back(p);
            }
        }
    }

    /// How long the loop may sleep: until the next deadline, sweep or retry.
    fn timeout(&self, now: Instant) -> libc::c_int {
        let next = self
            .waiting
            .iter()
            .filter_map(|w| w.deadline)
            .chain(self.parked.iter().filter_map(|p| p.deadline))
            .chain(self.asked.iter().map(|a| a.deadline))
            .chain(self.next_sweep)
            .chain(self.next_retry)
            .chain(self.next_relay_retry)
            .min();
        match next {
            None => -1,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis();
                // Round up, so the loop does not wake just before the time.
                libc::c_int::try_from(ms + 1).unwrap_or(libc::c_int::MAX)
            }
        }
    }
}

/// Approvals (`--net-ask`, see [`ask`]): asking, and what each end of a question does.
impl Calls {
    /// Poses the question for an unlisted `dest` and parks the call; denies it when
    /// [`ask::MAX_ASKED`] questions are pending already.
    #[allow(clippy::too_many_arguments)]
    fn ask(
        &mut self,
        notif: &Notif,
        since: Instant,
        tid: libc::pid_t,
        sock: &Sock,
        call: &Call,
        dest: SocketAddr,
        pidfd: OwnedFd,
    ) -> Start {
        let Some(desk) = &self.shared.ask else {
            return Start::Outcome(Outcome::Answer(Err(libc::EACCES)));
        };
        let asker = Asker::of(tid);
        let asking = Asking {
            kind: match call {
                Call::Connect { .. } => EventKind::Connect,
                Call::Send { .. } => EventKind::Send,
            },
            name: None,
            dest: Some(dest),
            protocol: if sock.stream {
                Protocol::Tcp
            } else {
                Protocol::Udp
            },
            pid: asker.pid,
            command: asker.command,
        };
        let Some((question, deadline)) = desk.pose(asking.clone()) else {
            let why = Why {
                allowed: false,
                reason: format!(
                    "not in the allow-list; {} questions pending",
                    ask::MAX_ASKED
                ),
                name: None,
            };
            audit(&self.shared, tid, sock, call, Some(dest), Some(why));
            record_denied(&self.shared, call, sock, Some(dest));
            return Start::Outcome(Outcome::Answer(Err(libc::EACCES)));
        };
        if let Some(sink) = &self.shared.audit {
            let reason = "not in the allow-list; asked".to_owned();
            sink.emit(ask::event(sink, &question, Decision::Asked, reason));
        }
        self.next_sweep
            .get_or_insert_with(|| Instant::now() + SWEEP);
        Start::Ask(Box::new(AskedCall {
            notif: *notif,
            since,
            pidfd,
            question,
            deadline,
            dest,
        }))
    }

    /// Logs a settled question.
    fn log(&self, a: &AskedCall, allowed: bool, reason: String) {
        if let Some(sink) = &self.shared.audit {
            let decision = if allowed {
                Decision::Allowed
            } else {
                Decision::Denied
            };
            sink.emit(ask::event(sink, &a.question, decision, reason));
        }
    }

    /// Acts on question `id`'s verdict; false if it is not a call's (a DNS query's).
    fn answered(&mut self, id: u64, verdict: Verdict, by: &str) -> bool {
        let Some(at) = self.asked.iter().position(|a| a.question.id == id) else {
            return false;
        };
        let a = self.asked.swap_remove(at);
        self.log(&a, verdict != Verdict::Deny, ask::reason(verdict, by));
        match verdict {
            Verdict::Deny => {
                super::decide::record_denied_line(&self.shared, a.line());
                self.respond(a.notif.id, Err(libc::EACCES));
            }
            // Started over: read and decided again, now with the approval.
            Verdict::Once => self.handle(a.notif, a.since, false, Some(a.dest)),
            Verdict::Sandbox => self.handle(a.notif, a.since, false, None),
        }
        true
    }

    /// Drops the asked calls whose caller exited (`gone[i]` for `asked[i]`).
    fn callers_gone(&mut self, gone: &[bool]) {
        if !gone.iter().any(|g| *g) {
            return;
        }
        let asked = std::mem::take(&mut self.asked);
        for (a, &gone) in asked
            .into_iter()
            .zip(gone.iter().chain(std::iter::repeat(&false)))
        {
            if gone {
                self.drop_asked(&a);
            } else {
                self.asked.push(a);
            }
        }
    }

    /// Takes a call whose caller is gone off the desk.
    fn drop_asked(&self, a: &AskedCall) {
        if let Some(desk) = &self.shared.ask {
            desk.withdraw(a.question.id);
        }
        self.log(a, false, "the caller went away while asked".into());
    }

    /// The supervisor ends: the calls still asked are logged as gone with the sandbox.
    fn end_asked(&mut self) {
        for a in std::mem::take(&mut self.asked) {
            if let Some(desk) = &self.shared.ask {
                desk.withdraw(a.question.id);
            }
            self.log(&a, false, "the sandbox ended while asked".into());
        }
    }

    /// Denies the asked calls whose time is up.
    fn expire_asked(&mut self, now: Instant) {
        if !self.asked.iter().any(|a| a.deadline <= now) {
            return;
        }
        let Some(desk) = self.shared.ask.clone() else {
            return;
        };
        for a in std::mem::take(&mut self.asked) {
            if a.deadline > now {
                self.asked.push(a);
                continue;
            }
            desk.withdraw(a.question.id);
            self.log(&a, false, ask::timeout_reason(desk.timeout()));
            super::decide::record_denied_line(&self.shared, a.line());
            self.respond(a.notif.id, Err(libc::EACCES));
        }
    }
}
