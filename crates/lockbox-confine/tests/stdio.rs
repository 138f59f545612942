//! Per-sandbox stdio ([`lockbox_confine::spawn_with`]): the sandbox reads and writes the
//! descriptors it is given, not the caller's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{spawn_with, Stdio, Waited};
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
    let running = spawn_with(
        &Policy::default(),
        &sh("tr a-z A-Z; echo oops >&2; exit 3"),
        stdio,
    )
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
    let running = spawn_with(&Policy::default(), &sh("wc -l"), stdio).unwrap();
    let mut out = String::new();
    // EOF only arrives once no copy of the write end is left: the caller's was closed by
    // spawn_with, the sandbox's when it ends.
    out_r.read_to_string(&mut out).unwrap();
    assert_eq!(wait_code(running), 0);
    assert_eq!(out.trim(), "2");
}

#[test]
fn spawn_without_stdio_still_inherits_the_callers() {
    let running = spawn_with(&Policy::default(), &sh("exit 0"), Stdio::default()).unwrap();
    assert_eq!(wait_code(running), 0);
}
