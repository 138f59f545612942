//! `lockbox serve` against hostile clients and hostile sandboxes (issue 15, item 6): what
//! they can make the server hold is measured from the host side (the server's VmHWM and
//! descriptors, reply sizes, connections it closes), with the real binary and real
//! sockets, as the current user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use common::{users, User};
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{output_bytes, read_sse, state_dir, tokio, Served};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// `--max-exec-output` by default.
const DEFAULT_CAP: usize = 16 << 20;
/// The issue's target: one hostile exec costs the server at most this much memory.
const TARGET_GROWTH_KIB: u64 = 64 * 1024;

/// Reads a response body, failing as soon as it exceeds `limit` bytes (the old server
/// sent gigabytes).
async fn body_at_most(response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk.unwrap());
        assert!(
            body.len() <= limit,
            "the reply passed {limit} bytes: the output cap is not enforced"
        );
    }
    body
}

#[test]
fn issue_15_exec_output_is_capped_while_read_and_sent_once() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({ "max_memory": "64M" })).await;
            server.exec(&id, json!({ "command": "echo warm" })).await;
            let idle = server.status_kib("VmHWM");
            // 64 MiB of NULs on stdout (base64 is shorter than \u0000 text), 64 MiB of text
            // on stderr: four times the cap each.
            let command = "head -c 64M /dev/zero; yes abcdefgh | head -c 64M >&2";
            let response = server
                .request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(&json!({ "command": command }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            // Each stream once, at most 4/3 of the cap: the NULs as base64, the text as is.
            let limit = 2 * (DEFAULT_CAP / 3 + 1) * 4 + 1024;
            let body = body_at_most(response, limit).await;
            let peak = server.status_kib("VmHWM");
            let reply: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(reply["exit_code"], 0, "{user:?}");
            assert_eq!(reply["stdout_truncated"], true);
            assert_eq!(reply["stderr_truncated"], true);
            let stdout = output_bytes(&reply, "stdout");
            let stderr = output_bytes(&reply, "stderr");
            assert!(reply.get("stdout_b64").is_some(), "NULs travel as base64");
            assert!(reply.get("stderr").is_some(), "plain text travels as text");
            assert_eq!(stdout.len(), DEFAULT_CAP);
            assert!(stdout.iter().all(|&b| b == 0));
            assert_eq!(stderr.len(), DEFAULT_CAP);
            assert!(stderr.starts_with(b"abcdefgh\nabcdefgh\n"));
            eprintln!(
                "{user:?}: server VmHWM {idle} KiB idle, {peak} KiB after the exec; reply {} bytes",
                body.len()
            );
            assert!(
                peak - idle <= TARGET_GROWTH_KIB,
                "{user:?}: the server grew by {} KiB for one exec",
                peak - idle
            );
            // The session is still usable, and small output is unchanged.
            let small = server.exec(&id, json!({ "command": "echo hi" })).await;
            assert_eq!(small["stdout"], "hi\n");
            assert_eq!(small["stdout_truncated"], false);
        });
    }
}

#[test]
fn issue_15_a_streamed_exec_reads_no_faster_than_its_client() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &[]);
    tokio().block_on(async {
        let id = server.sandbox(json!({ "max_memory": "64M" })).await;
        server.exec(&id, json!({ "command": "echo warm" })).await;
        let idle = server.status_kib("VmHWM");
        let response = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec/stream"))
            .json(&json!({ "command": "head -c 80M /dev/zero; echo done >&2" }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // The client reads nothing for a while: /dev/zero produces 80 MiB in far less. The
        // old server queued all of it (unbounded channel); now the command waits.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let stalled = server.status_kib("VmHWM");
        eprintln!("server VmHWM {idle} KiB idle, {stalled} KiB while the client read nothing");
        assert!(
            stalled - idle <= TARGET_GROWTH_KIB,
            "the server queued {} KiB for a client that read nothing",
            stalled - idle
        );
        let mut stdout = 0usize;
        let mut stderr = Vec::new();
        for event in read_sse(response, |e| e.event == "exit" || e.event == "error").await {
            if event.event == "stdout" {
                // NULs come as base64, counted rather than parsed (this test is about memory).
                let b64 = event.data.strip_prefix(r#"{"data_b64":""#).unwrap();
                let b64 = b64.strip_suffix(r#""}"#).unwrap();
                stdout += b64.len() / 4 * 3 - (b64.len() - b64.trim_end_matches('=').len());
                continue;
            }
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            match event.event.as_str() {
                "stderr" => stderr.extend(output_bytes(&data, "data")),
                "exit" => assert_eq!(data["exit_code"], 0),
                "error" => panic!("{data}"),
                _ => {}
            }
        }
        assert_eq!(stdout as u64, 80 * MIB, "every byte arrives, once");
        assert_eq!(stderr, b"done\n");
    });
}

/// Opens a connection that sends half a request head and stops.
fn half_open(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    s
}

/// Waits until the server has closed `s` (EOF or reset), reading and dropping what it sent.
fn wait_closed(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close a connection within 30 s: {e}"),
        }
    }
}

/// Sends `GET /healthz` on `s` and reads the whole answer (its head and its
/// `Content-Length` body); returns the head.
fn healthz_on(s: &mut TcpStream) -> String {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the server closed the connection: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + length {
                return head.to_owned();
            }
        }
    }
}

