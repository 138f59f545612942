//! What changed from one view of a workdir to another: two snapshots, or a snapshot and a
//! sandbox as it is now ([`diff_views`]).
//!
//! A view is a flattened upper layer over the workdir ([`crate::View`]). Only the paths one of
//! the two views changes against the workdir can differ between them, so the diff looks up
//! those paths in both views (through whiteouts and opaque directories, never following a
//! symlink) and compares what it finds: type, permission bits, size, then content or target.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::changes::{Change, ChangeKind, ChangeSet, FileType};
use crate::CowError;

/// An entry as a view shows it.
#[derive(Debug)]
struct Seen {
    /// Where its data is (in the view's upper or in the workdir).
    at: PathBuf,
    meta: std::fs::Metadata,
}

impl Seen {
    fn file_type(&self) -> FileType {
        let ft = self.meta.file_type();
        if ft.is_file() {
            FileType::File
        } else if ft.is_dir() {
            FileType::Dir
        } else if ft.is_symlink() {
            FileType::Symlink
        } else {
            FileType::Special
        }
    }

    fn mode(&self) -> u32 {
        self.meta.mode() & 0o7777
    }
}

/// The changes that turn view `from` into view `to` (both flattened uppers over `workdir`),
/// sorted by path. `Added`: `to` has the path and `from` does not; `Deleted`: the reverse
/// (with the entry `from` had); `TypeChanged` and `Modified` as in a change set. A directory
/// deleted (or replaced by a file) is listed once, not what was below it.
pub fn diff_views(from: &Path, to: &Path, workdir: &Path) -> Result<Vec<Change>, CowError> {
    let mut paths: Vec<PathBuf> = ChangeSet::compute(from, workdir)?
        .changes()
        .iter()
        .chain(ChangeSet::compute(to, workdir)?.changes())
        .map(|c| c.path.clone())
        .collect();
    paths.sort();
    paths.dedup();
    let mut out: Vec<Change> = Vec::new();
    // A path gone with its directory is said once, as a change set says it.
    let mut gone: Option<PathBuf> = None;
    for path in paths {
        if gone.as_ref().is_some_and(|g| path.starts_with(g)) {
            continue;
        }
        let a = lookup(from, workdir, &path)?;
        let b = lookup(to, workdir, &path)?;
        let (kind, shown) = match (&a, &b) {
            (None, None) => continue,
            (None, Some(b)) => (ChangeKind::Added, b),
            (Some(a), None) => (ChangeKind::Deleted, a),
            (Some(a), Some(b)) if a.file_type() != b.file_type() => (ChangeKind::TypeChanged, b),
            (Some(a), Some(b)) => {
                if same(a, b).map_err(|source| CowError::ReadUpper {
                    path: path.clone(),
                    source,
                })? {
                    continue;
                }
                (ChangeKind::Modified, b)
            }
        };
        let was_dir = a.as_ref().is_some_and(|a| a.meta.is_dir());
        let is_dir = b.as_ref().is_some_and(|b| b.meta.is_dir());
        if was_dir && !is_dir {
            gone = Some(path.clone());
        }
        out.push(Change {
            kind,
            file_type: shown.file_type(),
            size: if shown.meta.is_dir() {
                0
            } else {
                shown.meta.len()
            },
            mode: shown.mode(),
            path,
        });
    }
    Ok(out)
}

/// What the view `upper` over `workdir` shows at `rel` (relative, plain), or `None`.
fn lookup(upper: &Path, workdir: &Path, rel: &Path) -> Result<Option<Seen>, CowError> {
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some(last) = names.len().checked_sub(1) else {
        return Ok(None);
    };
    let io = |path: &Path, source: std::io::Error| CowError::ReadUpper {
        path: path.to_owned(),
        source,
    };
    // Down the upper while it has the path: a whiteout or a non-directory ends the path, an
    // opaque directory hides the workdir's below it.
    let mut at = upper.to_owned();
    let mut hidden = false;
    let mut in_upper = true;
    for (i, name) in names.iter().enumerate() {
        if !in_upper {
            break;
        }
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) => {
                if is_whiteout(&meta, &at) {
                    return Ok(None);
                }
                if i == last {
                    return Ok(Some(Seen { at, meta }));
                }
                if !meta.is_dir() {
                    return Ok(None);
                }
                if is_opaque(&at) {
                    hidden = true;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => in_upper = false,
            Err(e) => return Err(io(&at, e)),
        }
    }
    if hidden {
        return Ok(None);
    }
    // The workdir's, without following a symlink on the way.
    let mut at = workdir.to_owned();
    for (i, name) in names.iter().enumerate() {
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if i == last => return Ok(Some(Seen { at, meta })),
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&at, e)),
        }
    }
    Ok(None)
}

fn is_whiteout(meta: &std::fs::Metadata, path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if ft.is_char_device() {
        return meta.rdev() == 0;
    }
    ft.is_file()
        && meta.len() == 0
        && crate::overlay::list_xattrs(path).is_ok_and(|list| {
            list.split(|&b| b == 0)
                .any(|n| n == b"user.overlay.whiteout" || n == b"trusted.overlay.whiteout")
        })
}

fn is_opaque(dir: &Path) -> bool {
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|name| crate::overlay::get_xattr(dir, OsStr::new(name)).is_ok_and(|v| v == b"y"))
}

/// Whether two entries of one type hold the same: permission bits, and content (regular
/// files), target (symlinks) or device number.
fn same(a: &Seen, b: &Seen) -> std::io::Result<bool> {
    if a.mode() != b.mode() {
        return Ok(false);
    }
    match a.file_type() {
        FileType::Dir => Ok(true),
        FileType::Symlink => Ok(std::fs::read_link(&a.at)? == std::fs::read_link(&b.at)?),
        FileType::Special => Ok(a.meta.rdev() == b.meta.rdev()),
        FileType::File => {
            if a.meta.len() != b.meta.len() {
                return Ok(false);
            }
            if a.meta.dev() == b.meta.dev() && a.meta.ino() == b.meta.ino() {
                return Ok(true);
            }
            same_bytes(&a.at, &b.at)
        }
    }
}

/// Whether the files at `a` and `b` (neither followed) hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |p: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(p)
    };
    crate::changes::same_bytes(open(a)?, open(b)?)
}
