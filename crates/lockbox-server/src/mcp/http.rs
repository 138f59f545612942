//! MCP's streamable HTTP transport at `POST /mcp`, in its simplest conforming form: every
//! request is answered with one `application/json` reply, notifications with 202, and the
//! server opens no stream of its own (`GET /mcp` is 405, as the transport allows) and
//! issues no `Mcp-Session-Id`: sandboxes belong to the server, not to an MCP session, so
//! every request stands alone. Auth is the API's (bearer token; the route is under the same
//! middleware as `/v1`).

use super::{McpServer, PROTOCOL_VERSIONS};
use crate::extract::body_rejection;
use crate::AppState;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::json;

/// The header a client sends after `initialize` with the negotiated revision.
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// `POST /mcp`: one JSON-RPC message in, its reply (or 202) out.
pub async fn post(State(app): State<AppState>, req: Request) -> Response {
    if let Some(reply) = unsupported_version(req.headers()) {
        return reply;
    }
    let body = match Bytes::from_request(req, &()).await {
        Ok(body) => body,
        Err(e) => return body_rejection(e).into_response(),
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    let server = McpServer::new(app.runtime.clone(), true);
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
