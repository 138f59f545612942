//! Importing an upper layer that was written elsewhere (a size-bounded tmpfs inside the
//! sandbox, `lockbox run --max-disk`) into a branch's `upper/`, faithfully: file contents
//! (holes kept: [`crate::data`]), modes and times, symlinks, whiteouts and the `overlay.*`
//! xattrs that mark opaque directories.
//!
//! Walked with directory descriptors, one component at a time (paths may exceed `PATH_MAX`),
//! reading what the sandbox made unreadable ([`OwnDir`]). All or nothing: a failed import
//! leaves `dst` empty.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, Stat};

use crate::beneath::{self, fd_path, lstat_at, sorted_names, times_of, OwnDir};
use crate::data::copy_into;
use crate::error::CowError;
use crate::overlay;

/// Copies the upper layer at `src` into the (empty) directory `dst`; returns the bytes of
/// file data copied (holes are not copied). FIFOs and sockets are kept (a commit skips them);
/// devices other than whiteouts are refused, as in a commit. On failure `dst` is emptied again.
pub fn import_upper(src: &Path, dst: &Path) -> Result<u64, CowError> {
    let read_err = |source| CowError::ImportUpper {
        path: src.to_owned(),
        source,
    };
    let from = OwnDir::open_root(src, beneath::READ).map_err(read_err)?;
    let mut to =
        OwnDir::open_root(dst, beneath::WRITE).map_err(|source| CowError::ImportUpper {
            path: dst.to_owned(),
            source,
        })?;
    let copied = copy_dir(from.as_fd(), src, to.as_fd()).and_then(|bytes| {
        let st = rustix::fs::fstat(&from).map_err(|e| read_err(e.into()))?;
        let here = OsStr::new(".");
        copy_marks(from.as_fd(), here, to.as_fd(), here)
            .and_then(|()| beneath::set_times_fd(to.as_fd(), &times_of(&st)))
            .and_then(|()| to.set_mode(st.st_mode & 0o7777))
            .map_err(read_err)?;
        Ok(bytes)
    });
    if copied.is_err() {
        // Best effort: the error that matters is the one returned.
        if let Ok(names) = sorted_names(to.as_fd()) {
            for name in names {
                let _ = beneath::remove_tree_at(to.as_fd(), &name);
            }
        }
    }
    copied
}

fn copy_dir(from: BorrowedFd<'_>, from_abs: &Path, to: BorrowedFd<'_>) -> Result<u64, CowError> {
    let mut bytes = 0;
    let names = sorted_names(from).map_err(|source| CowError::ImportUpper {
        path: from_abs.to_owned(),
        source,
    })?;
    for name in names {
        let abs = from_abs.join(&name);
        let err = |source| CowError::ImportUpper {
            path: abs.clone(),
            source,
        };
        let st = lstat_at(from, &name)
            .and_then(|st| st.ok_or_else(|| io::ErrorKind::NotFound.into()))
            .map_err(err)?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                rustix::fs::mkdirat(to, &name, Mode::from_raw_mode(0o700))
                    .map_err(|e| err(e.into()))?;
                let sub_from = OwnDir::open_child(from, &name, beneath::READ).map_err(err)?;
                let mut sub_to = OwnDir::open_child(to, &name, beneath::WRITE).map_err(err)?;
                bytes += copy_dir(sub_from.as_fd(), &abs, sub_to.as_fd())?;
                // xattrs first, while the directory is still writable (`user.*` needs it).
                copy_marks(from, &name, to, &name)
                    .and_then(|()| beneath::set_times_fd(sub_to.as_fd(), &times_of(&st)))
                    .and_then(|()| sub_to.set_mode(st.st_mode & 0o7777))
                    .map_err(err)?;
            }
            FileType::RegularFile => {
                bytes += copy_file(from, &name, to, &st).map_err(err)?;
            }
            FileType::Symlink => {
                let target =
                    rustix::fs::readlinkat(from, &name, Vec::new()).map_err(|e| err(e.into()))?;
                rustix::fs::symlinkat(target.as_c_str(), to, &name).map_err(|e| err(e.into()))?;
                set_times_at(to, &name, &st).map_err(err)?;
            }
            // A whiteout: unprivileged users may create 0/0 character devices (Linux >= 5.8).
            FileType::CharacterDevice if st.st_rdev == 0 => {
                rustix::fs::mknodat(to, &name, FileType::CharacterDevice, Mode::empty(), 0)
                    .map_err(|e| err(e.into()))?;
                set_times_at(to, &name, &st).map_err(err)?;
            }
            // Kept as they are, for the commit to report as skipped (any user may make them).
            ft @ (FileType::Fifo | FileType::Socket) => {
                rustix::fs::mknodat(to, &name, ft, Mode::from_raw_mode(st.st_mode & 0o7777), 0)
                    .map_err(|e| err(e.into()))?;
                set_times_at(to, &name, &st).map_err(err)?;
            }
            _ => return Err(err(io::Error::other("devices cannot be part of a branch"))),
        }
    }
    Ok(bytes)
}

/// Copies a file's data into a new file that stays writable until its xattrs are set
/// (setting `user.*` xattrs needs write access), then sets its mode and times.
fn copy_file(from: BorrowedFd<'_>, name: &OsStr, to: BorrowedFd<'_>, st: &Stat) -> io::Result<u64> {
    let src = beneath::open_own_file(from, name)?;
    let (dst, bytes) = copy_into(&src, to, name)?;
    copy_marks(from, name, to, name)?;
    rustix::fs::fchmod(&dst, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    rustix::fs::futimens(&dst, &times_of(st))?;
    Ok(bytes)
}

/// Copies the `user.*` xattrs of `from/name` to `to/to_name` (neither followed): overlayfs's
/// own `user.overlay.*` marks and the command's `user.*` attributes, which a commit keeps.
fn copy_marks(
    from: BorrowedFd<'_>,
    name: &OsStr,
    to: BorrowedFd<'_>,
    to_name: &OsStr,
) -> io::Result<()> {
    let (src, dst) = (fd_path(from, name), fd_path(to, to_name));
    let names = overlay::list_xattrs(&src)?;
    for xname in names.split(|&b| b == 0).filter(|n| n.starts_with(b"user.")) {
        // The exact bytes: a lossy copy would name another attribute.
        let xname = OsStr::from_bytes(xname);
        let value = overlay::get_xattr(&src, xname)?;
        rustix::fs::lsetxattr(&dst, xname, &value, rustix::fs::XattrFlags::empty())?;
    }
    Ok(())
}

fn set_times_at(dir: BorrowedFd<'_>, name: &OsStr, st: &Stat) -> io::Result<()> {
    Ok(rustix::fs::utimensat(
        dir,
        name,
        &times_of(st),
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}
