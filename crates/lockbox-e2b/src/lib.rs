//! E2B's sandbox protocol on lockbox's runtime, so the **unmodified** `e2b` and
//! `e2b-code-interpreter` SDKs (and tools built on them, such as Harbor's E2B environment)
//! drive lockbox sandboxes. A user sets `E2B_API_URL` and `E2B_SANDBOX_URL` to one
//! `lockbox serve` listener and `E2B_API_KEY` to its token; nothing else changes.
//!
//! E2B has two planes, and so does this crate:
//! - the **control plane** ([`control`]: `POST /sandboxes`, `GET /v2/sandboxes`, kill,
//!   timeout, connect, pause/resume, ...), authenticated by `X-API-Key` (the server's token);
//! - the **sandbox plane**: what E2B serves inside each sandbox on its own ports. The SDK
//!   sends every such request to `E2B_SANDBOX_URL` with `E2b-Sandbox-Id` and
//!   `E2b-Sandbox-Port` headers (or to `{port}-{sandboxID}.{domain}`); [`target_of`] reads
//!   them and [`wrap`] routes the request by port: envd ([`envd`], port 49983: Connect RPC
//!   `process.Process` and `filesystem.Filesystem`, REST `/files`, `/health`, `/envs`) and
//!   the code interpreter ([`interpreter`], port 49999). Sandbox-plane requests carry the
//!   sandbox's own access token (`X-Access-Token`), not the API key.
//!
//! An E2B sandbox **is** a lockbox sandbox with the same id; what E2B adds (metadata, end
//! of life, access token, template) lives in the [`Registry`].
//!
//! Not here: HTTP serving, connection limits, lockbox's own API (lockbox-server mounts
//! this crate's routers beside its own); sandboxes themselves (lockbox-runtime).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod control;
pub mod envd;
pub mod interpreter;
mod registry;
pub mod templates;

pub use crate::registry::{E2bSandbox, Registry};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use lockbox_runtime::Runtime;
use std::sync::Arc;
use tower::ServiceExt;

/// envd's port inside an E2B sandbox (the SDK's `ConnectionConfig.envd_port`).
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port inside an E2B sandbox.
pub const INTERPRETER_PORT: u16 = 49999;

/// The envd version every sandbox reports (`envdVersion`). The SDK enables features by it
/// (`e2b/envd/versions.py`); 0.6.4, the newest gate, turns on everything envd here
/// implements: the default user, stdin and `CloseStdin`, recursive watch, watch events
/// carrying their entry (0.6.3), `application/octet-stream` uploads, and
/// `allow_network_mounts` (accepted; lockbox sandboxes have no network mounts). The one
/// feature it also turns on that lockbox lacks, file metadata on upload (0.6.2,
/// `X-Metadata-*` extended attributes), is sent only when the caller passes metadata, and
/// is then a 400 that says so.
pub const ENVD_VERSION: &str = "0.6.4";

/// The `clientID` of every sandbox (E2B's is the cluster node; lockbox has one).
pub const CLIENT_ID: &str = "lockbox";

/// The E2B user's home inside a sandbox: relative paths of files and the default working
/// directory of processes are resolved against it. E2B's is `/home/user`; a lockbox
/// sandbox's private writable directory is `/tmp` (HOME there too), see docs/e2b.md.
pub const HOME: &str = "/tmp";

/// What every E2B handler gets: the runtime, the API key and the E2B-side registry.
#[derive(Clone)]
pub struct E2b {
    /// The runtime whose sandboxes E2B's calls drive.
    pub runtime: Runtime,
    api_key: Arc<str>,
    /// What E2B adds to each lockbox sandbox.
    pub registry: Arc<Registry>,
    /// The policy E2B sandboxes start from (`lockbox serve --e2b-profile`): grants, limits,
    /// environment; E2B's network fields, `envVars` and working directory apply over it.
    pub base_policy: Option<Arc<lockbox_policy::Policy>>,
}

