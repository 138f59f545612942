//! Paused E2B sandboxes survive a restart of the server: a new E2B layer on the same
//! state directory lists them as paused, with their metadata, and resumes them under
//! their ids with their files and environment; a kill forgets them for good, and an
//! unreadable file is skipped without stopping the server.

use crate::common::{agent_exe, also_as_nobody, run, runtime, scratch};
use crate::control::Plane;
use lockbox_runtime::{Runtime, RuntimeConfig, SandboxState};
use reqwest::Method;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A new runtime and E2B layer on `state`, once the stopped one has let go of it (its
/// connections' tasks end shortly after it stops).
async fn restart(old: Plane, state: &Path) -> Plane {
    old.stop().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut config = RuntimeConfig::new(state);
        config.agent_exe = Some(agent_exe().to_owned());
        match Runtime::open(config) {
            Ok(rt) => return Plane::start_own(rt),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("reopening the state directory: {e}"),
        }
    }
}

/// The paused sandboxes `GET /v2/sandboxes?state=paused` lists.
async fn paused(e2b: &Plane) -> Vec<Value> {
    let (status, list) = e2b
        .call(Method::GET, "/v2/sandboxes?state=paused", json!({}))
        .await;
    assert_eq!(status, 200, "{list}");
    list.as_array().unwrap().clone()
}

fn kept_file(state: &Path, id: &str) -> std::path::PathBuf {
    state.join("e2b/paused").join(format!("{id}.json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_survives_a_server_restart_until_it_is_killed() {
    also_as_nobody("restart::a_paused_sandbox_survives_a_server_restart_until_it_is_killed");
    let state = scratch();
    let e2b = Plane::start_own(runtime(state.path()).await);
    let (sb, id) = e2b
        .create(json!({
            "metadata": {"owner": "me"},
            "envVars": {"GREETING": "hello"},
        }))
        .await;
    run(
        &e2b.rt.sandbox(&id).unwrap(),
        "printf kept > /home/user/kept.txt; printf kept > /tmp/kept.txt",
    )
    .await;
    // A running sandbox is not kept: it dies with the server.
    let (_, running) = e2b.create(json!({})).await;
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    let file = kept_file(state.path(), &id);
    // It holds the access token: the server's user alone reads it.
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!kept_file(state.path(), &running).exists());
    // One unreadable file among the kept ones.
    std::fs::write(kept_file(state.path(), "garbled"), b"{not json").unwrap();

    let e2b = restart(e2b, state.path()).await;
    let listed = paused(&e2b).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["sandboxID"], id.as_str());
    assert_eq!(listed[0]["metadata"], json!({"owner": "me"}));
    let (status, _) = e2b
        .call(Method::GET, &format!("/sandboxes/{running}"), json!({}))
        .await;
    assert_eq!(status, 404);
    // The bad file is left for the user to look at.
    assert!(kept_file(state.path(), "garbled").exists());

    let (status, resumed) = e2b
        .post(
            &format!("/v2/sandboxes/{id}/connect"),
            json!({"timeout": 60}),
        )
        .await;
    assert_eq!(status, 201, "{resumed}");
    assert_eq!(resumed["sandboxID"], id.as_str());
    // The token the SDK object had before the restart still opens it.
    assert_eq!(resumed["envdAccessToken"], sb["envdAccessToken"]);
    assert_eq!(e2b.read(&sb, "kept.txt").await, (200, "kept".to_owned()));
    // Running again, it is no longer kept.
    assert!(!file.exists());
    let instance = e2b
        .rt
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .find(|i| i.state == SandboxState::Running)
        .unwrap();
    let env = run(
        &e2b.rt.sandbox(instance.id.as_str()).unwrap(),
        "printf %s \"$GREETING\"",
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&env.stdout), "hello");

    // Paused again and killed: the file and the snapshots go, and a restart finds nothing.
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    assert!(file.exists());
    assert_eq!(e2b.kill(&id).await, 204);
    assert!(!file.exists());
    assert!(e2b.rt.list_snapshots().unwrap().is_empty());
    let e2b = restart(e2b, state.path()).await;
    assert!(paused(&e2b).await.is_empty());
    e2b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_whose_snapshot_was_deleted_is_forgotten_at_start() {
    also_as_nobody("restart::a_paused_sandbox_whose_snapshot_was_deleted_is_forgotten_at_start");
    let state = scratch();
    let e2b = Plane::start_own(runtime(state.path()).await);
    let (_, id) = e2b.create(json!({})).await;
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    // Deleted behind E2B's back (lockbox's own API: `lockbox snapshot rm`).
    for s in e2b.rt.list_snapshots().unwrap() {
        e2b.rt.delete_snapshot(s.id.as_str()).await.unwrap();
    }
    let e2b = restart(e2b, state.path()).await;
    assert!(paused(&e2b).await.is_empty());
    assert!(!kept_file(state.path(), &id).exists());
    e2b.stop().await;
}
