//! The messages between the runtime and the agent: one JSON document per `SOCK_SEQPACKET`
//! record, descriptors attached with `SCM_RIGHTS`. The runtime sends [`Request`]s; the agent
//! sends [`Message`]s: a [`Reply`] to each request (same `id`) and an [`Message::Exit`]
//! when a command it started has ended.
//!
//! The contract is versioned: [`Op::Hello`], the first request, is answered with
//! [`Body::Hello`] carrying the agent's [`PROTOCOL_VERSION`], and [`check_hello`] refuses
//! an agent of another version. A change that an older peer would misread (a renamed or
//! removed field, a new required one, a changed meaning) bumps the version; a new
//! operation or an optional field with a default does not need to, though a runtime that
//! relies on it should.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::ProtocolError;

/// The version of this protocol, sent in [`Body::Hello`].
pub const PROTOCOL_VERSION: u32 = 2;

/// A request to the agent. Replies carry the same `id`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the caller; echoed in the [`Reply`].
    pub id: u64,
    /// What to do.
    pub op: Op,
}

/// The operations of the agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Replies [`Body::Hello`]: the agent's protocol version, pid and working directory.
    Hello,
    /// Starts a command under a subreaper shim; replies [`Body::Spawned`] with descriptors
    /// (see [`Io`]).
    Spawn(SpawnSpec),
    /// Sends `signal` to every live process of the tree of `pid` (a pid from
    /// [`Body::Spawned`]): the command and everything it started, however detached.
    Signal {
        /// The command's pid.
        pid: i32,
        /// The signal number.
        signal: i32,
        /// Leave the command itself alone (a session's shell).
        spare_main: bool,
    },
    /// SIGKILLs the tree of `pid` until nothing of it is left alive; replies when done.
    KillTree {
        /// The command's pid.
        pid: i32,
        /// Leave the command itself alone (a session's shell).
        spare_main: bool,
    },
    /// Copies of the runtime's ends of a session's pipes ([`Io::Session`], which the agent
    /// keeps while the shell lives), in the order [`Op::Spawn`] gave them; replies
    /// [`Body::Done`]. The runtime closes its own while the session is idle, so that a
    /// sandbox's idle sessions hold no descriptors in the runtime.
    SessionPipes {
        /// The shell's pid.
        pid: i32,
    },
    /// Opens a regular file for reading; replies [`Body::Opened`] with the descriptor, or
    /// with a copy of what a file without a size (`/proc`, `/sys`) gave when read here.
    Open {
        /// Path inside the sandbox (absolute, or relative to the working directory).
        path: String,
        /// The most bytes the caller takes from a file without a size: one more is copied,
        /// so that it can tell a file giving more.
        max_unsized: u64,
    },
    /// Creates a temporary file beside `path` for an atomic write; replies
    /// [`Body::WriteStarted`] with its descriptor. Finish with [`Op::WriteEnd`].
    WriteBegin {
        /// The final path.
        path: String,
        /// Permission bits.
        mode: u32,
        /// Create missing parent directories.
        create_parents: bool,
        /// Extended attributes set on the temporary file (names in the `user.` namespace),
        /// so that the file has them from the moment it is in place.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        xattrs: BTreeMap<String, String>,
    },
    /// Renames the temporary file over its path (`commit`) or removes it; replies
    /// [`Body::Stat`] (or [`Body::Done`]).
    WriteEnd {
        /// From [`Body::WriteStarted`].
        token: u64,
        /// Rename into place (true) or discard.
        commit: bool,
    },
    /// Replies [`Body::Stat`] (symlinks not followed).
    Stat {
        /// The path.
        path: String,
    },
    /// Lists a directory into a memfd of JSON lines ([`EntryStat`]); replies
    /// [`Body::Listed`] with the memfd.
    List {
        /// The directory.
        path: String,
        /// Descend into subdirectories (never through symlinks).
        recursive: bool,
        /// Include names starting with `.`.
        hidden: bool,
    },
    /// Creates a directory; replies [`Body::Stat`].
    Mkdir {
        /// The path.
        path: String,
        /// Create missing parents; an existing directory is fine.
        parents: bool,
    },
    /// Removes a file, symlink or (with `recursive`, or if empty) a directory.
    Remove {
        /// The path.
        path: String,
        /// Remove a directory's contents too.
        recursive: bool,
    },
    /// Renames `from` to `to`; replies [`Body::Stat`] of `to`.
    Rename {
        /// Source.
        from: String,
        /// Destination.
        to: String,
        /// Replace an existing destination.
        overwrite: bool,
    },
    /// Connects a TCP socket to `127.0.0.1:port` (or `[::1]:port` when that is refused)
    /// in the sandbox's network namespace; replies [`Body::Connected`] with the connected
    /// socket. Refused on both: `ECONNREFUSED` (nothing listens on the port).
    Connect {
        /// The port inside the sandbox (1-65535).
        port: u16,
    },
    /// Starts watching `path` (inotify); replies [`Body::Watching`]. Its events come as
    /// [`Message::WatchEvents`] until [`Op::Unwatch`].
    Watch {
        /// Chosen by the runtime (so it can take events before the reply); unique per agent.
        watch: u64,
        /// The file or directory.
        path: String,
        /// Watch every directory below too (and those created later).
        recursive: bool,
    },
    /// Stops a watch; replies [`Body::Done`] (also for an unknown id).
    Unwatch {
        /// From [`Op::Watch`].
        watch: u64,
    },
    /// Starts a code context's runner (see [`crate::contexts`]) under a subreaper shim with
    /// [`Io::Runner`] descriptors; replies [`Body::Spawned`]. Its end is an
    /// [`Message::Exit`] like any command's; signal and kill it with [`Op::Signal`] and
    /// [`Op::KillTree`].
    ContextStart(crate::contexts::ContextSpec),
}

