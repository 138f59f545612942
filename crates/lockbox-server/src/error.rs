//! The one error type of the HTTP API: [`ApiError`], rendered as
//! `{"code": "...", "message": "...", "details": {...}}` with a stable `code` and the HTTP
//! status that code always has ([`status_of`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lockbox_runtime::RuntimeError;
use serde_json::{json, Value};

/// An error answered to an HTTP client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// Stable, `SCREAMING_SNAKE` code (see `docs/server.md`).
    pub code: &'static str,
    /// One lowercase line naming the id, path or field.
    pub message: String,
    /// Machine-readable context (`field`, `id`, `path`, ...); an object.
    pub details: Value,
}

/// Every code the server answers with, with its HTTP status. The runtime's codes pass
/// through unchanged; an unknown one is a 500 (and a bug to fix here).
pub const CODES: &[(&str, StatusCode)] = &[
    ("INVALID_REQUEST", StatusCode::BAD_REQUEST),
    ("NOT_A_DIRECTORY", StatusCode::BAD_REQUEST),
    ("IS_A_DIRECTORY", StatusCode::BAD_REQUEST),
    ("UNAUTHORIZED", StatusCode::UNAUTHORIZED),
    ("PATH_OUTSIDE_SANDBOX", StatusCode::FORBIDDEN),
    ("READ_ONLY", StatusCode::FORBIDDEN),
    ("PERMISSION_DENIED", StatusCode::FORBIDDEN),
    ("NOT_FOUND", StatusCode::NOT_FOUND),
    ("SANDBOX_NOT_FOUND", StatusCode::NOT_FOUND),
    ("SESSION_NOT_FOUND", StatusCode::NOT_FOUND),
    ("PROCESS_NOT_FOUND", StatusCode::NOT_FOUND),
    ("FILE_NOT_FOUND", StatusCode::NOT_FOUND),
    ("METHOD_NOT_ALLOWED", StatusCode::METHOD_NOT_ALLOWED),
    ("REQUEST_TIMEOUT", StatusCode::REQUEST_TIMEOUT),
    ("SANDBOX_NOT_RUNNING", StatusCode::CONFLICT),
    ("SESSION_TERMINATED", StatusCode::CONFLICT),
    ("PROCESS_NOT_RUNNING", StatusCode::CONFLICT),
    ("ALREADY_EXISTS", StatusCode::CONFLICT),
    ("NO_WORKDIR", StatusCode::CONFLICT),
    ("NOT_SUPPORTED", StatusCode::CONFLICT),
    ("CONFLICT", StatusCode::CONFLICT),
    ("PAYLOAD_TOO_LARGE", StatusCode::PAYLOAD_TOO_LARGE),
    ("UNSUPPORTED_MEDIA_TYPE", StatusCode::UNSUPPORTED_MEDIA_TYPE),
    ("RANGE_NOT_SATISFIABLE", StatusCode::RANGE_NOT_SATISFIABLE),
    ("SETUP_FAILED", StatusCode::UNPROCESSABLE_ENTITY),
    ("LIMIT_REACHED", StatusCode::TOO_MANY_REQUESTS),
    ("INTERNAL", StatusCode::INTERNAL_SERVER_ERROR),
    ("SERVER_BUSY", StatusCode::SERVICE_UNAVAILABLE),
];

/// The HTTP status of a code.
pub fn status_of(code: &str) -> StatusCode {
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, s)| *s)
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl ApiError {
    /// An error with empty details.
    pub fn new(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
            details: json!({}),
        }
    }

    /// Replaces the details.
    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = details;
        self
    }

    /// `INVALID_REQUEST` naming the field.
    pub fn invalid(field: &str, message: impl Into<String>) -> ApiError {
        ApiError::new("INVALID_REQUEST", message).with_details(json!({ "field": field }))
    }

    /// `LIMIT_REACHED` naming the limit (details as the runtime's: `{what, limit}`).
    pub fn limit(what: &str, limit: usize) -> ApiError {
        ApiError::new(
            "LIMIT_REACHED",
            format!("{what} reached ({limit}); retry later"),
        )
        .with_details(json!({ "what": what, "limit": limit }))
    }

    /// `REQUEST_TIMEOUT`: the request body delivered nothing for `--io-timeout`.
    pub fn body_stalled() -> ApiError {
        ApiError::new(
            "REQUEST_TIMEOUT",
            "the request body stopped arriving (--io-timeout)",
        )
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        status_of(self.code)
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> ApiError {
        let details = match e.details() {
            Value::Object(map) => Value::Object(map),
            Value::Null => json!({}),
            other => json!({ "value": other }),
        };
        ApiError {
            code: e.code(),
            message: e.to_string(),
            details,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (message, details) = if status.is_server_error() {
            // The cause goes to the operator's log, not to the client.
            tracing::error!(code = self.code, message = %self.message, details = %self.details, "request failed");
            ("internal error (see the server log)".to_owned(), json!({}))
        } else {
            (self.message, self.details)
        };
        let body = json!({ "code": self.code, "message": message, "details": details });
        (status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_status() {
        for (i, (code, _)) in CODES.iter().enumerate() {
            assert!(
                CODES[i + 1..].iter().all(|(c, _)| c != code),
                "{code} listed twice"
            );
        }
        assert_eq!(status_of("SANDBOX_NOT_FOUND"), StatusCode::NOT_FOUND);
        assert_eq!(status_of("NO_SUCH_CODE"), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
