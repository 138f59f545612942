//! Code contexts: create, list, delete, and runs (buffered JSON, or streamed as SSE).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::routes::exec::detached;
use crate::streams::json_event;
use crate::wire::{each, ContextInfo, CreateContext, Execution, RunCode};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use futures_util::StreamExt;
use lockbox_runtime::CodeEvent;
use serde_json::json;

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/contexts",
    operation_id = "create_context",
    summary = "Create a code context: a persistent python, bash or node interpreter (started on its first run)",
    description = "400 INVALID_REQUEST naming `language` for another language; 409 ALREADY_EXISTS; LIMIT_REACHED beyond 16",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::CreateContext>,
    responses((status = 201, description = "created", body = crate::wire::ContextInfo))
)]
pub async fn create(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateContext>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok((
        StatusCode::CREATED,
        Json(ContextInfo::from(
            sandbox.create_context(body.into_options()?).await?,
        )),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/contexts",
    operation_id = "list_contexts",
    summary = "List code contexts",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the contexts", body = crate::wire::ContextList))
)]
pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let contexts = each::<_, ContextInfo>(sandbox.list_contexts().await);
    Ok(Json(crate::wire::ContextList { contexts }))
}

#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/contexts/{cid}",
    operation_id = "delete_context",
    summary = "Delete a code context, killing its interpreter (404 CONTEXT_NOT_FOUND)",
    params(crate::openapi::ContextPath),
    responses((status = 204, description = "done"))
)]
pub async fn delete(
    State(app): State<AppState>,
    ApiPath((id, cid)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.delete_context(&cid).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/contexts/{cid}/run",
    operation_id = "run_code",
    summary = "Run code in a context: stdout/stderr, rich results (MIME bundles), the error",
    description = "A timeout interrupts (SIGINT: error KeyboardInterrupt, state kept), then after 2 s kills the interpreter (error Timeout, state_lost); a crash is error InterpreterDied. 404 CONTEXT_NOT_FOUND",
    params(crate::openapi::ContextPath),
    request_body = crate::wire::RunCode,
    responses((status = 200, description = "the execution", body = crate::wire::Execution))
)]
pub async fn run(
    State(app): State<AppState>,
    ApiPath((id, cid)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<RunCode>,
) -> Result<impl IntoResponse, ApiError> {
    let request = body.into_request(cid)?;
    let sandbox = app.runtime.sandbox(&id)?;
    let exec = detached(async move { sandbox.run_code(request).await }).await?;
    Ok(Json(Execution::from(exec)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/contexts/{cid}/run/stream",
    operation_id = "run_code_stream",
    summary = "Run code in a context, streamed as server-sent events",
    description = "Events: stdout, stderr ({text}), result (a MIME bundle), error ({name, value, traceback}), then end (the whole Execution)",
    params(crate::openapi::ContextPath),
    request_body = crate::wire::RunCode,
    responses((status = 200, description = "events", content((crate::openapi::CodeEvent = "text/event-stream"))))
)]
pub async fn stream(
    State(app): State<AppState>,
    ApiPath((id, cid)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<RunCode>,
) -> Result<impl IntoResponse, ApiError> {
    let request = body.into_request(cid)?;
    let slot = app.streams.open()?;
    let sandbox = app.runtime.sandbox(&id)?;
    let events = sandbox.run_code_stream(request).await?.map(|event| {
        let name = match &event {
            CodeEvent::Stdout { .. } => "stdout",
            CodeEvent::Stderr { .. } => "stderr",
            CodeEvent::Result(_) => "result",
            CodeEvent::Error(_) => "error",
            CodeEvent::End(_) => "end",
        };
        let data = match event {
            CodeEvent::Stdout { text } | CodeEvent::Stderr { text } => json!({ "text": text }),
            CodeEvent::Result(d) => json!(d),
            CodeEvent::Error(e) => json!(e),
            CodeEvent::End(exec) => json!(Execution::from(*exec)),
        };
        json_event(name, &data)
    });
    Ok(app.streams.sse(slot, events))
}
