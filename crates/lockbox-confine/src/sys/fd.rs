//! Descriptors by number: open, read, write, duplicate, close, poll, and the terminal calls.

use super::{check, check_int, errno, Errno};
use std::ffi::CStr;
use std::os::fd::{BorrowedFd, RawFd};

/// `open(path, flags, mode)`.
pub fn open(path: &CStr, flags: libc::c_int, mode: libc::mode_t) -> Result<RawFd, Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) })
}

/// Writes all of `data` to `fd`.
pub fn write_all(fd: RawFd, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        // SAFETY: `data` is a live slice of the given length.
        let rc = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        match check(rc as libc::c_long) {
            Ok(n) => data = &data[n as usize..],
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `read(2)` into `buf`, retrying on EINTR.
pub fn read(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    loop {
        // SAFETY: `buf` is a live, writable slice of the given length.
        let rc = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match check(rc as libc::c_long) {
            Err(Errno(libc::EINTR)) => continue,
            other => return other.map(|n| n as usize),
        }
    }
}

/// `dup2(old, new)`: `new` becomes a copy of `old` without `FD_CLOEXEC`.
///
/// # Safety
///
/// Whatever descriptor `new` was is replaced: the caller owns `new` (or it is not open), and
/// no other value will use or close it expecting the file it named before.
pub unsafe fn dup2(old: RawFd, new: RawFd) -> Result<(), Errno> {
    // SAFETY: descriptor numbers only, no pointers; the caller owns `new`.
    check_int(unsafe { libc::dup2(old, new) }).map(drop)
}

/// `dup3(old, new, flags)`: `new` becomes a copy of `old`, close-on-exec if `flags` says
/// `O_CLOEXEC`.
///
/// # Safety
///
/// As [`dup2`].
pub unsafe fn dup3(old: RawFd, new: RawFd, flags: libc::c_int) -> Result<(), Errno> {
    // SAFETY: descriptor numbers only, no pointers; the caller owns `new`.
    check_int(unsafe { libc::dup3(old, new, flags) }).map(drop)
}

/// Whether `fd` is close-on-exec.
pub fn is_cloexec(fd: RawFd) -> Result<bool, Errno> {
    // SAFETY: fcntl on a descriptor number; no pointers.
    let flags = check_int(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    Ok(flags & libc::FD_CLOEXEC != 0)
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd_nonblocking() -> Result<std::os::fd::OwnedFd, Errno> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .map_err(errno)
}

/// `close_range(first, ~0, CLOSE_RANGE_UNSHARE)`: the caller gets a descriptor table of its
/// own holding only the descriptors below `first` (Linux 5.9; `EINVAL` before). Closes only
/// in the new table, so nothing the other sharers own is touched.
pub fn close_range_unshare(first: u32) -> Result<(), Errno> {
    // SAFETY: no pointer arguments; what is closed is this caller's new copy.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    };
    check(rc).map(drop)
}

/// `close(2)`, ignoring errors (there is nothing useful to do about them).
///
/// # Safety
///
/// The caller owns `fd` (no `OwnedFd` or other code will use or close it) and does not use
/// the number afterwards: once closed, the number may name another file opened later.
pub unsafe fn close(fd: RawFd) {
    // SAFETY: the caller owns `fd` and does not use it afterwards.
    unsafe { libc::close(fd) };
}

/// `close_range(first, last, 0)`; falls back to closing one by one on kernels before 5.9.
///
/// # Safety
///
/// As [`close`], for every descriptor from `first` to `last`: none of them is owned by a
/// value that will still use or close it.
pub unsafe fn close_range(first: u32, last: u32) {
    // SAFETY: no pointer arguments; the caller owns every descriptor in the range.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if rc < 0 {
        for fd in first..=last.min(4096) {
            // SAFETY: in the range the caller owns.
            unsafe { close(fd as RawFd) };
        }
    }
}

/// Sets `O_NONBLOCK` on `fd` (one `ioctl(FIONBIO)`, not `F_GETFL` and `F_SETFL`).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    rustix::io::ioctl_fionbio(fd, true).map_err(errno)
}

/// Clears `FD_CLOEXEC` so that `fd` survives `execve`.
pub fn clear_cloexec(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: fcntl on a descriptor number; no pointers.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// `poll(fds, timeout_ms)`, retrying on EINTR is left to the caller.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> Result<usize, Errno> {
    // SAFETY: `fds` is a live, writable slice of pollfd.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    check_int(rc).map(|n| n as usize)
}

/// `ioctl(fd, TIOCSCTTY, 0)`: the terminal on `fd` becomes the controlling terminal of the
/// caller, a session leader without one.
pub fn set_controlling_terminal(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: TIOCSCTTY takes an integer argument; a bad descriptor is EBADF/ENOTTY.
    check_int(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0 as libc::c_int) }).map(drop)
}

/// Whether `fd` is a terminal (`isatty(3)`); `false` for a closed descriptor.
pub fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor number; a closed one is EBADF.
    unsafe { libc::isatty(fd) == 1 }
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a close-on-exec copy of `fd` numbered `>= min`.
pub fn dup_above(fd: RawFd, min: RawFd) -> Result<RawFd, Errno> {
    // SAFETY: descriptor numbers only; no pointers.
    check_int(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })
}

/// `fcntl(fd, F_SETFD, FD_CLOEXEC)`.
pub fn set_cloexec(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: descriptor numbers only; no pointers.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

/// `openat(dir, path, flags | O_CLOEXEC)`.
pub fn open_at(dir: RawFd, path: &CStr, flags: libc::c_int) -> Result<RawFd, Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC) })
}

/// Reads all of `fd`, a memfd sealed against writes and size changes (else `EPERM`: its
/// bytes could change under the reader), into `buf`; returns how many bytes it holds
/// (`E2BIG` if more than `buf` takes). Allocation-free.
pub fn read_sealed(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    let needed = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK;
    // SAFETY: F_GET_SEALS takes no argument and touches no memory of ours.
    let seals = check_int(unsafe { libc::fcntl(fd, libc::F_GET_SEALS) })?;
    if seals & needed != needed {
        return Err(Errno(libc::EPERM));
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is writable room for one `stat`.
    check_int(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled `st`.
    let len =
        usize::try_from(unsafe { st.assume_init() }.st_size).map_err(|_| Errno(libc::EINVAL))?;
    let buf = buf.get_mut(..len).ok_or(Errno(libc::E2BIG))?;
    let mut done = 0;
    while done < len {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is writable room for `rest.len()` bytes.
        let n = unsafe {
            libc::pread(
                fd,
                rest.as_mut_ptr().cast(),
                rest.len(),
                done as libc::off_t,
            )
        };
        match n {
            0 => return Err(Errno(libc::EIO)),
            n if n > 0 => done += n as usize,
            _ => match Errno::last() {
                Errno(libc::EINTR) => {}
                e => return Err(e),
            },
        }
    }
    Ok(len)
}

/// Fresh anonymous memory of its own mapping (`mmap`, unmapped when dropped): zero pages
/// that cost nothing until written, whatever the allocator holds. Room made before a
/// clone for a child that may not allocate.
#[derive(Debug)]
pub struct AnonMap {
    addr: *mut u8,
    len: usize,
}

impl AnonMap {
    /// `len` (> 0) bytes, readable and writable, not reserved against overcommit.
    pub fn new(len: usize) -> Result<AnonMap, Errno> {
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks: it
        // aliases nothing of ours.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        Ok(AnonMap {
            addr: addr.cast(),
            len,
        })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` readable and writable bytes, ours alone until drop.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `new`, not used after this.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}