#[test]
fn a_kept_alive_connection_outlives_the_header_timeout_but_a_slow_later_head_does_not() {
    // The header timeout bounds a head, not the wait between requests: a client's pooled
    // connection idle for longer than it is still served (a server closing it as the
    // client reuses it fails that request: E2B's SDK saw EPIPE). A later head that stops
    // half-way is still closed after one to two header timeouts, long before the idle
    // timeout.
    let state = state_dir(User::Current);
    let server = Served::start(
        User::Current,
        state.path(),
        &["--header-timeout", "1s", "--connection-idle-timeout", "60s"],
    );
    let mut kept = TcpStream::connect(server.addr()).unwrap();
    assert!(healthz_on(&mut kept).starts_with("HTTP/1.1 200"));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(healthz_on(&mut kept).starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHo").unwrap();
    wait_closed(&mut kept);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "a half-sent second head was closed after {took:?}, not within the header timeout's bound"
    );
}

/// Opens a connection that sends a whole request and waits for the start of its answer
/// (200, or 503 beyond the cap): then it has started a request, so it is never evicted
/// (an idle keep-alive connection).
fn started(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut status = [0u8; 12];
    s.read_exact(&mut status).unwrap();
    s
}

#[test]
fn issue_15_slowloris_at_a_low_descriptor_limit_gets_a_clear_refusal() {
    for user in users() {
        let state = state_dir(user);
        // 256 descriptors, default flags but a smaller pool (the default pool's spares
        // would leave no room for a sandbox): the connection cap is half of them.
        let server =
            Served::start_with_fd_limit(user, state.path(), 256, &["--pool-max-spares", "2"]);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        // Half-open connections are evicted, oldest first, for newer ones (issue 32): the
        // client is served.
        let attackers: Vec<TcpStream> = (0..300).map(|_| half_open(server.addr())).collect();
        tokio().block_on(async {
            // At most one `503 SERVER_BUSY` (Retry-After: 1) while the burst is still being
            // accepted: under a heavily loaded machine (CI) a client accepted in the middle
            // of it can wait longer than the eviction wait for the place it took (a race
            // still to find: the places evicted ones give back do not always reach it).
            let mut last = None;
            for _ in 0..2 {
                let response = client
                    .get(format!("{}/v1/sandboxes", server.base))
                    .bearer_auth(&server.token)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{user:?}: no answer under a slowloris: {e}"));
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                if status == StatusCode::OK {
                    return;
                }
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{user:?} {body}");
                last = Some(body);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            panic!("{user:?}: refused twice under a slowloris: {last:?}");
        });
        drop(attackers);
        // Connections that started a request are not evicted: beyond the cap, a clear
        // refusal. (A fresh client: the one above holds a slot.)
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let attackers: Vec<TcpStream> = (0..300).map(|_| started(server.addr())).collect();
        tokio().block_on(async {
            // The old server ran out of descriptors and left this one in its backlog for good.
            let response = client
                .get(format!("{}/v1/sandboxes", server.base))
                .bearer_auth(&server.token)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{user:?}: no answer under a slowloris: {e}"));
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()["retry-after"], "1");
            let error: Value = response.json().await.unwrap();
            assert_eq!(error["code"], "SERVER_BUSY", "{error}");
            assert_eq!(error["details"]["limit"], 128, "{error}");
        });
        assert!(
            server.descriptors() < 256,
            "{user:?}: the server is at its descriptor limit"
        );
        drop(attackers);
    }
}

