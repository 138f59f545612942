//! Transactional pipelines and gathers (`lockbox-txn`): a spec from the Python half becomes a
//! [`Pipeline`] or [`Gather`]; outcomes go back as JSON plus the last stage's stdout.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use lockbox_txn::{
    ConflictPolicy, Gather, LockPolicy, Output, Pipeline, Selection, Stage, TxnOutcome,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{errors, policy};

/// One stage as the Python half describes it.
#[derive(Debug, Deserialize)]
pub(crate) struct StageSpec {
    pub(crate) name: String,
    /// The JSON form of the stage's policy.
    pub(crate) policy: Value,
    pub(crate) argv: Vec<String>,
    #[serde(default)]
    pub(crate) retries: u32,
    /// Only these parts of the workdir (relative) are writable; absent: all of it.
    #[serde(default, with = "lockbox_policy::name::json::option_vec")]
    pub(crate) writable: Option<Vec<std::path::PathBuf>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Pipeline,
    Gather,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
enum LockSpec {
    Optimistic,
    FailIfBusy,
    Wait { timeout: Option<f64> },
}

/// A transaction as the Python half describes it. Paths in the JSON form of
/// `lockbox_policy::name` (a string, or `{"bytes": base64}` for a name that is not UTF-8).
#[derive(Debug, Deserialize)]
struct TxnSpec {
    kind: Kind,
    #[serde(with = "lockbox_policy::name::json")]
    state_dir: PathBuf,
    #[serde(with = "lockbox_policy::name::json")]
    workdir: PathBuf,
    #[serde(default)]
    stages: Vec<StageSpec>,
    #[serde(default)]
    sources: Vec<StageSpec>,
    #[serde(default)]
    consumer: Option<StageSpec>,
    #[serde(default)]
    conflict: ConflictPolicy,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    lock: Option<LockSpec>,
    #[serde(default, with = "lockbox_policy::name::json::vec")]
    only: Vec<PathBuf>,
    #[serde(default, with = "lockbox_policy::name::json::vec")]
    exclude: Vec<PathBuf>,
    #[serde(default)]
    memory_bound: Option<usize>,
}

/// What the spec builds.
enum Built {
    Pipeline(Pipeline),
    Gather(Box<Gather>),
}

impl StageSpec {
    pub(crate) fn build(&self) -> PyResult<Stage> {
        let policy = policy::parse(&self.policy.to_string())?;
        let stage = Stage::new(policy, self.argv.iter().map(Into::into).collect())
            .named(&self.name)
            .retries(self.retries);
        Ok(match &self.writable {
            Some(parts) => stage.writable(parts.clone()),
            None => stage,
        })
    }
}

fn build(spec_json: &str, stdin: Option<Vec<u8>>) -> PyResult<Built> {
    let spec: TxnSpec = serde_json::from_str(spec_json)
        .map_err(|e| errors::usage(format!("transaction spec: {e}")))?;
    let lock = match spec.lock {
        None | Some(LockSpec::Optimistic) => LockPolicy::Optimistic,
        Some(LockSpec::FailIfBusy) => LockPolicy::FailIfBusy,
        Some(LockSpec::Wait { timeout }) => {
            LockPolicy::Wait(timeout.map(|t| Duration::from_secs_f64(t.max(0.0))))
        }
    };
    let selection = Selection {
        only: spec.only,
        exclude: spec.exclude,
    };
    match spec.kind {
        Kind::Pipeline => {
            let mut p = Pipeline::new(&spec.state_dir, &spec.workdir)
                .lock(lock)
                .select(selection);
            for s in &spec.stages {
                p = p.stage(s.build()?);
            }
            if let Some(bytes) = stdin {
                p = p.stdin(bytes);
            }
            if let Some(bound) = spec.memory_bound {
                p = p.memory_bound(bound);
            }
            if spec.stream {
                p = p.stream(spec.conflict);
            }
            Ok(Built::Pipeline(p))
        }
        Kind::Gather => {
            let mut g = Gather::new(&spec.state_dir, &spec.workdir)
                .lock(lock)
                .select(selection)
                .conflict_policy(spec.conflict);
            for s in &spec.sources {
                g = g.source(&s.name, s.build()?);
            }
            if let Some(c) = &spec.consumer {
                g = g.consumer(c.build()?);
            }
            if let Some(bound) = spec.memory_bound {
                g = g.memory_bound(bound);
            }
            Ok(Built::Gather(Box::new(g)))
        }
    }
}

/// The JSON form of an outcome (without stdout, which travels as bytes).
fn outcome_json(o: &TxnOutcome) -> Value {
    let stages: Vec<Value> = o
        .stages
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "exit_code": s.exit_code,
                "signal": s.signal,
                "timed_out": s.timed_out,
                "duration": s.duration.as_secs_f64(),
                "stderr_tail": s.stderr_tail,
                "stdout_len": s.stdout_len,
                "setup_error": s.setup_error,
                "attempts": s.attempts,
            })
        })
        .collect();
    json!({
        "id": o.id.to_string(),
        "committed": o.committed,
        "stages": stages,
        "changes": o.changes.changes(),
        "conflicts": o.conflicts,
        "markers": o.markers,
        "abort_reason": o.abort_reason,
        "report": o.report,
        "exit_code": o.exit_code(),
    })
}

/// The outcome as (JSON, stdout bytes or None, spilled stdout path or None).
fn to_py(py: Python<'_>, o: &TxnOutcome) -> (String, Option<Py<PyBytes>>, Option<PathBuf>) {
    let json = outcome_json(o).to_string();
    match &o.stdout {
        Output::Memory(bytes) => (json, Some(PyBytes::new(py, bytes).unbind()), None),
        Output::File { path, .. } => (json, None, Some(path.clone())),
    }
}

