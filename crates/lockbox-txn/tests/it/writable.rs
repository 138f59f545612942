//! Stages restricted to part of the workdir (`Stage::writable`, `Stage::read_only`) on the
//! real kernel: writes below the writable paths commit, writes elsewhere fail (EROFS from
//! the view's read-only mount, or EACCES from Landlock) and abort the transaction. Workdirs
//! live under /var/tmp, except in the test showing a workdir under /tmp is restricted too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{dirs_in, rerun_as_nobody, stage, staging_leftovers, tree_hash};
use lockbox_txn::{AbortReason, ConflictPolicy, Gather, Output, Pipeline};

/// (temp dir, state dir, workdir) under /var/tmp, the workdir holding `web/`, `api/main`.
fn project() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let (tmp, state, work) = dirs_in(std::path::Path::new("/var/tmp"));
    std::fs::create_dir(work.join("web")).unwrap();
    std::fs::create_dir(work.join("api")).unwrap();
    std::fs::write(work.join("api/main"), "api").unwrap();
    (tmp, state, work)
}

#[test]
fn a_stage_restricted_to_web_writes_there_and_the_transaction_commits() {
    let (_tmp, state, work) = project();
    let outcome = Pipeline::new(&state, &work)
        .stage(
            stage(
                &work,
                "echo x > web/x && mkdir web/sub && echo y > web/sub/y",
            )
            .writable(["web"]),
        )
        // Read-committed: the read-only stage sees stage 1's writes; its /tmp stays writable.
        .stage(
            stage(
                &work,
                "cat web/x web/sub/y api/main > /tmp/all && cat /tmp/all",
            )
            .read_only(),
        )
        .run()
        .unwrap();
    assert!(outcome.committed, "{:?}", outcome.stages);
    assert_eq!(outcome.stdout, Output::Memory(b"x\ny\napi".to_vec()));
    assert_eq!(
        outcome.changes.to_lines(),
        "A web/sub\nA web/sub/y\nA web/x\n"
    );
    assert_eq!(std::fs::read_to_string(work.join("web/x")).unwrap(), "x\n");
    assert!(staging_leftovers(&work).is_empty());
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_stage_restricted_to_web_writes_there_and_the_transaction_commits"
    ));
}

#[test]
fn a_restricted_stage_writing_outside_its_paths_gets_eacces_and_nothing_commits() {
    let (_tmp, state, work) = project();
    let before = tree_hash(&work);
    let outcome = Pipeline::new(&state, &work)
        .stage(stage(&work, "echo a > a.txt"))
        .stage(stage(&work, "echo ok > web/ok && echo y > api/y").writable(["web"]))
        .run()
        .unwrap();
    assert!(!outcome.committed);
    assert_eq!(outcome.exit_code(), 1);
    assert!(
        matches!(
            outcome.abort_reason,
            Some(AbortReason::StageFailed { stage: 1, .. })
        ),
        "{:?}",
        outcome.abort_reason
    );
    let tail = &outcome.stages[1].stderr_tail;
    assert!(tail.contains("api/y") && refused(tail), "{tail}");
    assert_eq!(tree_hash(&work), before, "the workdir changed");
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_restricted_stage_writing_outside_its_paths_gets_eacces_and_nothing_commits"
    ));
}

#[test]
fn a_read_only_stage_cannot_write_anywhere_in_the_view_even_when_streamed() {
    let (_tmp, state, work) = project();
    let before = tree_hash(&work);
    for script in [
        "echo y > web/y",
        "echo y > top",
        "echo more >> api/main",
        "rm api/main",
        "mkdir new",
    ] {
        for streamed in [false, true] {
            let mut p = Pipeline::new(&state, &work)
                .stage(stage(&work, "echo t > /tmp/t && cat /tmp/t"))
                .stage(stage(&work, &format!("cat >/dev/null && {script}")).read_only());
            if streamed {
                p = p.stream(ConflictPolicy::Fail);
            }
            let outcome = p.run().unwrap();
            assert!(
                !outcome.committed,
                "{script} (streamed: {streamed}) committed"
            );
            let tail = &outcome.stages[1].stderr_tail;
            assert!(refused(tail), "{script}: {tail}");
            assert!(outcome.stages[0].succeeded(), "{:?}", outcome.stages[0]);
        }
    }
    assert_eq!(tree_hash(&work), before, "the workdir changed");
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_read_only_stage_cannot_write_anywhere_in_the_view_even_when_streamed"
    ));
}

