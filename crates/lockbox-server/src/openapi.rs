//! The OpenAPI 3.1 description of the API, served at `GET /openapi.json`, derived with
//! utoipa from the code rather than written by hand: the request and reply types of
//! `crate::wire` (`#[derive(Debug, ToSchema)]`, query strings `#[derive(Debug, IntoParams)]`) and the
//! handlers of `crate::routes` (`#[utoipa::path]`), listed in [`ApiDoc`]. What utoipa
//! cannot see is added here, computed rather than typed: the error reply (`4XX` and `5XX`, the
//! [`crate::error::ApiError`] body) on every operation, the bearer security scheme, and the
//! links from the operations that create things to those that use their ids.
//!
//! A type sent or read as it is has its schema where it is defined, behind an `openapi`
//! feature: lockbox-cow (a change's kind and type, a reviewed path; `ContentDigest` by hand),
//! lockbox-netsup (network events, approval questions), lockbox-agent (a run's results and
//! error), and lockbox-policy, whose forms with hand-written serde implement the schema by
//! hand next to their parser (a file name that may not be UTF-8, `name::Decoded`: component
//! `Name`; a size, `ByteSize`: `ByteSizeValue`; network access, `Net`: `NetChoice`). What
//! the server reshapes or parses itself has a type of its own in `crate::wire` (a commit's
//! review, `ReviewArg`: `ReviewSchema`; the names a text field takes where a handler checks
//! it, such as `LanguageName`). Still here: the output fields of the `exec` reply (written
//! piece by piece after its typed head, see `crate::output`), the path parameters, and the
//! SSE events of the streaming routes. A test checks that every operation is routed and
//! `lockbox-server/tests/it/http.rs` that every route is described; the schemathesis fuzz run
//! (`scripts/fuzz-api.sh`) drives the API from this document.

use serde_json::{json, Map, Value};
use std::sync::OnceLock;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, RefOr, ResponseBuilder};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};

/// The document (built once).
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

/// Every `(METHOD, path)` the document describes, e.g. `("GET", "/v1/sandboxes/{id}")`.
pub fn operations() -> Vec<(String, String)> {
    let mut ops = Vec::new();
    if let Some(paths) = document()["paths"].as_object() {
        for (path, item) in paths {
            if let Some(methods) = item.as_object() {
                for method in methods.keys().filter(|m| *m != "parameters") {
                    ops.push((method.to_ascii_uppercase(), path.clone()));
                }
            }
        }
    }
    ops
}

