//! The runtime's errors, each with a stable machine code (`code()`) and structured
//! `details()` that the HTTP layer turns into `{code, message, details}`.

use lockbox_policy::ErrorCode;

/// Everything the runtime can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No sandbox with this id (running or recorded).
    #[error("no sandbox with id {id:?}")]
    SandboxNotFound {
        /// The id asked for.
        id: String,
    },
    /// The sandbox is recorded but not running (stopped, or lost with a previous server).
    #[error("sandbox {id} is {state}, not running")]
    SandboxNotRunning {
        /// The sandbox.
        id: crate::SandboxId,
        /// Its state (stopped or lost).
        state: crate::SandboxState,
    },
    /// No session with this id in the sandbox.
    #[error("no session {id:?} in this sandbox")]
    SessionNotFound {
        /// The session id asked for.
        id: String,
    },
    /// A session with this id exists already.
    #[error("session {id:?} exists already")]
    SessionExists {
        /// The session id.
        id: String,
    },
    /// The session's shell ended (`exit` in a command, killed, or it stopped answering);
    /// the session is gone and the next call may create a fresh one under the same id.
    #[error("session {id:?} terminated: {reason}")]
    SessionTerminated {
        /// The session id.
        id: String,
        /// What happened.
        reason: String,
    },
    /// No process with this id in the sandbox.
    #[error("no process {id:?} in this sandbox")]
    ProcessNotFound {
        /// The process id asked for.
        id: String,
    },
    /// The process has exited (stdin writes, PTY resize, ...).
    #[error("process {id} is not running")]
    ProcessNotRunning {
        /// The process id.
        id: String,
    },
    /// The process has no PTY (attach, resize) or no open stdin (write).
    #[error("process {id}: {what}")]
    NotSupported {
        /// The process id.
        id: String,
        /// What is not available.
        what: String,
    },
    /// The sandbox's network list was not replaced (`Runtime::replace_network`): the
    /// change needs what it was not started with, or a name of the new list did not
    /// resolve. Its network is as it was.
    #[error("sandbox {id}: network not changed: {source}")]
    NetUpdate {
        /// The sandbox.
        id: crate::SandboxId,
        /// Why.
        #[source]
        source: lockbox_confine::NetUpdateError,
    },
    /// The path does not exist inside the sandbox.
    #[error("{path}: no such file or directory")]
    FileNotFound {
        /// The path as given.
        path: String,
    },
    /// The path (after `..` and symlinks) would leave the sandbox's root.
    #[error("{path}: resolves outside the sandbox")]
    PathOutsideSandbox {
        /// The path as given.
        path: String,
    },
    /// A path component or the target is not a directory.
    #[error("{path}: not a directory")]
    NotADirectory {
        /// The path as given.
        path: String,
    },
    /// The target is a directory where a file was expected (or a non-empty directory
    /// removed without `recursive`).
    #[error("{path}: is a directory")]
    IsADirectory {
        /// The path as given.
        path: String,
    },
    /// The target exists already.
    #[error("{path}: already exists")]
    AlreadyExists {
        /// The path as given.
        path: String,
    },
    /// The path is on a read-only part of the sandbox.
    #[error("{path}: read-only in this sandbox")]
    ReadOnly {
        /// The path as given.
        path: String,
    },
    /// Permission denied inside the sandbox.
    #[error("{path}: permission denied")]
    PermissionDenied {
        /// The path as given.
        path: String,
    },
    /// The sandbox was created without a workdir, so it has no branch.
    #[error("sandbox {id} has no workdir (no copy-on-write branch)")]
    NoWorkdir {
        /// The sandbox.
        id: String,
    },
    /// A request field is invalid.
    #[error("invalid {field}: {message}")]
    InvalidRequest {
        /// The field (`command`, `session`, `range`, `policy.fs`...).
        field: String,
        /// Why.
        message: String,
    },
    /// A configured limit (max sandboxes) is reached.
    #[error("limit reached: {what} ({limit})")]
    LimitReached {
        /// Which limit.
        what: String,
        /// Its value.
        limit: usize,
    },
    /// The sandbox could not be set up (the agent, its executable, the state directory).
    #[error("sandbox setup failed: {0}")]
    SetupFailed(String),
    /// The sandbox could not be confined as asked (kernel feature, policy): the wire code
    /// is `SETUP_FAILED`, the details name the cause's own code and hint.
    #[error("sandbox setup failed: {0}")]
    Setup(#[source] lockbox_confine::SetupError),
    /// The branch could not be created, read or committed (its own code on the wire).
    #[error("branch: {0}")]
    Branch(#[source] lockbox_cow::CowError),
    /// Commit refused: the workdir changed under the branch (stale base) at `paths`.
    #[error("conflict: {message}")]
    Conflict {
        /// The sentence, naming the paths.
        message: String,
        /// The workdir-relative paths that changed (in `details.paths`).
        paths: Vec<std::path::PathBuf>,
    },
    /// The sandbox's agent broke the protocol's contract: another protocol version (an
    /// agent executable of another lockbox build; wire code `SETUP_FAILED`) or a reply of
    /// the wrong kind (`INTERNAL`). The details name both sides.
    #[error("sandbox agent: {0}")]
    Protocol(#[from] lockbox_agent::ProtocolError),
    /// The port is not exposed in this sandbox.
    #[error("port {port} is not exposed in this sandbox (expose it first)")]
    PortNotExposed {
        /// The port.
        port: u16,
    },
    /// Nothing in the sandbox listens on the port (connection refused on 127.0.0.1 and ::1).
    #[error("nothing listens on port {port} in the sandbox")]
    PortNotListening {
        /// The port.
        port: u16,
    },
    /// No approval question with this id pending in the sandbox (never asked, timed out,
    /// or its caller is gone).
    #[error("no approval question {id} pending in this sandbox")]
    QuestionNotFound {
        /// The question's id.
        id: u64,
    },
    /// The approval question was decided already.
    #[error("approval question {id} was decided already")]
    QuestionDecided {
        /// The question's id.
        id: u64,
    },
    /// No code context with this id in the sandbox.
    #[error("no code context {id:?} in this sandbox")]
    ContextNotFound {
        /// The context id asked for.
        id: String,
    },
    /// A code context with this id exists already.
    #[error("code context {id:?} exists already")]
    ContextExists {
        /// The context id.
        id: String,
    },
    /// Sandboxes committed together changed the same paths under the `fail` conflict
    /// policy: nothing was committed (`details.conflicts` names each path's sandboxes).
    #[error("{} changed by more than one sandbox (conflict policy fail; nothing committed): {}", lockbox_policy::plural(conflicts.len(), "path"), conflicts.iter().map(|c| format!("{} ({})", lockbox_policy::name::quoted(&c.path), c.sandboxes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))).collect::<Vec<_>>().join("; "))]
    MergeConflicts {
        /// Each conflicting path and the sandboxes that changed it.
        conflicts: Vec<crate::gather::GatherConflict>,
    },
    /// A commit, abort, restore or snapshot of the sandbox is under way.
    #[error(
        "sandbox {id} is busy (a commit, abort, restore or snapshot of it is under way); try again"
    )]
    SandboxBusy {
        /// The sandbox.
        id: String,
    },
    /// A transaction of several sandboxes failed (its own code on the wire).
    #[error("transaction: {0}")]
    Transaction(#[source] lockbox_txn::TxnError),
    /// A background task of the runtime panicked or was cancelled.
    #[error("internal error: a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// An operating-system call the runtime made failed unexpectedly.
    #[error("internal error: {what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A value could not be turned into or read back from JSON.
    #[error("internal error: {what}: {source}")]
    Json {
        /// What was being encoded or decoded.
        what: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The sandbox database (SQLite, in the state directory) failed.
    #[error("internal error: sandbox database: {0}")]
    Database(#[source] rusqlite::Error),
    /// The sandbox ended while it was listed running: its agent hung up (its processes
    /// were killed from inside, or the sandbox died). Code `SANDBOX_NOT_RUNNING`.
    #[error("the sandbox ended: its agent is gone")]
    AgentGone,
    /// The sandbox's agent broke its protocol.
    #[error("internal error: the sandbox's agent {0}")]
    Agent(String),
    /// A condition that is a bug in lockbox (no source error to keep).
    #[error("internal error: {0}")]
    Internal(String),
    /// A snapshot could not be sent to or received from another state directory (a fleet
    /// node): its artifact's manifest or a blob is not the one its digest names, or it is
    /// malformed or cut short (`BAD_ARTIFACT`); or it could not be written (`INTERNAL`).
    /// Nothing of it was published.
    #[error("snapshot {id}: moving it between nodes: {source}")]
    SnapshotTransfer {
        /// The snapshot.
        id: String,
        /// What failed.
        #[source]
        source: lockbox_image::ImageError,
    },
    /// The sandbox's image (`policy.image`) could not be found, pulled, held or applied;
    /// its code is the image error's (`IMAGE_NOT_FOUND`, `BAD_REFERENCE`, ...).
    #[error("image: {0}")]
    Image(#[source] lockbox_image::ImageError),
}

impl RuntimeError {
    /// The stable machine code, e.g. `SESSION_TERMINATED`.
    pub fn code(&self) -> ErrorCode {
        match self {
            RuntimeError::SandboxNotFound { .. } => ErrorCode::SandboxNotFound,
            RuntimeError::SandboxNotRunning { .. } | RuntimeError::AgentGone => {
                ErrorCode::SandboxNotRunning
            }
            RuntimeError::SessionNotFound { .. } => ErrorCode::SessionNotFound,
            RuntimeError::SessionExists { .. } => ErrorCode::AlreadyExists,
            RuntimeError::SessionTerminated { .. } => ErrorCode::SessionTerminated,
            RuntimeError::ProcessNotFound { .. } => ErrorCode::ProcessNotFound,
            RuntimeError::ProcessNotRunning { .. } => ErrorCode::ProcessNotRunning,
            RuntimeError::NotSupported { .. } => ErrorCode::NotSupported,
            RuntimeError::NetUpdate { source, .. } => source.code(),
            RuntimeError::FileNotFound { .. } => ErrorCode::FileNotFound,
            RuntimeError::PathOutsideSandbox { .. } => ErrorCode::PathOutsideSandbox,
            RuntimeError::NotADirectory { .. } => ErrorCode::NotADirectory,
            RuntimeError::IsADirectory { .. } => ErrorCode::IsADirectory,
            RuntimeError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            RuntimeError::ReadOnly { .. } => ErrorCode::ReadOnly,
            RuntimeError::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            RuntimeError::NoWorkdir { .. } => ErrorCode::NoWorkdir,
            RuntimeError::InvalidRequest { .. } => ErrorCode::InvalidRequest,
            RuntimeError::LimitReached { .. } => ErrorCode::LimitReached,
            RuntimeError::SetupFailed(_) | RuntimeError::Setup(_) => ErrorCode::SetupFailed,
            RuntimeError::Branch(e) => e.code(),
            RuntimeError::Image(e) => e.code(),
            RuntimeError::SnapshotTransfer {
                source: lockbox_image::ImageError::Io { .. },
                ..
            } => ErrorCode::Internal,
            RuntimeError::SnapshotTransfer { .. } => ErrorCode::BadArtifact,
            RuntimeError::Conflict { .. } | RuntimeError::MergeConflicts { .. } => {
                ErrorCode::Conflict
            }
            RuntimeError::SandboxBusy { .. } => ErrorCode::WorkdirBusy,
            RuntimeError::Transaction(e) => e.code(),
            RuntimeError::Protocol(lockbox_agent::ProtocolError::VersionMismatch { .. }) => {
                ErrorCode::SetupFailed
            }
            RuntimeError::PortNotExposed { .. } => ErrorCode::PortNotExposed,
            RuntimeError::PortNotListening { .. } => ErrorCode::PortNotListening,
            RuntimeError::ContextNotFound { .. } => ErrorCode::ContextNotFound,
            RuntimeError::QuestionNotFound { .. } => ErrorCode::QuestionNotFound,
            RuntimeError::QuestionDecided { .. } => ErrorCode::QuestionDecided,
            RuntimeError::ContextExists { .. } => ErrorCode::AlreadyExists,
            RuntimeError::Protocol(_)
            | RuntimeError::Task(_)
            | RuntimeError::Os { .. }
            | RuntimeError::Json { .. }
            | RuntimeError::Database(_)
            | RuntimeError::Agent(_)
            | RuntimeError::Internal(_) => ErrorCode::Internal,
        }
    }

    pub(crate) fn internal(what: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Internal(what.to_string())
    }

    /// An OS error while doing `what` (for `map_err`).
    pub(crate) fn os<E: Into<std::io::Error>>(
        what: &'static str,
    ) -> impl FnOnce(E) -> RuntimeError {
        move |e| RuntimeError::Os {
            what,
            source: e.into(),
        }
    }

    /// A JSON error while encoding or decoding `what` (for `map_err`).
    pub(crate) fn json(what: &'static str) -> impl FnOnce(serde_json::Error) -> RuntimeError {
        move |source| RuntimeError::Json { what, source }
    }

    pub(crate) fn invalid(field: &str, message: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::InvalidRequest {
            field: field.to_owned(),
            message: message.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockbox_agent::{Body, ProtocolError, PROTOCOL_VERSION};

    #[test]
    fn an_agent_of_another_version_fails_setup_naming_both_versions() {
        let e = RuntimeError::from(ProtocolError::VersionMismatch {
            runtime: PROTOCOL_VERSION,
            agent: 99,
        });
        assert_eq!(e.code(), ErrorCode::SetupFailed);
        assert!(e.to_string().contains("version 99"), "{e}");
    }

    #[test]
    fn a_reply_of_the_wrong_kind_is_internal_naming_both_kinds() {
        let e = RuntimeError::from(Body::Done.unexpected("spawned"));
        assert_eq!(e.code(), ErrorCode::Internal);
        assert!(e.to_string().contains("`done` where `spawned`"), "{e}");
    }
}
