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
//! - `session`: persistent bash with a one-line-per-command protocol;
//! - `process` + `log`: background processes and their bounded logs;
//! - `contexts`: code contexts, persistent Python/bash interpreters whose runs return
//!   output, rich results and errors;
//! - `files`: file operations, resolved by the agent, streamed by the runtime;
//! - `workspace`: changes/commit/abort of the sandbox's branch;
//! - `store`: sandbox metadata in SQLite.
//!
//! Which executable is the agent ([`RuntimeConfig::agent_exe`]): by default the current
//! executable, re-executed, whose `main` must call [`main_if_agent`] first thing. The default
//! stays the dispatch function, not a path to `lockbox-agent`'s binary, because that keeps
//! `lockbox serve` a single installed file (no second binary to find, version or keep in
//! step with the runtime); hosts that cannot dispatch (the runtime's own tests and
//! benchmarks, the Python extension inside an interpreter, embedders) set `agent_exe` to the
//! `lockbox-agent` binary instead. Either way the agent's [`PROTOCOL_VERSION`] is checked at
//! the handshake: a mismatch is [`RuntimeError::Protocol`].
//!
//! Not here: HTTP (`lockbox-server`), confinement itself (`lockbox-confine`), the agent and
//! its protocol (`lockbox-agent`), branches and the commit engine (`lockbox-cow`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod agent;
mod branches;
mod contexts;
mod error;
mod files;
mod log;
mod output;
mod ports;
mod process;
mod sandbox;
mod session;
mod store;
mod streams;
mod types;
mod util;
mod workspace;

pub use crate::contexts::{
    CONTEXT_INTERRUPT_GRACE, DEFAULT_CONTEXT, DEFAULT_RUN_TIMEOUT, MAX_CONTEXTS,
};
pub use crate::error::RuntimeError;
pub use crate::ports::{check_port, MAX_EXPOSED_PORTS, MAX_FORWARDED_CONNECTIONS};
pub use crate::streams::{
    CodeStream, ExecStream, FileList, FileRead, LogStream, PtyAttachment, PtyOutput,
};
pub use crate::types::*;
pub use crate::util::rfc3339;
pub use lockbox_agent::{main_if_agent, ProtocolError, PROTOCOL_VERSION};
/// What [`Sandbox::changes`] lists.
pub use lockbox_cow::{Change, FileHunks, Hunk, HunkLine, LineOp, Side};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncRead;

use crate::sandbox::{lock, start_instance, Instance, SandboxInner};

/// The runtime: all sandboxes of one state directory. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

#[derive(Debug)]
struct RuntimeInner {
    /// Held while the runtime lives: one runtime per state directory.
    _state_lock: std::fs::File,
    config: RuntimeConfig,
    agent_exe: PathBuf,
    store: store::Store,
    sandboxes: Mutex<HashMap<String, Arc<SandboxInner>>>,
    /// Sandboxes being created (counted against the limit).
    starting: AtomicU64,
    /// What all process logs may reserve together.
    log_budget: Arc<sandbox::LogBudget>,
}

