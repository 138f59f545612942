//! Approvals (`net_ask`) through `lockbox serve`: a sandbox's DNS query and connect towards
//! unlisted destinations wait, are listed by `GET approvals` (a long poll), and are answered
//! by `POST approvals/{qid}`; stale, repeated and malformed answers get 404, 409 and 400.
//! No network is reached: the asked name resolves through `LOCKBOX_NET_HOSTS_FILE`, and the
//! asked connect is denied. As the current user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use common::{scratch, users};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{state_dir, tokio, Served};

/// Run in the sandbox: an A query for `asked.test` to lockbox's resolver (`dns RCODE N`),
/// then a TCP connect to an unlisted address (`connect ERRNO`).
const PROBE: &str = r#"
import socket, struct
q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x05asked\x04test\x00" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(60)
s.sendto(q, ("127.0.0.153", 53))
r = s.recv(4096)
print("dns", r[3] & 15, struct.unpack(">H", r[6:8])[0])
try:
    socket.create_connection(("198.18.0.77", 443), timeout=60)
    print("connect ok")
except OSError as e:
    print("connect", e.errno)
"#;

async fn next_question(server: &Served, id: &str, after: u64) -> Value {
    let path = format!("/v1/sandboxes/{id}/approvals?after={after}&wait_ms=10000");
    for _ in 0..6 {
        let (status, body) = server.json(Method::GET, &path, json!(null)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if let Some(q) = body["approvals"].as_array().and_then(|a| a.first()) {
            return q.clone();
        }
    }
    panic!("no question after {after}");
}

async fn decide(server: &Served, id: &str, qid: &Value, body: Value) -> (StatusCode, Value) {
    let path = format!("/v1/sandboxes/{id}/approvals/{qid}");
    server.json(Method::POST, &path, body).await
}

#[test]
fn approvals_over_http_are_listed_answered_once_and_refused_when_stale_repeated_or_malformed() {
    let dir = scratch();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "198.18.0.9 asked.test\n").unwrap();
    let probe = dir.path().join("probe.py");
    std::fs::write(&probe, PROBE).unwrap();
    for user in users() {
        let state = state_dir(user);
        let server =
            Served::start_with_env(user, state.path(), &[("LOCKBOX_NET_HOSTS_FILE", &hosts)]);
        tokio().block_on(async {
            let (status, err) = server
                .json(
                    Method::POST,
                    "/v1/sandboxes",
                    json!({ "net": "host", "net_ask": true }),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
            assert_eq!(err["details"]["field"], "net_ask", "{err}");

            let id = server
                .sandbox(json!({
                    "net": { "allow": ["tcp://listed.test:1"] },
                    "net_ask": true,
                    "net_ask_timeout_ms": 30000,
                    "fs_readable": [dir.path()],
                }))
                .await;
            let command = format!("python3 {}", probe.display());
            let run = server.exec(&id, json!({ "command": command, "timeout_ms": 120000 }));
            let answer = async {
                let q = next_question(&server, &id, 0).await;
                assert_eq!(
                    (&q["kind"], &q["name"]),
                    (&json!("dns"), &json!("asked.test"))
                );
                assert!(q["command"].as_str().unwrap().contains("probe.py"), "{q}");
                let (status, body) =
                    decide(&server, &id, &q["id"], json!({ "decision": "once" })).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                let (status, body) =
                    decide(&server, &id, &q["id"], json!({ "decision": "deny" })).await;
                assert_eq!(status, StatusCode::CONFLICT, "{body}");
                assert_eq!(body["code"], "QUESTION_DECIDED", "{body}");

                let q2 = next_question(&server, &id, q["id"].as_u64().unwrap()).await;
                assert_eq!(q2["kind"], "connect", "{q2}");
                assert_eq!(
                    (&q2["address"], &q2["port"]),
                    (&json!("198.18.0.77"), &json!(443))
                );
                let (status, body) =
                    decide(&server, &id, &q2["id"], json!({ "decision": "maybe" })).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
                assert_eq!(body["details"]["field"], "decision", "{body}");
                let (status, body) =
                    decide(&server, &id, &q2["id"], json!({ "verdict": "deny" })).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
                let (status, body) =
                    decide(&server, &id, &q2["id"], json!({ "decision": "deny" })).await;
                assert_eq!(status, StatusCode::OK, "{body}");
                let (status, body) =
                    decide(&server, &id, &json!(999), json!({ "decision": "once" })).await;
                assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
                assert_eq!(body["code"], "QUESTION_NOT_FOUND", "{body}");
            };
            let (result, ()) = futures_util::join!(run, answer);
            assert_eq!(
                result["stdout"], "dns 0 1\nconnect 13\n",
                "{user:?} {result}"
            );

            let (_, log) = server
                .json(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/audit?follow=false"),
                    json!(null),
                )
                .await;
            let decisions: Vec<(String, String)> = log["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["decision"].as_str().unwrap_or("").to_owned(),
                        e["reason"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect();
            let want = [
                ("asked", "name not listed; asked"),
                ("allowed", "approved once"),
                ("asked", "not in the allow-list; asked"),
                ("denied", "denied by the API"),
            ];
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(d, r)| ((*d).to_owned(), (*r).to_owned()))
                .collect();
            assert_eq!(decisions, want, "{user:?} {log}");
        });
    }
}
