//! Pre-armed sandboxes ([`lockbox_confine::Spawn::armed`]): confined before they know their
//! command, which comes with the go, and then behaving as a direct start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{ArmedCommand, Spawn, Status, Stdio, Waited};
use lockbox_policy::Policy;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn sh(script: &str) -> Vec<OsString> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The sandbox's processes: the init's children, as `/proc` lists them (one task each).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn status_field(pid: i32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_owned())
}

fn waiting_child(init: i32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // The armed command child has seccomp on once it waits (the helper, pid 2, comes and
        // goes before it).
        if let Some(&pid) = children_of(init)
            .iter()
            .find(|&&p| status_field(p, "Seccomp:").as_deref() == Some("2"))
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no armed command child");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_command_comes_with_the_go_and_runs_with_the_given_stdio_env_and_exit_code() {
    let policy = Policy::default();
    let armed = Spawn::armed(&policy).arm().unwrap();
    let (mut out_r, out_w) = UnixStream::pair().unwrap();
    let (in_r, mut in_w) = UnixStream::pair().unwrap();
    in_w.write_all(b"from stdin\n").unwrap();
    drop(in_w);
    let command = ArmedCommand::new(
        &sh("read l; echo \"$l|$GREETING|$0\"; exit 7"),
        &env(&[("GREETING", "hello there"), ("PATH", "/usr/bin:/bin")]),
    )
    .unwrap();
    let mut running = armed
        .release(
            Stdio {
                stdin: Some(OwnedFd::from(in_r)),
                stdout: Some(OwnedFd::from(out_w)),
                stderr: None,
            },
            &command,
        )
        .unwrap();
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no outcome")
    };
    assert_eq!(outcome.status, Status::Exited(7));
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    assert_eq!(out, "from stdin|hello there|sh\n");
}

#[test]
fn it_is_confined_before_the_go_and_runs_nothing_until_then() {
    let policy = Policy::default();
    let armed = Spawn::armed(&policy).arm().unwrap();
    let child = waiting_child(armed.pid());
    assert_eq!(status_field(child, "NoNewPrivs:").as_deref(), Some("1"));
    assert_eq!(
        status_field(child, "CapEff:").as_deref(),
        Some("0000000000000000")
    );
    // Still a copy of its init: nothing has been executed.
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    assert_eq!(exe(child), exe(armed.pid()));
    let init = armed.pid();
    drop(armed);
    // Dropping it killed the whole sandbox: the child dies, and once the init (dying too)
    // has reaped it, the init has no child left. Both are waited for: the child is a
    // zombie a moment before the init reaps it (CI saw the init still list it).
    let deadline = Instant::now() + Duration::from_secs(20);
    let alive = || {
        std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    while alive() || !children_of(init).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the armed child outlived its sandbox (alive: {}, the init's children: {:?})",
            alive(),
            children_of(init)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_missing_program_is_reported_as_a_direct_start_reports_it() {
    let policy = Policy::default();
    let argv: Vec<OsString> = vec!["no-such-program-lockbox".into()];
    let direct = lockbox_confine::run(&policy, &argv).unwrap();
    let armed = Spawn::armed(&policy).arm().unwrap();
    let command = ArmedCommand::new(&argv, &env(&[("PATH", "/usr/bin:/bin")])).unwrap();
    let mut running = armed.release(Stdio::default(), &command).unwrap();
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no outcome")
    };
    assert_eq!(outcome.status, Status::ExecFailed(libc::ENOENT));
    assert_eq!(outcome.status, direct.status);
    assert_eq!(outcome.exit_code(), direct.exit_code());
}

#[test]
fn an_unsealed_command_is_refused_inside() {
    let policy = Policy::default();
    let armed = Spawn::armed(&policy).arm().unwrap();
    // A memfd someone could still write to after the sandbox has read it.
    let fd = rustix::fs::memfd_create(c"unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let mut file = std::fs::File::from(fd);
    let good = ArmedCommand::new(&["true".into()], &[]).unwrap();
    let mut bytes = Vec::new();
    std::fs::File::from(good.fd().try_clone_to_owned().unwrap())
        .read_to_end(&mut bytes)
        .unwrap();
    file.write_all(&bytes).unwrap();
    let unsealed = ArmedCommand::from_fd(OwnedFd::from(file), "true".into());
    let mut running = armed.release(Stdio::default(), &unsealed).unwrap();
    // Refused where the exec would be: the caller's own protocol error, never a run.
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no outcome")
    };
    assert_eq!(outcome.status, Status::ExecFailed(libc::EPERM));
}

#[test]
fn policies_with_per_run_setup_are_not_armed() {
    let policy = Policy {
        pass_fds: vec![0],
        ..Policy::default()
    };
    assert!(lockbox_confine::armed_unsupported(&policy).is_some());
    assert!(Spawn::armed(&policy).arm().is_err());
    assert!(Spawn::command(&Policy::default(), &["true".into()])
        .arm()
        .is_err());
}

#[test]
fn a_command_larger_than_its_room_is_refused_inside() {
    use rustix::fs::{MemfdFlags, SealFlags};
    let policy = Policy::default();
    let armed = Spawn::armed(&policy).arm().unwrap();
    // Sealed, but more bytes than any command `ArmedCommand::new` makes.
    let fd = rustix::fs::memfd_create(c"large", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .unwrap();
    let file = std::fs::File::from(fd);
    // `ArmedCommand`'s bound: 4 MiB.
    file.set_len((4 << 20) + 1).unwrap();
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )
    .unwrap();
    let large = ArmedCommand::from_fd(OwnedFd::from(file), "true".into());
    let mut running = armed.release(Stdio::default(), &large).unwrap();
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no outcome")
    };
    assert_eq!(outcome.status, Status::ExecFailed(libc::E2BIG));
}
