//! Commands in a session: buffered (`exec`) and streamed as SSE (`exec/stream`).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::output::{data_fields, exec_reply, ms};
use crate::streams::json_event;
use crate::wire::Exec;
use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lockbox_runtime::ExecEvent;
use serde_json::{json, Value};

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    operation_id = "exec",
    summary = "Run a command in a session and wait for it",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::Exec,
    responses((status = 200, description = "how it ended, with all output", body = crate::wire::ExecHead))
)]
pub async fn exec(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Exec>,
) -> Result<Response, ApiError> {
    let request = body.into_request()?;
    let sandbox = app.runtime.sandbox(&id)?;
    let result = detached(async move { sandbox.exec(request).await }).await?;
    Ok(exec_reply(result))
}

/// Runs an exec in its own task: a client that disconnects must not cancel the command
/// half-way through the session protocol; it runs to its end (or timeout) and the session
/// stays usable. Shared by `/v1` and MCP.
pub(crate) async fn detached<T: Send + 'static>(
    exec: impl std::future::Future<Output = Result<T, lockbox_runtime::RuntimeError>> + Send + 'static,
) -> Result<T, ApiError> {
    let result = tokio::spawn(exec).await.map_err(|e| {
        ApiError::new(
            lockbox_policy::ErrorCode::Internal,
            format!("exec task: {e}"),
        )
    })?;
    Ok(result?)
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec/stream",
    operation_id = "exec_stream",
    summary = "Run a command in a session, streaming its output (SSE events start, stdout, stderr, exit, error)",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::Exec,
    responses((status = 200, description = "events; `stdout`/`stderr` carry {data} (UTF-8 text) or {data_b64}, `exit` {exit_code, timed_out, duration_ms, session}", content((crate::openapi::ExecEvent = "text/event-stream"))))
)]
pub async fn stream(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Exec>,
) -> Result<impl IntoResponse, ApiError> {
    let request = body.into_request()?;
    let slot = app.streams.open()?;
    let sandbox = app.runtime.sandbox(&id)?;
    let events = sandbox
        .exec_stream(request)
        .await?
        .map(|event| match event {
            ExecEvent::Start { session } => {
                json_event("start", &json!({ "session": session.as_str() }))
            }
            ExecEvent::Stdout { data } => json_event("stdout", &Value::Object(data_fields(&data))),
            ExecEvent::Stderr { data } => json_event("stderr", &Value::Object(data_fields(&data))),
            ExecEvent::Exit(exit) => json_event(
                "exit",
                &json!({
                    "exit_code": exit.exit_code,
                    "timed_out": exit.timed_out,
                    "duration_ms": ms(exit.duration),
                    "session": exit.session.as_str(),
                }),
            ),
            ExecEvent::Error { code, message } => json_event(
                "error",
                &json!({ "code": code, "message": message, "details": {} }),
            ),
        });
    Ok(app.streams.sse(slot, events))
}
