//! `lockbox serve` end to end: the real binary on 127.0.0.1:0, driven by a real HTTP and
//! WebSocket client; sandboxes on the real kernel, as the current user and (as root) as
//! uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use base64::Engine;
use common::{command_as, give, users, User};
use futures_util::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{output_bytes, read_sse, state_dir, tokio, Served, B64};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

#[test]
fn exec_over_http_is_byte_exact_and_keeps_session_state() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({ "labels": { "test": "exec" } })).await;
            // NUL, 0xff, a partial last line, and stderr apart from stdout.
            let result = server
                .exec(
                    &id,
                    json!({ "command": r"printf 'a\000b\377c\nno-newline'; printf err >&2; (exit 3)" }),
                )
                .await;
            assert_eq!(result["exit_code"], 3, "{user:?} {result}");
            assert_eq!(
                B64.decode(result["stdout_b64"].as_str().unwrap()).unwrap(),
                b"a\0b\xffc\nno-newline"
            );
            assert!(result.get("stdout").is_none(), "invalid UTF-8 has no text form");
            assert_eq!(result["stderr"], "err");
            assert_eq!(result["timed_out"], false);

            server
                .exec(&id, json!({ "command": "cd /tmp && export GREETING=hi" }))
                .await;
            let result = server
                .exec(&id, json!({ "command": "echo \"$PWD $GREETING\"" }))
                .await;
            assert_eq!(result["stdout"], "/tmp hi\n", "{user:?}");

            let result = server
                .exec(&id, json!({ "command": "cat", "stdin_b64": B64.encode(b"\x00in\xfe") }))
                .await;
            assert_eq!(
                B64.decode(result["stdout_b64"].as_str().unwrap()).unwrap(),
                b"\x00in\xfe"
            );

            let (status, info) = server
                .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), json!(null))
                .await;
            assert_eq!(status, StatusCode::OK, "{info}");
            let (status, error) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/exec"),
                    json!({ "command": "true" }),
                )
                .await;
            assert!(status.is_client_error(), "{error}");
        });
    }
}

#[test]
fn exec_of_exit_n_replies_n_and_the_next_exec_gets_a_fresh_session() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            server.exec(&id, json!({ "command": "export OLD=1" })).await;
            let result = server
                .exec(&id, json!({ "command": "echo bye; exit 3" }))
                .await;
            assert_eq!(result["exit_code"], 3, "{user:?} {result}");
            assert_eq!(result["stdout"], "bye\n", "{user:?} {result}");
            let result = server
                .exec(&id, json!({ "command": "sh -c 'exit 4'" }))
                .await;
            assert_eq!(result["exit_code"], 4, "{user:?} {result}");
            let result = server
                .exec(&id, json!({ "command": "echo \"${OLD-fresh}\"" }))
                .await;
            assert_eq!(result["stdout"], "fresh\n", "{user:?} {result}");
        });
    }
}

#[test]
fn exec_stream_sends_start_output_and_exit_events() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &[]);
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let response = server
            .request(Method::POST, &format!("/v1/sandboxes/{id}/exec/stream"))
            .json(&json!({ "command": "echo one; echo two >&2; printf '\\001'" }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let events = read_sse(response, |e| e.event == "exit").await;
        let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
        assert_eq!(names.first(), Some(&"start"), "{names:?}");
        assert_eq!(names.last(), Some(&"exit"), "{names:?}");
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        for event in &events {
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            let bytes = || output_bytes(&data, "data");
            match event.event.as_str() {
                "stdout" => stdout.extend(bytes()),
                "stderr" => stderr.extend(bytes()),
                "exit" => assert_eq!(data["exit_code"], 0),
                _ => {}
            }
        }
        assert_eq!(stdout, b"one\n\x01");
        assert_eq!(stderr, b"two\n");
    });
}

