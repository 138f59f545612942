//! Commands in a session: buffered (`exec`) and streamed as SSE (`exec/stream`).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::streams::{data_fields, json_event};
use crate::wire::Exec;
use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use futures_util::StreamExt;
use lockbox_runtime::{ExecEvent, ExecResult};
use serde_json::{json, Value};

pub async fn exec(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Exec>,
) -> Result<impl IntoResponse, ApiError> {
    let request = body.into_request()?;
    let sandbox = app.runtime.sandbox(&id).await?;
    // Its own task: a client that disconnects must not cancel the command half-way through
    // the session protocol; it runs to its end (or timeout) and the session stays usable.
    let result = tokio::spawn(async move { sandbox.exec(request).await })
        .await
        .map_err(|e| ApiError::new("INTERNAL", format!("exec task: {e}")))??;
    Ok(Json(result_json(&result)))
}

/// `{exit_code, stdout_b64, stderr_b64, stdout?, stderr?, timed_out, duration_ms, session}`.
fn result_json(r: &ExecResult) -> Value {
    let mut body = exit_json(r);
    for (name, bytes) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        let fields = data_fields(bytes);
        body[format!("{name}_b64")] = fields["data_b64"].clone();
        if let Some(text) = fields.get("data") {
            body[name] = text.clone();
        }
    }
    body
}

fn exit_json(r: &ExecResult) -> Value {
    json!({
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "duration_ms": ms(r.duration),
        "session": r.session,
    })
}

/// Milliseconds with microsecond precision (a warm exec takes well under one).
fn ms(d: std::time::Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

pub async fn stream(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Exec>,
) -> Result<impl IntoResponse, ApiError> {
    let request = body.into_request()?;
    let slot = app.streams.open()?;
    let sandbox = app.runtime.sandbox(&id).await?;
    let events = sandbox
        .exec_stream(request)
        .await?
        .map(|event| match event {
            ExecEvent::Start { session } => json_event("start", &json!({ "session": session })),
            ExecEvent::Stdout { data } => json_event("stdout", &Value::Object(data_fields(&data))),
            ExecEvent::Stderr { data } => json_event("stderr", &Value::Object(data_fields(&data))),
            ExecEvent::Exit(exit) => json_event(
                "exit",
                &json!({
                    "exit_code": exit.exit_code,
                    "timed_out": exit.timed_out,
                    "duration_ms": ms(exit.duration),
                    "session": exit.session,
                }),
            ),
            ExecEvent::Error { code, message } => json_event(
                "error",
                &json!({ "code": code, "message": message, "details": {} }),
            ),
        });
    Ok(app.streams.sse(slot, events))
}
