//! Long-lived sandboxes driven through an API: persistent shell sessions, background
//! processes with bounded cursor-addressed logs, PTYs, file operations resolved inside the
//! sandbox, and workspace operations on the sandbox's copy-on-write branch.
//!
//! How it fits together (details in `docs/runtime.md`, concurrency in
//! `docs/concurrency.md`):
//! - a sandbox is one `lockbox_confine::Spawn::agent` whose command is the in-sandbox agent
//!   (crate `lockbox-agent`); the runtime talks to it over a `SOCK_SEQPACKET` socket
//!   (`agent`) in `lockbox-agent`'s versioned protocol, and it starts commands under
//!   subreaper shims and sends back the host ends of their pipes and PTYs;
//! - `runtime` ([`Runtime`]): the sandboxes of a state directory, their creation,
//!   listing and deletion; `handle` ([`Sandbox`]): one running sandbox's operations,
//!   each delegated to the module below that does it; `sandbox`: a sandbox's live state
//!   (its instance: init, agent, branch) and start-up;
//! - `session`: persistent bash with a one-line-per-command protocol;
//! - `process` + `log`: background processes and their bounded logs;
//! - `contexts`: code contexts, persistent Python/bash interpreters whose runs return
//!   output, rich results and errors;
//! - `files`: file operations, resolved by the agent, streamed by the runtime;
//! - `workspace`: changes/commit/abort of the sandbox's branch; `gather`: several
//!   sandboxes' branches committed together as one transaction;
//! - `ports`: exposed ports; `watch`: file watching; `streams`: the streams handed out;
//! - `store`: sandbox metadata in SQLite; `record`: a spec's JSON on disk (the one serde of
//!   the runtime's own types, private).
//!
//! Which executable is the agent ([`RuntimeConfig::agent_exe`]): a binary whose `main` calls
//! [`main_if_agent`] first thing, re-executed in each sandbox as its agent and its init. The
//! `lockbox-agent` crate's binary is one, and what every host here sets: the `lockbox` CLI
//! and the Python SDK embed it (`lockbox_cli::install_agent` writes it into the state
//! directory), the runtime's tests and benchmarks take it from their target directory. Being
//! small matters: each of a sandbox's processes that executes it relocates its data, about
//! 12 KB for the agent against 330 KB for the whole CLI. Unset, the current executable is
//! re-executed (for an embedder whose `main` dispatches). Either way the agent's
//! [`PROTOCOL_VERSION`] is checked at the handshake: a mismatch is [`RuntimeError::Protocol`].
//!
//! Not here: HTTP and the API's JSON (`lockbox-server`, whose `wire` module turns these types
//! into their wire forms: times as RFC 3339 text, durations as `*_ms`), confinement
//! itself (`lockbox-confine`), the agent and its protocol (`lockbox-agent`), branches and
//! the commit engine (`lockbox-cow`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod agent;
mod audit;
mod branches;
mod contexts;
mod credentials;
mod error;
mod files;
mod gather;
mod handle;
mod log;
mod network;
mod output;
mod pool;
mod portable;
mod ports;
mod process;
mod record;
mod runtime;
mod sandbox;
mod session;
mod snapshots;
mod store;
mod streams;
mod types;
mod util;
mod watch;
mod workspace;

pub use crate::audit::AUDIT_RING;
pub use crate::contexts::{
    CONTEXT_INTERRUPT_GRACE, DEFAULT_CONTEXT, DEFAULT_RUN_TIMEOUT, MAX_CONTEXTS,
};
pub use crate::error::RuntimeError;
pub use crate::gather::{Contribution, GatherConflict, GatherOptions, GatherOutcome};
pub use crate::handle::Sandbox;
pub use crate::portable::{
    ImportedSnapshot, SnapshotExport, SNAPSHOT_ARTIFACT_TYPE, SNAPSHOT_CONFIG_TYPE,
};
pub use crate::ports::{check_port, MAX_EXPOSED_PORTS, MAX_FORWARDED_CONNECTIONS};
pub use crate::runtime::Runtime;
pub use crate::snapshots::{DiffTarget, MAX_SNAPSHOT_NAME};
pub use crate::streams::{
    AuditStream, CodeStream, ExecStream, FileList, FileRead, LogStream, PtyAttachment, PtyOutput,
    WatchStream,
};
pub use crate::types::*;
pub use lockbox_agent::{main_if_agent, ProtocolError, PROTOCOL_VERSION};
pub use lockbox_agent::{ChangeKind, FileChange, WatchEvent};
/// What [`CommitSummary::report`] holds.
pub use lockbox_cow::CommitReport;
pub use lockbox_cow::CowError;
/// What [`SandboxInfo::branch`] and [`KeptBranch`] name.
pub use lockbox_cow::{BranchId, BranchState};
/// What [`Sandbox::changes`] lists.
pub use lockbox_cow::{Change, FileHunks, Hunk, HunkLine, LineOp, Side, SnapshotId};
pub use lockbox_cow::{ContentDigest, Review, Reviewed, ReviewedChange, ReviewedPath};
/// What [`SandboxSpec::http`] and [`RuntimeConfig::credentials`] hold.
pub use lockbox_intercept::{
    AllowRule, AuthRule, CredentialSource, CredentialSpec, Credentials, Error as InterceptError,
    HttpRules,
};
/// What [`Sandbox::audit`] and [`Sandbox::audit_log`] give.
pub use lockbox_netsup::{
    Decision as NetDecision, EventKind as NetEventKind, NetEvent, Protocol as NetProtocol,
    Question, Verdict, DEFAULT_ASK_TIMEOUT,
};
/// What [`Runtime::commit_together`] takes and reports.
pub use lockbox_txn::{ConflictPolicy, Marker, TxnId};
