//! E2B's `Sandbox.create()` takes a sandbox from the runtime's warm pool (issue 30's
//! create → first command target): its spec (the template's policy, E2B's network, `HOME`
//! as cwd) is a key the pool arms after the first creation, and the sandbox taken runs as
//! the started one did.

use crate::common;
use lockbox_runtime::{Runtime, RuntimeConfig};
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_e2b_create_takes_a_warm_sandbox_after_the_first() {
    let name = lockbox_testkit::test_name!("an_e2b_create_takes_a_warm_sandbox_after_the_first");
    common::also_as_nobody(&name);
    if !common::in_own_process(&name) {
        return;
    }
    let before = common::host_agents();
    let state = common::scratch();
    let mut config = RuntimeConfig::new(state.path());
    config.agent_exe = Some(common::agent_exe().to_owned());
    config.pool_size = 1;
    let rt = Runtime::open(config).unwrap();
    let e2b = lockbox_e2b::E2b::new(rt.clone(), "test-key");
    let app = lockbox_e2b::wrap(e2b, axum::Router::new(), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let create = || async {
        let r = client
            .post(format!("{base}/sandboxes"))
            .header("X-API-Key", "test-key")
            .json(&json!({"templateID": "base", "timeout": 60}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let body: Value = r.json().await.unwrap();
        body["sandboxID"].as_str().unwrap().to_owned()
    };
    let seen = |id: String| {
        let rt = rt.clone();
        async move {
            let sb = rt.sandbox(&id).unwrap();
            common::out(&common::run(&sb, "pwd; echo $HOME; id -u").await)
        }
    };
    let e2b_key = |rt: &Runtime| rt.pool_stats().into_iter().find(|k| !k.default);

    let first = create().await;
    let started = seen(first.clone()).await;
    let mut armed = None;
    for _ in 0..1000 {
        armed = e2b_key(&rt).filter(|k| k.ready >= 1);
        if armed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let armed = armed.unwrap_or_else(|| panic!("not armed: {:?}", rt.pool_stats()));
    assert_eq!((armed.hits, armed.misses), (0, 1), "{armed:?}");
    let second = create().await;
    let key = e2b_key(&rt).unwrap();
    assert_eq!((key.hits, key.misses), (1, 1), "{key:?}");
    assert_eq!(seen(second.clone()).await, started);

    for id in [first, second] {
        let r = client
            .delete(format!("{base}/sandboxes/{id}"))
            .header("X-API-Key", "test-key")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    rt.shutdown().await;
    assert_eq!(rt.pool_ready(), 0);
    // Every E2B sandbox, a ready one too, has a branch of the E2B workdir: none is left.
    let branches = std::fs::read_dir(state.path().join("branches")).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count()
    });
    assert_eq!(branches, 0, "branches left");
    for _ in 0..200 {
        if common::host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(common::host_agents(), before, "sandboxes left running");
}
