//! How overlayfs marks things in an upper layer (Documentation/filesystems/overlayfs.rst).
//!
//! With `userxattr` (the only choice in an unprivileged user namespace) the xattrs live in the
//! `user.overlay.` namespace; `trusted.overlay.` is accepted too for uppers made by root.

use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::{FileType, Stat};
use rustix::io::Errno;

const PREFIXES: [&str; 2] = ["user.overlay.", "trusted.overlay."];

/// A whiteout: a 0/0 character device, or (Linux ≥ 6.7 "xattr whiteouts") an empty regular
/// file carrying `overlay.whiteout`.
pub(crate) fn is_whiteout(st: &Stat, abs: &Path) -> bool {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::CharacterDevice => st.st_rdev == 0,
        FileType::RegularFile if st.st_size == 0 => path_has_xattr(abs, "whiteout"),
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

/// The entry was copied up from a lower entry (`overlay.origin` holds its file handle), so
/// it existed in the lower layer when the branch touched it.
pub(crate) fn has_origin(abs: &Path) -> bool {
    path_has_xattr(abs, "origin")
}

/// The overlayfs feature an upper entry depends on that a change set cannot represent:
/// `metacopy` (a file whose data is still in the lower layer) or `redirect` (a directory
/// renamed without copying). Both are off in the unprivileged mounts lockbox makes.
pub(crate) fn unsupported_feature(abs: &Path) -> Option<&'static str> {
    ["metacopy", "redirect"]
        .into_iter()
        .find(|f| path_has_xattr(abs, f))
}

fn path_has_xattr(abs: &Path, suffix: &str) -> bool {
    PREFIXES.iter().any(|p| {
        let mut buf = [0u8; 1];
        matches!(
            rustix::fs::lgetxattr(abs, format!("{p}{suffix}"), &mut buf[..]),
            Ok(_) | Err(Errno::RANGE)
        )
    })
}
