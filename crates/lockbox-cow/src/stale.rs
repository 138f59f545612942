//! Stale-base detection: did the workdir change, after the branch (or transaction) began, at a
//! path it writes? One rule for branches (`lockbox run --workdir`) and transactions
//! (`lockbox pipeline` / `gather`, which call [`stamp_base`] and the same check).
//!
//! Rule: the branch records a base, a ctime the kernel stamped on a fresh directory of its
//! own one clock tick after its creation ([`stamp_base`]), so anything written before the
//! branch began is strictly older. The kernel stamps every later inode change (content, mode,
//! rename, link count, entry added or removed in a directory) with a ctime `>=` that value,
//! and userspace cannot set ctime. So a workdir entry is *changed since the base* iff its
//! ctime `>= base`; `>=` makes changes in the same clock tick count (false positives are
//! possible, lost updates are not). Per entry the branch wrote:
//! - `Modified` / `TypeChanged` / `Deleted`: the workdir entry's ctime; for a directory that
//!   goes away (deleted or replaced), any entry of its subtree;
//! - `Added` of an entry copied up from the workdir (`overlay.origin`) that is gone from it
//!   now: the workdir parent directory's ctime (the host removed or renamed the entry, or a
//!   sibling). If that parent is missing from the workdir, the parent is itself a change and
//!   carries the check. A plain `Added` (new on both sides is caught as `Modified`) is never
//!   stale;
//! - an entry the branch wrote that holds what the workdir holds *now* (the same bytes and
//!   mtime, a whiteout over nothing, an opaque directory with the same mode): no change to
//!   apply, but a write all the same. If the workdir entry changed since the base, a rival
//!   wrote it first and this branch's write was based on what it read before: stale (a
//!   lost update otherwise). The workdir entry's ctime decides; for a whiteout over nothing,
//!   its parent directory's (the entry was removed from it).
//!
//! After a partial commit of a kept branch ([`crate::Branch::commit_selected`]) the paths it
//! wrote hold the branch's version (or part of it) in the workdir, with fresh ctimes: by the
//! rule above they would look changed by someone else. So each path a commit wrote gets a
//! reference of its own, taken (by [`stamp_base`]) right after that commit
//! ([`crate::BranchMeta::rebased`]), with the workdir directories above them that nobody had
//! changed since their own reference (the commit added or removed entries in them), and only
//! those paths: every other path keeps the
//! branch's base, so a host edit to a path not yet committed is still refused later. (A host
//! edit to a committed path in the instant between that commit's last write and its new
//! reference is not seen: the commit holds the workdir lock, which `lockbox` writers take,
//! but other programs do not.)

use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::FileType as RawType;
use rustix::io::Errno;

use crate::beneath::{self, lstat_at, sorted_names, split};
use crate::changes::{ChangeKind, FileType, Item};
use crate::meta::{Rebased, Timestamp};
use crate::CowError;

/// Stamps the fresh directory `dir` again (a chmod to its own mode changes its ctime) until
/// the kernel's file clock has moved past the tick of its creation, and returns its ctime
/// then: the base of a branch or transaction, taken right before its sandboxes start.
///
/// File timestamps are coarse (one clock tick, 1-4 ms): a workdir file written in the same
/// tick as the base would carry the same ctime and look changed *after* the base (`>=`).
/// Waiting one tick makes the base strictly newer than anything written before `dir` was
/// made, so an agent that writes a file and starts a sandbox right away gets no false
/// stale-base refusal. (About 2 ms on average; with multigrain timestamps the kernel gives
/// the re-stamp a fine-grained ctime and the first chmod suffices.) Gives up waiting after
/// 100 ms (a clock that does not move): the base is then as coarse as the clock.
pub fn stamp_base(dir: &Path) -> std::io::Result<Timestamp> {
    let ctime = |m: &fs::Metadata| Timestamp {
        secs: m.ctime(),
        nanos: m.ctime_nsec(),
    };
    let made = fs::symlink_metadata(dir)?;
    let first = ctime(&made);
    let mode = fs::Permissions::from_mode(made.mode() & 0o7777);
    let deadline = Instant::now() + Duration::from_millis(100);
    loop {
        fs::set_permissions(dir, mode.clone())?;
        let now = ctime(&fs::symlink_metadata(dir)?);
        if now > first || Instant::now() > deadline {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_micros(250));
    }
}

