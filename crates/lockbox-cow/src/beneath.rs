//! Directory-fd helpers that never follow a symlink and never leave the directory they start
//! from: every path below the workdir is resolved with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (openat2(2)), and the last component is only
//! ever touched through `*at` calls that do not follow it (`renameat`, `unlinkat`, `mkdirat`,
//! `symlinkat`, `fstatat(AT_SYMLINK_NOFOLLOW)`, `openat(O_NOFOLLOW)`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// The resolve flags used for every path below the workdir.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens a directory the caller named (the workdir, the state dir). Symlinks in *this* path
/// are followed: the caller chose it.
pub(crate) fn open_root(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory `rel` (relative, may be empty) beneath `root` as an `O_PATH` fd, usable
/// as the `dirfd` of `*at` calls. Fails with `ELOOP` if any component is a symlink.
pub(crate) fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    Ok(rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )?)
}

/// Opens an existing directory entry `name` of `dir` for reading, without following it.
pub(crate) fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the regular file `name` of `dir` for reading, without following it.
pub(crate) fn open_child_file(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(std::fs::File::from(fd))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`, with `ENOENT` as `None`.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<Stat>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The names in a directory (without `.` and `..`), sorted bytewise so walks are
/// deterministic.
pub(crate) fn sorted_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Sets the mode of the inode behind `fd`, which may be an `O_PATH` fd (no read permission
/// needed, and the inode is already pinned so no symlink can be swapped in). Goes through the
/// `/proc/self/fd` magic link because `fchmod` refuses `O_PATH` fds and rustix has no
/// `fchmodat2`.
pub(crate) fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    match rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)) {
        Ok(()) => Ok(()),
        Err(Errno::BADF) => Ok(rustix::fs::chmod(
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            Mode::from_raw_mode(mode),
        )?),
        Err(e) => Err(e.into()),
    }
}

/// Sets atime/mtime of the inode behind `fd` (possibly `O_PATH`), see [`chmod_fd`].
pub(crate) fn set_times_fd(fd: BorrowedFd<'_>, times: &rustix::fs::Timestamps) -> io::Result<()> {
    match rustix::fs::futimens(fd, times) {
        Ok(()) => Ok(()),
        Err(Errno::BADF) => Ok(rustix::fs::utimensat(
            rustix::fs::CWD,
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            times,
            AtFlags::empty(),
        )?),
        Err(e) => Err(e.into()),
    }
}

/// Opens `name` in `dir` as an `O_PATH` fd without following it.
pub(crate) fn open_child_path(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Removes `name` from `dir`: a file or symlink is unlinked (never followed); a directory is
/// emptied recursively first. Directories we may not read or write (mode `000`, like
/// overlayfs's `work/work`) are made accessible first, which works for their owner without
/// privilege. A missing `name` is not an error.
pub(crate) fn remove_tree_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let Some(st) = lstat_at(dir, name)? else {
        return Ok(());
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    if st.st_mode & 0o700 != 0o700 {
        let pinned = open_child_path(dir, name)?;
        chmod_fd(pinned.as_fd(), (st.st_mode & 0o7777) | 0o700)?;
    }
    let child = open_child_dir(dir, name)?;
    for entry in sorted_names(child.as_fd())? {
        remove_tree_at(child.as_fd(), &entry)?;
    }
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Splits a relative path into its parent (possibly empty) and last component.
pub(crate) fn split(rel: &Path) -> (&Path, &OsStr) {
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().unwrap_or(rel.as_os_str());
    (parent, name)
}
