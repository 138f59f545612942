//! [`Runtime`]: the sandboxes of one state directory — creating, listing, deleting them,
//! and what happens to a sandbox's branch when it stops.

use crate::types::*;
use crate::{sandbox, store, RuntimeError, Sandbox};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sandbox::{lock, start_instance, SandboxInner};

/// The runtime: all sandboxes of one state directory. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
}

#[derive(Debug)]
pub(crate) struct RuntimeInner {
    /// Held while the runtime lives: one runtime per state directory.
    pub(crate) _state_lock: std::fs::File,
    pub(crate) config: RuntimeConfig,
    pub(crate) agent_exe: PathBuf,
    pub(crate) store: store::Store,
    pub(crate) sandboxes: Mutex<HashMap<SandboxId, Arc<SandboxInner>>>,
    /// Sandboxes being created (counted against the limit).
    pub(crate) starting: AtomicU64,
    /// What all process logs may reserve together.
    pub(crate) log_budget: Arc<sandbox::LogBudget>,
    pub(crate) held_pipes: Arc<crate::session::HeldPipes>,
    /// The snapshots of the state directory.
    pub(crate) snapshots: lockbox_cow::SnapshotStore,
    /// Sandboxes started ahead (`RuntimeConfig::pool_size` > 0).
    pub(crate) pool: Option<Arc<crate::pool::Pool>>,
    /// The credentials sandboxes' rules pick from: [`RuntimeConfig::credentials`] and
    /// those [`Runtime::define_credentials`] added since.
    pub(crate) registry: Mutex<crate::credentials::Registry>,
}

