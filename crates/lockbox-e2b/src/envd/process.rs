//! `process.Process` on lockbox's background processes: a process started here is a
//! runtime process (it outlives the Start call: closing the stream only stops following
//! it), named to E2B by its pid in the sandbox (or the tag it was started with).

use super::connect::{self, Call, Code, ConnectError, Events, Incoming};
use super::proto::*;
use super::{lock, rt_error, Ctx, Envd, Head};
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use futures_util::StreamExt;
use lockbox_runtime::{
    OutputStream, ProcessCommand, ProcessSpec, ProcessState, PtySize, RuntimeError, Sandbox, Signal,
};
use std::collections::BTreeMap;

/// What E2B started a process with (for List and tags).
#[derive(Debug, Clone)]
pub struct Started {
    tag: Option<String>,
    config: ProcessConfig,
}

pub(super) fn routes() -> Router<Envd> {
    Router::new()
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect_to))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/StreamInput", post(stream_input))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Update", post(update))
        .route("/process.Process/{method}", post(unknown))
}

async fn unknown(
    axum::extract::Path(method): axum::extract::Path<String>,
    req: Request,
) -> Response {
    connect::unimplemented(&req, &format!("process.Process/{method}"))
}

fn keepalive_start() -> StartResponse {
    StartResponse {
        event: Some(ProcessEvent {
            event: Some(Event::Keepalive(KeepAlive {})),
        }),
    }
}

fn keepalive_connect() -> ConnectResponse {
    ConnectResponse {
        event: Some(ProcessEvent {
            event: Some(Event::Keepalive(KeepAlive {})),
        }),
    }
}

async fn start(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::server_stream(
        req,
        keepalive_start,
        move |msg: StartRequest, call: Call| async move {
            let ctx = envd.ctx(&head).await?;
            let events = envd.start_process(&ctx, msg, call.timeout).await?;
            Ok::<Events<StartResponse>, ConnectError>(
                events
                    .map(|e| e.map(|event| StartResponse { event: Some(event) }))
                    .boxed(),
            )
        },
    )
    .await
}

async fn connect_to(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::server_stream(
        req,
        keepalive_connect,
        move |msg: ConnectRequest, _call: Call| async move {
            let ctx = envd.ctx(&head).await?;
            let id = envd.find(&ctx, msg.process.as_ref())?;
            let info = ctx.sandbox.process(&id).map_err(|e| rt_error(&ctx.id, e))?;
            // Like envd: output from now on (what was written before is not replayed).
            let events = follow(ctx.sandbox.clone(), id, info.pid, info.log_end)?;
            Ok::<Events<ConnectResponse>, ConnectError>(
                events
                    .map(|e| e.map(|event| ConnectResponse { event: Some(event) }))
                    .boxed(),
            )
        },
    )
    .await
}

