//! The data types of the runtime's API: ids, specs, records, events. Domain types only:
//! durations are [`Duration`]s, times [`std::time::SystemTime`]s, byte strings [`Bytes`].
//! Their JSON is `lockbox-server`'s `wire` module (an id is its text there, through `From<Id>
//! for String`); no type here derives serde (a snapshot record writes a session id as its
//! text, `sandbox.rs`).

use bytes::Bytes;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Default bound of a process's output log.
pub const DEFAULT_LOG_BYTES: usize = 4 << 20;
/// Default maximum number of running sandboxes.
pub const DEFAULT_MAX_SANDBOXES: usize = 64;
/// Default bound of each of stdout and stderr kept by a buffered exec.
pub const DEFAULT_MAX_EXEC_OUTPUT: usize = 16 << 20;
/// Default maximum number of sessions of one sandbox.
pub const DEFAULT_MAX_SESSIONS: usize = 16;
/// Default number of sessions whose pipes stay open between commands (2,560 descriptors).
pub const DEFAULT_MAX_HELD_SESSIONS: usize = 512;
/// Default maximum number of process records (running or exited) of one sandbox.
pub const DEFAULT_MAX_PROCESSES: usize = 64;
/// Default bound of all process logs of a runtime together.
pub const DEFAULT_MAX_LOG_MEMORY: usize = 1 << 30;
/// Default number of stopped sandboxes kept in the list (the newest).
pub const DEFAULT_KEEP_STOPPED: usize = 100;
/// Default bound of what all snapshots cost on disk ([`RuntimeConfig::max_snapshot_bytes`]):
/// 10 GiB.
pub const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 10 << 30;
/// Default bound of the entries (inodes) of all snapshots
/// ([`RuntimeConfig::max_snapshot_entries`]): one million.
pub const DEFAULT_MAX_SNAPSHOT_ENTRIES: u64 = 1_000_000;
/// Default bound of the pool's ready sandboxes, of all keys together
/// ([`RuntimeConfig::pool_max_spares`]).
pub const DEFAULT_POOL_MAX_SPARES: usize = 8;

/// How the runtime is set up.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Holds `sandboxes.sqlite` and the copy-on-write branches (`branches/`).
    pub state_dir: PathBuf,
    /// Running sandboxes at most; more is `LIMIT_REACHED`.
    pub max_sandboxes: usize,
    /// Per-process log bound when [`ProcessSpec::log_bytes`] is not given.
    pub default_log_bytes: usize,
    /// Most bytes of stdout, and of stderr, a buffered exec keeps (the rest is read and
    /// dropped; [`ExecResult::stdout_truncated`] says so). `exec_stream` has no such bound:
    /// it reads only as fast as its receiver takes events.
    pub max_exec_output: usize,
    /// Sessions of one sandbox at most (live or terminated, until deleted); more is
    /// `LIMIT_REACHED`. Each holds a shell, and five descriptors in the runtime while it
    /// runs a command or is among the [`RuntimeConfig::max_held_sessions`] used last.
    pub max_sessions: usize,
    /// Sessions, of all sandboxes together, whose pipes (five descriptors each) stay open in
    /// the runtime between commands: those used last. Another session's are asked for again
    /// from its sandbox's agent by its next command (one round trip), so that thousands of
    /// sandboxes with a shell each do not hold five descriptors each.
    pub max_held_sessions: usize,
    /// Processes one sandbox keeps at most, running or exited. Starting one more forgets
    /// the oldest exited one (and its log); when all are running it is `LIMIT_REACHED`.
    pub max_processes: usize,
    /// The bound of all process logs together: each process reserves its `log_bytes`
    /// while its record (or a reader of its log) lives. Starting a process whose log would
    /// not fit forgets the sandbox's oldest exited processes first, then is
    /// `LIMIT_REACHED`.
    pub max_log_memory: usize,
    /// Idle timeout when [`SandboxSpec::idle_timeout`] is not given; `None` = never.
    pub default_idle_timeout: Option<Duration>,
    /// Stopped sandboxes kept in the list (and the database), the most recently created
    /// ones; older stopped rows are forgotten when a sandbox stops and when the runtime
    /// opens. As many `lost` ones are kept the same way (their branches stay in the branch
    /// store for review either way).
    pub keep_stopped: usize,
    /// The executable run as the in-sandbox agent with `__lockbox_agent` as its first argument
    /// (see [`lockbox_agent`]): typically `lockbox-agent`'s binary (the `lockbox` CLI embeds
    /// one and writes it into its state directory). `None` = the current executable, which
    /// must then dispatch to [`lockbox_agent::main_if_agent`] first thing in `main`.
    pub agent_exe: Option<PathBuf>,
    /// What all snapshots together may cost on disk, in bytes: every entry's blocks (a
    /// directory at least 4 KiB) plus 512 bytes of inode ([`lockbox_cow::entry_cost`]). A
    /// snapshot that would go beyond is `LIMIT_REACHED`: its copy stops at the first entry
    /// beyond (the sandbox's processes go on at once) and nothing of it is kept.
    /// `None` = no bound.
    pub max_snapshot_bytes: Option<u64>,
    /// How many entries (inodes) all snapshots together may hold; beyond, as
    /// [`RuntimeConfig::max_snapshot_bytes`]. `None` = no bound.
    pub max_snapshot_entries: Option<u64>,
    /// Sandboxes kept started ahead per pooled spec (see `pool.rs`, docs/runtime.md): for
    /// the default policy with no workdir always, and for each other spec in recent use
    /// (after its first creation) within [`RuntimeConfig::pool_max_spares`]. A creation of
    /// a pooled spec takes one instead of starting a sandbox. 0 = no pool.
    pub pool_size: usize,
    /// The pool's ready sandboxes of all specs together at most (the default spec's
    /// `pool_size` always fit): a spec newly in use evicts the least recently used one's.
    /// `pool_size` here pools the default spec alone. Default
    /// [`DEFAULT_POOL_MAX_SPARES`].
    pub pool_max_spares: usize,
    /// The credentials sandboxes may use but never read (`lockbox serve --credential`),
    /// read once by the caller: a sandbox's [`SandboxSpec::http`] rules pick from them by
    /// name. See `credentials.rs`.
    pub credentials: lockbox_intercept::Credentials,
    /// The files [`RuntimeConfig::credentials`] were read from: no sandbox may be given
    /// one of them (or a directory above one) to read or write.
    pub credential_files: Vec<PathBuf>,
    /// CA certificates (a PEM file) trusted for the real servers of intercepted hosts
    /// besides the host's trust store, when [`SandboxSpec::upstream_ca`] names none.
    pub upstream_ca: Option<PathBuf>,
}

