//! `bench/session` (HTTP rows): round trip of `exec("echo hi")` on a warm session through
//! `lockbox serve` (real binary, real socket, one keep-alive HTTP/1.1 connection), p50/p99;
//! and throughput of S sessions × C commands driven concurrently over HTTP.
//!
//! ```text
//! cargo build --release -p lockbox-cli
//! cargo bench -p lockbox-server --bench session_http -- [--rounds N] [--sessions S] [--commands C]
//! ```
//!
//! `LOCKBOX_BIN` picks the binary (default: `$CARGO_TARGET_DIR/release/lockbox`). Prints a
//! Markdown table; asserts no timings (numbers go to docs/benchmarks.md with the command).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    rounds: usize,
    sessions: usize,
    commands: usize,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 2000,
        sessions: 50,
        commands: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--rounds" => a.rounds = it.next().unwrap().parse().unwrap(),
            "--sessions" => a.sessions = it.next().unwrap().parse().unwrap(),
            "--commands" => a.commands = it.next().unwrap().parse().unwrap(),
            _ => {} // cargo bench passes --bench
        }
    }
    a
}

struct Server {
    child: Child,
    api: Api,
    _state: tempfile::TempDir,
}

/// Where and how to call the API.
#[derive(Clone)]
struct Api {
    base: String,
    token: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    let bin = std::env::var("LOCKBOX_BIN").unwrap_or_else(|_| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        format!("{target}/release/lockbox")
    });
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(&bin)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--print-token",
            "--state-dir",
        ])
        .arg(state.path())
        .args(["--max-streams", "1024"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e} (build it: cargo build --release -p lockbox-cli)"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let info: Value = serde_json::from_str(&line).unwrap();
    Server {
        child,
        api: Api {
            base: format!("http://{}", info["listen"].as_str().unwrap()),
            token: info["token"].as_str().unwrap().to_owned(),
        },
        _state: state,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

async fn exec(client: &reqwest::Client, s: &Api, id: &str, session: &str) {
    let r: Value = client
        .post(format!("{}/v1/sandboxes/{id}/exec", s.base))
        .bearer_auth(&s.token)
        .json(&json!({ "command": "echo hi", "session": session }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["stdout"], "hi\n", "{r}");
}

fn main() {
    let args = args();
    let server = start();
    let api = server.api.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let created: Value = client
            .post(format!("{}/v1/sandboxes", api.base))
            .bearer_auth(&api.token)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = created["id"].as_str().unwrap().to_owned();
        for n in 0..args.sessions.max(1) {
            client
                .post(format!("{}/v1/sandboxes/{id}/sessions", api.base))
                .bearer_auth(&api.token)
                .json(&json!({ "id": format!("s{n}") }))
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
        }
        // Warm: the session's shell, the connection, the allocator.
        for _ in 0..100 {
            exec(&client, &server.api, &id, "s0").await;
        }
        let mut times = Vec::with_capacity(args.rounds);
        for _ in 0..args.rounds {
            let t = Instant::now();
            exec(&client, &server.api, &id, "s0").await;
            times.push(t.elapsed());
        }
        times.sort();
        println!("| measurement | n | p50 ms | p99 ms | mean ms |");
        println!("|---|---|---|---|---|");
        let mean = times.iter().sum::<Duration>() / times.len() as u32;
        println!(
            "| HTTP exec(\"echo hi\"), warm session, one connection | {} | {} | {} | {} |",
            times.len(),
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(mean)
        );

        // Throughput: one client connection pool, each session driven by its own task.
        let start = Instant::now();
        let mut tasks = Vec::new();
        for n in 0..args.sessions {
            let client = client.clone();
            let (api, id) = (server.api.clone(), id.clone());
            let commands = args.commands;
            tasks.push(tokio::spawn(async move {
                let mut times = Vec::with_capacity(commands);
                for _ in 0..commands {
                    let t = Instant::now();
                    exec(&client, &api, &id, &format!("s{n}")).await;
                    times.push(t.elapsed());
                }
                times
            }));
        }
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        let wall = start.elapsed();
        all.sort();
        if !all.is_empty() {
            println!(
                "| HTTP throughput {} sessions × {} commands: {:.0} commands/s | {} | {} | {} | {} |",
                args.sessions,
                args.commands,
                all.len() as f64 / wall.as_secs_f64(),
                all.len(),
                ms(percentile(&all, 0.5)),
                ms(percentile(&all, 0.99)),
                ms(all.iter().sum::<Duration>() / all.len() as u32)
            );
        }
    });
}
