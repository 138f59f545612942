//! A pool of pre-armed sandbox instances, keyed by what a sandbox fixes when it starts.
//!
//! A sandbox's policy (grants, network, limits, env, cwd, hostname, image), its approvals
//! (`net_ask`) and its interception rules with their credentials are fixed when its
//! namespaces, mounts, Landlock rules, seccomp filters and network supervisor are made: that
//! is the pool's key ([`key_of`]), the image named by its store id (digest), not its tag.
//! What the runtime keeps beside the instance — labels, `on_exit`, the idle timeout — is the
//! taker's, applied at the take. Everything else of a key is the same in a pooled sandbox
//! and a started one, because a pooled one *is* a started one of that key: started ahead —
//! confined, the agent answering, the default session's shell running — under an id of its
//! own, which the sandbox then bears (its audit log and image hold already name it).
//!
//! The default spec (the default policy, no workdir) is always kept at `pool_size` ready
//! (`RuntimeConfig::pool_size`). Any other key is armed once a sandbox of it started without
//! the pool (so a spec that cannot start takes no key's place) — the policies in recent
//! use — with `pool_size` ready too, while the ready sandboxes of all keys together
//! stay within `RuntimeConfig::pool_max_spares`: a new key evicts the least recently used
//! one, whose sandboxes are stopped. A key whose arming fails (an image with no shell, say)
//! is not armed again until it is evicted. Refilled in the background after each take;
//! emptied (its instances stopped, their image holds released) at shutdown.
//!
//! A workdir is part of the key (its canonical path): a ready sandbox of it has its branch
//! made and its overlay mounted at its arming, under its own id, the branch marked a spare
//! (swept at start-up if the runtime dies) until the take names it. The branch's base (the
//! stale-base reference of its commit) is taken at the arming, so a take hands it out only
//! if nothing in the workdir changed since ([`unchanged_since_armed`]: every entry's ctime
//! older than the base): then it is exactly the sandbox a start at the take would make —
//! the same view, and the same base for every path it may write. A workdir changed since is
//! a miss: the ready sandbox is discarded and one is started (whose base is then). A
//! workdir of more than [`WORKDIR_CHECK_ENTRIES`] entries is not pooled (the key is marked
//! broken at its arming): the check at each take would cost about a start. `on_exit` is
//! the taker's, applied when the sandbox ends; a ready sandbox stopped unused (evicted,
//! idle key, shutdown) has its branch removed: nothing ran in it to review.
//!
//! Not pooled: policies that pass file descriptors of the caller. A snapshot is immutable, so
//! a fork of one can be made whole ahead — branch over the snapshot's layers, overlay
//! mounted, `/tmp` restored, recorded sessions started — and only named at the take. The
//! pool keeps spare forks of the snapshot forked last (as many as `pool_size`), armed after
//! its first fork: that is the shape of a search that forks one state again and again.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lockbox_cow::{SnapshotId, SnapshotMeta, Timestamp};

use crate::audit::AuditLog;
use crate::sandbox::{lock, start_instance, Instance, Limits, Origin};
use crate::types::{PoolKeyStats, SandboxId, SandboxSpec};

/// The entries of a workdir a take looks at, at most, to tell whether it changed since its
/// ready sandbox was armed (a few milliseconds of `lstat`s): a workdir with more is not
/// pooled, since the check at every take would cost about what a start does.
pub(crate) const WORKDIR_CHECK_ENTRIES: usize = 4096;

/// How long a refill waits after a take.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(20);

/// How long a key in recent use is kept without a creation of it: then its sandboxes are
/// stopped (and the image they hold released, which `lockbox image rm` refuses while held).
pub(crate) const KEY_IDLE: std::time::Duration = std::time::Duration::from_secs(300);

/// Ready instances and what refills them.
#[derive(Debug)]
pub(crate) struct Pool {
    /// Ready sandboxes wanted per key.
    size: usize,
    /// Ready sandboxes of all keys together at most (at least `size`: the default's).
    max_spares: usize,
    keys: Mutex<Keys>,
    refilling: AtomicBool,
    /// A task evicts keys unused for [`KEY_IDLE`] while there are any but the default.
    sweeping: AtomicBool,
    closed: AtomicBool,
    /// Discarded sandboxes still being stopped in the background ([`Pool::discard`]).
    discarding: Arc<AtomicUsize>,
    state_dir: PathBuf,
    snapshots: lockbox_cow::SnapshotStore,
    agent_exe: PathBuf,
    limits: Limits,
    forks: Mutex<Forks>,
    arming_forks: AtomicBool,
}

