//! Code contexts: persistent interpreters (Python, bash) in a sandbox, each run returning
//! output, rich results and errors in the shape code-interpreter users know.
//!
//! The agent starts a context's runner (`lockbox_agent::contexts`) like any command, under
//! a subreaper shim, and sends back four pipe ends: the code's stdout and stderr, the
//! runner's events and its requests. A run writes one request, then reads the three read
//! ends together until the runner's `done` event: output is streamed as it is read, and
//! the `done` event is written after the code's output was flushed, so whatever is still in
//! the pipes then is read without waiting (`util::read_pending`).
//!
//! Timeouts: SIGINT to the runner's tree first (Python raises `KeyboardInterrupt` in the
//! code, and the context keeps its state), then, [`CONTEXT_INTERRUPT_GRACE`] later, a kill
//! of the whole tree: the run reports `state_lost` and the next run starts a fresh
//! interpreter. An interpreter that dies during a run (`os._exit`, a segfault) is reported
//! the same way. One run at a time per context: others wait their turn.

use lockbox_agent::contexts::{self as wire, ContextSpec, Frame, Language, RunnerEvent};
use lockbox_agent::{Body, Op};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

use crate::agent::AgentClient;
use crate::types::{
    CodeEvent, ContextId, ContextInfo, ContextOptions, DisplayData, ExecError, Execution,
};
use crate::util::{self, Read};
use crate::RuntimeError;

/// The id of the context runs use when they name none (a Python context, created on use).
pub const DEFAULT_CONTEXT: &str = "default";
/// Most code contexts one sandbox may hold at once (each is an interpreter).
pub const MAX_CONTEXTS: usize = 16;
/// How long a run may take when it sets no timeout.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a run interrupted by its timeout (SIGINT) may take to stop before its
/// interpreter is killed.
pub const CONTEXT_INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// A running interpreter's descriptors.
#[derive(Debug)]
struct Runner {
    pid: i32,
    stdout: AsyncFd<OwnedFd>,
    stderr: AsyncFd<OwnedFd>,
    events: AsyncFd<OwnedFd>,
    requests: AsyncFd<OwnedFd>,
}

/// A code context.
#[derive(Debug)]
pub(crate) struct Context {
    pub id: ContextId,
    language: Language,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    created_at: std::time::SystemTime,
    agent: AgentClient,
    runner: tokio::sync::Mutex<Option<Runner>>,
    /// The runner's pid (0: none), readable while a run holds `runner`.
    pid: AtomicI32,
    runs: AtomicU64,
    restarts: AtomicU64,
}

/// Checks options from an API and makes the context (its interpreter starts on first run).
pub(crate) fn new_context(
    agent: &AgentClient,
    id: ContextId,
    opts: &ContextOptions,
) -> Result<Context, RuntimeError> {
    let language = opts.language;
    for k in opts.env.keys() {
        if !util::valid_env_name(k) {
            return Err(RuntimeError::invalid(
                "env",
                format!("{k:?} is not a valid variable name"),
            ));
        }
    }
    Ok(Context {
        id,
        language,
        cwd: opts.cwd.clone(),
        env: opts
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        created_at: std::time::SystemTime::now(),
        agent: agent.clone(),
        runner: tokio::sync::Mutex::new(None),
        pid: AtomicI32::new(0),
        runs: AtomicU64::new(0),
        restarts: AtomicU64::new(0),
    })
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// SIGINT sent at the timeout.
    Interrupted,
}

/// What [`Context::take_events`] found.
enum Taken {
    /// No `done` yet.
    More,
    /// The run is over.
    Done {
        exit_code: Option<i32>,
        interrupted: bool,
    },
    /// Not the runner's protocol.
    Broken,
}

/// Splits bytes into UTF-8 text without cutting a character in two.
#[derive(Debug, Default)]
struct Utf8 {
    carry: Vec<u8>,
}

impl Utf8 {
    fn push(&mut self, data: &[u8]) -> String {
        self.carry.extend_from_slice(data);
        let whole = match std::str::from_utf8(&self.carry) {
            Ok(_) => self.carry.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.carry.len(),
        };
        let rest = self.carry.split_off(whole);
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry = rest;
        text
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry.clear();
        text
    }
}

