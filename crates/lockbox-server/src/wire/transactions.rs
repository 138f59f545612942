//! Transactions: pipelines and gathers.

use super::ChangeList;
use lockbox_policy::name::Decoded;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use utoipa::ToSchema;

/// A transaction as `GET /v1/transactions` lists it and `GET /v1/transactions/{id}` shows
/// it: its record, or what is known of one whose record cannot be read.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Txn {
    /// A readable record.
    Record(Box<TxnRecordReply>),
    /// A directory whose record is missing or damaged.
    Damaged(DamagedTxn),
}

impl From<&lockbox_txn::ListedTxn> for Txn {
    fn from(t: &lockbox_txn::ListedTxn) -> Txn {
        match t {
            lockbox_txn::ListedTxn::Ok(r) => Txn::Record(Box::new(TxnRecordReply::from(r))),
            lockbox_txn::ListedTxn::Damaged { dir, error } => Txn::Damaged(DamagedTxn {
                dir: dir.clone(),
                error: error.to_string(),
                state: DamagedName::Damaged,
            }),
        }
    }
}

/// A transaction's record (`STATE/txns/ID/record.json`) as `lockbox txn show --json` prints
/// it, with `exit_code` and `meaning` (the CLI's verdict) and `created` (RFC 3339). Fields
/// in the order of their names, as before they were typed.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = TxnRecord)]
pub struct TxnRecordReply {
    /// Why it aborted, when known (a failed stage, conflicts, a dry run, the caller).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub abort_reason: Option<lockbox_txn::AbortReason>,
    /// The ctime the kernel gave its fresh base directory: a workdir entry with a ctime at
    /// or after it changed since the transaction began.
    pub base_ctime: TxnTime,
    /// When it began (`base_ctime` as RFC 3339).
    #[schema(format = DateTime)]
    pub created: String,
    /// The exit code `lockbox txn` gives it (0 committed, 1 a stage failed, ...).
    pub exit_code: u8,
    /// Prepared and held by its owner process (recovery aborts it once that is gone).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// The id.
    pub id: String,
    /// The caller's key, for a transaction run under a key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Pipeline or gather.
    pub kind: TxnKindName,
    /// What `exit_code` means, in words.
    pub meaning: String,
    /// The process that runs it.
    pub owner_pid: u32,
    /// What the commit did, once committed (`added`, `modified`, `deleted`, ...).
    #[schema(value_type = Option<Object>)]
    pub report: Option<lockbox_runtime::CommitReport>,
    /// Every stage's result so far.
    #[schema(value_type = Vec<Object>)]
    pub stages: Vec<lockbox_txn::StageResult>,
    /// Where it is in its life.
    pub state: TxnStateName,
    /// A value recorded with the commit (a journaled step's result).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub value: Option<serde_json::Value>,
    /// The workdir, canonical.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub workdir: PathBuf,
}

impl From<&lockbox_txn::TxnRecord> for TxnRecordReply {
    fn from(r: &lockbox_txn::TxnRecord) -> TxnRecordReply {
        let (exit_code, meaning) = r.verdict();
        let nanos = u32::try_from(r.base_ctime.nanos).unwrap_or(0);
        TxnRecordReply {
            abort_reason: r.abort_reason.clone(),
            base_ctime: TxnTime {
                nanos: r.base_ctime.nanos,
                secs: r.base_ctime.secs,
            },
            created: lockbox_policy::time::rfc3339(r.base_ctime.secs, nanos),
            exit_code,
            held: r.held,
            id: r.id.to_string(),
            key: r.key.clone(),
            kind: match r.kind {
                lockbox_txn::TxnKind::Pipeline => TxnKindName::Pipeline,
                lockbox_txn::TxnKind::Gather => TxnKindName::Gather,
            },
            meaning,
            owner_pid: r.owner_pid,
            report: r.report.clone(),
            stages: r.stages.clone(),
            state: match r.state {
                lockbox_txn::TxnState::Running => TxnStateName::Running,
                lockbox_txn::TxnState::Prepared => TxnStateName::Prepared,
                lockbox_txn::TxnState::Committing => TxnStateName::Committing,
                lockbox_txn::TxnState::Committed => TxnStateName::Committed,
                lockbox_txn::TxnState::Aborted => TxnStateName::Aborted,
            },
            value: r.value.clone(),
            workdir: r.workdir.clone(),
        }
    }
}

