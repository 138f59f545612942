//! Exposed ports: expose, list, unexpose, and the proxy that carries HTTP requests and
//! WebSocket upgrades to the server listening on the port inside the sandbox.
//!
//! A sandbox's pages are never served on the API's origin, which is the console's: browsers
//! keep cookies per host *name*, whatever the port, so one `Set-Cookie` let through there
//! lands in the console's cookie jar (issue 32: a page set 80 KB of year-long cookies and
//! every route answered 431 `Request Header Fields Too Large` from then on). Two ways in:
//!
//! - **Each port's own origin** on the ports listener (`lockbox serve --ports-listen`): the
//!   host name `{port}-{sandbox}.{domain}` (`8000-sb-1a2b3c4d5e6f.localhost`) says which
//!   port, so what a page sets stays on its host. Access takes the bearer token, or the
//!   port's access cookie ([`PORT_COOKIE`], host-only, HttpOnly) that the port's `open_url`
//!   (`/__lockbox/open?key=...`, the key an HMAC of sandbox and port under a secret made at
//!   start) sets. A sandbox's `Set-Cookie` lose their `Domain` attribute (host-only).
//! - **The API's proxy** `/v1/sandboxes/{id}/ports/{port}/...` for programs with the bearer
//!   token: no `Set-Cookie` passes (a client's cookie jar is per host too), and the page would
//!   run in an opaque origin (`Content-Security-Policy: sandbox`). A browser (the console's
//!   cookie) is sent to the port's own origin instead (303), never served a page here.
//!
//! Each proxied request gets a fresh connection into the sandbox (`connect_port`) and an
//! HTTP/1.1 client connection on it. The request goes on as it came, but for what belongs
//! to lockbox: the `Authorization` header, lockbox's own cookies and the CSRF header are
//! removed (the sandboxed server never sees a credential of lockbox's), and `Host` becomes
//! `localhost:PORT`. `Clear-Site-Data` never comes back (it acts on a whole site).

use crate::auth;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::sessions::{self, CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE};
use crate::wire::{ExposePort, PortInfo};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_SECURITY_POLICY, COOKIE, HOST, LOCATION, REFERRER_POLICY,
    SET_COOKIE,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hmac::{Hmac, KeyInit, Mac};
use hyper_util::rt::TokioIo;
use lockbox_policy::ErrorCode;
use lockbox_runtime::{check_port, ExposeOptions, Sandbox};
use serde_json::json;
use sha2::Sha256;
use std::fmt;
use subtle::ConstantTimeEq;

/// Sent with every response of the API's proxy: scripts, forms and popups work, but the
/// page is in an opaque origin (no `allow-same-origin`), away from the console's cookies
/// and API.
const SANDBOX_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// The access cookie of a port on its own origin: its key (HttpOnly, host-only, never
/// forwarded to the sandbox, never settable by it).
pub const PORT_COOKIE: &str = "lockbox_port";

/// The path of a port's origin that trades the port's key for [`PORT_COOKIE`] (the
/// sandboxed server never sees a request for it).
pub const OPEN_PATH: &str = "/__lockbox/open";

/// `Clear-Site-Data` clears a whole site's cookies and storage (the console's too, where
/// they share a site): a sandboxed server never sends it through lockbox.
const CLEAR_SITE_DATA: HeaderName = HeaderName::from_static("clear-site-data");

/// Where the ports listener is reached (its domain and port, for the URLs in replies) and
/// the secret the ports' keys are derived from (made at start: a restart invalidates them,
/// as it ends the console's sessions).
pub(crate) struct PortsOrigin {
    domain: String,
    port: u16,
    secret: [u8; 32],
}

impl fmt::Debug for PortsOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PortsOrigin({}:{}, ..)", self.domain, self.port)
    }
}

/// Checks a `--ports-domain`: a DNS name (letters, digits, `-`, dots between labels) under
/// which `{port}-{sandbox}.DOMAIN` names each port. Returned lowercased.
pub fn check_ports_domain(domain: &str) -> Result<String, String> {
    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if domain.is_empty() || domain.len() > 200 || !domain.split('.').all(label_ok) {
        return Err(format!(
            "{domain:?} is not a DNS name (letters, digits and '-', labels separated by dots)"
        ));
    }
    Ok(domain)
}