#[test]
fn issue_15_half_open_and_idle_connections_close_after_their_timeouts() {
    let state = state_dir(User::Current);
    let server = Served::start(
        User::Current,
        state.path(),
        &[
            "--max-connections",
            "4",
            "--header-timeout",
            "1s",
            "--connection-idle-timeout",
            "2s",
            "--io-timeout",
            "1s",
        ],
    );
    // An idle keep-alive connection (one request answered) and three half-sent heads.
    let mut idle = TcpStream::connect(server.addr()).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = [0u8; 16];
    idle.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[..12], b"HTTP/1.1 200");
    let mut held: Vec<TcpStream> = (0..3).map(|_| half_open(server.addr())).collect();
    held.push(idle);
    let client = reqwest::Client::new();
    tokio().block_on(async {
        // At the cap, the oldest half-open connection gives its place (issue 32).
        let served = client
            .get(format!("{}/healthz", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(served.status(), StatusCode::OK);
    });
    for s in &mut held {
        wait_closed(s);
    }
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        // Requests being handled and streams are not cut for being quiet longer than both
        // timeouts.
        let slow = server
            .exec(&id, json!({ "command": "sleep 3; echo ok" }))
            .await;
        assert_eq!(slow["stdout"], "ok\n");
        let response = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec/stream"))
            .json(&json!({ "command": "sleep 3; echo streamed" }))
            .send()
            .await
            .unwrap();
        let events = read_sse(response, |e| e.event == "exit").await;
        let last = events.last().unwrap();
        assert_eq!(last.event, "exit", "{events:?}");
    });
}

#[test]
fn issue_15_a_stalled_body_is_408_and_an_unread_response_is_cut() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &["--io-timeout", "1s"]);
    let id = tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        server
            .exec(
                &id,
                json!({ "command": "head -c 64M /dev/zero > /tmp/big" }),
            )
            .await;
        id
    });
    // A body that promises 100 bytes and sends 10.
    let mut stalled = TcpStream::connect(server.addr()).unwrap();
    let head = format!(
        "POST /v1/sandboxes/{id}/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"command\"",
        server.token
    );
    stalled.write_all(head.as_bytes()).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = [0u8; 12];
    stalled.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 408");
    // The same for an image archive's upload, which streams its body to a file.
    let mut stalled = TcpStream::connect(server.addr()).unwrap();
    let head = format!(
        "PUT /v1/images/archive?reference=app:1&digest=sha256:{} HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/x-tar\r\n\
         Content-Length: 100\r\n\r\n0123456789",
        "0".repeat(64),
        server.token
    );
    stalled.write_all(head.as_bytes()).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stalled.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 408");

    // A download the client does not read: the socket buffers fill, the server's writes
    // wait, and after --io-timeout it gives up the connection instead of holding it.
    let mut unread = TcpStream::connect(server.addr()).unwrap();
    let get = format!(
        "GET /v1/sandboxes/{id}/files?path=/tmp/big HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {}\r\n\r\n",
        server.token
    );
    unread.write_all(get.as_bytes()).unwrap();
    // Not reading until the server has let go of its end (how long its writes take to fill
    // the buffers and then stall for --io-timeout depends on the machine's load): a client
    // that read after a fixed wait could read all 64 MiB from a server that was merely slow.
    let server_end = (unread.peer_addr().unwrap(), unread.local_addr().unwrap());
    let waited = Instant::now();
    while tcp_state(server_end) == Some(TCP_ESTABLISHED) {
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the server kept sending to a client that did not read for 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    unread
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let started = Instant::now();
    let mut received = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match unread.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received += n as u64,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("after {:?}: {e}", started.elapsed()),
        }
    }
    assert!(
        received < 64 * MIB,
        "the server kept sending to a client that did not read ({received} bytes)"
    );
}

/// `/proc/net/tcp`'s state of an IPv4 connection from its local end (ESTABLISHED: 1).
const TCP_ESTABLISHED: u8 = 1;

