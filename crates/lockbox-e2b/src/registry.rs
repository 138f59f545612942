//! What E2B adds to a lockbox sandbox: its metadata, end of life, access token, template
//! and the environment it was created with. Kept in memory by the server: a restarted
//! server forgets its E2B sandboxes (lockbox deletes their sandboxes as it stops).

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
}

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
        }
    }
}

/// Every E2B sandbox the server knows, by lockbox sandbox id.
#[derive(Debug, Default)]
pub struct Registry {
    sandboxes: Mutex<HashMap<String, E2bSandbox>>,
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
