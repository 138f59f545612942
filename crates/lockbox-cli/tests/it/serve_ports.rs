//! Exposed ports through `lockbox serve`: a stdlib Python server inside the sandbox is
//! fetched through the proxy (HTTP and WebSocket), never sees the API's token, and the
//! host loopback port forwards to it; as the current user and (as root) uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use common::users;
use futures_util::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{state_dir, tokio, Served};
use std::time::Duration;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

const SERVER: &str = include_str!("serve_ports/server.py");
const PORT: u16 = 8700;

/// Writes the test server into the sandbox, starts it and exposes its port.
async fn start_server(server: &Served, id: &str, host_loopback: bool) -> Value {
    let put = server
        .request(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/server.py"),
        )
        .body(SERVER)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK, "{:?}", put.text().await);
    let (status, p) = server
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            json!({ "argv": ["python3", "/tmp/server.py", PORT.to_string(), "/tmp/headers.log"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{p}");
    let (status, info) = server
        .json(
            Method::POST,
            &format!("/v1/sandboxes/{id}/ports"),
            json!({ "port": PORT, "host_loopback": host_loopback }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    info
}

/// GET through the proxy, retried while the server is still starting (502).
async fn get_when_listening(server: &Served, path: &str) -> reqwest::Response {
    for _ in 0..200 {
        let r = server.request(Method::GET, path).send().await.unwrap();
        if r.status() != StatusCode::BAD_GATEWAY {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server in the sandbox never listened");
}

#[test]
fn a_server_inside_is_reached_through_the_proxy_without_seeing_the_token() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let base = format!("/v1/sandboxes/{id}/ports/{PORT}");
            // Not exposed yet: 404 with its own code.
            let r = server
                .request(Method::GET, &format!("{base}/"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NOT_FOUND);
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["code"], "PORT_NOT_EXPOSED", "{body}");

            let info = start_server(&server, &id, false).await;
            assert_eq!(info["path"], format!("{base}/"));
            assert!(info.get("host_address").is_none(), "{info}");

            let r = get_when_listening(&server, &format!("{base}/a/b.txt?x=1")).await;
            assert_eq!(r.status(), StatusCode::OK, "{user:?}");
            assert!(r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("sandbox"));
            assert!(
                r.headers().get("set-cookie").is_none(),
                "lockbox's cookie name is dropped"
            );
            assert_eq!(r.text().await.unwrap(), "hello /a/b.txt?x=1");
            let r = server
                .request(Method::GET, &format!("{base}/"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.text().await.unwrap(), "hello /");
            // A body goes through, with the console's cookies removed and the app's kept.
            let r = server
                .request(Method::POST, &format!("{base}/echo"))
                .header("cookie", "lockbox_session=s3cret; app=1; lockbox_csrf=c5rf")
                .header("x-csrf-token", "c5rf")
                .body("posted")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
            assert_eq!(r.text().await.unwrap(), "posted");

            // The sandboxed server saw no credential of lockbox's.
            let log = server
                .request(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files?path=/tmp/headers.log"),
                )
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            assert!(!log.contains(&server.token), "{log}");
            assert!(!log.contains("s3cret") && !log.contains("c5rf"), "{log}");
            let last: Value = serde_json::from_str(log.lines().last().unwrap())
                .unwrap_or_else(|e| panic!("{e}: {log}"));
            let header = |name: &str| {
                let headers = last["headers"].as_object().unwrap();
                headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(header("authorization"), None, "{log}");
            assert_eq!(header("x-csrf-token"), None, "{log}");
            assert_eq!(header("cookie"), Some(json!("app=1")), "{log}");
            assert_eq!(
                header("host"),
                Some(json!(format!("localhost:{PORT}"))),
                "{log}"
            );

            // WebSocket through the proxy: upgrade on both sides, frames round-trip.
            let url = format!("{}{base}/ws", server.base.replace("http://", "ws://"));
            let mut request = url.as_str().into_client_request().unwrap();
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {}", server.token).parse().unwrap(),
            );
            let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            ws.send(Message::Text("ping through the proxy".into()))
                .await
                .unwrap();
            let reply = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(reply, Message::Text("echo: ping through the proxy".into()));
            ws.close(None).await.unwrap();

            // Listed, then unexposed: the proxy answers 404 again.
            let (status, list) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/ports"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(list["ports"][0]["port"], PORT, "{list}");
            let r = server.request(Method::DELETE, &base).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT);
            let r = server
                .request(Method::GET, &format!("{base}/"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NOT_FOUND);
        });
    }
}

#[test]
fn an_exposed_port_without_a_listener_is_502_and_host_loopback_forwards() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let (status, _) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/ports"),
                    json!({ "port": 9 }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED);
            let r = server
                .request(Method::GET, &format!("/v1/sandboxes/{id}/ports/9/"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["code"], "PORT_NOT_LISTENING", "{body}");

            let (status, body) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/ports"),
                    json!({ "port": 70000 }),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert_eq!(body["details"]["field"], "port", "{body}");

            let info = start_server(&server, &id, true).await;
            let host = info["host_address"].as_str().unwrap().to_owned();
            get_when_listening(&server, &format!("/v1/sandboxes/{id}/ports/{PORT}/")).await;
            // Straight to the host port: no token needed, the sandboxed server answers.
            let r = reqwest::get(format!("http://{host}/direct")).await.unwrap();
            assert_eq!(r.text().await.unwrap(), "hello /direct");
        });
    }
}

