//! One sandbox with pipes, supervised from Python: what the function executor builds on. The
//! pipes are created here and handed to Python as descriptor numbers it then owns; the
//! result pipe's read end is also kept here, so [`Process::wait`] wakes up when a result
//! arrives as well as when the sandbox ends (a crash never waits for the timeout).

use std::ffi::OsString;
use std::os::fd::{AsFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockbox_confine::{Outcome, Running, Spawn, Status, Stdio, StopReason, Waited};
use pyo3::prelude::*;
use serde_json::{json, Value};

use crate::{errors, policy};

fn pipe() -> PyResult<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| errors::usage(format!("creating a pipe: {e}")))
}

fn null() -> PyResult<OwnedFd> {
    std::fs::File::open("/dev/null")
        .map(Into::into)
        .map_err(|e| errors::usage(format!("opening /dev/null: {e}")))
}

/// Where a standard stream goes: `"null"`, `"pipe"` (a descriptor for Python) or
/// `"inherit"` (the caller's).
fn stream(mode: &str, is_input: bool) -> PyResult<(Option<OwnedFd>, Option<OwnedFd>)> {
    match mode {
        "null" => Ok((Some(null()?), None)),
        "inherit" => Ok((None, None)),
        "pipe" => {
            let (r, w) = pipe()?;
            Ok(if is_input {
                (Some(r), Some(w))
            } else {
                (Some(w), Some(r))
            })
        }
        other => Err(errors::usage(format!(
            "stdio mode {other:?}: expected \"null\", \"pipe\" or \"inherit\""
        ))),
    }
}

fn outcome_json(o: &Outcome) -> Value {
    json!({
        "exit_code": o.exit_code(),
        "signal": match o.status { Status::Signaled(n) => Some(n), _ => None },
        "timed_out": o.timed_out,
        "oom_killed": o.oom_killed,
        "wall": o.wall.as_secs_f64(),
        "cpu": o.cpu.as_secs_f64(),
        "peak_memory": o.peak_memory.map(|(b, _)| b),
    })
}

/// Starts `argv` in a sandbox confined by `policy` (JSON). With `result_pipe`, a pipe's
/// write end is handed to the command as descriptor `result_fd` (>= 3) and its read end
/// is readable from Python as `Process.result_fd`; an argument `{result_fd}` is replaced
/// by the descriptor's number. A policy naming an `image` runs on it: found in the image
/// store of `state_dir` (pulled when missing) and held while the process lives.
#[pyfunction]
#[pyo3(signature = (policy, argv, stdin="null", stdout="null", stderr="null", result_pipe=false, state_dir=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn(
    py: Python<'_>,
    policy: &str,
    argv: Vec<String>,
    stdin: &str,
    stdout: &str,
    stderr: &str,
    result_pipe: bool,
    state_dir: Option<std::path::PathBuf>,
) -> PyResult<Process> {
    let mut policy = policy::parse(policy)?;
    let image = match policy.image.clone() {
        None => None,
        Some(reference) => {
            let state_dir = match state_dir {
                Some(dir) => dir,
                None => lockbox_cow::default_state_dir().ok_or_else(|| {
                    errors::usage("no state directory for the image store: pass state_dir".into())
                })?,
            };
            let taken = py.detach(|| {
                let store = lockbox_image::Store::in_state_dir(&state_dir)?;
                lockbox_image::ProcessImage::take(
                    store,
                    &reference,
                    lockbox_image::PullPolicy::Missing,
                    &lockbox_image::PullOptions::default(),
                    lockbox_image::DEFAULT_MAX_STORE,
                )
            });
            Some(taken.map_err(|e| errors::image(&e))?)
        }
    };
    let (in_child, in_py) = stream(stdin, true)?;
    let (out_child, out_py) = stream(stdout, false)?;
    let (err_child, err_py) = stream(stderr, false)?;
    let result = if result_pipe {
        let (r, w) = pipe()?;
        policy.pass_fds.push(std::os::fd::AsRawFd::as_raw_fd(&w));
        Some((r, w))
    } else {
        None
    };
    // `{result_fd}` in argv names the result pipe's descriptor inside the sandbox.
    let child_fd = result
        .as_ref()
        .map(|(_, w)| std::os::fd::AsRawFd::as_raw_fd(w).to_string());
    let argv: Vec<OsString> = argv
        .into_iter()
        .map(|a| match (&child_fd, a.as_str()) {
            (Some(fd), "{result_fd}") => fd.into(),
            _ => a.into(),
        })
        .collect();
    let (argv, root) = match &image {
        None => (argv, None),
        Some(held) => {
            let (root, argv) = lockbox_image::apply(&held.image, &mut policy, &argv)
                .map_err(|e| errors::image(&e))?;
            (argv, Some(root))
        }
    };
    let stdio = Stdio {
        stdin: in_child,
        stdout: out_child,
        stderr: err_child,
    };
    let spawned = py.detach(|| {
        let spawn = Spawn::command(&policy, &argv).stdio(stdio);
        match root {
            Some(root) => spawn.image_root(root).start(),
            None => spawn.start(),
        }
    });
    let running = spawned.map_err(|e| errors::setup(&e))?;
    let (result_watch, result_fd, result_child_fd) = match result {
        Some((r, w)) => {
            let child_fd = std::os::fd::AsRawFd::as_raw_fd(&w);
            // Our copy of the write end goes, so the read end sees EOF when the sandbox ends.
            drop(w);
            let for_py = r
                .try_clone()
                .map_err(|e| errors::usage(format!("duplicating the result pipe: {e}")))?;
            (Some(r), Some(for_py.into_raw_fd()), Some(child_fd))
        }
        None => (None, None, None),
    };
    Ok(Process {
        pid: running.pid(),
        started: Instant::now(),
        timeout: policy.timeout,
        grace: policy.kill_grace,
        state: Mutex::new(State {
            running: Some(running),
            outcome: None,
            result_watch,
        }),
        stdin_fd: in_py.map(IntoRawFd::into_raw_fd),
        stdout_fd: out_py.map(IntoRawFd::into_raw_fd),
        stderr_fd: err_py.map(IntoRawFd::into_raw_fd),
        result_fd,
        result_child_fd,
        _image: image,
    })
}

