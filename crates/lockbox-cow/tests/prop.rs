//! Property: running a random script of file operations inside the overlay and committing
//! gives exactly the tree that running it directly on a copy gives (content, type, mode,
//! symlink targets, absence).
//!
//! `PROPTEST_CASES` overrides the number of cases (default 256).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: panics are failures

mod common;

use common::{require_overlay, run_direct, run_in_branch, sh, snapshot, tick};
use lockbox_cow::{Branch, CommitOptions};
use proptest::prelude::*;

const PATHS: [&str; 12] = [
    "a", "b", "d", "d/a", "d/b", "d/e", "d/e/f", "e", "e/a", "e/d", "sp ace", "d/ü",
];
const LINK_TARGETS: [&str; 6] = ["a", "d", "d/e", "missing", "e/a", "."];
/// Directory-safe modes (owner keeps rwx, so the tree stays walkable without privilege).
const MODES: [u32; 6] = [0o700, 0o755, 0o711, 0o750, 0o744, 0o775];

#[derive(Debug, Clone)]
enum Op {
    Write(usize, String),
    Append(usize, String),
    Truncate(usize, u8),
    Chmod(usize, usize),
    ReadOnlyFile(usize),
    Touch(usize),
    Mkdir(usize),
    Rmdir(usize),
    RmR(usize),
    Mv(usize, usize),
    Symlink(usize, usize),
    DirToFile(usize),
    FileToDir(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PATHS.len();
    let text = "[a-z]{0,12}";
    prop_oneof![
        3 => (p.clone(), text).prop_map(|(p, t)| Op::Write(p, t)),
        2 => (p.clone(), text).prop_map(|(p, t)| Op::Append(p, t)),
        1 => (p.clone(), 0u8..20).prop_map(|(p, n)| Op::Truncate(p, n)),
        1 => (p.clone(), 0..MODES.len()).prop_map(|(p, m)| Op::Chmod(p, m)),
        1 => p.clone().prop_map(Op::ReadOnlyFile),
        1 => p.clone().prop_map(Op::Touch),
        3 => p.clone().prop_map(Op::Mkdir),
        1 => p.clone().prop_map(Op::Rmdir),
        2 => p.clone().prop_map(Op::RmR),
        2 => (p.clone(), p.clone()).prop_map(|(a, b)| Op::Mv(a, b)),
        1 => (0..LINK_TARGETS.len(), p.clone()).prop_map(|(t, p)| Op::Symlink(t, p)),
        1 => p.clone().prop_map(Op::DirToFile),
        1 => p.prop_map(Op::FileToDir),
    ]
}

fn q(p: &str) -> String {
    format!("'{p}'")
}

fn to_sh(ops: &[Op]) -> String {
    let mut s = String::new();
    for op in ops {
        let line = match op {
            Op::Write(p, t) => format!("printf '%s\\n' '{t}' > {}", q(PATHS[*p])),
            Op::Append(p, t) => format!("printf '%s' '{t}' >> {}", q(PATHS[*p])),
            Op::Truncate(p, n) => format!("truncate -s {n} {}", q(PATHS[*p])),
            Op::Chmod(p, m) => format!("chmod {:o} {}", MODES[*m], q(PATHS[*p])),
            Op::ReadOnlyFile(p) => {
                let p = q(PATHS[*p]);
                format!("[ -f {p} ] && [ ! -L {p} ] && chmod 444 {p}")
            }
            Op::Touch(p) => format!("touch -h -d @1000000000 {}", q(PATHS[*p])),
            Op::Mkdir(p) => format!("mkdir {}", q(PATHS[*p])),
            Op::Rmdir(p) => format!("rmdir {}", q(PATHS[*p])),
            Op::RmR(p) => format!("rm -rf {}", q(PATHS[*p])),
            Op::Mv(a, b) => format!("mv {} {}", q(PATHS[*a]), q(PATHS[*b])),
            Op::Symlink(t, p) => format!("ln -s {} {}", LINK_TARGETS[*t], q(PATHS[*p])),
            Op::DirToFile(p) => format!("rm -rf {0} && printf 'was dir\\n' > {0}", q(PATHS[*p])),
            Op::FileToDir(p) => format!("rm -f {0} && mkdir {0}", q(PATHS[*p])),
        };
        s.push_str(&format!("{{ {line}; }} 2>/dev/null\n"));
    }
    s.push_str("exit 0\n");
    s
}

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
