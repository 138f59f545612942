//! The few raw operations the in-sandbox agent (`lockbox-agent`) needs, as safe functions,
//! so that the agent itself has no `unsafe` (it is `#![forbid(unsafe_code)]`). Each one is
//! a thin wrapper over this crate's syscall layer, whose `// SAFETY:` comments sit next to
//! the `unsafe` blocks; what a caller must still respect is said on each function.
//!
//! Descriptors are passed by number ([`RawFd`]) where the agent's shim arranges a forked
//! child's descriptor table by hand (as `child` does for `lockbox run`).
//!
//! Not here: anything that builds or enters a sandbox (see [`crate::Spawn`]).

use std::os::fd::{OwnedFd, RawFd};

use crate::sys;
pub use crate::sys::Errno;

/// Makes the calling process non-dumpable (`PR_SET_DUMPABLE` 0): processes without
/// capabilities can then neither ptrace it, read its memory, nor take its descriptors.
pub fn set_non_dumpable() -> Result<(), Errno> {
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map(drop)
}

/// Makes the calling process a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphans of its
/// descendants reparent to it instead of the pid namespace's init.
pub fn set_child_subreaper() -> Result<(), Errno> {
    sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1).map(drop)
}

/// `kill(pid, sig)`.
pub fn kill(pid: i32, sig: i32) -> Result<(), Errno> {
    sys::kill(pid, sig)
}

/// Result of [`fork`].
pub use crate::sys::Fork;

/// `fork(2)` without `exec`. Only for single-threaded callers (the agent is): the child
/// then inherits no lock held by another thread and may run ordinary Rust code.
pub fn fork() -> Result<Fork, Errno> {
    sys::fork()
}

/// Leaves at once with `code` (`_exit`), without running destructors or atexit handlers:
/// how a forked child that must not return into its parent's code ends.
pub fn exit(code: i32) -> ! {
    sys::exit(code)
}

/// Takes ownership of descriptor `fd` inherited from the process that started this one,
/// if it is open and above the standard ones; `None` otherwise. Call it once per
/// descriptor, before anything else could open or close descriptors.
pub fn inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    (fd > 2 && std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists())
        .then(|| sys::owned(fd))
}

/// Writes all of `data` to `fd` (retrying on `EINTR`).
pub fn write_all(fd: RawFd, data: &[u8]) -> Result<(), Errno> {
    sys::write_all(fd, data)
}

/// `read(2)` into `buf`, retrying on `EINTR`.
pub fn read(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    sys::read(fd, buf)
}

/// A close-on-exec copy of `fd` numbered `>= min` (`F_DUPFD_CLOEXEC`).
pub fn dup_above(fd: RawFd, min: RawFd) -> Result<RawFd, Errno> {
    sys::dup_above(fd, min)
}

/// `dup2(old, new)`: `new` becomes a copy of `old` without `FD_CLOEXEC`.
pub fn dup2(old: RawFd, new: RawFd) -> Result<(), Errno> {
    sys::dup2(old, new)
}

/// Sets `FD_CLOEXEC` on `fd`.
pub fn set_cloexec(fd: RawFd) -> Result<(), Errno> {
    sys::set_cloexec(fd)
}

/// Closes `fd`, which the caller owns by number and does not use afterwards.
pub fn close(fd: RawFd) {
    sys::close(fd)
}

/// Closes every descriptor from `first` to `last` (`close_range`, or one by one on kernels
/// before 5.9).
pub fn close_range(first: u32, last: u32) {
    sys::close_range(first, last)
}

/// The seccomp filter the agent stacks on each command it starts: `openat2` answers
/// `ENOSYS` (the agent's own filter allows it, its commands' must not), everything else is
/// left to the sandbox's filter. Built once, installed in each command's shim.
#[derive(Debug, Clone)]
pub struct CommandFilter(seccompiler::BpfProgram);

impl CommandFilter {
    /// The filter (see `seccomp::openat2_enosys`).
    pub fn new() -> CommandFilter {
        CommandFilter(crate::seccomp::openat2_enosys())
    }

    /// Installs it on the calling thread (needs `no_new_privs`, which every sandbox has).
    pub fn install(&self) -> Result<(), Errno> {
        sys::seccomp_set_filter(&self.0)
    }
}

impl Default for CommandFilter {
    fn default() -> CommandFilter {
        CommandFilter::new()
    }
}
