//! The HTTP layer on a real socket (127.0.0.1:0) with a real client: auth on every route,
//! error format and codes, request validation, limits, the OpenAPI document. No sandbox is
//! started here (those tests run the `lockbox serve` binary: lockbox-cli/tests/serve.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::{ServerConfig, Token};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const TOKEN: &str = "test-token-0123456789abcdef";

struct Server {
    base: String,
    client: reqwest::Client,
    _state: tempfile::TempDir,
}

impl Server {
    async fn start(config: ServerConfig) -> Server {
        let state = tempfile::tempdir().unwrap();
        let runtime = Runtime::open(RuntimeConfig::new(state.path())).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let token = Token::new(TOKEN).unwrap();
        tokio::spawn(lockbox_server::serve(
            listener,
            runtime,
            token,
            config,
            std::future::pending(),
        ));
        Server {
            base,
            client: reqwest::Client::new(),
            _state: state,
        }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
    }

    fn anonymous(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }
}

/// Status and JSON error body; asserts the body has the error shape.
async fn error(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(body["code"].is_string(), "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert!(body["details"].is_object(), "{body}");
    (status, body)
}

/// Every operation of the OpenAPI document, path parameters filled in.
fn operations() -> Vec<(Method, String)> {
    lockbox_server::openapi::operations()
        .into_iter()
        .map(|(method, path)| {
            let path = path
                .replace("{id}", "sb-none")
                .replace("{pid}", "p1")
                .replace("{sid}", "s1")
                .replace("{cid}", "c1")
                .replace("{port}", "8000")
                .replace("{path}", "index.html");
            (Method::from_bytes(method.as_bytes()).unwrap(), path)
        })
        .collect()
}

#[tokio::test]
async fn every_route_but_healthz_refuses_requests_without_the_token() {
    let server = Server::start(ServerConfig::default()).await;
    let ops = operations();
    assert!(ops.len() >= 30, "{ops:?}");
    for (method, path) in ops {
        let response = server
            .anonymous(method.clone(), &path)
            .send()
            .await
            .unwrap();
        if path == "/healthz" {
            assert_eq!(response.status(), StatusCode::OK);
            continue;
        }
        if path.starts_with("/ui/") {
            // The console's login, logout and session probe: public by design.
            continue;
        }
        assert_eq!(
            response.headers().get("www-authenticate").unwrap(),
            "Bearer"
        );
        if method == Method::HEAD {
            // No body to a HEAD: the status says it.
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path}"
            );
        } else {
            let (status, body) = error(response).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
            assert_eq!(body["code"], "UNAUTHORIZED", "{method} {path}");
        }

        let wrong = server
            .anonymous(method.clone(), &path)
            .bearer_auth("test-token-0123456789abcdeX")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    // Unknown routes too: nothing is reachable without the token.
    let response = server
        .anonymous(Method::GET, "/v2/nothing")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

/// Every route of the router (`routes::router`, read from its source) is in the document
/// with its methods, and the document describes nothing else. Not described: `/` (a
/// redirect), the console's page and static files, and `/mcp` (docs/mcp.md). A proxied port
/// takes any method; the document says GET.
#[test]
fn every_route_is_documented_and_nothing_else() {
    let source =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/routes/mod.rs")).unwrap();
    let mut routed = std::collections::BTreeSet::new();
    for call in source.split(".route(").skip(1) {
        let call = call.split(".merge(").next().unwrap();
        let call = call.split(".fallback(").next().unwrap();
        // The first argument: a literal, a `format!`, or the `sandbox`/`process` prefixes.
        let first = call.split(',').next().unwrap().trim();
        let literal = match first {
            "sandbox" => "{sandbox}",
            "process" => "{process}",
            _ => call.split('"').nth(1).unwrap(),
        };
        let path = literal
            .replace("{sandbox}", "/v1/sandboxes/{id}")
            .replace("{process}", "/v1/sandboxes/{id}/processes/{pid}")
            .replace("{{", "{")
            .replace("}}", "}")
            .replace("{*", "{");
        if ["/", "/mcp", "/ui", "/ui/", "/ui/{file}"].contains(&path.as_str()) {
            continue;
        }
        let handlers = call.split_once(',').map_or(call, |(_, rest)| rest);
        for (token, method) in [
            ("get(", "GET"),
            ("post(", "POST"),
            ("put(", "PUT"),
            ("delete(", "DELETE"),
            ("head(", "HEAD"),
            ("any(", "GET"),
        ] {
            let found = handlers
                .match_indices(token)
                .any(|(i, _)| i == 0 || !handlers.as_bytes()[i - 1].is_ascii_alphanumeric());
            if found {
                routed.insert((method.to_owned(), path.clone()));
            }
        }
    }
    let documented: std::collections::BTreeSet<_> =
        lockbox_server::openapi::operations().into_iter().collect();
    let missing: Vec<_> = routed.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&routed).collect();
    assert!(missing.is_empty(), "routed but not documented: {missing:?}");
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");
    assert!(routed.len() >= 60, "{routed:?}");
}

