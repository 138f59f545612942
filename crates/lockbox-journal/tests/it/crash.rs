//! Crash safety: a child process appends steps in a loop and is SIGKILLed at random points,
//! many times. Every restart must reopen the journal, and in the end the run must hold every
//! step the children acknowledged, in order, and no partial entry.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockbox_journal::{
    EntryBody, FileStorage, Journal, PostgresStorage, RunId, SqliteStorage, StartOptions,
    StepOutcome, Storage,
};

const CHILD_ENV: &str = "LOCKBOX_JOURNAL_CRASH_CHILD";
const KILLS: usize = 40;
const POSTGRES_URL_ENV: &str = "LOCKBOX_TEST_POSTGRES_URL";

async fn open(spec: &str) -> Arc<dyn Storage> {
    match spec.split_once(':').unwrap() {
        ("sqlite", path) => Arc::new(SqliteStorage::open(path).unwrap()),
        ("file", dir) => Arc::new(FileStorage::open(dir).unwrap()),
        ("postgres", schema) => {
            let url = std::env::var(POSTGRES_URL_ENV).unwrap();
            Arc::new(
                PostgresStorage::connect_in_schema(&url, schema)
                    .await
                    .unwrap(),
            )
        }
        other => panic!("unknown backend {other:?}"),
    }
}

/// The writer. Runs only when the parent sets `LOCKBOX_JOURNAL_CRASH_CHILD=backend:path`;
/// prints `ack N` once step N is durable.
#[tokio::test]
#[ignore = "child process of the crash tests, which run it with --ignored"]
async fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let j = Journal::open(open(&spec).await);
    let mut out = std::io::stdout().lock();
    // A writer killed while it took its session can still fence this one afterwards: its
    // PostgreSQL backend runs the query it had sent after the client is gone. Being fenced
    // is then the journal working; this writer does what a dispatcher does (starts again,
    // replaying what is journaled), a bounded number of times.
    let fenced = |e: &lockbox_journal::JournalError| {
        matches!(
            e.storage(),
            Some(lockbox_journal::StorageError::Fenced { .. })
        )
    };
    'start: for _ in 0..100 {
        let run = match j
            .start(&RunId::parse("crash").unwrap(), StartOptions::default())
            .await
        {
            Ok(run) => run,
            Err(e) if fenced(&e) => continue 'start,
            Err(e) => panic!("start: {e}"),
        };
        for i in 0..1_000_000u64 {
            let v: u64 = match run.record("step", || async move { Ok::<_, ()>(i) }).await {
                Ok(v) => v,
                Err(lockbox_journal::StepError::Journal(e)) if fenced(&e) => continue 'start,
                Err(e) => panic!("step {i}: {e:?}"),
            };
            assert_eq!(v, i, "replay returned another step's value");
            writeln!(out, "ack {i}").unwrap();
            out.flush().unwrap();
        }
        return;
    }
    panic!("fenced 100 times in a row");
}

/// A small xorshift so the kill points vary without a `rand` dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn kill_loop(spec: &str) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash test seed {seed}");
    let mut rng = Rng(seed);
    let max_acked = Arc::new(AtomicI64::new(-1));
    for round in 0..KILLS {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                lockbox_testkit::test_name!("crash_child").as_str(),
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let acked = Arc::clone(&max_acked);
        let first_ack = Arc::new(AtomicI64::new(-1));
        let first = Arc::clone(&first_ack);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The first ack shares its line with libtest's "test crash_child ... ".
                if let Some(n) = line.find("ack ").map(|i| &line[i + 4..]) {
                    let n: i64 = n.parse().unwrap();
                    let _ = first.compare_exchange(-1, n, Ordering::SeqCst, Ordering::SeqCst);
                    acked.fetch_max(n, Ordering::SeqCst);
                }
            }
        });
        // Some kills land during start-up and replay, most while appending.
        if rng.below(4) != 0 {
            let deadline = Instant::now() + Duration::from_secs(20);
            while first_ack.load(Ordering::SeqCst) < 0 && Instant::now() < deadline {
                if let Some(status) = child.try_wait().unwrap() {
                    let mut err = String::new();
                    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err)
                        .unwrap();
                    panic!("round {round}: writer exited on its own ({status}): {err}");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        reader.join().unwrap();
        if status.signal() != Some(libc_sigkill()) {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("round {round}: writer was not killed but exited ({status}): {err}");
        }
    }
    let acked = max_acked.load(Ordering::SeqCst);
    eprintln!("{spec}: highest acknowledged step {acked} after {KILLS} kills");
    assert!(acked > 0, "no step was ever acknowledged");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let j = Journal::open(open(spec).await);
        let entries = j.entries(&RunId::parse("crash").unwrap(), 0).await.unwrap();
        let values: Vec<u64> = entries
            .iter()
            .filter_map(|e| match &e.body {
                EntryBody::Step {
                    outcome: StepOutcome::Ok(v),
                    ..
                } => v.as_u64(),
                _ => None,
            })
            .collect();
        assert!(
            values.len() as i64 > acked,
            "acknowledged step {acked} lost: journal holds {} steps",
            values.len()
        );
        let expected: Vec<u64> = (0..values.len() as u64).collect();
        assert_eq!(values, expected, "steps out of order or duplicated");
        let starts = entries
            .iter()
            .filter(|e| matches!(e.body, EntryBody::Start { .. }))
            .count();
        assert!(starts >= 2, "only {starts} sessions ever started");
    });
}

fn libc_sigkill() -> i32 {
    9
}

#[test]
fn sigkilled_file_writer_keeps_every_acknowledged_step() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    kill_loop(&format!("file:{}", dir.path().join("runs").display()));
}

#[test]
fn sigkilled_sqlite_writer_keeps_every_acknowledged_step() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    kill_loop(&format!("sqlite:{}", dir.path().join("j.db").display()));
}

#[test]
fn sigkilled_postgres_writer_keeps_every_acknowledged_step() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    lockbox_testkit::require!(
        std::env::var(POSTGRES_URL_ENV).is_ok(),
        "{POSTGRES_URL_ENV} is unset (run `eval \"$(scripts/start-postgres.sh)\"`)"
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!("lbt_crash_{}_{nanos}", std::process::id());
    kill_loop(&format!("postgres:{schema}"));
    let url = std::env::var(POSTGRES_URL_ENV).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    });
}
