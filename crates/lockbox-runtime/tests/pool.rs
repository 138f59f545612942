//! The pool of pre-armed sandboxes: a creation of the default spec takes one, which is as
//! fresh as a started one (nothing of an earlier sandbox, no session listed, its default
//! session working); other specs start as before; the pool refills, and shutdown leaves no
//! process. A test binary of its own: it counts the host's sandbox agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use lockbox_runtime::{Runtime, RuntimeConfig, SandboxSpec};
use std::time::Duration;

async fn until_ready(rt: &Runtime, n: usize) {
    for _ in 0..500 {
        if rt.pool_ready() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the pool did not refill to {n}: {}", rt.pool_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sandboxes_are_as_fresh_as_started_ones_and_shutdown_stops_the_pool() {
    also_as_nobody("pooled_sandboxes_are_as_fresh_as_started_ones_and_shutdown_stops_the_pool");
    let before = host_agents();
    let state = scratch();
    let mut config = RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    config.pool_size = 2;
    let rt = Runtime::open(config).unwrap();
    until_ready(&rt, 2).await;
    // The pooled sandboxes run (each is its agent, and a shim over its spare shell).
    assert!(host_agents() >= before + 2, "{} agents", host_agents());

    let mut pids = Vec::new();
    for round in 0..4 {
        until_ready(&rt, 2).await;
        let info = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
        assert_eq!(info.sessions, 0, "a pooled sandbox lists no session yet");
        let sb = rt.sandbox(&info.id).unwrap();
        // Nothing of the sandbox before it: its own /tmp, no leftover file.
        let r = run(
            &sb,
            "ls /tmp; echo $$; touch /tmp/mark-$RANDOM; cd /tmp; export R=1",
        )
        .await;
        let text = out(&r);
        let mut lines: Vec<&str> = text.lines().collect();
        let pid = lines.pop().unwrap().to_owned();
        assert!(lines.is_empty(), "round {round}: /tmp holds {lines:?}");
        pids.push(pid);
        // The default session keeps its state as a started one does.
        assert_eq!(out(&run(&sb, "echo $PWD $R").await), "/tmp 1\n");
        assert_eq!(rt.sandbox_info(&info.id).unwrap().sessions, 1);
        rt.delete_sandbox(&info.id).await.unwrap();
    }
    // A spec the pool does not serve starts as before.
    let work = scratch();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        ..SandboxSpec::default()
    };
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    assert_eq!(out(&run(&sb, "echo ok").await), "ok\n");
    rt.delete_sandbox(&info.id).await.unwrap();

    until_ready(&rt, 2).await;
    rt.shutdown().await;
    assert_eq!(rt.pool_ready(), 0);
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        host_agents(),
        before,
        "pooled sandboxes left running after shutdown"
    );
}
