//! Background processes: start, list, status, signal, kill, stdin, and their output log
//! (a JSON chunk, or SSE with `id:` = cursor so `Last-Event-ID` resumes).

use crate::error::ApiError;
use crate::extract::{parse_json, ApiJson, ApiPath, ApiQuery};
use crate::openapi::MAX_GRACE_MS;
use crate::streams::json_event;
use crate::wire::{
    check_ms, decode_b64, each, KillQuery, LogsQuery, ProcessInfo, Signal, StartProcess, Stdin,
    StdinQuery,
};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use lockbox_runtime::{LogChunk, LogSegment};
use serde_json::{json, Value};
use std::time::Duration;

/// Default SIGTERM → SIGKILL delay of `DELETE .../processes/{pid}`.
const DEFAULT_GRACE: Duration = Duration::from_secs(2);

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes",
    operation_id = "start_process",
    summary = "Start a background process",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::StartProcess,
    responses((status = 201, description = "started", body = crate::wire::ProcessInfo))
)]
pub async fn start(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<StartProcess>,
) -> Result<impl IntoResponse, ApiError> {
    let spec = body.into_spec()?;
    let sandbox = app.runtime.sandbox(&id)?;
    Ok((
        StatusCode::CREATED,
        Json(ProcessInfo::from(sandbox.start_process(spec).await?)),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes",
    operation_id = "list_processes",
    summary = "List processes",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the processes", body = crate::wire::ProcessList))
)]
pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let processes = each::<_, ProcessInfo>(sandbox.list_processes());
    Ok(Json(crate::wire::ProcessList { processes }))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}",
    operation_id = "show_process",
    summary = "Show a process",
    params(crate::openapi::ProcessPath),
    responses((status = 200, description = "the process", body = crate::wire::ProcessInfo))
)]
pub async fn show(
    State(app): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(ProcessInfo::from(sandbox.process(&pid)?)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/signal",
    operation_id = "signal_process",
    summary = "Send a signal to the whole process tree",
    params(crate::openapi::ProcessPath),
    request_body = crate::wire::Signal,
    responses((status = 200, description = "the process", body = crate::wire::ProcessInfo))
)]
pub async fn signal(
    State(app): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Signal>,
) -> Result<impl IntoResponse, ApiError> {
    let signal = body.signal.signal()?;
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.signal_process(&pid, signal).await?;
    Ok(Json(ProcessInfo::from(sandbox.process(&pid)?)))
}

#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/processes/{pid}",
    operation_id = "kill_process",
    summary = "Kill a process tree (TERM, grace, KILL) and wait for it",
    params(crate::openapi::ProcessPath, crate::wire::KillQuery),
    responses((status = 200, description = "the exited process", body = crate::wire::ProcessInfo))
)]
pub async fn kill(
    State(app): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<KillQuery>,
) -> Result<impl IntoResponse, ApiError> {
    check_ms("grace_ms", query.grace_ms, MAX_GRACE_MS)?;
    let grace = query.grace_ms.map_or(DEFAULT_GRACE, Duration::from_millis);
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(ProcessInfo::from(
        sandbox.kill_process(&pid, grace).await?,
    )))
}

/// Writes the body to the process's stdin: raw bytes (`?close=true` closes afterwards),
/// or with `Content-Type: application/json` `{data | data_b64, close}`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/stdin",
    operation_id = "process_stdin",
    summary = "Write to the process's stdin (raw body, or JSON {data|data_b64, close})",
    params(crate::openapi::ProcessPath, crate::wire::StdinQuery),
    request_body(content((Option<crate::openapi::Binary> = "application/octet-stream"), (Option<crate::wire::Stdin> = "application/json"))),
    responses((status = 200, description = "written", body = crate::wire::StdinResult))
)]
pub async fn stdin(
    State(app): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<StdinQuery>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let is_json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    let body = Bytes::from_request(req, &())
        .await
        .map_err(crate::extract::body_rejection)?;
    let (data, close) = if is_json {
        let stdin: Stdin = parse_json(&body)?;
        let data = match (stdin.data, stdin.data_b64) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "data",
                    "give either data or data_b64, not both",
                ))
            }
            (Some(text), None) => Bytes::from(text),
            (None, Some(b64)) => decode_b64("data_b64", &b64)?.into(),
            (None, None) => Bytes::new(),
        };
        (data, stdin.close || query.close)
    } else {
        (body, query.close)
    };
    let sandbox = app.runtime.sandbox(&id)?;
    if !data.is_empty() {
        sandbox.write_stdin(&pid, data.clone()).await?;
    }
    if close {
        sandbox.close_stdin(&pid).await?;
    }
    Ok(Json(crate::wire::StdinResult {
        closed: close,
        written: data.len(),
    }))
}

/// One segment as an SSE event's data ([`crate::wire::LogSegment`]).
fn segment_json(segment: &LogSegment) -> Value {
    json!(crate::wire::LogSegment::from(segment))
}

/// SSE events of one chunk: `truncated` when bytes asked for were evicted, then one event
/// per segment named after its stream with `id:` = the cursor after it, then `eof`.
fn chunk_events(chunk: LogChunk) -> Vec<Event> {
    let mut events = Vec::new();
    if chunk.truncated {
        let first = chunk.segments.first().map_or(chunk.next, |s| s.offset);
        events.push(json_event("truncated", &json!({ "resumed_at": first })));
    }
    for segment in &chunk.segments {
        let end = segment.offset + segment.data.len() as u64;
        let body = segment_json(segment);
        let name = body["stream"].as_str().unwrap_or("stdout").to_owned();
        events.push(json_event(&name, &body).id(end.to_string()));
    }
    if chunk.eof {
        events.push(json_event("eof", &json!({ "next": chunk.next })).id(chunk.next.to_string()));
    }
    events
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}/logs",
    operation_id = "process_logs",
    summary = "Read the output log from a cursor; with follow=true an SSE stream (id: = cursor, Last-Event-ID resumes)",
    params(crate::openapi::ProcessPath, crate::wire::LogsQuery, ("Last-Event-ID" = Option<String>, Header, description = "resume a followed stream after this cursor", pattern = "^[0-9]{1,19}$")),
    responses((status = 200, description = "a chunk (JSON), or events (SSE) when following", content((crate::wire::LogChunk = "application/json"), (crate::openapi::LogEvent = "text/event-stream"))))
)]
pub async fn logs(
    State(app): State<AppState>,
    ApiPath((id, pid)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<LogsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    if !query.follow {
        let max = query
            .max_bytes
            .unwrap_or(app.config.max_log_read)
            .clamp(1, app.config.max_log_read);
        let chunk = sandbox.read_logs(&pid, query.since.unwrap_or(0), max)?;
        return Ok(Json(crate::wire::LogChunk::from(&chunk)).into_response());
    }
    // A reconnecting EventSource sends the last `id:` it saw: resume right after it.
    let since = match headers
        .get("last-event-id")
        .map(|v| v.to_str().map(str::parse::<u64>))
    {
        Some(Ok(Ok(cursor))) => cursor,
        Some(_) => {
            return Err(ApiError::invalid(
                "Last-Event-ID",
                "Last-Event-ID: expected a cursor (a number) from an earlier event",
            ))
        }
        None => query.since.unwrap_or(0),
    };
    let slot = app.streams.open()?;
    let events = sandbox
        .follow_logs(&pid, since)?
        .flat_map(|chunk| futures_util::stream::iter(chunk_events(chunk)));
    Ok(app.streams.sse(slot, events).into_response())
}
