//! Files in a sandbox's view: raw read (HTTP Range) and atomic streamed write, stat, list,
//! mkdir, move, remove. Paths are resolved by the runtime beneath the sandbox root.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::wire::{FileInfo, ListQuery, Mkdir, Move, PathQuery, PutQuery, Remove};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use lockbox_runtime::{ByteRange, WriteOptions};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio_util::io::{ReaderStream, StreamReader};

/// A single `bytes=` range as written: `a-b`, `a-` or `-n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RangeSpec {
    From { start: u64, last: Option<u64> },
    Suffix(u64),
}

/// Parses a `Range` header. `None`: no usable single byte range, so the whole file is
/// sent (RFC 9110 lets a server ignore a Range it does not support, e.g. several ranges).
fn parse_range(header: &str) -> Option<RangeSpec> {
    let spec = header.trim().strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return b.parse().ok().map(RangeSpec::Suffix);
    }
    let start = a.parse().ok()?;
    let last = if b.is_empty() {
        None
    } else {
        Some(b.parse().ok()?)
    };
    if last.is_some_and(|last| last < start) {
        return None;
    }
    Some(RangeSpec::From { start, last })
}

/// `[start, end)` of the range within a file of `size` bytes, or `None` when unsatisfiable.
fn resolve(spec: RangeSpec, size: u64) -> Option<(u64, u64)> {
    match spec {
        RangeSpec::From { start, .. } if start >= size => None,
        RangeSpec::From { start, last } => {
            Some((start, last.map_or(size, |l| l.saturating_add(1).min(size))))
        }
        RangeSpec::Suffix(0) => None,
        RangeSpec::Suffix(n) => Some((size.saturating_sub(n), size)),
    }
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    operation_id = "read_file",
    summary = "Read a file (Range: bytes=a-b gives 206, 416 when outside the file)",
    params(crate::openapi::SandboxPath, crate::wire::PathQuery, ("Range" = Option<String>, Header, description = "one byte range")),
    responses((status = 200, description = "the bytes", content((crate::openapi::Binary = "application/octet-stream"))), (status = 206, description = "the range", content((crate::openapi::Binary = "application/octet-stream"))))
)]
pub async fn get(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let spec = headers
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_range);
    let mut read = sandbox.read_file(&query.path, None).await?;
    if let Some(spec) = spec {
        // `read.size` is the file's size at open, or for a `/proc` or `/sys` file (whose
        // `stat` size is not its length) what it gave when read to its end.
        let Some((start, end)) = resolve(spec, read.size) else {
            return Ok(unsatisfiable(&query.path, read.size));
        };
        if read.read_whole {
            // Already in memory: skip to the range in the bytes read.
            tokio::io::copy(&mut (&mut read.body).take(start), &mut tokio::io::sink())
                .await
                .map_err(|e| {
                    ApiError::new(
                        lockbox_policy::ErrorCode::Internal,
                        format!("reading {}: {e}", query.path),
                    )
                })?;
            read.body = Box::pin(read.body.take(end - start));
            read.range = (start, end);
        } else {
            let range = ByteRange {
                start,
                end: Some(end),
            };
            read = sandbox.read_file(&query.path, Some(range)).await?;
        }
    }
    let (start, end) = read.range;
    let mut response = Response::new(Body::from_stream(ReaderStream::new(read.body)));
    let h = response.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(CONTENT_LENGTH, HeaderValue::from(end - start));
    if spec.is_some() {
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        let value = format!("bytes {start}-{}/{}", end.saturating_sub(1), read.size);
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(CONTENT_RANGE, value);
        }
    }
    Ok(response)
}

fn unsatisfiable(path: &str, size: u64) -> Response {
    let mut response = ApiError::new(
        lockbox_policy::ErrorCode::RangeNotSatisfiable,
        format!("{path}: the range is outside the file ({size} bytes)"),
    )
    .with_details(json!({ "path": path, "size": size }))
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
        response.headers_mut().insert(CONTENT_RANGE, value);
    }
    response
}

