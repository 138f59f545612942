//! Shared helpers of the lockbox-txn integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lockbox_policy::Policy;
use lockbox_txn::Stage;

/// A stage running `cd WORKDIR && script` with the default policy.
pub fn stage(workdir: &Path, script: &str) -> Stage {
    Stage::sh(
        Policy::default(),
        &format!("cd '{}' && {script}", workdir.display()),
    )
}

/// A hash of a whole tree: every path, type, permission bits, file content and link target.
pub fn tree_hash(root: &Path) -> u64 {
    let mut h = DefaultHasher::new();
    hash_dir(root, Path::new(""), &mut h);
    h.finish()
}

fn hash_dir(root: &Path, rel: &Path, h: &mut DefaultHasher) {
    let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        let rel = rel.join(&name);
        let abs = root.join(&rel);
        let meta = std::fs::symlink_metadata(&abs).unwrap();
        rel.hash(h);
        (meta.mode() & 0o170777).hash(h);
        if meta.is_dir() {
            hash_dir(root, &rel, h);
        } else if meta.file_type().is_symlink() {
            std::fs::read_link(&abs).unwrap().hash(h);
        } else {
            std::fs::read(&abs).unwrap().hash(h);
        }
    }
}

/// Top-level entries of `dir` that are commit staging directories.
pub fn staging_leftovers(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".lockbox-commit-"))
        })
        .collect()
}

/// A fresh (state dir, workdir) pair under one temp dir, accessible to the current user.
pub fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    dirs_in(&std::env::temp_dir())
}

/// Like [`dirs`], under `base`.
pub fn dirs_in(base: &Path) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir_in(base).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    (tmp, state, work)
}

/// Waits until the coarse clock behind file timestamps (`CLOCK_REALTIME_COARSE`) has just
/// ticked, so that what follows within well under a tick (1-4 ms) gets one timestamp: the
/// clock edge of "a file written just before the transaction", made deterministic.
pub fn at_tick_start() {
    use rustix::time::{clock_gettime, ClockId};
    let first = clock_gettime(ClockId::RealtimeCoarse);
    while clock_gettime(ClockId::RealtimeCoarse) == first {
        std::hint::spin_loop();
    }
}

const AS_NOBODY: &str = "LOCKBOX_TXN_TEST_AS_NOBODY";

/// True inside the uid-65534 re-run of [`rerun_as_nobody`].
pub fn is_nobody_rerun() -> bool {
    std::env::var_os(AS_NOBODY).is_some()
}

/// When running as root, re-runs the test `name` of this test binary as uid/gid 65534 with
/// `setpriv` and asserts it passes. A no-op (returns false) when not root or already
/// re-run; prints why it skips if `setpriv` is missing.
pub fn rerun_as_nobody(name: &str) -> bool {
    if std::env::var_os(AS_NOBODY).is_some() {
        return false;
    }
    if !lockbox_testkit::requirement(
        lockbox_testkit::is_root(),
        &format!("{name} as uid 65534 needs root (this run is unprivileged already)"),
    ) {
        return false;
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&exe)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(AS_NOBODY, "1")
        .env("TMPDIR", "/tmp")
        .status();
    match status {
        Ok(s) => assert!(s.success(), "{name} as uid 65534: {s}"),
        Err(e) => {
            lockbox_testkit::requirement(false, &format!("{name} as uid 65534: setpriv: {e}"));
        }
    }
    true
}

/// Copies `from` to `to` with `cp -a` (replacing `to`): the pristine state a crash test
/// restores before each trial.
pub fn cp_a(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Starts this test binary's `test` alone (as its child role: [`lockbox_testkit::child_role`]), with `env` naming the state directory and the
/// transaction it commits (`STATE\nID`): a committing process a crash test can kill.
pub fn spawn_child(
    test: &str,
    env: &str,
    state: &Path,
    id: &lockbox_txn::TxnId,
) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        // --include-ignored: the child may be an #[ignore]d (long) test.
        .args([
            "--exact",
            test,
            "--include-ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(env, format!("{}\n{id}", state.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}
