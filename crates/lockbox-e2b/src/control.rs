//! E2B's control plane (`spec/openapi.yml` of e2b-dev/E2B): create, list, info, kill,
//! timeout, connect, pause/resume, fork, network, health, logs, metrics. Authenticated by
//! `X-API-Key`.

use crate::E2b;
use axum::Router;

/// The control plane's routes.
pub fn router(e2b: E2b) -> Router {
    Router::new().with_state(e2b)
}
