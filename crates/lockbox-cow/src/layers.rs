//! Layer chains: [`flatten`] turns a stack of overlayfs upper layers (a pipeline's stage
//! uppers, or gather siblings stacked in priority order) into one upper layer with the same
//! view over the same lower. The result is an ordinary upper directory, so [`crate::ChangeSet`]
//! and the commit engine apply to the union of the layers unchanged.
//!
//! Rules, applying each layer onto the result from the bottom of the stack up:
//! - a whiteout removes what the result has at that path and leaves a whiteout (a 0/0
//!   character device: creating one needs no privilege since Linux 5.8);
//! - a file or symlink replaces what the result has at that path (hard-linked when possible,
//!   copied otherwise; mode and times kept);
//! - a directory merges into a result directory; it replaces a result entry that is not a
//!   directory, and then becomes opaque (`user.overlay.opaque=y`), because in the stack that
//!   entry hid everything below; an opaque directory replaces the result's directory and stays
//!   opaque. Its mode and times are the top-most layer's.
//!
//! Entries are read without following symlinks; FIFOs and sockets are carried along (a
//! commit reports them as skipped); a device, and the overlayfs features a change set cannot
//! represent (`metacopy`, `redirect`), are refused.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType as RawType, Mode, Stat};

use crate::beneath::{
    self, lstat_at, open_child_dir, remove_tree_at, sorted_names, times_of, OwnDir,
};
use crate::data::copy_into;
use crate::overlay;
use crate::CowError;

/// Applies `layers` (top first, as in an overlayfs `lowerdir=` list) onto the directory
/// `into` (empty, or an upper layer that lies below all of them), so that `into` alone shows
/// over the common lower what the whole stack shows.
pub fn flatten(layers: &[PathBuf], into: &Path) -> Result<(), CowError> {
    let dst = OwnDir::open_root(into, beneath::WRITE).map_err(|source| CowError::Stage {
        path: into.to_owned(),
        source,
    })?;
    for layer in layers.iter().rev() {
        let src =
            OwnDir::open_root(layer, beneath::READ).map_err(|source| CowError::ReadUpper {
                path: layer.clone(),
                source,
            })?;
        merge_dir(
            src.as_fd(),
            layer,
            dst.as_fd(),
            into,
            Merge::FLATTEN,
            &mut Tally::default(),
        )?;
    }
    Ok(())
}

/// What one inode costs a snapshot beyond its blocks: the filesystems a state directory
/// lives on (ext4, xfs) spend 256–512 bytes of inode table on each.
pub const INODE_COST: u64 = 512;

/// The least a directory costs a snapshot: one block where the copy lands, even when the
/// source (a tmpfs upper) reports none. Issue 32: 200,000 empty directories were counted
/// as 0 bytes and cost 786 MB and 200,000 inodes per snapshot.
pub const DIR_MIN_COST: u64 = 4096;

/// What an entry with `st` costs a snapshot, in bytes: its blocks (at least
/// [`DIR_MIN_COST`] for a directory) plus [`INODE_COST`].
pub fn entry_cost(st: &Stat) -> u64 {
    let blocks = (st.st_blocks as u64).saturating_mul(512);
    let blocks = if RawType::from_raw_mode(st.st_mode) == RawType::Directory {
        blocks.max(DIR_MIN_COST)
    } else {
        blocks
    };
    blocks.saturating_add(INODE_COST)
}

/// What a walk met: entries, and what they cost ([`entry_cost`]); with room, the walk
/// stops at the first entry beyond it, before copying it.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub entries: u64,
    pub bytes: u64,
    /// What the walk may still add: `(bytes, entries)`, each unbounded if `None`.
    pub room: (Option<u64>, Option<u64>),
}

impl Tally {
    /// A tally that refuses to grow by more than `room`.
    pub fn within(room: (Option<u64>, Option<u64>)) -> Tally {
        Tally {
            room,
            ..Tally::default()
        }
    }

    /// Counts one entry, or says which bound it would cross.
    fn count(&mut self, st: &Stat) -> Result<(), crate::SnapshotLimit> {
        let bytes = self.bytes.saturating_add(entry_cost(st));
        let entries = self.entries + 1;
        if self.room.0.is_some_and(|room| bytes > room) {
            return Err(crate::SnapshotLimit::Bytes);
        }
        if self.room.1.is_some_and(|room| entries > room) {
            return Err(crate::SnapshotLimit::Entries);
        }
        self.bytes = bytes;
        self.entries = entries;
        Ok(())
    }
}

