//! Snapshots of a running sandbox's files: its processes are paused
//! (`lockbox_confine::freeze_tree`), its branch's upper layer is copied into the snapshot
//! store (`lockbox_cow::SnapshotStore`), and its processes go on. Processes' memory is not
//! part of a snapshot: that needs `CAP_CHECKPOINT_RESTORE` (CRIU), which lockbox does not
//! ask for.
//!
//! A sandbox forked from a snapshot (or restored to one) lies on the snapshot's layers: its
//! own snapshots record that one as their parent and copy only its own upper.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockbox_cow::{
    CowError, NewSnapshot, SnapshotId, SnapshotLimit, SnapshotLimits, SnapshotMeta, SnapshotStore,
};

use crate::sandbox::{lock, Instance, Limits, SessionState};
use crate::types::{
    SandboxId, SandboxInfo, SandboxSpec, SessionOptions, SnapshotInfo, SnapshotOptions,
};
use crate::{Change, Runtime, RuntimeError};

/// Longest the processes of a sandbox may take to stop (a process in uninterruptible sleep
/// on a hung filesystem does not stop).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// The name under which a snapshot keeps the sandbox's `/tmp` (when asked).
const TMP: &str = "tmp";

/// Copies the `/tmp` snapshot `id` kept (if it kept one) into the `/tmp` of `inst`, a
/// sandbox just started over it (a fork, a restore), before anything of it runs but its
/// agent. Nothing is followed on either side ([`lockbox_cow::copy_tree`]).
pub(crate) fn restore_tmp(
    store: &SnapshotStore,
    id: &SnapshotId,
    inst: &Instance,
) -> Result<(), RuntimeError> {
    let Some(kept) = store.scratch(id, TMP) else {
        return Ok(());
    };
    let root = inst.agent_root().ok_or_else(|| {
        RuntimeError::internal("the new sandbox's /tmp cannot be reached through /proc")
    })?;
    lockbox_cow::copy_tree(&kept, &root.join("tmp"))
        .map(drop)
        .map_err(RuntimeError::Branch)
}

/// Longest a snapshot's name may be.
pub const MAX_SNAPSHOT_NAME: usize = 256;

/// What a snapshot records of its sandbox besides files (its `context`): the spec a fork
/// starts with, and the sessions a fork or restore starts again. Room for more (a process
/// checkpoint, where privilege allows) without a new format.
pub(crate) struct Recorded<'a> {
    pub spec: &'a SandboxSpec,
    pub sessions: &'a [SessionState],
}

/// The sessions snapshot `meta` recorded (none if it recorded none this version reads).
pub(crate) fn sessions_of(meta: &SnapshotMeta) -> Vec<SessionState> {
    let Some(sessions) = meta.context.get("sessions") else {
        return Vec::new();
    };
    serde_json::from_value(sessions.clone()).unwrap_or_else(|e| {
        tracing::warn!(snapshot = %meta.id, "its recorded sessions do not read ({e}): none is started again");
        Vec::new()
    })
}

/// Starts again, in `inst` (a fork or a restore of snapshot `meta`), the sessions `meta`
/// recorded, each in its cwd (or the default one, if that is gone) with its variables.
/// Best effort: a session that cannot start is logged, not fatal.
pub(crate) async fn start_sessions(inst: &Instance, meta: &SnapshotMeta, limits: &Limits) {
    for state in sessions_of(meta) {
        let opts = SessionOptions {
            id: Some(state.id.clone()),
            cwd: Some(state.cwd.clone()),
            env: state.env.clone(),
        };
        let started = match inst.create_session(opts.clone(), limits).await {
            Err(RuntimeError::SessionExists { .. }) => continue,
            Err(_) => {
                let opts = SessionOptions { cwd: None, ..opts };
                inst.create_session(opts, limits).await
            }
            ok => ok,
        };
        if let Err(e) = started {
            tracing::warn!(session = %state.id, "restarting a snapshot's session: {e}");
        }
    }
}

/// Opens the snapshot store of `state_dir`, sweeping what a killed runtime left half-made.
pub(crate) fn store(state_dir: &Path) -> Result<SnapshotStore, RuntimeError> {
    SnapshotStore::open(state_dir).map_err(RuntimeError::Branch)
}

