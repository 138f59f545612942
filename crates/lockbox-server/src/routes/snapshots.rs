//! Snapshots of sandboxes' files: take one of a running sandbox, list, show, diff, delete;
//! fork sandboxes from one, restore a sandbox to one.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::scope::Principal;
use crate::wire::{
    each, ForkRequest, ForkSandboxRequest, RestoreRequest, SandboxInfo, SnapshotDiffQuery,
    SnapshotInfo, SnapshotRequest,
};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use bytes::Bytes;
use futures_util::StreamExt;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshots",
    operation_id = "take_snapshot",
    summary = "Snapshot the sandbox's files (its branch)",
    description = "Its processes are paused while the branch is copied, then go on. Processes' memory is not captured. 409 NO_WORKDIR without a workdir",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::SnapshotRequest>,
    responses((status = 201, description = "the snapshot", body = crate::wire::SnapshotInfo))
)]
pub async fn take(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SnapshotRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let opts = lockbox_runtime::SnapshotOptions {
        name: body.name,
        include_tmp: body.include_tmp,
    };
    let sandbox = app.runtime.sandbox(&id)?;
    let snapshot = sandbox.snapshot_with(opts).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_snapshot(&snapshot.id);
    }
    Ok((StatusCode::CREATED, Json(SnapshotInfo::from(snapshot))))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots",
    operation_id = "list_snapshots",
    summary = "List snapshots, oldest first",
    responses((status = 200, description = "the snapshots", body = crate::wire::SnapshotList))
)]
pub async fn list(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Result<impl IntoResponse, ApiError> {
    let mut snapshots = app.runtime.list_snapshots()?;
    snapshots.retain(|s| who.snapshot(&s.id).is_ok());
    let snapshots = each::<_, SnapshotInfo>(snapshots);
    Ok(Json(crate::wire::SnapshotList { snapshots }))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots/{id}",
    operation_id = "show_snapshot",
    summary = "One snapshot (404 SNAPSHOT_NOT_FOUND)",
    params(crate::openapi::SnapshotPath),
    responses((status = 200, description = "the snapshot", body = crate::wire::SnapshotInfo))
)]
pub async fn show(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(SnapshotInfo::from(app.runtime.snapshot_info(&id)?)))
}

