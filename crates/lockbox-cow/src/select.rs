//! Committing part of a branch: a [`Selection`] of paths, and of hunks within files
//! ([`HunkChoice`]); [`select_hunks`] rewrites a flattened snapshot of an upper layer so that
//! committing it commits exactly the accepted hunks; [`Branch::commit_selected`] commits a
//! selection of a kept branch and keeps the rest in the branch.
//!
//! The shape is the one a running sandbox's commit has (`lockbox-runtime`): flatten the upper
//! into a snapshot, narrow it ([`crate::restrict`]), stage and apply it with the commit engine
//! ([`crate::stage_upper`], [`crate::apply_staged`]) under the workdir lock. A file with a
//! hunk choice is, in the snapshot: left as the branch has it when every hunk is accepted (the
//! same as committing the file), removed when none is (the workdir file is not touched), and
//! otherwise replaced by the workdir's content with the accepted hunks applied, with the
//! branch file's mode.

use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType as RawType, Mode, OFlags};

use crate::beneath::{self, lstat_at, remove_tree_at, split, OwnDir};
use crate::diff::{check_plain, new_side_digest, sides, Sides};
use crate::hunks::{apply_hunks, hunk_count};
use crate::meta::{BranchState, Rebased};
use crate::review::{review_changes, Review, Reviewed};
use crate::staged::stage_upper_from;
use crate::stale::Base;
use crate::{
    apply_staged, discard_staging, flatten, restrict, Branch, BranchId, ChangeSet, CommitOptions,
    CommitReport, CowError, WorkdirLock,
};

/// The record of a partial commit past its commit point, in the branch's directory.
pub(crate) const PART_RECORD: &str = "part-commit.json";

/// What [`Branch::commit_part`] records before it changes the workdir: enough to redo it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct PartRecord {
    /// The staging key ([`crate::stage_upper`]).
    key: String,
    plan: crate::CommitPlan,
    /// The paths it writes, relative to the workdir.
    #[serde(with = "lockbox_policy::name::json::vec")]
    written: Vec<PathBuf>,
}

/// The workdir directories above `paths` (not the root) that nobody changed since their
/// stale-base reference. A commit of `paths` adds or removes entries in them, which makes
/// them look changed by someone else to a later commit that checks them (a directory the
/// branch replaced): they get a new reference along with `paths`. One already changed keeps
/// its reference, so that change is still seen.
fn untouched_parents(workdir: &Path, paths: &[PathBuf], base: &Base<'_>) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut dirs = std::collections::BTreeSet::new();
    for path in paths {
        for dir in path.ancestors().skip(1) {
            if dir.as_os_str().is_empty() || !dirs.insert(dir.to_owned()) {
                break;
            }
        }
    }
    dirs.into_iter()
        .filter(|dir| !paths.contains(dir))
        .filter(|dir| match std::fs::symlink_metadata(workdir.join(dir)) {
            Ok(m) if m.is_dir() => {
                let at = base.for_path(dir);
                (m.ctime(), m.ctime_nsec()) < (at.secs, at.nanos)
            }
            _ => false,
        })
        .collect()
}

/// Which hunks of one file to commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HunkChoice {
    /// The file, relative to the workdir.
    pub path: PathBuf,
    /// Hunk numbers as [`Branch::hunks`] gives them (from 0, file order); empty: the file is
    /// not touched.
    pub accept: Vec<usize>,
}

/// What part of a branch to commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only these paths (and what is below them); empty: all. A path with a hunk choice
    /// that accepts something counts as selected too.
    pub only: Vec<PathBuf>,
    /// Not these (and nothing below them); wins over `only` and `hunks`.
    pub exclude: Vec<PathBuf>,
    /// Files committed with only some of their hunks.
    pub hunks: Vec<HunkChoice>,
    /// The review this commit follows, if any: then every path it writes must have been
    /// shown, as it is now (else [`CowError::StaleReview`]; see `review.rs`).
    pub review: Option<Reviewed>,
}

impl Selection {
    /// The paths a snapshot is narrowed to ([`crate::restrict`]'s `only`): `only`, and the
    /// paths of hunk choices that accept something (none if `only` is empty: all).
    pub fn only_paths(&self) -> Vec<PathBuf> {
        let mut only = self.only.clone();
        if !only.is_empty() {
            only.extend(
                self.hunks
                    .iter()
                    .filter(|h| !h.accept.is_empty())
                    .map(|h| h.path.clone()),
            );
        }
        only
    }
}

