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
//!   sandbox's own access token (`X-Access-Token`), not the API key, or are file URLs
//!   signed with it (`download_url`/`upload_url`).
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
pub mod lifecycle;
mod network;
pub mod observe;
mod persist;
mod registry;
mod template_copies;
pub mod template_start;
pub mod templates;

pub use crate::registry::{E2bSandbox, E2bSnapshot, Registry};

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

/// The E2B user's home inside a sandbox on an image without `/home/user` (E2B's home):
/// relative paths of files and the default working directory of processes are resolved
/// against it. A lockbox sandbox's private writable directory is `/tmp` (HOME there too).
/// A sandbox on the host's userland has `/home/user` (its workdir), see docs/e2b.md.
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
    /// The sandboxes paused before a restart (kept in the state directory) are paused here
    /// again; a file that cannot be read is skipped with a warning.
    pub fn new(runtime: Runtime, api_key: &str) -> E2b {
        let registry = Registry::default();
        let restored = persist::load(&runtime.state_dir(), |snapshot| {
            match runtime.snapshot_info(snapshot) {
                Ok(_) => Ok(true),
                Err(e) if e.code() == lockbox_policy::ErrorCode::SnapshotNotFound => Ok(false),
                Err(e) => Err(e.to_string()),
            }
        });
        if !restored.is_empty() {
            tracing::info!("{} paused E2B sandbox(es) restored", restored.len());
        }
        for (id, sandbox) in restored {
            registry.insert(&id, sandbox);
        }
        E2b {
            runtime,
            api_key: Arc::from(api_key),
            registry: Arc::new(registry),
            base_policy: None,
        }
    }

    /// Keeps sandbox `id` across restarts if it is paused (its file removed if not).
    pub(crate) fn persist(&self, id: &str, sandbox: &E2bSandbox) {
        persist::keep(&self.runtime.state_dir(), id, sandbox);
    }

    /// Forgets the kept file of sandbox `id` (killed or expired).
    pub(crate) fn unpersist(&self, id: &str) {
        persist::drop_kept(&self.runtime.state_dir(), id);
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
    /// The E2B sandbox's id.
    pub sandbox: String,
    /// The port inside the sandbox ([`ENVD_PORT`], [`INTERPRETER_PORT`] or an exposed one).
    pub port: u16,
    /// The lockbox sandbox serving it: the same id, except after a resume (set when the
    /// request is admitted, [`E2bSandbox::instance_id`]).
    pub instance: String,
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
            instance: sandbox.trim().to_owned(),
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
        instance: sandbox.to_owned(),
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

/// A signed file URL's query (the SDK's `download_url`/`upload_url` of a secured sandbox):
/// envd's `GET`/`POST /files` with `signature` (and `signature_expiration`) instead of
/// `X-Access-Token`.
#[derive(Debug, PartialEq, Eq)]
struct Signed {
    path: String,
    username: String,
    signature: String,
    expiration: Option<String>,
    /// `read` (GET) or `write` (POST).
    operation: &'static str,
}

impl Signed {
    /// The signature in a `/files` request's query, if any.
    fn of(method: &http::Method, uri: &http::Uri) -> Option<Signed> {
        if uri.path() != "/files" {
            return None;
        }
        let operation = match *method {
            http::Method::GET => "read",
            http::Method::POST => "write",
            _ => return None,
        };
        let (mut path, mut username, mut signature, mut expiration) =
            (String::new(), String::new(), None, None);
        for (k, v) in form_urlencoded::parse(uri.query()?.as_bytes()) {
            match &*k {
                "path" => path = v.into_owned(),
                "username" => username = v.into_owned(),
                "signature" => signature = Some(v.into_owned()),
                "signature_expiration" => expiration = Some(v.into_owned()),
                _ => {}
            }
        }
        Some(Signed {
            path,
            username,
            signature: signature?,
            expiration,
            operation,
        })
    }

    /// Whether it was made with `token` (envd's v1: `v1_` and the unpadded base64 of
    /// SHA-256 of `path:operation:username:token[:expiration]`), in constant time.
    fn made_with(&self, token: &str) -> bool {
        use base64::Engine;
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        let mut raw = format!("{}:{}:{}:{token}", self.path, self.operation, self.username);
        if let Some(expiration) = &self.expiration {
            raw.push(':');
            raw.push_str(expiration);
        }
        let digest = sha2::Sha256::digest(raw.as_bytes());
        let expected = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        );
        expected.as_bytes().ct_eq(self.signature.as_bytes()).into()
    }

    /// Refuses a signature past its expiration (Unix seconds), as envd does.
    fn check_expiration(&self) -> Result<(), E2bError> {
        let Some(expiration) = &self.expiration else {
            return Ok(());
        };
        let unauthorized = |m: &str| E2bError::new(http::StatusCode::UNAUTHORIZED, m);
        let at: u64 = expiration
            .parse()
            .map_err(|_| unauthorized("invalid signature expiration"))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if at < now {
            return Err(unauthorized("signature is already expired"));
        }
        Ok(())
    }
}