impl Envd {
    /// Starts the process; like envd, a call with a deadline (the SDK's command `timeout`,
    /// 60 s by default, `0` for none) bounds the process's life too: it is killed then,
    /// whether or not anyone still follows it. Unlike envd, which kills only the process
    /// itself, lockbox ends its whole tree (a lockbox process is its tree).
    async fn start_process(
        &self,
        ctx: &Ctx,
        msg: StartRequest,
        timeout: Option<std::time::Duration>,
    ) -> Result<Events<ProcessEvent>, ConnectError> {
        let config = msg.process.unwrap_or_default();
        if config.cmd.is_empty() {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "process.cmd: empty (name the program to run)",
            ));
        }
        let mut env: BTreeMap<String, String> = self.sandbox_env(&ctx.id).into_iter().collect();
        if ctx.home == ctx.user.home() {
            env.insert("HOME".into(), ctx.home.clone());
        }
        env.insert("USER".into(), ctx.user.name().into());
        env.insert("LOGNAME".into(), ctx.user.name().into());
        env.extend(config.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        let cwd = match config.cwd.as_deref() {
            Some(c) if !c.is_empty() => ctx.resolve(c),
            _ => ctx.home.clone(),
        };
        let pty = match msg.pty.and_then(|p| p.size) {
            Some(size) => Some(pty_size(&size)?),
            None => None,
        };
        let mut argv = vec![config.cmd.clone()];
        argv.extend(config.args.iter().cloned());
        let spec = ProcessSpec {
            command: ProcessCommand::Argv(argv),
            cwd: Some(cwd),
            env,
            pty,
            log_bytes: None,
            // Unset means open, as for SDKs older than stdin control (envd 0.3.0).
            stdin: msg.stdin.unwrap_or(true),
        };
        if let Some(tag) = &msg.tag {
            let taken = self
                .running(ctx)
                .into_iter()
                .any(|(_, started)| started.and_then(|s| s.tag).as_deref() == Some(tag));
            if taken {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("a running process has tag {tag:?} already"),
                ));
            }
        }
        let info = ctx
            .sandbox
            .start_process(spec)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        let mut all = lock(&self.state.processes);
        let ours = all.entry(ctx.sandbox.id().to_owned()).or_default();
        // What E2B remembers of processes that ended goes (List shows running ones only).
        // Each remembered one is looked up by id: listing all the sandbox's processes,
        // exited ones included (kept up to `max_processes`), cost every start time in
        // proportion to how many commands had run before it (issue 30).
        ours.retain(|id, _| {
            ctx.sandbox
                .process(id)
                .is_ok_and(|p| p.state == ProcessState::Running)
        });
        ours.insert(
            info.id.as_str().to_owned(),
            Started {
                tag: msg.tag,
                config,
            },
        );
        drop(all);
        if let Some(timeout) = timeout {
            let (sandbox, id) = (ctx.sandbox.clone(), info.id.as_str().to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                if sandbox
                    .process(&id)
                    .is_ok_and(|p| p.state == ProcessState::Running)
                {
                    if let Err(e) = sandbox.kill_process(&id, std::time::Duration::ZERO).await {
                        tracing::debug!("killing process {id} at its deadline: {e}");
                    }
                }
            });
        }
        follow(
            ctx.sandbox.clone(),
            info.id.as_str().to_owned(),
            info.pid,
            0,
        )
    }

    /// The sandbox's running processes with what E2B started them with, if it did.
    fn running(&self, ctx: &Ctx) -> Vec<(lockbox_runtime::ProcessInfo, Option<Started>)> {
        let all = lock(&self.state.processes);
        let ours = all.get(ctx.sandbox.id());
        ctx.sandbox
            .list_processes()
            .into_iter()
            .filter(|p| p.state == ProcessState::Running)
            .map(|p| {
                let started = ours.and_then(|m| m.get(p.id.as_str())).cloned();
                (p, started)
            })
            .collect()
    }

    /// The lockbox id of the running process `selector` names.
    fn find(&self, ctx: &Ctx, selector: Option<&ProcessSelector>) -> Result<String, ConnectError> {
        let Some(selector) = selector.and_then(|s| s.selector.as_ref()) else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "process: name it by pid or tag",
            ));
        };
        let running = self.running(ctx);
        let found = running.iter().rev().find(|(p, started)| match selector {
            Selector::Pid(pid) => i64::from(p.pid) == i64::from(*pid),
            Selector::Tag(tag) => started.as_ref().and_then(|s| s.tag.as_deref()) == Some(tag),
        });
        match found {
            Some((p, _)) => Ok(p.id.as_str().to_owned()),
            None => Err(ConnectError::new(
                Code::NotFound,
                match selector {
                    Selector::Pid(pid) => format!("process with pid {pid} not found"),
                    Selector::Tag(tag) => format!("process with tag {tag:?} not found"),
                },
            )),
        }
    }
}

fn pty_size(size: &PtySizeMsg) -> Result<PtySize, ConnectError> {
    let dim = |v: u32, name: &str| {
        u16::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("pty.size.{name}: {v} (expected 1 to 65535)"),
            )
        })
    };
    Ok(PtySize {
        cols: dim(size.cols, "cols")?,
        rows: dim(size.rows, "rows")?,
    })
}

/// Process `id`'s events: start, its output from log cursor `since`, then its end.
fn follow(
    sandbox: Sandbox,
    id: String,
    pid: i32,
    since: u64,
) -> Result<Events<ProcessEvent>, ConnectError> {
    let logs = sandbox
        .follow_logs(&id, since)
        .map_err(|e| rt_error(sandbox.id(), e))?;
    let start = ProcessEvent {
        event: Some(Event::Start(StartEvent {
            pid: u32::try_from(pid).unwrap_or_default(),
        })),
    };
    let data = logs.flat_map(|chunk| {
        futures_util::stream::iter(chunk.segments.into_iter().map(|seg| {
            let bytes = seg.data.to_vec();
            let output = match seg.stream {
                OutputStream::Stdout => Output::Stdout(bytes),
                OutputStream::Stderr => Output::Stderr(bytes),
                OutputStream::Pty => Output::Pty(bytes),
            };
            Ok(ProcessEvent {
                event: Some(Event::Data(DataEvent {
                    output: Some(output),
                })),
            })
        }))
    });
    let end = futures_util::stream::once(async move {
        // A process that ended with its sandbox (killed, expired) has no end of its own:
        // say so as envd does when its connection to the sandbox ends, an `unavailable`
        // that leads the SDK to probe the sandbox and report it gone.
        let stopped = || {
            ConnectError::new(
                Code::Unavailable,
                format!(
                    "the connection to sandbox {} ended before the stream completed (the sandbox stopped)",
                    sandbox.id()
                ),
            )
        };
        let info = match sandbox.process(&id) {
            Ok(info) => info,
            Err(RuntimeError::SandboxNotRunning { .. } | RuntimeError::SandboxNotFound { .. }) => {
                return Err(stopped())
            }
            Err(e) => return Err(rt_error(sandbox.id(), e)),
        };
        if info.signal.is_some()
            && matches!(
                sandbox.stat("/").await,
                Err(RuntimeError::SandboxNotRunning { .. } | RuntimeError::SandboxNotFound { .. })
            )
        {
            return Err(stopped());
        }
        Ok(ProcessEvent {
            event: Some(Event::End(end_event(&info))),
        })
    });
    Ok(futures_util::stream::once(async move { Ok(start) })
        .chain(data)
        .chain(end)
        .boxed())
}

