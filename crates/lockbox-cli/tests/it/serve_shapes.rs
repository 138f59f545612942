//! Issue 33 item 5: the OpenAPI document says what the server sends. Every reply read
//! through `Served::json` is checked against the document (`serve_support::shape`); the
//! other serve tests cover most routes that way, and this one walks through the JSON routes
//! they leave out — branches, the journal, transactions, contexts, tokens, snapshots, the
//! `fs/*` calls, processes' signals and stdin — so that each reply shape is checked at least
//! once on a real server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use common::{give, users};
use reqwest::Method;
use serde_json::{json, Value};
use serve_support::{state_dir, tokio, Served};

#[test]
fn every_json_route_answers_what_the_openapi_document_says() {
    for user in users() {
        let state = state_dir(user);
        let work = state_dir(user);
        std::fs::write(work.path().join("f"), "a\n").unwrap();
        let journal_dir = state_dir(user);
        let db = journal_dir.path().join("journal.db");
        let steps = [("llm", json!(1)), ("tool", json!("done"))];
        let url = tokio().block_on(common::journal::with_a_run(&db, "agent-1", &steps));
        give(journal_dir.path(), user);
        give(work.path(), user);
        let server = Served::start(user, state.path(), &["--journal", &url]);
        let workdir = work.path().to_str().unwrap();
        tokio().block_on(async {
            // Each call must succeed; `json` checks that its status is documented for the
            // route and its reply has the documented shape.
            let call = |method: Method, path: String, body: Value| {
                let server = &server;
                async move {
                    let (status, reply) = server.json(method.clone(), &path, body).await;
                    assert!(
                        status.is_success(),
                        "{user:?} {method} {path}: {status} {reply}"
                    );
                    reply
                }
            };

            // The journal.
            let runs = call(Method::GET, "/v1/journal/runs".into(), Value::Null).await;
            assert_eq!(runs["runs"][0]["id"], "agent-1", "{runs}");
            call(Method::GET, "/v1/journal/runs/agent-1".into(), Value::Null).await;

            // Files, processes, sessions, contexts, ports.
            let id = server.sandbox(json!({ "workdir": workdir })).await;
            let sb = format!("/v1/sandboxes/{id}");
            call(
                Method::POST,
                format!("{sb}/fs/mkdir"),
                json!({"path": "/tmp/d/e", "parents": true}),
            )
            .await;
            call(
                Method::POST,
                format!("{sb}/fs/move"),
                json!({"from": "/tmp/d/e", "to": "/tmp/d/g"}),
            )
            .await;
            call(
                Method::POST,
                format!("{sb}/fs/remove"),
                json!({"path": "/tmp/d", "recursive": true}),
            )
            .await;
            let process = call(
                Method::POST,
                format!("{sb}/processes"),
                json!({"argv": ["cat"], "stdin": true}),
            )
            .await;
            let pid = process["id"].as_str().unwrap().to_owned();
            call(
                Method::POST,
                format!("{sb}/processes/{pid}/stdin"),
                json!({"data": "aGk=", "close": true}),
            )
            .await;
            let sleeper = call(
                Method::POST,
                format!("{sb}/processes"),
                json!({"argv": ["sleep", "60"]}),
            )
            .await;
            let sleeper = sleeper["id"].as_str().unwrap().to_owned();
            call(
                Method::POST,
                format!("{sb}/processes/{sleeper}/signal"),
                json!({"signal": "TERM"}),
            )
            .await;
            let session = call(Method::POST, format!("{sb}/sessions"), json!({})).await;
            let sid = session["id"].as_str().unwrap().to_owned();
            call(Method::GET, format!("{sb}/sessions"), Value::Null).await;
            call(Method::DELETE, format!("{sb}/sessions/{sid}"), Value::Null).await;
            let context = call(
                Method::POST,
                format!("{sb}/contexts"),
                json!({"language": "bash"}),
            )
            .await;
            let cid = context["id"].as_str().unwrap().to_owned();
            let ran = call(
                Method::POST,
                format!("{sb}/contexts/{cid}/run"),
                json!({"code": "echo hi"}),
            )
            .await;
            assert!(ran.to_string().contains("hi"), "{ran}");
            call(Method::GET, format!("{sb}/contexts"), Value::Null).await;
            call(Method::DELETE, format!("{sb}/contexts/{cid}"), Value::Null).await;
            call(Method::POST, format!("{sb}/ports"), json!({"port": 8000})).await;
            call(Method::DELETE, format!("{sb}/ports/8000"), Value::Null).await;

            // Snapshots.
            server.exec(&id, json!({"command": "echo b > f"})).await;
            let snap = call(Method::POST, format!("{sb}/snapshots"), json!({})).await;
            let snap = snap["id"].as_str().unwrap().to_owned();
            call(Method::GET, format!("/v1/snapshots/{snap}"), Value::Null).await;
            call(
                Method::GET,
                format!("/v1/snapshots/{snap}/diff?to_sandbox={id}"),
                Value::Null,
            )
            .await;

            // A sandbox's diff and commit.
            call(Method::GET, format!("{sb}/diff?path=f"), Value::Null).await;
            call(Method::POST, format!("{sb}/commit"), json!({})).await;
            call(Method::DELETE, format!("/v1/snapshots/{snap}"), Value::Null).await;
            call(Method::DELETE, sb.clone(), Value::Null).await;

            // Transactions: a gather of two sandboxes, then its record.
            let a = server.sandbox(json!({ "workdir": workdir })).await;
            let b = server.sandbox(json!({ "workdir": workdir })).await;
            server.exec(&a, json!({"command": "echo a > from-a"})).await;
            server.exec(&b, json!({"command": "echo b > from-b"})).await;
            let gather = json!({"kind": "gather", "sandboxes": [a, b]});
            call(Method::POST, "/v1/transactions".into(), gather).await;
            let txns = call(Method::GET, "/v1/transactions".into(), Value::Null).await;
            let txn = txns["transactions"][0]["id"].as_str().unwrap().to_owned();
            call(Method::GET, format!("/v1/transactions/{txn}"), Value::Null).await;

            // Kept branches: listed, detailed, diffed, committed; another aborted.
            for action in ["commit", "abort"] {
                let id = server.sandbox(json!({ "workdir": workdir })).await;
                server
                    .exec(&id, json!({"command": format!("echo {action} > f")}))
                    .await;
                let deleted =
                    call(Method::DELETE, format!("/v1/sandboxes/{id}"), Value::Null).await;
                let branch = deleted["branch"].as_str().unwrap().to_owned();
                call(Method::GET, "/v1/branches".into(), Value::Null).await;
                call(Method::GET, format!("/v1/branches/{branch}"), Value::Null).await;
                call(
                    Method::GET,
                    format!("/v1/branches/{branch}/diff?path=f"),
                    Value::Null,
                )
                .await;
                call(
                    Method::POST,
                    format!("/v1/branches/{branch}/{action}"),
                    json!({}),
                )
                .await;
            }
            assert_eq!(
                std::fs::read_to_string(work.path().join("f")).unwrap(),
                "commit\n"
            );

            // Scoped tokens.
            let minted = call(Method::POST, "/v1/tokens".into(), json!({})).await;
            let token = minted["id"].as_str().unwrap().to_owned();
            call(Method::DELETE, format!("/v1/tokens/{token}"), Value::Null).await;
        });
    }
}
