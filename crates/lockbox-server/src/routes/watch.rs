//! File watching as SSE: `change`, `overflow` and `error` events until the client closes the
//! connection (which stops the watch in the sandbox).

use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::streams::json_event;
use crate::wire::WatchQuery;
use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lockbox_runtime::WatchEvent;
use serde_json::json;

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/watch",
    operation_id = "watch",
    summary = "Watch a file or directory (SSE) until the client disconnects",
    description = "Events: `change` {kind: created|modified|deleted|moved, path, is_dir, from (moved)}, `overflow` {dropped (null: unknown)} and `error` {message}",
    params(crate::openapi::SandboxPath, crate::wire::WatchQuery),
    responses((status = 200, description = "events (SSE)", content((crate::openapi::WatchEvent = "text/event-stream"))))
)]
pub async fn watch(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<WatchQuery>,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let slot = app.streams.open()?;
    let events = sandbox
        .watch(&query.path, query.recursive)
        .await?
        .map(|event| match event {
            WatchEvent::Change(c) => json_event("change", &json!(c)),
            WatchEvent::Overflow { dropped } => {
                json_event("overflow", &json!({ "dropped": dropped }))
            }
            WatchEvent::Error { message } => json_event("error", &json!({ "message": message })),
        });
    Ok(app.streams.sse(slot, events).into_response())
}
