//! [`TxnOutcome`]: what a transaction did, always with every stage's result.

use std::path::PathBuf;

use lockbox_cow::{ChangeSet, CommitReport};
use lockbox_policy::name::quoted;

use crate::capture::Output;
use crate::{StageResult, TxnId};

/// Why a transaction did not commit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum AbortReason {
    /// A stage exited non-zero (or was killed by a signal).
    StageFailed {
        /// Its index in declaration order.
        stage: usize,
        /// Its name.
        name: String,
        /// Its exit code.
        exit_code: i32,
    },
    /// A stage restricted to part of the workdir changed something outside it (metadata:
    /// chmod, chown, utimes, xattrs, which Landlock does not stop).
    OutsideWritable {
        /// Its index.
        stage: usize,
        /// Its name.
        name: String,
        /// What it changed, relative to the workdir.
        #[serde(with = "lockbox_policy::name::json::vec")]
        paths: Vec<PathBuf>,
    },
    /// A stage's timeout expired.
    TimedOut {
        /// Its index.
        stage: usize,
        /// Its name.
        name: String,
    },
    /// A stage's sandbox could not be set up.
    SetupFailed {
        /// Its index.
        stage: usize,
        /// Its name.
        name: String,
        /// The setup error.
        message: String,
    },
    /// Gather siblings wrote the same paths under [`crate::ConflictPolicy::Fail`].
    Conflicts {
        /// How many paths conflict (listed in [`TxnOutcome::conflicts`]).
        count: usize,
    },
    /// A dry run: the changes were computed and discarded.
    DryRun,
    /// Aborted by the caller (a prepared transaction aborted or dropped).
    Aborted,
}

impl AbortReason {
    /// The exit code: 1 stage failed, 124 timeout, 125 setup, 3 conflict, 0 dry run and
    /// explicit abort.
    pub fn exit_code(&self) -> u8 {
        match self {
            AbortReason::StageFailed { .. } | AbortReason::OutsideWritable { .. } => 1,
            AbortReason::TimedOut { .. } => 124,
            AbortReason::SetupFailed { .. } => 125,
            AbortReason::Conflicts { .. } => 3,
            AbortReason::DryRun | AbortReason::Aborted => 0,
        }
    }

    /// One sentence for people (`lockbox txn show`).
    pub fn explain(&self) -> String {
        match self {
            AbortReason::StageFailed {
                name, exit_code, ..
            } => format!("aborted: stage {name} exited {exit_code}; nothing committed"),
            AbortReason::TimedOut { name, .. } => {
                format!("aborted: stage {name} timed out; nothing committed")
            }
            AbortReason::OutsideWritable { name, paths, .. } => {
                let paths: Vec<String> = paths.iter().map(|p| quoted(p).to_string()).collect();
                format!(
                    "aborted: stage {name} changed {} outside its writable paths; nothing committed",
                    paths.join(", ")
                )
            }
            AbortReason::SetupFailed { name, message, .. } => {
                format!("aborted: the sandbox of stage {name} could not be set up: {message}")
            }
            AbortReason::Conflicts { count } => {
                format!("aborted: {count} merge conflicts under the fail policy; nothing committed")
            }
            AbortReason::DryRun => "dry run: changes computed and discarded".into(),
            AbortReason::Aborted => "aborted by its caller before commit".into(),
        }
    }

    /// Why a stage's result aborts the transaction (`stage` is its index), if it does.
    pub fn of_stage(stage: usize, r: &StageResult) -> Option<AbortReason> {
        if let Some(message) = &r.setup_error {
            return Some(AbortReason::SetupFailed {
                stage,
                name: r.name.clone(),
                message: message.clone(),
            });
        }
        if r.timed_out {
            return Some(AbortReason::TimedOut {
                stage,
                name: r.name.clone(),
            });
        }
        if r.exit_code == 0 && !r.outside_writable.is_empty() {
            return Some(AbortReason::OutsideWritable {
                stage,
                name: r.name.clone(),
                paths: r.outside_writable.clone(),
            });
        }
        (r.exit_code != 0).then(|| AbortReason::StageFailed {
            stage,
            name: r.name.clone(),
            exit_code: r.exit_code,
        })
    }
}

/// A path written by more than one gather source.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MergeConflict {
    /// The path, relative to the workdir.
    #[serde(with = "lockbox_policy::name::json")]
    pub path: PathBuf,
    /// The sources that changed it (or, for a deleted directory, something below it), in
    /// declaration order.
    pub stages: Vec<String>,
}

/// A losing version kept under another name by [`crate::ConflictPolicy::Markers`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    /// The conflicting path (it holds the first source's version).
    #[serde(with = "lockbox_policy::name::json")]
    pub path: PathBuf,
    /// Where the other source's version was kept (`PATH.lockbox-<source>`).
    #[serde(with = "lockbox_policy::name::json")]
    pub kept_as: PathBuf,
    /// That source.
    pub source: String,
}

/// What a transaction did. Serialised (`--json`, `--report`, a journaled transaction's
/// value) without `stdout`, which only the process that ran it has.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TxnOutcome {
    /// The transaction's id (its record stays in the store).
    pub id: TxnId,
    /// True if the union of the layers was applied to the workdir.
    pub committed: bool,
    /// Every stage that ran, in order (gather: sources, then the consumer).
    pub stages: Vec<StageResult>,
    /// The union of changes (what was, or for a dry run would be, committed).
    pub changes: ChangeSet,
    /// Gather conflicts (resolved or not).
    pub conflicts: Vec<MergeConflict>,
    /// Losing versions kept by [`crate::ConflictPolicy::Markers`].
    pub markers: Vec<Marker>,
    /// Why it did not commit.
    pub abort_reason: Option<AbortReason>,
    /// The commit's counts, when it committed.
    pub report: Option<CommitReport>,
    /// The last stage's (consumer's) stdout.
    #[serde(skip)]
    pub stdout: Output,
}

impl TxnOutcome {
    /// The exit code of `lockbox pipeline` / `lockbox gather`: 0 committed (or dry run), else
    /// the abort reason's.
    pub fn exit_code(&self) -> u8 {
        match &self.abort_reason {
            None => 0,
            Some(r) => r.exit_code(),
        }
    }

    /// Every stage exited 0 in time.
    pub fn all_succeeded(&self) -> bool {
        self.stages.iter().all(StageResult::succeeded)
    }
}
