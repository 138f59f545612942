//! Gather transactions on the real kernel: parallel sources on snapshots, merge under each
//! conflict policy, a consumer on the merged view with every source's output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{dirs, rerun_as_nobody, stage, staging_leftovers, tree_hash};
use lockbox_txn::{AbortReason, ConflictPolicy, Gather, MergeConflict, Output};

#[test]
fn disjoint_writes_commit_together_and_the_consumer_sees_merged_state_and_inputs() {
    let (_tmp, state, work) = dirs();
    std::fs::create_dir(work.join("shared")).unwrap();
    std::fs::write(work.join("shared/base"), "base").unwrap();
    let outcome = Gather::new(&state, &work)
        .source(
            "web",
            stage(&work, "mkdir web && echo w > web/index && echo w > shared/web && echo web-out"),
        )
        .source(
            "api",
            // Snapshot isolation: the sibling's writes are invisible.
            stage(&work, "test ! -e web && mkdir api && echo a > api/main && echo a > shared/api && echo api-out"),
        )
        .consumer(stage(
            &work,
            "test -f web/index && test -f api/main && ls shared && echo \"$LOCKBOX_INPUT_NAMES\" \
             && for n in $LOCKBOX_INPUT_NAMES; do cat \"$LOCKBOX_INPUTS/$n\"; done && echo c > consumed",
        ))
        .run()
        .unwrap();
    assert!(outcome.committed, "{:?}", outcome.stages);
    assert!(outcome.conflicts.is_empty());
    assert_eq!(outcome.stages.len(), 3);
    assert_eq!(
        outcome.stdout,
        Output::Memory(b"api\nbase\nweb\nweb api\nweb-out\napi-out\n".to_vec())
    );
    for (p, content) in [
        ("web/index", "w\n"),
        ("api/main", "a\n"),
        ("shared/web", "w\n"),
        ("shared/api", "a\n"),
        ("shared/base", "base"),
        ("consumed", "c\n"),
    ] {
        assert_eq!(
            std::fs::read_to_string(work.join(p)).unwrap(),
            content,
            "{p}"
        );
    }
    assert!(staging_leftovers(&work).is_empty());
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "disjoint_writes_commit_together_and_the_consumer_sees_merged_state_and_inputs"
    ));
}

fn same_path(
    policy: ConflictPolicy,
) -> (
    lockbox_txn::TxnOutcome,
    std::path::PathBuf,
    tempfile::TempDir,
) {
    let (tmp, state, work) = dirs();
    std::fs::write(work.join("other"), "other").unwrap();
    let outcome = Gather::new(&state, &work)
        .source("a", stage(&work, "echo from-a > f && echo a-only > a.txt"))
        .source("b", stage(&work, "echo from-b > f && echo b-only > b.txt"))
        .conflict_policy(policy)
        .run()
        .unwrap();
    (outcome, work, tmp)
}

fn read(work: &std::path::Path, p: &str) -> String {
    std::fs::read_to_string(work.join(p)).unwrap()
}

#[test]
fn same_path_under_fail_aborts_with_the_conflict_and_exit_3() {
    let (outcome, work2, _t) = same_path(ConflictPolicy::Fail);
    assert!(!outcome.committed);
    assert_eq!(outcome.exit_code(), 3);
    assert_eq!(
        outcome.abort_reason,
        Some(AbortReason::Conflicts { count: 1 })
    );
    assert_eq!(
        outcome.conflicts,
        [MergeConflict {
            path: "f".into(),
            stages: vec!["a".into(), "b".into()]
        }]
    );
    let names: Vec<_> = std::fs::read_dir(&work2)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["other"]);
}

#[test]
fn same_path_under_first_writer_wins_keeps_the_first_source() {
    let (outcome, work, _t) = same_path(ConflictPolicy::FirstWriterWins);
    assert!(outcome.committed);
    assert_eq!(outcome.conflicts.len(), 1);
    assert_eq!(read(&work, "f"), "from-a\n");
    assert_eq!(read(&work, "a.txt"), "a-only\n");
    assert_eq!(read(&work, "b.txt"), "b-only\n");
}

#[test]
fn same_path_under_last_writer_wins_keeps_the_last_source() {
    let (outcome, work, _t) = same_path(ConflictPolicy::LastWriterWins);
    assert!(outcome.committed);
    assert_eq!(read(&work, "f"), "from-b\n");
    assert_eq!(read(&work, "a.txt"), "a-only\n");
}

#[test]
fn same_path_under_markers_keeps_every_version() {
    let (outcome, work, _t) = same_path(ConflictPolicy::Markers);
    assert!(outcome.committed);
    assert_eq!(read(&work, "f"), "from-a\n");
    assert_eq!(read(&work, "f.lockbox-b"), "from-b\n");
    assert_eq!(outcome.markers.len(), 1);
    assert_eq!(outcome.markers[0].kept_as.to_str(), Some("f.lockbox-b"));
    assert_eq!(outcome.markers[0].source, "b");
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "same_path_under_markers_keeps_every_version"
    ));
}