impl PortsOrigin {
    /// The ports listener on `port`, its host names under `domain` (checked by
    /// [`check_ports_domain`]), with a fresh secret.
    pub(crate) fn new(domain: String, port: u16) -> std::io::Result<PortsOrigin> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(std::io::Error::other)?;
        Ok(PortsOrigin {
            domain,
            port,
            secret,
        })
    }

    /// `http://{port}-{id}.{domain}:{listener port}`.
    fn origin(&self, id: &str, port: u16) -> String {
        format!("http://{port}-{id}.{}:{}", self.domain, self.port)
    }

    /// The port's key: HMAC-SHA256 of `{id}:{port}` under the secret, hex.
    fn key(&self, id: &str, port: u16) -> String {
        // A 32-byte key is always accepted by HMAC; the fallback only satisfies the types.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.secret) else {
            return String::new();
        };
        mac.update(format!("{id}:{port}").as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn key_matches(&self, id: &str, port: u16, candidate: &str) -> bool {
        let key = self.key(id, port);
        !key.is_empty() && bool::from(key.as_bytes().ct_eq(candidate.as_bytes()))
    }

    fn open_url(&self, id: &str, port: u16) -> String {
        format!(
            "{}{OPEN_PATH}?key={}",
            self.origin(id, port),
            self.key(id, port)
        )
    }

    /// The sandbox and port a request to the ports listener is for: its `Host` is
    /// `{port}-{sandbox}.{domain}[:PORT]`.
    fn target(&self, headers: &HeaderMap) -> Result<(String, u16), ApiError> {
        let host = headers
            .get(HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let name = match host.rsplit_once(':') {
            Some((name, p)) if p.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
        .to_ascii_lowercase();
        let label = name
            .strip_suffix(self.domain.as_str())
            .and_then(|n| n.strip_suffix('.'))
            .filter(|l| !l.contains('.'));
        let found = label
            .and_then(|l| l.split_once('-'))
            .and_then(|(port, id)| {
                let port = port.parse::<u32>().ok().and_then(|p| check_port(p).ok())?;
                (!id.is_empty()).then(|| (id.to_owned(), port))
            });
        found.ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "host {host:?} names no port: each exposed port is served at \
                     {{port}}-{{sandbox}}.{}:{}",
                    self.domain, self.port
                ),
            )
            .with_details(json!({ "host": host }))
        })
    }

    /// `GET /__lockbox/open?key=K[&to=/path]`: the access cookie, then `to` (default `/`).
    fn open(&self, id: &str, port: u16, query: Option<&str>) -> Result<Response, ApiError> {
        let mut key = None;
        let mut to = String::from("/");
        for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*name {
                "key" => key = Some(value.into_owned()),
                "to" => to = value.into_owned(),
                _ => {}
            }
        }
        let Some(key) = key.filter(|k| self.key_matches(id, port, k)) else {
            return Ok(auth::unauthorized(
                "wrong or missing key: take the port's open_url from GET /v1/sandboxes/{id}/ports",
            ));
        };
        // A path of this origin only: `//host` and `/\host` would leave it.
        if !to.starts_with('/') || to.starts_with("//") || to.starts_with("/\\") {
            return Err(ApiError::invalid(
                "to",
                format!("{to:?} is not a path of this origin (it must start with one '/')"),
            ));
        }
        let location = HeaderValue::from_str(&to)
            .map_err(|_| ApiError::invalid("to", format!("{to:?} is not a request path")))?;
        let cookie = HeaderValue::from_str(&format!(
            "{PORT_COOKIE}={key}; HttpOnly; SameSite=Lax; Path=/"
        ))
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        Ok(see_other(location, Some(cookie)))
    }
}

