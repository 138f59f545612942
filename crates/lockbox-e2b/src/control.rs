//! E2B's control plane (`spec/openapi.yml` of e2b-dev/E2B): create, list, info, kill,
//! timeout, connect, refresh, health here; pause, resume, fork and snapshots in
//! [`crate::lifecycle`]; logs and metrics in [`crate::observe`]; the network options, and
//! `PUT .../network` replacing a running sandbox's egress rules, in the `network` module.
//! Authenticated by `X-API-Key` (the server's token).
//!
//! Each E2B sandbox is a lockbox sandbox with the same id (until it is paused and resumed:
//! see [`crate::E2bSandbox::instance`]), created on the host's userland (template `base`),
//! on an image from lockbox's image store, or from a snapshot (any other template), and
//! deleted (or paused, with `autoPause`) when its end of life passes (a timer per sandbox).
//! Every E2B sandbox sees an empty workdir ([`workdir`]) through a copy-on-write branch:
//! lockbox snapshots (pause, fork, `create_snapshot`) are of a sandbox's branch, and keep
//! its `/tmp` (the E2B home, [`crate::HOME`]) beside it.

use crate::registry::E2bSandbox;
use crate::{E2b, E2bError, ENVD_VERSION};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lockbox_policy::Net;
use lockbox_runtime::{RuntimeError, SandboxSpec};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

/// The timeout of a sandbox created without one: the SDK's default, 300 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest timeout a sandbox may have (E2B's Pro tier: 24 hours).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The template of a sandbox on the host's userland (the SDK's default).
pub const BASE_TEMPLATE: &str = "base";
/// Templates that run on the host's userland: `base` and the code interpreter SDK's
/// default (`code-interpreter-v1`; the interpreter is lockbox's code contexts).
pub const HOST_TEMPLATES: &[&str] = &[BASE_TEMPLATE, "code-interpreter-v1"];
/// The most sandboxes one page of `GET /v2/sandboxes` holds (and its default).
pub const MAX_PAGE: usize = 100;

/// The control plane's routes, behind the API-key check.
pub fn router(e2b: E2b) -> Router {
    Router::new()
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", post(create).get(list_v2))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/pause", post(crate::lifecycle::pause))
        .route("/sandboxes/{id}/resume", post(crate::lifecycle::resume))
        .route("/sandboxes/{id}/fork", post(crate::lifecycle::fork))
        .route(
            "/sandboxes/{id}/snapshots",
            post(crate::lifecycle::snapshot),
        )
        .route("/snapshots", get(crate::lifecycle::list_snapshots))
        .route(
            "/templates/{id}",
            axum::routing::delete(crate::lifecycle::delete_snapshot),
        )
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(crate::network::update_network),
        )
        .route("/sandboxes/{id}/logs", get(crate::observe::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(crate::observe::logs_v2))
        .route("/sandboxes/{id}/metrics", get(crate::observe::metrics))
        .route("/sandboxes/metrics", get(crate::observe::metrics_of_many))
        .route("/lockbox/signed-url-sandbox", get(signed_url_sandbox))
        .route_layer(axum::middleware::from_fn_with_state(
            e2b.clone(),
            require_api_key,
        ))
        // E2B's health check is open, as E2B's is.
        .route("/health", get(health))
        .with_state(e2b)
}

