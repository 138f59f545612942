//! [`ChangeSet`]: what a branch would do to its workdir, computed from the overlayfs upper
//! layer against the lower layer (the workdir as it is now).
//!
//! Rules (see `docs/cow.md`):
//! - a whiteout is a deletion of the lower entry (of its whole subtree for a directory); a
//!   whiteout over nothing is dropped;
//! - an opaque directory (`overlay.opaque=y`) replaces the lower directory: lower entries with
//!   no upper counterpart become deletions. Opacity is inherited: below an opaque directory no
//!   lower entry shows through, even in subdirectories that carry no mark;
//! - an upper entry with no lower entry is `Added`; over a lower entry of another type it is
//!   `TypeChanged`; over one of the same type it is `Modified` if content, symlink target,
//!   permission bits, size or mtime differ, and is dropped if nothing differs (a copy-up
//!   without a write);
//! - a directory whose permission bits are unchanged is not itself a change (its mtime only
//!   reflects entry changes, which are listed themselves), but is walked.
//!
//! Entries the branch wrote that change nothing *now* — a file or symlink equal to the
//! workdir's, a whiteout over nothing, an opaque directory with the workdir's mode — are not
//! changes, but they are writes: the walk of a commit's validation ([`Walker::witnesses`])
//! yields them as `unchanged` items for the stale-base check alone (a rival may have written
//! the same bytes first: see `stale.rs`).
//!
//! Order: depth first, entries of a directory sorted bytewise, so a parent always comes before
//! its children and the order is the same as sorting the paths with `Path`'s `Ord`.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use lockbox_policy::name::quoted;
use rustix::fs::{FileType as RawType, Stat};

use crate::beneath::{self, lstat_at, open_child_dir, open_child_file, sorted_names, OwnDir};
use crate::overlay;
use crate::CowError;

/// What happens to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// The path is new.
    Added,
    /// Same type, different content, target or metadata.
    Modified,
    /// The path (and, for a directory, its whole subtree) goes away.
    Deleted,
    /// Replaced by an entry of another type (file by directory, symlink by file, ...).
    TypeChanged,
}

impl ChangeKind {
    /// The one-letter code of `--dry-run` output: `A`, `M`, `D` or `T`.
    pub fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
            ChangeKind::TypeChanged => 'T',
        }
    }
}

/// The type of the entry a change leaves behind (for `Deleted`: of the entry removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = FileTypeName))]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket: listed; a commit leaves FIFOs and sockets out (reported in
    /// [`crate::CommitReport::skipped`]) and refuses devices.
    Special,
}

impl FileType {
    pub(crate) fn of(st: &Stat) -> FileType {
        match RawType::from_raw_mode(st.st_mode) {
            RawType::RegularFile => FileType::File,
            RawType::Directory => FileType::Dir,
            RawType::Symlink => FileType::Symlink,
            _ => FileType::Special,
        }
    }
}

/// One entry of a change set.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Change {
    /// The path relative to the workdir (in JSON: a string, or `{"bytes": base64}` when it
    /// is not UTF-8; see `lockbox_policy::name`).
    #[serde(with = "lockbox_policy::name::json")]
    pub path: PathBuf,
    /// What happens to it.
    pub kind: ChangeKind,
    /// The type of the new entry (for `Deleted`, of the old one).
    pub file_type: FileType,
    /// The size in bytes of the new entry (for `Deleted`, of the old one).
    pub size: u64,
    /// The permission bits (`0o7777`) of the new entry (for `Deleted`, of the old one).
    pub mode: u32,
}

