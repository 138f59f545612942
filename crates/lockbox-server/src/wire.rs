//! Request bodies and query strings of the API, and their one conversion each into the
//! runtime's types. Unknown fields are refused everywhere; `*_ms` fields are milliseconds
//! (the only place units are bare numbers). Also the replies whose wire form differs from
//! the runtime's type ([`FileInfo`]: permission bits as octal text, as they are given;
//! [`SandboxInfo`] and the other records with a time: the time as RFC 3339 text).

use crate::error::ApiError;
use crate::openapi::{ByteSizeValue, Name, NetChoice};
use crate::openapi::{MAX_GRACE_MS, MAX_LOG_BYTES, MAX_MS};
use base64::Engine;
use lockbox_policy::{ByteSize, Net, Policy, PolicyError};
use lockbox_runtime::{
    ExecRequest, FileKind, FileStat, OnExit, ProcessCommand, ProcessSpec, PtySize, SandboxSpec,
    SandboxState, Selection, SessionOptions,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/sandboxes`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CreateSandbox {
    /// Extra absolute host paths readable inside.
    #[schema(value_type = Vec<String>)]
    pub fs_readable: Vec<PathBuf>,
    /// Absolute host paths writable inside: writes reach the host directly, with no branch.
    #[schema(value_type = Vec<String>)]
    pub fs_writable: Vec<PathBuf>,
    /// Grant /usr, /bin, /sbin, /lib, /lib64 and /etc (minus secrets) read-only (default
    /// true).
    pub default_reads: Option<bool>,
    /// `none` (loopback only, default) or `host`.
    #[schema(value_type = Option<NetChoice>)]
    pub net: Option<Net>,
    /// Memory limit, bytes or `512M`.
    #[schema(value_type = Option<ByteSizeValue>)]
    pub max_memory: Option<ByteSize>,
    /// Processes and threads.
    #[schema(minimum = 1)]
    pub max_processes: Option<u64>,
    /// Descriptors per process.
    #[schema(minimum = 1)]
    pub max_open_files: Option<u64>,
    /// Largest file written, bytes or `100M`.
    #[schema(value_type = Option<ByteSizeValue>)]
    pub max_file_size: Option<ByteSize>,
    /// Inodes per writable tmpfs (`/tmp`, `/dev/shm`, a bounded branch).
    #[schema(minimum = 1)]
    pub max_inodes: Option<u64>,
    /// Wall-clock lifetime of the sandbox.
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub timeout_ms: Option<u64>,
    /// SIGTERM → SIGKILL delay when processes are stopped.
    #[schema(maximum = 60_000)]
    pub kill_grace_ms: Option<u64>,
    /// Variables set in every session and process.
    pub env: BTreeMap<String, String>,
    /// Start from an empty environment instead of PATH, LANG, LC_ALL, TERM, HOME=/tmp.
    pub clean_env: bool,
    /// Absolute working directory inside (default: workdir, else /tmp).
    #[schema(value_type = Option<String>)]
    pub cwd: Option<PathBuf>,
    /// Hostname inside.
    pub hostname: Option<String>,
    /// Absolute host directory the sandbox sees (at the same path) through a copy-on-write
    /// branch: writes stay in the branch until committed (see changes, diff, commit, abort).
    #[serde(with = "lockbox_policy::name::json::option")]
    #[schema(value_type = Option<Name>)]
    pub workdir: Option<PathBuf>,
    /// What deleting the sandbox does with the branch: `keep` (default), `commit`, `abort`.
    pub on_exit: Option<OnExitName>,
    /// Delete the sandbox after this long without a request.
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub idle_timeout_ms: Option<u64>,
    /// Free-form labels, returned as given.
    pub labels: BTreeMap<String, String>,
    /// Start from this snapshot's files (a fork of it); `workdir` is then the snapshot's.
    pub from_snapshot: Option<String>,
    /// Approvals: with `net.allow`, an unlisted destination is asked (`GET approvals`), not
    /// refused.
    pub net_ask: bool,
    /// How long a question waits for its verdict before the call is denied (default
    /// 30,000); needs `net_ask`.
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub net_ask_timeout_ms: Option<u64>,
    /// `HOST bearer NAME` or `HOST header HEADER-NAME NAME`: lockbox terminates the
    /// sandbox's HTTPS to HOST and puts the server's credential NAME (`lockbox serve
    /// --credential`) on each request; HOST must be allowed by name in `net.allow`.
    pub http_auth: Vec<String>,
    /// `METHOD HOST/PATH-PREFIX`: on HOST (intercepted), only the listed requests pass.
    pub http_allow: Vec<String>,
    /// An OCI image the sandbox runs on instead of the host's userland (`busybox:1.36`,
    /// `ghcr.io/org/app:1`, `oci:/srv/images/app:v1`; see docs/images.md): pulled into the
    /// server's image store if it lacks it, held while the sandbox lives. Its Env,
    /// WorkingDir and User apply to every session and process; sessions need `bash` in
    /// the image. An agent (MCP, scoped token) may name only images its ceiling allows
    /// (`--allow-image`).
    pub image: Option<String>,
    /// When `image` is pulled: `missing` (the default: only when the server's store lacks
    /// it), `always` (pulled again: a tag may have moved), `never` (an image not in the
    /// store is `IMAGE_NOT_FOUND`). Needs `image`.
    pub image_pull: Option<ImagePull>,
}

/// When a sandbox's `image` is pulled (`image_pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImagePull {
    /// Only when the store lacks it.
    Missing,
    /// Every time.
    Always,
    /// Never: an image not in the store is an error.
    Never,
}

/// One rule of `http_auth` or `http_allow`, parsed; errors name the field.
fn parse_rules<T>(field: &str, rules: &[String]) -> Result<Vec<T>, ApiError>
where
    T: std::str::FromStr<Err = lockbox_runtime::InterceptError>,
{
    rules
        .iter()
        .map(|rule| {
            rule.parse::<T>().map_err(|e| {
                let why = match e {
                    lockbox_runtime::InterceptError::BadRule { reason, .. } => reason,
                    other => other.to_string(),
                };
                ApiError::invalid(field, format!("{field}: {rule:?}: {why}"))
            })
        })
        .collect()
}

impl CreateSandbox {
    /// The one conversion from the HTTP body to a policy and a sandbox spec.
    pub fn into_spec(self) -> Result<SandboxSpec, ApiError> {
        let mut policy = Policy::default();
        policy.fs.read = self.fs_readable;
        policy.fs.write = self.fs_writable;
        if let Some(default_reads) = self.default_reads {
            policy.fs.default_reads = default_reads;
        }
        policy.net = self.net.unwrap_or_default();
        policy.limits.memory = self.max_memory;
        policy.limits.processes = self.max_processes;
        policy.limits.open_files = self.max_open_files;
        policy.limits.file_size = self.max_file_size;
        policy.limits.inodes = self.max_inodes;
        policy.timeout = self.timeout_ms.map(Duration::from_millis);
        if let Some(ms) = self.kill_grace_ms {
            policy.kill_grace = Duration::from_millis(ms);
        }
        policy.env.set = self.env;
        policy.env.clean = self.clean_env;
        policy.cwd = self.cwd;
        if let Some(image) = self.image {
            if image.trim().is_empty() {
                return Err(ApiError::invalid("image", "image: must not be empty"));
            }
            policy.image = Some(image);
        }
        let image_pull = match (self.image_pull, &policy.image) {
            (None, _) => lockbox_image::PullPolicy::Missing,
            (Some(_), None) => {
                return Err(ApiError::invalid(
                    "image_pull",
                    "image_pull says when to pull the sandbox's image: give image too",
                ))
            }
            (Some(ImagePull::Missing), Some(_)) => lockbox_image::PullPolicy::Missing,
            (Some(ImagePull::Always), Some(_)) => lockbox_image::PullPolicy::Always,
            (Some(ImagePull::Never), Some(_)) => lockbox_image::PullPolicy::Never,
        };
        if let Some(hostname) = self.hostname {
            policy.hostname = hostname;
        }
        check_ms("timeout_ms", self.timeout_ms, MAX_MS)?;
        check_ms("kill_grace_ms", self.kill_grace_ms, MAX_GRACE_MS)?;
        check_ms("idle_timeout_ms", self.idle_timeout_ms, MAX_MS)?;
        check_ms("net_ask_timeout_ms", self.net_ask_timeout_ms, MAX_MS)?;
        let net_ask = match (self.net_ask, self.net_ask_timeout_ms) {
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "net_ask_timeout_ms",
                    "net_ask_timeout_ms: needs net_ask: true",
                ))
            }
            (true, _) if !matches!(policy.net, Net::Allow(_)) => {
                return Err(ApiError::invalid(
                    "net_ask",
                    "net_ask: asks about destinations off the allow-list, so it needs net {\"allow\": [...]}",
                ))
            }
            (true, Some(0)) => {
                return Err(ApiError::invalid(
                    "net_ask_timeout_ms",
                    "net_ask_timeout_ms: must be greater than zero",
                ))
            }
            (true, ms) => Some(
                ms.map_or(lockbox_runtime::DEFAULT_ASK_TIMEOUT, Duration::from_millis),
            ),
        };
        policy.validate().map_err(policy_error)?;
        let http = lockbox_runtime::HttpRules::new(
            parse_rules("http_auth", &self.http_auth)?,
            parse_rules("http_allow", &self.http_allow)?,
        )
        .map_err(|e| ApiError::invalid("http_auth", format!("http_auth: {e}")))?;
        if let Some(workdir) = &self.workdir {
            if !workdir.is_absolute() {
                return Err(ApiError::invalid(
                    "workdir",
                    format!("workdir: path {workdir:?} must be absolute"),
                ));
            }
        }
        if self.idle_timeout_ms == Some(0) {
            return Err(ApiError::invalid(
                "idle_timeout_ms",
                "idle_timeout_ms: must be greater than zero (leave it out for none)",
            ));
        }
        Ok(SandboxSpec {
            policy,
            workdir: self.workdir,
            on_exit: self.on_exit.map(OnExit::from).unwrap_or_default(),
            idle_timeout: self.idle_timeout_ms.map(Duration::from_millis),
            labels: self.labels,
            from_snapshot: self
                .from_snapshot
                .map(|s| {
                    lockbox_runtime::SnapshotId::parse(&s).map_err(|e| {
                        ApiError::invalid("from_snapshot", format!("from_snapshot: {e}"))
                    })
                })
                .transpose()?,
            net_ask,
            http,
            image_pull,
            ..SandboxSpec::default()
        })
    }
}

