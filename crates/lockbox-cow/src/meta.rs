//! `meta.json`: the durable record of a branch.
//!
//! On disk: `{"format_version": 1, "checksum": "crc32:XXXXXXXX", "meta": {...}}` where the
//! checksum is a CRC-32 (IEEE) of the canonical JSON of `meta` (serde_json with sorted object
//! keys). Written temp + fsync + rename + fsync of the directory, except when a branch is
//! created (see [`crate::Branch::create`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(crate) use crate::durable::Durability;
use crate::{durable, BranchId, CowError, SandboxInit};

/// The current `meta.json` format version.
pub const META_FORMAT_VERSION: u32 = 1;
pub(crate) const META_FILE: &str = "meta.json";

/// A point in time as seconds and nanoseconds since the Unix epoch (a file timestamp or a
/// wall-clock reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp {
    /// Seconds since the epoch.
    pub secs: i64,
    /// Nanoseconds within the second.
    pub nanos: i64,
}

/// Where a branch is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchState {
    /// Created; a sandbox may be writing into it (or its owner died: see
    /// [`crate::ListedBranch::is_orphan`]).
    Active,
    /// Kept for review (`--on-exit keep`).
    Kept,
    /// A commit started. If lockbox died during it, committing again finishes the job
    /// (the stale-base check is skipped then, as the half-applied commit itself changed the
    /// workdir). A commit that failed part-way stays here, with its `failure`.
    Committing,
    /// A commit was refused: the workdir changed, since the branch began, at paths it
    /// writes (exit 5; `failure` names them). Kept for review: commit it with `force`, or
    /// abort it.
    Stale,
    /// A commit failed before changing the workdir (`failure` says why); kept to be
    /// committed again or aborted.
    CommitFailed,
}

impl BranchState {
    /// The lowercase name used in messages (`active`, `kept`, ..., as in `meta.json`).
    pub fn name(self) -> &'static str {
        match self {
            BranchState::Active => "active",
            BranchState::Kept => "kept",
            BranchState::Committing => "committing",
            BranchState::Stale => "stale",
            BranchState::CommitFailed => "commit_failed",
        }
    }
}

/// What `meta.json` records about a branch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchMeta {
    /// The branch id (also its directory name).
    pub id: BranchId,
    /// The workdir (lower layer), canonicalised at creation.
    #[serde(with = "lockbox_policy::name::json")]
    pub workdir: PathBuf,
    /// Wall-clock creation time.
    pub created: Timestamp,
    /// The stale-base reference: the ctime the kernel gave the branch's `upper/` directory
    /// when it was made. Any later change to a workdir entry gets a ctime `>=` this.
    pub base_ctime: Timestamp,
    /// Where the branch is in its life.
    pub state: BranchState,
    /// The pid of the process that created the branch (for orphan detection).
    pub owner_pid: u32,
    /// The init of the sandbox last started on the branch, recorded before that sandbox
    /// could write into it (see [`crate::Branch::record_sandbox`]): the branch is an orphan
    /// only once this process is gone too. `None` for a branch no sandbox was started on,
    /// and in records older than the field (then only `owner_pid` decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_init: Option<SandboxInit>,
    /// Opaque caller data: typically the policy and the command that made the branch.
    pub context: serde_json::Value,
    /// Why the last commit failed (states `stale`, `commit_failed`, `committing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The paths partial commits of this branch wrote, sorted by path, each with its own
    /// stale-base reference (see `stale.rs`): taken after the commit, so that the commit's
    /// own writes do not look like concurrent edits at the next commit. Empty for a branch
    /// never committed in part (and then not written: older records read the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rebased: Vec<Rebased>,
    /// For a fork of a snapshot: the snapshot's layers, top first, between the branch's
    /// upper and the workdir (`lowerdir=LAYERS:WORKDIR`). The branch's changes are those of
    /// its upper and these layers together. Empty for a branch of the workdir itself (and
    /// then not written: older records read the same).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "lockbox_policy::name::json::vec"
    )]
    pub layers: Vec<PathBuf>,
}

/// A path a partial commit wrote, and its stale-base reference from then on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebased {
    /// Relative to the workdir.
    #[serde(with = "lockbox_policy::name::json")]
    pub path: PathBuf,
    /// Taken right after the commit that wrote it.
    pub at: Timestamp,
}

#[derive(Serialize, Deserialize)]
struct MetaFile {
    format_version: u32,
    checksum: String,
    meta: serde_json::Value,
}

/// CRC-32 (IEEE) of `bytes`: the checksum of lockbox's durable records.
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

