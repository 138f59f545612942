//! Armed stage sandboxes (a pipeline starts the next stages' sandboxes while one runs):
//! nothing of them outlives the pipeline, whatever happens to it. Each test checks that
//! its process has no live child left, so it runs in a process of its own (the test binary
//! run again for that one test: [`in_own_process`]), where the process's children are only
//! its pipeline's, not those of the other tests of the binary running beside it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::{dirs, stage, tree_hash};
use lockbox_testkit::sandboxes::in_own_process;
use lockbox_txn::{AbortReason, Pipeline};

/// Live (not zombie) children of this process, over all its threads.
fn live_children() -> Vec<String> {
    let mut kids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            kids.extend(text.split_whitespace().map(str::to_owned));
        }
    }
    kids.retain(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    });
    kids
}

/// Waits (up to 10 s) until this process has no live child. Only in a process of the
/// test's own ([`in_own_process`]): the whole process's children are counted.
fn assert_no_children_soon() {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !live_children().is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            live_children()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_failed_stage_kills_the_sandboxes_armed_after_it_and_they_run_nothing() {
    if !in_own_process(&lockbox_testkit::test_name!(
        "a_failed_stage_kills_the_sandboxes_armed_after_it_and_they_run_nothing"
    )) {
        return;
    }
    let (_tmp, state, work) = dirs();
    std::fs::write(work.join("keep"), "keep").unwrap();
    let before = tree_hash(&work);
    // Stage 1 takes long enough for stages 2 and 3 to be armed and waiting.
    let outcome = Pipeline::new(&state, &work)
        .stage(stage(&work, "sleep 0.3; exit 4"))
        .stage(stage(&work, "echo two > two"))
        .stage(stage(&work, "echo three > three"))
        .run()
        .unwrap();
    assert!(!outcome.committed);
    assert_eq!(outcome.stages.len(), 1, "{outcome:?}");
    assert!(matches!(
        outcome.abort_reason,
        Some(AbortReason::StageFailed { .. })
    ));
    assert_eq!(tree_hash(&work), before);
    assert_no_children_soon();
    // Their layers went with the transaction's data.
    let layers: Vec<_> = walk(&state)
        .into_iter()
        .filter(|p| p.ends_with("two") || p.ends_with("three"))
        .collect();
    assert!(layers.is_empty(), "{layers:?}");
}

#[test]
fn a_successful_pipeline_leaves_no_sandbox_behind() {
    if !in_own_process(&lockbox_testkit::test_name!(
        "a_successful_pipeline_leaves_no_sandbox_behind"
    )) {
        return;
    }
    let (_tmp, state, work) = dirs();
    let outcome = Pipeline::new(&state, &work)
        .stage(stage(&work, "echo one > one"))
        .stage(stage(&work, "cat one > two"))
        .stage(stage(&work, "cat one two > three"))
        .stage(stage(&work, "cat three"))
        .run()
        .unwrap();
    assert!(outcome.committed, "{outcome:?}");
    assert_eq!(
        std::fs::read_to_string(work.join("three")).unwrap(),
        "one\none\n"
    );
    assert_no_children_soon();
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}
