//! Images made from sandboxes: `POST /v1/sandboxes/{id}/commit-image` (what `lockbox image
//! commit` calls); and an image carried to another server, `GET` and `PUT
//! /v1/images/archive` (what a fleet's router copies images between nodes with).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::scope::Principal;
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use futures_util::TryStreamExt;
use lockbox_policy::ErrorCode;
use serde::{Deserialize, Serialize};

/// The body of `POST /v1/sandboxes/{id}/commit-image`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitImageRequest {
    /// Names for the new image (`app:2`, `registry.example/team/app:2`); at least one.
    pub tags: Vec<String>,
}

/// The image a commit made.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CommittedImage {
    /// The new image's id (its config's digest).
    pub id: String,
    /// Its names in the server's store.
    pub references: Vec<String>,
    /// The image it was made on (the sandbox's).
    pub base: String,
    /// The new layer's diff id; null when the sandbox wrote nothing to its root.
    pub layer: Option<String>,
    /// How many layers it has.
    pub layers: usize,
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/commit-image",
    operation_id = "commit_image",
    summary = "Make an image of the sandbox's root writes",
    description = "Operator only (403 FORBIDDEN for a scoped token). What an image sandbox wrote to its root (outside its workdir and grants: files made, changed, deleted) becomes a new layer on its image, stored under `tags` in the server's image store (`lockbox image ls`). Deletions are whiteouts; lockbox's own mount points are left out. The sandbox goes on running. 400 INVALID_REQUEST (field `sandbox`) for a sandbox without an image, (field `tags`) without a name; a bad name is BAD_REFERENCE",
    params(crate::openapi::SandboxPath),
    request_body = CommitImageRequest,
    responses((status = 201, description = "the new image", body = CommittedImage))
)]
pub async fn commit(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CommitImageRequest>,
) -> Result<impl IntoResponse, ApiError> {
    if who.scope().is_some() {
        // Names in the store are what the operator's ceiling allows agents by: an agent
        // that could point `busybox` at its own image would step over it.
        return Err(crate::sessions::forbidden(
            "committing an image names it in the server's store: the operator's, not a scoped token's",
        ));
    }
    let sandbox = app.runtime.sandbox(&id)?;
    let made = sandbox.commit_image(body.tags).await?;
    let image = made.image;
    Ok((
        StatusCode::CREATED,
        Json(CommittedImage {
            id: image.id,
            references: image.references,
            base: made.base,
            layer: made.layer,
            layers: image.layers.len(),
        }),
    ))
}

/// The largest image archive `PUT /v1/images/archive` takes.
const MAX_ARCHIVE: u64 = 64 << 30;

/// `GET`, `HEAD` and `PUT /v1/images/archive`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImageArchiveQuery {
    /// The image's name in the server's store (`app:2`, `registry.example/team/app:2`).
    pub reference: String,
    /// `PUT` only, and needed there: the archive's digest (`sha256:` and 64 hex digits), the
    /// `Docker-Content-Digest` its export answered with.
    pub digest: Option<String>,
}

/// What `PUT /v1/images/archive` stored.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ImportedImage {
    /// The image's id (its config's digest): the same as on the server it came from.
    pub id: String,
    /// Its names in this server's store, `reference` among them.
    pub references: Vec<String>,
}

fn image_error(e: lockbox_image::ImageError) -> ApiError {
    lockbox_runtime::RuntimeError::Image(e).into()
}

fn scratch(app: &AppState) -> std::path::PathBuf {
    app.runtime.state_dir().join("image-transfers")
}

/// What GET and HEAD `/v1/images/archive` share: an operator's call naming an image
/// (no `digest`, which is PUT's), and `work` run on the store off the async threads.
async fn with_archived_image<T: Send + 'static>(
    app: &AppState,
    who: &Principal,
    q: ImageArchiveQuery,
    doing: &'static str,
    work: impl FnOnce(&lockbox_image::Store, &str) -> Result<T, lockbox_image::ImageError>
        + Send
        + 'static,
) -> Result<T, ApiError> {
    crate::sessions::operator_only(who, "images")?;
    if q.digest.is_some() {
        return Err(ApiError::invalid("digest", "digest: only for PUT"));
    }
    lockbox_image::Source::parse(&q.reference).map_err(image_error)?;
    let state_dir = app.runtime.state_dir();
    let reference = q.reference;
    tokio::task::spawn_blocking(move || {
        work(&lockbox_image::Store::in_state_dir(&state_dir)?, &reference)
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Internal, format!("{doing}: {e}")))?
    .map_err(image_error)
}

