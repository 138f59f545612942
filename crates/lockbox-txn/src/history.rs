//! A Jepsen-style history checker for concurrent commits on one workdir.
//!
//! Each round, a few racers do read-modify-write on shared counter files at once: each reads
//! one or two counters, writes each back incremented (most of them also `touch -d` a fixed
//! mtime, so two racers that read the same value write the *same bytes and mtime*: the
//! issue-15 lost update) and sometimes a log file of its own. A racer is an optimistic
//! transaction, a transaction under each lock mode (`FailIfBusy`, `Wait`), or a branch
//! commit (what `lockbox run --workdir` does). Afterwards the workdir must equal a serial
//! execution of exactly the racers that committed: for every counter, the committed racers
//! that touched it read 0, 1, ..., n-1 (one each) and its value is n; the orders these imply
//! across counters have no cycle (a serial order exists); a racer's log exists iff it
//! committed; nothing else is left.
//!
//! Cheap by design (a few ms per racer): the library API in-process — the transaction's
//! begin (base), flatten, base check and WAL commit, the lock modes, `Branch::create` and
//! `Branch::commit` — with each racer's "sandbox" a real overlayfs mount in a user namespace
//! (`unshare -Urm`, as in lockbox-cow's tests), not a whole sandbox: isolation is not what
//! is under test. End-to-end pipelines race in `tests/it/concurrency.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;

use lockbox_cow::{Branch, CommitOptions};

use crate::options::{self, TxnOptions};
use crate::pipeline::{empty_outcome, finish_prepare};
use crate::record::TxnKind;
use crate::LockPolicy;

/// Counter files `c0`, `c1`, ... in the workdir, all starting at 0.
const COUNTERS: usize = 3;
/// Racers per round.
const RACERS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Optimistic,
    FailIfBusy,
    Wait,
    Branch,
}

/// What one racer did and saw.
#[derive(Debug, Clone)]
struct Racer {
    n: usize,
    kind: Kind,
    /// The counters it increments.
    counters: Vec<usize>,
    /// Writes `touch -d @1700000000` after each counter: equal bytes *and* mtime for racers
    /// that read the same value.
    fixed_mtime: bool,
    /// Also writes `log_<n>`.
    log: bool,
    /// Sleeps this long (ms) between its reads and its writes.
    pause_ms: u8,
    /// (counter, value) it read; empty if it never ran (busy).
    reads: Vec<(usize, u64)>,
    /// Exited 0: the commit happened.
    committed: bool,
    /// The error code, when refused (exit 5: stale base or busy).
    refused: Option<&'static str>,
}

impl Racer {
    fn script(&self) -> String {
        let mut s = String::new();
        for c in &self.counters {
            let _ = write!(s, "n{c}=$(cat c{c}) && echo {c}=$n{c} && ");
        }
        if self.pause_ms > 0 {
            let _ = write!(s, "sleep 0.00{} && ", self.pause_ms);
        }
        for c in &self.counters {
            let _ = write!(s, "echo $((n{c}+1)) > c{c} && ");
            if self.fixed_mtime {
                let _ = write!(s, "touch -d @1700000000 c{c} && ");
            }
        }
        if self.log {
            let _ = write!(s, "echo {} > log_{} && ", self.n, self.n);
        }
        s.push_str("true");
        s
    }
}

/// xorshift64*: enough randomness for schedules, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Runs `script` in `lower` seen through an overlay with `upper`, inside a user+mount
/// namespace (the sandbox's view, without the sandbox); its stdout.
fn in_overlay(lower: &Path, upper: &Path, work: &Path, script: &str) -> String {
    let l = sh_quote(lower);
    let full = format!(
        "mount -t overlay overlay -o lowerdir={l},upperdir={},workdir={},userxattr {l} || exit 99\n\
         cd {l} || exit 98\n{script}",
        sh_quote(upper),
        sh_quote(work),
    );
    let out = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &full])
        .output()
        .expect("unshare");
    assert!(
        out.status.success(),
        "racer script failed ({}): {script}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn parse_reads(stdout: &str) -> Vec<(usize, u64)> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(c, v)| (c.parse().expect("counter"), v.parse().expect("value")))
        .collect()
}

/// Runs one racer to its end; fills in `reads`, `committed`, `refused`.
fn race(racer: &mut Racer, state: &Path, work: &Path) {
    let script = racer.script();
    let lock = match racer.kind {
        Kind::Optimistic => LockPolicy::Optimistic,
        Kind::FailIfBusy => LockPolicy::FailIfBusy,
        Kind::Wait => LockPolicy::Wait(None),
        Kind::Branch => return race_branch(racer, state, work, &script),
    };
    let opts = TxnOptions {
        lock,
        ..TxnOptions::new(state, work)
    };
    let mut stdout = String::new();
    let result = opts
        .prepare(TxnKind::Pipeline, |txn| {
            let (upper, overlay_work) = txn.new_layer(0)?;
            stdout = in_overlay(txn.workdir(), &upper, &overlay_work, &script);
            let mut outcome = empty_outcome(txn);
            finish_prepare(txn, &[upper], &mut outcome)?;
            Ok((outcome, true))
        })
        .and_then(options::run);
    racer.reads = parse_reads(&stdout);
    match result {
        Ok(outcome) => racer.committed = outcome.committed,
        Err(e) => racer.refused = Some(refusal(&e, e.exit_code())),
    }
}

