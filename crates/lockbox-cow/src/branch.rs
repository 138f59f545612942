//! [`Branch`]: one copy-on-write branch of a workdir, stored in the state directory.
//!
//! Layout (documented in `docs/cow.md`):
//!
//! ```text
//! STATE/branches/<id>/            0700, one per branch
//! STATE/branches/<id>/upper/      overlayfs upperdir: the branch's writes (mode of the workdir)
//! STATE/branches/<id>/work/       overlayfs workdir (scratch for the kernel)
//! STATE/branches/<id>/meta.json   BranchMeta, versioned and checksummed
//! ```
//!
//! A branch is built aside, in `STATE/branches/.new/<pid>-<id>/` (`meta.json` written last),
//! and renamed into place: a kill during [`Branch::create`] leaves nothing [`list`] shows,
//! and the next creation removes what a dead creator left there. A directory without a
//! readable `meta.json` (a power loss, a removal cut short) is listed as damaged and
//! [`abort_id`] removes it. A discarded branch may wait in `STATE/branches/.gone/<id>/` to be
//! removed by a later creation (see `Removal::Deferred`).

use std::ffi::OsStr;
use std::fs::{self, DirBuilder};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::RenameFlags;
use rustix::io::Errno;

use crate::meta::{self, BranchMeta, BranchState, Durability, Timestamp};
use crate::SandboxInit;
use crate::{
    beneath, commit, durable, BranchId, ChangeIter, ChangeSet, CommitOptions, CommitReport,
    CowError,
};

/// The directory holding all branches of a state directory.
pub fn branches_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("branches")
}

/// Where branches are built before they are renamed into place (not a valid [`BranchId`], so
/// never listed).
const UNFINISHED: &str = ".new";

/// Where discarded branches wait to be removed off the critical path (see [`Branch::abort`];
/// not a valid [`BranchId`] either).
const DISCARDED: &str = ".gone";

/// A branch on disk: its directory and its verified `meta.json`.
#[derive(Debug, Clone)]
pub struct Branch {
    dir: PathBuf,
    meta: BranchMeta,
    /// Whether the branch's directory, entries and record are known to be on disk. A new
    /// branch's are not (see [`Branch::create`]): it becomes durable when it first holds
    /// something to keep ([`Branch::keep`], [`Branch::record_failure`], a commit).
    durability: Durability,
}

impl Branch {
    /// Creates a branch of `workdir` under `state_dir` with a fresh id. Call it right before
    /// the sandbox starts: the creation time is the stale-base reference. `context` is stored
    /// as-is (policy, command, ...).
    ///
    /// Nothing is fsynced: a new branch holds nothing worth a crash (what its sandbox writes
    /// is only in the page cache anyway, views being `volatile`), so it is made durable when it
    /// first holds something to keep (issue 21). A crash before that leaves, at worst, a branch
    /// [`list`] shows as an orphan or as damaged (no readable `meta.json`), which
    /// [`abort_id`] removes, or a leftover under `.new/`, which the next creation sweeps.
    pub fn create(
        state_dir: &Path,
        workdir: &Path,
        context: serde_json::Value,
    ) -> Result<Branch, CowError> {
        Branch::create_with_id(state_dir, BranchId::generate(), workdir, context)
    }

    /// Creates a fork: a branch whose view is a snapshot's `layers` (top first, from
    /// [`crate::SnapshotStore::layers`]) over `workdir`, with its own empty upper. Its
    /// stale-base reference is the snapshot's (`base_ctime`), not now: a change made to the
    /// workdir since the snapshot's first sandbox began, at a path the fork writes (itself
    /// or through the snapshot), makes its commit stale, as a sibling's commit does.
    pub fn create_fork(
        state_dir: &Path,
        workdir: &Path,
        layers: Vec<PathBuf>,
        base_ctime: crate::Timestamp,
        context: serde_json::Value,
    ) -> Result<Branch, CowError> {
        let mut branch = Branch::create(state_dir, workdir, context)?;
        let mut meta = branch.meta.clone();
        meta.layers = layers;
        meta.base_ctime = base_ctime;
        meta::write(&branch.dir, &meta, branch.durability)?;
        branch.meta = meta;
        Ok(branch)
    }