/// Takes a snapshot of `inst`'s branch: pauses its processes, copies the upper, resumes
/// them (also when the copy fails).
pub(crate) fn take(
    inst: &Instance,
    store: &SnapshotStore,
    sandbox: &str,
    name: Option<String>,
    context: Recorded<'_>,
    limits: SnapshotLimits,
    include_tmp: bool,
) -> Result<SnapshotInfo, RuntimeError> {
    if let Some(n) = &name {
        if n.len() > MAX_SNAPSHOT_NAME || n.chars().any(char::is_control) {
            return Err(RuntimeError::invalid(
                "name",
                format!("at most {MAX_SNAPSHOT_NAME} bytes, no control characters"),
            ));
        }
    }
    let branch = lock(&inst.branch);
    let Some(branch) = branch.as_ref() else {
        return Err(RuntimeError::NoWorkdir {
            id: sandbox.to_owned(),
        });
    };
    let mut scratch = Vec::new();
    if include_tmp {
        let root = inst.agent_root().ok_or_else(|| {
            RuntimeError::internal("the sandbox's /tmp cannot be reached through /proc")
        })?;
        scratch.push((TMP.to_owned(), root.join("tmp")));
    }
    let new = NewSnapshot {
        scratch,
        name,
        parent: inst.base.clone(),
        workdir: branch.workdir().to_owned(),
        base_ctime: branch.meta().base_ctime,
        context: serde_json::json!({
            "sandbox": sandbox,
            "spec": crate::record::spec_json(context.spec),
            "sessions": context.sessions,
        }),
        limits,
    };
    let started = Instant::now();
    let frozen = inst.freeze(FREEZE_TIMEOUT).map_err(|e| {
        RuntimeError::internal(format!(
            "pausing the sandbox's processes for a snapshot: {e}"
        ))
    })?;
    let processes = frozen
        .as_ref()
        .map_or(0, lockbox_confine::Frozen::processes);
    let mut frozen = Some(frozen);
    let mut paused = None;
    // The processes go on as soon as the copy is whole; it is made durable after.
    let made = store.capture_then(&branch.upper_dir(), new, || {
        drop(frozen.take());
        paused = Some(started.elapsed());
    });
    drop(frozen);
    let meta = made.map_err(|e| limit_error(e, limits))?;
    tracing::debug!(
        snapshot = %meta.id,
        processes,
        paused_us = paused.unwrap_or_default().as_micros() as u64,
        total_us = started.elapsed().as_micros() as u64,
        "snapshot taken"
    );
    Ok(info(meta))
}

/// A snapshot refused by one of the `limits`, as `LIMIT_REACHED` naming the setting;
/// other errors as they are.
pub(crate) fn limit_error(e: CowError, limits: SnapshotLimits) -> RuntimeError {
    let CowError::SnapshotLimit { limit, .. } = e else {
        return RuntimeError::Branch(e);
    };
    let (what, max) = match limit {
        SnapshotLimit::Bytes => ("max_snapshot_bytes", limits.max_bytes),
        SnapshotLimit::Entries => ("max_snapshot_entries", limits.max_entries),
    };
    RuntimeError::LimitReached {
        what: format!(
            "{what} (this snapshot would take all snapshots beyond it; nothing of it was kept)"
        ),
        limit: max.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX)),
    }
}

/// The spec of the sandbox snapshot `meta` was taken of (as recorded then), without its
/// own origin: what a fork of it starts with. A record without one (or that this version
/// cannot read) gives the default policy over the snapshot's workdir.
pub(crate) fn spec_of(meta: &SnapshotMeta) -> SandboxSpec {
    let recorded = meta.context.get("spec");
    let mut spec = recorded
        .and_then(|s| crate::record::spec_from_json(s.clone()))
        .unwrap_or_else(|| {
            if recorded.is_some() {
                tracing::warn!(snapshot = %meta.id, "its recorded spec does not read: a fork of it starts with the default policy");
            }
            SandboxSpec::default()
        });
    spec.workdir = Some(meta.workdir.clone());
    spec.from_snapshot = None;
    spec
}

