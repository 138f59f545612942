//! The step journal (`lockbox-journal`) for Python: [`Journal`] and [`Run`]. Step values
//! cross as JSON (`json.dumps` / `json.loads`); a value that is not JSON-serialisable raises
//! `lockbox.errors.NotSerializable` and is not journaled. Sync calls block on the SDK's tokio
//! runtime with the GIL released; async calls are asyncio awaitables over the same futures
//! (pyo3-async-runtimes), so `parallel` branches interleave exactly as in Rust.

use std::future::Future;

use lockbox_journal::{
    Branches, ForkPoint, JournalError, RecordOptions, RunId, StartOptions, StepError, StepId,
    StorageUrl, Suspension,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::errors;

/// Runs `fut` to completion from synchronous code: on the SDK's runtime, or (when already
/// inside it, e.g. a sync `record` inside a sync `parallel` branch) nested in place.
fn block<F: Future>(fut: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => tokio::task::block_in_place(|| handle.block_on(fut)),
        Err(_) => pyo3_async_runtimes::tokio::get_runtime().block_on(fut),
    }
}

fn jerr(e: &JournalError) -> PyErr {
    errors::journal(e)
}

/// A Python value as JSON, or `NotSerializable` naming the step.
fn to_json(py: Python<'_>, what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let dumps = py.import("json")?.getattr("dumps")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    let text: String = match dumps.call((obj,), Some(&kwargs)) {
        Ok(t) => t.extract()?,
        Err(e) => {
            let err = errors::make(
                errors::Family::Journal,
                lockbox_policy::ErrorCode::NotSerializable,
                format!(
                    "{what}: the value is not JSON-serialisable ({}); return plain data (dict, list, str, int, float, bool, None)",
                    e.value(py)
                ),
                None,
                Value::Null,
            );
            err.set_cause(py, Some(e));
            return Err(err);
        }
    };
    serde_json::from_str(&text).map_err(|e| errors::usage(format!("{what}: {e}")))
}

fn from_json(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    let loads = py.import("json")?.getattr("loads")?;
    Ok(loads.call1((value.to_string(),))?.unbind())
}

/// A failed step as journaled: the exception's type and message. `original` is the live
/// exception (first run only); `retry` leaves the failure out of the journal.
#[derive(Debug, Serialize, Deserialize)]
struct PyStepError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    #[serde(skip)]
    retry: bool,
    #[serde(skip)]
    original: Option<Box<PyErr>>,
}

impl PyStepError {
    fn new(e: PyErr, journal_errors: bool) -> Self {
        Python::attach(|py| {
            let ty = e.get_type(py);
            let part = |attr: &str| {
                ty.getattr(attr)
                    .and_then(|v| v.extract::<String>())
                    .unwrap_or_default()
            };
            let (module, qualname) = (part("__module__"), part("__qualname__"));
            let kind = match module.as_str() {
                "" | "builtins" => qualname,
                m => format!("{m}.{qualname}"),
            };
            // Our own errors (e.g. NotSerializable) are never journaled.
            let ours = kind.starts_with("lockbox.");
            PyStepError {
                kind,
                message: e.value(py).to_string(),
                retry: ours || !journal_errors,
                original: Some(Box::new(e)),
            }
        })
    }
}

fn retryable(e: &PyStepError) -> bool {
    e.retry
}

/// The Python result of a `record`: the value, the original exception when it was not
/// journaled, `StepFailed` for a journaled one (first run and replay alike).
fn finish(step: &str, r: Result<Value, StepError<PyStepError>>) -> PyResult<Py<PyAny>> {
    match r {
        Ok(v) => Python::attach(|py| from_json(py, &v)),
        Err(StepError::Journal(e)) => Err(jerr(&e)),
        Err(StepError::Failed(e)) => {
            if e.retry {
                if let Some(orig) = e.original {
                    return Err(*orig);
                }
            }
            let details = serde_json::json!({ "step": step, "type": e.kind, "message": e.message });
            let err = errors::make(
                errors::Family::Journal,
                lockbox_policy::ErrorCode::StepFailed,
                format!("step {step} failed: {}: {}", e.kind, e.message),
                None,
                details,
            );
            if let Some(orig) = e.original {
                Python::attach(|py| err.set_cause(py, Some(*orig)));
            }
            Err(err)
        }
    }
}

/// Failures marked `retry` are returned but not journaled.
fn options() -> RecordOptions<PyStepError> {
    RecordOptions::retry_when(retryable)
}

/// Opens the journal at `url` (`sqlite:PATH`, `file:DIR`, `postgres://...`).
#[pyfunction]
pub(crate) fn open_journal(py: Python<'_>, url: &str) -> PyResult<Journal> {
    let parsed = StorageUrl::parse(url).map_err(|e| jerr(&e))?;
    let storage = py.detach(|| block(parsed.open())).map_err(|e| jerr(&e))?;
    Ok(Journal {
        inner: lockbox_journal::Journal::open(storage),
    })
}

