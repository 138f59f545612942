//! Journaled sandbox work (issue 6): a transaction step stays exactly-once on the workspace
//! across a crash between its commit and its journal append, and an exec step is replayed
//! from the journal instead of running again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use common::{dirs, rerun_as_nobody, stage, staging_leftovers};
use lockbox_journal::{
    EntryBody, Journal, RawEntry, RunId, SqliteStorage, StartOptions, Storage, StorageError,
};
use lockbox_policy::Policy;
use lockbox_txn::{record_exec, record_transaction, Pipeline, Transaction, TxnState};

const CHILD_ENV: &str = "LOCKBOX_TXN_JOURNALED_CHILD";

/// SQLite storage that lets the run's start entry through and then, at the step's append,
/// says so and hangs: the parent SIGKILLs the process right there, after the commit.
#[derive(Debug)]
struct HangAtStepAppend(SqliteStorage);

#[async_trait]
impl Storage for HangAtStepAppend {
    async fn acquire_session(&self, run: &RunId) -> Result<u64, StorageError> {
        self.0.acquire_session(run).await
    }
    async fn append(&self, run: &RunId, entry: RawEntry) -> Result<(), StorageError> {
        if entry.offset > 0 {
            println!("appending step");
            std::future::pending::<()>().await;
        }
        self.0.append(run, entry).await
    }
    async fn read(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError> {
        self.0.read(run, from).await
    }
    async fn list_runs(&self) -> Result<Vec<RunId>, StorageError> {
        self.0.list_runs().await
    }
}

/// The step: appends one line to `log` in the workdir (so a second commit would show).
fn append_once(state: &Path, work: &Path) -> Transaction {
    Pipeline::new(state, work)
        .stage(stage(work, "echo applied >> log"))
        .into()
}

#[tokio::test]
#[ignore = "child process of journaled_transaction_is_exactly_once_across_a_crash_after_commit"]
async fn journaled_child() {
    let Ok(base) = std::env::var(CHILD_ENV) else {
        return;
    };
    let base = PathBuf::from(base);
    let (state, work) = (base.join("state"), base.join("work"));
    let storage = HangAtStepAppend(SqliteStorage::open(base.join("j.db")).unwrap());
    let journal = Journal::open(Arc::new(storage));
    let run = journal
        .start(&RunId::parse("agent").unwrap(), StartOptions::default())
        .await
        .unwrap();
    let _ = record_transaction(&run, "apply", &state, append_once(&state, &work)).await;
}

/// Runs the child until it reaches the step's append, then SIGKILLs it.
fn kill_at_step_append(base: &Path) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!("journaled_child").as_str(),
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, base)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let reached = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("appending step"));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(reached, "the child never reached the append ({status})");
    assert_eq!(status.signal(), Some(9));
}

#[tokio::test]
async fn journaled_transaction_is_exactly_once_across_a_crash_after_commit() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let (tmp, state, work) = dirs();
    kill_at_step_append(tmp.path());
    let log = work.join("log");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "applied\n");

    let journal = Journal::open(Arc::new(
        SqliteStorage::open(tmp.path().join("j.db")).unwrap(),
    ));
    let id = RunId::parse("agent").unwrap();
    let steps = |entries: &[lockbox_journal::Entry]| {
        entries
            .iter()
            .filter(|e| matches!(e.body, EntryBody::Step { .. }))
            .count()
    };
    assert_eq!(steps(&journal.entries(&id, 0).await.unwrap()), 0);

    // The replay finds the commit in the transaction store and journals it: no second commit.
    let run = journal.start(&id, StartOptions::default()).await.unwrap();
    let outcome = record_transaction(&run, "apply", &state, append_once(&state, &work))
        .await
        .unwrap();
    assert!(outcome.committed);
    assert_eq!(outcome.changes.to_lines(), "A log\n");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "applied\n");
    assert_eq!(steps(&journal.entries(&id, 0).await.unwrap()), 1);
    drop(run);

    // And the next replay is a plain memo hit.
    let run = journal.start(&id, StartOptions::default()).await.unwrap();
    let again = record_transaction(&run, "apply", &state, append_once(&state, &work))
        .await
        .unwrap();
    assert_eq!(again.id, outcome.id);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "applied\n");
    let records = lockbox_txn::list(&state).unwrap();
    assert_eq!(records.len(), 1, "one transaction, committed once");
    assert!(matches!(&records[0], lockbox_txn::ListedTxn::Ok(r)
        if r.state == TxnState::Committed && r.key.as_deref() == Some("agent/apply")));
    assert!(staging_leftovers(&work).is_empty());
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "journaled_transaction_is_exactly_once_across_a_crash_after_commit"
    ));
}

#[tokio::test]
async fn a_journaled_transaction_that_aborted_runs_again_under_its_key_after_a_crash() {
    // A failed attempt left by a dead process (here: aborted) does not block the key.
    let (tmp, state, work) = dirs();
    let journal = Journal::open(Arc::new(
        SqliteStorage::open(tmp.path().join("j.db")).unwrap(),
    ));
    let id = RunId::parse("agent").unwrap();
    Pipeline::new(&state, &work)
        .key("agent/apply")
        .stage(stage(&work, "echo half >> log; exit 3"))
        .run()
        .unwrap();
    let run = journal.start(&id, StartOptions::default()).await.unwrap();
    let outcome = record_transaction(&run, "apply", &state, append_once(&state, &work))
        .await
        .unwrap();
    assert!(outcome.committed, "{outcome:?}");
    assert_eq!(
        std::fs::read_to_string(work.join("log")).unwrap(),
        "applied\n"
    );
    // The committed key refuses to run again outside the journal.
    let err = Pipeline::new(&state, &work)
        .key("agent/apply")
        .stage(stage(&work, "true"))
        .run()
        .unwrap_err();
    assert_eq!(err.code(), "TXN_WRONG_STATE");
}

#[tokio::test]
async fn a_journaled_exec_replays_without_running_again() {
    let (tmp, _state, work) = dirs();
    let journal = Journal::open(Arc::new(
        SqliteStorage::open(tmp.path().join("j.db")).unwrap(),
    ));
    let id = RunId::parse("agent").unwrap();
    let mut policy = Policy::default();
    policy.fs.write.push(work.clone());
    let argv = |script: &str| {
        vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("cd '{}' && {script}", work.display()).into(),
        ]
    };
    let script = "echo ran >> count; echo out; echo err >&2; exit 4";
    let run = journal.start(&id, StartOptions::default()).await.unwrap();
    let first = record_exec(&run, "tests", policy.clone(), argv(script))
        .await
        .unwrap();
    assert_eq!(first.result.exit_code, 4);
    assert_eq!(first.stdout, "out\n");
    assert_eq!(first.result.stderr_tail, "err\n");
    drop(run);
    let run = journal.start(&id, StartOptions::default()).await.unwrap();
    let replayed = record_exec(&run, "tests", policy, argv(script))
        .await
        .unwrap();
    assert_eq!(replayed, first);
    assert_eq!(
        std::fs::read_to_string(work.join("count")).unwrap(),
        "ran\n",
        "the command ran once"
    );
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_journaled_exec_replays_without_running_again"
    ));
}
