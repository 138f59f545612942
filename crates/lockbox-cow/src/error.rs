//! The crate's error type: one variant per failed step, each naming the path or id involved.
//!
//! Paths are shown quoted where they hold control characters or bytes that are not UTF-8
//! (`lockbox_policy::name::quoted`): a name the sandbox chose cannot forge a message.
//!
//! Library code classifies ([`CowError::code`], [`CowError::exit_code`]); front ends map once.

use std::io;
use std::path::PathBuf;

use lockbox_policy::name::quoted;
use lockbox_policy::ErrorCode;

/// Everything that can go wrong in `lockbox-cow`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CowError {
    /// A branch id failed validation.
    #[error("invalid branch id {id:?}: {reason}")]
    InvalidBranchId {
        /// The rejected text.
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A snapshot id (or the name of a hold) failed validation.
    #[error("invalid snapshot id {id:?}: {reason}")]
    InvalidSnapshotId {
        /// The rejected text.
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// No snapshot has this id.
    #[error("no snapshot {id}")]
    SnapshotNotFound {
        /// The id asked for.
        id: String,
    },
    /// A snapshot still used (held by forks, or stacked on by other snapshots) cannot be
    /// deleted.
    #[error("snapshot {id} is in use (held by: {}; snapshots on it: {}): delete those first", names(.holders), names(.children))]
    SnapshotInUse {
        /// The snapshot.
        id: String,
        /// Names holding it (forks' ids).
        holders: Vec<String>,
        /// Snapshots stacked on it.
        children: Vec<String>,
    },
    /// A new snapshot would take the store beyond one of its [`crate::SnapshotLimits`]:
    /// nothing of it is kept.
    #[error("the snapshot of {} would take the snapshots beyond their {limit} limit", quoted(.path))]
    SnapshotLimit {
        /// Which limit.
        limit: crate::SnapshotLimit,
        /// The tree being copied (the layer the snapshot was taken of).
        path: PathBuf,
    },
    /// Making, reading or removing a snapshot failed.
    #[error("snapshot {}: {source}", quoted(.path))]
    Snapshot {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The state directory (or its `branches/` subdirectory) could not be created or opened.
    #[error("state dir {}: {source}", quoted(.path))]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A branch directory (or its `upper/` / `work/`) could not be created.
    #[error("create branch dir {}: {source}", quoted(.path))]
    CreateBranchDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// No branch with this id exists in the state directory.
    #[error("branch {id} not found in {}", quoted(.path))]
    BranchNotFound {
        /// The id looked up.
        id: String,
        /// The `branches/` directory searched.
        path: PathBuf,
    },
    /// The workdir could not be resolved or opened.
    #[error("workdir {}: {source}", quoted(.path))]
    OpenWorkdir {
        /// The workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The per-workdir commit lock could not be taken.
    #[error("workdir lock {}: {source}", quoted(.path))]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Copying a bounded upper layer into the branch failed.
    #[error("importing upper layer entry {}: {source}", quoted(.path))]
    ImportUpper {
        /// The entry, in the source layer.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The workdir given to commit is not the one the branch was made from.
    #[error("branch was made from {}, not {}", quoted(.expected), quoted(.given))]
    WorkdirMismatch {
        /// The workdir recorded in the branch.
        expected: PathBuf,
        /// The workdir passed in.
        given: PathBuf,
    },
    /// The state directory and the workdir overlap: overlayfs refuses overlapping layers
    /// (`ELOOP`), and a commit would copy the branch into itself.
    #[error("state dir {} and workdir {} overlap; put the state dir elsewhere", quoted(.state), quoted(.workdir))]
    Overlap {
        /// The state directory.
        state: PathBuf,
        /// The workdir.
        workdir: PathBuf,
    },
    /// Writing `meta.json` (temp file, fsync, rename, directory fsync) failed.
    #[error("write branch meta {}: {source}", quoted(.path))]
    WriteMeta {
        /// The meta file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading `meta.json` failed.
    #[error("read branch meta {}: {source}", quoted(.path))]
    ReadMeta {
        /// The meta file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// `meta.json` is not valid, has the wrong checksum or an unknown format version.
    #[error("corrupt branch meta {}: {reason}", quoted(.path))]
    CorruptMeta {
        /// The meta file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Removing a branch directory failed.
    #[error("remove branch {}: {source}", quoted(.path))]
    RemoveBranch {
        /// The branch directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Listing the branches of a state directory failed.
    #[error("list branches in {}: {source}", quoted(.path))]
    ListBranches {
        /// The `branches/` directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading the upper layer (the branch) failed.
    #[error("read branch entry {}: {source}", quoted(.path))]
    ReadUpper {
        /// The path inside the upper layer.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading the lower layer (the workdir) failed.
    #[error("read workdir entry {}: {source}", quoted(.path))]
    ReadLower {
        /// The path inside the workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The branch holds devices, FIFOs or sockets; nothing was applied.
    #[error(
        "branch holds special files (devices, fifos or sockets), nothing applied: {}",
        list(paths)
    )]
    SpecialFiles {
        /// The offending paths, relative to the workdir.
        paths: Vec<PathBuf>,
    },
    /// The branch holds a name lockbox reserves for its own staging; nothing was applied.
    #[error("branch uses reserved name {}, nothing applied", quoted(.path))]
    ReservedName {
        /// The offending path.
        path: PathBuf,
    },
    /// Paths the branch changes were changed in the workdir after the branch began.
    #[error(
        "stale base: changed in the workdir since the branch began: {}",
        list(paths)
    )]
    StaleBase {
        /// The paths changed on both sides, relative to the workdir.
        paths: Vec<PathBuf>,
    },
    /// A commit that follows a review would write paths the review did not show as they are
    /// now (changed since, or added after it; see `review.rs`); nothing was applied.
    #[error(
        "stale review: {}; nothing applied, review the branch again",
        if paths.is_empty() { "the branch's changes are no longer the listing reviewed (its review token differs)".to_owned() } else { format!("changed since the review, or not shown in it: {}", list(paths)) }
    )]
    StaleReview {
        /// The paths, relative to the workdir.
        paths: Vec<PathBuf>,
    },
    /// The committing user may not change a workdir directory as the commit must (write or
    /// search it, remove it with its contents, or set its mode); nothing was applied.
    #[error(
        "workdir directory {path} cannot be changed as the commit needs, nothing applied: {source}"
    )]
    WorkdirPermission {
        /// The directory, relative to the workdir.
        path: PathBuf,
        /// The underlying error (`EACCES`, or `EPERM` for a directory of another user).
        source: io::Error,
    },
    /// Resolving a path beneath the workdir failed (for example because a component is a
    /// symlink, which commit never follows).
    #[error("resolve {} beneath the workdir: {source}", quoted(.path))]
    ResolveBeneath {
        /// The path, relative to the workdir.
        path: PathBuf,
        /// The underlying error (`ELOOP` for a symlink, `EXDEV` for an escape).
        source: io::Error,
    },
    /// Creating or filling the staging area failed.
    #[error("stage {}: {source}", quoted(.path))]
    Stage {
        /// The path being staged, relative to the workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// `syncfs` failed.
    #[error("syncfs on {}: {source}", quoted(.path))]
    SyncFs {
        /// The directory whose filesystem was synced.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Renaming a staged file into place failed.
    #[error("rename into {}: {source}", quoted(.path))]
    Rename {
        /// The destination, relative to the workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Creating a directory failed.
    #[error("mkdir {}: {source}", quoted(.path))]
    Mkdir {
        /// The directory, relative to the workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Deleting a file or a directory tree failed.
    #[error("delete {}: {source}", quoted(.path))]
    Delete {
        /// The path, relative to the workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Setting a mode or timestamps failed.
    #[error("set mode/times of {}: {source}", quoted(.path))]
    SetMeta {
        /// The path, relative to the workdir.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Fsyncing a directory failed.
    #[error("fsync {}: {source}", quoted(.path))]
    Fsync {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The upper layer uses an overlayfs feature the change set cannot represent
    /// (`metacopy`: the data stays in the lower file; `redirect`: a renamed directory).
    #[error("branch entry {} uses overlayfs {feature}, which lockbox does not support (mount without it)", quoted(.path))]
    UnsupportedOverlay {
        /// The path inside the upper layer.
        path: PathBuf,
        /// `metacopy` or `redirect`.
        feature: &'static str,
    },
    /// The path asked for in a diff is not one the branch changes.
    #[error("branch {id} does not change {}", quoted(.path))]
    NotChanged {
        /// The branch.
        id: String,
        /// The path asked for, relative to the workdir.
        path: PathBuf,
    },
    /// A hunk number in a commit selection that the file's diff does not have.
    #[error("{}: no hunk {index} (the diff has {count}{})", quoted(.path), if *.count == 0 { ": binary, unchanged or not a regular file" } else { "" })]
    BadHunk {
        /// The file, relative to the workdir.
        path: PathBuf,
        /// The number asked for.
        index: usize,
        /// How many hunks the file's diff has (numbered from 0).
        count: usize,
    },
    /// A partial commit of a branch whose full commit was interrupted: finish that first.
    #[error("branch {id} has a commit interrupted part-way: finish it with `lockbox branch commit {id}` before committing part of it")]
    BranchCommitting {
        /// The branch.
        id: String,
    },
    /// A partial commit of this branch that was interrupted after its commit point (a crash,
    /// or an error while applying) was finished first: its paths are in the workdir now, so
    /// the branch's diff and its hunk numbers changed; nothing else was committed.
    #[error("branch {id}: a partial commit interrupted part-way was finished first ({paths} path(s) written); nothing else was committed: the branch's diff changed, review it again and commit")]
    PartCommitFinished {
        /// The branch.
        id: String,
        /// How many paths that commit wrote.
        paths: usize,
    },
    /// The path asked for in a diff is not a plain relative path.
    #[error("bad path {}: must be relative, without `..`", quoted(.path))]
    BadPath {
        /// The rejected path.
        path: PathBuf,
    },
}

fn list(paths: &[PathBuf]) -> String {
    const SHOWN: usize = 20;
    let mut s = paths
        .iter()
        .take(SHOWN)
        .map(|p| quoted(p).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        s.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    s
}

impl CowError {
    /// A stable, `SCREAMING_SNAKE` code for the wire (HTTP, JSON reports).
    pub fn code(&self) -> ErrorCode {
        match self {
            CowError::InvalidBranchId { .. } => ErrorCode::InvalidBranchId,
            CowError::InvalidSnapshotId { .. } => ErrorCode::InvalidSnapshotId,
            CowError::SnapshotNotFound { .. } => ErrorCode::SnapshotNotFound,
            CowError::SnapshotInUse { .. } => ErrorCode::SnapshotInUse,
            CowError::Snapshot { .. } => ErrorCode::SnapshotStore,
            CowError::SnapshotLimit { .. } => ErrorCode::LimitReached,
            CowError::StateDir { .. } => ErrorCode::StateDir,
            CowError::CreateBranchDir { .. } => ErrorCode::CreateBranchDir,
            CowError::BranchNotFound { .. } => ErrorCode::BranchNotFound,
            CowError::OpenWorkdir { .. } => ErrorCode::OpenWorkdir,
            CowError::ImportUpper { .. } => ErrorCode::ImportUpper,
            CowError::Lock { .. } => ErrorCode::WorkdirLock,
            CowError::WorkdirMismatch { .. } => ErrorCode::WorkdirMismatch,
            CowError::Overlap { .. } => ErrorCode::StateWorkdirOverlap,
            CowError::WriteMeta { .. } => ErrorCode::WriteBranchMeta,
            CowError::ReadMeta { .. } => ErrorCode::ReadBranchMeta,
            CowError::CorruptMeta { .. } => ErrorCode::CorruptBranchMeta,
            CowError::RemoveBranch { .. } => ErrorCode::RemoveBranch,
            CowError::ListBranches { .. } => ErrorCode::ListBranches,
            CowError::ReadUpper { .. } => ErrorCode::ReadBranchEntry,
            CowError::ReadLower { .. } => ErrorCode::ReadWorkdirEntry,
            CowError::SpecialFiles { .. } => ErrorCode::SpecialFiles,
            CowError::ReservedName { .. } => ErrorCode::ReservedName,
            CowError::StaleBase { .. } => ErrorCode::StaleBase,
            CowError::StaleReview { .. } => ErrorCode::StaleReview,
            CowError::WorkdirPermission { .. } => ErrorCode::WorkdirPermission,
            CowError::ResolveBeneath { .. } => ErrorCode::ResolveBeneath,
            CowError::Stage { .. } => ErrorCode::CommitStage,
            CowError::SyncFs { .. } => ErrorCode::CommitSyncfs,
            CowError::Rename { .. } => ErrorCode::CommitRename,
            CowError::Mkdir { .. } => ErrorCode::CommitMkdir,
            CowError::Delete { .. } => ErrorCode::CommitDelete,
            CowError::SetMeta { .. } => ErrorCode::CommitSetMeta,
            CowError::Fsync { .. } => ErrorCode::Fsync,
            CowError::UnsupportedOverlay { .. } => ErrorCode::UnsupportedOverlay,
            CowError::BadPath { .. } => ErrorCode::BadPath,
            CowError::NotChanged { .. } => ErrorCode::NotChanged,
            CowError::BadHunk { .. } => ErrorCode::BadHunk,
            CowError::BranchCommitting { .. } => ErrorCode::BranchCommitting,
            CowError::PartCommitFinished { .. } => ErrorCode::PartCommitFinished,
        }
    }

    /// The process exit code a front end should use: 5 for a stale base or review, 2 for a bad id or
    /// path (usage), 4 for every other failure (commit/branch operation failed).
    pub fn exit_code(&self) -> u8 {
        match self {
            CowError::StaleBase { .. } | CowError::StaleReview { .. } => 5,
            CowError::InvalidBranchId { .. }
            | CowError::InvalidSnapshotId { .. }
            | CowError::SnapshotNotFound { .. }
            | CowError::BranchNotFound { .. }
            | CowError::BadPath { .. }
            | CowError::NotChanged { .. }
            | CowError::BadHunk { .. } => 2,
            _ => 4,
        }
    }
}

fn names(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}
