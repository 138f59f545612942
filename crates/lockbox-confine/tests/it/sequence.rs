//! Sequence sandboxes ([`lockbox_confine::Spawn::sequence`]): several commands, one after
//! another, in one sandbox, on the same views, with nothing of the previous command left:
//! its processes, scratch files and IPC objects are gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{Gated, Outcome, Spawn, Stdio, StopReason, Waited};
use lockbox_policy::{Overlay, OverlayUpper, Policy};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A workdir `work` and one layer (`layer/upper`, `layer/work`) for a view of it.
struct View {
    _tmp: tempfile::TempDir,
    work: PathBuf,
    layer: PathBuf,
}

fn view() -> View {
    view_in(&std::env::temp_dir())
}

/// A [`view`] whose workdir lies below `base`.
fn view_in(base: &Path) -> View {
    let tmp = tempfile::tempdir_in(base).unwrap();
    let work = tmp.path().join("work");
    let layer = tmp.path().join("layer");
    for d in [&work, &layer.join("upper"), &layer.join("work")] {
        std::fs::create_dir_all(d).unwrap();
    }
    View {
        _tmp: tmp,
        work,
        layer,
    }
}

impl View {
    /// The default policy with this view, writes limited to `writable` if given.
    fn policy(&self, writable: Option<&[&str]>) -> Policy {
        let mut policy = Policy::default();
        policy.fs.overlays.push(Overlay {
            target: self.work.clone(),
            lowers: vec![self.work.clone()],
            upper: Some(OverlayUpper {
                upper: self.upper(),
                work: self.layer.join("work"),
                max_size: None,
            }),
            writable: writable.map(|w| w.iter().map(|p| self.work.join(p)).collect()),
        });
        policy
    }

    /// `sh -c` running `script` in the view.
    fn sh(&self, script: &str) -> Vec<OsString> {
        let script = format!("cd '{}' && {script}", self.work.display());
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn upper(&self) -> PathBuf {
        self.layer.join("upper")
    }
}

/// Releases `gated` with `input` on stdin, returns its outcome and stdout.
fn run_step(gated: Gated, input: &[u8]) -> (Outcome, String, lockbox_confine::Running) {
    let (in_r, mut in_w) = UnixStream::pair().unwrap();
    let (mut out_r, out_w) = UnixStream::pair().unwrap();
    in_w.write_all(input).unwrap();
    drop(in_w);
    let mut running = gated
        .release(Stdio {
            stdin: Some(OwnedFd::from(in_r)),
            stdout: Some(OwnedFd::from(out_w)),
            stderr: None,
        })
        .unwrap();
    let mut out = String::new();
    out_r.read_to_string(&mut out).unwrap();
    let Waited::Exited(outcome) = running.wait(None, None).unwrap() else {
        panic!("no exit")
    };
    (outcome, out, running)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn each_command_reads_what_the_commands_before_it_wrote() {
    let v = view();
    std::fs::write(v.work.join("base.txt"), "base\n").unwrap();
    let commands = [
        v.sh("echo one > a.txt && cat"),
        v.sh("cat a.txt > b.txt && echo two >> b.txt && cat"),
        v.sh("cat base.txt a.txt b.txt && rm base.txt"),
    ];
    let gated = Spawn::sequence(&v.policy(None), &commands).gated().unwrap();
    let (o1, out1, running) = run_step(gated, b"first stdin\n");
    assert_eq!((o1.exit_code(), out1.as_str()), (0, "first stdin\n"));
    let (o2, out2, running) = run_step(running.next().unwrap(), b"second stdin\n");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "second stdin\n"));
    let (o3, out3, running) = run_step(running.next().unwrap(), b"");
    assert_eq!(o3.exit_code(), 0, "{out3}");
    assert_eq!(out3, "base\none\none\ntwo\n");
    assert!(running.next().is_none(), "three commands only");
    // One upper layer holds what all of them did, the deletion's whiteout included.
    assert_eq!(names(&v.upper()), ["a.txt", "b.txt", "base.txt"]);
    assert!(std::fs::symlink_metadata(v.upper().join("base.txt"))
        .unwrap()
        .file_type()
        .is_char_device());
    // The real directory is untouched.
    assert_eq!(names(&v.work), ["base.txt"]);
}

