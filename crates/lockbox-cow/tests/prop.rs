//! Property: running a random script of file operations inside the overlay and committing
//! gives exactly the tree that running it directly on a copy gives (content, type, mode,
//! symlink targets, absence).
//!
//! `PROPTEST_CASES` overrides the number of cases (default 256).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: panics are failures

mod common;
#[path = "common/script.rs"]
mod script;

use common::{require_overlay, run_direct, run_in_branch, sh, snapshot, tick};
use lockbox_cow::{Branch, CommitOptions};
use proptest::prelude::*;
use script::{op, to_sh, Op};

fn check(setup: &[Op], script: &[Op]) -> Result<(), TestCaseError> {
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

#[test]
fn commit_equals_direct_execution() {
    if !require_overlay() {
        return;
    }
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        max_shrink_iters: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        proptest::collection::vec(op(), 0..14),
        proptest::collection::vec(op(), 1..16),
    );
    let result = runner.run(&strategy, |(setup, script)| check(&setup, &script));
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The property again as uid/gid 65534 (when we are root), with fewer cases.
#[test]
fn commit_equals_direct_execution_as_uid_65534() {
    if std::env::var_os("LOCKBOX_COW_AS_NOBODY").is_some() {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIP: not root, so this whole run is already unprivileged");
        return;
    }
    if !require_overlay() {
        return;
    }
    let st = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "commit_equals_direct_execution"])
        .env("LOCKBOX_COW_AS_NOBODY", "1")
        .env("PROPTEST_CASES", "48")
        .env("TMPDIR", "/tmp")
        .env("HOME", "/tmp")
        .status()
        .unwrap();
    assert!(st.success(), "property failed as uid 65534: {st}");
}
