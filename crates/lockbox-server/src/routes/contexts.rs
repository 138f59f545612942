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

pub async fn create(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateContext>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok((
        StatusCode::CREATED,
        Json(ContextInfo::from(
            sandbox.create_context(body.into_options()).await?,
        )),
    ))
}

pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let contexts = each::<_, ContextInfo>(sandbox.list_contexts().await);
    Ok(Json(json!({ "contexts": contexts })))
}

pub async fn delete(
    State(app): State<AppState>,
    ApiPath((id, cid)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.delete_context(&cid).await?;
    Ok(StatusCode::NO_CONTENT)
}

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
