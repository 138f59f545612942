//! A pipeline without a transaction (`Pipeline.run()`): every stage starts at once, stage N's
//! stdout feeding stage N+1's stdin like a shell pipeline, each under its own policy; writes
//! go wherever each policy lets them (no layers, no commit).

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use lockbox_confine::{Running, Spawn, Status, Stdio, StopReason, Waited};
use lockbox_policy::Policy;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{json, Value};

use crate::errors;
use crate::txn::check_policies;
use lockbox_txn::StageSpec;

/// Output kept per stream; the rest is read and dropped so no stage blocks on a full pipe.
const KEEP: usize = 64 << 20;

fn pipe() -> PyResult<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| errors::usage(format!("creating a pipe: {e}")))
}

/// Reads `from` to its end, keeping the first [`KEEP`] bytes.
fn drain(from: OwnedFd) -> Vec<u8> {
    let mut from = File::from(from);
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = KEEP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// Reads `a` and `b` to their ends in this one thread, keeping the first [`KEEP`] bytes of
/// each (a run of one command: one thread for its two outputs, not two).
fn drain_two(a: OwnedFd, b: OwnedFd) -> (Vec<u8>, Vec<u8>) {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut open = [Some(a), Some(b)];
    let mut kept = [Vec::new(), Vec::new()];
    let mut buf = vec![0u8; 64 * 1024];
    while open.iter().any(Option::is_some) {
        let polled: Vec<usize> = (0..2).filter(|&i| open[i].is_some()).collect();
        let mut fds: Vec<PollFd<'_>> = open
            .iter()
            .flatten()
            .map(|fd| PollFd::new(fd, PollFlags::IN))
            .collect();
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        let ready: Vec<usize> = polled
            .into_iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(i, _)| i)
            .collect();
        drop(fds);
        for i in ready {
            let Some(fd) = &open[i] else { continue };
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => open[i] = None,
                Ok(n) => {
                    let room = KEEP.saturating_sub(kept[i].len());
                    kept[i].extend_from_slice(&buf[..n.min(room)]);
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(_) => open[i] = None,
            }
        }
    }
    let [a, b] = kept;
    (a, b)
}

struct Started {
    running: Option<Running>,
    started: Instant,
    timeout: Option<Duration>,
    grace: Duration,
    setup_error: Option<String>,
}

/// Runs `stages` (JSON list) as a streaming pipeline with `stdin`. Returns (JSON with every
/// stage's result and stderr, last stdout).
#[pyfunction]
#[pyo3(signature = (stages, stdin=None))]
pub(crate) fn run_plain(
    py: Python<'_>,
    stages: &str,
    stdin: Option<Vec<u8>>,
) -> PyResult<(String, Py<PyBytes>)> {
    let bad = |e: serde_json::Error| errors::usage(format!("stages: {e}"));
    let raw: serde_json::Value = serde_json::from_str(stages).map_err(bad)?;
    check_policies(&raw)?;
    let specs: Vec<StageSpec> = serde_json::from_value(raw).map_err(bad)?;
    if specs.is_empty() {
        return Err(errors::usage("a pipeline needs at least one stage".into()));
    }
    // Checked for every plain run, handed over or not, as `lockbox run` checks it.
    lockbox_cli::check_pre_arm_switch().map_err(errors::usage)?;
    if let [only] = specs.as_slice() {
        return run_one(py, only, stdin.unwrap_or_default());
    }
    let built: Vec<_> = specs.iter().map(|s| (&s.policy, s)).collect();
    let (stdin_r, stdin_w) = pipe()?;
    let mut next_in = Some(stdin_r);
    let mut stderr_readers = Vec::new();
    let mut started = Vec::new();
    let mut last_out = None;
    for (i, (policy, spec)) in built.iter().enumerate() {
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let stdio = Stdio {
            stdin: next_in.take(),
            stdout: Some(out_w),
            stderr: Some(err_w),
        };
        let argv: Vec<OsString> = spec.argv.iter().map(Into::into).collect();
        started.push(start(policy, &argv, stdio, Instant::now()));
        stderr_readers.push(err_r);
        if i + 1 == built.len() {
            last_out = Some(out_r);
        } else {
            next_in = Some(out_r);
        }
    }
    let stdin_bytes = stdin.unwrap_or_default();
    let stage_specs = &specs;
    let (results, stdout) = py.detach(move || {
        std::thread::scope(|scope| {
            let feeder = scope.spawn(move || {
                let mut w = File::from(stdin_w);
                // A stage that exits without reading its stdin is not an error.
                let _ = w.write_all(&stdin_bytes);
            });
            let out = last_out.map(|r| scope.spawn(move || drain(r)));
            let errs: Vec<_> = stderr_readers
                .into_iter()
                .map(|r| scope.spawn(move || drain(r)))
                .collect();
            let mut results = Vec::new();
            for (s, spec) in started.iter_mut().zip(stage_specs) {
                results.push(finish(s, spec));
            }
            drop(started);
            let _ = feeder.join();
            let stdout = out.and_then(|h| h.join().ok()).unwrap_or_default();
            let stderrs: Vec<Vec<u8>> = errs
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect();
            (results, (stdout, stderrs))
        })
    });
    let (stdout, stderrs) = stdout;
    let stages: Vec<Value> = results
        .into_iter()
        .zip(specs.iter())
        .zip(stderrs)
        .map(|(((mut r, said), spec), err)| {
            r["name"] = json!(spec.name);
            r["stderr"] = json!(format!("{said}{}", String::from_utf8_lossy(&err)));
            r
        })
        .collect();
    let json = json!({ "stages": stages }).to_string();
    Ok((json, PyBytes::new(py, &stdout).unbind()))
}