impl Runtime {
    /// Opens the state directory; sandboxes a previous runtime left running become `Lost`
    /// (their branches are kept).
    pub async fn open(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        std::fs::create_dir_all(&config.state_dir).map_err(|e| {
            RuntimeError::SetupFailed(format!(
                "creating the state directory {}: {e}",
                config.state_dir.display()
            ))
        })?;
        let agent_exe = match &config.agent_exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|e| {
                RuntimeError::SetupFailed(format!("locating the lockbox executable: {e}"))
            })?,
        };
        let agent_exe = std::fs::canonicalize(&agent_exe).map_err(|e| {
            RuntimeError::SetupFailed(format!("agent executable {}: {e}", agent_exe.display()))
        })?;
        let state_lock = lock_state_dir(&config.state_dir)?;
        let store = store::Store::open(&config.state_dir)?;
        store.prune_stopped(config.keep_stopped)?;
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                _state_lock: state_lock,
                agent_exe,
                store,
                sandboxes: Mutex::new(HashMap::new()),
                starting: AtomicU64::new(0),
                log_budget: sandbox::LogBudget::new(config.max_log_memory),
                config,
            }),
        })
    }

    /// Creates and starts a sandbox.
    pub async fn create_sandbox(&self, spec: SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        spec.policy
            .validate()
            .map_err(|e| RuntimeError::invalid("policy", e))?;
        let max = self.inner.config.max_sandboxes;
        let running = lock(&self.inner.sandboxes).len() as u64;
        if running + self.inner.starting.fetch_add(1, Ordering::SeqCst) >= max as u64 {
            self.inner.starting.fetch_sub(1, Ordering::SeqCst);
            return Err(RuntimeError::LimitReached {
                what: "max_sandboxes".into(),
                limit: max,
            });
        }
        let result = self.create_inner(spec).await;
        self.inner.starting.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn create_inner(&self, mut spec: SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        if let Some(w) = &spec.workdir {
            let abs = std::fs::canonicalize(w)
                .map_err(|e| RuntimeError::invalid("workdir", format!("{}: {e}", w.display())))?;
            spec.workdir = Some(abs);
        }
        if spec.idle_timeout.is_none() {
            spec.idle_timeout = self.inner.config.default_idle_timeout;
        }
        let id = format!("sb-{}", util::random_id());
        let instance = start_instance(
            &spec,
            &self.inner.config.state_dir,
            &self.inner.agent_exe,
            &id,
        )
        .await?;
        let grace = spec.policy.kill_grace;
        let sb = Arc::new(SandboxInner {
            id: id.clone(),
            created_at: util::now_rfc3339(),
            spec,
            state_dir: self.inner.config.state_dir.clone(),
            agent_exe: self.inner.agent_exe.clone(),
            limits: sandbox::Limits {
                grace,
                default_log_bytes: self.inner.config.default_log_bytes,
                max_exec_output: self.inner.config.max_exec_output,
                max_sessions: self.inner.config.max_sessions,
                max_processes: self.inner.config.max_processes,
                log_budget: Arc::clone(&self.inner.log_budget),
            },
            instance: Mutex::new(Arc::new(instance)),
            next_process: AtomicU64::new(1),
            last_used: Mutex::new(Instant::now()),
            stopped: AtomicBool::new(false),
            ports: Default::default(),
            lifecycle: tokio::sync::Mutex::new(()),
        });
        let info = sb.info(SandboxState::Running, None);
        let spec_json = serde_json::to_value(&sb.spec).unwrap_or_default();
        if let Err(e) = self.inner.store.insert(&info, &spec_json) {
            sb.instance().stop(Duration::ZERO).await;
            return Err(e);
        }
        lock(&self.inner.sandboxes).insert(id.clone(), sb.clone());
        if let Some(idle) = sb.spec.idle_timeout {
            let rt = self.clone();
            tokio::spawn(async move { rt.idle_watch(id, idle).await });
        }
        Ok(info)
    }

    async fn idle_watch(self, id: String, idle: Duration) {
        loop {
            let Some(sb) = lock(&self.inner.sandboxes).get(&id).cloned() else {
                return;
            };
            // A command still running counts as activity.
            if sb.instance().any_session_busy() {
                sb.touch();
            }
            let last = *lock(&sb.last_used);
            drop(sb);
            let due = last + idle;
            if Instant::now() >= due {
                tracing::info!(sandbox = %id, "idle timeout: deleting");
                let _ = self.delete_sandbox(&id).await;
                return;
            }
            tokio::time::sleep_until(due.into()).await;
        }
    }

    /// All sandboxes, running and recorded (stopped, lost: the last
    /// [`RuntimeConfig::keep_stopped`] stopped ones), oldest first.
    pub async fn list_sandboxes(&self) -> Vec<SandboxInfo> {
        let live: HashMap<String, Arc<SandboxInner>> = lock(&self.inner.sandboxes).clone();
        let mut out = self.inner.store.list().unwrap_or_default();
        for info in &mut out {
            if let Some(sb) = live.get(&info.id) {
                *info = sb.info(SandboxState::Running, None);
            }
        }
        out
    }

    /// A handle to a running sandbox (`SANDBOX_NOT_FOUND`, or `SANDBOX_NOT_RUNNING` for a
    /// stopped or lost one).
    pub async fn sandbox(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        if let Some(sb) = lock(&self.inner.sandboxes).get(id).cloned() {
            sb.touch();
            return Ok(Sandbox { inner: sb });
        }
        let info = self.sandbox_info(id).await?;
        Err(RuntimeError::SandboxNotRunning {
            id: id.to_owned(),
            state: serde_json::to_value(info.state)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
        })
    }

    /// What a sandbox is (running or recorded).
    pub async fn sandbox_info(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        if let Some(sb) = lock(&self.inner.sandboxes).get(id).cloned() {
            return Ok(sb.info(SandboxState::Running, None));
        }
        self.inner
            .store
            .list()?
            .into_iter()
            .find(|i| i.id == id)
            .ok_or_else(|| RuntimeError::SandboxNotFound { id: id.to_owned() })
    }

    /// Kills everything in the sandbox and applies its `on_exit` to the branch.
    pub async fn delete_sandbox(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        let sb = lock(&self.inner.sandboxes).get(id).cloned();
        let Some(sb) = sb else {
            return match self.sandbox_info(id).await {
                Ok(info) => Ok(info),
                Err(e) => Err(e),
            };
        };
        let _life = sb.lifecycle.lock().await;
        if sb.stopped.swap(true, Ordering::SeqCst) {
            drop(_life);
            return self.sandbox_info(id).await;
        }
        // Their host listeners end with the sandbox.
        lock(&sb.ports).clear();
        let inst = sb.instance();
        inst.stop(sb.grace()).await;
        let branch = lock(&inst.branch).take();
        let branch_id = branch.as_ref().map(|b| b.id().as_str().to_owned());
        let action = match branch {
            None => None,
            Some(b) => {
                let on_exit = sb.spec.on_exit;
                let done = tokio::task::spawn_blocking(move || finish_branch(b, on_exit))
                    .await
                    .unwrap_or_else(|_| "kept".to_owned());
                Some(done)
            }
        };
        let mut info = sb.info(SandboxState::Stopped, action.clone());
        info.branch = branch_id.clone();
        info.sessions = 0;
        info.processes = 0;
        let _ = self.inner.store.update(
            id,
            SandboxState::Stopped,
            branch_id.as_deref(),
            action.as_deref(),
        );
        if let Err(e) = self
            .inner
            .store
            .prune_stopped(self.inner.config.keep_stopped)
        {
            tracing::warn!("forgetting old stopped sandboxes: {e}");
        }
        lock(&self.inner.sandboxes).remove(id);
        Ok(info)
    }

    /// Deletes every running sandbox (each with its `on_exit`).
    pub async fn shutdown(&self) {
        let ids: Vec<String> = lock(&self.inner.sandboxes).keys().cloned().collect();
        let deletes = ids.iter().map(|id| self.delete_sandbox(id));
        futures_util::future::join_all(deletes).await;
    }
}

