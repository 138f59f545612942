//! Snapshot, fork and delete, a hundred times over: nothing is left behind (processes,
//! branches, snapshot directories). It runs in a process of its own: it counts the process's
//! sandbox agents, which the crate's other tests, running beside it, would change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{OnExit, SandboxSpec};
use std::path::Path;

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_snapshot_fork_delete_cycles_leave_nothing_behind() {
    let name =
        lockbox_testkit::test_name!("a_hundred_snapshot_fork_delete_cycles_leave_nothing_behind");
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let state = scratch();
    let work = scratch();
    std::fs::write(work.path().join("base"), "b").unwrap();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        on_exit: OnExit::Abort,
        ..SandboxSpec::default()
    };
    let (rt, root) = sandbox_with(state.path(), spec).await;
    run(&root, "echo 0 > counter").await;
    let agents_before = host_agents();
    assert!(agents_before >= 1, "the root sandbox's agent is counted");
    let branches_before = entries(&state.path().join("branches"));
    for i in 0..100 {
        let snap = root.snapshot(Some(format!("c{i}"))).await.unwrap();
        let forks = rt.fork_snapshot(&snap.id, 1).await.unwrap();
        let fork = rt.sandbox(&forks[0].id).unwrap();
        assert_eq!(out(&run(&fork, "cat counter").await), format!("{i}\n"));
        run(&fork, &format!("echo {i} > fork-only")).await;
        rt.delete_sandbox(fork.id()).await.unwrap();
        rt.delete_snapshot(&snap.id).await.unwrap();
        run(&root, &format!("echo {} > counter", i + 1)).await;
    }
    assert_eq!(host_agents(), agents_before);
    assert_eq!(entries(&state.path().join("branches")), branches_before);
    let snapshots: Vec<String> = entries(&state.path().join("snapshots"))
        .into_iter()
        .filter(|e| !e.starts_with('.'))
        .collect();
    assert!(snapshots.is_empty(), "{snapshots:?}");
    assert!(entries(&state.path().join("snapshots/.new")).is_empty());
    rt.delete_sandbox(root.id()).await.unwrap();
}
