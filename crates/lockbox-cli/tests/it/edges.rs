//! The edges a user touches: failures that explain themselves, output a script can read,
//! help that teaches. As the current user and (when root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{give, lockbox, scratch, text, users, Scratch, User};
use std::path::Path;
use std::process::Output;

/// A scratch dir with `work/` (a workdir holding `a.txt`) and `state/`.
fn dirs(user: User) -> (Scratch, String, String) {
    let tmp = scratch();
    std::fs::create_dir(tmp.path().join("work")).unwrap();
    std::fs::write(tmp.path().join("work/a.txt"), "a\n").unwrap();
    std::fs::create_dir(tmp.path().join("state")).unwrap();
    give(tmp.path(), user);
    let w = tmp.path().join("work").to_str().unwrap().to_owned();
    let s = tmp.path().join("state").to_str().unwrap().to_owned();
    (tmp, w, s)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_failed_stage_is_named_with_the_end_of_its_stderr() {
    for user in users() {
        let (tmp, w, s) = dirs(user);
        let args = ["--workdir", &w, "--state-dir", &s];
        let out = lockbox(
            user,
            tmp.path(),
            &[
                &["pipeline"],
                &args[..],
                &["--stage", "true", "--stage", "nosuch-linter ."],
            ]
            .concat(),
        );
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("lockbox: not committed: stage 2 exited 127: ")
                && err.contains("nosuch-linter: not found"),
            "{user:?} {err}"
        );
        assert!(!err.contains("StageFailed"), "{err}");

        // Several lines of stderr: the last ones, indented, control characters escaped.
        let out = lockbox(
            user,
            tmp.path(),
            &[
                &["gather"],
                &args[..],
                &["--source", "lint=printf 'one\\ntwo\\033[2K\\n' >&2; exit 4"],
            ]
            .concat(),
        );
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        let err = stderr(&out);
        assert!(
            err.contains("not committed: stage 1 \"lint\" exited 4\nits stderr ends with:\n  one\n  two\\033[2K\n"),
            "{user:?} {err}"
        );

        // A timeout is named too, and durations read as people write them.
        let out = lockbox(
            user,
            tmp.path(),
            &[
                &["pipeline"],
                &args[..],
                &["--stage", "sleep 10", "--stage-opts", "1:--timeout 200ms"],
            ]
            .concat(),
        );
        assert_eq!(out.status.code(), Some(124), "{user:?} {}", text(&out));
        let err = stderr(&out);
        assert!(err.contains("not committed: stage 1 timed out"), "{err}");
        assert!(
            err.lines()
                .any(|l| l.starts_with("lockbox: stage 1: exit 124 in ") && l.ends_with(" ms")),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(&w).unwrap().count(),
            1,
            "nothing committed"
        );
    }
}

#[test]
fn run_workdir_says_what_it_discarded_and_how_to_keep_it() {
    for user in users() {
        let (tmp, w, s) = dirs(user);
        let out = lockbox(
            user,
            tmp.path(),
            &[
                "run",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--",
                "sh",
                "-c",
                "echo b > b.txt; echo c > c.txt; rm a.txt; exit 3",
            ],
        );
        assert_eq!(out.status.code(), Some(3), "{user:?} {}", text(&out));
        assert!(
            stderr(&out).contains(
                "lockbox: discarded 3 changes: the command exited 3; keep them with --on-error keep"
            ),
            "{user:?} {}",
            text(&out)
        );
        let out = lockbox(
            user,
            tmp.path(),
            &[
                "run",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--on-exit",
                "keep",
                "--",
                "sh",
                "-c",
                "echo b > b.txt",
            ],
        );
        assert!(
            stderr(&out).contains("(1 change); see `lockbox branch diff"),
            "{user:?} {}",
            text(&out)
        );
        let out = lockbox(
            user,
            tmp.path(),
            &[
                "run",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--",
                "sh",
                "-c",
                "echo c > c; exit 1",
            ],
        );
        assert!(
            stderr(&out).contains("discarded 1 change: the command exited 1; keep it with"),
            "{user:?} {}",
            text(&out)
        );
    }
}

