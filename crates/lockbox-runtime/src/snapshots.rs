//! Snapshots of a running sandbox's files: its processes are paused
//! (`lockbox_confine::freeze_tree`), its branch's upper layer is copied into the snapshot
//! store (`lockbox_cow::SnapshotStore`), and its processes go on. Processes' memory is not
//! part of a snapshot: that needs `CAP_CHECKPOINT_RESTORE` (CRIU), which lockbox does not
//! ask for.
//!
//! Forks and restores (overlays of a fresh upper on a snapshot's layers) are the next step
//! of issue 18; this module takes, lists and deletes snapshots.

use std::path::Path;
use std::time::{Duration, Instant};

use lockbox_cow::{NewSnapshot, SnapshotId, SnapshotMeta, SnapshotStore};

use crate::sandbox::{lock, Instance};
use crate::types::SnapshotInfo;
use crate::util::rfc3339;
use crate::RuntimeError;

/// Longest the processes of a sandbox may take to stop (a process in uninterruptible sleep
/// on a hung filesystem does not stop).
const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a snapshot's name may be.
pub const MAX_SNAPSHOT_NAME: usize = 256;

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
    context: serde_json::Value,
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
    let new = NewSnapshot {
        name,
        parent: None,
        workdir: branch.workdir().to_owned(),
        base_ctime: branch.meta().base_ctime,
        context: serde_json::json!({ "sandbox": sandbox, "spec": context }),
    };
    let started = Instant::now();
    let frozen = inst.freeze(FREEZE_TIMEOUT).map_err(|e| {
        RuntimeError::internal(format!(
            "pausing the sandbox's processes for a snapshot: {e}"
        ))
    })?;
    let made = store.capture(&branch.upper_dir(), new);
    let processes = frozen
        .as_ref()
        .map_or(0, lockbox_confine::Frozen::processes);
    drop(frozen);
    let meta = made.map_err(RuntimeError::Branch)?;
    tracing::debug!(
        snapshot = %meta.id,
        processes,
        paused_us = started.elapsed().as_micros() as u64,
        "snapshot taken"
    );
    Ok(info(meta))
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
            .map(String::from),
        id: m.id.to_string(),
        name: m.name,
        parent: m.parent.map(|p| p.to_string()),
        workdir: m.workdir,
        created_at: rfc3339(m.created.secs, u32::try_from(m.created.nanos).unwrap_or(0)),
        bytes: m.bytes,
        entries: m.entries,
    }
}
