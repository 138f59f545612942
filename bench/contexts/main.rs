//! `bench/contexts`: `run_code("1+1")` round trip on a warm code context through the Rust
//! API (Python, and `true` in a bash context), and the first run of a new context (the
//! interpreter's start).
//!
//! ```text
//! cargo bench -p lockbox-runtime --bench contexts -- [--rounds N] [--starts K]
//! ```
//!
//! Prints a Markdown table; asserts no timings (numbers go to docs/benchmarks.md with the
//! command that made them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use lockbox_runtime::{ContextOptions, RunCodeRequest, Runtime, RuntimeConfig, SandboxSpec};
use std::time::{Duration, Instant};

fn args() -> (usize, usize) {
    let (mut rounds, mut starts) = (2000, 20);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = || it.next().unwrap().parse().unwrap();
        match flag.as_str() {
            "--rounds" => rounds = num(),
            "--starts" => starts = num(),
            _ => {} // cargo bench passes --bench
        }
    }
    (rounds, starts)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn row(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    println!(
        "| {name} | {} | {} | {} | {} |",
        samples.len(),
        ms(pct(&samples, 0.5)),
        ms(pct(&samples, 0.95)),
        ms(pct(&samples, 0.99)),
    );
}

fn code(c: &str, context: &str) -> RunCodeRequest {
    RunCodeRequest {
        code: c.into(),
        context: Some(context.into()),
        timeout: None,
        env: Vec::new(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (rounds, starts) = args();
    let state = tempfile::tempdir().unwrap();
    let mut config = RuntimeConfig::new(state.path());
    config.agent_exe = Some(lockbox_testkit::sandboxes::built_agent());
    let rt = Runtime::open(config).unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average before: {}", load.trim());
    println!();
    println!("| measurement | n | p50 | p95 | p99 |");
    println!("|---|---|---|---|---|");
    let info = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();

    for (language, snippet, name) in [
        (
            "python",
            "1+1",
            "run_code(\"1+1\"), warm Python context, Rust API",
        ),
        (
            "bash",
            "true",
            "run_code(\"true\"), warm bash context, Rust API",
        ),
    ] {
        let opts = ContextOptions {
            id: Some(language.into()),
            language: lockbox_runtime::Language::from_name(language).unwrap(),
            ..ContextOptions::default()
        };
        sb.create_context(opts).await.unwrap();
        for _ in 0..100 {
            sb.run_code(code(snippet, language)).await.unwrap();
        }
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            let e = sb.run_code(code(snippet, language)).await.unwrap();
            samples.push(t.elapsed());
            assert!(e.error.is_none(), "{e:?}");
        }
        row(name, samples);
    }

    let mut samples = Vec::with_capacity(starts);
    for i in 0..starts {
        let id = format!("start-{i}");
        let opts = ContextOptions {
            id: Some(id.as_str().into()),
            ..ContextOptions::default()
        };
        let t = Instant::now();
        sb.create_context(opts).await.unwrap();
        sb.run_code(code("1+1", &id)).await.unwrap();
        samples.push(t.elapsed());
        sb.delete_context(&id).await.unwrap();
    }
    row(
        "create_context + first run_code(\"1+1\") (python3 start)",
        samples,
    );
    rt.delete_sandbox(&info.id).await.unwrap();
}
