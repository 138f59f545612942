//! Integration tests of lockbox-confine, one binary: `cargo test -p lockbox-confine --test it`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// `as_root_and_nobody!("test_fn", || ...)`: [`root_and_nobody`] for test `test_fn` of the
/// calling module.
macro_rules! as_root_and_nobody {
    ($name:expr, $body:expr $(,)?) => {
        $crate::root_and_nobody(&lockbox_testkit::test_name!($name), $body)
    };
}

mod armed;
mod boot_id;
mod gate;
mod image;
mod overlay;
mod own_table;
mod parked;
mod sequence;
mod stdio;
mod template;

use std::io::Read;
use std::os::unix::process::CommandExt;

/// Runs `sh -c script` in a sandbox of `policy`, stdout to a pipe; its output, once the
/// sandbox exited 0.
pub fn stdout_of(policy: &lockbox_policy::Policy, script: &str) -> String {
    stdout_of_spawn(policy, script, |spawn| spawn)
}

/// [`stdout_of`], the spawn first passed through `with`.
pub fn stdout_of_spawn(
    policy: &lockbox_policy::Policy,
    script: &str,
    with: impl for<'a> FnOnce(lockbox_confine::Spawn<'a>) -> lockbox_confine::Spawn<'a>,
) -> String {
    let (mut out_r, out_w) = std::os::unix::net::UnixStream::pair().unwrap();
    let argv = ["sh".into(), "-c".into(), script.into()];
    let mut running = with(lockbox_confine::Spawn::command(policy, &argv))
        .stdio(lockbox_confine::Stdio {
            stdin: None,
            stdout: Some(std::os::fd::OwnedFd::from(out_w)),
            stderr: None,
        })
        .start()
        .unwrap();
    // A descriptor left holding our end would keep the pipe open: fail, do not hang.
    out_r
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut out = String::new();
    out_r
        .read_to_string(&mut out)
        .expect("the command's output never ended");
    match running.wait(None, None).unwrap() {
        lockbox_confine::Waited::Exited(o) => assert_eq!(o.exit_code(), 0, "{out}"),
        other => panic!("{other:?}"),
    }
    out
}

/// Set in the re-executed test process (which must not re-execute again).
pub const AS_NOBODY: &str = "LOCKBOX_CONFINE_TEST_AS_NOBODY";

/// Runs `body` as the caller and, as root, again as uid 65534 in a copy of this test
/// process running only test `name` (as libtest names it: `as_root_and_nobody!` gives it).
pub fn root_and_nobody(name: &str, body: impl Fn()) {
    if std::env::var_os(AS_NOBODY).is_some() {
        assert_eq!(rustix::process::getuid().as_raw(), 65534);
        return body();
    }
    body();
    if !rustix::process::getuid().is_root() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(AS_NOBODY, "1")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "as uid 65534:\n{text}");
    assert!(
        text.contains("1 passed"),
        "as uid 65534, the test did not run:\n{text}"
    );
}