/// A browser's cookie jar, reduced to what issue 32 needs: cookies are kept per host *name*
/// (or per `Domain`, then sent to every host under it), whatever the port.
#[derive(Default)]
struct Jar(Vec<(String, String)>);

impl Jar {
    /// Keeps the cookies `response`, from `host`, sets.
    fn keep(&mut self, host: &str, response: &reqwest::Response) {
        for value in response.headers().get_all("set-cookie") {
            let text = value.to_str().unwrap();
            let mut parts = text.split(';').map(str::trim);
            let pair = parts.next().unwrap().to_owned();
            let scope = parts
                .find_map(|a| {
                    let (k, v) = a.split_once('=')?;
                    k.eq_ignore_ascii_case("domain")
                        .then(|| v.trim_start_matches('.').to_owned())
                })
                .unwrap_or_else(|| host.to_owned());
            self.0.push((scope, pair));
        }
    }

    /// The `Cookie` header a browser sends to `host`.
    fn header(&self, host: &str) -> String {
        let sent: Vec<&str> = self
            .0
            .iter()
            .filter(|(scope, _)| host == scope || host.ends_with(&format!(".{scope}")))
            .map(|(_, pair)| pair.as_str())
            .collect();
        sent.join("; ")
    }
}

#[test]
fn issue_32_cookies_a_sandbox_sets_never_reach_the_console_origin() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let info = start_server(&server, &id, false).await;
            get_when_listening(&server, &format!("/v1/sandboxes/{id}/ports/{PORT}/")).await;
            let api = server.addr().split(':').next().unwrap().to_owned();
            let ports: std::net::SocketAddr =
                server.ports_listen.as_ref().unwrap().parse().unwrap();
            let host = format!("{PORT}-{id}.localhost");
            let origin = format!("http://{host}:{}", ports.port());
            let mut jar = Jar::default();
            // What a browser does: *.localhost is the loopback, no redirect followed by itself.
            let browser = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .resolve(&host, ports)
                .build()
                .unwrap();

            // The API's proxy (bearer token): the 80 KB of cookies are not let through.
            let r = server
                .request(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/ports/{PORT}/cookies"),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{user:?}");
            assert!(r.headers().get("clear-site-data").is_none());
            jar.keep(&api, &r);
            let r = server
                .request(Method::GET, "/v1/sandboxes")
                .header("cookie", jar.header(&api))
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                StatusCode::OK,
                "the API answers a client that kept them"
            );

            assert_eq!(info["origin"], origin, "{info}");
            let open_url = info["open_url"].as_str().unwrap().to_owned();
            assert!(open_url.starts_with(&format!("{origin}/__lockbox/open?key=")));

            // A browser logged in to the console is sent to the port's own origin.
            let r = browser
                .post(format!("{}/ui/login", server.base))
                .json(&json!({ "token": server.token }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NO_CONTENT);
            jar.keep(&api, &r);
            let r = browser
                .get(format!(
                    "{}/v1/sandboxes/{id}/ports/{PORT}/a?b=1",
                    server.base
                ))
                .header("cookie", jar.header(&api))
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                StatusCode::SEE_OTHER,
                "never a page on the console's origin"
            );
            assert!(r.headers().get("set-cookie").is_none());
            let location = r.headers()["location"].to_str().unwrap().to_owned();
            assert_eq!(location, format!("{open_url}&to=%2Fa%3Fb%3D1"));

            // Without its key or the token the port's origin is closed; a host that names
            // no port is nothing.
            let r = browser
                .get(format!("{origin}/cookies"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            let r = browser
                .get(format!("{origin}/__lockbox/open?key=00"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            let r = browser
                .get(format!("http://{ports}/"))
                .bearer_auth(&server.token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NOT_FOUND);

            // The open URL sets the port's access cookie (host-only) and goes on.
            let r = browser.get(&location).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::SEE_OTHER);
            assert_eq!(r.headers()["location"], "/a?b=1");
            jar.keep(&host, &r);
            let r = browser
                .get(format!("{origin}/a?b=1"))
                .header("cookie", jar.header(&host))
                .send()
                .await
                .unwrap();
            assert_eq!(r.text().await.unwrap(), "hello /a?b=1");

            // The page sets its 80 KB: on its own host only, and none of lockbox's names.
            let r = browser
                .get(format!("{origin}/cookies"))
                .header("cookie", jar.header(&host))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            assert!(r.headers().get("clear-site-data").is_none());
            let set: Vec<String> = r
                .headers()
                .get_all("set-cookie")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            assert_eq!(set.len(), 21, "{set:?}");
            assert!(set
                .iter()
                .all(|c| !c.to_ascii_lowercase().contains("domain")));
            assert!(set.iter().all(|c| !c.starts_with("lockbox_")));
            jar.keep(&host, &r);
            assert!(jar.header(&host).len() > 80_000);

            // That browser still has the console and the API...
            for path in ["/ui/session", "/v1/sandboxes", "/ui/"] {
                let r = browser
                    .get(format!("{}{path}", server.base))
                    .header("cookie", jar.header(&api))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::OK, "{path}");
            }
            // ...and the sandbox broke its own origin only (lockbox's 64 KiB head bound).
            let r = browser
                .get(format!("{origin}/"))
                .header("cookie", jar.header(&host))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

            // Programs reach the port's origin with the token, WebSockets too.
            let r = browser
                .get(format!("{origin}/t"))
                .bearer_auth(&server.token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.text().await.unwrap(), "hello /t");
            let mut request = format!("ws://{host}:{}/ws", ports.port())
                .into_client_request()
                .unwrap();
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {}", server.token).parse().unwrap(),
            );
            let stream = tokio::net::TcpStream::connect(ports).await.unwrap();
            let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
                .await
                .unwrap();
            ws.send(Message::Text("on its own origin".into()))
                .await
                .unwrap();
            let reply = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(reply, Message::Text("echo: on its own origin".into()));

            // The sandboxed server never saw the key or the token.
            let log = server
                .request(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files?path=/tmp/headers.log"),
                )
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let key = open_url.rsplit('=').next().unwrap();
            assert!(!log.contains(key) && !log.contains(&server.token), "{log}");
        });
    }
}