/// How envd (Go's `os.ProcessState`) reports an exit: `exit status N` with the code, or
/// `signal: NAME` with exit code -1 and `exited` false; `error` is set unless it exited 0.
fn end_event(info: &lockbox_runtime::ProcessInfo) -> EndEvent {
    match (info.exit_code, info.signal) {
        (_, Some(sig)) => {
            let status = format!("signal: {}", signal_name(sig));
            EndEvent {
                exit_code: -1,
                exited: false,
                error: Some(status.clone()),
                status,
            }
        }
        (code, None) => {
            let code = code.unwrap_or(-1);
            let status = format!("exit status {code}");
            EndEvent {
                exit_code: code,
                exited: true,
                error: (code != 0).then(|| status.clone()),
                status,
            }
        }
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGALRM => "alarm clock".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGABRT => "aborted".into(),
        other => format!("signal {other}"),
    }
}

async fn list(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |_: ListRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let processes = envd
            .running(&ctx)
            .into_iter()
            .map(|(p, started)| {
                let (tag, config) = match started {
                    Some(s) => (s.tag, s.config),
                    None => {
                        let mut argv = p.command.clone().into_iter();
                        let cmd = argv.next().unwrap_or_default();
                        let config = ProcessConfig {
                            cmd,
                            args: argv.collect(),
                            ..ProcessConfig::default()
                        };
                        (None, config)
                    }
                };
                ProcessInfo {
                    config: Some(config),
                    pid: u32::try_from(p.pid).unwrap_or_default(),
                    tag,
                }
            })
            .collect();
        Ok(ListResponse { processes })
    })
    .await
}

async fn send_input(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: SendInputRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let id = envd.find(&ctx, msg.process.as_ref())?;
        write_input(&ctx, &id, msg.input).await?;
        Ok(SendInputResponse {})
    })
    .await
}

async fn write_input(ctx: &Ctx, id: &str, input: Option<ProcessInput>) -> Result<(), ConnectError> {
    let data = match input.and_then(|i| i.input) {
        Some(Input::Stdin(d) | Input::Pty(d)) => d,
        None => return Ok(()),
    };
    ctx.sandbox
        .write_stdin(id, Bytes::from(data))
        .await
        .map_err(|e| rt_error(&ctx.id, e))
}

async fn stream_input(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::client_stream(
        req,
        move |mut incoming: Incoming<StreamInputRequest>, _call: Call| async move {
            let ctx = envd.ctx(&head).await?;
            let mut id = None;
            while let Some(msg) = incoming.next().await? {
                match msg.event {
                    Some(StreamInputEvent::Start(start)) => {
                        id = Some(envd.find(&ctx, start.process.as_ref())?);
                    }
                    Some(StreamInputEvent::Data(data)) => {
                        let Some(id) = &id else {
                            return Err(ConnectError::new(
                                Code::InvalidArgument,
                                "stream input: the first message must be start (naming the process)",
                            ));
                        };
                        write_input(&ctx, id, data.input).await?;
                    }
                    Some(StreamInputEvent::Keepalive(_)) | None => {}
                }
            }
            Ok(StreamInputResponse {})
        },
    )
    .await
}

async fn send_signal(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: SendSignalRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let signal = match msg.signal {
            SIGNAL_SIGTERM | SIGNAL_SIGKILL => {
                Signal::from_number(msg.signal).map_err(|e| rt_error(&ctx.id, e))?
            }
            other => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("signal: {other} (expected SIGNAL_SIGTERM or SIGNAL_SIGKILL)"),
                ))
            }
        };
        let id = envd.find(&ctx, msg.process.as_ref())?;
        ctx.sandbox
            .signal_process(&id, signal)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        if signal.number() == libc::SIGKILL {
            // SIGKILL cannot be caught: answer once the process is gone, so the SDK's
            // kill() followed by list() (or a second kill(), False) sees it gone.
            for _ in 0..1000 {
                match ctx.sandbox.process(&id) {
                    Ok(p) if p.state == ProcessState::Running => {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    _ => break,
                }
            }
        }
        Ok(SendSignalResponse {})
    })
    .await
}

async fn close_stdin(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: CloseStdinRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let id = envd.find(&ctx, msg.process.as_ref())?;
        ctx.sandbox
            .close_stdin(&id)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        Ok(CloseStdinResponse {})
    })
    .await
}

async fn update(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: UpdateRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let id = envd.find(&ctx, msg.process.as_ref())?;
        if let Some(size) = msg.pty.and_then(|p| p.size) {
            let size = pty_size(&size)?;
            ctx.sandbox
                .resize_pty(&id, size.cols, size.rows)
                .map_err(|e| rt_error(&ctx.id, e))?;
        }
        Ok(UpdateResponse {})
    })
    .await
}