#[test]
fn idle_sse_stream_gets_keepalive_comments_and_logs_resume_from_last_event_id() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &["--keepalive", "200ms"]);
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let (status, process) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                json!({ "command": "echo first; sleep 2; echo second" }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{process}");
        let pid = process["id"].as_str().unwrap();
        let logs = format!("/v1/sandboxes/{id}/processes/{pid}/logs");
        let response = server
            .request(Method::GET, &format!("{logs}?follow=true"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        // The process is silent for 2 s: keepalive comments must arrive meanwhile.
        let mut seen_output = false;
        let items = read_sse(response, |e| {
            seen_output |= e.event == "stdout";
            seen_output && e.comment.is_some()
        })
        .await;
        let first = items
            .iter()
            .find(|e| e.event == "stdout")
            .expect("first line");
        let data: Value = serde_json::from_str(&first.data).unwrap();
        assert_eq!(data["data"], "first\n");
        let cursor = first.id.clone().expect("events carry the cursor as id");
        assert_eq!(cursor, "6");
        assert_eq!(items.last().unwrap().comment.as_deref(), Some("keepalive"));

        // Reconnect as an EventSource would: only what came after the cursor.
        let response = server
            .request(Method::GET, &format!("{logs}?follow=true"))
            .header("Last-Event-ID", &cursor)
            .send()
            .await
            .unwrap();
        let items = read_sse(response, |e| e.event == "eof").await;
        let text: String = items
            .iter()
            .filter(|e| e.event == "stdout")
            .map(|e| {
                serde_json::from_str::<Value>(&e.data).unwrap()["data"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(text, "second\n");

        // Not following: one JSON chunk from a cursor.
        let (status, chunk) = server
            .json(Method::GET, &format!("{logs}?since=0"), json!(null))
            .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(chunk["next"], 13);
        assert_eq!(chunk["eof"], true);
        assert_eq!(chunk["truncated"], false);
    });
}

#[test]
fn files_put_get_and_range_round_trip() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 256) as u8).collect();
            let files = format!("/v1/sandboxes/{id}/files");
            let response = server
                .request(Method::PUT, &format!("{files}?path=/tmp/deep/er/data.bin"))
                .body(content.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{user:?}");
            let stat: Value = response.json().await.unwrap();
            assert_eq!(stat["size"], 100_000);

            let data = "/tmp/deep/er/data.bin";
            let whole = server.get_file(&id, data, None).await;
            assert_eq!(whole.status(), StatusCode::OK);
            assert_eq!(whole.bytes().await.unwrap(), content);
            let range = |r, cr, part| server.assert_file_range(&id, data, r, cr, part);
            range("bytes=10-19", "bytes 10-19/100000", Some(&content[10..20])).await;
            range(
                "bytes=-5",
                "bytes 99995-99999/100000",
                Some(&content[99_995..]),
            )
            .await;
            range("bytes=100000-", "bytes */100000", None).await;

            // The sandbox sees the same bytes.
            let result = server
                .exec(
                    &id,
                    json!({ "command": "sha256sum < /tmp/deep/er/data.bin" }),
                )
                .await;
            let expected = std::process::Command::new("sha256sum")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    use std::io::Write;
                    c.stdin.take().unwrap().write_all(&content)?;
                    c.wait_with_output()
                })
                .unwrap();
            assert_eq!(
                result["stdout"].as_str().unwrap(),
                String::from_utf8(expected.stdout).unwrap()
            );

            let (status, listing) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/fs/list?path=/tmp/deep&recursive=true"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{listing}");
            let paths: Vec<&str> = listing["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["path"].as_str().unwrap())
                .collect();
            assert!(paths.contains(&"/tmp/deep/er/data.bin"), "{paths:?}");

            let (status, error) = server
                .json(
                    Method::GET,
                    &format!("{files}?path=/tmp/absent"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            assert_eq!(error["code"], "FILE_NOT_FOUND");
        });
    }
}

/// `/proc` files say 0 bytes in `stat` but have content (E2B's `files.read` found it).
#[test]
fn proc_files_are_read_to_their_end_with_their_real_length() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let boot_id = "/proc/sys/kernel/random/boot_id";
            let cat = server
                .exec(&id, json!({ "command": format!("cat {boot_id}") }))
                .await;
            let cat = cat["stdout"].as_str().unwrap().to_owned();
            assert_eq!(cat.len(), 37, "{user:?}: {cat:?}");

            let whole = server.get_file(&id, boot_id, None).await;
            assert_eq!(whole.status(), StatusCode::OK, "{user:?}");
            assert_eq!(whole.headers()["content-length"], "37");
            assert_eq!(whole.bytes().await.unwrap(), cat.as_bytes());
            let range = |r, cr, part| server.assert_file_range(&id, boot_id, r, cr, part);
            range("bytes=0-7", "bytes 0-7/37", Some(&cat.as_bytes()[..8])).await;
            range("bytes=-1", "bytes 36-36/37", Some(b"\n")).await;
            range("bytes=37-", "bytes */37", None).await;

            let status = server.get_file(&id, "/proc/self/status", None).await;
            assert_eq!(status.status(), StatusCode::OK);
            let length: usize = status.headers()["content-length"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let status = status.bytes().await.unwrap();
            assert_eq!(status.len(), length);
            assert!(status.starts_with(b"Name:\t"), "{status:?}");
        });
    }
}