/// What deleting a sandbox does with its branch, as a client names it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExitName {
    /// `keep`.
    Keep,
    /// `commit`.
    Commit,
    /// `abort`.
    Abort,
}

impl From<OnExitName> for OnExit {
    fn from(o: OnExitName) -> OnExit {
        match o {
            OnExitName::Keep => OnExit::Keep,
            OnExitName::Commit => OnExit::Commit,
            OnExitName::Abort => OnExit::Abort,
        }
    }
}

/// Refuses a duration beyond `max` milliseconds (a deadline that far is a client bug, and
/// would overflow clock arithmetic further down).
pub fn check_ms(field: &str, value: Option<u64>, max: u64) -> Result<(), ApiError> {
    match value {
        Some(ms) if ms > max => Err(ApiError::invalid(
            field,
            format!("{field}: {ms} is more than the maximum {max}"),
        )),
        _ => Ok(()),
    }
}

/// A refused policy as `INVALID_REQUEST`, naming the field as the client spelled it.
fn policy_error(e: PolicyError) -> ApiError {
    let message = e.to_string();
    let (field, message) = match &e {
        PolicyError::RelativePath { field, .. }
        | PolicyError::ReservedPath { field, .. }
        | PolicyError::Invalid { field, .. } => {
            let wire = wire_field(field);
            // The policy names its own field (`fs.write: ...`); say it as the client did.
            let rest = message.strip_prefix(field).unwrap_or(&message);
            (wire, format!("{wire}{rest}"))
        }
        PolicyError::BadEnv { .. } => ("env", message),
        _ => ("", message),
    };
    ApiError::invalid(field, message)
}

/// A policy field as `/v1` and MCP name it (`fs.read` is `fs_readable`).
pub(crate) fn wire_field(policy_field: &'static str) -> &'static str {
    match policy_field {
        "fs.read" => "fs_readable",
        "fs.write" => "fs_writable",
        "timeout" => "timeout_ms",
        "kill_grace" => "kill_grace_ms",
        "cwd" => "cwd",
        "hostname" => "hostname",
        "limits.memory" => "max_memory",
        "limits.processes" => "max_processes",
        "limits.open_files" => "max_open_files",
        "limits.file_size" => "max_file_size",
        "limits.inodes" => "max_inodes",
        other => other,
    }
}

/// `POST /v1/sandboxes/{id}/sessions`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CreateSession {
    /// The session's id (generated when absent).
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub id: Option<String>,
    /// Initial working directory.
    pub cwd: Option<String>,
    /// Variables exported in the session.
    pub env: BTreeMap<String, String>,
}

impl CreateSession {
    /// The runtime's options.
    pub fn into_options(self) -> SessionOptions {
        SessionOptions {
            id: self.id.map(Into::into),
            cwd: self.cwd,
            env: self.env,
        }
    }
}

/// `POST /v1/sandboxes/{id}/exec` and `/exec/stream`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ExecRequest)]
pub struct Exec {
    /// A bash command line, run in the session.
    pub command: String,
    /// The session (the sandbox's default session when absent).
    #[serde(default)]
    pub session: Option<String>,
    /// Working directory for this call only.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Variables for this call only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kill the command (TERM, grace, KILL of its tree) after this long; exit 124.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub timeout_ms: Option<u64>,
    /// Bytes for the command's stdin (closed when absent).
    #[serde(default)]
    #[schema(format = Byte)]
    pub stdin_b64: Option<String>,
    /// Text for the command's stdin (alternative to `stdin_b64`).
    #[serde(default)]
    pub stdin: Option<String>,
}

impl Exec {
    /// The runtime's request.
    pub fn into_request(self) -> Result<ExecRequest, ApiError> {
        if self.timeout_ms == Some(0) {
            return Err(ApiError::invalid(
                "timeout_ms",
                "timeout_ms: must be greater than zero",
            ));
        }
        check_ms("timeout_ms", self.timeout_ms, MAX_MS)?;
        let stdin = match (self.stdin_b64, self.stdin) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "stdin",
                    "give either stdin or stdin_b64, not both",
                ))
            }
            (Some(b64), None) => Some(decode_b64("stdin_b64", &b64)?.into()),
            (None, Some(text)) => Some(text.into_bytes().into()),
            (None, None) => None,
        };
        Ok(ExecRequest {
            command: self.command,
            session: self.session.map(Into::into),
            cwd: self.cwd,
            env: self.env,
            timeout: self.timeout_ms.map(Duration::from_millis),
            stdin,
        })
    }
}

/// Decodes standard base64, naming the field on error.
pub fn decode_b64(field: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| ApiError::invalid(field, format!("{field}: invalid base64: {e}")))
}

/// PTY size.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PtySize)]
pub struct Size {
    /// Columns.
    #[schema(minimum = 1, maximum = 65535)]
    pub cols: u16,
    /// Rows.
    #[schema(minimum = 1, maximum = 65535)]
    pub rows: u16,
}

impl Size {
    /// Refuses a zero dimension.
    pub fn check(self, field: &str) -> Result<PtySize, ApiError> {
        if self.cols == 0 || self.rows == 0 {
            return Err(ApiError::invalid(
                field,
                format!("{field}: cols and rows must be at least 1"),
            ));
        }
        Ok(PtySize {
            cols: self.cols,
            rows: self.rows,
        })
    }
}

/// `POST /v1/sandboxes/{id}/processes`: exactly one of `argv` and `command`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StartProcess {
    /// Program and arguments, run directly.
    #[schema(min_items = 1)]
    pub argv: Option<Vec<String>>,
    /// A bash command line, run with the cwd and environment of `session`.
    pub command: Option<String>,
    /// The session whose state `command` starts from.
    pub session: Option<String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Extra variables.
    pub env: BTreeMap<String, String>,
    /// Run on a pseudo-terminal of this size.
    pub pty: Option<Size>,
    /// Bound of the output log in bytes (default: the server's).
    #[schema(minimum = 1, maximum = 1_073_741_824)]
    pub log_bytes: Option<usize>,
    /// Keep stdin open for writes (default: stdin is /dev/null).
    pub stdin: bool,
}

