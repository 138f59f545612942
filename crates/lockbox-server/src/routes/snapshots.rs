//! Snapshots of sandboxes' files: take one of a running sandbox, list, show, delete.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::wire::SnapshotRequest;
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
    let name = body.name;
    let sandbox = app.runtime.sandbox(&id).await?;
    Ok((StatusCode::CREATED, Json(sandbox.snapshot(name).await?)))
}

pub async fn list(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(json!({ "snapshots": app.runtime.list_snapshots()? })))
}

pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(app.runtime.snapshot_info(&id)?))
}

pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    app.runtime.delete_snapshot(&id)?;
    Ok(StatusCode::NO_CONTENT)
}
