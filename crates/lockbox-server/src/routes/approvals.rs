//! A sandbox's approval questions (`net_ask`): `GET approvals` lists those waiting for a
//! verdict (`?after=ID&wait_ms=MS`: a long poll for newer ones), `POST approvals/{qid}`
//! answers one. Each new question is also an `asked` event of the audit stream.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{check_ms, ApprovalsQuery, Decide};
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use lockbox_runtime::Verdict;
use std::time::Duration;

/// The longest long poll.
const MAX_WAIT_MS: u64 = 60_000;
/// Who a denial through the API is logged as (`denied by the API`).
const BY: &str = "the API";

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/approvals",
    operation_id = "list_approvals",
    summary = "The approval questions of a net_ask sandbox waiting for a verdict, oldest first",
    description = "docs/security.md, Approvals. Each new question is also an `asked` event of the audit stream. With wait_ms, a long poll: waits up to that long for a question with an id above `after`",
    params(crate::openapi::SandboxPath, crate::wire::ApprovalsQuery),
    responses((status = 200, description = "the pending questions", body = crate::wire::Approvals))
)]
pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ApprovalsQuery>,
) -> Result<impl IntoResponse, ApiError> {
    check_ms("wait_ms", Some(query.wait_ms), MAX_WAIT_MS)?;
    let sandbox = app.runtime.sandbox(&id)?;
    let wait = Duration::from_millis(query.wait_ms);
    let approvals = sandbox.approvals(query.after, wait).await?;
    Ok(Json(crate::wire::Approvals { approvals }))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/approvals/{qid}",
    operation_id = "decide_approval",
    summary = "Answer an approval question: once (this call), sandbox (this destination or name from now on) or deny",
    description = "404 QUESTION_NOT_FOUND if it is not pending (never asked, timed out, its caller gone), 409 QUESTION_DECIDED if answered already, 400 naming the field for a bad body",
    params(crate::openapi::QuestionPath),
    request_body = crate::wire::Decide,
    responses((status = 200, description = "the verdict taken", body = crate::wire::Decided))
)]
pub async fn decide(
    State(app): State<AppState>,
    ApiPath((id, qid)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Decide>,
) -> Result<impl IntoResponse, ApiError> {
    let qid: u64 = qid
        .parse()
        .map_err(|_| ApiError::invalid("qid", format!("qid: {qid:?} is not a question id")))?;
    let verdict = Verdict::parse(&body.decision).ok_or_else(|| {
        ApiError::invalid(
            "decision",
            format!(
                "decision: {:?} is not one of once, sandbox, deny",
                body.decision
            ),
        )
    })?;
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.decide(qid, verdict, BY)?;
    Ok(Json(crate::wire::Decided {
        id: qid,
        decision: verdict.as_str(),
    }))
}