#[test]
fn file_modes_are_octal_text_in_both_directions() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let files = format!("/v1/sandboxes/{id}/files");
            let response = server
                .request(Method::PUT, &format!("{files}?path=/tmp/run.sh&mode=0750"))
                .body("echo hi")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{user:?}");
            let written: Value = response.json().await.unwrap();
            assert_eq!(written["mode"], "0750", "{user:?} {written}");
            let result = server
                .exec(&id, json!({ "command": "stat -c %a /tmp/run.sh" }))
                .await;
            assert_eq!(result["stdout"], "750\n", "{user:?}");

            let (status, stat) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/fs/stat?path=/tmp/run.sh"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{stat}");
            assert_eq!(stat["mode"], "0750", "{user:?} {stat}");
            let (status, listing) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/fs/list?path=/tmp"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{listing}");
            let entry = listing["entries"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["path"] == "/tmp/run.sh")
                .cloned()
                .unwrap_or_else(|| panic!("{listing}"));
            assert_eq!(entry["mode"], "0750", "{user:?} {entry}");

            // Issue 32: a refused set-user-id bit was answered READ_ONLY.
            let (status, error) = server
                .json(
                    Method::PUT,
                    &format!("{files}?path=/tmp/suid&mode=4755"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{user:?} {error}");
            assert_eq!(error["code"], "INVALID_REQUEST", "{user:?} {error}");
            assert!(
                error["message"].as_str().unwrap().contains("set-user-id"),
                "{error}"
            );

            let (status, error) = server
                .json(
                    Method::PUT,
                    &format!("{files}?path=/tmp/x&mode=rwx"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            assert!(
                error["message"].as_str().unwrap().contains("mode"),
                "{error}"
            );
        });
    }
}

#[test]
fn path_traversal_is_refused_with_path_outside_sandbox() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &[]);
    let marker = format!("lockbox-escape-{}", std::process::id());
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let files = format!("/v1/sandboxes/{id}/files");
        for path in [
            format!("../../../../../../tmp/{marker}"),
            format!("/tmp/../../../../tmp/x/../../../{marker}"),
        ] {
            let response = server
                .request(Method::PUT, &format!("{files}?path={path}"))
                .body("escaped")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
            let error: Value = response.json().await.unwrap();
            assert_eq!(error["code"], "PATH_OUTSIDE_SANDBOX", "{path}: {error}");
        }
        let (status, error) = server
            .json(
                Method::GET,
                &format!("{files}?path=/../../../etc/../../shadow"),
                json!(null),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{error}");
        assert_eq!(error["code"], "PATH_OUTSIDE_SANDBOX");
        // A symlink made inside that points out is not followed out of the sandbox.
        server
            .exec(
                &id,
                json!({ "command": "ln -s /proc/self/root/../../.. /tmp/magic; ln -s ../../../../.. /tmp/up" }),
            )
            .await;
        for path in ["/tmp/magic/etc/shadow", "/tmp/up/etc/shadow"] {
            let (status, error) = server
                .json(Method::GET, &format!("{files}?path={path}"), json!(null))
                .await;
            assert!(status.is_client_error(), "{path}: {error}");
            assert!(
                matches!(
                    error["code"].as_str(),
                    Some("PATH_OUTSIDE_SANDBOX" | "FILE_NOT_FOUND" | "INVALID_REQUEST")
                ),
                "{path}: {error}"
            );
        }
    });
    assert!(!Path::new("/tmp").join(&marker).exists());
}

#[test]
fn pty_over_websocket_drives_an_interactive_bash() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let (status, process) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/processes"),
                    json!({ "argv": ["bash", "--norc", "--noprofile", "-i"],
                            "pty": { "cols": 80, "rows": 24 } }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{process}");
            assert_eq!(process["pty"], true);
            let pid = process["id"].as_str().unwrap().to_owned();
            let url = format!(
                "{}/v1/sandboxes/{id}/processes/{pid}/pty",
                server.base.replace("http://", "ws://")
            );
            let connect = || {
                let mut request = url.as_str().into_client_request().unwrap();
                request.headers_mut().insert(
                    "authorization",
                    format!("Bearer {}", server.token).parse().unwrap(),
                );
                tokio_tungstenite::connect_async(request)
            };
            let (mut ws, _) = connect().await.unwrap();
            let mut screen = Vec::new();
            ws.send(Message::Binary(b"echo $((6*7))x\n".to_vec().into()))
                .await
                .unwrap();
            read_until(&mut ws, &mut screen, "42x").await;
            ws.send(Message::Text(r#"{"resize":{"cols":100,"rows":30}}"#.into()))
                .await
                .unwrap();
            ws.send(Message::Binary(b"stty size\n".to_vec().into()))
                .await
                .unwrap();
            read_until(&mut ws, &mut screen, "30 100").await;

            // A second viewer gets the scrollback first.
            let (mut viewer, _) = connect().await.unwrap();
            let mut replay = Vec::new();
            read_until(&mut viewer, &mut replay, "42x").await;

            ws.send(Message::Binary(b"exit 7\n".to_vec().into()))
                .await
                .unwrap();
            let exited = loop {
                match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
                    Ok(Some(Ok(Message::Text(text)))) if text.contains("exited") => {
                        break serde_json::from_str::<Value>(&text).unwrap();
                    }
                    Ok(Some(Ok(_))) => continue,
                    other => panic!("no exit frame: {other:?}"),
                }
            };
            assert_eq!(exited["exited"]["exit_code"], 7, "{exited}");
        });
    }
}

