//! The raw syscall layer: one small function per kernel call, split by topic as youki's
//! `syscall/` is ([`fd`], [`fs`], [`mount`](mod@mount), [`ns`], [`process`], [`security`],
//! [`signal`], [`socket`]). Every function here may be called in the child of a `clone` made by a
//! multi-threaded process: none allocates, locks or logs. Paths are `&CStr` built by the
//! caller before the clone. The socket calls use rustix (its Linux backend makes the
//! syscall directly: no allocation, no lock, safe after the clone); `Errno` stays ours, as
//! `child` reports it in a record.
//!
//! **Safe or `unsafe fn`.** A function is `unsafe fn`, with a `# Safety` section, when its
//! soundness depends on its caller: ending, replacing or adopting a descriptor
//! ([`close`], [`close_range`], [`dup2`], [`send_with_fd`], [`recv_with_fds`]), running a
//! child on shared memory or a copy of a multi-threaded process ([`clone3_fork`],
//! [`spawn_vfork`], [`spawn_alongside`], [`fork`]), or moving where the heap grows
//! ([`set_mm_map`]). Every other function is sound whatever its arguments: pointers come in
//! as references, slices and `&CStr` (an `execve` argument list as a [`CStringArray`]), and
//! [`prctl`] refuses the options that would write our memory.
//!
//! **Descriptors.** Calls made by the parent (the supervising process, which has threads
//! and `OwnedFd`s) take `BorrowedFd` and return `OwnedFd`. Calls the init and the command
//! child make after the clone pass `RawFd`: the child may not allocate, and its descriptors
//! live in [`crate::child::Prepared`], built by the parent before the clone and shared with
//! the helper of `spawn_alongside`, as plain numbers the child closes by hand (and
//! `close_range` for the rest) — an `OwnedFd` there would be dropped by nobody (the child
//! ends in `_exit`) or by the wrong process. A call that only *uses* a descriptor number
//! for its own duration (`read`, `write_all`, `mount_set_readonly`, `setns`, ...) stays
//! safe: at worst it acts on whatever file has that number, or fails with `EBADF`; it can
//! neither close another owner's descriptor nor touch memory.

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