fn checksum_of(meta: &serde_json::Value) -> Result<String, serde_json::Error> {
    Ok(format!("crc32:{:08x}", crc32(&serde_json::to_vec(meta)?)))
}

/// Writes `meta` into `branch_dir/meta.json`, replacing it atomically; `Durable`: fsynced
/// (file and directory).
pub(crate) fn write(
    branch_dir: &Path,
    meta: &BranchMeta,
    durability: Durability,
) -> Result<(), CowError> {
    let path = branch_dir.join(META_FILE);
    let err = |source| CowError::WriteMeta {
        path: path.clone(),
        source,
    };
    let json = (|| {
        let value = serde_json::to_value(meta)?;
        let file = MetaFile {
            format_version: META_FORMAT_VERSION,
            checksum: checksum_of(&value)?,
            meta: value,
        };
        serde_json::to_vec_pretty(&file)
    })()
    .map_err(|e| err(e.into()))?;
    match durability {
        Durability::Durable => durable::write_atomic(branch_dir, META_FILE, &json),
        Durability::Lazy => durable::write_replace(branch_dir, META_FILE, &json),
    }
    .map_err(err)
}

/// Reads and verifies `branch_dir/meta.json`.
pub(crate) fn read(branch_dir: &Path) -> Result<BranchMeta, CowError> {
    let path = branch_dir.join(META_FILE);
    let bytes = std::fs::read(&path).map_err(|source| CowError::ReadMeta {
        path: path.clone(),
        source,
    })?;
    BranchMeta::decode(&path, &bytes)
}

impl BranchMeta {
    /// Decodes and verifies the bytes of a branch's `meta.json` (format version, checksum,
    /// fields); `path` only names the file in errors. Any damage is
    /// [`CowError::CorruptMeta`], never a panic (fuzzed: `fuzz/fuzz_targets/branch_meta.rs`).
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<BranchMeta, CowError> {
        let corrupt = |reason: String| CowError::CorruptMeta {
            path: path.to_owned(),
            reason,
        };
        let file: MetaFile = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        if file.format_version != META_FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {} (this lockbox reads {META_FORMAT_VERSION})",
                file.format_version
            )));
        }
        let sum = checksum_of(&file.meta).map_err(|e| corrupt(e.to_string()))?;
        if sum != file.checksum {
            return Err(corrupt(format!(
                "checksum mismatch: recorded {}, computed {sum}",
                file.checksum
            )));
        }
        serde_json::from_value(file.meta).map_err(|e| corrupt(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_reference() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn round_trip_and_tamper_detection() {
        let dir = tempfile::tempdir().unwrap();
        let meta = BranchMeta {
            id: BranchId::parse("b1").unwrap(),
            workdir: "/x".into(),
            created: Timestamp { secs: 1, nanos: 2 },
            base_ctime: Timestamp { secs: 3, nanos: 4 },
            state: BranchState::Active,
            owner_pid: 7,
            sandbox_init: Some(SandboxInit {
                pid: 8,
                start_time: 9,
            }),
            context: serde_json::json!({"command": ["sh", "-c", "true"], "z": 1.5, "a": null}),
            failure: None,
            rebased: vec![Rebased {
                path: "a/b".into(),
                at: Timestamp { secs: 5, nanos: 6 },
            }],
            layers: vec!["/state/snapshots/s1/layer".into()],
        };
        write(dir.path(), &meta, Durability::Durable).unwrap();
        assert_eq!(read(dir.path()).unwrap(), meta);
        let p = dir.path().join(META_FILE);
        let text = std::fs::read_to_string(&p).unwrap().replace("/x", "/y");
        std::fs::write(&p, text).unwrap();
        let err = read(dir.path()).unwrap_err();
        assert_eq!(err.code(), "CORRUPT_BRANCH_META", "{err}");
    }

    #[test]
    fn a_record_without_a_sandbox_init_reads_as_older_lockboxes_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let meta = BranchMeta {
            id: BranchId::parse("b1").unwrap(),
            workdir: "/x".into(),
            created: Timestamp { secs: 1, nanos: 2 },
            base_ctime: Timestamp { secs: 3, nanos: 4 },
            state: BranchState::Active,
            owner_pid: 7,
            sandbox_init: None,
            context: serde_json::Value::Null,
            failure: None,
            rebased: Vec::new(),
            layers: Vec::new(),
        };
        write(dir.path(), &meta, Durability::Durable).unwrap();
        let text = std::fs::read_to_string(dir.path().join(META_FILE)).unwrap();
        assert!(!text.contains("sandbox_init"), "{text}");
        assert_eq!(read(dir.path()).unwrap(), meta);
    }
}