async fn read_until<S>(ws: &mut S, screen: &mut Vec<u8>, needle: &str)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    while !String::from_utf8_lossy(screen).contains(needle) {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Binary(bytes)))) => screen.extend_from_slice(&bytes),
            Ok(Some(Ok(_))) => {}
            other => panic!(
                "waiting for {needle:?}: {other:?}; screen: {}",
                String::from_utf8_lossy(screen)
            ),
        }
    }
}

#[test]
fn hundred_concurrent_clients_each_get_their_own_output() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &[]);
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        for n in 0..10 {
            let (status, session) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/sessions"),
                    json!({ "id": format!("s{n}") }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{session}");
        }
        let mut tasks = Vec::new();
        for n in 0..100 {
            // A client (and connection) each; ten sessions, so runs interleave.
            let client = reqwest::Client::new();
            let url = format!("{}/v1/sandboxes/{id}/exec", server.base);
            let token = server.token.clone();
            tasks.push(tokio::spawn(async move {
                let response = client
                    .post(url)
                    .bearer_auth(token)
                    .json(&json!({ "command": format!("echo client-{n}"), "session": format!("s{}", n % 10) }))
                    .send()
                    .await
                    .unwrap();
                let status = response.status();
                let body: Value = response.json().await.unwrap();
                (n, status, body)
            }));
        }
        for task in tasks {
            let (n, status, body) = task.await.unwrap();
            assert_eq!(status, StatusCode::OK, "client {n}: {body}");
            assert_eq!(body["stdout"], format!("client-{n}\n"));
            assert_eq!(body["session"], format!("s{}", n % 10));
        }
    });
}

#[test]
fn limits_answer_429_and_413() {
    let state = state_dir(User::Current);
    let server = Served::start(
        User::Current,
        state.path(),
        &[
            "--max-sandboxes",
            "1",
            "--max-streams",
            "1",
            "--max-body",
            "2K",
        ],
    );
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let (status, error) = server.json(Method::POST, "/v1/sandboxes", json!({})).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
        assert_eq!(error["code"], "LIMIT_REACHED");

        let (_, process) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                json!({ "argv": ["sleep", "30"] }),
            )
            .await;
        let logs = format!(
            "/v1/sandboxes/{id}/processes/{}/logs?follow=true",
            process["id"].as_str().unwrap()
        );
        let open = server.request(Method::GET, &logs).send().await.unwrap();
        assert_eq!(open.status(), StatusCode::OK);
        let (status, error) = server.json(Method::GET, &logs, json!(null)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
        assert_eq!(error["details"]["what"], "max_streams");
        drop(open);

        let (status, error) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                json!({ "command": "x".repeat(4096) }),
            )
            .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    });
}

/// `lockbox branch list --json` of a state directory: the branches' ids, but those of the
/// pool's ready sandboxes (a workdir's spec is pooled: `"spare": true` until taken).
fn branches(user: User, state: &Path) -> Vec<String> {
    let out = command_as(user)
        .args(["branch", "list", "--json", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .filter(|b| b["meta"]["context"]["spare"] != true)
        .map(|b| b["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn abort_and_delete_leave_no_empty_branch_behind() {
    for user in users() {
        let state = state_dir(user);
        let work = state_dir(user);
        std::fs::write(work.path().join("f"), "a").unwrap();
        give(work.path(), user);
        let server = Served::start(user, state.path(), &[]);
        let workdir = work.path().to_str().unwrap();
        tokio().block_on(async {
            // Written, aborted (a fresh branch), deleted: nothing to keep.
            let id = server.sandbox(json!({ "workdir": workdir })).await;
            server.exec(&id, json!({ "command": "echo b > f" })).await;
            let (status, reply) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/abort"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{user:?} {reply}");
            let (status, info) = server
                .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), json!(null))
                .await;
            assert_eq!(status, StatusCode::OK, "{user:?} {info}");
            assert_eq!(info["branch_action"], "empty", "{user:?} {info}");
            assert_eq!(
                branches(user, state.path()),
                Vec::<String>::new(),
                "{user:?}"
            );

            // A branch with a change is still kept for review.
            let id = server.sandbox(json!({ "workdir": workdir })).await;
            server
                .exec(&id, json!({ "command": "echo c > f && chmod 640 f" }))
                .await;
            let (status, changes) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/changes"),
                    json!(null),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{user:?} {changes}");
            assert_eq!(changes["changes"][0]["path"], "f", "{changes}");
            assert_eq!(
                changes["changes"][0]["mode"], "0640",
                "modes are octal text: {changes}"
            );
            let (status, info) = server
                .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), json!(null))
                .await;
            assert_eq!(status, StatusCode::OK, "{user:?} {info}");
            assert_eq!(info["branch_action"], "kept", "{user:?} {info}");
            assert_eq!(
                branches(user, state.path()),
                vec![info["branch"].as_str().unwrap()]
            );
        });
        assert_eq!(std::fs::read_to_string(work.path().join("f")).unwrap(), "a");
    }
}

