//! Gated sandboxes ([`lockbox_confine::Spawn::gated`]): set up ahead, their command runs only
//! once released, and their copy-on-write view shows the layers as they are at the release.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{Spawn, Stdio, Waited};
use lockbox_policy::{Overlay, OverlayUpper, Policy};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sh(script: &str) -> Vec<std::ffi::OsString> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// A view of `work` with `lower` on top of it and a fresh upper in `dir`.
fn view(dir: &Path, work: &Path, lower: &Path) -> Policy {
    let mut policy = Policy::default();
    std::fs::create_dir_all(dir.join("upper")).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    policy.fs.overlays.push(Overlay {
        target: work.to_owned(),
        lowers: vec![lower.to_owned(), work.to_owned()],
        upper: Some(OverlayUpper {
            upper: dir.join("upper"),
            work: dir.join("work"),
            max_size: None,
        }),
        writable: None,
    });
    policy
}

fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (work, lower) = (tmp.path().join("work"), tmp.path().join("lower"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&lower).unwrap();
    (tmp, work, lower)
}

/// The process exists and is not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[test]
fn the_command_runs_only_after_release_and_sees_the_layers_as_released() {
    let (tmp, work, lower) = dirs();
    let policy = view(&tmp.path().join("layer"), &work, &lower);
    let (mut out_r, out_w) = UnixStream::pair().unwrap();
    let stdio = Stdio {
        stdin: None,
        stdout: Some(OwnedFd::from(out_w)),
        stderr: None,
    };
    let w = work.display();
    let gated = Spawn::command(
        &policy,
        &sh(&format!("cat {w}/late.txt; read line; echo \"$line\"")),
    )
    .stdio(stdio)
    .gated()
    .unwrap();
    // Written into the lower layer after the spawn, as a previous pipeline stage would.
    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(lower.join("late.txt"), "written after the spawn\n").unwrap();
    let (stdin_r, stdin_w) = UnixStream::pair().unwrap();
    {
        use std::io::Write;
        let mut w = stdin_w;
        w.write_all(b"stdin given at the release\n").unwrap();
    }
    let mut running = gated
        .release(Stdio {
            stdin: Some(OwnedFd::from(stdin_r)),
            ..Stdio::default()
        })
        .unwrap();
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no exit")
    };
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(out, "written after the spawn\nstdin given at the release\n");
}

#[test]
fn an_unreleased_sandbox_runs_nothing_and_dropping_it_kills_it() {
    let (tmp, work, lower) = dirs();
    let policy = view(&tmp.path().join("layer"), &work, &lower);
    let w = work.display();
    let script = format!("echo ran > {w}/ran.txt");
    let gated = Spawn::command(&policy, &sh(&script)).gated().unwrap();
    let pid = gated.pid();
    std::thread::sleep(Duration::from_millis(200));
    assert!(alive(pid), "the init waits at its gate");
    assert!(!tmp.path().join("layer/upper/ran.txt").exists());
    drop(gated);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "the init outlived its Gated");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!tmp.path().join("layer/upper/ran.txt").exists());
}

#[test]
fn the_sandbox_holds_none_of_the_callers_descriptors_while_it_waits() {
    // A pipe end the caller still uses elsewhere must reach EOF when the caller closes it,
    // although a gated sandbox was started while it was open.
    let (mut r, w) = UnixStream::pair().unwrap();
    let gated = Spawn::command(&Policy::default(), &sh("true"))
        .gated()
        .unwrap();
    drop(w);
    let mut buf = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(r.read_to_end(&mut buf).map(|_| ())).unwrap());
    let read = rx.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(read, Ok(Ok(()))),
        "no EOF while the gated sandbox waits: {read:?}"
    );
    let mut running = gated.release(Stdio::default()).unwrap();
    assert!(matches!(running.wait(None, None).unwrap(), Waited::Exited(o) if o.exit_code() == 0));
}

#[test]
fn a_view_that_cannot_be_mounted_at_the_release_is_a_setup_error() {
    let (tmp, work, lower) = dirs();
    let layer = tmp.path().join("layer");
    let policy = view(&layer, &work, &lower);
    let gated = Spawn::command(&policy, &sh("true")).gated().unwrap();
    // The layer directory was captured ahead; its upper vanishing is only noticed when the
    // view is mounted, after the release.
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_dir(layer.join("upper")).unwrap();
    let mut running = gated.release(Stdio::default()).unwrap();
    let err = running.wait(None, None).unwrap_err().to_string();
    assert!(err.contains("overlay"), "{err}");
}

#[test]
fn a_view_whose_path_sorts_before_proc_is_gated_too() {
    // Only the views wait for the go; /proc and /dev must be mounted before it (a new proc
    // mount needs the old root still attached), wherever the view lies.
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let (work, lower) = (tmp.path().join("work"), tmp.path().join("lower"));
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&lower).unwrap();
    std::fs::write(lower.join("a.txt"), "from the lower layer\n").unwrap();
    let policy = view(&tmp.path().join("layer"), &work, &lower);
    let (mut out_r, out_w) = UnixStream::pair().unwrap();
    let stdio = Stdio {
        stdout: Some(OwnedFd::from(out_w)),
        ..Stdio::default()
    };
    let script = format!("cat {}/a.txt && test -r /proc/self/status", work.display());
    let gated = Spawn::command(&policy, &sh(&script))
        .stdio(stdio)
        .gated()
        .unwrap();
    let mut running = gated.release(Stdio::default()).unwrap();
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no exit")
    };
    assert_eq!(outcome.exit_code(), 0, "{out}");
    assert_eq!(out, "from the lower layer\n");
}
