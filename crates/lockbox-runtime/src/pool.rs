//! A pool of pre-armed sandbox instances (`RuntimeConfig::pool_size`): started ahead with
//! the default policy and no workdir — confined, the agent answering, the default session's
//! shell running — so that creating a sandbox of that spec takes one from the pool instead of
//! paying the start (~28 ms, docs/benchmarks.md). Refilled in the background after each
//! take; emptied (its instances stopped) at shutdown.
//!
//! Only that one spec is pooled, and forks of one snapshot: a sandbox's policy is fixed when
//! its namespaces, mounts, Landlock rules and seccomp filters are made, and a workdir's
//! branch and overlay are made then too. A snapshot is immutable, though, so a fork can be
//! made whole ahead — branch over the snapshot's layers, overlay mounted, `/tmp` restored,
//! recorded sessions started — and only named at the take. The pool keeps spare forks of
//! the snapshot forked last (as many as `pool_size`), armed after its first fork: that is
//! the shape of a search that forks one state again and again. Sandboxes with a workdir of
//! their own or another policy start as before.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use lockbox_cow::{SnapshotId, SnapshotMeta};

use crate::audit::AuditLog;
use crate::sandbox::{branch_context, lock, start_instance, Instance, Limits, Origin};
use crate::types::{SandboxId, SandboxSpec};

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
    limits: Limits,
    forks: Mutex<Forks>,
    arming_forks: AtomicBool,
}

/// Spare forks of the snapshot forked last.
#[derive(Debug, Default)]
struct Forks {
    /// The snapshot and the spec its forks are armed with (`None`: no snapshot wanted).
    of: Option<(SnapshotMeta, SandboxSpec)>,
    ready: VecDeque<Spare>,
}

/// A fork made ahead: its id (its branch and audit log name it already), ready to be taken.
#[derive(Debug)]
pub(crate) struct Spare {
    pub id: SandboxId,
    pub audit: Arc<AuditLog>,
    pub instance: Instance,
}