/// Streams the body into the file (no buffering, so no size cap from memory); the runtime
/// writes a temporary file and renames it, so readers see the old or the new file.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files",
    operation_id = "write_file",
    summary = "Write a file atomically from the raw body (parents created)",
    params(crate::openapi::SandboxPath, crate::wire::PutQuery),
    request_body(content((Option<crate::openapi::Binary> = "application/octet-stream"))),
    responses((status = 200, description = "the written file", body = crate::wire::FileInfo))
)]
pub async fn put(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PutQuery>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let mode = query.mode()?;
    let sandbox = app.runtime.sandbox(&id)?;
    // The runtime sees an I/O error; remember whether it was the body stalling, to answer
    // 408 rather than 500.
    let stalled = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&stalled);
    let stream = req.into_body().into_data_stream().map_err(move |e| {
        if crate::extract::body_stalled(&e) {
            seen.store(true, Ordering::Relaxed);
        }
        std::io::Error::other(e)
    });
    let options = WriteOptions {
        mode: mode.unwrap_or(WriteOptions::default().mode),
        create_parents: true,
        ..WriteOptions::default()
    };
    let written = sandbox
        .write_file(&query.path, Box::pin(StreamReader::new(stream)), options)
        .await;
    match written {
        Err(_) if stalled.load(Ordering::Relaxed) => Err(ApiError::body_stalled()),
        written => Ok(Json(FileInfo::from(written?))),
    }
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/fs/stat",
    operation_id = "stat_file",
    summary = "Stat a path (symlinks not followed)",
    params(crate::openapi::SandboxPath, crate::wire::PathQuery),
    responses((status = 200, description = "the entry", body = crate::wire::FileInfo))
)]
pub async fn stat(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<PathQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(FileInfo::from(sandbox.stat(&query.path).await?)))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/fs/list",
    operation_id = "list_files",
    summary = "List a directory",
    params(crate::openapi::SandboxPath, crate::wire::ListQuery),
    responses((status = 200, description = "entries", body = crate::openapi::FileList))
)]
pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    let entries = sandbox
        .list_stream(&query.path, query.recursive, query.hidden)
        .await?
        .map_ok(FileInfo::from);
    Ok(json_array_body("entries", entries))
}

/// `{"<name>": [...]}` written one entry at a time as the client reads, so a listing of a
/// large tree is never held whole (an error after the first byte cuts the body short,
/// which a client sees as invalid JSON).
fn json_array_body<T, E>(
    name: &'static str,
    entries: impl futures_util::Stream<Item = Result<T, E>> + Send + 'static,
) -> Response
where
    T: serde::Serialize,
    E: std::fmt::Display,
{
    let open = futures_util::stream::once(async move {
        Ok::<_, std::io::Error>(Bytes::from(format!("{{\"{name}\":[")))
    });
    let items = entries.enumerate().map(|(i, entry)| {
        let entry = entry.map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut line = if i == 0 { Vec::new() } else { vec![b','] };
        serde_json::to_writer(&mut line, &entry).map_err(std::io::Error::other)?;
        Ok(Bytes::from(line))
    });
    let close = futures_util::stream::once(async { Ok(Bytes::from_static(b"]}")) });
    let mut response = Response::new(Body::from_stream(open.chain(items).chain(close)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fs/mkdir",
    operation_id = "make_directory",
    summary = "Create a directory",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::Mkdir,
    responses((status = 200, description = "the directory", body = crate::wire::FileInfo))
)]
pub async fn mkdir(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Mkdir>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(FileInfo::from(
        sandbox.mkdir(&body.path, body.parents).await?,
    )))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fs/move",
    operation_id = "move_file",
    summary = "Move or rename",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::Move,
    responses((status = 200, description = "the destination", body = crate::wire::FileInfo))
)]
pub async fn rename(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Move>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(FileInfo::from(
        sandbox.rename(&body.from, &body.to, body.overwrite).await?,
    )))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fs/remove",
    operation_id = "remove_file",
    summary = "Remove a file or directory",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::Remove,
    responses((status = 204, description = "done"))
)]
pub async fn remove(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Remove>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.remove(&body.path, body.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_like_rfc_9110() {
        let r = |h: &str, size| parse_range(h).map(|s| resolve(s, size));
        assert_eq!(r("bytes=0-3", 10), Some(Some((0, 4))));
        assert_eq!(r("bytes=5-", 10), Some(Some((5, 10))));
        assert_eq!(r("bytes=-3", 10), Some(Some((7, 10))));
        assert_eq!(r("bytes=-30", 10), Some(Some((0, 10))));
        assert_eq!(r("bytes=8-100", 10), Some(Some((8, 10))));
        assert_eq!(
            r("bytes=10-", 10),
            Some(None),
            "start at the end is unsatisfiable"
        );
        assert_eq!(r("bytes=-0", 10), Some(None));
        assert_eq!(r("bytes=0-0", 0), Some(None));
        assert_eq!(r("bytes=3-1", 10), None, "invalid: ignored");
        assert_eq!(r("bytes=0-1,4-5", 10), None, "several ranges: whole file");
        assert_eq!(r("items=0-1", 10), None);
    }
}
