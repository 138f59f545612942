//! Crash safety: SIGKILL a process in the middle of a commit, at many points; every path must
//! hold its old or its new content (never torn, never empty), and committing the branch again
//! (or aborting a half-removed branch) must give exactly the intended tree.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: panics are failures

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{require_overlay, run_direct, run_in_branch, sh, snapshot, Node, Scratch};
use lockbox_cow::{
    abort_id, list, staging_keys, sweep_branch_staging, Branch, BranchId, CommitOptions, CowError,
    HunkChoice, Selection, WorkdirLock,
};

const ENV: &str = "LOCKBOX_COW_CRASH_HELPER";

/// Commits the branch named in the environment; the parent kills us somewhere inside.
fn helper_commit_until_killed() {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let (state, id) = spec.split_once('\n').unwrap();
    let branch = Branch::open(Path::new(state), &BranchId::parse(id).unwrap()).unwrap();
    branch.commit(&CommitOptions::default()).unwrap();
}

/// Commits part of the branch named in the environment ([`part`]); killed somewhere inside.
fn helper_commit_part_until_killed() {
    let Ok(spec) = std::env::var(PART_ENV) else {
        return;
    };
    let (state, id) = spec.split_once('\n').unwrap();
    let mut branch = Branch::open(Path::new(state), &BranchId::parse(id).unwrap()).unwrap();
    branch
        .commit_selected(&part(), &CommitOptions::default())
        .unwrap();
}

const PART_ENV: &str = "LOCKBOX_COW_CRASH_PART_HELPER";

/// The child roles of the SIGKILL tests ([`lockbox_testkit::child_role`]): whether this
/// process is one (it then committed until killed, or its commit ended).
fn as_child() -> bool {
    if lockbox_testkit::child_role(ENV).is_some() {
        helper_commit_until_killed();
        return true;
    }
    if lockbox_testkit::child_role(PART_ENV).is_some() {
        helper_commit_part_until_killed();
        return true;
    }
    false
}

/// Part of [`script`]'s changes: not the removal of `gone`, not `n1`, and only the second
/// of `long`'s two hunks.
fn part() -> Selection {
    Selection {
        only: Vec::new(),
        exclude: vec!["gone".into(), "n1".into()],
        hunks: vec![HunkChoice {
            path: "long".into(),
            accept: vec![1],
        }],
        review: None,
    }
}

/// The paths of the branch's change set.
fn changed_paths(branch: &Branch) -> Vec<std::path::PathBuf> {
    let set = branch.change_set().unwrap();
    set.changes().iter().map(|c| c.path.clone()).collect()
}

/// Runs the test `helper` (the caller) on `branch` (named to it in `env`) in a child process and
/// SIGKILLs it after `delay_ms`; whether it had finished by then.
fn commit_until_killed(
    helper: &str,
    env: &str,
    s: &Scratch,
    branch: &Branch,
    delay_ms: u64,
) -> bool {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!(helper).as_str(),
            "--test-threads",
            "1",
        ])
        .env(env, format!("{}\n{}", s.state.display(), branch.id()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(delay_ms));
    let _ = child.kill(); // SIGKILL
    child.wait().unwrap().success()
}

const FILES: usize = 100;

fn setup() -> String {
    format!("mkdir -p d/sub gone; for i in $(seq 1 {FILES}); do echo old-$i > f$i; echo x > gone/g$i; done; echo s > d/sub/s")
}

fn script() -> String {
    format!(
        "for i in $(seq 1 {FILES}); do echo new-new-new-$i > f$i; echo n > n$i; done; \
         rm -r gone; rm -r d; mkdir d; echo fresh > d/new; chmod 600 f1"
    )
}

