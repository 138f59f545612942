//! The raw syscall layer: the only module of lockbox that uses `unsafe`.
//!
//! One small safe function per kernel call. Every function here is safe to call in the
//! child of a `clone` made by a multi-threaded process: none allocates, locks or logs.
//! Paths are `&CStr` built by the caller before the clone.
//!
//! Descriptors: calls made by the parent take `BorrowedFd` and return `OwnedFd`; calls the
//! init and the command child make still pass `RawFd`, because `child` manages its
//! descriptors by number (it closes them by hand, and `close_range` the rest). The socket
//! calls use rustix (its Linux backend makes the syscall directly: no allocation, no lock,
//! safe after the clone); `Errno` stays ours, as `child` reports it in a record.

use std::ffi::CStr;
use std::ptr;

mod fd;
mod fs;
mod mount;
mod ns;
mod process;
mod security;
mod signal;
mod socket;
pub use self::fd::*;
pub use self::fs::*;
pub use self::mount::*;
pub use self::ns::*;
pub use self::process::*;
pub use self::security::*;
pub use self::signal::*;
pub use self::socket::*;

/// An `errno` value returned by a failed syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    fn last() -> Errno {
        // SAFETY: __errno_location returns this thread's errno slot, always valid.
        Errno(unsafe { *libc::__errno_location() })
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

fn check(rc: libc::c_long) -> Result<libc::c_long, Errno> {
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(rc)
    }
}

fn check_int(rc: libc::c_int) -> Result<libc::c_int, Errno> {
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(rc)
    }
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno(e.raw_os_error())
}

fn opt_ptr(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(ptr::null(), CStr::as_ptr)
}
