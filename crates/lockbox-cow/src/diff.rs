//! [`FileDiff`]: what `lockbox branch diff` prints for one path: a unified diff for text,
//! a summary for anything else.
//!
//! Shown to a person (`Display`), names are quoted and control characters of the text are
//! escaped (`lockbox_policy::name`): neither a file name nor a file's content can forge or
//! erase a line of the review.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

use lockbox_policy::name::{printable_text, quoted};

use rustix::fs::FileType as RawType;

use crate::beneath::{self, lstat_at, split, OwnDir};
use crate::hunks::{text_hunks, Hunk};
use crate::review::{self, ContentDigest};
use crate::{overlay, Branch, CowError};
use rustix::io::Errno;

/// Files larger than this are summarised, not diffed.
pub const MAX_DIFF_BYTES: u64 = 8 * 1024 * 1024;

/// One side of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side {
    /// Nothing at this path.
    Absent,
    /// A regular file of this size.
    File {
        /// Size in bytes.
        size: u64,
    },
    /// A directory.
    Dir,
    /// A symlink with this target.
    Symlink {
        /// The link target, as the kernel has it (bytes).
        target: PathBuf,
    },
    /// A device, FIFO or socket.
    Special,
}

/// The difference at one path between the workdir (old) and the branch (new).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileDiff {
    /// Both sides are text (or absent): a unified diff with `a/PATH` and `b/PATH` headers
    /// (quoted as `"a/PATH"` when PATH needs quotes, as git does); empty if they are equal.
    Text {
        /// The unified diff, raw (the `Display` form escapes control characters).
        unified: String,
    },
    /// At least one side is binary, too large, or not a regular file.
    Summary {
        /// The workdir side.
        old: Side,
        /// The branch side.
        new: Side,
    },
}

impl std::fmt::Display for FileDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileDiff::Text { unified } => f.write_str(&printable_text(unified)),
            FileDiff::Summary { old, new } => write!(f, "{} -> {}", describe(old), describe(new)),
        }
    }
}

fn describe(s: &Side) -> String {
    match s {
        Side::Absent => "absent".into(),
        Side::File { size } => format!("binary file, {size} bytes"),
        Side::Dir => "directory".into(),
        Side::Symlink { target } => format!("symlink to {}", quoted(target)),
        Side::Special => "special file".into(),
    }
}

enum Content {
    Side(Side),
    Bytes(Vec<u8>),
}

/// The hunks of the difference at one path between the workdir (old) and the branch (new):
/// [`FileDiff`] in a form one can accept part of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileHunks {
    /// Both sides are text (or absent): the hunks, numbered from 0 (none if equal).
    Text {
        /// The hunks, in file order.
        hunks: Vec<Hunk>,
    },
    /// At least one side is binary, too large, or not a regular file: no hunks.
    Summary {
        /// The workdir side.
        old: Side,
        /// The branch side.
        new: Side,
    },
}

/// Both sides of one path: texts (`None`: absent), or a summary.
pub(crate) enum Sides {
    Text {
        old: Option<Vec<u8>>,
        new: Option<Vec<u8>>,
    },
    Summary {
        old: Side,
        new: Side,
    },
}

impl Sides {
    /// The texts, lossless (they were checked to be UTF-8); empty for an absent side.
    pub(crate) fn texts(old: &Option<Vec<u8>>, new: &Option<Vec<u8>>) -> (String, String) {
        let text = |b: &Option<Vec<u8>>| {
            String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned()
        };
        (text(old), text(new))
    }
}

