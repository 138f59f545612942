//! Sequence sandboxes ([`lockbox_confine::spawn_sequence`]): several commands, one after
//! another, in one sandbox, each on views of its own and with nothing of the previous
//! command left: its processes, scratch files and IPC objects are gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_confine::{spawn_sequence, Gated, Outcome, SequenceStep, Stdio, Waited};
use lockbox_policy::{Overlay, OverlayUpper, Policy};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sh(script: &str) -> Vec<std::ffi::OsString> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// Three layers over `work`: step n writes layer n and reads layers n-1..1 over `work`
/// (a pipeline's read-committed chain).
struct Chain {
    _tmp: tempfile::TempDir,
    work: PathBuf,
    layers: Vec<PathBuf>,
}

fn chain(n: usize) -> Chain {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let layers = (0..n)
        .map(|i| {
            let layer = tmp.path().join(format!("layer{i}"));
            std::fs::create_dir_all(layer.join("upper")).unwrap();
            std::fs::create_dir_all(layer.join("work")).unwrap();
            layer
        })
        .collect();
    Chain {
        _tmp: tmp,
        work,
        layers,
    }
}

impl Chain {
    fn step(&self, i: usize, script: &str) -> SequenceStep {
        let mut lowers: Vec<PathBuf> = (0..i).rev().map(|j| self.layers[j].join("upper")).collect();
        lowers.push(self.work.clone());
        SequenceStep {
            argv: sh(&format!("cd '{}' && {script}", self.work.display())),
            overlays: vec![Overlay {
                target: self.work.clone(),
                lowers,
                upper: Some(OverlayUpper {
                    upper: self.layers[i].join("upper"),
                    work: self.layers[i].join("work"),
                    max_size: None,
                }),
                writable: None,
            }],
        }
    }

    fn upper(&self, i: usize) -> PathBuf {
        self.layers[i].join("upper")
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
fn each_command_reads_the_layers_before_it_and_writes_only_its_own() {
    let c = chain(3);
    std::fs::write(c.work.join("base.txt"), "base\n").unwrap();
    let steps = [
        c.step(0, "echo one > a.txt && cat"),
        c.step(1, "cat a.txt > b.txt && echo two >> b.txt && cat"),
        c.step(2, "cat base.txt a.txt b.txt && rm base.txt"),
    ];
    let gated = spawn_sequence(&Policy::default(), &steps).unwrap();
    let (o1, out1, running) = run_step(gated, b"first stdin\n");
    assert_eq!((o1.exit_code(), out1.as_str()), (0, "first stdin\n"));
    let (o2, out2, running) = run_step(running.next().unwrap(), b"second stdin\n");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "second stdin\n"));
    let (o3, out3, running) = run_step(running.next().unwrap(), b"");
    assert_eq!(o3.exit_code(), 0, "{out3}");
    assert_eq!(out3, "base\none\none\ntwo\n");
    assert!(running.next().is_none(), "three steps only");
    assert_eq!(names(&c.upper(0)), ["a.txt"]);
    assert_eq!(names(&c.upper(1)), ["b.txt"]);
    assert_eq!(names(&c.upper(2)), ["base.txt"], "the deletion's whiteout");
    // The real directory is untouched.
    assert_eq!(names(&c.work), ["base.txt"]);
}

#[test]
fn nothing_of_a_command_is_left_for_the_next() {
    let c = chain(2);
    // The first command leaves a daemon, scratch files and a message queue behind.
    // Shell builtins only where processes are listed, so that none is ours.
    let list = "for f in /proc/[0-9]*/comm; do read c < $f && echo $c; done";
    let first = format!(
        "setsid sleep 600 >/dev/null 2>&1 < /dev/null & \
         echo left > /tmp/left && echo left > /dev/shm/left && ipcmk -Q >/dev/null && {list}"
    );
    let second = format!(
        "{list}; test -e /tmp/left && echo tmp-left; test -e /dev/shm/left && echo shm-left; \
         echo \"queues=$(ipcs -q | grep -c '^0x')\""
    );
    let gated =
        spawn_sequence(&Policy::default(), &[c.step(0, &first), c.step(1, &second)]).unwrap();
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
fn a_failed_command_ends_only_itself() {
    let c = chain(2);
    let gated = spawn_sequence(
        &Policy::default(),
        &[
            c.step(0, "echo partial > p.txt; exit 3"),
            c.step(1, "cat p.txt"),
        ],
    )
    .unwrap();
    let (o1, _, running) = run_step(gated, b"");
    assert_eq!(o1.exit_code(), 3);
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "partial\n"));
}

