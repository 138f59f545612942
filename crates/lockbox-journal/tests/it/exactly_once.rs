//! Issue 6, exactly-once: a writer process commits a transaction and is SIGKILLed before the
//! journal append. Replaying the run must find the commit through the transaction store and
//! not commit again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use lockbox_journal::{
    EntryBody, FileStorage, Journal, RunId, SqliteStorage, StartOptions, StepOutcome, Storage,
    TxnId, TxnOutcome, TxnOutcomeStore, TxnStoreError,
};
use serde_json::json;

const CHILD_ENV: &str = "LOCKBOX_JOURNAL_TXN_CHILD";

/// A stand-in for `lockbox-txn`'s store: a commit appends to `commits.log` (so the test can
/// count them) and durably records the outcome under the transaction id, in that order.
struct FileTxnStore {
    dir: PathBuf,
}

impl FileTxnStore {
    fn outcome_path(&self, txn: &TxnId) -> PathBuf {
        self.dir
            .join(format!("{}.outcome", txn.as_str().replace('/', "__")))
    }

    fn commit(&self, txn: &TxnId, value: &serde_json::Value) {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("commits.log"))
            .unwrap();
        writeln!(log, "{txn} {value}").unwrap();
        log.sync_all().unwrap();
        let tmp = self.dir.join("outcome.tmp");
        std::fs::write(&tmp, value.to_string()).unwrap();
        std::fs::File::open(&tmp).unwrap().sync_all().unwrap();
        std::fs::rename(&tmp, self.outcome_path(txn)).unwrap();
        std::fs::File::open(&self.dir).unwrap().sync_all().unwrap();
    }

    fn commits(&self) -> usize {
        std::fs::read_to_string(self.dir.join("commits.log"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

#[async_trait]
impl TxnOutcomeStore for FileTxnStore {
    async fn outcome(&self, txn: &TxnId) -> Result<Option<TxnOutcome>, TxnStoreError> {
        match std::fs::read_to_string(self.outcome_path(txn)) {
            Ok(text) => Ok(Some(TxnOutcome::Committed(serde_json::from_str(&text)?))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

fn storage(spec: &str, dir: &Path) -> Arc<dyn Storage> {
    match spec {
        "sqlite" => Arc::new(SqliteStorage::open(dir.join("j.db")).unwrap()),
        _ => Arc::new(FileStorage::open(dir.join("runs")).unwrap()),
    }
}

/// The writer: commits, says so, then hangs before `record_txn` can journal the outcome.
#[tokio::test]
#[ignore = "child process of the exactly-once tests, which run it with --ignored"]
async fn txn_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (backend, dir) = spec.split_once(':').unwrap();
    let dir = PathBuf::from(dir);
    let store = FileTxnStore { dir: dir.clone() };
    let j = Journal::open(storage(backend, &dir));
    let run = j
        .start(&RunId::parse("agent").unwrap(), StartOptions::default())
        .await
        .unwrap();
    let _: Result<String, _> = run
        .record_txn("apply", &store, |txn| {
            let store = &store;
            async move {
                store.commit(&txn, &json!("applied-once"));
                println!("committed");
                std::io::stdout().flush().unwrap();
                std::future::pending::<Result<String, String>>().await
            }
        })
        .await;
}

fn kill_after_commit(backend: &str, dir: &Path) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!("txn_child").as_str(),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{backend}:{}", dir.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // A watchdog so a child that never commits fails the test instead of hanging it.
    let pid = child.id().to_string();
    let (done, watchdog) = std::sync::mpsc::channel::<()>();
    let dog = std::thread::spawn(move || {
        // Only a timeout kills: a disconnect means the child was already reaped.
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            watchdog.recv_timeout(std::time::Duration::from_secs(60))
        {
            let _ = Command::new("kill").args(["-9", &pid]).status();
        }
    });
    let stdout = BufReader::new(child.stdout.take().unwrap());
    // libtest prints "test txn_child ... " without a newline first, so match the line's end.
    let committed = stdout
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("committed"));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    drop(done);
    dog.join().unwrap();
    assert!(committed, "child never committed ({status})");
    assert_eq!(
        status.signal(),
        Some(9),
        "child was not SIGKILLed: {status}"
    );
}

async fn replay_does_not_commit_twice(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    kill_after_commit(backend, dir.path());
    let store = FileTxnStore {
        dir: dir.path().to_owned(),
    };
    assert_eq!(store.commits(), 1);
    let j = Journal::open(storage(backend, dir.path()));
    let r = RunId::parse("agent").unwrap();
    let steps = |entries: &[lockbox_journal::Entry]| {
        entries
            .iter()
            .filter(|e| matches!(e.body, EntryBody::Step { .. }))
            .count()
    };
    assert_eq!(
        steps(&j.entries(&r, 0).await.unwrap()),
        0,
        "outcome was journaled"
    );

    let run = j.start(&r, StartOptions::default()).await.unwrap();
    let value: String = run
        .record_txn("apply", &store, |txn| {
            let store = &store;
            async move {
                store.commit(&txn, &json!("applied-twice"));
                Ok::<_, String>("applied-twice".to_owned())
            }
        })
        .await
        .unwrap();
    assert_eq!(value, "applied-once");
    assert_eq!(store.commits(), 1, "the replay committed again");
    let entries = j.entries(&r, 0).await.unwrap();
    assert!(entries.iter().any(|e| matches!(
        &e.body,
        EntryBody::Step { step_id, outcome: StepOutcome::Ok(v), .. }
            if step_id.as_str() == "apply" && v == &json!("applied-once")
    )));
}

#[tokio::test]
async fn sigkill_between_commit_and_append_sqlite() {
    if std::env::var(CHILD_ENV).is_err() {
        replay_does_not_commit_twice("sqlite").await;
    }
}

#[tokio::test]
async fn sigkill_between_commit_and_append_file() {
    if std::env::var(CHILD_ENV).is_err() {
        replay_does_not_commit_twice("file").await;
    }
}