#[test]
fn later_commands_are_confined_like_the_first() {
    let v = view();
    std::fs::create_dir(v.work.join("out")).unwrap();
    // Landlock limits writes to out/; seccomp, no_new_privs and no capabilities.
    let script = |n: u32| {
        v.sh(&format!(
            "echo {n} > out/{n}.txt; echo {n} > top{n}.txt 2>/dev/null && echo wrote-top; \
             grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status"
        ))
    };
    let gated = Spawn::sequence(&v.policy(Some(&["out"])), &[script(1), script(2)])
        .gated()
        .unwrap();
    let (o1, out1, running) = run_step(gated, b"");
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!((o1.exit_code(), o2.exit_code()), (0, 0), "{out1}{out2}");
    assert!(!out2.contains("wrote-top"), "{out2}");
    assert_eq!(out1, out2, "the second command is confined otherwise");
    assert!(
        out2.contains("Seccomp:\t2") && out2.contains("NoNewPrivs:\t1"),
        "{out2}"
    );
    assert!(out2.contains("CapEff:\t0000000000000000"), "{out2}");
    assert_eq!(names(&v.upper().join("out")), ["1.txt", "2.txt"]);
}

#[test]
fn nothing_of_a_command_is_left_for_the_next() {
    // Outside /tmp: a view inside the scratch /tmp keeps it (see below).
    let v = view_in(Path::new("/var/tmp"));
    // The first command leaves a daemon, scratch files and a message queue behind.
    // Shell builtins only where processes are listed, so that none is ours.
    let list = "for f in /proc/[0-9]*/comm; do read c < $f && echo $c; done";
    // It lists them once the daemon is past its fork (a forked shell is `sh` until it
    // executes `setsid`): waits for that, with builtins, a bounded number of looks.
    let started = "i=0; until [ -n \"$up\" ] || [ $i -ge 100000 ]; do i=$((i+1)); \
                   for f in /proc/[0-9]*/comm; do read c < $f; \
                   case $c in sleep|setsid) up=1;; esac; done; done";
    let first = format!(
        "setsid sleep 600 >/dev/null 2>&1 < /dev/null & \
         echo left > /tmp/left && echo left > /dev/shm/left && ipcmk -Q >/dev/null && \
         {started}; {list}"
    );
    let second = format!(
        "{list}; test -e /tmp/left && echo tmp-left; test -e /dev/shm/left && echo shm-left; \
         echo \"queues=$(ipcs -q | grep -c '^0x')\""
    );
    let gated = Spawn::sequence(&v.policy(None), &[v.sh(&first), v.sh(&second)])
        .gated()
        .unwrap();
    let (o1, out1, running) = run_step(gated, b"");
    assert_eq!(o1.exit_code(), 0, "{out1}");
    // The daemon is `setsid` until it has executed `sleep`.
    let daemon = |l: &str| l == "sleep" || l == "setsid";
    assert!(out1.lines().any(daemon), "the daemon ran: {out1}");
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!(o2.exit_code(), 0, "{out2}");
    assert!(
        !out2.lines().any(daemon),
        "the daemon outlived its command: {out2}"
    );
    assert!(
        !out2.contains("-left"),
        "scratch files outlived their command: {out2}"
    );
    assert!(out2.contains("queues=0\n"), "{out2}");
}

#[test]
fn a_view_inside_the_scratch_tmp_keeps_it_between_commands() {
    // Renewing /tmp would take the view below it along: the commands share /tmp (as they
    // would with a grant below it), while /dev/shm is renewed.
    let v = view_in(Path::new("/tmp"));
    let gated = Spawn::sequence(
        &v.policy(None),
        &[
            v.sh("echo left > /tmp/left && echo left > /dev/shm/left"),
            v.sh("cat /tmp/left; test -e /dev/shm/left && echo shm-left; echo ok > ok.txt"),
        ],
    )
    .gated()
    .unwrap();
    let (o1, _, running) = run_step(gated, b"");
    assert_eq!(o1.exit_code(), 0);
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "left\n"));
    assert_eq!(names(&v.upper()), ["ok.txt"]);
}