fn run_id(id: &str) -> PyResult<RunId> {
    RunId::parse(id).map_err(|e| jerr(&e))
}

fn parse_json(text: Option<&str>) -> PyResult<Value> {
    match text {
        None => Ok(Value::Null),
        Some(t) => serde_json::from_str(t).map_err(|e| errors::usage(format!("JSON: {e}"))),
    }
}

/// A journal over one storage.
#[pyclass(module = "lockbox._lockbox")]
pub(crate) struct Journal {
    inner: lockbox_journal::Journal,
}

#[pymethods]
impl Journal {
    /// Starts a new session of `run_id` (fencing older ones) and returns its [`Run`].
    #[pyo3(signature = (run_id, version=None, metadata=None))]
    fn start(
        &self,
        py: Python<'_>,
        run_id: &str,
        version: Option<String>,
        metadata: Option<&str>,
    ) -> PyResult<Run> {
        let id = self::run_id(run_id)?;
        let opts = StartOptions {
            version,
            metadata: parse_json(metadata)?,
        };
        let j = self.inner.clone();
        let run = py
            .detach(|| block(j.start(&id, opts)))
            .map_err(|e| jerr(&e))?;
        Ok(Run { inner: run })
    }

    /// Delivers `value` (JSON) to the run's pending suspension.
    fn resume(&self, py: Python<'_>, run_id: &str, value: &str) -> PyResult<()> {
        let id = self::run_id(run_id)?;
        let v = parse_json(Some(value))?;
        let j = self.inner.clone();
        py.detach(|| block(j.resume(&id, &v))).map_err(|e| jerr(&e))
    }

    /// Cancels the run from outside.
    fn cancel(&self, py: Python<'_>, run_id: &str, reason: &str) -> PyResult<()> {
        let id = self::run_id(run_id)?;
        let j = self.inner.clone();
        py.detach(|| block(j.cancel(&id, reason)))
            .map_err(|e| jerr(&e))
    }

    /// Copies the run's entries before `step` (a step id) or `offset` into a new run.
    #[pyo3(signature = (run_id, step=None, offset=None, new_run_id=None))]
    fn fork(
        &self,
        py: Python<'_>,
        run_id: &str,
        step: Option<&str>,
        offset: Option<u64>,
        new_run_id: Option<&str>,
    ) -> PyResult<String> {
        let id = self::run_id(run_id)?;
        let at = match (step, offset) {
            (Some(s), None) => ForkPoint::Step(StepId::parse(s).map_err(|e| jerr(&e))?),
            (None, Some(o)) => ForkPoint::Offset(o),
            _ => {
                return Err(errors::usage(
                    "fork: give exactly one of step= or offset=".into(),
                ))
            }
        };
        let new_id = new_run_id.map(self::run_id).transpose()?;
        let j = self.inner.clone();
        let forked = py
            .detach(|| block(j.fork(&id, &at, new_id.as_ref())))
            .map_err(|e| jerr(&e))?;
        Ok(forked.as_str().to_owned())
    }

    /// Every run id, sorted.
    fn list(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let j = self.inner.clone();
        let ids = py.detach(|| block(j.list())).map_err(|e| jerr(&e))?;
        Ok(ids.iter().map(|i| i.as_str().to_owned()).collect())
    }

    /// The run's status as JSON.
    fn status(&self, py: Python<'_>, run_id: &str) -> PyResult<String> {
        let id = self::run_id(run_id)?;
        let j = self.inner.clone();
        let st = py.detach(|| block(j.status(&id))).map_err(|e| jerr(&e))?;
        serde_json::to_string(&st).map_err(|e| errors::usage(e.to_string()))
    }

    /// The run's entries (from `offset`) as a JSON list.
    #[pyo3(signature = (run_id, offset=0))]
    fn entries(&self, py: Python<'_>, run_id: &str, offset: u64) -> PyResult<String> {
        let id = self::run_id(run_id)?;
        let j = self.inner.clone();
        let es = py
            .detach(|| block(j.entries(&id, offset)))
            .map_err(|e| jerr(&e))?;
        serde_json::to_string(&es).map_err(|e| errors::usage(e.to_string()))
    }
}

/// One session of a run.
#[pyclass(module = "lockbox._lockbox")]
pub(crate) struct Run {
    inner: lockbox_journal::Run,
}

type PyBranch = (String, Py<PyAny>);

#[pymethods]
impl Run {
    /// The run id.
    #[getter]
    fn id(&self) -> String {
        self.inner.id().as_str().to_owned()
    }

    /// This session's number.
    #[getter]
    fn session(&self) -> u64 {
        self.inner.session()
    }

    /// The branch prefix (`""` at the root).
    #[getter]
    fn prefix(&self) -> String {
        self.inner.prefix().to_owned()
    }

