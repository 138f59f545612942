//! End-to-end tests of `lockbox run --workdir` and `lockbox branch` on the real kernel, as
//! the current user and (when root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
#[path = "../../../lockbox-cow/tests/it/common/script.rs"]
mod script;

use common::{
    command_as, give, scratch, snapshot, text, users, wait_for_file, User, EQUAL_BYTES_RACER,
};
use proptest::prelude::*;
use std::path::Path;
use std::process::Output;

/// A workdir and a state directory owned by `user`.
struct Setup {
    _tmp: crate::common::Scratch,
    work: std::path::PathBuf,
    state: std::path::PathBuf,
    user: User,
}

impl Setup {
    fn new(user: User) -> Setup {
        let tmp = scratch();
        let (work, state) = (tmp.path().join("work"), tmp.path().join("state"));
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("a.txt"), "original\n").unwrap();
        std::fs::write(work.join("gone.txt"), "delete me\n").unwrap();
        give(tmp.path(), user);
        Setup {
            _tmp: tmp,
            work,
            state,
            user,
        }
    }

    fn run(&self, extra: &[&str], script: &str) -> Output {
        let mut cmd = command_as(self.user);
        cmd.arg("run")
            .args(["--workdir", self.work.to_str().unwrap()])
            .args(["--state-dir", self.state.to_str().unwrap()])
            .args(extra)
            .args(["--", "sh", "-c", script])
            .current_dir("/");
        cmd.output().unwrap()
    }

    fn branch(&self, args: &[&str]) -> Output {
        let mut cmd = command_as(self.user);
        cmd.arg("branch")
            .args(args)
            .args(["--state-dir", self.state.to_str().unwrap()]);
        cmd.output().unwrap()
    }

    fn branch_ids(&self) -> Vec<String> {
        let out = self.branch(&["list", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

const EDIT: &str = "echo changed > a.txt && rm gone.txt && mkdir -p sub && echo new > sub/new.txt";

#[test]
fn success_commits_and_the_cwd_is_the_workdir() {
    for user in users() {
        let s = Setup::new(user);
        let out = s.run(&[], &format!("pwd && {EDIT}"));
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            s.work.to_str().unwrap()
        );
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "changed\n"
        );
        assert!(!s.work.join("gone.txt").exists());
        assert_eq!(
            std::fs::read_to_string(s.work.join("sub/new.txt")).unwrap(),
            "new\n"
        );
        assert!(s.branch_ids().is_empty(), "branch left behind");
    }
}

#[test]
fn relative_state_and_work_directories_are_taken_from_the_cwd() {
    for user in users() {
        let s = Setup::new(user);
        let parent = s.work.parent().unwrap();
        let out = common::lockbox(
            user,
            parent,
            &[
                "run",
                "--workdir",
                "work",
                "--state-dir",
                "state",
                "--on-exit",
                "keep",
                "--",
                "sh",
                "-c",
                "echo changed > a.txt",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "original\n"
        );
        assert_eq!(
            s.branch_ids().len(),
            1,
            "{user:?}: the kept branch is in ./state"
        );
    }
}

#[test]
fn workdir_through_a_symlinked_parent_keeps_its_path_and_commits_to_the_real_directory() {
    for user in users() {
        let s = Setup::new(user);
        let parent = s.work.parent().unwrap();
        let link = parent.join("link");
        std::os::unix::fs::symlink(parent, &link).unwrap();
        let given = link.join("work");
        let script = format!(
            "pwd && echo x > {0}/x && echo y > {1}/y && cat {0}/a.txt",
            given.display(),
            s.work.display()
        );
        for (workdir, cwd, pwd) in [
            // As given on the command line...
            (given.to_str().unwrap(), Path::new("/"), "/"),
            // ... and as `.` in a shell that did `cd` through the link.
            (".", s.work.as_path(), given.to_str().unwrap()),
        ] {
            let out = command_as(user)
                .args(["run", "--workdir", workdir])
                .args(["--state-dir", s.state.to_str().unwrap()])
                .args(["--", "sh", "-c", &script])
                .current_dir(cwd)
                .env("PWD", pwd)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                format!("{}\noriginal\n", given.display()),
                "{user:?} {workdir}"
            );
            for (name, content) in [("x", "x\n"), ("y", "y\n")] {
                assert_eq!(
                    std::fs::read_to_string(s.work.join(name)).unwrap(),
                    content,
                    "{user:?} {workdir}"
                );
                std::fs::remove_file(s.work.join(name)).unwrap();
            }
            assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        }
    }
}

#[test]
fn failure_timeout_kill_and_dry_run_leave_the_workdir_byte_identical() {
    for user in users() {
        let s = Setup::new(user);
        let before = snapshot(&s.work);
        let cases: [(&[&str], String); 4] = [
            (&[], format!("{EDIT}; exit 3")),
            (&["--timeout", "300ms"], format!("{EDIT}; sleep 100")),
            (&[], format!("{EDIT}; kill -9 $$")),
            (&["--dry-run"], EDIT.to_owned()),
        ];
        for (extra, script) in cases {
            let out = s.run(extra, &script);
            assert_eq!(
                snapshot(&s.work),
                before,
                "{user:?} {extra:?} {}",
                text(&out)
            );
            assert!(
                s.branch_ids().is_empty(),
                "branch left behind after {extra:?}"
            );
        }
        let out = s.run(&["--dry-run"], EDIT);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("M a.txt\nD gone.txt\nA sub\nA sub/new.txt\n"),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn kept_branch_can_be_reviewed_then_committed() {
    for user in users() {
        let s = Setup::new(user);
        let out = s.run(&["--on-exit", "keep"], EDIT);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "original\n"
        );
        let ids = s.branch_ids();
        assert_eq!(ids.len(), 1);
        let diff = s.branch(&["diff", &ids[0], "a.txt"]);
        assert!(
            String::from_utf8_lossy(&diff.stdout).contains("-original\n+changed\n"),
            "{}",
            text(&diff)
        );
        let out = s.branch(&["commit", &ids[0]]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "changed\n"
        );
        assert!(s.branch_ids().is_empty());
    }
}

#[test]
fn stale_base_refuses_with_exit_5_and_force_overrides() {
    for user in users() {
        let s = Setup::new(user);
        // The host edits a.txt while the sandbox edits it too.
        let host_edit = format!("echo host > {}/a.txt", s.work.display());
        let mut cmd = command_as(user);
        cmd.args([
            "run",
            "-w",
            s.work.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &host_edit,
        ]);
        // The sandbox says it runs (its branch's base is taken) and waits for the host's
        // edit: the order is the test's, not a guess at timing.
        let mut child = {
            let mut c = command_as(user);
            c.arg("run")
                .args([
                    "--workdir",
                    s.work.to_str().unwrap(),
                    "--state-dir",
                    s.state.to_str().unwrap(),
                ])
                .args([
                    "--",
                    "sh",
                    "-c",
                    "echo ready; read go; echo sandbox > a.txt",
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c.spawn().unwrap()
        };
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready, "ready\n", "{user:?}");
        assert!(cmd.status().unwrap().success());
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(5), "{user:?} {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("a.txt"),
            "{}",
            text(&out)
        );
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "host\n"
        );
        let ids = s.branch_ids();
        assert_eq!(ids.len(), 1, "the refused branch is kept");
        let out = s.branch(&["commit", &ids[0]]);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        let out = s.branch(&["commit", &ids[0], "--force"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "sandbox\n"
        );
    }
}

#[test]
fn symlinks_never_let_a_commit_write_outside_the_workdir() {
    for user in users() {
        let s = Setup::new(user);
        let outside = scratch();
        give(outside.path(), user);
        std::os::unix::fs::symlink(outside.path(), s.work.join("link")).unwrap();
        let o = outside.path().display();
        let script = format!(
            "echo x > link/escaped; mkdir -p made && ln -s {o} made/out && echo y > made/out/escaped2; ln -s {o}/evil newlink; true"
        );
        let out = s.run(&[], &script);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "something escaped: {}",
            text(&out)
        );
        // The branch's symlink is committed as a symlink, never followed.
        assert_eq!(
            std::fs::read_link(s.work.join("newlink")).unwrap(),
            outside.path().join("evil")
        );
    }
}

#[test]
fn fifos_and_sockets_are_skipped_with_a_warning_and_the_rest_commits() {
    for user in users() {
        let s = Setup::new(user);
        let report = s.work.parent().unwrap().join("report.json");
        let out = s.run(
            &["--report", report.to_str().unwrap()],
            "echo changed > a.txt && mkfifo pipe && \
             python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'",
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "lockbox: warning: pipe was not committed: a FIFO holds no data to commit\n\
             lockbox: warning: sock was not committed: a socket is only meaningful to the process that bound it\n",
            "{user:?}"
        );
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "changed\n"
        );
        assert!(!s.work.join("pipe").exists() && !s.work.join("sock").exists());
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(json["branch"]["action"], "committed", "{json}");
        assert_eq!(
            json["skipped"],
            serde_json::json!([
                {"path": "pipe", "reason": "fifo"},
                {"path": "sock", "reason": "socket"},
            ]),
            "{json}"
        );
        // The same with --max-disk, whose branch is stored after the run.
        let out = s.run(&["--max-disk", "16M"], "mkfifo pipe2 && echo again > a.txt");
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("pipe2 was not committed"),
            "{}",
            text(&out)
        );
        assert_eq!(
            std::fs::read_to_string(s.work.join("a.txt")).unwrap(),
            "again\n"
        );
        assert!(s.branch_ids().is_empty(), "branch left behind");
    }
}