impl StartProcess {
    /// The runtime's spec.
    pub fn into_spec(self) -> Result<ProcessSpec, ApiError> {
        let command =
            match (self.argv, self.command) {
                (Some(argv), None) => {
                    if argv.is_empty() || argv[0].is_empty() {
                        return Err(ApiError::invalid("argv", "argv: needs a program name"));
                    }
                    if self.session.is_some() {
                        return Err(ApiError::invalid(
                            "session",
                            "session applies to `command`, not to `argv`",
                        ));
                    }
                    ProcessCommand::Argv(argv)
                }
                (None, Some(script)) => ProcessCommand::Shell {
                    script,
                    session: self.session.map(Into::into),
                },
                _ => return Err(ApiError::invalid(
                    "argv",
                    "give exactly one of argv (program and arguments) and command (a shell line)",
                )),
            };
        if self.log_bytes == Some(0) {
            return Err(ApiError::invalid(
                "log_bytes",
                "log_bytes: must be greater than zero",
            ));
        }
        check_ms("log_bytes", self.log_bytes.map(|b| b as u64), MAX_LOG_BYTES)?;
        Ok(ProcessSpec {
            command,
            cwd: self.cwd,
            env: self.env,
            pty: self.pty.map(|s| s.check("pty")).transpose()?,
            log_bytes: self.log_bytes,
            stdin: self.stdin,
        })
    }
}

/// A signal by name (`TERM`, `SIGTERM`) or number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SignalName {
    /// `15`.
    Number(i32),
    /// `"TERM"`, `"SIGTERM"`.
    Name(String),
}

impl SignalName {
    /// The signal, refusing unknown names and numbers outside 1..=64.
    pub fn signal(&self) -> Result<lockbox_runtime::Signal, ApiError> {
        match self {
            SignalName::Number(n) => lockbox_runtime::Signal::from_number(*n),
            SignalName::Name(name) => lockbox_runtime::Signal::parse(name),
        }
        .map_err(ApiError::from)
    }
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SignalRequest)]
pub struct Signal {
    /// The signal, to the whole process tree.
    #[schema(schema_with = crate::openapi::signal_name)]
    pub signal: SignalName,
}

/// `DELETE .../processes/{pid}?grace_ms=`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct KillQuery {
    /// SIGTERM → SIGKILL delay (default 2000).
    #[param(maximum = 60_000)]
    pub grace_ms: Option<u64>,
}

/// `GET .../processes/{pid}/logs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// Cursor to read from (0: the oldest byte kept).
    pub since: Option<u64>,
    /// Stream live (SSE) after the replay.
    pub follow: bool,
    /// Most bytes in one (non-follow) reply.
    #[param(minimum = 1)]
    pub max_bytes: Option<usize>,
}

/// `POST .../processes/{pid}/stdin` with a JSON body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(as = StdinRequest)]
pub struct Stdin {
    /// Text to write.
    pub data: Option<String>,
    /// Bytes to write.
    #[schema(format = Byte)]
    pub data_b64: Option<String>,
    /// Close stdin after writing.
    pub close: bool,
}

/// `POST .../processes/{pid}/stdin?close=` with a raw body.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StdinQuery {
    /// Close stdin after writing.
    pub close: bool,
}

/// `?path=` of `GET/PUT files` and `fs/stat`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// Absolute inside the sandbox, or relative to its working directory.
    pub path: String,
}

/// `PUT files?path=&mode=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PutQuery {
    /// Where to write.
    pub path: String,
    /// Permission bits, octal text (`644`, `0755`).
    #[serde(default)]
    #[param(pattern = "^[0-7]{1,4}$")]
    pub mode: Option<String>,
}

impl PutQuery {
    /// The mode as a number.
    pub fn mode(&self) -> Result<Option<u32>, ApiError> {
        self.mode
            .as_deref()
            .map(|m| {
                u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        ApiError::invalid("mode", format!("mode: {m:?} is not octal bits (0644)"))
                    })
            })
            .transpose()
    }
}

/// A file's metadata as `fs/stat`, `fs/list` and `PUT files` send it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = FileStat)]
pub struct FileInfo {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: FileKindName,
    pub size: u64,
    /// Permission bits as octal text (`"0644"`, `"4755"`): what `PUT files?mode=` takes,
    /// not the decimal 420 a client would have to convert.
    #[schema(pattern = "^[0-7]{4}$")]
    pub mode: String,
    pub modified: String,
    #[schema(required = true)]
    pub target: Option<String>,
}

impl From<FileStat> for FileInfo {
    fn from(stat: FileStat) -> FileInfo {
        FileInfo {
            path: stat.path,
            kind: match stat.kind {
                FileKind::File => FileKindName::File,
                FileKind::Dir => FileKindName::Dir,
                FileKind::Symlink => FileKindName::Symlink,
                FileKind::Other => FileKindName::Other,
            },
            size: stat.size,
            mode: format!("{:04o}", stat.mode & 0o7777),
            modified: time(stat.modified),
            target: stat.target,
        }
    }
}

/// The type of a file as `fs/stat` names it.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKindName {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

/// A time on the wire: RFC 3339 UTC with milliseconds (`2026-11-18T11:06:40.000Z`).
fn time(t: SystemTime) -> String {
    lockbox_policy::time::format(t)
}

/// Each of `items` in its wire form.
pub fn each<T, W: From<T>>(items: Vec<T>) -> Vec<W> {
    items.into_iter().map(W::from).collect()
}

/// A sandbox as the API shows it ([`lockbox_runtime::SandboxInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Sandbox)]
pub struct SandboxInfo {
    pub id: String,
    /// `running`, `stopped` or `lost`.
    pub state: StateName,
    pub created_at: String,
    #[serde(serialize_with = "lockbox_policy::name::json::option::serialize")]
    #[schema(value_type = Option<Name>, required = true)]
    pub workdir: Option<PathBuf>,
    #[schema(required = true)]
    pub branch: Option<String>,
    /// What deleting the sandbox did with its branch.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = BranchActionName, required = false)]
    pub branch_action: Option<BranchActionName>,
    pub labels: BTreeMap<String, String>,
    pub sessions: usize,
    pub processes: usize,
    #[schema(required = true)]
    pub policy: Option<PolicySummary>,
    #[schema(required = true)]
    pub usage: Option<ResourceUse>,
}

/// What deleting a sandbox did with its branch ([`lockbox_runtime::BranchAction`]).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchActionName {
    /// Kept for later (`lockbox branch`).
    Kept,
    /// Committed to the workdir.
    Committed,
    /// Discarded.
    Aborted,
    /// There was nothing in it.
    Empty,
}

impl From<lockbox_runtime::BranchAction> for BranchActionName {
    fn from(a: lockbox_runtime::BranchAction) -> BranchActionName {
        use lockbox_runtime::BranchAction as A;
        match a {
            A::Kept => BranchActionName::Kept,
            A::Committed => BranchActionName::Committed,
            A::Aborted => BranchActionName::Aborted,
            A::Empty => BranchActionName::Empty,
        }
    }
}

impl From<lockbox_runtime::SandboxInfo> for SandboxInfo {
    fn from(i: lockbox_runtime::SandboxInfo) -> SandboxInfo {
        SandboxInfo {
            id: i.id.into(),
            state: i.state.into(),
            created_at: time(i.created_at),
            workdir: i.workdir,
            branch: i.branch.map(|b| b.to_string()),
            branch_action: i.branch_action.map(BranchActionName::from),
            labels: i.labels,
            sessions: i.sessions,
            processes: i.processes,
            policy: i.policy.map(PolicySummary::from),
            usage: i.usage.map(ResourceUse::from),
        }
    }
}

/// A sandbox's policy in brief ([`lockbox_runtime::PolicySummary`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicySummary {
    /// `none` (loopback only), `host`, `allow` (only `net_destinations`) or `deny` (all but
    /// `net_destinations`).
    pub net: NetKindName,
    #[schema(value_type = Vec<String>)]
    pub net_destinations: Vec<lockbox_policy::NetSpec>,
    pub default_reads: bool,
    #[serde(serialize_with = "lockbox_policy::name::json::vec::serialize")]
    #[schema(value_type = Vec<Name>)]
    pub fs_readable: Vec<PathBuf>,
    #[serde(serialize_with = "lockbox_policy::name::json::vec::serialize")]
    #[schema(value_type = Vec<Name>)]
    pub fs_writable: Vec<PathBuf>,
    #[schema(required = true)]
    pub max_memory_bytes: Option<u64>,
    #[schema(required = true)]
    pub max_processes: Option<u64>,
    #[schema(required = true)]
    pub max_cpu_time_ms: Option<u64>,
    #[schema(required = true)]
    pub max_file_size_bytes: Option<u64>,
    #[schema(required = true)]
    pub idle_timeout_ms: Option<u64>,
    /// The OCI image it runs on (`image` as created), `null` for the host's userland.
    #[schema(required = true)]
    pub image: Option<String>,
}

