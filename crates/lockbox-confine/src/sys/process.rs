//! Processes: `clone3`, `clone` on a caller's stack, `fork`, `execve`, `_exit`, signals to
//! and waits for processes, `prctl`, resource limits, and the memory layout `/proc` shows.

use super::{check, check_int, errno, Errno};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr;

/// Result of [`clone3_fork`].
#[derive(Debug)]
pub enum Forked {
    /// We are the new child.
    Child,
    /// We are the parent; the child has this pid and pidfd.
    Parent {
        /// The child's pid (in our pid namespace).
        pid: libc::pid_t,
        /// A pidfd for the child, close-on-exec.
        pidfd: OwnedFd,
    },
}

/// `clone3(2)` with fork semantics (no new stack) and `CLONE_PIDFD`.
///
/// # Safety
///
/// The child is a copy of a process that may have other threads, which it does not have:
/// any lock one of them held stays held. In [`Forked::Child`] the caller therefore makes
/// only async-signal-safe calls (no allocation, no lock, no logging: the rules of `child`)
/// and ends in `execve` or [`exit`], never returning into code that could unwind or drop
/// what the parent owns. (With `CLONE_VM` or `CLONE_FILES` in `flags`, the rules of
/// [`spawn_alongside`] apply too.)
pub unsafe fn clone3_fork(flags: u64) -> Result<Forked, Errno> {
    let mut pidfd: libc::c_int = -1;
    let mut args: libc::clone_args = libc::clone_args {
        flags: flags | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        child_tid: 0,
        parent_tid: 0,
        // With CLONE_PARENT the child's parent is ours, and so is its exit signal: clone3
        // refuses one given.
        exit_signal: match flags & libc::CLONE_PARENT as u64 {
            0 => libc::SIGCHLD as u64,
            _ => 0,
        },
        stack: 0,
        stack_size: 0,
        tls: 0,
        set_tid: 0,
        set_tid_size: 0,
        cgroup: 0,
    };
    // SAFETY: `args` is a valid clone_args of the size passed; with no stack the child
    // continues on a copy of our stack, like fork(2). `pidfd` outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match check(rc)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: pid as libc::pid_t,
            // SAFETY: CLONE_PIDFD made this descriptor for us just now; nothing else owns it.
            pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
        }),
    }
}

/// Runs `run(arg)` in a child that shares our memory, on `stack`, while we are suspended
/// until it calls `execve` or exits (`CLONE_VM | CLONE_VFORK`, as posix_spawn does): no page
/// tables are copied. Returns the child's pid.
///
/// # Safety
///
/// `run` runs in our memory without our threads: it makes only async-signal-safe calls (no
/// allocation, no lock), writes nothing but its own stack (and errno), uses no more than
/// `stack` (which has no guard page), and ends in `execve` or [`exit`].
pub unsafe fn spawn_vfork<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
) -> Result<libc::pid_t, Errno> {
    // SAFETY: the caller keeps the promises above; we are suspended until the child has
    // exec'd or exited, so `stack` and `arg` outlive its use of them.
    unsafe { clone_on(stack, run, arg, libc::CLONE_VM | libc::CLONE_VFORK, None) }
}

/// [`spawn_vfork`] with our descriptor table shared too (`CLONE_FILES`): what the child
/// opens, or a pidfd its own clone makes, is ours. Returns the child's pid.
///
/// # Safety
///
/// As [`spawn_vfork`]; besides, the child closes nothing of ours.
pub unsafe fn spawn_vfork_sharing_table<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
) -> Result<libc::pid_t, Errno> {
    // SAFETY: the caller keeps the promises above; we are suspended until the child has
    // exec'd or exited, so `stack` and `arg` outlive its use of them.
    unsafe {
        clone_on(
            stack,
            run,
            arg,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_FILES,
            None,
        )
    }
}

/// Runs `run(arg)` in a child cloned with `flags` (new namespaces) and `CLONE_VM`, on
/// `stack`, in parallel with us: it shares our memory, so nothing of ours is copied or
/// write-protected, as a fork would. Returns its pid and pidfd; reap it with [`wait4`]
/// before `stack` or `arg` go away.
///
/// # Safety
///
/// As [`spawn_alongside`], except that the child has a descriptor table of its own (a
/// copy), and that it may write what `arg` points to, which the caller leaves alone until
/// the child is reaped. Block every signal in the calling thread around this call and
/// never unblock any in the child: it would run our handlers in our memory.
pub unsafe fn spawn_sharing_memory_into<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
    flags: libc::c_int,
) -> Result<(libc::pid_t, OwnedFd), Errno> {
    // SAFETY: the caller keeps the promises above.
    unsafe { clone_with_pidfd(stack, run, arg, flags | libc::CLONE_VM) }
}

