//! What E2B adds to a lockbox sandbox: its metadata, end of life, access token, template
//! and the environment it was created with. Kept in memory by the server.

use std::collections::HashMap;
use std::sync::Mutex;

/// E2B's view of one sandbox.
#[derive(Debug, Clone, Default)]
pub struct E2bSandbox {
    /// The template (image) it was created from.
    pub template: String,
    /// The user's metadata (`metadata` on create), for listing and filters.
    pub metadata: HashMap<String, String>,
    /// The token sandbox-plane requests must carry (`X-Access-Token`), when `secure`.
    pub access_token: Option<String>,
    /// Environment variables given on create (`envVars`), the default for every process.
    pub env: HashMap<String, String>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, E2bSandbox>> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.sandboxes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