/// The keys kept warm, the default spec's first.
#[derive(Debug)]
struct Keys {
    entries: Vec<Entry>,
}

/// One key's ready sandboxes.
#[derive(Debug)]
struct Entry {
    /// The spec they are armed with ([`key_of`]).
    key: SandboxSpec,
    ready: VecDeque<Spare>,
    /// When it was last asked for.
    used: std::time::Instant,
    hits: u64,
    misses: u64,
    /// Arming failed: not tried again while the key is kept.
    broken: bool,
}

impl Entry {
    fn new(key: SandboxSpec) -> Entry {
        Entry {
            key,
            ready: VecDeque::new(),
            used: std::time::Instant::now(),
            hits: 0,
            misses: 0,
            broken: false,
        }
    }
}

/// Spare forks of the snapshot forked last.
#[derive(Debug, Default)]
struct Forks {
    /// The snapshot and the spec its forks are armed with (`None`: no snapshot wanted).
    of: Option<(SnapshotMeta, SandboxSpec)>,
    ready: VecDeque<Spare>,
}

/// A sandbox made ahead: its id (its branch, image hold and audit log name it already),
/// ready to be taken.
#[derive(Debug)]
pub(crate) struct Spare {
    pub id: SandboxId,
    pub audit: Arc<AuditLog>,
    pub instance: Instance,
}

/// What of `spec` a pooled sandbox is armed with and must match: everything fixed at its
/// start, with the image named by `image_id` (its store id, which the caller resolved the
/// reference to) so that a tag moved since, or an image removed and pulled again, never
/// finds a sandbox of the image it named before.
fn key_of(spec: &SandboxSpec, image_id: Option<&str>) -> SandboxSpec {
    let mut policy = spec.policy.clone();
    policy.image = image_id.map(str::to_owned);
    // Not a start's: a long-lived sandbox ends by delete or idle timeout (`start_instance`).
    policy.timeout = None;
    SandboxSpec {
        policy,
        // Canonical (the caller resolved it): one directory, one key.
        workdir: spec.workdir.clone(),
        workdir_at: spec.workdir_at.clone(),
        net_ask: spec.net_ask,
        http: spec.http.clone(),
        credentials: spec.credentials.clone(),
        upstream_ca: spec.upstream_ca.clone(),
        ..SandboxSpec::default()
    }
}

impl Pool {
    pub fn new(
        size: usize,
        max_spares: usize,
        state_dir: PathBuf,
        snapshots: lockbox_cow::SnapshotStore,
        agent_exe: PathBuf,
        limits: Limits,
    ) -> Arc<Pool> {
        let default = Entry::new(key_of(&SandboxSpec::default(), None));
        Arc::new(Pool {
            size,
            max_spares: max_spares.max(size),
            keys: Mutex::new(Keys {
                entries: vec![default],
            }),
            refilling: AtomicBool::new(false),
            sweeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            discarding: Arc::new(AtomicUsize::new(0)),
            state_dir,
            snapshots,
            agent_exe,
            limits,
            forks: Mutex::new(Forks::default()),
            arming_forks: AtomicBool::new(false),
        })
    }

    /// Whether a sandbox of `spec` can come from the pool (a workdir's, if it is small
    /// enough: [`Pool::arm`]).
    fn serves(spec: &SandboxSpec) -> bool {
        spec.from_snapshot.is_none() && spec.policy.pass_fds.is_empty()
    }