/// A sandbox's network ([`lockbox_runtime::NetKind`]).
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetKindName {
    /// Loopback only.
    None,
    /// The host's network.
    Host,
    /// Only `net_destinations`.
    Allow,
    /// All but `net_destinations`.
    Deny,
}

impl From<lockbox_runtime::PolicySummary> for PolicySummary {
    fn from(p: lockbox_runtime::PolicySummary) -> PolicySummary {
        use lockbox_runtime::NetKind;
        PolicySummary {
            net: match p.net {
                NetKind::None => NetKindName::None,
                NetKind::Host => NetKindName::Host,
                NetKind::Allow => NetKindName::Allow,
                NetKind::Deny => NetKindName::Deny,
            },
            net_destinations: p.net_destinations,
            default_reads: p.default_reads,
            fs_readable: p.fs_readable,
            fs_writable: p.fs_writable,
            max_memory_bytes: p.max_memory_bytes,
            max_processes: p.max_processes,
            max_cpu_time_ms: p.max_cpu_time.map(ms),
            max_file_size_bytes: p.max_file_size_bytes,
            idle_timeout_ms: p.idle_timeout.map(ms),
            image: p.image,
        }
    }
}

/// What a running sandbox's processes use ([`lockbox_runtime::ResourceUse`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct ResourceUse {
    pub processes: u32,
    pub threads: u32,
    pub rss_bytes: u64,
    pub cpu_ms: u64,
}

impl From<lockbox_runtime::ResourceUse> for ResourceUse {
    fn from(u: lockbox_runtime::ResourceUse) -> ResourceUse {
        ResourceUse {
            processes: u.processes,
            threads: u.threads,
            rss_bytes: u.rss_bytes,
            cpu_ms: ms(u.cpu),
        }
    }
}

/// A duration on the wire: whole milliseconds (saturating).
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A session ([`lockbox_runtime::SessionInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Session)]
pub struct SessionInfo {
    pub id: String,
    pub pid: i32,
    pub created_at: String,
    pub busy: bool,
}

impl From<lockbox_runtime::SessionInfo> for SessionInfo {
    fn from(i: lockbox_runtime::SessionInfo) -> SessionInfo {
        SessionInfo {
            id: i.id.into(),
            pid: i.pid,
            created_at: time(i.created_at),
            busy: i.busy,
        }
    }
}

/// A background process ([`lockbox_runtime::ProcessInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Process)]
pub struct ProcessInfo {
    pub id: String,
    pub pid: i32,
    pub command: Vec<String>,
    /// `running` or `exited`.
    pub state: ProcessStateName,
    #[schema(required = true)]
    pub exit_code: Option<i32>,
    #[schema(required = true)]
    pub signal: Option<i32>,
    pub started_at: String,
    pub pty: bool,
    pub log_end: u64,
}

impl From<lockbox_runtime::ProcessInfo> for ProcessInfo {
    fn from(i: lockbox_runtime::ProcessInfo) -> ProcessInfo {
        ProcessInfo {
            id: i.id.into(),
            pid: i.pid,
            command: i.command,
            state: match i.state {
                lockbox_runtime::ProcessState::Running => ProcessStateName::Running,
                lockbox_runtime::ProcessState::Exited => ProcessStateName::Exited,
            },
            exit_code: i.exit_code,
            signal: i.signal,
            started_at: time(i.started_at),
            pty: i.pty,
            log_end: i.log_end,
        }
    }
}

/// A background process's state.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessStateName {
    /// Still running.
    Running,
    /// Exited (`exit_code` or `signal` say how).
    Exited,
}

/// A code context ([`lockbox_runtime::ContextInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Context)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    #[schema(required = true)]
    pub cwd: Option<String>,
    pub created_at: String,
    #[schema(required = true)]
    pub pid: Option<i32>,
    pub runs: u64,
    pub restarts: u64,
}

impl From<lockbox_runtime::ContextInfo> for ContextInfo {
    fn from(i: lockbox_runtime::ContextInfo) -> ContextInfo {
        ContextInfo {
            id: i.id.into(),
            language: i.language.as_str().to_owned(),
            cwd: i.cwd,
            created_at: time(i.created_at),
            pid: i.pid,
            runs: i.runs,
            restarts: i.restarts,
        }
    }
}

/// A snapshot ([`lockbox_runtime::SnapshotInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Snapshot)]
pub struct SnapshotInfo {
    #[schema(value_type = String)]
    pub id: lockbox_runtime::SnapshotId,
    #[schema(required = true)]
    pub name: Option<String>,
    #[schema(value_type = Option<String>, required = true)]
    pub parent: Option<lockbox_runtime::SnapshotId>,
    #[schema(required = true)]
    pub sandbox: Option<String>,
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Name)]
    pub workdir: PathBuf,
    pub created_at: String,
    pub bytes: u64,
    pub entries: u64,
}

impl From<lockbox_runtime::SnapshotInfo> for SnapshotInfo {
    fn from(i: lockbox_runtime::SnapshotInfo) -> SnapshotInfo {
        SnapshotInfo {
            id: i.id,
            name: i.name,
            parent: i.parent,
            sandbox: i.sandbox.map(String::from),
            workdir: i.workdir,
            created_at: time(i.created_at),
            bytes: i.bytes,
            entries: i.entries,
        }
    }
}

/// A kept branch as `GET /v1/branches` lists it ([`lockbox_runtime::KeptBranch`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Branch)]
pub struct KeptBranch {
    pub id: String,
    #[serde(serialize_with = "lockbox_policy::name::json::option::serialize")]
    #[schema(value_type = Option<Name>)]
    pub workdir: Option<PathBuf>,
    /// `kept`, `stale`, `commit_failed`, `committing`, `active` (an orphan), or `damaged`
    /// (its record is unreadable).
    pub state: &'static str,
    pub status: String,
    pub created: Option<String>,
    /// The command the branch was made by, as its record has it.
    #[schema(value_type = Option<Value>)]
    pub command: Option<serde_json::Value>,
    pub changes: Option<usize>,
}

impl From<lockbox_runtime::KeptBranch> for KeptBranch {
    fn from(b: lockbox_runtime::KeptBranch) -> KeptBranch {
        KeptBranch {
            id: b.id.to_string(),
            workdir: b.workdir,
            state: b
                .state
                .map_or("damaged", lockbox_runtime::BranchState::name),
            status: b.status,
            created: b.created.map(time),
            command: b.command,
            changes: b.changes,
        }
    }
}

/// The changes of `GET changes`, each with its `mode` as octal text as [`FileInfo`] has it.
/// Serialised one change at a time: a `json!` value of the whole list would be a second,
/// larger copy of every change.
#[derive(Debug)]
pub struct ChangeList(pub Vec<lockbox_runtime::Change>);

impl Serialize for ChangeList {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for change in &self.0 {
            seq.serialize_element(&change_json::<S>(change, None)?)?;
        }
        seq.end()
    }
}

fn change_json<S: serde::Serializer>(
    change: &lockbox_runtime::Change,
    digest: Option<&lockbox_runtime::ContentDigest>,
) -> Result<serde_json::Value, S::Error> {
    use serde::ser::Error;
    let mut value = serde_json::to_value(change).map_err(S::Error::custom)?;
    value["mode"] = format!("{:04o}", change.mode & 0o7777).into();
    if let Some(d) = digest {
        value["digest"] = d.to_string().into();
    }
    Ok(value)
}

/// A review: the changes of [`ChangeList`], each with the `digest` of what the branch has at
/// its path, and `review_token`, the digest of the whole listing. A commit that follows it
/// names it ([`ReviewArg`]).
#[derive(Debug)]
pub struct ReviewList(pub Vec<lockbox_runtime::ReviewedChange>);

impl ReviewList {
    /// The listing's token (`lockbox_cow::Review::token`).
    pub fn token(&self) -> String {
        lockbox_runtime::Review::of(&self.0).token().to_string()
    }
}

impl Serialize for ReviewList {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for row in &self.0 {
            seq.serialize_element(&change_json::<S>(&row.change, Some(&row.digest))?)?;
        }
        seq.end()
    }
}