impl RuntimeConfig {
    /// A config with the defaults for `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> RuntimeConfig {
        RuntimeConfig {
            state_dir: state_dir.into(),
            max_sandboxes: DEFAULT_MAX_SANDBOXES,
            default_log_bytes: DEFAULT_LOG_BYTES,
            max_exec_output: DEFAULT_MAX_EXEC_OUTPUT,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_held_sessions: DEFAULT_MAX_HELD_SESSIONS,
            max_processes: DEFAULT_MAX_PROCESSES,
            max_log_memory: DEFAULT_MAX_LOG_MEMORY,
            default_idle_timeout: None,
            keep_stopped: DEFAULT_KEEP_STOPPED,
            agent_exe: None,
            max_snapshot_bytes: Some(DEFAULT_MAX_SNAPSHOT_BYTES),
            max_snapshot_entries: Some(DEFAULT_MAX_SNAPSHOT_ENTRIES),
            pool_size: 0,
            pool_max_spares: DEFAULT_POOL_MAX_SPARES,
            credentials: lockbox_intercept::Credentials::default(),
            credential_files: Vec::new(),
            upstream_ca: None,
        }
    }
}

/// One spec the pool keeps sandboxes ready for ([`crate::Runtime::pool_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKeyStats {
    /// The default spec's (always kept), not one in recent use.
    pub default: bool,
    /// The store id of its image, if it has one.
    pub image: Option<String>,
    /// Sandboxes ready now.
    pub ready: usize,
    /// Creations that took a ready sandbox.
    pub hits: u64,
    /// Creations that found none ready (a spec's first creation is one).
    pub misses: u64,
}

/// What to do with a sandbox's branch when the sandbox is deleted (or idles out, or the
/// server stops).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnExit {
    /// Keep the branch for review (`lockbox branch ...`): nothing is lost.
    #[default]
    Keep,
    /// Commit it to the workdir (kept if the commit fails).
    Commit,
    /// Discard it.
    Abort,
}

