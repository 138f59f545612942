//! The code interpreter (port 49999, `e2b-code-interpreter`): `POST /execute` streaming
//! newline-delimited JSON, and `/contexts`, on lockbox's code contexts.

use crate::E2b;
use axum::Router;

/// The code interpreter's routes.
pub fn router(e2b: E2b) -> Router {
    Router::new().with_state(e2b)
}
