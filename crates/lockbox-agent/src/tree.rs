//! Process trees from `/proc`: every live descendant of a pid, found by parent links. A
//! subreaper root keeps orphans (double forks, `setsid` daemons) among its descendants.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lockbox_confine::agent_sys;
use lockbox_confine::proc_stat::ProcStat;

/// Live (non-zombie) descendants of `root`, parents before children.
pub fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        match ProcStat::read(pid) {
            Ok(stat) if !stat.is_zombie() => children.entry(stat.ppid).or_default().push(pid),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        if let Some(kids) = children.get(&p) {
            for &k in kids {
                out.push(k);
                queue.push(k);
            }
        }
    }
    out
}

/// The live processes of a command's tree: every descendant of its shim, and the command
/// itself when it runs in place of a shim (`shim == main`: see `shim::Shim::in_place`).
fn members(shim: i32, main: i32) -> Vec<i32> {
    let mut pids = descendants(shim);
    if shim == main && ProcStat::read(main).is_ok_and(|s| !s.is_zombie()) {
        pids.insert(0, main);
    }
    pids
}

/// Children of `parent`, zombies included (to be reaped).
pub fn children(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&pid| ProcStat::read(pid).is_ok_and(|s| s.ppid == parent))
        .collect()
}

/// Sends `signal` to `main` (unless `spare_main`) and every live descendant of `shim`
/// except `main`... i.e. to the whole tree below the shim.
pub fn signal_tree(shim: i32, main: i32, signal: i32, spare_main: bool) {
    for pid in members(shim, main) {
        if spare_main && pid == main {
            continue;
        }
        let _ = agent_sys::kill(pid, signal);
    }
}

/// SIGKILLs the tree below `shim` (sparing `main` if asked) until none of it is alive, or
/// `limit` passes (a process stuck in the kernel). Returns whether the tree is gone.
pub fn kill_tree(shim: i32, main: i32, spare_main: bool, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        let alive: Vec<i32> = members(shim, main)
            .into_iter()
            .filter(|&p| !(spare_main && p == main))
            .collect();
        if alive.is_empty() {
            return true;
        }
        for &pid in &alive {
            let _ = agent_sys::kill(pid, libc::SIGKILL);
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