/// How to create a sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// The confinement policy (what is visible, network, limits, env).
    pub policy: lockbox_policy::Policy,
    /// When the policy's `image` is pulled: `missing` (the default: only when the store
    /// lacks it), `always` (a tag may have moved), `never` (not in the store: an error).
    pub image_pull: lockbox_image::PullPolicy,
    /// A host directory seen through a copy-on-write branch (the sandbox's working directory).
    pub workdir: Option<PathBuf>,
    /// Where the sandbox sees its workdir (an absolute path inside it), if not at the
    /// workdir's own path: E2B's sandboxes see theirs as their home, `/home/user`.
    pub workdir_at: Option<PathBuf>,
    /// What happens to the branch at the end.
    pub on_exit: OnExit,
    /// Delete the sandbox after this long without API calls.
    pub idle_timeout: Option<Duration>,
    /// Free-form labels, returned in [`SandboxInfo`].
    pub labels: BTreeMap<String, String>,
    /// Start from this snapshot's files (a fork): the sandbox sees the workdir as the
    /// snapshot does and writes to its own layer over it. `workdir` may be left out (it is
    /// the snapshot's) and must otherwise be the snapshot's.
    pub from_snapshot: Option<lockbox_cow::SnapshotId>,
    /// Approvals (`net_ask`, an allow-list only): an unlisted destination is asked, not
    /// refused, and each question waits this long for a verdict
    /// ([`crate::Sandbox::decide`]).
    pub net_ask: Option<Duration>,
    /// Hosts whose HTTPS lockbox terminates (a net allow-list's names only): the
    /// credential each request gets (`http_auth`) and the methods and paths let through
    /// (`http_allow`). Their credentials come from [`SandboxSpec::credentials`], then from
    /// [`RuntimeConfig::credentials`]; a name neither holds is `INVALID_ARGUMENT`.
    pub http: lockbox_intercept::HttpRules,
    /// Credentials of this sandbox alone, given by an in-process caller (the Python SDK's
    /// local runtime) that read them itself; never from an API request.
    pub credentials: lockbox_intercept::Credentials,
    /// CA certificates trusted for the real servers of [`SandboxSpec::http`]'s hosts
    /// besides the host's trust store; `None`: [`RuntimeConfig::upstream_ca`].
    pub upstream_ca: Option<PathBuf>,
}

/// An id type: text that names one thing of a kind, compared and hashed as its text, and
/// looked up by `&str` in maps keyed by it. Read back (from a request path, the runtime's
/// records) without a check, since an unknown id is simply not found; ids a caller chooses
/// are checked where the thing is created.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> $name {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> $name {
                $name(id.to_owned())
            }
        }
    };
}

id_type! {
    /// A sandbox's id (`sb-` and 12 hex digits when the runtime makes it). In JSON, a string.
    SandboxId
}

impl SandboxId {
    /// A fresh id.
    pub(crate) fn generate() -> SandboxId {
        SandboxId(format!("sb-{}", crate::util::random_id()))
    }
}

id_type! {
    /// A shell session's id in its sandbox (`[A-Za-z0-9_.-]{1,64}`, checked when the
    /// session is created; `default` for the one commands without a session use).
    SessionId
}

id_type! {
    /// A background process's id in its sandbox (`p1`, `p2`, ...: the runtime makes them).
    ProcessId
}

id_type! {
    /// A code context's id in its sandbox (`[A-Za-z0-9_.-]{1,64}`, checked when the context
    /// is created; `default` for the one runs without a context use).
    ContextId
}

/// How to take a snapshot ([`crate::Sandbox::snapshot_with`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotOptions {
    /// A name for people.
    pub name: Option<String>,
    /// Keep the sandbox's `/tmp` too (copied while its processes are paused, as the
    /// workdir's layer is), and put it back in the `/tmp` of forks and restores.
    pub include_tmp: bool,
}

/// A snapshot of a sandbox's files ([`crate::Sandbox::snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its id.
    pub id: lockbox_cow::SnapshotId,
    /// The name given when it was taken.
    pub name: Option<String>,
    /// The snapshot it lies on (the sandbox was forked from it), if any.
    pub parent: Option<lockbox_cow::SnapshotId>,
    /// The sandbox it was taken of.
    pub sandbox: Option<SandboxId>,
    /// The workdir below it.
    pub workdir: PathBuf,
    /// When it was taken.
    pub created_at: SystemTime,
    /// What its own layer (not its parents') costs on disk: every entry's blocks (a directory at
    /// least 4 KiB) plus 512 bytes of inode ([`lockbox_cow::entry_cost`]).
    pub bytes: u64,
    /// Files, directories and deletions in its own layer.
    pub entries: u64,
}

/// A signal for a sandbox's processes: a number from 1 to 64, made from a number or a
/// name ([`Signal::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signal(i32);

/// The signals known by name (with or without `SIG`, any case).
const SIGNAL_NAMES: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("WINCH", libc::SIGWINCH),
];

impl Signal {
    /// `SIGINT`.
    pub const INT: Signal = Signal(libc::SIGINT);
    /// `SIGTERM`.
    pub const TERM: Signal = Signal(libc::SIGTERM);
    /// `SIGKILL`.
    pub const KILL: Signal = Signal(libc::SIGKILL);

