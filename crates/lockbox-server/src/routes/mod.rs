//! The route table: one line per route, handlers in one module per resource.

pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod branches;
pub(crate) mod console;
pub(crate) mod contexts;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod images;
pub(crate) mod journal;
pub(crate) mod ports;
pub(crate) mod processes;
pub(crate) mod pty;
pub(crate) mod sandboxes;
pub(crate) mod snapshots;
pub(crate) mod tokens;
pub(crate) mod transactions;
pub(crate) mod watch;
pub(crate) mod workspace;

use crate::error::ApiError;
use crate::AppState;
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Redirect};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use serde_json::json;

/// Every route of the API (also what `openapi.json` describes).
pub fn router() -> Router<AppState> {
    let sandbox = "/v1/sandboxes/{id}";
    let process = "/v1/sandboxes/{id}/processes/{pid}";
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(sandbox, get(sandboxes::show).delete(sandboxes::delete))
        .route(
            &format!("{sandbox}/sessions"),
            post(sandboxes::create_session).get(sandboxes::list_sessions),
        )
        .route(
            &format!("{sandbox}/sessions/{{sid}}"),
            delete(sandboxes::delete_session),
        )
        .route(
            &format!("{sandbox}/contexts"),
            post(contexts::create).get(contexts::list),
        )
        .route(
            &format!("{sandbox}/contexts/{{cid}}"),
            delete(contexts::delete),
        )
        .route(
            &format!("{sandbox}/contexts/{{cid}}/run"),
            post(contexts::run),
        )
        .route(
            &format!("{sandbox}/contexts/{{cid}}/run/stream"),
            post(contexts::stream),
        )
        .route(&format!("{sandbox}/exec"), post(exec::exec))
        .route(&format!("{sandbox}/exec/stream"), post(exec::stream))
        .route(
            &format!("{sandbox}/processes"),
            post(processes::start).get(processes::list),
        )
        .route(process, get(processes::show).delete(processes::kill))
        .route(&format!("{process}/signal"), post(processes::signal))
        .route(&format!("{process}/logs"), get(processes::logs))
        .route(&format!("{process}/stdin"), post(processes::stdin))
        .route(&format!("{process}/pty"), get(pty::attach))
        .route(&format!("{process}/ws"), get(pty::attach_ws))
        .route(&format!("{sandbox}/files"), get(files::get).put(files::put))
        .route(&format!("{sandbox}/fs/list"), get(files::list))
        .route(&format!("{sandbox}/watch"), get(watch::watch))
        .route(&format!("{sandbox}/audit"), get(audit::audit))
        .route(&format!("{sandbox}/approvals"), get(approvals::list))
        .route(
            &format!("{sandbox}/approvals/{{qid}}"),
            post(approvals::decide),
        )
        .route(&format!("{sandbox}/fs/stat"), get(files::stat))
        .route(&format!("{sandbox}/fs/mkdir"), post(files::mkdir))
        .route(&format!("{sandbox}/fs/move"), post(files::rename))
        .route(&format!("{sandbox}/fs/remove"), post(files::remove))
        .route(&format!("{sandbox}/changes"), get(workspace::changes))
        .route(&format!("{sandbox}/diff"), get(workspace::diff))
        .route(&format!("{sandbox}/commit"), post(workspace::commit))
        .route(&format!("{sandbox}/abort"), post(workspace::abort))
        .route(
            &format!("{sandbox}/ports"),
            post(ports::expose).get(ports::list),
        )
        .route(
            &format!("{sandbox}/ports/{{port}}"),
            delete(ports::unexpose),
        )
        .route(
            &format!("{sandbox}/ports/{{port}}/"),
            any(ports::proxy_root),
        )
        .route(
            &format!("{sandbox}/ports/{{port}}/{{*path}}"),
            any(ports::proxy_path),
        )
        .route(&format!("{sandbox}/snapshots"), post(snapshots::take))
        .route(&format!("{sandbox}/commit-image"), post(images::commit))
        .route(
            "/v1/images/archive",
            get(images::export_archive)
                .head(images::has_image)
                .put(images::import_archive),
        )
        .route(&format!("{sandbox}/restore"), post(snapshots::restore))
        .route(&format!("{sandbox}/fork"), post(snapshots::fork_sandbox))
        .route("/v1/snapshots/{id}/fork", post(snapshots::fork))
        .route("/v1/snapshots/{id}/diff", get(snapshots::diff))
        .route(
            "/v1/snapshots/{id}/artifact",
            get(snapshots::export).put(snapshots::import),
        )
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{id}",
            get(snapshots::show).delete(snapshots::delete),
        )
        .route("/v1/branches", get(branches::list))
        .route("/v1/branches/{id}", get(branches::show))
        .route("/v1/branches/{id}/diff", get(branches::diff))
        .route("/v1/branches/{id}/commit", post(branches::commit))
        .route("/v1/branches/{id}/abort", post(branches::abort))
        .route(
            "/v1/transactions",
            get(transactions::list).post(transactions::create),
        )
        .route("/v1/transactions/{id}", get(transactions::show))
        .route("/v1/journal/runs", get(journal::runs))
        .route("/v1/journal/runs/{id}", get(journal::run))
        .route("/v1/tokens", post(tokens::mint))
        .route("/v1/tokens/{id}", delete(tokens::revoke))
        .route("/mcp", post(crate::mcp::http::post))
        .merge(console())
        .route("/", get(|| async { Redirect::to("/ui") }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// The console's routes, each response with its security headers.
fn console() -> Router<AppState> {
    Router::new()
        .route("/ui", get(console::index))
        .route("/ui/", get(console::index))
        .route("/ui/login", post(console::login))
        .route("/ui/logout", post(console::logout))
        .route("/ui/session", get(console::session))
        .route("/ui/{*file}", get(console::file))
        .route_layer(axum::middleware::from_fn(console::security_headers))
}

/// This server process's instance id: its pid and the time it first answered `/healthz`
/// (no randomness needed: two processes never share both).
fn instance() -> &'static str {
    static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{:x}-{now:x}", std::process::id())
    })
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    summary = "Liveness (no token needed)",
    responses((status = 200, description = "alive", body = crate::wire::Health)),
    security(())
)]
pub(crate) async fn healthz() -> impl IntoResponse {
    Json(crate::wire::Health {
        instance: instance(),
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
    })
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    summary = "This document",
    responses((status = 200, description = "OpenAPI 3.1 document", content((Object = "application/json"))))
)]
pub(crate) async fn openapi() -> impl IntoResponse {
    Json(crate::openapi::document().clone())
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        lockbox_policy::ErrorCode::NotFound,
        format!("no route {}", uri.path()),
    )
    .with_details(json!({ "path": uri.path() }))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        lockbox_policy::ErrorCode::MethodNotAllowed,
        format!("{} does not take {method}", uri.path()),
    )
    .with_details(json!({ "path": uri.path(), "method": method.as_str() }))
}
