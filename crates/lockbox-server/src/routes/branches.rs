//! Kept branches of the server's state directory (`lockbox run --workdir --on-exit keep`, a
//! failed run): list, show, one path's diff as hunks, commit (all, a selection, or some hunks
//! of files; the rest kept or dropped), abort.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{
    each, BranchCommit, BranchDetail, ChangeList, CommitSummary, DiffQuery, FileDiffReply,
    KeptBranch,
};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

pub async fn list(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let branches = each::<_, KeptBranch>(app.runtime.branches().await?);
    Ok(Json(json!({ "branches": branches })))
}

pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let detail = app.runtime.branch(id).await?;
    Ok(Json(BranchDetail {
        branch: KeptBranch::from(detail.branch),
        change_list: ChangeList(detail.change_list),
    }))
}

pub async fn diff(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<DiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let path = query.path()?;
    let diff = app.runtime.branch_diff(id, path.clone()).await?;
    Ok(Json(FileDiffReply { path, diff }))
}

pub async fn commit(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<BranchCommit>,
) -> Result<impl IntoResponse, ApiError> {
    let (sel, rest) = body.into_parts();
    Ok(Json(CommitSummary::from(
        app.runtime.branch_commit(id, sel, rest).await?,
    )))
}

pub async fn abort(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    app.runtime.branch_abort(id).await?;
    Ok(Json(json!({ "aborted": true })))
}