    /// The signal numbered `n` (`INVALID_ARGUMENT` outside 1..=64).
    pub fn from_number(n: i32) -> Result<Signal, crate::RuntimeError> {
        if (1..=64).contains(&n) {
            Ok(Signal(n))
        } else {
            Err(crate::RuntimeError::invalid(
                "signal",
                format!("{n} is not a signal number (1-64)"),
            ))
        }
    }

    /// A signal by number (`"15"`) or name (`"TERM"`, `"SIGTERM"`, any case).
    pub fn parse(s: &str) -> Result<Signal, crate::RuntimeError> {
        if let Ok(n) = s.parse::<i32>() {
            return Signal::from_number(n);
        }
        let bare = s
            .strip_prefix("SIG")
            .or_else(|| s.strip_prefix("sig"))
            .unwrap_or(s);
        SIGNAL_NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(bare))
            .map(|(_, n)| Signal(*n))
            .ok_or_else(|| {
                crate::RuntimeError::invalid("signal", format!("unknown signal name {s:?}"))
            })
    }

    /// Its number.
    pub fn number(self) -> i32 {
        self.0
    }
}

/// What happened to a sandbox's branch when the sandbox stopped (its `on_exit`, or what
/// was done instead when that failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchAction {
    /// Kept for review (`lockbox branch`): asked for, or a commit/abort on exit failed, or
    /// the runtime ended while the sandbox ran.
    Kept,
    /// Committed to the workdir.
    Committed,
    /// Discarded.
    Aborted,
    /// It had no changes and was removed instead of kept.
    Empty,
}

impl BranchAction {
    /// The action's name: `kept`, `committed`, `aborted` or `empty`.
    pub fn as_str(self) -> &'static str {
        match self {
            BranchAction::Kept => "kept",
            BranchAction::Committed => "committed",
            BranchAction::Aborted => "aborted",
            BranchAction::Empty => "empty",
        }
    }

    /// The action named `s`, if any.
    pub fn parse(s: &str) -> Option<BranchAction> {
        [
            BranchAction::Kept,
            BranchAction::Committed,
            BranchAction::Aborted,
            BranchAction::Empty,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// A sandbox's life state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Its init runs; all operations work.
    Running,
    /// Deleted (or idled out); kept in the list with its branch's fate.
    Stopped,
    /// It was running when a previous runtime (server) ended; its branch is kept.
    Lost,
}

impl SandboxState {
    /// The state's name: `running`, `stopped` or `lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Stopped => "stopped",
            SandboxState::Lost => "lost",
        }
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a sandbox is.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    /// Its id.
    pub id: SandboxId,
    /// Running, stopped or lost.
    pub state: SandboxState,
    /// Creation time.
    pub created_at: SystemTime,
    /// The host workdir behind its branch, if any.
    pub workdir: Option<PathBuf>,
    /// The branch id (see `lockbox branch list`).
    pub branch: Option<lockbox_cow::BranchId>,
    /// What happened to the branch when the sandbox stopped.
    pub branch_action: Option<BranchAction>,
    /// Labels from the spec.
    pub labels: BTreeMap<String, String>,
    /// Live sessions.
    pub sessions: usize,
    /// Processes (running or exited, still listed).
    pub processes: usize,
    /// Its policy in brief (`None` for a recorded sandbox whose spec cannot be read).
    pub policy: Option<PolicySummary>,
    /// What its processes use now (`None` unless it is running).
    pub usage: Option<ResourceUse>,
}

/// A sandbox's policy in brief: what it may reach and what bounds it. The whole policy is
/// the one it was created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySummary {
    /// What its network policy lets through.
    pub net: NetKind,
    /// The destinations of an `allow` or `deny` network policy.
    pub net_destinations: Vec<lockbox_policy::NetSpec>,
    /// Whether the default system paths (`/usr`, `/etc` without its secrets, ...) are
    /// readable.
    pub default_reads: bool,
    /// Other host paths readable, at the same path.
    pub fs_readable: Vec<PathBuf>,
    /// Host paths writable directly (their writes do not go through the branch).
    pub fs_writable: Vec<PathBuf>,
    /// Memory bound of the sandbox, in bytes.
    pub max_memory_bytes: Option<u64>,
    /// Bound on processes and threads.
    pub max_processes: Option<u64>,
    /// CPU time bound per process.
    pub max_cpu_time: Option<Duration>,
    /// Largest file a process may write, in bytes.
    pub max_file_size_bytes: Option<u64>,
    /// Deleted after this long without API calls.
    pub idle_timeout: Option<Duration>,
    /// The OCI image it runs on (the reference it was created with), if any.
    pub image: Option<String>,
}