#[test]
fn sigkill_during_commit_never_tears_and_recommit_finishes() {
    if as_child() {
        return;
    }
    if !require_overlay() {
        return;
    }
    let mut outcomes = Vec::new();
    for delay_ms in [0u64, 5, 20, 50, 100, 200, 400, 800, 1600, 3200] {
        let s = Scratch::new();
        sh(&s.wd, &setup());
        let expected_dir = s.tmp.path().join("expected");
        std::fs::create_dir(&expected_dir).unwrap();
        sh(&expected_dir, &setup());
        assert!(run_direct(&expected_dir, &script()));
        let branch = s.branch();
        assert!(run_in_branch(&branch, &script()));
        let old = snapshot(&s.wd);
        let expected = snapshot(&expected_dir);

        let finished = commit_until_killed(
            "sigkill_during_commit_never_tears_and_recommit_finishes",
            ENV,
            &s,
            &branch,
            delay_ms,
        );
        let staged = std::fs::read_dir(&s.wd).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".lockbox-commit-")
        });
        let state = Branch::open(&s.state, branch.id()).map(|b| b.meta().state);
        let applied = snapshot(&s.wd)
            .iter()
            .filter(|(p, n)| old.get(*p) != Some(n))
            .count();
        outcomes.push(format!(
            "{delay_ms}ms: finished={finished} state={state:?} staging={staged} changed={applied}",
            state = state.as_ref().map_err(|e| e.code()),
        ));

        // Every path is old or new, whole.
        for (path, node) in snapshot(&s.wd) {
            if path.to_string_lossy().starts_with(".lockbox-commit-") {
                continue; // the staging area (removed by the re-commit below)
            }
            // Content and mode travel together in one staged inode.
            let ok = old.get(&path) == Some(&node) || expected.get(&path) == Some(&node);
            assert!(
                ok,
                "delay {delay_ms}ms: {} is neither old nor new: {node:?}",
                path.display()
            );
            if let Node::File(_, c) = &node {
                assert!(!c.is_empty(), "empty file {}", path.display());
            }
        }

        // Recover: finish the commit, or clean up a half-removed branch.
        match Branch::open(&s.state, branch.id()) {
            Ok(b) => {
                b.commit(&CommitOptions::default())
                    .unwrap_or_else(|e| panic!("delay {delay_ms}ms: re-commit failed: {e}"));
            }
            Err(_) => {
                if list(&s.state).unwrap().iter().any(|l| &l.id == branch.id()) {
                    abort_id(&s.state, branch.id()).unwrap();
                }
            }
        }
        assert!(list(&s.state).unwrap().is_empty());
        assert_eq!(
            snapshot(&s.wd),
            expected,
            "delay {delay_ms}ms: final tree differs"
        );
    }
    eprintln!("{}", outcomes.join("\n"));
    assert!(
        outcomes.iter().any(|o| o.contains("finished=false")),
        "no kill landed inside a commit; the test did not test anything"
    );
}

/// A partial commit killed at many points never leaves the workdir with part of itself: the
/// next partial commit finishes it (and says so) or, before its commit point, makes it anew;
/// either way the workdir then holds exactly what an uninterrupted one gives, and the rest
/// stays in the branch.
#[test]
fn sigkill_during_a_partial_commit_never_leaves_it_half_applied() {
    if as_child() {
        return;
    }
    if !require_overlay() {
        return;
    }
    let long_old: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    let long_edit = "sed -i 's/^line 2$/LINE TWO/; s/^line 30$/LINE THIRTY/' long";
    let prepare = |dir: &Path| {
        sh(dir, &setup());
        std::fs::write(dir.join("long"), &long_old).unwrap();
    };
    // The result of the same partial commit, not interrupted.
    let calm = Scratch::new();
    prepare(&calm.wd);
    let mut b = calm.branch();
    assert!(run_in_branch(&b, &format!("{}; {long_edit}", script())));
    b.commit_selected(&part(), &CommitOptions::default())
        .unwrap();
    let expected = snapshot(&calm.wd);
    let left = changed_paths(&b);
    assert!(std::fs::read_to_string(calm.wd.join("long"))
        .unwrap()
        .contains("LINE THIRTY"));

    let mut outcomes = Vec::new();
    for delay_ms in [0u64, 5, 10, 20, 30, 50, 75, 100, 150, 200, 400, 800] {
        let s = Scratch::new();
        prepare(&s.wd);
        let branch = s.branch();
        assert!(run_in_branch(
            &branch,
            &format!("{}; {long_edit}", script())
        ));
        let old = snapshot(&s.wd);
        let finished = commit_until_killed(
            "sigkill_during_a_partial_commit_never_leaves_it_half_applied",
            PART_ENV,
            &s,
            &branch,
            delay_ms,
        );
        let recorded = branch.dir().join("part-commit.json").exists();
        for (path, node) in snapshot(&s.wd) {
            if path.to_string_lossy().starts_with(".lockbox-commit-") {
                continue;
            }
            let ok = old.get(&path) == Some(&node) || expected.get(&path) == Some(&node);
            assert!(
                ok,
                "delay {delay_ms}ms: {} is neither old nor new",
                path.display()
            );
        }
        let mut b = Branch::open(&s.state, branch.id()).unwrap();
        let again = if finished {
            "not needed".to_owned()
        } else {
            match b.commit_selected(&part(), &CommitOptions::default()) {
                Ok(_) => "made anew".to_owned(),
                Err(e @ CowError::PartCommitFinished { .. }) => {
                    assert!(
                        recorded,
                        "delay {delay_ms}ms: finished without a record: {e}"
                    );
                    "finished".to_owned()
                }
                // Killed after the commit's last step (its record removed) but before the
                // helper exited: the commit is whole, so the hunk it took is no longer in
                // the branch, and asking for it again is refused without changing anything.
                Err(CowError::BadHunk { .. }) if !recorded && snapshot(&s.wd) == expected => {
                    "done before the kill; the hunk asked for is gone".to_owned()
                }
                Err(e) => panic!("delay {delay_ms}ms: committing again failed: {e}"),
            }
        };
        outcomes.push(format!(
            "{delay_ms}ms: finished={finished} record={recorded} again: {again}"
        ));
        assert_eq!(
            snapshot(&s.wd),
            expected,
            "delay {delay_ms}ms: {}",
            outcomes.join("; ")
        );
        let now = changed_paths(&b);
        assert_eq!(now, left, "delay {delay_ms}ms: what is left in the branch");
        // What is left commits without a stale-base refusal: the finished paths are not
        // taken for host edits.
        b.commit(&CommitOptions::default()).unwrap();
    }
    eprintln!("{}", outcomes.join("\n"));
    assert!(
        outcomes.iter().any(|o| o.contains("finished=false")),
        "no kill landed inside a partial commit; the test did not test anything"
    );
}

