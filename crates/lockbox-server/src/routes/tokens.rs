//! Scoped tokens (operator only): `POST /v1/tokens` hands out a token bound to a ceiling, for
//! an agent; `DELETE /v1/tokens/{id}` revokes one. A scoped token creates and forks
//! sandboxes only within its ceiling, sees only what it made, and reaches none of the
//! operator's routes (`auth`). Kept in memory: they end with the server.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::wire::{MintToken, MintedToken};
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use lockbox_policy::ErrorCode;
use serde_json::json;

#[utoipa::path(
    post,
    path = "/v1/tokens",
    operation_id = "mint_token",
    summary = "Hand out a token bound to a ceiling, for an agent (operator only)",
    description = "docs/server.md, Scoped tokens. Without `ceiling`, the server's (--ceiling and the --allow-* flags). The secret is shown once; the token lasts until revoked or the server stops. 403 FORBIDDEN with a scoped token",
    request_body = Option<crate::wire::MintToken>,
    responses((status = 201, description = "the token", body = crate::wire::MintedToken))
)]
pub async fn mint(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<MintToken>,
) -> Result<impl IntoResponse, ApiError> {
    let ceiling = match body.ceiling {
        Some(value) => {
            let ceiling: lockbox_policy::Ceiling = serde_json::from_value(value)
                .map_err(|e| ApiError::invalid("ceiling", format!("ceiling: {e}")))?;
            ceiling
                .validate()
                .map_err(|e| ApiError::invalid("ceiling", format!("ceiling: {e}")))?;
            ceiling
        }
        None => app.config.ceiling.clone(),
    };
    let (id, token) = app
        .tokens
        .mint(ceiling.clone())
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(MintedToken {
            id,
            token: token.secret().to_owned(),
            ceiling: serde_json::to_value(&ceiling)
                .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?,
        }),
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/tokens/{id}",
    operation_id = "revoke_token",
    summary = "Revoke a scoped token (operator only); its sandboxes keep running",
    description = "404 TOKEN_NOT_FOUND for a token never minted or revoked already",
    params(("id" = String, Path, description = "The token's id (from POST /v1/tokens)")),
    responses((status = 200, description = "revoked", body = Object))
)]
pub async fn revoke(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    if app.tokens.revoke(&id) {
        Ok(Json(json!({ "revoked": true })))
    } else {
        Err(
            ApiError::new(ErrorCode::TokenNotFound, format!("no scoped token {id}"))
                .with_details(json!({ "id": id })),
        )
    }
}