/// 303 to `location`, not cached, no `Referer` (the URL that led here holds a key).
fn see_other(location: HeaderValue, cookie: Option<HeaderValue>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    headers.insert(LOCATION, location);
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if let Some(cookie) = cookie {
        headers.insert(SET_COOKIE, cookie);
    }
    response
}

/// The reply for a port: the runtime's, and its own origin when there is a ports listener.
fn port_info(app: &AppState, id: &str, p: lockbox_runtime::PortInfo) -> PortInfo {
    let (origin, open_url) = match &app.ports {
        Some(o) => (Some(o.origin(id, p.port)), Some(o.open_url(id, p.port))),
        None => (None, None),
    };
    PortInfo {
        port: p.port,
        path: p.path,
        host_address: p.host_address,
        origin,
        open_url,
    }
}

fn port_of(text: &str) -> Result<u16, ApiError> {
    let port = text
        .parse::<u32>()
        .map_err(|_| ApiError::invalid("port", format!("{text:?} is not a TCP port (1-65535)")))?;
    Ok(check_port(port)?)
}

#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/ports",
    operation_id = "expose_port",
    summary = "Expose a port of the sandbox (through the proxy below; with host_loopback also on a host 127.0.0.1 port)",
    params(crate::openapi::SandboxPath),
    request_body = crate::wire::ExposePort,
    responses((status = 201, description = "exposed", body = crate::wire::PortInfo))
)]
pub async fn expose(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ExposePort>,
) -> Result<impl IntoResponse, ApiError> {
    let port = check_port(body.port)?;
    let sandbox = app.runtime.sandbox(&id)?;
    let opts = ExposeOptions {
        host_loopback: body.host_loopback,
    };
    let info = sandbox.expose_port(port, opts).await?;
    Ok((StatusCode::CREATED, Json(port_info(&app, &id, info))))
}

#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports",
    operation_id = "list_ports",
    summary = "List exposed ports",
    params(crate::openapi::SandboxPath),
    responses((status = 200, description = "the ports", body = crate::wire::PortList))
)]
pub async fn list(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<impl IntoResponse, ApiError> {
    let sandbox = app.runtime.sandbox(&id)?;
    Ok(Json(crate::wire::PortList {
        ports: sandbox
            .ports()
            .into_iter()
            .map(|p| port_info(&app, &id, p))
            .collect(),
    }))
}

#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/ports/{port}",
    operation_id = "unexpose_port",
    summary = "Stop exposing a port (its host listener closes)",
    params(crate::openapi::PortPath),
    responses((status = 204, description = "done"))
)]
pub async fn unexpose(
    State(app): State<AppState>,
    ApiPath((id, port)): ApiPath<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let port = port_of(&port)?;
    let sandbox = app.runtime.sandbox(&id)?;
    sandbox.unexpose_port(port)?;
    Ok(StatusCode::NO_CONTENT)
}

const PROXY_DESCRIPTION: &str = "For programs with the bearer token: Authorization, lockbox's \
    cookies and X-CSRF-Token are removed, Host becomes localhost:PORT; no Set-Cookie or \
    Clear-Site-Data comes back, and the page would run in an opaque origin (CSP sandbox). A \
    request with the console's cookie (a browser) is answered 303 to the port's own origin \
    (its open_url), or 403 FORBIDDEN when the server has no ports listener: a sandbox's page \
    is never served on the console's origin.";

/// `ANY /v1/sandboxes/{id}/ports/{port}/`: the server's root.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports/{port}/",
    operation_id = "proxy_root",
    summary = "Proxy (prefix, any method) to the server on the exposed port: the root path",
    description = PROXY_DESCRIPTION,
    params(crate::openapi::PortPath),
    responses((status = "default", description = "the sandboxed server's reply, as it sent it but for Set-Cookie and Clear-Site-Data (502 PORT_NOT_LISTENING when nothing listens; WebSocket upgrades are carried through)", content(("*/*"))))
)]
pub async fn proxy_root(
    State(app): State<AppState>,
    ApiPath((id, port)): ApiPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    api_proxy(app, &id, &port, "", req).await
}

