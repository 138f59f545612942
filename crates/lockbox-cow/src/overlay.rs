//! How overlayfs marks things in an upper layer (Documentation/filesystems/overlayfs.rst).
//!
//! With `userxattr` (the only choice in an unprivileged user namespace) the xattrs live in the
//! `user.overlay.` namespace; `trusted.overlay.` is accepted too for uppers made by root.

use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::{FileType, Stat};
use rustix::io::Errno;

const PREFIXES: [&str; 2] = ["user.overlay.", "trusted.overlay."];

/// The `overlay.*` xattr names of an upper entry (prefix stripped), read with one
/// `llistxattr`.
#[derive(Debug, Default)]
pub(crate) struct OverlayXattrs(Vec<String>);

impl OverlayXattrs {
    pub(crate) fn of(abs: &Path) -> OverlayXattrs {
        let mut buf = vec![0u8; 1024];
        let n = match rustix::fs::llistxattr(abs, &mut buf[..]) {
            Ok(n) => n,
            Err(Errno::RANGE) => match rustix::fs::llistxattr(abs, &mut [0u8; 0][..]) {
                Ok(size) => {
                    buf = vec![0u8; size];
                    rustix::fs::llistxattr(abs, &mut buf[..]).unwrap_or(0)
                }
                Err(_) => 0,
            },
            Err(_) => 0,
        };
        let names = buf[..n.min(buf.len())]
            .split(|&b| b == 0)
            .filter_map(|name| std::str::from_utf8(name).ok())
            .filter_map(|name| PREFIXES.iter().find_map(|p| name.strip_prefix(p)))
            .map(str::to_owned)
            .collect();
        OverlayXattrs(names)
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