/// The state of the TCP connection whose local end is `local` and remote end `remote`, from
/// `/proc/net/tcp` (this network namespace's); `None` once the kernel has forgotten it.
fn tcp_state((local, remote): (std::net::SocketAddr, std::net::SocketAddr)) -> Option<u8> {
    let hex = |a: std::net::SocketAddr| match a {
        std::net::SocketAddr::V4(a) => {
            let [x, y, z, w] = a.ip().octets();
            format!("{w:02X}{z:02X}{y:02X}{x:02X}:{:04X}", a.port())
        }
        std::net::SocketAddr::V6(_) => panic!("an IPv4 address was expected: {a}"),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let (l, r, st) = (fields.next()?, fields.next()?, fields.next()?);
        (l == local && r == remote).then(|| u8::from_str_radix(st, 16).ok())?
    })
}

#[test]
fn issue_15_sessions_processes_and_logs_count_against_their_caps() {
    let state = state_dir(User::Current);
    let server = Served::start(
        User::Current,
        state.path(),
        &[
            "--max-sessions",
            "2",
            "--max-processes",
            "2",
            "--max-log-memory",
            "1M",
            "--log-bytes",
            "256K",
        ],
    );
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let sessions = format!("/v1/sandboxes/{id}/sessions");
        for name in ["a", "b"] {
            let (status, body) = server
                .json(Method::POST, &sessions, json!({ "id": name }))
                .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let (status, error) = server
            .json(Method::POST, &sessions, json!({ "id": "c" }))
            .await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
        assert_eq!(error["details"]["what"], "max_sessions");
        // The default session would be a third.
        let (status, error) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                json!({ "command": "true" }),
            )
            .await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");

        let processes = format!("/v1/sandboxes/{id}/processes");
        let start = |argv: Value| {
            let server = &server;
            let processes = processes.clone();
            async move {
                server
                    .json(Method::POST, &processes, json!({ "argv": argv }))
                    .await
            }
        };
        // Two that exit, then a third: the oldest exited one is forgotten.
        for _ in 0..2 {
            let (status, p) = start(json!(["true"])).await;
            assert_eq!(status, StatusCode::CREATED, "{p}");
            let path = format!("{processes}/{}", p["id"].as_str().unwrap());
            let (status, _) = server.json(Method::DELETE, &path, json!(null)).await;
            assert_eq!(status, StatusCode::OK);
        }
        let (status, p3) = start(json!(["sleep", "30"])).await;
        assert_eq!(status, StatusCode::CREATED, "{p3}");
        let (_, list) = server.json(Method::GET, &processes, json!(null)).await;
        let ids: Vec<&str> = list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["p2", "p3"]);
        let (status, _) = start(json!(["sleep", "30"])).await;
        assert_eq!(status, StatusCode::CREATED);
        // Two running: no room.
        let (status, error) = start(json!(["sleep", "30"])).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
        assert_eq!(error["details"]["what"], "max_processes");
        // A log larger than all logs may hold together is refused outright.
        let (status, error) = server
            .json(
                Method::POST,
                &processes,
                json!({ "argv": ["true"], "log_bytes": 2 << 20 }),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert_eq!(error["details"]["field"], "log_bytes");
    });
}