#[test]
fn stopped_sandboxes_are_kept_up_to_keep_stopped_and_state_filters_the_list() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &["--keep-stopped", "3"]);
        tokio().block_on(async {
            let live = server
                .sandbox(json!({ "labels": { "role": "live" } }))
                .await;
            let mut stopped = Vec::new();
            for _ in 0..6 {
                let id = server.sandbox(json!({})).await;
                let (status, info) = server
                    .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), json!(null))
                    .await;
                assert_eq!(status, StatusCode::OK, "{info}");
                stopped.push(id);
            }
            let ids = |list: &Value, state: &str| -> Vec<String> {
                list["sandboxes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|s| state.is_empty() || s["state"] == state)
                    .map(|s| s["id"].as_str().unwrap().to_owned())
                    .collect()
            };
            let (status, all) = server.json(Method::GET, "/v1/sandboxes", json!(null)).await;
            assert_eq!(status, StatusCode::OK, "{all}");
            assert_eq!(ids(&all, "stopped"), stopped[3..], "{user:?} {all}");
            assert_eq!(ids(&all, "running"), vec![live.clone()], "{user:?} {all}");

            let (status, running) = server
                .json(Method::GET, "/v1/sandboxes?state=running", json!(null))
                .await;
            assert_eq!(status, StatusCode::OK, "{running}");
            assert_eq!(ids(&running, ""), vec![live.clone()], "{user:?} {running}");
            let (status, only_stopped) = server
                .json(Method::GET, "/v1/sandboxes?state=stopped", json!(null))
                .await;
            assert_eq!(status, StatusCode::OK, "{only_stopped}");
            assert_eq!(ids(&only_stopped, ""), stopped[3..], "{user:?}");

            let (status, error) = server
                .json(Method::GET, "/v1/sandboxes?state=alive", json!(null))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            assert!(
                error["message"].as_str().unwrap().contains("state"),
                "{error}"
            );
        });
    }
}

#[test]
fn listen_takes_a_host_name_and_names_the_flag_on_a_bad_value() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start_listening(user, "localhost:0", state.path());
        let addr: std::net::SocketAddr = server.addr().parse().unwrap();
        assert!(addr.ip().is_loopback(), "{user:?} {addr}");
        tokio().block_on(async {
            let (status, health) = server.json(Method::GET, "/healthz", json!(null)).await;
            assert_eq!(status, StatusCode::OK, "{user:?} {health}");
            let id = server.sandbox(json!({})).await;
            let result = server.exec(&id, json!({ "command": "echo hi" })).await;
            assert_eq!(result["stdout"], "hi\n", "{user:?}");
        });
    }
    let state = state_dir(User::Current);
    for (bad, says) in [
        ("localhost", "HOST:PORT"),
        ("localhost:http", "port"),
        ("localhost:70000", "port"),
        (":7070", "host is missing"),
        ("no-such-host.invalid:7070", "no-such-host.invalid"),
    ] {
        let out = command_as(User::Current)
            .args(["serve", "--listen", bad, "--state-dir"])
            .arg(state.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--listen"), "{bad}: {stderr}");
        assert!(stderr.contains(says), "{bad}: {stderr}");
    }
}