/// The length of byte `b` inside a JSON string as serde_json writes it.
fn escaped_len(b: u8) -> usize {
    match b {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
        0..=0x1f => 6,
        _ => 1,
    }
}

/// What `text` costs in a JSON reply (its string's contents): a control character such as
/// `\x01` costs 6 bytes (`\u0001`). Issue 32: 16 MiB of `\x01` kept per stream made a
/// 201 MB reply; the cap now counts this, not the raw bytes.
fn json_len(text: &str) -> usize {
    text.bytes().map(escaped_len).sum()
}

/// The longest prefix of `text` (whole characters) whose JSON form fits in `room` bytes.
fn json_prefix(text: &str, room: usize) -> &str {
    let mut used = 0;
    for (i, c) in text.char_indices() {
        used += match u8::try_from(c) {
            Ok(b) if b.is_ascii() => escaped_len(b),
            _ => c.len_utf8(),
        };
        if used > room {
            return &text[..i];
        }
    }
    text
}

/// Counts the bytes written to it (the JSON size of a value, without making the JSON).
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a run collects, and where it sends events. What it keeps for the reply is bounded
/// by `max_output` bytes *of JSON* ([`json_len`]) per stream, and as much again for the
/// results and the error together; beyond, it is dropped and `truncated` set. Events are
/// sent as they come (a stream's client reads them; they are not kept).
struct Collect<'a> {
    exec: Execution,
    out: Utf8,
    err: Utf8,
    out_bytes: usize,
    err_bytes: usize,
    results_bytes: usize,
    max_output: usize,
    emit: &'a mut (dyn FnMut(CodeEvent) + Send),
}

impl Collect<'_> {
    fn output(&mut self, stderr: bool, data: &[u8]) {
        let text = if stderr {
            self.err.push(data)
        } else {
            self.out.push(data)
        };
        self.text(stderr, text);
    }

    fn text(&mut self, stderr: bool, text: String) {
        if text.is_empty() {
            return;
        }
        let (used, logs) = if stderr {
            (&mut self.err_bytes, &mut self.exec.logs.stderr)
        } else {
            (&mut self.out_bytes, &mut self.exec.logs.stdout)
        };
        let kept = json_prefix(&text, self.max_output.saturating_sub(*used));
        if kept.len() < text.len() {
            self.exec.truncated = true;
        }
        if !kept.is_empty() {
            *used += json_len(kept);
            logs.push(kept.to_owned());
        }
        (self.emit)(if stderr {
            CodeEvent::Stderr { text }
        } else {
            CodeEvent::Stdout { text }
        });
    }

    fn result(&mut self, d: DisplayData) {
        let mut size = Counter(0);
        let measured = serde_json::to_writer(&mut size, &d);
        (self.emit)(CodeEvent::Result(d.clone()));
        let used = self.results_bytes.saturating_add(size.0);
        if measured.is_ok() && used <= self.max_output {
            self.results_bytes = used;
            self.exec.results.push(d);
        } else {
            self.exec.truncated = true;
        }
    }

    /// Sets the run's error, cut to what the results left of their budget.
    fn error(&mut self, e: ExecError) {
        (self.emit)(CodeEvent::Error(e.clone()));
        let mut room = self.max_output.saturating_sub(self.results_bytes);
        let mut cut = |text: &str| {
            let kept = json_prefix(text, room);
            room -= json_len(kept);
            kept.to_owned()
        };
        let kept = ExecError {
            name: cut(&e.name),
            value: cut(&e.value),
            traceback: cut(&e.traceback),
        };
        if kept != e {
            self.exec.truncated = true;
        }
        self.exec.error = Some(kept);
    }
}

impl Context {
    pub fn info(&self) -> ContextInfo {
        let pid = self.pid.load(Ordering::Relaxed);
        ContextInfo {
            id: self.id.clone(),
            language: self.language,
            cwd: self.cwd.clone(),
            created_at: self.created_at,
            pid: (pid > 0).then_some(pid),
            runs: self.runs.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
        }
    }

    /// True while a run holds the context.
    pub fn busy(&self) -> bool {
        self.runner.try_lock().is_err()
    }

