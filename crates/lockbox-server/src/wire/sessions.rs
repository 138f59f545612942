//! Sessions and processes: exec, start, signal, stdin, logs.

use super::{check_ms, decode_b64, time};
use crate::error::ApiError;
use crate::openapi::{MAX_LOG_BYTES, MAX_MS};
use lockbox_runtime::{ExecRequest, ProcessCommand, ProcessSpec, PtySize, SessionOptions};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

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

/// A run of code ([`lockbox_runtime::Execution`]).
#[derive(Debug, Serialize, ToSchema)]
pub struct Execution {
    pub context: String,
    pub results: Vec<lockbox_runtime::DisplayData>,
    pub logs: Logs,
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

/// How a command in a session ended, with its output (`POST exec`). Each stream once: text
/// (`stdout`) when UTF-8 and no longer than base64, else base64 (`stdout_b64`).
// The head of the reply: `output::exec_reply` writes these fields, then each stream's field
// piece by piece as the client reads (so the output is never copied whole); the document
// adds those fields (`openapi::build`). Fields in the order of their names, as the `json!`
// value this replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecResult)]
pub struct ExecHead<'a> {
    /// Wall time of the call: milliseconds, with microseconds as the fraction.
    pub duration_ms: f64,
    /// Exit status as bash reports it (128+N after signal N, 124 after a timeout).
    pub exit_code: i32,
    /// The session it ran in.
    pub session: &'a str,
    /// stderr was cut, as `stdout_truncated` says of stdout.
    pub stderr_truncated: bool,
    /// stdout was longer than a buffered exec keeps and was cut there (the rest was read
    /// and dropped); `exec/stream` sends such outputs whole.
    pub stdout_truncated: bool,
    /// The timeout killed it.
    pub timed_out: bool,
}

impl<'a> From<&'a lockbox_runtime::ExecResult> for ExecHead<'a> {
    fn from(r: &'a lockbox_runtime::ExecResult) -> ExecHead<'a> {
        ExecHead {
            duration_ms: crate::output::ms(r.duration),
            exit_code: r.exit_code,
            session: r.session.as_str(),
            stderr_truncated: r.stderr_truncated,
            stdout_truncated: r.stdout_truncated,
            timed_out: r.timed_out,
        }
    }
}

/// A chunk of a process's output log.
// Fields (here and in `LogSegment`) in the order of their names, as the `json!` value this
// replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogChunk {
    /// The process exited and everything was read.
    pub eof: bool,
    /// The cursor after this chunk.
    pub next: u64,
    /// The bytes, by stream, in order.
    pub segments: Vec<LogSegment>,
    /// Bytes asked for were evicted.
    pub truncated: bool,
}

impl From<&lockbox_runtime::LogChunk> for LogChunk {
    fn from(c: &lockbox_runtime::LogChunk) -> LogChunk {
        LogChunk {
            eof: c.eof,
            next: c.next,
            segments: c.segments.iter().map(LogSegment::from).collect(),
            truncated: c.truncated,
        }
    }
}

/// Bytes of one stream, at `offset` of the log: `data` (UTF-8 text) or `data_b64`.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogSegment {
    /// The bytes as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub data: Option<String>,
    /// The bytes, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = Byte)]
    pub data_b64: Option<String>,
    /// The cursor of its first byte.
    pub offset: u64,
    #[schema(inline)]
    pub stream: StreamName,
}

impl From<&lockbox_runtime::LogSegment> for LogSegment {
    fn from(s: &lockbox_runtime::LogSegment) -> LogSegment {
        let (data, data_b64) = crate::output::text_or_base64(&s.data);
        LogSegment {
            data,
            data_b64,
            offset: s.offset,
            stream: StreamName::from(s.stream),
        }
    }
}

/// Which stream of a process log.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamName {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// The terminal (a process started with a PTY).
    Pty,
}

impl From<lockbox_runtime::OutputStream> for StreamName {
    fn from(s: lockbox_runtime::OutputStream) -> StreamName {
        match s {
            lockbox_runtime::OutputStream::Stdout => StreamName::Stdout,
            lockbox_runtime::OutputStream::Stderr => StreamName::Stderr,
            lockbox_runtime::OutputStream::Pty => StreamName::Pty,
        }
    }
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

/// `POST processes/{pid}/stdin`. In the order of their names, as before.
#[derive(Debug, Serialize, ToSchema)]
pub struct StdinResult {
    /// Whether stdin was closed.
    pub closed: bool,
    /// Bytes written.
    pub written: usize,
}

/// `GET /ui/session`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionState {
    /// Always true (401 otherwise).
    pub authenticated: bool,
}
