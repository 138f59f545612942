//! Snapshots of sandboxes' files: take one of a running sandbox, list, show, diff, delete;
//! fork sandboxes from one, restore a sandbox to one.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::scope::Principal;
use crate::wire::{
    each, ForkRequest, ForkSandboxRequest, RestoreRequest, SandboxInfo, SnapshotDiffQuery,
    SnapshotInfo, SnapshotRequest,
};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshots",
    operation_id = "take_snapshot",
    summary = "Snapshot the sandbox's files (its branch)",
    description = "Its processes are paused while the branch is copied, then go on. Processes' memory is not captured. 409 NO_WORKDIR without a workdir",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::SnapshotRequest>,
    responses((status = 201, description = "the snapshot", body = crate::wire::SnapshotInfo))
)]
pub async fn take(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SnapshotRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let opts = lockbox_runtime::SnapshotOptions {
        name: body.name,
        include_tmp: body.include_tmp,
    };
    let sandbox = app.runtime.sandbox(&id)?;
    let snapshot = sandbox.snapshot_with(opts).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_snapshot(&snapshot.id);
    }
    Ok((StatusCode::CREATED, Json(SnapshotInfo::from(snapshot))))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots",
    operation_id = "list_snapshots",
    summary = "List snapshots, oldest first",
    responses((status = 200, description = "the snapshots", body = crate::wire::SnapshotList))
)]
pub async fn list(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<impl IntoResponse, ApiError> {
    let mut snapshots = app.runtime.list_snapshots()?;
    snapshots.retain(|s| who.snapshot(&s.id).is_ok());
    let snapshots = each::<_, SnapshotInfo>(snapshots);
    Ok(Json(crate::wire::SnapshotList { snapshots }))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots/{id}",
    operation_id = "show_snapshot",
    summary = "One snapshot (404 SNAPSHOT_NOT_FOUND)",
    params(crate::openapi::SnapshotPath),
    responses((status = 200, description = "the snapshot", body = crate::wire::SnapshotInfo))
)]
pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SnapshotInfo::from(app.runtime.snapshot_info(&id)?)))
}

#[utoipa::path(
    delete,
    path = "/v1/snapshots/{id}",
    operation_id = "delete_snapshot",
    summary = "Delete a snapshot (409 SNAPSHOT_IN_USE while forks or other snapshots use it)",
    params(crate::openapi::SnapshotPath),
    responses((status = 204, description = "deleted"))
)]
pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    app.runtime.delete_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/v1/snapshots/{id}/fork",
    operation_id = "fork_snapshot",
    summary = "Create `count` sandboxes from the snapshot (forks)",
    description = "With the policy of the sandbox it was taken of: each sees exactly the snapshot's files and writes to its own layer. All or none; LIMIT_REACHED past max_sandboxes",
    params(crate::openapi::SnapshotPath),
    request_body = Option<crate::wire::ForkRequest>,
    responses((status = 201, description = "the forks", body = crate::wire::SandboxList))
)]
pub async fn fork(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let _admitted = match who.scope() {
        Some(scope) => Some(scope.admit_fork(&app.runtime, &id, body.count)?),
        None => None,
    };
    let forks = app.runtime.fork_snapshot(&id, body.count).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_sandboxes(forks.iter().map(|f| f.id.as_str()));
    }
    let forks = each::<_, SandboxInfo>(forks);
    Ok((
        StatusCode::CREATED,
        Json(crate::wire::SandboxList { sandboxes: forks }),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots/{id}/diff",
    operation_id = "diff_snapshot",
    summary = "What changed from the snapshot to another snapshot or to a running sandbox of the same workdir",
    description = "None given: the snapshot's own changes against the workdir as it is now",
    params(crate::openapi::SnapshotPath, crate::wire::SnapshotDiffQuery),
    responses((status = 200, description = "the changes, sorted by path", body = crate::wire::ReviewReply))
)]
pub async fn diff(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<SnapshotDiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let target = query.into_target()?;
    match &target {
        lockbox_runtime::DiffTarget::Snapshot(s) => who.snapshot(s)?,
        lockbox_runtime::DiffTarget::Sandbox(s) => who.sandbox(s)?,
        lockbox_runtime::DiffTarget::Workdir => {}
    }
    let changes = app.runtime.diff_snapshot(&id, target).await?;
    Ok(Json(crate::wire::ReviewReply::from(changes)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/restore",
    operation_id = "restore_sandbox",
    summary = "Roll the sandbox back to a snapshot of its workdir",
    description = "Its processes, sessions and contexts are stopped, its branch discarded, and it starts again (same id and policy) seeing exactly the snapshot's files. Processes' memory is not restored. 400 INVALID_REQUEST for a snapshot of another workdir",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::RestoreRequest,
    responses((status = 200, description = "the sandbox, running again", body = crate::wire::SandboxInfo))
)]
pub async fn restore(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RestoreRequest>,
) -> Result<impl IntoResponse, ApiError> {
    who.snapshot(&body.snapshot)?;
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.restore(&body.snapshot).await?;
    Ok(Json(SandboxInfo::from(app.runtime.sandbox_info(&id)?)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fork",
    operation_id = "fork_sandbox",
    summary = "Snapshot the sandbox, then create `count` sandboxes from that snapshot",
    description = "As POST /v1/snapshots/{id}/fork: the snapshot stays, delete it once its forks are gone",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::ForkSandboxRequest>,
    responses((status = 201, description = "the snapshot and the forks", body = crate::wire::ForkReply))
)]
pub async fn fork_sandbox(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkSandboxRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let opts = lockbox_runtime::SnapshotOptions {
        name: body.name,
        include_tmp: body.include_tmp,
    };
    // The sandbox is the agent's (`auth`), so its policy was admitted under this ceiling.
    let _admitted = match who.scope() {
        Some(scope) => Some(scope.reserve(&app.runtime, body.count)?),
        None => None,
    };
    let (snapshot, forks) = app.runtime.fork_sandbox(&id, body.count, opts).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_snapshot(&snapshot.id);
        scope.adopt_sandboxes(forks.iter().map(|f| f.id.as_str()));
    }
    Ok((
        StatusCode::CREATED,
        Json(crate::wire::ForkReply {
            sandboxes: each(forks),
            snapshot: SnapshotInfo::from(snapshot),
        }),
    ))
}