/// How to start a command.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnSpec {
    /// The command (PATH searched).
    pub argv: Vec<String>,
    /// Working directory (default: the agent's).
    pub cwd: Option<String>,
    /// Start from an empty environment instead of the agent's.
    pub env_clear: bool,
    /// Variables to set.
    pub env: Vec<(String, String)>,
    /// Its standard descriptors.
    pub io: Io,
}

/// The descriptors of a spawned command, and those sent back (in this order).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Io {
    /// stdin from a pipe (`stdin: true`; its write end is sent first) or `/dev/null`;
    /// stdout and stderr to pipes whose read ends are sent next.
    Pipes {
        /// Keep stdin as a pipe.
        stdin: bool,
    },
    /// A new PTY of this size in the sandbox's devpts is the controlling terminal and
    /// stdio; the master is sent.
    Pty {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// A session shell: fd 0 `/dev/null`, 1 stdout, 2 stderr, 3 status (write), 4 stdin
    /// data (read), 5 script (read). Sent: stdout, stderr and status read ends, then the
    /// data and script write ends.
    Session,
    /// A code context's runner: fd 0 `/dev/null`, 1 stdout, 2 stderr, 3 events (write),
    /// 4 requests (read). Sent: stdout, stderr and events read ends, then the requests
    /// write end.
    Runner,
}

/// A reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// The request's id.
    pub id: u64,
    /// What happened.
    pub result: Result<Body, AgentError>,
}

/// A successful reply's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Body {
    /// Nothing to say.
    Done,
    /// See [`Op::Hello`].
    Hello {
        /// The agent's pid in the sandbox.
        pid: i32,
        /// Its working directory (the sandbox's).
        cwd: String,
        /// Its [`PROTOCOL_VERSION`]; absent (0) from agents that predate versioning.
        #[serde(default)]
        protocol: u32,
    },
    /// The command runs with this pid.
    Spawned {
        /// The command's pid in the sandbox.
        pid: i32,
    },
    /// A file opened for reading.
    Opened {
        /// Its size, or the bytes copied.
        size: u64,
        /// The descriptor is a copy of a file without a size, read inside the sandbox.
        #[serde(default)]
        copied: bool,
    },
    /// A temporary file for [`Op::WriteBegin`].
    WriteStarted {
        /// For [`Op::WriteEnd`].
        token: u64,
    },
    /// An entry.
    Stat(EntryStat),
    /// The memfd holds this many JSON lines.
    Listed {
        /// Entries.
        count: u64,
    },
    /// The socket of [`Op::Connect`] is attached.
    Connected {
        /// The address it connected to, as the sandbox sees it (`127.0.0.1:8000`).
        peer: String,
    },
    /// A watch started ([`Op::Watch`]).
    Watching {
        /// The watched path as the sandbox sees it (absolute).
        path: String,
        /// Whether it is a directory.
        is_dir: bool,
    },
}

/// A failure, with the `errno` that explains it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentError {
    /// The errno (`EXDEV` = the path would leave the sandbox's root or working tree).
    pub errno: i32,
    /// What failed.
    pub message: String,
}

/// A filesystem entry as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryStat {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time: seconds since the epoch.
    pub mtime: i64,
    /// Nanoseconds of the modification time.
    pub mtime_nsec: u32,
    /// A symlink's target.
    pub target: Option<String>,
    /// A regular file's or directory's extended attributes in the `user.` namespace whose
    /// values are UTF-8 (names in full: `user.e2b.author`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// What the agent sends: replies, and exits of spawned commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    /// A reply to a request.
    Reply(Reply),
    /// A spawned command ended (and its whole tree is gone).
    Exit {
        /// Its pid.
        pid: i32,
        /// Exit code, if it exited.
        code: Option<i32>,
        /// Signal, if one killed it.
        signal: Option<i32>,
    },
    /// Events of a watch ([`Op::Watch`]), oldest first.
    WatchEvents {
        /// The watch.
        watch: u64,
        /// What happened.
        events: Vec<WatchEvent>,
    },
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEvent {
    /// Something changed.
    Change(FileChange),
    /// Events were dropped here: a queue was full (`dropped` counts them) or the kernel's
    /// queue overflowed (`dropped` unknown).
    Overflow {
        /// How many, if known.
        dropped: Option<u64>,
    },
    /// Part of the tree is not watched (a limit was reached, a directory was unreadable).
    Error {
        /// What and why.
        message: String,
    },
}