/// Runs the test `helper` (the caller) on `branch` in a child process and SIGKILLs it as soon as
/// a staging directory appears in the workdir; whether it did (rather than end first).
fn kill_once_staging(helper: &str, env: &str, s: &Scratch, branch: &Branch) -> bool {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!(helper).as_str(),
            "--test-threads",
            "1",
        ])
        .env(env, format!("{}\n{}", s.state.display(), branch.id()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if !staging_keys(&s.wd).is_empty() {
            let _ = child.kill(); // SIGKILL
            child.wait().unwrap();
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
    }
}

/// Issue 32: a commit (full or partial) killed while staging left
/// `WORKDIR/.lockbox-commit-<id>[-part]/` in the user's directory for good: `branch abort`,
/// recovery and later commits left it, and sandboxes of the workdir saw it. Abort removes
/// it, and so does recovery's sweep (which keeps only a partial commit's staging past its
/// commit point, to finish it from).
#[test]
fn sigkill_during_staging_then_abort_or_recovery_leaves_no_staging() {
    if as_child() {
        return;
    }
    if !require_overlay() {
        return;
    }
    let long: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    let many = "mkdir many && for i in $(seq 1 500); do echo $i > many/$i; done";
    let mut caught = Vec::new();
    for attempt in 0..8 {
        let (part, recovery) = (attempt % 2 == 1, attempt % 4 >= 2);
        let s = Scratch::new();
        sh(&s.wd, &setup());
        std::fs::write(s.wd.join("long"), &long).unwrap();
        let branch = s.branch();
        let edit = "sed -i 's/^line 2$/LINE TWO/; s/^line 30$/LINE THIRTY/' long";
        assert!(run_in_branch(
            &branch,
            &format!("{}; {edit}; {many}", script())
        ));
        let env = match part {
            true => PART_ENV,
            false => ENV,
        };
        if !kill_once_staging(
            "sigkill_during_staging_then_abort_or_recovery_leaves_no_staging",
            env,
            &s,
            &branch,
        ) {
            continue;
        }
        let recorded = branch.dir().join("part-commit.json").exists();
        caught.push(format!("part={part} recovery={recovery} record={recorded}"));
        let wd = std::fs::canonicalize(&s.wd).unwrap();
        if recovery {
            let _lock = WorkdirLock::acquire(&s.state, &wd).unwrap();
            let removed = sweep_branch_staging(&s.state, &wd).unwrap();
            let left = staging_keys(&wd);
            if part && recorded {
                // Past its commit point: kept for the abort (or a commit) to finish.
                assert_eq!(left, [format!("{}-part", branch.id())], "{caught:?}");
            } else {
                assert!(left.is_empty(), "{left:?} after the sweep ({caught:?})");
                assert!(!removed.is_empty(), "{caught:?}");
            }
        }
        abort_id(&s.state, branch.id()).unwrap();
        assert_eq!(staging_keys(&wd), Vec::<String>::new(), "{caught:?}");
    }
    eprintln!("{}", caught.join("\n"));
    for (part, recovery) in [(false, false), (true, false), (false, true), (true, true)] {
        let case = format!("part={part} recovery={recovery} ");
        assert!(
            caught.iter().any(|c| c.starts_with(&case)),
            "no kill landed in staging for {case}: {caught:?}"
        );
    }
}

/// A branch of `s` that ran [`script`] and was committed by [`lockbox_cow::commit`], which
/// applies everything and leaves the branch in state `committing`, as a kill right after
/// the commit would.
fn committed_but_kept(s: &Scratch) -> Branch {
    sh(&s.wd, &setup());
    let mut branch = s.branch();
    assert!(run_in_branch(&branch, &script()));
    lockbox_cow::commit(&mut branch, &s.wd.clone(), &CommitOptions::default()).unwrap();
    branch
}

/// A kill after every change is applied but before the staging directory is gone (during
/// the final `syncfs`, say) leaves nothing to apply: committing again must still finish and
/// remove the staging directory, not return early and leave it in the workdir.
#[test]
fn recommit_with_nothing_left_to_apply_removes_staging() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let branch = committed_but_kept(&s);
    let committed = snapshot(&s.wd);
    // The staging directory a kill after the last rename leaves behind.
    let staging = s.wd.join(format!(".lockbox-commit-{}", branch.id()));
    std::fs::create_dir(&staging).unwrap();

    let again = Branch::open(&s.state, branch.id()).unwrap();
    assert_eq!(again.meta().state, lockbox_cow::BranchState::Committing);
    let report = again.commit(&CommitOptions::default()).unwrap();
    assert_eq!(report.added + report.modified + report.deleted, 0);
    assert!(!staging.exists(), "staging directory left in the workdir");
    assert_eq!(snapshot(&s.wd), committed);
    assert!(list(&s.state).unwrap().is_empty());
}

