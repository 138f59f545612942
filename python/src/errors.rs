//! Rust errors to Python exceptions. The classes live in `lockbox.errors` (pure Python, so
//! they can be subclassed and documented there); `lockbox.errors._from_rust` picks the class
//! from the error's stable code.

use pyo3::prelude::*;
use serde_json::Value;

/// Which family an error comes from; selects the base class when the code is unknown.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Family {
    Policy,
    Setup,
    Txn,
    Journal,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Policy => "policy",
            Family::Setup => "setup",
            Family::Txn => "txn",
            Family::Journal => "journal",
        }
    }
}

/// Builds the `lockbox.errors` exception for an error of `family` with `code`, the Rust
/// error's message, its exit code and details (JSON object).
pub(crate) fn make(
    family: Family,
    code: lockbox_policy::ErrorCode,
    message: String,
    exit_code: Option<u8>,
    details: Value,
) -> PyErr {
    Python::attach(|py| {
        let built = (|| -> PyResult<PyErr> {
            let module = py.import("lockbox.errors")?;
            let exc = module.getattr("_from_rust")?.call1((
                family.name(),
                code.as_str(),
                message.clone(),
                exit_code,
                details.to_string(),
            ))?;
            Ok(PyErr::from_value(exc))
        })();
        built.unwrap_or_else(|e| e)
    })
}

pub(crate) fn policy(e: &lockbox_policy::PolicyError) -> PyErr {
    make(
        Family::Policy,
        e.code(),
        e.to_string(),
        Some(125),
        Value::Null,
    )
}

pub(crate) fn setup(e: &lockbox_confine::SetupError) -> PyErr {
    let details = serde_json::json!({ "hint": e.hint() });
    make(Family::Setup, e.code(), e.to_string(), Some(125), details)
}

/// A sandbox's image that could not be found, pulled or applied: its set-up failed.
pub(crate) fn image(e: &lockbox_image::ImageError) -> PyErr {
    make(
        Family::Setup,
        e.code(),
        e.to_string(),
        Some(125),
        Value::Null,
    )
}

pub(crate) fn txn(e: &lockbox_txn::TxnError) -> PyErr {
    make(
        Family::Txn,
        e.code(),
        e.to_string(),
        Some(e.exit_code()),
        Value::Null,
    )
}

pub(crate) fn journal(e: &lockbox_journal::JournalError) -> PyErr {
    make(
        Family::Journal,
        e.code(),
        e.to_string(),
        None,
        serde_json::json!({ "transient": e.is_transient() }),
    )
}

/// A usage error found by this layer (bad spec from the Python half).
pub(crate) fn usage(message: String) -> PyErr {
    make(
        Family::Txn,
        lockbox_policy::ErrorCode::TxnUsage,
        message,
        Some(2),
        Value::Null,
    )
}

/// Every error code lockbox has, with its family (`lockbox_policy::ErrorCode::ALL`): what
/// `lockbox.errors` must map (tested by python/tests/test_errors.py).
#[pyfunction]
pub(crate) fn error_codes() -> Vec<(&'static str, &'static str)> {
    lockbox_policy::ErrorCode::ALL
        .iter()
        .map(|c| (c.as_str(), c.family().as_str()))
        .collect()
}
