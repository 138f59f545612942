//! [`WipedOnFork`]: memory for secrets that the sandbox's init never inherits.
//!
//! The init is a fork of its caller (`clone3` without `CLONE_VM`), so it starts with a copy
//! of all of the caller's memory: a credential lockbox holds to set on a sandbox's requests
//! would be in it (issue 32). Non-dumpability closes `/proc/1/mem` to the command, but the
//! copy would still be there, one kernel bug from the command. Pages advised
//! `MADV_WIPEONFORK` (Linux 4.14) are zero-filled in every child of a fork; `MADV_DONTDUMP`
//! keeps them out of core dumps. (A long-lived sandbox's init is not forked: it shares the
//! caller's memory, these pages as they are, until it executes its lean self, which it does
//! before its caller hands the sandbox any work; see `lean_init`.)

use std::io;

/// A fixed buffer of bytes in pages of their own that a forked child (a sandbox's init)
/// sees as zeros, and that are zeroed when dropped.
pub struct WipedOnFork {
    /// Start of the mapping, owned by this value.
    ptr: *mut u8,
    /// Length of the mapping (a whole number of pages, at least one).
    map_len: usize,
    /// Bytes in use.
    len: usize,
}

// SAFETY: the mapping is owned by the value and only read through `&self` after it is
// filled; no interior mutability.
unsafe impl Send for WipedOnFork {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for WipedOnFork {}

impl std::fmt::Debug for WipedOnFork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WipedOnFork(<redacted>)")
    }
}

impl WipedOnFork {
    /// Moves `bytes` into pages that forked children see as zeros, and overwrites `bytes`
    /// with zeros (the heap copy it leaves is freed clean).
    pub fn take(bytes: &mut [u8]) -> io::Result<WipedOnFork> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(1);
        let map_len = bytes.len().max(1).div_ceil(page) * page;
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            wipe(bytes);
            return Err(e);
        }
        let buf = WipedOnFork {
            ptr: ptr.cast(),
            map_len,
            len: bytes.len(),
        };
        for advice in [libc::MADV_WIPEONFORK, libc::MADV_DONTDUMP] {
            // SAFETY: the range is our own mapping.
            if unsafe { libc::madvise(ptr, map_len, advice) } != 0 {
                let e = io::Error::last_os_error();
                wipe(bytes);
                return Err(e);
            }
        }
        // SAFETY: the mapping holds `map_len >= bytes.len()` writable bytes and does not
        // overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.ptr, bytes.len()) };
        wipe(bytes);
        Ok(buf)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` initialised bytes of our mapping, alive as long
        // as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for WipedOnFork {
    fn drop(&mut self) {
        // SAFETY: our mapping, `map_len` bytes, not referred to once `self` is gone.
        let all = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.map_len) };
        wipe(all);
        // SAFETY: as above; unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.map_len) };
    }
}

/// Overwrites `bytes` with zeros in a way the compiler cannot drop as a dead store.
pub fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, exclusive reference.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_sees_zeros_and_the_source_is_wiped() {
        let mut src = b"sk-wiped-on-fork".to_vec();
        let buf = WipedOnFork::take(&mut src).unwrap();
        assert_eq!(src, vec![0; 16]);
        assert_eq!(buf.as_bytes(), b"sk-wiped-on-fork");
        let mut fds = [0; 2];
        // SAFETY: a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [r, w] = fds;
        // SAFETY: the child only reads memory and writes to a pipe, then _exits.
        match unsafe { libc::fork() } {
            0 => {
                let seen = buf.as_bytes()[0];
                // SAFETY: `w` is open; one byte from a valid address.
                unsafe {
                    libc::write(w, (&seen as *const u8).cast(), 1);
                    libc::_exit(0);
                }
            }
            pid => {
                assert!(pid > 0);
                let mut seen = 0xffu8;
                // SAFETY: `r` is open; one byte into a valid address.
                let n = unsafe { libc::read(r, (&mut seen as *mut u8).cast(), 1) };
                assert_eq!(n, 1);
                // SAFETY: our child.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                assert_eq!(seen, 0, "the child inherited the secret");
                assert_eq!(buf.as_bytes(), b"sk-wiped-on-fork", "the parent keeps it");
            }
        }
        // SAFETY: our descriptors, closed once.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }
}