/// A network policy's kind ([`PolicySummary::net`]), without its destinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetKind {
    /// Loopback only.
    None,
    /// The host's network.
    Host,
    /// Only the policy's destinations.
    Allow,
    /// All but the policy's destinations.
    Deny,
}

impl PolicySummary {
    /// The summary of a sandbox's spec.
    pub fn of(spec: &SandboxSpec) -> PolicySummary {
        use lockbox_policy::Net;
        let p = &spec.policy;
        PolicySummary {
            net: match p.net {
                Net::None => NetKind::None,
                Net::Host => NetKind::Host,
                Net::Allow(_) => NetKind::Allow,
                Net::Deny(_) => NetKind::Deny,
            },
            net_destinations: p.net.specs().to_vec(),
            default_reads: p.fs.default_reads,
            fs_readable: p.fs.read.clone(),
            fs_writable: p.fs.write.clone(),
            max_memory_bytes: p.limits.memory.map(|m| m.bytes()),
            max_processes: p.limits.processes,
            max_cpu_time: p.limits.cpu_time,
            max_file_size_bytes: p.limits.file_size.map(|m| m.bytes()),
            idle_timeout: spec.idle_timeout,
            image: p.image.clone(),
        }
    }
}

/// What a running sandbox's processes use, read from `/proc` when asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceUse {
    /// Live processes, the sandbox's init and agent included.
    pub processes: u32,
    /// Their threads.
    pub threads: u32,
    /// The sum of their resident set sizes (a page shared by two processes counts twice).
    pub rss_bytes: u64,
    /// CPU time (user + system) of its live processes and of those that ended.
    pub cpu: Duration,
}

impl From<lockbox_confine::TreeUsage> for ResourceUse {
    fn from(u: lockbox_confine::TreeUsage) -> ResourceUse {
        ResourceUse {
            processes: u.processes,
            threads: u.threads,
            rss_bytes: u.rss_bytes,
            cpu: u.cpu,
        }
    }
}

/// How to create a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Its id; generated when absent. `[A-Za-z0-9_.-]{1,64}`.
    pub id: Option<SessionId>,
    /// Initial working directory (inside the sandbox).
    pub cwd: Option<String>,
    /// Initial extra environment.
    pub env: BTreeMap<String, String>,
}

/// A session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Its id.
    pub id: SessionId,
    /// Pid of its shell (in the sandbox's pid namespace).
    pub pid: i32,
    /// Creation time.
    pub created_at: SystemTime,
    /// True while a command runs.
    pub busy: bool,
}

/// One command for a session.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// Shell text, run by the session's bash as if typed (any text: heredocs, quotes...).
    pub command: String,
    /// The session; `None` = the sandbox's default session (created on first use).
    pub session: Option<SessionId>,
    /// Working directory for this call only.
    pub cwd: Option<String>,
    /// Environment for this call only.
    pub env: BTreeMap<String, String>,
    /// Kill the command (TERM, grace, KILL of its whole tree) after this long: exit 124.
    pub timeout: Option<Duration>,
    /// Bytes for the command's stdin; `None` = `/dev/null`.
    pub stdin: Option<Bytes>,
}

/// The result of a finished command.
#[derive(Debug, Clone)]
pub struct ExecResult {
    /// Exit status as bash reports it (128+N after signal N, 124 after a timeout).
    pub exit_code: i32,
    /// stdout, byte-exact: all of it, or its first [`RuntimeConfig::max_exec_output`] bytes.
    pub stdout: Bytes,
    /// stderr, likewise.
    pub stderr: Bytes,
    /// The timeout killed it.
    pub timed_out: bool,
    /// stdout was longer than a buffered exec keeps and was cut there (the rest was read
    /// and dropped, so the command did not block); use `exec_stream` for such outputs.
    pub stdout_truncated: bool,
    /// Likewise for stderr.
    pub stderr_truncated: bool,
    /// Wall time of the call.
    pub duration: Duration,
    /// The session it ran in.
    pub session: SessionId,
}

/// How a command of [`crate::ExecStream`] ended (an [`ExecResult`] without its output).
#[derive(Debug, Clone)]
pub struct ExecExit {
    /// As [`ExecResult::exit_code`].
    pub exit_code: i32,
    /// As [`ExecResult::timed_out`].
    pub timed_out: bool,
    /// As [`ExecResult::duration`].
    pub duration: Duration,
    /// As [`ExecResult::session`].
    pub session: SessionId,
}

