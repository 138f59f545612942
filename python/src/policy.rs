//! The one conversion from the Python keyword arguments (as the JSON form of a policy, built
//! by `lockbox._policy`) to [`Policy`].

use lockbox_policy::Policy;
use pyo3::prelude::*;

use crate::errors;

/// Fields of the policy's JSON form and the `Sandbox` keyword each comes from.
const KEYWORDS: &[(&str, &str)] = &[
    ("limits.memory", "max_memory"),
    ("limits.processes", "max_processes"),
    ("limits.cpu_time", "max_cpu_time"),
    ("limits.open_files", "max_open_files"),
    ("limits.file_size", "max_file_size"),
    ("limits.inodes", "max_inodes"),
    ("fs.read", "fs_readable"),
    ("fs.write", "fs_writable"),
    ("fs.default_reads", "default_reads"),
    ("env.set", "env"),
    ("env.pass", "env_pass"),
    ("env.clean", "clean_env"),
    ("net", "net"),
];

/// The `Sandbox` keyword a field of the policy's JSON form comes from (`limits.memory` is
/// `max_memory`, `env.set.A` is `env`), so an error names what the user wrote, not the
/// internal JSON.
fn keyword(path: &str) -> &str {
    let field = path.split(['[', '?']).next().unwrap_or(path);
    KEYWORDS
        .iter()
        .find(|(json, _)| {
            field == *json
                || field
                    .strip_prefix(json)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
        .map_or(field, |(_, keyword)| keyword)
}

/// serde_json's message without its position in the JSON text (which the user never saw).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// Parses and validates the JSON form of a policy.
pub(crate) fn parse(json: &str) -> PyResult<Policy> {
    let de = &mut serde_json::Deserializer::from_str(json);
    let policy: Policy = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = keyword(&path);
        let message = if path == "." {
            format!("policy: {}", without_position(e.inner()))
        } else {
            format!("{field}: {}", without_position(e.inner()))
        };
        errors::make(
            errors::Family::Policy,
            lockbox_policy::ErrorCode::BadPolicy,
            message,
            Some(125),
            serde_json::json!({ "field": field }),
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