    /// A ready sandbox for `spec` (whose image, if any, is the store's `image_id`; whose
    /// workdir, if any, is canonical), if the pool has one of its key alive and, for a
    /// workdir's, the workdir unchanged since it was armed; starts a refill either way. A
    /// key not kept yet is only [`Pool::remember`]ed once a sandbox of it started.
    pub async fn take(
        self: &Arc<Self>,
        spec: &SandboxSpec,
        image_id: Option<&str>,
    ) -> Option<Spare> {
        if !Self::serves(spec) {
            return None;
        }
        let key = key_of(spec, image_id);
        let mut got = None;
        loop {
            let mut dead = Vec::new();
            let candidate = {
                let mut keys = lock(&self.keys);
                let Some(entry) = keys.entries.iter_mut().find(|e| fits(&e.key, &key)) else {
                    break;
                };
                entry.used = std::time::Instant::now();
                let mut candidate = None;
                while let Some(spare) = entry.ready.pop_front() {
                    if spare.instance.spare_alive() {
                        candidate = Some(spare);
                        break;
                    }
                    // Died while waiting (killed from outside).
                    dead.push(spare);
                }
                candidate
            };
            dead.into_iter().for_each(|s| self.discard(s));
            let Some(spare) = candidate else {
                break;
            };
            if unchanged_since_armed(&spare).await {
                got = Some(spare);
                break;
            }
            // Its workdir changed since it was armed: a sandbox started now would see the
            // change as its base, this one would call it stale. Not handed out.
            tracing::debug!(sandbox = %spare.id, "the workdir changed since it was armed");
            self.discard(spare);
        }
        {
            let mut keys = lock(&self.keys);
            if let Some(entry) = keys.entries.iter_mut().find(|e| fits(&e.key, &key)) {
                if got.is_some() {
                    entry.hits += 1;
                } else {
                    entry.misses += 1;
                }
            }
        }
        self.refill();
        got
    }

    /// Keeps `spec`'s key from now on (a spec in recent use), after a sandbox of it started
    /// without the pool (so a spec that cannot start never takes a key's place): the least
    /// recently used keys are evicted beyond `max_spares`.
    pub fn remember(self: &Arc<Self>, spec: &SandboxSpec, image_id: Option<&str>) {
        if !Self::serves(spec) || self.closed.load(Ordering::SeqCst) {
            return;
        }
        let key = key_of(spec, image_id);
        let evicted: Vec<Spare> = {
            let mut keys = lock(&self.keys);
            if keys.entries.iter().any(|e| fits(&e.key, &key)) {
                return;
            }
            let mut entry = Entry::new(key);
            entry.misses = 1;
            keys.entries.push(entry);
            let mut evicted = Vec::new();
            // Beyond the bound: the least recently used keys go (never the default's).
            while keys.entries.len() * self.size > self.max_spares && keys.entries.len() > 1 {
                let oldest = (1..keys.entries.len()).min_by_key(|&i| keys.entries[i].used);
                if let Some(i) = oldest {
                    evicted.extend(keys.entries.remove(i).ready);
                }
            }
            evicted
        };
        evicted.into_iter().for_each(|s| self.discard(s));
        self.refill();
        self.sweep();
    }

    /// While keys in recent use are kept, evicts in the background those unused for
    /// [`KEY_IDLE`] (one sweeper at a time).
    fn sweep(self: &Arc<Self>) {
        if lock(&self.keys).entries.len() < 2 || self.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(tokio) = tokio::runtime::Handle::try_current() else {
            self.sweeping.store(false, Ordering::SeqCst);
            return;
        };
        // Weak: a runtime dropped without its shutdown drops its pool (and so its sandboxes).
        let pool = Arc::downgrade(self);
        tokio.spawn(async move {
            loop {
                tokio::time::sleep(KEY_IDLE / 4).await;
                let Some(pool) = pool.upgrade() else {
                    return;
                };
                if pool.closed.load(Ordering::SeqCst) {
                    return;
                }
                let (idle, done) = {
                    let mut keys = lock(&pool.keys);
                    let mut idle = Vec::new();
                    let mut i = 1;
                    while i < keys.entries.len() {
                        if keys.entries[i].used.elapsed() >= KEY_IDLE {
                            idle.extend(keys.entries.remove(i).ready);
                        } else {
                            i += 1;
                        }
                    }
                    // Under the lock: a take adding a key then sees no sweeper and starts one.
                    let done = keys.entries.len() < 2;
                    if done {
                        pool.sweeping.store(false, Ordering::SeqCst);
                    }
                    (idle, done)
                };
                idle.into_iter().for_each(|s| pool.discard(s));
                if done {
                    return;
                }
            }
        });
    }

