//! The messages between `lockbox run` and the pre-arm helper: one JSON object per seqpacket
//! record, with descriptors attached where a message says so.

use lockbox_confine::{Outcome, Status};
use lockbox_policy::Policy;
use rustix::net::{self, RecvAncillaryBuffer, RecvAncillaryMessage, SendAncillaryBuffer};
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;

/// The largest record either side sends (a policy is a few KiB). Below glibc's threshold
/// for a mapping of its own: a receive buffer then takes no `mmap`, which would wait for
/// the helper's memory map while its armer forks it.
pub(crate) const MAX_RECORD: usize = 64 * 1024;

/// The most descriptors a record carries: stdin, stdout, stderr and the command.
const MAX_FDS: usize = 4;

/// What `lockbox run` (or `lockbox pre-arm`) asks the helper.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Request {
    /// Run a command in a spare of this policy. Carries four descriptors: stdin, stdout,
    /// stderr and the command ([`lockbox_confine::ArmedCommand`]).
    Run(Box<RunRequest>),
    /// While it runs: send this signal to the command (as a direct start forwards it).
    Signal(i32),
    /// While it runs: stop the sandbox (SIGTERM, then SIGKILL after the policy's grace).
    Terminate,
    /// While it runs: pause every process of the sandbox (the caller's terminal said
    /// Ctrl-Z, which stops the caller).
    Suspend,
    /// While it runs: resume what [`Request::Suspend`] paused (the caller was continued).
    Resume,
    /// The helper's state.
    Status,
    /// End the helper: no run is handed to it from now on, its spares go, runs in progress
    /// finish first.
    Shutdown,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RunRequest {
    /// The policy, as `lockbox run` resolved it.
    pub policy: Policy,
    /// The caller's current directory (the default working directory inside).
    pub cwd: PathBuf,
    /// The program (argv\[0\]), for messages.
    pub program: String,
    /// The caller's scheduling, which a direct start's command would inherit: a spare made
    /// with another is not used.
    pub scheduling: lockbox_confine::Scheduling,
}

/// What the helper answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    /// No spare for this policy (one is being armed): start directly. Nothing ran.
    Miss(String),
    /// The command ran in a spare, starting in `cwd`, and its sandbox has ended. (Nothing is
    /// said when it starts: a short run's caller would wake for it while the command starts.)
    Ran {
        ended: Ended,
        cwd: PathBuf,
    },
    /// The sandbox could not be set up, as a direct start would say it.
    Failed {
        message: String,
        hint: Option<String>,
    },
    Status(StatusReport),
    /// Shutdown is under way.
    Stopping,
}

/// How a run ended: what `lockbox run` explains, reports and exits with, whether the
/// sandbox was started directly or by the helper.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ended {
    pub status: EndStatus,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub exit_code: i32,
    /// `lockbox run`'s JSON report of the outcome (README.md, "A short tour"), without a branch's part.
    pub report: serde_json::Value,
    /// It ran in a sandbox the pre-arm helper had armed.
    pub pre_armed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EndStatus {
    Exited(i32),
    Signaled(i32),
    ExecFailed(i32),
}

impl Ended {
    pub(crate) fn of(outcome: &Outcome) -> Ended {
        Ended {
            status: match outcome.status {
                Status::Exited(c) => EndStatus::Exited(c),
                Status::Signaled(s) => EndStatus::Signaled(s),
                Status::ExecFailed(e) => EndStatus::ExecFailed(e),
            },
            timed_out: outcome.timed_out,
            oom_killed: outcome.oom_killed,
            exit_code: outcome.exit_code(),
            report: crate::commands::run::report(outcome),
            pre_armed: false,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StatusReport {
    pub pid: u32,
    pub socket: PathBuf,
    /// Spares kept per policy.
    pub spares_per_policy: usize,
    /// The most policies kept.
    pub max_policies: usize,
    /// Seconds without a request after which the helper exits.
    pub idle_exit_s: u64,
    pub runs_in_progress: usize,
    pub runs_handed_over: u64,
    pub misses: u64,
    pub policies: Vec<PolicyStatus>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PolicyStatus {
    pub cwd: PathBuf,
    /// What tells the policy apart (the first line of its JSON, shortened).
    pub policy: String,
    pub spares: usize,
    pub last_used_s_ago: u64,
}

/// Sends `message` with `fds` attached.
pub(crate) fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    message: &T,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    send_encoded(sock, &encode(message)?, fds)
}

/// `message` as it goes on the wire; an error for one above [`MAX_RECORD`].
pub(crate) fn encode<T: Serialize>(message: &T) -> std::io::Result<Vec<u8>> {
    let bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    if bytes.len() > MAX_RECORD {
        return Err(std::io::Error::other("message too large"));
    }
    Ok(bytes)
}

/// Sends a message [`encode`]d before, with `fds` attached.
pub(crate) fn send_encoded(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(net::SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors"));
    }
    net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        net::SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one message and the descriptors attached; `None` at the end of the connection.
pub(crate) fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<(T, Vec<OwnedFd>)>> {
    recv_with(sock, net::RecvFlags::CMSG_CLOEXEC)
}

/// [`recv`], but an error (`WouldBlock`) rather than a wait when nothing has come yet.
pub(crate) fn try_recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<(T, Vec<OwnedFd>)>> {
    recv_with(
        sock,
        net::RecvFlags::CMSG_CLOEXEC | net::RecvFlags::DONTWAIT,
    )
}

fn recv_with<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
    flags: net::RecvFlags,
) -> std::io::Result<Option<(T, Vec<OwnedFd>)>> {
    // The record's length first (a peek, nothing taken): a buffer of that size, not of
    // the largest record's, is one page to zero and fault in rather than sixteen — at the
    // end of a pre-armed run, in the `lockbox run` the caller waits for.
    let peek = net::RecvFlags::PEEK | net::RecvFlags::TRUNC | (flags & net::RecvFlags::DONTWAIT);
    let len = loop {
        match net::recv(sock, &mut [] as &mut [u8], peek) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?.1,
        }
    };
    let mut buf = vec![0u8; len.clamp(1, MAX_RECORD)];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match net::recvmsg(sock, &mut [IoSliceMut::new(&mut buf)], &mut control, flags) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    if got.flags.contains(net::ReturnFlags::TRUNC) {
        return Err(std::io::Error::other("message too large"));
    }
    let message = serde_json::from_slice(&buf[..got.bytes]).map_err(std::io::Error::other)?;
    Ok(Some((message, fds)))
}