/// Longest duration any `*_ms` field accepts: 30 days.
pub const MAX_MS: u64 = 30 * 24 * 3600 * 1000;
/// Largest `grace_ms` of a kill: one minute.
pub const MAX_GRACE_MS: u64 = 60_000;
/// Largest per-process log bound: 1 GiB.
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// Every operation of the API (see the module doc).
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "lockbox",
        description = "Long-lived sandboxes: sessions, processes, PTYs, files, workspace branches, exposed ports, code contexts (persistent Python/bash/Node interpreters with rich results). Every route but /healthz and the console's /ui routes needs `Authorization: Bearer <token>` (or the console's session cookie, with `X-CSRF-Token` on state-changing requests). Errors are {code, message, details}; see docs/server.md. The same sandboxes are also served as MCP tools at POST /mcp (MCP streamable HTTP transport, JSON-RPC 2.0, same bearer token; not described here: see docs/mcp.md)."
    ),
    paths(
        crate::routes::healthz,
        crate::routes::openapi,
        crate::routes::sandboxes::create,
        crate::routes::sandboxes::list,
        crate::routes::sandboxes::show,
        crate::routes::sandboxes::delete,
        crate::routes::sandboxes::create_session,
        crate::routes::sandboxes::list_sessions,
        crate::routes::sandboxes::delete_session,
        crate::routes::contexts::create,
        crate::routes::contexts::list,
        crate::routes::contexts::delete,
        crate::routes::contexts::run,
        crate::routes::contexts::stream,
        crate::routes::exec::exec,
        crate::routes::exec::stream,
        crate::routes::processes::start,
        crate::routes::processes::list,
        crate::routes::processes::show,
        crate::routes::processes::kill,
        crate::routes::processes::signal,
        crate::routes::processes::logs,
        crate::routes::processes::stdin,
        crate::routes::pty::attach,
        crate::routes::pty::attach_ws,
        crate::routes::files::get,
        crate::routes::files::put,
        crate::routes::files::list,
        crate::routes::files::stat,
        crate::routes::files::mkdir,
        crate::routes::files::rename,
        crate::routes::files::remove,
        crate::routes::watch::watch,
        crate::routes::audit::audit,
        crate::routes::approvals::list,
        crate::routes::approvals::decide,
        crate::routes::workspace::changes,
        crate::routes::workspace::diff,
        crate::routes::workspace::commit,
        crate::routes::workspace::abort,
        crate::routes::ports::expose,
        crate::routes::ports::list,
        crate::routes::ports::unexpose,
        crate::routes::ports::proxy_root,
        crate::routes::ports::proxy_path,
        crate::routes::snapshots::take,
        crate::routes::images::commit,
        crate::routes::images::export_archive,
        crate::routes::images::has_image,
        crate::routes::images::import_archive,
        crate::routes::snapshots::restore,
        crate::routes::snapshots::fork_sandbox,
        crate::routes::snapshots::fork,
        crate::routes::snapshots::diff,
        crate::routes::snapshots::export,
        crate::routes::snapshots::import,
        crate::routes::snapshots::list,
        crate::routes::snapshots::show,
        crate::routes::snapshots::delete,
        crate::routes::branches::list,
        crate::routes::branches::show,
        crate::routes::branches::diff,
        crate::routes::branches::commit,
        crate::routes::branches::abort,
        crate::routes::transactions::list,
        crate::routes::transactions::show,
        crate::routes::transactions::create,
        crate::routes::journal::runs,
        crate::routes::journal::run,
        crate::routes::tokens::mint,
        crate::routes::tokens::revoke,
        crate::routes::console::login,
        crate::routes::console::logout,
        crate::routes::console::session,
    ),
    components(schemas(crate::error::ApiError)),
    security(("bearer" = [])),
    modifiers(&Common)
)]
pub struct ApiDoc;

/// What every operation has: the bearer scheme, and the error reply.
#[derive(Debug)]
struct Common;

impl Modify for Common {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                // Every operation can fail with the error shape: the caller's fault (4XX,
                // 401 without a valid token) or the server's (5XX: `INTERNAL`, a sandbox
                // that could not start, ...).
                for (range, description) in [
                    ("4XX", "error (see `code`; 401 without a valid token)"),
                    (
                        "5XX",
                        "the server failed (see `code`; `INTERNAL` is logged)",
                    ),
                ] {
                    let error = ResponseBuilder::new()
                        .description(description)
                        .content(
                            "application/json",
                            Content::new(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                                "Error",
                            )))),
                        )
                        .build();
                    op.responses
                        .responses
                        .entry(range.into())
                        .or_insert(RefOr::T(error));
                }
            }
            // A HEAD's answers have no body: the status alone says what went wrong.
            if let Some(op) = item.head.as_mut() {
                for range in ["4XX", "5XX"] {
                    let error = ResponseBuilder::new()
                        .description("error (the status; no body to a HEAD)")
                        .build();
                    op.responses
                        .responses
                        .entry(range.into())
                        .or_insert(RefOr::T(error));
                }
            }
        }
    }
}