/// `GET changes` (and MCP's `changes`): `{"changes": [... each with "digest"], "review_token"}`.
#[derive(Debug, Serialize)]
pub struct ReviewReply {
    /// The changes.
    pub changes: ReviewList,
    /// The whole listing's digest.
    pub review_token: String,
}

impl From<Vec<lockbox_runtime::ReviewedChange>> for ReviewReply {
    fn from(rows: Vec<lockbox_runtime::ReviewedChange>) -> ReviewReply {
        let changes = ReviewList(rows);
        ReviewReply {
            review_token: changes.token(),
            changes,
        }
    }
}

/// `review` of a commit: the review it follows, either the paths shown with their digests
/// (`[{"path": P, "digest": "sha256:..."}]`, as `GET changes` / `GET diff` gave them) or the
/// `review_token` of a whole listing. The commit then writes nothing the review did not show
/// as it is now (else `409 STALE_REVIEW`, `details.paths`).
#[derive(Debug, Clone)]
pub struct ReviewArg(pub lockbox_runtime::Reviewed);

impl<'de> Deserialize<'de> for ReviewArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ReviewArg, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(token) => token
                .parse()
                .map(|t| ReviewArg(lockbox_runtime::Reviewed::Token(t)))
                .map_err(D::Error::custom),
            list @ serde_json::Value::Array(_) => {
                Vec::<lockbox_runtime::ReviewedPath>::deserialize(list)
                    .map(|paths| {
                        ReviewArg(lockbox_runtime::Reviewed::Paths(
                            lockbox_runtime::Review::new(paths),
                        ))
                    })
                    .map_err(D::Error::custom)
            }
            _ => Err(D::Error::custom(
                "review: expected a review_token (string) or [{\"path\", \"digest\"}]",
            )),
        }
    }
}

/// `GET /v1/sandboxes?state=`.
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSandboxes {
    /// Only sandboxes in this state (`running`: the live ones).
    pub state: Option<StateName>,
}

/// A sandbox state as a client names it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateName {
    /// `running`.
    Running,
    /// `stopped`.
    Stopped,
    /// `lost`.
    Lost,
}

impl From<SandboxState> for StateName {
    fn from(s: SandboxState) -> StateName {
        match s {
            SandboxState::Running => StateName::Running,
            SandboxState::Stopped => StateName::Stopped,
            SandboxState::Lost => StateName::Lost,
        }
    }
}

impl From<StateName> for SandboxState {
    fn from(s: StateName) -> SandboxState {
        match s {
            StateName::Running => SandboxState::Running,
            StateName::Stopped => SandboxState::Stopped,
            StateName::Lost => SandboxState::Lost,
        }
    }
}

/// A port exposed ([`lockbox_runtime::PortInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Port)]
pub struct PortInfo {
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// The API's proxy to it (bearer token only: never a browser page on the API's origin).
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    pub host_address: Option<String>,
    /// The port's own origin on the ports listener (`http://8000-sb-....localhost:7071`),
    /// when the server has one (`--ports-listen`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    pub origin: Option<String>,
    /// `origin` + `/__lockbox/open?key=...`: opened in a browser, it sets the port's access
    /// cookie on that origin and goes on to `/`. A capability: whoever has it reaches the port.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    pub open_url: Option<String>,
}

/// What a commit did ([`lockbox_runtime::CommitSummary`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct CommitSummary {
    /// What was applied (`lockbox_cow::CommitReport`: counts and paths).
    #[schema(value_type = Object)]
    pub report: lockbox_runtime::CommitReport,
    pub remaining: usize,
}

impl From<lockbox_runtime::CommitSummary> for CommitSummary {
    fn from(c: lockbox_runtime::CommitSummary) -> CommitSummary {
        CommitSummary {
            report: c.report,
            remaining: c.remaining,
        }
    }
}

/// A run of code ([`lockbox_runtime::Execution`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct Execution {
    pub context: String,
    #[schema(value_type = Vec<crate::openapi::DisplayDataSchema>)]
    pub results: Vec<lockbox_runtime::DisplayData>,
    pub logs: Logs,
    #[schema(value_type = Option<crate::openapi::ExecErrorSchema>)]
    pub error: Option<lockbox_runtime::ExecError>,
    #[schema(required = true)]
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub state_lost: bool,
    pub truncated: bool,
    pub duration_ms: u64,
}

/// A run's output chunks ([`lockbox_runtime::Logs`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct Logs {
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

impl From<lockbox_runtime::Execution> for Execution {
    fn from(e: lockbox_runtime::Execution) -> Execution {
        Execution {
            context: e.context.into(),
            results: e.results,
            logs: Logs {
                stdout: e.logs.stdout,
                stderr: e.logs.stderr,
            },
            error: e.error,
            exit_code: e.exit_code,
            timed_out: e.timed_out,
            state_lost: e.state_lost,
            truncated: e.truncated,
            duration_ms: e.duration_ms,
        }
    }
}

/// A process log's stream by name: `stdout`, `stderr` or `pty`.
pub fn stream_name(s: lockbox_runtime::OutputStream) -> &'static str {
    match s {
        lockbox_runtime::OutputStream::Stdout => "stdout",
        lockbox_runtime::OutputStream::Stderr => "stderr",
        lockbox_runtime::OutputStream::Pty => "pty",
    }
}

/// `GET fs/list`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The directory.
    pub path: String,
    /// Descend into subdirectories.
    #[serde(default)]
    pub recursive: bool,
    /// Include names starting with `.`.
    #[serde(default)]
    pub hidden: bool,
}

/// `GET audit`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Stream (SSE) the kept events, then live ones (default); false: the kept ones as JSON.
    #[serde(default = "yes")]
    pub follow: bool,
}

/// `GET approvals`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ApprovalsQuery {
    /// Only questions with a greater id (default 0: all pending).
    #[serde(default)]
    pub after: u64,
    /// Wait up to this long for such a question (a long poll; default 0, at most 60,000).
    #[serde(default)]
    #[param(maximum = 60_000)]
    pub wait_ms: u64,
}

/// `POST approvals/{qid}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    /// `once`, `sandbox` or `deny`.
    #[schema(value_type = crate::openapi::DecisionName)]
    pub decision: String,
}

/// The reply of `POST approvals/{qid}`: the verdict taken.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Decision)]
pub struct Decided {
    /// The question.
    #[schema(minimum = 1)]
    pub id: u64,
    /// `once`, `sandbox` or `deny`.
    #[schema(value_type = crate::openapi::DecisionName)]
    pub decision: &'static str,
}

/// `GET watch`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// The file or directory.
    pub path: String,
    /// Watch everything below a directory too (default true).
    #[serde(default = "yes")]
    pub recursive: bool,
}

/// `POST fs/mkdir`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = MkdirRequest)]
pub struct Mkdir {
    /// The directory to create.
    pub path: String,
    /// Create missing parents (default true); an existing directory is then fine.
    #[serde(default = "yes")]
    pub parents: bool,
}

fn yes() -> bool {
    true
}

/// `POST fs/move`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = MoveRequest)]
pub struct Move {
    /// Source.
    pub from: String,
    /// Destination.
    pub to: String,
    /// Replace an existing destination.
    #[serde(default)]
    pub overwrite: bool,
}

/// `POST fs/remove`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RemoveRequest)]
pub struct Remove {
    /// What to remove.
    pub path: String,
    /// Remove a directory with its contents.
    #[serde(default)]
    pub recursive: bool,
}

/// `POST commit`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(as = CommitRequest)]
pub struct Commit {
    /// Only these paths (relative to the workdir; a directory covers what is below it). A
    /// name that is not UTF-8 is `{"bytes": base64}` (`lockbox_policy::name`).
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Name>)]
    pub only: Vec<PathBuf>,
    /// Not these paths.
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Name>)]
    pub exclude: Vec<PathBuf>,
    /// Commit even where the workdir changed under the branch at those paths.
    pub force: bool,
    /// Files committed with only some of their hunks: `[{"path": P, "accept": [0, 2]}]`
    /// (numbered as `GET diff?path=P` gives them; `accept: []` leaves the file untouched).
    pub hunks: Vec<HunkChoice>,
    /// The review this commit follows: `[{"path", "digest"}]` of the paths shown (from `GET
    /// changes` / `GET diff`) or a `review_token`. Every path the commit writes must have
    /// been shown with the digest it has now, else `409 STALE_REVIEW` (nothing applied).
    #[schema(value_type = Option<crate::openapi::ReviewSchema>, default = serde_json::Value::default)]
    pub review: Option<ReviewArg>,
}