impl Runtime {
    /// Opens the state directory; sandboxes a previous runtime left running become `Lost`
    /// (their branches are kept).
    pub fn open(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        // Each sandbox's init is then cloned without a copy of this process's descriptor
        // table, which grows with every sandbox it holds. Best effort: without the slots a
        // create costs more the more sandboxes live, as it did.
        if let Err(e) = lockbox_confine::reserve_spawn_slots() {
            tracing::warn!("reserving descriptor slots for spawning: {e}");
        }
        std::fs::create_dir_all(&config.state_dir).map_err(|e| {
            RuntimeError::SetupFailed(format!(
                "creating the state directory {}: {e}",
                config.state_dir.display()
            ))
        })?;
        let agent_exe = match &config.agent_exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|e| {
                RuntimeError::SetupFailed(format!("locating the lockbox executable: {e}"))
            })?,
        };
        let agent_exe = std::fs::canonicalize(&agent_exe).map_err(|e| {
            RuntimeError::SetupFailed(format!("agent executable {}: {e}", agent_exe.display()))
        })?;
        let state_lock = lock_state_dir(&config.state_dir)?;
        let store = store::Store::open(&config.state_dir)?;
        // Opening sweeps what a killed runtime left half-made: once, at start-up.
        let snapshots = crate::snapshots::store(&config.state_dir)?;
        crate::pool::sweep_spares(&config.state_dir);
        sandbox::release_stale_image_holds(&config.state_dir);
        store.prune_ended(config.keep_stopped)?;
        let log_budget = sandbox::LogBudget::new(config.max_log_memory);
        let held_pipes = crate::session::HeldPipes::new(config.max_held_sessions);
        let pool = (config.pool_size > 0).then(|| {
            crate::pool::Pool::new(
                config.pool_size,
                config.pool_max_spares,
                config.state_dir.clone(),
                snapshots.clone(),
                agent_exe.clone(),
                limits(&config, &log_budget, &held_pipes, Duration::ZERO),
            )
        });
        if let Some(pool) = &pool {
            pool.refill();
        }
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                pool,
                _state_lock: state_lock,
                agent_exe,
                store,
                sandboxes: Mutex::new(HashMap::new()),
                starting: AtomicU64::new(0),
                log_budget,
                held_pipes,
                snapshots,
                registry: Mutex::new(crate::credentials::Registry::of(&config)),
                config,
            }),
        })
    }

    /// Creates and starts a sandbox.
    pub async fn create_sandbox(&self, spec: SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        spec.policy
            .validate()
            .map_err(|e| RuntimeError::invalid("policy", e))?;
        let max = self.inner.config.max_sandboxes;
        let running = lock(&self.inner.sandboxes).len() as u64;
        if running + self.inner.starting.fetch_add(1, Ordering::SeqCst) >= max as u64 {
            self.inner.starting.fetch_sub(1, Ordering::SeqCst);
            return Err(RuntimeError::LimitReached {
                what: "max_sandboxes".into(),
                limit: max,
            });
        }
        let result = self.create_inner(spec).await;
        self.inner.starting.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn create_inner(&self, mut spec: SandboxSpec) -> Result<SandboxInfo, RuntimeError> {
        let registry = lock(&self.inner.registry).clone();
        crate::credentials::resolve(&mut spec, &registry, &self.inner.config.credential_files)?;
        if let Some(w) = &spec.workdir {
            let abs = std::fs::canonicalize(w)
                .map_err(|e| RuntimeError::invalid("workdir", format!("{}: {e}", w.display())))?;
            spec.workdir = Some(abs);
        }
        check_workdir_at(&spec)?;
        let base = match &spec.from_snapshot {
            Some(s) => {
                let meta = self.inner.snapshots.get(s).map_err(RuntimeError::Branch)?;
                crate::snapshots::check_workdir(&meta, &mut spec.workdir)?;
                Some(meta)
            }
            None => None,
        };
        let image_id = match &spec.policy.image {
            Some(reference) => {
                // Pulled as `image_pull` says (default `missing`). The sandbox keeps the
                // reference as given: its restarts (a workspace abort) and the forks of its
                // snapshots look it up again, and an operator's ceiling sees the name. The
                // pool is asked by the image's id: a tag moved since is another key.
                let store = lockbox_image::Store::in_state_dir(&self.inner.config.state_dir)
                    .map_err(RuntimeError::Image)?;
                let image = store
                    .find_or_pull(
                        reference,
                        spec.image_pull,
                        &lockbox_image::PullOptions::default(),
                    )
                    .await
                    .map_err(RuntimeError::Image)?;
                Some(image.id)
            }
            None => None,
        };
        if spec.idle_timeout.is_none() {
            spec.idle_timeout = self.inner.config.default_idle_timeout;
        }
        let pool = self.inner.pool.as_ref();
        // A pooled sandbox comes started, under an id of its own; a spare fork comes whole:
        // named, its /tmp restored and its sessions started.
        let spare = match &base {
            Some(meta) => pool.and_then(|p| p.take_fork(&spec, meta)),
            None => match pool {
                Some(p) => p.take(&spec, image_id.as_deref()).await,
                None => None,
            },
        };
        let made_ahead = spare.is_some();
        let (id, audit, instance) = match spare {
            Some(s) => {
                // Handed out: no longer a spare for a start-up to sweep.
                let named = match lock(&s.instance.branch).as_mut() {
                    Some(b) => b.set_context(sandbox::branch_context(&s.id, &spec, false)),
                    None => Ok(()),
                };
                if let Err(e) = named {
                    s.instance.stop(Duration::ZERO).await;
                    if let Some(b) = lock(&s.instance.branch).take() {
                        let _ = b.abort();
                    }
                    return Err(RuntimeError::Branch(e));
                }
                (s.id, s.audit, s.instance)
            }
            None => {
                let id = SandboxId::generate();
                let origin = sandbox::Origin {
                    state_dir: &self.inner.config.state_dir,
                    snapshots: &self.inner.snapshots,
                    base: base.as_ref().map(|m| &m.id),
                    spare: false,
                };
                let audit = crate::audit::AuditLog::new();
                let instance =
                    start_instance(&spec, origin, &self.inner.agent_exe, &id, &audit).await?;
                if let (Some(p), None) = (pool, &base) {
                    // A spec in recent use: kept ready from now on.
                    p.remember(&spec, image_id.as_deref());
                }
                (id, audit, instance)
            }
        };
        let instance = match &base {
            // What the snapshot kept of /tmp, before anything but the agent runs.
            Some(meta) if !made_ahead => {
                let store = self.inner.snapshots.clone();
                let id = meta.id.clone();
                let (instance, copied) = tokio::task::spawn_blocking(move || {
                    let copied = crate::snapshots::restore_tmp(&store, &id, &instance);
                    (instance, copied)
                })
                .await
                .map_err(RuntimeError::Task)?;
                if let Err(e) = copied {
                    instance.stop(Duration::ZERO).await;
                    if let Some(b) = lock(&instance.branch).take() {
                        let _ = b.abort();
                    }
                    return Err(e);
                }
                instance
            }
            _ => instance,
        };
        let grace = spec.policy.kill_grace;
        let sb = Arc::new(SandboxInner {
            net: Mutex::new(spec.policy.net.clone()),
            id: id.clone(),
            created_at: std::time::SystemTime::now(),
            spec,
            state_dir: self.inner.config.state_dir.clone(),
            agent_exe: self.inner.agent_exe.clone(),
            snapshots: self.inner.snapshots.clone(),
            limits: limits(
                &self.inner.config,
                &self.inner.log_budget,
                &self.inner.held_pipes,
                grace,
            ),
            instance: Mutex::new(Arc::new(instance)),
            next_process: AtomicU64::new(1),
            last_used: Mutex::new(Instant::now()),
            stopped: AtomicBool::new(false),
            ports: Default::default(),
            lifecycle: tokio::sync::Mutex::new(()),
            audit,
        });
        let info = sb.info(SandboxState::Running, None);
        let spec_json = crate::record::spec_json(&sb.spec);
        if let Err(e) = self.inner.store.insert(&info, &spec_json) {
            sb.instance().stop(Duration::ZERO).await;
            return Err(e);
        }
        lock(&self.inner.sandboxes).insert(id.clone(), sb.clone());
        match &base {
            Some(meta) if !made_ahead => {
                let handle = Sandbox { inner: sb.clone() };
                handle.start_recorded_sessions(meta).await;
            }
            _ => {}
        }
        if let Some(idle) = sb.spec.idle_timeout {
            let rt = self.clone();
            tokio::spawn(async move { rt.idle_watch(id, idle).await });
        }
        Ok(info)
    }

    async fn idle_watch(self, id: SandboxId, idle: Duration) {
        loop {
            let Some(sb) = lock(&self.inner.sandboxes).get(&id).cloned() else {
                return;
            };
            // A command still running counts as activity.
            if sb.instance().any_session_busy() {
                sb.touch();
            }
            let last = *lock(&sb.last_used);
            drop(sb);
            let due = last + idle;
            if Instant::now() >= due {
                tracing::info!(sandbox = %id, "idle timeout: deleting");
                let _ = self.delete_sandbox(&id).await;
                return;
            }
            tokio::time::sleep_until(due.into()).await;
        }
    }

    /// All sandboxes, running and recorded (stopped, lost: the last
    /// [`RuntimeConfig::keep_stopped`] of each), oldest first. Fails when the sandbox
    /// database cannot be read (rather than listing only some).
    pub fn list_sandboxes(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
        let live: HashMap<SandboxId, Arc<SandboxInner>> = lock(&self.inner.sandboxes).clone();
        let mut out = self.inner.store.list()?;
        for info in &mut out {
            if let Some(sb) = live.get(info.id.as_str()) {
                *info = sb.info(SandboxState::Running, None);
            }
        }
        Ok(out)
    }

    /// A handle to a running sandbox (`SANDBOX_NOT_FOUND`, or `SANDBOX_NOT_RUNNING` for a
    /// stopped or lost one).
    pub fn sandbox(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        if let Some(sb) = lock(&self.inner.sandboxes).get(id).cloned() {
            sb.touch();
            return Ok(Sandbox { inner: sb });
        }
        let info = self.sandbox_info(id)?;
        Err(RuntimeError::SandboxNotRunning {
            id: info.id,
            state: info.state,
        })
    }

    /// What a sandbox is (running or recorded).
    pub fn sandbox_info(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        if let Some(sb) = lock(&self.inner.sandboxes).get(id).cloned() {
            return Ok(sb.info(SandboxState::Running, None));
        }
        self.inner
            .store
            .list()?
            .into_iter()
            .find(|i| i.id == id)
            .ok_or_else(|| RuntimeError::SandboxNotFound { id: id.to_owned() })
    }

    /// Kills everything in the sandbox and applies its `on_exit` to the branch.
    pub async fn delete_sandbox(&self, id: &str) -> Result<SandboxInfo, RuntimeError> {
        let sb = lock(&self.inner.sandboxes).get(id).cloned();
        let Some(sb) = sb else {
            return match self.sandbox_info(id) {
                Ok(info) => Ok(info),
                Err(e) => Err(e),
            };
        };
        let _life = sb.lifecycle.lock().await;
        if sb.stopped.swap(true, Ordering::SeqCst) {
            drop(_life);
            return self.sandbox_info(id);
        }
        // Their host listeners end with the sandbox.
        lock(&sb.ports).clear();
        let inst = sb.instance();
        inst.stop(sb.grace()).await;
        let branch = lock(&inst.branch).take();
        let branch_id = branch.as_ref().map(|b| b.id().clone());
        let action = match branch {
            None => None,
            Some(b) => {
                let on_exit = sb.spec.on_exit;
                let done = tokio::task::spawn_blocking(move || finish_branch(b, on_exit))
                    .await
                    .unwrap_or(BranchAction::Kept);
                Some(done)
            }
        };
        let mut info = sb.info(SandboxState::Stopped, action);
        info.branch = branch_id.clone();
        info.sessions = 0;
        info.processes = 0;
        let _ = self
            .inner
            .store
            .update(id, SandboxState::Stopped, branch_id.as_ref(), action);
        if let Err(e) = self.inner.store.prune_ended(self.inner.config.keep_stopped) {
            tracing::warn!("forgetting old stopped sandboxes: {e}");
        }
        if let Some(hold) = &inst.image {
            hold.release();
        }
        lock(&self.inner.sandboxes).remove(id);
        Ok(info)
    }

    /// Adds credentials to the registry sandboxes' rules pick from (one of the same name
    /// is replaced; sandboxes already created keep the value they got), and sets the CA
    /// file trusted for the real servers if `upstream_ca` names one. For an in-process
    /// caller that read the values itself (the Python SDK's local runtime); a server's
    /// registry is fixed at start ([`RuntimeConfig::credentials`]).
    pub fn define_credentials(&self, more: crate::Credentials, upstream_ca: Option<PathBuf>) {
        lock(&self.inner.registry).define(more, upstream_ca);
    }

    /// How many pooled sandboxes are ready now, of every spec (0 without a pool).
    pub fn pool_ready(&self) -> usize {
        self.inner.pool.as_ref().map_or(0, |p| p.ready())
    }

    /// The specs the pool keeps sandboxes ready for, the default's first, with how many are
    /// ready and how creations of each went (empty without a pool). Spare forks aside.
    pub fn pool_stats(&self) -> Vec<PoolKeyStats> {
        self.inner
            .pool
            .as_ref()
            .map_or_else(Vec::new, |p| p.stats())
    }

    /// Every snapshot, oldest first.
    pub fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>, RuntimeError> {
        let store = &self.inner.snapshots;
        Ok(store
            .list()
            .map_err(RuntimeError::Branch)?
            .into_iter()
            .map(crate::snapshots::info)
            .collect())
    }

    /// One snapshot (`SNAPSHOT_NOT_FOUND`).
    pub fn snapshot_info(&self, id: &str) -> Result<SnapshotInfo, RuntimeError> {
        let store = &self.inner.snapshots;
        let meta = store
            .get(&crate::snapshots::parse_id(id)?)
            .map_err(RuntimeError::Branch)?;
        Ok(crate::snapshots::info(meta))
    }

    /// The spec a fork of snapshot `id` gets (the policy, labels and `on_exit` of the
    /// sandbox it was taken of, its workdir), for a caller that bounds what forks may be
    /// (the server's ceilings) before making them (`SNAPSHOT_NOT_FOUND`).
    pub fn snapshot_spec(&self, id: &str) -> Result<SandboxSpec, RuntimeError> {
        let meta = self
            .inner
            .snapshots
            .get(&crate::snapshots::parse_id(id)?)
            .map_err(RuntimeError::Branch)?;
        Ok(crate::snapshots::spec_of(&meta))
    }

    /// Deletes a snapshot (`SNAPSHOT_IN_USE` while forks or other snapshots use it).
    pub async fn delete_snapshot(&self, id: &str) -> Result<(), RuntimeError> {
        let id = crate::snapshots::parse_id(id)?;
        let inner = Arc::clone(&self.inner);
        // Off the async workers: it may wait for a spare fork being armed (one sandbox
        // start at most) and removes the snapshot's files.
        tokio::task::spawn_blocking(move || {
            if let Some(pool) = &inner.pool {
                pool.forget_forks(&id);
            }
            inner.snapshots.delete(&id).map_err(RuntimeError::Branch)
        })
        .await
        .map_err(RuntimeError::Task)?
    }

    /// Creates `count` sandboxes from snapshot `id` (forks), each with the policy, labels and
    /// `on_exit` of the sandbox the snapshot was taken of: all of them, or none (those made
    /// before a failure are deleted).
    pub async fn fork_snapshot(
        &self,
        id: &str,
        count: usize,
    ) -> Result<Vec<SandboxInfo>, RuntimeError> {
        self.fork_with(id, count, crate::Credentials::default())
            .await
    }

    /// [`Runtime::fork_snapshot`], the forks' interception rules taking their credentials
    /// from `given` first, then from the registry.
    pub(crate) async fn fork_with(
        &self,
        id: &str,
        count: usize,
        given: crate::Credentials,
    ) -> Result<Vec<SandboxInfo>, RuntimeError> {
        let max = self.inner.config.max_sandboxes;
        if count == 0 || count > max {
            return Err(RuntimeError::invalid(
                "count",
                format!("must be from 1 to {max} (the server's max_sandboxes)"),
            ));
        }
        let meta = self
            .inner
            .snapshots
            .get(&crate::snapshots::parse_id(id)?)
            .map_err(RuntimeError::Branch)?;
        let mut spec = crate::snapshots::spec_of(&meta);
        spec.from_snapshot = Some(meta.id.clone());
        spec.credentials = given;
        let made =
            futures_util::future::join_all((0..count).map(|_| self.create_sandbox(spec.clone())))
                .await;
        let (ok, failed): (Vec<_>, Vec<_>) = made.into_iter().partition(Result::is_ok);
        let ok: Vec<SandboxInfo> = ok.into_iter().filter_map(Result::ok).collect();
        if let Some(Err(e)) = failed.into_iter().next() {
            for info in &ok {
                let _ = self.delete_sandbox(&info.id).await;
            }
            return Err(recorded_rules_error(e, &meta.id));
        }
        Ok(ok)
    }

    /// Deletes every running sandbox (each with its `on_exit`).
    pub async fn shutdown(&self) {
        if let Some(pool) = &self.inner.pool {
            pool.close().await;
        }
        let ids: Vec<SandboxId> = lock(&self.inner.sandboxes).keys().cloned().collect();
        let deletes = ids.iter().map(|id| self.delete_sandbox(id));
        futures_util::future::join_all(deletes).await;
    }
}

