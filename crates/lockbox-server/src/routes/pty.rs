//! WebSocket attachment to a process: for a PTY process the terminal (scrollback replayed
//! on attach, many viewers, resize); for a pipe process interactive stdin and the merged
//! output log from its oldest retained byte.
//!
//! Frames: binary = bytes both ways; a text frame that is a JSON control message —
//! `{"resize": {"cols": C, "rows": R}}` or `{"close_stdin": true}` — is obeyed, any other
//! text frame is input. When the process exits the server sends `{"exited": <process>}`
//! as a text frame and closes.

use crate::error::ApiError;
use crate::extract::ApiPath;
use crate::streams::StreamSlot;
use crate::wire::{ProcessInfo, Size};
use crate::AppState;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{SinkExt, StreamExt};
use lockbox_runtime::{ProcessState, Sandbox};
use std::time::Duration;

/// How often an attachment checks whether its process exited.
const EXIT_POLL: Duration = Duration::from_millis(200);
/// How long output may keep arriving after the exit was seen.
const DRAIN: Duration = Duration::from_millis(100);
/// Largest message a client may send (keystrokes, stdin): the WebSocket library buffers a
/// whole message before handing it over, 64 MiB by default.
pub const MAX_MESSAGE: usize = 1 << 20;
/// Largest frame the server sends: the scrollback goes in pieces of this size rather than
/// as one message as large as the log.
const FRAME: usize = 64 * 1024;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

/// Where input frames go.
enum Input {
    Pty(mpsc::Sender<Bytes>),
    Stdin,
}

/// A control message in a text frame.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    #[serde(default)]
    resize: Option<Size>,
    #[serde(default)]
    close_stdin: bool,
}

/// `GET .../ws`: the same WebSocket as [`attach`] (the name for interactive stdin of pipe
/// processes).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}/ws",
    operation_id = "attach_ws",
    summary = "The same WebSocket as /pty (the name for interactive stdin of pipe processes)",
    params(crate::openapi::ProcessPath),
    responses((status = 101, description = "switching to WebSocket"))
)]
pub async fn attach_ws(
    state: State<AppState>,
    path: ApiPath<(String, String)>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    attach(state, path, upgrade).await
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}/pty",
    operation_id = "attach_pty",
    summary = "WebSocket to a PTY process (binary frames both ways, {\"resize\":{cols,rows}} text frames, scrollback on attach); for a pipe process stdin and merged output",
    params(crate::openapi::ProcessPath),
    responses((status = 101, description = "switching to WebSocket"))
)]
pub async fn attach(
    State(app): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, String)>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let info = sandbox.process(&pid)?;
    let upgrade = upgrade
        .map_err(|e| {
            ApiError::new(
                lockbox_policy::ErrorCode::InvalidRequest,
                format!("this route is a WebSocket: {}", e.body_text()),
            )
        })?
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE);
    let slot = app.streams.open()?;
    let (first, output, input): (Bytes, BoxStream<'static, Bytes>, Input) = if info.pty {
        let attachment = sandbox.attach_pty(&pid)?;
        (
            attachment.scrollback,
            attachment.output.boxed(),
            Input::Pty(attachment.input),
        )
    } else {
        let logs = sandbox.follow_logs(&pid, 0)?;
        let bytes = logs.flat_map(|chunk| {
            futures_util::stream::iter(chunk.segments.into_iter().map(|s| s.data))
        });
        (Bytes::new(), bytes.boxed(), Input::Stdin)
    };
    Ok(upgrade.on_upgrade(move |socket| async move {
        let link = Link {
            sandbox,
            pid,
            input,
        };
        link.run(socket, first, output, slot).await;
    }))
}

struct Link {
    sandbox: Sandbox,
    pid: String,
    input: Input,
}

impl Link {
    async fn run(
        self,
        socket: WebSocket,
        first: Bytes,
        mut output: BoxStream<'static, Bytes>,
        slot: StreamSlot,
    ) {
        let (mut tx, mut rx) = socket.split();
        for at in (0..first.len()).step_by(FRAME) {
            let piece = first.slice(at..(at + FRAME).min(first.len()));
            if tx.send(Message::Binary(piece)).await.is_err() {
                return;
            }
        }
        // A PTY's output stream does not end when the process exits (viewers of a log can
        // attach later), so its exit is polled; a pipe process's log stream ends by itself
        // after the last byte.
        let poll_exit = matches!(self.input, Input::Pty(_));
        let mut tick = tokio::time::interval(EXIT_POLL);
        let reason = loop {
            tokio::select! {
                _ = tick.tick(), if poll_exit => {
                    if self.exited().await {
                        // Output written just before the exit may still be on its way.
                        while let Ok(Some(bytes)) = tokio::time::timeout(DRAIN, output.next()).await {
                            if tx.send(Message::Binary(bytes)).await.is_err() {
                                return;
                            }
                        }
                        break "process exited";
                    }
                }
                out = output.next() => match out {
                    Some(bytes) => {
                        if tx.send(Message::Binary(bytes)).await.is_err() {
                            return;
                        }
                    }
                    None => break "process exited",
                },
                msg = rx.next() => match msg {
                    Some(Ok(Message::Binary(bytes))) => {
                        if let Err(e) = self.input(bytes).await {
                            let _ = tx.send(error_frame(&e)).await;
                        }
                    }
                    Some(Ok(Message::Text(text))) => {
                        if let Err(e) = self.text(text.as_str()).await {
                            let _ = tx.send(error_frame(&e)).await;
                        }
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                },
                _ = slot.shutdown() => break "server shutting down",
            }
        };
        if let Ok(info) = self.sandbox.process(&self.pid) {
            let frame = json!({ "exited": ProcessInfo::from(info) }).to_string();
            let _ = tx.send(Message::Text(frame.into())).await;
        }
        let close = CloseFrame {
            code: axum::extract::ws::close_code::NORMAL,
            reason: reason.into(),
        };
        let _ = tx.send(Message::Close(Some(close))).await;
    }

    async fn exited(&self) -> bool {
        match self.sandbox.process(&self.pid) {
            Ok(info) => info.state == ProcessState::Exited,
            Err(_) => true,
        }
    }

    async fn input(&self, bytes: Bytes) -> Result<(), ApiError> {
        match &self.input {
            Input::Pty(sender) => sender.send(bytes).await.map_err(|_| {
                ApiError::new(
                    lockbox_policy::ErrorCode::ProcessNotRunning,
                    format!("process {}: the terminal is closed", self.pid),
                )
            }),
            Input::Stdin => Ok(self.sandbox.write_stdin(&self.pid, bytes).await?),
        }
    }

    async fn text(&self, text: &str) -> Result<(), ApiError> {
        let control = text
            .trim_start()
            .starts_with('{')
            .then(|| serde_json::from_str::<Control>(text).ok())
            .flatten();
        let Some(control) = control else {
            return self.input(Bytes::copy_from_slice(text.as_bytes())).await;
        };
        if let Some(size) = control.resize {
            let size = size.check("resize")?;
            self.sandbox.resize_pty(&self.pid, size.cols, size.rows)?;
        }
        if control.close_stdin {
            self.sandbox.close_stdin(&self.pid).await?;
        }
        Ok(())
    }
}

/// An error answered inside the socket: `{"error": {code, message, details}}`.
fn error_frame(e: &ApiError) -> Message {
    let body = json!({ "error": { "code": e.code, "message": e.message, "details": e.details } });
    Message::Text(body.to_string().into())
}
