//! The sandbox's copy-on-write branch: what it changes, one path's diff as hunks, commit (all,
//! a selection, or some hunks of files), abort.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{Commit, CommitSummary, DiffQuery, FileDiffReply};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/changes",
    operation_id = "changes",
    summary = "What committing the sandbox's branch would do",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the change set", body = crate::wire::ReviewReply))
)]
pub async fn changes(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(crate::wire::ReviewReply::from(
        sandbox.review().await?,
    )))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/diff",
    operation_id = "diff",
    summary = "One path's diff between the workdir and the branch, as numbered hunks",
    params(crate::openapi::SandboxPath, crate::wire::DiffQuery),
    responses((status = 200, description = "the hunks, or a summary of both sides", body = crate::wire::FileDiff))
)]
pub async fn diff(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<DiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let path = query.path()?;
    let sandbox = app.runtime.sandbox(&id)?;
    let diff = sandbox.diff(path.clone()).await?;
    Ok(Json(FileDiffReply::new(path, diff)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/commit",
    operation_id = "commit",
    summary = "Commit the branch (all, only/exclude paths, some hunks of files) to the workdir",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::Commit>,
    responses((status = 200, description = "what was applied", body = crate::wire::CommitSummary))
)]
pub async fn commit(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Commit>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(CommitSummary::from(
        sandbox.commit(body.into_selection()).await?,
    )))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/abort",
    operation_id = "abort",
    summary = "Discard the branch's changes",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "done", body = crate::wire::AbortResult))
)]
pub async fn abort(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.abort().await?;
    Ok(Json(crate::wire::AbortResult { aborted: true }))
}
