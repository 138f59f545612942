//! Starting the init without a copy of its caller's descriptor table.
//!
//! A `clone` without `CLONE_FILES` copies the caller's whole descriptor table: a reference
//! on every file it holds, which the init drops again at step 0 (`close_other_fds`), closing
//! each one. Under `lockbox serve` that is every descriptor of the server, about 8 for each
//! live sandbox: at 1,800 live sandboxes, 6-7 ms of kernel time per create, the largest part
//! of what grew with N (issue 34, docs/benchmarks.md). A process that holds many descriptors
//! reserves a few low-numbered slots first ([`reserve`], `lockbox-runtime` does at start);
//! its spawns then:
//!
//! 1. duplicate each descriptor the init needs from the caller into a slot (the slots stay
//!    open on `/dev/null` between spawns, so no other code is ever given their numbers);
//! 2. clone with `CLONE_FILES`: the init shares the table, nothing is copied;
//! 3. the init's first act ([`adopt`]): `close_range(bound, ~0, CLOSE_RANGE_UNSHARE)`, which
//!    gives it a table of its own holding only the descriptors below `bound` (the slots, and
//!    whatever else of the caller's is that low, closed at step 0 as before); it says so
//!    through an eventfd, then duplicates each slot to the number the descriptor has in the
//!    caller, with its close-on-exec flag: from there on the init's table is what a copy
//!    would have held of what it needs;
//! 4. the caller waits for that word (or for the init's death), then puts `/dev/null` back
//!    into the slots ([`Lease::release`]).
//!
//! A process that reserved nothing, a spawn needing more than [`SLOTS`] descriptors above
//! the slots, or a kernel without `CLOSE_RANGE_UNSHARE` (Linux 5.9; the init then copies
//! the table with `unshare(CLONE_FILES)`) clone as before.

use crate::sys::{self, Errno};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How many descriptors a spawn can move through the slots.
pub const SLOTS: usize = 16;

/// How long the caller waits for the init to take its table before killing it: it takes
/// microseconds unless the machine is stopped.
const ADOPT_TIMEOUT_MS: libc::c_int = 10_000;

#[derive(Debug)]
struct Reserved {
    /// `/dev/null`, which fills the slots between spawns.
    null: OwnedFd,
    /// Copies of `null`, or of what a spawn moves, at reserved numbers.
    slots: Vec<OwnedFd>,
    /// Where the init says it has its own table (an eventfd, non-blocking).
    done: OwnedFd,
    /// One above the highest of these descriptors: what the init's table keeps.
    bound: u32,
}

static RESERVED: Mutex<Option<Reserved>> = Mutex::new(None);

fn reserved() -> MutexGuard<'static, Option<Reserved>> {
    RESERVED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reserves this process's slots; once (later calls do nothing). Call it early, while the
/// process holds few descriptors: every init gets a copy of each descriptor numbered below
/// the highest slot, closed again at its step 0.
pub fn reserve() -> std::io::Result<()> {
    reserve_slots().map_err(|Errno(e)| std::io::Error::from_raw_os_error(e))
}

fn reserve_slots() -> Result<(), Errno> {
    let mut reserved = reserved();
    if reserved.is_some() {
        return Ok(());
    }
    let null = sys::open(c"/dev/null", libc::O_RDONLY, 0)?;
    // SAFETY: just opened, owned by nothing else.
    let null = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(null) };
    let slots = (0..SLOTS)
        .map(|_| null.try_clone())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EMFILE)))?;
    let done = sys::eventfd_nonblocking()?;
    let bound = slots
        .iter()
        .chain([&null, &done])
        .map(|fd| fd.as_raw_fd() as u32 + 1)
        .max()
        .unwrap_or(0);
    *reserved = Some(Reserved {
        null,
        slots,
        done,
        bound,
    });
    Ok(())
}

/// What the init does with the slots (made before the clone, read after it: it allocates
/// nothing).
#[derive(Debug)]
pub(crate) struct Adopt {
    bound: u32,
    done: RawFd,
    /// (slot, the descriptor's number in the caller, close-on-exec).
    moves: Vec<(RawFd, RawFd, bool)>,
}

