//! Kept branches of the server's state directory (`lockbox run --workdir --on-exit keep`, a
//! failed run): list, show, one path's diff as hunks, commit (all, a selection, or some hunks
//! of files; the rest kept or dropped), abort.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{
    each, BranchCommit, BranchDetail, CommitSummary, DiffQuery, FileDiffReply, KeptBranch,
    ReviewList,
};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;

#[utoipa::path(
    get,
    path = "/v1/branches",
    operation_id = "list_branches",
    summary = "Kept branches of the server's state directory",
    responses((status = 200, description = "the branches", body = crate::wire::BranchList))
)]
pub async fn list(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let branches = each::<_, KeptBranch>(app.runtime.branches().await?);
    Ok(Json(crate::wire::BranchList { branches }))
}

#[utoipa::path(
    get,
    path = "/v1/branches/{id}",
    operation_id = "show_branch",
    summary = "A kept branch and its changes",
    params(crate::openapi::BranchPath),
    responses((status = 200, description = "the branch", body = crate::wire::BranchDetail))
)]
pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let detail = app.runtime.branch(id).await?;
    let change_list = ReviewList(detail.change_list);
    Ok(Json(BranchDetail {
        branch: KeptBranch::from(detail.branch),
        review_token: change_list.token(),
        change_list,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/branches/{id}/diff",
    operation_id = "diff_branch",
    summary = "One path's diff between the workdir and the branch, as numbered hunks",
    params(crate::openapi::BranchPath, crate::wire::DiffQuery),
    responses((status = 200, description = "the hunks, or a summary of both sides", body = crate::wire::FileDiff))
)]
pub async fn diff(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<DiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let path = query.path()?;
    let diff = app.runtime.branch_diff(id, path.clone()).await?;
    Ok(Json(FileDiffReply::new(path, diff)))
}

#[utoipa::path(
    post,
    path = "/v1/branches/{id}/commit",
    operation_id = "commit_branch",
    summary = "Commit a kept branch (all, only/exclude paths, some hunks of files); the rest is kept or dropped",
    params(crate::openapi::BranchPath),
    request_body = Option<crate::wire::BranchCommit>,
    responses((status = 200, description = "what was applied", body = crate::wire::CommitSummary))
)]
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

#[utoipa::path(
    post,
    path = "/v1/branches/{id}/abort",
    operation_id = "abort_branch",
    summary = "Remove a kept branch",
    params(crate::openapi::BranchPath),
    responses((status = 200, description = "done", body = crate::wire::AbortResult))
)]
pub async fn abort(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    app.runtime.branch_abort(id).await?;
    Ok(Json(crate::wire::AbortResult { aborted: true }))
}
