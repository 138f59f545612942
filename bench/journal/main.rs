//! `bench/journal`: durable `record()` latency and throughput per backend, against the raw
//! cost of the same durable write done directly, and replay speed.
//!
//! ```text
//! cargo bench -p lockbox-journal --bench journal -- [--steps N] [--replay N]
//! ```
//!
//! PostgreSQL rows appear when `LOCKBOX_TEST_POSTGRES_URL` is set. Prints a Markdown table;
//! asserts no timings (numbers go to docs/benchmarks.md with the command that made them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockbox_journal::{
    FileStorage, Journal, PostgresStorage, RunId, SqliteStorage, StartOptions, Storage,
};

struct Args {
    steps: usize,
    replay: usize,
}

fn args() -> Args {
    let mut a = Args {
        steps: 300,
        replay: 20_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--steps" => a.steps = it.next().unwrap().parse().unwrap(),
            "--replay" => a.replay = it.next().unwrap().parse().unwrap(),
            _ => {} // cargo bench passes --bench
        }
    }
    a
}

/// Prints one table row and returns the p50 in µs.
fn row(what: &str, samples: &mut [Duration], wall: Duration) -> f64 {
    samples.sort();
    let pct = |p: f64| {
        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    println!(
        "| {what} | {} | {:.0} | {:.0} | {:.0} |",
        samples.len(),
        pct(0.5),
        pct(0.99),
        samples.len() as f64 / wall.as_secs_f64()
    );
    pct(0.5)
}

fn line() -> Vec<u8> {
    let mut l = br#"{"crc32":"00000000","entry":{"format":1,"run":"bench","offset":0,"session":1,"at_ms":0,"kind":"step","step_id":"llm","name":"llm","outcome":{"ok":"#.to_vec();
    l.extend_from_slice(format!("\"{}\"", "x".repeat(100)).as_bytes());
    l.extend_from_slice(b"}}}\n");
    l
}

/// The raw durable write a backend's append is compared with.
enum Raw {
    /// `write(2)` of one line + `fdatasync`, on one open file.
    File(std::fs::File),
    /// One autocommit `INSERT` (WAL, `synchronous=FULL`).
    Sqlite(rusqlite::Connection),
    /// One `INSERT` round trip (a prepared statement, as the journal's append) into a
    /// logged table (commit waits for the WAL flush).
    Postgres(tokio_postgres::Client, tokio_postgres::Statement),
}

impl Raw {
    async fn write(&mut self, l: &[u8]) {
        match self {
            Self::File(f) => {
                f.write_all(l).unwrap();
                f.sync_data().unwrap();
            }
            Self::Sqlite(c) => {
                c.execute(
                    "INSERT INTO t (line) VALUES (?1)",
                    [std::str::from_utf8(l).unwrap()],
                )
                .unwrap();
            }
            Self::Postgres(c, insert) => {
                let l = std::str::from_utf8(l).unwrap();
                c.execute(insert, &[&l]).await.unwrap();
            }
        }
    }
}

fn raw_file(dir: &std::path::Path) -> Raw {
    Raw::File(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("raw.jsonl"))
            .unwrap(),
    )
}

fn raw_sqlite(dir: &std::path::Path) -> Raw {
    let conn = rusqlite::Connection::open(dir.join("raw.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, line TEXT NOT NULL)")
        .unwrap();
    Raw::Sqlite(conn)
}

async fn raw_postgres(url: &str) -> Raw {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(
            "DROP TABLE IF EXISTS lockbox_bench_raw;
             CREATE TABLE lockbox_bench_raw (k BIGSERIAL PRIMARY KEY, line TEXT NOT NULL)",
        )
        .await
        .unwrap();
    let insert = client
        .prepare("INSERT INTO lockbox_bench_raw (line) VALUES ($1)")
        .await
        .unwrap();
    Raw::Postgres(client, insert)
}

/// One writer, `record()` and the raw write alternating sample by sample, so both see the
/// same disk weather on a shared machine.
async fn one_writer(name: &str, storage: Arc<dyn Storage>, mut raw: Raw, n: usize) {
    let j = Journal::open(storage);
    let run = j
        .start(&RunId::parse("one").unwrap(), StartOptions::default())
        .await
        .unwrap();
    let payload = "x".repeat(100);
    let l = line();
    let (mut rec, mut base) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut rec_wall, mut base_wall) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        let t = Instant::now();
        raw.write(&l).await;
        let d = t.elapsed();
        base.push(d);
        base_wall += d;
        let t = Instant::now();
        let _: String = run
            .record("llm", || async { Ok::<_, ()>(payload.clone()) })
            .await
            .unwrap();
        let d = t.elapsed();
        rec.push(d);
        rec_wall += d;
    }
    let base_p50 = row(&format!("{name}: raw durable write"), &mut base, base_wall);
    let rec_p50 = row(&format!("{name}: record(), 1 writer"), &mut rec, rec_wall);
    println!(
        "| {name}: record() p50 / raw p50 | | {:.2}x | | |",
        rec_p50 / base_p50
    );
}