    /// Starts sandboxes in the background until every key kept has `size` ready (one
    /// refill at a time; the default key first, then the most recently used).
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
            let mut drained = false;
            loop {
                if pool.closed.load(Ordering::SeqCst) {
                    break;
                }
                let Some((key, default)) = pool.wanted() else {
                    drained = true;
                    break;
                };
                match pool.arm(&key).await {
                    Ok(spare) => {
                        let mut keys = lock(&pool.keys);
                        let entry = keys.entries.iter_mut().find(|e| fits(&e.key, &key));
                        match entry {
                            Some(e) if !pool.closed.load(Ordering::SeqCst) => {
                                e.ready.push_back(spare)
                            }
                            // Closed, or the key was evicted meanwhile.
                            _ => {
                                drop(keys);
                                pool.discard(spare);
                            }
                        }
                    }
                    Err(e) => {
                        // Not fatal: sandboxes start the usual way meanwhile.
                        tracing::warn!("arming a pooled sandbox: {e}");
                        if default {
                            // Tried again at the next take.
                            break;
                        }
                        let mut keys = lock(&pool.keys);
                        if let Some(e) = keys.entries.iter_mut().find(|e| fits(&e.key, &key)) {
                            e.broken = true;
                        }
                    }
                }
            }
            pool.refilling.store(false, Ordering::SeqCst);
            // A key remembered after the last look found this refill still running.
            if drained && pool.wanted().is_some() {
                pool.refill();
            }
        });
    }

    /// The key to arm a sandbox of next, and whether it is the default's.
    fn wanted(&self) -> Option<(SandboxSpec, bool)> {
        let keys = lock(&self.keys);
        let mut short: Vec<(usize, &Entry)> = keys
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.broken && e.ready.len() < self.size)
            .collect();
        short.sort_by_key(|(i, e)| (*i != 0, std::cmp::Reverse(e.used)));
        short.first().map(|(i, e)| (e.key.clone(), *i == 0))
    }

    /// A sandbox of `key` started ahead, its default session's shell running; a workdir's
    /// with its branch made and its overlay mounted, the branch marked a spare until the
    /// take (its base is now: [`unchanged_since_armed`] keeps that exact).
    async fn arm(&self, key: &SandboxSpec) -> Result<Spare, crate::RuntimeError> {
        if let Some(workdir) = &key.workdir {
            let dir = workdir.clone();
            let fits = tokio::task::spawn_blocking(move || {
                // Nothing is newer than the end of time: this only counts.
                let never = Timestamp {
                    secs: i64::MAX,
                    nanos: 0,
                };
                changed_since(&dir, never) != Since::TooLarge
            })
            .await
            .map_err(crate::RuntimeError::Task)?;
            if !fits {
                return Err(crate::RuntimeError::invalid(
                    "workdir",
                    format!(
                        "{} has more than {WORKDIR_CHECK_ENTRIES} entries: its sandboxes are \
                         not pooled (checking it at each take would cost about a start)",
                        workdir.display()
                    ),
                ));
            }
        }
        let id = SandboxId::generate();
        let origin = Origin {
            state_dir: &self.state_dir,
            snapshots: &self.snapshots,
            base: None,
            spare: true,
        };
        let audit = crate::audit::AuditLog::new();
        let instance = start_instance(key, origin, &self.agent_exe, &id, &audit).await?;
        let spare = Spare {
            id,
            audit,
            instance,
        };
        if let Err(e) = spare
            .instance
            .start_spare_default(key.policy.kill_grace, &self.limits.held_pipes)
            .await
        {
            self.discard(spare);
            return Err(e);
        }
        Ok(spare)
    }

    /// What each key kept has ready and how its takes went.
    pub fn stats(&self) -> Vec<PoolKeyStats> {
        let keys = lock(&self.keys);
        keys.entries
            .iter()
            .enumerate()
            .map(|(i, e)| PoolKeyStats {
                default: i == 0,
                image: e.key.policy.image.clone(),
                ready: e.ready.len(),
                hits: e.hits,
                misses: e.misses,
            })
            .collect()
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
                .is_some_and(|(m, s)| m.id == meta.id && fits(s, &armed));
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
                self.discard(spare);
            }
            (got, stale)
        };
        stale.into_iter().for_each(|s| self.discard(s));
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
        stale.into_iter().for_each(|s| self.discard(s));
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
                            .is_some_and(|(m, s)| m.id == meta.id && fits(s, &spec));
                        if still && !pool.closed.load(Ordering::SeqCst) {
                            forks.ready.push_back(spare);
                        } else {
                            drop(forks);
                            pool.discard(spare);
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
            spare: true,
        };
        let audit = AuditLog::new();
        let instance = start_instance(spec, origin, &self.agent_exe, &id, &audit).await?;
        let spare = Spare {
            id,
            audit,
            instance,
        };
        let store = self.snapshots.clone();
        let snapshot = meta.id.clone();
        let (spare, copied) = tokio::task::spawn_blocking(move || {
            let copied = crate::snapshots::restore_tmp(&store, &snapshot, &spare.instance);
            (spare, copied)
        })
        .await
        .map_err(crate::RuntimeError::Task)?;
        if let Err(e) = copied {
            self.discard(spare);
            return Err(e);
        }
        let limits = Limits {
            grace: spec.policy.kill_grace,
            ..self.limits.clone()
        };
        crate::snapshots::start_sessions(&spare.instance, meta, &limits).await;
        Ok(spare)
    }

    /// Stops every ready sandbox (removing its branch, if a workdir's, and releasing its
    /// image) and discards every spare fork, those being armed too; no refill after.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Spare> = lock(&self.keys)
            .entries
            .iter_mut()
            .flat_map(|e| e.ready.drain(..))
            .collect();
        for spare in all {
            spare.instance.stop(std::time::Duration::ZERO).await;
            // Nothing ran in it: nothing to keep for review.
            let branch = lock(&spare.instance.branch).take();
            if let Some(b) = branch {
                if let Err(e) = b.abort() {
                    tracing::warn!("removing a ready sandbox's branch: {e}");
                }
            }
            if let Some(hold) = &spare.instance.image {
                hold.release();
            }
        }
        let spares: Vec<Spare> = {
            let mut forks = lock(&self.forks);
            forks.of = None;
            forks.ready.drain(..).collect()
        };
        spares.into_iter().for_each(|s| self.discard(s));
        // A sandbox being armed now is discarded when made (the pool is closed): waited
        // for, so that no branch of it outlives the shutdown (one sandbox start at most).
        let since = std::time::Instant::now();
        // And the sandboxes discarded in the background are stopped and their images released
        // before the shutdown returns (an `image rm` right after must find no holder).
        while (self.refilling.load(Ordering::SeqCst)
            || self.arming_forks.load(Ordering::SeqCst)
            || self.discarding.load(Ordering::SeqCst) > 0)
            && since.elapsed() < std::time::Duration::from_secs(10)
        {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// How many are ready now (of every key, spare forks included).
    pub fn ready(&self) -> usize {
        let keyed: usize = lock(&self.keys).entries.iter().map(|e| e.ready.len()).sum();
        keyed + lock(&self.forks).ready.len()
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

/// Whether a ready sandbox can be handed out as far as its workdir goes: it has none, or
/// nothing in the workdir changed since its branch's base was taken (at its arming).
///
/// A sandbox started at the take would take its base then: a change made between the
/// arming and the take would be part of what it began with, and its commit would not call
/// that path stale. The ready sandbox's base is older, so it would; and its overlay, made
/// before the change, may have looked up the entry as it was. Every change to a workdir
/// entry (content, mode, link, an entry added, removed or renamed in a directory) stamps a
/// ctime at least the base on it or its directory (the stale-base rule of `lockbox-cow`),
/// so a walk finding none proves the two sandboxes alike: same view, same base for every
/// path. A change after the check is one after the sandbox began, for both.
async fn unchanged_since_armed(spare: &Spare) -> bool {
    let armed = lock(&spare.instance.branch)
        .as_ref()
        .map(|b| (b.workdir().to_owned(), b.meta().base_ctime));
    let Some((dir, base)) = armed else {
        return true;
    };
    tokio::task::spawn_blocking(move || changed_since(&dir, base) == Since::Unchanged)
        .await
        .unwrap_or(false)
}

/// What [`changed_since`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Since {
    Unchanged,
    Changed,
    /// More than [`WORKDIR_CHECK_ENTRIES`] entries: not looked at further.
    TooLarge,
}

/// Whether directory `dir` or anything below it has a ctime at least `base` (the stale-base
/// rule's "changed since"). A directory that cannot be read (mode 000) is judged by its own
/// ctime, as the commit's stale-base check does; an entry gone while walked is a change.
fn changed_since(dir: &std::path::Path, base: Timestamp) -> Since {
    let mut left = WORKDIR_CHECK_ENTRIES;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if !newer(&m, base) => changed_below(dir, base, &mut left),
        _ => Since::Changed,
    }
}

