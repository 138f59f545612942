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
use serde_json::json;
use std::time::Duration;

/// The longest long poll.
const MAX_WAIT_MS: u64 = 60_000;
/// Who a denial through the API is logged as (`denied by the API`).
const BY: &str = "the API";

pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ApprovalsQuery>,
) -> Result<impl IntoResponse, ApiError> {
    check_ms("wait_ms", Some(query.wait_ms), MAX_WAIT_MS)?;
    let sandbox = app.runtime.sandbox(&id)?;
    let wait = Duration::from_millis(query.wait_ms);
    Ok(Json(
        json!({ "approvals": sandbox.approvals(query.after, wait).await? }),
    ))
}

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
    Ok(Json(json!({ "id": qid, "decision": verdict.as_str() })))
}
