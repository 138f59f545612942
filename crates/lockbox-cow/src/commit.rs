//! [`commit`]: applies a branch's change set to the real workdir, safely and durably.
//!
//! Algorithm (crash argument in `docs/cow.md`):
//! 1. **Validate** (nothing written): walk the whole change set; list FIFOs and sockets as
//!    skipped ([`SkipReason`]); refuse devices and reserved names; refuse workdir directories the apply step could not write, search or
//!    empty (see [`WorkdirCheck`]); collect stale paths (see [`crate::stale`]) and refuse
//!    unless `force`. A dry run stops here.
//! 2. Mark the branch `Committing` in `meta.json` (durable, and the branch with it: a new
//!    branch is not, see [`Branch::create`]).
//! 3. **Stage**: copy every new file and symlink into `DIR/.lockbox-commit-<id>/` (same
//!    filesystem as DIR, so the later `rename(2)` is atomic), with mode and times set, holes
//!    kept ([`crate::data`]); then one `syncfs(2)`: all new data is durable before any of it
//!    becomes visible. (Up to [`SMALL`] changes, each staged file is fsynced instead:
//!    `syncfs` also flushes other processes' dirty data, which dominates a small commit on a
//!    busy disk.) A failure here removes the staging directory and gives the branch its state
//!    back: nothing was applied.
//! 4. **Apply** in change-set order (parents first): `renameat` staged entries over their
//!    targets, `mkdirat` new directories (mode 0700 for now), remove deleted entries and
//!    trees. Each parent is resolved one component at a time with `openat2(RESOLVE_BENEATH |
//!    RESOLVE_NO_SYMLINKS)` ([`DirCursor`]: no path is ever passed whole, so paths longer
//!    than `PATH_MAX` work), and the last component is only touched by calls that do not
//!    follow it, so no symlink (in DIR or in the branch) can make a commit write outside DIR.
//! 5. Remove the staging directory, set directory modes and mtimes deepest first (last of
//!    all, so a mode such as 000 the sandbox left forbids nothing the commit still does),
//!    `syncfs` again (all renames, unlinks and directory updates durable, the staging
//!    directory's removal too; small commits fsync each touched directory and DIR, opened
//!    before their final modes are set). An empty change set writes nothing at all.
//!
//! Steps 1-5 run under the per-workdir commit lock ([`WorkdirLock`]).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::beneath::{self, lstat_at, remove_tree_at, split, DirCursor};
use crate::changes::{ChangeKind, FileType, Item, Walker};
use crate::data::copy_into;
use crate::lock::WorkdirLock;
use crate::meta::BranchState;
use crate::stale::Base;
use crate::{stale, Branch, CowError};

/// The prefix of the staging directory at the top of the workdir. A branch may not create a
/// top-level entry with this prefix.
pub const STAGING_PREFIX: &str = ".lockbox-commit-";

/// How to commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitOptions {
    /// Commit even if paths the branch changes were changed in the workdir since the branch
    /// began (their workdir edits are overwritten).
    pub force: bool,
    /// Validate and count only; write nothing.
    pub dry_run: bool,
    /// The caller exits right after (`lockbox run`): a small branch is set aside in
    /// `branches/.gone/` for a later creation to remove, instead of being removed before
    /// the commit returns (see [`crate::Branch::abort_before_exit`]).
    pub defer_removal: bool,
}

/// What a commit did (or, for a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommitReport {
    /// Paths added.
    pub added: u64,
    /// Paths modified.
    pub modified: u64,
    /// Paths deleted (a directory counts once).
    pub deleted: u64,
    /// Paths whose type changed.
    pub type_changed: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
    /// True if nothing was written.
    pub dry_run: bool,
    /// Stale paths overwritten because of `force`.
    #[serde(with = "lockbox_policy::name::json::vec")]
    pub forced_stale: Vec<PathBuf>,
    /// Entries of the branch left out: the workdir keeps what it has at those paths. (A
    /// boxed slice: this report is part of every transaction record, kept small.)
    #[serde(default, skip_serializing_if = "<[Skipped]>::is_empty")]
    pub skipped: Box<[Skipped]>,
}