fn race_branch(racer: &mut Racer, state: &Path, work: &Path, script: &str) {
    let branch = Branch::create(state, work, serde_json::Value::Null).expect("branch");
    let stdout = in_overlay(
        branch.workdir(),
        &branch.upper_dir(),
        &branch.work_dir(),
        script,
    );
    racer.reads = parse_reads(&stdout);
    let id = branch.id().clone();
    match branch.commit(&CommitOptions::default()) {
        Ok(_) => racer.committed = true,
        Err(e) => {
            racer.refused = Some(refusal(&e, e.exit_code()));
            lockbox_cow::abort_id(state, &id).expect("abort refused branch");
        }
    }
}

/// The code of an expected refusal (exit 5); anything else fails the test.
fn refusal(e: &dyn std::fmt::Display, exit: u8) -> &'static str {
    assert_eq!(exit, 5, "unexpected failure: {e}");
    let text = e.to_string();
    if text.contains("busy") {
        "WORKDIR_BUSY"
    } else {
        "STALE_BASE"
    }
}

/// Checks that the workdir is a serial execution of exactly the committed racers.
fn check(work: &Path, racers: &[Racer]) -> Result<(), String> {
    let committed: Vec<&Racer> = racers.iter().filter(|r| r.committed).collect();
    // Per counter: the committed racers ordered by what they read, which must be 0..n.
    let mut before: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for c in 0..COUNTERS {
        let value: u64 = std::fs::read_to_string(work.join(format!("c{c}")))
            .map_err(|e| format!("c{c}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("c{c}: {e}"))?;
        let mut chain: Vec<(u64, usize)> = committed
            .iter()
            .filter(|r| r.counters.contains(&c))
            .map(|r| {
                let read = r.reads.iter().find(|(rc, _)| *rc == c).map(|(_, v)| *v);
                (read.unwrap_or(u64::MAX), r.n)
            })
            .collect();
        chain.sort_unstable();
        let reads: Vec<u64> = chain.iter().map(|(v, _)| *v).collect();
        let serial: Vec<u64> = (0..chain.len() as u64).collect();
        if reads != serial || value != chain.len() as u64 {
            return Err(format!(
                "c{c} = {value}, but the committed racers touching it read {reads:?} \
                 (racers {:?}): no serial order gives that (a lost update)",
                chain.iter().map(|(_, n)| n).collect::<Vec<_>>()
            ));
        }
        for pair in chain.windows(2) {
            before.entry(pair[0].1).or_default().push(pair[1].1);
        }
    }
    // The per-counter orders must fit one serial order: no cycle (Kahn's algorithm).
    let mut indegree: BTreeMap<usize, usize> = committed.iter().map(|r| (r.n, 0)).collect();
    for next in before.values().flatten() {
        *indegree.entry(*next).or_default() += 1;
    }
    let mut ready: Vec<usize> = indegree
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| *n)
        .collect();
    let mut ordered = 0;
    while let Some(n) = ready.pop() {
        ordered += 1;
        for next in before.get(&n).into_iter().flatten() {
            let d = indegree.entry(*next).or_default();
            *d -= 1;
            if *d == 0 {
                ready.push(*next);
            }
        }
    }
    if ordered != committed.len() {
        return Err("the committed racers' reads order them in a cycle: no serial order".into());
    }
    // Exactly the committed racers' other writes, and nothing else.
    let mut expected: Vec<String> = (0..COUNTERS).map(|c| format!("c{c}")).collect();
    expected.extend(
        committed
            .iter()
            .filter(|r| r.log)
            .map(|r| format!("log_{}", r.n)),
    );
    expected.sort();
    let mut found: Vec<String> = std::fs::read_dir(work)
        .map_err(|e| e.to_string())?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    found.sort();
    if found != expected {
        return Err(format!("workdir holds {found:?}, expected {expected:?}"));
    }
    Ok(())
}

fn draw(rng: &mut Rng, n: usize, kinds: &[Kind]) -> Racer {
    let kind = kinds[rng.below(kinds.len() as u64) as usize];
    let first = rng.below(COUNTERS as u64) as usize;
    let mut counters = vec![first];
    if rng.below(3) == 0 {
        let second = (first + 1 + rng.below(COUNTERS as u64 - 1) as usize) % COUNTERS;
        counters.push(second);
    }
    Racer {
        n,
        kind,
        counters,
        fixed_mtime: rng.below(4) != 0,
        log: rng.below(2) == 0,
        pause_ms: rng.below(4) as u8,
        reads: Vec::new(),
        committed: false,
        refused: None,
    }
}

/// Plays `rounds` rounds; the first violation fails with the round's history.
fn play(rounds: usize, kinds: &[Kind]) -> (usize, usize) {
    let seed = std::env::var("LOCKBOX_TXN_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    let mut rng = Rng(seed);
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let tmp = tempfile::tempdir_in(&base).expect("tempdir");
    let state = tmp.path().join("state");
    let (mut committed, mut total) = (0, 0);
    for round in 0..rounds {
        let work = tmp.path().join(format!("work{round}"));
        std::fs::create_dir_all(&work).unwrap();
        for c in 0..COUNTERS {
            std::fs::write(work.join(format!("c{c}")), "0\n").unwrap();
        }
        let mut racers: Vec<Racer> = (0..RACERS)
            .map(|i| draw(&mut rng, round * RACERS + i, kinds))
            .collect();
        let barrier = Barrier::new(RACERS);
        std::thread::scope(|s| {
            for racer in racers.iter_mut() {
                let (state, work, barrier) = (&state, &work, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    race(racer, state, work);
                });
            }
        });
        if let Err(why) = check(&work, &racers) {
            let mut history = String::new();
            for r in &racers {
                let _ = writeln!(
                    history,
                    "  racer {} {:?} counters {:?} fixed_mtime {} log {}: read {:?}, {}",
                    r.n,
                    r.kind,
                    r.counters,
                    r.fixed_mtime,
                    r.log,
                    r.reads,
                    match (r.committed, r.refused) {
                        (true, _) => "committed (exit 0)".to_owned(),
                        (false, Some(code)) => format!("refused ({code}, exit 5)"),
                        (false, None) => "not committed".to_owned(),
                    }
                );
            }
            panic!("round {round} (LOCKBOX_TXN_HISTORY_SEED={seed}): {why}\n{history}");
        }
        committed += racers.iter().filter(|r| r.committed).count();
        total += racers.len();
        std::fs::remove_dir_all(&work).unwrap();
    }
    (committed, total)
}

/// True if an overlay can be mounted in a user namespace here; loud skip otherwise (a
/// failure under `LOCKBOX_TEST_REQUIRE=all`).
fn require_overlay() -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    for sub in ["l", "u", "w"] {
        std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
    }
    let ok = Command::new("unshare")
        .args(["-Urm", "sh", "-c"])
        .arg(format!(
            "mount -t overlay overlay -o lowerdir={0}/l,upperdir={0}/u,workdir={0}/w,userxattr {0}/l",
            dir.path().display()
        ))
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert_ne!(
            std::env::var("LOCKBOX_TEST_REQUIRE").as_deref(),
            Ok("all"),
            "overlayfs in a user namespace is required (LOCKBOX_TEST_REQUIRE=all)"
        );
        eprintln!("SKIP: cannot mount overlayfs in an unprivileged user namespace here");
    }
    ok
}

