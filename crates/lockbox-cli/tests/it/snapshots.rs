//! Snapshots end to end: taken, forked, diffed and restored over `lockbox serve`'s HTTP API,
//! then listed, shown, compared and deleted with `lockbox snapshot` on the same state
//! directory; as the current user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use common::{give, lockbox, scratch, text, users};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{state_dir, tokio, Served};

#[test]
fn snapshots_fork_restore_and_diff_over_http_and_the_cli_reads_and_deletes_them() {
    for user in users() {
        let state = state_dir(user);
        let work = scratch();
        std::fs::write(work.path().join("app.txt"), "v1\n").unwrap();
        give(work.path(), user);
        let wd = work.path().to_str().unwrap().to_owned();
        let server = Served::start(user, state.path(), &[]);
        let (snap, fork_a, root) = tokio().block_on(async {
            let root = server
                .sandbox(json!({ "workdir": wd, "on_exit": "abort" }))
                .await;
            server
                .exec(
                    &root,
                    json!({ "command": "echo v2 > app.txt; echo n > new.txt" }),
                )
                .await;
            let (status, snap) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{root}/snapshots"),
                    json!({ "name": "v2" }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{user:?} {snap}");
            let sid = snap["id"].as_str().unwrap().to_owned();

            // Two forks, each on its own layer over the snapshot.
            let (status, forks) = server
                .json(
                    Method::POST,
                    &format!("/v1/snapshots/{sid}/fork"),
                    json!({ "count": 2 }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{forks}");
            let ids: Vec<String> = forks["sandboxes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(ids.len(), 2);
            for (i, id) in ids.iter().enumerate() {
                let r = server
                    .exec(
                        id,
                        json!({ "command": format!("cat app.txt new.txt; echo {i} > mine.txt") }),
                    )
                    .await;
                assert_eq!(r["stdout"], "v2\nn\n", "{user:?} {r}");
            }
            let (status, diff) = server
                .json(
                    Method::GET,
                    &format!("/v1/snapshots/{sid}/diff?to_sandbox={}", ids[0]),
                    Value::Null,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{diff}");
            assert_eq!(diff["changes"][0]["path"], "mine.txt", "{diff}");
            assert_eq!(diff["changes"].as_array().unwrap().len(), 1, "{diff}");
            let (status, e) = server
                .json(
                    Method::GET,
                    &format!("/v1/snapshots/{sid}/diff?to_sandbox=x&to_snapshot=y"),
                    Value::Null,
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");

            // A bad count, an unknown snapshot: refused, nothing made.
            for (body, want) in [
                (json!({ "count": 0 }), StatusCode::BAD_REQUEST),
                (json!({ "count": "two" }), StatusCode::BAD_REQUEST),
            ] {
                let (status, e) = server
                    .json(Method::POST, &format!("/v1/snapshots/{sid}/fork"), body)
                    .await;
                assert_eq!(status, want, "{e}");
            }
            let (status, e) = server
                .json(Method::POST, "/v1/snapshots/s-none/fork", json!({}))
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{e}");
            assert_eq!(e["code"], "SNAPSHOT_NOT_FOUND");

            // The first sandbox goes on, then rolls back.
            server
                .exec(&root, json!({ "command": "rm app.txt; echo junk > junk" }))
                .await;
            let (status, info) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{root}/restore"),
                    json!({ "snapshot": sid }),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{info}");
            assert_eq!(info["state"], "running");
            let r = server
                .exec(&root, json!({ "command": "cat app.txt; ls" }))
                .await;
            assert_eq!(r["stdout"], "v2\napp.txt\nnew.txt\n", "{r}");
            // A sandbox created from the snapshot with a body of its own.
            let one = server
                .sandbox(json!({ "from_snapshot": sid, "on_exit": "abort" }))
                .await;
            let r = server.exec(&one, json!({ "command": "cat new.txt" })).await;
            assert_eq!(r["stdout"], "n\n", "{r}");
            let (status, _) = server
                .json(Method::DELETE, &format!("/v1/sandboxes/{one}"), Value::Null)
                .await;
            assert_eq!(status, StatusCode::OK);
            (sid, ids[0].clone(), root)
        });

        // The CLI on the same state directory, while the server runs.
        let dir = state.path().to_str().unwrap();
        let cli = |args: &[&str]| {
            let mut all = vec!["snapshot", "--state-dir", dir];
            all.extend_from_slice(args);
            lockbox(user, work.path(), &all)
        };
        let out = cli(&["list", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(listed["snapshots"][0]["id"], snap.as_str(), "{listed}");
        let out = cli(&["show", &snap]);
        assert!(out.status.success(), "{}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(shown.contains("name v2"), "{shown}");
        assert!(
            shown.contains("M app.txt") && shown.contains("A new.txt"),
            "{shown}"
        );
        let out = cli(&["diff", &snap]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "M app.txt\nA new.txt\n"
        );
        // In use by the forks and the restored sandbox: refused, kept.
        let out = cli(&["rm", &snap]);
        assert_eq!(out.status.code(), Some(4), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(&fork_a),
            "{}",
            text(&out)
        );
        let out = cli(&["show", "s-none"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let out = cli(&["diff", &snap, "../x"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));

        // Once every sandbox over it is gone, it is deleted.
        tokio().block_on(async {
            let (_, list) = server.json(Method::GET, "/v1/sandboxes", Value::Null).await;
            for sb in list["sandboxes"].as_array().unwrap() {
                if sb["state"] == "running" {
                    let id = sb["id"].as_str().unwrap();
                    server
                        .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), Value::Null)
                        .await;
                }
            }
        });
        let _ = root;
        let out = cli(&["rm", &snap]);
        assert!(out.status.success(), "{}", text(&out));
        let out = cli(&["list"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{}", text(&out));
        // Nothing reached the workdir: every sandbox was aborted.
        assert_eq!(
            std::fs::read_to_string(work.path().join("app.txt")).unwrap(),
            "v1\n"
        );
    }
}

/// Entries of `dir` not starting with `.`, sorted.
fn visible(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_server_killed_during_a_snapshot_or_a_fork_leaves_nothing_half_made() {
    for user in users() {
        let mut landed_inside = false;
        // Kills as soon as the snapshot's staging directory appears (so at least one kill
        // lands inside a snapshot, however fast the machine), then at a quarter, half and
        // three quarters of the time the same snapshot just took (measured in each round:
        // it depends on the machine's load).
        for quarters in [0u32, 1, 2, 3] {
            let state = state_dir(user);
            let work = scratch();
            give(work.path(), user);
            let wd = work.path().to_str().unwrap().to_owned();
            let mut server = Served::start(user, state.path(), &["--pool", "0"]);
            let mut delay_ms = 0;
            let mut took_ms = 0;
            let staging = state.path().join("snapshots").join(".new");
            let calm = tokio().block_on(async {
                let id = server
                    .sandbox(json!({ "workdir": wd, "on_exit": "abort" }))
                    .await;
                let r = server
                    .exec(
                        &id,
                        json!({ "command": "head -c 8192 /dev/urandom > /tmp/b; for d in $(seq 1 10); do mkdir d$d; for f in $(seq 1 100); do cp /tmp/b d$d/f$f; done; done" }),
                    )
                    .await;
                assert_eq!(r["exit_code"], 0, "{r}");
                let took = std::time::Instant::now();
                let (status, calm) = server
                    .json(Method::POST, &format!("/v1/sandboxes/{id}/snapshots"), json!({}))
                    .await;
                assert_eq!(status, StatusCode::CREATED, "{calm}");
                took_ms = u64::try_from(took.elapsed().as_millis()).unwrap();
                delay_ms = took_ms * u64::from(quarters) / 4;
                // Killed while a second snapshot of the same files is taken.
                let path = format!("{}/v1/sandboxes/{id}/snapshots", server.base);
                let request = server
                    .client
                    .post(path)
                    .bearer_auth(&server.token)
                    .json(&json!({ "name": "killed" }))
                    .send();
                let pending = tokio::spawn(request);
                if quarters == 0 {
                    let since = std::time::Instant::now();
                    while visible(&staging).is_empty()
                        && since.elapsed() < std::time::Duration::from_secs(10)
                    {
                        tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                    }
                } else {
                    tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                }
                server.signal("KILL");
                let _ = pending.await;
                calm
            });
            server.wait();
            let snapshots = state.path().join("snapshots");
            let half_made = visible(&snapshots.join(".new"));
            eprintln!("{user:?} {delay_ms}ms: left half-made: {half_made:?}");
            landed_inside |= !half_made.is_empty();

            // Restarted: the killed snapshot is there whole, or not at all.
            let server = Served::start(user, state.path(), &["--pool", "0"]);
            assert!(
                visible(&snapshots.join(".new")).is_empty(),
                "{user:?} {delay_ms}ms"
            );
            let calm_id = calm["id"].as_str().unwrap().to_owned();
            tokio().block_on(async {
                let (_, list) = server.json(Method::GET, "/v1/snapshots", Value::Null).await;
                let listed = list["snapshots"].as_array().unwrap();
                for s in listed {
                    assert_eq!(s["entries"], calm["entries"], "{user:?} {delay_ms}ms: {s}");
                    assert_eq!(s["bytes"], calm["bytes"], "{user:?} {delay_ms}ms: {s}");
                }
                eprintln!(
                    "{user:?} {delay_ms}ms: {} snapshots after the kill",
                    listed.len()
                );
                // Killed while forking: the forks are lost, their branches kept.
                let path = format!("{}/v1/snapshots/{calm_id}/fork", server.base);
                let request = server
                    .client
                    .post(path)
                    .bearer_auth(&server.token)
                    .json(&json!({ "count": 4 }))
                    .send();
                let pending = tokio::spawn(request);
                tokio::time::sleep(std::time::Duration::from_millis(
                    took_ms * u64::from(quarters.max(1)) / 16,
                ))
                .await;
                server.signal("KILL");
                let _ = pending.await;
            });
            let mut server = server;
            server.wait();
            drop(server);
            // Whatever the kill left is reviewable and removable: the lost forks' branches
            // are listed and aborted, then every snapshot is deleted and nothing remains.
            let dir = state.path().to_str().unwrap();
            let out = lockbox(
                user,
                work.path(),
                &["branch", "--state-dir", dir, "list", "--json"],
            );
            assert!(out.status.success(), "{}", text(&out));
            let branches: Value = serde_json::from_slice(&out.stdout).unwrap();
            for b in branches.as_array().unwrap() {
                let id = b["id"].as_str().unwrap();
                let out = lockbox(
                    user,
                    work.path(),
                    &["branch", "--state-dir", dir, "abort", id],
                );
                assert!(out.status.success(), "{}", text(&out));
            }
            for id in visible(&snapshots) {
                let out = lockbox(
                    user,
                    work.path(),
                    &["snapshot", "--state-dir", dir, "rm", &id],
                );
                assert!(out.status.success(), "{user:?} {delay_ms}ms {}", text(&out));
            }
            // A fresh server sweeps what a kill left in the store.
            let server = Served::start(user, state.path(), &["--pool", "0"]);
            drop(server);
            assert!(visible(&snapshots).is_empty(), "{user:?} {delay_ms}ms");
            assert!(visible(&snapshots.join(".new")).is_empty());
            assert!(
                visible(&state.path().join("branches")).is_empty(),
                "{user:?} {delay_ms}ms"
            );
            // The workdir never moved.
            assert!(visible(work.path()).is_empty(), "{user:?} {delay_ms}ms");
        }
        assert!(
            landed_inside,
            "{user:?}: no kill landed inside a snapshot; the test did not test anything"
        );
    }
}