fn build() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    if let Some(paths) = doc.get_mut("paths") {
        for op in paths
            .as_object_mut()
            .into_iter()
            .flat_map(|paths| paths.values_mut())
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
        {
            optional_parts(op);
        }
        add_links(paths);
    }
    // Raw bytes are written in place (`{type: string, format: binary}`), as clients such as
    // schemathesis recognise them there, rather than as a reference to a component.
    let binary = doc["components"]["schemas"]["Binary"].take();
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        schemas.remove("Binary");
    }
    inline_binary(&mut doc, &binary);
    // Each stream once, as text or as base64 (`output::data_fields`); `exec`'s are written
    // after the typed head, piece by piece (`output::exec_reply`).
    let schemas = &mut doc["components"]["schemas"];
    for name in ["stdout", "stderr"] {
        let props = &mut schemas["ExecResult"]["properties"];
        props[name] = json!({ "type": "string" });
        props[format!("{name}_b64")] = json!({ "type": "string", "format": "byte" });
    }
    schemas["ExecResult"]["allOf"] = json!([one_of_fields("stdout"), one_of_fields("stderr")]);
    schemas["LogSegment"]["oneOf"] = one_of_fields("data")["oneOf"].clone();
    doc
}

/// The `code` of an error: one of [`lockbox_policy::ErrorCode::ALL`].
pub fn error_codes() -> utoipa::openapi::Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(
            lockbox_policy::ErrorCode::ALL.iter().map(|c| c.as_str()),
        ))
        .description(Some("stable, SCREAMING_SNAKE (docs/server.md)"))
        .build()
}

/// A signal (`wire::SignalName`): its number, 1 to 64 (what
/// `lockbox_runtime::Signal::from_number` takes), or its name.
pub fn signal_name() -> utoipa::openapi::schema::Schema {
    utoipa::openapi::schema::OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(64)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples(["TERM"]),
        )
        .description(Some("a signal number (1-64) or name (`TERM`, `SIGTERM`)"))
        .build()
        .into()
}

// ---- Forms written by hand ----

/// Raw bytes (a file's contents, a process's stdin).
#[derive(Debug)]
pub(crate) struct Binary;

impl utoipa::PartialSchema for Binary {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, SchemaFormat};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .into()
    }
}

impl ToSchema for Binary {}

/// `GET fs/list`: the entries (written one at a time as the client reads).
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub(crate) struct FileList {
    entries: Vec<crate::wire::FileInfo>,
}

// ---- Server-sent events ----

/// One SSE event (`event:`, `data:`, `id:`); clients such as schemathesis check each event
/// against it.
macro_rules! sse_events {
    ($name:ident, $events:ident, $what:literal, [$($event:ident),+]) => {
        #[doc = $what]
        #[derive(Debug, ToSchema)]
        #[allow(dead_code)]
        pub(crate) struct $name {
            #[schema(inline)]
            event: Option<$events>,
            /// A JSON document.
            data: String,
            /// The log cursor after this event.
            id: Option<String>,
        }

        #[derive(Debug, ToSchema)]
        #[serde(rename_all = "snake_case")]
        #[allow(dead_code)]
        enum $events {
            $($event),+
        }
    };
}

sse_events!(
    ExecEvent,
    ExecEventName,
    "An event of `exec/stream`",
    [Start, Stdout, Stderr, Exit, Error]
);
sse_events!(
    LogEvent,
    LogEventName,
    "An event of a followed process log",
    [Stdout, Stderr, Pty, Truncated, Eof]
);
sse_events!(
    WatchEvent,
    WatchEventName,
    "An event of `watch`",
    [Change, Overflow, Error]
);
sse_events!(AuditEvent, AuditEventName, "An event of `audit`", [Audit]);
sse_events!(
    CodeEvent,
    CodeEventName,
    "An event of a streamed code run",
    [Stdout, Stderr, Result, Error, End]
);

// ---- Path parameters ----

/// `{id}` of a sandbox.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct SandboxPath {
    /// Sandbox id.
    id: String,
}

/// `{id}` and `{pid}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct ProcessPath {
    /// Sandbox id.
    id: String,
    /// Process id (`p1`, ...).
    pid: String,
}

/// `{id}` and `{sid}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct SessionPath {
    /// Sandbox id.
    id: String,
    /// Session id.
    sid: String,
}

