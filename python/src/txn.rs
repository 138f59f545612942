//! Transactional pipelines and gathers (`lockbox-txn`): the Python half builds a
//! [`TxnSpec`] (as JSON), which `lockbox_txn` turns into a pipeline or gather; outcomes go back
//! as JSON plus the last stage's stdout.

use std::path::PathBuf;
use std::sync::Mutex;

use lockbox_image::{ImageError, ProcessImage, PullOptions, PullPolicy, Store};
use lockbox_txn::{Output, Selection, StageImageError, Txn, TxnOutcome, TxnSpec};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{json, Value};

use crate::{errors, policy};

/// Checks the policy of every stage in `raw` (a transaction spec, or a list of stages) with
/// [`policy::parse`], so that a bad one is a `PolicyError` that names the problem rather
/// than a position in the spec's JSON.
pub(crate) fn check_policies(raw: &Value) -> PyResult<()> {
    let stages = match raw {
        Value::Array(list) => list.iter().collect::<Vec<_>>(),
        _ => ["stages", "sources"]
            .iter()
            .filter_map(|k| raw.get(k).and_then(Value::as_array))
            .flatten()
            .chain(raw.get("consumer").filter(|c| !c.is_null()))
            .collect(),
    };
    for s in stages {
        if let Some(p) = s.get("policy") {
            policy::parse(&p.to_string())?;
        }
    }
    Ok(())
}

/// The spec (`lockbox_txn::TxnSpec`'s JSON form, built by the Python half) as a
/// transaction, with the images its stages name found in the state directory's store (pulled
/// when missing) and held by this process until the returned holds are dropped. Blocking
/// (a pull): call it with the GIL released.
fn build(spec_json: &str, stdin: Option<Vec<u8>>) -> PyResult<(Txn, Vec<ProcessImage>)> {
    let bad = |e: serde_json::Error| errors::usage(format!("transaction spec: {e}"));
    let raw: Value = serde_json::from_str(spec_json).map_err(bad)?;
    check_policies(&raw)?;
    let spec: TxnSpec = serde_json::from_value(raw).map_err(bad)?;
    let mut held = Vec::new();
    let txn = spec
        .build_with_images(stdin, &mut |policy, argv| {
            let image_error = |e: ImageError| StageImageError {
                reason: e.to_string(),
                code: e.code(),
                exit_code: if e.exit_code() == 2 { 2 } else { 125 },
            };
            let reference = policy.image.clone().unwrap_or_default();
            let store = Store::in_state_dir(&spec.state_dir).map_err(image_error)?;
            let image = ProcessImage::take(
                store,
                &reference,
                PullPolicy::Missing,
                &PullOptions::default(),
                lockbox_image::DEFAULT_MAX_STORE,
            )
            .map_err(image_error)?;
            let resolved = lockbox_image::apply(&image.image, policy, argv).map_err(image_error)?;
            held.push(image);
            Ok(resolved)
        })
        .map_err(|e| errors::txn(&e))?;
    Ok((txn, held))
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
        "summary": o.to_string(),
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
    let spec = spec.to_owned();
    let result = py.detach(move || {
        let (txn, _held) = build(&spec, stdin)?;
        let outcome = if dry { txn.dry_run() } else { txn.run() };
        outcome.map_err(|e| errors::txn(&e))
    });
    let outcome = result?;
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
    let spec = spec.to_owned();
    // The images are held while the stages run; the prepared layers do not need them.
    let result = py.detach(move || {
        let (txn, _held) = build(&spec, stdin)?;
        txn.prepare().map_err(|e| errors::txn(&e))
    });
    let prepared = result?;
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
                    lockbox_policy::ErrorCode::TxnWrongState,
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

/// lockbox's state directory when none is given: the rule the CLI and the server use
/// (`lockbox_cow::default_state_dir`).
#[pyfunction]
pub(crate) fn default_state_dir() -> PyResult<std::path::PathBuf> {
    lockbox_cow::default_state_dir().ok_or_else(|| {
        errors::usage(
            "no state directory: no home directory was found; pass state_dir= or set LOCKBOX_STATE_DIR"
                .to_owned(),
        )
    })
}
