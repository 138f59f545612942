//! File watching through the agent: every created file reported, moves with both paths,
//! deleted directories, new subdirectories watched, overflow reported to a slow consumer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use futures_util::StreamExt;
use lockbox_runtime::{ChangeKind, FileChange, RuntimeError, WatchEvent, WatchStream};
use std::collections::HashSet;
use std::time::Duration;

/// Reads events into `seen` until `done(seen)` holds (60 s at most: a debug build on a busy
/// machine takes seconds to pass tens of thousands of events through).
async fn until(
    w: &mut WatchStream,
    seen: &mut Vec<WatchEvent>,
    done: impl Fn(&[WatchEvent]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done(seen) {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(ev)) => seen.push(ev),
            Ok(None) => panic!("the watch ended; seen: {seen:?}"),
            Err(_) => panic!(
                "timed out; last events: {:?}",
                &seen[seen.len().saturating_sub(20)..]
            ),
        }
    }
}

fn changes(seen: &[WatchEvent]) -> impl Iterator<Item = &FileChange> {
    seen.iter().filter_map(|e| match e {
        WatchEvent::Change(c) => Some(c),
        _ => None,
    })
}

fn has(seen: &[WatchEvent], kind: ChangeKind, path: &str, is_dir: bool) -> bool {
    changes(seen).any(|c| c.kind == kind && c.path == path && c.is_dir == is_dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_1000_created_files_moves_deleted_dirs_and_new_subdirectories() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "watch_reports_1000_created_files_moves_deleted_dirs_and_new_subdirectories"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "mkdir -p /tmp/w/old/deep && touch /tmp/w/old/deep/f").await;
    let mut w = sb.watch("/tmp/w", true).await.unwrap();
    assert_eq!((w.path.as_str(), w.is_dir), ("/tmp/w", true));

    let r = run(
        &sb,
        "i=0; while [ $i -lt 1000 ]; do : > /tmp/w/f$i; i=$((i+1)); done",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{}", out(&r));
    let mut seen = Vec::new();
    let created = |seen: &[WatchEvent]| -> HashSet<String> {
        changes(seen)
            .filter(|c| c.kind == ChangeKind::Created && !c.is_dir)
            .map(|c| c.path.clone())
            .collect()
    };
    until(&mut w, &mut seen, |s| created(s).len() >= 1000).await;
    let expected: HashSet<String> = (0..1000).map(|i| format!("/tmp/w/f{i}")).collect();
    assert_eq!(created(&seen), expected);
    assert!(!seen
        .iter()
        .any(|e| matches!(e, WatchEvent::Overflow { .. })));

    // A rename inside the watch: both paths.
    seen.clear();
    run(&sb, "mv /tmp/w/f1 /tmp/w/g1").await;
    until(&mut w, &mut seen, |s| {
        has(s, ChangeKind::Moved, "/tmp/w/g1", false)
    })
    .await;
    let moved = changes(&seen)
        .find(|c| c.kind == ChangeKind::Moved)
        .unwrap();
    assert_eq!(moved.from.as_deref(), Some("/tmp/w/f1"));

    // A new subdirectory and the files in it (made at once, before its watch could be added,
    // or after): all reported.
    seen.clear();
    run(
        &sb,
        "mkdir -p /tmp/w/new/sub && echo x > /tmp/w/new/sub/a && echo y > /tmp/w/new/b",
    )
    .await;
    until(&mut w, &mut seen, |s| {
        has(s, ChangeKind::Created, "/tmp/w/new", true)
            && has(s, ChangeKind::Created, "/tmp/w/new/sub", true)
            && has(s, ChangeKind::Created, "/tmp/w/new/sub/a", false)
            && has(s, ChangeKind::Created, "/tmp/w/new/b", false)
    })
    .await;
    // Later writes in it are seen too.
    run(&sb, "echo more >> /tmp/w/new/sub/a").await;
    until(&mut w, &mut seen, |s| {
        has(s, ChangeKind::Modified, "/tmp/w/new/sub/a", false)
    })
    .await;

    // A deleted directory, and a watched directory moved: paths below follow it.
    seen.clear();
    run(
        &sb,
        "rm -r /tmp/w/old && mv /tmp/w/new /tmp/w/renamed && touch /tmp/w/renamed/sub/c",
    )
    .await;
    until(&mut w, &mut seen, |s| {
        has(s, ChangeKind::Deleted, "/tmp/w/old/deep/f", false)
            && has(s, ChangeKind::Deleted, "/tmp/w/old", true)
            && has(s, ChangeKind::Moved, "/tmp/w/renamed", true)
            && has(s, ChangeKind::Created, "/tmp/w/renamed/sub/c", false)
    })
    .await;
    drop(w);
    rt.delete_sandbox(sb.id()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_falls_behind_is_told_of_the_loss_and_the_watch_goes_on() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_consumer_that_falls_behind_is_told_of_the_loss_and_the_watch_goes_on"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "mkdir /tmp/o").await;
    let mut w = sb.watch("/tmp/o", false).await.unwrap();
    // 20,000 files, 40,000 events (created, then closed after writing), nothing read: more
    // than every queue on the way holds together (the kernel's inotify queue, 16,384 by
    // default, the agent's 4,096, the socket's, the runtime's 4,096), so some queue drops
    // events however fast or slow the agent is on a busy machine.
    let r = run(
        &sb,
        "cd /tmp/o && i=0; while [ $i -lt 20000 ]; do : > f$i; i=$((i+1)); done",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{}", out(&r));
    let mut seen = Vec::new();
    until(&mut w, &mut seen, |s| {
        s.iter().any(|e| matches!(e, WatchEvent::Overflow { .. }))
    })
    .await;
    // Which queue dropped depends on the agent's speed: the runtime's (after at most 4,096
    // events, counting what it dropped) or the kernel's (`dropped` unknown).
    let before = seen.len() - 1;
    assert!(before > 0, "the events before the overflow are delivered");
    match seen[before] {
        WatchEvent::Overflow { dropped: Some(n) } => {
            assert!(n > 0 && before <= 4096, "{before} events, then {n} dropped")
        }
        WatchEvent::Overflow { dropped: None } => {}
        ref other => panic!("{other:?}"),
    }
    // Once the consumer catches up, new events come again. Catching up means reading until
    // the backlog is gone (the flood's events still in the kernel's and the agent's queues
    // keep coming, and may overflow the runtime's queue again while nobody reads): until no
    // event comes for a second.
    loop {
        match tokio::time::timeout(Duration::from_secs(1), w.next()).await {
            Ok(Some(ev)) => seen.push(ev),
            Ok(None) => panic!("the watch ended"),
            Err(_) => break,
        }
    }
    run(&sb, "touch /tmp/o/after").await;
    until(&mut w, &mut seen, |s| {
        has(s, ChangeKind::Created, "/tmp/o/after", false)
    })
    .await;
    // One overflow event stands for each run of losses: never two in a row.
    let overflow = |e: &WatchEvent| matches!(e, WatchEvent::Overflow { .. });
    assert!(
        !seen.windows(2).any(|p| overflow(&p[0]) && overflow(&p[1])),
        "two overflow events in a row"
    );
    drop(w);
    rt.delete_sandbox(sb.id()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_a_missing_or_outside_path_is_a_clear_error() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let err = sb.watch("/no/such/dir", true).await.unwrap_err();
    assert!(matches!(err, RuntimeError::FileNotFound { .. }), "{err}");
    let err = sb.watch("../../..", true).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::PathOutsideSandbox { .. }),
        "{err}"
    );
    rt.delete_sandbox(sb.id()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_has_at_most_32_watches_and_dropping_one_stops_it() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "mkdir /tmp/l").await;
    let mut held = Vec::new();
    for _ in 0..32 {
        held.push(sb.watch("/tmp/l", false).await.unwrap());
    }
    let err = sb.watch("/tmp/l", false).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::LimitReached { limit: 32, .. }),
        "{err}"
    );
    held.pop();
    // The unwatch is sent when the stream is dropped; the agent takes requests in order.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut w = sb.watch("/tmp/l", false).await.unwrap();
    run(&sb, "touch /tmp/l/x").await;
    let mut seen = Vec::new();
    until(&mut w, &mut seen, |s| {
        has(s, ChangeKind::Created, "/tmp/l/x", false)
    })
    .await;
    drop((held, w));
    rt.delete_sandbox(sb.id()).await.unwrap();
}