/// A time as the kernel gives it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TxnTime {
    /// Nanoseconds within the second.
    pub nanos: i64,
    /// Seconds since the Unix epoch.
    pub secs: i64,
}

/// Pipeline or gather.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TxnKindName {
    /// Sequential stages.
    Pipeline,
    /// Parallel sources, then a consumer; or running sandboxes committed together.
    Gather,
}

/// Where a transaction is in its life.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TxnStateName {
    /// Stages are running (or the owner died while they were).
    Running,
    /// Every stage ran; the layers are kept until commit or abort.
    Prepared,
    /// The commit point passed; applying to the workdir.
    Committing,
    /// Applied to the workdir.
    Committed,
    /// Rolled back; the workdir was never touched.
    Aborted,
}

/// A transaction directory whose record is missing (creation interrupted) or damaged.
#[derive(Debug, Serialize, ToSchema)]
pub struct DamagedTxn {
    /// The directory.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub dir: PathBuf,
    /// Why its record cannot be read.
    pub error: String,
    /// `damaged`.
    pub state: DamagedName,
}

/// `damaged`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DamagedName {
    /// The record cannot be read.
    Damaged,
}

/// `GET /v1/transactions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TxnList {
    /// The transactions of the state directory.
    pub transactions: Vec<Txn>,
}

/// `POST /v1/transactions`: running sandboxes committed together (`kind: "gather"`, the
/// only kind so far).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = GatherRequest)]
pub struct TransactionRequest {
    /// `gather`.
    #[schema(value_type = GatherKind)]
    pub kind: String,
    /// The running sandboxes, in order (the order `first_writer_wins` and
    /// `last_writer_wins` go by).
    #[schema(min_items = 1)]
    pub sandboxes: Vec<String>,
    /// `fail` (default): refuse with 409; `first_writer_wins`/`last_writer_wins`: the
    /// first/last sandbox listed that changed the path wins; `markers`: the first wins, the
    /// others' versions are kept as PATH.lockbox-<sandbox>.
    #[serde(default)]
    #[schema(value_type = Option<ConflictName>)]
    pub conflicts: Option<String>,
    /// Report the merged result; change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Commit even where the workdir changed under a sandbox since it began.
    #[serde(default)]
    pub force: bool,
}

// Written here, not derived on `lockbox_txn::TxnKind`: the API makes gathers only, and
// `kind` is text checked by `TransactionRequest::into_gather`.
/// The kind of a transaction made through the API.
#[derive(Debug, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum GatherKind {
    Gather,
}

// The names `TransactionRequest::into_gather` takes. Written here, not derived on
// `lockbox_txn::ConflictPolicy`: its serde form (kebab-case) is not the API's snake_case.
/// How a gather resolves a path several sandboxes changed.
#[derive(Debug, ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum ConflictName {
    Fail,
    FirstWriterWins,
    LastWriterWins,
    Markers,
}