/// Refuses a path that is not plain and relative, or that no file can have (a NUL byte, a
/// component longer than `NAME_MAX`).
pub(crate) fn check_plain(path: &Path) -> Result<(), CowError> {
    let plain = |c: Component<'_>| match c {
        Component::Normal(name) => name.len() <= 255 && !name.as_encoded_bytes().contains(&0),
        _ => false,
    };
    if path.as_os_str().is_empty() || !path.components().all(plain) {
        return Err(CowError::BadPath {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// Both sides of `path`: the workdir's, and what `upper` (an upper layer, or a flattened
/// snapshot of one) shows over it.
pub(crate) fn sides(upper: &Path, workdir: &Path, path: &Path) -> Result<Sides, CowError> {
    Ok(reviewed_sides(upper, workdir, path)?.0)
}

/// [`sides`], and the digest of the new side, from the bytes the sides hold.
fn reviewed_sides(
    upper: &Path,
    workdir: &Path,
    path: &Path,
) -> Result<(Sides, ContentDigest), CowError> {
    check_plain(path)?;
    let new = upper_side(upper, path)?;
    let old = lower_side(workdir, path)?;
    let (new, digest) = match new {
        Some(n) => n,
        None => lower_reviewed(workdir, path)?,
    };
    let sides = match (old, new) {
        (Content::Bytes(a), Content::Bytes(b)) => text_or_summary(Some(a), Some(b)),
        (Content::Side(Side::Absent), Content::Bytes(b)) => text_or_summary(None, Some(b)),
        (Content::Bytes(a), Content::Side(Side::Absent)) => text_or_summary(Some(a), None),
        (o, n) => Sides::Summary {
            old: side_of(&o),
            new: side_of(&n),
        },
    };
    Ok((sides, digest))
}

impl Branch {
    /// Diffs one path (relative to the workdir) between the workdir and the branch. A path
    /// the branch does not touch compares equal.
    pub fn diff(&self, path: &Path) -> Result<FileDiff, CowError> {
        Ok(match sides(self.view()?.path(), self.workdir(), path)? {
            Sides::Summary { old, new } => FileDiff::Summary { old, new },
            Sides::Text { old, new } => {
                let (a, b) = Sides::texts(&old, &new);
                let header = |side: &str| quoted(&Path::new(side).join(path)).to_string();
                // Rendered from the hunks `Branch::hunks` numbers, so both always agree.
                let hunks = text_hunks(&a, &b);
                let unified = if hunks.is_empty() {
                    String::new()
                } else {
                    let mut text = format!("--- {}\n+++ {}\n", header("a"), header("b"));
                    hunks.iter().for_each(|h| text.push_str(&h.to_patch()));
                    text
                };
                FileDiff::Text { unified }
            }
        })
    }

    /// The diff of one path as numbered hunks (the same hunks [`Branch::diff`] prints), for
    /// a commit of some of them ([`crate::Selection::hunks`]).
    pub fn hunks(&self, path: &Path) -> Result<FileHunks, CowError> {
        file_hunks(self.view()?.path(), self.workdir(), path)
    }

    /// [`Branch::hunks`] with the digest of the branch side they were made from.
    pub fn hunks_reviewed(&self, path: &Path) -> Result<(FileHunks, ContentDigest), CowError> {
        file_review(self.view()?.path(), self.workdir(), path)
    }
}

/// [`Branch::hunks`] for any upper layer over `workdir` (a running sandbox's too).
pub fn file_hunks(upper: &Path, workdir: &Path, path: &Path) -> Result<FileHunks, CowError> {
    Ok(file_review(upper, workdir, path)?.0)
}

/// [`file_hunks`] and the [`ContentDigest`] of the branch side the hunks were made from:
/// what a commit of some of these hunks names ([`crate::Reviewed`]).
pub fn file_review(
    upper: &Path,
    workdir: &Path,
    path: &Path,
) -> Result<(FileHunks, ContentDigest), CowError> {
    let (sides, digest) = reviewed_sides(upper, workdir, path)?;
    let hunks = match sides {
        Sides::Summary { old, new } => FileHunks::Summary { old, new },
        Sides::Text { old, new } => {
            let (a, b) = Sides::texts(&old, &new);
            FileHunks::Text {
                hunks: text_hunks(&a, &b),
            }
        }
    };
    Ok((hunks, digest))
}

/// What the upper layer has at a path it has: nothing (a whiteout, below an opaque
/// directory, below a non-directory), or an entry of `dir`.
enum InUpper<'a> {
    Absent,
    At {
        dir: OwnDir,
        name: &'a std::ffi::OsStr,
        st: rustix::fs::Stat,
    },
}

/// The branch side's entry, or `None` when the upper layer does not have the path
/// (unchanged, or below an unchanged directory).
fn upper_entry<'a>(upper: &Path, path: &'a Path) -> Result<Option<InUpper<'a>>, CowError> {
    let abs = upper.join(path);
    let err = |source| CowError::ReadUpper {
        path: abs.clone(),
        source,
    };
    let (parent, name) = split(path);
    // One component at a time, with access to what the sandbox made unreadable.
    let dir = match OwnDir::open_path(upper, parent) {
        Ok(d) => d,
        Err(e) => {
            return match Errno::from_io_error(&e) {
                // Not in the upper: unchanged (the lower side shows through), unless an
                // opaque directory above hides the lower.
                Some(Errno::NOENT) if below_opaque(upper, parent) => Ok(Some(InUpper::Absent)),
                Some(Errno::NOENT) => Ok(None),
                // A parent is a file, symlink or whiteout in the branch: nothing is at
                // this path there.
                Some(Errno::NOTDIR | Errno::LOOP) => Ok(Some(InUpper::Absent)),
                _ => Err(err(e)),
            };
        }
    };
    let Some(st) = lstat_at(dir.as_fd(), name).map_err(err)? else {
        // In an opaque directory (`rm -r d; mkdir d`) nothing of the workdir shows through.
        return Ok(below_opaque(upper, parent).then_some(InUpper::Absent));
    };
    let marks = overlay::OverlayXattrs::at(dir.as_fd(), name).map_err(err)?;
    if overlay::is_whiteout(&st, &marks) {
        return Ok(Some(InUpper::Absent));
    }
    Ok(Some(InUpper::At { dir, name, st }))
}

