//! Scoped tokens.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/tokens`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MintToken {
    /// The token's ceiling, as a ceiling profile's fields (`read`, `write`, `workdirs`,
    /// `net`, `credentials`, `limits`, `timeout`, `sandboxes`); the server's when absent.
    #[schema(value_type = Option<Object>)]
    pub ceiling: Option<serde_json::Value>,
}

/// A scoped token, as `POST /v1/tokens` hands it out (the secret is not shown again).
#[derive(Debug, Serialize, ToSchema)]
pub struct MintedToken {
    /// Its id, for `DELETE /v1/tokens/{id}`.
    pub id: String,
    /// The secret, sent as `Authorization: Bearer <token>`.
    pub token: String,
    /// Its ceiling.
    #[schema(value_type = Object)]
    pub ceiling: serde_json::Value,
}
