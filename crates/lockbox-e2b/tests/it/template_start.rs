//! A template's start and ready commands (`startCmd`, `readyCmd` of its build): every
//! sandbox created from it has the start command running and the ready command passed
//! when the create answers; a ready command that never passes fails the create within
//! its bound and leaves no sandbox.

use crate::common::{also_as_nobody, scratch};
use crate::control::Plane;
use lockbox_runtime::{ProcessState, SandboxState};
use lockbox_testkit::oci;
use reqwest::Method;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// An OCI layout at `dir` (`oci:DIR:v1`): busybox's sh, sleep, test and cat.
fn layout(dir: &Path) -> String {
    let root = dir.join("rootfs");
    oci::busybox_root(&root, &["sh", "sleep", "test", "cat"]);
    for sub in ["work", "tmp"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    let oci_dir = dir.join("oci");
    oci::layout(
        &oci_dir,
        &root,
        json!({"Env": ["PATH=/bin"], "WorkingDir": "/work"}),
        "v1",
    );
    format!("oci:{}:v1", oci_dir.display())
}

/// Builds template `name` from `image` with `start` (the SDK's three calls), until ready.
async fn build(e2b: &Plane, name: &str, image: &str, start: Value) -> Value {
    let (status, made) = e2b.post("/v3/templates", json!({"name": name})).await;
    assert_eq!(status, 202, "{made}");
    let (id, build) = (
        made["templateID"].as_str().unwrap(),
        made["buildID"].as_str().unwrap(),
    );
    let mut body = json!({"fromImage": image, "steps": []});
    body.as_object_mut()
        .unwrap()
        .extend(start.as_object().unwrap().clone());
    let (status, started) = e2b
        .post(&format!("/v2/templates/{id}/builds/{build}"), body)
        .await;
    assert_eq!(status, 202, "{started}");
    for _ in 0..600 {
        let (_, st) = e2b
            .call(
                Method::GET,
                &format!("/templates/{id}/builds/{build}/status"),
                json!({}),
            )
            .await;
        match st["status"].as_str() {
            Some("ready") => return st,
            Some("error") => panic!("the build failed: {st}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("the build of {name} did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_of_a_template_with_a_start_command_has_it_running_once_ready() {
    also_as_nobody(
        "template_start::a_sandbox_of_a_template_with_a_start_command_has_it_running_once_ready",
    );
    let (state, files) = (scratch(), scratch());
    let e2b = Plane::start(state.path()).await;
    let image = layout(files.path());
    let start = "sh -c 'sleep 1; pwd > /tmp/started; exec sleep 600'";
    build(
        &e2b,
        "started",
        &image,
        json!({"startCmd": start, "readyCmd": "test -f /tmp/started"}),
    )
    .await;

    let (sb, id) = e2b
        .create(json!({"templateID": "started", "timeout": 60}))
        .await;
    // Ready when the create answers: the file is there, written in the image's workdir.
    assert_eq!(e2b.read(&sb, "/tmp/started").await, (200, "/work\n".into()));
    let running = e2b.rt.sandbox(&id).unwrap().list_processes();
    assert!(
        running
            .iter()
            .any(|p| p.state == ProcessState::Running && p.command.join(" ").contains(start)),
        "{running:?}"
    );
    assert_eq!(e2b.kill(&id).await, 204);
    e2b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_command_that_never_passes_fails_the_create_and_leaves_no_sandbox() {
    also_as_nobody(
        "template_start::a_ready_command_that_never_passes_fails_the_create_and_leaves_no_sandbox",
    );
    let (state, files) = (scratch(), scratch());
    let e2b = Plane::start(state.path()).await;
    let image = layout(files.path());
    build(
        &e2b,
        "never-ready",
        &image,
        json!({"startCmd": "sleep 600", "readyCmd": "test -f /tmp/never"}),
    )
    .await;

    // The bound is the sandbox's timeout when it is shorter than 50 s.
    let began = Instant::now();
    let (status, err) = e2b
        .post(
            "/sandboxes",
            json!({"templateID": "never-ready", "timeout": 3}),
        )
        .await;
    assert_eq!(status, 500, "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("ready command \"test -f /tmp/never\" did not exit 0 within 3 s")
            && message.contains("exited with 1")
            && message.contains("the sandbox was deleted"),
        "{err}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
    // Deleted (stopped, its processes ended) as a kill deletes one.
    let after = e2b.rt.list_sandboxes().unwrap();
    assert!(
        after.iter().all(|s| s.state == SandboxState::Stopped),
        "{after:?}"
    );
    let (_, listed) = e2b.call(Method::GET, "/v2/sandboxes", json!({})).await;
    assert_eq!(listed, json!([]));
    e2b.stop().await;
}