#[tokio::test]
async fn every_documented_operation_is_routed() {
    let server = Server::start(ServerConfig::default()).await;
    for (method, path) in operations() {
        let response = server.request(method.clone(), &path).send().await.unwrap();
        if response.status().is_success() {
            continue;
        }
        if method == Method::HEAD {
            // No body to tell a missing route from a refused request: the route's own
            // answers (400 without `reference`) are neither 404 nor 405.
            assert!(
                ![StatusCode::NOT_FOUND, StatusCode::METHOD_NOT_ALLOWED]
                    .contains(&response.status()),
                "{method} {path} is documented but not routed: {}",
                response.status()
            );
            continue;
        }
        let (_, body) = error(response).await;
        assert!(
            !matches!(
                body["code"].as_str().unwrap(),
                "NOT_FOUND" | "METHOD_NOT_ALLOWED"
            ),
            "{method} {path} is documented but not routed: {body}"
        );
    }
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let server = Server::start(ServerConfig::default()).await;
    let (status, body) = error(
        server
            .request(Method::GET, "/v1/nope")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("NOT_FOUND"))
    );
    let (status, body) = error(
        server
            .request(Method::PATCH, "/v1/sandboxes")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("METHOD_NOT_ALLOWED"))
    );
}

#[tokio::test]
async fn unknown_sandbox_is_404_sandbox_not_found_on_every_sandbox_route() {
    let server = Server::start(ServerConfig::default()).await;
    let bodies = [
        ("/v1/sandboxes/sb-none", Method::GET, json!(null)),
        ("/v1/sandboxes/sb-none", Method::DELETE, json!(null)),
        (
            "/v1/sandboxes/sb-none/exec",
            Method::POST,
            json!({ "command": "true" }),
        ),
        ("/v1/sandboxes/sb-none/processes", Method::GET, json!(null)),
        (
            "/v1/sandboxes/sb-none/fs/stat?path=/tmp",
            Method::GET,
            json!(null),
        ),
        ("/v1/sandboxes/sb-none/changes", Method::GET, json!(null)),
    ];
    for (path, method, body) in bodies {
        let mut request = server.request(method.clone(), path);
        if !body.is_null() {
            request = request.json(&body);
        }
        let (status, body) = error(request.send().await.unwrap()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(body["code"], "SANDBOX_NOT_FOUND", "{method} {path}");
        assert_eq!(body["details"]["id"], "sb-none", "{body}");
    }
}

#[tokio::test]
async fn malformed_or_invalid_json_is_400_naming_the_field() {
    let server = Server::start(ServerConfig::default()).await;
    let cases: &[(&str, &str, &str)] = &[
        ("/v1/sandboxes/x/exec", r#"{"command": 5}"#, "command"),
        ("/v1/sandboxes/x/exec", r#"{"cmd": "ls"}"#, "cmd"),
        ("/v1/sandboxes/x/exec", r#"{}"#, "command"),
        (
            "/v1/sandboxes/x/exec",
            r#"{"command": "x", "timeout_ms": -1}"#,
            "timeout_ms",
        ),
        (
            "/v1/sandboxes/x/exec",
            r#"{"command": "x", "timeout_ms": 0}"#,
            "timeout_ms",
        ),
        (
            "/v1/sandboxes/x/exec",
            r#"{"command": "x", "stdin_b64": "%%%"}"#,
            "stdin_b64",
        ),
        (
            "/v1/sandboxes/x/exec",
            r#"{"command": "x", "env": {"A": 1}}"#,
            "env.A",
        ),
        ("/v1/sandboxes/x/exec", r#"{"command": "#, "command"),
        ("/v1/sandboxes/x/exec", r#"[1, 2"#, ""),
        ("/v1/sandboxes", r#"{"max_memory": "lots"}"#, "max_memory"),
        ("/v1/sandboxes", r#"{"net": "internet"}"#, "net"),
        ("/v1/sandboxes", r#"{"max_inodes": 0}"#, "max_inodes"),
        (
            "/v1/sandboxes",
            r#"{"fs_writable": ["relative/dir"]}"#,
            "fs_writable",
        ),
        (
            "/v1/sandboxes",
            r#"{"fs_readable": ["/proc"]}"#,
            "fs_readable",
        ),
        ("/v1/sandboxes", r#"{"hostname": "no spaces"}"#, "hostname"),
        ("/v1/sandboxes", r#"{"on_exit": "explode"}"#, "on_exit"),
        (
            "/v1/sandboxes",
            r#"{"timeout_ms": 99999999999999}"#,
            "timeout_ms",
        ),
        ("/v1/sandboxes", r#"{"policy": {}}"#, "policy"),
        ("/v1/sandboxes/x/processes", r#"{"argv": []}"#, "argv"),
        (
            "/v1/sandboxes/x/processes",
            r#"{"argv": ["a"], "command": "b"}"#,
            "argv",
        ),
        (
            "/v1/sandboxes/x/processes",
            r#"{"command": "a", "pty": {"cols": 0, "rows": 5}}"#,
            "pty",
        ),
        (
            "/v1/sandboxes/x/processes/p1/signal",
            r#"{"signal": "SIGNOPE"}"#,
            "signal",
        ),
        (
            "/v1/sandboxes/x/processes/p1/signal",
            r#"{"signal": 99}"#,
            "signal",
        ),
        ("/v1/sandboxes/x/fs/move", r#"{"from": "/a"}"#, "to"),
    ];
    for (path, body, field) in cases {
        let response = server
            .request(Method::POST, path)
            .header("content-type", "application/json")
            .body(*body)
            .send()
            .await
            .unwrap();
        let (status, error) = error(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {error}");
        assert_eq!(error["code"], "INVALID_REQUEST", "{path} {body}");
        assert_eq!(error["details"]["field"], *field, "{path} {body}: {error}");
        if !field.is_empty() {
            let message = error["message"].as_str().unwrap();
            let leaf = field.rsplit('.').next().unwrap();
            assert!(message.contains(leaf), "message names {leaf}: {message}");
        }
    }
}

#[tokio::test]
async fn bad_query_parameters_are_400_naming_the_parameter() {
    let server = Server::start(ServerConfig::default()).await;
    let cases = [
        ("/v1/sandboxes/x/files", "path"),
        (
            "/v1/sandboxes/x/fs/list?path=/&recursive=maybe",
            "recursive",
        ),
        ("/v1/sandboxes/x/processes/p1/logs?since=-4", "since"),
        ("/v1/sandboxes/x/processes/p1/logs?bogus=1", "bogus"),
    ];
    for (path, field) in cases {
        let (status, error) = error(server.request(Method::GET, path).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["details"]["field"], field, "{path}: {error}");
    }
}

#[tokio::test]
async fn non_json_content_type_is_415() {
    let server = Server::start(ServerConfig::default()).await;
    let response = server
        .request(Method::POST, "/v1/sandboxes/x/exec")
        .header("content-type", "text/plain")
        .body("ls")
        .send()
        .await
        .unwrap();
    let (status, body) = error(response).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(body["code"], "UNSUPPORTED_MEDIA_TYPE");
}

#[tokio::test]
async fn bodies_over_max_body_are_413_payload_too_large() {
    let server = Server::start(ServerConfig {
        max_body: 1024,
        ..ServerConfig::default()
    })
    .await;
    let command = "x".repeat(4096);
    let response = server
        .request(Method::POST, "/v1/sandboxes/x/exec")
        .json(&json!({ "command": command }))
        .send()
        .await
        .unwrap();
    let (status, body) = error(response).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["code"], "PAYLOAD_TOO_LARGE");
}

#[tokio::test]
async fn healthz_and_openapi_describe_the_server() {
    let server = Server::start(ServerConfig::default()).await;
    let health: Value = server
        .anonymous(Method::GET, "/healthz")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let doc: Value = server
        .request(Method::GET, "/openapi.json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/v1/sandboxes/{id}/exec/stream",
        "/v1/sandboxes/{id}/processes/{pid}/logs",
        "/v1/sandboxes/{id}/processes/{pid}/pty",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/commit",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    let codes = doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap();
    for code in [
        "UNAUTHORIZED",
        "SANDBOX_NOT_FOUND",
        "PATH_OUTSIDE_SANDBOX",
        "LIMIT_REACHED",
    ] {
        assert!(codes.iter().any(|c| c == code), "{code} not documented");
    }
}

#[tokio::test]
async fn committing_sandboxes_together_checks_each_field_and_names_unknown_sandboxes_404() {
    let server = Server::start(ServerConfig::default()).await;
    let cases: &[(&str, &str)] = &[
        (r#"{"kind": "pipeline", "sandboxes": ["sb-a"]}"#, "kind"),
        (r#"{"sandboxes": ["sb-a"]}"#, "kind"),
        (r#"{"kind": "gather"}"#, "sandboxes"),
        (r#"{"kind": "gather", "sandboxes": []}"#, "sandboxes"),
        (
            r#"{"kind": "gather", "sandboxes": ["sb-a", "sb-a"]}"#,
            "sandboxes",
        ),
        (
            r#"{"kind": "gather", "sandboxes": ["sb-a"], "conflicts": "newest"}"#,
            "conflicts",
        ),
        (
            r#"{"kind": "gather", "sandboxes": ["sb-a"], "dry_run": "yes"}"#,
            "dry_run",
        ),
        (
            r#"{"kind": "gather", "sandboxes": ["sb-a"], "policy": "fail"}"#,
            "policy",
        ),
    ];
    for (body, field) in cases {
        let response = server
            .request(Method::POST, "/v1/transactions")
            .json(&serde_json::from_str::<Value>(body).unwrap())
            .send()
            .await
            .unwrap();
        let (status, error) = error(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {error}");
        assert_eq!(error["code"], "INVALID_REQUEST", "{body}");
        assert_eq!(error["details"]["field"], *field, "{body}: {error}");
    }
    let response = server
        .request(Method::POST, "/v1/transactions")
        .json(&json!({"kind": "gather", "sandboxes": ["sb-nothere"], "conflicts": "markers"}))
        .send()
        .await
        .unwrap();
    let (status, error) = error(response).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(error["code"], "SANDBOX_NOT_FOUND");
    assert_eq!(error["details"]["id"], "sb-nothere");
}