/// What the walk knows about a change beyond [`Change`]: used by stale-base detection and by
/// commit.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub change: Change,
    /// Upper entry's (atime, mtime) as (secs, nsecs); zero for deletions.
    pub times: [(i64, i64); 2],
    /// The lower entry as found now, if any.
    pub lower: Option<LowerEntry>,
    /// The upper entry was copied up from a lower entry (`overlay.origin`).
    pub origin: bool,
    /// The branch wrote this entry but it holds what the workdir holds now (see the module
    /// doc): nothing to apply, only a stale-base check to make. Only from
    /// [`Walker::witnesses`].
    pub unchanged: bool,
    /// The upper entry is a FIFO or socket, which a commit leaves out (see
    /// [`crate::SkipReason`]).
    pub skip: Option<crate::SkipReason>,
}

/// The lower (workdir) entry a change replaces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LowerEntry {
    pub file_type: FileType,
    pub ctime: (i64, i64),
}

impl LowerEntry {
    fn of(st: &Stat) -> LowerEntry {
        LowerEntry {
            file_type: FileType::of(st),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
        }
    }
}

struct Frame {
    rel: PathBuf,
    /// Held with access granted if the sandbox took it away (see [`OwnDir`]).
    upper: OwnDir,
    lower: Option<OwnedFd>,
    opaque: bool,
    pending: std::vec::IntoIter<(OsString, bool)>,
}

/// The depth-first walk behind [`ChangeIter`]. Memory is one directory listing per level.
pub(crate) struct Walker {
    upper_root: PathBuf,
    stack: Vec<Frame>,
    /// Also yield `unchanged` items (see [`Walker::witnesses`]).
    witnesses: bool,
}

impl Walker {
    pub(crate) fn new(upper: &Path, workdir: &Path) -> Result<Walker, CowError> {
        let upper_fd =
            OwnDir::open_root(upper, beneath::READ).map_err(|source| CowError::ReadUpper {
                path: upper.to_owned(),
                source,
            })?;
        let lower_fd = beneath::open_root(workdir).map_err(|source| CowError::OpenWorkdir {
            path: workdir.to_owned(),
            source,
        })?;
        let opaque = overlay::is_opaque(upper_fd.as_fd());
        let frame = make_frame(upper, PathBuf::new(), upper_fd, Some(lower_fd), opaque)?;
        Ok(Walker {
            upper_root: upper.to_owned(),
            stack: vec![frame],
            witnesses: false,
        })
    }

    /// Also yields the entries the branch wrote that change nothing now, as `unchanged`
    /// items: what the stale-base check must see besides the changes (see the module doc).
    pub(crate) fn witnesses(mut self) -> Walker {
        self.witnesses = true;
        self
    }

    fn step(&mut self) -> Option<Result<Item, CowError>> {
        loop {
            let frame = self.stack.last_mut()?;
            let Some((name, in_upper)) = frame.pending.next() else {
                self.stack.pop();
                continue;
            };
            let rel = frame.rel.join(&name);
            let visited = if in_upper {
                self.visit_upper(&name, rel)
            } else {
                self.visit_lower_only(&name, rel)
            };
            match visited {
                Ok(Some(item)) => return Some(Ok(item)),
                Ok(None) => continue,
                Err(e) => {
                    self.stack.clear();
                    return Some(Err(e));
                }
            }
        }
    }

    fn top(&self) -> Option<&Frame> {
        self.stack.last()
    }