type OutcomeTuple = (String, Option<Py<PyBytes>>, Option<PathBuf>);

/// Runs a transaction (`mode`: `"run"` commits if every stage succeeded, `"dry_run"`
/// reports the changes and aborts). Releases the GIL while the sandboxes run.
#[pyfunction]
#[pyo3(signature = (spec, stdin=None, mode="run"))]
pub(crate) fn run_txn(
    py: Python<'_>,
    spec: &str,
    stdin: Option<Vec<u8>>,
    mode: &str,
) -> PyResult<OutcomeTuple> {
    let dry = match mode {
        "run" => false,
        "dry_run" => true,
        other => return Err(errors::usage(format!("unknown mode {other:?}"))),
    };
    let built = build(spec, stdin)?;
    let result = py.detach(move || match (&built, dry) {
        (Built::Pipeline(p), false) => p.run(),
        (Built::Pipeline(p), true) => p.dry_run(),
        (Built::Gather(g), false) => g.run(),
        (Built::Gather(g), true) => g.dry_run(),
    });
    let outcome = result.map_err(|e| errors::txn(&e))?;
    Ok(to_py(py, &outcome))
}

/// Runs every stage and keeps the layers: returns a [`PreparedTxn`] to commit or abort.
#[pyfunction]
#[pyo3(signature = (spec, stdin=None))]
pub(crate) fn prepare_txn(
    py: Python<'_>,
    spec: &str,
    stdin: Option<Vec<u8>>,
) -> PyResult<PreparedTxn> {
    let built = build(spec, stdin)?;
    let result = py.detach(move || match &built {
        Built::Pipeline(p) => p.prepare(),
        Built::Gather(g) => g.prepare(),
    });
    let prepared = result.map_err(|e| errors::txn(&e))?;
    Ok(PreparedTxn {
        inner: Mutex::new(Some(prepared)),
    })
}

/// Rolls interrupted transactions of `workdir` (or of every workdir) forward or back.
/// Returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (state_dir, workdir=None))]
pub(crate) fn recover(
    py: Python<'_>,
    state_dir: PathBuf,
    workdir: Option<PathBuf>,
) -> PyResult<String> {
    let report = py
        .detach(move || lockbox_txn::recover(&state_dir, workdir.as_deref()))
        .map_err(|e| errors::txn(&e))?;
    serde_json::to_string(&report).map_err(|e| errors::usage(e.to_string()))
}

/// A transaction whose stages ran and whose layers are kept: `commit()` or `abort()` it.
/// Dropped unresolved, the Rust value aborts it (the Python wrapper warns first).
#[pyclass(module = "lockbox._lockbox")]
pub(crate) struct PreparedTxn {
    inner: Mutex<Option<lockbox_txn::PreparedTxn>>,
}

impl PreparedTxn {
    fn take(&self, operation: &str) -> PyResult<lockbox_txn::PreparedTxn> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                errors::make(
                    errors::Family::Txn,
                    "TXN_WRONG_STATE",
                    format!(
                        "cannot {operation}: this transaction was already committed or aborted"
                    ),
                    Some(2),
                    Value::Null,
                )
            })
    }
}

#[pymethods]
impl PreparedTxn {
    /// The transaction id.
    #[getter]
    fn id(&self) -> Option<String> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|p| p.id().to_string())
    }

    /// True until `commit()`, `abort()` or `keep()`.
    #[getter]
    fn pending(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// The outcome so far (stages, changes, conflicts) as (JSON, stdout, stdout path).
    fn outcome(&self, py: Python<'_>) -> PyResult<OutcomeTuple> {
        let guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let prepared = guard
            .as_ref()
            .ok_or_else(|| errors::usage("this transaction is resolved".into()))?;
        Ok(to_py(py, prepared.outcome()))
    }

    /// Narrows what `commit()` applies (`only` / `exclude` paths relative to the workdir).
    fn select(&self, py: Python<'_>, only: Vec<PathBuf>, exclude: Vec<PathBuf>) -> PyResult<()> {
        let mut guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let prepared = guard
            .as_mut()
            .ok_or_else(|| errors::usage("this transaction is resolved".into()))?;
        py.detach(|| prepared.select(&Selection { only, exclude }))
            .map_err(|e| errors::txn(&e))
    }

    /// Applies every change to the workdir (all or nothing).
    #[pyo3(signature = (force=false))]
    fn commit(&self, py: Python<'_>, force: bool) -> PyResult<OutcomeTuple> {
        let prepared = self.take("commit")?;
        let outcome = py
            .detach(move || {
                if force {
                    prepared.commit_forced()
                } else {
                    prepared.commit()
                }
            })
            .map_err(|e| errors::txn(&e))?;
        Ok(to_py(py, &outcome))
    }

    /// Discards every change.
    fn abort(&self, py: Python<'_>) -> PyResult<OutcomeTuple> {
        let prepared = self.take("abort")?;
        let outcome = py
            .detach(move || prepared.abort())
            .map_err(|e| errors::txn(&e))?;
        Ok(to_py(py, &outcome))
    }

    /// Leaves the transaction prepared in the store (for `lockbox txn commit ID`).
    fn keep(&self) -> PyResult<String> {
        let id = self.take("keep")?.keep().map_err(|e| errors::txn(&e))?;
        Ok(id.to_string())
    }
}