#[test]
fn report_lists_branch_and_changes() {
    let s = Setup::new(User::Current);
    let report = s.work.parent().unwrap().join("report.json");
    let out = s.run(&["--dry-run", "--report", report.to_str().unwrap()], EDIT);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        out.stderr.is_empty(),
        "dry run with --report prints nothing: {}",
        text(&out)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["branch"]["action"], "dry-run");
    let kinds: Vec<_> = json["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds[0],
        ("a.txt".to_owned(), "modified".to_owned()),
        "{json}"
    );
}

fn sandbox_sh(user: User, grant: &[&str], dir: &Path, script: &str) -> Output {
    let mut cmd = command_as(user);
    cmd.arg("run")
        .args(grant)
        .args(["--cwd", dir.to_str().unwrap(), "--", "sh", "-c", script]);
    cmd.output().unwrap()
}

fn check(
    user: User,
    setup: &[script::Op],
    ops: &[script::Op],
    bounded: bool,
) -> Result<(), TestCaseError> {
    let tmp = scratch();
    let (a, b, state) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("state"),
    );
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
    }
    give(tmp.path(), user);
    let (setup_sh, ops_sh) = (script::to_sh(setup), script::to_sh(ops));
    for d in [&a, &b] {
        let ds = d.to_str().unwrap();
        sandbox_sh(user, &["-w", ds], d, &setup_sh);
    }
    prop_assert_eq!(snapshot(&a), snapshot(&b));
    // The same script, once through a copy-on-write branch then committed, once directly.
    // --force: the setup just wrote these files, and a change in the same clock tick as the
    // branch's creation counts as stale by design.
    let (aw, st) = (a.to_str().unwrap(), state.to_str().unwrap());
    // Half the cases go through a bounded (tmpfs) upper imported afterwards.
    let mut flags = vec!["--workdir", aw, "--state-dir", st, "--force"];
    if bounded {
        flags.extend(["--max-disk", "64M"]);
    }
    let out = sandbox_sh(user, &flags, &a, &ops_sh);
    prop_assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    sandbox_sh(user, &["-w", b.to_str().unwrap()], &b, &ops_sh);
    prop_assert_eq!(snapshot(&a), snapshot(&b), "script:\n{}", ops_sh);
    Ok(())
}

