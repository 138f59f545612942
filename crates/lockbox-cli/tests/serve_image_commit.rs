//! `lockbox image commit` (issue 29): what a served image sandbox wrote to its root becomes
//! a new layer (deletions as whiteouts) on its image, through `POST
//! /v1/sandboxes/{id}/commit-image`; `lockbox run --image` of the new name sees the writes.
//! As the current user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod serve_support;

use common::{command_as, give, scratch, text, users};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{state_dir, tokio, Served};
use sha2::Digest as _;
use std::path::Path;
use std::process::Command;

fn sha(data: &[u8]) -> String {
    let hex: String = sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

fn blob(dir: &Path, data: &[u8]) -> String {
    let d = sha(data);
    std::fs::write(dir.join("blobs/sha256").join(&d[7..]), data).unwrap();
    d
}

/// An OCI layout at `dir`, tag `v1`: busybox, a static bash, `/work`; Env
/// `GREETING=from-image`, WorkingDir `/work`.
fn layout(dir: &Path) {
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("work")).unwrap();
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::fs::copy("/bin/bash-static", root.join("bin/bash")).unwrap();
    for applet in ["sh", "cat", "ls", "mktemp", "head", "rm", "env", "test"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let tar = dir.join("layer.tar");
    let st = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
        ])
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let layer = std::fs::read(&tar).unwrap();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin", "GREETING=from-image"], "Cmd": ["sh"], "WorkingDir": "/work"},
        "rootfs": {"type": "layers", "diff_ids": [sha(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(dir, &config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": blob(dir, &layer), "size": layer.len()}],
    }))
    .unwrap();
    let m = blob(dir, &manifest);
    let index = json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": m, "size": manifest.len(), "annotations": {"org.opencontainers.image.ref.name": "v1"}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

fn lockbox_in(user: common::User, dir: &Path, args: &[&str]) -> std::process::Output {
    command_as(user)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
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
        let roots = state.path().join("image-roots");
        let left: Vec<_> = std::fs::read_dir(&roots)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
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