/// Lets a request through only with the server's token as `X-API-Key` (or as a bearer
/// token, which E2B's API also takes); 401 in E2B's shape otherwise.
pub(crate) async fn require_api_key(State(e2b): State<E2b>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let key = headers
        .get("x-api-key")
        .map(HeaderValue::as_bytes)
        .or_else(|| {
            headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        });
    match key {
        Some(key) if e2b.api_key_matches(key) => next.run(req).await,
        Some(_) => E2bError::new(StatusCode::UNAUTHORIZED, "Invalid API key").into_response(),
        None => E2bError::new(
            StatusCode::UNAUTHORIZED,
            "Missing API key: send the lockbox server's token as X-API-Key (E2B_API_KEY)",
        )
        .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct SignedUrl {
    /// The signed request's method: `GET` (a download) or `POST` (an upload).
    method: String,
    /// The signed URL's path and query (`/files?path=...&signature=...`).
    url: String,
}

/// `GET /lockbox/signed-url-sandbox?method=GET&url=/files?...` (lockbox's, not E2B's): which
/// of this server's E2B sandboxes signed that file URL, `{"sandboxID"}`, or 404. A signed
/// URL made for `E2B_SANDBOX_URL` names no sandbox (one server finds it by the signature),
/// so a fleet's router asks each node before it forwards one. Only whether the signature
/// is a sandbox's is answered: its expiration and path are checked by the sandbox plane
/// when the URL itself is used.
async fn signed_url_sandbox(
    State(e2b): State<E2b>,
    Query(q): Query<SignedUrl>,
) -> Result<Json<Value>, E2bError> {
    let method = http::Method::from_bytes(q.method.as_bytes())
        .map_err(|_| bad(format!("method: {:?} is not an HTTP method", q.method)))?;
    let uri: http::Uri = q
        .url
        .parse()
        .map_err(|e| bad(format!("url: {:?}: {e}", q.url)))?;
    match crate::signed_url_sandbox(&e2b, &method, &uri) {
        Some(id) => Ok(Json(json!({"sandboxID": id}))),
        None => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            "no sandbox of this server signed that URL",
        )),
    }
}

async fn health() -> Response {
    (
        StatusCode::OK,
        Json(json!({"message": "Health check successful"})),
    )
        .into_response()
}

/// A JSON body, with a 400 in E2B's shape (naming what is wrong) instead of axum's text.
pub(crate) struct Body<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = E2bError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text)
            .map(Body)
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("request body: {e}")))
    }
}

/// `POST /sandboxes` and `POST /v2/sandboxes` (E2B's `NewSandbox` / `NewSandboxV2`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<HashMap<String, String>>,
    /// Ignored: every sandbox's envd access is secured (as the SDK assumes).
    #[allow(dead_code)]
    secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<crate::network::NetworkConfig>,
    mcp: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
    iam: Option<Value>,
    auto_resume: Option<Value>,
}

pub(crate) fn bad(message: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, message)
}

/// A fresh access token: 32 random bytes, hex.
pub(crate) fn access_token() -> Result<String, E2bError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        E2bError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no randomness for the sandbox's access token: {e}"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A timeout in seconds from a request: positive, at most [`MAX_TIMEOUT`]; [`DEFAULT_TIMEOUT`]
/// when not given.
pub(crate) fn timeout_of(field: &str, seconds: Option<i64>) -> Result<Duration, E2bError> {
    timeout_or(field, seconds, DEFAULT_TIMEOUT)
}

/// [`timeout_of`] with another default.
pub(crate) fn timeout_or(
    field: &str,
    seconds: Option<i64>,
    default: Duration,
) -> Result<Duration, E2bError> {
    match seconds {
        None => Ok(default),
        Some(s) if s < 0 => Err(bad(format!("{field}: must not be negative, got {s}"))),
        Some(s) => {
            let d = Duration::from_secs(s.unsigned_abs());
            if d > MAX_TIMEOUT {
                return Err(bad(format!(
                    "{field}: at most {} seconds, got {s}",
                    MAX_TIMEOUT.as_secs()
                )));
            }
            Ok(d)
        }
    }
}

/// A runtime error as E2B's API would answer it.
pub(crate) fn runtime_error(e: &RuntimeError) -> E2bError {
    use lockbox_policy::ErrorCode as C;
    let status = match e.code() {
        C::SandboxNotFound | C::NotFound | C::FileNotFound => StatusCode::NOT_FOUND,
        C::LimitReached => StatusCode::TOO_MANY_REQUESTS,
        C::SetupFailed | C::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        C::PathOutsideSandbox | C::ReadOnly | C::PermissionDenied => StatusCode::FORBIDDEN,
        C::SandboxNotRunning | C::SnapshotNotFound => StatusCode::NOT_FOUND,
        C::SnapshotInUse => StatusCode::CONFLICT,
        _ => StatusCode::BAD_REQUEST,
    };
    E2bError::new(status, e.to_string())
}

pub(crate) fn not_found(id: &str) -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        format!("sandbox \"{id}\" was not found"),
    )
}

pub(crate) fn time(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    lockbox_policy::time::rfc3339(
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        since.subsec_nanos(),
    )
}