/// `e`, saying where its rules came from when the interception rules recorded with
/// snapshot `id` are at fault: typically a credential this runtime does not define (a
/// server restarted without its `--credential`). The fork is refused rather than started
/// without the credential.
fn recorded_rules_error(e: RuntimeError, id: &lockbox_cow::SnapshotId) -> RuntimeError {
    match e {
        RuntimeError::InvalidRequest { field, message }
            if field == "http_auth" || field == "http_allow" =>
        {
            RuntimeError::InvalidRequest {
                message: format!("the {field} rules recorded with snapshot {id}: {message}"),
                field,
            }
        }
        other => other,
    }
}

/// The bounds of `config` as a sandbox whose SIGTERM → SIGKILL delay is `grace` applies them.
pub(crate) fn limits(
    config: &RuntimeConfig,
    log_budget: &Arc<sandbox::LogBudget>,
    held_pipes: &Arc<crate::session::HeldPipes>,
    grace: Duration,
) -> sandbox::Limits {
    sandbox::Limits {
        grace,
        default_log_bytes: config.default_log_bytes,
        max_exec_output: config.max_exec_output,
        max_sessions: config.max_sessions,
        max_processes: config.max_processes,
        log_budget: Arc::clone(log_budget),
        held_pipes: Arc::clone(held_pipes),
        snapshots: lockbox_cow::SnapshotLimits {
            max_bytes: config.max_snapshot_bytes,
            max_entries: config.max_snapshot_entries,
        },
    }
}