/// An entry of the branch that a commit leaves out, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    /// The path relative to the workdir (in JSON as in [`crate::Change::path`]).
    #[serde(with = "lockbox_policy::name::json")]
    pub path: PathBuf,
    /// Why it was left out.
    pub reason: SkipReason,
}

/// Why a commit leaves an entry out: it cannot be committed meaningfully, and refusing the
/// whole commit for it (a build's leftover socket, a test's FIFO) would lose the real work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A named pipe: it holds no data, only a rendezvous for processes that have ended.
    Fifo,
    /// A unix socket: only the process that bound it could answer on it, and it has ended.
    Socket,
}

impl SkipReason {
    /// The reason for an entry of this type, if it is one a commit leaves out (devices are
    /// refused instead: [`CowError::SpecialFiles`]).
    pub(crate) fn of(file_type: rustix::fs::FileType) -> Option<SkipReason> {
        match file_type {
            rustix::fs::FileType::Fifo => Some(SkipReason::Fifo),
            rustix::fs::FileType::Socket => Some(SkipReason::Socket),
            _ => None,
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipReason::Fifo => "a FIFO holds no data to commit",
            SkipReason::Socket => "a socket is only meaningful to the process that bound it",
        })
    }
}

/// Applies `branch` to `workdir` (which must be the branch's own workdir). The branch is left
/// in place; [`Branch::commit`] also removes it.
///
/// Not atomic across paths: a crash in step 4 leaves some paths new and some old (each path
/// is whole, never torn) and the branch in state `Committing`; committing it again finishes
/// (and removes the staging directory and syncs even if nothing was left to apply).
pub fn commit(
    branch: &mut Branch,
    workdir: &Path,
    opts: &CommitOptions,
) -> Result<CommitReport, CowError> {
    let given = std::fs::canonicalize(workdir).map_err(|source| CowError::OpenWorkdir {
        path: workdir.to_owned(),
        source,
    })?;
    if given != branch.workdir() {
        return Err(CowError::WorkdirMismatch {
            expected: branch.workdir().to_owned(),
            given,
        });
    }
    let root = beneath::open_root(&given).map_err(|source| CowError::OpenWorkdir {
        path: given.clone(),
        source,
    })?;
    // STATE/branches/<id> -> STATE. Held until the commit is complete.
    let state_dir = branch.dir().ancestors().nth(2).unwrap_or(Path::new("/"));
    let _lock = WorkdirLock::acquire(state_dir, &given)?;
    let resuming = branch.meta().state == BranchState::Committing;
    let base = (!resuming).then_some(Base {
        at: branch.meta().base_ctime,
        rebased: &branch.meta().rebased,
    });
    let view = branch.view()?;
    let upper = view.path().to_owned();
    let mut report = validate(&upper, branch.workdir(), root.as_fd(), base, opts)?;
    if opts.dry_run {
        report.dry_run = true;
        return Ok(report);
    }
    let total = report.added + report.modified + report.deleted + report.type_changed;
    // A resumed commit always runs to the end, even with nothing left to apply: the
    // interrupted run may have left its staging directory, and its renames may not be durable.
    if total == 0 && !resuming {
        return Ok(report);
    }
    let prior = branch.meta().state;
    if !resuming {
        branch.set_state(BranchState::Committing)?;
    }
    let staging_name = format!("{STAGING_PREFIX}{}", branch.id());
    // Resumed: `syncfs`, since the operations the interrupted run already did are not in this
    // plan, so fsyncing only the directories it touches would not cover them.
    let staged = stage(
        &upper,
        branch.workdir(),
        root.as_fd(),
        OsStr::new(&staging_name),
        is_small(total) && !resuming,
    );
    let plan = match staged {
        Ok(plan) => plan,
        Err(e) => {
            // Nothing was applied and the staging directory is gone: the branch is as it
            // was, and committing it again starts afresh. (Best effort: the error that
            // matters is the one returned. A resumed commit stays `committing`: the
            // interrupted run may have applied part of it.)
            if !resuming {
                let _ = branch.set_state(prior);
            }
            return Err(e);
        }
    };
    apply(root.as_fd(), &plan, false)?;
    // Removed before `finish`, so that its fsyncs (or syncfs) make the removal durable with
    // the renames: one flush of DIR instead of two (issue 21). A crash before they return
    // leaves the branch `committing`, and committing it again stages and applies afresh:
    // a resumed commit needs nothing from the staging directory.
    remove_tree_at(root.as_fd(), OsStr::new(&staging_name)).map_err(|source| CowError::Delete {
        path: staging_name.clone().into(),
        source,
    })?;
    finish(root.as_fd(), &plan, Some(Path::new("")))?;
    Ok(report)
}

