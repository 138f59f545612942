//! [`lockbox_confine::Running::park`]: a long-lived sandbox that keeps no descriptor of its
//! caller's, and still ends whole.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{Spawn, Stdio};
use lockbox_policy::Policy;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Descriptors of this process that are pidfds of `pid` (their fdinfo names it).
fn pidfds_of(pid: i32) -> usize {
    let line = format!("Pid:\t{pid}");
    std::fs::read_dir("/proc/self/fdinfo")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.lines().any(|l| l == line)))
        .count()
}

/// Starts a sandbox whose command leaves a daemon in a session of its own, both holding
/// the returned output open: it ends only once every process of the sandbox is gone.
fn sandbox_with_a_daemon() -> (lockbox_confine::Running, UnixStream) {
    let (mut out_r, out_w) = UnixStream::pair().unwrap();
    let argv = [
        "sh".into(),
        "-c".into(),
        "setsid sleep 300 & echo started; exec sleep 300".into(),
    ];
    let running = Spawn::command(&Policy::default(), &argv)
        .stdio(Stdio {
            stdin: None,
            stdout: Some(OwnedFd::from(out_w)),
            stderr: None,
        })
        .start()
        .unwrap();
    out_r
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut started = [0u8; 8];
    out_r.read_exact(&mut started).unwrap();
    assert_eq!(&started, b"started\n");
    (running, out_r)
}

/// Every process of the sandbox has ended: its output reached end-of-file.
fn assert_all_gone(mut out: UnixStream) {
    let mut rest = Vec::new();
    out.read_to_end(&mut rest)
        .expect("a process of the sandbox still holds its output");
    assert!(rest.is_empty(), "{rest:?}");
}

/// Issue 34: a server held each of its sandboxes' init pidfd and report socket, two of the
/// three descriptors per sandbox that kept one server below 10,000 sandboxes.
#[test]
fn a_parked_sandbox_holds_no_pidfd_and_stopping_or_dropping_it_ends_every_process() {
    as_root_and_nobody!(
        "a_parked_sandbox_holds_no_pidfd_and_stopping_or_dropping_it_ends_every_process",
        || {
            let (running, out) = sandbox_with_a_daemon();
            let pid = running.pid();
            assert_eq!(pidfds_of(pid), 1);
            let parked = running.park();
            assert_eq!(pidfds_of(pid), 0);
            assert_eq!(parked.pid(), pid);
            parked.stop(Duration::from_millis(200)).unwrap();
            assert_all_gone(out);
            // Reaped by the stop: no longer a child of this process.
            let pid = rustix::process::Pid::from_raw(pid).unwrap();
            let left = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
            assert_eq!(left.err(), Some(rustix::io::Errno::CHILD));

            let (running, out) = sandbox_with_a_daemon();
            drop(running.park());
            assert_all_gone(out);
        }
    );
}
