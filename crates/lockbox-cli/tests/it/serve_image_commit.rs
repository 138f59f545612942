//! `lockbox image commit` (issue 29): what a served image sandbox wrote to its root becomes
//! a new layer (deletions as whiteouts) on its image, through `POST
//! /v1/sandboxes/{id}/commit-image`; `lockbox run --image` of the new name sees the writes.
//! As the current user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::{command_as, give, scratch, text, users};
use crate::serve_support::{state_dir, tokio, Served};
use lockbox_testkit::oci;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::Path;

fn lockbox_in(user: common::User, dir: &Path, args: &[&str]) -> std::process::Output {
    command_as(user)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// An OCI layout at `dir`, tag `v1`: busybox-static with a few applets and bash-static.
fn layout(dir: &Path) {
    let root = dir.join("rootfs");
    oci::busybox_root(
        &root,
        &["sh", "cat", "ls", "mktemp", "head", "rm", "env", "test"],
    );
    std::fs::create_dir_all(root.join("work")).unwrap();
    std::fs::copy("/bin/bash-static", root.join("bin/bash")).unwrap();
    oci::layout(
        dir,
        &root,
        serde_json::json!({"Env": ["PATH=/bin", "GREETING=from-image"], "Cmd": ["sh"], "WorkingDir": "/work"}),
        "v1",
    );
}

#[test]
fn a_served_image_sandboxs_root_writes_commit_to_an_image_that_runs() {
    for user in users() {
        let tmp = scratch();
        layout(&tmp.path().join("lay"));
        give(tmp.path(), user);
        let w = tmp.path();
        let state = state_dir(user);
        let st = state.path().to_str().unwrap();
        let server = Served::start(user, state.path(), &[]);
        let image = format!("oci:{}:v1", w.join("lay").display());
        let (id, plain) = tokio().block_on(async {
            let id = server.sandbox(json!({ "image": image })).await;
            let result = server
                .exec(
                    &id,
                    json!({ "command": "echo committed > /work/new.txt && rm /bin/head && busybox mkdir -p /opt/app && echo y > /opt/app/f && echo ok" }),
                )
                .await;
            assert_eq!(result["stdout"], "ok\n", "{user:?} {result}");
            let plain = server.sandbox(json!({})).await;
            (id, plain)
        });

        let out = lockbox_in(
            user,
            w,
            &[
                "image",
                "commit",
                &id,
                "-t",
                "app:2",
                "--server",
                server.addr(),
                "--state-dir",
                st,
                "--json",
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        let made: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(made["references"][0], "docker.io/library/app:2", "{made}");
        assert!(made["layer"].is_string(), "{made}");
        assert_eq!(made["layers"], 2, "{made}");

        // The new image runs with the file, without the deleted one, and without lockbox's
        // own mount points in its layer.
        let out = lockbox_in(
            user,
            w,
            &[
                "run",
                "--image",
                "app:2",
                "--pull",
                "never",
                "--state-dir",
                st,
                "--",
                "sh",
                "-c",
                "cat /work/new.txt /opt/app/f; test -e /bin/head || echo head-gone",
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "committed\ny\nhead-gone\n"
        );
        let inspect = lockbox_in(
            user,
            w,
            &["image", "inspect", "app:2", "--json", "--state-dir", st],
        );
        assert!(inspect.status.success(), "{}", text(&inspect));
        let info: Value = serde_json::from_slice(&inspect.stdout).unwrap();
        let top = Path::new(info["layers"][0].as_str().unwrap());
        for own in ["dev", "proc", "etc/hosts", "etc/resolv.conf"] {
            assert!(
                !top.join(own).exists(),
                "{own} is lockbox's, not the layer's"
            );
        }

        // A sandbox on the host's userland has no image root: a usage error naming it.
        let out = lockbox_in(
            user,
            w,
            &[
                "image",
                "commit",
                &plain,
                "-t",
                "x",
                "--server",
                server.addr(),
                "--state-dir",
                st,
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("not an image"), "{}", text(&out));
        tokio().block_on(async {
            let (status, error) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{plain}/commit-image"),
                    json!({ "tags": ["x"] }),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            assert_eq!(error["details"]["field"], "sandbox", "{error}");
            let (status, error) = server
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/commit-image"),
                    json!({ "tags": [] }),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            // Deleted, the sandbox's root writes go with it.
            let (status, _) = server
                .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), json!(null))
                .await;
            assert_eq!(status, StatusCode::OK);
        });
        // (The pool's ready sandboxes of that image keep their own.)
        let roots = state.path().join("image-roots");
        let left: Vec<_> = std::fs::read_dir(&roots)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("{id}-")))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[test]
fn image_pull_on_create_says_when_the_server_pulls() {
    for user in users() {
        let tmp = scratch();
        layout(&tmp.path().join("lay"));
        give(tmp.path(), user);
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        let image = format!("oci:{}:v1", tmp.path().join("lay").display());
        tokio().block_on(async {
            // never: not in the store yet, so not found (and nothing pulled).
            let (status, error) = server
                .json(
                    Method::POST,
                    "/v1/sandboxes",
                    json!({ "image": image, "image_pull": "never" }),
                )
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{user:?} {error}");
            assert_eq!(error["code"], "IMAGE_NOT_FOUND", "{error}");
            // always: pulled (again), then never finds it.
            let id = server
                .sandbox(json!({ "image": image, "image_pull": "always" }))
                .await;
            let again = server
                .sandbox(json!({ "image": image, "image_pull": "never" }))
                .await;
            for sb in [&id, &again] {
                let (status, _) = server
                    .json(Method::DELETE, &format!("/v1/sandboxes/{sb}"), json!(null))
                    .await;
                assert_eq!(status, StatusCode::OK);
            }
            // Without an image, or an unknown value: the field is named.
            let (status, error) = server
                .json(
                    Method::POST,
                    "/v1/sandboxes",
                    json!({ "image_pull": "never" }),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            assert_eq!(error["details"]["field"], "image_pull", "{error}");
            let (status, error) = server
                .json(
                    Method::POST,
                    "/v1/sandboxes",
                    json!({ "image": image, "image_pull": "sometimes" }),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
            assert!(error.to_string().contains("image_pull"), "{error}");
        });
    }
}

/// `GET` and `PUT /v1/images/archive` (what a fleet's router copies images with): an image
/// committed on one server goes to another by its archive, checked against its digest, keeps
/// its id there and runs under the name it was given; a tampered body and a missing digest
/// are refused and leave nothing. As the current user and (as root) as uid 65534.
#[test]
fn a_committed_image_moves_to_another_server_by_its_archive_and_runs_there() {
    for user in users() {
        let tmp = scratch();
        layout(&tmp.path().join("lay"));
        give(tmp.path(), user);
        let (sa, sb) = (state_dir(user), state_dir(user));
        let a = Served::start(user, sa.path(), &[]);
        let b = Served::start(user, sb.path(), &[]);
        let image = format!("oci:{}:v1", tmp.path().join("lay").display());
        tokio().block_on(async {
            let id = a.sandbox(json!({ "image": image })).await;
            let ran = a
                .exec(&id, json!({ "command": "echo moved > /work/m.txt" }))
                .await;
            assert_eq!(ran["exit_code"], 0, "{user:?} {ran}");
            let (status, made) = a
                .json(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/commit-image"),
                    json!({ "tags": ["app:3"] }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{made}");

            let sent = a
                .request(Method::GET, "/v1/images/archive?reference=app:3")
                .send()
                .await
                .unwrap();
            assert_eq!(sent.status(), StatusCode::OK);
            let digest = sent.headers()["docker-content-digest"]
                .to_str()
                .unwrap()
                .to_owned();
            let archive = sent.bytes().await.unwrap().to_vec();
            let put = |reference: &str, digest: Option<&str>, body: Vec<u8>| {
                let query = match digest {
                    Some(d) => format!("reference={reference}&digest={d}"),
                    None => format!("reference={reference}"),
                };
                b.request(Method::PUT, &format!("/v1/images/archive?{query}"))
                    .body(body)
                    .send()
            };

            let mut tampered = archive.clone();
            let last = tampered.len() - 1;
            tampered[last] ^= 1;
            let refused = put("bad:1", Some(&digest), tampered).await.unwrap();
            assert_eq!(refused.status(), StatusCode::BAD_GATEWAY);
            let error: Value = refused.json().await.unwrap();
            assert_eq!(error["code"], "DIGEST_MISMATCH", "{error}");
            let refused = put("bad:1", None, b"x".to_vec()).await.unwrap();
            assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
            let kept = b
                .request(Method::GET, "/v1/images/archive?reference=bad:1")
                .send()
                .await
                .unwrap();
            assert_eq!(
                kept.status(),
                StatusCode::NOT_FOUND,
                "nothing of them is kept"
            );

            let stored = put("moved:1", Some(&digest), archive).await.unwrap();
            assert_eq!(stored.status(), StatusCode::CREATED);
            let stored: Value = stored.json().await.unwrap();
            assert_eq!(stored["id"], made["id"], "{stored} {made}");
            let there = b.sandbox(json!({ "image": "moved:1" })).await;
            let ran = b
                .exec(&there, json!({ "command": "cat /work/m.txt" }))
                .await;
            assert_eq!(ran["stdout"], "moved\n", "{user:?} {ran}");
        });
    }
}