    /// The upper directory the walk is in. Right after a file or symlink was returned, that is
    /// the directory holding it (only a directory is descended into).
    pub(crate) fn upper_dir(&self) -> Option<BorrowedFd<'_>> {
        self.top().map(|f| f.upper.as_fd())
    }

    fn lower_stat(&self, name: &OsString, rel: &Path) -> Result<Option<Stat>, CowError> {
        match self.top().and_then(|f| f.lower.as_ref()) {
            Some(lower) => lstat_at(lower.as_fd(), name).map_err(|source| CowError::ReadLower {
                path: rel.to_owned(),
                source,
            }),
            None => Ok(None),
        }
    }

    fn visit_lower_only(
        &mut self,
        name: &OsString,
        rel: PathBuf,
    ) -> Result<Option<Item>, CowError> {
        Ok(self.lower_stat(name, &rel)?.map(|lst| deleted(rel, &lst)))
    }

    fn visit_upper(&mut self, name: &OsString, rel: PathBuf) -> Result<Option<Item>, CowError> {
        let Some(frame) = self.top() else {
            return Ok(None);
        };
        let abs = self.upper_root.join(&rel);
        let read_upper = |source| CowError::ReadUpper {
            path: abs.clone(),
            source,
        };
        let ust = lstat_at(frame.upper.as_fd(), name)
            .map_err(read_upper)?
            .ok_or_else(|| read_upper(std::io::ErrorKind::NotFound.into()))?;
        let lst = self.lower_stat(name, &rel)?;
        let xattrs = overlay::OverlayXattrs::at(frame.upper.as_fd(), name).map_err(read_upper)?;
        if overlay::is_whiteout(&ust, &xattrs) {
            return Ok(match lst {
                Some(l) => Some(deleted(rel, &l)),
                // Overlayfs leaves a whiteout only over an entry the layers below had: the
                // workdir's (removed since the branch deleted it), or an earlier stage's.
                None if self.witnesses && frame.lower.is_some() => Some(Item {
                    unchanged: true,
                    ..deleted_nothing(rel)
                }),
                None => None,
            });
        }
        if let Some(feature) = xattrs.unsupported_feature() {
            return Err(CowError::UnsupportedOverlay { path: abs, feature });
        }
        let utype = FileType::of(&ust);
        // `unchanged`: an entry the branch wrote with what the workdir holds now.
        let mut unchanged = false;
        let mut kind = match (&lst, utype) {
            (None, _) => Some(ChangeKind::Added),
            (Some(l), t) if FileType::of(l) != t => Some(ChangeKind::TypeChanged),
            (Some(l), FileType::Dir) => {
                (l.st_mode & 0o7777 != ust.st_mode & 0o7777).then_some(ChangeKind::Modified)
            }
            (Some(l), _) => {
                if !self.same_content(name, &rel, &ust, l, utype)? {
                    Some(ChangeKind::Modified)
                } else if self.witnesses {
                    unchanged = true;
                    Some(ChangeKind::Modified)
                } else {
                    None
                }
            }
        };
        let replaces_dir = utype == FileType::Dir
            && self.descend(name, rel.clone(), &abs, lst.as_ref())?
            && lst
                .as_ref()
                .is_some_and(|l| FileType::of(l) == FileType::Dir);
        // An opaque directory over the workdir's (`rm -r d; mkdir d`) replaced it, whatever
        // its mode.
        if kind.is_none() && replaces_dir && self.witnesses {
            unchanged = true;
            kind = Some(ChangeKind::Modified);
        }
        let item = kind.map(|kind| Item {
            change: Change {
                path: rel.clone(),
                kind,
                file_type: utype,
                size: if utype == FileType::File {
                    ust.st_size as u64
                } else {
                    0
                },
                mode: ust.st_mode & 0o7777,
            },
            times: [
                (ust.st_atime, ust.st_atime_nsec as i64),
                (ust.st_mtime, ust.st_mtime_nsec as i64),
            ],
            lower: lst.as_ref().map(LowerEntry::of),
            origin: lst.is_none() && xattrs.has_origin(),
            unchanged,
            skip: crate::SkipReason::of(RawType::from_raw_mode(ust.st_mode)),
        });
        Ok(item)
    }

    /// Pushes the frame of the upper directory `name`; whether it is opaque (marked, or below
    /// an opaque directory).
    fn descend(
        &mut self,
        name: &OsString,
        rel: PathBuf,
        abs: &Path,
        lst: Option<&Stat>,
    ) -> Result<bool, CowError> {
        let Some(frame) = self.top() else {
            return Ok(false);
        };
        let upper =
            OwnDir::open_child(frame.upper.as_fd(), name, beneath::READ).map_err(|source| {
                CowError::ReadUpper {
                    path: abs.to_owned(),
                    source,
                }
            })?;
        let lower_is_dir = lst.is_some_and(|l| FileType::of(l) == FileType::Dir);
        let lower = match (&frame.lower, lower_is_dir) {
            (Some(parent), true) => {
                Some(open_child_dir(parent.as_fd(), name).map_err(|source| {
                    CowError::ReadLower {
                        path: rel.clone(),
                        source,
                    }
                })?)
            }
            _ => None,
        };
        let opaque = frame.opaque || overlay::is_opaque(upper.as_fd());
        let new = make_frame(abs, rel, upper, lower, opaque)?;
        self.stack.push(new);
        Ok(opaque)
    }

    /// True when a lower and an upper entry of the same type (file or symlink) hold the same
    /// thing: same permission bits, size, mtime and bytes (or link target).
    fn same_content(
        &self,
        name: &OsString,
        rel: &Path,
        ust: &Stat,
        lst: &Stat,
        t: FileType,
    ) -> Result<bool, CowError> {
        let Some(frame) = self.top() else {
            return Ok(false);
        };
        let Some(lower) = frame.lower.as_ref() else {
            return Ok(false);
        };
        let abs = self.upper_root.join(rel);
        let up_err = |source| CowError::ReadUpper {
            path: abs.clone(),
            source,
        };
        let low_err = |source| CowError::ReadLower {
            path: rel.to_owned(),
            source,
        };
        match t {
            FileType::Symlink => {
                let u = rustix::fs::readlinkat(frame.upper.as_fd(), name, Vec::new())
                    .map_err(|e| up_err(e.into()))?;
                let l = rustix::fs::readlinkat(lower.as_fd(), name, Vec::new())
                    .map_err(|e| low_err(e.into()))?;
                Ok(u == l)
            }
            FileType::File => {
                if ust.st_mode & 0o7777 != lst.st_mode & 0o7777
                    || ust.st_size != lst.st_size
                    || (ust.st_mtime, ust.st_mtime_nsec) != (lst.st_mtime, lst.st_mtime_nsec)
                {
                    return Ok(false);
                }
                let u = beneath::open_own_file(frame.upper.as_fd(), name).map_err(up_err)?;
                let l = open_child_file(lower.as_fd(), name).map_err(low_err)?;
                // A `user.*` xattr set in the sandbox is a change a commit carries.
                if crate::commit::user_xattrs(u.as_fd()).map_err(up_err)?
                    != crate::commit::user_xattrs(l.as_fd()).map_err(low_err)?
                {
                    return Ok(false);
                }
                same_bytes(u, l).map_err(up_err)
            }
            FileType::Dir | FileType::Special => Ok(false),
        }
    }
}