#[test]
fn generated_token_is_private_and_never_printed() {
    let state = state_dir(User::Current);
    let mut child = command_as(User::Current)
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status();
    let out = child.wait_with_output().unwrap();
    let info: Value = serde_json::from_str(&line).unwrap();
    assert!(info.get("token").is_none(), "{line}");
    let file = Path::new(info["token_file"].as_str().unwrap());
    assert_eq!(file, state.path().join("server.token"));
    let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let token = std::fs::read_to_string(file).unwrap();
    assert_eq!(token.trim().len(), 64);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains(token.trim()) && !line.contains(token.trim()));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn restart_lists_the_previous_servers_sandboxes_as_lost() {
    let state = state_dir(User::Current);
    let mut first = Served::start(User::Current, state.path(), &[]);
    let id = tokio().block_on(first.sandbox(json!({ "labels": { "keep": "me" } })));
    first.signal("KILL");
    first.wait();

    let second = Served::start(User::Current, state.path(), &[]);
    tokio().block_on(async {
        let (status, list) = second.json(Method::GET, "/v1/sandboxes", json!(null)).await;
        assert_eq!(status, StatusCode::OK);
        let entry = list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id.as_str())
            .unwrap_or_else(|| panic!("{id} not listed: {list}"))
            .clone();
        assert_eq!(entry["state"], "lost", "{entry}");
        assert_eq!(entry["labels"]["keep"], "me");
        let (status, error) = second
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                json!({ "command": "true" }),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{error}");
        assert_eq!(error["code"], "SANDBOX_NOT_RUNNING");
    });
}

#[test]
fn sigterm_stops_the_server_and_kills_everything_in_its_sandboxes() {
    let state = state_dir(User::Current);
    let mut server = Served::start(User::Current, state.path(), &[]);
    let marker = format!("{}", 900_000 + std::process::id() % 99_999);
    let id = tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let (status, process) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                json!({ "command": format!("sleep {marker} & sleep {marker}") }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{process}");
        id
    });
    for _ in 0..100 {
        if sleepers(&marker) == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(sleepers(&marker), 2, "the processes run");
    server.signal("TERM");
    assert_eq!(server.wait(), Some(0));
    assert_eq!(sleepers(&marker), 0, "nothing survives the server");

    let again = Served::start(User::Current, state.path(), &[]);
    tokio().block_on(async {
        let (_, info) = again
            .json(Method::GET, &format!("/v1/sandboxes/{id}"), json!(null))
            .await;
        assert_eq!(info["state"], "stopped", "{info}");
    });
}

/// Processes on the host whose command line is `sleep MARKER`.
fn sleepers(marker: &str) -> usize {
    let want = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|cmdline| cmdline == want.as_bytes())
        .count()
}

/// Fuzzes the API from its OpenAPI document with schemathesis (scripts/fuzz-api.sh): no
/// 5xx, no hang. Needs python3 (with venv); a loud skip without it, a failure under
/// `LOCKBOX_TEST_REQUIRE=all`.
#[test]
fn schemathesis_fuzz_finds_no_server_error() {
    let has_python = std::process::Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .status()
        .is_ok_and(|s| s.success());
    lockbox_testkit::require!(has_python, "python3 with venv is missing");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fuzz-api.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .env("LOCKBOX_BIN", common::binary())
        .env("FUZZ_MAX_EXAMPLES", "20")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
}

