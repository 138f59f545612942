//! What a running sandbox uses now: its process tree read from `/proc`.
//!
//! The tree is walked from the init through each thread's `children` list, so only the
//! sandbox's own processes count, whatever pid namespace the caller is in. A child whose
//! parent changed between the two reads (it exited and its pid was reused) is skipped.

use std::io;
use std::time::Duration;

/// How far a walk goes: more processes than any sandbox's bound allows by default.
const MAX_PROCESSES: usize = 65_536;

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
    let mut queue = vec![(init, None)];
    while let Some((pid, parent)) = queue.pop() {
        let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(s) => s,
            Err(e) if pid == init => return Err(e),
            Err(_) => continue, // exited since its parent listed it
        };
        let Some(stat) = Stat::parse(&stat) else {
            continue;
        };
        if parent.is_some_and(|p| p != stat.ppid) {
            continue;
        }
        usage.processes += 1;
        usage.threads += stat.threads;
        usage.rss_bytes += stat.rss_pages * page;
        ticks_used += stat.cpu_ticks;
        if usage.processes as usize >= MAX_PROCESSES {
            break;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            let Ok(children) = std::fs::read_to_string(path) else {
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
    usage.cpu = Duration::from_micros(ticks_used.saturating_mul(1_000_000) / ticks);
    Ok(usage)
}

/// The fields of `/proc/PID/stat` a walk needs.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    ppid: libc::pid_t,
    /// utime + stime + cutime + cstime, in clock ticks.
    cpu_ticks: u64,
    threads: u32,
    rss_pages: u64,
}

impl Stat {
    /// Parses the line; the command name (field 2) may hold spaces and parentheses, so
    /// fields are counted from its last `)`.
    fn parse(line: &str) -> Option<Stat> {
        let rest = &line[line.rfind(')')? + 1..];
        // Fields from 3 (state) on: index = field number - 3.
        let f: Vec<&str> = rest.split_ascii_whitespace().collect();
        let num = |field: usize| f.get(field - 3)?.parse::<i64>().ok();
        let cpu = [14, 15, 16, 17]
            .into_iter()
            .map(|i| num(i).map(|v| v.max(0) as u64))
            .sum::<Option<u64>>()?;
        Some(Stat {
            ppid: i32::try_from(num(4)?).ok()?,
            cpu_ticks: cpu,
            threads: u32::try_from(num(20)?.max(0)).ok()?,
            rss_pages: num(24)?.max(0) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 3 0 \
                    123 456789 99 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                ppid: 7,
                cpu_ticks: 110,
                threads: 3,
                rss_pages: 99
            })
        );
        assert_eq!(Stat::parse("42 (no close paren"), None);
    }

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