#[test]
fn rfc_example_4_agents_restricted_to_disjoint_subsystems_commit_together() {
    let (_tmp, state, work) = project();
    let outcome = Gather::new(&state, &work)
        .source("frontend_agent", stage(&work, "echo page > web/index.html && echo web-done").writable(["web"]))
        .source("backend_agent", stage(&work, "echo route >> api/main && echo api-done").writable(["api"]))
        .consumer(
            stage(
                &work,
                "cat web/index.html api/main && cat \"$LOCKBOX_INPUTS/frontend_agent\" \"$LOCKBOX_INPUTS/backend_agent\"",
            )
            .read_only(),
        )
        .run()
        .unwrap();
    assert!(outcome.committed, "{:?}", outcome.stages);
    assert!(outcome.conflicts.is_empty());
    assert_eq!(
        outcome.stdout,
        Output::Memory(b"page\napiroute\nweb-done\napi-done\n".to_vec())
    );
    assert_eq!(
        std::fs::read_to_string(work.join("web/index.html")).unwrap(),
        "page\n"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("api/main")).unwrap(),
        "apiroute\n"
    );

    // An agent straying out of its subsystem aborts the whole gather.
    let before = tree_hash(&work);
    let outcome = Gather::new(&state, &work)
        .source(
            "frontend_agent",
            stage(&work, "echo page2 > web/index.html").writable(["web"]),
        )
        .source(
            "backend_agent",
            stage(&work, "echo hack > web/index.html").writable(["api"]),
        )
        .run()
        .unwrap();
    assert!(!outcome.committed);
    assert!(
        refused(&outcome.stages[1].stderr_tail),
        "{:?}",
        outcome.stages
    );
    assert_eq!(tree_hash(&work), before, "the workdir changed");
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "rfc_example_4_agents_restricted_to_disjoint_subsystems_commit_together"
    ));
}

#[test]
fn a_missing_writable_directory_is_created_in_the_stage_layer() {
    let (_tmp, state, work) = project();
    let outcome = Pipeline::new(&state, &work)
        .stage(stage(&work, "echo bin > out/dist/app").writable(["out/dist"]))
        .run()
        .unwrap();
    assert!(outcome.committed, "{:?}", outcome.stages);
    assert_eq!(
        outcome.changes.to_lines(),
        "A out\nA out/dist\nA out/dist/app\n"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("out/dist/app")).unwrap(),
        "bin\n"
    );
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_missing_writable_directory_is_created_in_the_stage_layer"
    ));
}

#[test]
fn a_bad_restriction_fails_the_stage_setup_naming_the_path() {
    let (_tmp, state, work) = project();
    let before = tree_hash(&work);
    for (writable, expected) in [
        ("/etc", "not inside the view"),
        ("../escape", "not inside the view"),
        ("api/main", "not a directory"),
    ] {
        let outcome = Pipeline::new(&state, &work)
            .stage(stage(&work, "true").writable([writable]))
            .run()
            .unwrap();
        assert!(!outcome.committed);
        assert_eq!(outcome.exit_code(), 125, "{writable}");
        let error = outcome.stages[0].setup_error.clone().unwrap_or_default();
        assert!(error.contains(expected), "{writable}: {error}");
        let name = std::path::Path::new(writable).file_name().unwrap();
        assert!(
            error.contains(&*name.to_string_lossy()),
            "{writable}: {error}"
        );
    }
    assert_eq!(tree_hash(&work), before);
}

#[test]
fn a_restriction_of_a_workdir_under_tmp_holds() {
    // The sandbox's own /tmp is writable; the read-only mount of the view still holds.
    let (_tmp, state, work) = dirs_in(std::path::Path::new("/tmp"));
    let outcome = Pipeline::new(&state, &work)
        .stage(stage(&work, "echo y > y").read_only())
        .run()
        .unwrap();
    assert!(!outcome.committed);
    assert_eq!(outcome.exit_code(), 1);
    assert!(
        outcome.stages[0]
            .stderr_tail
            .contains("Read-only file system"),
        "{:?}",
        outcome.stages[0]
    );
    assert!(!work.join("y").exists());
}

#[test]
fn a_restricted_stage_cannot_change_metadata_outside_its_paths() {
    let (_tmp, state, work) = project();
    let before = tree_hash(&work);
    for (script, changed) in [
        ("chmod 600 api/main", "api/main"),
        ("touch -d 2001-01-01 api/main", "api/main"),
        ("chmod 700 api", "api"),
    ] {
        for streamed in [false, true] {
            let mut p = Pipeline::new(&state, &work)
                .stage(stage(&work, &format!("echo ok > web/ok && {script}")).writable(["web"]));
            if streamed {
                p = p.stream(ConflictPolicy::Fail);
            }
            let outcome = p.run().unwrap();
            assert!(!outcome.committed, "{script} committed");
            assert_eq!(outcome.exit_code(), 1);
            // The read-only mount refuses it (EROFS: the stage fails); had it slipped through,
            // the layer check would name the path.
            match &outcome.abort_reason {
                Some(AbortReason::StageFailed { stage: 0, .. }) => assert!(
                    outcome.stages[0]
                        .stderr_tail
                        .contains("Read-only file system"),
                    "{script}: {:?}",
                    outcome.stages[0]
                ),
                Some(AbortReason::OutsideWritable { paths, .. }) => {
                    assert_eq!(paths, &[std::path::PathBuf::from(changed)], "{script}")
                }
                other => panic!("{script} (streamed: {streamed}): {other:?}"),
            }
        }
    }
    assert_eq!(tree_hash(&work), before, "the workdir changed");
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_restricted_stage_cannot_change_metadata_outside_its_paths"
    ));
}

/// The error a write outside a stage's writable parts gets: EROFS from the read-only mount of
/// the view (EACCES where Landlock refuses first).
fn refused(stderr: &str) -> bool {
    stderr.contains("Read-only file system") || stderr.contains("Permission denied")
}