    /// Like [`Branch::create`], with a caller-chosen id (fails if it exists).
    pub fn create_with_id(
        state_dir: &Path,
        id: BranchId,
        workdir: &Path,
        context: serde_json::Value,
    ) -> Result<Branch, CowError> {
        let workdir = fs::canonicalize(workdir).map_err(|source| CowError::OpenWorkdir {
            path: workdir.to_owned(),
            source,
        })?;
        let wd_meta = fs::metadata(&workdir).map_err(|source| CowError::OpenWorkdir {
            path: workdir.clone(),
            source,
        })?;
        let branches = branches_dir(state_dir);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&branches)
            .map_err(|source| CowError::StateDir {
                path: branches.clone(),
                source,
            })?;
        let real_branches = fs::canonicalize(&branches).map_err(|source| CowError::StateDir {
            path: branches.clone(),
            source,
        })?;
        if real_branches.starts_with(&workdir) || workdir.starts_with(&real_branches) {
            return Err(CowError::Overlap {
                state: state_dir.to_owned(),
                workdir,
            });
        }
        let dir = branches.join(id.as_str());
        let unfinished = branches.join(UNFINISHED);
        sweep_unfinished(&unfinished);
        sweep_discarded_in_background(&branches);
        let aside_name = format!("{}-{}", std::process::id(), id.as_str());
        let aside = unfinished.join(&aside_name);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&aside)
            .map_err(|source| CowError::CreateBranchDir {
                path: aside.clone(),
                source,
            })?;
        let made =
            Branch::fill_new(&aside, id, workdir, wd_meta.mode(), context).and_then(|branch| {
                rename_noreplace(&aside, &dir).map_err(|source| CowError::CreateBranchDir {
                    path: dir.clone(),
                    source,
                })?;
                Ok(Branch { dir, ..branch })
            });
        if made.is_err() {
            // Best effort: the error that matters is the one returned.
            let _ = remove_dir_robust(&unfinished, OsStr::new(&aside_name), Durability::Lazy);
        }
        made
    }

    fn fill_new(
        dir: &Path,
        id: BranchId,
        workdir: PathBuf,
        workdir_mode: u32,
        context: serde_json::Value,
    ) -> Result<Branch, CowError> {
        let upper = dir.join("upper");
        let work = dir.join("work");
        for (path, mode) in [(&upper, workdir_mode & 0o7777), (&work, 0o700)] {
            let mk = || -> std::io::Result<()> {
                fs::create_dir(path)?;
                // The overlay's root takes its attributes from the upper root.
                fs::set_permissions(path, fs::Permissions::from_mode(mode))
            };
            mk().map_err(|source| CowError::CreateBranchDir {
                path: path.clone(),
                source,
            })?;
        }
        let base_ctime = crate::stamp_base(&upper).map_err(|source| CowError::CreateBranchDir {
            path: upper.clone(),
            source,
        })?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let meta = BranchMeta {
            id,
            workdir,
            created: Timestamp {
                secs: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
                nanos: i64::from(now.subsec_nanos()),
            },
            base_ctime,
            state: BranchState::Active,
            owner_pid: std::process::id(),
            sandbox_init: None,
            context,
            failure: None,
            rebased: Vec::new(),
            layers: Vec::new(),
        };
        meta::write(dir, &meta, Durability::Lazy)?;
        Ok(Branch {
            dir: dir.to_owned(),
            meta,
            durability: Durability::Lazy,
        })
    }

    /// Opens an existing branch, verifying its `meta.json`.
    pub fn open(state_dir: &Path, id: &BranchId) -> Result<Branch, CowError> {
        let dir = branches_dir(state_dir).join(id.as_str());
        if !dir.is_dir() {
            return Err(CowError::BranchNotFound {
                id: id.to_string(),
                path: branches_dir(state_dir),
            });
        }
        let meta = meta::read(&dir)?;
        // Whoever made it may have died before making it durable: treated as durable, so
        // that removing it is (a crash must not bring back a branch that was committed).
        Ok(Branch {
            dir,
            meta,
            durability: Durability::Durable,
        })
    }

    /// The branch id.
    pub fn id(&self) -> &BranchId {
        &self.meta.id
    }

    /// The recorded metadata.
    pub fn meta(&self) -> &BranchMeta {
        &self.meta
    }

    /// The workdir this branch is a branch of (canonical path).
    pub fn workdir(&self) -> &Path {
        &self.meta.workdir
    }

    /// `STATE/branches/<id>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The overlayfs `upperdir=` for this branch.
    pub fn upper_dir(&self) -> PathBuf {
        self.dir.join("upper")
    }

    /// The overlayfs `workdir=` for this branch (not to be confused with the lockbox workdir,
    /// which is the overlay's `lowerdir=`).
    pub fn work_dir(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// The upper layer the branch's changes are read from: its `upper/`, or for a fork of
    /// a snapshot its upper and the snapshot's layers flattened (see [`crate::View`]).
    pub fn view(&self) -> Result<crate::View, CowError> {
        crate::View::of(&self.dir, self.upper_dir(), &self.meta.layers)
    }

    /// The snapshot layers between the branch's upper and the workdir, top first (empty
    /// for a branch of the workdir itself): an overlay of the branch mounts
    /// `lowerdir=LAYERS:WORKDIR`.
    pub fn layers(&self) -> &[PathBuf] {
        &self.meta.layers
    }

    /// Streams the change set against the workdir.
    pub fn changes(&self) -> Result<ChangeIter, CowError> {
        ChangeIter::of_view(self.view()?, &self.meta.workdir)
    }

    /// Collects the whole change set against the workdir.
    pub fn change_set(&self) -> Result<ChangeSet, CowError> {
        ChangeSet::compute(self.view()?.path(), &self.meta.workdir)
    }

    /// Marks the branch as kept for review (durably).
    pub fn keep(&mut self) -> Result<(), CowError> {
        self.sync_upper()?;
        self.set_state(BranchState::Kept)
    }

    /// What the sandbox wrote is only in the page cache (views are `volatile`): made
    /// durable before a record says the branch outlives its process (one syncfs: the upper
    /// can hold many files). The syncfs also covers the branch's own directory entries (they
    /// are on the upper's filesystem), so the branch is durable from here on.
    fn sync_upper(&mut self) -> Result<(), CowError> {
        let upper = self.upper_dir();
        let synced = fs::File::open(&upper)
            .and_then(|dir| rustix::fs::syncfs(&dir).map_err(std::io::Error::from));
        synced.map_err(|source| CowError::SyncFs {
            path: upper,
            source,
        })?;
        self.durability = Durability::Durable;
        Ok(())
    }

    /// Replaces the caller data the record keeps (see [`Branch::create`]).
    pub fn set_context(&mut self, context: serde_json::Value) -> Result<(), CowError> {
        let mut meta = self.meta.clone();
        meta.context = context;
        meta::write(&self.dir, &meta, self.durability)?;
        self.meta = meta;
        Ok(())
    }

    /// Records the init of the sandbox started on the branch (see [`SandboxInit`]): until
    /// it is gone, [`list`] does not call the branch an orphan, even once its owner died.
    /// Call it before that sandbox can write into the branch (a gated sandbox, before its
    /// go: `lockbox_confine::Spawn::held`), or an owner killed in between leaves a branch
    /// listed as an orphan while the sandbox is still being killed.
    pub fn record_sandbox(&mut self, init: SandboxInit) -> Result<(), CowError> {
        let mut meta = self.meta.clone();
        meta.sandbox_init = Some(init);
        meta::write(&self.dir, &meta, self.durability)?;
        self.meta = meta;
        Ok(())
    }

    /// Replaces the record in memory (written by the next [`Branch::set_state`]).
    pub(crate) fn replace_meta(&mut self, meta: BranchMeta) {
        self.meta = meta;
    }

    /// Writes the record with `state` durably. A branch not yet durable is made so: after
    /// this the record is on disk and so is the branch's entry in `branches/` (the record's
    /// own fsyncs cover its directory, not that directory's parent).
    pub(crate) fn set_state(&mut self, state: BranchState) -> Result<(), CowError> {
        let mut meta = self.meta.clone();
        meta.state = state;
        meta::write(&self.dir, &meta, Durability::Durable)?;
        self.meta = meta;
        if self.durability == Durability::Lazy {
            // After the record's fsyncs: on a journalling filesystem they committed the
            // branch's creation with them, and this one has nothing left to wait for.
            let parent = self.dir.parent().unwrap_or(Path::new("/"));
            durable::fsync_dir(parent).map_err(|source| CowError::StateDir {
                path: parent.to_owned(),
                source,
            })?;
            self.durability = Durability::Durable;
        }
        Ok(())
    }

    /// Commits the branch into its own workdir (see [`crate::commit`]) and, unless it was a
    /// dry run, removes the branch. If the commit succeeded but removing the branch failed,
    /// the error is [`CowError::RemoveBranch`]: the workdir is fully committed and the branch
    /// is left in state `committing` ([`abort_id`] removes it).
    ///
    /// A failed commit is recorded in the branch's state (see [`Branch::record_failure`]), so
    /// that [`list`] can say what happened and what to do.
    pub fn commit(mut self, opts: &CommitOptions) -> Result<CommitReport, CowError> {
        if !opts.dry_run {
            self.finish_interrupted_part()?;
        }
        let workdir = self.meta.workdir.clone();
        let report = match commit::commit(&mut self, &workdir, opts) {
            Ok(report) => report,
            Err(e) => {
                // Best effort: the error that matters is the commit's.
                let _ = self.record_failure(&e);
                return Err(e);
            }
        };
        if !opts.dry_run {
            let total = report.added + report.modified + report.deleted + report.type_changed;
            let small = commit::is_small(total) && report.bytes <= DEFER_COMMITTED_BYTES;
            self.remove(if small && opts.defer_removal {
                Removal::Deferred
            } else {
                Removal::Now
            })?;
        }
        Ok(report)
    }

    /// Records that committing (or reading) the branch failed with `error`: state `stale`
    /// for [`CowError::StaleBase`], `commit_failed` otherwise, or, for a commit that had
    /// begun to change the workdir, still `committing` (committing again finishes it); the
    /// error's text goes into `failure`. The branch now outlives its process, so its upper
    /// layer is made durable first (as [`Branch::keep`] does).
    pub fn record_failure(&mut self, error: &CowError) -> Result<(), CowError> {
        let state = match (self.meta.state, error) {
            (BranchState::Committing, _) => BranchState::Committing,
            (_, CowError::StaleBase { .. }) => BranchState::Stale,
            _ => BranchState::CommitFailed,
        };
        self.sync_upper()?;
        let mut meta = self.meta.clone();
        meta.state = state;
        meta.failure = Some(bounded(error.to_string()));
        meta::write(&self.dir, &meta, Durability::Durable)?;
        self.meta = meta;
        Ok(())
    }

    /// Discards the branch: removes its directory, including unreadable or unwritable
    /// entries (the kernel's `work/work` is mode 000).
    ///
    /// The removal of a branch that was never made durable is not waited for either: a crash
    /// can only bring back what a crash during its run could have left (an orphan, or a
    /// damaged branch), never one that was kept or committed.
    ///
    ///
    /// A partial commit of the branch interrupted after its commit point is finished first
    /// (see [`Branch::commit_part`]): the workdir is never left with part of one.
    ///
    /// What a commit of it killed while staging left in the workdir is removed too.
    pub fn abort(mut self) -> Result<(), CowError> {
        self.finish_interrupted_part()?;
        self.discard_leftover_staging()?;
        self.remove(Removal::Now)
    }

    /// [`Branch::abort`] for a caller that exits right after (`lockbox run`): a branch whose
    /// upper layer holds nothing (a run that wrote nothing) is only renamed into
    /// `branches/.gone/` (see `Removal::Deferred`); the next creation removes it. A
    /// long-lived caller uses [`Branch::abort`], which leaves nothing behind.
    pub fn abort_before_exit(self) -> Result<(), CowError> {
        let removal = if is_empty_dir(&self.upper_dir()) {
            Removal::Deferred
        } else {
            Removal::Now
        };
        self.remove(removal)
    }

    fn remove(self, removal: Removal) -> Result<(), CowError> {
        let parent = self.dir.parent().map(Path::to_owned).unwrap_or_default();
        let name = self.dir.file_name().unwrap_or_default().to_owned();
        if removal == Removal::Deferred {
            let gone = parent.join(DISCARDED);
            // Best effort: if it cannot be set aside, it is removed here.
            let _ = fs::create_dir(&gone);
            if fs::rename(&self.dir, gone.join(&name)).is_ok() {
                // One rename, so one fsync makes it gone for good: `.gone/` is never listed.
                if self.durability == Durability::Durable {
                    durable::fsync_dir(&parent).map_err(|source| CowError::RemoveBranch {
                        path: self.dir.clone(),
                        source,
                    })?;
                }
                return Ok(());
            }
        }
        remove_dir_robust(&parent, &name, self.durability)
    }
}