/// The branch side, or `None` when the upper layer does not have the path, with the
/// digest of what it has there ([`crate::ContentDigest`]), taken from the bytes read.
fn upper_side(upper: &Path, path: &Path) -> Result<Option<(Content, ContentDigest)>, CowError> {
    let err = |source| CowError::ReadUpper {
        path: upper.join(path),
        source,
    };
    match upper_entry(upper, path)? {
        None => Ok(None),
        Some(InUpper::Absent) => Ok(Some((Content::Side(Side::Absent), review::absent()))),
        Some(InUpper::At { dir, name, st }) => {
            reviewed_content(dir.as_fd(), name, &st, beneath::open_own_file)
                .map(Some)
                .map_err(err)
        }
    }
}

/// The digest of what `upper` (over `workdir`) has at `path`: what a review shows for it
/// and a commit of it writes (see `review.rs`).
pub(crate) fn new_side_digest(
    upper: &Path,
    workdir: &Path,
    path: &Path,
) -> Result<ContentDigest, CowError> {
    let err = |source| CowError::ReadUpper {
        path: upper.join(path),
        source,
    };
    match upper_entry(upper, path)? {
        Some(InUpper::Absent) => Ok(review::absent()),
        Some(InUpper::At { dir, name, st }) => {
            review::entry(dir.as_fd(), name, &st, beneath::open_own_file).map_err(err)
        }
        None => lower_digest(workdir, path),
    }
}

fn lower_digest(workdir: &Path, path: &Path) -> Result<ContentDigest, CowError> {
    let err = |source| CowError::ReadLower {
        path: path.to_owned(),
        source,
    };
    let root = beneath::open_root(workdir).map_err(err)?;
    let (parent, name) = split(path);
    let Ok(dir) = beneath::open_dir_beneath(root.as_fd(), parent) else {
        return Ok(review::absent());
    };
    match lstat_at(dir.as_fd(), name).map_err(err)? {
        None => Ok(review::absent()),
        Some(st) => review::entry(dir.as_fd(), name, &st, beneath::open_child_file).map_err(err),
    }
}