/// Some hunks of one file: `{"path": P, "accept": [0, 2]}`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HunkChoice {
    /// The file, relative to the workdir (a string, or `{"bytes": base64}`).
    #[serde(deserialize_with = "lockbox_policy::name::json::deserialize")]
    #[schema(value_type = Name)]
    pub path: PathBuf,
    /// Hunk numbers (from 0, as the diff numbers them); empty: the file is not touched.
    pub accept: Vec<usize>,
}

impl From<HunkChoice> for lockbox_runtime::HunkSelection {
    fn from(h: HunkChoice) -> lockbox_runtime::HunkSelection {
        lockbox_runtime::HunkSelection {
            path: h.path,
            accept: h.accept,
        }
    }
}

/// What happens to the part of a kept branch a commit did not take.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestName {
    /// It stays in the branch (default).
    #[default]
    Keep,
    /// The branch is removed after the commit.
    Drop,
}

impl From<RestName> for lockbox_runtime::Rest {
    fn from(r: RestName) -> lockbox_runtime::Rest {
        match r {
            RestName::Keep => lockbox_runtime::Rest::Keep,
            RestName::Drop => lockbox_runtime::Rest::Drop,
        }
    }
}

impl Commit {
    /// The runtime's selection.
    pub fn into_selection(self) -> Selection {
        Selection {
            only: self.only,
            exclude: self.exclude,
            force: self.force,
            hunks: each(self.hunks),
            review: self.review.map(|r| r.0),
        }
    }
}

/// `POST /v1/branches/{id}/commit`: [`Commit`] and what happens to the rest.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(as = BranchCommitRequest)]
pub struct BranchCommit {
    /// Only these paths.
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Name>)]
    pub only: Vec<PathBuf>,
    /// Not these paths.
    #[serde(with = "lockbox_policy::name::json::vec")]
    #[schema(value_type = Vec<Name>)]
    pub exclude: Vec<PathBuf>,
    /// Files committed with only some of their hunks.
    pub hunks: Vec<HunkChoice>,
    /// Commit even where the workdir changed under the branch at those paths.
    pub force: bool,
    /// `keep` (default): what is not committed stays in the branch; `drop`: the branch is
    /// removed after the commit.
    pub rest: RestName,
    /// The review this commit follows (as [`Commit::review`]).
    #[schema(value_type = Option<crate::openapi::ReviewSchema>, default = serde_json::Value::default)]
    pub review: Option<ReviewArg>,
}

impl BranchCommit {
    /// The runtime's selection and the fate of the rest.
    pub fn into_parts(self) -> (Selection, lockbox_runtime::Rest) {
        (
            Selection {
                only: self.only,
                exclude: self.exclude,
                force: self.force,
                hunks: each(self.hunks),
                review: self.review.map(|r| r.0),
            },
            self.rest.into(),
        )
    }
}

/// `?path=` (or `?path_bytes=` with the base64 of a name that is not UTF-8) of `GET diff`.
#[derive(Debug, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// A changed path, relative to the workdir (as `changes` lists it).
    pub path: Option<String>,
    /// The path's bytes, base64 (standard alphabet, as `{"bytes": ...}` names are), for a
    /// name that is not UTF-8 (instead of `path`).
    #[param(format = Byte)]
    #[schema(format = Byte)]
    pub path_bytes: Option<String>,
}

impl DiffQuery {
    /// The path asked for.
    pub fn path(self) -> Result<PathBuf, ApiError> {
        use std::os::unix::ffi::OsStringExt;
        match (self.path, self.path_bytes) {
            (Some(p), None) => Ok(PathBuf::from(p)),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .map(|v| PathBuf::from(std::ffi::OsString::from_vec(v)))
                .map_err(|e| ApiError::invalid("path_bytes", format!("not base64: {e}"))),
            _ => Err(ApiError::invalid(
                "path",
                "give exactly one of `path` and `path_bytes`",
            )),
        }
    }
}

/// One path's diff as numbered hunks, or a summary of both sides, in the wire shape of `GET
/// diff` (docs/server.md), `lockbox branch hunks --json` and the Python SDK:
/// `{"path", "kind": "text", "hunks": [{"index", "old_start", "old_lines", "new_start",
/// "new_lines", "header", "lines": [{"op": " "|"-"|"+", "text"}], "no_newline_old",
/// "no_newline_new"}]}` or `{"path", "kind": "summary", "old": Side, "new": Side}`, each
/// with `digest`: that of the branch side the diff was made from (what a commit's `review`
/// names for this path).
#[derive(Debug, Clone)]
pub struct FileDiffReply {
    /// The path asked for.
    pub path: PathBuf,
    /// The diff.
    pub diff: lockbox_runtime::FileHunks,
    /// The digest of the branch side.
    pub digest: lockbox_runtime::ContentDigest,
}

impl FileDiffReply {
    /// The reply for `path` from the runtime's diff and digest.
    pub fn new(
        path: PathBuf,
        (diff, digest): (lockbox_runtime::FileHunks, lockbox_runtime::ContentDigest),
    ) -> FileDiffReply {
        FileDiffReply { path, diff, digest }
    }
}

fn side_json(side: &lockbox_runtime::Side) -> serde_json::Value {
    use lockbox_runtime::Side;
    match side {
        Side::Absent => serde_json::json!({ "type": "absent" }),
        Side::File { size } => serde_json::json!({ "type": "file", "size": size }),
        Side::Dir => serde_json::json!({ "type": "dir" }),
        Side::Symlink { target } => {
            serde_json::json!({ "type": "symlink", "target": lockbox_policy::name::Encoded(target) })
        }
        Side::Special => serde_json::json!({ "type": "special" }),
    }
}

impl Serialize for FileDiffReply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use lockbox_runtime::FileHunks;
        let path = lockbox_policy::name::Encoded(&self.path);
        let mut value = match &self.diff {
            FileHunks::Text { hunks } => {
                let hunks: Vec<_> = hunks
                    .iter()
                    .map(|h| {
                        let lines: Vec<_> = h
                            .lines
                            .iter()
                            .map(|l| serde_json::json!({ "op": l.op.symbol().to_string(), "text": l.text }))
                            .collect();
                        serde_json::json!({
                            "index": h.index,
                            "old_start": h.old_start,
                            "old_lines": h.old_lines,
                            "new_start": h.new_start,
                            "new_lines": h.new_lines,
                            "header": h.header(),
                            "lines": lines,
                            "no_newline_old": h.no_newline_old,
                            "no_newline_new": h.no_newline_new,
                        })
                    })
                    .collect();
                serde_json::json!({ "path": path, "kind": "text", "hunks": hunks })
            }
            FileHunks::Summary { old, new } => serde_json::json!({
                "path": path, "kind": "summary", "old": side_json(old), "new": side_json(new)
            }),
        };
        value["digest"] = self.digest.to_string().into();
        value.serialize(serializer)
    }
}

/// `GET /v1/branches/{id}`: the branch object and its changes.
#[derive(Serialize, ToSchema)]
pub struct BranchDetail {
    /// The branch object of `GET /v1/branches`.
    #[serde(flatten)]
    pub branch: KeptBranch,
    /// Its changes (as `GET /v1/sandboxes/{id}/changes` gives them, each with its `digest`).
    #[schema(value_type = Vec<crate::openapi::ChangeSchema>)]
    pub change_list: ReviewList,
    /// The digest of the whole listing (a commit's `review` may name it).
    pub review_token: String,
}

/// A transaction as `GET /v1/transactions` lists it: its record with `exit_code` and
/// `meaning` (as `lockbox txn show --json`) and `created` (RFC 3339), or `{"dir", "state": "damaged", "error"}` for one whose record is unreadable.
pub fn txn_json(t: &lockbox_txn::ListedTxn) -> serde_json::Value {
    match t {
        lockbox_txn::ListedTxn::Ok(r) => {
            let (code, meaning) = r.verdict();
            let mut v = serde_json::to_value(r).unwrap_or_else(|e| {
                serde_json::json!({ "id": r.id.to_string(), "state": "damaged", "error": e.to_string() })
            });
            // When it began: its fresh base directory's ctime.
            let nanos = u32::try_from(r.base_ctime.nanos).unwrap_or(0);
            v["created"] =
                serde_json::json!(lockbox_policy::time::rfc3339(r.base_ctime.secs, nanos));
            v["exit_code"] = serde_json::json!(code);
            v["meaning"] = serde_json::json!(meaning);
            v
        }
        lockbox_txn::ListedTxn::Damaged { dir, error } => serde_json::json!({
            "dir": lockbox_policy::name::Encoded(dir),
            "state": "damaged",
            "error": error.to_string(),
        }),
    }
}

