//! Signal masks and `signalfd`.

use super::fd::read;
use super::{check_int, Errno};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A set of signals.
#[derive(Clone, Copy)]
pub struct SigSet(libc::sigset_t);

impl std::fmt::Debug for SigSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigSet")
    }
}

impl SigSet {
    /// A set holding `signals`.
    pub fn of(signals: &[libc::c_int]) -> SigSet {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t.
        unsafe { libc::sigemptyset(&mut set) };
        for &sig in signals {
            // SAFETY: `set` is initialised; invalid signal numbers only return EINVAL.
            unsafe { libc::sigaddset(&mut set, sig) };
        }
        SigSet(set)
    }

    /// The empty set.
    pub fn empty() -> SigSet {
        SigSet::of(&[])
    }

    /// Every signal (the kernel never blocks `SIGKILL` and `SIGSTOP`; glibc leaves its own
    /// two out when the set is used as a mask).
    pub fn full() -> SigSet {
        // SAFETY: sigset_t is plain data; sigfillset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t.
        unsafe { libc::sigfillset(&mut set) };
        SigSet(set)
    }
}

/// `sigprocmask(how, set)`; returns the previous mask.
pub fn sigprocmask(how: libc::c_int, set: &SigSet) -> Result<SigSet, Errno> {
    let mut old = SigSet::empty();
    // SAFETY: both sets are valid sigset_t values.
    let rc = unsafe { libc::pthread_sigmask(how, &set.0, &mut old.0) };
    if rc != 0 {
        return Err(Errno(rc));
    }
    Ok(old)
}

/// Resets `SIGPIPE` and `SIGXFSZ` to their defaults. `execve` resets caught signals itself
/// but keeps ignored ones: the Rust runtime ignores `SIGPIPE`, and CPython (the Python
/// SDK's host process) `SIGXFSZ` too, which would turn `--max-file-size` from a kill into a
/// write error. Signals a caller ignores on purpose (as `nohup` does with `SIGHUP`) stay
/// ignored, as with any exec.
pub fn reset_runtime_signals() {
    for sig in [libc::SIGPIPE, libc::SIGXFSZ] {
        // SAFETY: setting SIG_DFL is always valid.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// Sets every signal that has a handler back to its default action (ignored ones stay
/// ignored). A child that shares its parent's memory but not its handlers (`CLONE_VM`
/// without `CLONE_SIGHAND`) calls it before it unblocks any signal: a handler of the
/// parent's would run in the parent's memory. Async-signal-safe.
pub fn reset_signal_handlers() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old = std::mem::MaybeUninit::<libc::sigaction>::uninit();
        // SAFETY: a null new action only reads the current one into `old`.
        if unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) } != 0 {
            continue;
        }
        // SAFETY: sigaction succeeded, so it filled `old`.
        let handler = unsafe { old.assume_init() }.sa_sigaction;
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            // SAFETY: setting SIG_DFL is always valid.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

/// Whether `sig`'s disposition is "ignore" (`SIG_IGN`), which survives `execve`.
pub fn is_ignored(sig: libc::c_int) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: a null new action only reads the current one into `old`, writable room for it.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: sigaction succeeded, so it filled `old`.
    rc == 0 && unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// Sets an ignored `sig` back to its default action (a handler is left alone).
pub fn unignore(sig: libc::c_int) {
    if is_ignored(sig) {
        // SAFETY: setting SIG_DFL is always valid.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// `signalfd(-1, set, SFD_CLOEXEC)`.
pub fn signalfd(set: &SigSet) -> Result<OwnedFd, Errno> {
    // SAFETY: `set` is a valid sigset_t.
    let fd =
        check_int(unsafe { libc::signalfd(-1, &set.0, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) })?;
    // SAFETY: signalfd(-1, ..) made this descriptor for us just now; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A signal read from a signalfd: (signal number, si_code, sender pid).
pub fn read_signalfd(fd: BorrowedFd<'_>) -> Result<Option<(i32, i32, u32)>, Errno> {
    // SAFETY: signalfd_siginfo is plain data.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a writable buffer of its own size.
    let buf = unsafe {
        std::slice::from_raw_parts_mut(
            (&mut info as *mut libc::signalfd_siginfo).cast::<u8>(),
            std::mem::size_of::<libc::signalfd_siginfo>(),
        )
    };
    match read(fd.as_raw_fd(), buf) {
        Ok(0) | Err(Errno(libc::EAGAIN)) => Ok(None),
        Ok(_) => Ok(Some((info.ssi_signo as i32, info.ssi_code, info.ssi_pid))),
        Err(e) => Err(e),
    }
}
