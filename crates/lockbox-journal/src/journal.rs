//! [`Journal`]: opens runs ([`Journal::start`]), answers suspensions ([`Journal::resume`]),
//! cancels, forks and inspects them. A journal is a cheap handle on one [`Storage`].

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::entry::{self, Entry, EntryBody, RawEntry, FORMAT_VERSION};
use crate::error::{JournalError, StorageError, TerminalState};
use crate::id::{RunId, StepId};
use crate::run::{Memo, MemoKind, Run};
use crate::storage::Storage;

/// Default bound on one encoded entry: 8 MiB.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 8 * 1024 * 1024;

/// What a run declares when it starts. The first start of a run fixes both; later starts
/// must match or fail with [`JournalError::VersionMismatch`] / [`JournalError::MetadataMismatch`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartOptions {
    /// The version of the code driving the run (e.g. a git hash); `None` is a version too.
    pub version: Option<String>,
    /// Caller data (JSON); `Null` when absent.
    pub metadata: serde_json::Value,
}

/// Where [`Journal::fork`] cuts the source run. The fork keeps the entries *before* the cut,
/// so the step at the cut runs again in the fork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkPoint {
    /// Cut just before this step's entry.
    Step(StepId),
    /// Keep entries `0..offset`.
    Offset(u64),
}

/// Where a run stands, derived from its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum RunState {
    /// Started and not finished.
    Running,
    /// Waiting for [`Journal::resume`].
    Suspended {
        /// The event it waits for.
        event: String,
    },
    /// Finished.
    Finished {
        /// How.
        outcome: TerminalState,
    },
}

/// A summary of one run, for `lockbox journal status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunStatus {
    /// The run.
    pub run_id: RunId,
    /// Where it stands.
    #[serde(flatten)]
    pub state: RunState,
    /// Number of entries.
    pub entries: u64,
    /// Number of journaled steps.
    pub steps: u64,
    /// Newest session that wrote an entry.
    pub last_session: u64,
    /// Version of the first start.
    pub version: Option<String>,
    /// Metadata of the first start.
    pub metadata: serde_json::Value,
}

/// A durable step journal over one [`Storage`].
#[derive(Debug, Clone)]
pub struct Journal {
    storage: Arc<dyn Storage>,
    max_entry_bytes: usize,
}

/// What the entries of a run say, folded once.
pub(crate) struct History {
    pub(crate) entries: Vec<Entry>,
    pub(crate) first_start: Option<(Option<String>, serde_json::Value)>,
    pub(crate) terminal: Option<TerminalState>,
    pub(crate) pending_suspend: Option<(StepId, String)>,
}

impl History {
    fn fold(entries: Vec<Entry>) -> Self {
        let mut first_start = None;
        let mut terminal = None;
        let mut pending_suspend = None;
        for e in &entries {
            match &e.body {
                EntryBody::Start { version, metadata } if first_start.is_none() => {
                    first_start = Some((version.clone(), metadata.clone()));
                }
                EntryBody::Suspend { step_id, event, .. } => {
                    pending_suspend = Some((step_id.clone(), event.clone()));
                }
                EntryBody::Resume { step_id, .. }
                    if pending_suspend.as_ref().is_some_and(|(s, _)| s == step_id) =>
                {
                    pending_suspend = None;
                }
                EntryBody::Complete { .. } => terminal = Some(TerminalState::Completed),
                EntryBody::Error { .. } => terminal = Some(TerminalState::Failed),
                EntryBody::Cancel { .. } => terminal = Some(TerminalState::Cancelled),
                _ => {}
            }
        }
        Self {
            entries,
            first_start,
            terminal,
            pending_suspend,
        }
    }

    fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    fn ensure_exists(&self, run_id: &RunId) -> Result<(), JournalError> {
        if self.entries.is_empty() {
            return Err(JournalError::RunNotFound {
                run_id: run_id.clone(),
            });
        }
        Ok(())
    }

    fn ensure_live(&self, run_id: &RunId) -> Result<(), JournalError> {
        match self.terminal {
            Some(state) => Err(JournalError::TerminalRun {
                run_id: run_id.clone(),
                state,
            }),
            None => Ok(()),
        }
    }

