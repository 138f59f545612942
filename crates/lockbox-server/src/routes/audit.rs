//! A sandbox's network audit log: `GET audit` streams its events as SSE (`audit` events,
//! the kept ones first) until the client leaves; `?follow=false` returns the kept ones as
//! JSON `{"events": [...]}`.

use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::streams::json_event;
use crate::wire::AuditQuery;
use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::json;

pub async fn audit(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    if !query.follow {
        return Ok(Json(json!({ "events": sandbox.audit_log() })).into_response());
    }
    let slot = app.streams.open()?;
    let events = sandbox.audit().map(|e| json_event("audit", &json!(e)));
    Ok(app.streams.sse(slot, events).into_response())
}
