//! Snapshots of sandboxes' files: take one of a running sandbox, list, show, diff, delete;
//! fork sandboxes from one, restore a sandbox to one.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{
    each, ChangeList, ForkRequest, ForkSandboxRequest, RestoreRequest, SandboxInfo,
    SnapshotDiffQuery, SnapshotInfo, SnapshotRequest,
};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

pub async fn take(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SnapshotRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let opts = lockbox_runtime::SnapshotOptions {
        name: body.name,
        include_tmp: body.include_tmp,
    };
    let sandbox = app.runtime.sandbox(&id)?;
    Ok((
        StatusCode::CREATED,
        Json(SnapshotInfo::from(sandbox.snapshot_with(opts).await?)),
    ))
}

pub async fn list(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let snapshots = each::<_, SnapshotInfo>(app.runtime.list_snapshots()?);
    Ok(Json(json!({ "snapshots": snapshots })))
}

pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SnapshotInfo::from(app.runtime.snapshot_info(&id)?)))
}

pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    app.runtime.delete_snapshot(&id)?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn fork(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let forks = each::<_, SandboxInfo>(app.runtime.fork_snapshot(&id, body.count).await?);
    Ok((StatusCode::CREATED, Json(json!({ "sandboxes": forks }))))
}

pub async fn diff(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<SnapshotDiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let changes = app.runtime.diff_snapshot(&id, query.into_target()?).await?;
    Ok(Json(json!({ "changes": ChangeList(changes) })))
}

pub async fn restore(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RestoreRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.restore(&body.snapshot).await?;
    Ok(Json(SandboxInfo::from(app.runtime.sandbox_info(&id)?)))
}

pub async fn fork_sandbox(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkSandboxRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let opts = lockbox_runtime::SnapshotOptions {
        name: body.name,
        include_tmp: body.include_tmp,
    };
    let (snapshot, forks) = app.runtime.fork_sandbox(&id, body.count, opts).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "snapshot": SnapshotInfo::from(snapshot),
            "sandboxes": each::<_, SandboxInfo>(forks),
        })),
    ))
}