/// Takes `STATE/runtime.lock`: a second runtime on the same state directory would mark the
/// first one's running sandboxes `lost`.
fn lock_state_dir(state_dir: &std::path::Path) -> Result<std::fs::File, RuntimeError> {
    let path = state_dir.join("runtime.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| RuntimeError::SetupFailed(format!("{}: {e}", path.display())))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(RuntimeError::SetupFailed(format!(
            "the state directory {} is in use by another lockbox runtime (lockbox serve)",
            state_dir.display()
        ))),
        Err(e) => Err(RuntimeError::SetupFailed(format!(
            "{}: {e}",
            path.display()
        ))),
    }
}

/// Applies `on_exit` to a stopped sandbox's branch; returns what was done.
fn finish_branch(mut b: lockbox_cow::Branch, on_exit: OnExit) -> BranchAction {
    let id = b.id().as_str().to_owned();
    match on_exit {
        OnExit::Commit => match b.commit(&lockbox_cow::CommitOptions::default()) {
            Ok(_) => BranchAction::Committed,
            Err(e) => {
                tracing::warn!(branch = %id, "commit on exit failed, branch kept: {e}");
                BranchAction::Kept
            }
        },
        OnExit::Abort => match b.abort() {
            Ok(()) => BranchAction::Aborted,
            Err(e) => {
                tracing::warn!(branch = %id, "abort on exit failed: {e}");
                BranchAction::Kept
            }
        },
        // A branch without changes has nothing to review: removed rather than left in
        // `lockbox branch list` (after an abort, the fresh branch is always empty).
        OnExit::Keep if b.changes().is_ok_and(|mut c| c.next().is_none()) => match b.abort() {
            Ok(()) => BranchAction::Empty,
            Err(e) => {
                tracing::warn!(branch = %id, "removing an empty branch failed: {e}");
                BranchAction::Kept
            }
        },
        OnExit::Keep => {
            let _ = b.keep();
            BranchAction::Kept
        }
    }
}