fn changed_below(dir: &std::path::Path, base: Timestamp, left: &mut usize) -> Since {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Since::Unchanged,
        Err(_) => return Since::Changed,
    };
    for entry in entries {
        let Ok(entry) = entry else {
            return Since::Changed;
        };
        if *left == 0 {
            return Since::TooLarge;
        }
        *left -= 1;
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            return Since::Changed;
        };
        if newer(&meta, base) {
            return Since::Changed;
        }
        if meta.is_dir() {
            match changed_below(&path, base, left) {
                Since::Unchanged => {}
                other => return other,
            }
        }
    }
    Since::Unchanged
}

/// `meta`'s ctime is at least `base`.
fn newer(meta: &std::fs::Metadata, base: Timestamp) -> bool {
    use std::os::unix::fs::MetadataExt;
    (meta.ctime(), meta.ctime_nsec()) >= (base.secs, base.nanos)
}

/// Whether a sandbox (or fork) armed with `armed` can be handed out for `wanted`: the same
/// sandbox (policy, workdir and where it is seen, approvals, interception rules and their credentials), whatever
/// its labels, `on_exit` and idle timeout, which are the taker's.
fn fits(armed: &SandboxSpec, wanted: &SandboxSpec) -> bool {
    armed.policy == wanted.policy
        && armed.workdir == wanted.workdir
        && armed.workdir_at == wanted.workdir_at
        && armed.net_ask == wanted.net_ask
        && armed.http == wanted.http
        && armed.credentials == wanted.credentials
        && armed.upstream_ca == wanted.upstream_ca
}

