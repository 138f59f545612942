//! Exposed ports: expose, list, unexpose, and the proxy that carries HTTP requests and
//! WebSocket upgrades to the server listening on the port inside the sandbox.
//!
//! Each proxied request gets a fresh connection into the sandbox (`connect_port`) and an
//! HTTP/1.1 client connection on it. The request goes on as it came, but for what belongs
//! to lockbox: the `Authorization` header, lockbox's own cookies and the CSRF header are
//! removed (the sandboxed server never sees the API's credentials), and `Host` becomes
//! `localhost:PORT`. Responses come back as they are, but for `Set-Cookie` of lockbox's
//! cookie names (dropped) and a `Content-Security-Policy: sandbox ...` header: a page
//! served by the sandbox runs in an opaque origin, so its scripts cannot use the console's
//! session on this server's origin.

use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::sessions::{CSRF_COOKIE, CSRF_HEADER, SESSION_COOKIE};
use crate::wire::{each, ExposePort, PortInfo};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_SECURITY_POLICY, COOKIE, HOST, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;
use lockbox_policy::ErrorCode;
use lockbox_runtime::{check_port, ExposeOptions, Sandbox};
use serde_json::json;

/// Sent with every proxied response: scripts, forms and popups work, but the page is in an
/// opaque origin (no `allow-same-origin`), away from the console's cookies and API.
const SANDBOX_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

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
    Ok((
        StatusCode::CREATED,
        Json(PortInfo::from(sandbox.expose_port(port, opts).await?)),
    ))
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
        ports: each(sandbox.ports()),
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

/// `ANY /v1/sandboxes/{id}/ports/{port}/`: the server's root.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports/{port}/",
    operation_id = "proxy_root",
    summary = "Proxy (prefix, any method) to the server on the exposed port: the root path",
    description = "Authorization, lockbox's cookies and X-CSRF-Token are removed, Host becomes localhost:PORT",
    params(crate::openapi::PortPath),
    responses((status = "default", description = "the sandboxed server's reply, as it sent it (502 PORT_NOT_LISTENING when nothing listens; WebSocket upgrades are carried through)", content(("*/*"))))
)]
pub async fn proxy_root(
    State(app): State<AppState>,
    ApiPath((id, port)): ApiPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    proxy(app, &id, &port, "", req).await
}

/// `ANY /v1/sandboxes/{id}/ports/{port}/{*path}`.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports/{port}/{path}",
    operation_id = "proxy_path",
    summary = "Proxy (prefix, any method, any path below) to the server on the exposed port",
    params(crate::openapi::ProxyPath),
    responses((status = "default", description = "the sandboxed server's reply, as it sent it (502 PORT_NOT_LISTENING when nothing listens; WebSocket upgrades are carried through)", content(("*/*"))))
)]
pub async fn proxy_path(
    State(app): State<AppState>,
    ApiPath((id, port, path)): ApiPath<(String, String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    proxy(app, &id, &port, &path, req).await
}

async fn proxy(
    app: AppState,
    id: &str,
    port: &str,
    path: &str,
    mut req: Request,
) -> Result<Response, ApiError> {
    let port = port_of(port)?;
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
    // The path as the client sent it (percent-encoding kept), under the proxy's prefix.
    let target = match parts.uri.query() {
        Some(q) => format!("/{path}?{q}"),
        None => format!("/{path}"),
    };
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
    clean_response(&mut parts.headers);
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
    name == SESSION_COOKIE || name == CSRF_COOKIE
}

/// Drops `Set-Cookie` of lockbox's cookie names and puts the page in an opaque origin.
fn clean_response(headers: &mut HeaderMap) {
    let kept: Vec<HeaderValue> = headers
        .get_all(SET_COOKIE)
        .iter()
        .filter(|v| !v.to_str().map(is_lockbox_cookie).unwrap_or(true))
        .cloned()
        .collect();
    headers.remove(SET_COOKIE);
    for v in kept {
        headers.append(SET_COOKIE, v);
    }
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(SANDBOX_CSP),
    );
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
    fn responses_cannot_set_lockbox_cookies_and_run_in_an_opaque_origin() {
        let mut h = HeaderMap::new();
        h.append(
            SET_COOKIE,
            HeaderValue::from_static("lockbox_session=x; Path=/"),
        );
        h.append(SET_COOKIE, HeaderValue::from_static("app=1; Path=/"));
        clean_response(&mut h);
        let cookies: Vec<_> = h.get_all(SET_COOKIE).iter().collect();
        assert_eq!(cookies, vec!["app=1; Path=/"]);
        assert!(h[CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .starts_with("sandbox "));
    }
}
