//! Sandboxes and their sessions: create, list, show, delete.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{each, CreateSandbox, CreateSession, ListSandboxes, SandboxInfo, SessionInfo};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

pub async fn create(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<CreateSandbox>,
) -> Result<impl IntoResponse, ApiError> {
    let info = app.runtime.create_sandbox(body.into_spec()?).await?;
    Ok((StatusCode::CREATED, Json(SandboxInfo::from(info))))
}

pub async fn list(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<ListSandboxes>,
) -> impl IntoResponse {
    let mut sandboxes = app.runtime.list_sandboxes();
    sandboxes.retain(|s| query.state.is_none_or(|state| s.state == state.into()));
    Json(json!({ "sandboxes": each::<_, SandboxInfo>(sandboxes) }))
}

pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SandboxInfo::from(app.runtime.sandbox_info(&id)?)))
}

pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SandboxInfo::from(
        app.runtime.delete_sandbox(&id).await?,
    )))
}

pub async fn create_session(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateSession>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let info = sandbox.create_session(body.into_options()).await?;
    Ok((StatusCode::CREATED, Json(SessionInfo::from(info))))
}

pub async fn list_sessions(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let sessions = each::<_, SessionInfo>(sandbox.list_sessions().await);
    Ok(Json(json!({ "sessions": sessions })))
}

pub async fn delete_session(
    State(app): State<AppState>,
    ApiPath((id, sid)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.delete_session(&sid).await?;
    Ok(StatusCode::NO_CONTENT)
}