/// What E2B reports as the sandbox's resources: lockbox does not reserve CPUs or memory
/// per sandbox, so these are the host's CPUs, the sandbox's memory limit (0: none) and 0.
pub(crate) fn resources(e2b: &E2b, id: &str) -> (u64, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let memory = e2b
        .runtime
        .sandbox_info(id)
        .ok()
        .and_then(|i| i.policy)
        .and_then(|p| p.max_memory_bytes)
        .map_or(0, |b| b >> 20);
    (cpus, memory)
}

/// E2B's `Sandbox` (the answer to create and connect).
pub(crate) fn created(id: &str, s: &E2bSandbox) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": id,
        "clientID": crate::CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.access_token,
        // The SDK sends it to the code interpreter's port, where it sends no envd token
        // (contexts); one token serves both.
        "trafficAccessToken": s.access_token,
        "domain": Value::Null,
    })
}

/// E2B's `ListedSandbox`, plus `SandboxDetail`'s fields.
fn listed(e2b: &E2b, id: &str, s: &E2bSandbox) -> Value {
    let (cpus, memory) = resources(e2b, s.instance_id(id));
    json!({
        "templateID": s.template,
        "sandboxID": id,
        "clientID": crate::CLIENT_ID,
        "startedAt": time(s.started_at),
        "endAt": time(s.end_at),
        "cpuCount": cpus,
        "memoryMB": memory,
        "diskSizeMB": 0,
        "state": if s.paused.is_some() { "paused" } else { "running" },
        "envdVersion": ENVD_VERSION,
        "metadata": s.metadata,
    })
}

/// The directory behind every E2B sandbox's workdir, through a branch of its own:
/// `STATE/e2b-workdir`, empty and never written (the sandboxes' branches are discarded
/// when they end). It is what lets lockbox snapshot an E2B sandbox (a snapshot is of a
/// branch, with the sandbox's `/tmp` beside it). A sandbox on the host's userland sees it
/// as `/home/user`, one on an image at this path.
pub fn workdir(e2b: &E2b) -> Result<std::path::PathBuf, E2bError> {
    let dir = e2b.runtime.state_dir().join("e2b-workdir");
    std::fs::create_dir_all(&dir).map_err(|e| {
        E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("creating E2B's workdir {}: {e}", dir.display()),
        )
    })?;
    Ok(dir)
}

/// The lockbox snapshot `template` names, if it names one: the id or name of a snapshot
/// taken through E2B (the newest of a name), or the id of any lockbox snapshot.
fn snapshot_template(e2b: &E2b, template: &str) -> Option<String> {
    let taken = e2b.registry.snapshots();
    if let Some(s) = taken
        .iter()
        .rev()
        .find(|s| s.id == template || s.name.as_deref() == Some(template))
    {
        return Some(s.id.clone());
    }
    e2b.runtime
        .snapshot_info(template)
        .ok()
        .map(|i| i.id.as_str().to_owned())
}

