//! `lockbox pipeline`, `lockbox gather` and `lockbox txn` end to end, as the current user and
//! (when root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{command_as, give, scratch, snapshot, text, users, User};
use std::path::Path;
use std::process::Output;

fn lockbox_in(user: User, args: &[&str]) -> Output {
    command_as(user)
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

fn dirs(user: User) -> (tempfile::TempDir, String, String) {
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