fn rounds(default: usize) -> usize {
    std::env::var("LOCKBOX_TXN_HISTORY_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const AS_NOBODY: &str = "LOCKBOX_TXN_HISTORY_AS_NOBODY";

/// Re-runs the test `name` as uid/gid 65534 (when root), with fewer rounds.
fn rerun_as_nobody(name: &str) {
    if std::env::var_os(AS_NOBODY).is_some() || !rustix::process::geteuid().is_root() {
        return;
    }
    let status = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(AS_NOBODY, "1")
        .env("LOCKBOX_TXN_HISTORY_ROUNDS", "40")
        .env("TMPDIR", "/tmp")
        .status();
    match status {
        Ok(s) => assert!(s.success(), "{name} as uid 65534: {s}"),
        Err(e) => eprintln!("SKIP {name} as uid 65534: setpriv: {e}"),
    }
}

#[test]
fn racing_commits_of_every_kind_form_a_serial_history() {
    if !require_overlay() {
        return;
    }
    let kinds = [Kind::Optimistic, Kind::FailIfBusy, Kind::Wait, Kind::Branch];
    let (committed, total) = play(rounds(200), &kinds);
    eprintln!("{committed} of {total} racers committed");
    assert!(committed > 0);
    rerun_as_nobody("history::racing_commits_of_every_kind_form_a_serial_history");
}

/// Optimistic racers alone conflict most: most are refused, and those that commit must
/// still form a serial history.
#[test]
fn racing_optimistic_commits_form_a_serial_history() {
    if !require_overlay() {
        return;
    }
    let (committed, total) = play(rounds(100), &[Kind::Optimistic, Kind::Branch]);
    eprintln!("{committed} of {total} racers committed");
    assert!(committed > 0);
}