#[test]
fn issue_32_without_a_ports_listener_a_browser_gets_no_sandbox_page() {
    let user = users()[0];
    let state = state_dir(user);
    let server = Served::start(user, state.path(), &["--ports-listen", "off"]);
    assert_eq!(server.ports_listen, None);
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let info = start_server(&server, &id, false).await;
        assert!(
            info.get("origin").is_none() && info.get("open_url").is_none(),
            "{info}"
        );
        let r = server
            .client
            .post(format!("{}/ui/login", server.base))
            .json(&json!({ "token": server.token }))
            .send()
            .await
            .unwrap();
        let mut jar = Jar::default();
        jar.keep("127.0.0.1", &r);
        let r = server
            .client
            .get(format!("{}/v1/sandboxes/{id}/ports/{PORT}/", server.base))
            .header("cookie", jar.header("127.0.0.1"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let body: Value = r.json().await.unwrap();
        assert!(
            body["message"].as_str().unwrap().contains("--ports-listen"),
            "{body}"
        );
    });
    for (flag, bad) in [
        ("--ports-domain", "not a name"),
        ("--ports-domain", "-x.localhost"),
        ("--ports-listen", "localhost"),
    ] {
        let out = common::command_as(user)
            .args(["serve", &format!("{flag}={bad}"), "--state-dir"])
            .arg(state.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains(flag), "{bad}: {stderr}");
    }
}

#[test]
fn issue_32_the_ports_listener_shares_the_connection_cap() {
    use std::io::{Read, Write};
    let user = users()[0];
    let state = state_dir(user);
    let server = Served::start(user, state.path(), &["--max-connections", "2"]);
    let ports = server.ports_listen.clone().unwrap();
    // Two kept-alive connections to the ports listener, each answered once: both hold their
    // place under the cap.
    let held: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(&ports).unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nHost: 1-sb-none.localhost\r\n\r\n")
                .unwrap();
            let mut head = [0u8; 12];
            c.read_exact(&mut head).unwrap();
            assert_eq!(&head, b"HTTP/1.1 401", "no token, no key");
            c
        })
        .collect();
    tokio().block_on(async {
        let r = server
            .request(Method::GET, "/v1/sandboxes")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    });
    drop(held);
}