#[test]
fn a_command_starts_in_the_callers_directory_when_it_is_the_parent_of_a_grant() {
    for user in users() {
        let tmp = scratch();
        std::fs::create_dir(tmp.path().join("project")).unwrap();
        std::fs::write(
            tmp.path().join("project/Makefile"),
            "all:\n\techo built > out\n",
        )
        .unwrap();
        give(tmp.path(), user);
        // `-w ./project -- make -C project`, without make: the same relative path.
        let out = lockbox(
            user,
            tmp.path(),
            &[
                "run",
                "-w",
                "./project",
                "--",
                "sh",
                "-c",
                "pwd; echo built > project/out",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let here = std::fs::canonicalize(tmp.path()).unwrap();
        assert_eq!(stdout(&out).trim(), here.to_str().unwrap());
        assert!(tmp.path().join("project/out").exists());

        // Not visible inside: a failure that names a path here says where it ran instead.
        let out = lockbox(user, tmp.path(), &["run", "--", "ls", "project"]);
        assert_ne!(out.status.code(), Some(0), "{}", text(&out));
        assert!(
            stderr(&out).contains("hint: the command ran in /: the current directory"),
            "{user:?} {}",
            text(&out)
        );
    }
}

#[test]
fn a_workdir_that_is_not_a_directory_is_refused_before_anything_starts() {
    for user in users() {
        let (tmp, _w, s) = dirs(user);
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        give(tmp.path(), user);
        let f = file.to_str().unwrap();
        let missing = tmp.path().join("missing");
        let m = missing.to_str().unwrap();
        let cases: [(Vec<&str>, &str); 5] = [
            (
                vec!["run", "--workdir", f, "--state-dir", &s, "--", "true"],
                "not a directory",
            ),
            (
                vec!["run", "--workdir", m, "--state-dir", &s, "--", "true"],
                "no such directory",
            ),
            (
                vec![
                    "pipeline",
                    "--workdir",
                    f,
                    "--state-dir",
                    &s,
                    "--stage",
                    "true",
                ],
                "not a directory",
            ),
            (
                vec![
                    "gather",
                    "--workdir",
                    f,
                    "--state-dir",
                    &s,
                    "--source",
                    "a=true",
                ],
                "not a directory",
            ),
            (
                vec!["txn", "--state-dir", &s, "recover", "--workdir", f],
                "not a directory",
            ),
        ];
        for (args, why) in cases {
            let out = lockbox(user, tmp.path(), &args);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{user:?} {args:?} {}",
                text(&out)
            );
            let err = stderr(&out);
            assert!(
                err.contains("--workdir ") && err.contains(why),
                "{args:?} {err}"
            );
            assert_eq!(
                err.lines().count(),
                1,
                "one line, no repeated OS text: {err}"
            );
        }
        assert_eq!(
            std::fs::read_dir(&s)
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.path()
                        .join("branches")
                        .read_dir()
                        .is_ok_and(|mut d| d.next().is_some())
                })
                .count(),
            0,
            "no branch was made"
        );
        assert!(!missing.exists());
    }
}