/// Step 1. `base` is the stale-base reference (`None`: skip the check, as when resuming).
pub(crate) fn validate(
    upper: &Path,
    workdir: &Path,
    root: BorrowedFd<'_>,
    base: Option<Base<'_>>,
    opts: &CommitOptions,
) -> Result<CommitReport, CowError> {
    let mut report = CommitReport::default();
    let (mut special, mut stale_paths, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    let mut access = WorkdirCheck::new(root);
    for item in Walker::new(upper, workdir)?.witnesses() {
        let item = item?;
        let c = &item.change;
        let stale = match base {
            Some(base) => stale::is_stale(root, &item, base)?,
            None => false,
        };
        if stale {
            stale_paths.push(c.path.clone());
        }
        // Written, but nothing to apply: there only for the stale-base check.
        if item.unchanged {
            continue;
        }
        access.check(&item)?;
        if c.path.components().count() == 1
            && c.path
                .as_os_str()
                .as_encoded_bytes()
                .starts_with(STAGING_PREFIX.as_bytes())
        {
            return Err(CowError::ReservedName {
                path: c.path.clone(),
            });
        }
        if c.kind != ChangeKind::Deleted {
            if let Some(reason) = item.skip {
                skipped.push(Skipped {
                    path: c.path.clone(),
                    reason,
                });
                continue;
            }
            if c.file_type == FileType::Special {
                special.push(c.path.clone());
            }
        }
        match c.kind {
            ChangeKind::Added => report.added += 1,
            ChangeKind::Modified => report.modified += 1,
            ChangeKind::Deleted => report.deleted += 1,
            ChangeKind::TypeChanged => report.type_changed += 1,
        }
        if c.kind != ChangeKind::Deleted && c.file_type == FileType::File {
            report.bytes += c.size;
        }
    }
    if !special.is_empty() {
        return Err(CowError::SpecialFiles { paths: special });
    }
    report.skipped = skipped.into_boxed_slice();
    if !stale_paths.is_empty() {
        if !opts.force {
            return Err(CowError::StaleBase { paths: stale_paths });
        }
        report.forced_stale = stale_paths;
    }
    Ok(report)
}

/// Step 1's check that the apply step will be allowed to do what it must in the workdir, so
/// that a permission problem refuses the commit before anything is written instead of
/// stopping it half-way. Root passes every check. For each change:
/// - its workdir parent, if it exists (else the commit makes it), must be writable and
///   searchable by us (a `renameat`, `mkdirat` or `unlinkat` in it);
/// - a workdir directory whose mode or times the commit sets must be ours;
/// - a workdir directory that goes away (deleted, or replaced by a file or symlink) must be
///   removable: every directory in it ours (we can give ourselves access) or writable,
///   searchable and readable by us.
struct WorkdirCheck<'a> {
    cursor: DirCursor<'a>,
    /// The parent checked last: consecutive changes usually share it.
    last_parent: Option<PathBuf>,
    euid: u32,
}

