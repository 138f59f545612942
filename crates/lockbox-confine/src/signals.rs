//! Receiving the supervisor's own signals as data (a signalfd), so a front end can forward
//! them to a sandbox from its wait loop instead of in a handler.

use crate::error::SetupError;
use crate::sys::{self, SigSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// A signal taken from the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivedSignal {
    /// Signal number.
    pub signal: i32,
    /// Sent by the terminal driver (e.g. Ctrl-C), which also signals the sandboxed command
    /// directly when it shares the terminal's foreground process group.
    pub from_terminal: bool,
}

/// Signals blocked for the calling thread and readable from a descriptor. Blocking is undone
/// on drop. Use from a single-threaded front end (the CLI): the mask is per thread.
#[derive(Debug)]
pub struct Signals {
    fd: OwnedFd,
    previous: SigSet,
}

impl Signals {
    /// Blocks `signals` and opens a signalfd for them.
    pub fn block(signals: &[i32]) -> Result<Signals, SetupError> {
        let set = SigSet::of(signals);
        let err = |errno| SetupError::Supervise {
            what: "blocking signals",
            errno,
        };
        let previous = sys::sigprocmask(libc::SIG_BLOCK, &set).map_err(err)?;
        let fd = sys::signalfd(&set).map_err(err)?;
        Ok(Signals { fd, previous })
    }

    /// The next pending signal, if any (never blocks).
    pub fn next(&self) -> Option<ReceivedSignal> {
        sys::read_signalfd(self.fd.as_fd())
            .ok()
            .flatten()
            .map(|(signal, code, _)| ReceivedSignal {
                signal,
                from_terminal: code == libc::SI_KERNEL,
            })
    }
}

impl AsFd for Signals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        let _ = sys::sigprocmask(libc::SIG_SETMASK, &self.previous);
    }
}

/// The signals whose "ignore" disposition a sandboxed command inherits through `execve`
/// and a shell's job control sets: a background job's `SIGINT` and `SIGQUIT`, `nohup`'s
/// `SIGHUP`, and the others a supervisor forwards.
pub const INHERITED_IGNORES: [i32; 6] = [
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Which of [`INHERITED_IGNORES`] this process ignores: a command it starts directly
/// ignores them too.
pub fn ignored_signals() -> Vec<i32> {
    INHERITED_IGNORES
        .into_iter()
        .filter(|&sig| sys::is_ignored(sig))
        .collect()
}

/// Sets each of [`INHERITED_IGNORES`] this process ignores back to its default: a process
/// that starts sandboxes for others (the pre-arm helper) does not pass on whatever its own
/// starter ignored.
pub fn unignore_signals() {
    for sig in INHERITED_IGNORES {
        sys::unignore(sig);
    }
}