/// `{id}` and `{cid}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct ContextPath {
    /// Sandbox id.
    id: String,
    /// Context id (`default`: the sandbox's Python context, created on first use).
    cid: String,
}

/// `{id}` and `{port}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct PortPath {
    /// Sandbox id.
    id: String,
    /// The port inside the sandbox (1-65535).
    #[param(minimum = 1, maximum = 65535)]
    port: u16,
}

/// `{id}`, `{port}` and the proxied `{path}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct ProxyPath {
    /// Sandbox id.
    id: String,
    /// The port inside the sandbox (1-65535).
    #[param(minimum = 1, maximum = 65535)]
    port: u16,
    /// The path on the sandboxed server (may contain /).
    path: String,
}

/// `{id}` and `{qid}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct QuestionPath {
    /// Sandbox id.
    id: String,
    /// The question's id.
    #[param(minimum = 1)]
    qid: u64,
}

/// `{id}` of a kept branch.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct BranchPath {
    /// Branch id (`lockbox branch list`).
    id: String,
}

/// `{id}` of a snapshot.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct SnapshotPath {
    /// Snapshot id.
    id: String,
}

/// `{id}` of a transaction.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct TxnPath {
    /// Transaction id (`lockbox txn list`).
    id: String,
}

/// `{id}` of a journal run.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct RunPath {
    /// Run id (`lockbox journal list`).
    id: String,
}

/// Replaces each reference to the `Binary` component by `binary` itself.
fn inline_binary(value: &mut Value, binary: &Value) {
    match value {
        Value::Object(map) => {
            if map.get("$ref").and_then(Value::as_str) == Some("#/components/schemas/Binary") {
                *value = binary.clone();
                return;
            }
            for v in map.values_mut() {
                inline_binary(v, binary);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| inline_binary(v, binary)),
        _ => {}
    }
}

/// utoipa writes an optional body (`request_body = Option<T>`) and an optional header
/// (`Option<String>`) as "T or null"; what is optional there is the body or header itself,
/// so it becomes "T, not required". A public operation's `security(())` becomes `[]` (no
/// requirement) rather than `[{}]`.
fn optional_parts(op: &mut Value) {
    let unwrap_null = |schema: &mut Value| {
        let inner = schema["oneOf"].as_array().and_then(|alts| {
            let rest: Vec<_> = alts.iter().filter(|s| s["type"] != "null").collect();
            (rest.len() == 1 && alts.len() == 2).then(|| rest[0].clone())
        });
        if let Some(inner) = inner {
            *schema = inner;
        }
        if let Some(types) = schema["type"].as_array() {
            let rest: Vec<_> = types.iter().filter(|t| *t != "null").cloned().collect();
            if rest.len() == 1 {
                schema["type"] = rest[0].clone();
            }
        }
    };
    if let Some(content) = op
        .pointer_mut("/requestBody/content")
        .and_then(Value::as_object_mut)
    {
        let mut optional = false;
        for media in content.values_mut() {
            if let Some(schema) = media.get_mut("schema") {
                let before = schema.clone();
                unwrap_null(schema);
                optional |= *schema != before;
            }
        }
        if optional {
            op["requestBody"]["required"] = json!(false);
        }
    }
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for param in params.iter_mut().filter(|p| p["in"] == "header") {
            if let Some(schema) = param.get_mut("schema") {
                unwrap_null(schema);
            }
        }
    }
    if op["security"] == json!([{}]) {
        op["security"] = json!([]);
    }
}

/// Exactly one of `name` (text) and `name_b64` (see `output.rs`).
fn one_of_fields(name: &str) -> Value {
    json!({ "oneOf": [ { "required": [name] }, { "required": [format!("{name}_b64")] } ] })
}