impl Pool {
    /// Discards a ready sandbox or spare fork: removes its branch (which releases the
    /// snapshot) and stops it, then releases its image (in the background when there is a
    /// tokio runtime, counted in `discarding` for [`Pool::close`] to wait for; dropping it
    /// kills it otherwise).
    fn discard(&self, spare: Spare) {
        let branch = lock(&spare.instance.branch).take();
        if let Ok(tokio) = tokio::runtime::Handle::try_current() {
            self.discarding.fetch_add(1, Ordering::SeqCst);
            let discarding = Arc::clone(&self.discarding);
            tokio.spawn(async move {
                spare.instance.stop(std::time::Duration::ZERO).await;
                if let Some(hold) = &spare.instance.image {
                    hold.release();
                }
                discarding.fetch_sub(1, Ordering::SeqCst);
            });
        } else {
            if let Some(hold) = &spare.instance.image {
                hold.release();
            }
            drop(spare);
        }
        if let Some(b) = branch {
            if let Err(e) = b.abort() {
                tracing::warn!("removing a spare fork's branch: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A base taken now, as a branch's is (a fresh directory's ctime, one tick on).
    fn base_now(scratch: &std::path::Path) -> Timestamp {
        let fresh = scratch.join(format!("base-{}", crate::util::random_id()));
        std::fs::create_dir(&fresh).unwrap();
        lockbox_cow::stamp_base(&fresh).unwrap()
    }

    #[test]
    fn any_change_to_a_workdir_after_the_base_is_seen_and_a_large_one_is_not_walked() {
        let scratch = tempfile::tempdir().unwrap();
        let work = scratch.path().join("work");
        std::fs::create_dir_all(work.join("d/e")).unwrap();
        std::fs::write(work.join("d/e/f"), "f").unwrap();
        std::fs::write(work.join("g"), "g").unwrap();
        let changes: [&dyn Fn(); 5] = [
            &|| std::fs::write(work.join("d/e/f"), "changed").unwrap(),
            &|| std::fs::write(work.join("d/e/new"), "").unwrap(),
            &|| std::fs::remove_file(work.join("g")).unwrap(),
            &|| std::fs::rename(work.join("d/e"), work.join("d/moved")).unwrap(),
            &|| {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::Permissions::from_mode(0o700);
                std::fs::set_permissions(&work, mode).unwrap()
            },
        ];
        for (n, change) in changes.iter().enumerate() {
            let base = base_now(scratch.path());
            assert_eq!(changed_since(&work, base), Since::Unchanged, "before {n}");
            change();
            assert_eq!(changed_since(&work, base), Since::Changed, "change {n}");
        }
        assert_eq!(
            changed_since(&scratch.path().join("gone"), base_now(scratch.path())),
            Since::Changed
        );
        let large = scratch.path().join("large");
        std::fs::create_dir(&large).unwrap();
        for i in 0..=WORKDIR_CHECK_ENTRIES {
            std::fs::write(large.join(i.to_string()), "").unwrap();
        }
        assert_eq!(
            changed_since(&large, base_now(scratch.path())),
            Since::TooLarge
        );
    }

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
        assert!(fits(&plain, &plain));
        assert!(fits(&ruled, &ruled));
        assert!(!fits(&plain, &ruled));
        assert!(!fits(&ruled, &plain));
        let mut other_ca = ruled.clone();
        other_ca.upstream_ca = Some("/ca.pem".into());
        assert!(!fits(&ruled, &other_ca));
    }
}