/// When a discarded branch's directories are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// Before the call returns.
    Now,
    /// Renamed into `branches/.gone/` now (never listed, never opened), removed by a later
    /// [`Branch::create`] on a background thread, while its caller starts the sandbox.
    /// Removing a branch's six directories costs 1-12 ms on a busy ext4 (each `rmdir` can wait
    /// milliseconds; issue 21): worth deferring for an empty or small upper, not for one
    /// whose space the caller wants back.
    Deferred,
}

/// A committed branch up to this size is removed with [`Removal::Deferred`].
const DEFER_COMMITTED_BYTES: u64 = 1 << 20;

/// `rename(from, to)` that fails with `EEXIST` rather than replace `to` (an empty directory
/// would be replaced silently). Filesystems without `RENAME_NOREPLACE` get a plain rename:
/// `from` is never empty, so it cannot replace a directory that holds anything.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let cwd = rustix::fs::CWD;
    match rustix::fs::renameat_with(cwd, from, cwd, to, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL) => fs::rename(from, to),
        r => Ok(r?),
    }
}

/// Removes what creators that died left in `STATE/branches/.new/` (`<pid>-<id>`, the pid
/// gone). Best effort: a leftover costs a few empty directories until the next creation.
fn sweep_unfinished(unfinished: &Path) {
    let Ok(entries) = fs::read_dir(unfinished) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if left_by_dead_creator(&name) {
            let _ = remove_dir_robust(unfinished, &name, Durability::Lazy);
        }
    }
}