#[test]
fn a_failed_command_ends_only_itself() {
    let v = view();
    let gated = Spawn::sequence(
        &v.policy(None),
        &[v.sh("echo partial > p.txt; exit 3"), v.sh("cat p.txt")],
    )
    .gated()
    .unwrap();
    let (o1, _, running) = run_step(gated, b"");
    assert_eq!(o1.exit_code(), 3);
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "partial\n"));
}

#[test]
fn a_stopped_command_is_killed_and_the_next_one_still_runs() {
    let v = view();
    let gated = Spawn::sequence(&v.policy(None), &[v.sh("sleep 600"), v.sh("echo after")])
        .gated()
        .unwrap();
    let mut running = gated.release(Stdio::default()).unwrap();
    assert!(matches!(
        running.wait(Some(Instant::now() + Duration::from_millis(200)), None),
        Ok(Waited::Deadline)
    ));
    // SIGTERM ends the command within the grace: the init lives on.
    let outcome = running
        .stop(Duration::from_secs(30), StopReason::Timeout)
        .unwrap();
    assert!(outcome.timed_out);
    assert_eq!(outcome.exit_code(), 124);
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "after\n"));
}

#[test]
fn dropping_the_sandbox_between_commands_kills_it() {
    let v = view();
    let gated = Spawn::sequence(&v.policy(None), &[v.sh("true"), v.sh("echo ran > ran.txt")])
        .gated()
        .unwrap();
    let pid = gated.pid();
    let (_, _, running) = run_step(gated, b"");
    let next = running.next().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    drop(next);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(Instant::now() < deadline, "the init outlived its Gated");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(names(&v.upper()).is_empty(), "the second command never ran");
}

#[test]
fn several_commands_with_a_network_list_or_a_bounded_upper_are_refused() {
    let v = view();
    let mut policy = v.policy(None);
    policy.net = lockbox_policy::Net::Allow(vec!["127.0.0.1:80".parse().unwrap()]);
    let err = Spawn::sequence(&policy, &[v.sh("true"), v.sh("true")])
        .gated()
        .unwrap_err();
    assert_eq!(err.code(), "SEQUENCE_UNSUPPORTED", "{err}");
    assert!(err.to_string().contains("network"), "{err}");
    let mut policy = v.policy(None);
    if let Some(upper) = policy.fs.overlays[0].upper.as_mut() {
        upper.max_size = Some(lockbox_policy::ByteSize(1 << 20));
    }
    let err = Spawn::sequence(&policy, &[v.sh("true"), v.sh("true")])
        .gated()
        .unwrap_err();
    assert!(err.to_string().contains("bounded upper"), "{err}");
}

#[test]
fn a_command_that_outlives_its_grace_ends_the_sandbox() {
    let v = view();
    // Children inherit the ignored SIGTERM: only the SIGKILL of the whole sandbox ends it.
    let gated = Spawn::sequence(
        &v.policy(None),
        &[
            v.sh("trap '' TERM; sleep 600"),
            v.sh("echo never > never.txt"),
        ],
    )
    .gated()
    .unwrap();
    let mut running = gated.release(Stdio::default()).unwrap();
    let outcome = running
        .stop(Duration::from_millis(100), StopReason::Timeout)
        .unwrap();
    assert_eq!(outcome.exit_code(), 124);
    assert!(running.next().is_none(), "the sandbox is gone");
    assert!(names(&v.upper()).is_empty());
}

#[test]
fn one_command_may_have_a_network_list() {
    // A sequence of one is a gated sandbox: what it cannot share, it need not.
    let v = view();
    let mut policy = v.policy(None);
    policy.net = lockbox_policy::Net::Allow(vec!["127.0.0.1:9".parse().unwrap()]);
    let gated = Spawn::sequence(&policy, &[v.sh("echo alone")])
        .gated()
        .unwrap();
    let (outcome, out, _) = run_step(gated, b"");
    assert_eq!((outcome.exit_code(), out.as_str()), (0, "alone\n"));
}
