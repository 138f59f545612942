//! Replacing a running sandbox's network policy ([`Runtime::replace_network`]): its
//! supervisor's list changes in place, and the sandbox's record follows, so what its info
//! shows, what its snapshots record (and so its forks and resumes) and a restart of its
//! instance all have the network in force.

use crate::sandbox::lock;
use crate::types::{SandboxInfo, SandboxState};
use crate::{Runtime, RuntimeError};
use lockbox_policy::Net;

impl Runtime {
    /// Replaces sandbox `id`'s network policy while it runs; its processes go on. See
    /// [`lockbox_netsup::Supervisor::replace`] for what changes at once (every later
    /// connect, send and DNS query) and what stays (established connections).
    ///
    /// Only a sandbox started with a network list (`Net::Allow`, `Net::Deny`) has a
    /// supervisor to take another list: one started without a network or with the host's
    /// keeps it (`NOT_SUPPORTED`). `Net::None` on a listed sandbox is an allow-list of
    /// nothing (its own loopback only, as without a network), and is recorded so. An
    /// allow-list naming hosts needs lockbox's resolver, which only a sandbox started with
    /// an allow-list has (`NOT_SUPPORTED` otherwise); a deny-list's names are resolved now
    /// (`NET_NAME_UNRESOLVED`), and the sandbox's `/etc/hosts`, which pinned the names of
    /// the list it started with, is not rewritten.
    pub async fn replace_network(&self, id: &str, net: Net) -> Result<SandboxInfo, RuntimeError> {
        let sandbox = self.sandbox(id)?;
        let inner = sandbox.inner.clone();
        // Serialised with snapshots and restarts: each sees the old network or the new.
        let _life = inner.lifecycle.lock().await;
        let inst = sandbox.live()?;
        let asked = net.clone();
        let replaced = tokio::task::spawn_blocking(move || inst.replace_net(&asked))
            .await
            .map_err(RuntimeError::Task)?;
        match replaced {
            None => {
                return Err(RuntimeError::SandboxNotRunning {
                    id: inner.id.clone(),
                    state: SandboxState::Stopped,
                })
            }
            Some(Err(source)) => {
                return Err(RuntimeError::NetUpdate {
                    id: inner.id.clone(),
                    source,
                })
            }
            Some(Ok(_)) => {}
        }
        *lock(&inner.net) = match net {
            // What is in force: a supervisor with an empty allow-list, which a later
            // replacement (or a resume) can change again.
            Net::None => Net::Allow(Vec::new()),
            other => other,
        };
        let info = inner.info(SandboxState::Running, None);
        self.inner
            .store
            .update_spec(id, &crate::record::spec_json(&inner.spec_now()))?;
        Ok(info)
    }
}