#[test]
fn workdir_commit_equals_running_directly() {
    for user in users() {
        let cases = match user {
            User::Current => 64,
            User::Nobody => 24,
        };
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases,
            max_shrink_iters: 100,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let strategy = (
            proptest::collection::vec(script::op(), 0..12),
            proptest::collection::vec(script::op(), 1..14),
            proptest::bool::ANY,
        );
        if let Err(e) = runner.run(&strategy, |(setup, ops, bounded)| {
            check(user, &setup, &ops, bounded)
        }) {
            panic!("{user:?}: {e}");
        }
    }
}

/// Issue 32: a directory that came from the workdir renames inside as it does outside
/// (overlayfs alone answers `EXDEV`): with `os.rename`, into another parent, when its owner
/// cannot search it (or a directory inside it), when a file in it changed first, and with
/// `git mv`; a directory made in the sandbox too. The committed tree equals the tree the same
/// script leaves when run directly, modes included. Under a network list too, whose
/// supervisor takes the renames then.
#[test]
fn issue_32_renaming_a_workdir_directory_works_as_it_does_outside() {
    for user in users() {
        rename_like_outside(user, &[]);
        rename_like_outside(user, &["--net-deny", "192.0.2.1:9"]);
    }
}

/// Issue 32: a directory move that cannot finish (the branch is full) is undone: the call
/// fails with `EXDEV` as it did before, and the directory is whole, nothing left beside it.
#[test]
fn issue_32_a_directory_move_that_cannot_finish_is_undone() {
    const SCRIPT: &str = "python3 -c \"
import os
try:
    os.rename('big', 'moved')
    print('moved')
except OSError as e:
    print('errno', e.errno)
names = sorted(os.listdir('big'))
print(names, {len(open('big/' + n, 'rb').read()) for n in names})
print([n for n in os.listdir('.') if n.startswith('.lockbox')])
\"";
    for user in users() {
        let s = Setup::new(user);
        std::fs::create_dir(s.work.join("big")).unwrap();
        // 2 MiB: more than a 1 MiB branch holds once copied up.
        for i in 0..8 {
            std::fs::write(s.work.join(format!("big/f{i}")), vec![b'x'; 256 << 10]).unwrap();
        }
        give(&s.work, user);
        let out = s.run(
            &["--max-disk", "1M", "--on-exit", "abort", "--force"],
            SCRIPT,
        );
        assert_eq!(out.status.code(), Some(0), "{user:?}: {}", text(&out));
        let names: Vec<String> = (0..8).map(|i| format!("'f{i}'")).collect();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("errno 18\n[{}] {{262144}}\n[]\n", names.join(", ")),
            "{user:?}: {}",
            text(&out)
        );
    }
}