/// Checks a sandbox's `workdir` against the one of the snapshot it starts from, or sets it.
pub(crate) fn check_workdir(
    meta: &SnapshotMeta,
    workdir: &mut Option<PathBuf>,
) -> Result<(), RuntimeError> {
    match workdir {
        None => *workdir = Some(meta.workdir.clone()),
        Some(w) if *w == meta.workdir => {}
        Some(w) => {
            return Err(RuntimeError::invalid(
                "workdir",
                format!(
                    "{} is not the workdir of snapshot {} ({}); leave it out to use that one",
                    w.display(),
                    meta.id,
                    meta.workdir.display()
                ),
            ))
        }
    }
    if !meta.workdir.is_dir() {
        return Err(RuntimeError::invalid(
            "from_snapshot",
            format!(
                "the workdir of snapshot {}, {}, is no longer a directory",
                meta.id,
                meta.workdir.display()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn parse_id(id: &str) -> Result<SnapshotId, RuntimeError> {
    SnapshotId::parse(id).map_err(RuntimeError::Branch)
}

pub(crate) fn info(m: SnapshotMeta) -> SnapshotInfo {
    SnapshotInfo {
        sandbox: m
            .context
            .get("sandbox")
            .and_then(|s| s.as_str())
            .map(|s| SandboxId::from(s.to_owned())),
        id: m.id,
        name: m.name,
        parent: m.parent,
        workdir: m.workdir,
        created_at: lockbox_policy::time::from_unix(
            m.created.secs,
            u32::try_from(m.created.nanos).unwrap_or(0),
        ),
        bytes: m.bytes,
        entries: m.entries,
    }
}

/// What [`Runtime::diff_snapshot`] compares a snapshot with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffTarget {
    /// The workdir as it is now: the snapshot's own changes against it.
    Workdir,
    /// Another snapshot of the same workdir: what turns the first into it.
    Snapshot(String),
    /// A running sandbox of the same workdir, as it is now: what turns the snapshot into it.
    Sandbox(String),
}

impl Runtime {
    /// Snapshots sandbox `id` and forks `count` sandboxes from that snapshot
    /// ([`Runtime::fork_snapshot`]): the snapshot, and the forks.
    pub async fn fork_sandbox(
        &self,
        id: &str,
        count: usize,
        opts: SnapshotOptions,
    ) -> Result<(SnapshotInfo, Vec<SandboxInfo>), RuntimeError> {
        let sandbox = self.sandbox(id)?;
        let snapshot = sandbox.snapshot_with(opts).await?;
        // The forks of a live sandbox get the values it was given (an in-process caller's
        // own credentials too), which its record does not hold.
        let given = sandbox.inner.spec.credentials.clone();
        let forks = self.fork_with(snapshot.id.as_str(), count, given).await?;
        Ok((snapshot, forks))
    }

    /// The changes from snapshot `from` to `to`, sorted by path (see [`DiffTarget`];
    /// `lockbox_cow::diff_views`). `INVALID_REQUEST` if `to` has another workdir.
    pub async fn diff_snapshot(
        &self,
        from: &str,
        to: DiffTarget,
    ) -> Result<Vec<Change>, RuntimeError> {
        let store = self.inner.snapshots.clone();
        let from = parse_id(from)?;
        let meta = store.get(&from).map_err(RuntimeError::Branch)?;
        let other_workdir = |w: &Path, what: &str| {
            RuntimeError::invalid(
                "to",
                format!(
                    "{what} sees the workdir {}, snapshot {from} {}: no diff between them",
                    w.display(),
                    meta.workdir.display()
                ),
            )
        };
        match to {
            DiffTarget::Workdir => {
                spawn(move || {
                    let view = store.view(&from)?;
                    Ok(lockbox_cow::ChangeSet::compute(view.path(), &meta.workdir)?
                        .changes()
                        .to_vec())
                })
                .await
            }
            DiffTarget::Snapshot(to) => {
                let to = parse_id(&to)?;
                let to_meta = store.get(&to).map_err(RuntimeError::Branch)?;
                if to_meta.workdir != meta.workdir {
                    return Err(other_workdir(&to_meta.workdir, &format!("snapshot {to}")));
                }
                spawn(move || {
                    let a = store.view(&from)?;
                    let b = store.view(&to)?;
                    lockbox_cow::diff_views(a.path(), b.path(), &meta.workdir)
                })
                .await
            }
            DiffTarget::Sandbox(id) => {
                let sb = self.sandbox(&id)?;
                let inst = sb.inner.instance();
                let workdir = sb.inner.spec.workdir.clone();
                match workdir {
                    Some(w) if w == meta.workdir => {}
                    Some(w) => return Err(other_workdir(&w, &format!("sandbox {id}"))),
                    None => return Err(RuntimeError::NoWorkdir { id }),
                }
                spawn(move || {
                    let a = store.view(&from)?;
                    let branch = lock(&inst.branch);
                    let Some(branch) = branch.as_ref() else {
                        return Ok(Vec::new());
                    };
                    let b = branch.view()?;
                    lockbox_cow::diff_views(a.path(), b.path(), &meta.workdir)
                })
                .await
            }
        }
    }
}

/// Runs `f` on a blocking thread.
async fn spawn<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, lockbox_cow::CowError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(RuntimeError::Task)?
        .map_err(crate::workspace::cow_error)
}