/// `pause(2)`: sleeps until a signal comes.
pub fn pause() {
    // SAFETY: no arguments.
    unsafe { libc::pause() };
}

/// [`spawn_vfork`] into new namespaces: `run(arg)` in a child cloned with `flags` (the
/// namespaces, `CLONE_FILES` maybe) and `CLONE_VM | CLONE_VFORK | CLONE_PIDFD`, on `stack`,
/// while we are suspended until it calls `execve` or exits. Returns its pid and pidfd.
/// A sandbox's init that will execute a small program of its own is cloned so: a fork
/// would copy our page tables, only for the `execve` to tear them down.
///
/// # Safety
///
/// As [`spawn_vfork`]. Besides, what the child changes of the state its memory carries is
/// ours too: it changes none of it (no `PR_SET_DUMPABLE`, no `PR_SET_MM`, nothing written
/// into our argument or environment strings), and it runs no signal handler of ours (block
/// every signal in the calling thread around this call; the child resets the handlers with
/// [`reset_signal_handlers`] before it unblocks any).
pub unsafe fn spawn_vfork_into<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
    flags: libc::c_int,
) -> Result<(libc::pid_t, OwnedFd), Errno> {
    // SAFETY: the caller keeps the promises above; we are suspended until the child has
    // exec'd or exited, so `stack` and `arg` outlive its use of them.
    unsafe { clone_with_pidfd(stack, run, arg, flags | libc::CLONE_VM | libc::CLONE_VFORK) }
}

/// [`clone_on`] with `CLONE_PIDFD`: the child's pid and pidfd.
///
/// # Safety
///
/// As [`clone_on`].
unsafe fn clone_with_pidfd<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
    flags: libc::c_int,
) -> Result<(libc::pid_t, OwnedFd), Errno> {
    let mut pidfd: libc::c_int = -1;
    // SAFETY: the caller keeps the promises of `clone_on`; `pidfd` outlives the call.
    let pid = unsafe { clone_on(stack, run, arg, flags | libc::CLONE_PIDFD, Some(&mut pidfd)) }?;
    // SAFETY: CLONE_PIDFD made this descriptor for us just now; nothing else owns it.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

/// Runs `run(arg)` in a child that shares our memory and descriptor table, on `stack`,
/// *alongside* us (`CLONE_VM | CLONE_FILES`, no `CLONE_VFORK`): work done in parallel with
/// ours, without copying page tables. Returns the child's pid; reap it with [`wait4`]
/// before `stack` or `arg` go away.
///
/// # Safety
///
/// `run` runs in our memory, in parallel with us, without our other threads: it makes only
/// async-signal-safe calls (no allocation, no lock), writes nothing but its own stack and
/// atomics in `arg`, uses no more than `stack` (which has no guard page), closes only
/// descriptors it opened itself, and ends in [`exit`]. The caller does not touch `stack`,
/// and keeps `stack` and `arg` alive, until [`wait4`] has reaped the child: the borrows end
/// when this function returns, the child's use of them does not.
pub unsafe fn spawn_alongside<T: Sync>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
) -> Result<libc::pid_t, Errno> {
    // SAFETY: the caller keeps the promises above.
    unsafe { clone_on(stack, run, arg, libc::CLONE_VM | libc::CLONE_FILES, None) }
}