/// The stale-base reference of a commit: the branch's base, and later ones for the paths a
/// partial commit of the branch already wrote ([`crate::BranchMeta::rebased`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Base<'a> {
    /// When the branch (or transaction) began.
    pub at: Timestamp,
    /// Paths committed since, each with the reference taken right after that commit.
    pub rebased: &'a [Rebased],
}

static NOTHING_REBASED: [Rebased; 0] = [];

impl Base<'static> {
    /// One reference for every path.
    pub(crate) fn uniform(at: Timestamp) -> Base<'static> {
        Base {
            at,
            rebased: &NOTHING_REBASED,
        }
    }
}

impl Base<'_> {
    /// The reference for `path` (the later one if the path was committed since the start;
    /// `rebased` is sorted by path).
    pub(crate) fn for_path(&self, path: &Path) -> Timestamp {
        match self
            .rebased
            .binary_search_by(|r| r.path.as_path().cmp(path))
        {
            Ok(i) => self.rebased[i].at.max(self.at),
            Err(_) => self.at,
        }
    }
}

fn newer(secs: i64, nanos: i64, base: Timestamp) -> bool {
    (secs, nanos) >= (base.secs, base.nanos)
}

pub(crate) fn is_stale(
    root: BorrowedFd<'_>,
    item: &Item,
    base: Base<'_>,
) -> Result<bool, CowError> {
    let c = &item.change;
    let base = base.for_path(&c.path);
    let err = |source| CowError::ReadLower {
        path: c.path.clone(),
        source,
    };
    let Some(lower) = item.lower else {
        // A whiteout over nothing (`unchanged`): the entry was in the workdir when the branch
        // deleted it, and was removed from its parent since.
        if !item.origin && !item.unchanged {
            return Ok(false);
        }
        let (parent, _) = split(&c.path);
        return match beneath::open_dir_beneath(root, parent) {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd).map_err(|e| err(e.into()))?;
                Ok(newer(st.st_ctime, st.st_ctime_nsec as i64, base))
            }
            // No lower parent: the branch made it (a rename keeps `origin`) or the host removed
            // or replaced it. In the latter case the parent is itself a change (`Added` with
            // `origin`, or `TypeChanged`) and is checked on its own account.
            Err(_) => Ok(false),
        };
    };
    if newer(lower.ctime.0, lower.ctime.1, base) {
        return Ok(true);
    }
    let goes_away = matches!(c.kind, ChangeKind::Deleted | ChangeKind::TypeChanged);
    if lower.file_type == FileType::Dir && goes_away {
        return subtree_changed(root, &c.path, base).map_err(err);
    }
    Ok(false)
}

/// Whether anything below directory `rel` changed after `base`. A directory closed to us
/// (mode 000, say; the commit can still remove it: see `commit::removable`) is judged by its
/// own ctime, which a change inside it moves: entering it to change anything takes a
/// `chmod` first, unless one is root, and then it is not closed to us.
fn subtree_changed(root: BorrowedFd<'_>, rel: &Path, base: Timestamp) -> std::io::Result<bool> {
    let dir = match beneath::open_dir_read_beneath(root, rel) {
        Ok(fd) => fd,
        Err(e)
            if matches!(
                Errno::from_io_error(&e),
                Some(Errno::NOENT | Errno::NOTDIR | Errno::LOOP)
            ) =>
        {
            return Ok(true)
        }
        Err(e) if Errno::from_io_error(&e) == Some(Errno::ACCESS) => return Ok(false),
        Err(e) => return Err(e),
    };
    changed_below(dir.as_fd(), base)
}

fn changed_below(dir: BorrowedFd<'_>, base: Timestamp) -> std::io::Result<bool> {
    for name in sorted_names(dir)? {
        let Some(st) = lstat_at(dir, &name)? else {
            return Ok(true);
        };
        if newer(st.st_ctime, st.st_ctime_nsec as i64, base) {
            return Ok(true);
        }
        if RawType::from_raw_mode(st.st_mode) == RawType::Directory {
            let child = match beneath::open_child_dir(dir, &name) {
                Ok(child) => child,
                Err(e) if Errno::from_io_error(&e) == Some(Errno::ACCESS) => continue,
                Err(e) => return Err(e),
            };
            if changed_below(child.as_fd(), base)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}