#[utoipa::path(
    delete,
    path = "/v1/snapshots/{id}",
    operation_id = "delete_snapshot",
    summary = "Delete a snapshot (409 SNAPSHOT_IN_USE while forks or other snapshots use it)",
    params(crate::openapi::SnapshotPath),
    responses((status = 204, description = "deleted"))
)]
pub async fn delete(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    app.runtime.delete_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/v1/snapshots/{id}/fork",
    operation_id = "fork_snapshot",
    summary = "Create `count` sandboxes from the snapshot (forks)",
    description = "With the policy of the sandbox it was taken of: each sees exactly the snapshot's files and writes to its own layer. All or none; LIMIT_REACHED past max_sandboxes",
    params(crate::openapi::SnapshotPath),
    request_body = Option<crate::wire::ForkRequest>,
    responses((status = 201, description = "the forks", body = crate::wire::SandboxList))
)]
pub async fn fork(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let _admitted = match who.scope() {
        Some(scope) => Some(scope.admit_fork(&app.runtime, &id, body.count)?),
        None => None,
    };
    let forks = app.runtime.fork_snapshot(&id, body.count).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_sandboxes(forks.iter().map(|f| f.id.as_str()));
    }
    let forks = each::<_, SandboxInfo>(forks);
    Ok((
        StatusCode::CREATED,
        Json(crate::wire::SandboxList { sandboxes: forks }),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/snapshots/{id}/diff",
    operation_id = "diff_snapshot",
    summary = "What changed from the snapshot to another snapshot or to a running sandbox of the same workdir",
    description = "None given: the snapshot's own changes against the workdir as it is now",
    params(crate::openapi::SnapshotPath, crate::wire::SnapshotDiffQuery),
    responses((status = 200, description = "the changes, sorted by path", body = crate::wire::ReviewReply))
)]
pub async fn diff(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<SnapshotDiffQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let target = query.into_target()?;
    match &target {
        lockbox_runtime::DiffTarget::Snapshot(s) => who.snapshot(s)?,
        lockbox_runtime::DiffTarget::Sandbox(s) => who.sandbox(s)?,
        lockbox_runtime::DiffTarget::Workdir => {}
    }
    let changes = app.runtime.diff_snapshot(&id, target).await?;
    Ok(Json(crate::wire::ReviewReply::from(changes)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/restore",
    operation_id = "restore_sandbox",
    summary = "Roll the sandbox back to a snapshot of its workdir",
    description = "Its processes, sessions and contexts are stopped, its branch discarded, and it starts again (same id and policy) seeing exactly the snapshot's files. Processes' memory is not restored. 400 INVALID_REQUEST for a snapshot of another workdir",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::RestoreRequest,
    responses((status = 200, description = "the sandbox, running again", body = crate::wire::SandboxInfo))
)]
pub async fn restore(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<RestoreRequest>,
) -> Result<impl IntoResponse, ApiError> {
    who.snapshot(&body.snapshot)?;
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.restore(&body.snapshot).await?;
    Ok(Json(SandboxInfo::from(app.runtime.sandbox_info(&id)?)))
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fork",
    operation_id = "fork_sandbox",
    summary = "Snapshot the sandbox, then create `count` sandboxes from that snapshot",
    description = "As POST /v1/snapshots/{id}/fork: the snapshot stays, delete it once its forks are gone",
    params(crate::openapi::SandboxPath),
    request_body = Option<crate::wire::ForkSandboxRequest>,
    responses((status = 201, description = "the snapshot and the forks", body = crate::wire::ForkReply))
)]
pub async fn fork_sandbox(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ForkSandboxRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let opts = lockbox_runtime::SnapshotOptions {
        name: body.name,
        include_tmp: body.include_tmp,
    };
    // The sandbox is the agent's (`auth`), so its policy was admitted under this ceiling.
    let _admitted = match who.scope() {
        Some(scope) => Some(scope.reserve(&app.runtime, body.count)?),
        None => None,
    };
    let (snapshot, forks) = app.runtime.fork_sandbox(&id, body.count, opts).await?;
    if let Some(scope) = who.scope() {
        scope.adopt_snapshot(&snapshot.id);
        scope.adopt_sandboxes(forks.iter().map(|f| f.id.as_str()));
    }
    Ok((
        StatusCode::CREATED,
        Json(crate::wire::ForkReply {
            sandboxes: each(forks),
            snapshot: SnapshotInfo::from(snapshot),
        }),
    ))
}

/// The media type of a snapshot's artifact: an OCI image layout in a tar stream.
const ARTIFACT_TAR: &str = "application/vnd.oci.image.layout.v1+tar";