impl Pool {
    pub fn new(
        size: usize,
        state_dir: PathBuf,
        snapshots: lockbox_cow::SnapshotStore,
        agent_exe: PathBuf,
        limits: Limits,
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
            limits,
            forks: Mutex::new(Forks::default()),
            arming_forks: AtomicBool::new(false),
        })
    }

    /// Whether a sandbox of `spec` can come from the pool.
    pub fn serves(&self, spec: &SandboxSpec) -> bool {
        spec.workdir.is_none()
            && spec.from_snapshot.is_none()
            && spec.net_ask.is_none()
            && spec.http.is_empty()
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

    /// A spare fork for `spec` (a sandbox from snapshot `meta`), if one of that snapshot
    /// with that spec is ready; either way, `meta` becomes the snapshot whose forks are
    /// kept ready (a spare of another one is discarded).
    pub fn take_fork(self: &Arc<Self>, spec: &SandboxSpec, meta: &SnapshotMeta) -> Option<Spare> {
        let mut armed = spec.clone();
        armed.from_snapshot = None;
        let (got, stale) = {
            let mut forks = lock(&self.forks);
            let same = forks
                .of
                .as_ref()
                .is_some_and(|(m, s)| m.id == meta.id && fork_fits(s, &armed));
            let stale: Vec<Spare> = if same {
                Vec::new()
            } else {
                forks.of = Some((meta.clone(), armed));
                forks.ready.drain(..).collect()
            };
            let mut got = None;
            while let Some(spare) = forks.ready.pop_front() {
                if !spare.instance.agent.is_closed() {
                    got = Some(spare);
                    break;
                }
                // Died while waiting (killed from outside): discarded below.
                discard(spare);
            }
            (got, stale)
        };
        stale.into_iter().for_each(discard);
        self.refill_forks();
        got
    }

    /// Discards the spare forks of snapshot `id` and arms none any more (before the snapshot
    /// is deleted: their branches hold it). Waits for a fork being armed to be discarded too.
    pub fn forget_forks(&self, id: &SnapshotId) {
        let stale: Vec<Spare> = {
            let mut forks = lock(&self.forks);
            if forks.of.as_ref().is_none_or(|(m, _)| m.id != *id) {
                return;
            }
            forks.of = None;
            forks.ready.drain(..).collect()
        };
        stale.into_iter().for_each(discard);
        // A fork being armed holds the snapshot until it is discarded (it finds the
        // snapshot no longer wanted); that takes one sandbox start at most.
        let since = std::time::Instant::now();
        while self.arming_forks.load(Ordering::SeqCst)
            && since.elapsed() < std::time::Duration::from_secs(2)
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Arms spare forks in the background until `pool_size` of the wanted snapshot are ready.
    fn refill_forks(self: &Arc<Self>) {
        if self.closed.load(Ordering::SeqCst) || self.arming_forks.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(tokio) = tokio::runtime::Handle::try_current() else {
            self.arming_forks.store(false, Ordering::SeqCst);
            return;
        };
        let pool = Arc::clone(self);
        tokio.spawn(async move {
            tokio::time::sleep(REFILL_DELAY).await;
            loop {
                let wanted = {
                    let forks = lock(&pool.forks);
                    match &forks.of {
                        Some(of) if forks.ready.len() < pool.size => of.clone(),
                        _ => break,
                    }
                };
                if pool.closed.load(Ordering::SeqCst) {
                    break;
                }
                let (meta, spec) = wanted;
                match pool.arm_fork(&meta, &spec).await {
                    Ok(spare) => {
                        let mut forks = lock(&pool.forks);
                        let still = forks
                            .of
                            .as_ref()
                            .is_some_and(|(m, s)| m.id == meta.id && fork_fits(s, &spec));
                        if still && !pool.closed.load(Ordering::SeqCst) {
                            forks.ready.push_back(spare);
                        } else {
                            drop(forks);
                            discard(spare);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(snapshot = %meta.id, "arming a spare fork: {e}");
                        break;
                    }
                }
            }
            pool.arming_forks.store(false, Ordering::SeqCst);
        });
    }

    /// A fork of `meta` with `spec`, made whole: branch, sandbox, `/tmp`, sessions.
    async fn arm_fork(
        &self,
        meta: &SnapshotMeta,
        spec: &SandboxSpec,
    ) -> Result<Spare, crate::RuntimeError> {
        let id = SandboxId::generate();
        let origin = Origin {
            state_dir: &self.state_dir,
            snapshots: &self.snapshots,
            base: Some(&meta.id),
        };
        let audit = AuditLog::new();
        let instance = start_instance(spec, origin, &self.agent_exe, &id, &audit).await?;
        let marked = match lock(&instance.branch).as_mut() {
            Some(b) => b.set_context(branch_context(&id, spec, true)),
            None => Ok(()),
        };
        let spare = Spare {
            id,
            audit,
            instance,
        };
        if let Err(e) = marked {
            discard(spare);
            return Err(crate::RuntimeError::Branch(e));
        }
        let store = self.snapshots.clone();
        let snapshot = meta.id.clone();
        let (spare, copied) = tokio::task::spawn_blocking(move || {
            let copied = crate::snapshots::restore_tmp(&store, &snapshot, &spare.instance);
            (spare, copied)
        })
        .await
        .map_err(crate::RuntimeError::Task)?;
        if let Err(e) = copied {
            discard(spare);
            return Err(e);
        }
        let limits = Limits {
            grace: spec.policy.kill_grace,
            ..self.limits.clone()
        };
        crate::snapshots::start_sessions(&spare.instance, meta, &limits).await;
        Ok(spare)
    }

    /// Stops every ready instance and discards every spare fork; no refill after.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Instance> = lock(&self.ready).drain(..).collect();
        for inst in all {
            inst.stop(std::time::Duration::ZERO).await;
        }
        let spares: Vec<Spare> = {
            let mut forks = lock(&self.forks);
            forks.of = None;
            forks.ready.drain(..).collect()
        };
        spares.into_iter().for_each(discard);
    }

    /// How many are ready now (spare forks included).
    pub fn ready(&self) -> usize {
        lock(&self.ready).len() + lock(&self.forks).ready.len()
    }
}

/// Removes the branches of spare forks an earlier runtime left (killed, or dropped without
/// its shutdown). Called at start-up under the state directory's lock: only a runtime makes
/// spares, and no other runtime of this state directory lives to hand them out. Their
/// sandboxes never ran anything of a user's.
pub(crate) fn sweep_spares(state_dir: &std::path::Path) {
    let Ok(listed) = lockbox_cow::list(state_dir) else {
        return;
    };
    for b in listed {
        if b.meta
            .as_ref()
            .is_ok_and(|m| lockbox_cow::is_spare(&m.context))
        {
            if let Err(e) = lockbox_cow::abort_id(state_dir, &b.id) {
                tracing::warn!(branch = %b.id, "removing a dead runtime's spare fork: {e}");
            }
        }
    }
}

/// Whether a fork armed with `armed` can be handed out for `wanted`: the same sandbox
/// (policy, workdir, approvals, interception rules and their credentials), whatever its
/// labels, `on_exit` and idle timeout, which are the taker's.
fn fork_fits(armed: &SandboxSpec, wanted: &SandboxSpec) -> bool {
    armed.policy == wanted.policy
        && armed.workdir == wanted.workdir
        && armed.net_ask == wanted.net_ask
        && armed.http == wanted.http
        && armed.credentials == wanted.credentials
        && armed.upstream_ca == wanted.upstream_ca
}

/// Removes a spare fork's branch (which releases the snapshot) and stops its sandbox (in
/// the background when there is a tokio runtime; dropping it kills it otherwise).
fn discard(spare: Spare) {
    if let Some(hold) = &spare.instance.image {
        hold.release();
    }
    let branch = lock(&spare.instance.branch).take();
    if let Ok(tokio) = tokio::runtime::Handle::try_current() {
        tokio.spawn(async move { spare.instance.stop(std::time::Duration::ZERO).await });
    } else {
        drop(spare);
    }
    if let Some(b) = branch {
        if let Err(e) = b.abort() {
            tracing::warn!("removing a spare fork's branch: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_spare_fork_is_handed_out_only_to_a_fork_with_the_same_interception() {
        let plain = SandboxSpec::default();
        let ruled = SandboxSpec {
            http: lockbox_intercept::HttpRules::new(
                vec!["api.x.org bearer API".parse().unwrap()],
                Vec::new(),
            )
            .unwrap(),
            ..SandboxSpec::default()
        };
        assert!(fork_fits(&plain, &plain));
        assert!(fork_fits(&ruled, &ruled));
        assert!(!fork_fits(&plain, &ruled));
        assert!(!fork_fits(&ruled, &plain));
        let mut other_ca = ruled.clone();
        other_ca.upstream_ca = Some("/ca.pem".into());
        assert!(!fork_fits(&ruled, &other_ca));
    }
}
