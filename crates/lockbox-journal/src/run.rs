//! [`Run`]: one session of a run. `record` replays journaled steps and journals new ones;
//! `parallel` gives each branch its own name prefix; `suspend`/`complete`/`fail`/`cancel`
//! journal the lifecycle.
//!
//! Step ids come from a per-name counter (`llm`, `llm#2`, …) that restarts with every session,
//! so a replay that makes the same calls in the same order produces the same ids. Concurrency
//! is safe when concurrent calls use distinct names; `parallel` makes that automatic.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::entry::{EntryBody, StepOutcome};
use crate::error::{JournalError, StepError, TerminalState};
use crate::id::{validate_step_name, BranchKey, RunId, StepId};
use crate::journal::{encode_entry, to_json};
use crate::storage::Storage;

/// What was journaled under one step id.
#[derive(Debug, Clone)]
pub(crate) struct Memo {
    /// Full step name (or event name for a suspension).
    pub(crate) name: String,
    pub(crate) offset: u64,
    pub(crate) kind: MemoKind,
}

#[derive(Debug, Clone)]
pub(crate) enum MemoKind {
    Step(StepOutcome),
    /// A suspension, with the value of its resume if one arrived.
    Suspend(Option<serde_json::Value>),
}

/// Options of [`Run::record_with`].
#[derive(Debug)]
pub struct RecordOptions<E> {
    pub(crate) retryable: fn(&E) -> bool,
}

impl<E> Clone for RecordOptions<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for RecordOptions<E> {}

impl<E> Default for RecordOptions<E> {
    fn default() -> Self {
        Self {
            retryable: |_| false,
        }
    }
}

impl<E> RecordOptions<E> {
    /// Errors for which `retryable` returns true are returned but not journaled, so a replay
    /// runs the step again (timeouts, rate limits). Other errors are journaled and replayed.
    #[must_use]
    pub fn retry_when(retryable: fn(&E) -> bool) -> Self {
        Self { retryable }
    }
}

/// What [`Run::suspend`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suspension<V> {
    /// The run is waiting: stop driving it; [`Journal::resume`](crate::Journal::resume) will
    /// deliver a value and a new `start` will replay to this point.
    Suspended,
    /// The value delivered by `resume`.
    Resumed(V),
}

/// One session of a run. Cloning gives another handle on the same session (same counters);
/// [`Run::parallel`] hands out prefixed children.
#[derive(Debug, Clone)]
pub struct Run {
    inner: Arc<Inner>,
    /// `""` at the root, `"a:"` in branch `a`, `"a:b:"` in branch `b` nested in `a`.
    prefix: String,
}

#[derive(Debug)]
struct Inner {
    storage: Arc<dyn Storage>,
    run_id: RunId,
    session: u64,
    max_entry_bytes: usize,
    /// Journaled before this session; read-only.
    memo: HashMap<StepId, Memo>,
    /// Occurrences so far per full name.
    counters: Mutex<HashMap<String, u32>>,
    /// Serialises appends so offsets are assigned in append order.
    writer: tokio::sync::Mutex<Writer>,
}

#[derive(Debug)]
struct Writer {
    next_offset: u64,
    finished: Option<TerminalState>,
}

type BranchFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
type BranchFn<'a, T> = Box<dyn FnOnce(Run) -> BranchFuture<'a, T> + Send + 'a>;

/// The branches of one [`Run::parallel`] call, each under a key.
pub struct Branches<'a, T> {
    branches: Vec<(String, BranchFn<'a, T>)>,
}

impl<T> std::fmt::Debug for Branches<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.branches.iter().map(|(k, _)| k))
            .finish()
    }
}

impl<T> Default for Branches<'_, T> {
    fn default() -> Self {
        Self {
            branches: Vec::new(),
        }
    }
}

impl<'a, T> Branches<'a, T> {
    /// No branches yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a branch; `f` gets a child run whose step names are prefixed with `key:`.
    /// The key is checked when `parallel` runs.
    #[must_use]
    pub fn branch<F, Fut>(mut self, key: impl Into<String>, f: F) -> Self
    where
        F: FnOnce(Run) -> Fut + Send + 'a,
        Fut: Future<Output = T> + Send + 'a,
    {
        self.branches
            .push((key.into(), Box::new(move |run| Box::pin(f(run)))));
        self
    }
}

impl<'a, T, K, F, Fut> FromIterator<(K, F)> for Branches<'a, T>
where
    K: Into<String>,
    F: FnOnce(Run) -> Fut + Send + 'a,
    Fut: Future<Output = T> + Send + 'a,
{
    fn from_iter<I: IntoIterator<Item = (K, F)>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Self::new(), |b, (key, f)| b.branch(key, f))
    }
}

