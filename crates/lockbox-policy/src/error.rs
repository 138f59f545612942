//! Why a policy was refused.

use lockbox_codes::ErrorCode;
use std::path::PathBuf;

/// A policy value that no sandbox can honour. Each variant names the field or input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// A size could not be parsed.
    #[error("invalid size {input:?}: {reason}")]
    BadSize {
        /// What the user wrote.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration could not be parsed.
    #[error("invalid duration {input:?}: {reason}")]
    BadDuration {
        /// What the user wrote.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A path that must be absolute is not.
    #[error("{field}: path {path:?} must be absolute")]
    RelativePath {
        /// The policy field.
        field: &'static str,
        /// The offending path.
        path: PathBuf,
    },
    /// A path that lockbox itself provides cannot be granted.
    #[error("{field}: {path:?} is provided by lockbox and cannot be granted ({why})")]
    ReservedPath {
        /// The policy field.
        field: &'static str,
        /// The offending path.
        path: PathBuf,
        /// Why it is reserved.
        why: &'static str,
    },
    /// An environment entry is malformed.
    #[error("environment: {reason}")]
    BadEnv {
        /// What is wrong.
        reason: String,
    },
    /// Any other field with an out-of-range value.
    #[error("{field}: {reason}")]
    Invalid {
        /// The policy field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A `--net-allow`/`--net-deny` destination could not be parsed.
    #[error("network spec {spec:?}: {reason}")]
    BadNetSpec {
        /// What the user wrote.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TOML profile could not be read.
    #[error("profile: {message}")]
    Profile {
        /// The parser's message (names the key).
        message: String,
        /// Byte range in the profile, if known.
        span: Option<(usize, usize)>,
    },
}

impl PolicyError {
    /// A stable identifier for machines (`SCREAMING_SNAKE`).
    pub fn code(&self) -> ErrorCode {
        match self {
            PolicyError::BadSize { .. } => ErrorCode::BadSize,
            PolicyError::BadDuration { .. } => ErrorCode::BadDuration,
            PolicyError::RelativePath { .. } => ErrorCode::RelativePath,
            PolicyError::ReservedPath { .. } => ErrorCode::ReservedPath,
            PolicyError::BadEnv { .. } => ErrorCode::BadEnv,
            PolicyError::Invalid { .. } => ErrorCode::InvalidPolicy,
            PolicyError::BadNetSpec { .. } => ErrorCode::BadNetSpec,
            PolicyError::Profile { .. } => ErrorCode::BadProfile,
        }
    }
}
