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

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/audit",
    operation_id = "audit",
    summary = "The network audit log of a --net-allow/--net-deny sandbox",
    description = "One NetEvent per connect or send towards the host's network, per DNS query lockbox's resolver answered, and per name (SNI, Host) a relayed TLS or HTTP connection asked for. By default an SSE stream of `audit` events (the last 1,000 kept, then live ones; a stream that lags gets a `dropped` event with the count) until the client disconnects; with follow=false the kept events as JSON",
    params(crate::openapi::SandboxPath, crate::wire::AuditQuery),
    responses((status = 200, description = "events (SSE), or the kept ones (follow=false)", content((crate::openapi::AuditEvent = "text/event-stream"), (crate::wire::AuditLog = "application/json"))))
)]
pub async fn audit(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    if !query.follow {
        let events = sandbox.audit_log();
        return Ok(Json(crate::wire::AuditLog { events }).into_response());
    }
    let slot = app.streams.open()?;
    let events = sandbox.audit().map(|e| json_event("audit", &json!(e)));
    Ok(app.streams.sse(slot, events).into_response())
}
