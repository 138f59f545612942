//! [`SandboxInit`]: which process a branch's sandbox lives as long as, recorded so that
//! [`crate::ListedBranch::is_orphan`] can tell when nothing can write into the branch any
//! more (issue 32, item 9).
//!
//! Every process of a sandbox is in the pid namespace whose pid 1 is the sandbox's init,
//! and when that init exits the kernel kills the rest of the namespace. The kill is
//! asynchronous, but the init's own exit waits for it: `do_exit` → `exit_notify` →
//! `forget_original_parent` → `find_child_reaper` calls `zap_pid_ns_processes` when the
//! exiting task is the namespace's last reaper thread, and that function SIGKILLs every
//! task of the namespace, reaps its own children, then sleeps until
//! `pid_ns->pid_allocated` is back to the init's own pid — every task with a pid in the
//! namespace (children of processes outside it and nested namespaces included) has been
//! released. Only after that does `exit_notify` make the init a zombie (`kernel/exit.c`,
//! `kernel/pid_namespace.c`: "when the init process of a pid namespace is reaped all of
//! the processes in the pid namespace are gone"). So an init that is a zombie whose other
//! threads are all gone (`/proc/PID/stat` state `Z`, one thread) or that was reaped (no
//! `/proc/PID`, or a different process there: another start time) leaves no process
//! that could still write into the branch's upper layer. A zombie thread-group leader
//! whose other threads still run shows `Z` too, hence the thread count.
//!
//! The identity is the pid and the start time (`/proc/PID/stat` field 22, clock ticks
//! since boot): a pid reused after the init was reaped has a later start time. Both are
//! read in the pid namespace of the process that records them, so `branch list` must look
//! from the same one (as for `owner_pid`). The start time and the state are shown to any
//! reader of `/proc/PID/stat`, with or without ptrace access to the process (the init is
//! not dumpable).

use serde::{Deserialize, Serialize};

/// The init (pid 1 of its pid namespace) of a sandbox running on a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SandboxInit {
    /// Its pid, as seen by the process that recorded it.
    pub pid: u32,
    /// Its start time: `/proc/PID/stat` field 22, in clock ticks since boot.
    pub start_time: u64,
}

impl SandboxInit {
    /// Identifies the running process `pid`. Call it while `pid` cannot be reused: the
    /// caller's own child, not yet waited for.
    pub fn of(pid: u32) -> std::io::Result<SandboxInit> {
        let stat = Stat::read(pid)?.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat: unexpected format"),
            )
        })?;
        Ok(SandboxInit {
            pid,
            start_time: stat.start_time,
        })
    }

    /// Whether the init has exited and with it every process of its sandbox (see the
    /// module's comment). A `/proc/PID/stat` that cannot be read other than for its absence
    /// counts as running: calling a branch free to commit must be sure.
    pub fn is_gone(&self) -> bool {
        match Stat::read(self.pid) {
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            Ok(None) => false,
            Ok(Some(stat)) => {
                stat.start_time != self.start_time
                    || (matches!(stat.state, b'Z' | b'X') && stat.threads <= 1)
            }
        }
    }
}

/// The fields of `/proc/PID/stat` read here.
struct Stat {
    /// Field 3.
    state: u8,
    /// Field 20.
    threads: u64,
    /// Field 22.
    start_time: u64,
}

impl Stat {
    /// `Ok(None)`: the file does not parse. A process that exits while its file is read
    /// gives ESRCH, taken as its absence.
    fn read(pid: u32) -> std::io::Result<Option<Stat>> {
        match std::fs::read(format!("/proc/{pid}/stat")) {
            Ok(data) => Ok(Stat::parse(&data)),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => Err(
                std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
            ),
            Err(e) => Err(e),
        }
    }

    /// The command name (field 2) may hold anything, `)` included: fields are counted from
    /// its last `)`.
    fn parse(data: &[u8]) -> Option<Stat> {
        let close = data.iter().rposition(|&b| b == b')')?;
        let rest = std::str::from_utf8(data.get(close + 1..)?).ok()?;
        let f: Vec<&str> = rest.split_ascii_whitespace().collect();
        let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
        Some(Stat {
            state: *f.first()?.as_bytes().first()?,
            threads: num(20)?,
            start_time: num(22)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = b"42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 50";
        let s = Stat::parse(line).unwrap();
        assert_eq!((s.state, s.threads, s.start_time), (b'S', 3, 987654));
    }

    #[test]
    fn our_own_process_is_running_and_a_reused_pid_is_not_it() {
        let me = SandboxInit::of(std::process::id()).unwrap();
        assert!(!me.is_gone());
        let other = SandboxInit {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(other.is_gone(), "another start time: the pid was reused");
    }
}
