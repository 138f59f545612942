//! Images made from sandboxes: `POST /v1/sandboxes/{id}/commit-image` (what `lockbox image
//! commit` calls).

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::scope::Principal;
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Extension;
use axum::Json;
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