/// Rewrites `snapshot` (a flattened upper layer over `workdir`: [`crate::flatten`]) so that
/// committing it commits, for each choice, only the accepted hunks of that file (see the
/// module doc). Refuses, before changing anything, a path that is not plain
/// ([`CowError::BadPath`]) and a hunk number the file's diff does not have
/// ([`CowError::BadHunk`]; a binary file, a file the branch does not change, or one that is
/// not a regular file has none).
pub fn select_hunks(
    snapshot: &Path,
    workdir: &Path,
    choices: &[HunkChoice],
) -> Result<(), CowError> {
    // Checked first, all of them: a bad choice leaves the snapshot as it was.
    let mut plans = Vec::with_capacity(choices.len());
    for choice in choices {
        check_plain(&choice.path)?;
        let mut accept = choice.accept.clone();
        accept.sort_unstable();
        accept.dedup();
        let texts = match sides(snapshot, workdir, &choice.path)? {
            Sides::Text { old, new } => Some(Sides::texts(&old, &new)),
            Sides::Summary { .. } => None,
        };
        let count = texts.as_ref().map_or(0, |(a, b)| hunk_count(a, b));
        if let Some(&index) = accept.iter().find(|&&i| i >= count) {
            return Err(CowError::BadHunk {
                path: choice.path.clone(),
                index,
                count,
            });
        }
        plans.push((choice, accept, count, texts));
    }
    for (choice, accept, count, texts) in plans {
        match (accept.len(), texts) {
            // Every hunk: the file as the branch has it.
            (n, _) if n == count && n > 0 => {}
            (0, _) => restrict(snapshot, &[], std::slice::from_ref(&choice.path))?,
            (_, Some((old, new))) => {
                let merged = apply_hunks(&old, &new, &accept).map_err(|e| CowError::BadHunk {
                    path: choice.path.clone(),
                    index: e.index,
                    count: e.count,
                })?;
                replace_file(snapshot, workdir, &choice.path, merged.as_bytes())?;
            }
            (_, None) => {}
        }
    }
    Ok(())
}

/// Puts a regular file holding `bytes` at `rel` in the snapshot, with the mode of the
/// snapshot's file there (else the workdir's, else 0644), by a rename over what was there.
fn replace_file(snapshot: &Path, workdir: &Path, rel: &Path, bytes: &[u8]) -> Result<(), CowError> {
    let err = |source| CowError::Stage {
        path: snapshot.join(rel),
        source,
    };
    let (parent, name) = split(rel);
    let mut dir = OwnDir::open_root(snapshot, beneath::WRITE).map_err(err)?;
    for part in parent.components() {
        dir = OwnDir::open_child(dir.as_fd(), part.as_os_str(), beneath::WRITE).map_err(err)?;
    }
    let mode = match lstat_at(dir.as_fd(), name).map_err(err)? {
        Some(st) if RawType::from_raw_mode(st.st_mode) == RawType::RegularFile => {
            Some(st.st_mode & 0o7777)
        }
        _ => None,
    };
    let mode = match mode {
        Some(m) => m,
        None => workdir_mode(workdir, rel).unwrap_or(0o644),
    };
    write_and_rename(dir.as_fd(), name, bytes, mode).map_err(err)
}

fn workdir_mode(workdir: &Path, rel: &Path) -> Option<u32> {
    let root = beneath::open_root(workdir).ok()?;
    let (parent, name) = split(rel);
    let dir = beneath::open_dir_beneath(root.as_fd(), parent).ok()?;
    let st = lstat_at(dir.as_fd(), name).ok()??;
    (RawType::from_raw_mode(st.st_mode) == RawType::RegularFile).then_some(st.st_mode & 0o7777)
}

