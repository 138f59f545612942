//! `bench/session`: session exec round trip through the Rust API against a baseline that
//! drives a warm bash with the seed's FIFO-and-labeler script, many sessions at once,
//! sandbox create → first exec latency (started, and taken from a warm pool), and forks of a
//! snapshot of a large upper layer.
//!
//! ```text
//! cargo bench -p lockbox-runtime --bench session -- [--rounds N] [--sessions S] [--commands C] \
//!     [--creates K] [--pool P] [--fork-files F] [--fork-bytes B] [--forks N] [--fork-rounds R]
//! ```
//!
//! Prints a Markdown table; asserts no timings (numbers go to docs/benchmarks.md with the
//! command that made them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary, not library code

use lockbox_runtime::{ExecRequest, Runtime, RuntimeConfig, SandboxSpec, SessionOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

struct Args {
    rounds: usize,
    sessions: usize,
    commands: usize,
    creates: usize,
    pool: usize,
    fork_files: usize,
    fork_bytes: usize,
    forks: usize,
    fork_rounds: usize,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 2000,
        sessions: 50,
        commands: 200,
        creates: 20,
        pool: 2,
        fork_files: 5000,
        fork_bytes: 100 << 20,
        forks: 10,
        fork_rounds: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = || it.next().unwrap().parse().unwrap();
        match flag.as_str() {
            "--rounds" => a.rounds = num(),
            "--sessions" => a.sessions = num(),
            "--commands" => a.commands = num(),
            "--creates" => a.creates = num(),
            "--pool" => a.pool = num(),
            "--fork-files" => a.fork_files = num(),
            "--fork-bytes" => a.fork_bytes = num(),
            "--forks" => a.forks = num(),
            "--fork-rounds" => a.fork_rounds = num(),
            _ => {} // cargo bench passes --bench
        }
    }
    a
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn row(name: &str, mut samples: Vec<Duration>, extra: &str) {
    samples.sort();
    println!(
        "| {name} | {} | {} | {} | {} | {extra} |",
        samples.len(),
        ms(pct(&samples, 0.5)),
        ms(pct(&samples, 0.95)),
        ms(pct(&samples, 0.99)),
    );
}

fn echo_hi() -> ExecRequest {
    ExecRequest {
        command: "echo hi".into(),
        ..ExecRequest::default()
    }
}

/// The seed's FIFO-and-labeler wrapper around one command, run by a warm bash reading its
/// stdin; completion is the exit-code file appearing (polled every 50 µs, which favours the
/// baseline).
fn baseline(rounds: usize, dir: &Path) -> Vec<Duration> {
    use std::process::{Command, Stdio};
    let mut bash = Command::new("bash")
        .args(["--norc", "--noprofile"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = bash.stdin.take().unwrap();
    let d = dir.display();
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let exit = dir.join(format!("exit-{i}"));
        let script = format!(
            r#"{{
  log={d}/log-{i}
  sp={d}/out-{i}.fifo
  ep={d}/err-{i}.fifo
  cleanup() {{ rm -f "$sp" "$ep"; }}
  trap 'cleanup' EXIT HUP INT TERM
  rm -f "$sp" "$ep" && mkfifo "$sp" "$ep" || exit 1
  (while IFS= read -r line || [[ -n "$line" ]]; do printf '\x01\x01\x01%s\n' "$line"; done < "$sp") >> "$log" & r1=$!
  (while IFS= read -r line || [[ -n "$line" ]]; do printf '\x02\x02\x02%s\n' "$line"; done < "$ep") >> "$log" & r2=$!
  {{ echo hi; }} > "$sp" 2> "$ep"
  EXIT_CODE=$?
  wait "$r1" "$r2"
  echo "$EXIT_CODE" > {exit}.tmp && mv {exit}.tmp {exit}
  cleanup
}}
"#,
            exit = exit.display()
        );
        let start = Instant::now();
        stdin.write_all(script.as_bytes()).unwrap();
        while !exit.exists() {
            std::thread::sleep(Duration::from_micros(50));
        }
        let log = std::fs::read(dir.join(format!("log-{i}"))).unwrap();
        samples.push(start.elapsed());
        assert_eq!(log, b"\x01\x01\x01hi\n");
    }
    drop(stdin);
    let _ = bash.wait();
    samples
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = args();
    let state = tempfile::tempdir().unwrap();
    let mut config = RuntimeConfig::new(state.path());
    config.agent_exe = Some(lockbox_testkit::sandboxes::built_agent());
    config.max_sandboxes = 1024;
    // The runtime's default bound is 16 sessions per sandbox; the concurrency row uses more.
    config.max_sessions = config.max_sessions.max(a.sessions + 1);
    let rt = Runtime::open(config).unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average before: {}", load.trim());
    println!();
    println!("| measurement | n | p50 | p95 | p99 | notes |");
    println!("|---|---|---|---|---|---|");

    // 1. Warm session round trip.
    let info = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    for _ in 0..50 {
        sb.exec(echo_hi()).await.unwrap();
    }
    let mut samples = Vec::with_capacity(a.rounds);
    for _ in 0..a.rounds {
        let t = Instant::now();
        let r = sb.exec(echo_hi()).await.unwrap();
        samples.push(t.elapsed());
        assert_eq!(&r.stdout[..], b"hi\n");
    }
    row("exec(\"echo hi\"), warm session, Rust API", samples, "");

    // 2. Baseline: the seed's script on a warm bash (on the host, no sandbox).
    let dir = tempfile::tempdir().unwrap();
    let base = baseline(a.rounds.min(500), dir.path());
    row(
        "baseline: FIFO + labelers script, warm bash",
        base,
        "host bash, exit file polled every 50 µs",
    );

    // 3. Many sessions at once.
    let mut ids = Vec::new();
    for i in 0..a.sessions {
        let id = format!("s{i}");
        sb.create_session(SessionOptions {
            id: Some(id.as_str().into()),
            ..SessionOptions::default()
        })
        .await
        .unwrap();
        ids.push(id);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for id in ids {
        let sb = sb.clone();
        let n = a.commands;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            let mut errors = 0;
            for _ in 0..n {
                let mut req = echo_hi();
                req.session = Some(id.as_str().into());
                let t = Instant::now();
                match sb.exec(req).await {
                    Ok(r) if &r.stdout[..] == b"hi\n" => lat.push(t.elapsed()),
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await.unwrap();
        all.extend(lat);
        errors += e;
    }
    let wall = start.elapsed();
    let total = a.sessions * a.commands;
    row(
        &format!(
            "{} sessions × {} commands, concurrent",
            a.sessions, a.commands
        ),
        all,
        &format!(
            "{:.0} commands/s, {errors} errors, wall {:.2} s",
            total as f64 / wall.as_secs_f64(),
            wall.as_secs_f64()
        ),
    );
    rt.delete_sandbox(&info.id).await.unwrap();

    // 4. Create → first exec result.
    let mut samples = Vec::new();
    for _ in 0..a.creates {
        let t = Instant::now();
        let info = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
        let sb = rt.sandbox(&info.id).unwrap();
        let r = sb.exec(echo_hi()).await.unwrap();
        samples.push(t.elapsed());
        assert_eq!(&r.stdout[..], b"hi\n");
        rt.delete_sandbox(&info.id).await.unwrap();
    }
    row(
        "create sandbox → first exec result",
        samples,
        "default policy, no workdir",
    );

    // 5. Create → first exec result, from a warm pool (each round waits for the refill,
    //    as creations spaced out by more than a start would find it).
    let pool_state = tempfile::tempdir().unwrap();
    let mut config = RuntimeConfig::new(pool_state.path());
    config.agent_exe = Some(lockbox_testkit::sandboxes::built_agent());
    config.pool_size = a.pool;
    let pooled = Runtime::open(config).unwrap();
    let mut samples = Vec::new();
    let mut creates = Vec::new();
    for _ in 0..a.creates {
        while pooled.pool_ready() < a.pool {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = Instant::now();
        let info = pooled.create_sandbox(SandboxSpec::default()).await.unwrap();
        creates.push(t.elapsed());
        let sb = pooled.sandbox(&info.id).unwrap();
        let r = sb.exec(echo_hi()).await.unwrap();
        samples.push(t.elapsed());
        assert_eq!(&r.stdout[..], b"hi\n");
        pooled.delete_sandbox(&info.id).await.unwrap();
    }
    row(
        "create sandbox → first exec result, warm pool",
        samples,
        &format!("default policy, no workdir, --pool {}", a.pool),
    );
    row("of which create_sandbox, warm pool", creates, "");
    pooled_fork_row(&pooled, &a).await;
    pooled.shutdown().await;

    // 6. Forks of a snapshot of a large upper layer.
    fork_rows(&rt, &a).await;

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!();
    println!("load average after: {}", load.trim());
}

/// Create from a snapshot → first exec result, with the pool's spare forks of that snapshot
/// ready (armed after its first fork; each round waits for the refill, as a caller
/// pausing between forks would see it).
async fn pooled_fork_row(pooled: &Runtime, a: &Args) {
    let work = tempfile::tempdir().unwrap();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        on_exit: lockbox_runtime::OnExit::Abort,
        ..SandboxSpec::default()
    };
    let info = pooled.create_sandbox(spec).await.unwrap();
    let sb = pooled.sandbox(&info.id).unwrap();
    let r = sb.exec(ExecRequest {
        command: "mkdir src && seq 1 1000 > src/a && cd src && export V=1".into(),
        ..ExecRequest::default()
    });
    assert_eq!(r.await.unwrap().exit_code, 0);
    let snap = sb.snapshot(None).await.unwrap();
    let first = pooled.fork_snapshot(&snap.id, 1).await.unwrap();
    pooled.delete_sandbox(&first[0].id).await.unwrap();
    let one = first_exec_from(pooled, &snap.id, a.creates, 2 * a.pool).await;
    row(
        "create from a snapshot → first exec result, warm pool",
        one,
        &format!(
            "fork_snapshot(id, 1) + exec, spare forks of it ready, --pool {}",
            a.pool
        ),
    );
    pooled.delete_sandbox(&info.id).await.unwrap();
    pooled.delete_snapshot(&snap.id).await.unwrap();
}

/// `n` times: one sandbox from snapshot `id`, to its first command's result (each time
/// once `ready` sandboxes of the pool are, its refill done).
async fn first_exec_from(rt: &Runtime, id: &str, n: usize, ready: usize) -> Vec<Duration> {
    let mut one = Vec::new();
    for _ in 0..n {
        while rt.pool_ready() < ready {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let t = Instant::now();
        let forks = rt.fork_snapshot(id, 1).await.unwrap();
        let fb = rt.sandbox(&forks[0].id).unwrap();
        let r = fb.exec(echo_hi()).await.unwrap();
        one.push(t.elapsed());
        assert_eq!(&r.stdout[..], b"hi\n");
        rt.delete_sandbox(&forks[0].id).await.unwrap();
    }
    one
}

/// A sandbox writes `fork_files` files of `fork_bytes` in all into its upper; it is
/// snapshotted, and `forks` sandboxes are forked from the snapshot, `fork_rounds` times.
async fn fork_rows(rt: &Runtime, a: &Args) {
    let work = tempfile::tempdir().unwrap();
    let spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        on_exit: lockbox_runtime::OnExit::Abort,
        ..SandboxSpec::default()
    };
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    let per = a.fork_bytes / a.fork_files.max(1);
    let dirs = a.fork_files.div_ceil(100);
    let script = format!(
        "set -e; head -c {per} /dev/urandom > /tmp/blob; for d in $(seq 1 {dirs}); do mkdir d$d; \
         for f in $(seq 1 100); do cp /tmp/blob d$d/f$f; done; done; rm /tmp/blob"
    );
    let r = sb
        .exec(ExecRequest {
            command: script,
            timeout: Some(Duration::from_secs(600)),
            ..ExecRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    // A process ticking every millisecond says how long it was stopped.
    let ticker = sb
        .start_process(lockbox_runtime::ProcessSpec {
            command: lockbox_runtime::ProcessCommand::Shell {
                script: "exec python3 -c 'import time\nwhile True:\n print(time.time(), flush=True)\n time.sleep(0.001)' > /tmp/ticks".into(),
                session: None,
            },
            cwd: None,
            env: Default::default(),
            pty: None,
            log_bytes: None,
            stdin: false,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let snap = sb.snapshot(None).await.unwrap();
    let took = t.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gap = sb
        .exec(ExecRequest {
            command: "python3 -c 't=[float(l) for l in open(\"/tmp/ticks\") if l.strip()]\nprint(max(b-a for a,b in zip(t,t[1:])))'".into(),
            ..ExecRequest::default()
        })
        .await
        .unwrap();
    let longest: f64 = String::from_utf8_lossy(&gap.stdout)
        .trim()
        .parse()
        .unwrap_or(f64::NAN);
    row(
        "snapshot of a running sandbox (pause, copy, resume, publish)",
        vec![took],
        &format!(
            "{} entries, {} MB in its upper; a process ticking every ms was stopped {:.1} ms at most",
            snap.entries,
            snap.bytes >> 20,
            longest * 1e3
        ),
    );
    sb.kill_process(&ticker.id, Duration::ZERO).await.unwrap();
    let mut all = Vec::new();
    let mut first_exec = Vec::new();
    for _ in 0..a.fork_rounds {
        let t = Instant::now();
        let forks = rt.fork_snapshot(&snap.id, a.forks).await.unwrap();
        all.push(t.elapsed());
        for f in &forks {
            let fb = rt.sandbox(&f.id).unwrap();
            let t = Instant::now();
            let r = fb.exec(echo_hi()).await.unwrap();
            first_exec.push(t.elapsed());
            assert_eq!(&r.stdout[..], b"hi\n");
        }
        for f in forks {
            rt.delete_sandbox(&f.id).await.unwrap();
        }
    }
    row(
        &format!("fork {} sandboxes from that snapshot (all ready)", a.forks),
        all,
        "fork_snapshot: branches, overlay mounts over the layer, agents",
    );
    row(
        "a fork's first exec result",
        first_exec,
        "after fork_snapshot returned (its default session starts)",
    );
    let one = first_exec_from(rt, &snap.id, a.creates, 0).await;
    row(
        "create from that snapshot → first exec result",
        one,
        "fork_snapshot(id, 1) + exec, not pooled",
    );
    rt.delete_sandbox(&info.id).await.unwrap();
    rt.delete_snapshot(&snap.id).await.unwrap();
}