async fn create(State(e2b): State<E2b>, Body(req): Body<NewSandbox>) -> Result<Response, E2bError> {
    let auto_resume = req
        .auto_resume
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.get("enabled") != Some(&Value::Bool(false)));
    for (field, given) in [
        ("mcp", req.mcp.as_ref().is_some_and(|v| !v.is_null())),
        (
            "volumeMounts",
            req.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        ("iam", req.iam.as_ref().is_some_and(|v| !v.is_null())),
        ("autoResume", auto_resume),
    ] {
        if given {
            return Err(bad(format!(
                "{field}: not supported by lockbox's E2B API (see docs/e2b.md)"
            )));
        }
    }
    if req.auto_pause_memory == Some(true) {
        return Err(bad(
            "autoPauseMemory: lockbox pauses keep a sandbox's files, not its memory (its processes end); leave it out or set mode \"filesystem\"",
        ));
    }
    let timeout = timeout_of("timeout", req.timeout)?;
    let template = req
        .template_id
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| BASE_TEMPLATE.to_owned());
    let env = req.env_vars.unwrap_or_default();
    let token = access_token()?;
    let (info, internet) = match snapshot_template(&e2b, &template) {
        Some(snapshot) => {
            // A fork of the snapshot, with the policy (network, environment) of the
            // sandbox it was taken of.
            for (field, given) in [
                ("envVars", !env.is_empty()),
                ("network", req.network.is_some()),
                ("allow_internet_access", req.allow_internet_access.is_some()),
            ] {
                if given {
                    return Err(bad(format!(
                        "{field}: a sandbox created from snapshot {template:?} has the snapshot's sandbox's settings; leave {field} out"
                    )));
                }
            }
            let made = e2b
                .runtime
                .fork_snapshot(&snapshot, 1)
                .await
                .map_err(|e| runtime_error(&e))?;
            let info = made
                .into_iter()
                .next()
                .ok_or_else(|| bad("the snapshot's fork was not made"))?;
            let internet = info
                .policy
                .as_ref()
                .is_none_or(|p| !matches!(p.net, lockbox_runtime::NetKind::None));
            (info, internet)
        }
        None => {
            let net = crate::network::network_policy(
                req.allow_internet_access,
                req.network.as_ref(),
                "network.",
            )?;
            let internet = !matches!(net, Net::None);
            let mut spec = SandboxSpec::default();
            if let Some(base) = &e2b.base_policy {
                spec.policy = (**base).clone();
            }
            spec.policy.net = net;
            spec.policy
                .env
                .set
                .extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
            spec.workdir = Some(workdir(&e2b)?);
            if HOST_TEMPLATES.contains(&template.as_str()) {
                // The host's userland has no `/home/user`: the sandbox's workdir is its home,
                // where E2B's is, and a pause or a snapshot keeps it.
                let home = crate::envd::User::User.home();
                spec.workdir_at = Some(home.into());
                spec.policy.cwd = Some(home.into());
            } else {
                spec.policy.image = Some(template.clone());
                spec.policy.cwd = Some(crate::HOME.into());
            }
            spec.on_exit = lockbox_runtime::OnExit::Abort;
            spec.labels.insert("e2b.template".into(), template.clone());
            let info = e2b.runtime.create_sandbox(spec).await.map_err(|e| {
                if matches!(e, RuntimeError::Image(_)) {
                    E2bError::new(
                        StatusCode::NOT_FOUND,
                        format!("template \"{template}\" was not found: {e}"),
                    )
                } else {
                    runtime_error(&e)
                }
            })?;
            // The template's start and ready commands, if it has them (else nothing).
            crate::template_start::start(&e2b, &template, info.id.as_str(), timeout).await?;
            (info, internet)
        }
    };
    let id = info.id.as_str().to_owned();
    let now = SystemTime::now();
    let sandbox = E2bSandbox {
        template,
        metadata: req.metadata.unwrap_or_default(),
        access_token: Some(token),
        env,
        started_at: now,
        end_at: now + timeout,
        internet,
        auto_pause: req.auto_pause == Some(true),
        ..E2bSandbox::default()
    };
    sandbox.log(format!("created from template {:?}", sandbox.template));
    e2b.registry.insert(&id, sandbox.clone());
    tokio::spawn(expire(e2b.clone(), id.clone(), 0));
    Ok((StatusCode::CREATED, Json(created(&id, &sandbox))).into_response())
}

/// Ends sandbox `id` when its end of life passes (re-read after each wait, so a changed
/// timeout moves it): deletes it, or pauses it if it was created with `autoPause`. Stops
/// when the sandbox is killed or paused first, or resumed (`generation`: the resume
/// starts a timer of its own).
pub(crate) async fn expire(e2b: E2b, id: String, generation: u64) {
    loop {
        let Some(sandbox) = e2b.registry.get(&id) else {
            return;
        };
        if sandbox.paused.is_some() || sandbox.generation != generation {
            return;
        }
        match sandbox.end_at.duration_since(SystemTime::now()) {
            Ok(left) if !left.is_zero() => {
                tokio::select! {
                    () = tokio::time::sleep(left) => {}
                    () = sandbox.end_changed.notified() => {}
                }
            }
            _ => break,
        }
    }
    let Some(sandbox) = e2b.registry.get(&id) else {
        return;
    };
    if sandbox.auto_pause {
        match crate::lifecycle::pause_now(&e2b, &id, Some(generation)).await {
            Ok(_) => return,
            // Not paused (it could not be snapshotted): it ends as E2B's kill would.
            Err(e) => tracing::warn!(sandbox = %id, "auto-pausing an E2B sandbox: {}", e.message),
        }
    }
    let _ = remove(&e2b, &id, Some(generation)).await;
}

