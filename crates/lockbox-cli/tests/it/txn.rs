//! `lockbox pipeline`, `lockbox gather` and `lockbox txn` end to end, as the current user and
//! (when root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{
    command_as, give, scratch, snapshot, text, users, wait_for_file, Scratch, User,
    EQUAL_BYTES_RACER,
};
use std::path::Path;
use std::process::Output;

fn lockbox_in(user: User, args: &[&str]) -> Output {
    command_as(user)
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

/// `lockbox KIND --workdir W --state-dir S ARGS...` as `user`.
fn txn_in(user: User, kind: &str, w: &str, s: &str, args: &[&str]) -> Output {
    let mut all = vec![kind, "--workdir", w, "--state-dir", s];
    all.extend_from_slice(args);
    lockbox_in(user, &all)
}

fn dirs(user: User) -> (Scratch, String, String) {
    let tmp = scratch();
    std::fs::create_dir(tmp.path().join("work")).unwrap();
    std::fs::create_dir(tmp.path().join("state")).unwrap();
    give(tmp.path(), user);
    let w = tmp.path().join("work").to_str().unwrap().to_owned();
    let s = tmp.path().join("state").to_str().unwrap().to_owned();
    (tmp, w, s)
}

#[test]
fn pipeline_commits_all_stages_or_none() {
    for user in users() {
        let (_tmp, w, s) = dirs(user);
        let ok = lockbox_in(
            user,
            &[
                "pipeline",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--stage",
                "echo a > a.txt; echo piped",
                "--stage",
                "cat a.txt > b.txt; cat",
            ],
        );
        assert_eq!(ok.status.code(), Some(0), "{user:?} {}", text(&ok));
        assert_eq!(String::from_utf8_lossy(&ok.stdout), "piped\n");
        assert_eq!(
            std::fs::read_to_string(Path::new(&w).join("b.txt")).unwrap(),
            "a\n"
        );

        let before = snapshot(Path::new(&w));
        let failed = lockbox_in(
            user,
            &[
                "pipeline",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--stage",
                "echo x > x.txt",
                "--stage",
                "exit 3",
            ],
        );
        assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
        assert_eq!(
            snapshot(Path::new(&w)),
            before,
            "a failed pipeline changed the workdir"
        );
    }
}

/// Issue 32: every stage of a pipeline renames a directory of the workdir as outside, the
/// stages after the first (run one after another in one sandbox) too.
#[test]
fn issue_32_later_pipeline_stages_rename_workdir_directories() {
    for user in users() {
        let (_tmp, w, s) = dirs(user);
        std::fs::create_dir_all(Path::new(&w).join("src/sub")).unwrap();
        std::fs::create_dir(Path::new(&w).join("other")).unwrap();
        std::fs::write(Path::new(&w).join("src/sub/f"), "f\n").unwrap();
        give(Path::new(&w), user);
        let out = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &[
                "--stage",
                "python3 -c \"import os; os.rename('other', 'other2')\"",
                "--stage",
                "python3 -c \"import os; os.rename('src', 'moved')\"",
                "--stage",
                "mv moved/sub moved/sub2",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let w = Path::new(&w);
        assert_eq!(
            std::fs::read_to_string(w.join("moved/sub2/f")).unwrap(),
            "f\n"
        );
        assert!(w.join("other2").is_dir() && !w.join("src").exists() && !w.join("other").exists());
    }
}

#[test]
fn gather_conflicts_fail_by_default_and_markers_keep_both() {
    for user in users() {
        let (_tmp, w, s) = dirs(user);
        let base = [
            "gather",
            "--workdir",
            &w,
            "--state-dir",
            &s,
            "--source",
            "a=echo A > same.txt",
            "--source",
            "b=echo B > same.txt",
            "--consumer",
            "cat $LOCKBOX_INPUTS/a",
        ];
        let out = lockbox_in(user, &base);
        assert_eq!(out.status.code(), Some(3), "{user:?} {}", text(&out));
        assert!(!Path::new(&w).join("same.txt").exists());
        let mut with_markers = base.to_vec();
        with_markers.extend(["--conflict", "markers"]);
        let out = lockbox_in(user, &with_markers);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(
            std::fs::read_to_string(Path::new(&w).join("same.txt")).unwrap(),
            "A\n"
        );
        assert_eq!(
            std::fs::read_to_string(Path::new(&w).join("same.txt.lockbox-b")).unwrap(),
            "B\n"
        );
    }
}

#[test]
fn prepared_transaction_is_committed_by_a_second_command() {
    for user in users() {
        let (_tmp, w, s) = dirs(user);
        let out = lockbox_in(
            user,
            &[
                "pipeline",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--prepare",
                "--stage",
                "echo p > p.txt",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!Path::new(&w).join("p.txt").exists());
        let list = lockbox_in(user, &["txn", "--state-dir", &s, "list"]);
        assert!(
            String::from_utf8_lossy(&list.stdout).contains(&id),
            "{}",
            text(&list)
        );
        let out = lockbox_in(user, &["txn", "--state-dir", &s, "commit", &id]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(
            std::fs::read_to_string(Path::new(&w).join("p.txt")).unwrap(),
            "p\n"
        );
    }
}

#[test]
fn stage_opts_give_one_stage_its_own_policy() {
    for user in users() {
        let (_tmp, w, s) = dirs(user);
        let out = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &[
                "--env",
                "SHARED=all",
                "--stage-opts",
                "1:--env 'ONLY=first stage'",
                "--stage",
                "echo \"$SHARED $ONLY\" > a.txt",
                "--stage",
                "echo \"$SHARED ${ONLY:-unset}\" > b.txt",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let read = |f: &str| std::fs::read_to_string(Path::new(&w).join(f)).unwrap();
        assert_eq!(read("a.txt"), "all first stage\n");
        assert_eq!(read("b.txt"), "all unset\n");

        // Only the second source gets a timeout, and only it times out.
        let out = txn_in(
            user,
            "gather",
            &w,
            &s,
            &[
                "--json",
                "--stage-opts",
                "slow:--timeout 200ms --kill-grace 100ms",
                "--source",
                "quick=sleep 1; echo q",
                "--source",
                "slow=sleep 30",
            ],
        );
        assert_eq!(out.status.code(), Some(124), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["stages"][0]["name"], "quick");
        assert_eq!(v["stages"][0]["exit_code"], 0, "{v}");
        assert_eq!(v["stages"][1]["timed_out"], true, "{v}");
        assert_eq!(v["abort_reason"]["reason"], "timed_out");

        let bad = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &["--stage-opts", "3:--net host", "--stage", "true"],
        );
        assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
        assert!(
            text(&bad).contains("--stage-opts 3: no such stage"),
            "{}",
            text(&bad)
        );
        let bad = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &["--stage-opts", "1:--no-such-flag", "--stage", "true"],
        );
        assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    }
}

#[test]
fn json_and_report_carry_every_stage_changes_and_the_abort_reason() {
    for user in users() {
        let (tmp, w, s) = dirs(user);
        let report = tmp.path().join("report.json");
        let report_s = report.to_str().unwrap();
        let out = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &[
                "--report",
                report_s,
                "--stage",
                "echo a > a.txt; echo out",
                "--stage",
                "cat; echo oops >&2; exit 7",
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(v["committed"], false);
        assert_eq!(v["action"], "aborted");
        assert_eq!(v["exit_code"], 1);
        assert_eq!(v["stages"].as_array().unwrap().len(), 2);
        assert_eq!(v["stages"][1]["exit_code"], 7);
        assert_eq!(v["stages"][1]["stderr_tail"], "oops\n");
        assert_eq!(
            v["abort_reason"],
            serde_json::json!({"reason": "stage_failed", "stage": 1, "name": "stage-2", "exit_code": 7})
        );
        // The id leads to the record, which says what the exit code meant.
        let id = v["id"].as_str().unwrap();
        let show = lockbox_in(user, &["txn", "--state-dir", &s, "show", id]);
        let rec: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
        assert_eq!(rec["state"], "aborted");
        assert_eq!(rec["exit_code"], 1);
        assert!(
            rec["meaning"]
                .as_str()
                .unwrap()
                .contains("stage 2 exited 7; nothing committed"),
            "{rec}"
        );

        let out = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &[
                "--json",
                "--stage",
                "mkdir d && echo a > d/a.txt && echo done",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["committed"], true);
        assert_eq!(v["action"], "committed");
        assert_eq!(v["stdout"], "done\n");
        let paths: Vec<&str> = v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["d", "d/a.txt"]);
        assert_eq!(v["changes"][1]["kind"], "added", "{v}");
        assert!(v["report"].is_object(), "{v}");

        let list = lockbox_in(user, &["txn", "--state-dir", &s, "--json", "list"]);
        let all: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
    }
}

/// A transaction over 2,000 files whose `txn commit` is SIGKILLed while its staging
/// directory exists (between staging and the end of the apply); the next lockbox command on
/// the workdir — here `lockbox run --workdir` — finds it and finishes or rolls it back
/// first, so that command sees the pre-state or the post-state, never a half.
#[test]
fn a_commit_killed_with_sigkill_is_recovered_by_the_next_command_on_the_workdir() {
    let user = users()[0];
    for attempt in 0..20 {
        let (_tmp, w, s) = dirs(user);
        let out = txn_in(
            user,
            "pipeline",
            &w,
            &s,
            &[
                "--prepare",
                "--stage",
                "mkdir many && for i in $(seq 2000); do echo $i > many/$i; done",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let mut commit = command_as(user)
            .args(["txn", "--state-dir", &s, "commit", &id])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let staging = Path::new(&w).join(format!(".lockbox-commit-{id}"));
        let caught = loop {
            if staging.exists() {
                commit.kill().unwrap();
                commit.wait().unwrap();
                break true;
            }
            if commit.try_wait().unwrap().is_some() {
                break false;
            }
        };
        if !caught {
            continue;
        }
        let record = || {
            let show = lockbox_in(user, &["txn", "--state-dir", &s, "show", &id]);
            serde_json::from_slice::<serde_json::Value>(&show.stdout).unwrap()["state"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        // Before its commit point the kill leaves it prepared (with staging to remove),
        // after it committing.
        let killed = record();
        assert!(
            killed == "prepared" || killed == "committing",
            "the kill left {killed}"
        );
        let out = lockbox_in(
            user,
            &[
                "run",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--on-exit",
                "abort",
                "--",
                "/bin/sh",
                "-c",
                "ls many 2>/dev/null | wc -l",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let seen = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let state = record();
        match state.as_str() {
            "committed" => assert_eq!(seen, "2000", "{}", text(&out)),
            "prepared" => assert_eq!(seen, "0", "{}", text(&out)),
            other => panic!("not recovered: {other} {}", text(&out)),
        }
        assert!(
            text(&out).contains(&format!("transaction {id}")),
            "the sweep says what it did: {}",
            text(&out)
        );
        assert!(!staging.exists(), "staging left behind");
        eprintln!("killed during commit on attempt {attempt}; recovered as {state}");
        return;
    }
    panic!("never caught a commit in flight in 20 attempts");
}

/// (temp dir, workdir, state dir) under /var/tmp, for `user`. The workdir holds `web/` and
/// `api/main`.
fn project(user: User) -> (tempfile::TempDir, String, String) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::Builder::new()
        .prefix("lockbox-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for d in ["work/web", "work/api", "state"] {
        std::fs::create_dir_all(tmp.path().join(d)).unwrap();
    }
    std::fs::write(tmp.path().join("work/api/main"), "api\n").unwrap();
    give(tmp.path(), user);
    // Past the timestamp granularity: the files above predate the transactions.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let w = tmp.path().join("work").to_str().unwrap().to_owned();
    let s = tmp.path().join("state").to_str().unwrap().to_owned();
    (tmp, w, s)
}

#[test]
fn stage_opts_writable_confines_each_agent_to_its_part_of_the_workdir() {
    for user in users() {
        // The RFC's example 4: two agents on disjoint subsystems, a read-only tester.
        let (_tmp, w, s) = project(user);
        let out = txn_in(
            user,
            "gather",
            &w,
            &s,
            &[
                "--stage-opts",
                "frontend:--writable web",
                "--stage-opts",
                &format!("backend:--writable {w}/api"),
                "--stage-opts",
                "consumer:--read-only",
                "--source",
                "frontend=echo page > web/index.html",
                "--source",
                "backend=echo route >> api/main",
                "--consumer",
                "cat web/index.html api/main > /tmp/seen && cat /tmp/seen",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "page\napi\nroute\n");

        // A stage writing outside its part: EACCES, exit 1, the workdir untouched.
        let before = snapshot(Path::new(&w));
        for (opts, script) in [
            ("1:--writable web", "echo ok > web/ok && echo y > api/y"),
            ("1:--read-only", "echo y > web/y"),
        ] {
            let out = txn_in(
                user,
                "pipeline",
                &w,
                &s,
                &["--json", "--stage-opts", opts, "--stage", script],
            );
            assert_eq!(out.status.code(), Some(1), "{opts}: {}", text(&out));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let tail = v["stages"][0]["stderr_tail"].as_str().unwrap_or_default();
            assert!(refused(tail), "{opts}: {v}");
        }
        assert_eq!(
            snapshot(Path::new(&w)),
            before,
            "{user:?}: the workdir changed"
        );

        // A path outside the workdir is a usage error naming it.
        for bad in ["/etc", "../elsewhere"] {
            let out = txn_in(
                user,
                "pipeline",
                &w,
                &s,
                &[
                    "--stage-opts",
                    &format!("1:--writable {bad}"),
                    "--stage",
                    "true",
                ],
            );
            assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!("--writable {bad}: not inside the workdir")),
                "{stderr}"
            );
        }
    }
}

/// The error a write outside a stage's writable parts gets: EROFS from the read-only mount of
/// the view (EACCES where Landlock refuses first).
fn refused(stderr: &str) -> bool {
    stderr.contains("Read-only file system") || stderr.contains("Permission denied")
}

/// Issue 15's lost update, deterministic: pipeline A reads the counter (0), pipeline B
/// reads 0 and commits 1, then A writes 1 too, with the same mtime: A's write equals the
/// workdir's now, but it read a stale value. A must be refused (exit 5), not exit 0.
#[test]
fn issue_15_a_pipeline_writing_the_bytes_a_rival_committed_is_refused_not_lost() {
    for user in users() {
        let (tmp, w, s) = dirs(user);
        let sync = tmp.path().join("sync");
        std::fs::create_dir(&sync).unwrap();
        std::fs::write(Path::new(&w).join("counter"), "0\n").unwrap();
        give(tmp.path(), user);
        let sync_dir = sync.to_str().unwrap();
        let racer = |id: &str, go: &str| {
            let mut c = command_as(user);
            c.args([
                "pipeline",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--write",
                sync_dir,
            ])
            .args([
                "--env",
                &format!("SYNC={sync_dir}"),
                "--env",
                &format!("ID={id}"),
            ])
            .args(["--env", &format!("GO={go}"), "--stage", EQUAL_BYTES_RACER])
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
        assert!(
            String::from_utf8_lossy(&a.stderr).contains("counter"),
            "{}",
            text(&a)
        );
        let w = Path::new(&w);
        assert_eq!(std::fs::read_to_string(w.join("counter")).unwrap(), "1\n");
        assert!(w.join("log_B").exists() && !w.join("log_A").exists());
    }
}

/// A transaction whose record a power loss tore is listed as damaged with the command
/// that removes it, and `txn abort ID` does (it used to say "not found").
#[test]
fn a_damaged_transaction_is_listed_with_its_remedy_and_abort_removes_it() {
    let user = users()[0];
    let (_tmp, w, s) = dirs(user);
    let out = txn_in(
        user,
        "pipeline",
        &w,
        &s,
        &["--prepare", "--stage", "echo x > f"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let record = Path::new(&s).join("txns").join(&id).join("record.json");
    std::fs::write(&record, "{\"torn").unwrap();
    let out = lockbox_in(user, &["txn", "--state-dir", &s, "list"]);
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        listed.contains("damaged") && listed.contains("lockbox txn abort ID"),
        "{}",
        text(&out)
    );
    let out = lockbox_in(user, &["txn", "--state-dir", &s, "abort", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = lockbox_in(user, &["txn", "--state-dir", &s, "--json", "list"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[]",
        "{}",
        text(&out)
    );
    assert!(!Path::new(&w).join("f").exists());
}