/// `clone(flags | SIGCHLD)` of a child that runs `run(arg)` on `stack`. The child finds
/// `run` and `arg` at the top of its own stack (ours may have moved on by the time it runs
/// unless `CLONE_VFORK` suspends us). With `CLONE_PIDFD` in `flags`, the pidfd is written
/// to `pidfd`.
///
/// # Safety
///
/// As [`spawn_vfork`], [`spawn_vfork_into`] or [`spawn_alongside`], according to `flags`.
unsafe fn clone_on<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
    flags: libc::c_int,
    pidfd: Option<&mut libc::c_int>,
) -> Result<libc::pid_t, Errno> {
    struct Start<'a, T> {
        run: fn(&T) -> !,
        arg: &'a T,
    }
    extern "C" fn entry<T>(start: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `start` points into the child's stack (below), which the caller keeps
        // alive and untouched until the child has exited or exec'd.
        let start = unsafe { &*(start as *const Start<'_, T>) };
        (start.run)(start.arg)
    }
    let slot = std::mem::size_of::<Start<'_, T>>().next_multiple_of(16);
    if stack.len() < slot + 4096 {
        return Err(Errno(libc::EINVAL));
    }
    // The stack grows down on every architecture lockbox supports; align the top to 16.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let start_at = (top - slot) as *mut Start<'_, T>;
    // SAFETY: `start_at` is 16-aligned and inside `stack`, which is live and writable.
    unsafe { start_at.write(Start { run, arg }) };
    let pidfd = pidfd.map_or(ptr::null_mut(), |fd| fd as *mut libc::c_int);
    // SAFETY: the child runs on `stack` below its `Start`, which the caller keeps alive
    // (and `arg` with it) until the child has exited or exec'd. `pidfd` (the parent_tid
    // argument, which only CLONE_PIDFD writes) is null or outlives the call.
    let rc = unsafe {
        libc::clone(
            entry::<T>,
            start_at as *mut libc::c_void,
            flags | libc::SIGCHLD,
            start_at as *mut libc::c_void,
            pidfd,
        )
    };
    check_int(rc)
}

/// `prctl(option, arg2, 0, 0, 0)`, for the options whose arguments are plain integers and
/// that change no memory of ours: any other option is `EINVAL` here (`PR_SET_MM` has
/// [`set_mm_map`], `PR_SET_NAME` [`set_name`]).
pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> Result<libc::c_int, Errno> {
    const PLAIN: [libc::c_int; 8] = [
        libc::PR_GET_DUMPABLE,
        libc::PR_SET_DUMPABLE,
        libc::PR_SET_CHILD_SUBREAPER,
        libc::PR_SET_PDEATHSIG,
        libc::PR_SET_NO_NEW_PRIVS,
        libc::PR_CAPBSET_DROP,
        libc::PR_CAP_AMBIENT,
        libc::PR_SET_SECUREBITS,
    ];
    if !PLAIN.contains(&option) {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: the options above take integer arguments only and write no memory of ours.
    check_int(unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
}

/// `prctl(PR_SET_NAME, name)`: this thread's `comm` (at most 15 bytes are kept).
pub fn set_name(name: &CStr) -> Result<(), Errno> {
    // SAFETY: `name` is a live NUL-terminated string; the kernel copies at most 16 bytes.
    check_int(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) }).map(drop)
}

/// Wipes the argument and environment strings the kernel put on our stack at `execve`
/// (where `layout`, read from `/proc/self/stat`, says they are), writing `title` (without
/// its NUL, truncated to leave the area's last byte a NUL) at the start of the first.
pub fn wipe_exec_strings(layout: &crate::proctitle::Layout, title: &[u8]) {
    let title = title.strip_suffix(b"\0").unwrap_or(title);
    for ((start, len), text) in [(layout.args(), title), (layout.env(), &[][..])] {
        let shown = text.len().min(len.saturating_sub(1));
        let at = start as usize as *mut u8;
        // SAFETY: a `Layout` is only made from /proc/self/stat, so these are the ranges of
        // our stack mapping that hold the execve strings (mapped writable for the life of
        // the process; a fork's copy keeps them). Nothing Rust owns lives there, and no
        // reference into them exists (std keeps raw argv pointers, which callers of this
        // function never read again). `text` is on the heap or in .rodata: no overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), at, shown);
            std::ptr::write_bytes(at.add(shown), 0, len - shown);
        }
    }
}

/// The current program break (`brk(0)`, which changes nothing).
pub fn current_brk() -> u64 {
    // SAFETY: brk(0) is below any valid break, so the kernel leaves the break where it is
    // and returns it.
    unsafe { libc::syscall(libc::SYS_brk, 0usize) as u64 }
}

/// `prctl(PR_SET_MM, PR_SET_MM_MAP, map)`: replaces the memory-layout fields the kernel
/// shows in `/proc` (no privilege needed unless `map.exe_fd` is set).
///
/// # Safety
///
/// The kernel changes no mapping, but `brk(2)` goes on from `map.brk`: `start_brk` and
/// `brk` are this process's current ones (`current_brk`), so that the heap the allocator
/// may grow with `brk` stays where it is.
pub unsafe fn set_mm_map(map: &rustix::process::PrctlMmMap) -> Result<(), Errno> {
    // SAFETY: `map` is a live, fully initialised PrctlMmMap; the kernel copies it and
    // changes no mapping; the caller keeps the break where it is.
    unsafe { rustix::process::configure_virtual_memory_map(map) }.map_err(errno)
}