#[utoipa::path(
    get,
    path = "/v1/images/archive",
    operation_id = "export_image",
    summary = "An image of the server's store as an OCI archive, to move it to another server (operator only)",
    description = "The image `reference` names, as an OCI archive (what `lockbox image save` writes); `Docker-Content-Digest` is the archive's sha256, what `PUT /v1/images/archive?digest=` checks. A fleet's router copies images committed or built on one node to another with it (docs/fleet.md). 404 IMAGE_NOT_FOUND, 400 BAD_REFERENCE for a malformed name; 403 FORBIDDEN for a scoped token",
    params(ImageArchiveQuery),
    responses((status = 200, description = "the archive, streamed", content((crate::openapi::Binary = "application/x-tar")),
        headers(("Docker-Content-Digest" = String, description = "the archive's sha256"))))
)]
pub async fn export_archive(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiQuery(q): ApiQuery<ImageArchiveQuery>,
) -> Result<Response, ApiError> {
    let dir = scratch(&app);
    let out = with_archived_image(
        &app,
        &who,
        q,
        "saving the image",
        move |store, reference| store.export_for_transfer(reference, &dir),
    )
    .await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(out.file));
    let mut response = Body::from_stream(stream).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(out.size));
    if let Ok(v) = HeaderValue::from_str(&out.digest) {
        h.insert("docker-content-digest", v);
    }
    Ok(response)
}

#[utoipa::path(
    head,
    path = "/v1/images/archive",
    operation_id = "has_image",
    summary = "Whether the server's store has an image, without exporting it (operator only)",
    description = "200 when the store has the image `reference` names: `Lockbox-Image-Id` is its id, `Lockbox-Image-Source` where it came from (its registry name when pulled from one; `build`, an archive or a layout otherwise). 404 when it does not, 400 for a malformed name, 403 for a scoped token; no body. A fleet's router asks its nodes this about an image none of its sandboxes runs (docs/fleet.md)",
    params(ImageArchiveQuery),
    responses((status = 200, description = "the store has it",
        headers(("Lockbox-Image-Id" = String, description = "the image's id"),
                ("Lockbox-Image-Source" = String, description = "where the store got it"))))
)]
pub async fn has_image(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiQuery(q): ApiQuery<ImageArchiveQuery>,
) -> Result<Response, ApiError> {
    let found = with_archived_image(&app, &who, q, "looking the image up", |store, reference| {
        store.get(reference)
    })
    .await?;
    let Some(image) = found else {
        return Ok(StatusCode::NOT_FOUND.into_response());
    };
    let mut response = StatusCode::OK.into_response();
    let h = response.headers_mut();
    for (name, value) in [
        ("lockbox-image-id", &image.id),
        ("lockbox-image-source", &image.source),
    ] {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    }
    Ok(response)
}

#[utoipa::path(
    put,
    path = "/v1/images/archive",
    operation_id = "import_image",
    summary = "Store an image another server exported (operator only)",
    description = "The body is `GET /v1/images/archive`'s; `digest` its `Docker-Content-Digest`. The body is checked against the digest before anything is loaded; the image keeps its id and is named `reference` (moved off any image that name had). 201 the image. 400 INVALID_REQUEST for a missing or malformed `digest` (field `digest`), BAD_REFERENCE for a malformed name; 502 DIGEST_MISMATCH for a tampered or cut body, BAD_IMAGE for one that is no image archive (nothing is kept of either); 413 PAYLOAD_TOO_LARGE past 64 GiB; 403 FORBIDDEN for a scoped token",
    params(ImageArchiveQuery),
    request_body(content((crate::openapi::Binary = "application/x-tar"))),
    responses((status = 201, description = "stored", body = ImportedImage))
)]
pub async fn import_archive(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiQuery(q): ApiQuery<ImageArchiveQuery>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    crate::sessions::operator_only(&who, "images")?;
    let digest = q.digest.unwrap_or_default();
    let Some(want) = lockbox_image::sha256_hex(&digest) else {
        return Err(ApiError::invalid(
            "digest",
            "digest: the archive's Docker-Content-Digest, sha256: and 64 hex digits",
        ));
    };
    lockbox_image::Source::parse(&q.reference).map_err(image_error)?;
    let dir = scratch(&app);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("{}: {e}", dir.display())))?;
    let name = crate::sessions::random_hex::<8>()?;
    let path = dir.join(format!(".import-{name}.tar"));
    // A body that stops arriving (`--io-timeout`) is 408, as on the other uploads.
    let stalled = std::sync::atomic::AtomicBool::new(false);
    let body = req.into_body().into_data_stream().inspect_err(|e| {
        if crate::extract::body_stalled(e) {
            stalled.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let received = lockbox_image::receive(body, &path, want, MAX_ARCHIVE).await;
    let stored = match received {
        Err(_) if stalled.load(std::sync::atomic::Ordering::Relaxed) => {
            Err(ApiError::body_stalled())
        }
        Ok(()) => {
            let store = lockbox_image::Store::in_state_dir(&app.runtime.state_dir())
                .map_err(image_error)?;
            store
                .import_transfer(&path, &q.reference)
                .await
                .map_err(image_error)
        }
        Err(e) => Err(receive_error(e)),
    };
    let _ = tokio::fs::remove_file(&path).await;
    let image = stored?;
    Ok((
        StatusCode::CREATED,
        Json(ImportedImage {
            id: image.id,
            references: image.references,
        }),
    ))
}

fn receive_error(e: lockbox_image::ReceiveError) -> ApiError {
    use lockbox_image::ReceiveError as R;
    let code = match &e {
        R::TooLarge(_) => ErrorCode::PayloadTooLarge,
        R::Mismatch { .. } => ErrorCode::DigestMismatch,
        R::Stream(_) => ErrorCode::InvalidRequest,
        R::Io(_) => ErrorCode::Internal,
    };
    ApiError::new(code, format!("{e}: nothing was stored"))
}