/// Kills E2B sandbox `id`: forgets it, deletes the lockbox sandbox serving it (unless it is
/// paused) and the snapshots made for it (those still in use stay: a fork's source is
/// deleted with the last sandbox that lies on it). With `generation`, only if it is still
/// that one (an expiry that a resume overtook does nothing). `None` if E2B does not know it.
pub(crate) async fn remove(
    e2b: &E2b,
    id: &str,
    generation: Option<u64>,
) -> Option<Result<(), RuntimeError>> {
    let lifecycle = e2b.registry.get(id)?.lifecycle;
    let _held = lifecycle.lock().await;
    let current = e2b.registry.get(id)?;
    if generation.is_some_and(|g| g != current.generation || current.paused.is_some()) {
        return None;
    }
    let sandbox = e2b.registry.remove(id)?;
    e2b.unpersist(id);
    let deleted = match sandbox.paused {
        Some(_) => Ok(()),
        None => e2b
            .runtime
            .delete_sandbox(sandbox.instance_id(id))
            .await
            .map(drop),
    };
    for snapshot in sandbox.owned_snapshots.iter().rev() {
        if let Err(e) = e2b.runtime.delete_snapshot(snapshot).await {
            tracing::debug!(sandbox = %id, %snapshot, "not deleting a snapshot of an E2B sandbox: {e}");
        }
    }
    Some(deleted)
}

/// The sandbox `id` if E2B knows it and it is paused or still runs.
pub(crate) fn known(e2b: &E2b, id: &str) -> Result<E2bSandbox, E2bError> {
    let sandbox = e2b.registry.get(id).ok_or_else(|| not_found(id))?;
    if sandbox.paused.is_some() {
        return Ok(sandbox);
    }
    match e2b.runtime.sandbox_info(sandbox.instance_id(id)) {
        Ok(info) if info.state == lockbox_runtime::SandboxState::Running => Ok(sandbox),
        _ => {
            // Deleted under E2B (through lockbox's own API, or its init died).
            e2b.registry.remove(id);
            Err(not_found(id))
        }
    }
}

async fn info(State(e2b): State<E2b>, Path(id): Path<String>) -> Result<Json<Value>, E2bError> {
    let sandbox = known(&e2b, &id)?;
    let mut detail = listed(&e2b, &id, &sandbox);
    detail["envdAccessToken"] = json!(sandbox.access_token);
    detail["trafficAccessToken"] = json!(sandbox.access_token);
    detail["domain"] = Value::Null;
    detail["allowInternetAccess"] = json!(sandbox.internet);
    detail["lifecycle"] = json!({
        "onTimeout": if sandbox.auto_pause { "pause" } else { "kill" },
        "autoResume": false,
    });
    Ok(Json(detail))
}

async fn kill(State(e2b): State<E2b>, Path(id): Path<String>) -> Result<StatusCode, E2bError> {
    match remove(&e2b, &id, None).await {
        None | Some(Err(RuntimeError::SandboxNotFound { .. })) => Err(not_found(&id)),
        Some(Ok(())) => Ok(StatusCode::NO_CONTENT),
        Some(Err(e)) => Err(runtime_error(&e)),
    }
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: Option<i64>,
}