#[utoipa::path(
    get,
    path = "/v1/snapshots/{id}/artifact",
    operation_id = "export_snapshot",
    summary = "The snapshot as an OCI artifact, to move it to another node (operator only)",
    description = "An OCI image layout in a tar stream, its manifest first: the snapshot's record as the config, its layer and kept /tmp as layer tar streams. `Docker-Content-Digest` is the manifest's sha256, what `PUT .../artifact?digest=` checks. The snapshot's workdir does not move (docs/fleet.md). 403 FORBIDDEN for a scoped token",
    params(crate::openapi::SnapshotPath),
    responses((status = 200, description = "the artifact, streamed", content((crate::openapi::Binary = "application/vnd.oci.image.layout.v1+tar")),
        headers(("Docker-Content-Digest" = String, description = "the artifact's digest (its manifest's sha256)"))))
)]
pub async fn export(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    crate::sessions::operator_only(&who, "snapshots")?;
    let export = app.runtime.export_snapshot(&id).await?;
    let digest = export.digest().to_owned();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    // The layer is read as the artifact is written, off the async workers; a failure
    // midway ends the stream without its last chunk, which the receiver refuses.
    tokio::task::spawn_blocking(move || {
        let out = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let sent = export
            .write_to(out)
            .map_err(|e| e.to_string())
            .and_then(|mut out| out.flush().map_err(|e| e.to_string()));
        if let Err(e) = sent {
            tracing::warn!(snapshot = %id, "sending a snapshot's artifact: {e}");
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = Response::new(Body::from_stream(stream));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ARTIFACT_TAR));
    if let Ok(v) = HeaderValue::from_str(&digest) {
        h.insert("docker-content-digest", v);
    }
    Ok(response)
}

#[utoipa::path(
    put,
    path = "/v1/snapshots/{id}/artifact",
    operation_id = "import_snapshot",
    summary = "Receive a snapshot another node exported (operator only)",
    description = "The body is `GET .../artifact`'s stream; `digest` is its `Docker-Content-Digest`. The manifest is checked against it before anything else is read, then every blob against the manifest as it streams in; nothing is kept unless all match. A snapshot with a parent needs that parent here first. 201 received, 200 this node had it already (nothing read). `Lockbox-Snapshot-Scope: mcp` also puts the snapshot (received or had) in this node's MCP scope, so `/mcp`'s fork and restore tools see it. 400 INVALID_REQUEST for a missing or malformed `digest`, an artifact of another snapshot, a missing parent (`parent`) or workdir (`workdir`), a `Lockbox-Snapshot-Scope` other than `mcp` (`field` names the header); 502 DIGEST_MISMATCH for a tampered or cut blob, 502 BAD_IMAGE for a malformed artifact; 403 FORBIDDEN for a scoped token",
    params(crate::openapi::SnapshotPath, crate::wire::ArtifactQuery, crate::wire::ArtifactHeaders),
    request_body(content((crate::openapi::Binary = "application/vnd.oci.image.layout.v1+tar"))),
    responses(
        (status = 201, description = "received", body = crate::wire::SnapshotInfo),
        (status = 200, description = "this node had it already", body = crate::wire::SnapshotInfo)
    )
)]
pub async fn import(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<crate::wire::ArtifactQuery>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    crate::sessions::operator_only(&who, "snapshots")?;
    let headers = crate::wire::ArtifactHeaders::from_headers(req.headers())?;
    lockbox_image::Digest::parse(&query.digest)
        .map_err(|e| ApiError::invalid("digest", e.to_string()))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let stalled = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&stalled);
    let mut body = req.into_body().into_data_stream();
    // The body is pumped into the blocking reader; it stops when the reader is gone (the
    // import refused or done).
    tokio::spawn(async move {
        while let Some(chunk) = body.next().await {
            let item = chunk.map_err(|e| {
                if crate::extract::body_stalled(&e) {
                    seen.store(true, Ordering::Relaxed);
                }
                std::io::Error::other(e)
            });
            let failed = item.is_err();
            if tx.send(item).await.is_err() || failed {
                return;
            }
        }
    });
    let runtime = app.runtime.clone();
    let imported = tokio::task::spawn_blocking(move || {
        let input = ChannelReader {
            rx,
            cur: Bytes::new(),
        };
        runtime.import_snapshot(&id, &query.digest, input)
    })
    .await
    .map_err(|e| ApiError::from(lockbox_runtime::RuntimeError::from(e)))?;
    match imported {
        Err(_) if stalled.load(Ordering::Relaxed) => Err(ApiError::body_stalled()),
        Err(e) => Err(e.into()),
        Ok(got) => {
            match headers.scope {
                // Operator only (above): an agent cannot widen its own or another's scope.
                Some(crate::wire::SnapshotScope::Mcp) => app.mcp.adopt_snapshot(&got.info.id),
                None => {}
            }
            Ok((
                if got.received {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                Json(SnapshotInfo::from(got.info)),
            ))
        }
    }
}

const CHUNK: usize = 64 * 1024;

/// A writer whose bytes go to a channel in chunks (blocking sends: a blocking thread's).
struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client is gone"))
    }
}

/// A reader of the chunks a channel brings (blocking receives: a blocking thread's).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    cur: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => self.cur = chunk?,
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        bytes::Buf::advance(&mut self.cur, n);
        Ok(n)
    }
}