struct State {
    running: Option<Running>,
    outcome: Option<Value>,
    /// Our read end of the result pipe, polled by `wait`; dropped once it hit EOF.
    result_watch: Option<OwnedFd>,
}

/// A running sandbox. Dropping it kills everything in it.
#[pyclass(module = "lockbox._lockbox")]
pub(crate) struct Process {
    pid: i32,
    started: Instant,
    timeout: Option<Duration>,
    grace: Duration,
    state: Mutex<State>,
    /// Write end of the command's stdin (`stdin="pipe"`), owned by Python.
    #[pyo3(get)]
    stdin_fd: Option<RawFd>,
    /// Read end of the command's stdout (`stdout="pipe"`), owned by Python.
    #[pyo3(get)]
    stdout_fd: Option<RawFd>,
    /// Read end of the command's stderr (`stderr="pipe"`), owned by Python.
    #[pyo3(get)]
    stderr_fd: Option<RawFd>,
    /// Read end of the result pipe (`result_pipe=True`), owned by Python.
    #[pyo3(get)]
    result_fd: Option<RawFd>,
    /// The descriptor number of the result pipe's write end inside the sandbox.
    #[pyo3(get)]
    result_child_fd: Option<RawFd>,
    /// The image the sandbox runs on, held (not removable from its store) while this lives.
    _image: Option<lockbox_image::ProcessImage>,
}

#[pymethods]
impl Process {
    /// The pid of the sandbox's init on the host.
    #[getter]
    fn pid(&self) -> i32 {
        self.pid
    }

    /// The policy's timeout in seconds, if any.
    #[getter]
    fn timeout(&self) -> Option<f64> {
        self.timeout.map(|t| t.as_secs_f64())
    }

    /// Waits until the sandbox ends (`"exited"`), `timeout` seconds pass (`"deadline"`;
    /// `None` waits forever) or, with `watch_result`, the result pipe has data or reached
    /// its end (`"result"`). Releases the GIL.
    #[pyo3(signature = (timeout=None, watch_result=false))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>, watch_result: bool) -> PyResult<String> {
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        py.detach(|| {
            let mut guard = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let st = &mut *guard;
            let Some(running) = st.running.as_mut() else {
                return Ok("exited".to_owned());
            };
            let extra = if watch_result {
                st.result_watch.as_ref().map(|fd| fd.as_fd())
            } else {
                None
            };
            match running.wait(deadline, extra) {
                Ok(Waited::Exited(o)) => {
                    st.outcome = Some(outcome_json(&o));
                    st.running = None;
                    Ok("exited".to_owned())
                }
                Ok(Waited::Deadline) => Ok("deadline".to_owned()),
                Ok(Waited::Extra) => Ok("result".to_owned()),
                Err(e) => {
                    st.running = None;
                    Err(errors::setup(&e))
                }
            }
        })
    }

    /// Stops the result pipe from waking `wait` (after Python read its end).
    fn unwatch_result(&self) {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .result_watch = None;
    }

    /// Stops the sandbox (SIGTERM to everything in it, SIGKILL after `grace` seconds; the
    /// policy's grace when `None`) and returns the outcome. `timed_out` marks it a timeout.
    #[pyo3(signature = (grace=None, timed_out=false))]
    fn stop(&self, py: Python<'_>, grace: Option<f64>, timed_out: bool) -> PyResult<String> {
        let grace = grace.map_or(self.grace, |g| Duration::from_secs_f64(g.max(0.0)));
        let reason = if timed_out {
            StopReason::Timeout
        } else {
            StopReason::Requested
        };
        py.detach(|| {
            let mut st = self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(mut running) = st.running.take() {
                let o = running.stop(grace, reason).map_err(|e| errors::setup(&e))?;
                st.outcome = Some(outcome_json(&o));
            }
            Ok(st.outcome.clone().unwrap_or(Value::Null).to_string())
        })
    }

    /// The outcome as JSON once the sandbox ended, else `None`.
    #[getter]
    fn outcome(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .outcome
            .as_ref()
            .map(Value::to_string)
    }

    /// Seconds since the sandbox started.
    #[getter]
    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}