/// A request to the server with bearer `token` and JSON `body`: status and reply.
async fn as_token(
    served: &Served,
    token: &str,
    method: Method,
    path: &str,
    body: Value,
    origin: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = served
        .client
        .request(method, format!("{}{path}", served.base))
        .bearer_auth(token)
        .json(&body);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A `tools/call` over `POST /mcp`: the HTTP status and the call's result.
async fn mcp_call(served: &Served, token: &str, tool: &str, arguments: Value) -> Value {
    let message = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": { "name": tool, "arguments": arguments } });
    let (status, reply) = as_token(served, token, Method::POST, "/mcp", message, None).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    reply["result"].clone()
}

/// The field a BEYOND_CEILING tool error names.
fn mcp_refused_field(result: &Value) -> String {
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["structuredContent"]["code"], "BEYOND_CEILING",
        "{result}"
    );
    result["structuredContent"]["details"]["field"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Issue 32's `create_sandbox` arguments: root's files, a writable host directory, the
/// host's network (its loopback, where this server listens, included).
fn reproduction(hostwrite: &std::path::Path) -> Value {
    json!({
        "default_reads": false,
        "fs_readable": ["/etc", "/usr", "/lib", "/lib64", "/bin", "/root"],
        "fs_writable": [hostwrite],
        "net": "host",
    })
}

/// Issue 32 over `POST /mcp` with the operator's token: the reproduction is refused naming
/// each field, the agent sees none of the operator's sandboxes, and a browser origin that is
/// not loopback (DNS rebinding) is refused before anything runs.
#[test]
fn issue_32_mcp_over_http_is_bounded_by_the_ceiling_and_checks_origin() {
    for user in users() {
        let state = state_dir(user);
        let hostwrite = state.path().join("hostwrite");
        std::fs::create_dir(&hostwrite).unwrap();
        common::give(state.path(), user);
        let served = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let token = served.token.clone();
            let result =
                mcp_call(&served, &token, "create_sandbox", reproduction(&hostwrite)).await;
            assert_eq!(mcp_refused_field(&result), "fs_readable", "{user:?}");
            let message = result["structuredContent"]["message"].as_str().unwrap();
            assert!(message.contains("ceiling"), "{message}");
            let result = mcp_call(
                &served,
                &token,
                "create_sandbox",
                json!({ "fs_writable": [hostwrite] }),
            )
            .await;
            assert_eq!(mcp_refused_field(&result), "fs_writable", "{user:?}");
            let result =
                mcp_call(&served, &token, "create_sandbox", json!({ "net": "host" })).await;
            assert_eq!(mcp_refused_field(&result), "net", "{user:?}");
            assert_eq!(std::fs::read_dir(&hostwrite).unwrap().count(), 0);

            // The operator's own sandbox, with a host write: not the agent's to use or see.
            let theirs = served.sandbox(json!({ "fs_writable": [hostwrite] })).await;
            let result = mcp_call(
                &served,
                &token,
                "exec",
                json!({ "sandbox_id": theirs, "command": "echo PWNED > f" }),
            )
            .await;
            assert_eq!(
                result["structuredContent"]["code"], "SANDBOX_NOT_FOUND",
                "{result}"
            );
            let listed = mcp_call(&served, &token, "list_sandboxes", json!({})).await;
            assert_eq!(
                listed["structuredContent"]["sandboxes"],
                json!([]),
                "{listed}"
            );

            let ping = json!({ "jsonrpc": "2.0", "id": 1, "method": "ping" });
            let evil = Some("http://rebound.example:7070");
            let (status, reply) =
                as_token(&served, &token, Method::POST, "/mcp", ping.clone(), evil).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{reply}");
            assert_eq!(reply["code"], "FORBIDDEN", "{reply}");
            let local = format!("http://{}", served.addr());
            let (status, reply) =
                as_token(&served, &token, Method::POST, "/mcp", ping, Some(&local)).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
        });
    }
}