/// A pipeline of one command: handed over to a pre-armed sandbox of this build's pre-arm
/// helper when one answers for its policy (docs/pre-arm.md, "From the Python SDK"), else
/// started directly. The same result either way, but for `pre_armed`.
fn run_one(py: Python<'_>, spec: &StageSpec, stdin: Vec<u8>) -> PyResult<(String, Py<PyBytes>)> {
    let (stdin_r, stdin_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let argv: Vec<OsString> = spec.argv.iter().map(Into::into).collect();
    let ((mut result, said), stdout, stderr) = py.detach(move || {
        std::thread::scope(|scope| {
            // Nothing to feed (the usual case): the command reads the end at once.
            let feeder = (!stdin.is_empty()).then(|| {
                scope.spawn(move || {
                    // A command that exits without reading its stdin is not an error.
                    let _ = File::from(stdin_w).write_all(&stdin);
                })
            });
            let outputs = scope.spawn(move || drain_two(out_r, err_r));
            let t0 = Instant::now();
            let stdio = [stdin_r.as_fd(), out_w.as_fd(), err_w.as_fd()];
            let handed = lockbox_cli::pre_armed_run(&spec.policy, &argv, stdio);
            let result = match handed {
                Ok(Some(end)) => {
                    // The helper had its own copies: the readers see the end once ours go.
                    drop((stdin_r, out_w, err_w));
                    let said = end
                        .exec_failed
                        .map(|errno| exec_failed(spec, errno))
                        .unwrap_or_default();
                    let result = json!({
                        "exit_code": end.exit_code,
                        "signal": end.signal,
                        "timed_out": end.timed_out,
                        "duration": t0.elapsed().as_secs_f64(),
                        "setup_error": null,
                        "pre_armed": true,
                    });
                    (result, said)
                }
                Ok(None) => {
                    let stdio = Stdio {
                        stdin: Some(stdin_r),
                        stdout: Some(out_w),
                        stderr: Some(err_w),
                    };
                    finish(&mut start(&spec.policy, &argv, stdio, t0), spec)
                }
                Err(message) => {
                    drop((stdin_r, out_w, err_w));
                    (not_started(message, t0.elapsed()), String::new())
                }
            };
            if let Some(feeder) = feeder {
                let _ = feeder.join();
            }
            let (stdout, stderr) = outputs.join().unwrap_or_default();
            (result, stdout, stderr)
        })
    });
    result["name"] = json!(spec.name);
    result["stderr"] = json!(format!("{said}{}", String::from_utf8_lossy(&stderr)));
    let json = json!({ "stages": [result] }).to_string();
    Ok((json, PyBytes::new(py, &stdout).unbind()))
}

/// Starts one stage directly (`started` is when its clock starts).
fn start(policy: &Policy, argv: &[OsString], stdio: Stdio, started: Instant) -> Started {
    let (running, setup_error) = match Spawn::command(policy, argv).stdio(stdio).start() {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Started {
        running,
        started,
        timeout: policy.timeout,
        grace: policy.kill_grace,
        setup_error,
    }
}

/// A stage's result when its sandbox could not be set up (exit 125, as `lockbox run`).
fn not_started(message: String, duration: Duration) -> Value {
    json!({ "exit_code": 125, "signal": null, "timed_out": false,
        "duration": duration.as_secs_f64(), "setup_error": message })
}

/// Waits for one stage until its own deadline, stopping it then: its result, and what
/// lockbox says on its stderr (as `lockbox run` does: a program that could not be run is
/// exit 127 or 126 and names itself, not an empty stderr).
fn finish(s: &mut Started, spec: &StageSpec) -> (Value, String) {
    let Some(running) = s.running.as_mut() else {
        let message = s.setup_error.clone().unwrap_or_default();
        return (not_started(message, Duration::ZERO), String::new());
    };
    let deadline = s.timeout.map(|t| s.started + t);
    let waited = match running.wait(deadline, None) {
        Ok(Waited::Exited(o)) => Ok(o),
        Ok(Waited::Deadline | Waited::Extra) => running.stop(s.grace, StopReason::Timeout),
        Err(e) => Err(e),
    };
    s.running = None;
    match waited {
        Ok(o) => {
            let said = match o.status {
                Status::ExecFailed(errno) => exec_failed(spec, errno),
                _ => String::new(),
            };
            let result = json!({
                "exit_code": o.exit_code(),
                "signal": match o.status { Status::Signaled(n) => Some(n), _ => None },
                "timed_out": o.timed_out,
                "duration": s.started.elapsed().as_secs_f64(),
                "setup_error": null,
            });
            (result, said)
        }
        Err(e) => (
            not_started(e.to_string(), s.started.elapsed()),
            String::new(),
        ),
    }
}

/// `lockbox run`'s words for a program that could not be executed.
fn exec_failed(spec: &StageSpec, errno: i32) -> String {
    let program = spec.argv.first().map(String::as_str).unwrap_or_default();
    if errno == rustix::io::Errno::NOENT.raw_os_error() {
        format!(
            "lockbox: {program}: command not found inside the sandbox\n\
             hint: grant its directory with fs_readable=, or give its full path\n"
        )
    } else {
        let why = std::io::Error::from_raw_os_error(errno);
        format!("lockbox: {program}: cannot execute: {why}\n")
    }
}