/// Whether `name` (`<pid>-<id>` in a `.new/` directory: something being made) was left
/// by a creator that is gone. Best effort: a pid may have been reused.
pub(crate) fn left_by_dead_creator(name: &OsStr) -> bool {
    name.to_str()
        .and_then(|n| n.split_once('-'))
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
        .is_some_and(|pid| !pid_alive(pid))
}

/// Removes the branches set aside in `branches/.gone/` ([`Removal::Deferred`]), on a thread
/// of its own while the caller goes on to start its sandbox. Best effort: if the process ends
/// first, what is left is removed by a later creation (an entry there is never listed, and is
/// garbage whatever state it is in).
fn sweep_discarded_in_background(branches: &Path) {
    let gone = branches.join(DISCARDED);
    let has_entries = fs::read_dir(&gone).is_ok_and(|mut rd| rd.next().is_some());
    if !has_entries {
        return;
    }
    let sweep = move || {
        let Ok(entries) = fs::read_dir(&gone) else {
            return;
        };
        for entry in entries.flatten() {
            let _ = remove_dir_robust(&gone, &entry.file_name(), Durability::Lazy);
        }
    };
    // Detached: nothing waits for it. If no thread can be made, the next creation tries again.
    let _ = std::thread::Builder::new()
        .name("lockbox-sweep".into())
        .spawn(sweep);
}

