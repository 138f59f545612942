//! The console's server side through `app()` (no socket): its files with the security
//! headers, login for the session and CSRF cookies, the API with the cookie (reads work;
//! writes need the CSRF header and this server's origin), logout; transactions and journal
//! runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::{JournalSource, ServerConfig, Token};
use serde_json::{json, Value};
use tower::ServiceExt;

const TOKEN: &str = "test-token-0123456789abcdef";
const HOST: &str = "127.0.0.1:7070";

struct Console {
    app: Router,
    _state: tempfile::TempDir,
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    fn cookies(&self) -> Vec<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }
}

/// The cookies of a login: `Cookie` header value and the CSRF value.
struct LoggedIn {
    cookie: String,
    csrf: String,
}

impl Console {
    async fn start(config: ServerConfig) -> Console {
        let state = tempfile::tempdir().unwrap();
        let runtime = Runtime::open(RuntimeConfig::new(state.path())).unwrap();
        Console {
            app: lockbox_server::app(runtime, Token::new(TOKEN).unwrap(), config),
            _state: state,
        }
    }

    async fn send(&self, req: Request<Body>) -> Reply {
        let response = self.app.clone().oneshot(req).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .unwrap()
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn login(&self) -> LoggedIn {
        let reply = self.send(login_request(TOKEN)).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT);
        let value = |name: &str| {
            reply
                .cookies()
                .iter()
                .find_map(|c| c.strip_prefix(&format!("{name}=")).map(str::to_owned))
                .and_then(|c| c.split(';').next().map(str::to_owned))
                .unwrap()
        };
        let (session, csrf) = (value("lockbox_session"), value("lockbox_csrf"));
        LoggedIn {
            cookie: format!("lockbox_session={session}; lockbox_csrf={csrf}"),
            csrf,
        }
    }
}

fn request(method: &str, path: &str) -> axum::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, HOST)
}

fn login_request(token: &str) -> Request<Body> {
    request("POST", "/ui/login")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({ "token": token }).to_string()))
        .unwrap()
}

/// A POST with the cookie that would otherwise reach its handler (an unknown sandbox: 404).
fn cookie_post(s: &LoggedIn) -> axum::http::request::Builder {
    request("POST", "/v1/sandboxes/sb-missing/abort").header(header::COOKIE, &s.cookie)
}

