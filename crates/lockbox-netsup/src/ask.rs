//! Approvals (`--net-ask`): under an allow-list, a call or DNS query towards an unlisted
//! destination is not refused at once but *asked*. [`Approvals`] is the desk the supervisor
//! and whoever decides (a terminal prompt, an HTTP resource, a Python callback) share:
//!
//! - the supervisor poses a [`Question`] ([`Approvals::pose`], at most [`MAX_ASKED`]
//!   pending; beyond that the call is denied with a reason) and parks the call, as it parks
//!   calls waiting for room (`serve.rs`): the supervisor goes on serving every other call;
//! - the owner waits for questions ([`Approvals::next`]), lists them
//!   ([`Approvals::pending`]) and answers one ([`Approvals::decide`]) with a [`Verdict`];
//!   deciding wakes the supervisor's poll loop through a socket pair;
//! - a question nobody answers within [`Approvals::timeout`] is denied; one whose caller
//!   dies meanwhile is dropped. Either way it leaves the desk: deciding it then is
//!   [`DecideError::Unknown`].
//!
//! What a verdict allows: [`Verdict::Once`] this one call (or this one query's answer);
//! [`Verdict::Sandbox`] this destination for the rest of the sandbox's life: the same
//! protocol, address and port (a connect or send), or the same name (a DNS query). A name
//! approved in DNS is *answered*, but its addresses are not thereby allowed: the connection
//! that follows is asked on its own (the question names the name it was answered for).
//! Every question thus allows exactly what it shows.
//!
//! No async runtime: a mutex, a condition variable and a socket pair.

use super::audit::{EventKind, Protocol};
use lockbox_policy::time::now_rfc3339;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Questions pending at once; a call asked beyond this is denied ("too many questions").
pub const MAX_ASKED: usize = 64;
/// Destinations and names approved for the sandbox that are remembered (oldest forgotten).
pub const MAX_APPROVED: usize = 1024;
/// Decided question ids remembered, so deciding one twice says so ([`DecideError::Decided`]).
const MAX_DECIDED: usize = 1024;
/// Addresses remembered with the asked name they were answered for.
const MAX_ANSWERED: usize = 256;
/// The default time a question waits for its answer.
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(30);

/// One question: may this process reach this destination?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Question {
    /// The question's id, unique in its sandbox (from 1).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub id: u64,
    /// When it was asked, RFC 3339 UTC.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub ts: String,
    /// `connect`, `send` or `dns`.
    #[cfg_attr(feature = "openapi", schema(schema_with = question_kind))]
    pub kind: EventKind,
    /// The name asked (dns), or the name an approved DNS answer gave this address for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub name: Option<String>,
    /// The destination address (connect, send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, nullable = false))]
    pub address: Option<IpAddr>,
    /// The destination port (connect, send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 65535, nullable = false))]
    pub port: Option<u16>,
    /// TCP or UDP.
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub protocol: Protocol,
    /// The asking process, as the caller of lockbox sees it (0: not found).
    pub pid: u32,
    /// Its command line (at most [`super::MAX_COMMAND`] bytes).
    pub command: String,
    /// Milliseconds it waits for an answer, from `ts`; then it is denied.
    pub timeout_ms: u64,
}

/// What a question is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = DecisionName))]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Allow this call (or this query's answer) only.
    Once,
    /// Allow this destination (or name) for the rest of the sandbox's life.
    Sandbox,
    /// Refuse it.
    Deny,
}

impl Verdict {
    /// The wire name: `once`, `sandbox`, `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Once => "once",
            Verdict::Sandbox => "sandbox",
            Verdict::Deny => "deny",
        }
    }

    /// Parses a wire name.
    pub fn parse(text: &str) -> Option<Verdict> {
        match text {
            "once" => Some(Verdict::Once),
            "sandbox" => Some(Verdict::Sandbox),
            "deny" => Some(Verdict::Deny),
            _ => None,
        }
    }
}

/// Why [`Approvals::decide`] did not take a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecideError {
    /// No such question pending: never asked, timed out, or its caller is gone.
    #[error("question {id}: not pending (unknown, timed out, or its caller is gone)")]
    Unknown {
        /// The question's id.
        id: u64,
    },
    /// The question was decided already.
    #[error("question {id}: already decided")]
    Decided {
        /// The question's id.
        id: u64,
    },
}

/// A destination approved for the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Approved {
    Dest(Protocol, SocketAddr),
    Name(String),
}