/// `ANY /v1/sandboxes/{id}/ports/{port}/{*path}`.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports/{port}/{path}",
    operation_id = "proxy_path",
    summary = "Proxy (prefix, any method, any path below) to the server on the exposed port",
    description = PROXY_DESCRIPTION,
    params(crate::openapi::ProxyPath),
    responses((status = "default", description = "the sandboxed server's reply, as it sent it but for Set-Cookie and Clear-Site-Data (502 PORT_NOT_LISTENING when nothing listens; WebSocket upgrades are carried through)", content(("*/*"))))
)]
pub async fn proxy_path(
    State(app): State<AppState>,
    ApiPath((id, port, path)): ApiPath<(String, String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    api_proxy(app, &id, &port, &path, req).await
}

/// Where a proxied reply goes: what of it is let through differs.
#[derive(Debug, Clone, Copy)]
enum Served {
    /// The API's origin (the console's): no cookie, an opaque origin.
    OnApi,
    /// The port's own origin: host-only cookies.
    OnOwnOrigin,
}

async fn api_proxy(
    app: AppState,
    id: &str,
    port: &str,
    path: &str,
    req: Request,
) -> Result<Response, ApiError> {
    let port = port_of(port)?;
    // The path as the client sent it (percent-encoding kept), under the proxy's prefix.
    let target = match req.uri().query() {
        Some(q) => format!("/{path}?{q}"),
        None => format!("/{path}"),
    };
    // The auth middleware let it in: without a bearer token, by the console's cookie, so
    // from a browser, which must not get a sandbox's page on this origin.
    if auth::bearer(req.headers()).is_none() {
        app.runtime.sandbox(id)?;
        let Some(origin) = &app.ports else {
            return Err(sessions::forbidden(
                "a sandbox's pages are not served on the console's origin, and this server \
                 has no ports listener (lockbox serve --ports-listen)",
            ));
        };
        let to: String = form_urlencoded::byte_serialize(target.as_bytes()).collect();
        let location = HeaderValue::from_str(&format!("{}&to={to}", origin.open_url(id, port)))
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
        return Ok(see_other(location, None));
    }
    proxy(app, id, port, &target, req, Served::OnApi).await
}

/// Every request to the ports listener: the port its `Host` names, if the request may
/// reach it (the bearer token, or the port's cookie), else 401.
pub(crate) async fn own_origin(State(app): State<AppState>, req: Request) -> Response {
    let Some(origin) = app.ports.clone() else {
        return ApiError::new(ErrorCode::NotFound, "this server has no ports listener")
            .into_response();
    };
    let (id, port) = match origin.target(req.headers()) {
        Ok(target) => target,
        Err(e) => return e.into_response(),
    };
    if req.uri().path() == OPEN_PATH {
        return origin
            .open(&id, port, req.uri().query())
            .unwrap_or_else(IntoResponse::into_response);
    }
    match auth::bearer(req.headers()) {
        Some(secret) if app.token.matches(secret.as_bytes()) => {}
        Some(_) => return auth::unauthorized("the bearer token is wrong"),
        None => {
            // Any of them: a page's script may add a `lockbox_port` of its own for a
            // longer path, which the browser would send first.
            let allowed = req
                .headers()
                .get_all(COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .filter_map(|pair| pair.trim().split_once('='))
                .any(|(name, key)| name == PORT_COOKIE && origin.key_matches(&id, port, key));
            if !allowed {
                return auth::unauthorized(
                    "open the port's open_url (GET /v1/sandboxes/{id}/ports) first, or send \
                     Authorization: Bearer <token>",
                );
            }
        }
    }
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    proxy(app, &id, port, &target, req, Served::OnOwnOrigin)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn proxy(
    app: AppState,
    id: &str,
    port: u16,
    target: &str,
    mut req: Request,
    served: Served,
) -> Result<Response, ApiError> {
    let sandbox = app.runtime.sandbox(id)?;
    let stream = sandbox.connect_port(port).await?;
    let upgrading = req.headers().contains_key(axum::http::header::UPGRADE);
    let slot = if upgrading {
        Some(app.streams.open()?)
    } else {
        None
    };
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    parts.uri = target
        .parse()
        .map_err(|_| ApiError::invalid("path", format!("{target:?} is not a request path")))?;
    strip_credentials(&mut parts.headers);
    let host = HeaderValue::from_str(&format!("localhost:{port}"))
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    parts.headers.insert(HOST, host);
    let upstream = Request::from_parts(parts, body);

    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| bad_gateway(port, &e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut response = sender
        .send_request(upstream)
        .await
        .map_err(|e| bad_gateway(port, &e))?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let server_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(splice(client_upgrade, server_upgrade, slot, sandbox));
        }
    }
    let (mut parts, body) = response.into_parts();
    clean_response(&mut parts.headers, served);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Joins the client's upgraded connection to the sandboxed server's until either ends.
async fn splice(
    client: hyper::upgrade::OnUpgrade,
    server: hyper::upgrade::OnUpgrade,
    slot: Option<crate::streams::StreamSlot>,
    _sandbox: Sandbox,
) {
    let _slot = slot;
    let (Ok(client), Ok(server)) = tokio::join!(client, server) else {
        return;
    };
    let _ =
        tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(server)).await;
}

fn bad_gateway(port: u16, e: &hyper::Error) -> ApiError {
    ApiError::new(
        ErrorCode::PortNotListening,
        format!("the server on port {port} in the sandbox did not answer: {e}"),
    )
    .with_details(json!({ "port": port }))
}

/// Removes lockbox's credentials: `Authorization`, the CSRF header, and lockbox's cookies
/// (other cookies are the sandboxed application's and stay).
fn strip_credentials(headers: &mut HeaderMap) {
    headers.remove(AUTHORIZATION);
    headers.remove(CSRF_HEADER);
    let kept: Vec<String> = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !is_lockbox_cookie(c))
        .map(str::to_owned)
        .collect();
    headers.remove(COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(COOKIE, v);
        }
    }
}