impl<'a> WorkdirCheck<'a> {
    fn new(root: BorrowedFd<'a>) -> WorkdirCheck<'a> {
        WorkdirCheck {
            cursor: DirCursor::new(root),
            last_parent: None,
            euid: rustix::process::geteuid().as_raw(),
        }
    }

    fn check(&mut self, item: &Item) -> Result<(), CowError> {
        if self.euid == 0 {
            return Ok(());
        }
        let c = &item.change;
        let (parent, name) = split(&c.path);
        let denied = |path: &Path| {
            let path = path.to_owned();
            move |source: io::Error| CowError::WorkdirPermission { path, source }
        };
        let dir = match self.cursor.open(parent) {
            Ok(dir) => dir,
            // Missing, a file or a symlink in the workdir: the commit makes that parent (it
            // is a change of its own, checked on its own account).
            Err(e) if is_replaced(&e) => return Ok(()),
            Err(e) => return Err(denied(parent)(e)),
        };
        if self.last_parent.as_deref() != Some(parent) {
            // `.` is looked up in the directory itself: that checks search permission too.
            rustix::fs::accessat(
                dir,
                ".",
                rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
                AtFlags::EACCESS,
            )
            .map_err(|e| denied(parent)(e.into()))?;
            self.last_parent = Some(parent.to_owned());
        }
        let Some(lower) = item.lower else {
            return Ok(());
        };
        if lower.file_type != FileType::Dir {
            return Ok(());
        }
        let goes_away = matches!(c.kind, ChangeKind::Deleted | ChangeKind::TypeChanged);
        let gets_meta = c.kind == ChangeKind::Modified && c.file_type == FileType::Dir;
        if !(goes_away || gets_meta) {
            return Ok(());
        }
        let Some(st) = lstat_at(dir, name).map_err(denied(&c.path))? else {
            return Ok(());
        };
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
            return Ok(());
        }
        if gets_meta && st.st_uid != self.euid {
            return Err(denied(&c.path)(Errno::PERM.into()));
        }
        if goes_away {
            removable(dir, name, &st, self.euid).map_err(denied(&c.path))?;
        }
        Ok(())
    }
}

/// The errors that say a workdir path is not a directory the commit must enter as it is.
fn is_replaced(e: &io::Error) -> bool {
    matches!(
        Errno::from_io_error(e),
        Some(Errno::NOENT | Errno::NOTDIR | Errno::LOOP)
    )
}

/// Whether [`remove_tree_at`] can remove the directory `name` of `dir` (see [`WorkdirCheck`]).
/// A directory of ours that we cannot read is not looked into: what it holds was put there
/// by us, or by someone we let in.
fn removable(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    st: &rustix::fs::Stat,
    euid: u32,
) -> io::Result<()> {
    if st.st_uid != euid {
        rustix::fs::accessat(
            dir,
            name,
            rustix::fs::Access::READ_OK
                | rustix::fs::Access::WRITE_OK
                | rustix::fs::Access::EXEC_OK,
            AtFlags::EACCESS,
        )?;
    }
    let sub = match beneath::open_child_dir(dir, name) {
        Ok(sub) => sub,
        Err(e) if st.st_uid == euid && Errno::from_io_error(&e) == Some(Errno::ACCESS) => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    for child in beneath::sorted_names(sub.as_fd())? {
        if let Some(cst) = lstat_at(sub.as_fd(), &child)? {
            if rustix::fs::FileType::from_raw_mode(cst.st_mode) == rustix::fs::FileType::Directory {
                removable(sub.as_fd(), &child, &cst, euid)?;
            }
        }
    }
    Ok(())
}

/// One step of applying a staged commit, in change-set order (parents first).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanOp {
    /// Rename staged entry number `seq` to `path`.
    Place {
        /// The target, relative to the workdir.
        #[serde(with = "lockbox_policy::name::json")]
        path: PathBuf,
        /// The staged entry's name in the staging directory.
        seq: u64,
    },
    /// Make directory `path` (replacing a non-directory).
    MakeDir {
        /// The directory, relative to the workdir.
        #[serde(with = "lockbox_policy::name::json")]
        path: PathBuf,
    },
    /// Remove `path` (a whole tree for a directory).
    Delete {
        /// The path, relative to the workdir.
        #[serde(with = "lockbox_policy::name::json")]
        path: PathBuf,
    },
}

/// A directory whose mode and times are set once every [`PlanOp`] is done.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlanDir {
    /// The directory, relative to the workdir.
    #[serde(with = "lockbox_policy::name::json")]
    pub path: PathBuf,
    /// Its final permission bits.
    pub mode: u32,
    /// Its final (atime, mtime) as (secs, nsecs).
    pub times: [(i64, i64); 2],
}

