//! envd, E2B's in-sandbox daemon (`spec/envd/` of e2b-dev/E2B), answered by lockbox
//! outside the sandbox: Connect RPC `process.Process` and `filesystem.Filesystem`, and
//! REST `/files`, `/health`, `/envs`, `/metrics`. Each request carries its [`crate::Target`]
//! as an extension.

pub mod rest;

use crate::E2b;
use axum::Router;

/// envd's routes.
pub fn router(e2b: E2b) -> Router {
    Router::new()
        .with_state(e2b.clone())
        .merge(rest::router(e2b))
}