fn is_lockbox_cookie(pair: &str) -> bool {
    let name = pair.split('=').next().unwrap_or("").trim();
    name == SESSION_COOKIE || name == CSRF_COOKIE || name == PORT_COOKIE
}

/// What of a reply's headers may reach the client, by where it is served: on the API's
/// origin no `Set-Cookie` at all and an opaque origin; on the port's own origin host-only
/// cookies but lockbox's. `Clear-Site-Data` on neither.
fn clean_response(headers: &mut HeaderMap, served: Served) {
    headers.remove(CLEAR_SITE_DATA);
    let kept: Vec<HeaderValue> = match served {
        Served::OnApi => Vec::new(),
        Served::OnOwnOrigin => headers
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(host_only)
            .collect(),
    };
    headers.remove(SET_COOKIE);
    for v in kept {
        headers.append(SET_COOKIE, v);
    }
    if let Served::OnApi = served {
        headers.insert(
            CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(SANDBOX_CSP),
        );
    }
}

/// A `Set-Cookie` value without its `Domain` attribute, so the cookie stays on the port's
/// host (a `Domain` would share it with every host under that domain: other ports, and the
/// console where it is under it too); none for lockbox's cookie names or a value that is not
/// text.
fn host_only(value: &HeaderValue) -> Option<HeaderValue> {
    let text = value.to_str().ok()?;
    let mut parts = text.split(';').map(str::trim);
    let pair = parts.next()?;
    if is_lockbox_cookie(pair) {
        return None;
    }
    let attributes = parts.filter(|a| {
        !a.split('=')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("domain")
    });
    let cookie: Vec<&str> = std::iter::once(pair).chain(attributes).collect();
    HeaderValue::from_str(&cookie.join("; ")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_stripped_and_other_cookies_kept() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer secret"));
        h.insert(CSRF_HEADER, HeaderValue::from_static("c"));
        h.append(
            COOKIE,
            HeaderValue::from_static("lockbox_session=s; app=1; lockbox_csrf=c"),
        );
        h.append(COOKIE, HeaderValue::from_static("theme=dark"));
        strip_credentials(&mut h);
        assert!(h.get(AUTHORIZATION).is_none());
        assert!(h.get(CSRF_HEADER).is_none());
        assert_eq!(h.get(COOKIE).unwrap(), "app=1; theme=dark");
    }

    #[test]
    fn on_the_api_no_cookie_is_set_and_the_page_runs_in_an_opaque_origin() {
        let mut h = HeaderMap::new();
        h.append(
            SET_COOKIE,
            HeaderValue::from_static("lockbox_session=x; Path=/"),
        );
        h.append(SET_COOKIE, HeaderValue::from_static("app=1; Path=/"));
        h.append(CLEAR_SITE_DATA, HeaderValue::from_static("\"cookies\""));
        clean_response(&mut h, Served::OnApi);
        assert!(h.get(SET_COOKIE).is_none());
        assert!(h.get(CLEAR_SITE_DATA).is_none());
        assert!(h[CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .starts_with("sandbox "));
    }

    #[test]
    fn on_its_own_origin_cookies_are_host_only_and_never_lockbox_s() {
        let mut h = HeaderMap::new();
        for c in [
            "lockbox_port=x; Path=/",
            "app=1; Path=/; Domain=localhost; Max-Age=60",
            "b=2;domain=.example.com;HttpOnly",
        ] {
            h.append(SET_COOKIE, HeaderValue::from_static(c));
        }
        h.append(CLEAR_SITE_DATA, HeaderValue::from_static("\"*\""));
        clean_response(&mut h, Served::OnOwnOrigin);
        let cookies: Vec<_> = h.get_all(SET_COOKIE).iter().collect();
        assert_eq!(cookies, vec!["app=1; Path=/; Max-Age=60", "b=2; HttpOnly"]);
        assert!(h.get(CLEAR_SITE_DATA).is_none());
        assert!(h.get(CONTENT_SECURITY_POLICY).is_none());
    }

    #[test]
    fn a_port_is_named_by_its_host_and_opened_by_its_own_key_only() {
        let o = PortsOrigin::new("localhost".into(), 7071).unwrap();
        let host = |h: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(HOST, HeaderValue::from_static(h));
            o.target(&m)
        };
        assert_eq!(
            host("8000-sb-0123456789ab.localhost:7071").unwrap(),
            ("sb-0123456789ab".to_owned(), 8000)
        );
        assert_eq!(
            host("80-SB-AB.LOCALHOST").unwrap(),
            ("sb-ab".to_owned(), 80)
        );
        for bad in [
            "127.0.0.1:7071",
            "localhost:7071",
            "8000-sb-a.b.localhost",
            "0-sb-a.localhost",
            "70000-sb-a.localhost",
            "8000-.localhost",
            "8000-sb-a.localhostx",
        ] {
            assert!(host(bad).is_err(), "{bad}");
        }
        let key = o.key("sb-a", 8000);
        assert_eq!(key.len(), 64);
        assert!(o.key_matches("sb-a", 8000, &key));
        assert!(!o.key_matches("sb-a", 8001, &key));
        assert!(!o.key_matches("sb-b", 8000, &key));
        assert!(!o.key_matches("sb-a", 8000, ""));
        let other = PortsOrigin::new("localhost".into(), 7071).unwrap();
        assert!(
            !other.key_matches("sb-a", 8000, &key),
            "a new secret at start"
        );
        for to in ["//evil.example/", "/\\evil.example", "http://evil.example/"] {
            let q = format!(
                "key={key}&to={}",
                form_urlencoded::byte_serialize(to.as_bytes()).collect::<String>()
            );
            assert!(o.open("sb-a", 8000, Some(&q)).is_err(), "{to}");
        }
        let r = o
            .open("sb-a", 8000, Some(&format!("key={key}&to=%2Fa%3Fb%3D1")))
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[LOCATION], "/a?b=1");
        assert!(r.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .starts_with(&format!("lockbox_port={key}; HttpOnly")));
        let r = o.open("sb-a", 8000, Some("key=0000")).unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
}