impl Run {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        run_id: RunId,
        session: u64,
        next_offset: u64,
        memo: HashMap<StepId, Memo>,
        max_entry_bytes: usize,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                storage,
                run_id,
                session,
                max_entry_bytes,
                memo,
                counters: Mutex::default(),
                writer: tokio::sync::Mutex::new(Writer {
                    next_offset,
                    finished: None,
                }),
            }),
            prefix: String::new(),
        }
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.inner.run_id
    }

    /// This session's number (fencing token).
    pub fn session(&self) -> u64 {
        self.inner.session
    }

    /// The branch prefix of this handle (`""` at the root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Runs `f` once across replays: on a memo hit returns the journaled value (or journaled
    /// error) without calling `f`; otherwise runs `f` and journals its outcome. Every error is
    /// journaled; use [`Run::record_with`] to leave retryable errors out.
    pub async fn record<T, E, F, Fut>(&self, name: &str, f: F) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.record_with(name, RecordOptions::default(), f).await
    }

    /// [`Run::record`] with options (which errors are retryable).
    pub async fn record_with<T, E, F, Fut>(
        &self,
        name: &str,
        opts: RecordOptions<E>,
        f: F,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (full, step_id) = self.next_step_id(name)?;
        if let Some(memo) = self.inner.memo.get(&step_id) {
            let outcome = self.replayed_step(&step_id, &full, memo)?;
            // Let concurrent branches interleave as they did when the step really ran.
            tokio::task::yield_now().await;
            return match outcome {
                StepOutcome::Ok(v) => Ok(self.decode(&step_id, memo.offset, v)?),
                StepOutcome::Err(v) => {
                    Err(StepError::Failed(self.decode(&step_id, memo.offset, v)?))
                }
            };
        }
        match f().await {
            Ok(value) => {
                let json = to_json(&self.inner.run_id, step_id.as_str(), &value)?;
                self.append_step(step_id, full, StepOutcome::Ok(json))
                    .await?;
                Ok(value)
            }
            Err(err) if (opts.retryable)(&err) => {
                // Not journaled, so the id is not used up: the retry gets the same id, and a
                // replay finds the retry's result under it.
                self.release_step_id(&full, &step_id);
                Err(StepError::Failed(err))
            }
            Err(err) => {
                let json = to_json(&self.inner.run_id, step_id.as_str(), &err)?;
                self.append_step(step_id, full, StepOutcome::Err(json))
                    .await?;
                Err(StepError::Failed(err))
            }
        }
    }

    /// Runs the branches concurrently (on this task), each with a child run that prefixes
    /// step names with `KEY:`. Results come back in key order. Step ids do not depend on
    /// scheduling as long as each branch is sequential inside (nest `parallel` otherwise).
    pub async fn parallel<T>(
        &self,
        branches: Branches<'_, T>,
    ) -> Result<BTreeMap<BranchKey, T>, JournalError> {
        let mut keyed = BTreeMap::new();
        for (key, f) in branches.branches {
            let key = BranchKey::parse(&key)?;
            if keyed.contains_key(&key) {
                return Err(JournalError::DuplicateBranchKey {
                    key: key.as_str().to_owned(),
                });
            }
            keyed.insert(key, f);
        }
        let (keys, futures): (Vec<_>, Vec<_>) = keyed
            .into_iter()
            .map(|(key, f)| {
                let child = Self {
                    inner: Arc::clone(&self.inner),
                    prefix: format!("{}{}:", self.prefix, key.as_str()),
                };
                (key, f(child))
            })
            .unzip();
        let results = futures_util::future::join_all(futures).await;
        Ok(keys.into_iter().zip(results).collect())
    }

    /// A suspension point named `event`: journals that the run waits (first time) and returns
    /// [`Suspension::Suspended`]; once [`Journal::resume`](crate::Journal::resume) delivered a
    /// value, a replay returns it as [`Suspension::Resumed`]. Ids share the step counters.
    pub async fn suspend<P, V>(
        &self,
        event: &str,
        payload: &P,
    ) -> Result<Suspension<V>, JournalError>
    where
        P: Serialize,
        V: DeserializeOwned,
    {
        let (full, step_id) = self.next_step_id(event)?;
        if let Some(memo) = self.inner.memo.get(&step_id) {
            let resumed = match &memo.kind {
                MemoKind::Suspend(resumed) if memo.name == full => resumed.as_ref(),
                _ => return Err(self.mismatch(&step_id, memo, &full, "suspend")),
            };
            tokio::task::yield_now().await;
            return match resumed {
                Some(v) => Ok(Suspension::Resumed(self.decode(
                    &step_id,
                    memo.offset,
                    v,
                )?)),
                None => Ok(Suspension::Suspended),
            };
        }
        let payload = to_json(&self.inner.run_id, step_id.as_str(), payload)?;
        let body = EntryBody::Suspend {
            step_id: step_id.clone(),
            event: full,
            payload,
        };
        self.append(body, step_id.as_str(), None).await?;
        Ok(Suspension::Suspended)
    }

    /// Journals the run's result; later starts fail with [`JournalError::TerminalRun`].
    pub async fn complete<V: Serialize>(&self, value: &V) -> Result<(), JournalError> {
        let value = to_json(&self.inner.run_id, "complete", value)?;
        self.append(
            EntryBody::Complete { value },
            "complete",
            Some(TerminalState::Completed),
        )
        .await
    }

    /// Journals that the run failed for good.
    pub async fn fail<V: Serialize>(&self, error: &V) -> Result<(), JournalError> {
        let error = to_json(&self.inner.run_id, "error", error)?;
        self.append(
            EntryBody::Error { error },
            "error",
            Some(TerminalState::Failed),
        )
        .await
    }

    /// Journals that the run was cancelled.
    pub async fn cancel(&self, reason: &str) -> Result<(), JournalError> {
        let body = EntryBody::Cancel {
            reason: reason.to_owned(),
        };
        self.append(body, "cancel", Some(TerminalState::Cancelled))
            .await
    }

    /// Prefixes and checks `name`, then takes its next occurrence number.
    pub(crate) fn next_step_id(&self, name: &str) -> Result<(String, StepId), JournalError> {
        validate_step_name(name)?;
        let full = format!("{}{name}", self.prefix);
        validate_step_name(&full)?;
        let occurrence = {
            let mut counters = self
                .inner
                .counters
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = counters.entry(full.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let step_id = StepId::new(&full, occurrence);
        Ok((full, step_id))
    }

    /// Gives back the id `next_step_id` just handed out for `full`, if no later call with the
    /// same name took one since (same-name concurrency is unsafe anyway; see the module doc).
    pub(crate) fn release_step_id(&self, full: &str, step_id: &StepId) {
        let mut counters = self
            .inner
            .counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = counters.get_mut(full) {
            if StepId::new(full, *n) == *step_id {
                *n -= 1;
            }
        }
    }

    pub(crate) fn memo(&self, step_id: &StepId) -> Option<&Memo> {
        self.inner.memo.get(step_id)
    }

    /// Checks that a memo hit is a step with the called name and returns its outcome.
    pub(crate) fn replayed_step<'m>(
        &self,
        step_id: &StepId,
        full: &str,
        memo: &'m Memo,
    ) -> Result<&'m StepOutcome, JournalError> {
        match &memo.kind {
            MemoKind::Step(outcome) if memo.name == full => Ok(outcome),
            _ => Err(self.mismatch(step_id, memo, full, "step")),
        }
    }

    fn mismatch(
        &self,
        step_id: &StepId,
        memo: &Memo,
        called: &str,
        called_kind: &str,
    ) -> JournalError {
        let journaled_kind = match memo.kind {
            MemoKind::Step(_) => "step",
            MemoKind::Suspend(_) => "suspend",
        };
        // Same name but another kind of call: say so in the names.
        let (journaled_name, called_name) = if journaled_kind == called_kind {
            (memo.name.clone(), called.to_owned())
        } else {
            (
                format!("{journaled_kind} {}", memo.name),
                format!("{called_kind} {called}"),
            )
        };
        JournalError::ReplayMismatch {
            run_id: self.inner.run_id.clone(),
            step_id: step_id.clone(),
            journaled_name,
            called_name,
            offset: memo.offset,
        }
    }

    pub(crate) fn decode<V: DeserializeOwned>(
        &self,
        step_id: &StepId,
        offset: u64,
        value: &serde_json::Value,
    ) -> Result<V, JournalError> {
        V::deserialize(value).map_err(|source| JournalError::DecodeValue {
            run_id: self.inner.run_id.clone(),
            step_id: step_id.as_str().to_owned(),
            offset,
            source,
        })
    }

    pub(crate) async fn append_step(
        &self,
        step_id: StepId,
        name: String,
        outcome: StepOutcome,
    ) -> Result<(), JournalError> {
        let what = step_id.as_str().to_owned();
        let body = EntryBody::Step {
            step_id,
            name,
            outcome,
        };
        self.append(body, &what, None).await
    }

    async fn append(
        &self,
        body: EntryBody,
        what: &str,
        finishes: Option<TerminalState>,
    ) -> Result<(), JournalError> {
        let inner = &self.inner;
        let mut writer = inner.writer.lock().await;
        if let Some(state) = writer.finished {
            return Err(JournalError::TerminalRun {
                run_id: inner.run_id.clone(),
                state,
            });
        }
        let raw = encode_entry(&inner.run_id, inner.session, writer.next_offset, body, what)?;
        if raw.line.len() > inner.max_entry_bytes {
            return Err(JournalError::StepTooLarge {
                run_id: inner.run_id.clone(),
                step_id: StepId::new(what, 1),
                size: raw.line.len(),
                limit: inner.max_entry_bytes,
            });
        }
        inner.storage.append(&inner.run_id, raw).await?;
        writer.next_offset += 1;
        if finishes.is_some() {
            writer.finished = finishes;
        }
        Ok(())
    }
}