fn write_and_rename(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    let tmp = OsStr::new(".lockbox-hunks.tmp");
    remove_tree_at(dir, tmp)?;
    let fd = rustix::fs::openat(
        dir,
        tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    beneath::chmod_fd(file.as_fd(), mode)?;
    drop(file);
    rustix::fs::renameat(dir, tmp, dir, name)?;
    Ok(())
}

impl Branch {
    /// Commits `sel` of the branch into its workdir and keeps the branch, holding what was
    /// not committed (state `kept`; [`Branch::changes`] lists the rest, [`Branch::hunks`] a
    /// partly committed file's remaining hunks). Abort it afterwards to drop the rest.
    ///
    /// The stale-base rule is the one of [`Branch::commit`]: refused
    /// ([`CowError::StaleBase`], recorded as state `stale`) if the workdir changed since the
    /// branch began at a path this commit writes, unless `opts.force`. A failure is recorded
    /// as [`Branch::commit`] records it; a bad selection ([`CowError::BadPath`],
    /// [`CowError::BadHunk`]) changes nothing. See [`Branch::commit_part`].
    pub fn commit_selected(
        &mut self,
        sel: &Selection,
        opts: &CommitOptions,
    ) -> Result<CommitReport, CowError> {
        if self.meta().state == BranchState::Committing {
            return Err(CowError::BranchCommitting {
                id: self.id().to_string(),
            });
        }
        match self.commit_part(sel, opts) {
            Ok(report) if opts.dry_run => Ok(report),
            Ok(report) => {
                let mut meta = self.meta().clone();
                meta.failure = None;
                self.replace_meta(meta);
                self.set_state(BranchState::Kept)?;
                Ok(report)
            }
            // A stale review says nothing about the branch: the reviewer looks again.
            Err(e) if e.exit_code() != 2 && !matches!(e, CowError::StaleReview { .. }) => {
                let _ = self.record_failure(&e);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Commits `sel` of the branch into its workdir, leaving the branch's state as it is: for
    /// a branch in use (a running sandbox's, whose upper layer is mounted: it is read once,
    /// into a snapshot) as well as a kept one ([`Branch::commit_selected`]).
    ///
    /// The paths this commit writes get a stale-base reference of their own, taken right
    /// after it and recorded in `meta.json` ([`crate::BranchMeta::rebased`]), so that later
    /// commits of the branch do not take these writes for concurrent edits; every other path
    /// keeps the branch's. Under the workdir lock.
    ///
    /// Resumable like a full commit: once its data is staged and durable, a record of the
    /// plan (`part-commit.json` in the branch) is its commit point. A crash (or an error while
    /// applying) after it leaves the record; the next commit of any kind or abort of the
    /// branch finishes that commit first ([`Branch::finish_interrupted_part`]) and a partial
    /// one then stops with [`CowError::PartCommitFinished`]: the branch's hunks changed, so
    /// the selection asked for may no longer mean what its caller saw.
    pub fn commit_part(
        &mut self,
        sel: &Selection,
        opts: &CommitOptions,
    ) -> Result<CommitReport, CowError> {
        let workdir = self.workdir().to_owned();
        let _lock = WorkdirLock::acquire(&self.state_dir(), &workdir)?;
        if let Some(paths) = self.finish_part_locked()? {
            return Err(CowError::PartCommitFinished {
                id: self.id().to_string(),
                paths,
            });
        }
        let name = format!("select-{}", BranchId::generate());
        let snap = self.dir().join(&name);
        std::fs::create_dir(&snap).map_err(|source| CowError::Stage {
            path: snap.clone(),
            source,
        })?;
        let result = self.commit_snapshot(&snap, sel, opts);
        if let Ok(fd) = beneath::open_root(self.dir()) {
            // Best effort: the snapshot is scratch; the result is what matters.
            let _ = remove_tree_at(fd.as_fd(), OsStr::new(&name));
        }
        result
    }

    fn commit_snapshot(
        &mut self,
        snap: &Path,
        sel: &Selection,
        opts: &CommitOptions,
    ) -> Result<CommitReport, CowError> {
        let workdir = self.workdir().to_owned();
        let mut stack = vec![self.upper_dir()];
        stack.extend(self.layers().iter().cloned());
        flatten(&stack, snap)?;
        // Checked on the frozen snapshot, and a hunk file before its hunks are applied: hunk
        // numbers refer to the content that was shown (a file made binary since has another
        // digest, not just no hunks).
        let current = |path: &Path| new_side_digest(snap, &workdir, path);
        match &sel.review {
            Some(Reviewed::Token(token)) => {
                let changes = ChangeSet::compute(snap, &workdir)?;
                let rows = review_changes(snap, &workdir, changes.into_iter().collect())?;
                if Review::of(&rows).token() != *token {
                    // A token names no paths: the listing differs as a whole.
                    return Err(CowError::StaleReview { paths: Vec::new() });
                }
            }
            Some(reviewed @ Reviewed::Paths(_)) => {
                let hunk_paths: Vec<PathBuf> = sel.hunks.iter().map(|h| h.path.clone()).collect();
                hunk_paths.iter().try_for_each(|p| check_plain(p))?;
                let paths = reviewed.stale(&hunk_paths, current)?;
                if !paths.is_empty() {
                    return Err(CowError::StaleReview { paths });
                }
            }
            None => {}
        }
        select_hunks(snap, &workdir, &sel.hunks)?;
        restrict(snap, &sel.only_paths(), &sel.exclude)?;
        let written: Vec<PathBuf> = ChangeSet::compute(snap, &workdir)?
            .changes()
            .iter()
            .map(|c| c.path.clone())
            .collect();
        if let Some(reviewed) = &sel.review {
            // Every path written must have been shown as it is: one added after the review
            // was not. (Hunk files were checked above, before their hunks were applied.)
            let others: Vec<PathBuf> = written
                .iter()
                .filter(|p| !sel.hunks.iter().any(|h| &h.path == *p))
                .cloned()
                .collect();
            let paths = reviewed.stale(&others, current)?;
            if !paths.is_empty() {
                return Err(CowError::StaleReview { paths });
            }
        }
        let key = format!("{}{}", self.id(), crate::staged::PART_SUFFIX);
        // A staging directory a crash left behind (never applied: nothing needs it).
        discard_staging(&workdir, &key)?;
        let base = Base {
            at: self.meta().base_ctime,
            rebased: &self.meta().rebased,
        };
        let (plan, report) = stage_upper_from(snap, &workdir, &key, Some(base), opts)?;
        if opts.dry_run || written.is_empty() {
            discard_staging(&workdir, &key)?;
            return Ok(report);
        }
        let mut written = written;
        written.extend(untouched_parents(&workdir, &written, &base));
        let record = PartRecord { key, plan, written };
        self.write_part_record(&record)?;
        // Past the commit point: an error from here on leaves the record for a redo.
        self.apply_part(&record)?;
        Ok(report)
    }

    /// Applies a recorded partial commit (again, after a crash: [`apply_staged`] skips what
    /// is done), gives its paths their stale-base reference, removes the record.
    fn apply_part(&mut self, record: &PartRecord) -> Result<(), CowError> {
        apply_staged(self.workdir(), &record.key, &record.plan)?;
        self.rebase_paths(&record.written)?;
        let removed = std::fs::remove_file(self.dir().join(PART_RECORD))
            .and_then(|()| crate::fsync_dir(self.dir()));
        removed.map_err(|source| CowError::Stage {
            path: self.dir().join(PART_RECORD),
            source,
        })
    }

    /// Gives `paths` a stale-base reference of their own, taken now, as a commit of the
    /// branch does for the paths it writes ([`Branch::commit_part`]): for a commit of the
    /// branch's changes made by other means (a gather of running sandboxes' branches in one
    /// transaction), so that the branch's later commits do not take those writes for
    /// concurrent edits. Every other path keeps its reference.
    pub fn rebase_paths(&mut self, paths: &[PathBuf]) -> Result<(), CowError> {
        if paths.is_empty() {
            return Ok(());
        }
        let at = self.rebase_stamp()?;
        let mut meta = self.meta().clone();
        for path in paths {
            match meta.rebased.binary_search_by(|r| r.path.cmp(path)) {
                Ok(i) => meta.rebased[i].at = at,
                Err(i) => meta.rebased.insert(
                    i,
                    Rebased {
                        path: path.clone(),
                        at,
                    },
                ),
            }
        }
        let state = meta.state;
        self.replace_meta(meta);
        self.set_state(state)
    }

    fn write_part_record(&self, record: &PartRecord) -> Result<(), CowError> {
        let path = self.dir().join(PART_RECORD);
        let bytes = serde_json::to_vec(record).map_err(|e| CowError::Stage {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        crate::write_atomic(self.dir(), PART_RECORD, &bytes)
            .map_err(|source| CowError::Stage { path, source })
    }

    /// Finishes a partial commit of this branch that was interrupted after its commit point
    /// (see [`Branch::commit_part`]), under the workdir lock: the number of paths it wrote,
    /// or `None` if there was none to finish. [`Branch::commit`], [`Branch::abort`] and
    /// [`crate::abort_id`] call it first.
    pub fn finish_interrupted_part(&mut self) -> Result<Option<usize>, CowError> {
        if !self.dir().join(PART_RECORD).exists() {
            return Ok(None);
        }
        let _lock = WorkdirLock::acquire(&self.state_dir(), self.workdir())?;
        self.finish_part_locked()
    }

    /// The state directory holding the branch (`STATE/branches/ID`).
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.dir()
            .ancestors()
            .nth(2)
            .unwrap_or(Path::new("/"))
            .to_owned()
    }

    /// [`Branch::finish_interrupted_part`] with the workdir lock held.
    fn finish_part_locked(&mut self) -> Result<Option<usize>, CowError> {
        let path = self.dir().join(PART_RECORD);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CowError::ReadMeta { path, source }),
        };
        let record: PartRecord =
            serde_json::from_slice(&bytes).map_err(|e| CowError::CorruptMeta {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        self.apply_part(&record)?;
        Ok(Some(record.written.len()))
    }

    /// A stale-base reference taken now (see [`crate::stamp_base`]), strictly newer than the
    /// writes of the commit that just ended.
    fn rebase_stamp(&self) -> Result<crate::Timestamp, CowError> {
        let marker = self.dir().join(format!(".rebase-{}", BranchId::generate()));
        let err = |source| CowError::Stage {
            path: marker.clone(),
            source,
        };
        std::fs::create_dir(&marker).map_err(err)?;
        let at = crate::stamp_base(&marker);
        let _ = std::fs::remove_dir(&marker);
        at.map_err(err)
    }
}
