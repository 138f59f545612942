//! Properties of the commit engine against direct execution ("direct execution" = the same
//! script run straight on a copy of the workdir, with the same privileges):
//! - `commit_equals_direct_execution`: plain scripts commit to exactly the tree the direct run
//!   gives (content, type, mode, symlink targets, absence);
//! - `hostile_trees_commit_as_direct_execution_fifos_left_out`: scripts that also make paths
//!   longer than `PATH_MAX`, names that are not UTF-8, directories of mode 000/300/100, sparse
//!   files, hard links and FIFOs commit to exactly the direct run's tree, holes included,
//!   except that FIFOs are left out (the workdir keeps what it had at their paths), and
//!   leave no staging directory.
//!
//! `PROPTEST_CASES` overrides the number of cases (defaults 256 and 64; 48 and 24 for the
//! re-runs as uid 65534).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: panics are failures

use crate::common;
use crate::script;

use common::{
    require_overlay, run_direct, run_in_branch, sh, snapshot, snapshot_with_extents, tick,
    tree_diff, Node,
};
use lockbox_cow::{Branch, CommitOptions};
use proptest::prelude::*;
use script::{op, rich_op, rich_setup_op, to_sh, Op};
use std::path::PathBuf;

/// A state directory and two workdirs set up alike: `a` for the branch, `b` for the direct
/// run.
fn workdirs(setup: &[Op]) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (state, a, b) = (
        tmp.path().join("state"),
        tmp.path().join("a"),
        tmp.path().join("b"),
    );
    for d in [&state, &a, &b] {
        std::fs::create_dir(d).unwrap();
    }
    let setup_sh = to_sh(setup);
    sh(&a, &setup_sh);
    sh(&b, &setup_sh);
    (tmp, state, a, b)
}

fn check(setup: &[Op], script: &[Op]) -> Result<(), TestCaseError> {
    let (_tmp, state, a, b) = workdirs(setup);
    prop_assert_eq!(snapshot(&a), snapshot(&b), "setup is not deterministic");
    tick();
    let branch = Branch::create(&state, &a, serde_json::Value::Null).unwrap();
    let script_sh = to_sh(script);
    run_in_branch(&branch, &script_sh);
    run_direct(&b, &script_sh);
    // The workdir was not touched while the branch existed: no stale paths may be reported.
    let report = branch.commit(&CommitOptions::default());
    prop_assert!(report.is_ok(), "commit failed: {:?}", report);
    prop_assert_eq!(snapshot(&a), snapshot(&b), "script:\n{}", script_sh);
    prop_assert!(lockbox_cow::list(&state).unwrap().is_empty());
    Ok(())
}

fn runner(default_cases: u32) -> proptest::test_runner::TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cases);
    proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

#[test]
fn commit_equals_direct_execution() {
    if !require_overlay() {
        return;
    }
    let strategy = (
        proptest::collection::vec(op(), 0..14),
        proptest::collection::vec(op(), 1..16),
    );
    let result = runner(256).run(&strategy, |(setup, script)| check(&setup, &script));
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn staging_left(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .as_encoded_bytes()
            .starts_with(lockbox_cow::STAGING_PREFIX.as_bytes())
    })
}

