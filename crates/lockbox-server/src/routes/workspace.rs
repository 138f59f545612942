//! The sandbox's copy-on-write branch: what it changes, one path's diff as hunks, commit (all,
//! a selection, or some hunks of files), abort.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{Commit, CommitSummary, DiffQuery, FileDiffReply};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

pub async fn changes(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    #[derive(serde::Serialize)]
    struct Changes {
        changes: crate::wire::ChangeList,
    }
    Ok(Json(Changes {
        changes: crate::wire::ChangeList(sandbox.changes().await?),
    }))
}

pub async fn diff(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<DiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let path = query.path()?;
    let sandbox = app.runtime.sandbox(&id)?;
    let diff = sandbox.diff(path.clone()).await?;
    Ok(Json(FileDiffReply { path, diff }))
}

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

pub async fn abort(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.abort().await?;
    Ok(Json(json!({ "aborted": true })))
}
