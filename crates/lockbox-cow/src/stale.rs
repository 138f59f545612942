//! Stale-base detection: did the workdir change, after the branch began, at a path the branch
//! changes?
//!
//! Rule: the branch records `base_ctime`, a ctime the kernel stamped on its fresh `upper/`
//! directory one clock tick after its creation (see `branch::next_tick`), so anything written
//! before the branch began is strictly older. The kernel stamps every later inode change (content, mode, rename, link count,
//! entry added or removed in a directory) with a ctime `>=` that value, and userspace cannot
//! set ctime. So a workdir entry is *changed since the base* iff its ctime `>= base_ctime`;
//! `>=` makes changes in the same clock tick count (false positives are possible, lost updates
//! are not). Per change:
//! - `Modified` / `TypeChanged` / `Deleted`: the workdir entry's ctime; for a directory that
//!   goes away (deleted or replaced), any entry of its subtree;
//! - `Added` of an entry copied up from the workdir (`overlay.origin`) that is gone from it
//!   now: the workdir parent directory's ctime (the host removed or renamed the entry, or a
//!   sibling). If that parent is missing from the workdir, the parent is itself a change and
//!   carries the check. A plain `Added` (new on both sides is caught as `Modified`) is never
//!   stale.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::FileType as RawType;
use rustix::io::Errno;

use crate::beneath::{self, lstat_at, sorted_names, split};
use crate::changes::{ChangeKind, FileType, Item};
use crate::meta::Timestamp;
use crate::CowError;

fn newer(secs: i64, nanos: i64, base: Timestamp) -> bool {
    (secs, nanos) >= (base.secs, base.nanos)
}

pub(crate) fn is_stale(
    root: BorrowedFd<'_>,
    item: &Item,
    base: Timestamp,
) -> Result<bool, CowError> {
    let c = &item.change;
    let err = |source| CowError::ReadLower {
        path: c.path.clone(),
        source,
    };
    let Some(lower) = item.lower else {
        if !item.origin {
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
            let child = beneath::open_child_dir(dir, &name)?;
            if changed_below(child.as_fd(), base)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}