    /// Starts the interpreter.
    async fn start(&self) -> Result<Runner, RuntimeError> {
        let spec = ContextSpec {
            language: self.language,
            cwd: self.cwd.clone(),
            env: self.env.clone(),
        };
        let (result, fds) = self.agent.call(Op::ContextStart(spec)).await?;
        let pid = match result {
            Ok(Body::Spawned { pid }) => pid,
            Ok(other) => return Err(other.unexpected("spawned").into()),
            Err(e) => {
                return Err(RuntimeError::invalid(
                    "language",
                    format!(
                        "the {} interpreter could not start in the sandbox: {}",
                        self.language.as_str(),
                        e.message
                    ),
                ))
            }
        };
        let [stdout, stderr, events, requests]: [OwnedFd; 4] = fds
            .try_into()
            .map_err(|_| RuntimeError::Agent("sent the wrong descriptors".into()))?;
        self.pid.store(pid, Ordering::Relaxed);
        Ok(Runner {
            pid,
            stdout: util::async_fd(stdout)?,
            stderr: util::async_fd(stderr)?,
            events: util::async_fd(events)?,
            requests: util::async_fd(requests)?,
        })
    }

    /// Kills the interpreter (a run in progress reports its end); the context stays.
    pub async fn kill(&self) {
        let pid = self.pid.load(Ordering::Relaxed);
        if pid > 0 {
            let _ = self
                .agent
                .call(Op::KillTree {
                    pid,
                    spare_main: false,
                })
                .await;
        }
    }

    /// Runs `code`; `emit` sees output and results as they come (not the final `End`). With
    /// `watched`, the channel a stream of the run is read from: once its reader is gone (the
    /// client gave up), the run is interrupted as at its timeout, so that the context's next
    /// run does not wait for it.
    pub async fn run(
        &self,
        code: &str,
        env: &[(String, String)],
        timeout: Duration,
        max_output: usize,
        emit: &mut (dyn FnMut(CodeEvent) + Send),
        watched: Option<&tokio::sync::mpsc::UnboundedSender<CodeEvent>>,
    ) -> Result<Execution, RuntimeError> {
        let mut slot = self.runner.lock().await;
        let started = Instant::now();
        let mut c = Collect {
            exec: Execution::in_context(self.id.clone()),
            out: Utf8::default(),
            err: Utf8::default(),
            out_bytes: 0,
            err_bytes: 0,
            results_bytes: 0,
            max_output,
            emit,
        };
        // An interpreter that ended between runs (a thread called os._exit) is replaced
        // first; its state is gone, and this run says so.
        if let Some(r) = slot.as_ref() {
            if let Some(_status) = self.agent.exit_of(r.pid) {
                self.agent.forget(r.pid);
                *slot = None;
                c.exec.state_lost = true;
            }
        }
        let runner = match slot.take() {
            Some(r) => r,
            None => {
                if self.runs.load(Ordering::Relaxed) > 0 {
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                }
                self.start().await?
            }
        };
        self.runs.fetch_add(1, Ordering::Relaxed);
        let request = wire::encode_request(code, env);
        let kept = self
            .drive(&runner, &request, timeout, &mut c, watched)
            .await;
        if kept {
            *slot = Some(runner);
        } else {
            self.pid.store(0, Ordering::Relaxed);
            c.exec.state_lost = true;
        }
        let tail = c.out.finish();
        c.text(false, tail);
        let tail = c.err.finish();
        c.text(true, tail);
        c.exec.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(c.exec)
    }