pub(crate) fn same_bytes(mut a: std::fs::File, mut b: std::fs::File) -> std::io::Result<bool> {
    let mut ba = vec![0u8; 64 * 1024];
    let mut bb = vec![0u8; 64 * 1024];
    loop {
        let n = read_full(&mut a, &mut ba)?;
        let m = read_full(&mut b, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn deleted(rel: PathBuf, lst: &Stat) -> Item {
    let file_type = FileType::of(lst);
    Item {
        change: Change {
            path: rel,
            kind: ChangeKind::Deleted,
            file_type,
            size: if file_type == FileType::File {
                lst.st_size as u64
            } else {
                0
            },
            mode: lst.st_mode & 0o7777,
        },
        times: [(0, 0); 2],
        lower: Some(LowerEntry::of(lst)),
        origin: false,
        unchanged: false,
        skip: None,
    }
}

/// A deletion of an entry that is already gone from the workdir (its type unknown).
fn deleted_nothing(rel: PathBuf) -> Item {
    Item {
        change: Change {
            path: rel,
            kind: ChangeKind::Deleted,
            file_type: FileType::File,
            size: 0,
            mode: 0,
        },
        times: [(0, 0); 2],
        lower: None,
        origin: false,
        unchanged: false,
        skip: None,
    }
}

fn make_frame(
    abs: &Path,
    rel: PathBuf,
    upper: OwnDir,
    lower: Option<OwnedFd>,
    opaque: bool,
) -> Result<Frame, CowError> {
    let names = sorted_names(upper.as_fd()).map_err(|source| CowError::ReadUpper {
        path: abs.to_owned(),
        source,
    })?;
    let mut pending: Vec<(OsString, bool)> = names.into_iter().map(|n| (n, true)).collect();
    if let (true, Some(lower)) = (opaque, lower.as_ref()) {
        let lower_names = sorted_names(lower.as_fd()).map_err(|source| CowError::ReadLower {
            path: rel.clone(),
            source,
        })?;
        let lower_only: Vec<(OsString, bool)> = lower_names
            .into_iter()
            .filter(|n| pending.binary_search_by(|(p, _)| p.cmp(n)).is_err())
            .map(|n| (n, false))
            .collect();
        pending.extend(lower_only);
        pending.sort();
    }
    Ok(Frame {
        rel,
        upper,
        lower,
        opaque,
        pending: pending.into_iter(),
    })
}

impl Iterator for Walker {
    type Item = Result<Item, CowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.step()
    }
}

/// A streaming iterator over the changes of an upper layer, in [`ChangeSet`] order. Memory use
/// is one directory listing per level of depth, not one entry per change. After the first
/// error it ends.
pub struct ChangeIter {
    walker: Walker,
    /// The flattened view the walker reads, kept until the walk ends.
    _view: Option<crate::view::View>,
}

impl std::fmt::Debug for ChangeIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeIter")
            .field("upper", &self.walker.upper_root)
            .finish_non_exhaustive()
    }
}