    /// Runs the synchronous `func()` once across replays (see `lockbox.journal.Run.record`).
    #[pyo3(signature = (name, func, journal_errors=false))]
    fn record(
        &self,
        py: Python<'_>,
        name: String,
        func: Py<PyAny>,
        journal_errors: bool,
    ) -> PyResult<Py<PyAny>> {
        let run = self.inner.clone();
        let step = format!("{}{name}", run.prefix());
        let what = step.clone();
        let r = py.detach(move || {
            block(run.record_with(&name, options(), || async move {
                Python::attach(|py| {
                    let out = func
                        .bind(py)
                        .call0()
                        .map_err(|e| PyStepError::new(e, journal_errors))?;
                    to_json(py, &what, &out).map_err(|e| PyStepError::new(e, journal_errors))
                })
            }))
        });
        finish(&step, r)
    }

    /// Like `record` for an async `func`: returns an awaitable.
    #[pyo3(signature = (name, func, journal_errors=false))]
    fn record_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        func: Py<PyAny>,
        journal_errors: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let step = format!("{}{name}", run.prefix());
            let what = step.clone();
            let r = run
                .record_with(&name, options(), || async move {
                    let fut = Python::attach(|py| {
                        pyo3_async_runtimes::tokio::into_future(func.bind(py).call0()?)
                    })
                    .map_err(|e| PyStepError::new(e, journal_errors))?;
                    let obj = fut.await.map_err(|e| PyStepError::new(e, journal_errors))?;
                    Python::attach(|py| to_json(py, &what, obj.bind(py)))
                        .map_err(|e| PyStepError::new(e, journal_errors))
                })
                .await;
            finish(&step, r)
        })
    }

    /// Runs synchronous branches `(key, func(child_run))` one after another in key order,
    /// each with a child run prefixing its step names with `key:`. Returns `{key: result}`.
    fn parallel(&self, py: Python<'_>, branches: Vec<PyBranch>) -> PyResult<Py<PyDict>> {
        let run = self.inner.clone();
        let results = py.detach(move || {
            let b: Branches<'_, PyResult<Py<PyAny>>> = branches
                .into_iter()
                .map(|(key, f)| {
                    (key, move |child: lockbox_journal::Run| async move {
                        Python::attach(|py| {
                            let child = Py::new(py, Run { inner: child })?;
                            Ok(f.bind(py).call1((child,))?.unbind())
                        })
                    })
                })
                .collect();
            block(run.parallel(b))
        });
        collect(results)
    }

    /// Like `parallel` for async branch functions, run concurrently: returns an awaitable.
    fn parallel_async<'py>(
        &self,
        py: Python<'py>,
        branches: Vec<PyBranch>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let run = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let b: Branches<'_, PyResult<Py<PyAny>>> = branches
                .into_iter()
                .map(|(key, f)| {
                    (key, move |child: lockbox_journal::Run| async move {
                        let fut = Python::attach(|py| {
                            let child = Py::new(py, Run { inner: child })?;
                            pyo3_async_runtimes::tokio::into_future(f.bind(py).call1((child,))?)
                        })?;
                        fut.await
                    })
                })
                .collect();
            collect(run.parallel(b).await)
        })
    }

    /// A suspension point: `None` while waiting, the delivered value (JSON) once resumed.
    #[pyo3(signature = (event, payload=None))]
    fn suspend(
        &self,
        py: Python<'_>,
        event: &str,
        payload: Option<&str>,
    ) -> PyResult<Option<String>> {
        let payload = parse_json(payload)?;
        let run = self.inner.clone();
        let s = py
            .detach(|| block(run.suspend::<Value, Value>(event, &payload)))
            .map_err(|e| jerr(&e))?;
        Ok(match s {
            Suspension::Suspended => None,
            Suspension::Resumed(v) => Some(v.to_string()),
        })
    }

    /// Journals the run's result (JSON); the run is finished.
    fn complete(&self, py: Python<'_>, value: &str) -> PyResult<()> {
        let v = parse_json(Some(value))?;
        let run = self.inner.clone();
        py.detach(|| block(run.complete(&v))).map_err(|e| jerr(&e))
    }

    /// Journals that the run failed for good (error as JSON).
    fn fail(&self, py: Python<'_>, error: &str) -> PyResult<()> {
        let v = parse_json(Some(error))?;
        let run = self.inner.clone();
        py.detach(|| block(run.fail(&v))).map_err(|e| jerr(&e))
    }

    /// Journals that the run was cancelled.
    fn cancel(&self, py: Python<'_>, reason: &str) -> PyResult<()> {
        let run = self.inner.clone();
        py.detach(|| block(run.cancel(reason)))
            .map_err(|e| jerr(&e))
    }
}

/// `{key: result}` from `parallel`'s map, raising the first branch's exception (in key order).
fn collect(
    r: Result<
        std::collections::BTreeMap<lockbox_journal::BranchKey, PyResult<Py<PyAny>>>,
        JournalError,
    >,
) -> PyResult<Py<PyDict>> {
    let map = r.map_err(|e| jerr(&e))?;
    Python::attach(|py| {
        let dict = PyDict::new(py);
        for (k, v) in map {
            dict.set_item(k.as_str(), v?)?;
        }
        Ok(dict.unbind())
    })
}
