//! [`Sandbox`]: the handle to a running sandbox, each operation delegated to its module
//! (sessions, processes, PTYs, ports, files, watches, the workspace).

use crate::contexts::DEFAULT_RUN_TIMEOUT;
use crate::streams::{
    CodeStream, ExecStream, FileList, FileRead, LogStream, PtyAttachment, PtyOutput, WatchStream,
};
use crate::types::*;
use crate::{files, output, ports, watch, workspace, RuntimeError};
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use lockbox_cow::{Change, ContentDigest, FileHunks, ReviewedChange};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncRead;

use crate::sandbox::{lock, start_instance, Instance, SandboxInner};

/// A handle to a running sandbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<SandboxInner>,
}

impl Sandbox {
    /// The sandbox's id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    pub(crate) fn live(&self) -> Result<Arc<Instance>, RuntimeError> {
        if self.inner.stopped.load(Ordering::SeqCst) {
            return Err(RuntimeError::SandboxNotRunning {
                id: self.inner.id.clone(),
                state: SandboxState::Stopped,
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
        task.await.map_err(RuntimeError::Task)?
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
    pub async fn interrupt(&self, session: &str, signal: Signal) -> Result<(), RuntimeError> {
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
        s.interrupt(signal.number()).await
    }

    /// Starts a background process; returns at once with its id and pid.
    pub async fn start_process(&self, spec: ProcessSpec) -> Result<ProcessInfo, RuntimeError> {
        let inst = self.live()?;
        let n = self.inner.next_process.fetch_add(1, Ordering::Relaxed);
        inst.start_process(ProcessId::from(format!("p{n}")), spec, &self.inner.limits)
            .await
    }

    /// All processes, running and exited.
    pub fn list_processes(&self) -> Vec<ProcessInfo> {
        let inst = self.inner.instance();
        let procs = lock(&inst.processes);
        let mut out: Vec<ProcessInfo> = procs.values().map(|p| p.info()).collect();
        out.sort_by_key(|p| p.id.trim_start_matches('p').parse::<u64>().unwrap_or(0));
        out
    }

    /// One process.
    pub fn process(&self, id: &str) -> Result<ProcessInfo, RuntimeError> {
        Ok(self.inner.instance().process(id)?.info())
    }

    /// Sends `signal` to the process's whole tree.
    pub async fn signal_process(&self, id: &str, signal: Signal) -> Result<(), RuntimeError> {
        let inst = self.live()?;
        let p = inst.process(id)?;
        inst.signal_process(&p, signal.number()).await
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
    pub fn read_logs(
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
    pub fn follow_logs(&self, id: &str, since: u64) -> Result<LogStream, RuntimeError> {
        let p = self.inner.instance().process(id)?;
        Ok(LogStream {
            inner: Box::pin(p.log.clone().follow(since)),
        })
    }

    /// Attaches to the process's PTY: scrollback, live output, input.
    pub fn attach_pty(&self, id: &str) -> Result<PtyAttachment, RuntimeError> {
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
    pub fn resize_pty(&self, id: &str, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        if cols == 0 || rows == 0 {
            return Err(RuntimeError::invalid("cols/rows", "must be at least 1"));
        }
        self.live()?.process(id)?.resize(cols, rows)
    }

    /// Creates a code context: a persistent `python`, `bash` or `node` interpreter (started on its
    /// first run). `INVALID_REQUEST` naming `language` for another language,
    /// `ALREADY_EXISTS` for a taken id, `LIMIT_REACHED` beyond [`MAX_CONTEXTS`](crate::MAX_CONTEXTS).
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
    /// and a fresh interpreter after [`CONTEXT_INTERRUPT_GRACE`](crate::CONTEXT_INTERRUPT_GRACE)); these and a crashing
    /// interpreter are reported in `error`, not as `Err`. The run goes on to its end even
    /// if this future is dropped.
    pub async fn run_code(&self, req: RunCodeRequest) -> Result<Execution, RuntimeError> {
        crate::util::check_env(req.env.iter().map(|(k, v)| (k, v)))?;
        let ctx = self.live()?.context(req.context.as_deref()).await?;
        let max = self.inner.limits.max_exec_output;
        let timeout = req.timeout.unwrap_or(DEFAULT_RUN_TIMEOUT);
        let task = tokio::spawn(async move {
            let mut ignore = |_: CodeEvent| {};
            ctx.run(&req.code, &req.env, timeout, max, &mut ignore, None)
                .await
        });
        task.await.map_err(RuntimeError::Task)?
    }

    /// [`Sandbox::run_code`], streaming: output and results as they come, then
    /// [`CodeEvent::End`] with the whole execution. The run is not slowed by a slow
    /// consumer: events are queued, output text up to [`RuntimeConfig::max_exec_output`]
    /// bytes per run (beyond it, only the final execution's `truncated` says more came).
    pub async fn run_code_stream(&self, req: RunCodeRequest) -> Result<CodeStream, RuntimeError> {
        crate::util::check_env(req.env.iter().map(|(k, v)| (k, v)))?;
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
            let run = ctx.run(&req.code, &req.env, timeout, max, &mut emit, Some(&tx));
            match run.await {
                Ok(exec) => {
                    let _ = tx.send(CodeEvent::End(Box::new(exec)));
                }
                Err(e) => {
                    let exec = Execution {
                        error: Some(ExecError {
                            name: e.code().as_str().to_owned(),
                            value: e.to_string(),
                            traceback: String::new(),
                        }),
                        ..Execution::in_context(ctx.id.clone())
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
    /// [`MAX_EXPOSED_PORTS`](crate::MAX_EXPOSED_PORTS) (`LIMIT_REACHED`).
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
    pub fn unexpose_port(&self, port: u16) -> Result<(), RuntimeError> {
        ports::unexpose(&self.inner, port)
    }

    /// The exposed ports, by port number.
    pub fn ports(&self) -> Vec<PortInfo> {
        ports::list(&self.inner)
    }

    /// A new TCP connection to exposed `port` inside the sandbox (its 127.0.0.1, or ::1).
    /// `PORT_NOT_EXPOSED`, or `PORT_NOT_LISTENING` when nothing listens there.
    pub async fn connect_port(&self, port: u16) -> Result<tokio::net::TcpStream, RuntimeError> {
        self.live()?;
        ports::connect(&self.inner, port).await
    }

    /// Opens a file inside the sandbox for reading (whole, or a range). A regular file
    /// streams, bounded by its size when opened. A file whose `stat` size is not its length
    /// (`/proc`, `/sys`: 0 or 4096) is read to its end first, as `cat` would, keeping at most
    /// [`RuntimeConfig::max_exec_output`](crate::RuntimeConfig::max_exec_output) bytes, so
    /// that `size` is its real length; one giving more is `INVALID_REQUEST` on `path`.
    pub async fn read_file(
        &self,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<FileRead, RuntimeError> {
        let max = self.inner.limits.max_exec_output;
        files::read_file(&self.live()?.agent, path, range, max).await
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

    /// Watches `path` (a file or directory, resolved inside the sandbox) for changes:
    /// created, modified, deleted and moved, with paths as the sandbox sees them; with
    /// `recursive`, everything below a directory too. Dropping the stream stops the watch.
    /// Bounds: 32 watches per sandbox, 8,192 watched directories per sandbox (beyond, an
    /// `Error` event names the limit), 4,096 queued events per watch in the agent and again
    /// in the stream (beyond, one `Overflow` event).
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<WatchStream, RuntimeError> {
        watch::watch(&self.live()?.agent, path, recursive).await
    }

    /// The network supervisor's decisions kept for this sandbox (the last
    /// [`crate::AUDIT_RING`]), oldest first: one event per connect or send towards the
    /// host's network and per DNS query answered (`--net-allow`/`--net-deny` policies; empty
    /// otherwise). Works on a stopped sandbox too.
    pub fn audit_log(&self) -> Vec<crate::NetEvent> {
        self.inner.audit.snapshot()
    }

    /// [`Sandbox::audit_log`]'s events, then each new one as it is decided (see
    /// [`crate::AuditStream`]).
    pub fn audit(&self) -> crate::AuditStream {
        self.inner.audit.follow()
    }

    /// The approval questions (`net_ask`) waiting for a verdict, oldest first, with an id
    /// above `after`; with a `wait`, waits up to that long for one (a long poll). Empty for
    /// a sandbox without `net_ask`.
    pub async fn approvals(
        &self,
        after: u64,
        wait: Duration,
    ) -> Result<Vec<crate::Question>, RuntimeError> {
        let Some(desk) = self.live()?.approvals.clone() else {
            return Ok(Vec::new());
        };
        if !wait.is_zero() {
            let waiting = desk.clone();
            tokio::task::spawn_blocking(move || waiting.next(after, wait))
                .await
                .map_err(RuntimeError::Task)?;
        }
        Ok(desk
            .pending()
            .into_iter()
            .filter(|q| q.id > after)
            .collect())
    }

    /// Answers approval question `id`; `by` is logged with a denial (`denied by BY`).
    /// `QUESTION_NOT_FOUND` if it is not pending (never asked, timed out, its caller gone),
    /// `QUESTION_DECIDED` if it was answered already.
    pub fn decide(&self, id: u64, verdict: crate::Verdict, by: &str) -> Result<(), RuntimeError> {
        let Some(desk) = self.live()?.approvals.clone() else {
            return Err(RuntimeError::QuestionNotFound { id });
        };
        desk.decide(id, verdict, by).map_err(|e| match e {
            lockbox_netsup::DecideError::Decided { id } => RuntimeError::QuestionDecided { id },
            _ => RuntimeError::QuestionNotFound { id },
        })
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
            id: self.inner.id.to_string(),
        }
    }

    /// Takes a snapshot of the sandbox's files (its branch: the workdir as the sandbox sees
    /// it): its processes are paused while the branch's upper layer is copied, then go on.
    /// Processes' memory is not captured (that needs `CAP_CHECKPOINT_RESTORE`).
    /// `NO_WORKDIR` for a sandbox without a workdir.
    pub async fn snapshot(&self, name: Option<String>) -> Result<SnapshotInfo, RuntimeError> {
        self.snapshot_with(SnapshotOptions {
            name,
            include_tmp: false,
        })
        .await
    }

    /// `image commit`: what this image sandbox wrote to its root (files made, changed and
    /// deleted outside its workdir and grants) as a new layer on its image, named `names`
    /// (`app:2`, ...). The sandbox goes on; a write made during the commit may or may not
    /// be in the layer. A sandbox on the host's userland has no image root:
    /// `INVALID_REQUEST` (field `sandbox`).
    pub async fn commit_image(
        &self,
        names: Vec<String>,
    ) -> Result<lockbox_image::build::Committed, RuntimeError> {
        let inst = self.live()?;
        let not_image = || {
            RuntimeError::invalid(
                "sandbox",
                format!(
                    "sandbox {} runs on the host's userland, not an image: it has no image root to commit",
                    self.id()
                ),
            )
        };
        let hold = inst.image.as_ref().ok_or_else(not_image)?;
        if hold.root.is_none() {
            return Err(not_image());
        }
        if names.is_empty() {
            return Err(RuntimeError::invalid(
                "tags",
                "name the new image (at least one tag)",
            ));
        }
        let source = format!("commit of sandbox {}", self.id());
        tokio::task::spawn_blocking(move || {
            let hold = inst
                .image
                .as_ref()
                .ok_or_else(|| RuntimeError::invalid("sandbox", "no image"))?;
            let upper = hold
                .root
                .as_ref()
                .map(|r| r.0.join("upper"))
                .ok_or_else(|| RuntimeError::invalid("sandbox", "no image root"))?;
            let store =
                lockbox_image::Store::in_state_dir(&hold.state_dir).map_err(RuntimeError::Image)?;
            lockbox_image::build::commit_upper(&store, &upper, &hold.id, &names, &source)
                .map_err(RuntimeError::Image)
        })
        .await
        .map_err(RuntimeError::Task)?
    }

    /// [`Sandbox::snapshot`] with options: a name, and whether to keep the sandbox's `/tmp`
    /// too (`include_tmp`), which its forks and restores then find in their `/tmp`.
    pub async fn snapshot_with(&self, opts: SnapshotOptions) -> Result<SnapshotInfo, RuntimeError> {
        let SnapshotOptions { name, include_tmp } = opts;
        let inst = self.live()?;
        let _life = self.inner.lifecycle.lock().await;
        if lock(&inst.branch).is_none() {
            return Err(self.no_workdir());
        }
        // Asked before the processes are paused: the shells answer.
        let sessions = inst.session_states().await;
        let sb = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let spec = sb.spec_now();
            let context = crate::snapshots::Recorded {
                spec: &spec,
                sessions: &sessions,
            };
            crate::snapshots::take(
                &inst,
                &sb.snapshots,
                &sb.id,
                name,
                context,
                sb.limits.snapshots,
                include_tmp,
            )
        })
        .await
        .map_err(RuntimeError::Task)?
    }

    /// Starts the sessions a snapshot recorded, in their cwd with their variables (one whose
    /// cwd is gone starts in the default one). Best effort: the sandbox is usable without.
    pub(crate) async fn start_recorded_sessions(&self, meta: &lockbox_cow::SnapshotMeta) {
        if let Ok(inst) = self.live() {
            crate::snapshots::start_sessions(&inst, meta, &self.inner.limits).await;
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
        .map_err(RuntimeError::Task)?
        .map_err(|()| self.no_workdir())?
    }

    /// The changes of the sandbox's branch, each with the digest of what the branch has at
    /// its path: a review, which a commit that follows it names (`Selection::review`).
    pub async fn review(&self) -> Result<Vec<ReviewedChange>, RuntimeError> {
        let inst = self.live()?;
        tokio::task::spawn_blocking(move || match lock(&inst.branch).as_ref() {
            Some(b) => Ok(b.review().map_err(workspace::cow_error)),
            None => Err(()),
        })
        .await
        .map_err(RuntimeError::Task)?
        .map_err(|()| self.no_workdir())?
    }

    /// The diff of one path of the sandbox's branch against its workdir, as numbered hunks,
    /// with the digest of the branch side they were made from (what a commit of them names).
    pub async fn diff(
        &self,
        path: std::path::PathBuf,
    ) -> Result<(FileHunks, ContentDigest), RuntimeError> {
        let inst = self.live()?;
        tokio::task::spawn_blocking(move || match lock(&inst.branch).as_ref() {
            Some(b) => Ok(b
                .view()
                .and_then(|view| lockbox_cow::file_review(view.path(), b.workdir(), &path))
                .map_err(workspace::diff_error)),
            None => Err(()),
        })
        .await
        .map_err(RuntimeError::Task)?
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
        .map_err(RuntimeError::Task)?
        .map_err(|e| e.unwrap_or_else(|| self.no_workdir()))
    }

    /// Discards the branch's changes: stops everything in the sandbox and restarts it on a
    /// fresh branch of the same workdir (same id and policy); a fork stays a fork of its
    /// snapshot.
    pub async fn abort(&self) -> Result<(), RuntimeError> {
        let _life = self.inner.lifecycle.lock().await;
        let old = self.live()?;
        if lock(&old.branch).is_none() {
            return Err(self.no_workdir());
        }
        let base = old.base.clone();
        self.start_over(&old, base.as_ref()).await
    }

    /// Rolls the sandbox back to snapshot `id` (one of its own, or any of its workdir): its
    /// processes, sessions and code contexts are stopped, its branch discarded, and it starts
    /// again (same id and policy) seeing exactly the snapshot's files, with its own layer over
    /// them. Processes' memory is not restored: a snapshot holds files only.
    pub async fn restore(&self, id: &str) -> Result<(), RuntimeError> {
        let target = crate::snapshots::parse_id(id)?;
        let meta = self
            .inner
            .snapshots
            .get(&target)
            .map_err(RuntimeError::Branch)?;
        let _life = self.inner.lifecycle.lock().await;
        let old = self.live()?;
        let mut workdir = self.inner.spec.workdir.clone();
        if workdir.is_none() {
            return Err(self.no_workdir());
        }
        crate::snapshots::check_workdir(&meta, &mut workdir)?;
        self.start_over(&old, Some(&target)).await?;
        let inst = self.inner.instance();
        let store = self.inner.snapshots.clone();
        tokio::task::spawn_blocking(move || crate::snapshots::restore_tmp(&store, &target, &inst))
            .await
            .map_err(RuntimeError::Task)??;
        self.start_recorded_sessions(&meta).await;
        Ok(())
    }

    /// Stops `old` (the current instance), discards its branch and starts the sandbox again
    /// (same id and policy) on a fresh branch: of the workdir, or over snapshot `base`, which
    /// is held meanwhile so that it cannot be deleted before the fresh branch names it.
    async fn start_over(
        &self,
        old: &Instance,
        base: Option<&lockbox_cow::SnapshotId>,
    ) -> Result<(), RuntimeError> {
        let store = &self.inner.snapshots;
        let hold = lockbox_cow::process_hold("restart", &self.inner.id);
        if let Some(b) = base {
            store.hold(b, &hold).map_err(RuntimeError::Branch)?;
        }
        let result = async {
            old.stop(self.inner.grace()).await;
            let branch = lock(&old.branch).take();
            if let Some(b) = branch {
                tokio::task::spawn_blocking(move || b.abort())
                    .await
                    .map_err(RuntimeError::Task)?
                    .map_err(workspace::cow_error)?;
            }
            let origin = crate::sandbox::Origin {
                state_dir: &self.inner.state_dir,
                snapshots: store,
                base,
                spare: false,
            };
            let fresh = start_instance(
                &self.inner.spec_now(),
                origin,
                &self.inner.agent_exe,
                &self.inner.id,
                &self.inner.audit,
            )
            .await?;
            if let Some(was) = &old.image {
                was.release_unless_held_by(fresh.image.as_ref());
            }
            *lock(&self.inner.instance) = Arc::new(fresh);
            Ok(())
        }
        .await;
        if let Some(b) = base {
            let _ = store.release(b, &hold);
        }
        result
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
