//! A built template carried to another server: `GET /templates/{id}/archive?tag=T` sends the
//! image that `id:T` names as an OCI archive (its sha256 in `Docker-Content-Digest`, its
//! start and ready commands in `Lockbox-Template-Start`), and `PUT /templates/{id}/archive
//! ?tag=T&digest=sha256:HEX` on the other server checks the digest, loads the archive into
//! its image store and names it `id:T`, with those commands. A fleet's router uses the pair
//! to run a template's sandboxes on nodes other than the one that built it (docs/fleet.md,
//! "E2B templates"). Both need the API key, as the other template routes do.
//!
//! The image keeps its id (the digest of its config) across the copy, so the start commands,
//! recorded with the image id they were built with, stay valid there.

use crate::template_start::{self, StartCmds};
use crate::templates::{check_name, random_hex};
use crate::{E2b, E2bError};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;
use serde_json::json;
use std::path::{Path as FsPath, PathBuf};

/// The largest archive a server takes.
const MAX_ARCHIVE: u64 = 64 << 30;
/// The header that carries a template's start and ready commands (base64 of their JSON).
pub const START_HEADER: &str = "lockbox-template-start";

#[derive(Deserialize)]
pub(crate) struct ArchiveQuery {
    tag: Option<String>,
    digest: Option<String>,
}

/// `id:tag` (tag `latest` when none is given), both checked as template names are.
fn template_name(id: &str, tag: Option<&str>) -> Result<String, E2bError> {
    check_name("template", id)?;
    let tag = tag.unwrap_or("latest");
    if tag.contains('/') {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("tag {tag:?}: a tag has no '/'"),
        ));
    }
    check_name("tag", tag)?;
    Ok(format!("{id}:{tag}"))
}

fn internal(what: &str) -> impl Fn(String) -> E2bError + '_ {
    move |e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}"))
}

fn scratch(e2b: &E2b) -> PathBuf {
    e2b.runtime.state_dir().join("e2b").join("archives")
}

/// `GET /templates/{id}/archive?tag=T`.
pub(crate) async fn export(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<ArchiveQuery>,
) -> Result<Response, E2bError> {
    let name = template_name(&id, q.tag.as_deref())?;
    let state_dir = e2b.runtime.state_dir();
    let dir = scratch(&e2b);
    let (out, start) = tokio::task::spawn_blocking(move || save(&state_dir, &dir, &name))
        .await
        .map_err(|e| internal("saving the template")(e.to_string()))??;
    let (size, digest) = (out.size, out.digest);
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(out.file));
    let mut resp = Body::from_stream(stream).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/x-tar"),
    );
    headers.insert("content-length", HeaderValue::from(size));
    if let Ok(v) = HeaderValue::from_str(&digest) {
        headers.insert("docker-content-digest", v);
    }
    if let Some(start) = start {
        let encoded = base64::engine::general_purpose::STANDARD.encode(start);
        if let Ok(v) = HeaderValue::from_str(&encoded) {
            headers.insert(START_HEADER, v);
        }
    }
    Ok(resp)
}

/// The archive of `name` (open and unlinked: [`lockbox_image::Store::export_for_transfer`])
/// and the template's start commands (JSON).
fn save(
    state_dir: &FsPath,
    dir: &FsPath,
    name: &str,
) -> Result<(lockbox_image::Outgoing, Option<Vec<u8>>), E2bError> {
    let store = lockbox_image::Store::in_state_dir(state_dir)
        .map_err(|e| internal("the image store")(e.to_string()))?;
    let out = store.export_for_transfer(name, dir).map_err(|e| match e {
        lockbox_image::ImageError::NotFound(_) => E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template {name} is not built on this server"),
        ),
        e => internal("saving the template")(e.to_string()),
    })?;
    Ok((out, template_start::raw(state_dir, name)))
}

/// `PUT /templates/{id}/archive?tag=T&digest=sha256:HEX`: 201 `{templateID, name, image}`.
pub(crate) async fn import(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Query(q): Query<ArchiveQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, E2bError> {
    let name = template_name(&id, q.tag.as_deref())?;
    let want = q.digest.unwrap_or_default();
    let Some(hex_part) = lockbox_image::sha256_hex(&want) else {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "digest: the archive's digest, sha256:<64 hex digits>, is required",
        ));
    };
    let start = match headers.get(START_HEADER) {
        None => StartCmds::default(),
        Some(v) => base64::engine::general_purpose::STANDARD
            .decode(v.as_bytes())
            .ok()
            .and_then(|raw| serde_json::from_slice::<StartCmds>(&raw).ok())
            .ok_or_else(|| {
                E2bError::new(
                    StatusCode::BAD_REQUEST,
                    format!("{START_HEADER}: base64 of the template's start commands (JSON)"),
                )
            })?,
    };
    let dir = scratch(&e2b);
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| internal("the archives' directory")(e.to_string()))?;
    let path = dir.join(format!(".import-{}.tar", random_hex(8)?));
    let received = receive(body, &path, hex_part).await;
    let loaded = match received {
        Ok(()) => load(&e2b, &path, &name, &start).await,
        Err(e) => Err(e),
    };
    let _ = tokio::fs::remove_file(&path).await;
    let image = loaded?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"templateID": id, "name": name, "image": image})),
    )
        .into_response())
}

/// The body into `path`, checked against the sha256 `want` (hex).
async fn receive(body: Body, path: &FsPath, want: &str) -> Result<(), E2bError> {
    use lockbox_image::ReceiveError as R;
    lockbox_image::receive(body.into_data_stream(), path, want, MAX_ARCHIVE)
        .await
        .map_err(|e| {
            let status = match e {
                R::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                R::Mismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                R::Stream(_) => StatusCode::BAD_REQUEST,
                R::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            E2bError::new(status, format!("{e}: nothing was stored"))
        })
}

/// Loads the archive into the image store, names it `name`, records its start commands;
/// the image's id.
async fn load(e2b: &E2b, path: &FsPath, name: &str, start: &StartCmds) -> Result<String, E2bError> {
    let state_dir = e2b.runtime.state_dir();
    let store = lockbox_image::Store::in_state_dir(&state_dir)
        .map_err(|e| internal("the image store")(e.to_string()))?;
    let image = store
        .load_archive(path, &lockbox_image::PullOptions::default())
        .await
        .map_err(|e| {
            E2bError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("loading the archive: {e}"),
            )
        })?;
    if (start.start.is_some() || start.ready.is_some()) && start.image != image.id {
        return Err(E2bError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "{START_HEADER}: the commands are for image {}, the archive's is {}",
                start.image, image.id
            ),
        ));
    }
    store
        .tag(&image.id, name)
        .map_err(|e| internal("naming the image")(e.to_string()))?;
    template_start::record(&state_dir, &[name.to_owned()], start)
        .map_err(|e| internal("recording the start commands")(e.to_string()))?;
    Ok(image.id)
}