/// Issue 32: a scoped token creates only within its ceiling (the server's by default,
/// or the one it was minted with), sees and acts on only its own sandboxes, reaches no
/// operator route (tokens, branches, transactions), and stops working once revoked.
#[test]
fn issue_32_a_scoped_token_stays_under_its_ceiling_and_off_operator_routes() {
    for user in users() {
        let state = state_dir(user);
        let hostwrite = state.path().join("hostwrite");
        std::fs::create_dir(&hostwrite).unwrap();
        common::give(state.path(), user);
        let served = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let (status, minted) =
                as_token(&served, &served.token, Method::POST, "/v1/tokens", json!({}), None).await;
            assert_eq!(status, StatusCode::CREATED, "{minted}");
            let agent = minted["token"].as_str().unwrap().to_owned();
            let create = |body: Value| {
                let agent = agent.clone();
                let served = &served;
                async move {
                    as_token(served, &agent, Method::POST, "/v1/sandboxes", body, None).await
                }
            };
            for (body, field) in [
                (reproduction(&hostwrite), "fs_readable"),
                (json!({ "fs_writable": [hostwrite] }), "fs_writable"),
                (json!({ "net": "host" }), "net"),
                (json!({ "workdir": hostwrite }), "workdir"),
            ] {
                let (status, reply) = create(body).await;
                assert_eq!(status, StatusCode::FORBIDDEN, "{user:?}: {reply}");
                assert_eq!(reply["code"], "BEYOND_CEILING", "{reply}");
                assert_eq!(reply["details"]["field"], field, "{reply}");
            }
            let (status, mine) = create(json!({})).await;
            assert_eq!(status, StatusCode::CREATED, "{mine}");
            let mine = mine["id"].as_str().unwrap().to_owned();
            let theirs = served.sandbox(json!({ "fs_writable": [hostwrite] })).await;

            let (_, listed) =
                as_token(&served, &agent, Method::GET, "/v1/sandboxes", Value::Null, None).await;
            let ids: Vec<&str> = listed["sandboxes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, [mine.as_str()], "{listed}");
            let exec = json!({ "command": "echo PWNED > f" });
            let path = format!("/v1/sandboxes/{theirs}/exec");
            let (status, reply) =
                as_token(&served, &agent, Method::POST, &path, exec.clone(), None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{reply}");
            assert_eq!(reply["code"], "SANDBOX_NOT_FOUND", "{reply}");
            let path = format!("/v1/sandboxes/{mine}/exec");
            let (status, reply) =
                as_token(&served, &agent, Method::POST, &path, json!({ "command": "true" }), None)
                    .await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            for (method, path) in [
                (Method::POST, "/v1/tokens"),
                (Method::GET, "/v1/branches"),
                (Method::GET, "/v1/transactions"),
            ] {
                let (status, reply) =
                    as_token(&served, &agent, method, path, json!({}), None).await;
                assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {reply}");
                assert_eq!(reply["code"], "FORBIDDEN", "{path}: {reply}");
            }
            let result = mcp_call(&served, &agent, "create_sandbox", reproduction(&hostwrite)).await;
            assert_eq!(mcp_refused_field(&result), "fs_readable");
            assert_eq!(std::fs::read_dir(&hostwrite).unwrap().count(), 0);

            // A token minted with a wider ceiling gets what that ceiling allows.
            let body = json!({ "ceiling": { "write": [hostwrite] } });
            let (status, wider) =
                as_token(&served, &served.token, Method::POST, "/v1/tokens", body, None).await;
            assert_eq!(status, StatusCode::CREATED, "{wider}");
            let wider_token = wider["token"].as_str().unwrap();
            let body = json!({ "fs_writable": [hostwrite] });
            let (status, reply) =
                as_token(&served, wider_token, Method::POST, "/v1/sandboxes", body, None).await;
            assert_eq!(status, StatusCode::CREATED, "{reply}");

            let path = format!("/v1/tokens/{}", minted["id"].as_str().unwrap());
            let (status, reply) =
                as_token(&served, &served.token, Method::DELETE, &path, Value::Null, None).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            let (status, _) =
                as_token(&served, &agent, Method::GET, "/v1/sandboxes", Value::Null, None).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
        });
    }
}

/// Opens a connection from `source` (a loopback address: every 127.x.y.z is this host's)
/// that sends half a request head and stops.
async fn half_open_from(source: std::net::Ipv4Addr, addr: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((source, 0).into()).unwrap();
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    s
}

/// Raises this process's soft open-files limit to its hard one (the test's own sockets).
fn raise_own_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let hard = getrlimit(Resource::Nofile).maximum;
    let raised = Rlimit {
        current: hard,
        maximum: hard,
    };
    setrlimit(Resource::Nofile, raised).unwrap();
    hard.unwrap_or(u64::MAX)
}

/// Issue 32: 1,100 half-open connections locked every client out for ~10 s per wave behind
/// the 512-connection cap. One address now holds at most `--max-connections-per-peer`
/// (512); the rest of the cap stays for the others.
#[test]
fn issue_32_half_open_connections_of_one_peer_do_not_lock_out_another() {
    let nofile = raise_own_nofile();
    assert!(
        nofile >= 4096,
        "this test needs 4,096 descriptors, has {nofile}"
    );
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &[]);
    let flooder = std::net::Ipv4Addr::new(127, 0, 0, 2);
    tokio().block_on(async {
        let mut held = Vec::new();
        for _ in 0..2000 {
            held.push(half_open_from(flooder, server.addr()).await);
        }
        // The flooder's next complete request is refused, naming the per-peer cap.
        let mut extra = half_open_from(flooder, server.addr()).await;
        {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            extra.write_all(b"1\r\n\r\n").await.unwrap();
            let mut answer = Vec::new();
            extra.read_to_end(&mut answer).await.unwrap();
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains("max_connections_per_peer"), "{answer}");
        }
        // Another client (127.0.0.1) is served while the flooder's connections are held.
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let response = client
            .get(format!("{}/v1/sandboxes", server.base))
            .bearer_auth(&server.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        drop(held);
    });
}