/// What applying a staged commit does, after its data is staged and durable: the record a
/// write-ahead log keeps so that the apply can be redone after a crash
/// ([`crate::apply_staged`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommitPlan {
    /// The steps, in order.
    pub ops: Vec<PlanOp>,
    /// Directories whose mode and times are set at the end, deepest last in this list.
    pub dirs: Vec<PlanDir>,
}

/// Up to this many changes, durability comes from fsyncing each staged file and each touched
/// directory rather than from `syncfs`: `syncfs` also writes back every other process's dirty
/// data on the filesystem, which dominates the cost of a small commit on a busy disk.
const SMALL: u64 = 64;

/// Whether a commit of `changes` changes uses the per-file protocol (see [`SMALL`]).
pub(crate) fn is_small(changes: u64) -> bool {
    changes <= SMALL
}

pub(crate) struct Plan {
    pub(crate) staging: OwnedFd,
    pub(crate) plan: CommitPlan,
    /// Use per-file and per-directory fsync instead of `syncfs` (see [`SMALL`]).
    pub(crate) small: bool,
}

fn timestamps(item: &Item) -> Timestamps {
    to_timestamps(&item.times)
}

fn to_timestamps(times: &[(i64, i64); 2]) -> Timestamps {
    let ts = |(s, n): (i64, i64)| Timespec {
        tv_sec: s,
        tv_nsec: n as _,
    };
    Timestamps {
        last_access: ts(times[0]),
        last_modification: ts(times[1]),
    }
}

/// Setuid/setgid bits are dropped on commit: the branch was written by untrusted code, and
/// the committed file belongs to the (possibly privileged) invoking user.
fn file_mode(mode: u32) -> u32 {
    mode & 0o1777
}

/// Step 3: stages `upper`'s new entries in `root/staging_name` and makes them durable
/// (`small`: file by file, see [`SMALL`]).
pub(crate) fn stage(
    upper: &Path,
    workdir: &Path,
    root: BorrowedFd<'_>,
    staging_name: &OsStr,
    small: bool,
) -> Result<Plan, CowError> {
    let stage_err = |path: &Path| {
        let path = path.to_owned();
        move |source: io::Error| CowError::Stage { path, source }
    };
    // A leftover from an interrupted commit of this branch is discarded.
    remove_tree_at(root, staging_name).map_err(stage_err(Path::new(staging_name)))?;
    rustix::fs::mkdirat(root, staging_name, Mode::from_raw_mode(0o700))
        .map_err(|e| stage_err(Path::new(staging_name))(e.into()))?;
    let filled = beneath::open_child_dir(root, staging_name)
        .map_err(stage_err(Path::new(staging_name)))
        .and_then(|staging| {
            let plan = fill_staging(upper, workdir, staging.as_fd(), small)?;
            // Every staged file is durable before any becomes visible: each was fsynced
            // (small) or one syncfs covers them all. The staging directory's own entries
            // need no fsync here: a rename makes a durable inode visible, and a commit cut
            // short stages again ([`stage_upper`] syncs them: its redo reads the staging
            // directory).
            if !small {
                rustix::fs::syncfs(&staging).map_err(|e| CowError::SyncFs {
                    path: staging_name.into(),
                    source: e.into(),
                })?;
            }
            Ok(Plan {
                staging,
                plan,
                small,
            })
        });
    if filled.is_err() {
        // Nothing was applied: leave no staging directory behind. (Best effort: the error
        // that matters is the one returned; a later commit discards a leftover anyway.)
        let _ = remove_tree_at(root, staging_name);
    }
    filled
}

