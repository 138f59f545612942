//! The system calls the in-sandbox agent (`lockbox-agent`) needs, as a small safe API whose
//! soundness does not depend on its caller: the agent is `#![forbid(unsafe_code)]`, and that
//! only means something if nothing it can call safely is unsafe in disguise.
//!
//! What makes each one sound:
//! - descriptors go in and out as [`OwnedFd`]/[`BorrowedFd`]; the one descriptor the agent
//!   finds by number (its control socket, inherited across `execve`) is *copied*
//!   ([`inherited_fd`]), never adopted, so no other owner's descriptor can be closed twice;
//! - [`fork_command`] forks only a process that has a single thread (it checks), and does
//!   the descriptor surgery of the forked child itself, on descriptors it installed, before
//!   handing them over as owned values; the child never unwinds into the caller's frames.
//!
//! Not here: anything that builds or enters a sandbox (see [`crate::Spawn`]).
//!
//! The agent cannot close a descriptor by number, so it cannot close one twice: there is
//! no such function here,
//!
//! ```compile_fail
//! lockbox_confine::agent_sys::close(3);
//! ```
//!
//! and the crate's own `unsafe fn close` is not reachable from outside it:
//!
//! ```compile_fail
//! unsafe { lockbox_confine::sys::close(3) };
//! ```

use std::convert::Infallible;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

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

/// Leaves at once with `code` (`_exit`), without running destructors or atexit handlers:
/// how a forked child that must not return into its parent's code ends.
pub fn exit(code: i32) -> ! {
    sys::exit(code)
}

/// A close-on-exec copy of descriptor `fd`, inherited from the process that started this
/// one, if it is open and above the standard ones; `None` otherwise.
///
/// A copy, not `fd` itself: whoever owns `fd` in this process (if anything does) keeps it,
/// so this cannot lead to a descriptor being closed twice. `fd` stays open; a forked
/// command never sees it ([`fork_command`] closes everything it did not install).
pub fn inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    if fd <= 2 {
        return None;
    }
    let copy = sys::dup_above(fd, 3).ok()?;
    // SAFETY: `copy` is a descriptor F_DUPFD_CLOEXEC just created for us; nothing else in
    // the process knows its number, so this OwnedFd is its only owner.
    Some(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// [`inherited_fd`], with `fd` itself closed: the descriptor named on the command line of
/// a process that has just started (the agent's socket), which nothing in it owns yet.
/// Call it first thing, before anything else in the process may hold `fd`.
///
/// Why: a descriptor table is sized at each fork to the highest descriptor open in the
/// parent, and never shrinks, not at `close` nor at `execve`. The agent's socket comes with
/// the number its creator gave it, and `lockbox serve` holds several per sandbox (about
/// 16,000 at 2,000 sandboxes), so while it stayed open every shim the agent forked, and
/// every command under it, got a table that large (128 KB each at 2,000 sandboxes; issue 34).
pub fn take_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    let copy = inherited_fd(fd)?;
    // SAFETY: `fd` was inherited at the exec that started this process and, by this
    // function's contract, nothing in the process owns it; `copy` refers to the same file
    // and is what the caller uses from now on.
    unsafe { sys::close(fd) };
    Some(copy)
}

/// Writes all of `data` to `fd` (retrying on `EINTR`).
pub fn write_all(fd: BorrowedFd<'_>, data: &[u8]) -> Result<(), Errno> {
    sys::write_all(fd.as_raw_fd(), data)
}

/// `read(2)` into `buf`, retrying on `EINTR`.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    sys::read(fd.as_raw_fd(), buf)
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

/// The descriptors of a child forked by [`fork_command`]: `slots[i]` is descriptor `i`
/// (without `FD_CLOEXEC`, so a command it starts inherits it) and the report descriptor
/// follows them (close-on-exec). Nothing else is open.
#[derive(Debug)]
pub struct CommandFds {
    /// Descriptors `0..n`; `None` once [`CommandFds::release_slots`] has closed them.
    slots: Option<Vec<OwnedFd>>,
    report: OwnedFd,
}