impl std::fmt::Debug for E2b {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2b").finish_non_exhaustive()
    }
}

impl E2b {
    /// E2B over `runtime`; `api_key` is what clients send as `X-API-Key` (the server's token).
    pub fn new(runtime: Runtime, api_key: &str) -> E2b {
        E2b {
            runtime,
            api_key: Arc::from(api_key),
            registry: Arc::new(Registry::default()),
            base_policy: None,
        }
    }

    /// E2B sandboxes start from `policy` instead of lockbox's default one.
    pub fn with_base_policy(mut self, policy: Option<lockbox_policy::Policy>) -> E2b {
        self.base_policy = policy.map(Arc::new);
        self
    }

    /// Whether `candidate` is the API key (constant time).
    pub fn api_key_matches(&self, candidate: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        self.api_key.as_bytes().ct_eq(candidate).into()
    }
}

/// Which sandbox and port a sandbox-plane request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The sandbox's id (an E2B id is a lockbox id).
    pub sandbox: String,
    /// The port inside the sandbox ([`ENVD_PORT`], [`INTERPRETER_PORT`] or an exposed one).
    pub port: u16,
}

/// The sandbox a request is for, from `E2b-Sandbox-Id` + `E2b-Sandbox-Port` (what the SDK
/// sends to `E2B_SANDBOX_URL`), else from a `Host` of the form `{port}-{sandboxID}.{domain}`
/// when `domain` is given. `None` for control-plane and lockbox API requests.
pub fn target_of(headers: &http::HeaderMap, domain: Option<&str>) -> Option<Target> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let (Some(sandbox), Some(port)) = (header("e2b-sandbox-id"), header("e2b-sandbox-port")) {
        let port = port.trim().parse().ok()?;
        return Some(Target {
            sandbox: sandbox.trim().to_owned(),
            port,
        });
    }
    let domain = domain?;
    let host = header("host")?;
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, sandbox) = label.split_once('-')?;
    Some(Target {
        sandbox: sandbox.to_owned(),
        port: port.parse().ok()?,
    })
}

/// `api` (lockbox's own API) with E2B beside it: sandbox-plane requests (see
/// [`target_of`]) go to envd or the code interpreter, E2B's control-plane paths to
/// [`control`], everything else to `api` unchanged. `domain` enables the
/// `{port}-{sandboxID}.{domain}` host form.
pub fn wrap(e2b: E2b, api: Router, domain: Option<String>) -> Router {
    let plane = SandboxPlane {
        envd: envd::router(e2b.clone()).fallback(unsupported),
        interpreter: interpreter::router(e2b.clone()).fallback(unsupported),
        domain,
        e2b: e2b.clone(),
    };
    control::router(e2b.clone())
        .merge(templates::router(e2b))
        .merge(api)
        .layer(axum::middleware::from_fn_with_state(
            plane,
            to_sandbox_plane,
        ))
}

#[derive(Clone)]
struct SandboxPlane {
    envd: Router,
    interpreter: Router,
    domain: Option<String>,
    e2b: E2b,
}

/// The most of an unsupported request's body read before it is answered.
const DRAIN_AT_MOST: usize = 1 << 20;

/// A sandbox-plane call lockbox does not implement: 501 in E2B's shape (Connect's
/// `unimplemented`), after reading the request's body (up to [`DRAIN_AT_MOST`]) so the
/// connection stays usable for the client's next request instead of being closed under it.
async fn unsupported(req: Request) -> E2bError {
    let what = format!("{} {}", req.method(), req.uri().path());
    let _ = axum::body::to_bytes(req.into_body(), DRAIN_AT_MOST).await;
    E2bError::new(
        http::StatusCode::NOT_IMPLEMENTED,
        format!("{what} is not supported by lockbox's E2B sandbox API (see docs/e2b.md)"),
    )
}

/// The message of a sandbox that does not exist (any more): the SDK recognises "was not
/// found" in a 502 and raises `SandboxNotRunningException` (`is_sandbox_not_found_message`).
pub fn sandbox_not_found(id: &str) -> E2bError {
    E2bError::new(
        http::StatusCode::BAD_GATEWAY,
        format!("The sandbox {id} was not found"),
    )
}