const REMOVE_ENV: &str = "LOCKBOX_COW_REMOVE_HELPER";

/// In a user+mount namespace: mounts a tmpfs on the branch's `upper/d`, so removing the
/// branch fails in the middle (`rmdir` of a mount point is EBUSY), as a crash would stop it.
/// The child role of [`interrupted_removal_of_committed_branch_never_recommits`] ([`lockbox_testkit::child_role`]).
fn helper_remove_until_stuck() {
    let Ok(spec) = std::env::var(REMOVE_ENV) else {
        return;
    };
    let (state, id) = spec.split_once('\n').unwrap();
    let branch = Branch::open(Path::new(state), &BranchId::parse(id).unwrap()).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(branch.upper_dir().join("d"))
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs: {st}");
    let err = branch.abort().unwrap_err();
    assert_eq!(err.code(), "REMOVE_BRANCH", "{err}");
}

/// A committed branch whose removal stops half-way must not open again: its upper is partly
/// gone, and committing it again would apply what is left (an opaque directory emptied by
/// the removal would delete its files from the workdir). It is listed as damaged, and
/// `abort_id` finishes the removal.
#[test]
fn interrupted_removal_of_committed_branch_never_recommits() {
    if lockbox_testkit::child_role(REMOVE_ENV).is_some() {
        return helper_remove_until_stuck();
    }
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let branch = committed_but_kept(&s);
    let committed = snapshot(&s.wd);
    assert!(committed.contains_key(Path::new("d/new")));

    let st = Command::new("unshare")
        .args(["-Urm", "--propagation", "private"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!("interrupted_removal_of_committed_branch_never_recommits")
                .as_str(),
            "--test-threads",
            "1",
        ])
        .env(
            REMOVE_ENV,
            format!("{}\n{}", s.state.display(), branch.id()),
        )
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "removal helper failed: {st}");

    let reopened = Branch::open(&s.state, branch.id());
    assert!(
        reopened.is_err(),
        "a half-removed branch opened again (and could be re-committed)"
    );
    let listed = list(&s.state).unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].meta.is_err(), "listed as intact: {:?}", listed[0]);
    abort_id(&s.state, branch.id()).unwrap();
    assert!(list(&s.state).unwrap().is_empty());
    assert_eq!(snapshot(&s.wd), committed);
}

/// The crash tests (a full and a partial commit) again as uid/gid 65534 (when we are root).
#[test]
fn sigkill_during_commits_as_uid_65534() {
    if std::env::var_os("LOCKBOX_COW_AS_NOBODY").is_some() {
        return;
    }
    lockbox_testkit::require!(
        lockbox_testkit::is_root(),
        "running as uid 65534 needs root (this run is unprivileged already)"
    );
    if !require_overlay() {
        return;
    }
    let st = lockbox_testkit::as_uid_65534("LOCKBOX_COW_AS_NOBODY")
        // Both `sigkill_during_*` tests (this one returns at once when run as 65534).
        .arg(lockbox_testkit::test_name!("sigkill_during_"))
        .status()
        .unwrap();
    assert!(st.success(), "crash test failed as uid 65534: {st}");
}
