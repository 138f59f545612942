//! Per-sandbox stdio ([`lockbox_confine::Spawn::stdio`]): the sandbox reads and writes the
//! descriptors it is given, not the caller's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{Spawn, Stdio, Waited};
use lockbox_policy::Policy;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

fn sh(script: &str) -> Vec<std::ffi::OsString> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// A one-way channel (a socket pair: `std::io::pipe` is newer than the MSRV).
fn pipe() -> (UnixStream, UnixStream) {
    UnixStream::pair().unwrap()
}

fn wait_code(mut running: lockbox_confine::Running) -> i32 {
    match running.wait(None, None).unwrap() {
        Waited::Exited(o) => o.exit_code(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn stdin_stdout_and_stderr_are_the_descriptors_given() {
    let (in_r, mut in_w) = pipe();
    let (mut out_r, out_w) = pipe();
    let (mut err_r, err_w) = pipe();
    let stdio = Stdio {
        stdin: Some(OwnedFd::from(in_r)),
        stdout: Some(OwnedFd::from(out_w)),
        stderr: Some(OwnedFd::from(err_w)),
    };
    let running = Spawn::command(&Policy::default(), &sh("tr a-z A-Z; echo oops >&2; exit 3"))
        .stdio(stdio)
        .start()
        .unwrap();
    in_w.write_all(b"hello pipes\n").unwrap();
    drop(in_w);
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    let mut err = String::new();
    err_r.read_to_string(&mut err).unwrap();
    assert_eq!(wait_code(running), 3);
    assert_eq!(out, "HELLO PIPES\n");
    assert_eq!(err, "oops\n");
}

#[test]
fn a_file_can_be_stdin_and_output_reaches_eof_when_the_sandbox_ends() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::write(&input, b"line1\nline2\n").unwrap();
    let (mut out_r, out_w) = pipe();
    let stdio = Stdio {
        stdin: Some(OwnedFd::from(std::fs::File::open(&input).unwrap())),
        stdout: Some(OwnedFd::from(out_w)),
        stderr: None,
    };
    let running = Spawn::command(&Policy::default(), &sh("wc -l"))
        .stdio(stdio)
        .start()
        .unwrap();
    let mut out = String::new();
    // EOF only arrives once no copy of the write end is left: the caller's was closed by
    // the spawn, the sandbox's when it ends.
    out_r.read_to_string(&mut out).unwrap();
    assert_eq!(wait_code(running), 0);
    assert_eq!(out.trim(), "2");
}

#[test]
fn spawn_without_stdio_still_inherits_the_callers() {
    let running = Spawn::command(&Policy::default(), &sh("exit 0"))
        .start()
        .unwrap();
    assert_eq!(wait_code(running), 0);
}

/// A pseudo-terminal pair: (master, slave).
fn pty() -> (OwnedFd, OwnedFd) {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    (master, slave)
}

/// What the sandbox wrote on the terminal, up to `end`.
fn read_terminal(master: OwnedFd, end: &str) -> String {
    let mut master = std::fs::File::from(master);
    let mut out = String::new();
    let mut buf = [0u8; 256];
    while !out.contains(end) {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    out
}

#[test]
fn the_terminal_is_named_for_a_command_on_it_but_never_for_an_agents_children() {
    const PROBE: &str = "if test -c /dev/console; then echo named.; else echo unnamed.; fi";
    // The command has the terminal as its stdout: /dev/console names it.
    let (master, slave) = pty();
    let stdio = Stdio {
        stdin: None,
        stdout: Some(slave),
        stderr: None,
    };
    let running = Spawn::command(&Policy::default(), &sh(PROBE))
        .stdio(stdio)
        .start()
        .unwrap();
    assert_eq!(read_terminal(master, "."), "named.\r\n");
    assert_eq!(wait_code(running), 0);
    // An agent (the runtime's, whose children get pipes) on the same kind of terminal: the
    // name would hand its children a terminal they do not hold.
    let (master, slave) = pty();
    let stdio = Stdio {
        stdin: None,
        stdout: Some(slave),
        stderr: None,
    };
    let running = lockbox_confine::Spawn::agent(
        &Policy::default(),
        std::path::Path::new("/bin/sh"),
        &["-c".into(), PROBE.into()],
    )
    .stdio(stdio)
    .start()
    .unwrap();
    assert_eq!(read_terminal(master, "."), "unnamed.\r\n");
    assert_eq!(wait_code(running), 0);
}