/// Takes `STATE/runtime.lock`: a second runtime on the same state directory would mark the
/// first one's running sandboxes `lost`.
fn lock_state_dir(state_dir: &std::path::Path) -> Result<std::fs::File, RuntimeError> {
    let path = state_dir.join("runtime.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| RuntimeError::SetupFailed(format!("{}: {e}", path.display())))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(RuntimeError::SetupFailed(format!(
            "the state directory {} is in use by another lockbox runtime (lockbox serve)",
            state_dir.display()
        ))),
        Err(e) => Err(RuntimeError::SetupFailed(format!(
            "{}: {e}",
            path.display()
        ))),
    }
}

/// Applies `on_exit` to a stopped sandbox's branch; returns what was done.
fn finish_branch(mut b: lockbox_cow::Branch, on_exit: OnExit) -> String {
    let id = b.id().as_str().to_owned();
    match on_exit {
        OnExit::Commit => match b.commit(&lockbox_cow::CommitOptions::default()) {
            Ok(_) => "committed".into(),
            Err(e) => {
                tracing::warn!(branch = %id, "commit on exit failed, branch kept: {e}");
                "kept".into()
            }
        },
        OnExit::Abort => match b.abort() {
            Ok(()) => "aborted".into(),
            Err(e) => {
                tracing::warn!(branch = %id, "abort on exit failed: {e}");
                "kept".into()
            }
        },
        // A branch without changes has nothing to review: removed rather than left in
        // `lockbox branch list` (after an abort, the fresh branch is always empty).
        OnExit::Keep if b.changes().is_ok_and(|mut c| c.next().is_none()) => match b.abort() {
            Ok(()) => "empty".into(),
            Err(e) => {
                tracing::warn!(branch = %id, "removing an empty branch failed: {e}");
                "kept".into()
            }
        },
        OnExit::Keep => {
            let _ = b.keep();
            "kept".into()
        }
    }
}