fn rename_like_outside(user: User, extra: &[&str]) {
    const SETUP: &str = "mkdir -p src/sub/deep src/shut closed into moved repo/lib \
        && echo x > src/f && ln -s f src/link && echo y > src/sub/deep/g \
        && echo q > src/shut/q && chmod 000 src/shut && echo z > closed/h && chmod 000 closed \
        && echo m > moved/m && echo l > repo/lib/x.py && git -C repo init -q && git -C repo add lib";
    const OPS: &str = "echo more >> src/f \
        && python3 -c \"import os; os.rename('src', 'dst'); os.rename('closed', 'opened'); \
           os.rename('moved', 'into/moved')\" \
        && mkdir fresh && echo n > fresh/n && python3 -c \"import os; os.rename('fresh', 'made')\" \
        && git -C repo mv lib newlib && git -C repo status --porcelain";
    let tmp = scratch();
    let (a, b, state) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("state"),
    );
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
    }
    give(tmp.path(), user);
    for d in [&a, &b] {
        let out = sandbox_sh(user, &["-w", d.to_str().unwrap()], d, SETUP);
        assert_eq!(out.status.code(), Some(0), "{user:?}: {}", text(&out));
    }
    let (aw, st) = (a.to_str().unwrap(), state.to_str().unwrap());
    // --force: the setup wrote the workdir in the clock tick the branch starts in.
    let mut flags = vec!["--workdir", aw, "--state-dir", st, "--force"];
    flags.extend(extra);
    let out = sandbox_sh(user, &flags, &a, OPS);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{user:?} {extra:?}: {}",
        text(&out)
    );
    let direct = sandbox_sh(user, &["-w", b.to_str().unwrap()], &b, OPS);
    assert_eq!(direct.status.code(), Some(0), "{user:?}: {}", text(&direct));
    // `git status` after the `git mv`: the index moved along.
    assert_eq!(out.stdout, direct.stdout, "{user:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("A  newlib/x.py"),
        "{user:?}: {}",
        text(&out)
    );
    // Closed directories compared by mode, then opened so the snapshot can enter them
    // whoever runs the test. git's index holds inode numbers and times: left out.
    for closed in ["opened", "dst/shut"] {
        let modes = [&a, &b].map(|d| {
            let m = std::fs::symlink_metadata(d.join(closed)).unwrap();
            std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777
        });
        assert_eq!(modes, [0, 0], "{user:?}: {closed}");
        for d in [&a, &b] {
            let open = std::os::unix::fs::PermissionsExt::from_mode(0o700);
            std::fs::set_permissions(d.join(closed), open).unwrap();
        }
    }
    let tree = |d: &Path| {
        let mut t = snapshot(d);
        t.retain(|p, _| !p.starts_with("repo/.git"));
        t
    };
    assert_eq!(tree(&a), tree(&b), "{user:?}");
    assert!(
        a.join("made/n").exists() && !a.join("src").exists(),
        "{user:?}"
    );
}

