//! Crash torture: a commit changing thousands of files is SIGKILLed at random moments; after
//! recovery the workdir is exactly the pre-state or exactly the post-state, never in
//! between, and no staging directory is left.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{dirs, stage, staging_leftovers, tree_hash};
use lockbox_txn::{recover, Pipeline, PreparedTxn, TxnId};

const CHILD_ENV: &str = "LOCKBOX_TXN_CRASH_CHILD";
const READY: &str = "lockbox-crash-child-committing";

/// The child side of every test here ([`lockbox_testkit::child_role`]): commits the
/// prepared transaction named by `spec` (`STATE\nID`), for the parent to SIGKILL.
fn commit_as_child(spec: &str) {
    let (state, id) = spec.split_once('\n').unwrap();
    let id = TxnId::parse(id).unwrap();
    let prepared = PreparedTxn::open(Path::new(state), &id).unwrap();
    println!("{READY}");
    // Forced: restoring the pristine copies for each trial gives every workdir file a new
    // ctime, which the optimistic base check would (rightly) call a concurrent change.
    assert!(prepared.commit_forced().unwrap().committed);
}

/// The long test's time budget from `LOCKBOX_TXN_LONG_CRASH_SECONDS` (CI sets it: see
/// scripts/test.sh); unset, it runs all its trials.
fn long_budget() -> Option<Duration> {
    let secs = std::env::var("LOCKBOX_TXN_LONG_CRASH_SECONDS").ok()?;
    Some(Duration::from_secs(secs.parse().unwrap()))
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Prepares (with real sandboxes) a transaction adding `adds` files in 20 directories,
/// modifying 150 and deleting 100 plus a 50-file directory of a pre-state of 300 files.
fn prepare(state: &Path, work: &Path, adds: usize) -> TxnId {
    for d in 0..3 {
        std::fs::create_dir_all(work.join(format!("old{d}"))).unwrap();
        for f in 0..100 {
            std::fs::write(work.join(format!("old{d}/f{f}")), format!("old {d} {f}")).unwrap();
        }
    }
    std::fs::create_dir_all(work.join("doomed")).unwrap();
    for f in 0..50 {
        std::fs::write(work.join(format!("doomed/f{f}")), "doomed").unwrap();
    }
    let per_dir = adds / 20;
    let create = format!(
        "for d in $(seq 0 19); do mkdir -p new$d; i=0; while [ $i -lt {per_dir} ]; do echo \"new $d $i\" > new$d/f$i; i=$((i+1)); done; done"
    );
    let change = "for f in $(seq 0 49); do echo changed >> old0/f$f; echo changed >> old1/f$f; echo changed >> old2/f$f; rm old2/f$((f+50)) old1/f$((f+50)); done; rm -r doomed";
    let prepared = Pipeline::new(state, work)
        .stage(stage(work, &create))
        .stage(stage(work, change))
        .prepare()
        .unwrap();
    assert!(prepared.all_succeeded(), "{:?}", prepared.outcome().stages);
    assert!(
        prepared.outcome().changes.len() >= adds + 250,
        "{}",
        prepared.outcome().changes.len()
    );
    prepared.keep().unwrap()
}

/// Runs `trials` SIGKILLed commits of `adds`+ files, each killed at a random moment in a
/// child running the test `test` (this test, as its child role), stopping early (after at
/// least 10 trials) once `budget` has passed.
fn torture(test: &str, adds: usize, trials: usize, budget: Option<Duration>) {
    // SIGKILL loses no page cache, so a tmpfs shows the same crash states as a disk, without
    // every trial's `syncfs` writing back the previous trial's restore.
    let shm = Path::new("/dev/shm");
    let (tmp, state, work) = if shm.is_dir() {
        common::dirs_in(shm)
    } else {
        dirs()
    };
    let id = prepare(&state, &work, adds);
    let (pristine_state, pristine_work): (PathBuf, PathBuf) =
        (tmp.path().join("p-state"), tmp.path().join("p-work"));
    common::cp_a(&state, &pristine_state);
    common::cp_a(&work, &pristine_work);
    let pre = tree_hash(&work);

    // One uninterrupted commit gives the post-state and the length of the window.
    let mut child = common::spawn_child(test, CHILD_ENV, &state, &id);
    let started = Instant::now();
    assert!(child.wait().unwrap().success());
    let window = started.elapsed();
    let post = tree_hash(&work);
    assert_ne!(pre, post);

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    let (mut saw_pre, mut saw_post) = (0, 0);
    let begun = Instant::now();
    let mut trials_run = 0;
    for trial in 0..trials {
        if budget.is_some_and(|b| trial >= 10 && begun.elapsed() > b) {
            break;
        }
        trials_run += 1;
        common::cp_a(&pristine_state, &state);
        common::cp_a(&pristine_work, &work);
        let mut child = common::spawn_child(test, CHILD_ENV, &state, &id);
        let delay = rng.below(window.as_micros() as u64 * 11 / 10);
        std::thread::sleep(Duration::from_micros(delay));
        let _ = child.kill();
        child.wait().unwrap();
        let report = recover(&state, Some(&work)).unwrap();
        let h = tree_hash(&work);
        assert!(
            h == pre || h == post,
            "trial {trial} (seed {seed}, kill after {delay}us): workdir is neither pre nor post; recovery: {report:?}"
        );
        assert!(
            staging_leftovers(&work).is_empty(),
            "trial {trial} (seed {seed})"
        );
        if h == pre {
            saw_pre += 1;
        } else {
            saw_post += 1;
        }
    }
    eprintln!(
        "crash torture: {trials_run} of {trials} trials over a {window:?} commit of {adds}+ files: {saw_pre} pre, {saw_post} post (seed {seed})"
    );
}

#[test]
fn a_commit_killed_at_random_moments_recovers_to_exactly_pre_or_post() {
    if let Some(spec) = lockbox_testkit::child_role(CHILD_ENV) {
        return commit_as_child(&spec);
    }
    torture(
        &lockbox_testkit::test_name!(
            "a_commit_killed_at_random_moments_recovers_to_exactly_pre_or_post"
        ),
        2000,
        100,
        None,
    );
}

#[test]
fn a_killed_commit_recovers_as_uid_65534_too() {
    if let Some(spec) = lockbox_testkit::child_role(CHILD_ENV) {
        return commit_as_child(&spec);
    }
    let name = lockbox_testkit::test_name!("a_killed_commit_recovers_as_uid_65534_too");
    if common::is_nobody_rerun() {
        torture(&name, 2000, 20, None);
    } else {
        common::rerun_as_nobody(&name);
    }
}

/// 5,000 files and 500 trials: minutes. CI runs it with a time budget
/// (`LOCKBOX_TXN_LONG_CRASH_SECONDS`, scripts/test.sh).
#[test]
#[ignore = "long"]
fn long_crash_torture_with_more_files_and_trials() {
    if let Some(spec) = lockbox_testkit::child_role(CHILD_ENV) {
        return commit_as_child(&spec);
    }
    torture(
        &lockbox_testkit::test_name!("long_crash_torture_with_more_files_and_trials"),
        5000,
        500,
        long_budget(),
    );
}
