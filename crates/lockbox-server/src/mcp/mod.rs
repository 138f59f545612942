//! The MCP (Model Context Protocol) front end: the same sandboxes as `/v1`, as MCP tools, for
//! agents. JSON-RPC 2.0 written here with serde (see `docs/mcp.md` for why not the `rmcp`
//! crate: its current release needs Rust 1.88, the workspace's MSRV is 1.85), kept to what a
//! tool server needs: `initialize`, `ping`, `tools/list`, `tools/call`; notifications are
//! accepted and ignored.
//!
//! - [`McpServer`] answers one JSON-RPC message; it is transport-free;
//! - [`serve_stdio`] runs it over newline-delimited JSON on a reader and a writer (`lockbox
//!   mcp`), requests concurrently, until the reader ends;
//! - `http` runs it as the streamable HTTP transport at `POST /mcp` of `lockbox serve`
//!   (JSON replies, stateless: no `Mcp-Session-Id`, no server-to-client stream), behind the
//!   API's bearer-token auth;
//! - `tools` declares each tool (its JSON schema) and turns arguments into a [`ToolCall`] once;
//!   `run` makes the one runtime call and shapes its result as MCP content.
//!
//! Not here: sandboxes and their operations (lockbox-runtime); argument types shared with
//! `/v1` (`wire`).

pub(crate) mod http;
mod run;
mod stdio;
mod tools;

pub use self::stdio::serve_stdio;
pub use self::tools::{tool_names, ToolCall, MAX_OUTPUT};

use crate::scope::Scope;
use lockbox_runtime::Runtime;
use serde_json::{json, Value};
use std::sync::Arc;

/// Protocol revisions this server speaks, newest first. The tool surface used here is the
/// same in all of them; `structuredContent` is simply ignored by clients of older ones.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// JSON-RPC error codes (JSON-RPC 2.0, section 5.1).
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// Answers MCP messages with the tools of one runtime, for an agent bound to a scope: the
/// operator's ceiling bounds what its sandboxes may be granted, and it sees only the
/// sandboxes and snapshots it made (`crate::scope`).
#[derive(Debug, Clone)]
pub struct McpServer {
    runtime: Runtime,
    scope: Arc<Scope>,
    /// Replace the message of internal (5xx-class) errors by a pointer to the log, as the
    /// HTTP API does; the stdio server's user is the operator and sees them.
    redact_internal: bool,
}

/// What one incoming message is.
enum Incoming {
    /// A request: it gets one response.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification or a response to us: no reply.
    NoReply,
}

impl McpServer {
    /// A server on `runtime` for an agent in `scope` (`Scope::new(ceiling)`).
    /// `redact_internal`: hide the details of lockbox's own failures from clients (the HTTP
    /// transport); they are logged instead.
    pub fn new(runtime: Runtime, scope: Arc<Scope>, redact_internal: bool) -> McpServer {
        McpServer {
            runtime,
            scope,
            redact_internal,
        }
    }

    /// The runtime the tools act on.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Answers one message given as text; `None` for notifications and responses.
    pub async fn handle_text(&self, text: &str) -> Option<Value> {
        match serde_json::from_str::<Value>(text) {
            Ok(message) => self.handle(message).await,
            Err(e) => Some(error_response(
                Value::Null,
                PARSE_ERROR,
                &format!("parse error: {e}"),
            )),
        }
    }

    /// Answers one parsed message; `None` for notifications and responses.
    pub async fn handle(&self, message: Value) -> Option<Value> {
        let (id, method, params) = match classify(message) {
            Ok(Incoming::Request { id, method, params }) => (id, method, params),
            Ok(Incoming::NoReply) => return None,
            Err((id, message)) => return Some(error_response(id, INVALID_REQUEST, &message)),
        };
        let result = match method.as_str() {
            "initialize" => Ok(initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({ "tools": tools::definitions() })),
            "tools/call" => self.call(&params).await,
            other => Err((METHOD_NOT_FOUND, format!("method not found: {other}"))),
        };
        Some(match result {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err((code, message)) => error_response(id, code, &message),
        })
    }

    /// `tools/call`: an unknown tool or params that are not `{name, arguments}` are protocol
    /// errors; everything about the arguments and the call itself is a tool error
    /// (`isError`), which the model sees and can act on.
    async fn call(&self, params: &Value) -> Result<Value, (i64, String)> {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return Err((INVALID_PARAMS, "tools/call needs params.name".into()));
        };
        if !tool_names().contains(&name) {
            return Err((INVALID_PARAMS, format!("unknown tool: {name}")));
        }
        let args = params.get("arguments").cloned().unwrap_or(json!({}));
        let outcome = match ToolCall::parse(name, args) {
            Ok(call) => run::run(&self.runtime, &self.scope, call).await,
            Err(e) => Err(e),
        };
        Ok(match outcome {
            Ok(result) => result,
            Err(e) => run::tool_error(e, self.redact_internal),
        })
    }
}