#[tokio::test]
async fn api_without_cookie_or_bearer_is_401() {
    let c = Console::start(ServerConfig::default()).await;
    for path in ["/v1/sandboxes", "/v1/transactions", "/v1/journal/runs"] {
        let reply = c
            .send(request("GET", path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(reply.json()["code"], "UNAUTHORIZED");
    }
    let forged = request("GET", "/v1/sandboxes")
        .header(header::COOKIE, "lockbox_session=00ff")
        .body(Body::empty())
        .unwrap();
    assert_eq!(c.send(forged).await.status, StatusCode::UNAUTHORIZED);
    let probe = c
        .send(request("GET", "/ui/session").body(Body::empty()).unwrap())
        .await;
    assert_eq!(probe.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn login_with_wrong_token_is_401_and_sets_no_cookie() {
    let c = Console::start(ServerConfig::default()).await;
    let reply = c.send(login_request("wrong-token-0123456789abcdef")).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.json()["code"], "UNAUTHORIZED");
    assert!(reply.cookies().is_empty());
}

#[tokio::test]
async fn login_cookies_are_httponly_and_samesite_strict() {
    let c = Console::start(ServerConfig::default()).await;
    let reply = c.send(login_request(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let cookies = reply.cookies();
    let session = cookies
        .iter()
        .find(|c| c.starts_with("lockbox_session="))
        .unwrap();
    let csrf = cookies
        .iter()
        .find(|c| c.starts_with("lockbox_csrf="))
        .unwrap();
    assert!(session.contains("; HttpOnly"), "{session}");
    assert!(session.contains("; SameSite=Strict"), "{session}");
    assert!(session.contains("; Path=/"), "{session}");
    // 256 random bits, hex.
    assert_eq!(
        session.split(';').next().unwrap().len(),
        "lockbox_session=".len() + 64
    );
    assert!(
        !csrf.contains("HttpOnly"),
        "the console's script reads it: {csrf}"
    );
    assert!(csrf.contains("; SameSite=Strict"), "{csrf}");
}

#[tokio::test]
async fn cookie_get_works_and_logout_ends_it() {
    let c = Console::start(ServerConfig::default()).await;
    let s = c.login().await;
    let get = || {
        request("GET", "/v1/sandboxes")
            .header(header::COOKIE, &s.cookie)
            .body(Body::empty())
            .unwrap()
    };
    let reply = c.send(get()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.json()["sandboxes"].is_array());
    let probe = request("GET", "/ui/session")
        .header(header::COOKIE, &s.cookie)
        .body(Body::empty())
        .unwrap();
    assert_eq!(c.send(probe).await.json(), json!({ "authenticated": true }));

    let logout = request("POST", "/ui/logout")
        .header(header::COOKIE, &s.cookie)
        .body(Body::empty())
        .unwrap();
    let out = c.send(logout).await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    assert!(out.cookies().iter().all(|c| c.contains("Max-Age=0")));
    assert_eq!(c.send(get()).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn cookie_post_without_csrf_header_is_403() {
    let c = Console::start(ServerConfig::default()).await;
    let s = c.login().await;
    let reply = c.send(cookie_post(&s).body(Body::empty()).unwrap()).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.json()["code"], "FORBIDDEN");
    let wrong = cookie_post(&s)
        .header("x-csrf-token", "0".repeat(64))
        .body(Body::empty())
        .unwrap();
    assert_eq!(c.send(wrong).await.status, StatusCode::FORBIDDEN);
    // With the header (and from this origin) the request reaches its handler.
    let right = cookie_post(&s)
        .header("x-csrf-token", &s.csrf)
        .header(header::ORIGIN, format!("http://{HOST}"))
        .header("sec-fetch-site", "same-origin")
        .body(Body::empty())
        .unwrap();
    let reply = c.send(right).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{:?}", reply.json());
}

#[tokio::test]
async fn cross_site_post_with_the_cookie_is_403() {
    let c = Console::start(ServerConfig::default()).await;
    let s = c.login().await;
    let foreign = cookie_post(&s)
        .header("x-csrf-token", &s.csrf)
        .header(header::ORIGIN, "http://evil.example")
        .body(Body::empty())
        .unwrap();
    let reply = c.send(foreign).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .contains("evil.example"));
    let other_port = cookie_post(&s)
        .header("x-csrf-token", &s.csrf)
        .header(header::ORIGIN, "http://127.0.0.1:8080")
        .body(Body::empty())
        .unwrap();
    assert_eq!(c.send(other_port).await.status, StatusCode::FORBIDDEN);
    let read = request("GET", "/v1/sandboxes")
        .header(header::COOKIE, &s.cookie)
        .header("sec-fetch-site", "same-site")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        c.send(read).await.status,
        StatusCode::FORBIDDEN,
        "reads too"
    );
    let fetch_site = cookie_post(&s)
        .header("x-csrf-token", &s.csrf)
        .header("sec-fetch-site", "cross-site")
        .body(Body::empty())
        .unwrap();
    assert_eq!(c.send(fetch_site).await.status, StatusCode::FORBIDDEN);
    let login = request("POST", "/ui/login")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ORIGIN, "http://evil.example")
        .body(Body::from(json!({ "token": TOKEN }).to_string()))
        .unwrap();
    assert_eq!(c.send(login).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn websocket_upgrade_with_the_cookie_needs_this_origin() {
    let c = Console::start(ServerConfig::default()).await;
    let s = c.login().await;
    let ws = |origin: Option<&str>| {
        let mut r = request("GET", "/v1/sandboxes/sb-missing/processes/p1/ws")
            .header(header::COOKIE, &s.cookie)
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "upgrade");
        if let Some(o) = origin {
            r = r.header(header::ORIGIN, o);
        }
        r.body(Body::empty()).unwrap()
    };
    assert_eq!(c.send(ws(None)).await.status, StatusCode::FORBIDDEN);
    let foreign = c.send(ws(Some("http://evil.example"))).await.status;
    assert_eq!(foreign, StatusCode::FORBIDDEN);
    let own = c.send(ws(Some(&format!("http://{HOST}")))).await.status;
    assert_ne!(own, StatusCode::FORBIDDEN);
    assert_ne!(own, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn console_files_carry_csp_and_security_headers() {
    let c = Console::start(ServerConfig::default()).await;
    for path in ["/ui", "/ui/", "/ui/branches/some-id"] {
        let reply = c
            .send(request("GET", path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        let h = |name: &str| {
            reply
                .headers
                .get(name)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert!(h("content-type").starts_with("text/html"), "{path}");
        let csp = h("content-security-policy");
        assert!(
            csp.starts_with("default-src 'none'; script-src 'self';"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(h("x-content-type-options"), "nosniff");
        assert_eq!(h("referrer-policy"), "no-referrer");
        assert_eq!(h("x-frame-options"), "DENY");
        assert_eq!(h("cache-control"), "no-store");
        assert!(String::from_utf8_lossy(&reply.body).contains("id=\"token\""));
    }
    // The page names its assets at a versioned address, where they are immutable.
    let page = c
        .send(request("GET", "/ui").body(Body::empty()).unwrap())
        .await;
    let page = String::from_utf8_lossy(&page.body).into_owned();
    let start = page.find("src=\"/ui/v/").unwrap() + "src=\"".len();
    let app = &page[start..start + page[start..].find('"').unwrap()];
    assert!(
        app.ends_with("/js/app.js") && !page.contains("/ui/@/"),
        "{page}"
    );
    let versioned = c
        .send(request("GET", app).body(Body::empty()).unwrap())
        .await;
    assert_eq!(versioned.status, StatusCode::OK);
    assert_eq!(
        versioned.headers["cache-control"],
        "public, max-age=31536000, immutable"
    );
    let older = c
        .send(
            request("GET", "/ui/v/0123456789abcdef/js/app.js")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(older.status, StatusCode::OK);
    assert_eq!(older.headers["cache-control"], "no-cache");
    assert_eq!(older.body, versioned.body);
    let get = |path: &str| request("GET", path).body(Body::empty()).unwrap();
    let script = c.send(get("/ui/js/app.js")).await;
    assert_eq!(script.status, StatusCode::OK);
    let content_type = script.headers["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/javascript"),
        "{content_type}"
    );
    assert_eq!(script.headers["cache-control"], "no-cache");
    let again = request("GET", "/ui/js/app.js")
        .header(header::IF_NONE_MATCH, script.headers["etag"].clone())
        .body(Body::empty())
        .unwrap();
    let again = c.send(again).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty());
    assert!(again.headers.contains_key("content-security-policy"));
    let missing = c
        .send(
            request("GET", "/ui/missing.js")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.headers.contains_key("content-security-policy"));
    let escape = c
        .send(
            request("GET", "/ui/../Cargo.toml")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_ne!(escape.status, StatusCode::OK);
}

#[tokio::test]
async fn transactions_are_listed_and_unknown_ones_are_404() {
    let c = Console::start(ServerConfig::default()).await;
    let s = c.login().await;
    let get = |path: &str| {
        request("GET", path)
            .header(header::COOKIE, &s.cookie)
            .body(Body::empty())
            .unwrap()
    };
    let reply = c.send(get("/v1/transactions")).await;
    assert_eq!(reply.json(), json!({ "transactions": [] }));
    let missing = c.send(get("/v1/transactions/t1234-1-0")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["code"], "TXN_NOT_FOUND");
    let bad = c.send(get("/v1/transactions/..%2Fx")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn journal_runs_are_listed_with_their_steps() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("j.db").display());
    let storage = lockbox_journal::StorageUrl::parse(&url)
        .unwrap()
        .open()
        .await
        .unwrap();
    let journal = lockbox_journal::Journal::open(storage);
    let id = lockbox_journal::RunId::parse("agent-1").unwrap();
    let run = journal.start(&id, Default::default()).await.unwrap();
    let v = run
        .record("llm", || async { Ok::<u32, String>(42) })
        .await
        .unwrap();
    assert_eq!(v, 42);
    let config = ServerConfig {
        journal: Some(JournalSource {
            url: url.clone(),
            journal,
        }),
        ..ServerConfig::default()
    };
    let c = Console::start(config).await;
    let get = |path: &str| {
        request("GET", path)
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap()
    };
    let list = c.send(get("/v1/journal/runs")).await.json();
    assert_eq!(list["journal"], url);
    assert_eq!(list["runs"][0]["id"], "agent-1");
    assert_eq!(list["runs"][0]["status"], "running");
    assert_eq!(list["runs"][0]["steps"], 1);
    let one = c.send(get("/v1/journal/runs/agent-1")).await.json();
    assert_eq!(one["id"], "agent-1");
    assert!(one["entries"].as_array().unwrap().len() >= 2, "{one}");
    let missing = c.send(get("/v1/journal/runs/nope")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // Without a journal: an empty list, and 404 NO_JOURNAL for a run.
    let none = Console::start(ServerConfig::default()).await;
    let list = none.send(get("/v1/journal/runs")).await.json();
    assert_eq!(list, json!({ "journal": null, "runs": [] }));
    let run = none.send(get("/v1/journal/runs/agent-1")).await;
    assert_eq!(run.json()["code"], "NO_JOURNAL");
}