/// OpenAPI links from the operations that create things to those that use them, so a
/// stateful client (and schemathesis' stateful phase) can follow ids it was given.
fn add_links(paths: &mut Value) {
    let Some(map) = paths.as_object_mut() else {
        return;
    };
    let mut sandbox_links = Map::new();
    let mut process_links = Map::new();
    let mut session_links = Map::new();
    let mut context_links = Map::new();
    for (path, item) in map.iter() {
        let Some(methods) = item.as_object() else {
            continue;
        };
        for method in methods.keys() {
            let name = format!("{method}{}", path.replace(['/', '{', '}'], "_"));
            let op_ref = format!(
                "#/paths/{}/{method}",
                path.replace('~', "~0").replace('/', "~1")
            );
            if path.starts_with("/v1/sandboxes/{id}/processes/{pid}") {
                process_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$request.path.id", "pid": "$response.body#/id" } }),
                );
            } else if path == "/v1/sandboxes/{id}/sessions/{sid}" {
                session_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$request.path.id", "sid": "$response.body#/id" } }),
                );
            } else if path.starts_with("/v1/sandboxes/{id}/contexts/{cid}") {
                context_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$request.path.id", "cid": "$response.body#/id" } }),
                );
            } else if path.starts_with("/v1/sandboxes/{id}")
                && !path.contains("{pid}")
                && !path.contains("{sid}")
                // A watch streams until the client leaves: a client following links to
                // exercise every operation would wait on it forever. So does an audit.
                && !path.ends_with("/watch")
                && !path.ends_with("/audit")
                && !path.contains("{qid}")
                && !path.contains("{cid}")
            {
                sandbox_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$response.body#/id" } }),
                );
            }
        }
    }
    for (path, links) in [
        ("/v1/sandboxes", sandbox_links),
        ("/v1/sandboxes/{id}/processes", process_links),
        ("/v1/sandboxes/{id}/sessions", session_links),
        ("/v1/sandboxes/{id}/contexts", context_links),
    ] {
        if let Some(created) = map
            .get_mut(path)
            .and_then(|item| item.pointer_mut("/post/responses/201"))
        {
            created["links"] = Value::Object(links);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_schema_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            assert!(
                doc["components"]["schemas"].get(&name).is_some(),
                "dangling $ref {name}"
            );
        }
        assert!(operations().len() >= 30, "{:?}", operations());
        let links = &doc["paths"]["/v1/sandboxes"]["post"]["responses"]["201"]["links"];
        assert!(links.as_object().unwrap().len() >= 15, "{links}");
    }

    #[test]
    fn every_operation_answers_errors_and_has_its_own_id() {
        let doc = document();
        let mut ids = std::collections::BTreeSet::new();
        for (method, path) in operations() {
            let op = &doc["paths"][&path][method.to_ascii_lowercase()];
            for range in ["4XX", "5XX"] {
                let error = &op["responses"][range];
                if method == "HEAD" {
                    assert!(error["description"].is_string(), "{method} {path} {range}");
                    continue;
                }
                assert_eq!(
                    error["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/Error",
                    "{method} {path} {range}"
                );
            }
            let id = op["operationId"].as_str().unwrap().to_owned();
            assert!(ids.insert(id.clone()), "operationId {id} twice");
        }
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }

    /// The limits the schemas state are the ones the code enforces (utoipa takes literals).
    #[test]
    fn documented_limits_are_the_enforced_ones() {
        let schemas = &document()["components"]["schemas"];
        let props = &schemas["CreateSandbox"]["properties"];
        assert_eq!(props["timeout_ms"]["maximum"], json!(MAX_MS));
        assert_eq!(props["kill_grace_ms"]["maximum"], json!(MAX_GRACE_MS));
        assert_eq!(
            schemas["StartProcess"]["properties"]["log_bytes"]["maximum"],
            json!(MAX_LOG_BYTES)
        );
        let codes = schemas["Error"]["properties"]["code"]["enum"]
            .as_array()
            .unwrap();
        assert_eq!(codes.len(), lockbox_policy::ErrorCode::ALL.len());
    }
}
