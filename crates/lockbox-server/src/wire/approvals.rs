//! The audit log and network approvals.

use super::{sorted_keys, yes};
use lockbox_netsup::{NetEvent, Question};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `GET audit`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Stream (SSE) the kept events, then live ones (default); false: the kept ones as JSON.
    #[serde(default = "yes")]
    pub follow: bool,
}

/// `GET approvals`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ApprovalsQuery {
    /// Only questions with a greater id (default 0: all pending).
    #[serde(default)]
    pub after: u64,
    /// Wait up to this long for such a question (a long poll; default 0, at most 60,000).
    #[serde(default)]
    #[param(maximum = 60_000)]
    pub wait_ms: u64,
}

/// `POST approvals/{qid}`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    /// `once`, `sandbox` or `deny`.
    #[schema(value_type = lockbox_netsup::Verdict)]
    pub decision: String,
}

/// The reply of `POST approvals/{qid}`: the verdict taken.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Decision)]
pub struct Decided {
    /// The question.
    #[schema(minimum = 1)]
    pub id: u64,
    /// `once`, `sandbox` or `deny`.
    #[schema(value_type = lockbox_netsup::Verdict)]
    pub decision: &'static str,
}

/// The kept events of a sandbox's audit log.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditLog {
    /// Oldest first (docs/security.md, Audit log).
    #[serde(serialize_with = "sorted_keys")]
    pub events: Vec<NetEvent>,
}

/// The questions waiting for a verdict.
#[derive(Debug, Serialize, ToSchema)]
pub struct Approvals {
    /// Oldest first (docs/security.md, Approvals).
    #[serde(serialize_with = "sorted_keys")]
    pub approvals: Vec<Question>,
}