    /// One run on `r`; false when the interpreter is gone after it.
    async fn drive(
        &self,
        r: &Runner,
        request: &[u8],
        timeout: Duration,
        c: &mut Collect<'_>,
        watched: Option<&tokio::sync::mpsc::UnboundedSender<CodeEvent>>,
    ) -> bool {
        let mut sent = 0;
        let mut events: Vec<u8> = Vec::new();
        let (mut out_open, mut err_open) = (true, true);
        let mut phase = Phase::Running;
        let mut deadline = tokio::time::Instant::now() + timeout;
        loop {
            let want_write = sent < request.len();
            tokio::select! {
                biased;
                w = r.requests.writable(), if want_write => {
                    let Ok(mut g) = w else { return self.died(r, c).await };
                    match rustix::io::write(g.get_inner(), &request[sent..]) {
                        Ok(n) => sent += n,
                        Err(rustix::io::Errno::AGAIN) => g.clear_ready(),
                        Err(rustix::io::Errno::INTR) => {}
                        // EPIPE: the interpreter is gone; its events' end says how.
                        Err(_) => sent = request.len(),
                    }
                }
                g = r.stdout.readable(), if out_open => {
                    let Ok(mut g) = g else { out_open = false; continue };
                    let mut got = Vec::new();
                    match util::read_some(g.get_inner(), util::READ_CHUNK, |d| got.extend_from_slice(d)) {
                        Read::Empty => g.clear_ready(),
                        Read::More => {}
                        Read::Eof => out_open = false,
                    }
                    c.output(false, &got);
                }
                g = r.stderr.readable(), if err_open => {
                    let Ok(mut g) = g else { err_open = false; continue };
                    let mut got = Vec::new();
                    match util::read_some(g.get_inner(), util::READ_CHUNK, |d| got.extend_from_slice(d)) {
                        Read::Empty => g.clear_ready(),
                        Read::More => {}
                        Read::Eof => err_open = false,
                    }
                    c.output(true, &got);
                }
                g = r.events.readable() => {
                    let Ok(mut g) = g else { return self.died(r, c).await };
                    let state = util::read_some(g.get_inner(), util::READ_CHUNK, |d| events.extend_from_slice(d));
                    if state == Read::Empty {
                        g.clear_ready();
                    }
                    drop(g);
                    match self.take_events(&mut events, c) {
                        Taken::More => {}
                        Taken::Done { exit_code, interrupted } => {
                            let interrupted = interrupted || phase == Phase::Interrupted;
                            self.finish(r, c, exit_code, interrupted, timeout);
                            return true;
                        }
                        Taken::Broken => return self.died(r, c).await,
                    }
                    if state == Read::Eof {
                        return self.died(r, c).await;
                    }
                }
                () = reader_gone(watched), if phase == Phase::Running => {
                    // Nobody reads the run any more: interrupt it now, as at its timeout.
                    phase = Phase::Interrupted;
                    deadline = tokio::time::Instant::now() + CONTEXT_INTERRUPT_GRACE;
                    let _ = self.agent.call(Op::Signal { pid: r.pid, signal: libc::SIGINT, spare_main: false }).await;
                }
                () = tokio::time::sleep_until(deadline) => {
                    match phase {
                        Phase::Running => {
                            c.exec.timed_out = true;
                            phase = Phase::Interrupted;
                            deadline = tokio::time::Instant::now() + CONTEXT_INTERRUPT_GRACE;
                            let _ = self.agent.call(Op::Signal { pid: r.pid, signal: libc::SIGINT, spare_main: false }).await;
                        }
                        Phase::Interrupted => {
                            self.kill_after_timeout(r, c, timeout).await;
                            return false;
                        }
                    }
                }
            }
        }
    }

    /// Handles the whole event frames at the start of `events` (removing them).
    fn take_events(&self, events: &mut Vec<u8>, c: &mut Collect<'_>) -> Taken {
        loop {
            match wire::decode_event(events) {
                Frame::Incomplete => return Taken::More,
                Frame::Invalid(why) => {
                    tracing::warn!(context = %self.id, "runner protocol: {why}");
                    return Taken::Broken;
                }
                Frame::Event(ev, used) => {
                    events.drain(..used);
                    match *ev {
                        RunnerEvent::Result(d) => c.result(d),
                        RunnerEvent::Error(e) => c.error(e),
                        RunnerEvent::Done {
                            exit_code,
                            interrupted,
                        } => {
                            return Taken::Done {
                                exit_code,
                                interrupted,
                            }
                        }
                    }
                }
            }
        }
    }