#[derive(Debug)]
struct Pending {
    question: Question,
    /// The verdict and who gave it, once decided (until the supervisor takes it).
    verdict: Option<(Verdict, String)>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    pending: BTreeMap<u64, Pending>,
    decided: VecDeque<u64>,
    approved: VecDeque<Approved>,
    /// Addresses answered for names approved in DNS (for the connect question's name).
    answered: VecDeque<(IpAddr, String)>,
    /// The supervisor is gone: nothing more will be asked.
    closed: bool,
}

#[derive(Debug)]
struct Desk {
    state: Mutex<State>,
    asked: Condvar,
    timeout: Duration,
    /// Written by [`Approvals::decide`], polled by the supervisor.
    wake_tx: UnixStream,
    wake_rx: UnixStream,
}

/// The approvals desk of one sandbox (cheap to clone: every clone is the same desk). Give
/// one to `lockbox_confine::Spawn::ask`; keep one to answer.
#[derive(Debug, Clone)]
pub struct Approvals {
    desk: Arc<Desk>,
}

/// A new question's fields (all but the id, time and timeout, which the desk gives).
#[derive(Debug, Clone)]
pub(super) struct Asking {
    pub(super) kind: EventKind,
    pub(super) name: Option<String>,
    pub(super) dest: Option<SocketAddr>,
    pub(super) protocol: Protocol,
    pub(super) pid: u32,
    pub(super) command: String,
}