/// One event of a streamed command.
#[derive(Debug, Clone)]
pub enum ExecEvent {
    /// The command started in this session.
    Start {
        /// The session.
        session: SessionId,
    },
    /// Bytes on stdout.
    Stdout {
        /// The bytes.
        data: Bytes,
    },
    /// Bytes on stderr.
    Stderr {
        /// The bytes.
        data: Bytes,
    },
    /// The command ended (all output was sent before).
    Exit(ExecExit),
    /// The command could not finish (e.g. `SESSION_TERMINATED`); the last event.
    Error {
        /// [`crate::RuntimeError::code`].
        code: lockbox_policy::ErrorCode,
        /// The message.
        message: String,
    },
}

/// A PTY's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// What a background process runs.
#[derive(Debug, Clone)]
pub enum ProcessCommand {
    /// An argv, executed directly (PATH searched).
    Argv(Vec<String>),
    /// A shell string, run by bash in the named session's current cwd and exported env
    /// (the default session when `None`).
    Shell {
        /// The script.
        script: String,
        /// The session whose cwd/env it inherits.
        session: Option<SessionId>,
    },
}

/// How to start a background process.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// What to run.
    pub command: ProcessCommand,
    /// Working directory.
    pub cwd: Option<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Run on a new PTY of this size (stdout and stderr are then one `pty` stream).
    pub pty: Option<PtySize>,
    /// Bound of its output log in bytes (default [`RuntimeConfig::default_log_bytes`]).
    pub log_bytes: Option<usize>,
    /// Keep stdin open for [`crate::Sandbox::write_stdin`]; false = `/dev/null`.
    pub stdin: bool,
}

/// A process's life state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Running.
    Running,
    /// Exited (or killed); exit code and log are retained.
    Exited,
}

/// A background process.
#[derive(Debug, Clone)]
pub struct ProcessInfo {
    /// Its id (`p1`, `p2`, ...).
    pub id: ProcessId,
    /// Its pid in the sandbox's pid namespace.
    pub pid: i32,
    /// Its argv (for a shell string: `["bash", "-c", script]`).
    pub command: Vec<String>,
    /// Running or exited.
    pub state: ProcessState,
    /// The exit code, once exited normally.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Start time.
    pub started_at: SystemTime,
    /// Runs on a PTY.
    pub pty: bool,
    /// Total bytes ever logged (the cursor a reader at the end would use).
    pub log_end: u64,
}

/// Which output a log segment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// The PTY (stdout and stderr together).
    Pty,
}

/// Contiguous bytes of one stream in a process's log.
#[derive(Debug, Clone)]
pub struct LogSegment {
    /// Which stream.
    pub stream: OutputStream,
    /// Cursor of its first byte.
    pub offset: u64,
    /// The bytes.
    pub data: Bytes,
}

/// A read of a process's log.
#[derive(Debug, Clone)]
pub struct LogChunk {
    /// Segments in order, contiguous from the first offset.
    pub segments: Vec<LogSegment>,
    /// The cursor for the next read.
    pub next: u64,
    /// Bytes asked for were evicted; the read resumed at the oldest retained byte.
    pub truncated: bool,
    /// The process exited and everything it wrote is in the log up to `next`.
    pub eof: bool,
}

/// A byte range of a file: `start..end` (end exclusive; `None` = to the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte; `None` = end of file.
    pub end: Option<u64>,
}

/// How to write a file.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Permission bits of the new file (default 0o644).
    pub mode: u32,
    /// Create missing parent directories (0o755).
    pub create_parents: bool,
    /// Extended attributes the new file has from the moment it is in place: names in the
    /// `user.` namespace (`user.e2b.author`), values without NUL. A file it replaces goes
    /// with its own. A file system without user extended attributes refuses them.
    pub xattrs: BTreeMap<String, String>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            mode: default_mode(),
            create_parents: true,
            xattrs: BTreeMap::new(),
        }
    }
}

fn default_mode() -> u32 {
    0o644
}

/// The type of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Device, FIFO or socket.
    Other,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStat {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Type.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Modification time.
    pub modified: SystemTime,
    /// For a symlink, its target.
    pub target: Option<String>,
    /// A regular file's or directory's extended attributes in the `user.` namespace whose
    /// values are UTF-8, by full name (`user.e2b.author`); those the sandbox may read.
    pub xattrs: BTreeMap<String, String>,
}