/// [`content`] and the digest of the same entry; a regular file small enough to diff is
/// digested from the bytes the diff is made of (and its mode from the same open file), so
/// the hunks shown and the digest bound to them are of one content.
fn reviewed_content(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    st: &rustix::fs::Stat,
    open: fn(std::os::fd::BorrowedFd<'_>, &std::ffi::OsStr) -> std::io::Result<std::fs::File>,
) -> std::io::Result<(Content, ContentDigest)> {
    if RawType::from_raw_mode(st.st_mode) == RawType::RegularFile
        && st.st_size as u64 <= MAX_DIFF_BYTES
    {
        let mut file = open(dir, name)?;
        let mode = rustix::fs::fstat(file.as_fd())?.st_mode & 0o7777;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut h = review::EntryHasher::file(mode);
        h.update(&bytes);
        return Ok((Content::Bytes(bytes), h.finish()));
    }
    Ok((
        content(dir, name, st, open)?,
        review::entry(dir, name, st, open)?,
    ))
}

/// Whether `dir` of the upper layer, or a directory above it that the layer has, is opaque:
/// then the workdir's entries below it do not show through.
fn below_opaque(upper: &Path, dir: &Path) -> bool {
    let Ok(mut at) = OwnDir::open_root(upper, beneath::READ) else {
        return false;
    };
    for part in dir.components() {
        match OwnDir::open_child(at.as_fd(), part.as_os_str(), beneath::READ) {
            Ok(child) => at = child,
            Err(_) => return false,
        }
        if overlay::is_opaque(at.as_fd()) {
            return true;
        }
    }
    false
}

fn lower_side(workdir: &Path, path: &Path) -> Result<Content, CowError> {
    Ok(lower_with(workdir, path, false)?.0)
}

/// The workdir side as the new side (a path the branch does not touch), with its digest.
fn lower_reviewed(workdir: &Path, path: &Path) -> Result<(Content, ContentDigest), CowError> {
    let (content, digest) = lower_with(workdir, path, true)?;
    Ok((content, digest.unwrap_or_else(review::absent)))
}

fn lower_with(
    workdir: &Path,
    path: &Path,
    digest: bool,
) -> Result<(Content, Option<ContentDigest>), CowError> {
    let err = |source| CowError::ReadLower {
        path: path.to_owned(),
        source,
    };
    let root = beneath::open_root(workdir).map_err(err)?;
    let (parent, name) = split(path);
    let dir = match beneath::open_dir_beneath(root.as_fd(), parent) {
        Ok(d) => d,
        Err(_) => return Ok((Content::Side(Side::Absent), None)),
    };
    match lstat_at(dir.as_fd(), name).map_err(err)? {
        None => Ok((Content::Side(Side::Absent), None)),
        Some(st) if digest => {
            let (c, d) =
                reviewed_content(dir.as_fd(), name, &st, beneath::open_child_file).map_err(err)?;
            Ok((c, Some(d)))
        }
        Some(st) => Ok((
            content(dir.as_fd(), name, &st, beneath::open_child_file).map_err(err)?,
            None,
        )),
    }
}

/// What `dir/name` holds; `open` opens a regular file (granting access in the upper).
fn content(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    st: &rustix::fs::Stat,
    open: fn(std::os::fd::BorrowedFd<'_>, &std::ffi::OsStr) -> std::io::Result<std::fs::File>,
) -> std::io::Result<Content> {
    Ok(Content::Side(match RawType::from_raw_mode(st.st_mode) {
        RawType::RegularFile if st.st_size as u64 <= MAX_DIFF_BYTES => {
            let mut bytes = Vec::new();
            open(dir, name)?.read_to_end(&mut bytes)?;
            return Ok(Content::Bytes(bytes));
        }
        RawType::RegularFile => Side::File {
            size: st.st_size as u64,
        },
        RawType::Directory => Side::Dir,
        RawType::Symlink => Side::Symlink {
            target: PathBuf::from(OsString::from_vec(
                rustix::fs::readlinkat(dir, name, Vec::new())?.into_bytes(),
            )),
        },
        _ => Side::Special,
    }))
}

fn side_of(c: &Content) -> Side {
    match c {
        Content::Side(s) => s.clone(),
        Content::Bytes(b) => Side::File {
            size: b.len() as u64,
        },
    }
}

fn is_text(b: &[u8]) -> bool {
    !b.contains(&0) && std::str::from_utf8(b).is_ok()
}

/// Two texts, or a summary naming both sides (`absent` for a side that does not exist, the
/// size of one that does) when either is binary.
fn text_or_summary(old: Option<Vec<u8>>, new: Option<Vec<u8>>) -> Sides {
    let side = |b: &Option<Vec<u8>>| match b {
        Some(b) => Side::File {
            size: b.len() as u64,
        },
        None => Side::Absent,
    };
    let text = |b: &Option<Vec<u8>>| b.as_deref().is_none_or(is_text);
    if !(text(&old) && text(&new)) {
        return Sides::Summary {
            old: side(&old),
            new: side(&new),
        };
    }
    Sides::Text { old, new }
}