#[test]
fn an_http2_prior_knowledge_client_is_served_on_the_same_port_and_idle_ones_are_closed() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(
            user,
            state.path(),
            &["--header-timeout", "1s", "--io-timeout", "1s"],
        );
        let h2 = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        tokio().block_on(async {
            let health = h2
                .get(format!("{}/healthz", server.base))
                .send()
                .await
                .unwrap();
            assert_eq!(health.status(), StatusCode::OK);
            assert_eq!(health.version(), reqwest::Version::HTTP_2);
            // The API (a sandbox, an exec, a stream quieter than both timeouts) over h2c,
            // while HTTP/1.1 clients keep working on the same listener.
            let created = h2
                .post(format!("{}/v1/sandboxes", server.base))
                .bearer_auth(&server.token)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(created.status(), StatusCode::CREATED);
            let id = created.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned();
            let ran: Value = h2
                .post(format!("{}/v1/sandboxes/{id}/exec", server.base))
                .bearer_auth(&server.token)
                .json(&json!({ "command": "sleep 2; echo over-h2" }))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(ran["stdout"], "over-h2\n", "{ran}");
            let streamed = h2
                .post(format!("{}/v1/sandboxes/{id}/exec/stream", server.base))
                .bearer_auth(&server.token)
                .json(&json!({ "command": "sleep 2; echo streamed" }))
                .send()
                .await
                .unwrap();
            let events = read_sse(streamed, |e| e.event == "exit").await;
            assert_eq!(events.last().unwrap().event, "exit", "{events:?}");
            let http1 = server.exec(&id, json!({ "command": "echo h1" })).await;
            assert_eq!(http1["stdout"], "h1\n");
        });
        // An h2c connection that sends its preface and settings but no request is closed
        // after the header timeout, as a silent HTTP/1.1 one is.
        let mut silent = TcpStream::connect(server.addr()).unwrap();
        silent
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .unwrap();
        wait_closed(&mut silent);
    }
}

#[test]
fn issue_34_sandboxes_stop_at_what_the_descriptor_limit_has_room_for_and_the_server_still_answers()
{
    for user in users() {
        let state = state_dir(user);
        // 256 descriptors: 128 for connections, 96 kept for the server, 5 for the pipes of
        // the one session kept open between commands (a quarter of the 32 left, 5 each),
        // room for 27 sandboxes of 1 descriptor (their agents' sockets), no pool. Each runs
        // a command in its shell, whose pipes are asked for again when another's were
        // kept.
        let server = Served::start_with_fd_limit(
            user,
            state.path(),
            256,
            &["--pool", "0", "--pool-max-spares", "0"],
        );
        tokio().block_on(async {
            let mut ids = Vec::new();
            for _ in 0..27 {
                let id = server.sandbox(json!({})).await;
                let r = server.exec(&id, json!({ "command": "echo up" })).await;
                assert_eq!(r["stdout"], "up\n", "{user:?} {r}");
                ids.push(id);
            }
            for id in &ids {
                let r = server.exec(id, json!({ "command": "echo again" })).await;
                assert_eq!(r["stdout"], "again\n", "{user:?} {r}");
            }
            // One more is a clear refusal, not a server out of descriptors.
            let (status, body) = server.json(Method::POST, "/v1/sandboxes", json!({})).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{user:?} {body}");
            assert_eq!(body["code"], "LIMIT_REACHED", "{body}");
            assert_eq!(body["details"]["limit"], 27, "{body}");
            let health = server
                .request(Method::GET, "/healthz")
                .send()
                .await
                .unwrap();
            assert_eq!(health.status(), StatusCode::OK);
            // A deleted one makes room again.
            let (status, body) = server
                .json(
                    Method::DELETE,
                    &format!("/v1/sandboxes/{}", ids[0]),
                    json!(null),
                )
                .await;
            assert!(status.is_success(), "{user:?} {status} {body}");
            let id = server.sandbox(json!({})).await;
            server.exec(&id, json!({ "command": "true" })).await;
        });
        assert!(
            server.descriptors() < 200,
            "{user:?}: {} descriptors open, near the limit",
            server.descriptors()
        );
    }
}