/// The caller's hold on the slots for one spawn: they carry the init's descriptors until it
/// has its own table.
#[derive(Debug)]
pub(crate) struct Lease {
    guard: MutexGuard<'static, Option<Reserved>>,
    used: usize,
}

/// Moves `needed` (the descriptors the init uses, by their numbers in the caller) into the
/// slots, for a clone with `CLONE_FILES`. `None`: clone as before (no slots reserved in this
/// process, too many descriptors, or one could not be moved).
pub(crate) fn lease(needed: &[RawFd]) -> Option<(Lease, Adopt)> {
    let guard = reserved();
    let reserved = guard.as_ref()?;
    let bound = reserved.bound;
    let mut above: Vec<RawFd> = needed
        .iter()
        .copied()
        .filter(|&fd| fd >= 0 && fd as u32 >= bound)
        .collect();
    above.sort_unstable();
    above.dedup();
    if above.len() > SLOTS {
        return None;
    }
    let done = reserved.done.as_raw_fd();
    let slots: Vec<RawFd> = reserved.slots.iter().map(AsRawFd::as_raw_fd).collect();
    let mut lease = Lease { guard, used: 0 };
    let mut moves = Vec::with_capacity(above.len());
    for (fd, slot) in above.into_iter().zip(slots) {
        let cloexec = sys::is_cloexec(fd).ok()?;
        // SAFETY: `slot` is one of the reserved descriptors, which only this module uses and
        // which the lease holds; it is put back on /dev/null when the lease ends.
        unsafe { sys::dup3(fd, slot, libc::O_CLOEXEC) }.ok()?;
        lease.used += 1;
        moves.push((slot, fd, cloexec));
    }
    Some((lease, Adopt { bound, done, moves }))
}

impl Lease {
    /// After the clone: waits until the init `pidfd` names has its own table (or is dead;
    /// killed if neither happens within 10 s), then frees the slots.
    pub(crate) fn release(self, init: BorrowedFd<'_>) {
        let Some(reserved) = self.guard.as_ref() else {
            return;
        };
        let mut fds = [
            libc::pollfd {
                fd: reserved.done.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: init.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        match poll_retrying(&mut fds, ADOPT_TIMEOUT_MS) {
            Ok(0) | Err(_) => {
                // The slots must not change under an init that may still copy them.
                let _ = sys::pidfd_send_signal(init, libc::SIGKILL);
                let _ = poll_retrying(&mut fds[1..], -1);
            }
            Ok(_) => {}
        }
        // Resets the eventfd for the next spawn (nothing to read if the init died first).
        let _ = sys::read(reserved.done.as_raw_fd(), &mut [0u8; 8]);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(reserved) = self.guard.as_ref() else {
            return;
        };
        for slot in reserved.slots.iter().take(self.used) {
            // SAFETY: the slot is reserved (see `lease`); /dev/null replaces what this
            // spawn moved into it, whose owner still holds its own descriptor.
            let _ =
                unsafe { sys::dup3(reserved.null.as_raw_fd(), slot.as_raw_fd(), libc::O_CLOEXEC) };
        }
    }
}

fn poll_retrying(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> Result<usize, Errno> {
    loop {
        match sys::poll(fds, timeout_ms) {
            Err(Errno(libc::EINTR)) => continue,
            other => return other,
        }
    }
}

/// The init's first act when cloned with `CLONE_FILES` for `adopt`: a table of its own, then
/// its descriptors at their numbers in the caller. Async-signal-safe.
pub(crate) fn adopt(a: &Adopt) -> Result<(), Errno> {
    if sys::close_range_unshare(a.bound).is_err() {
        // Before Linux 5.9: a full copy, as a clone without CLONE_FILES makes.
        sys::unshare(libc::CLONE_FILES)?;
    }
    // The caller may free the slots now: these are this table's own references.
    let _ = sys::write_all(a.done, &1u64.to_ne_bytes());
    for &(slot, fd, cloexec) in &a.moves {
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: the init's own table now; `fd` is the number the caller gave this
        // descriptor, which the init's plan uses, and nothing else of the init's is there
        // (only descriptors below `bound` were kept).
        unsafe { sys::dup3(slot, fd, flags) }?;
    }
    Ok(())
}
