//! Long-lived sandboxes copy their root from a template (lockbox-confine's `template`):
//! sandboxes of one policy share only the read-only root, each has its own scratch and
//! `/proc`; one with a workdir builds its own root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::*;
use lockbox_runtime::SandboxSpec;

/// How many mounts lie at `/proc`: 2 in a copy of a template (its bare `/proc` under the
/// sandbox's own), 1 in a root built for the sandbox.
const PROC_MOUNTS: &str = "awk '$5 == \"/proc\"' /proc/self/mountinfo | wc -l";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_of_one_policy_share_the_read_only_root_and_no_scratch() {
    let name = lockbox_testkit::test_name!(
        "sandboxes_of_one_policy_share_the_read_only_root_and_no_scratch"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let state = scratch();
    let rt = runtime(state.path()).await;
    let first = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
    let second = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
    let (a, b) = (
        rt.sandbox(&first.id).unwrap(),
        rt.sandbox(&second.id).unwrap(),
    );
    for sb in [&a, &b] {
        assert_eq!(out(&run(sb, PROC_MOUNTS).await).trim(), "2");
    }
    let wrote = run(
        &a,
        "echo a > /tmp/a && echo a > /dev/shm/a && cat /tmp/a /dev/shm/a",
    )
    .await;
    assert_eq!(out(&wrote), "a\na\n");
    let seen = out(&run(&b, "ls -a /tmp /dev/shm; touch /x || echo read-only").await);
    assert!(!seen.contains("\na\n"), "{seen}");
    assert!(seen.ends_with("read-only\n"), "{seen}");
    // Each sees its own processes only: its init, agent, shell and what runs.
    let pids = out(&run(&b, "ls /proc | grep -c '^[0-9]'").await);
    assert!(pids.trim().parse::<u32>().unwrap() < 10, "{pids}");

    // A workdir's copy-on-write view is the sandbox's own: that root is built.
    let work = tempfile::tempdir().unwrap();
    let with_workdir = rt
        .create_sandbox(SandboxSpec {
            workdir: Some(work.path().to_owned()),
            ..SandboxSpec::default()
        })
        .await
        .unwrap();
    let c = rt.sandbox(&with_workdir.id).unwrap();
    assert_eq!(out(&run(&c, PROC_MOUNTS).await).trim(), "1");
    rt.shutdown().await;
}