/// A handle to a running sandbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sandbox {
    inner: Arc<SandboxInner>,
}

impl Sandbox {
    /// The sandbox's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    fn live(&self) -> Result<Arc<Instance>, RuntimeError> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(RuntimeError::SandboxNotRunning {
                id: self.inner.id.clone(),
                state: "stopped".into(),
            });
        }
        self.inner.touch();
        Ok(self.inner.instance())
    }

    /// Starts a session (a persistent bash). `ALREADY_EXISTS` if the id is taken.
    pub async fn create_session(&self, opts: SessionOptions) -> Result<SessionInfo, RuntimeError> {
        self.live()?.create_session(opts, &self.inner.limits).await
    }

    /// Ends a session, killing what runs in it.
    pub async fn delete_session(&self, session: &str) -> Result<(), RuntimeError> {
        let inst = self.live()?;
        let removed = inst.sessions.lock().await.remove(session);
        match removed {
            Some((s, _)) => {
                s.kill().await;
                Ok(())
            }
            None => Err(RuntimeError::SessionNotFound {
                id: session.to_owned(),
            }),
        }
    }

    /// The live sessions.
    pub async fn list_sessions(&self) -> Vec<SessionInfo> {
        let inst = self.inner.instance();
        let sessions = inst.sessions.lock().await;
        let mut out: Vec<SessionInfo> = sessions
            .values()
            .filter(|(s, _)| !s.is_dead())
            .map(|(s, _)| s.info())
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        out
    }

    /// Runs a command in a session and returns its buffered result: each of stdout and
    /// stderr up to [`RuntimeConfig::max_exec_output`] (flagged when cut). The command runs
    /// to its end even if this future is dropped.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecResult, RuntimeError> {
        let inst = self.live()?;
        let session = inst
            .session(req.session.as_deref(), &self.inner.limits)
            .await?;
        let mut sink = output::Sink::buffer(self.inner.limits.max_exec_output);
        let task = tokio::spawn(async move {
            let exit = session.exec(&req, &mut sink).await?;
            Ok(sink.into_result(exit))
        });
        task.await.map_err(RuntimeError::internal)?
    }

    /// Runs a command in a session, streaming its output. Output is read as fast as the
    /// stream is consumed (a few events are queued): a slow consumer slows the command down.
    /// Dropping the stream does not kill the command (its output is then read and dropped).
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream, RuntimeError> {
        let inst = self.live()?;
        let session = inst
            .session(req.session.as_deref(), &self.inner.limits)
            .await?;
        let (tx, rx) = tokio::sync::mpsc::channel(output::EVENT_QUEUE);
        tokio::spawn(async move {
            let mut sink = output::Sink::events(tx.clone());
            if let Err(e) = session.exec(&req, &mut sink).await {
                drop(sink);
                let _ = tx
                    .send(ExecEvent::Error {
                        code: e.code(),
                        message: e.to_string(),
                    })
                    .await;
            }
        });
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|e| (e, rx)) },
            );
        Ok(ExecStream {
            inner: Box::pin(stream),
        })
    }

    /// Sends `signal` to the session's running command (its whole tree, not the shell);
    /// bypasses the session's queue.
    pub async fn interrupt(&self, session: &str, signal: i32) -> Result<(), RuntimeError> {
        check_signal(signal)?;
        let inst = self.live()?;
        let s = inst
            .sessions
            .lock()
            .await
            .get(session)
            .map(|(s, _)| s.clone())
            .ok_or_else(|| RuntimeError::SessionNotFound {
                id: session.to_owned(),
            })?;
        s.interrupt(signal).await
    }

    /// Starts a background process; returns at once with its id and pid.
    pub async fn start_process(&self, spec: ProcessSpec) -> Result<ProcessInfo, RuntimeError> {
        let inst = self.live()?;
        let n = self.inner.next_process.fetch_add(1, Ordering::Relaxed);
        inst.start_process(format!("p{n}"), spec, &self.inner.limits)
            .await
    }

    /// All processes, running and exited.
    pub async fn list_processes(&self) -> Vec<ProcessInfo> {
        let inst = self.inner.instance();
        let procs = lock(&inst.processes);
        let mut out: Vec<ProcessInfo> = procs.values().map(|p| p.info()).collect();
        out.sort_by_key(|p| p.id.trim_start_matches('p').parse::<u64>().unwrap_or(0));
        out
    }

    /// One process.
    pub async fn process(&self, id: &str) -> Result<ProcessInfo, RuntimeError> {
        Ok(self.inner.instance().process(id)?.info())
    }

    /// Sends `signal` to the process's whole tree.
    pub async fn signal_process(&self, id: &str, signal: i32) -> Result<(), RuntimeError> {
        check_signal(signal)?;
        let inst = self.live()?;
        let p = inst.process(id)?;
        inst.signal_process(&p, signal).await
    }

    /// TERM, `grace`, KILL of the process's whole tree; waits until it is gone.
    pub async fn kill_process(
        &self,
        id: &str,
        grace: Duration,
    ) -> Result<ProcessInfo, RuntimeError> {
        let inst = self.live()?;
        let p = inst.process(id)?;
        inst.kill_process(&p, grace).await?;
        Ok(p.info())
    }

    /// Writes to the process's stdin (started with `stdin: true`) or PTY.
    pub async fn write_stdin(&self, id: &str, data: Bytes) -> Result<(), RuntimeError> {
        let p = self.live()?.process(id)?;
        p.write_input(&data).await
    }

    /// Closes the process's stdin (for a PTY: sends ^D).
    pub async fn close_stdin(&self, id: &str) -> Result<(), RuntimeError> {
        let p = self.live()?.process(id)?;
        p.close_input().await
    }

    /// Reads the process's log from cursor `since`, at most `max_bytes`.
    pub async fn read_logs(
        &self,
        id: &str,
        since: u64,
        max_bytes: usize,
    ) -> Result<LogChunk, RuntimeError> {
        let p = self.inner.instance().process(id)?;
        Ok(p.log.read(since, max_bytes))
    }

    /// Replays the log from `since`, then follows it live; ends after the process exited
    /// and everything was sent (the last chunk has `eof: true`).
    pub async fn follow_logs(&self, id: &str, since: u64) -> Result<LogStream, RuntimeError> {
        let p = self.inner.instance().process(id)?;
        Ok(LogStream {
            inner: Box::pin(p.log.clone().follow(since)),
        })
    }

    /// Attaches to the process's PTY: scrollback, live output, input.
    pub async fn attach_pty(&self, id: &str) -> Result<PtyAttachment, RuntimeError> {
        let p = self.live()?.process(id)?;
        if p.pty.is_none() {
            return Err(RuntimeError::NotSupported {
                id: id.to_owned(),
                what: "it has no PTY".into(),
            });
        }
        let (scrollback, rx) = p.log.subscribe();
        let output = tokio_stream_from_broadcast(rx);
        // A few messages in flight: a program that does not read its terminal holds the
        // sender (and the client's socket) back instead of queueing input in the server.
        let (tx, mut input) = tokio::sync::mpsc::channel::<Bytes>(8);
        let writer = p.clone();
        tokio::spawn(async move {
            while let Some(data) = input.recv().await {
                if writer.write_input(&data).await.is_err() {
                    break;
                }
            }
        });
        Ok(PtyAttachment {
            scrollback,
            output: PtyOutput {
                inner: Box::pin(output),
            },
            input: tx,
        })
    }

    /// Resizes the process's PTY.
    pub async fn resize_pty(&self, id: &str, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        if cols == 0 || rows == 0 {
            return Err(RuntimeError::invalid("cols/rows", "must be at least 1"));
        }
        self.live()?.process(id)?.resize(cols, rows)
    }

    /// Creates a code context: a persistent `python`, `bash` or `node` interpreter (started on its
    /// first run). `INVALID_REQUEST` naming `language` for another language,
    /// `ALREADY_EXISTS` for a taken id, `LIMIT_REACHED` beyond [`MAX_CONTEXTS`].
    pub async fn create_context(&self, opts: ContextOptions) -> Result<ContextInfo, RuntimeError> {
        self.live()?.create_context(opts).await
    }

    /// The code contexts, by id.
    pub async fn list_contexts(&self) -> Vec<ContextInfo> {
        let inst = self.inner.instance();
        let contexts = inst.contexts.lock().await;
        contexts.values().map(|c| c.info()).collect()
    }

    /// Deletes a code context, killing its interpreter (and a run in progress).
    /// `CONTEXT_NOT_FOUND` if there is none of this id.
    pub async fn delete_context(&self, id: &str) -> Result<(), RuntimeError> {
        let inst = self.live()?;
        let removed = inst.contexts.lock().await.remove(id);
        match removed {
            Some(c) => {
                c.kill().await;
                Ok(())
            }
            None => Err(RuntimeError::ContextNotFound { id: id.to_owned() }),
        }
    }

    /// Runs code in a context (the `default` Python context when `req.context` is `None`)
    /// and returns its [`Execution`]. A timeout interrupts the code (SIGINT, then a kill
    /// and a fresh interpreter after [`CONTEXT_INTERRUPT_GRACE`]); these and a crashing
    /// interpreter are reported in `error`, not as `Err`. The run goes on to its end even
    /// if this future is dropped.
    pub async fn run_code(&self, req: RunCodeRequest) -> Result<Execution, RuntimeError> {
        let ctx = self.live()?.context(req.context.as_deref()).await?;
        let max = self.inner.limits.max_exec_output;
        let timeout = req.timeout.unwrap_or(DEFAULT_RUN_TIMEOUT);
        let task = tokio::spawn(async move {
            let mut ignore = |_: CodeEvent| {};
            ctx.run(&req.code, timeout, max, &mut ignore).await
        });
        task.await.map_err(RuntimeError::internal)?
    }

    /// [`Sandbox::run_code`], streaming: output and results as they come, then
    /// [`CodeEvent::End`] with the whole execution. The run is not slowed by a slow
    /// consumer: events are queued, output text up to [`RuntimeConfig::max_exec_output`]
    /// bytes per run (beyond it, only the final execution's `truncated` says more came).
    pub async fn run_code_stream(&self, req: RunCodeRequest) -> Result<CodeStream, RuntimeError> {
        let ctx = self.live()?.context(req.context.as_deref()).await?;
        let max = self.inner.limits.max_exec_output;
        let timeout = req.timeout.unwrap_or(DEFAULT_RUN_TIMEOUT);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let events = tx.clone();
            let mut streamed = 0usize;
            let mut emit = move |e: CodeEvent| {
                if let CodeEvent::Stdout { text } | CodeEvent::Stderr { text } = &e {
                    streamed += text.len();
                    if streamed > max {
                        return;
                    }
                }
                let _ = events.send(e);
            };
            match ctx.run(&req.code, timeout, max, &mut emit).await {
                Ok(exec) => {
                    let _ = tx.send(CodeEvent::End(Box::new(exec)));
                }
                Err(e) => {
                    let exec = Execution {
                        context: ctx.id.clone(),
                        error: Some(ExecError {
                            name: e.code().as_str().to_owned(),
                            value: e.to_string(),
                            traceback: String::new(),
                        }),
                        ..Execution::default()
                    };
                    let _ = tx.send(CodeEvent::End(Box::new(exec)));
                }
            }
        });
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|e| (e, rx)) },
            );
        Ok(CodeStream {
            inner: Box::pin(stream),
        })
    }

    /// Exposes `port` of the sandbox: reachable through [`Sandbox::connect_port`] (the
    /// server's proxy) and, with `host_loopback`, on a host loopback address. Exposing
    /// an exposed port again returns it (adding a host listener if asked). At most
    /// [`MAX_EXPOSED_PORTS`] (`LIMIT_REACHED`).
    pub async fn expose_port(
        &self,
        port: u16,
        opts: ExposeOptions,
    ) -> Result<PortInfo, RuntimeError> {
        self.live()?;
        ports::check_port(u32::from(port))?;
        ports::expose(&self.inner, port, opts).await
    }

    /// Stops exposing `port` (and its host listener); `PORT_NOT_EXPOSED` if it was not.
    pub async fn unexpose_port(&self, port: u16) -> Result<(), RuntimeError> {
        ports::unexpose(&self.inner, port)
    }

    /// The exposed ports, by port number.
    pub async fn ports(&self) -> Vec<PortInfo> {
        ports::list(&self.inner)
    }

    /// A new TCP connection to exposed `port` inside the sandbox (its 127.0.0.1, or ::1).
    /// `PORT_NOT_EXPOSED`, or `PORT_NOT_LISTENING` when nothing listens there.
    pub async fn connect_port(&self, port: u16) -> Result<tokio::net::TcpStream, RuntimeError> {
        self.live()?;
        ports::connect(&self.inner, port).await
    }

    /// Opens a file inside the sandbox for reading (whole, or a range).
    pub async fn read_file(
        &self,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<FileRead, RuntimeError> {
        files::read_file(&self.live()?.agent, path, range).await
    }

    /// Writes a file inside the sandbox atomically (temp file + rename) from a stream.
    pub async fn write_file(
        &self,
        path: &str,
        body: Pin<Box<dyn AsyncRead + Send>>,
        opts: WriteOptions,
    ) -> Result<FileStat, RuntimeError> {
        files::write_file(&self.live()?.agent, path, body, opts).await
    }

    /// Stats a path (symlinks not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat, RuntimeError> {
        files::stat(&self.live()?.agent, path).await
    }

    /// Lists a directory (sorted by name; depth first when recursive, never through
    /// symlinks).
    pub async fn list(
        &self,
        path: &str,
        recursive: bool,
        hidden: bool,
    ) -> Result<Vec<FileStat>, RuntimeError> {
        let entries = self.list_stream(path, recursive, hidden).await?;
        entries.try_collect().await
    }

    /// As [`Sandbox::list`], one entry at a time (a large tree is never held whole).
    pub async fn list_stream(
        &self,
        path: &str,
        recursive: bool,
        hidden: bool,
    ) -> Result<FileList, RuntimeError> {
        files::list(&self.live()?.agent, path, recursive, hidden).await
    }

    /// Creates a directory.
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<FileStat, RuntimeError> {
        files::mkdir(&self.live()?.agent, path, parents).await
    }

    /// Removes a file or (with `recursive`, or if empty) a directory.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), RuntimeError> {
        files::remove(&self.live()?.agent, path, recursive).await
    }

    /// Renames `from` to `to`.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<FileStat, RuntimeError> {
        files::rename(&self.live()?.agent, from, to, overwrite).await
    }

    fn no_workdir(&self) -> RuntimeError {
        RuntimeError::NoWorkdir {
            id: self.inner.id.clone(),
        }
    }

    /// The changes of the sandbox's branch against its workdir.
    pub async fn changes(&self) -> Result<Vec<Change>, RuntimeError> {
        let inst = self.live()?;
        tokio::task::spawn_blocking(move || match lock(&inst.branch).as_ref() {
            Some(b) => Ok(workspace::changes(b)),
            None => Err(()),
        })
        .await
        .map_err(RuntimeError::internal)?
        .map_err(|()| self.no_workdir())?
    }

    /// The diff of one path of the sandbox's branch against its workdir, as numbered hunks.
    pub async fn diff(&self, path: std::path::PathBuf) -> Result<FileHunks, RuntimeError> {
        let inst = self.live()?;
        tokio::task::spawn_blocking(move || match lock(&inst.branch).as_ref() {
            Some(b) => Ok(lockbox_cow::file_hunks(&b.upper_dir(), b.workdir(), &path)
                .map_err(workspace::diff_error)),
            None => Err(()),
        })
        .await
        .map_err(RuntimeError::internal)?
        .map_err(|()| self.no_workdir())?
    }

    /// Commits (the selected part of) the branch to the workdir; the sandbox keeps running
    /// (see `docs/runtime.md`).
    pub async fn commit(&self, sel: Selection) -> Result<CommitSummary, RuntimeError> {
        let _life = self.inner.lifecycle.lock().await;
        let inst = self.live()?;
        tokio::task::spawn_blocking(move || {
            let mut branch = lock(&inst.branch);
            let Some(b) = branch.as_mut() else {
                return Err(None);
            };
            workspace::commit(b, &sel).map_err(Some)
        })
        .await
        .map_err(RuntimeError::internal)?
        .map_err(|e| e.unwrap_or_else(|| self.no_workdir()))
    }

    /// Discards the branch's changes: stops everything in the sandbox and restarts it on a
    /// fresh branch of the same workdir (same id and policy).
    pub async fn abort(&self) -> Result<(), RuntimeError> {
        let _life = self.inner.lifecycle.lock().await;
        let old = self.live()?;
        if lock(&old.branch).is_none() {
            return Err(self.no_workdir());
        }
        old.stop(self.inner.grace()).await;
        let branch = lock(&old.branch).take();
        if let Some(b) = branch {
            tokio::task::spawn_blocking(move || b.abort())
                .await
                .map_err(RuntimeError::internal)?
                .map_err(workspace::cow_error)?;
        }
        let fresh = start_instance(
            &self.inner.spec,
            &self.inner.state_dir,
            &self.inner.agent_exe,
            &self.inner.id,
        )
        .await?;
        *lock(&self.inner.instance) = Arc::new(fresh);
        Ok(())
    }
}

fn check_signal(signal: i32) -> Result<(), RuntimeError> {
    if (1..=64).contains(&signal) {
        Ok(())
    } else {
        Err(RuntimeError::invalid(
            "signal",
            format!("{signal} is not a signal number"),
        ))
    }
}

/// Live PTY output; a viewer that lags skips what it missed (the log keeps it).
fn tokio_stream_from_broadcast(
    rx: tokio::sync::broadcast::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(b) => return Some((b, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}
