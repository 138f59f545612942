//! The pool of pre-armed sandboxes: a creation of the default spec takes one, which is as
//! fresh as a started one (nothing of an earlier sandbox, no session listed, its default
//! session working); other specs start as before; the pool refills, and shutdown leaves no
//! process. A test binary of its own: it counts its sandbox agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{Runtime, RuntimeConfig, SandboxSpec};
use std::time::Duration;

/// The tests count this process's sandbox agents, which the other test's (and its re-run
/// as uid 65534's) would change: they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _serial = SERIAL.lock().await;
    also_as_nobody(&lockbox_testkit::test_name!(
        "pooled_sandboxes_are_as_fresh_as_started_ones_and_shutdown_stops_the_pool"
    ));
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

/// Branches of a state directory (not its staging directory).
fn branches(state: &std::path::Path) -> usize {
    std::fs::read_dir(state.join("branches")).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_forks_of_a_snapshot_are_whole_forks_and_never_hold_it_or_outlive_the_runtime() {
    let _serial = SERIAL.lock().await;
    also_as_nobody(&lockbox_testkit::test_name!(
        "spare_forks_of_a_snapshot_are_whole_forks_and_never_hold_it_or_outlive_the_runtime"
    ));
    let before = host_agents();
    let state = scratch();
    let work = scratch();
    let open = || {
        let mut config = RuntimeConfig::new(state.path());
        config.agent_exe = Some(agent_exe().to_owned());
        config.pool_size = 2;
        Runtime::open(config).unwrap()
    };
    let rt = open();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        on_exit: lockbox_runtime::OnExit::Abort,
        ..SandboxSpec::default()
    };
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    let r = run(
        &sb,
        "echo base > f; mkdir d; echo t > /tmp/t; cd d; export V=7",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let snap = sb
        .snapshot_with(lockbox_runtime::SnapshotOptions {
            name: None,
            include_tmp: true,
        })
        .await
        .unwrap();
    // The first fork arms spares of the snapshot: two besides the two default sandboxes.
    let first = rt.fork_snapshot(snap.id.as_str(), 1).await.unwrap();
    until_ready(&rt, 4).await;
    // Taken from the spares, forks are as whole as the first: the snapshot's files, its
    // /tmp, the session's cwd and variables; each its own sandbox, writing its own layer.
    let forks = rt.fork_snapshot(snap.id.as_str(), 3).await.unwrap();
    let mut ids: Vec<&str> = forks.iter().map(|f| f.id.as_str()).collect();
    ids.push(first[0].id.as_str());
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "{ids:?}");
    for (n, f) in forks.iter().enumerate() {
        let fork = rt.sandbox(&f.id).unwrap();
        let seen = run(
            &fork,
            &format!("echo $PWD $V; cat ../f /tmp/t; echo {n} > ../own"),
        )
        .await;
        assert_eq!(
            out(&seen),
            format!("{}/d 7\nbase\nt\n", work.path().display()),
            "fork {n}"
        );
    }
    for f in &forks {
        let fork = rt.sandbox(&f.id).unwrap();
        let changes = fork.changes().await.unwrap();
        let own: Vec<String> = changes
            .iter()
            .map(|c| c.path.display().to_string())
            .filter(|p| p == "own")
            .collect();
        assert_eq!(own.len(), 1, "{changes:?}");
    }
    assert!(std::fs::read_dir(work.path()).unwrap().next().is_none());
    // Spares never keep a snapshot from being deleted once its forks are gone, and go with it.
    until_ready(&rt, 4).await;
    for f in forks.iter().chain(&first) {
        rt.delete_sandbox(&f.id).await.unwrap();
    }
    rt.delete_snapshot(snap.id.as_str()).await.unwrap();
    rt.delete_sandbox(&info.id).await.unwrap();
    assert_eq!(branches(state.path()), 0, "spare forks' branches left");

    // A runtime that dies with spares armed leaves branches its successor sweeps.
    let info = rt
        .create_sandbox(SandboxSpec {
            workdir: Some(work.path().to_owned()),
            on_exit: lockbox_runtime::OnExit::Abort,
            ..SandboxSpec::default()
        })
        .await
        .unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    let snap = sb.snapshot(None).await.unwrap();
    let fork = rt.fork_snapshot(snap.id.as_str(), 1).await.unwrap();
    until_ready(&rt, 4).await;
    // The runtime dies without its shutdown: what a kill leaves (the sandboxes die with
    // their handles; the branches stay).
    drop(sb);
    drop(rt);
    let listed = lockbox_cow::list(state.path()).unwrap();
    assert_eq!(
        listed.len(),
        4,
        "the sandbox's, the fork's and two spares' branches"
    );
    // Each names its sandbox's init (issue 32: an orphan only once that is gone too).
    for b in &listed {
        let meta = b.meta.as_ref().unwrap();
        assert!(meta.sandbox_init.is_some(), "{meta:?}");
    }
    let rt = open();
    let kept: Vec<String> = lockbox_cow::list(state.path())
        .unwrap()
        .iter()
        .map(|b| {
            b.meta.as_ref().unwrap().context["sandbox"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut expected = vec![info.id.to_string(), fork[0].id.to_string()];
    expected.sort();
    let mut kept = kept;
    kept.sort();
    assert_eq!(
        kept, expected,
        "only the spares are swept; sandboxes' branches stay"
    );
    rt.shutdown().await;
    for _ in 0..200 {
        if host_agents() == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host_agents(), before, "sandboxes left running");
}
