//! Pausing a sandbox's whole process tree, and resuming it: while a snapshot copies a
//! sandbox's files, nothing in it may run.
//!
//! Without a delegated cgroup freezer (cgroup v2 `cgroup.freeze` needs a delegated
//! subtree, which unprivileged lockbox does not have), the tree is stopped with `SIGSTOP`,
//! which any process may send to its own uid's processes. Each process is signalled
//! through a pidfd opened after the walk found it, and the walk is checked again through
//! that pidfd's process, so a pid reused meanwhile is never signalled. The walk repeats
//! until it finds no process it has not stopped and every stopped process reports `T`:
//! a process stopped cannot fork, so then the whole tree is still.
//!
//! What `SIGSTOP` shows: a parent that waits with `WUNTRACED` sees its child stopped.
//! A shell with job control (an interactive `bash` on a PTY) does: tried by hand, bash
//! reports its foreground job as `Stopped` and takes it to the background, although the
//! job is resumed and goes on. Resuming children first does not prevent it. The shells of
//! lockbox's sessions and processes started without a PTY run without job control and see
//! nothing. The cgroup freezer has no such effect; it is the better mechanism where it is
//! delegated.

use std::collections::HashSet;
use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

use crate::proc_stat::ProcStat;
use crate::usage::{walk, Walked, MAX_PROCESSES};

/// A paused tree; resumed by [`Frozen::thaw`] or when dropped.
#[derive(Debug)]
pub struct Frozen {
    /// The processes stopped, parents before their children, with a pidfd each (so
    /// `SIGCONT` reaches the same process even if it died and its pid was reused).
    stopped: Vec<(i32, OwnedFd)>,
    /// Their pids.
    pids: HashSet<i32>,
}

impl Frozen {
    /// How many processes were stopped.
    pub fn processes(&self) -> usize {
        self.stopped.len()
    }

    /// Resumes every process the freeze stopped.
    pub fn thaw(mut self) {
        self.resume();
    }

    /// Children first, so that a parent never runs before what it waits for.
    fn resume(&mut self) {
        self.pids.clear();
        for (_, fd) in self.stopped.drain(..).rev() {
            // A process that exited meanwhile: nothing to resume.
            let _ = pidfd_send_signal(&fd, Signal::CONT);
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.resume();
    }
}

/// Stops every process of the tree rooted at host pid `init` (the init included) and
/// waits until all are stopped; `TimedOut` (with everything resumed) if that takes longer
/// than `timeout`, e.g. a process in uninterruptible sleep on a hung filesystem.
pub fn freeze_tree(init: libc::pid_t, timeout: Duration) -> io::Result<Frozen> {
    let deadline = Instant::now() + timeout;
    let mut frozen = Frozen {
        stopped: Vec::new(),
        pids: HashSet::new(),
    };
    loop {
        let mut new = 0;
        for Walked { pid, parent, .. } in walk(init, false)? {
            if frozen.pids.contains(&pid) {
                continue;
            }
            let Some(fd) = open_checked(pid, parent) else {
                continue; // exited, or its pid is no longer the walk's process
            };
            match pidfd_send_signal(&fd, Signal::STOP) {
                Ok(()) => {}
                Err(rustix::io::Errno::SRCH) => continue,
                Err(e) => return Err(e.into()),
            }
            frozen.stopped.push((pid, fd));
            frozen.pids.insert(pid);
            new += 1;
            if frozen.stopped.len() >= MAX_PROCESSES {
                return Err(io::Error::other(format!(
                    "more than {MAX_PROCESSES} processes to stop"
                )));
            }
        }
        if new == 0 && all_stopped(&frozen) {
            return Ok(frozen);
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the sandbox's processes did not all stop within {} ms",
                    timeout.as_millis()
                ),
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A pidfd for `pid`, if after opening it `pid` is still the child of `parent` the walk
/// found (the pidfd pins the process: a later check cannot see a reused pid).
fn open_checked(pid: i32, parent: Option<i32>) -> Option<OwnedFd> {
    let fd = pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
    let stat = ProcStat::read(pid).ok()?;
    if parent.is_some_and(|p| p != stat.ppid) || stat.is_zombie() {
        return None;
    }
    Some(fd)
}

/// True once every stopped process is stopped (`T`), or has exited.
fn all_stopped(frozen: &Frozen) -> bool {
    frozen
        .stopped
        .iter()
        .all(|&(pid, _)| match ProcStat::read(pid) {
            Ok(stat) => matches!(stat.state, b'T' | b't') || stat.is_zombie(),
            Err(_) => true,
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn state(pid: i32) -> u8 {
        ProcStat::read(pid).unwrap().state
    }

    #[test]
    fn a_forking_tree_is_stopped_whole_and_resumed_by_drop() {
        // A shell whose children keep forking: each stop must catch the new ones.
        let mut sh = std::process::Command::new("sh")
            .args([
                "-c",
                "while :; do sleep 0.001 & wait; done & while :; do :; done",
            ])
            .spawn()
            .unwrap();
        let root = i32::try_from(sh.id()).unwrap();
        // A loaded machine may take a while to run the shell: wait for its subshells,
        // not a fixed time, so that the freeze has a forking tree to catch.
        let deadline = Instant::now() + Duration::from_secs(30);
        while walk(root, false).unwrap().len() < 2 {
            assert!(
                Instant::now() < deadline,
                "the shell did not fork its loops"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let frozen = freeze_tree(root, Duration::from_secs(5)).unwrap();
        assert!(frozen.processes() >= 2, "{frozen:?}");
        let pids: Vec<i32> = walk(root, false).unwrap().iter().map(|w| w.pid).collect();
        for &pid in &pids {
            assert_eq!(state(pid), b'T', "pid {pid} of {pids:?}");
        }
        // Still: nothing new appears while frozen.
        std::thread::sleep(Duration::from_millis(50));
        let again: Vec<i32> = walk(root, false).unwrap().iter().map(|w| w.pid).collect();
        assert_eq!(again, pids);
        drop(frozen);
        std::thread::sleep(Duration::from_millis(50));
        assert_ne!(state(root), b'T');
        // Stopped again to be killed whole (the shell's children would outlive it).
        let frozen = freeze_tree(root, Duration::from_secs(5)).unwrap();
        for w in walk(root, false).unwrap() {
            let _ = rustix::process::kill_process(Pid::from_raw(w.pid).unwrap(), Signal::KILL);
        }
        drop(frozen);
        sh.wait().unwrap();
    }
}