async fn sixteen_runs(name: &str, storage: Arc<dyn Storage>, n: usize) {
    let j = Journal::open(storage);
    let per_run = (n / 16).max(10);
    let wall = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..16 {
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            let run = j
                .start(
                    &RunId::parse(&format!("many-{r}")).unwrap(),
                    StartOptions::default(),
                )
                .await
                .unwrap();
            let mut samples = Vec::with_capacity(per_run);
            for _ in 0..per_run {
                let t = Instant::now();
                let _: u64 = run
                    .record("step", || async { Ok::<_, ()>(7u64) })
                    .await
                    .unwrap();
                samples.push(t.elapsed());
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.unwrap());
    }
    row(
        &format!("{name}: record(), 16 concurrent runs"),
        &mut samples,
        wall.elapsed(),
    );
}

async fn replay(name: &str, storage: Arc<dyn Storage>, n: usize) {
    let j = Journal::open(storage);
    let id = RunId::parse("replay").unwrap();
    let run = j.start(&id, StartOptions::default()).await.unwrap();
    // Fill through parallel branches so the fill is quick on slow-fsync backends.
    for chunk in 0..(n / 1000).max(1) {
        let branches: lockbox_journal::Branches<'_, ()> = (0..1000)
            .map(|b| {
                (
                    format!("c{chunk}-{b}"),
                    move |ctx: lockbox_journal::Run| async move {
                        let _: u64 = ctx
                            .record("s", || async { Ok::<_, ()>(1u64) })
                            .await
                            .unwrap();
                    },
                )
            })
            .collect();
        run.parallel(branches).await.unwrap();
    }
    drop(run);
    let t = Instant::now();
    let run = j.start(&id, StartOptions::default()).await.unwrap();
    let load = t.elapsed();
    let t = Instant::now();
    let mut hits = 0usize;
    for chunk in 0..(n / 1000).max(1) {
        for b in 0..1000 {
            let child_name = format!("c{chunk}-{b}:s");
            let _: u64 = run
                .record(&child_name, || async { Ok::<_, ()>(2u64) })
                .await
                .unwrap();
            hits += 1;
        }
    }
    let hit_time = t.elapsed();
    println!(
        "| {name}: replay {hits} memo hits | {hits} | start (load) {:.1} ms | | {:.0} hits/s |",
        load.as_secs_f64() * 1e3,
        hits as f64 / hit_time.as_secs_f64()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    println!("| what | samples | p50 µs | p99 µs | ops/s |");
    println!("|---|---|---|---|---|");
    let file: Arc<dyn Storage> = Arc::new(FileStorage::open(dir.path().join("runs")).unwrap());
    one_writer("file", Arc::clone(&file), raw_file(dir.path()), a.steps).await;
    sixteen_runs("file", Arc::clone(&file), a.steps).await;

    let sqlite = SqliteStorage::open(dir.path().join("j.db")).unwrap();
    one_writer(
        "sqlite",
        Arc::new(sqlite.clone()),
        raw_sqlite(dir.path()),
        a.steps,
    )
    .await;
    let before = sqlite.stats();
    sixteen_runs("sqlite", Arc::new(sqlite.clone()), a.steps).await;
    let after = sqlite.stats();
    println!(
        "| sqlite group commit: requests per commit (16 runs) | {} | | | {:.1} |",
        after.requests - before.requests,
        (after.requests - before.requests) as f64 / (after.commits - before.commits).max(1) as f64
    );
    replay("sqlite", Arc::new(sqlite), a.replay).await;
    replay("file", file, a.replay).await;

    if let Ok(url) = std::env::var("LOCKBOX_TEST_POSTGRES_URL") {
        let schema = format!("lockbox_bench_{}", std::process::id());
        let pg: Arc<dyn Storage> = Arc::new(
            PostgresStorage::connect_in_schema(&url, &schema)
                .await
                .unwrap(),
        );
        one_writer(
            "postgres",
            Arc::clone(&pg),
            raw_postgres(&url).await,
            a.steps,
        )
        .await;
        sixteen_runs("postgres", Arc::clone(&pg), a.steps).await;
        replay("postgres", pg, a.replay.min(5_000)).await;
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "DROP SCHEMA {schema} CASCADE; DROP TABLE IF EXISTS lockbox_bench_raw"
            ))
            .await
            .unwrap();
    } else {
        eprintln!("SKIP: postgres rows (LOCKBOX_TEST_POSTGRES_URL is unset)");
    }
}