/// The sandbox a signed `/files` URL sent without routing headers is for: the one whose
/// access token made its signature. With `E2B_SANDBOX_URL` the SDK's signed URLs are
/// that URL plus the query, naming no sandbox; the signature binds one.
fn signed_target(e2b: &E2b, signed: &Signed) -> Option<Target> {
    e2b.registry.all().into_iter().find_map(|(id, s)| {
        let token = s.access_token.as_deref()?;
        signed.made_with(token).then(|| Target {
            instance: s.instance_id(&id).to_owned(),
            sandbox: id,
            port: ENVD_PORT,
        })
    })
}

/// The E2B sandbox (its id) whose access token signed the `/files` URL `uri` for `method`
/// (`GET`: a download, `POST`: an upload), whatever its expiration: see
/// `control::signed_url_sandbox`.
pub(crate) fn signed_url_sandbox(
    e2b: &E2b,
    method: &http::Method,
    uri: &http::Uri,
) -> Option<String> {
    let signed = Signed::of(method, uri)?;
    signed_target(e2b, &signed).map(|t| t.sandbox)
}

/// Lets a sandbox-plane request through if its sandbox is E2B's and running (not
/// paused), and it carries the sandbox's access token as `X-Access-Token` (constant-time
/// comparison) or is a signed file URL made with it; sets the lockbox sandbox serving it
/// ([`Target::instance`]).
fn admit(e2b: &E2b, target: &mut Target, req: &Request) -> Result<(), E2bError> {
    let headers = req.headers();
    let sandbox = e2b
        .registry
        .get(&target.sandbox)
        .ok_or_else(|| sandbox_not_found(&target.sandbox))?;
    target.instance = sandbox.instance_id(&target.sandbox).to_owned();
    let running = sandbox.paused.is_none()
        && e2b
            .runtime
            .sandbox_info(&target.instance)
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
    if given.is_none() && target.port == ENVD_PORT {
        if let Some(signed) = Signed::of(req.method(), req.uri()) {
            if !signed.made_with(&token) {
                return Err(E2bError::new(
                    http::StatusCode::UNAUTHORIZED,
                    "invalid signature for this sandbox's file URL",
                ));
            }
            return signed.check_expiration();
        }
    }
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
    let target = target_of(req.headers(), plane.domain.as_deref()).or_else(|| {
        Signed::of(req.method(), req.uri()).and_then(|s| signed_target(&plane.e2b, &s))
    });
    match target {
        Some(mut target) => {
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
            if let Err(refused) = admit(&plane.e2b, &mut target, &req) {
                return refused.into_response();
            }
            if req.headers().get("x-access-token").is_none() {
                if let Some(signed) = Signed::of(req.method(), req.uri()) {
                    // What the signature allows: its path alone (a multipart upload names
                    // its files' paths itself).
                    req.extensions_mut()
                        .insert(envd::rest::SignedPath(signed.path));
                }
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
    fn a_signed_file_url_verifies_with_its_token_only_for_its_path_and_method() {
        // What the SDK's `get_signature` makes for `a.txt`, `read`, user `user`, token
        // `tok`, expiring at 4102444800: python3 -c 'import base64,hashlib; print("v1_" +
        // base64.b64encode(hashlib.sha256(b"a.txt:read:user:tok:4102444800").digest())
        // .rstrip(b"=").decode())'
        let uri: http::Uri = "/files?path=a.txt&username=user&signature=v1_sMVu5%2F9VdN7de9etei5GkbqRY9DqmvZn92V3WI%2FhF78&signature_expiration=4102444800"
            .parse()
            .unwrap();
        let signed = Signed::of(&http::Method::GET, &uri).unwrap();
        assert_eq!(signed.path, "a.txt");
        assert!(signed.made_with("tok"));
        assert!(!signed.made_with("other"));
        assert!(signed.check_expiration().is_ok());
        let as_write = Signed::of(&http::Method::POST, &uri).unwrap();
        assert!(!as_write.made_with("tok"));
        let other_path: http::Uri = "/files?path=b.txt&username=user&signature=v1_sMVu5%2F9VdN7de9etei5GkbqRY9DqmvZn92V3WI%2FhF78&signature_expiration=4102444800"
            .parse()
            .unwrap();
        assert!(!Signed::of(&http::Method::GET, &other_path)
            .unwrap()
            .made_with("tok"));
        let expired = Signed {
            expiration: Some("1".into()),
            ..signed
        };
        assert_eq!(
            expired.check_expiration().unwrap_err().message,
            "signature is already expired"
        );
        let unsigned: http::Uri = "/files?path=a.txt".parse().unwrap();
        assert_eq!(Signed::of(&http::Method::GET, &unsigned), None);
    }

    #[test]
    fn the_sdks_routing_headers_name_the_sandbox_and_port() {
        let h = headers(&[("E2b-Sandbox-Id", "sb-1"), ("E2b-Sandbox-Port", "49983")]);
        assert_eq!(
            target_of(&h, None),
            Some(Target {
                sandbox: "sb-1".into(),
                port: ENVD_PORT,
                instance: "sb-1".into(),
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
                port: INTERPRETER_PORT,
                instance: "sb-2".into(),
            })
        );
        assert_eq!(target_of(&h, None), None);
        assert_eq!(target_of(&h, Some("other.test")), None);
        let api = headers(&[("host", "127.0.0.1:3000")]);
        assert_eq!(target_of(&api, Some("lockbox.test")), None);
    }
}
