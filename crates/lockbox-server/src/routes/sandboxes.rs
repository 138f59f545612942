//! Sandboxes and their sessions: create, list, show, delete.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::scope::Principal;
use crate::wire::{each, CreateSandbox, CreateSession, ListSandboxes, SandboxInfo, SessionInfo};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;

#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    operation_id = "create_sandbox",
    summary = "Create a sandbox",
    request_body = Option<crate::wire::CreateSandbox>,
    responses((status = 201, description = "created", body = crate::wire::SandboxInfo))
)]
pub async fn create(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiJson(body): ApiJson<CreateSandbox>,
) -> Result<impl IntoResponse, ApiError> {
    let mut spec = body.into_spec()?;
    let _admitted = match who.scope() {
        Some(scope) => Some(scope.admit(&app.runtime, &mut spec)?),
        None => None,
    };
    let info = app.runtime.create_sandbox(spec).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_sandboxes([info.id.as_str()]);
    }
    Ok((StatusCode::CREATED, Json(SandboxInfo::from(info))))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    operation_id = "list_sandboxes",
    summary = "List sandboxes (running, and the last --keep-stopped stopped and lost ones)",
    params(crate::wire::ListSandboxes),
    responses((status = 200, description = "the sandboxes", body = crate::wire::SandboxList))
)]
pub async fn list(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiQuery(query): ApiQuery<ListSandboxes>,
) -> Result<impl IntoResponse, ApiError> {
    let mut sandboxes = app.runtime.list_sandboxes()?;
    sandboxes.retain(|s| query.state.is_none_or(|state| s.state == state.into()));
    sandboxes.retain(|s| who.sandbox(&s.id).is_ok());
    Ok(Json(crate::wire::SandboxList {
        sandboxes: each(sandboxes),
    }))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    operation_id = "show_sandbox",
    summary = "Show a sandbox",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the sandbox", body = crate::wire::SandboxInfo))
)]
pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SandboxInfo::from(app.runtime.sandbox_info(&id)?)))
}

#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    operation_id = "delete_sandbox",
    summary = "Delete a sandbox: kill everything in it, apply on_exit to its branch",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the stopped sandbox", body = crate::wire::SandboxInfo))
)]
pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SandboxInfo::from(
        app.runtime.delete_sandbox(&id).await?,
    )))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/sessions",
    operation_id = "create_session",
    summary = "Create a session (a persistent bash)",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::CreateSession>,
    responses((status = 201, description = "created", body = crate::wire::SessionInfo))
)]
pub async fn create_session(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CreateSession>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let info = sandbox.create_session(body.into_options()).await?;
    Ok((StatusCode::CREATED, Json(SessionInfo::from(info))))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/sessions",
    operation_id = "list_sessions",
    summary = "List sessions",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the sessions", body = crate::wire::SessionList))
)]
pub async fn list_sessions(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let sessions = each::<_, SessionInfo>(sandbox.list_sessions().await);
    Ok(Json(crate::wire::SessionList { sessions }))
}

#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/sessions/{sid}",
    operation_id = "delete_session",
    summary = "Delete a session (kills what runs in it)",
    params(crate::openapi::SessionPath),
    responses((status = 204, description = "done"))
)]
pub async fn delete_session(
    State(app): State<AppState>,
    ApiPath((id, sid)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.delete_session(&sid).await?;
    Ok(StatusCode::NO_CONTENT)
}
