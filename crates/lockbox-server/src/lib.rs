//! The HTTP front end of lockbox's long-lived sandboxes (`lockbox serve`): REST + JSON,
//! SSE for streams, WebSocket for PTYs and interactive stdin, bearer-token auth, and the
//! browser review console.
//!
//! - [`serve`] runs the API on a listener until a shutdown future resolves, then stops the
//!   runtime (every sandbox is deleted, its branch's on-exit policy applied);
//! - [`app`] is the same API as a [`Router`] (for tests and embedding);
//! - [`Token`] is the secret clients send; [`ServerConfig`] the limits (connections and
//!   their timeouts in `connections`, bodies, streams, exec output in `output`);
//! - [`openapi::document`] is the OpenAPI 3.1 description of every route, derived (utoipa)
//!   from the wire types (`wire.rs`) and the handlers;
//! - the review console: its static files (`ui/`, embedded by `build.rs`) at `/ui`, and its
//!   login, which exchanges the token for a session cookie the API also accepts, with CSRF
//!   and origin checks (`sessions`, `auth`, `routes::console`);
//! - transactions and journal runs for the console to read ([`JournalSource`]);
//! - [`mcp`]: the same sandboxes as MCP tools, at `POST /mcp` (streamable HTTP) and over
//!   stdio ([`mcp::serve_stdio`], `lockbox mcp`).
//!
//! Handlers only translate: a request becomes one call of [`lockbox_runtime`], the result
//! or [`RuntimeError`](lockbox_runtime::RuntimeError) a response (errors are
//! `{code, message, details}`, see [`ApiError`]).
//!
//! Not here: sandboxes, sessions, logs, files (the runtime); the command line (lockbox-cli).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod auth;
mod connections;
mod error;
mod extract;
pub mod mcp;
pub mod openapi;
mod output;
mod routes;
mod sessions;
mod streams;
mod ui;
mod wire;

pub use crate::auth::{Token, TokenError, TOKEN_FILE};
pub use crate::connections::MAX_HEAD;
pub use crate::error::{status_of, ApiError};
/// One path's diff in its wire shape, as `lockbox branch hunks --json` prints it too.
pub use crate::wire::FileDiffReply;

use crate::streams::Streams;
use axum::extract::DefaultBodyLimit;
use axum::Router;
use lockbox_runtime::Runtime;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// Limits and intervals of the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// SSE keepalive comment interval (default 10 s, under the 15 s proxies commonly allow).
    pub keepalive: Duration,
    /// Largest buffered request body (JSON, stdin); file uploads stream and are not bound
    /// by it. Default 16 MiB.
    pub max_body: usize,
    /// Open SSE and WebSocket streams at most; more is 429 `LIMIT_REACHED`. Default 256.
    pub max_streams: usize,
    /// Most log bytes in one non-follow `logs` reply. Default 1 MiB.
    pub max_log_read: usize,
    /// How long a stop waits for requests in flight before the runtime is shut down
    /// anyway (which ends them). Default 5 s.
    pub shutdown_grace: Duration,
    /// Connections open at once; at the cap a new one closes the oldest that has not sent a
    /// complete request head, or, if there is none, is answered 503 `SERVER_BUSY` and
    /// closed. Default 512 (the CLI derives it from the open-files limit).
    pub max_connections: usize,
    /// Connections open at once from one IP address; one more is answered 503
    /// `SERVER_BUSY` (`max_connections_per_peer`) and closed. Default 128.
    pub max_connections_per_peer: usize,
    /// How long a connection may take to send a complete request head, counted from its
    /// opening or from the end of its previous response (so idle keep-alive connections
    /// close after it too). Default 10 s.
    pub header_timeout: Duration,
    /// How long a request body may deliver nothing, or a response go unread, before the
    /// connection is ended. Default 60 s.
    pub io_timeout: Duration,
    /// The step journal `GET /v1/journal/runs` shows (`lockbox serve --journal URL`);
    /// none by default.
    pub journal: Option<JournalSource>,
}

/// A step journal and the URL it was opened from (shown to clients, so give one without
/// a password).
#[derive(Debug, Clone)]
pub struct JournalSource {
    /// Where it lives, e.g. `sqlite:/var/lib/app/journal.db`.
    pub url: String,
    /// The journal.
    pub journal: lockbox_journal::Journal,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            keepalive: Duration::from_secs(10),
            max_body: 16 << 20,
            max_streams: 256,
            max_log_read: 1 << 20,
            shutdown_grace: Duration::from_secs(5),
            max_connections: 512,
            max_connections_per_peer: 128,
            header_timeout: Duration::from_secs(10),
            io_timeout: Duration::from_secs(60),
            journal: None,
        }
    }
}

/// What every handler gets.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub runtime: Runtime,
    pub token: Token,
    pub sessions: sessions::Sessions,
    pub streams: Streams,
    pub config: Arc<ServerConfig>,
}

/// The API as a router: every route, auth, body limit, JSON errors for unknown routes.
pub fn app(runtime: Runtime, token: Token, config: ServerConfig) -> Router {
    build(runtime, token, config, CancellationToken::new())
}

fn build(
    runtime: Runtime,
    token: Token,
    config: ServerConfig,
    shutdown: CancellationToken,
) -> Router {
    let state = AppState {
        runtime,
        token,
        sessions: sessions::Sessions::default(),
        streams: Streams::new(config.max_streams, config.keepalive, shutdown),
        config: Arc::new(config.clone()),
    };
    routes::router()
        .layer(DefaultBodyLimit::max(config.max_body))
        // A body that stops arriving ends its request (408) instead of holding it forever.
        .layer(RequestBodyTimeoutLayer::new(config.io_timeout))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_auth,
        ))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves; then ends open streams, waits
/// up to [`ServerConfig::shutdown_grace`] for requests in flight, and shuts the runtime
/// down. Connections are bounded as `connections` describes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    runtime: Runtime,
    token: Token,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cancel = CancellationToken::new();
    let grace = config.shutdown_grace;
    let limits = connections::Limits {
        max_connections: config.max_connections,
        max_per_peer: config.max_connections_per_peer,
        header_timeout: config.header_timeout,
        io_timeout: config.io_timeout,
    };
    let router = build(runtime.clone(), token, config, cancel.clone());
    let stop = cancel.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let server = connections::serve(listener, router, limits, cancel.clone());
    let deadline = async move {
        cancel.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = server => {}
        () = deadline => {
            tracing::warn!(?grace, "requests still in flight after the grace period; stopping");
        }
    }
    runtime.shutdown().await;
    Ok(())
}