fn check_hostile(setup: &[Op], script: &[Op]) -> Result<(), TestCaseError> {
    let (_tmp, state, a, b) = workdirs(setup);
    let before = snapshot_with_extents(&a);
    let same = snapshot_with_extents(&b);
    prop_assert!(
        before == same,
        "setup is not deterministic:\n{}",
        tree_diff(&before, &same)
    );
    tick();
    let branch = Branch::create(&state, &a, serde_json::Value::Null).unwrap();
    let id = branch.id().clone();
    let script_sh = to_sh(script);
    run_in_branch(&branch, &script_sh);
    run_direct(&b, &script_sh);
    let direct = snapshot_with_extents(&b);
    // FIFOs are left out of a commit: at their paths the workdir keeps what it had.
    let mut expected = direct.clone();
    for (fifo, _) in direct
        .iter()
        .filter(|(_, (n, _))| matches!(n, Node::Other(_)))
    {
        expected.remove(fifo);
        for (path, entry) in before.iter().filter(|(p, _)| p.starts_with(fifo)) {
            expected.insert(path.clone(), entry.clone());
        }
    }
    let result = branch.commit(&CommitOptions::default());
    prop_assert!(
        !staging_left(&a),
        "staging directory left; script:\n{}",
        script_sh
    );
    if let Err(e) = result {
        let left = Branch::open(&state, &id).map(|b| b.meta().state);
        prop_assert!(
            false,
            "commit failed: {} (branch {:?}); script:\n{}",
            e,
            left.ok(),
            script_sh
        );
    }
    let got = snapshot_with_extents(&a);
    // A file that was in the workdir before is copied up by the kernel when the sandbox
    // writes it, and overlayfs copies up data in chunks (1 MiB) from each data start: a
    // hole inside such a chunk becomes zeros in the upper layer, which the commit then
    // copies as data. Same bytes, more allocated; only there is a filled hole accepted.
    let copied_up_fill = |path: &std::path::Path| match (got.get(path), expected.get(path)) {
        (Some((Node::File(gm, gc), ge)), Some((Node::File(wm, wc), we))) => {
            gm == wm
                && gc == wc
                && matches!(before.get(path), Some((Node::File(..), _)))
                && data_covers(ge, we)
        }
        _ => false,
    };
    let differing: Vec<_> = got
        .keys()
        .chain(expected.keys())
        .filter(|p| got.get(*p) != expected.get(*p) && !copied_up_fill(p))
        .collect();
    prop_assert!(
        differing.is_empty(),
        "committed tree differs:\n{}script:\n{}",
        tree_diff(&got, &expected),
        script_sh
    );
    prop_assert!(lockbox_cow::list(&state).unwrap().is_empty());
    Ok(())
}

/// Every data range of `want` lies within the data ranges of `got` (no data became a hole).
fn data_covers(got: &[(u64, u64)], want: &[(u64, u64)]) -> bool {
    want.iter().all(|&(start, end)| {
        let mut at = start;
        for &(s, e) in got {
            if s <= at && at < e {
                at = e;
            }
        }
        at >= end
    })
}

#[test]
fn a_filled_hole_is_covered_and_a_lost_range_is_not() {
    assert!(data_covers(
        &[(0, 1048578)],
        &[(0, 4096), (1048576, 1048578)]
    ));
    assert!(data_covers(&[(0, 10), (10, 20)], &[(0, 20)]));
    assert!(!data_covers(&[(0, 4096)], &[(0, 4096), (1048576, 1048578)]));
    assert!(!data_covers(&[], &[(0, 1)]));
}

#[test]
fn hostile_trees_commit_as_direct_execution_fifos_left_out() {
    if !require_overlay() {
        return;
    }
    let strategy = (
        proptest::collection::vec(rich_setup_op(), 0..10),
        proptest::collection::vec(rich_op(), 1..14),
    );
    let result = runner(64).run(&strategy, |(setup, script)| check_hostile(&setup, &script));
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// `test` again as uid/gid 65534 (when we are root) with `cases` cases.
fn as_uid_65534(test: &str, cases: &str) {
    if std::env::var_os("LOCKBOX_COW_AS_NOBODY").is_some() {
        return;
    }
    lockbox_testkit::require!(
        lockbox_testkit::is_root(),
        "running as uid 65534 needs root (this run is unprivileged already)"
    );
    if !require_overlay() {
        return;
    }
    let st = lockbox_testkit::as_uid_65534("LOCKBOX_COW_AS_NOBODY")
        .args(["--exact", lockbox_testkit::test_name!(test).as_str()])
        .env(
            "PROPTEST_CASES",
            std::env::var("PROPTEST_CASES_AS_NOBODY").unwrap_or_else(|_| cases.into()),
        )
        .status()
        .unwrap();
    assert!(st.success(), "{test} failed as uid 65534: {st}");
}

#[test]
fn hostile_trees_commit_as_direct_execution_fifos_left_out_as_uid_65534() {
    as_uid_65534(
        "hostile_trees_commit_as_direct_execution_fifos_left_out",
        "24",
    );
}

/// The property again as uid/gid 65534 (when we are root), with fewer cases.
#[test]
fn commit_equals_direct_execution_as_uid_65534() {
    as_uid_65534("commit_equals_direct_execution", "48");
}

/// The case CI's property run found: a sparse file (a hole inside its first MiB) that the
/// sandbox appends to is committed with the same bytes; the hole inside the kernel's copy-up
/// chunk may become data, no data may become a hole.
#[test]
fn a_copied_up_sparse_file_commits_its_bytes_with_its_hole_filled_or_kept() {
    if !require_overlay() {
        return;
    }
    let setup = [Op::Append(0, "a".into()), Op::Poke(0, 2)];
    let script = [Op::Append(0, "a".into())];
    if let Err(e) = check_hostile(&setup, &script) {
        panic!("{e}");
    }
}