/// `setrlimit(resource, {value, value})`.
pub fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Result<(), Errno> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a valid rlimit.
    check_int(unsafe { libc::setrlimit(resource, &limit) }).map(drop)
}

/// `getrlimit(resource)`: (soft, hard), `RLIM_INFINITY` for none.
pub fn get_rlimit(resource: libc::__rlimit_resource_t) -> Result<(u64, u64), Errno> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a live, writable rlimit.
    check_int(unsafe { libc::getrlimit(resource, &mut limit) })?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// A null-terminated array of C strings for `execve`, built before the clone; it may end
/// in numbers written after it (in the clone child, without allocating: [`Self::set_number`]).
#[derive(Debug)]
pub struct CStringArray {
    _owned: Vec<CString>,
    /// Room for the trailing numbers, each in decimal and NUL-terminated.
    numbers: Vec<[u8; NUMBER_ROOM]>,
    ptrs: Vec<*const libc::c_char>,
}

/// Room for an `i32` in decimal, its sign and the NUL.
const NUMBER_ROOM: usize = 12;

impl CStringArray {
    /// Builds the array; the strings are owned by it.
    pub fn new(items: Vec<CString>) -> CStringArray {
        CStringArray::with_numbers(items, 0)
    }

    /// Builds the array of `items` followed by `numbers` numbers, each `0` until
    /// [`Self::set_number`] sets it.
    pub fn with_numbers(items: Vec<CString>, numbers: usize) -> CStringArray {
        let mut zero = [0u8; NUMBER_ROOM];
        zero[0] = b'0';
        let numbers = vec![zero; numbers];
        let mut ptrs: Vec<*const libc::c_char> = items
            .iter()
            .map(|s| s.as_ptr())
            .chain(numbers.iter().map(|n| n.as_ptr().cast()))
            .collect();
        ptrs.push(std::ptr::null());
        CStringArray {
            _owned: items,
            numbers,
            ptrs,
        }
    }

    /// Sets trailing number `i` (of those [`Self::with_numbers`] made room for) to `value`.
    /// Allocates nothing: callable in a clone child.
    pub fn set_number(&mut self, i: usize, value: i32) {
        let base = self._owned.len();
        let Some(room) = self.numbers.get_mut(i) else {
            return;
        };
        let mut digits = [0u8; NUMBER_ROOM];
        let mut n = value.unsigned_abs();
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        if value < 0 {
            digits[len] = b'-';
            len += 1;
        }
        *room = [0; NUMBER_ROOM];
        for (k, d) in digits[..len].iter().rev().enumerate() {
            room[k] = *d;
        }
        // The pointer is taken again after the write, from the array it points into.
        self.ptrs[base + i] = room.as_ptr().cast();
    }

    pub(crate) fn as_ptr(&self) -> *const *const libc::c_char {
        self.ptrs.as_ptr()
    }
}

