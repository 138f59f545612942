//! [`ZeroOnFree`]: the global allocator of the processes that hold credentials.
//!
//! A sandbox's init that is forked (`clone3` without `CLONE_VM`: a single command's, and any
//! where the kernel refuses `lean_init`'s shared clone) starts with a copy of all of its
//! caller's memory, the allocator's free blocks included. Under `lockbox serve`
//! a request's credential header is built, encoded and encrypted in ordinary heap buffers
//! (hyper's and rustls's, beyond lockbox's reach: only the registry's value lives in
//! [`crate::WipedOnFork`] pages); freed, they kept their bytes, and a sandbox started after
//! another sandbox's requests had such a copy in its init (issue 32, item 5). Overwriting
//! every block as it is freed leaves no freed copy for a fork to inherit. A buffer still in
//! use when the sandbox is cloned is copied as it is: the server's own stays short-lived.
//! Cost: one `explicit_bzero` per free (not elided as a dead store, unlike a plain
//! `memset` before `free`), and reallocations copy instead of growing in place.

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator, overwriting every block with zeros when it is freed. Install it
/// in a binary that holds credentials: `#[global_allocator] static A: ZeroOnFree = ZeroOnFree;`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ZeroOnFree;

// SAFETY: every method forwards to `System` with the caller's own arguments, which carry
// the `GlobalAlloc` contract; the only addition writes zeros over `layout.size()` bytes of
// a block the caller owns and is giving back (valid for writes by that same contract).
unsafe impl GlobalAlloc for ZeroOnFree {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract (see the impl's comment).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is a live block of `layout.size()` bytes owned by the caller, who
        // frees it next; `explicit_bzero` writes only within it.
        unsafe {
            libc::explicit_bzero(ptr.cast(), layout.size());
            System.dealloc(ptr, layout);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Not `System.realloc`: when it moves the block it frees the old one unzeroed.
        // SAFETY: the caller guarantees `new_size` is valid for `layout.align()`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: forwarded contract.
        let new = unsafe { System.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realloc_keeps_the_contents_and_frees_the_old_block() {
        let a = ZeroOnFree;
        let layout = Layout::from_size_align(64, 8).unwrap();
        // SAFETY: a block of `layout` from `a`, filled, then read back while still owned;
        // after the free only its address is compared, never dereferenced.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            std::ptr::write_bytes(p, 0xAB, 64);
            let q = a.realloc(p, layout, 128);
            assert!(!q.is_null());
            assert_eq!(*q.add(63), 0xAB, "realloc keeps the contents");
            a.dealloc(q, Layout::from_size_align(128, 8).unwrap());
        }
    }
}
