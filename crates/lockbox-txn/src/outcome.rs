//! [`TxnOutcome`]: what a transaction did, always with every stage's result.

use std::path::PathBuf;

use lockbox_cow::{ChangeSet, CommitReport};
use lockbox_policy::name::{printable_text, quoted};
use lockbox_policy::plural;
use std::fmt;

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

    /// One sentence for people (`lockbox txn show`), naming the stage by number (from 1)
    /// and name: `stage 1 "lint" exited 127; nothing committed`.
    pub fn explain(&self) -> String {
        match self {
            AbortReason::DryRun | AbortReason::Aborted => self.what(),
            _ => format!("{}; nothing committed", self.what()),
        }
    }

    /// What stopped the transaction: `stage 1 "lint" exited 127`.
    fn what(&self) -> String {
        match self {
            AbortReason::StageFailed {
                stage,
                name,
                exit_code,
            } => format!("{} exited {exit_code}", stage_label(*stage, name)),
            AbortReason::TimedOut { stage, name } => {
                format!("{} timed out", stage_label(*stage, name))
            }
            AbortReason::OutsideWritable { stage, name, paths } => {
                let paths: Vec<String> = paths.iter().map(|p| quoted(p).to_string()).collect();
                format!(
                    "{} changed {} outside its writable paths",
                    stage_label(*stage, name),
                    paths.join(", ")
                )
            }
            AbortReason::SetupFailed {
                stage,
                name,
                message,
            } => format!(
                "the sandbox of {} could not be set up: {message}",
                stage_label(*stage, name)
            ),
            AbortReason::Conflicts { count } => {
                format!("{} under the fail policy", plural(*count, "merge conflict"))
            }
            AbortReason::DryRun => "dry run: changes computed and discarded".into(),
            AbortReason::Aborted => "aborted by its caller before commit".into(),
        }
    }

    /// The index of the stage this reason names, if it names one.
    pub fn stage(&self) -> Option<usize> {
        match self {
            AbortReason::StageFailed { stage, .. }
            | AbortReason::OutsideWritable { stage, .. }
            | AbortReason::TimedOut { stage, .. }
            | AbortReason::SetupFailed { stage, .. } => Some(*stage),
            AbortReason::Conflicts { .. } | AbortReason::DryRun | AbortReason::Aborted => None,
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

/// How people read a stage's identity: `stage 2`, or `stage 2 "lint"` when it has a name of
/// its own (not the default `stage-2`). Numbers count from 1, as `--stage-opts` does.
pub fn stage_label(index: usize, name: &str) -> String {
    let n = index + 1;
    if name.is_empty() || name == format!("stage-{n}") {
        format!("stage {n}")
    } else {
        format!(
            "stage {n} \"{}\"",
            printable_text(name).replace('\n', "\\n")
        )
    }
}

/// How many trailing lines of a failed stage's stderr a summary shows.
pub const SUMMARY_STDERR_LINES: usize = 10;

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

/// The summary for people: what happened and, when a stage stopped the transaction, the end
/// of its stderr (escaped: nothing in it can rewrite the terminal). `lockbox pipeline`
/// prints it after `lockbox: `; Python and the server use the same text.
impl fmt::Display for TxnOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(reason) = &self.abort_reason else {
            return write!(f, "committed {}", plural(self.changes.len(), "change"));
        };
        let failed = reason.stage().and_then(|i| self.stages.get(i));
        let tail = failed
            .map(|s| stderr_lines(&s.stderr_tail))
            .unwrap_or_default();
        match (reason, tail.as_slice()) {
            (AbortReason::DryRun | AbortReason::Aborted, _) => f.write_str(&reason.what()),
            (_, []) => write!(f, "not committed: {}", reason.what()),
            // The usual failure ends with one line that says it all: put it on the same line.
            (_, [line]) => write!(f, "not committed: {}: {line}", reason.what()),
            (_, lines) => {
                write!(f, "not committed: {}", reason.what())?;
                write!(f, "\nits stderr ends with:")?;
                for line in lines {
                    write!(f, "\n  {line}")?;
                }
                Ok(())
            }
        }
    }
}

/// The last [`SUMMARY_STDERR_LINES`] non-empty lines of a stderr tail, made printable.
fn stderr_lines(tail: &str) -> Vec<String> {
    let lines: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(SUMMARY_STDERR_LINES);
    lines[from..]
        .iter()
        .map(|l| printable_text(l).into_owned())
        .collect()
}