/// Sorts a message into request / no reply, or an invalid-request error with the id (if any).
fn classify(message: Value) -> Result<Incoming, (Value, String)> {
    let Value::Object(mut map) = message else {
        return Err((
            Value::Null,
            "expected a JSON-RPC message object (batches are not supported)".into(),
        ));
    };
    let id = map.remove("id");
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id.unwrap_or(Value::Null), "jsonrpc must be \"2.0\"".into()));
    }
    let method = match map.remove("method") {
        Some(Value::String(method)) => method,
        Some(_) => return Err((id.unwrap_or(Value::Null), "method must be a string".into())),
        // A response to a request of ours: we send none, so there is nothing to match.
        None => return Ok(Incoming::NoReply),
    };
    match id {
        None => Ok(Incoming::NoReply),
        Some(id @ (Value::String(_) | Value::Number(_))) => Ok(Incoming::Request {
            id,
            method,
            params: map.remove("params").unwrap_or(json!({})),
        }),
        Some(other) => Err((other, "id must be a string or a number".into())),
    }
}

/// The `initialize` result: the client's protocol version when we speak it, else our newest
/// (the client then decides whether it can go on).
fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| PROTOCOL_VERSIONS.contains(v))
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": { "name": "lockbox", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "lockbox runs commands in confined Linux sandboxes. create_sandbox \
            (with workdir: a host directory seen through a copy-on-write branch), then exec, \
            read_file/write_file/list_files; changes and diff show what the sandbox changed \
            in the workdir; commit applies it to the host directory, abort discards it. \
            delete_sandbox when done.",
    })
}

fn error_response(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    async fn server() -> (McpServer, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::open(lockbox_runtime::RuntimeConfig::new(dir.path())).unwrap();
        let scope = Arc::new(Scope::new(lockbox_policy::Ceiling::default()));
        (McpServer::new(runtime, scope, true), dir)
    }

    async fn ask(server: &McpServer, message: &str) -> Value {
        server.handle_text(message).await.unwrap()
    }

    #[tokio::test]
    async fn initialize_agrees_on_a_version_and_offers_tools() {
        let (server, _dir) = server().await;
        let r = ask(&server, r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#).await;
        assert_eq!(r["result"]["protocolVersion"], "2025-03-26");
        assert!(r["result"]["capabilities"]["tools"].is_object());
        let r = ask(&server, r#"{"jsonrpc":"2.0","id":"x","method":"initialize","params":{"protocolVersion":"1999-01-01"}}"#).await;
        assert_eq!(r["id"], "x");
        assert_eq!(r["result"]["protocolVersion"], PROTOCOL_VERSIONS[0]);
        let r = ask(&server, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).await;
        let names: Vec<&str> = r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, tool_names());
    }

    #[tokio::test]
    async fn protocol_errors_and_tool_errors_are_told_apart() {
        let (server, _dir) = server().await;
        assert!(server
            .handle_text(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await
            .is_none());
        let r = ask(&server, "{not json").await;
        assert_eq!(r["error"]["code"], PARSE_ERROR);
        let r = ask(&server, r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).await;
        assert_eq!(r["error"]["code"], INVALID_REQUEST);
        let r = ask(
            &server,
            r#"{"jsonrpc":"2.0","id":1,"method":"server/discover"}"#,
        )
        .await;
        assert_eq!(r["error"]["code"], METHOD_NOT_FOUND);
        let r = ask(
            &server,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm_rf"}}"#,
        )
        .await;
        assert_eq!(r["error"]["code"], INVALID_PARAMS);
        // A call that reaches the runtime and fails: a tool result with isError and the code.
        let r = ask(&server, r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"changes","arguments":{"sandbox_id":"sb-none"}}}"#).await;
        assert_eq!(r["result"]["isError"], true);
        assert_eq!(
            r["result"]["structuredContent"]["code"],
            "SANDBOX_NOT_FOUND"
        );
        let text = r["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("SANDBOX_NOT_FOUND: "), "{text}");
        // Bad arguments: a tool error too, naming the field.
        let r = ask(&server, r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":{"sandbox_id":"a"}}}"#).await;
        assert_eq!(
            r["result"]["structuredContent"]["details"]["field"],
            "command"
        );
    }
}
