//! A commit split at its commit point, for callers that keep their own write-ahead log
//! (`lockbox-txn`): [`stage_upper`] does steps 1 and 3 of [`crate::commit`] (validate, stage,
//! make durable) and returns the [`CommitPlan`]; the caller makes the plan durable (its commit
//! point) and then calls [`apply_staged`], which does steps 4 and 5 and can be redone after a
//! crash any number of times; [`discard_staging`] rolls back a commit that never reached its
//! commit point.
//!
//! The staging directory is `WORKDIR/.lockbox-commit-<key>`, so the existing reserved-name
//! rule keeps it out of every change set.
//!
//! A branch's own commits stage there too (key `<id>`, `<id>-part` for a partial one): what
//! a commit killed while staging left is removed by the branch's abort and by recovery
//! ([`sweep_branch_staging`]; issue 32: it stayed in the user's directory for good, and
//! sandboxes of the workdir saw it).

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::beneath::{self, remove_tree_at};
use crate::commit::{self, CommitPlan, Plan, STAGING_PREFIX};
use crate::lock::WorkdirLock;
use crate::meta::Timestamp;
use crate::select::PART_RECORD;
use crate::stale::Base;
use crate::{Branch, BranchId, CommitOptions, CommitReport, CowError};

fn staging_name(key: &str) -> String {
    format!("{STAGING_PREFIX}{key}")
}

fn open_workdir(workdir: &Path) -> Result<std::os::fd::OwnedFd, CowError> {
    beneath::open_root(workdir).map_err(|source| CowError::OpenWorkdir {
        path: workdir.to_owned(),
        source,
    })
}

/// Validates the change set of `upper` (an overlayfs upper layer, or a flattened stack of
/// them: [`crate::flatten`]) against `workdir`, refusing special files, reserved names and,
/// when `base` is given and `opts.force` is not, paths changed in the workdir since `base`
/// ([`CowError::StaleBase`]). Unless `opts.dry_run`, then stages every new file and symlink
/// in the staging directory named by `key` and makes it durable. Nothing in the workdir
/// outside the staging directory changes.
pub fn stage_upper(
    upper: &Path,
    workdir: &Path,
    key: &str,
    base: Option<Timestamp>,
    opts: &CommitOptions,
) -> Result<(CommitPlan, CommitReport), CowError> {
    stage_upper_from(upper, workdir, key, base.map(Base::uniform), opts)
}

/// [`stage_upper`] with a per-path stale-base reference: `rebased` (sorted by path) gives
/// some paths a later reference than `base` (see [`crate::BranchMeta::rebased`]). A gather
/// of running sandboxes' branches (`lockbox-txn`'s `LayerGather`) checks each path against
/// the reference of the branch it comes from.
pub fn stage_upper_rebased(
    upper: &Path,
    workdir: &Path,
    key: &str,
    base: Option<(Timestamp, &[crate::Rebased])>,
    opts: &CommitOptions,
) -> Result<(CommitPlan, CommitReport), CowError> {
    let base = base.map(|(at, rebased)| Base { at, rebased });
    stage_upper_from(upper, workdir, key, base, opts)
}

/// [`stage_upper`] with a per-path stale-base reference.
pub(crate) fn stage_upper_from(
    upper: &Path,
    workdir: &Path,
    key: &str,
    base: Option<Base<'_>>,
    opts: &CommitOptions,
) -> Result<(CommitPlan, CommitReport), CowError> {
    let root = open_workdir(workdir)?;
    let mut report = commit::validate(upper, workdir, root.as_fd(), base, opts)?;
    if opts.dry_run {
        report.dry_run = true;
        return Ok((CommitPlan::default(), report));
    }
    let total = report.added + report.modified + report.deleted + report.type_changed;
    let name = staging_name(key);
    let plan = commit::stage(
        upper,
        workdir,
        root.as_fd(),
        OsStr::new(&name),
        commit::is_small(total),
    )?;
    // A redo after a crash reads the staged entries ([`apply_staged`]): they must be durable
    // before the caller's log records the commit point (`stage` synced them only for a
    // large plan, with syncfs).
    if plan.small {
        rustix::fs::fsync(&plan.staging).map_err(|e| CowError::SyncFs {
            path: name.into(),
            source: e.into(),
        })?;
    }
    Ok((plan.plan, report))
}