#[test]
fn max_disk_gives_enospc_inside_and_leaves_the_host_alone() {
    for user in users() {
        let s = Setup::new(user);
        let out = s.run(
            &["--max-disk", "1M", "--on-error", "keep"],
            "head -c 4000000 /dev/zero > big; echo rc=$?; echo small > small.txt; exit 1",
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("rc=1"), "{user:?} {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("No space left"),
            "{}",
            text(&out)
        );
        assert!(!s.work.join("big").exists());
        // The kept branch holds what fitted, bounded by the limit, on disk.
        let ids = s.branch_ids();
        assert_eq!(ids.len(), 1, "{}", text(&out));
        let upper = s.state.join("branches").join(&ids[0]).join("upper");
        let big = std::fs::metadata(upper.join("big")).unwrap().len();
        assert!(big <= 1 << 20, "branch grew to {big} bytes");
    }
}

#[test]
fn kill_9_of_lockbox_leaves_an_orphan_branch_that_abort_removes() {
    for user in users() {
        let s = Setup::new(user);
        let before = snapshot(&s.work);
        let mut cmd = command_as(user);
        cmd.arg("run")
            .args([
                "--workdir",
                s.work.to_str().unwrap(),
                "--state-dir",
                s.state.to_str().unwrap(),
            ])
            .args([
                "--",
                "sh",
                "-c",
                "echo changed > a.txt; touch started; sleep 1000",
            ]);
        let mut child = cmd.spawn().unwrap();
        // Wait until the sandbox has written into its branch.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !s.state.join("branches").exists()
            || s.branch_ids().iter().all(|id| {
                !s.state
                    .join("branches")
                    .join(id)
                    .join("upper/started")
                    .exists()
            })
        {
            assert!(
                std::time::Instant::now() < deadline,
                "sandbox never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let listed = |s: &Setup| -> serde_json::Value {
            serde_json::from_slice(&s.branch(&["list", "--json"]).stdout).unwrap()
        };
        // The record names the sandbox's init (issue 32): the branch is an orphan only once
        // that init, and every process of the sandbox with it, is gone.
        let json = listed(&s);
        assert_eq!(json[0]["orphan"], false, "{json}");
        let init: lockbox_cow::SandboxInit =
            serde_json::from_value(json[0]["meta"]["sandbox_init"].clone()).unwrap();
        assert!(!init.is_gone(), "{user:?}: {json}");
        child.kill().unwrap();
        child.wait().unwrap();
        // Killed with its lockbox, the sandbox may still be exiting for a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let json = loop {
            let json = listed(&s);
            if init.is_gone() && json[0]["orphan"] == true {
                break json;
            }
            if !init.is_gone() {
                // Running after the listing, so running during it: no orphan yet.
                assert_eq!(json[0]["orphan"], false, "{user:?}: {json}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{user:?}: never an orphan: {json}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(json[0]["orphan"], true, "{json}");
        assert_eq!(snapshot(&s.work), before, "{user:?}: the workdir changed");
        let ids = s.branch_ids();
        let out = s.branch(&["abort", &ids[0]]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(s.branch_ids().is_empty());
        // Nothing left but the (empty) directory branches are built in.
        let left: Vec<_> = std::fs::read_dir(s.state.join("branches"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [".new"]);
        assert_eq!(
            std::fs::read_dir(s.state.join("branches/.new"))
                .unwrap()
                .count(),
            0
        );
    }
}

#[test]
fn max_disk_branch_keeps_read_only_entries() {
    for user in users() {
        let s = Setup::new(user);
        // A read-only copy-up carries overlay xattrs: the import must set them before the
        // mode (found by the property test). Directories get a read-only mode too.
        let script = "chmod 444 a.txt; mkdir locked && echo x > locked/f && chmod 555 locked";
        let out = s.run(&["--max-disk", "8M"], script);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let mode = |p: &str| {
            std::os::unix::fs::PermissionsExt::mode(
                &std::fs::symlink_metadata(s.work.join(p))
                    .unwrap()
                    .permissions(),
            ) & 0o7777
        };
        assert_eq!(mode("a.txt"), 0o444);
        assert_eq!(mode("locked"), 0o555);
        std::fs::set_permissions(
            s.work.join("locked"),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(s.work.join("locked/f")).unwrap(),
            "x\n"
        );
    }
}

/// Issue 15's lost update through `run --workdir`: branch A reads the counter (0), B reads
/// 0 and commits 1, then A writes 1 with the same mtime. A is refused (exit 5) and its
/// branch is kept in state `stale`, listed with what to do.
#[test]
fn issue_15_run_writing_the_bytes_a_rival_committed_is_refused_and_listed_stale() {
    for user in users() {
        let s = Setup::new(user);
        let sync = s._tmp.path().join("sync");
        std::fs::create_dir(&sync).unwrap();
        std::fs::write(s.work.join("counter"), "0\n").unwrap();
        give(s._tmp.path(), user);
        let sync_dir = sync.to_str().unwrap();
        let racer = |id: &str, go: &str| {
            let mut c = command_as(user);
            c.arg("run")
                .args(["--workdir", s.work.to_str().unwrap()])
                .args([
                    "--state-dir",
                    s.state.to_str().unwrap(),
                    "--write",
                    sync_dir,
                ])
                .args([
                    "--env",
                    &format!("SYNC={sync_dir}"),
                    "--env",
                    &format!("ID={id}"),
                ])
                .args([
                    "--env",
                    &format!("GO={go}"),
                    "--",
                    "sh",
                    "-c",
                    EQUAL_BYTES_RACER,
                ])
                .current_dir("/")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            c
        };
        let mut a = racer("A", &format!("{sync_dir}/go")).spawn().unwrap();
        wait_for_file(&sync.join("read-A"), &mut a);
        let b = racer("B", "/").output().unwrap();
        assert_eq!(b.status.code(), Some(0), "{user:?} B: {}", text(&b));
        std::fs::write(sync.join("go"), "").unwrap();
        let a = a.wait_with_output().unwrap();
        assert_eq!(a.status.code(), Some(5), "{user:?} A: {}", text(&a));
        assert_eq!(
            std::fs::read_to_string(s.work.join("counter")).unwrap(),
            "1\n"
        );
        assert!(s.work.join("log_B").exists() && !s.work.join("log_A").exists());

        let ids = s.branch_ids();
        assert_eq!(ids.len(), 1, "the refused branch is kept");
        let id = &ids[0];
        let out = s.branch(&["list", "--json"]);
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(listed[0]["meta"]["state"], "stale", "{}", text(&out));
        assert_eq!(listed[0]["orphan"], false);
        let out = s.branch(&["list"]);
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        for want in [
            "stale".to_owned(),
            format!("lockbox branch diff {id}"),
            format!("lockbox branch commit --force {id}"),
            format!("lockbox branch abort {id}"),
        ] {
            assert!(line.contains(&want), "{line:?} lacks {want:?}");
        }
        assert!(!line.contains("orphan"), "{line:?}");
        let out = s.branch(&["commit", "--force", id]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(s.work.join("log_A").exists());
        assert!(s.branch_ids().is_empty());
    }
}

/// Issue 15: a file of holes costs the host nothing, whether the branch is bounded
/// (`--max-disk`: imported from the tmpfs) or not, kept or committed.
#[test]
fn sparse_files_stay_sparse_in_bounded_branches_and_in_the_workdir() {
    use std::os::unix::fs::MetadataExt;
    let blocks = |p: &Path| std::fs::metadata(p).unwrap().blocks();
    for user in users() {
        let s = Setup::new(user);
        let out = s.run(
            &["--max-disk", "64M", "--on-exit", "keep"],
            "truncate -s 1G sparse.img",
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let ids = s.branch_ids();
        let upper = s.state.join("branches").join(&ids[0]).join("upper");
        assert_eq!(
            blocks(&upper.join("sparse.img")),
            0,
            "{user:?}: dense branch"
        );
        let out = s.branch(&["commit", &ids[0]]);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            blocks(&s.work.join("sparse.img")),
            0,
            "{user:?}: dense commit"
        );
        let out = s.run(&[], "truncate -s 100G huge.img");
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let huge = std::fs::metadata(s.work.join("huge.img")).unwrap();
        assert_eq!((huge.len(), huge.blocks()), (100 << 30, 0), "{user:?}");
    }
}

/// Issue 15: what a command may do to names it owns commits whole: directories it made
/// unreadable (exit 4 before) and paths longer than `PATH_MAX` (half-committed before, with
/// a staging directory left and the branch stuck in `committing`).
#[test]
fn unreadable_directories_and_paths_longer_than_path_max_commit_whole() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    for user in users() {
        let s = Setup::new(user);
        let script = "N=$(printf '%0200d' 0 | tr 0 x); P=.; i=0; \
             while [ $i -lt 21 ]; do P=$P/$N; i=$((i+1)); done; \
             echo first > 0first.txt && mkdir -p \"$P\" && \
             (i=0; while [ $i -lt 21 ]; do cd -P $N; i=$((i+1)); done; echo deep > f) && \
             mkdir d e && echo x > d/f && echo y > e/g && chmod 000 d && chmod 300 e && \
             echo z > zlast.txt";
        let out = s.run(&[], script);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            (mode(&s.work.join("d")), mode(&s.work.join("e"))),
            (0o000, 0o300)
        );
        assert!(s.work.join("zlast.txt").exists() && s.work.join("0first.txt").exists());
        let deep = std::process::Command::new("find")
            .arg(&s.work)
            .args(["-name", "f"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&deep.stdout).len() > 4096,
            "{user:?}: the deep file was not committed"
        );
        assert!(s.branch_ids().is_empty(), "{user:?}: branch left");
        let names: Vec<_> = std::fs::read_dir(&s.work)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(".lockbox")),
            "{names:?}"
        );
        // Let the scratch directory be removed.
        for d in ["d", "e"] {
            std::fs::set_permissions(s.work.join(d), std::fs::Permissions::from_mode(0o700))
                .unwrap();
        }
    }
}

#[test]
fn setgid_directories_work_and_commit_while_setgid_files_lose_the_bit_and_grants_refuse_it() {
    use std::os::unix::fs::PermissionsExt;
    for user in users() {
        let s = Setup::new(user);
        let out = s.run(
            &[],
            "mkdir -m 2775 shared && mkdir made && chmod g+s made && mkdir shared/inner \
             && echo x > tool && chmod g+s tool",
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let mode = |p: &str| {
            std::fs::metadata(s.work.join(p))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("shared") & 0o7777, 0o2775, "{user:?}");
        assert_eq!(mode("made") & 0o2000, 0o2000, "{user:?}");
        // Made inside a setgid directory: inherits the bit, as on the host.
        assert_eq!(mode("shared/inner") & 0o2000, 0o2000, "{user:?}");
        // A file's set-id bits never reach the workdir.
        assert_eq!(mode("tool") & 0o6000, 0, "{user:?}");

        // A writable grant is the host's own directory: there the bit stays refused.
        let mut cmd = command_as(user);
        let granted = s.work.join("plain");
        std::fs::create_dir(&granted).unwrap();
        give(&granted, user);
        cmd.args(["run", "-w", granted.to_str().unwrap(), "--", "sh", "-c"])
            .arg(format!("mkdir {0}/g && chmod g+s {0}/g", granted.display()))
            .current_dir("/");
        let out = cmd.output().unwrap();
        assert_ne!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
            "{user:?} {}",
            text(&out)
        );
        assert_eq!(
            std::fs::metadata(granted.join("g"))
                .unwrap()
                .permissions()
                .mode()
                & 0o2000,
            0,
            "{user:?}"
        );
    }
}