/// A change of a file or directory, with its path as the sandbox sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// What happened.
    pub kind: ChangeKind,
    /// The path (absolute, in the sandbox's view); for `moved`, the new one.
    pub path: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// For `moved`: the old path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// The kinds of [`FileChange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Created (or moved in from outside the watch).
    Created,
    /// Content written (reported when written and when closed, repeats coalesced) or
    /// metadata changed.
    Modified,
    /// Removed (or moved out of the watch).
    Deleted,
    /// Renamed inside the watch: `from` → `path`.
    Moved,
}

impl Body {
    /// The reply's kind as it appears on the wire (`hello`, `spawned`, `stat`, ...), for
    /// errors that name what came instead of what was expected.
    pub fn kind(&self) -> &'static str {
        match self {
            Body::Done => "done",
            Body::Hello { .. } => "hello",
            Body::Spawned { .. } => "spawned",
            Body::Opened { .. } => "opened",
            Body::WriteStarted { .. } => "write_started",
            Body::Stat(_) => "stat",
            Body::Listed { .. } => "listed",
            Body::Connected { .. } => "connected",
            Body::Watching { .. } => "watching",
        }
    }

    /// An [`ProtocolError::UnexpectedReply`] saying that `expected` was due and this came.
    pub fn unexpected(&self, expected: &'static str) -> ProtocolError {
        ProtocolError::UnexpectedReply {
            expected,
            received: self.kind(),
        }
    }
}

/// What the agent said in [`Body::Hello`], once its version is known to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The agent's pid in the sandbox.
    pub pid: i32,
    /// Its working directory.
    pub cwd: String,
}

/// Checks the reply to [`Op::Hello`]: a [`Body::Hello`] of this [`PROTOCOL_VERSION`], or a
/// typed error naming what was wrong (another version, another reply).
pub fn check_hello(body: Body) -> Result<Hello, ProtocolError> {
    match body {
        Body::Hello { pid, cwd, protocol } if protocol == PROTOCOL_VERSION => {
            Ok(Hello { pid, cwd })
        }
        Body::Hello { protocol, .. } => Err(ProtocolError::VersionMismatch {
            runtime: PROTOCOL_VERSION,
            agent: protocol,
        }),
        other => Err(other.unexpected("hello")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_agent_of_another_protocol_version_is_refused_naming_both_versions() {
        let body = Body::Hello {
            pid: 1,
            cwd: "/".into(),
            protocol: PROTOCOL_VERSION + 1,
        };
        let err = check_hello(body).unwrap_err();
        assert_eq!(
            err,
            ProtocolError::VersionMismatch {
                runtime: PROTOCOL_VERSION,
                agent: PROTOCOL_VERSION + 1
            }
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("version {}", PROTOCOL_VERSION + 1)),
            "{text}"
        );
        assert!(
            text.contains(&format!("version {PROTOCOL_VERSION}")),
            "{text}"
        );
    }

    #[test]
    fn an_agent_that_predates_versioning_is_refused_as_version_0() {
        let body: Body = serde_json::from_str(r#"{"hello":{"pid":3,"cwd":"/w"}}"#).unwrap();
        assert_eq!(
            check_hello(body).unwrap_err(),
            ProtocolError::VersionMismatch {
                runtime: PROTOCOL_VERSION,
                agent: 0
            }
        );
    }

    #[test]
    fn an_agent_of_this_version_is_accepted() {
        let hello = Body::Hello {
            pid: 7,
            cwd: "/work".into(),
            protocol: PROTOCOL_VERSION,
        };
        let wire = serde_json::to_string(&hello).unwrap();
        let back: Body = serde_json::from_str(&wire).unwrap();
        assert_eq!(
            check_hello(back).unwrap(),
            Hello {
                pid: 7,
                cwd: "/work".into()
            }
        );
    }

    #[test]
    fn an_unexpected_reply_names_the_expected_and_the_received_kind() {
        let err = check_hello(Body::Done).unwrap_err();
        assert_eq!(
            err,
            ProtocolError::UnexpectedReply {
                expected: "hello",
                received: "done"
            }
        );
        let text = err.to_string();
        assert!(text.contains("hello") && text.contains("done"), "{text}");
        let err = Body::Listed { count: 2 }.unexpected("stat");
        assert!(err.to_string().contains("listed"), "{err}");
        assert!(err.to_string().contains("stat"), "{err}");
    }
}
