//! What E2B adds to a lockbox sandbox: its metadata, end of life, access token, template,
//! the environment it was created with, and whether it is paused (and on which snapshot).
//! Kept in memory by the server; paused sandboxes are also written to the state directory
//! ([`crate::persist`]) and come back when the server restarts. Running ones do not (lockbox
//! deletes their sandboxes as it stops).
//!
//! An E2B sandbox keeps its id for its whole life; the lockbox sandbox serving it changes
//! when it is resumed (a fork of its pause snapshot, with an id of its own): that one is
//! [`E2bSandbox::instance`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// E2B's view of one sandbox.
#[derive(Debug, Clone)]
pub struct E2bSandbox {
    /// The template (image) it was created from, as the client named it.
    pub template: String,
    /// The user's metadata (`metadata` on create), for listing and filters.
    pub metadata: BTreeMap<String, String>,
    /// The token sandbox-plane requests must carry (`X-Access-Token`).
    pub access_token: Option<String>,
    /// Environment variables given on create (`envVars`), the default for every process.
    pub env: HashMap<String, String>,
    /// When it was created.
    pub started_at: SystemTime,
    /// When it is deleted unless its timeout is changed.
    pub end_at: SystemTime,
    /// Whether it may reach the internet (`allow_internet_access`, `network`).
    pub internet: bool,
    /// Woken when `end_at` changes, so the timer that deletes the sandbox re-reads it.
    pub end_changed: Arc<tokio::sync::Notify>,
    /// The lockbox sandbox serving it when that is not the one of the same id (after a
    /// resume); `None`: the lockbox sandbox with the E2B id.
    pub instance: Option<String>,
    /// Set while it is paused: the snapshot of its files it resumes from.
    pub paused: Option<String>,
    /// Pause instead of delete when its end of life passes (`autoPause`).
    pub auto_pause: bool,
    /// Snapshots made for it (pauses, forks' sources) that nothing else names, oldest
    /// first: deleted with it.
    pub owned_snapshots: Vec<String>,
    /// Counts its resumes: the end-of-life timer of an earlier instance stops on seeing
    /// a newer one.
    pub generation: u64,
    /// Held across pause, resume, kill and expiry, so they do not interleave.
    pub lifecycle: Arc<tokio::sync::Mutex<()>>,
    /// What happened to it (created, paused, resumed, ...): its E2B logs.
    pub events: Arc<Mutex<Vec<(SystemTime, String)>>>,
}

impl E2bSandbox {
    /// The id of the lockbox sandbox serving the E2B sandbox `id` (this one).
    pub fn instance_id<'a>(&'a self, id: &'a str) -> &'a str {
        self.instance.as_deref().unwrap_or(id)
    }

    /// Notes `what` in its log.
    pub fn log(&self, what: impl Into<String>) {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if events.len() < MAX_EVENTS {
            events.push((SystemTime::now(), what.into()));
        }
    }
}

/// The most lifecycle events one sandbox's log keeps.
const MAX_EVENTS: usize = 1000;

impl Default for E2bSandbox {
    fn default() -> Self {
        E2bSandbox {
            template: String::new(),
            metadata: BTreeMap::new(),
            access_token: None,
            env: HashMap::new(),
            started_at: SystemTime::UNIX_EPOCH,
            end_at: SystemTime::UNIX_EPOCH,
            internet: false,
            end_changed: Arc::default(),
            instance: None,
            paused: None,
            auto_pause: false,
            owned_snapshots: Vec::new(),
            generation: 0,
            lifecycle: Arc::default(),
            events: Arc::default(),
        }
    }
}

/// Every E2B sandbox the server knows, by lockbox sandbox id.
#[derive(Debug, Default)]
pub struct Registry {
    sandboxes: Mutex<HashMap<String, E2bSandbox>>,
    snapshots: Mutex<Vec<E2bSnapshot>>,
}

/// A snapshot taken through E2B's `create_snapshot` (a lockbox snapshot), which
/// `Sandbox.create` takes as a template by id or name.
#[derive(Debug, Clone)]
pub struct E2bSnapshot {
    /// The lockbox snapshot's id (E2B's `snapshotID`).
    pub id: String,
    /// The name it was given, if any.
    pub name: Option<String>,
    /// The E2B sandbox it was taken of.
    pub sandbox: String,
}

impl Registry {
    /// Records `sandbox` under `id`.
    pub fn insert(&self, id: &str, sandbox: E2bSandbox) {
        self.lock().insert(id.to_owned(), sandbox);
    }

    /// The sandbox `id`, if E2B made it.
    pub fn get(&self, id: &str) -> Option<E2bSandbox> {
        self.lock().get(id).cloned()
    }

    /// Forgets `id` (it was killed or expired).
    pub fn remove(&self, id: &str) -> Option<E2bSandbox> {
        self.lock().remove(id)
    }

    /// Changes the end of life of `id` with `f` (given the current one); the new one, or
    /// `None` if E2B does not know `id`.
    pub fn set_end(
        &self,
        id: &str,
        f: impl FnOnce(SystemTime) -> SystemTime,
    ) -> Option<E2bSandbox> {
        let mut all = self.lock();
        let sandbox = all.get_mut(id)?;
        sandbox.end_at = f(sandbox.end_at);
        sandbox.end_changed.notify_one();
        Some(sandbox.clone())
    }

    /// Changes sandbox `id` with `f`; the sandbox as changed, or `None` if E2B does not
    /// know `id`.
    pub fn update(&self, id: &str, f: impl FnOnce(&mut E2bSandbox)) -> Option<E2bSandbox> {
        let mut all = self.lock();
        let sandbox = all.get_mut(id)?;
        f(sandbox);
        sandbox.end_changed.notify_one();
        Some(sandbox.clone())
    }

    /// Records a snapshot taken through E2B's `create_snapshot`.
    pub fn add_snapshot(&self, snapshot: E2bSnapshot) {
        self.lock_snapshots().push(snapshot);
    }

    /// The snapshots taken through E2B, oldest first.
    pub fn snapshots(&self) -> Vec<E2bSnapshot> {
        self.lock_snapshots().clone()
    }

    /// Forgets snapshot `id` (deleted).
    pub fn remove_snapshot(&self, id: &str) {
        self.lock_snapshots().retain(|s| s.id != id);
    }

    fn lock_snapshots(&self) -> std::sync::MutexGuard<'_, Vec<E2bSnapshot>> {
        self.snapshots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every sandbox, with its id.
    pub fn all(&self) -> Vec<(String, E2bSandbox)> {
        self.lock()
            .iter()
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, E2bSandbox>> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.sandboxes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