impl ChangeIter {
    /// Starts walking `upper` (an overlayfs upper directory) against `workdir` (its lower).
    pub fn new(upper: &Path, workdir: &Path) -> Result<ChangeIter, CowError> {
        Ok(ChangeIter {
            walker: Walker::new(upper, workdir)?,
            _view: None,
        })
    }

    /// Walks `view` against `workdir`, keeping the view until the walk is dropped.
    pub(crate) fn of_view(view: crate::view::View, workdir: &Path) -> Result<ChangeIter, CowError> {
        Ok(ChangeIter {
            walker: Walker::new(view.path(), workdir)?,
            _view: Some(view),
        })
    }
}

impl Iterator for ChangeIter {
    type Item = Result<Change, CowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.walker.next().map(|r| r.map(|item| item.change))
    }
}

/// All changes of a branch, sorted (see the module doc). For huge sets prefer [`ChangeIter`].
// Deserialize: a change set travels in reports (e.g. a journaled transaction outcome).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ChangeSet {
    changes: Vec<Change>,
}

impl ChangeSet {
    /// Computes the whole change set of `upper` against `workdir`.
    pub fn compute(upper: &Path, workdir: &Path) -> Result<ChangeSet, CowError> {
        Ok(ChangeSet {
            changes: ChangeIter::new(upper, workdir)?.collect::<Result<_, _>>()?,
        })
    }

    /// The changes, in order.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// True if committing would do nothing.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// `A path` / `M path` / `D path` / `T path`, one per line (the `--dry-run` format), each
    /// path quoted when it holds anything a terminal acts on (`lockbox_policy::name::quoted`):
    /// one line per change, whatever the names.
    pub fn to_lines(&self) -> String {
        let mut out = String::new();
        for c in &self.changes {
            out.push_str(&format!("{} {}\n", c.kind.letter(), quoted(&c.path)));
        }
        out
    }
}

impl IntoIterator for ChangeSet {
    type Item = Change;
    type IntoIter = std::vec::IntoIter<Change>;
    fn into_iter(self) -> Self::IntoIter {
        self.changes.into_iter()
    }
}
