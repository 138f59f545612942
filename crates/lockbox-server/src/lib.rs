//! The HTTP front end of lockbox's long-lived sandboxes (`lockbox serve`): REST + JSON,
//! SSE for streams, WebSocket for PTYs and interactive stdin, bearer-token auth, and the
//! browser review console.
//!
//! - [`serve`] runs the API on a listener until a shutdown future resolves, then stops the
//!   runtime (every sandbox is deleted, its branch's on-exit policy applied);
//!   [`serve_with_ports`] also serves each exposed port on an origin of its own
//!   ([`PortsListener`], see `routes::ports`);
//! - [`app`] is the same API as a [`Router`] (for tests and embedding);
//! - [`Token`] is the secret clients send; [`ServerConfig`] the limits (connections and
//!   their timeouts in `connections`, bodies, streams, exec output in `output`);
//! - [`openapi::document`] is the OpenAPI 3.1 description of every route, derived (utoipa)
//!   from the wire types (`wire/`, one module per resource) and the handlers;
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
pub mod scope;
mod sessions;
mod streams;
mod ui;
mod wire;

pub use crate::auth::{Token, TokenError, TOKEN_FILE};
pub use crate::connections::MAX_HEAD;
pub use crate::error::{status_of, ApiError};
pub use crate::routes::ports::{check_ports_domain, OPEN_PATH, PORT_COOKIE};
/// One path's diff in its wire shape, as `lockbox branch hunks --json` prints it too.
pub use crate::wire::FileDiffReply;

use crate::streams::Streams;
use axum::extract::DefaultBodyLimit;
use axum::Router;
use lockbox_policy::Ceiling;
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
    /// How long a connection may take to send a complete request head: its first one from
    /// its opening, a later one from its first byte (closed within one to two times this).
    /// Default 10 s.
    pub header_timeout: Duration,
    /// How long a connection may sit with no request in flight (a kept-alive one between
    /// requests) before it is closed. Default 120 s: longer than clients' pools keep an
    /// idle connection (reqwest, Go: 90 s), so that the client closes first and never sends
    /// a request on a connection the server is closing.
    pub connection_idle_timeout: Duration,
    /// How long a request body may deliver nothing, or a response go unread, before the
    /// connection is ended. Default 60 s.
    pub io_timeout: Duration,
    /// The step journal `GET /v1/journal/runs` shows (`lockbox serve --journal URL`);
    /// none by default.
    pub journal: Option<JournalSource>,
    /// The operator's ceiling for agents: what `/mcp` may grant, and scoped tokens by
    /// default (`lockbox serve --ceiling`, `--allow-*`). Default: [`Ceiling::default`].
    pub ceiling: Ceiling,
    /// Origins besides loopback ones a browser may call `/mcp` from (`--mcp-allow-origin`,
    /// e.g. `https://agent.example`); any other `Origin` is 403 (MCP's DNS-rebinding rule).
    pub mcp_allow_origins: Vec<String>,
    /// E2B's sandbox domain (`--e2b-domain`): a request whose `Host` is
    /// `{port}-{sandboxID}.{domain}` goes to that E2B sandbox's port (docs/e2b.md). Without
    /// it, E2B's sandbox requests are routed by the SDK's `E2b-Sandbox-Id` and
    /// `E2b-Sandbox-Port` headers only.
    pub e2b_domain: Option<String>,
    /// The policy E2B sandboxes start from (`lockbox serve --e2b-profile`): grants,
    /// limits, environment; E2B's own fields apply over it. None: lockbox's default.
    pub e2b_policy: Option<lockbox_policy::Policy>,
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
            connection_idle_timeout: Duration::from_secs(120),
            io_timeout: Duration::from_secs(60),
            journal: None,
            ceiling: Ceiling::default(),
            mcp_allow_origins: Vec::new(),
            e2b_domain: None,
            e2b_policy: None,
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
    /// Scoped tokens handed out (`POST /v1/tokens`).
    pub tokens: Arc<auth::ScopedTokens>,
    /// What `/mcp` made with the operator's token, under [`ServerConfig::ceiling`].
    pub mcp: Arc<scope::Scope>,
    /// The ports listener, if there is one.
    pub ports: Option<Arc<routes::ports::PortsOrigin>>,
}