impl TransactionRequest {
    /// The runtime's ids and options, or the field that is wrong.
    pub fn into_gather(
        self,
    ) -> Result<
        (
            Vec<lockbox_runtime::SandboxId>,
            lockbox_runtime::GatherOptions,
        ),
        lockbox_runtime::RuntimeError,
    > {
        use lockbox_runtime::{ConflictPolicy, RuntimeError};
        let invalid = |field: &str, message: String| RuntimeError::InvalidRequest {
            field: field.to_owned(),
            message,
        };
        if self.kind != "gather" {
            return Err(invalid(
                "kind",
                format!("{:?}: the only kind is \"gather\"", self.kind),
            ));
        }
        let conflicts = match self.conflicts.as_deref() {
            None | Some("fail") => ConflictPolicy::Fail,
            Some("first_writer_wins") => ConflictPolicy::FirstWriterWins,
            Some("last_writer_wins") => ConflictPolicy::LastWriterWins,
            Some("markers") => ConflictPolicy::Markers,
            Some(other) => {
                return Err(invalid(
                    "conflicts",
                    format!("{other:?}: use fail, first_writer_wins, last_writer_wins or markers"),
                ))
            }
        };
        let ids = self
            .sandboxes
            .into_iter()
            .map(lockbox_runtime::SandboxId::from)
            .collect();
        let opts = lockbox_runtime::GatherOptions {
            conflicts,
            dry_run: self.dry_run,
            force: self.force,
        };
        Ok((ids, opts))
    }
}

/// What `POST /v1/transactions` answers for a gather. The fields are in the order of their
/// names, as the `json!` object this replaced wrote them.
#[derive(Debug, Serialize, ToSchema)]
pub struct GatherResult {
    /// The merged changes.
    #[schema(value_type = Vec<super::Change>)]
    pub changes: ChangeList,
    /// Applied to the workdir (false for a dry run or a refusal).
    pub committed: bool,
    /// Paths several sandboxes changed, and how each was resolved.
    pub conflicts: Vec<GatherConflict>,
    /// What each sandbox contributed.
    pub contributions: Vec<Contribution>,
    /// Nothing was changed.
    pub dry_run: bool,
    /// The transaction (`GET /v1/transactions/{id}`).
    pub id: String,
    /// `gather`.
    #[schema(value_type = GatherKind)]
    pub kind: &'static str,
    /// Versions kept beside the winner (`markers`).
    pub markers: Vec<Marker>,
    /// What the commit applied.
    #[schema(value_type = Option<Object>)]
    pub report: Option<lockbox_runtime::CommitReport>,
}

/// What one sandbox of a gather contributed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Contribution {
    /// Its changes.
    #[schema(value_type = Vec<super::Change>)]
    pub changes: ChangeList,
    /// The sandbox.
    pub sandbox: String,
}

/// A path several sandboxes of a gather changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct GatherConflict {
    /// Relative to the workdir.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub path: PathBuf,
    /// The sandboxes that changed it.
    pub sandboxes: Vec<String>,
    /// The one whose version was taken (none under `fail`).
    #[schema(required = true)]
    pub winner: Option<String>,
}

/// A version kept beside the winner's under `markers`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Marker {
    /// Where it was kept.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub kept_as: PathBuf,
    /// The path it is a version of.
    #[serde(serialize_with = "lockbox_policy::name::json::serialize")]
    #[schema(value_type = Decoded)]
    pub path: PathBuf,
    /// Whose version.
    pub sandbox: String,
}

impl From<lockbox_runtime::GatherOutcome> for GatherResult {
    fn from(o: lockbox_runtime::GatherOutcome) -> GatherResult {
        GatherResult {
            changes: ChangeList(o.changes),
            committed: o.committed,
            conflicts: o
                .conflicts
                .into_iter()
                .map(|c| GatherConflict {
                    path: c.path,
                    sandboxes: c.sandboxes.iter().map(|s| s.as_str().to_owned()).collect(),
                    winner: c.winner.as_ref().map(|s| s.as_str().to_owned()),
                })
                .collect(),
            contributions: o
                .contributions
                .into_iter()
                .map(|c| Contribution {
                    changes: ChangeList(c.changes),
                    sandbox: c.sandbox.as_str().to_owned(),
                })
                .collect(),
            dry_run: o.dry_run,
            id: o.transaction.to_string(),
            kind: "gather",
            markers: o
                .markers
                .into_iter()
                .map(|m| Marker {
                    kept_as: m.kept_as,
                    path: m.path,
                    sandbox: m.source.to_string(),
                })
                .collect(),
            report: o.report,
        }
    }
}