    /// The memo table a replay consults: step id → what was journaled under it.
    fn memo(&self) -> HashMap<StepId, Memo> {
        let mut memo = HashMap::new();
        for e in &self.entries {
            match &e.body {
                EntryBody::Step {
                    step_id,
                    name,
                    outcome,
                } => {
                    memo.insert(
                        step_id.clone(),
                        Memo {
                            name: name.clone(),
                            offset: e.offset,
                            kind: MemoKind::Step(outcome.clone()),
                        },
                    );
                }
                EntryBody::Suspend { step_id, event, .. } => {
                    memo.insert(
                        step_id.clone(),
                        Memo {
                            name: event.clone(),
                            offset: e.offset,
                            kind: MemoKind::Suspend(None),
                        },
                    );
                }
                EntryBody::Resume { step_id, value } => {
                    if let Some(Memo {
                        kind: MemoKind::Suspend(resumed),
                        ..
                    }) = memo.get_mut(step_id)
                    {
                        *resumed = Some(value.clone());
                    }
                }
                _ => {}
            }
        }
        memo
    }
}

impl Journal {
    /// A journal over `storage`, with the default entry bound ([`DEFAULT_MAX_ENTRY_BYTES`]).
    pub fn open(storage: Arc<dyn Storage>) -> Self {
        Self {
            storage,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
        }
    }

    /// Sets the largest encoded entry (a step's value or error plus ~200 bytes of framing)
    /// that may be journaled.
    #[must_use]
    pub fn with_max_entry_bytes(mut self, limit: usize) -> Self {
        self.max_entry_bytes = limit;
        self
    }

    /// The storage under this journal.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Starts a new session of `run_id` (creating the run on first start) and returns the
    /// handle that replays its journaled steps and records new ones. Any older session of the
    /// run is fenced from then on.
    pub async fn start(&self, run_id: &RunId, opts: StartOptions) -> Result<Run, JournalError> {
        let (session, history) = self
            .take_session(run_id, |h| check_start(run_id, h, &opts))
            .await?;
        let offset = history.len();
        let start = EntryBody::Start {
            version: opts.version,
            metadata: opts.metadata,
        };
        self.append(run_id, session, offset, start, "start").await?;
        Ok(Run::new(
            Arc::clone(&self.storage),
            run_id.clone(),
            session,
            offset + 1,
            history.memo(),
            self.max_entry_bytes,
        ))
    }

    /// Reads and checks the run, takes a new session (fencing the previous one), then checks
    /// again including whatever the previous session appended before the fence. Checking
    /// before taking the session keeps a refused call from fencing a live writer.
    async fn take_session<F>(
        &self,
        run_id: &RunId,
        check: F,
    ) -> Result<(u64, History), JournalError>
    where
        F: Fn(&History) -> Result<(), JournalError>,
    {
        let before = self.history(run_id).await?;
        check(&before)?;
        let session = self.storage.acquire_session(run_id).await?;
        let mut entries = before.entries;
        let tail = self.decoded(run_id, entries.len() as u64).await?;
        entries.extend(tail);
        let history = History::fold(entries);
        check(&history)?;
        Ok((session, history))
    }

    /// Delivers `value` to the run's pending suspension. The next `start` replays up to the
    /// matching `suspend` call, which then returns [`Suspension::Resumed`](crate::Suspension).
    pub async fn resume<V: Serialize>(
        &self,
        run_id: &RunId,
        value: &V,
    ) -> Result<(), JournalError> {
        let value = to_json(run_id, "resume", value)?;
        let (session, history) = self
            .take_session(run_id, |h| {
                h.ensure_exists(run_id)?;
                h.ensure_live(run_id)?;
                match h.pending_suspend {
                    Some(_) => Ok(()),
                    None => Err(JournalError::NotSuspended {
                        run_id: run_id.clone(),
                    }),
                }
            })
            .await?;
        let Some((step_id, _event)) = history.pending_suspend.clone() else {
            return Err(JournalError::NotSuspended {
                run_id: run_id.clone(),
            });
        };
        let body = EntryBody::Resume { step_id, value };
        self.append(run_id, session, history.len(), body, "resume")
            .await
    }

