//! `process.Process` as the E2B SDK uses it: commands through `bash -l -c`, exit codes and
//! output exactly, env and cwd, users, background processes killed by pid, stdin
//! (SendInput, StreamInput, CloseStdin), PTYs and resize, reattach by tag, errors.

use crate::common::also_as_nobody;
use crate::envd::*;
use lockbox_e2b::envd::proto;
use prost::Message;
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_streams_its_pid_stdout_stderr_and_exit_code() {
    also_as_nobody("process::a_command_streams_its_pid_stdout_stderr_and_exit_code");
    let s = Served::start().await;
    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": bash("echo out; echo err >&2; printf '%s' \"$GREETING\"; exit 3"),
                   "stdin": false}),
            None,
        )
        .await;
    // The registry is empty (no E2B create): envs come from the request alone.
    assert!(started(&mut st).await > 0);
    let (out, err, _, end) = st.collect_process().await;
    assert_eq!(out, b"out\n");
    assert_eq!(err, b"err\n");
    assert_eq!(end["exitCode"], 3);
    assert_eq!(end["exited"], true);
    assert_eq!(end["status"], "exit status 3");
    assert_eq!(end["error"], "exit status 3");
    assert_eq!(st.end().await, None, "the stream ends cleanly");

    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "printf '%s|' \"$GREETING\" \"$PWD\""],
                               "envs": {"GREETING": "hello"}, "cwd": "/tmp"},
                   "stdin": false}),
            None,
        )
        .await;
    started(&mut st).await;
    let (out, _, _, end) = st.collect_process().await;
    assert_eq!(String::from_utf8(out).unwrap(), "hello|/tmp|");
    assert_eq!(end["exitCode"], 0);
    assert!(end.get("error").is_none(), "no error for exit 0: {end}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_root_and_user_start_in_their_home() {
    also_as_nobody("process::users_root_and_user_start_in_their_home");
    let s = Served::start().await;
    for user in ["root", "user"] {
        let home = if user == "root" {
            "/root"
        } else {
            "/home/user"
        };
        let is_dir = |st: lockbox_runtime::FileStat| st.kind == lockbox_runtime::FileKind::Dir;
        // The user's home, else lockbox's default HOME.
        let home = if s.sb.stat(home).await.is_ok_and(is_dir) {
            home
        } else {
            "/tmp"
        };
        let mut st = s
            .stream(
                "process.Process/Start",
                json!({"process": bash("printf '%s|%s' \"$PWD\" \"$USER\""), "stdin": false}),
                Some(user),
            )
            .await;
        started(&mut st).await;
        let (out, _, _, _) = st.collect_process().await;
        let want = format!("{home}|{user}");
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }
    let (status, body) = s
        .unary_as("process.Process/List", json!({}), Some("mallory"))
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["code"], "invalid_argument");
    assert!(body["message"].as_str().unwrap().contains("mallory"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_process_outlives_its_stream_and_is_killed_by_pid() {
    also_as_nobody("process::a_background_process_outlives_its_stream_and_is_killed_by_pid");
    let s = Served::start().await;
    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": bash("sleep 300"), "stdin": false, "tag": "sleeper"}),
            None,
        )
        .await;
    let pid = started(&mut st).await;
    drop(st); // the SDK's background=True handle, disconnected
    let listed = |v: &serde_json::Value| {
        v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pid)
    };
    let (status, list) = s.unary("process.Process/List", json!({})).await;
    assert_eq!(status, 200);
    assert!(
        listed(&list),
        "still running after its stream closed: {list}"
    );
    let entry = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap()
        .clone();
    assert_eq!(entry["tag"], "sleeper");
    assert_eq!(entry["config"]["cmd"], "/bin/bash");
    assert_eq!(entry["config"]["args"], json!(["-l", "-c", "sleep 300"]));
    // bash -l reads its profile before it execs the command.
    assert!(
        eventually(|| async {
            s.sh("ps -eo args= | grep -c '^sleep 300$' || true").await == "1\n"
        })
        .await,
        "the command runs"
    );

    let kill = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
    let (status, _) = s.unary("process.Process/SendSignal", kill.clone()).await;
    assert_eq!(status, 200);
    // SIGKILL answers once the process is gone.
    assert!(!listed(&s.unary("process.Process/List", json!({})).await.1));
    assert_eq!(
        s.sh("ps -eo args= | grep -c '^sleep 300$' || true").await,
        "0\n"
    );
    // The SDK's kill() answers False for a process that is gone: not_found.
    let (status, body) = s.unary("process.Process/SendSignal", kill).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_process_and_its_stream_reports_the_signal() {
    also_as_nobody("process::sigterm_ends_a_process_and_its_stream_reports_the_signal");
    let s = Served::start().await;
    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "sleep", "args": ["301"]}, "stdin": false}),
            None,
        )
        .await;
    let pid = started(&mut st).await;
    let (status, _) = s
        .unary(
            "process.Process/SendSignal",
            json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, _, _, end) = st.collect_process().await;
    assert_eq!(end["exitCode"], -1);
    assert_eq!(end["exited"], false);
    assert_eq!(end["status"], "signal: terminated");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_arrives_by_send_input_and_stream_input_and_closes() {
    also_as_nobody("process::stdin_arrives_by_send_input_and_stream_input_and_closes");
    let s = Served::start().await;
    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "cat"}, "stdin": true}),
            None,
        )
        .await;
    let pid = started(&mut st).await;
    let (status, body) = s
        .unary(
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"stdin": b64(b"hello ")}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let frames = s
        .client_stream(
            "process.Process/StreamInput",
            vec![
                json!({"start": {"process": {"pid": pid}}}),
                json!({"data": {"input": {"stdin": b64(b"stream")}}}),
                json!({"keepalive": {}}),
                json!({"data": {"input": {"stdin": b64(b"ed\n")}}}),
            ],
        )
        .await;
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[0].json(), json!({}));
    assert!(matches!(&frames[1], Frame::End(v) if v.get("error").is_none()));
    let (status, _) = s
        .unary(
            "process.Process/CloseStdin",
            json!({"process": {"pid": pid}}),
        )
        .await;
    assert_eq!(status, 200);
    let (out, _, _, end) = st.collect_process().await;
    assert_eq!(out, b"hello streamed\n");
    assert_eq!(end["exitCode"], 0, "cat saw end of input");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_has_the_asked_size_resizes_and_takes_input() {
    also_as_nobody("process::a_pty_has_the_asked_size_resizes_and_takes_input");
    let s = Served::start().await;
    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": bash("stty size; read line; stty size; echo \"got $line\""),
                   "pty": {"size": {"cols": 100, "rows": 30}}, "tag": "term"}),
            None,
        )
        .await;
    let pid = started(&mut st).await;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("30 100") {
        let v = st.event().await;
        let data = v["event"]["data"]["pty"].as_str().expect("pty output");
        seen.extend(
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, data).unwrap(),
        );
    }
    let (status, _) = s
        .unary(
            "process.Process/Update",
            json!({"process": {"tag": "term"}, "pty": {"size": {"cols": 120, "rows": 40}}}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = s
        .unary(
            "process.Process/SendInput",
            json!({"process": {"pid": pid}, "input": {"pty": b64(b"hi\n")}}),
        )
        .await;
    assert_eq!(status, 200);
    let (_, _, pty, end) = st.collect_process().await;
    let text = String::from_utf8_lossy(&pty);
    assert!(text.contains("40 120"), "resized: {text:?}");
    assert!(
        text.contains("got hi"),
        "input reached the terminal: {text:?}"
    );
    assert_eq!(end["exitCode"], 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_reattaches_to_a_running_process_by_tag_or_pid() {
    also_as_nobody("process::connect_reattaches_to_a_running_process_by_tag_or_pid");
    let s = Served::start().await;
    let mut first = s
        .stream(
            "process.Process/Start",
            json!({"process": bash("while read l; do echo \"got $l\"; done"), "stdin": true, "tag": "echoer"}),
            None,
        )
        .await;
    let pid = started(&mut first).await;
    drop(first);
    let mut again = s
        .stream(
            "process.Process/Connect",
            json!({"process": {"tag": "echoer"}}),
            None,
        )
        .await;
    assert_eq!(started(&mut again).await, pid);
    s.unary(
        "process.Process/SendInput",
        json!({"process": {"pid": pid}, "input": {"stdin": b64(b"one\n")}}),
    )
    .await;
    s.unary(
        "process.Process/CloseStdin",
        json!({"process": {"pid": pid}}),
    )
    .await;
    let (out, _, _, end) = again.collect_process().await;
    assert_eq!(out, b"got one\n");
    assert_eq!(end["exitCode"], 0);
    let (status, body) = s
        .unary("process.Process/Connect", json!({"process": {"pid": pid}}))
        .await;
    assert_eq!(status, 501, "a stream method called as unary: {body}");
    let mut gone = s
        .stream(
            "process.Process/Connect",
            json!({"process": {"pid": pid}}),
            None,
        )
        .await;
    let err = gone.end().await.expect("an error");
    assert_eq!(err["code"], "not_found");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_codec_serves_unary_and_streaming_calls() {
    also_as_nobody("process::the_binary_codec_serves_unary_and_streaming_calls");
    let s = Served::start().await;
    let start = proto::StartRequest {
        process: Some(proto::ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo binary; exit 7".into()],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let resp = s
        .client
        .post(format!("{}/process.Process/Start", s.base))
        .header("E2b-Sandbox-Id", s.sb.id())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/connect+proto")
        .body(frame(0, &start.encode_to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "application/connect+proto");
    let body = resp.bytes().await.unwrap();
    let (mut rest, mut out, mut code) = (&body[..], Vec::new(), None);
    while !rest.is_empty() {
        let (flags, len) = (
            rest[0],
            u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize,
        );
        let payload = &rest[5..5 + len];
        rest = &rest[5 + len..];
        if flags & 2 != 0 {
            assert_eq!(payload, b"{}");
            continue;
        }
        let ev = proto::StartResponse::decode(payload)
            .unwrap()
            .event
            .unwrap();
        match ev.event.unwrap() {
            proto::Event::Data(d) => {
                if let Some(proto::Output::Stdout(b)) = d.output {
                    out.extend(b);
                }
            }
            proto::Event::End(e) => code = Some(e.exit_code),
            _ => {}
        }
    }
    assert_eq!(out, b"binary\n");
    assert_eq!(code, Some(7));

    let resp = s
        .client
        .post(format!("{}/process.Process/List", s.base))
        .header("E2b-Sandbox-Id", s.sb.id())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/proto")
        .body(Vec::new())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/proto");
    let list = proto::ListResponse::decode(resp.bytes().await.unwrap()).unwrap();
    assert!(list.processes.is_empty(), "nothing runs: {list:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_connect_codes_the_sdk_maps_to_its_exceptions() {
    also_as_nobody("process::errors_carry_the_connect_codes_the_sdk_maps_to_its_exceptions");
    let s = Served::start().await;
    let (status, body) = s
        .unary(
            "process.Process/SendInput",
            json!({"process": {"pid": 999999}, "input": {"stdin": b64(b"x")}}),
        )
        .await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, body) = s.unary("process.Process/Frobnicate", json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (501, Some("unimplemented"))
    );
    assert!(body["message"].as_str().unwrap().contains("Frobnicate"));
    let (status, body) = s
        .unary(
            "process.Process/SendSignal",
            json!({"process": {"pid": 1}, "signal": 2}),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let resp = s
        .client
        .post(format!("{}/process.Process/SendSignal", s.base))
        .header("E2b-Sandbox-Id", s.sb.id())
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400, "a body that is not JSON");
    // Another sandbox id: the SDK turns "was not found" into SandboxNotRunningException.
    let resp = s
        .client
        .post(format!("{}/process.Process/List", s.base))
        .header("E2b-Sandbox-Id", "no-such-sandbox")
        .header("E2b-Sandbox-Port", "49983")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    // (Answered by the sandbox plane's admission, in E2B's shape, as E2B's proxy does.)
    assert_eq!(resp.status(), 502);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("was not found"));
    // A deadline ends a stream with deadline_exceeded.
    let mut st = s
        .stream_with(
            "process.Process/Start",
            json!({"process": bash("sleep 7 & exec sleep 5"), "stdin": false}),
            None,
            &[("Connect-Timeout-Ms", "300")],
        )
        .await;
    started(&mut st).await;
    assert_eq!(st.end().await.unwrap()["code"], "deadline_exceeded");
    // As envd: the command's timeout bounds the process too (and, in lockbox, what it
    // started: a process is its tree).
    assert!(
        eventually(|| async { s.sh("ps -eo args= | grep -c '^sleep 5$' || true").await == "0\n" })
            .await,
        "killed at its deadline"
    );
    assert_eq!(
        s.sh("ps -eo args= | grep -c '^sleep 7$' || true").await,
        "0\n"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_sandbox_needs_its_access_token_and_its_env_vars_are_the_default() {
    also_as_nobody(
        "process::a_secure_sandbox_needs_its_access_token_and_its_env_vars_are_the_default",
    );
    let s = Served::start().await;
    s.e2b.registry.insert(
        s.sb.id(),
        lockbox_e2b::E2bSandbox {
            access_token: Some("sesame".into()),
            env: [("FROM_CREATE".to_owned(), "yes".to_owned())].into(),
            ..Default::default()
        },
    );
    // Refused by the sandbox plane's admission (E2B's shape; the SDK's Connect client
    // maps the 401 to unauthenticated).
    let (status, body) = s.unary("process.Process/List", json!({})).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("X-Access-Token"),
        "{body}"
    );
    let start = |token: &'static str| {
        s.client
            .post(format!("{}/process.Process/Start", s.base))
            .header("E2b-Sandbox-Id", s.sb.id())
            .header("E2b-Sandbox-Port", "49983")
            .header("X-Access-Token", token)
            .header("Content-Type", "application/connect+json")
    };
    let body = json!({"process": {"cmd": "/bin/bash", "args": ["-c", "printf '%s %s' $FROM_CREATE $MINE"],
                                  "envs": {"MINE": "too"}}, "stdin": false});
    let resp = start("sesame")
        .body(frame(0, body.to_string().as_bytes()))
        .send()
        .await
        .unwrap();
    let bytes = resp.bytes().await.unwrap();
    let text = String::from_utf8_lossy(&bytes);
    // "yes too" in base64, inside a data event.
    assert!(text.contains(&b64(b"yes too")), "{text}");
    let resp = start("wrong")
        .body(frame(0, body.to_string().as_bytes()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let text = resp.text().await.unwrap();
    assert!(text.contains("invalid access token"), "{text}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_sandbox_is_killed_ends_unavailable_without_an_exit() {
    also_as_nobody("process::a_command_whose_sandbox_is_killed_ends_unavailable_without_an_exit");
    let s = Served::start().await;
    let mut st = s
        .stream(
            "process.Process/Start",
            json!({"process": bash("sleep 60"), "stdin": false}),
            None,
        )
        .await;
    started(&mut st).await;
    s.rt.delete_sandbox(s.sb.id()).await.unwrap();
    let err = st.end().await.expect("an error, not an exit");
    assert_eq!(err["code"], "unavailable");
    // Not the proxy's "was not found": the SDK probes the sandbox's health and reports
    // it gone (SandboxNotRunningException).
    let message = err["message"].as_str().unwrap();
    assert!(!message.contains("was not found"), "{message}");
    s.stop().await;
}

/// A server stream whose request body ends after the server has answered (a chunked body's
/// last chunk sent late, as the E2B SDK's client does under load) leaves its HTTP/1.1
/// connection usable: hyper closes a connection whose request body was not read to its
/// end, without a `Connection: close` the client could see, and the SDK's next call on the
/// pooled connection failed ("connection closed before message completed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_request_ends_late_leaves_its_connection_usable() {
    also_as_nobody("process::a_stream_whose_request_ends_late_leaves_its_connection_usable");
    use tokio::io::AsyncWriteExt;
    let s = Served::start().await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let message = frame(
        0,
        json!({"process": bash("true"), "stdin": false})
            .to_string()
            .as_bytes(),
    );
    let head = format!(
        "POST /process.Process/Start HTTP/1.1\r\nHost: {addr}\r\nE2b-Sandbox-Id: {}\r\n\
         E2b-Sandbox-Port: 49983\r\nConnect-Protocol-Version: 1\r\n\
         Content-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        s.sb.id(),
        message.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&message).await.unwrap();
    conn.write_all(b"\r\n").await.unwrap();
    // `true` has ended by now, and its stream could have too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    conn.write_all(b"0\r\n\r\n").await.unwrap();
    let response = read_until_ends(&mut conn, b"\r\n0\r\n\r\n").await;
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );
    assert!(
        !String::from_utf8_lossy(&response)
            .to_lowercase()
            .contains("connection: close"),
        "the response does not end the connection"
    );
    // The same connection serves the next request.
    let health = format!(
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nE2b-Sandbox-Id: {}\r\n\
         E2b-Sandbox-Port: 49983\r\n\r\n",
        s.sb.id()
    );
    let wrote = conn.write_all(health.as_bytes()).await;
    let next = read_until_ends(&mut conn, b"\r\n\r\n").await;
    assert!(
        wrote.is_ok() && next.starts_with(b"HTTP/1.1 204"),
        "the server closed the connection: {wrote:?}, {:?}",
        String::from_utf8_lossy(&next)
    );
    s.stop().await;
}

/// Bytes read off `conn` until they end with `end` (or the connection ends, or 10 s pass).
async fn read_until_ends(conn: &mut tokio::net::TcpStream, end: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !got.ends_with(end) {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    got
}