/// Which changes a commit takes (paths relative to the workdir; a directory covers its
/// subtree). Empty `only` = all.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Take only these (in JSON: strings, or `{"bytes": base64}` for names that are not
    /// UTF-8, as everywhere: `lockbox_policy::name`).
    pub only: Vec<PathBuf>,
    /// Leave these in the branch.
    pub exclude: Vec<PathBuf>,
    /// Commit even if the workdir changed under the branch at those paths.
    pub force: bool,
    /// Files committed with only some of their hunks (numbered as the diff gives them).
    pub hunks: Vec<HunkSelection>,
    /// The review this commit follows (the paths shown with their digests, or a listing's
    /// token): refused with `STALE_REVIEW` if the commit would write anything else
    /// (`lockbox_cow::Reviewed`). `None`: a commit that follows no review.
    pub review: Option<lockbox_cow::Reviewed>,
}

impl Selection {
    /// The commit engine's selection.
    pub fn to_cow(&self) -> lockbox_cow::Selection {
        lockbox_cow::Selection {
            only: self.only.clone(),
            exclude: self.exclude.clone(),
            hunks: self
                .hunks
                .iter()
                .map(|h| lockbox_cow::HunkChoice {
                    path: h.path.clone(),
                    accept: h.accept.clone(),
                })
                .collect(),
            review: self.review.clone(),
        }
    }
}

/// Some hunks of one file: the committed file is the workdir's with these hunks applied.
#[derive(Debug, Clone, Default)]
pub struct HunkSelection {
    /// The file, relative to the workdir (a string, or `{"bytes": base64}`).
    pub path: PathBuf,
    /// Hunk numbers (from 0, in file order, as the diff numbers them); empty: the file is
    /// not touched.
    pub accept: Vec<usize>,
}

/// What happens to the part of a kept branch a commit did not take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rest {
    /// It stays in the branch, listed and committable later.
    #[default]
    Keep,
    /// The branch is removed after the commit.
    Drop,
}

/// A kept branch of the state directory (one `lockbox run --workdir --on-exit keep` or a
/// failed run left, or one whose sandbox's runtime died).
#[derive(Debug, Clone)]
pub struct KeptBranch {
    /// The branch id.
    pub id: lockbox_cow::BranchId,
    /// The workdir it is a branch of (`None` if its record is unreadable).
    pub workdir: Option<PathBuf>,
    /// Its recorded state (`Active`: an orphan); `None`: its record is unreadable (on the
    /// wire, `damaged`).
    pub state: Option<lockbox_cow::BranchState>,
    /// What happened to it and what to do, in words.
    pub status: String,
    /// When it was made, if known.
    pub created: Option<SystemTime>,
    /// The command that made it, if recorded.
    pub command: Option<serde_json::Value>,
    /// How many changes it holds (`null` if they cannot be read).
    pub changes: Option<usize>,
}

/// A kept branch and its changes.
#[derive(Debug, Clone)]
pub struct KeptBranchDetail {
    /// The branch.
    pub branch: KeptBranch,
    /// Its changes, in path order, each with the digest a commit that follows this review
    /// names (`Selection::review`).
    pub change_list: Vec<lockbox_cow::ReviewedChange>,
}

/// What a workspace commit did.
#[derive(Debug, Clone)]
pub struct CommitSummary {
    /// The commit engine's report.
    pub report: lockbox_cow::CommitReport,
    /// Changes left in the branch (not selected).
    pub remaining: usize,
}

/// How to expose a port ([`crate::Sandbox::expose_port`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExposeOptions {
    /// Also listen on a host loopback port (`127.0.0.1`, chosen by the kernel) that
    /// forwards each connection into the sandbox.
    pub host_loopback: bool,
}

/// An exposed port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// The port inside the sandbox.
    pub port: u16,
    /// The path of its proxy on `lockbox serve` (`/v1/sandboxes/{id}/ports/{port}/`).
    pub path: String,
    /// The host loopback address forwarding to it (`127.0.0.1:41234`), if asked for.
    pub host_address: Option<String>,
}

#[cfg(test)]
mod signal_tests {
    use super::Signal;

    #[test]
    fn signals_are_taken_by_number_or_name_and_nothing_else() {
        for s in ["15", "TERM", "SIGTERM", "sigterm", "term"] {
            assert_eq!(Signal::parse(s).unwrap(), Signal::TERM, "{s}");
        }
        assert_eq!(Signal::from_number(64).unwrap().number(), 64);
        for bad in ["0", "65", "-9", "TERMINATE", "", "SIG"] {
            let e = Signal::parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("invalid signal: "), "{bad}: {e}");
        }
    }
}

/// How to create a code context ([`crate::Sandbox::create_context`]).
#[derive(Debug, Clone)]
pub struct ContextOptions {
    /// Its id; generated when absent. `[A-Za-z0-9_.-]{1,64}`.
    pub id: Option<ContextId>,
    /// Python (default), bash or Node (a front end turns a name into it, e.g.
    /// [`Language::from_name`]).
    pub language: crate::Language,
    /// Working directory of the interpreter (inside the sandbox).
    pub cwd: Option<String>,
    /// Extra environment of the interpreter (e.g. a `PATH` to another `python3`).
    pub env: BTreeMap<String, String>,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            id: None,
            language: crate::Language::Python,
            cwd: None,
            env: BTreeMap::new(),
        }
    }
}