    /// Cancels the run from outside (a dispatcher giving up). Fences any live session.
    pub async fn cancel(&self, run_id: &RunId, reason: &str) -> Result<(), JournalError> {
        let (session, history) = self
            .take_session(run_id, |h| {
                h.ensure_exists(run_id)?;
                h.ensure_live(run_id)
            })
            .await?;
        let body = EntryBody::Cancel {
            reason: reason.to_owned(),
        };
        self.append(run_id, session, history.len(), body, "cancel")
            .await
    }

    /// Copies the entries of `run_id` before `at` into the new run `new_run_id` (which must
    /// not exist; `None` names it `RUN.fork-<unix ms>`) and returns the new run's id. The source is not touched. Starting the fork replays the copied steps and
    /// runs everything from the cut on again.
    pub async fn fork(
        &self,
        run_id: &RunId,
        at: &ForkPoint,
        new_run_id: Option<&RunId>,
    ) -> Result<RunId, JournalError> {
        let new_run_id = match new_run_id {
            Some(id) => id.clone(),
            None => run_id.fork_name(entry::now_ms())?,
        };
        let new_run_id = &new_run_id;
        let source = self.entries(run_id, 0).await?;
        if source.is_empty() {
            return Err(JournalError::RunNotFound {
                run_id: run_id.clone(),
            });
        }
        let len = source.len() as u64;
        let cut = match at {
            ForkPoint::Offset(offset) if *offset <= len => *offset,
            ForkPoint::Offset(offset) => {
                return Err(JournalError::OffsetOutOfRange {
                    run_id: run_id.clone(),
                    offset: *offset,
                    len,
                })
            }
            ForkPoint::Step(wanted) => source
                .iter()
                .find(|e| matches!(&e.body, EntryBody::Step { step_id, .. } if step_id == wanted))
                .map(|e| e.offset)
                .ok_or_else(|| JournalError::StepNotFound {
                    run_id: run_id.clone(),
                    step_id: wanted.clone(),
                })?,
        };
        let (session, _) = self
            .take_session(new_run_id, |h| {
                if h.entries.is_empty() {
                    Ok(())
                } else {
                    Err(JournalError::RunExists {
                        run_id: new_run_id.clone(),
                    })
                }
            })
            .await?;
        for e in source.into_iter().take_while(|e| e.offset < cut) {
            self.append(new_run_id, session, e.offset, e.body, "fork")
                .await?;
        }
        Ok(new_run_id.clone())
    }

    /// Every run with at least one entry, sorted.
    pub async fn list(&self) -> Result<Vec<RunId>, JournalError> {
        Ok(self.storage.list_runs().await?)
    }

    /// The run's entries from `from` on, decoded and checked; [`JournalError::RunNotFound`]
    /// if the run has no entries at all.
    pub async fn entries(&self, run_id: &RunId, from: u64) -> Result<Vec<Entry>, JournalError> {
        let raw = self.storage.read(run_id, from).await?;
        self.ensure_run(run_id, &raw).await?;
        decode_all(run_id, from, &raw)
    }

    /// The entries from `from` on; none for a run that does not exist yet.
    async fn decoded(&self, run_id: &RunId, from: u64) -> Result<Vec<Entry>, JournalError> {
        let raw = self.storage.read(run_id, from).await?;
        decode_all(run_id, from, &raw)
    }

    /// A read that found nothing: `RunNotFound` unless the run has entries before it.
    async fn ensure_run(&self, run_id: &RunId, read: &[RawEntry]) -> Result<(), JournalError> {
        if read.is_empty() && self.storage.read(run_id, 0).await?.is_empty() {
            return Err(JournalError::RunNotFound {
                run_id: run_id.clone(),
            });
        }
        Ok(())
    }

    /// The run's entries from `from` on, exactly as stored (checked, not re-encoded);
    /// [`JournalError::RunNotFound`] if the run has no entries at all.
    pub async fn raw_entries(
        &self,
        run_id: &RunId,
        from: u64,
    ) -> Result<Vec<RawEntry>, JournalError> {
        let raw = self.storage.read(run_id, from).await?;
        self.ensure_run(run_id, &raw).await?;
        decode_all(run_id, from, &raw)?;
        Ok(raw)
    }