#[test]
fn pipe_process_stdin_over_websocket_and_truncated_logs() {
    let state = state_dir(User::Current);
    let server = Served::start(User::Current, state.path(), &[]);
    tokio().block_on(async {
        let id = server.sandbox(json!({})).await;
        let (status, process) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                json!({ "argv": ["sed", "-u", "s/hello/HELLO/"], "stdin": true }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{process}");
        let pid = process["id"].as_str().unwrap();
        let url = format!(
            "{}/v1/sandboxes/{id}/processes/{pid}/ws",
            server.base.replace("http://", "ws://")
        );
        let mut request = url.as_str().into_client_request().unwrap();
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {}", server.token).parse().unwrap(),
        );
        let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        ws.send(Message::Binary(b"hello\n".to_vec().into()))
            .await
            .unwrap();
        let mut screen = Vec::new();
        read_until(&mut ws, &mut screen, "HELLO").await;
        ws.send(Message::Text(r#"{"close_stdin": true}"#.into()))
            .await
            .unwrap();
        let exited = loop {
            match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
                Ok(Some(Ok(Message::Text(text)))) if text.contains("exited") => {
                    break serde_json::from_str::<Value>(&text).unwrap();
                }
                Ok(Some(Ok(_))) => continue,
                other => panic!("no exit frame: {other:?}"),
            }
        };
        assert_eq!(exited["exited"]["exit_code"], 0, "{exited}");

        // A log bound smaller than the output: the oldest bytes are gone, and a reader
        // from cursor 0 is told so.
        let (_, process) = server
            .json(
                Method::POST,
                &format!("/v1/sandboxes/{id}/processes"),
                json!({ "command": "seq 1 5000", "log_bytes": 1000 }),
            )
            .await;
        let pid = process["id"].as_str().unwrap();
        // Read only once it is done, so exactly one eviction lies between cursor 0 and the
        // log (a follower racing the writer may be overtaken several times).
        for _ in 0..200 {
            let (_, info) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/processes/{pid}"),
                    json!(null),
                )
                .await;
            if info["state"] == "exited" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let logs = format!("/v1/sandboxes/{id}/processes/{pid}/logs");
        let response = server
            .request(Method::GET, &format!("{logs}?follow=true&since=0"))
            .send()
            .await
            .unwrap();
        let events = read_sse(response, |e| e.event == "eof").await;
        assert_eq!(events.iter().filter(|e| e.event == "truncated").count(), 1);
        let text: String = events
            .iter()
            .filter(|e| e.event == "stdout")
            .map(|e| {
                serde_json::from_str::<Value>(&e.data).unwrap()["data"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert!(text.ends_with("4999\n5000\n"), "{text}");
        assert!(text.len() <= 1000, "{}", text.len());
    });
}

/// `2026-11-18T11:06:40.123Z`: RFC 3339, UTC, milliseconds, as every record gives its time.
fn is_api_time(v: &Value) -> bool {
    let Some(s) = v.as_str() else { return false };
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    b.len() == 24
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z'
}

#[test]
fn every_record_gives_its_time_as_rfc3339_utc_with_milliseconds_across_a_restart() {
    for user in users() {
        let state = state_dir(user);
        let work = common::scratch();
        give(work.path(), user);
        let wd = work.path().to_str().unwrap().to_owned();
        let mut first = Served::start(user, state.path(), &[]);
        let (id, created_at) = tokio().block_on(async {
            let (status, info) = first
                .json(
                    Method::POST,
                    "/v1/sandboxes",
                    json!({ "workdir": wd, "on_exit": "abort" }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{user:?} {info}");
            assert!(is_api_time(&info["created_at"]), "{info}");
            let id = info["id"].as_str().unwrap().to_owned();
            let sandbox = format!("/v1/sandboxes/{id}");
            for (path, body, field) in [
                ("sessions", json!({}), "created_at"),
                ("processes", json!({ "argv": ["true"] }), "started_at"),
                ("contexts", json!({ "language": "bash" }), "created_at"),
                ("snapshots", json!({}), "created_at"),
            ] {
                let (status, record) = first
                    .json(Method::POST, &format!("{sandbox}/{path}"), body)
                    .await;
                assert_eq!(status, StatusCode::CREATED, "{user:?} {path} {record}");
                assert!(is_api_time(&record[field]), "{path}: {record}");
            }
            let (status, stat) = first
                .json(
                    Method::GET,
                    &format!("{sandbox}/fs/stat?path=/tmp"),
                    Value::Null,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{stat}");
            assert!(is_api_time(&stat["modified"]), "{stat}");
            (id, info["created_at"].clone())
        });
        first.signal("KILL");
        first.wait();

        // The time read back from the state directory is the one the creation gave.
        let second = Served::start(user, state.path(), &[]);
        tokio().block_on(async {
            let (status, info) = second
                .json(Method::GET, &format!("/v1/sandboxes/{id}"), Value::Null)
                .await;
            assert_eq!(status, StatusCode::OK, "{info}");
            assert_eq!(info["state"], "lost", "{info}");
            assert_eq!(info["created_at"], created_at, "{info}");
            // And its spec, from the same record: the policy summary of the one created.
            assert_eq!(info["policy"]["net"], "none", "{info}");
        });
    }
}

/// Issue 32: a 500 tells the client to "see the server log", and `lockbox serve` logged
/// nothing unless `LOCKBOX_LOG` was set: each 500's cause is logged by default.
#[test]
fn issue_32_an_internal_error_is_logged_without_lockbox_log() {
    let user = users()[0];
    let state = state_dir(user);
    let (server, stderr) = Served::start_with_stderr(user, state.path());
    // The transactions' directory made unreadable as one: listing them fails inside.
    std::fs::write(state.path().join("txns"), "not a directory").unwrap();
    let error = tokio().block_on(async {
        let (status, error) = server
            .json(Method::GET, "/v1/transactions", json!(null))
            .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{error}");
        error
    });
    let code = error["code"].as_str().unwrap().to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let found = BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("ERROR") && line.contains(&code));
        let _ = tx.send(found);
    });
    let logged = rx.recv_timeout(Duration::from_secs(60));
    assert!(
        matches!(&logged, Ok(Some(line)) if line.contains("txns")),
        "the cause, with its path, on stderr: {logged:?}"
    );
}

/// The file (device, inode) each of the server's descendants executes.
fn executables(server: &Served) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    server
        .descendants()
        .into_iter()
        .filter_map(|pid| std::fs::metadata(format!("/proc/{pid}/exe")).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

fn file_id(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.dev(), m.ino())
}

#[test]
fn sandboxes_run_the_small_agent_written_into_the_state_directory() {
    for user in users() {
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &["--pool", "0"]);
        let agents: Vec<_> = std::fs::read_dir(state.path().join("agent"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(agents.len(), 1, "{user:?}: {agents:?}");
        let agent = &agents[0];
        assert!(
            std::fs::metadata(agent).unwrap().len() * 4
                < std::fs::metadata(common::binary()).unwrap().len(),
            "the agent is a small binary of its own, not a copy of lockbox"
        );
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let result = server.exec(&id, json!({ "command": "echo hi" })).await;
            assert_eq!(result["stdout"], "hi\n", "{user:?} {result}");
        });
        // The init and the agent run the agent's file (the session's shell runs in place of
        // a shim). The init is a fork of the server until it re-executes itself beside the
        // agent's first answers, and a set-up helper is one while it runs: wait (up to 10 s).
        let settled = || {
            let run = executables(&server);
            let agent_run = run.iter().filter(|f| **f == file_id(agent)).count();
            (agent_run >= 2 && !run.contains(&file_id(common::binary()))).then_some(())
        };
        let mut done = settled();
        for _ in 0..200 {
            if done.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            done = settled();
        }
        assert!(done.is_some(), "{user:?}: {:?}", executables(&server));
    }
}

#[test]
fn a_server_whose_state_directory_is_noexec_runs_lockbox_itself_as_the_agent_and_says_so() {
    for user in users() {
        let state = state_dir(user);
        let (server, stderr) = Served::start_on_noexec_state(user, state.path());
        let mut stderr = BufReader::new(stderr);
        let mut said = String::new();
        while !said.contains("lockbox: serving") {
            assert_ne!(stderr.read_line(&mut said).unwrap(), 0, "{said}");
        }
        assert!(
            said.contains(&format!(
                "{} is on a noexec file system: sandboxes run lockbox itself as their agent",
                state.path().display()
            )),
            "{user:?}: {said}"
        );
        tokio().block_on(async {
            let id = server.sandbox(json!({})).await;
            let result = server.exec(&id, json!({ "command": "echo hi" })).await;
            assert_eq!(result["stdout"], "hi\n", "{user:?} {result}");
        });
        let run = executables(&server);
        let lockbox_run = run
            .iter()
            .filter(|f| **f == file_id(common::binary()))
            .count();
        assert!(lockbox_run >= 3, "{user:?}: {lockbox_run} of {run:?}");
    }
}

#[test]
fn out_of_processes_a_create_fails_with_a_hint_and_the_server_stays_up_and_stops_cleanly() {
    lockbox_testkit::require!(
        rustix::process::geteuid().is_root(),
        "needs root to run the server as a uid of its own"
    );
    use std::os::unix::process::CommandExt;
    // RLIMIT_NPROC counts every process of the user on the host: a uid no other test uses.
    const UID: u32 = 64_731;
    let dir = common::scratch();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let state = dir.path().join("state");
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let mut command = std::process::Command::new("prlimit");
    command
        .arg("--nproc=48")
        .arg(common::binary())
        .uid(UID)
        .gid(UID)
        .stderr(stderr)
        .env_remove("LOCKBOX_LOG");
    let mut server = Served::start_from(command, &state, &["--pool", "0"]);
    let said = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        said.contains("RLIMIT_NPROC (48, ulimit -u) leaves room for about 16 idle sandboxes"),
        "{said}"
    );
    tokio().block_on(async {
        let mut refused = None;
        for _ in 0..40 {
            let (status, created) = server.json(Method::POST, "/v1/sandboxes", json!({})).await;
            if !status.is_success() {
                refused = Some((status, created));
                break;
            }
            let id = created["id"].as_str().unwrap();
            // Its shell, as an agent's first command starts it; it may be the one refused.
            let _ = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/exec"),
                    json!({ "command": "true" }),
                )
                .await;
        }
        let (status, error) = refused.expect("48 processes cannot hold 40 sandboxes");
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
        assert_eq!(error["code"], "SETUP_FAILED", "{error}");
        assert!(
            error["details"]["hint"]
                .as_str()
                .is_some_and(|h| h.starts_with("no more processes: this user's RLIMIT_NPROC")),
            "{error}"
        );
        let (status, _) = server.json(Method::GET, "/healthz", json!(null)).await;
        assert_eq!(status, StatusCode::OK);
    });
    server.signal("TERM");
    assert_eq!(server.wait(), Some(0));
    let said = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(!said.contains("panicked"), "{said}");
    let left = std::process::Command::new("pgrep")
        .args(["-u", &UID.to_string()])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "left: {left:?}");
}
