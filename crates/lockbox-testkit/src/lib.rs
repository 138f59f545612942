//! Shared helpers of lockbox's integration tests: a dev-dependency of the crates' `it` test
//! binaries, never a dependency of shipped code (`publish = false`).
//!
//! - [`test_name!`]: the name libtest knows a test by inside the one `it` binary of a crate
//!   (`module::test`), for tests that run themselves again in a child process.
//! - [`require!`]: a missing requirement (root, a kernel feature, a tool, a server) skips the
//!   test loudly, or fails it under `LOCKBOX_TEST_REQUIRE=all` (what CI sets).
//! - [`child_role`] / [`child`]: the convention for a test that runs part of itself in a child
//!   process (to SIGKILL it, or under other limits).
//! - [`as_uid_65534`]: runs tests of the current binary again as uid/gid 65534.
//! - [`scratch`]: a temporary directory uid 65534 and sandboxes can enter.
//! - [`oci`]: OCI image layouts made from a directory (busybox-static's `/bin/busybox`).
//! - [`sandboxes`]: for tests running real sandboxes: the agent binary, scratch directories
//!   overlayfs may leave work directories in, re-runs as uid 65534 or in a process of the
//!   test's own, counting sandbox agents.
//!
//! A failing helper panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::io::Write;
use std::process::Command;

pub mod oci;
pub mod sandboxes;

/// The name libtest gives the test `$name` defined in the calling module: the module path
/// without the crate (`it::`), then `::$name`. Pass it with `--exact` to run that one test.
#[macro_export]
macro_rules! test_name {
    ($name:expr) => {
        $crate::libtest_name(module_path!(), $name)
    };
}

/// `module_path` (as `module_path!()` gives it) less its crate, joined with `name`.
pub fn libtest_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

/// Skips the calling test (returns from it) unless `$cond` holds; `$why` (format arguments)
/// says what is missing. Under `LOCKBOX_TEST_REQUIRE=all` the test fails instead. See
/// [`requirement`].
#[macro_export]
macro_rules! require {
    ($cond:expr, $($why:tt)+) => {
        if !$crate::requirement($cond, &format!($($why)+)) {
            return;
        }
    };
}

/// Whether a requirement of the running test is met (`met`). When it is not: under
/// `LOCKBOX_TEST_REQUIRE=all` panics (the test fails); otherwise records a skip and returns
/// false, and the caller returns.
///
/// A skip is written straight to the process's stderr (libtest captures only `print!` and
/// `eprint!`, so the line shows even when the test passes) as `SKIP <crate> <test>: <why>`, and
/// appended to the file `LOCKBOX_TEST_SKIP_LOG` names, if set: `scripts/test.sh` prints that
/// file as the run's summary of skipped tests.
pub fn requirement(met: bool, why: &str) -> bool {
    if met {
        return true;
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    if std::env::var("LOCKBOX_TEST_REQUIRE").as_deref() == Ok("all") {
        panic!("{test}: {why} (required: LOCKBOX_TEST_REQUIRE=all)");
    }
    // cargo runs a crate's tests in the crate's directory: name the crate.
    let dir = std::env::current_dir().unwrap_or_default();
    let krate = dir.file_name().unwrap_or_default().to_string_lossy();
    let line = format!("SKIP {krate} {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("LOCKBOX_TEST_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
    false
}

/// Every descendant of process `root` (zombies included), found by their parents in `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // The fields after the command name, which may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
        {
            parents.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(parent) = todo.pop() {
        for &(pid, _) in parents.iter().filter(|(_, ppid)| *ppid == parent) {
            out.push(pid);
            todo.push(pid);
        }
    }
    out
}

/// Whether the process runs as root (many tests also run as uid 65534 then).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The role this process was started in by [`child`] through the variable `var`, if any.
///
/// The convention for a test that needs part of itself in another process: the test starts
/// with `if let Some(arg) = child_role(VAR) { ...the child's part...; return; }`, and its
/// parent part runs [`child`]`(test_name!("the_test"), VAR, arg)`. So there is one test, the
/// real one; no helper `#[test]` that passes by doing nothing.
pub fn child_role(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

/// A command that runs the test `test` (a [`test_name!`]) of the current test binary alone,
/// uncaptured, with `var=arg` (its [`child_role`]).
pub fn child(test: &str, var: &str, arg: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, arg);
    cmd
}

/// A command running the current test binary again as uid/gid 65534 (through `setpriv`, no
/// supplementary groups), with `marker=1` set so the re-run can tell; add libtest arguments
/// (filters: [`test_name!`]) and run it. `TMPDIR` and `HOME` point at `/tmp`, which uid
/// 65534 can write. The test binary must be reachable by uid 65534.
pub fn as_uid_65534(marker: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--",
    ])
    .arg(std::env::current_exe().unwrap())
    .env(marker, "1")
    .env("TMPDIR", "/tmp")
    .env("HOME", "/tmp");
    cmd
}

/// A temporary directory under `/tmp` (named `prefix`...), mode 0755: uid 65534 and the
/// sandboxes of a test can enter it. Removed when dropped.
/// Removed even when it holds an overlay's work directory (mode 000): see
/// [`sandboxes::Scratch`].
pub fn scratch(prefix: &str) -> sandboxes::Scratch {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    sandboxes::Scratch(dir)
}