#[test]
fn an_os_error_is_said_once() {
    // The reproduction: a missing workdir said "No such file or directory (os error 2)" twice.
    let tmp = scratch();
    let out = lockbox(
        User::Current,
        tmp.path(),
        &["run", "--workdir", "nosuch", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        stderr(&out),
        "lockbox: --workdir nosuch: no such directory\n"
    );
}

#[test]
fn run_reports_json_on_stdout_and_report_dash_is_stdout() {
    for user in users() {
        let (tmp, w, s) = dirs(user);
        for flag in [&["--json"][..], &["--report", "-"][..]] {
            let out = lockbox(
                user,
                tmp.path(),
                &[
                    &["run", "--workdir", &w, "--state-dir", &s][..],
                    flag,
                    &["--", "sh", "-c", "echo from-the-command; echo n > new.txt"],
                ]
                .concat(),
            );
            assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
            let text_out = stdout(&out);
            let mut lines = text_out.lines();
            assert_eq!(lines.next(), Some("from-the-command"));
            let report: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
            assert_eq!(report["exit_code"], 0);
            assert_eq!(report["branch"]["action"], "committed");
            assert_eq!(report["changes"][0]["path"], "new.txt");
            assert_eq!(lines.next(), None);
            assert!(!tmp.path().join("-").exists(), "no file named -");
            std::fs::remove_file(Path::new(&w).join("new.txt")).unwrap();
        }
        // Dry run: the change lines on stdout, as for pipeline.
        let out = lockbox(
            user,
            tmp.path(),
            &[
                "run",
                "--workdir",
                &w,
                "--state-dir",
                &s,
                "--dry-run",
                "--",
                "sh",
                "-c",
                "echo n > d.txt",
            ],
        );
        assert_eq!(stdout(&out), "A d.txt\n", "{}", text(&out));
    }
}

#[test]
fn txn_list_takes_state_dir_after_the_subcommand() {
    let (tmp, w, s) = dirs(User::Current);
    let out = lockbox(
        User::Current,
        tmp.path(),
        &[
            "pipeline",
            "--workdir",
            &w,
            "--state-dir",
            &s,
            "--prepare",
            "--stage",
            "echo x > x",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = stdout(&out).trim().to_owned();
    let out = lockbox(
        User::Current,
        tmp.path(),
        &["txn", "list", "--state-dir", &s],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains(&id), "{}", text(&out));
}

#[test]
fn branch_diff_of_a_path_the_branch_does_not_change_is_an_error() {
    let (tmp, w, s) = dirs(User::Current);
    let out = lockbox(
        User::Current,
        tmp.path(),
        &[
            "run",
            "--workdir",
            &w,
            "--state-dir",
            &s,
            "--on-exit",
            "keep",
            "--",
            "sh",
            "-c",
            "mkdir sub; echo x > sub/x.txt",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let list = lockbox(
        User::Current,
        tmp.path(),
        &["branch", "--state-dir", &s, "list"],
    );
    let id = stdout(&list).split_whitespace().next().unwrap().to_owned();
    let out = lockbox(
        User::Current,
        tmp.path(),
        &["branch", "--state-dir", &s, "diff", &id, "nosuch"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains("does not change nosuch"),
        "{}",
        text(&out)
    );
    // A directory: the diffs of the changes below it.
    let out = lockbox(
        User::Current,
        tmp.path(),
        &["branch", "--state-dir", &s, "diff", &id, "sub"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("+x"), "{}", text(&out));
}

#[test]
fn journal_reads_create_nothing_and_name_what_is_missing() {
    let tmp = scratch();
    let db = tmp.path().join("no/such/dir/runs.db");
    let url = format!("sqlite:{}", db.display());
    for args in [
        vec!["journal", "--journal", &url, "list"],
        // --journal after the subcommand too.
        vec!["journal", "list", "--journal", &url],
        vec!["journal", "--journal", &url, "dump", "r1"],
    ] {
        let out = lockbox(User::Current, tmp.path(), &args);
        assert_eq!(out.status.code(), Some(1), "{args:?} {}", text(&out));
        assert!(
            stderr(&out).contains("no journal at sqlite:"),
            "{}",
            text(&out)
        );
    }
    assert!(!tmp.path().join("no").exists(), "a read made directories");
    let out = lockbox(User::Current, tmp.path(), &["journal", "list"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(stderr(&out).contains("--journal URL"), "{}", text(&out));
}

#[test]
fn a_run_given_without_dashes_is_told_about_them() {
    let tmp = scratch();
    let out = lockbox(User::Current, tmp.path(), &["run", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains("hint: the command goes after `--`")
            && stderr(&out).contains("-- true"),
        "{}",
        text(&out)
    );
}

#[test]
fn every_help_page_has_examples_and_every_positional_is_described() {
    let tmp = scratch();
    let pages: [&[&str]; 12] = [
        &[],
        &["run"],
        &["check"],
        &["branch"],
        &["pipeline"],
        &["gather"],
        &["txn"],
        &["journal"],
        &["serve"],
        &["mcp"],
        &["completions"],
        &["man"],
    ];
    for page in pages {
        let out = lockbox(User::Current, tmp.path(), &[page, &["--help"]].concat());
        assert_eq!(out.status.code(), Some(0), "{page:?} {}", text(&out));
        assert!(
            stdout(&out).contains("Example"),
            "{page:?} has no examples:\n{}",
            stdout(&out)
        );
    }
    for page in [
        &["branch", "diff"][..],
        &["txn", "show"],
        &["journal", "status"],
    ] {
        let out = lockbox(User::Current, tmp.path(), &[page, &["--help"]].concat());
        let help = stdout(&out);
        let args = help.split("Arguments:").nth(1).unwrap_or_default();
        let first = args.lines().nth(1).unwrap_or_default();
        assert!(
            first.split_whitespace().count() > 1,
            "{page:?}: positional without a description:\n{help}"
        );
    }
}

#[test]
fn completions_and_the_manual_are_generated_from_the_help() {
    let tmp = scratch();
    let out = lockbox(User::Current, tmp.path(), &["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout(&out).contains("complete -F") && stdout(&out).contains("pipeline"));
    let out = lockbox(User::Current, tmp.path(), &["man"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        stdout(&out).starts_with(".ie") || stdout(&out).contains(".TH lockbox"),
        "{}",
        text(&out)
    );
    let dir = tmp.path().join("man1");
    std::fs::create_dir(&dir).unwrap();
    let out = lockbox(
        User::Current,
        tmp.path(),
        &["man", "--dir", dir.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for page in [
        "lockbox.1",
        "lockbox-run.1",
        "lockbox-branch-diff.1",
        "lockbox-txn-recover.1",
    ] {
        let roff = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(roff.contains(".TH"), "{page}");
    }
    assert!(std::fs::read_to_string(dir.join("lockbox-run.1"))
        .unwrap()
        .contains("workdir"));
}