/// Whether `dir` is a directory without entries (false if it cannot be read).
fn is_empty_dir(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut rd| rd.next().is_none())
}

/// Best effort: a pid may have been reused.
fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Removes the branch `id` whatever state it is in (even without a readable `meta.json`).
///
/// A partial commit of the branch interrupted after its commit point is finished first when
/// the branch can be read and its workdir is there (see [`Branch::commit_part`]), and what
/// a commit of it killed while staging left in the workdir is removed.
pub fn abort_id(state_dir: &Path, id: &BranchId) -> Result<(), CowError> {
    let branches = branches_dir(state_dir);
    if !branches.join(id.as_str()).exists() {
        return Err(CowError::BranchNotFound {
            id: id.to_string(),
            path: branches,
        });
    }
    if let Ok(mut branch) = Branch::open(state_dir, id) {
        // No workdir: nothing of a commit can be in it, nothing to finish or remove.
        match branch
            .finish_interrupted_part()
            .and_then(|_| branch.discard_leftover_staging())
        {
            Ok(()) | Err(CowError::OpenWorkdir { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    remove_dir_robust(&branches, OsStr::new(id.as_str()), Durability::Durable)
}

/// Removes a branch directory, its `meta.json` first: a removal that a crash interrupts must
/// leave a directory [`Branch::open`] refuses, never a branch whose upper is half gone (a
/// re-commit of that would apply an emptied opaque directory as deletions). The unlink needs
/// no fsync of its own: the filesystems lockbox targets journal metadata in order, so no later
/// removal can survive a crash that the unlink did not.
fn remove_dir_robust(parent: &Path, name: &OsStr, durability: Durability) -> Result<(), CowError> {
    let err = |source| CowError::RemoveBranch {
        path: parent.join(name),
        source,
    };
    let fd = beneath::open_root(parent).map_err(err)?;
    match beneath::open_child_dir(fd.as_fd(), name) {
        Ok(dir) => {
            match rustix::fs::unlinkat(&dir, meta::META_FILE, rustix::fs::AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(err(e.into())),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    beneath::remove_tree_at(fd.as_fd(), name).map_err(err)?;
    if durability == Durability::Durable {
        rustix::fs::fsync(&fd).map_err(|e| err(e.into()))?;
    }
    Ok(())
}

/// One entry of [`list`].
#[derive(Debug, Clone)]
pub struct ListedBranch {
    /// The branch id.
    pub id: BranchId,
    /// `STATE/branches/<id>`.
    pub dir: PathBuf,
    /// The verified metadata, or why it could not be read (a damaged or half-created
    /// branch; it can still be removed with [`abort_id`]).
    pub meta: Result<BranchMeta, String>,
}

impl ListedBranch {
    /// True for an `active` or `committing` branch whose creating process is gone (lockbox
    /// was killed) and whose sandbox is gone too — its init, and so every process that
    /// could write into the branch (see [`SandboxInit::is_gone`]) — and for a damaged one:
    /// nobody will finish it, so it is effectively kept and can be committed as it is.
    /// A record without a sandbox init (none was started, or an older lockbox wrote it)
    /// is decided by the owner alone. Best effort for the owner: its pid may have been
    /// reused (which keeps a branch from being called an orphan, never the reverse).
    pub fn is_orphan(&self) -> bool {
        match &self.meta {
            Ok(m) => {
                matches!(m.state, BranchState::Active | BranchState::Committing)
                    && !pid_alive(m.owner_pid)
                    && m.sandbox_init.as_ref().is_none_or(SandboxInit::is_gone)
            }
            Err(_) => true,
        }
    }

    /// What happened to the branch, in words, and what to do about it (the `lockbox branch`
    /// commands that resolve it).
    pub fn status(&self) -> String {
        let id = self.id.as_str();
        let review = format!("review it with `lockbox branch diff {id}`");
        let (m, orphan) = match &self.meta {
            Ok(m) => (m, self.is_orphan()),
            Err(why) => {
                return format!(
                    "unreadable record ({why}): a creation or removal was cut short; remove it \
                     with `lockbox branch abort {id}`"
                )
            }
        };
        let failure = m.failure.as_deref().unwrap_or("reason not recorded");
        match m.state {
            BranchState::Active if !orphan && crate::is_spare(&m.context) => format!(
                "a spare fork made ahead by process {}'s pool; nothing to review",
                m.owner_pid
            ),
            BranchState::Active if !orphan && !pid_alive(m.owner_pid) => format!(
                "its lockbox (process {}) died; its sandbox (process {}) is still being \
                 stopped, so it may still write: list again once it is gone",
                m.owner_pid,
                m.sandbox_init.map_or(0, |i| i.pid)
            ),
            BranchState::Active if !orphan => format!("in use by process {}", m.owner_pid),
            BranchState::Active => format!(
                "orphan: its lockbox died before finishing it; {review}, then \
                 `lockbox branch commit {id}` or `lockbox branch abort {id}`"
            ),
            BranchState::Kept => format!(
                "kept for review: {review}, then `lockbox branch commit {id}` or \
                 `lockbox branch abort {id}`"
            ),
            BranchState::Stale => format!(
                "commit refused, the workdir changed under it ({failure}); {review}, then \
                 `lockbox branch commit --force {id}` (overwrites those paths) or \
                 `lockbox branch abort {id}`"
            ),
            BranchState::CommitFailed => format!(
                "commit failed ({failure}); fix the cause and retry with `lockbox branch \
                 commit {id}`, or `lockbox branch abort {id}`"
            ),
            BranchState::Committing if !orphan && m.failure.is_none() => {
                format!("being committed by process {}", m.owner_pid)
            }
            BranchState::Committing => format!(
                "commit interrupted part-way ({}); finish it with `lockbox branch commit \
                 {id}` (aborting leaves the workdir half-committed)",
                m.failure.as_deref().unwrap_or("its lockbox died")
            ),
        }
    }
}

/// Bounds a failure message kept in `meta.json` (a stale base can name many paths).
fn bounded(mut text: String) -> String {
    const MAX: usize = 2048;
    if text.len() > MAX {
        let mut cut = MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// Lists all branches of a state directory, sorted by id. Entries whose names are not valid
/// ids are skipped (they are not branches lockbox made).
pub fn list(state_dir: &Path) -> Result<Vec<ListedBranch>, CowError> {
    let branches = branches_dir(state_dir);
    let rd = match fs::read_dir(&branches) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CowError::ListBranches {
                path: branches,
                source,
            })
        }
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|source| CowError::ListBranches {
            path: branches.clone(),
            source,
        })?;
        let Some(Ok(id)) = entry.file_name().to_str().map(BranchId::parse) else {
            continue;
        };
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let meta = meta::read(&dir).map_err(|e| e.to_string());
        out.push(ListedBranch { id, dir, meta });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}
