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

fn row(what: &str, samples: &mut [Duration], wall: Duration) {
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
}

fn line() -> Vec<u8> {
    let mut l = br#"{"crc32":"00000000","entry":{"format":1,"run":"bench","offset":0,"session":1,"at_ms":0,"kind":"step","step_id":"llm","name":"llm","outcome":{"ok":"#.to_vec();
    l.extend_from_slice(format!("\"{}\"", "x".repeat(100)).as_bytes());
    l.extend_from_slice(b"}}}\n");
    l
}

fn raw_file(dir: &std::path::Path, n: usize) {
    let path = dir.join("raw.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let l = line();
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&l).unwrap();
        f.sync_data().unwrap();
        samples.push(t.elapsed());
    }
    row("raw file write + fdatasync", &mut samples, wall.elapsed());
}

fn raw_sqlite(dir: &std::path::Path, n: usize) {
    let conn = rusqlite::Connection::open(dir.join("raw.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, line TEXT NOT NULL)")
        .unwrap();
    let l = String::from_utf8(line()).unwrap();
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        conn.execute("INSERT INTO t (line) VALUES (?1)", [&l])
            .unwrap();
        samples.push(t.elapsed());
    }
    row(
        "raw sqlite INSERT (WAL, synchronous=FULL)",
        &mut samples,
        wall.elapsed(),
    );
}

async fn raw_postgres(url: &str, n: usize) {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TEMP TABLE t (k BIGSERIAL PRIMARY KEY, line TEXT NOT NULL)")
        .await
        .unwrap();
    let l = String::from_utf8(line()).unwrap();
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        client
            .execute("INSERT INTO t (line) VALUES ($1)", &[&l])
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    row(
        "raw postgres INSERT round trip",
        &mut samples,
        wall.elapsed(),
    );
}

async fn one_writer(name: &str, storage: Arc<dyn Storage>, n: usize) {
    let j = Journal::open(storage);
    let run = j
        .start(&RunId::parse("one").unwrap(), StartOptions::default())
        .await
        .unwrap();
    let payload = "x".repeat(100);
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let _: String = run
            .record("llm", || async { Ok::<_, ()>(payload.clone()) })
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    row(
        &format!("{name}: record(), 1 writer"),
        &mut samples,
        wall.elapsed(),
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
    raw_file(dir.path(), a.steps);
    let file: Arc<dyn Storage> = Arc::new(FileStorage::open(dir.path().join("runs")).unwrap());
    one_writer("file", Arc::clone(&file), a.steps).await;
    sixteen_runs("file", Arc::clone(&file), a.steps).await;

    raw_sqlite(dir.path(), a.steps);
    let sqlite = SqliteStorage::open(dir.path().join("j.db")).unwrap();
    one_writer("sqlite", Arc::new(sqlite.clone()), a.steps).await;
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
        raw_postgres(&url, a.steps).await;
        let schema = format!("lockbox_bench_{}", std::process::id());
        let pg: Arc<dyn Storage> = Arc::new(
            PostgresStorage::connect_in_schema(&url, &schema)
                .await
                .unwrap(),
        );
        one_writer("postgres", Arc::clone(&pg), a.steps).await;
        sixteen_runs("postgres", Arc::clone(&pg), a.steps).await;
        replay("postgres", pg, a.replay.min(5_000)).await;
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    } else {
        eprintln!("SKIP: postgres rows (LOCKBOX_TEST_POSTGRES_URL is unset)");
    }
}