/// Copies the upper layer `upper` into the empty directory `into`, overlay marks included
/// (whiteouts, opaque directories), never linking a file (a sandbox may be running on
/// `upper`: its processes paused, its files will change in place once they go on).
/// Counts into `tally`, stopping at its room.
pub(crate) fn capture(upper: &Path, into: &Path, tally: &mut Tally) -> Result<(), CowError> {
    let dst = OwnDir::open_root(into, beneath::WRITE).map_err(|source| CowError::Stage {
        path: into.to_owned(),
        source,
    })?;
    let src = OwnDir::open_root(upper, beneath::READ).map_err(|source| CowError::ReadUpper {
        path: upper.to_owned(),
        source,
    })?;
    merge_dir(src.as_fd(), upper, dst.as_fd(), into, Merge::CAPTURE, tally)
}

/// Copies what an overlay of `upper` over `lower` shows at `rel` to `dst_dir/dst_name`, as
/// plain files and directories: a directory of the upper that is not opaque shows the
/// lower's directory with the upper's changes applied (a whiteout removes, an opaque
/// directory replaces), without overlay marks. Files of the lower are copied, never linked
/// (a link would tie the copy to the lower's file). Keeps a losing version of a
/// conflicting path under another name; `rel` must not be a whiteout in `upper`.
pub fn copy_view(
    upper: &Path,
    lower: &Path,
    rel: &Path,
    dst_dir: &Path,
    dst_name: &OsStr,
) -> Result<(), CowError> {
    let (parent, name) = match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) => (parent, name),
        _ => {
            return Err(CowError::BadPath {
                path: rel.to_owned(),
            })
        }
    };
    let src = OwnDir::open_path(upper, parent).map_err(|source| CowError::ReadUpper {
        path: upper.join(parent),
        source,
    })?;
    let dst = beneath::open_root(dst_dir).map_err(|source| CowError::Stage {
        path: dst_dir.to_owned(),
        source,
    })?;
    let abs = upper.join(rel);
    let st = lstat_at(src.as_fd(), name)
        .and_then(|st| st.ok_or_else(|| io::ErrorKind::NotFound.into()))
        .map_err(|source| CowError::ReadUpper {
            path: abs.clone(),
            source,
        })?;
    let out = dst_dir.join(dst_name);
    let err = |source| CowError::Stage {
        path: out.clone(),
        source,
    };
    remove_tree_at(dst.as_fd(), dst_name).map_err(err)?;
    match RawType::from_raw_mode(st.st_mode) {
        RawType::Directory => {
            rustix::fs::mkdirat(dst.as_fd(), dst_name, Mode::from_raw_mode(0o700))
                .map_err(|e| err(e.into()))?;
            let s = OwnDir::open_child(src.as_fd(), name, beneath::READ).map_err(|source| {
                CowError::ReadUpper {
                    path: abs.clone(),
                    source,
                }
            })?;
            let mut d = OwnDir::open_child(dst.as_fd(), dst_name, beneath::WRITE).map_err(err)?;
            if !overlay::is_opaque(s.as_fd()) {
                if let Some(l) = lower_dir(lower, rel)? {
                    merge_dir(
                        l.as_fd(),
                        &lower.join(rel),
                        d.as_fd(),
                        &out,
                        Merge::COPY,
                        &mut Tally::default(),
                    )?;
                }
            }
            merge_dir(
                s.as_fd(),
                &abs,
                d.as_fd(),
                &out,
                Merge::RESOLVE,
                &mut Tally::default(),
            )?;
            set_dir_meta(&mut d, &st).map_err(err)
        }
        RawType::RegularFile | RawType::Symlink => place_leaf(
            src.as_fd(),
            name,
            &st,
            dst.as_fd(),
            dst_name,
            Merge::RESOLVE,
        )
        .map_err(err),
        // Carried along for the commit to report as skipped (any user may make them).
        ft @ (RawType::Fifo | RawType::Socket) => {
            let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
            rustix::fs::mknodat(dst.as_fd(), dst_name, ft, mode, 0).map_err(|e| err(e.into()))
        }
        _ => Err(CowError::SpecialFiles { paths: vec![abs] }),
    }
}

