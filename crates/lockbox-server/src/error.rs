//! The one error type of the HTTP API: [`ApiError`], rendered as
//! `{"code": "...", "message": "...", "details": {...}}` with a stable `code` and the HTTP
//! status that code always has ([`status_of`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lockbox_policy::ErrorCode;
use lockbox_runtime::RuntimeError;
use serde_json::{json, Value};

/// An error answered to an HTTP client.
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct ApiError {
    /// Stable, `SCREAMING_SNAKE` code (see `docs/server.md`).
    #[schema(schema_with = crate::openapi::error_codes)]
    pub code: ErrorCode,
    /// One lowercase line naming the id, path or field.
    pub message: String,
    /// Machine-readable context (`field`, `id`, `path`, ...); an object.
    #[schema(value_type = Object)]
    pub details: Value,
}

/// The HTTP status of a code: one `match` over every code lockbox has, so a new code
/// cannot be added without deciding its status.
pub fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode as C;
    match code {
        // The request is wrong.
        C::InvalidRequest
        | C::NotADirectory
        | C::IsADirectory
        | C::BadSize
        | C::BadDuration
        | C::RelativePath
        | C::ReservedPath
        | C::BadEnv
        | C::InvalidPolicy
        | C::BadNetSpec
        | C::BadProfile
        | C::BadPolicy
        | C::BadPath
        | C::BadHunk
        | C::InvalidBranchId
        | C::InvalidSnapshotId
        | C::InvalidTxnId
        | C::TxnUsage
        | C::InvalidRunId
        | C::InvalidStepName
        | C::InvalidBranchKey
        | C::DuplicateBranchKey
        | C::InvalidStorageUrl
        | C::NotSerializable
        | C::BadReference
        | C::EncodeValue => StatusCode::BAD_REQUEST,
        C::Unauthorized => StatusCode::UNAUTHORIZED,
        C::Forbidden
        | C::BeyondCeiling
        | C::PathOutsideSandbox
        | C::ReadOnly
        | C::PermissionDenied
        | C::WorkdirPermission => StatusCode::FORBIDDEN,
        C::NotFound
        | C::SandboxNotFound
        | C::SessionNotFound
        | C::ProcessNotFound
        | C::FileNotFound
        | C::BranchNotFound
        | C::SnapshotNotFound
        | C::NotChanged
        | C::TxnNotFound
        | C::RunNotFound
        | C::NoJournal
        | C::StepNotFound
        | C::PortNotExposed
        | C::ContextNotFound
        | C::QuestionNotFound
        | C::ImageNotFound
        | C::TokenNotFound => StatusCode::NOT_FOUND,
        // An upstream (a registry) failed or sent what cannot be used.
        C::RegistryFailed | C::RegistryAuth | C::DigestMismatch | C::BadImage => {
            StatusCode::BAD_GATEWAY
        }
        // The sandboxed server is the upstream of the port proxy.
        C::PortNotListening => StatusCode::BAD_GATEWAY,
        C::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        C::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        // The request is fine but the state forbids it now.
        C::SandboxNotRunning
        | C::QuestionDecided
        | C::SessionTerminated
        | C::ProcessNotRunning
        | C::AlreadyExists
        | C::NoWorkdir
        | C::NotSupported
        | C::Conflict
        | C::StaleBase
        | C::StaleReview
        | C::BranchCommitting
        | C::PartCommitFinished
        | C::SnapshotInUse
        | C::WorkdirBusy
        | C::WorkdirLock
        | C::WorkdirMismatch
        | C::SpecialFiles
        | C::ReservedName
        | C::TxnWrongState
        | C::ReplayMismatch
        | C::VersionMismatch
        | C::MetadataMismatch
        | C::TerminalRun
        | C::Fenced
        | C::OffsetConflict
        | C::RunExists
        | C::OffsetOutOfRange
        | C::NotSuspended
        | C::ImageInUse
        | C::StepFailed => StatusCode::CONFLICT,
        C::PayloadTooLarge | C::StepTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        C::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        C::RangeNotSatisfiable => StatusCode::RANGE_NOT_SATISFIABLE,
        // No sandbox can be made as asked on this host.
        C::SetupFailed
        | C::FeatureMissing
        | C::NetNameUnresolved
        | C::CloneFailed
        | C::SetupStepFailed
        | C::InitDied
        | C::SeccompBuildFailed
        | C::CgroupFailed
        | C::SequenceUnsupported
        | C::StateWorkdirOverlap
        | C::NoPlatform
        | C::UnsupportedOverlay => StatusCode::UNPROCESSABLE_ENTITY,
        // A body that is no usable artifact: its content, not its syntax, is wrong.
        C::BadArtifact => StatusCode::UNPROCESSABLE_ENTITY,
        C::LimitReached => StatusCode::TOO_MANY_REQUESTS,
        C::ServerBusy | C::StorageWorkerGone | C::TxnOutcomeLookup => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        // A fleet router's own: a node that may come back, or none to take it.
        C::NodeUnreachable | C::NoNode | C::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        // ... and what went with a lost node.
        C::SandboxLost | C::SnapshotLost | C::NodeLost => StatusCode::GONE,
        // lockbox or the host failed: the cause goes to the operator's log.
        C::Internal
        | C::SuperviseFailed
        | C::StateDir
        | C::CreateBranchDir
        | C::OpenWorkdir
        | C::ImportUpper
        | C::WriteBranchMeta
        | C::ReadBranchMeta
        | C::CorruptBranchMeta
        | C::RemoveBranch
        | C::ListBranches
        | C::ReadBranchEntry
        | C::ReadWorkdirEntry
        | C::ResolveBeneath
        | C::CommitStage
        | C::CommitSyncfs
        | C::CommitRename
        | C::CommitMkdir
        | C::CommitDelete
        | C::CommitSetMeta
        | C::Fsync
        | C::SnapshotStore
        | C::ImageStore
        | C::TxnStore
        | C::TxnWriteRecord
        | C::TxnReadRecord
        | C::TxnCorruptRecord
        | C::TxnStdio
        | C::TxnApply
        | C::JournalTask
        | C::JournalCorruption
        | C::UnsupportedFormat
        | C::DecodeValue
        | C::StorageIo
        | C::StorageSqlite
        | C::StoragePostgres
        | C::InvalidSchema
        | C::StorageUnsupported => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// An error with empty details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
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
        ApiError::new(ErrorCode::InvalidRequest, message).with_details(json!({ "field": field }))
    }

    /// `LIMIT_REACHED` naming the limit (details as the runtime's: `{what, limit}`).
    pub fn limit(what: &str, limit: usize) -> ApiError {
        ApiError::new(
            ErrorCode::LimitReached,
            format!("{what} reached ({limit}); retry later"),
        )
        .with_details(json!({ "what": what, "limit": limit }))
    }

    /// `REQUEST_TIMEOUT`: the request body delivered nothing for `--io-timeout`.
    pub fn body_stalled() -> ApiError {
        ApiError::new(
            ErrorCode::RequestTimeout,
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
        let details = match runtime_details(&e) {
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

/// A runtime error's details for machines (`{"id": ...}`, `{"path": ...}`, `{"field":
/// ...}`): the server's wire form, not the runtime's concern.
fn runtime_details(e: &RuntimeError) -> Value {
    match e {
        RuntimeError::SandboxNotFound { id }
        | RuntimeError::SessionNotFound { id }
        | RuntimeError::SessionExists { id }
        | RuntimeError::ProcessNotFound { id }
        | RuntimeError::ProcessNotRunning { id }
        | RuntimeError::NoWorkdir { id }
        | RuntimeError::ContextNotFound { id }
        | RuntimeError::ContextExists { id }
        | RuntimeError::SandboxBusy { id } => json!({ "id": id }),
        RuntimeError::SandboxNotRunning { id, state } => {
            json!({ "id": id.as_str(), "state": state.as_str() })
        }
        RuntimeError::QuestionNotFound { id } | RuntimeError::QuestionDecided { id } => {
            json!({ "id": id })
        }
        RuntimeError::SessionTerminated { id, reason } => {
            json!({ "id": id, "reason": reason })
        }
        RuntimeError::NotSupported { id, what } => json!({ "id": id, "what": what }),
        RuntimeError::NetUpdate { id, .. } => json!({ "id": id.as_str() }),
        RuntimeError::FileNotFound { path }
        | RuntimeError::PathOutsideSandbox { path }
        | RuntimeError::NotADirectory { path }
        | RuntimeError::IsADirectory { path }
        | RuntimeError::AlreadyExists { path }
        | RuntimeError::ReadOnly { path }
        | RuntimeError::PermissionDenied { path } => json!({ "path": path }),
        RuntimeError::InvalidRequest { field, message } => {
            json!({ "field": field, "message": message })
        }
        RuntimeError::LimitReached { what, limit } => json!({ "what": what, "limit": limit }),
        RuntimeError::PortNotExposed { port } | RuntimeError::PortNotListening { port } => {
            json!({ "port": port })
        }
        RuntimeError::Setup(e) => json!({ "cause": e.code(), "hint": e.hint() }),
        RuntimeError::Image(_) => json!({ "field": "image" }),
        RuntimeError::SnapshotTransfer { id, source } => {
            let reason = match source {
                lockbox_image::ImageError::DigestMismatch { .. } => "digest_mismatch",
                lockbox_image::ImageError::SizeMismatch { .. } => "size_mismatch",
                lockbox_image::ImageError::Io { .. } => "io",
                _ => "malformed",
            };
            json!({ "id": id, "reason": reason })
        }
        RuntimeError::Branch(lockbox_runtime::CowError::BadHunk { path, index, count }) => {
            json!({ "path": lockbox_policy::name::Encoded(path), "index": index, "count": count })
        }
        RuntimeError::Branch(lockbox_runtime::CowError::StaleReview { paths }) => {
            let paths: Vec<_> = paths
                .iter()
                .map(|p| lockbox_policy::name::Encoded(p))
                .collect();
            json!({ "paths": paths })
        }
        RuntimeError::Branch(lockbox_runtime::CowError::SnapshotInUse {
            holders,
            children,
            ..
        }) => json!({ "held_by": holders, "snapshots": children }),
        RuntimeError::Conflict { paths, .. } => {
            let paths: Vec<_> = paths
                .iter()
                .map(|p| lockbox_policy::name::Encoded(p))
                .collect();
            json!({ "paths": paths })
        }
        RuntimeError::MergeConflicts { conflicts } => {
            let paths: Vec<_> = conflicts
                .iter()
                .map(|c| lockbox_policy::name::Encoded(&c.path))
                .collect();
            let each: Vec<_> = conflicts
                .iter()
                .map(|c| {
                    let sandboxes: Vec<&str> = c.sandboxes.iter().map(|s| s.as_str()).collect();
                    json!({ "path": lockbox_policy::name::Encoded(&c.path), "sandboxes": sandboxes })
                })
                .collect();
            json!({ "paths": paths, "conflicts": each })
        }
        RuntimeError::Protocol(lockbox_runtime::ProtocolError::VersionMismatch {
            runtime,
            agent,
        }) => json!({ "runtime_protocol": runtime, "agent_protocol": agent }),
        RuntimeError::Protocol(lockbox_runtime::ProtocolError::UnexpectedReply {
            expected,
            received,
        }) => json!({ "expected": expected, "received": received }),
        // SetupFailed, other Branch errors, Transaction, Internal (and variants added
        // later, RuntimeError being non-exhaustive): nothing more than the message.
        _ => json!({}),
    }
}

impl From<lockbox_txn::TxnError> for ApiError {
    fn from(e: lockbox_txn::TxnError) -> ApiError {
        ApiError::new(e.code(), e.to_string())
    }
}

impl From<lockbox_journal::JournalError> for ApiError {
    fn from(e: lockbox_journal::JournalError) -> ApiError {
        ApiError::new(e.code(), e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (message, details) = if status.is_server_error() {
            // The cause goes to the operator's log, not to the client.
            tracing::error!(code = %self.code, message = %self.message, details = %self.details, "request failed");
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
    /// The details of an agent of another protocol version name both versions.
    #[test]
    fn a_protocol_mismatch_names_both_versions_in_its_details() {
        let e =
            lockbox_runtime::RuntimeError::from(lockbox_runtime::ProtocolError::VersionMismatch {
                runtime: lockbox_runtime::PROTOCOL_VERSION,
                agent: 99,
            });
        let api = super::ApiError::from(e);
        assert_eq!(
            api.details,
            serde_json::json!({ "runtime_protocol": lockbox_runtime::PROTOCOL_VERSION, "agent_protocol": 99 })
        );
    }

    use super::*;

    #[test]
    fn codes_have_the_statuses_clients_rely_on() {
        assert_eq!(status_of(ErrorCode::SandboxNotFound), StatusCode::NOT_FOUND);
        assert_eq!(status_of(ErrorCode::StaleBase), StatusCode::CONFLICT);
        assert_eq!(status_of(ErrorCode::StaleReview), StatusCode::CONFLICT);
        assert_eq!(
            status_of(ErrorCode::SetupFailed),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(status_of(ErrorCode::Unauthorized), StatusCode::UNAUTHORIZED);
        // Errors of the request are 4xx; only lockbox's or the host's own failures are 5xx.
        for &code in ErrorCode::ALL {
            let status = status_of(code);
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{code}"
            );
        }
    }
}