/// A journal run's status with `id` and `status` (`running`, `suspended`, `finished`)
/// beside the fields of `lockbox journal status`.
pub fn run_json(s: &lockbox_journal::RunStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap_or_else(|_| serde_json::json!({}));
    v["id"] = serde_json::json!(s.run_id.to_string());
    v["status"] = v["state"].clone();
    v
}

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    /// The port inside the sandbox (1-65535).
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u32,
    /// Also listen on a host loopback port.
    #[serde(default)]
    pub host_loopback: bool,
}

/// `POST /v1/sandboxes/{id}/snapshots` (the body may be left out).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A name for people (at most 256 bytes, no control characters).
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f]*$")]
    pub name: Option<String>,
    /// Keep the sandbox's `/tmp` too: forks and restores find it in theirs.
    #[serde(default)]
    pub include_tmp: bool,
}

/// `POST /v1/snapshots/{id}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes (default 1; at most the server's max_sandboxes).
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1)]
    pub count: usize,
}

fn one() -> usize {
    1
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandboxRequest {
    /// How many sandboxes (default 1; at most the server's max_sandboxes).
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1)]
    pub count: usize,
    /// A name for the snapshot taken first.
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f]*$")]
    pub name: Option<String>,
    /// Keep the sandbox's `/tmp` in that snapshot too.
    #[serde(default)]
    pub include_tmp: bool,
}

/// `POST /v1/sandboxes/{id}/restore`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The snapshot to roll back to.
    pub snapshot: String,
}

/// `GET /v1/snapshots/{id}/diff`: what the snapshot is compared with (at most one; none:
/// the workdir as it is now).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SnapshotDiffQuery {
    /// Another snapshot of the same workdir.
    pub to_snapshot: Option<String>,
    /// A running sandbox of the same workdir.
    pub to_sandbox: Option<String>,
}

impl SnapshotDiffQuery {
    /// The one conversion into the runtime's target.
    pub fn into_target(self) -> Result<lockbox_runtime::DiffTarget, ApiError> {
        use lockbox_runtime::DiffTarget;
        match (self.to_snapshot, self.to_sandbox) {
            (None, None) => Ok(DiffTarget::Workdir),
            (Some(s), None) => Ok(DiffTarget::Snapshot(s)),
            (None, Some(s)) => Ok(DiffTarget::Sandbox(s)),
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "to_snapshot",
                "give to_snapshot or to_sandbox, not both",
            )),
        }
    }
}

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// Its id; generated when absent. `[A-Za-z0-9_.-]{1,64}`.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub id: Option<String>,
    /// `python` (default), `bash` or `node`.
    #[serde(default = "python")]
    #[schema(value_type = crate::openapi::LanguageName, default = "python")]
    pub language: String,
    /// Working directory of the interpreter (inside the sandbox).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment of the interpreter.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn python() -> String {
    "python".into()
}

impl CreateContext {
    /// The runtime's options, or `language` named as the field that is wrong.
    pub fn into_options(self) -> Result<lockbox_runtime::ContextOptions, ApiError> {
        Ok(lockbox_runtime::ContextOptions {
            id: self.id.map(Into::into),
            language: language(&self.language)?,
            cwd: self.cwd,
            env: self.env,
        })
    }
}

/// A code context's language by one of its names (`python`, `python3`, `bash`, `sh`,
/// `node`, `javascript`, `js`); anything else is `INVALID_REQUEST` naming `language`.
pub fn language(name: &str) -> Result<lockbox_runtime::Language, lockbox_runtime::RuntimeError> {
    use lockbox_runtime::Language;
    Language::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Language::ALL.iter().map(|l| l.as_str()).collect();
        lockbox_runtime::RuntimeError::InvalidRequest {
            field: "language".into(),
            message: format!("{name:?} is not one of {}", known.join(", ")),
        }
    })
}

/// `POST /v1/sandboxes/{id}/contexts/{cid}/run` and `/run/stream`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The code (Python statements, or bash text).
    pub code: String,
    /// Interrupt after this long (default 300 000).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub timeout_ms: Option<u64>,
}

impl RunCode {
    /// The runtime's request for context `context`.
    pub fn into_request(
        self,
        context: String,
    ) -> Result<lockbox_runtime::RunCodeRequest, ApiError> {
        if self.timeout_ms == Some(0) {
            return Err(ApiError::invalid(
                "timeout_ms",
                "timeout_ms: must be greater than zero",
            ));
        }
        check_ms("timeout_ms", self.timeout_ms, MAX_MS)?;
        Ok(lockbox_runtime::RunCodeRequest {
            code: self.code,
            context: Some(context.into()),
            timeout: self.timeout_ms.map(std::time::Duration::from_millis),
        })
    }
}

/// `POST /v1/transactions`: running sandboxes committed together (`kind: "gather"`, the
/// only kind so far).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = GatherRequest)]
pub struct TransactionRequest {
    /// `gather`.
    #[schema(value_type = crate::openapi::GatherKind)]
    pub kind: String,
    /// The running sandboxes, in order (the order `first_writer_wins` and
    /// `last_writer_wins` go by).
    #[schema(min_items = 1)]
    pub sandboxes: Vec<String>,
    /// `fail` (default): refuse with 409; `first_writer_wins`/`last_writer_wins`: the
    /// first/last sandbox listed that changed the path wins; `markers`: the first wins, the
    /// others' versions are kept as PATH.lockbox-<sandbox>.
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::ConflictName>)]
    pub conflicts: Option<String>,
    /// Report the merged result; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Commit even where the workdir changed under a sandbox since it began.
    #[serde(default)]
    pub force: bool,
}

impl TransactionRequest {
    /// The runtime's ids and options, or the field that is wrong.
    pub fn into_gather(
        self,
    ) -> Result<
        (
            Vec<lockbox_runtime::SandboxId>,
            lockbox_runtime::GatherOptions,
        ),
        lockbox_runtime::RuntimeError,
    > {
        use lockbox_runtime::{ConflictPolicy, RuntimeError};
        let invalid = |field: &str, message: String| RuntimeError::InvalidRequest {
            field: field.to_owned(),
            message,
        };
        if self.kind != "gather" {
            return Err(invalid(
                "kind",
                format!("{:?}: the only kind is \"gather\"", self.kind),
            ));
        }
        let conflicts = match self.conflicts.as_deref() {
            None | Some("fail") => ConflictPolicy::Fail,
            Some("first_writer_wins") => ConflictPolicy::FirstWriterWins,
            Some("last_writer_wins") => ConflictPolicy::LastWriterWins,
            Some("markers") => ConflictPolicy::Markers,
            Some(other) => {
                return Err(invalid(
                    "conflicts",
                    format!("{other:?}: use fail, first_writer_wins, last_writer_wins or markers"),
                ))
            }
        };
        let ids = self
            .sandboxes
            .into_iter()
            .map(lockbox_runtime::SandboxId::from)
            .collect();
        let opts = lockbox_runtime::GatherOptions {
            conflicts,
            dry_run: self.dry_run,
            force: self.force,
        };
        Ok((ids, opts))
    }
}

/// What `POST /v1/transactions` answers for a gather. The fields are in the order of their
/// names, as the `json!` object this replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct GatherResult {
    /// The merged changes.
    #[schema(value_type = Vec<crate::openapi::ChangeSchema>)]
    pub changes: ChangeList,
    /// Applied to the workdir (false for a dry run or a refusal).
    pub committed: bool,
    /// Paths several sandboxes changed, and how each was resolved.
    pub conflicts: Vec<GatherConflict>,
    /// What each sandbox contributed.
    pub contributions: Vec<Contribution>,
    /// Nothing was changed.
    pub dry_run: bool,
    /// The transaction (`GET /v1/transactions/{id}`).
    pub id: String,
    /// `gather`.
    #[schema(value_type = crate::openapi::GatherKind)]
    pub kind: &'static str,
    /// Versions kept beside the winner (`markers`).
    pub markers: Vec<Marker>,
    /// What the commit applied.
    #[schema(value_type = Option<Object>)]
    pub report: Option<lockbox_runtime::CommitReport>,
}

/// What one sandbox of a gather contributed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Contribution {
    /// Its changes.
    #[schema(value_type = Vec<crate::openapi::ChangeSchema>)]
    pub changes: ChangeList,
    /// The sandbox.
    pub sandbox: String,
}

