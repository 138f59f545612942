//! Sandboxes on an OCI image through the long-lived front ends (issue 29): `POST
//! /v1/sandboxes` with `image` on `lockbox serve`, and `create_sandbox` of `lockbox mcp`,
//! where an agent gets an image only if the operator's ceiling allows it
//! (`--allow-image`). The image has no glibc (busybox and a static bash). As the current
//! user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::serve_support;

use common::{command_as, give, scratch, users};
use lockbox_testkit::oci;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use serve_support::{state_dir, tokio, Served};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;

/// An OCI layout at `dir`, tag `v1`: busybox, a static bash, `/work`; Env
/// `GREETING=from-image`, WorkingDir `/work`.
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
        json!({"Env": ["PATH=/bin", "GREETING=from-image"], "Cmd": ["sh"], "WorkingDir": "/work"}),
        "v1",
    );
}

#[test]
fn serve_creates_a_sandbox_on_an_image_and_refuses_a_tag_the_source_lacks_naming_image() {
    for user in users() {
        let tmp = scratch();
        layout(&tmp.path().join("lay"));
        give(tmp.path(), user);
        let state = state_dir(user);
        let server = Served::start(user, state.path(), &[]);
        let image = format!("oci:{}:v1", tmp.path().join("lay").display());
        tokio().block_on(async {
            let id = server.sandbox(json!({ "image": image })).await;
            let (_, info) = server
                .json(Method::GET, &format!("/v1/sandboxes/{id}"), json!(null))
                .await;
            assert_eq!(info["policy"]["image"], image.as_str(), "{info}");
            let result = server
                .exec(
                    &id,
                    json!({ "command": "echo \"$GREETING $PWD\"; test -e /lib/x86_64-linux-gnu/libc.so.6 || echo no-glibc" }),
                )
                .await;
            assert_eq!(result["stdout"], "from-image /work\nno-glibc\n", "{user:?} {result}");
            let (status, _) = server
                .json(Method::DELETE, &format!("/v1/sandboxes/{id}"), json!(null))
                .await;
            assert_eq!(status, StatusCode::OK);

            let missing = format!("oci:{}:no-such-tag", tmp.path().join("lay").display());
            let (status, error) = server
                .json(Method::POST, "/v1/sandboxes", json!({ "image": missing }))
                .await;
            // The layout has no such tag: the reference is wrong (lockbox-image's code).
            assert_eq!(status, StatusCode::BAD_REQUEST, "{user:?} {error}");
            assert_eq!(error["code"], "BAD_REFERENCE", "{error}");
            assert_eq!(error["details"]["field"], "image", "{error}");
            let (status, error) = server
                .json(Method::POST, "/v1/sandboxes", json!({ "image": "" }))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        });
    }
}

struct Mcp {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn spawn(user: common::User, state: &Path, extra: &[&str]) -> Mcp {
        let mut child = command_as(user)
            .arg("mcp")
            .arg("--state-dir")
            .arg(state)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Mcp {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            next: 0,
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.next += 1;
        let msg = json!({ "jsonrpc": "2.0", "id": self.next, "method": "tools/call",
                          "params": { "name": tool, "arguments": arguments } });
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let reply: Value = serde_json::from_str(&line).unwrap();
        reply["result"].clone()
    }

    fn close(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

#[test]
fn an_mcp_agent_gets_an_image_only_where_the_operator_allows_it() {
    for user in users() {
        let tmp = scratch();
        let images = tmp.path().join("images");
        layout(&images.join("lay"));
        layout(&tmp.path().join("elsewhere"));
        give(tmp.path(), user);
        let state = tmp.path().join("state");
        let image = format!("oci:{}:v1", images.join("lay").display());

        // By default, no image.
        let mut mcp = Mcp::spawn(user, &state, &[]);
        let refused = mcp.call("create_sandbox", json!({ "image": image }));
        assert_eq!(refused["isError"], true, "{refused}");
        let error = &refused["structuredContent"];
        assert_eq!(error["code"], "BEYOND_CEILING", "{refused}");
        assert_eq!(error["details"]["field"], "image", "{refused}");
        mcp.close();

        // Allowed below a directory: an image there runs; one elsewhere, or reached by a
        // `..` out of the directory, does not.
        let allowed = format!("oci:{}/*", images.display());
        let mut mcp = Mcp::spawn(user, &state, &["--allow-image", &allowed]);
        let created = mcp.call("create_sandbox", json!({ "image": image }));
        assert_eq!(created["isError"], false, "{user:?}: {created}");
        let id = created["structuredContent"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ran = mcp.call(
            "exec",
            json!({ "sandbox_id": id, "command": "echo \"$GREETING\"" }),
        );
        assert_eq!(ran["structuredContent"]["stdout"], "from-image\n", "{ran}");
        for outside in [
            format!("oci:{}:v1", tmp.path().join("elsewhere").display()),
            format!("oci:{}/../elsewhere:v1", images.display()),
        ] {
            let refused = mcp.call("create_sandbox", json!({ "image": outside }));
            assert_eq!(
                refused["structuredContent"]["code"], "BEYOND_CEILING",
                "{outside}: {refused}"
            );
            assert_eq!(refused["structuredContent"]["details"]["field"], "image");
        }
        mcp.close();
    }
}
