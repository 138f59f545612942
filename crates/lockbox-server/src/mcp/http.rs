//! MCP's streamable HTTP transport at `POST /mcp`, in its simplest conforming form: every
//! request is answered with one `application/json` reply, notifications with 202, and the
//! server opens no stream of its own (`GET /mcp` is 405, as the transport allows) and
//! issues no `Mcp-Session-Id`: sandboxes belong to the server, not to an MCP session, so
//! every request stands alone. Auth is the API's (bearer token; the route is under the same
//! middleware as `/v1`): with the operator's token the agent works under the server's
//! ceiling (`ServerConfig::ceiling`), with a scoped token under that token's. A request with
//! an `Origin` header must come from a loopback origin or one the operator allowed
//! (`--mcp-allow-origin`): the transport's rule against DNS rebinding, where a web page
//! whose name now resolves to 127.0.0.1 calls the server from the user's browser.

use super::{McpServer, PROTOCOL_VERSIONS};
use crate::error::ApiError;
use crate::extract::body_rejection;
use crate::scope::Principal;
use crate::AppState;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::ORIGIN;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;

/// The header a client sends after `initialize` with the negotiated revision.
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// `POST /mcp`: one JSON-RPC message in, its reply (or 202) out.
pub async fn post(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    req: Request,
) -> Response {
    if let Err(e) = check_origin(req.headers(), &app.config.mcp_allow_origins) {
        return e.into_response();
    }
    if let Some(reply) = unsupported_version(req.headers()) {
        return reply;
    }
    let body = match Bytes::from_request(req, &()).await {
        Ok(body) => body,
        Err(e) => return body_rejection(e).into_response(),
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let scope = match who {
        Principal::Operator => Arc::clone(&app.mcp),
        Principal::Agent(scope) => scope,
    };
    let server = McpServer::new(app.runtime.clone(), scope, true);
    // Its own task: a client that goes away must not cancel a call half-way (an exec in
    // its session protocol, a commit).
    let reply = tokio::spawn(async move { server.handle_text(&text).await }).await;
    match reply {
        Ok(Some(reply)) if reply.get("error").is_some() && reply["id"].is_null() => {
            (StatusCode::BAD_REQUEST, Json(reply)).into_response()
        }
        Ok(Some(reply)) => Json(reply).into_response(),
        Ok(None) => StatusCode::ACCEPTED.into_response(),
        Err(e) => crate::error::ApiError::new(
            lockbox_policy::ErrorCode::Internal,
            format!("mcp task: {e}"),
        )
        .into_response(),
    }
}

/// 403 `FORBIDDEN` for an `Origin` that is neither loopback (`http://localhost:3000`,
/// `http://127.0.0.1`, `http://[::1]:8080`) nor one of `allowed` (compared exactly, without a
/// trailing `/`). Not the request's own `Host`: under DNS rebinding the attacker's name is
/// both the Origin and the Host.
fn check_origin(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("").trim_end_matches('/');
    if allowed.iter().any(|a| a.trim_end_matches('/') == origin) || is_loopback(origin) {
        return Ok(());
    }
    Err(crate::sessions::forbidden(format!(
        "Origin {origin:?} may not call /mcp: only loopback origins and those of \
         --mcp-allow-origin may (MCP's rule against DNS rebinding)"
    ))
    .with_details(json!({ "origin": origin })))
}

/// Whether `origin` (`scheme://host[:port]`) names a loopback host.
fn is_loopback(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    if !matches!(scheme, "http" | "https") || rest.contains(['/', '@']) {
        return false;
    }
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(h, _)| h),
        None => rest.rsplit_once(':').map_or(rest, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// 400 when the client names a protocol revision this server does not speak.
fn unsupported_version(headers: &HeaderMap) -> Option<Response> {
    let asked = headers.get(PROTOCOL_HEADER)?.to_str().unwrap_or("");
    if PROTOCOL_VERSIONS.contains(&asked) {
        return None;
    }
    let message = format!(
        "unsupported MCP-Protocol-Version {asked:?} (this server speaks {})",
        PROTOCOL_VERSIONS.join(", ")
    );
    let body = json!({ "jsonrpc": "2.0", "id": null,
                       "error": { "code": super::INVALID_REQUEST, "message": message } });
    Some((StatusCode::BAD_REQUEST, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn origin(value: &str, allowed: &[&str]) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(ORIGIN, value.parse().unwrap());
        let allowed: Vec<String> = allowed.iter().map(|a| (*a).to_owned()).collect();
        check_origin(&headers, &allowed).is_ok()
    }

    #[test]
    fn issue_32_only_loopback_and_allowed_origins_may_call_mcp() {
        assert!(
            check_origin(&HeaderMap::new(), &[]).is_ok(),
            "no Origin: not a browser"
        );
        for ok in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://[::1]:8443",
            "http://127.1.2.3:80/",
        ] {
            assert!(origin(ok, &[]), "{ok} refused");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:7070",
            "null",
            "http://user@127.0.0.1",
            "file://localhost",
        ] {
            assert!(!origin(bad, &[]), "{bad} allowed");
        }
        assert!(origin("https://agent.example", &["https://agent.example/"]));
        assert!(!origin(
            "https://agent.example.evil",
            &["https://agent.example"]
        ));
    }
}