/// Applies a plan staged by [`stage_upper`] with the same `key`: renames the staged entries
/// into place, makes and removes directories, sets directory metadata, makes it durable
/// (`syncfs`, or fsyncs of the touched directories for a small plan), removes the
/// staging directory and fsyncs the workdir. Safe to call again after a crash at any point of
/// an earlier call (a staged entry already renamed is skipped). Once the staging directory
/// is gone, calling it again is a no-op.
pub fn apply_staged(workdir: &Path, key: &str, plan: &CommitPlan) -> Result<(), CowError> {
    let root = open_workdir(workdir)?;
    let name = staging_name(key);
    let staging = match beneath::open_child_dir(root.as_fd(), OsStr::new(&name)) {
        Ok(fd) => fd,
        // Gone: a previous apply finished (the staging directory is removed last).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CowError::Stage {
                path: name.into(),
                source,
            })
        }
    };
    // Decided from the plan alone, so a redo after a crash makes the same choice. (Either
    // is safe: a small plan's staged files were fsynced one by one; a large one's by syncfs.)
    let small = commit::is_small((plan.ops.len() + plan.dirs.len()) as u64);
    let plan = Plan {
        staging,
        plan: plan.clone(),
        small,
    };
    commit::apply(root.as_fd(), &plan, true)?;
    commit::finish(root.as_fd(), &plan, None)?;
    drop(plan);
    remove_tree_at(root.as_fd(), OsStr::new(&name)).map_err(|source| CowError::Delete {
        path: name.clone().into(),
        source,
    })?;
    rustix::fs::fsync(&root).map_err(|e| CowError::Fsync {
        path: workdir.to_owned(),
        source: e.into(),
    })
}

/// Removes the staging directory of `key` (a commit rolled back before its commit point) and
/// fsyncs the workdir. A missing staging directory is not an error.
pub fn discard_staging(workdir: &Path, key: &str) -> Result<(), CowError> {
    let root = open_workdir(workdir)?;
    let name = staging_name(key);
    remove_tree_at(root.as_fd(), OsStr::new(&name)).map_err(|source| CowError::Delete {
        path: name.into(),
        source,
    })?;
    rustix::fs::fsync(&root).map_err(|e| CowError::Fsync {
        path: workdir.to_owned(),
        source: e.into(),
    })
}

/// True if the staging directory of `key` exists in `workdir`.
pub fn staging_exists(workdir: &Path, key: &str) -> bool {
    workdir.join(staging_name(key)).symlink_metadata().is_ok()
}

/// The suffix of the key of a partial commit's staging ([`Branch::commit_part`]).
pub(crate) const PART_SUFFIX: &str = "-part";

impl Branch {
    /// The staging keys of this branch's commits left in its workdir: a full commit's (which
    /// a resumed commit stages afresh) and a partial one's, unless an interrupted partial
    /// commit is still to be applied from it ([`Branch::commit_part`]).
    fn leftover_staging(&self) -> Vec<String> {
        let full = self.id().to_string();
        let part = format!("{full}{PART_SUFFIX}");
        let pending_part = self.dir().join(PART_RECORD).exists();
        [full, part]
            .into_iter()
            .filter(|key| !(pending_part && key.ends_with(PART_SUFFIX)))
            .filter(|key| staging_exists(self.workdir(), key))
            .collect()
    }

    /// Removes what commits of this branch killed while staging left in its workdir (see
    /// [`Branch::leftover_staging`]), under the workdir lock, so that no commit of it is
    /// running meanwhile. A workdir that is gone holds none.
    pub(crate) fn discard_leftover_staging(&self) -> Result<(), CowError> {
        if self.leftover_staging().is_empty() {
            return Ok(());
        }
        let _lock = WorkdirLock::acquire(&self.state_dir(), self.workdir())?;
        self.discard_leftover_staging_locked().map(drop)
    }

    /// [`Branch::discard_leftover_staging`] with the workdir lock held: the removed paths.
    fn discard_leftover_staging_locked(&self) -> Result<Vec<PathBuf>, CowError> {
        let mut removed = Vec::new();
        for key in self.leftover_staging() {
            discard_staging(self.workdir(), &key)?;
            removed.push(self.workdir().join(staging_name(&key)));
        }
        Ok(removed)
    }
}

/// Recovery's part for branches: removes the staging directories that commits of
/// `state_dir`'s branches over `workdir` (canonical), killed while staging, left at its top
/// (see [`Branch::commit`], [`Branch::commit_part`]; a partial commit past its commit point
/// keeps its own, to be finished from). The caller holds the workdir lock
/// ([`WorkdirLock`]), so no commit of them is running. Staging of anything else (a
/// transaction, another state directory's branch) is left alone. Returns what it removed.
pub fn sweep_branch_staging(state_dir: &Path, workdir: &Path) -> Result<Vec<PathBuf>, CowError> {
    let mut removed = Vec::new();
    for key in staging_keys(workdir) {
        let id = key.strip_suffix(PART_SUFFIX).unwrap_or(&key);
        let Ok(branch) = BranchId::parse(id).and_then(|id| Branch::open(state_dir, &id)) else {
            continue;
        };
        if branch.workdir() == workdir {
            removed.extend(branch.discard_leftover_staging_locked()?);
        }
    }
    Ok(removed)
}

/// The keys of the staging directories at the top of `workdir` (none if it cannot be read).
pub fn staging_keys(workdir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(workdir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(STAGING_PREFIX))
                .map(str::to_owned)
        })
        .collect()
}