/// `execve(path, argv, envp)`; returns only on failure.
pub fn execve(path: &CStr, argv: &CStringArray, envp: &CStringArray) -> Errno {
    // SAFETY: `path` is a live C string; a `CStringArray` is a null-terminated array of
    // pointers to the C strings it owns, all live as long as it is.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// `execve(path, argv, envp)` with raw arrays (a pre-armed command's, see `armed`); returns
/// only on failure.
///
/// # Safety
///
/// `path` is a live C string; `argv` and `envp` are NULL-terminated arrays of pointers to
/// live C strings.
pub unsafe fn execve_raw(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> Errno {
    // SAFETY: as the caller promises.
    unsafe { libc::execve(path, argv, envp) };
    Errno::last()
}

/// The calling thread's scheduling policy, real-time priority and nice value (0s where the
/// kernel does not say).
pub fn scheduling() -> crate::sched::Scheduling {
    // SAFETY: sched_getscheduler(0) reads the calling thread's policy; no memory is passed.
    let policy = unsafe { libc::sched_getscheduler(0) };
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is writable room for one sched_param.
    let _ = unsafe { libc::sched_getparam(0, &mut param) };
    // getpriority may return -1 as a value: errno tells, cleared first.
    // SAFETY: __errno_location is the calling thread's errno.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority takes no memory.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    crate::sched::Scheduling {
        policy: policy.max(0) & !libc::SCHED_RESET_ON_FORK,
        priority: param.sched_priority,
        nice: if Errno::last().0 == 0 { nice } else { 0 },
    }
}

/// `_exit(code)`: leaves without running destructors or atexit handlers (which may lock).
pub fn exit(code: i32) -> ! {
    // SAFETY: _exit never returns and is async-signal-safe.
    unsafe { libc::_exit(code) }
}

/// `kill(pid, sig)`.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> Result<(), Errno> {
    // SAFETY: no pointer arguments.
    check_int(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`. (Not rustix's: its `Signal` has no
/// real-time signals, which a caller may forward.)
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> Result<(), Errno> {
    // SAFETY: a null siginfo is allowed; no other pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    check(rc).map(drop)
}

/// `pidfd_open(getpid(), 0)`: a descriptor of this process (the whole thread group), which
/// polls readable once every thread of it has exited; close-on-exec.
pub fn pidfd_of_self() -> Result<OwnedFd, Errno> {
    // SAFETY: getpid cannot fail; pidfd_open takes no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    // SAFETY: pidfd_open made this descriptor for us just now; nothing else owns it.
    check(rc).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `waitpid(-1, WNOHANG)`: Some((pid, status)) for a reaped child.
pub fn reap_any() -> Result<Option<(libc::pid_t, libc::c_int)>, Errno> {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    match check_int(unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) })? {
        0 => Ok(None),
        pid => Ok(Some((pid, status))),
    }
}

/// `waitpid(-1, 0)`: blocks until any child exits; `ECHILD` when none is left.
pub fn wait_any() -> Result<libc::pid_t, Errno> {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    check_int(unsafe { libc::waitpid(-1, &mut status, 0) })
}

/// `getrusage(RUSAGE_CHILDREN)`: (user + system microseconds, max RSS in KiB) of every
/// child waited for.
pub fn children_usage() -> (u64, u32) {
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (
        us(usage.ru_utime) + us(usage.ru_stime),
        usage.ru_maxrss as u32,
    )
}

/// `waitpid(pid, WNOHANG)`: whether `pid` has been reaped now.
pub fn try_reap(pid: libc::pid_t) -> bool {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    rc == pid || rc < 0
}

/// `wait4(pid, 0)`: blocks until `pid` exits; returns its status and resource usage
/// (which includes every descendant it waited for).
pub fn wait4(pid: libc::pid_t) -> Result<(libc::c_int, libc::rusage), Errno> {
    let mut status = 0;
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both out pointers are valid.
        match check_int(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }) {
            Err(Errno(libc::EINTR)) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok((status, usage)),
        }
    }
}

/// `setsid()`: a new session and process group, led by the caller, with no controlling
/// terminal.
pub fn setsid() -> Result<(), Errno> {
    // SAFETY: setsid takes no arguments and touches only the calling process.
    check_int(unsafe { libc::setsid() }).map(drop)
}

/// `getuid()` and `getgid()`.
pub fn ids() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Result of [`fork`].
#[derive(Debug)]
pub enum Fork {
    /// We are the new child.
    Child,
    /// We are the parent of this pid.
    Parent(libc::pid_t),
}

/// `fork(2)`.
///
/// # Safety
///
/// The calling process has exactly one thread, so that the child inherits no lock held by
/// another thread and may allocate and run ordinary Rust code. (With more threads, the
/// child may only make async-signal-safe calls: use [`clone3_fork`] and `child`'s rules.)
pub unsafe fn fork() -> Result<Fork, Errno> {
    // SAFETY: no pointers are involved; the caller guarantees a single thread.
    match check_int(unsafe { libc::fork() })? {
        0 => Ok(Fork::Child),
        pid => Ok(Fork::Parent(pid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The strings `execve` would get, read through the array's pointers.
    fn read_back(a: &CStringArray) -> Vec<String> {
        a.ptrs
            .iter()
            .take_while(|p| !p.is_null())
            // SAFETY: each non-null pointer is to a NUL-terminated string the array owns.
            .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn numbers_set_after_the_strings_read_back_as_decimal() {
        let mut a = CStringArray::with_numbers(vec![CString::from(c"init")], 3);
        assert_eq!(read_back(&a), ["init", "0", "0", "0"]);
        a.set_number(0, 7);
        a.set_number(1, i32::MAX);
        a.set_number(2, -1);
        assert_eq!(read_back(&a), ["init", "7", "2147483647", "-1"]);
        a.set_number(1, 42);
        a.set_number(3, 5); // beyond the room made: ignored
        assert_eq!(read_back(&a), ["init", "7", "42", "-1"]);
        a.set_number(2, i32::MIN);
        assert_eq!(read_back(&a)[3], "-2147483648");
    }
}