async fn set_timeout(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<TimeoutBody>,
) -> Result<StatusCode, E2bError> {
    let Some(seconds) = body.timeout else {
        return Err(bad("timeout: required (seconds)"));
    };
    let timeout = timeout_of("timeout", Some(seconds))?;
    known(&e2b, &id)?;
    e2b.registry
        .set_end(&id, |_| SystemTime::now() + timeout)
        .ok_or_else(|| not_found(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct ConnectBody {
    timeout: Option<i64>,
    /// `false` (the SDK's `on_resume="reboot"`) is what every lockbox resume does; `true`
    /// or none (restore memory, E2B's default) resumes the same way: see docs/e2b.md.
    #[allow(dead_code)]
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/connect`: the sandbox, its end of life moved to at least
/// `timeout` from now (never earlier); a paused sandbox is resumed first (201).
async fn connect(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<ConnectBody>,
) -> Result<Response, E2bError> {
    let timeout = timeout_of("timeout", body.timeout)?;
    if known(&e2b, &id)?.paused.is_some() {
        match crate::lifecycle::resume_now(&e2b, &id, timeout).await {
            Ok(sandbox) => {
                return Ok((StatusCode::CREATED, Json(created(&id, &sandbox))).into_response())
            }
            // Resumed meanwhile by another call: connect to it as it runs.
            Err(e) if e.status == StatusCode::CONFLICT => {}
            Err(e) => return Err(e),
        }
    }
    let sandbox = e2b
        .registry
        .set_end(&id, |end| end.max(SystemTime::now() + timeout))
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(created(&id, &sandbox)).into_response())
}

#[derive(Debug, Deserialize)]
struct RefreshBody {
    duration: Option<i64>,
}

/// `POST /sandboxes/{id}/refreshes`: keeps the sandbox alive `duration` seconds more from
/// now (never shortening it).
async fn refresh(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<RefreshBody>,
) -> Result<StatusCode, E2bError> {
    let duration = timeout_of("duration", body.duration)?;
    known(&e2b, &id)?;
    e2b.registry
        .set_end(&id, |end| end.max(SystemTime::now() + duration))
        .ok_or_else(|| not_found(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
    order: Option<String>,
    template: Option<String>,
    #[serde(rename = "startedAfter")]
    started_after: Option<String>,
}

/// Decodes `%XX` escapes (the SDK quotes each metadata key and value before encoding the
/// whole filter).
fn unquote(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The metadata filter `k=v&k2=v2` (each key and value quoted) as pairs.
fn metadata_filter(text: Option<&str>) -> Vec<(String, String)> {
    text.map(|t| {
        form_urlencoded::parse(t.as_bytes())
            .map(|(k, v)| (unquote(&k), unquote(&v)))
            .collect()
    })
    .unwrap_or_default()
}

/// An RFC 3339 time with `Z` or a numeric offset: the SDK sends Python's
/// `datetime.isoformat()`, `2026-12-02T12:14:53.802000+00:00` (`t` and `z` in lower case
/// too, as RFC 3339 allows). A space where the `+` was is
/// read as `+`, for clients that leave `+` unescaped in the query string.
fn parse_time(text: &str) -> Option<std::time::SystemTime> {
    let split = text.len().checked_sub(6)?;
    let (local, offset) = (text.get(..split)?, text.get(split..)?.as_bytes());
    let ahead_of_utc = match offset.first() {
        Some(b'+' | b' ') => true,
        Some(b'-') => false,
        _ => return lockbox_policy::time::parse(&text.to_ascii_uppercase()),
    };
    let digits = |a: u8, b: u8| -> Option<u64> {
        (a.is_ascii_digit() && b.is_ascii_digit()).then(|| u64::from((a - b'0') * 10 + (b - b'0')))
    };
    if offset.get(3) != Some(&b':') {
        return None;
    }
    let (hours, minutes) = (digits(offset[1], offset[2])?, digits(offset[4], offset[5])?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    let at = lockbox_policy::time::parse(&format!("{}Z", local.to_ascii_uppercase()))?;
    let shift = std::time::Duration::from_secs(hours * 3600 + minutes * 60);
    // Local time minus a positive offset is UTC.
    if ahead_of_utc {
        at.checked_sub(shift)
    } else {
        at.checked_add(shift)
    }
}

/// The sandboxes matching `query`'s filters, with their ids, newest first (or oldest
/// first with `order=asc`).
fn matching(e2b: &E2b, query: &ListQuery) -> Result<Vec<(String, E2bSandbox)>, E2bError> {
    // No state filter: running and paused ones, as E2B lists.
    let (mut running, mut paused) = (query.state.is_none(), query.state.is_none());
    if let Some(states) = &query.state {
        for state in states.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match state {
                "running" => running = true,
                "paused" => paused = true,
                _ => {
                    return Err(bad(format!(
                        "state: {state:?} is not a sandbox state (running, paused)"
                    )))
                }
            }
        }
    }
    let filter = metadata_filter(query.metadata.as_deref());
    let after = match query.started_after.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(text) => Some(
            parse_time(text)
                .ok_or_else(|| bad(format!("startedAfter: {text:?} is not an RFC 3339 time")))?,
        ),
    };
    let template = query.template.as_deref().filter(|t| !t.is_empty());
    let mut all: Vec<_> = e2b
        .registry
        .all()
        .into_iter()
        .filter(|(_, s)| filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .filter(|(_, s)| after.is_none_or(|a| s.started_at >= a))
        .filter(|(_, s)| template.is_none_or(|t| s.template == t))
        .filter(|(id, s)| match s.paused {
            Some(_) => paused,
            None => {
                running
                    && e2b
                        .runtime
                        .sandbox_info(s.instance_id(id))
                        .is_ok_and(|i| i.state == lockbox_runtime::SandboxState::Running)
            }
        })
        .collect();
    all.sort_by(|(a_id, a), (b_id, b)| (a.started_at, a_id).cmp(&(b.started_at, b_id)));
    match query.order.as_deref() {
        None | Some("") | Some("desc") => all.reverse(),
        Some("asc") => {}
        Some(other) => return Err(bad(format!("order: \"asc\" or \"desc\", got {other:?}"))),
    }
    Ok(all)
}

/// `GET /sandboxes` (deprecated by E2B): the running sandboxes (E2B's v1 lists no paused
/// ones), `metadata` filter.
async fn list_v1(
    State(e2b): State<E2b>,
    Query(mut query): Query<ListQuery>,
) -> Result<Json<Value>, E2bError> {
    query.state = Some("running".to_owned());
    let all = matching(&e2b, &query)?;
    Ok(Json(Value::Array(
        all.iter().map(|(id, s)| listed(&e2b, id, s)).collect(),
    )))
}

/// The paging key of a sandbox: its start (nanoseconds) and id.
fn page_key(id: &str, s: &E2bSandbox) -> String {
    let nanos = s
        .started_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{nanos:032}.{id}")
}

async fn list_v2(
    State(e2b): State<E2b>,
    Query(query): Query<ListQuery>,
) -> Result<Response, E2bError> {
    let limit = match query.limit.as_deref() {
        None | Some("") => MAX_PAGE,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(bad(format!(
                    "limit: a number from 1 to {MAX_PAGE}, got {text:?}"
                )))
            }
        },
    };
    let all = matching(&e2b, &query)?;
    let after = query.next_token.as_deref().filter(|t| !t.is_empty());
    let ascending = query.order.as_deref() == Some("asc");
    let rest: Vec<_> = all
        .iter()
        .filter(|(id, s)| {
            after.is_none_or(|a| {
                let key = page_key(id, s);
                if ascending {
                    key.as_str() > a
                } else {
                    key.as_str() < a
                }
            })
        })
        .collect();
    let page = &rest[..rest.len().min(limit)];
    let mut headers = HeaderMap::new();
    if rest.len() > limit {
        if let Some((id, s)) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&page_key(id, s)) {
                headers.insert("x-next-token", v);
            }
        }
    }
    let body = Value::Array(page.iter().map(|(id, s)| listed(&e2b, id, s)).collect());
    Ok((headers, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_doubly_quoted_metadata_filter_reads_back_as_given() {
        // What `SandboxQuery(metadata={"a b": "x=y", "k": "v"})` becomes after the outer
        // query string is decoded.
        let pairs = metadata_filter(Some("a%2520b=x%253Dy&k=v"));
        assert_eq!(
            pairs,
            vec![("a b".into(), "x=y".into()), ("k".into(), "v".into())]
        );
    }

    #[test]
    fn started_after_takes_utc_and_numeric_offsets() {
        let utc = parse_time("2026-12-02T12:14:53.802Z");
        assert!(utc.is_some());
        assert_eq!(parse_time("2026-12-02T12:14:53.802000+00:00"), utc);
        assert_eq!(parse_time("2026-12-02T12:14:53.802000 00:00"), utc);
        assert_eq!(parse_time("2026-12-02T14:14:53.802+02:00"), utc);
        assert_eq!(parse_time("2026-12-02T10:44:53.802-01:30"), utc);
        assert_eq!(parse_time("2026-12-02t12:14:53.802z"), utc);
        for bad in [
            "",
            "2026-12-02",
            "2026-12-02T12:14:53+0000",
            "2026-12-02T12:14:53+24:00",
        ] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
    }
}
