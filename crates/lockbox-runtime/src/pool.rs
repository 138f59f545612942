//! A pool of pre-armed sandbox instances (`RuntimeConfig::pool_size`): started ahead with
//! the default policy and no workdir — confined, the agent answering, the default session's
//! shell running — so that creating a sandbox of that spec takes one from the pool instead of
//! paying the start (~28 ms, docs/benchmarks.md). Refilled in the background after each
//! take; emptied (its instances stopped) at shutdown.
//!
//! Only that one spec is pooled: a sandbox's policy is fixed when its namespaces, mounts,
//! Landlock rules and seccomp filters are made, and a workdir's branch and overlay are made
//! then too. Forks and sandboxes with a workdir or another policy start as before.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::sandbox::{lock, start_instance, Instance, Origin};
use crate::types::SandboxSpec;

/// How long a refill waits after a take.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(20);

/// Ready instances and what refills them.
#[derive(Debug)]
pub(crate) struct Pool {
    size: usize,
    template: SandboxSpec,
    ready: Mutex<VecDeque<Instance>>,
    refilling: AtomicBool,
    closed: AtomicBool,
    state_dir: PathBuf,
    snapshots: lockbox_cow::SnapshotStore,
    agent_exe: PathBuf,
}

impl Pool {
    pub fn new(
        size: usize,
        state_dir: PathBuf,
        snapshots: lockbox_cow::SnapshotStore,
        agent_exe: PathBuf,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            size,
            template: SandboxSpec::default(),
            ready: Mutex::new(VecDeque::new()),
            refilling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            state_dir,
            snapshots,
            agent_exe,
        })
    }

    /// Whether a sandbox of `spec` can come from the pool.
    pub fn serves(&self, spec: &SandboxSpec) -> bool {
        spec.workdir.is_none()
            && spec.from_snapshot.is_none()
            && spec.net_ask.is_none()
            && spec.policy == self.template.policy
    }

    /// A ready instance for `spec`, if the pool serves it and has one alive; starts a
    /// refill either way.
    pub fn take(self: &Arc<Self>, spec: &SandboxSpec) -> Option<Instance> {
        if !self.serves(spec) {
            return None;
        }
        let got = loop {
            let next = lock(&self.ready).pop_front();
            match next {
                Some(inst) if inst.spare_alive() => break Some(inst),
                // Died while waiting (killed from outside): dropped, which stops it.
                Some(_) => continue,
                None => break None,
            }
        };
        self.refill();
        got
    }

    /// Starts instances in the background until the pool is full (one refill at a time).
    pub fn refill(self: &Arc<Self>) {
        if self.closed.load(Ordering::SeqCst) || self.refilling.swap(true, Ordering::SeqCst) {
            return;
        }
        // Outside a tokio runtime (a runtime opened from synchronous code) the first
        // creation refills instead.
        let Ok(tokio) = tokio::runtime::Handle::try_current() else {
            self.refilling.store(false, Ordering::SeqCst);
            return;
        };
        let pool = Arc::clone(self);
        tokio.spawn(async move {
            // Let the sandbox just taken run its first command before a start competes
            // with it for the CPU (a start forks and sets up namespaces: milliseconds).
            tokio::time::sleep(REFILL_DELAY).await;
            loop {
                if pool.closed.load(Ordering::SeqCst) || lock(&pool.ready).len() >= pool.size {
                    break;
                }
                match pool.arm().await {
                    Ok(inst) => {
                        if pool.closed.load(Ordering::SeqCst) {
                            inst.stop(pool.template.policy.kill_grace).await;
                            break;
                        }
                        lock(&pool.ready).push_back(inst);
                    }
                    Err(e) => {
                        // Not fatal: sandboxes start the usual way meanwhile.
                        tracing::warn!("arming a pooled sandbox: {e}");
                        break;
                    }
                }
            }
            pool.refilling.store(false, Ordering::SeqCst);
        });
    }

    async fn arm(&self) -> Result<Instance, crate::RuntimeError> {
        let origin = Origin {
            state_dir: &self.state_dir,
            snapshots: &self.snapshots,
            base: None,
        };
        // The default policy has no network list: its log would stay empty.
        let audit = crate::audit::AuditLog::new();
        let inst = start_instance(&self.template, origin, &self.agent_exe, "pool", &audit).await?;
        if let Err(e) = inst
            .start_spare_default(self.template.policy.kill_grace)
            .await
        {
            inst.stop(std::time::Duration::ZERO).await;
            return Err(e);
        }
        Ok(inst)
    }

    /// Stops every ready instance; no refill after.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Instance> = lock(&self.ready).drain(..).collect();
        for inst in all {
            inst.stop(std::time::Duration::ZERO).await;
        }
    }

    /// How many are ready now.
    pub fn ready(&self) -> usize {
        lock(&self.ready).len()
    }
}