/// Lets a sandbox-plane request through if its sandbox is E2B's and running, and it
/// carries the sandbox's access token as `X-Access-Token` (constant-time comparison).
fn admit(e2b: &E2b, target: &Target, headers: &http::HeaderMap) -> Result<(), E2bError> {
    let sandbox = e2b
        .registry
        .get(&target.sandbox)
        .ok_or_else(|| sandbox_not_found(&target.sandbox))?;
    let running = e2b
        .runtime
        .sandbox_info(&target.sandbox)
        .is_ok_and(|i| i.state == lockbox_runtime::SandboxState::Running);
    if !running {
        return Err(sandbox_not_found(&target.sandbox));
    }
    let Some(token) = sandbox.access_token else {
        return Ok(());
    };
    use subtle::ConstantTimeEq;
    // The code interpreter's requests for contexts carry only the traffic token (which
    // is the same token, see control.rs).
    let given = headers
        .get("x-access-token")
        .or_else(|| {
            (target.port == INTERPRETER_PORT)
                .then(|| headers.get("e2b-traffic-access-token"))
                .flatten()
        })
        .map(http::HeaderValue::as_bytes);
    match given {
        Some(given) if bool::from(token.as_bytes().ct_eq(given)) => Ok(()),
        Some(_) => Err(E2bError::new(
            http::StatusCode::UNAUTHORIZED,
            "invalid access token for this sandbox (X-Access-Token)",
        )),
        None => Err(E2bError::new(
            http::StatusCode::UNAUTHORIZED,
            "this sandbox is secured: send its envdAccessToken as X-Access-Token",
        )),
    }
}

async fn to_sandbox_plane(
    State(plane): State<SandboxPlane>,
    mut req: Request,
    next: Next,
) -> Response {
    match target_of(req.headers(), plane.domain.as_deref()) {
        Some(target) => {
            let router = match target.port {
                ENVD_PORT => plane.envd,
                INTERPRETER_PORT => plane.interpreter,
                port => {
                    return E2bError::new(
                        http::StatusCode::BAD_GATEWAY,
                        format!("The sandbox is running but port is not open: port {port}"),
                    )
                    .into_response()
                }
            };
            if let Err(refused) = admit(&plane.e2b, &target, req.headers()) {
                return refused.into_response();
            }
            req.extensions_mut().insert(target);
            match router.oneshot(req).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
        None => next.run(req).await,
    }
}

/// An error in E2B's shape (`{"code": status, "message": ...}`), which the SDKs turn into
/// their typed exceptions by status.
#[derive(Debug)]
pub struct E2bError {
    /// The HTTP status.
    pub status: http::StatusCode,
    /// What was wrong, for the user.
    pub message: String,
}

impl E2bError {
    /// An error with `status` and `message`.
    pub fn new(status: http::StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_sdks_routing_headers_name_the_sandbox_and_port() {
        let h = headers(&[("E2b-Sandbox-Id", "sb-1"), ("E2b-Sandbox-Port", "49983")]);
        assert_eq!(
            target_of(&h, None),
            Some(Target {
                sandbox: "sb-1".into(),
                port: ENVD_PORT
            })
        );
    }

    #[test]
    fn a_wildcard_host_names_the_sandbox_only_under_the_configured_domain() {
        let h = headers(&[("host", "49999-sb-2.lockbox.test:3000")]);
        assert_eq!(
            target_of(&h, Some("lockbox.test")),
            Some(Target {
                sandbox: "sb-2".into(),
                port: INTERPRETER_PORT
            })
        );
        assert_eq!(target_of(&h, None), None);
        assert_eq!(target_of(&h, Some("other.test")), None);
        let api = headers(&[("host", "127.0.0.1:3000")]);
        assert_eq!(target_of(&api, Some("lockbox.test")), None);
    }
}