impl CommandFds {
    /// The report descriptor (number `n`, close-on-exec).
    pub fn report(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.report.as_fd()
    }

    /// Lets go of the slots once the command has started, so that this process's copies do
    /// not keep the command's pipes from reaching end-of-file: descriptors 0, 1 and 2
    /// become `/dev/null`, the others are closed.
    pub fn release_slots(&mut self) -> Result<(), Errno> {
        let Some(slots) = self.slots.take() else {
            return Ok(());
        };
        let null = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let mut result = Ok(());
        for slot in slots {
            if slot.as_raw_fd() <= 2 {
                // Replaced rather than closed: 0, 1 and 2 must stay open; then `slot` is let
                // go of without closing.
                // SAFETY: `slot` owns this number, so no other owner sees it replaced.
                result = result.and(unsafe { sys::dup2(null.as_raw_fd(), slot.as_raw_fd()) });
                let _ = std::os::fd::IntoRawFd::into_raw_fd(slot);
            }
        }
        result
    }
}

/// Forks the calling process, which must have one thread (checked: `EBUSY` otherwise), to
/// run a command's shim: in the child, `slots[i]` becomes descriptor `i`, `report` the next
/// one (close-on-exec), every other descriptor is closed, and `run` is called with them; it
/// cannot return (it ends in [`exit`]: [`Infallible`] has no value), and a panic in it ends
/// the child with status 127.
/// In the parent, `slots` and `report` are closed and the child's pid is returned.
///
/// Why it is sound whatever the caller does: with one thread, the child inherits no lock
/// held by another thread, so it may allocate and run ordinary Rust code. The descriptors
/// the caller owns are copies in the child; they are closed there, but their owners never
/// run again in the child (`run` does not return, a panic does not unwind past this
/// function), so none of them is closed twice. If `run` still *uses* one of the caller's
/// descriptors, the kernel answers `EBADF` or reaches a descriptor `run` opened itself:
/// wrong, but not memory-unsafe.
pub fn fork_command<F>(slots: Vec<OwnedFd>, report: OwnedFd, run: F) -> Result<i32, Errno>
where
    F: FnOnce(CommandFds) -> Infallible,
{
    single_threaded()?;
    // SAFETY: the process has one thread (checked just above; only this thread could start
    // another, and it does not in between), so the child inherits no lock held by another
    // thread and may run ordinary Rust code.
    match unsafe { sys::fork() }? {
        sys::Fork::Parent(pid) => {
            drop((slots, report));
            Ok(pid)
        }
        sys::Fork::Child => {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                match arrange(&slots, &report) {
                    Ok(fds) => match run(fds) {},
                    Err(_) => exit(127),
                }
            }));
            // Not dropped: a payload whose drop panics would unwind into the caller.
            std::mem::forget(result);
            exit(127)
        }
    }
}

/// Gives the calling process a descriptor table sized to the descriptors it has open (64
/// slots when all are below 64), if it has one thread (checked: `EBUSY` otherwise).
///
/// Why: a table never shrinks by itself, not at `close` nor at `execve`, and a process
/// forked from lockbox's gets a copy as large as the parent's highest descriptor: under
/// `lockbox serve`, whose table grows by 8 slots per sandbox it holds, 64 KB at 1,000
/// sandboxes, for the re-executed init and for the agent.
/// `unshare(CLONE_FILES)` copies the table, at the size of the highest descriptor open, only
/// when another task shares it: a thread shares it for the call, and leaves with the old one.
///
/// Why it is sound: the calling thread gets a copy with every descriptor at its number and on
/// its file, so every descriptor it holds stays valid; the helper thread, left with the old
/// table, holds and uses none, and ends before this returns; no other thread exists (checked)
/// whose descriptors this thread would stop seeing.
pub fn shrink_descriptor_table() -> Result<(), Errno> {
    single_threaded()?;
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let helper = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = wait.recv();
        })
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EAGAIN)))?;
    let unshared = sys::unshare(libc::CLONE_FILES);
    drop(done);
    let _ = helper.join();
    // `join` returns when the thread has left its memory, before the kernel has released
    // it, and until then the process counts two threads. Under a network list that matters:
    // the supervisor refuses a unix `sendmsg` of a multi-threaded process (`EACCES`: another
    // thread could swap the descriptor under a call let through), and the agent's first
    // message then failed now and then ("the sandbox agent exited with status 0"). So this
    // returns once the helper is gone.
    for _ in 0..10_000 {
        if single_threaded().is_ok() {
            break;
        }
        std::thread::yield_now();
    }
    unshared
}