/// `workdir_at` is an absolute path other than `/`, without `..`, and comes with a
/// workdir (or a snapshot's).
fn check_workdir_at(spec: &SandboxSpec) -> Result<(), RuntimeError> {
    let Some(at) = &spec.workdir_at else {
        return Ok(());
    };
    use std::path::Component;
    let plain = at
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)));
    if !at.is_absolute() || at.parent().is_none() || !plain {
        return Err(RuntimeError::invalid(
            "workdir_at",
            format!(
                "{}: an absolute path inside the sandbox, not /, without ..",
                at.display()
            ),
        ));
    }
    if spec.workdir.is_none() && spec.from_snapshot.is_none() {
        return Err(RuntimeError::invalid(
            "workdir_at",
            "where the sandbox sees its workdir: give a workdir",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workdir_at_must_be_a_plain_absolute_path_beside_a_workdir() {
        let at = |at: &str, workdir: bool| SandboxSpec {
            workdir: workdir.then(|| PathBuf::from("/srv/w")),
            workdir_at: Some(at.into()),
            ..SandboxSpec::default()
        };
        assert!(check_workdir_at(&at("/home/user", true)).is_ok());
        for bad in ["home/user", "/", "/home/../etc"] {
            let e = check_workdir_at(&at(bad, true)).unwrap_err().to_string();
            assert!(e.contains("workdir_at") && e.contains(bad), "{bad}: {e}");
        }
        let e = check_workdir_at(&at("/home/user", false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("give a workdir"), "{e}");
    }
}