/// The listener of exposed ports (`lockbox serve --ports-listen`): each port at
/// `http://{port}-{sandbox}.{domain}:{its port}/`, an origin of its own, so nothing a
/// sandbox's page sets reaches the API's (the console's) origin.
#[derive(Debug)]
pub struct PortsListener {
    listener: tokio::net::TcpListener,
    domain: String,
}

impl PortsListener {
    /// The ports on `listener`, their host names under `domain` (`localhost`: browsers
    /// resolve `*.localhost` to the loopback and keep each such host a site of its own);
    /// a `domain` that is not a DNS name is refused ([`check_ports_domain`]).
    pub fn new(listener: tokio::net::TcpListener, domain: &str) -> Result<PortsListener, String> {
        Ok(PortsListener {
            listener,
            domain: check_ports_domain(domain)?,
        })
    }
}

/// The API as a router: every route, auth, body limit, JSON errors for unknown routes.
pub fn app(runtime: Runtime, token: Token, config: ServerConfig) -> Router {
    let state = state(runtime, token, &config, None, CancellationToken::new());
    api_router(state)
}

fn state(
    runtime: Runtime,
    token: Token,
    config: &ServerConfig,
    ports: Option<routes::ports::PortsOrigin>,
    shutdown: CancellationToken,
) -> AppState {
    AppState {
        runtime,
        token,
        sessions: sessions::Sessions::default(),
        streams: Streams::new(config.max_streams, config.keepalive, shutdown),
        tokens: Arc::default(),
        mcp: Arc::new(scope::Scope::new(config.ceiling.clone())),
        config: Arc::new(config.clone()),
        ports: ports.map(Arc::new),
    }
}

fn api_router(state: AppState) -> Router {
    let e2b = lockbox_e2b::E2b::new(state.runtime.clone(), state.token.secret())
        .with_base_policy(state.config.e2b_policy.clone());
    let io_timeout = state.config.io_timeout;
    let domain = state.config.e2b_domain.clone();
    // An E2B upload that stops arriving ends its request (408), as lockbox's own do.
    lockbox_e2b::wrap(e2b, lockbox_router(state), domain)
        .layer(RequestBodyTimeoutLayer::new(io_timeout))
}

/// lockbox's own API (`/v1/...`, `/mcp`, the console), without E2B's protocol.
fn lockbox_router(state: AppState) -> Router {
    let config = Arc::clone(&state.config);
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

/// The ports listener's router: every request goes to the port its `Host` names.
fn ports_router(state: AppState) -> Router {
    let io_timeout = state.config.io_timeout;
    Router::new()
        .fallback(routes::ports::own_origin)
        .layer(RequestBodyTimeoutLayer::new(io_timeout))
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
    serve_with_ports(listener, None, runtime, token, config, shutdown).await
}

/// As [`serve`], and the exposed ports on `ports` (the connection bounds hold for both
/// listeners together).
pub async fn serve_with_ports(
    listener: tokio::net::TcpListener,
    ports: Option<PortsListener>,
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
        idle_timeout: config.connection_idle_timeout,
        io_timeout: config.io_timeout,
    };
    let (ports_listener, origin) = match ports {
        Some(p) => {
            let port = p.listener.local_addr()?.port();
            let origin = routes::ports::PortsOrigin::new(p.domain, port)?;
            (Some(p.listener), Some(origin))
        }
        None => (None, None),
    };
    let state = state(runtime.clone(), token, &config, origin, cancel.clone());
    let stop = cancel.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let gate = connections::Gate::new(&limits);
    let api = connections::serve(
        listener,
        api_router(state.clone()),
        limits,
        gate.clone(),
        cancel.clone(),
    );
    let ports_cancel = cancel.clone();
    let ports = async move {
        if let Some(listener) = ports_listener {
            connections::serve(listener, ports_router(state), limits, gate, ports_cancel).await;
        }
    };
    let server = async move {
        tokio::join!(api, ports);
    };
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