fn fill_staging(
    upper: &Path,
    workdir: &Path,
    staging: BorrowedFd<'_>,
    small: bool,
) -> Result<CommitPlan, CowError> {
    let mut plan = CommitPlan::default();
    let mut seq = 0u64;
    let mut walker = Walker::new(upper, workdir)?;
    let mut links = Links::default();
    while let Some(item) = walker.next() {
        let item = item?;
        let c = &item.change;
        let path = c.path.clone();
        match (c.kind, c.file_type) {
            (ChangeKind::Deleted, _) => plan.ops.push(PlanOp::Delete { path }),
            // Reported by `validate`; the workdir keeps its entry.
            (_, FileType::Special) if item.skip.is_some() => {}
            (_, FileType::Dir) => {
                if c.kind != ChangeKind::Modified {
                    plan.ops.push(PlanOp::MakeDir { path: path.clone() });
                }
                plan.dirs.push(PlanDir {
                    path,
                    mode: c.mode,
                    times: item.times,
                });
            }
            (_, FileType::File | FileType::Symlink) => {
                seq += 1;
                let staged = match walker.upper_dir() {
                    Some(dir) => stage_entry(dir, staging, seq, &item, small, &mut links),
                    None => Err(Errno::NOENT.into()),
                };
                staged.map_err(|source| CowError::Stage {
                    path: path.clone(),
                    source,
                })?;
                plan.ops.push(PlanOp::Place { path, seq });
            }
            (_, FileType::Special) => {
                return Err(CowError::SpecialFiles { paths: vec![path] });
            }
        }
    }
    Ok(plan)
}

/// The staged entry of each upper inode with more than one name: a hard link made in the
/// sandbox (upper (device, inode) -> its first staged entry's `seq`).
type Links = std::collections::HashMap<(u64, u64), u64>;

/// Copies the file or symlink of `item` from `dir`, the upper directory holding it, to
/// `staging/<seq>`, with its `user.*` xattrs. A further name of an upper inode already
/// staged becomes a hard link to that staged entry, so that names the sandbox linked are
/// still one inode in the workdir.
fn stage_entry(
    dir: BorrowedFd<'_>,
    staging: BorrowedFd<'_>,
    seq: u64,
    item: &Item,
    fsync: bool,
    links: &mut Links,
) -> io::Result<()> {
    let (_, src) = split(&item.change.path);
    let name = seq.to_string();
    let times = timestamps(item);
    if item.change.file_type == FileType::Symlink {
        let target = rustix::fs::readlinkat(dir, src, Vec::new())?;
        rustix::fs::symlinkat(target.as_c_str(), staging, &name)?;
        return Ok(rustix::fs::utimensat(
            staging,
            &name,
            &times,
            AtFlags::SYMLINK_NOFOLLOW,
        )?);
    }
    let from = beneath::open_own_file(dir, src)?;
    let st = rustix::fs::fstat(&from)?;
    if st.st_nlink > 1 {
        let inode = (st.st_dev, st.st_ino);
        if let Some(first) = links.get(&inode) {
            rustix::fs::linkat(staging, first.to_string(), staging, &name, AtFlags::empty())?;
            return Ok(());
        }
        links.insert(inode, seq);
    }
    let (to, _) = copy_into(&from, staging, OsStr::new(&name))?;
    // Before the mode: setting a `user.*` xattr needs write permission.
    copy_user_xattrs(from.as_fd(), to.as_fd())?;
    rustix::fs::fchmod(&to, Mode::from_raw_mode(file_mode(item.change.mode)))?;
    rustix::fs::futimens(&to, &times)?;
    if fsync {
        to.sync_all()?;
    }
    Ok(())
}

