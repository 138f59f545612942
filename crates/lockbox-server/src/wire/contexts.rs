//! Code contexts: create, run code.

use super::{check_ms, time};
use crate::error::ApiError;
use crate::openapi::MAX_MS;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A code context ([`lockbox_runtime::ContextInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Context)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    #[schema(required = true)]
    pub cwd: Option<String>,
    pub created_at: String,
    #[schema(required = true)]
    pub pid: Option<i32>,
    pub runs: u64,
    pub restarts: u64,
}

impl From<lockbox_runtime::ContextInfo> for ContextInfo {
    fn from(i: lockbox_runtime::ContextInfo) -> ContextInfo {
        ContextInfo {
            id: i.id.into(),
            language: i.language.as_str().to_owned(),
            cwd: i.cwd,
            created_at: time(i.created_at),
            pid: i.pid,
            runs: i.runs,
            restarts: i.restarts,
        }
    }
}

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// Its id; generated when absent. `[A-Za-z0-9_.-]{1,64}`.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub id: Option<String>,
    /// `python` (default), `bash` or `node`.
    #[serde(default = "python")]
    #[schema(value_type = LanguageName, default = "python")]
    pub language: String,
    /// Working directory of the interpreter (inside the sandbox).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment of the interpreter.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

// The names `language` takes (`Language::from_name`, aliases included). Written here, not
// derived on the language type: the field is text checked by `language` (so that a wrong
// name is reported as the `language` field), and the runtime's type is serde-free.
/// The language of a code context.
#[derive(Debug, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum LanguageName {
    Python,
    Python3,
    Bash,
    Sh,
    Node,
    Javascript,
    Js,
}

fn python() -> String {
    "python".into()
}

impl CreateContext {
    /// The runtime's options, or `language` named as the field that is wrong.
    pub fn into_options(self) -> Result<lockbox_runtime::ContextOptions, ApiError> {
        Ok(lockbox_runtime::ContextOptions {
            id: self.id.map(Into::into),
            language: language(&self.language)?,
            cwd: self.cwd,
            env: self.env,
        })
    }
}

/// A code context's language by one of its names (`python`, `python3`, `bash`, `sh`,
/// `node`, `javascript`, `js`); anything else is `INVALID_REQUEST` naming `language`.
pub fn language(name: &str) -> Result<lockbox_runtime::Language, lockbox_runtime::RuntimeError> {
    use lockbox_runtime::Language;
    Language::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Language::ALL.iter().map(|l| l.as_str()).collect();
        lockbox_runtime::RuntimeError::InvalidRequest {
            field: "language".into(),
            message: format!("{name:?} is not one of {}", known.join(", ")),
        }
    })
}

/// `POST /v1/sandboxes/{id}/contexts/{cid}/run` and `/run/stream`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The code (Python statements, or bash text).
    pub code: String,
    /// Interrupt after this long (default 300 000).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    pub timeout_ms: Option<u64>,
    /// Variables for this run only: set in the interpreter before the code runs (and so
    /// seen by what it starts), given their earlier values back (or unset) when it ends.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl RunCode {
    /// The runtime's request for context `context`.
    pub fn into_request(
        self,
        context: String,
    ) -> Result<lockbox_runtime::RunCodeRequest, ApiError> {
        if self.timeout_ms == Some(0) {
            return Err(ApiError::invalid(
                "timeout_ms",
                "timeout_ms: must be greater than zero",
            ));
        }
        check_ms("timeout_ms", self.timeout_ms, MAX_MS)?;
        Ok(lockbox_runtime::RunCodeRequest {
            code: self.code,
            context: Some(context.into()),
            timeout: self.timeout_ms.map(std::time::Duration::from_millis),
            env: self.env.into_iter().collect(),
        })
    }
}

/// `GET contexts`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ContextList {
    /// The contexts.
    pub contexts: Vec<ContextInfo>,
}