#[test]
fn a_marker_of_a_directory_is_the_losing_sources_whole_version_of_it() {
    let (_tmp, state, work) = dirs();
    std::fs::create_dir_all(work.join("d/sub")).unwrap();
    std::fs::write(work.join("d/a"), "a").unwrap();
    std::fs::write(work.join("d/b"), "b").unwrap();
    std::fs::write(work.join("d/sub/s"), "s").unwrap();
    let outcome = Gather::new(&state, &work)
        .conflict_policy(ConflictPolicy::Markers)
        .source("one", stage(&work, "rm -r d"))
        .source(
            "two",
            stage(&work, "rm d/a && echo y > d/y && echo changed > d/sub/s"),
        )
        .consumer(stage(&work, "ls -A d.lockbox-two"))
        .run()
        .unwrap();
    assert!(outcome.committed, "{outcome:?}");
    // The first source's deletion keeps the path; the second's directory is kept whole:
    // the workdir's entries it left alone, its changes, and not what it deleted.
    assert!(!work.join("d").exists());
    let kept = work.join("d.lockbox-two");
    let mut names: Vec<_> = walk(&kept);
    names.sort();
    assert_eq!(names, ["b", "sub", "sub/s", "y"]);
    assert_eq!(read(&kept, "b"), "b");
    assert_eq!(read(&kept, "sub/s"), "changed\n");
    assert_eq!(read(&kept, "y"), "y\n");
    assert_eq!(outcome.stdout, Output::Memory(b"b\nsub\ny\n".to_vec()));
    // Copied, not linked: the kept version is not tied to a file the workdir had.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(kept.join("b")).unwrap().nlink(), 1);
    assert!(staging_leftovers(&work).is_empty());
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_marker_of_a_directory_is_the_losing_sources_whole_version_of_it"
    ));
}

/// Every path below `dir`, relative to it.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()).into_iter().map(|p| format!("{name}/{p}")));
        }
        out.push(name);
    }
    out
}

#[test]
fn delete_versus_write_of_the_same_path_is_a_conflict() {
    let (_tmp, state, work) = dirs();
    std::fs::write(work.join("f"), "f").unwrap();
    std::fs::create_dir(work.join("d")).unwrap();
    std::fs::write(work.join("d/x"), "x").unwrap();
    let before = tree_hash(&work);
    let outcome = Gather::new(&state, &work)
        .source("del", stage(&work, "rm f && rm -r d"))
        .source("wr", stage(&work, "echo new > f && echo y > d/y"))
        .run()
        .unwrap();
    assert!(!outcome.committed);
    let paths: Vec<_> = outcome
        .conflicts
        .iter()
        .map(|c| c.path.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(paths, ["d", "f"]);
    assert!(outcome.conflicts.iter().all(|c| c.stages == ["del", "wr"]));
    assert_eq!(tree_hash(&work), before);
}

#[test]
fn a_failing_source_aborts_the_gather_and_reports_every_source() {
    let (_tmp, state, work) = dirs();
    let before = tree_hash(&work);
    let outcome = Gather::new(&state, &work)
        .source("ok", stage(&work, "echo a > a"))
        .source("bad", stage(&work, "echo b > b; exit 2"))
        .consumer(stage(&work, "echo never > c"))
        .run()
        .unwrap();
    assert!(!outcome.committed);
    assert_eq!(outcome.exit_code(), 1);
    assert_eq!(outcome.stages.len(), 2, "the consumer does not run");
    assert_eq!(outcome.stages[1].exit_code, 2);
    assert_eq!(tree_hash(&work), before);
}

#[test]
fn gather_dry_run_reports_the_merged_changes_and_commits_nothing() {
    let (_tmp, state, work) = dirs();
    let before = tree_hash(&work);
    let outcome = Gather::new(&state, &work)
        .source("x", stage(&work, "echo x > x"))
        .source("y", stage(&work, "echo y > y"))
        .dry_run()
        .unwrap();
    assert_eq!(outcome.abort_reason, Some(AbortReason::DryRun));
    assert_eq!(outcome.changes.to_lines(), "A x\nA y\n");
    assert_eq!(tree_hash(&work), before);
}

#[test]
fn a_gather_source_is_retried_on_a_fresh_layer() {
    let (tmp, state, work) = dirs();
    let counter = tmp.path().join("counter");
    std::fs::create_dir(&counter).unwrap();
    let policy = lockbox_policy::Policy {
        fs: lockbox_policy::FsPolicy {
            write: vec![counter.clone()],
            ..Default::default()
        },
        ..Default::default()
    };
    let (w, c) = (work.display(), counter.display());
    let flaky = lockbox_txn::Stage::sh(
        policy,
        &format!(
            "cd '{w}' && n=$(cat '{c}/count' 2>/dev/null || echo 0) && echo $((n+1)) > '{c}/count' \
             && echo $n > try-$n && [ $n -ge 1 ]"
        ),
    )
    .retries(1);
    let outcome = Gather::new(&state, &work)
        .source("steady", stage(&work, "echo s > s"))
        .source("flaky", flaky)
        .run()
        .unwrap();
    assert!(outcome.committed, "{:?}", outcome.stages);
    assert_eq!(outcome.stages[1].attempts, 2);
    assert!(!work.join("try-0").exists());
    assert!(work.join("try-1").exists() && work.join("s").exists());
}
