//! What a running sandbox uses now, and the walk of its process tree through `/proc` that
//! this and the freeze ([`crate::freeze_tree`]) share.
//!
//! The tree is walked from the init through each thread's `children` list, so only the
//! sandbox's own processes count, whatever pid namespace the caller is in. A child whose
//! parent changed between the two reads (it exited and its pid was reused) is skipped.

use std::io;

use crate::proc_stat::ProcStat;
use std::time::Duration;

/// How far a walk goes: more processes than any sandbox's bound allows by default.
pub(crate) const MAX_PROCESSES: usize = 65_536;

/// A sandbox's processes and what they use, at the time of the call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeUsage {
    /// Live processes, the init included.
    pub processes: u32,
    /// Their threads.
    pub threads: u32,
    /// The sum of their resident set sizes (a page shared by two processes counts twice).
    pub rss_bytes: u64,
    /// CPU time (user + system) of the live processes and of every descendant they reaped.
    pub cpu: Duration,
}

/// The tree rooted at host pid `init` (`ESRCH`-like `NotFound` if it is gone).
pub fn tree_usage(init: libc::pid_t) -> io::Result<TreeUsage> {
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let page = rustix::param::page_size() as u64;
    let mut usage = TreeUsage::default();
    let mut ticks_used: u64 = 0;
    // Zombies count as the walk always counted them: their parents have not reaped them.
    for p in walk(init, true)? {
        usage.processes += 1;
        usage.threads += p.stat.threads;
        usage.rss_bytes += p.stat.rss_pages * page;
        ticks_used += p.stat.cpu_ticks;
    }
    usage.cpu = Duration::from_micros(ticks_used.saturating_mul(1_000_000) / ticks);
    Ok(usage)
}

/// One process of a walk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walked {
    pub pid: i32,
    /// `None` for the init.
    pub parent: Option<i32>,
    pub stat: ProcStat,
}

/// The tree rooted at `init`, parents before their children, through each thread's
/// `children` list (so only the tree's own processes, whatever pid namespace the caller is
/// in). A child whose parent changed between the two reads (it exited and its pid was
/// reused) is left out, and so are zombies unless `zombies`. At most [`MAX_PROCESSES`].
pub(crate) fn walk(init: libc::pid_t, zombies: bool) -> io::Result<Vec<Walked>> {
    let mut out = Vec::new();
    let mut queue = vec![(init, None)];
    while let Some((pid, parent)) = queue.pop() {
        let stat = match ProcStat::read(pid) {
            Ok(s) => s,
            Err(e) if pid == init => return Err(e),
            Err(_) => continue, // exited since its parent listed it
        };
        if parent.is_some_and(|p| p != stat.ppid) || (!zombies && stat.is_zombie()) {
            continue;
        }
        out.push(Walked { pid, parent, stat });
        if out.len() >= MAX_PROCESSES {
            break;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            queue.extend(
                children
                    .split_ascii_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .map(|c| (c, Some(pid))),
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_callers_own_tree_counts_itself_and_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let usage = tree_usage(me).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(usage.processes >= 2, "{usage:?}");
        assert!(usage.threads >= usage.processes, "{usage:?}");
        assert!(usage.rss_bytes > 1 << 20, "{usage:?}");
    }
}