/// A path several sandboxes of a gather changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct GatherConflict {
    /// Relative to the workdir.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Name)]
    pub path: PathBuf,
    /// The sandboxes that changed it.
    pub sandboxes: Vec<String>,
    /// The one whose version was taken (none under `fail`).
    #[schema(required = true)]
    pub winner: Option<String>,
}

/// A version kept beside the winner's under `markers`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Marker {
    /// Where it was kept.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Name)]
    pub kept_as: PathBuf,
    /// The path it is a version of.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Name)]
    pub path: PathBuf,
    /// Whose version.
    pub sandbox: String,
}

impl From<lockbox_runtime::GatherOutcome> for GatherResult {
    fn from(o: lockbox_runtime::GatherOutcome) -> GatherResult {
        GatherResult {
            changes: ChangeList(o.changes),
            committed: o.committed,
            conflicts: o
                .conflicts
                .into_iter()
                .map(|c| GatherConflict {
                    path: c.path,
                    sandboxes: c.sandboxes.iter().map(|s| s.as_str().to_owned()).collect(),
                    winner: c.winner.as_ref().map(|s| s.as_str().to_owned()),
                })
                .collect(),
            contributions: o
                .contributions
                .into_iter()
                .map(|c| Contribution {
                    changes: ChangeList(c.changes),
                    sandbox: c.sandbox.as_str().to_owned(),
                })
                .collect(),
            dry_run: o.dry_run,
            id: o.transaction.to_string(),
            kind: "gather",
            markers: o
                .markers
                .into_iter()
                .map(|m| Marker {
                    kept_as: m.kept_as,
                    path: m.path,
                    sandbox: m.source.to_string(),
                })
                .collect(),
            report: o.report,
        }
    }
}

/// `GET /v1/sandboxes` and the forks of `POST /v1/snapshots/{id}/fork`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    /// The sandboxes.
    pub sandboxes: Vec<SandboxInfo>,
}

/// `GET sessions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    /// The sessions.
    pub sessions: Vec<SessionInfo>,
}

/// `GET processes`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessList {
    /// The processes.
    pub processes: Vec<ProcessInfo>,
}

/// `GET contexts`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ContextList {
    /// The contexts.
    pub contexts: Vec<ContextInfo>,
}

/// `GET ports`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PortList {
    /// The exposed ports.
    pub ports: Vec<PortInfo>,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    /// The snapshots, oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}

/// `GET /v1/branches`.
#[derive(Debug, Serialize, ToSchema)]
pub struct BranchList {
    /// The kept branches.
    pub branches: Vec<KeptBranch>,
}

/// `POST /v1/sandboxes/{id}/fork`: the snapshot taken and the forks made of it. The fields
/// are in the order of their names, as the `json!` object this replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkReply {
    /// The forks.
    pub sandboxes: Vec<SandboxInfo>,
    /// The snapshot taken first.
    pub snapshot: SnapshotInfo,
}

/// `POST abort`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AbortResult {
    /// Always true.
    pub aborted: bool,
}

/// `POST processes/{pid}/stdin`. In the order of their names, as before.
#[derive(Debug, Serialize, ToSchema)]
pub struct StdinResult {
    /// Whether stdin was closed.
    pub closed: bool,
    /// Bytes written.
    pub written: usize,
}

/// `POST /v1/tokens`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MintToken {
    /// The token's ceiling, as a ceiling profile's fields (`read`, `write`, `workdirs`,
    /// `net`, `credentials`, `limits`, `timeout`, `sandboxes`); the server's when absent.
    #[schema(value_type = Option<Object>)]
    pub ceiling: Option<serde_json::Value>,
}

/// A scoped token, as `POST /v1/tokens` hands it out (the secret is not shown again).
#[derive(Debug, Serialize, ToSchema)]
pub struct MintedToken {
    /// Its id, for `DELETE /v1/tokens/{id}`.
    pub id: String,
    /// The secret, sent as `Authorization: Bearer <token>`.
    pub token: String,
    /// Its ceiling.
    #[schema(value_type = Object)]
    pub ceiling: serde_json::Value,
}

/// `GET /healthz`. In the order of their names, as before.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
    /// The server's version.
    pub version: &'static str,
}

/// `GET /ui/session`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionState {
    /// Always true (401 otherwise).
    pub authenticated: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The JSON the runtime's serde derives wrote before the wire forms moved here: the
    /// Python SDK and clients read it field for field.
    #[test]
    fn a_sandbox_record_keeps_its_wire_form_byte_for_byte() {
        let info = lockbox_runtime::SandboxInfo {
            id: "sb-1".into(),
            state: SandboxState::Stopped,
            created_at: lockbox_policy::time::from_unix(1_795_000_000, 5_000_000),
            workdir: Some(PathBuf::from("/w")),
            branch: Some(lockbox_runtime::BranchId::parse("b1").unwrap()),
            branch_action: Some(lockbox_runtime::BranchAction::Kept),
            labels: BTreeMap::from([("a".to_owned(), "b".to_owned())]),
            sessions: 1,
            processes: 2,
            policy: Some(lockbox_runtime::PolicySummary {
                net: lockbox_runtime::NetKind::None,
                net_destinations: Vec::new(),
                default_reads: true,
                fs_readable: vec![PathBuf::from("/r")],
                fs_writable: Vec::new(),
                max_memory_bytes: Some(1024),
                max_processes: None,
                max_cpu_time: Some(Duration::from_millis(1500)),
                max_file_size_bytes: None,
                idle_timeout: None,
                image: None,
            }),
            usage: Some(lockbox_runtime::ResourceUse {
                processes: 2,
                threads: 3,
                rss_bytes: 4096,
                cpu: Duration::from_millis(12),
            }),
        };
        assert_eq!(
            serde_json::to_string(&SandboxInfo::from(info)).unwrap(),
            concat!(
                r#"{"id":"sb-1","state":"stopped","created_at":"2026-11-18T11:06:40.005Z","#,
                r#""workdir":"/w","branch":"b1","branch_action":"kept","labels":{"a":"b"},"#,
                r#""sessions":1,"processes":2,"policy":{"net":"none","net_destinations":[],"#,
                r#""default_reads":true,"fs_readable":["/r"],"fs_writable":[],"#,
                r#""max_memory_bytes":1024,"max_processes":null,"max_cpu_time_ms":1500,"#,
                r#""max_file_size_bytes":null,"idle_timeout_ms":null,"image":null},"#,
                r#""usage":{"processes":2,"threads":3,"rss_bytes":4096,"cpu_ms":12}}"#
            )
        );
    }

    /// A context's language is checked at the edge; the runtime gets a `Language`.
    #[test]
    fn an_unknown_context_language_is_invalid_request_naming_language() {
        let body: CreateContext = serde_json::from_str(r#"{"language": "cobol"}"#).unwrap();
        let err = body.into_options().unwrap_err();
        assert_eq!(err.code, lockbox_policy::ErrorCode::InvalidRequest);
        assert_eq!(err.details["field"], "language");
        assert!(
            err.message.contains("python, bash, node"),
            "{}",
            err.message
        );
        let body: CreateContext = serde_json::from_str(r#"{"language": "js"}"#).unwrap();
        assert_eq!(
            body.into_options().unwrap().language,
            lockbox_runtime::Language::Node
        );
    }

    #[test]
    fn an_execution_and_a_commit_summary_keep_their_wire_form() {
        let mut exec = lockbox_runtime::Execution::in_context("c1".into());
        exec.logs.stdout.push("a".into());
        exec.error = Some(lockbox_runtime::ExecError {
            name: "E".into(),
            value: "v".into(),
            traceback: "t".into(),
        });
        exec.duration_ms = 7;
        assert_eq!(
            serde_json::to_string(&Execution::from(exec)).unwrap(),
            concat!(
                r#"{"context":"c1","results":[],"logs":{"stdout":["a"],"stderr":[]},"#,
                r#""error":{"name":"E","value":"v","traceback":"t"},"exit_code":null,"#,
                r#""timed_out":false,"state_lost":false,"truncated":false,"duration_ms":7}"#
            )
        );
        let summary = lockbox_runtime::CommitSummary {
            report: lockbox_runtime::CommitReport::default(),
            remaining: 2,
        };
        let json = serde_json::to_value(CommitSummary::from(summary)).unwrap();
        assert_eq!(json["remaining"], 2);
        assert_eq!(json["report"]["added"], 0);
    }
}