    /// The run did not stop within the grace after SIGINT: kill the interpreter's tree.
    async fn kill_after_timeout(&self, r: &Runner, c: &mut Collect<'_>, timeout: Duration) {
        let _ = self
            .agent
            .call(Op::KillTree {
                pid: r.pid,
                spare_main: false,
            })
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.agent.wait_exit(r.pid)).await;
        self.agent.forget(r.pid);
        self.drain(r, c);
        c.error(ExecError {
            name: "Timeout".into(),
            value: format!(
                "the run exceeded its timeout of {} ms and did not stop within {} ms of SIGINT: \
                 the {} interpreter was killed; the context's state (variables, imports, \
                 working directory) is lost and the next run starts a fresh interpreter",
                timeout.as_millis(),
                CONTEXT_INTERRUPT_GRACE.as_millis(),
                self.language.as_str()
            ),
            traceback: String::new(),
        });
    }

    /// The run ended normally (`done`): the rest of its output is in the pipes.
    fn finish(
        &self,
        r: &Runner,
        c: &mut Collect<'_>,
        exit_code: Option<i32>,
        interrupted: bool,
        timeout: Duration,
    ) {
        self.drain(r, c);
        c.exec.exit_code = exit_code;
        if c.exec.timed_out {
            let value = format!(
                "the run exceeded its timeout of {} ms and was interrupted (SIGINT); the context \
                 kept its state",
                timeout.as_millis()
            );
            match &mut c.exec.error {
                Some(e) if e.name == "KeyboardInterrupt" => e.value = value,
                _ => c.error(ExecError {
                    name: "KeyboardInterrupt".into(),
                    value,
                    traceback: String::new(),
                }),
            }
        } else if c.exec.error.is_none() {
            match exit_code {
                Some(code) if code != 0 => c.error(ExecError {
                    name: if interrupted {
                        "KeyboardInterrupt"
                    } else {
                        "ExitCode"
                    }
                    .into(),
                    value: format!("exit status {code}"),
                    traceback: String::new(),
                }),
                _ => {}
            }
        }
    }

    /// Reads what the pipes hold now.
    fn drain(&self, r: &Runner, c: &mut Collect<'_>) {
        let mut got = Vec::new();
        util::read_pending(r.stdout.get_ref(), &mut got);
        c.output(false, &got);
        got.clear();
        util::read_pending(r.stderr.get_ref(), &mut got);
        c.output(true, &got);
    }

    /// The interpreter ended during the run: report how, end what it left.
    async fn died(&self, r: &Runner, c: &mut Collect<'_>) -> bool {
        let status =
            match tokio::time::timeout(Duration::from_secs(2), self.agent.wait_exit(r.pid)).await {
                Ok(Ok(s)) => Some(s),
                _ => {
                    let _ = self
                        .agent
                        .call(Op::KillTree {
                            pid: r.pid,
                            spare_main: false,
                        })
                        .await;
                    tokio::time::timeout(Duration::from_secs(5), self.agent.wait_exit(r.pid))
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
            };
        self.agent.forget(r.pid);
        self.drain(r, c);
        let how = match status {
            Some(s) if s.signal.is_some() => {
                format!("was killed by signal {}", s.signal.unwrap_or_default())
            }
            Some(s) => format!("exited with status {}", s.code.unwrap_or(-1)),
            None => "stopped answering".to_owned(),
        };
        c.error(ExecError {
            name: "InterpreterDied".into(),
            value: format!(
                "the {} interpreter {how}; the context's state is lost and the next run starts \
                 a fresh interpreter",
                self.language.as_str()
            ),
            traceback: String::new(),
        });
        false
    }
}

/// Checks a context id from an API.
pub(crate) fn check_id(id: &str) -> Result<(), RuntimeError> {
    if util::valid_id(id) {
        Ok(())
    } else {
        Err(RuntimeError::invalid(
            "id",
            "a context id is 1 to 64 characters of A-Z a-z 0-9 _ . -",
        ))
    }
}

/// Once the reader of `watched` is gone (never without one).
async fn reader_gone(watched: Option<&tokio::sync::mpsc::UnboundedSender<CodeEvent>>) {
    match watched {
        Some(tx) => tx.closed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::{json_len, json_prefix, Utf8};

    #[test]
    fn json_prefix_counts_escapes_and_keeps_characters_whole() {
        let text = "a\u{1}é\n";
        assert_eq!(
            json_len(text),
            serde_json::to_string(text).unwrap().len() - 2
        );
        assert_eq!(json_prefix(text, 6), "a");
        assert_eq!(json_prefix(text, 7), "a\u{1}");
        assert_eq!(json_prefix(text, 8), "a\u{1}");
        assert_eq!(json_prefix(text, 9), "a\u{1}é");
        assert_eq!(json_prefix(text, 11), text);
    }

    #[test]
    fn a_character_split_across_reads_is_kept_whole() {
        let mut u = Utf8::default();
        let bytes = "é!".as_bytes();
        assert_eq!(u.push(&bytes[..1]), "");
        assert_eq!(u.push(&bytes[1..]), "é!");
        assert_eq!(u.push(b"\xff"), "\u{fffd}");
    }
}