#[test]
fn a_stopped_command_is_killed_and_the_next_one_still_runs() {
    let c = chain(2);
    let gated = spawn_sequence(
        &Policy::default(),
        &[c.step(0, "sleep 600"), c.step(1, "echo after")],
    )
    .unwrap();
    let mut running = gated.release(Stdio::default()).unwrap();
    assert!(matches!(
        running.wait(Some(Instant::now() + Duration::from_millis(200)), None),
        Ok(Waited::Deadline)
    ));
    // SIGTERM ends the command within the grace: the init lives on.
    let outcome = running.stop(Duration::from_secs(30), true).unwrap();
    assert!(outcome.timed_out);
    assert_eq!(outcome.exit_code(), 124);
    let (o2, out2, _) = run_step(running.next().unwrap(), b"");
    assert_eq!((o2.exit_code(), out2.as_str()), (0, "after\n"));
}

#[test]
fn dropping_the_sandbox_between_commands_kills_it() {
    let c = chain(2);
    let gated = spawn_sequence(
        &Policy::default(),
        &[c.step(0, "true"), c.step(1, "echo ran > ran.txt")],
    )
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
    assert!(
        names(&c.upper(1)).is_empty(),
        "the second command never ran"
    );
}

#[test]
fn a_later_view_that_cannot_be_mounted_fails_that_command_only() {
    let c = chain(2);
    let gated = spawn_sequence(
        &Policy::default(),
        &[c.step(0, "echo one"), c.step(1, "echo two")],
    )
    .unwrap();
    let (o1, out1, running) = run_step(gated, b"");
    assert_eq!((o1.exit_code(), out1.as_str()), (0, "one\n"));
    // The second layer vanishes before its command mounts it.
    std::fs::remove_dir(c.upper(1)).unwrap();
    let mut running = running.next().unwrap().release(Stdio::default()).unwrap();
    let err = running.wait(None, None).unwrap_err().to_string();
    assert!(err.contains("overlay"), "{err}");
}

#[test]
fn commands_with_other_targets_or_a_network_list_are_refused() {
    let c = chain(2);
    let d = chain(1);
    let mut other = d.step(0, "true");
    other.overlays[0].upper = c.step(1, "true").overlays[0].upper.clone();
    let err = spawn_sequence(&Policy::default(), &[c.step(0, "true"), other]).unwrap_err();
    assert_eq!(err.code(), "SEQUENCE_UNSUPPORTED", "{err}");
    let policy = Policy {
        net: lockbox_policy::Net::Allow(vec!["127.0.0.1:80".parse().unwrap()]),
        ..Policy::default()
    };
    let err = spawn_sequence(&policy, &[c.step(0, "true"), c.step(1, "true")]).unwrap_err();
    assert!(err.to_string().contains("network"), "{err}");
}

#[test]
fn a_command_that_outlives_its_grace_ends_the_sandbox() {
    let c = chain(2);
    // Children inherit the ignored SIGTERM: only the SIGKILL of the whole sandbox ends it.
    let gated = spawn_sequence(
        &Policy::default(),
        &[
            c.step(0, "trap '' TERM; sleep 600"),
            c.step(1, "echo never > never.txt"),
        ],
    )
    .unwrap();
    let mut running = gated.release(Stdio::default()).unwrap();
    let outcome = running.stop(Duration::from_millis(100), true).unwrap();
    assert_eq!(outcome.exit_code(), 124);
    assert!(running.next().is_none(), "the sandbox is gone");
    assert!(names(&c.upper(1)).is_empty());
}

#[test]
fn one_command_may_have_a_network_list() {
    // A sequence of one is a gated sandbox: what it cannot share, it need not.
    let c = chain(1);
    let policy = Policy {
        net: lockbox_policy::Net::Allow(vec!["127.0.0.1:9".parse().unwrap()]),
        ..Policy::default()
    };
    let gated = spawn_sequence(&policy, &[c.step(0, "echo alone")]).unwrap();
    let (outcome, out, _) = run_step(gated, b"");
    assert_eq!((outcome.exit_code(), out.as_str()), (0, "alone\n"));
}