/// Copies the plain tree `src` into the existing directory `into` (merged in; files copied,
/// never linked; symlinks copied as symlinks; nothing followed; no overlay marks; nothing
/// on another filesystem on either side: mount points are skipped), for the trees a
/// snapshot keeps beside its layer (a sandbox's `/tmp`). `src` is not ours: its
/// modes are left as they are, so a directory the copier cannot read is an error naming it.
/// Returns the entries and bytes copied.
pub fn copy_tree(src: &Path, into: &Path) -> Result<(u64, u64), CowError> {
    let mut tally = Tally::default();
    copy_tree_counted(src, into, &mut tally)?;
    Ok((tally.entries, tally.bytes))
}

/// [`copy_tree`], counting into `tally` and stopping at its room.
pub(crate) fn copy_tree_counted(
    src: &Path,
    into: &Path,
    tally: &mut Tally,
) -> Result<(), CowError> {
    let dst = OwnDir::open_root(into, beneath::WRITE).map_err(|source| CowError::Stage {
        path: into.to_owned(),
        source,
    })?;
    let from = beneath::open_root(src).map_err(|source| CowError::ReadUpper {
        path: src.to_owned(),
        source,
    })?;
    let dev = |fd: BorrowedFd<'_>, path: &Path| {
        rustix::fs::fstat(fd)
            .map(|st| st.st_dev)
            .map_err(|e| CowError::Stage {
                path: path.to_owned(),
                source: e.into(),
            })
    };
    let how = Merge {
        one_fs: Some((dev(from.as_fd(), src)?, dev(dst.as_fd(), into)?)),
        ..Merge::COPY
    };
    merge_dir(from.as_fd(), src, dst.as_fd(), into, how, tally)
}