    /// A summary of the run.
    pub async fn status(&self, run_id: &RunId) -> Result<RunStatus, JournalError> {
        let history = self.history(run_id).await?;
        history.ensure_exists(run_id)?;
        let state = match (&history.terminal, &history.pending_suspend) {
            (Some(outcome), _) => RunState::Finished { outcome: *outcome },
            (None, Some((_, event))) => RunState::Suspended {
                event: event.clone(),
            },
            (None, None) => RunState::Running,
        };
        let (version, metadata) = history.first_start.clone().unwrap_or_default();
        Ok(RunStatus {
            run_id: run_id.clone(),
            state,
            entries: history.len(),
            steps: history
                .entries
                .iter()
                .filter(|e| matches!(e.body, EntryBody::Step { .. }))
                .count() as u64,
            last_session: history.entries.iter().map(|e| e.session).max().unwrap_or(0),
            version,
            metadata,
        })
    }

    pub(crate) async fn history(&self, run_id: &RunId) -> Result<History, JournalError> {
        Ok(History::fold(self.decoded(run_id, 0).await?))
    }

    async fn append(
        &self,
        run_id: &RunId,
        session: u64,
        offset: u64,
        body: EntryBody,
        what: &str,
    ) -> Result<(), JournalError> {
        let raw = encode_entry(run_id, session, offset, body, what)?;
        Ok(self.storage.append(run_id, raw).await?)
    }
}

fn check_start(run_id: &RunId, history: &History, opts: &StartOptions) -> Result<(), JournalError> {
    history.ensure_live(run_id)?;
    if let Some((version, metadata)) = &history.first_start {
        if *version != opts.version {
            return Err(JournalError::VersionMismatch {
                run_id: run_id.clone(),
                journaled: version.clone(),
                requested: opts.version.clone(),
            });
        }
        if *metadata != opts.metadata {
            return Err(JournalError::MetadataMismatch {
                run_id: run_id.clone(),
                journaled: metadata.clone(),
                requested: opts.metadata.clone(),
            });
        }
    }
    Ok(())
}

pub(crate) fn to_json<V: Serialize>(
    run_id: &RunId,
    what: &str,
    value: &V,
) -> Result<serde_json::Value, JournalError> {
    serde_json::to_value(value).map_err(|source| JournalError::EncodeValue {
        run_id: run_id.clone(),
        step_id: what.to_owned(),
        source,
    })
}

pub(crate) fn encode_entry(
    run_id: &RunId,
    session: u64,
    offset: u64,
    body: EntryBody,
    what: &str,
) -> Result<RawEntry, JournalError> {
    let entry = Entry {
        format: FORMAT_VERSION,
        run: run_id.clone(),
        offset,
        session,
        at_ms: entry::now_ms(),
        body,
    };
    entry::encode(&entry).map_err(|source| JournalError::EncodeValue {
        run_id: run_id.clone(),
        step_id: what.to_owned(),
        source,
    })
}

/// Decodes stored lines, checking checksum, format, run and gap-free offsets from `from`.
fn decode_all(run_id: &RunId, from: u64, raw: &[RawEntry]) -> Result<Vec<Entry>, JournalError> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let expected = from + i as u64;
        let corrupt = |detail: String| {
            JournalError::from(StorageError::Corruption {
                run_id: run_id.clone(),
                offset: r.offset,
                detail,
            })
        };
        let e = match entry::decode(&r.line) {
            Ok(e) => e,
            Err(entry::DecodeFailure::Format(found)) => {
                return Err(JournalError::UnsupportedFormat {
                    run_id: run_id.clone(),
                    offset: r.offset,
                    found,
                    supported: FORMAT_VERSION,
                })
            }
            Err(e) => return Err(corrupt(e.to_string())),
        };
        if e.offset != expected
            || r.offset != expected
            || &e.run != run_id
            || e.session != r.session
        {
            return Err(corrupt(format!(
                "entry says run {} offset {} session {}, stored as offset {} session {}, expected offset {expected}",
                e.run, e.offset, e.session, r.offset, r.session
            )));
        }
        out.push(e);
    }
    Ok(out)
}