/// `Ok` if the calling process has one thread, `EBUSY` if it has more.
pub(crate) fn single_threaded() -> Result<(), Errno> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?
        .count();
    if threads == 1 {
        Ok(())
    } else {
        Err(Errno(libc::EBUSY))
    }
}

/// The child's descriptor surgery of [`fork_command`].
fn arrange(slots: &[OwnedFd], report: &OwnedFd) -> Result<CommandFds, Errno> {
    let n = slots.len() as RawFd;
    // First above every target (n + 1 and up), so that installing one cannot replace the
    // copy of another; then onto 0..n, and the report onto n.
    let mut high = Vec::with_capacity(slots.len() + 1);
    for fd in slots.iter().chain([report]) {
        high.push(sys::dup_above(fd.as_raw_fd(), n + 1)?);
    }
    for (target, &fd) in high.iter().enumerate() {
        // SAFETY: see `fork_command`: the caller's owners of 0..=n (if any) never run again
        // in this child, so nothing uses or closes the descriptor replaced here.
        unsafe { sys::dup2(fd, target as RawFd) }?;
    }
    sys::set_cloexec(n)?;
    // Everything else goes: the copies made above, and every descriptor of the parent
    // (its socket, other commands' pipes), whose owners never run again in this child.
    // SAFETY: see `fork_command`: no owner of these descriptors runs again in this child,
    // so none of them is used or closed after this.
    unsafe { sys::close_range((n + 1) as u32, u32::MAX) };
    // SAFETY: 0..=n were installed just above by dup2 and are owned by no value of this
    // child (the caller's owners of those numbers, if any, never run again here).
    let owned = |fd: RawFd| unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(CommandFds {
        slots: Some((0..n).map(owned).collect()),
        report: owned(n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_table_is_not_shrunk_beside_other_threads() {
        // libtest runs this on a thread of its own: the process has at least two.
        assert_eq!(shrink_descriptor_table(), Err(Errno(libc::EBUSY)));
    }

    #[test]
    fn an_inherited_descriptor_is_copied_and_its_owner_keeps_the_original() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let copy = inherited_fd(ours.as_raw_fd()).unwrap();
        assert_ne!(copy.as_raw_fd(), ours.as_raw_fd());
        // Dropping the copy leaves the original working: nothing is closed twice.
        write_all(std::os::fd::AsFd::as_fd(&copy), b"a").unwrap();
        drop(copy);
        (&ours).write_all(b"b").unwrap();
        let mut got = [0u8; 2];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ab");
    }

    #[test]
    fn the_standard_descriptors_are_not_taken_as_inherited() {
        for fd in 0..=2 {
            assert!(inherited_fd(fd).is_none());
        }
    }

    #[test]
    fn a_process_with_threads_is_not_forked() {
        // libtest runs this on a thread of its own: the process has at least two.
        let (slot, report) = UnixStream::pair().unwrap();
        let refused = fork_command(vec![slot.into()], report.into(), |_| exit(0));
        assert_eq!(refused, Err(Errno(libc::EBUSY)));
    }
}
