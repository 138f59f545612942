//! Runs of the step journal (`lockbox serve --journal`), as `lockbox journal status|dump`
//! print them, plus `id` and `status`.

use lockbox_journal::{RunState, RunStatus, TerminalState};
use serde::Serialize;
use utoipa::ToSchema;

/// Where a run stands.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStateName {
    /// Started and not finished.
    Running,
    /// Waiting to be resumed (`event` names what for).
    Suspended,
    /// Finished (`outcome` says how).
    Finished,
}

/// How a finished run ended.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeName {
    /// `complete` was journaled.
    Completed,
    /// `error` was journaled.
    Failed,
    /// `cancel` was journaled.
    Cancelled,
}

impl From<TerminalState> for OutcomeName {
    fn from(t: TerminalState) -> OutcomeName {
        match t {
            TerminalState::Completed => OutcomeName::Completed,
            TerminalState::Failed => OutcomeName::Failed,
            TerminalState::Cancelled => OutcomeName::Cancelled,
        }
    }
}

/// What is said of a run of the journal beside its entries: `lockbox journal status`'s
/// fields with `id` and `status` beside `run_id` and `state`.
// Fields in the order of their names (after `entries`), as before they were typed.
#[derive(Debug, Serialize, ToSchema)]
pub struct JournalRunFields {
    /// Suspended: the event it waits for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The run's id.
    pub id: String,
    /// The newest session that wrote an entry.
    pub last_session: u64,
    /// The metadata of its first start (any JSON; `null` if none).
    #[schema(value_type = Value)]
    pub metadata: serde_json::Value,
    /// Finished: how.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeName>,
    /// The run's id (as `lockbox journal status` prints it).
    pub run_id: String,
    /// Where it stands (as `lockbox journal status` prints it).
    pub state: RunStateName,
    /// Where it stands.
    pub status: RunStateName,
    /// Number of journaled steps.
    pub steps: u64,
    /// The code version of its first start.
    pub version: Option<String>,
}

impl From<RunStatus> for JournalRunFields {
    fn from(s: RunStatus) -> JournalRunFields {
        let (state, event, outcome) = match s.state {
            RunState::Running => (RunStateName::Running, None, None),
            RunState::Suspended { event } => (RunStateName::Suspended, Some(event), None),
            RunState::Finished { outcome } => (RunStateName::Finished, None, Some(outcome.into())),
        };
        JournalRunFields {
            event,
            id: s.run_id.to_string(),
            last_session: s.last_session,
            metadata: s.metadata,
            outcome,
            run_id: s.run_id.to_string(),
            state,
            status: state,
            steps: s.steps,
            version: s.version,
        }
    }
}

/// A run of the journal (`GET /v1/journal/runs`): [`JournalRunFields`] and the number of
/// its entries.
#[derive(Debug, Serialize, ToSchema)]
pub struct JournalRunStatus {
    /// Number of entries.
    pub entries: u64,
    // Written after `entries`, so the fields stay in the order of their names.
    #[serde(flatten)]
    pub run: JournalRunFields,
}

impl From<RunStatus> for JournalRunStatus {
    fn from(s: RunStatus) -> JournalRunStatus {
        JournalRunStatus {
            entries: s.entries,
            run: JournalRunFields::from(s),
        }
    }
}

/// The runs of the journal given to `--journal`.
#[derive(Debug, Serialize, ToSchema)]
pub struct JournalRuns {
    /// The journal's URL without a password (`null`: this server has none).
    pub journal: Option<String>,
    /// Its runs.
    pub runs: Vec<JournalRunStatus>,
}

/// One run of the journal with its entries (`GET /v1/journal/runs/{id}`, as `lockbox journal
/// status` and `dump` print it): [`JournalRunFields`] and the entries themselves.
#[derive(Debug, Serialize, ToSchema)]
pub struct JournalRun {
    /// The entries, oldest first, as `lockbox journal dump --json` prints them.
    #[schema(value_type = Vec<Object>)]
    pub entries: Vec<lockbox_journal::Entry>,
    // Written after `entries`, so the fields stay in the order of their names.
    #[serde(flatten)]
    pub run: JournalRunFields,
}

impl JournalRun {
    /// `status` with `entries` in place of their number.
    pub fn new(status: RunStatus, entries: Vec<lockbox_journal::Entry>) -> JournalRun {
        JournalRun {
            entries,
            run: JournalRunFields::from(status),
        }
    }
}