/// A code context.
#[derive(Debug, Clone)]
pub struct ContextInfo {
    /// Its id (`default` for the one runs without a context use).
    pub id: ContextId,
    /// What it runs.
    pub language: crate::Language,
    /// The working directory it was created with (`None`: the sandbox's).
    pub cwd: Option<String>,
    /// Creation time.
    pub created_at: SystemTime,
    /// Pid of its interpreter; `None` while none runs (before the first run, after a
    /// crash or a kill: the next run starts a fresh one).
    pub pid: Option<i32>,
    /// Runs so far.
    pub runs: u64,
    /// Times its interpreter was replaced (after a crash or a timeout kill).
    pub restarts: u64,
}

/// One run of code in a context.
#[derive(Debug, Clone, Default)]
pub struct RunCodeRequest {
    /// The code: Python statements (the last expression's value is the main result) or
    /// bash text.
    pub code: String,
    /// The context; `None` = the sandbox's `default` Python context (created on use).
    pub context: Option<ContextId>,
    /// Interrupt the run after this long (SIGINT; then, after
    /// [`crate::CONTEXT_INTERRUPT_GRACE`], kill and restart the interpreter). Default
    /// [`crate::DEFAULT_RUN_TIMEOUT`].
    pub timeout: Option<Duration>,
    /// Environment variables for this run only: set in the interpreter before the code
    /// runs (and so inherited by what it starts), given their earlier values (or unset)
    /// when it ends. Names are `[A-Za-z_][A-Za-z0-9_]*`; values hold no NUL byte.
    pub env: Vec<(String, String)>,
}

pub use lockbox_agent::contexts::{DisplayData, ExecError, Language};

/// The output of a run, as chunks in the order they were read.
#[derive(Debug, Clone, Default)]
pub struct Logs {
    /// stdout chunks (UTF-8, invalid bytes replaced).
    pub stdout: Vec<String>,
    /// stderr chunks.
    pub stderr: Vec<String>,
}

/// The outcome of [`crate::Sandbox::run_code`], in the shape E2B's and Cloudflare's code
/// interpreters use: `results` (rich values), `logs`, `error`.
#[derive(Debug, Clone)]
pub struct Execution {
    /// The context it ran in.
    pub context: ContextId,
    /// `display()` calls, matplotlib figures and the last expression's value, in order.
    pub results: Vec<DisplayData>,
    /// stdout and stderr, each bounded by [`RuntimeConfig::max_exec_output`] bytes of JSON
    /// (a control character counts 6: `\u0001`); `results` and `error` together by as much
    /// again.
    pub logs: Logs,
    /// The exception (`name`, `value`, `traceback`); `KeyboardInterrupt` after a timeout
    /// the code survived, `Timeout` when the interpreter had to be killed,
    /// `InterpreterDied` when it crashed, `ExitCode` for a failing bash command.
    pub error: Option<ExecError>,
    /// bash: the exit status of the code's last command.
    pub exit_code: Option<i32>,
    /// The run was interrupted by its timeout.
    pub timed_out: bool,
    /// The interpreter ended during this run (crash or timeout kill): the context's
    /// variables and imports are gone; the next run starts a fresh interpreter.
    pub state_lost: bool,
    /// Output, results or error text beyond their bound (see [`Execution::logs`]) was
    /// dropped.
    pub truncated: bool,
    /// Wall time of the run in milliseconds.
    pub duration_ms: u64,
}

impl Execution {
    /// A run in `context` that has produced nothing yet.
    pub fn in_context(context: ContextId) -> Execution {
        Execution {
            context,
            results: Vec::new(),
            logs: Logs::default(),
            error: None,
            exit_code: None,
            timed_out: false,
            state_lost: false,
            truncated: false,
            duration_ms: 0,
        }
    }
}

/// One event of a streamed run ([`crate::Sandbox::run_code_stream`]).
#[derive(Debug, Clone)]
pub enum CodeEvent {
    /// Text on stdout.
    Stdout {
        /// The text.
        text: String,
    },
    /// Text on stderr.
    Stderr {
        /// The text.
        text: String,
    },
    /// A rich result.
    Result(DisplayData),
    /// The code raised (also in the final execution).
    Error(ExecError),
    /// The run is over; the whole execution (the last event).
    End(Box<Execution>),
}
