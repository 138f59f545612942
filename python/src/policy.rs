//! The one conversion from the Python keyword arguments (as the JSON form of a policy, built
//! by `lockbox._policy`) to [`Policy`].

use lockbox_policy::Policy;
use pyo3::prelude::*;

use crate::errors;

/// Parses and validates the JSON form of a policy.
pub(crate) fn parse(json: &str) -> PyResult<Policy> {
    let policy: Policy = serde_json::from_str(json).map_err(|e| {
        errors::make(
            errors::Family::Policy,
            "BAD_POLICY",
            format!("policy: {e}"),
            Some(125),
            serde_json::Value::Null,
        )
    })?;
    policy.validate().map_err(|e| errors::policy(&e))?;
    Ok(policy)
}

/// Validates a policy (JSON) and returns its normalised JSON form.
#[pyfunction]
pub(crate) fn check_policy(json: &str) -> PyResult<String> {
    let policy = parse(json)?;
    serde_json::to_string(&policy).map_err(|e| errors::usage(e.to_string()))
}

/// Why `spec` is not a network destination (`[tcp://|udp://]HOST:PORTS`), or `None` if it
/// is one: the message of `NetSpec::parse`, which names the spec.
#[pyfunction]
pub(crate) fn net_spec_error(spec: &str) -> Option<String> {
    lockbox_policy::NetSpec::parse(spec)
        .err()
        .map(|e| e.to_string())
}

/// A duration (`"500ms"`, `"2m"`) in whole milliseconds; a `PolicyError` naming it otherwise.
#[pyfunction]
pub(crate) fn duration_ms(text: &str) -> PyResult<u64> {
    let d = lockbox_policy::parse_duration(text).map_err(|e| errors::policy(&e))?;
    Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