impl Approvals {
    /// A desk whose questions are denied after `timeout` without an answer.
    pub fn new(timeout: Duration) -> std::io::Result<Approvals> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        Ok(Approvals {
            desk: Arc::new(Desk {
                state: Mutex::default(),
                asked: Condvar::new(),
                timeout,
                wake_tx,
                wake_rx,
            }),
        })
    }

    /// How long a question waits for its answer.
    pub fn timeout(&self) -> Duration {
        self.desk.timeout
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind: go on with it.
        self.desk
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The questions waiting for a verdict, oldest first.
    pub fn pending(&self) -> Vec<Question> {
        self.state()
            .pending
            .values()
            .filter(|p| p.verdict.is_none())
            .map(|p| p.question.clone())
            .collect()
    }

    /// The first undecided question with an id above `after`, waiting up to `wait` for one
    /// to be asked; `None` when there is none by then, or the supervisor has ended
    /// ([`Approvals::closed`]).
    pub fn next(&self, after: u64, wait: Duration) -> Option<Question> {
        let until = Instant::now() + wait;
        let mut state = self.state();
        loop {
            let found = state
                .pending
                .range(after.saturating_add(1)..)
                .find(|(_, p)| p.verdict.is_none())
                .map(|(_, p)| p.question.clone());
            if found.is_some() || state.closed {
                return found;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            state = match self.desk.asked.wait_timeout(state, left) {
                Ok((s, _)) => s,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Whether the sandbox's supervisor has ended (no question will be asked again).
    pub fn closed(&self) -> bool {
        self.state().closed
    }

    /// Answers question `id`; `by` names who decided, for the log ("denied by `by`").
    /// [`Verdict::Sandbox`] also answers the other pending questions about the same
    /// destination or name (a lookup's `A` and `AAAA` queries, say).
    pub fn decide(&self, id: u64, verdict: Verdict, by: &str) -> Result<(), DecideError> {
        {
            let mut state = self.state();
            let decided = state.decided.contains(&id);
            let key = match state.pending.get_mut(&id) {
                Some(p) if p.verdict.is_none() => {
                    p.verdict = Some((verdict, by.to_owned()));
                    approval_of(&p.question)
                }
                Some(_) => return Err(DecideError::Decided { id }),
                None if decided => return Err(DecideError::Decided { id }),
                None => return Err(DecideError::Unknown { id }),
            };
            if let (Verdict::Sandbox, Some(key)) = (verdict, key) {
                for p in state.pending.values_mut() {
                    if p.verdict.is_none() && approval_of(&p.question).as_ref() == Some(&key) {
                        p.verdict = Some((verdict, by.to_owned()));
                    }
                }
            }
        }
        // A full socket already says there is something to take.
        let _ = (&self.desk.wake_tx).write(&[1]);
        Ok(())
    }

    // ---- The supervisor's side. ----

    /// The descriptor the supervisor polls: readable when a verdict is waiting.
    pub(super) fn wake_fd(&self) -> RawFd {
        self.desk.wake_rx.as_raw_fd()
    }

    /// Poses a question; returns it with its deadline, or `None` when [`MAX_ASKED`] are
    /// pending (deny the call).
    pub(super) fn pose(&self, asking: Asking) -> Option<(Question, Instant)> {
        let mut state = self.state();
        if state.closed || state.pending.len() >= MAX_ASKED {
            return None;
        }
        state.next_id += 1;
        let id = state.next_id;
        let name = asking.name.or_else(|| {
            let ip = asking.dest?.ip();
            state
                .answered
                .iter()
                .rev()
                .find(|(a, _)| *a == ip)
                .map(|(_, n)| n.clone())
        });
        let question = Question {
            id,
            ts: now_rfc3339(),
            kind: asking.kind,
            name,
            address: asking.dest.map(|d| lockbox_policy::canonical(d.ip())),
            port: asking.dest.map(|d| d.port()),
            protocol: asking.protocol,
            pid: asking.pid,
            command: asking.command,
            timeout_ms: u64::try_from(self.desk.timeout.as_millis()).unwrap_or(u64::MAX),
        };
        state.pending.insert(
            id,
            Pending {
                question: question.clone(),
                verdict: None,
            },
        );
        drop(state);
        self.desk.asked.notify_all();
        Some((question, Instant::now() + self.desk.timeout))
    }

    /// Takes the verdicts given since the last call: (question, verdict, who).
    pub(super) fn take_verdicts(&self) -> Vec<(u64, Verdict, String)> {
        let mut sink = [0u8; 64];
        while matches!((&self.desk.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
        let mut state = self.state();
        let ids: Vec<u64> = state
            .pending
            .iter()
            .filter(|(_, p)| p.verdict.is_some())
            .map(|(id, _)| *id)
            .collect();
        let mut out = Vec::new();
        for id in ids {
            let Some(p) = state.pending.remove(&id) else {
                continue;
            };
            let Some((verdict, by)) = p.verdict else {
                continue;
            };
            if verdict == Verdict::Sandbox {
                if let Some(a) = approval_of(&p.question) {
                    push_bounded(&mut state.approved, a, MAX_APPROVED);
                }
            }
            push_bounded(&mut state.decided, id, MAX_DECIDED);
            out.push((id, verdict, by));
        }
        out
    }

    /// Takes question `id` off the desk without a verdict (timed out, caller gone).
    pub(super) fn withdraw(&self, id: u64) {
        self.state().pending.remove(&id);
    }

    /// Whether `dest` was approved for the sandbox.
    pub(super) fn dest_approved(&self, protocol: Protocol, dest: SocketAddr) -> bool {
        let dest = SocketAddr::new(lockbox_policy::canonical(dest.ip()), dest.port());
        self.state()
            .approved
            .contains(&Approved::Dest(protocol, dest))
    }

    /// Whether the (normalised) name was approved for the sandbox.
    pub(super) fn name_approved(&self, name: &str) -> bool {
        self.state()
            .approved
            .iter()
            .any(|a| matches!(a, Approved::Name(n) if n == name))
    }

    /// Remembers the addresses answered for an approved name.
    pub(super) fn answered(&self, name: &str, addrs: &[IpAddr]) {
        let mut state = self.state();
        for ip in addrs {
            push_bounded(&mut state.answered, (*ip, name.to_owned()), MAX_ANSWERED);
        }
    }

    /// The supervisor ends: every question left is gone, and waiters are woken.
    pub(super) fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        state.pending.clear();
        drop(state);
        self.desk.asked.notify_all();
    }
}

/// The event about question `q` (asked, or settled), for the audit log.
pub(super) fn event(
    sink: &super::AuditSink,
    q: &Question,
    decision: super::Decision,
    reason: String,
) -> super::NetEvent {
    let mut e = sink.event(q.kind, decision, reason);
    e.protocol = Some(q.protocol);
    e.address = q.address;
    e.port = q.port;
    e.name = q.name.clone();
    e.pid = Some(q.pid);
    e.command = Some(q.command.clone());
    e.question = Some(q.id);
    e
}

/// A call waiting for its question's verdict.
pub(super) struct AskedCall {
    pub(super) notif: crate::sys::Notif,
    /// When the call first arrived.
    pub(super) since: Instant,
    /// The caller's pidfd: readable when it exits (the call is then dropped).
    pub(super) pidfd: std::os::fd::OwnedFd,
    pub(super) question: Question,
    pub(super) deadline: Instant,
    /// What was asked (an approval once holds for this destination only).
    pub(super) dest: SocketAddr,
}

impl AskedCall {
    /// The call as the run report lists refusals (`connect tcp 198.18.0.1:80`).
    pub(super) fn line(&self) -> String {
        let kind = match self.question.kind {
            EventKind::Send => "send",
            _ => "connect",
        };
        let proto = match self.question.protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        };
        format!("{kind} {proto} {}", self.dest)
    }
}

/// What approving question `q` for the sandbox approves.
fn approval_of(q: &Question) -> Option<Approved> {
    match (q.kind, q.address, q.port) {
        (EventKind::Dns, _, _) => q.name.clone().map(Approved::Name),
        (_, Some(ip), Some(port)) => Some(Approved::Dest(q.protocol, SocketAddr::new(ip, port))),
        _ => None,
    }
}

fn push_bounded<T: PartialEq>(queue: &mut VecDeque<T>, item: T, cap: usize) {
    if queue.contains(&item) {
        return;
    }
    if queue.len() >= cap {
        queue.pop_front();
    }
    queue.push_back(item);
}

/// The reason logged for an answered question.
pub(super) fn reason(verdict: Verdict, by: &str) -> String {
    match verdict {
        Verdict::Once => "approved once".into(),
        Verdict::Sandbox => "approved for the sandbox".into(),
        Verdict::Deny => format!("denied by {by}"),
    }
}

/// The reason logged for a question that timed out.
pub(super) fn timeout_reason(timeout: Duration) -> String {
    let ms = timeout.as_millis();
    if ms % 1000 == 0 {
        format!("no answer in {} s", ms / 1000)
    } else {
        format!("no answer in {ms} ms")
    }
}

/// A question's `kind`: only the calls that are asked about.
#[cfg(feature = "openapi")]
fn question_kind() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(["connect", "send", "dns"]))
        .description(Some("`connect`, `send` or `dns`."))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(port: u16) -> Asking {
        Asking {
            kind: EventKind::Connect,
            name: None,
            dest: Some(SocketAddr::from(([198, 18, 0, 1], port))),
            protocol: Protocol::Tcp,
            pid: 1,
            command: "x".into(),
        }
    }

    #[test]
    fn questions_beyond_the_cap_are_not_posed() {
        let desk = Approvals::new(Duration::from_secs(1)).unwrap();
        for i in 0..MAX_ASKED {
            assert!(desk.pose(asking(i as u16)).is_some());
        }
        assert!(desk.pose(asking(9)).is_none());
        assert_eq!(desk.pending().len(), MAX_ASKED);
    }

    #[test]
    fn a_question_is_decided_once_and_withdrawn_ones_are_unknown() {
        let desk = Approvals::new(Duration::from_secs(1)).unwrap();
        let a = desk.pose(asking(1)).unwrap().0.id;
        let b = desk.pose(asking(2)).unwrap().0.id;
        // Asked again about the same destination meanwhile: settled by `a`'s verdict.
        let a2 = desk.pose(asking(1)).unwrap().0.id;
        assert_eq!(desk.next(0, Duration::ZERO).map(|q| q.id), Some(a));
        assert_eq!(desk.next(a, Duration::ZERO).map(|q| q.id), Some(b));
        desk.decide(a, Verdict::Sandbox, "t").unwrap();
        assert_eq!(
            desk.decide(a, Verdict::Deny, "t"),
            Err(DecideError::Decided { id: a })
        );
        assert_eq!(desk.pending().len(), 1);
        assert_eq!(
            desk.take_verdicts(),
            vec![
                (a, Verdict::Sandbox, "t".into()),
                (a2, Verdict::Sandbox, "t".into())
            ]
        );
        assert_eq!(
            desk.decide(a, Verdict::Deny, "t"),
            Err(DecideError::Decided { id: a })
        );
        assert!(desk.dest_approved(Protocol::Tcp, SocketAddr::from(([198, 18, 0, 1], 1))));
        assert!(!desk.dest_approved(Protocol::Udp, SocketAddr::from(([198, 18, 0, 1], 1))));
        desk.withdraw(b);
        assert_eq!(
            desk.decide(b, Verdict::Once, "t"),
            Err(DecideError::Unknown { id: b })
        );
        assert_eq!(
            desk.decide(99, Verdict::Once, "t"),
            Err(DecideError::Unknown { id: 99 })
        );
        desk.close();
        assert!(desk.next(0, Duration::from_secs(5)).is_none());
    }

    #[test]
    fn timeouts_read_in_seconds_or_milliseconds() {
        assert_eq!(timeout_reason(Duration::from_secs(30)), "no answer in 30 s");
        assert_eq!(
            timeout_reason(Duration::from_millis(1500)),
            "no answer in 1500 ms"
        );
    }
}
