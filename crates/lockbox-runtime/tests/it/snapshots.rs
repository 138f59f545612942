//! Snapshots of a running sandbox: consistent while a process writes (one instant of
//! all its files; records whole), the sandbox goes on after each, listed and deleted through the runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{ProcessCommand, ProcessSpec, SandboxSpec};

/// `record NNNNNNNN ` + 44 characters + newline.
const RECORD: usize = 61;

fn writer() -> ProcessSpec {
    ProcessSpec {
        // One write(2) per record: bash's printf builtin writes its whole output at once.
        command: ProcessCommand::Shell {
            // Record i goes to `log`, then to `log2`: at any instant log2 has as many
            // records as log, or one fewer.
            script: "exec 3>> log 4>> log2; i=0; while :; do \
                     printf 'record %08d %s\\n' $i 0123456789012345678901234567890123456789abcd >&3; \
                     printf 'record %08d %s\\n' $i 0123456789012345678901234567890123456789abcd >&4; \
                     i=$((i+1)); done"
                .into(),
            session: None,
        },
        cwd: None,
        env: Default::default(),
        pty: None,
        log_bytes: None,
        stdin: false,
    }
}

/// Every record of `data` is whole and they are numbered 0, 1, 2, ... in order.
fn check_records(data: &[u8]) -> usize {
    assert_eq!(
        data.len() % RECORD,
        0,
        "a torn record: {} bytes",
        data.len()
    );
    for (i, rec) in data.chunks(RECORD).enumerate() {
        let text = std::str::from_utf8(rec).unwrap();
        assert_eq!(
            text,
            format!("record {i:08} 0123456789012345678901234567890123456789abcd\n"),
            "record {i}"
        );
    }
    data.len() / RECORD
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_of_a_sandbox_writing_continuously_hold_whole_records() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "snapshots_of_a_sandbox_writing_continuously_hold_whole_records"
    ));
    let state = scratch();
    let work = scratch();
    std::fs::write(work.path().join("seed"), "seed\n").unwrap();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        ..SandboxSpec::default()
    };
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    sb.start_process(writer()).await.unwrap();
    // Some records first.
    for _ in 0..200 {
        let r = run(&sb, "[ -s log ] && [ $(wc -c < log) -gt 6400 ]").await;
        if r.exit_code == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let mut counts = Vec::new();
    let mut ids = Vec::new();
    for n in 0..5 {
        let snap = sb.snapshot(Some(format!("n{n}"))).await.unwrap();
        assert_eq!(snap.sandbox.as_deref(), Some(sb.id()));
        assert_eq!(snap.name.as_deref(), Some(format!("n{n}").as_str()));
        assert!(snap.bytes > 0 && snap.entries >= 1, "{snap:?}");
        let layer = state
            .path()
            .join("snapshots")
            .join(snap.id.as_str())
            .join("layer");
        let first = check_records(&std::fs::read(layer.join("log")).unwrap());
        let second = check_records(&std::fs::read(layer.join("log2")).unwrap());
        // One instant of the sandbox: never a record in log2 that log lacks (copied
        // after log, a running writer would have added to it).
        assert!(
            second == first || second + 1 == first,
            "snapshot {n}: log has {first} records, log2 {second}"
        );
        counts.push(first);
        // The workdir's own files are not copied: the snapshot is the branch's changes.
        assert!(!layer.join("seed").exists());
        ids.push(snap.id);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The writer went on between and after the snapshots.
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
    let r = run(&sb, "wc -c < log").await;
    let now: usize = out(&r).trim().parse().unwrap();
    assert!(
        now / RECORD > counts[4],
        "{now} bytes, last snapshot {counts:?}"
    );

    let listed: Vec<lockbox_runtime::SnapshotId> = rt
        .list_snapshots()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, ids);
    assert_eq!(
        rt.snapshot_info(&ids[0]).unwrap().name.as_deref(),
        Some("n0")
    );
    for id in &ids {
        rt.delete_snapshot(id).await.unwrap();
    }
    assert!(rt.list_snapshots().unwrap().is_empty());
    let e = rt.snapshot_info(&ids[0]).unwrap_err();
    assert_eq!(e.code().as_str(), "SNAPSHOT_NOT_FOUND");
    let e = rt.delete_snapshot("../x").await.unwrap_err();
    assert_eq!(e.code().as_str(), "INVALID_SNAPSHOT_ID");
    rt.delete_sandbox(sb.id()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_needs_a_workdir_and_a_name_without_control_characters() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let e = sb.snapshot(None).await.unwrap_err();
    assert_eq!(e.code().as_str(), "NO_WORKDIR");
    rt.delete_sandbox(sb.id()).await.unwrap();
    drop(rt);

    let work = scratch();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        ..SandboxSpec::default()
    };
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    let e = sb.snapshot(Some("bad\nname".into())).await.unwrap_err();
    assert_eq!(e.code().as_str(), "INVALID_REQUEST");
    assert!(rt.list_snapshots().unwrap().is_empty());
    rt.delete_sandbox(sb.id()).await.unwrap();
}