/// Copies the `user.*` xattrs of `from` to `to` (see [`user_xattrs`]).
fn copy_user_xattrs(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    for (xname, value) in user_xattrs(from)? {
        rustix::fs::fsetxattr(to, &xname, &value, rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

/// The `user.*` xattrs of `fd` (names as exact bytes, sorted), except overlayfs's own
/// bookkeeping (`user.overlay.*`, in an unprivileged upper): what a commit carries. Other
/// namespaces are not the sandbox's to give: `security.*` holds file capabilities,
/// `trusted.*` needs privilege.
pub(crate) fn user_xattrs(fd: BorrowedFd<'_>) -> io::Result<Vec<(std::ffi::OsString, Vec<u8>)>> {
    use std::os::unix::ffi::OsStrExt;
    let names = xattr_read(|buf| rustix::fs::flistxattr(fd, buf))?;
    let mut out = Vec::new();
    for xname in names
        .split(|&b| b == 0)
        .filter(|n| n.starts_with(b"user.") && !n.starts_with(b"user.overlay."))
    {
        let xname = OsStr::from_bytes(xname);
        let value = xattr_read(|buf| rustix::fs::fgetxattr(fd, xname, buf))?;
        out.push((xname.to_owned(), value));
    }
    out.sort();
    Ok(out)
}

/// The whole answer of an xattr call that fills `buf` (growing it on `ERANGE`); nothing
/// where the filesystem has no xattrs.
fn xattr_read(mut call: impl FnMut(&mut [u8]) -> rustix::io::Result<usize>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match call(&mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) => {
                let size = call(&mut [0u8; 0][..])?;
                buf = vec![0u8; size.max(buf.len() * 2)];
            }
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The workdir directories of the plan's paths, opened one component at a time.
struct Parents<'a> {
    cursor: DirCursor<'a>,
}

impl Parents<'_> {
    fn get(&mut self, parent: &Path) -> Result<BorrowedFd<'_>, CowError> {
        self.cursor
            .open(parent)
            .map_err(|source| CowError::ResolveBeneath {
                path: parent.to_owned(),
                source,
            })
    }
}

/// Step 4. With `replay` (redoing an apply a crash interrupted), a staged entry that is gone
/// was already placed and is skipped; every other step is idempotent anyway.
pub(crate) fn apply(root: BorrowedFd<'_>, plan: &Plan, replay: bool) -> Result<(), CowError> {
    let mut parents = Parents {
        cursor: DirCursor::new(root),
    };
    for op in &plan.plan.ops {
        match op {
            PlanOp::Place { path, seq } => {
                if replay && !staged_exists(plan.staging.as_fd(), *seq, path)? {
                    continue;
                }
                let (parent, name) = split(path);
                let dir = parents.get(parent)?;
                place(plan.staging.as_fd(), *seq, dir, name, path)?;
            }
            PlanOp::MakeDir { path } => {
                let (parent, name) = split(path);
                let dir = parents.get(parent)?;
                make_dir(dir, name, path)?;
            }
            PlanOp::Delete { path } => {
                let (parent, name) = split(path);
                let dir = parents.get(parent)?;
                remove_tree_at(dir, name).map_err(|source| CowError::Delete {
                    path: path.clone(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

fn staged_exists(staging: BorrowedFd<'_>, seq: u64, path: &Path) -> Result<bool, CowError> {
    lstat_at(staging, OsStr::new(&seq.to_string()))
        .map(|st| st.is_some())
        .map_err(|source| CowError::Rename {
            path: path.to_owned(),
            source,
        })
}

fn place(
    staging: BorrowedFd<'_>,
    seq: u64,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
) -> Result<(), CowError> {
    let existing = lstat_at(dir, name).map_err(|source| CowError::Rename {
        path: path.to_owned(),
        source,
    })?;
    if existing.is_some_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir()) {
        remove_tree_at(dir, name).map_err(|source| CowError::Delete {
            path: path.to_owned(),
            source,
        })?;
    }
    let staged = seq.to_string();
    match rustix::fs::renameat(staging, &staged, dir, name) {
        Ok(()) => Ok(()),
        Err(Errno::XDEV) => place_across_devices(staging, &staged, dir, name),
        Err(e) => Err(e.into()),
    }
    .map_err(|source| CowError::Rename {
        path: path.to_owned(),
        source,
    })
}

/// DIR has another filesystem mounted below it: the staged copy cannot be renamed there, so
/// it is copied to a temp file in the target directory, fsynced, renamed, and the directory
/// fsynced (the classic per-file protocol; `syncfs` of DIR does not cover that filesystem).
fn place_across_devices(
    staging: BorrowedFd<'_>,
    staged: &str,
    dir: BorrowedFd<'_>,
    name: &OsStr,
) -> io::Result<()> {
    let tmp = format!(".lockbox-tmp-{}-{staged}", std::process::id());
    let st = rustix::fs::statat(staging, staged, AtFlags::SYMLINK_NOFOLLOW)?;
    let times = beneath::times_of(&st);
    let _ = rustix::fs::unlinkat(dir, &tmp, AtFlags::empty());
    if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink {
        let target = rustix::fs::readlinkat(staging, staged, Vec::new())?;
        rustix::fs::symlinkat(target.as_c_str(), dir, &tmp)?;
        rustix::fs::utimensat(dir, &tmp, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    } else {
        let from = beneath::open_child_file(staging, OsStr::new(staged))?;
        let (to, _) = copy_into(&from, dir, OsStr::new(&tmp))?;
        rustix::fs::fchmod(&to, Mode::from_raw_mode(st.st_mode & 0o7777))?;
        rustix::fs::futimens(&to, &times)?;
        to.sync_all()?;
    }
    rustix::fs::renameat(dir, &tmp, dir, name)?;
    rustix::fs::unlinkat(staging, staged, AtFlags::empty())?;
    let d = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(rustix::fs::fsync(d)?)
}

fn make_dir(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), CowError> {
    let err = |source: io::Error| CowError::Mkdir {
        path: path.to_owned(),
        source,
    };
    match lstat_at(dir, name).map_err(err)? {
        Some(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() => return Ok(()),
        Some(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(|e| err(e.into()))?,
        None => {}
    }
    // 0700 until the end: the final mode may forbid writing the entries still to come.
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)).map_err(|e| err(e.into()))
}

/// Step 5 (without removing the staging directory).
///
/// `also`: a directory the caller changed too (relative to `root`), made durable with the
/// plan's.
pub(crate) fn finish(
    root: BorrowedFd<'_>,
    plan: &Plan,
    also: Option<&Path>,
) -> Result<(), CowError> {
    // Opened before the final modes are set: a directory left at mode 000 by the sandbox
    // cannot be opened by its owner afterwards, and fsync needs a readable descriptor.
    let to_fsync = if plan.small {
        open_touched_dirs(root, plan, also)?
    } else {
        None
    };
    let mut cursor = DirCursor::new(root);
    // Deepest first: a directory's final mode may forbid looking up its entries.
    for PlanDir { path, mode, times } in plan.plan.dirs.iter().rev() {
        let times = &to_timestamps(times);
        let mut set = || -> io::Result<()> {
            let fd = cursor.open(path)?;
            beneath::chmod_fd(fd, *mode)?;
            beneath::set_times_fd(fd, times)
        };
        set().map_err(|source| CowError::SetMeta {
            path: path.clone(),
            source,
        })?;
    }
    match to_fsync {
        Some(dirs) => {
            for (path, fd) in dirs {
                rustix::fs::fsync(&fd).map_err(|e| CowError::Fsync {
                    path,
                    source: e.into(),
                })?;
            }
            Ok(())
        }
        None => rustix::fs::syncfs(root).map_err(|e| CowError::SyncFs {
            path: PathBuf::new(),
            source: e.into(),
        }),
    }
}

/// The small-commit equivalent of the final `syncfs`: every directory an operation added,
/// renamed or removed an entry in, and every directory whose mode or times are set, opened
/// for an fsync. `None` when one of them cannot be read by us (a workdir directory of mode
/// 0300, say): `syncfs` then covers them all. (Symlinks staged in small mode are not fsynced
/// as files: the rename makes their inode durable with the directory on the journalling
/// filesystems lockbox targets.)
fn open_touched_dirs(
    root: BorrowedFd<'_>,
    plan: &Plan,
    also: Option<&Path>,
) -> Result<Option<Vec<(PathBuf, OwnedFd)>>, CowError> {
    let mut dirs: Vec<PathBuf> = plan
        .plan
        .ops
        .iter()
        .map(|op| match op {
            PlanOp::Place { path, .. } | PlanOp::MakeDir { path } | PlanOp::Delete { path } => {
                path.parent().map(Path::to_owned).unwrap_or_default()
            }
        })
        .chain(plan.plan.dirs.iter().map(|d| d.path.clone()))
        .chain(also.map(Path::to_owned))
        .collect();
    dirs.sort();
    dirs.dedup();
    let mut cursor = DirCursor::new(root);
    let mut open = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let opened = cursor.open(&dir).and_then(beneath::reopen_dir);
        match opened {
            Ok(fd) => open.push((dir, fd)),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::ACCESS) => return Ok(None),
            Err(source) => return Err(CowError::Fsync { path: dir, source }),
        }
    }
    Ok(Some(open))
}
