//! How overlayfs marks things in an upper layer (Documentation/filesystems/overlayfs.rst).
//!
//! With `userxattr` (the only choice in an unprivileged user namespace) the xattrs live in the
//! `user.overlay.` namespace; `trusted.overlay.` is accepted too for uppers made by root.

use std::ffi::OsStr;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::{FileType, Stat};
use rustix::io::Errno;

use crate::beneath;

const PREFIXES: [&str; 2] = ["user.overlay.", "trusted.overlay."];

/// The `overlay.*` xattr names of an upper entry (prefix stripped), read with one
/// `llistxattr`.
#[derive(Debug, Default)]
pub(crate) struct OverlayXattrs(Vec<String>);

impl OverlayXattrs {
    /// The marks of the entry `name` of the directory open as `dir` (not followed). Read
    /// through a short `/proc/self/fd` path, whatever the length of the entry's own path.
    pub(crate) fn at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OverlayXattrs> {
        let list = list_xattrs(&beneath::fd_path(dir, name))?;
        let names = list
            .split(|&b| b == 0)
            .filter_map(|name| std::str::from_utf8(name).ok())
            .filter_map(|name| PREFIXES.iter().find_map(|p| name.strip_prefix(p)))
            .map(str::to_owned)
            .collect();
        Ok(OverlayXattrs(names))
    }

    fn has(&self, suffix: &str) -> bool {
        self.0.iter().any(|n| n == suffix)
    }

    /// Copied up from a lower entry (`overlay.origin` holds its file handle), so it existed
    /// in the lower layer when the branch touched it.
    pub(crate) fn has_origin(&self) -> bool {
        self.has("origin")
    }

    /// The overlayfs feature the entry depends on that a change set cannot represent:
    /// `metacopy` (a file whose data is still in the lower layer) or `redirect` (a directory
    /// renamed without copying). Both are off in the unprivileged mounts lockbox makes.
    pub(crate) fn unsupported_feature(&self) -> Option<&'static str> {
        ["metacopy", "redirect"].into_iter().find(|f| self.has(f))
    }
}

/// A whiteout: a 0/0 character device, or (Linux >= 6.7 "xattr whiteouts") an empty regular
/// file carrying `overlay.whiteout`.
pub(crate) fn is_whiteout(st: &Stat, xattrs: &OverlayXattrs) -> bool {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::CharacterDevice => st.st_rdev == 0,
        FileType::RegularFile if st.st_size == 0 => xattrs.has("whiteout"),
        _ => false,
    }
}

/// An opaque directory (`overlay.opaque=y`): nothing of the lower directory shows through.
/// (`x` means "holds xattr whiteouts", not opaque.)
pub(crate) fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    PREFIXES.iter().any(|p| {
        let mut buf = [0u8; 4];
        matches!(
            rustix::fs::fgetxattr(dir, format!("{p}opaque"), &mut buf[..]),
            Ok(1) if buf[0] == b'y'
        )
    })
}

/// The NUL-separated names of the xattrs of `path` (not followed), whatever their total size
/// (a sandbox may set many `user.*` xattrs; a short read would hide the overlay's marks).
/// A filesystem without xattrs has none.
pub(crate) fn list_xattrs(path: &Path) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::llistxattr(path, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) => {
                let size = rustix::fs::llistxattr(path, &mut [0u8; 0][..])?;
                buf = vec![0u8; size.max(buf.len() * 2)];
            }
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The value of the xattr `name` of `path` (not followed), whatever its size.
pub(crate) fn get_xattr(path: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) => {
                let size = rustix::fs::lgetxattr(path, name, &mut [0u8; 0][..])?;
                buf = vec![0u8; size.max(buf.len() * 2)];
            }
            Err(e) => return Err(e.into()),
        }
    }
}