/// The workdir's directory at `rel` opened for reading, `None` if there is none (missing, not
/// a directory, or a symlink, which is never followed).
fn lower_dir(lower: &Path, rel: &Path) -> Result<Option<std::os::fd::OwnedFd>, CowError> {
    let err = |source| CowError::ReadLower {
        path: rel.to_owned(),
        source,
    };
    let root = beneath::open_root(lower).map_err(err)?;
    match beneath::open_dir_read_beneath(root.as_fd(), rel) {
        Ok(fd) => Ok(Some(fd)),
        Err(e)
            if matches!(
                rustix::io::Errno::from_io_error(&e),
                Some(
                    rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP
                )
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(err(e)),
    }
}

/// How [`merge_dir`] applies a layer.
#[derive(Debug, Clone, Copy)]
struct Merge {
    /// Keep overlay marks: a whiteout stays a whiteout, a directory that replaces becomes
    /// opaque (a layer over a lower); without them, a whiteout only removes and the result is
    /// a plain tree.
    marks: bool,
    /// Hard-link files where the filesystem allows it, instead of copying them.
    link: bool,
    /// The source is a layer only lockbox writes now: grant ourselves access to what the
    /// sandbox made unreadable ([`OwnDir`]). Never for the workdir.
    own: bool,
    /// Stay on one filesystem each side: `(source device, destination device)`. An entry
    /// of another device is a mount point (a sandbox's workdir or a grant mounted under its
    /// `/tmp`): neither copied from nor written into.
    one_fs: Option<(u64, u64)>,
}

impl Merge {
    /// Stacking layers into one ([`flatten`]).
    const FLATTEN: Merge = Merge {
        marks: true,
        link: true,
        own: true,
        one_fs: None,
    };
    /// Applying a layer's changes to a plain copy ([`copy_view`]).
    const RESOLVE: Merge = Merge {
        marks: false,
        link: true,
        own: true,
        one_fs: None,
    };
    /// Copying a live upper layer into a snapshot ([`capture`]): its files may still change
    /// in place, so never linked.
    const CAPTURE: Merge = Merge {
        marks: true,
        link: false,
        own: true,
        one_fs: None,
    };
    /// Copying a plain tree that is not ours to link to (the workdir).
    const COPY: Merge = Merge {
        marks: false,
        link: false,
        own: false,
        one_fs: None,
    };
}

fn merge_dir(
    src: BorrowedFd<'_>,
    src_abs: &Path,
    dst: BorrowedFd<'_>,
    dst_abs: &Path,
    how: Merge,
    tally: &mut Tally,
) -> Result<(), CowError> {
    let read_err = |path: PathBuf| move |source| CowError::ReadUpper { path, source };
    for name in sorted_names(src).map_err(read_err(src_abs.to_owned()))? {
        let abs = src_abs.join(&name);
        let st = lstat_at(src, &name)
            .and_then(|st| st.ok_or_else(|| io::ErrorKind::NotFound.into()))
            .map_err(read_err(abs.clone()))?;
        let xattrs = overlay::OverlayXattrs::at(src, &name).map_err(read_err(abs.clone()))?;
        if let Some(feature) = xattrs.unsupported_feature() {
            return Err(CowError::UnsupportedOverlay { path: abs, feature });
        }
        let out = dst_abs.join(&name);
        let write_err = |source| CowError::Stage {
            path: out.clone(),
            source,
        };
        let existing = lstat_at(dst, &name).map_err(write_err)?;
        if let Some((src_dev, dst_dev)) = how.one_fs {
            if st.st_dev != src_dev || existing.as_ref().is_some_and(|e| e.st_dev != dst_dev) {
                continue;
            }
        }
        tally.count(&st).map_err(|limit| CowError::SnapshotLimit {
            limit,
            path: abs.clone(),
        })?;
        if overlay::is_whiteout(&st, &xattrs) {
            if existing.is_some() {
                remove_tree_at(dst, &name).map_err(write_err)?;
            }
            if how.marks {
                rustix::fs::mknodat(dst, &name, RawType::CharacterDevice, Mode::empty(), 0)
                    .map_err(|e| write_err(e.into()))?;
            }
            continue;
        }
        match RawType::from_raw_mode(st.st_mode) {
            RawType::Directory => {
                let sub_src = if how.own {
                    OwnDir::open_child(src, &name, beneath::READ)
                } else {
                    open_child_dir(src, &name).map(OwnDir::from)
                }
                .map_err(read_err(abs.clone()))?;
                let opaque = overlay::is_opaque(sub_src.as_fd());
                let existing_dir = existing
                    .as_ref()
                    .is_some_and(|e| RawType::from_raw_mode(e.st_mode) == RawType::Directory);
                if opaque || !existing_dir {
                    if existing.is_some() {
                        remove_tree_at(dst, &name).map_err(write_err)?;
                    }
                    rustix::fs::mkdirat(dst, &name, Mode::from_raw_mode(0o700))
                        .map_err(|e| write_err(e.into()))?;
                }
                // Ours; a lower layer merged before may have given it a mode such as 000.
                let mut sub_dst =
                    OwnDir::open_child(dst, &name, beneath::WRITE).map_err(write_err)?;
                if how.marks && (opaque || (existing.is_some() && !existing_dir)) {
                    rustix::fs::fsetxattr(
                        &sub_dst,
                        "user.overlay.opaque",
                        b"y",
                        rustix::fs::XattrFlags::empty(),
                    )
                    .map_err(|e| write_err(e.into()))?;
                }
                merge_dir(sub_src.as_fd(), &abs, sub_dst.as_fd(), &out, how, tally)?;
                set_dir_meta(&mut sub_dst, &st).map_err(write_err)?;
            }
            RawType::RegularFile | RawType::Symlink => {
                if existing.is_some() {
                    remove_tree_at(dst, &name).map_err(write_err)?;
                }
                place_leaf(src, &name, &st, dst, &name, how).map_err(write_err)?;
            }
            ft @ (RawType::Fifo | RawType::Socket) => {
                if existing.is_some() {
                    remove_tree_at(dst, &name).map_err(write_err)?;
                }
                let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
                rustix::fs::mknodat(dst, &name, ft, mode, 0).map_err(|e| write_err(e.into()))?;
            }
            _ => return Err(CowError::SpecialFiles { paths: vec![abs] }),
        }
    }
    Ok(())
}

/// Times now, the mode now or when `dir`'s grant ends (see [`OwnDir::set_mode`]).
fn set_dir_meta(dir: &mut OwnDir, st: &Stat) -> io::Result<()> {
    beneath::set_times_fd(dir.as_fd(), &times_of(st))?;
    dir.set_mode(st.st_mode & 0o7777)
}

/// Puts a file or symlink at `dst/dst_name` (which must not exist): with `how.link`, a hard
/// link when the filesystem allows it (same inode: content, mode and times come along), else
/// a copy (holes kept).
fn place_leaf(
    src: BorrowedFd<'_>,
    name: &OsStr,
    st: &Stat,
    dst: BorrowedFd<'_>,
    dst_name: &OsStr,
    how: Merge,
) -> io::Result<()> {
    if how.link && rustix::fs::linkat(src, name, dst, dst_name, AtFlags::empty()).is_ok() {
        return Ok(());
    }
    let times = times_of(st);
    if RawType::from_raw_mode(st.st_mode) == RawType::Symlink {
        let target = rustix::fs::readlinkat(src, name, Vec::new())?;
        rustix::fs::symlinkat(target.as_c_str(), dst, dst_name)?;
        return Ok(rustix::fs::utimensat(
            dst,
            dst_name,
            &times,
            AtFlags::SYMLINK_NOFOLLOW,
        )?);
    }
    let from = if how.own {
        beneath::open_own_file(src, name)?
    } else {
        beneath::open_child_file(src, name)?
    };
    let (to, _) = copy_into(&from, dst, dst_name)?;
    rustix::fs::fchmod(&to, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    Ok(rustix::fs::futimens(&to, &times)?)
}

/// Narrows an upper layer (typically a flattened one) so that its change set keeps only the
/// changes at or below an `only` path (all of them when `only` is empty), plus the
/// directories on the way there, and none at or below an `exclude` path. Paths are relative
/// to the workdir. Refused ([`CowError::BadPath`]) when a path is not plain and relative,
/// or lies below a directory the layer deletes, replaces or makes opaque (keeping it
/// unchanged would need that directory's change, which is all or nothing).
pub fn restrict(upper: &Path, only: &[PathBuf], exclude: &[PathBuf]) -> Result<(), CowError> {
    for p in only.iter().chain(exclude) {
        let plain = p.components().count() > 0
            && p.components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(CowError::BadPath { path: p.clone() });
        }
    }
    let root = OwnDir::open_root(upper, beneath::WRITE).map_err(|source| CowError::ReadUpper {
        path: upper.to_owned(),
        source,
    })?;
    for p in exclude {
        let (parent, name) = beneath::split(p);
        if let Some(dir) = open_ancestors(upper, parent, p)? {
            remove_tree_at(dir.as_fd(), name).map_err(|source| CowError::Stage {
                path: upper.join(p),
                source,
            })?;
        }
    }
    if !only.is_empty() {
        prune(root.as_fd(), upper, Path::new(""), only)?;
    }
    Ok(())
}

/// Opens `parent` in the upper layer, refusing an opaque or non-directory ancestor of
/// `wanted`; `None` if the layer has no such directory (nothing to narrow there).
fn open_ancestors(upper: &Path, parent: &Path, wanted: &Path) -> Result<Option<OwnDir>, CowError> {
    let read_err = |source| CowError::ReadUpper {
        path: upper.join(parent),
        source,
    };
    let mut dir = OwnDir::open_root(upper, beneath::WRITE).map_err(read_err)?;
    for part in parent.components() {
        let name = part.as_os_str();
        match lstat_at(dir.as_fd(), name).map_err(read_err)? {
            None => return Ok(None),
            Some(st) if RawType::from_raw_mode(st.st_mode) == RawType::Directory => {
                let child =
                    OwnDir::open_child(dir.as_fd(), name, beneath::WRITE).map_err(read_err)?;
                if overlay::is_opaque(child.as_fd()) {
                    return Err(CowError::BadPath {
                        path: wanted.to_owned(),
                    });
                }
                dir = child;
            }
            Some(_) => {
                return Err(CowError::BadPath {
                    path: wanted.to_owned(),
                })
            }
        }
    }
    Ok(Some(dir))
}

fn prune(dir: BorrowedFd<'_>, upper: &Path, rel: &Path, only: &[PathBuf]) -> Result<(), CowError> {
    let err = |path: PathBuf| move |source| CowError::Stage { path, source };
    for name in sorted_names(dir).map_err(err(upper.join(rel)))? {
        let q = rel.join(&name);
        if only.iter().any(|o| q.starts_with(o)) {
            continue;
        }
        if !only.iter().any(|o| o.starts_with(&q)) {
            remove_tree_at(dir, &name).map_err(err(upper.join(&q)))?;
            continue;
        }
        // An ancestor of a selected path: keep the directory, narrow inside it.
        let st = lstat_at(dir, &name).map_err(err(upper.join(&q)))?;
        let is_dir = st.is_some_and(|st| RawType::from_raw_mode(st.st_mode) == RawType::Directory);
        let wanted = || {
            only.iter()
                .find(|o| o.starts_with(&q))
                .cloned()
                .unwrap_or_else(|| q.clone())
        };
        if !is_dir {
            return Err(CowError::BadPath { path: wanted() });
        }
        let child = OwnDir::open_child(dir, &name, beneath::WRITE).map_err(err(upper.join(&q)))?;
        if overlay::is_opaque(child.as_fd()) {
            return Err(CowError::BadPath { path: wanted() });
        }
        prune(child.as_fd(), upper, &q, only)?;
    }
    Ok(())
}
