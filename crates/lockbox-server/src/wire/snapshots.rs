//! Snapshots, forks and restores.

use super::{time, SandboxInfo};
use crate::error::ApiError;
use lockbox_policy::name::Decoded;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use utoipa::{IntoParams, ToSchema};

/// A snapshot ([`lockbox_runtime::SnapshotInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Snapshot)]
pub struct SnapshotInfo {
    #[schema(value_type = String)]
    pub id: lockbox_runtime::SnapshotId,
    #[schema(required = true)]
    pub name: Option<String>,
    #[schema(value_type = Option<String>, required = true)]
    pub parent: Option<lockbox_runtime::SnapshotId>,
    #[schema(required = true)]
    pub sandbox: Option<String>,
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub workdir: PathBuf,
    pub created_at: String,
    pub bytes: u64,
    pub entries: u64,
}

impl From<lockbox_runtime::SnapshotInfo> for SnapshotInfo {
    fn from(i: lockbox_runtime::SnapshotInfo) -> SnapshotInfo {
        SnapshotInfo {
            id: i.id,
            name: i.name,
            parent: i.parent,
            sandbox: i.sandbox.map(String::from),
            workdir: i.workdir,
            created_at: time(i.created_at),
            bytes: i.bytes,
            entries: i.entries,
        }
    }
}

/// `POST /v1/sandboxes/{id}/snapshots` (the body may be left out).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A name for people (at most 256 bytes, no control characters).
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f]*$")]
    pub name: Option<String>,
    /// Keep the sandbox's `/tmp` too: forks and restores find it in theirs.
    #[serde(default)]
    pub include_tmp: bool,
}

/// `POST /v1/snapshots/{id}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes (default 1; at most the server's max_sandboxes).
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1)]
    pub count: usize,
}

fn one() -> usize {
    1
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandboxRequest {
    /// How many sandboxes (default 1; at most the server's max_sandboxes).
    #[serde(default = "one")]
    #[schema(minimum = 1, default = 1)]
    pub count: usize,
    /// A name for the snapshot taken first.
    #[serde(default)]
    #[schema(max_length = 256, pattern = "^[^\\x00-\\x1f\\x7f]*$")]
    pub name: Option<String>,
    /// Keep the sandbox's `/tmp` in that snapshot too.
    #[serde(default)]
    pub include_tmp: bool,
}

/// `POST /v1/sandboxes/{id}/restore`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The snapshot to roll back to.
    pub snapshot: String,
}

/// `GET /v1/snapshots/{id}/diff`: what the snapshot is compared with (at most one; none:
/// the workdir as it is now).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SnapshotDiffQuery {
    /// Another snapshot of the same workdir.
    pub to_snapshot: Option<String>,
    /// A running sandbox of the same workdir.
    pub to_sandbox: Option<String>,
}

impl SnapshotDiffQuery {
    /// The one conversion into the runtime's target.
    pub fn into_target(self) -> Result<lockbox_runtime::DiffTarget, ApiError> {
        use lockbox_runtime::DiffTarget;
        match (self.to_snapshot, self.to_sandbox) {
            (None, None) => Ok(DiffTarget::Workdir),
            (Some(s), None) => Ok(DiffTarget::Snapshot(s)),
            (None, Some(s)) => Ok(DiffTarget::Sandbox(s)),
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "to_snapshot",
                "give to_snapshot or to_sandbox, not both",
            )),
        }
    }
}

/// `PUT /v1/snapshots/{id}/artifact`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ArtifactQuery {
    /// The artifact's digest (`sha256:` and 64 hex digits): the `Docker-Content-Digest`
    /// its export answered with.
    pub digest: String,
}

/// The header of `PUT /v1/snapshots/{id}/artifact` that puts the received snapshot in a
/// scope of this node's agents besides its store.
pub const SNAPSHOT_SCOPE_HEADER: &str = "lockbox-snapshot-scope";

/// `PUT /v1/snapshots/{id}/artifact`'s headers, read once at the edge
/// ([`ArtifactHeaders::from_headers`]).
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct ArtifactHeaders {
    /// `mcp`: the snapshot joins this node's MCP scope (what `/mcp` reaches with the
    /// operator's token), so its `fork` and `restore` tools see it, as if it had been taken
    /// through this node's `/mcp`; a fleet router sets it when it copies a snapshot that
    /// is in the source node's MCP scope (docs/fleet.md). Given again for a snapshot this
    /// node has, it joins the scope all the same. Any other value: 400 `INVALID_REQUEST`.
    #[param(rename = "Lockbox-Snapshot-Scope", value_type = Option<String>, pattern = "^mcp$")]
    pub scope: Option<SnapshotScope>,
}

/// A scope a received snapshot joins (`Lockbox-Snapshot-Scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotScope {
    /// The node's MCP scope (`AppState::mcp`).
    Mcp,
}

impl ArtifactHeaders {
    /// The one conversion of the request's headers: a `Lockbox-Snapshot-Scope` that is not
    /// `mcp` (or not text) is 400 `INVALID_REQUEST` naming the header.
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Result<ArtifactHeaders, ApiError> {
        let Some(value) = headers.get(SNAPSHOT_SCOPE_HEADER) else {
            return Ok(ArtifactHeaders::default());
        };
        match value.to_str() {
            Ok("mcp") => Ok(ArtifactHeaders {
                scope: Some(SnapshotScope::Mcp),
            }),
            _ => Err(ApiError::invalid(
                "Lockbox-Snapshot-Scope",
                format!(
                    "Lockbox-Snapshot-Scope: {:?} is not a scope (the one there is: mcp)",
                    String::from_utf8_lossy(value.as_bytes())
                ),
            )),
        }
    }
}

/// `GET /v1/snapshots`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotList {
    /// The snapshots, oldest first.
    pub snapshots: Vec<SnapshotInfo>,
}

/// `POST /v1/sandboxes/{id}/fork`: the snapshot taken and the forks made of it. The fields
/// are in the order of their names, as the `json!` object this replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkReply {
    /// The forks.
    pub sandboxes: Vec<SandboxInfo>,
    /// The snapshot taken first.
    pub snapshot: SnapshotInfo,
}
