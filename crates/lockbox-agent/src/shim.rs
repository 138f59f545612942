//! The per-command shim: a forked child of the agent that becomes a session leader and a
//! child subreaper, starts the command, reports its pid, waits for it, then kills whatever
//! the command left behind and reports its status. Because it is a subreaper, orphans of the
//! command (double forks, `setsid` daemons) reparent to it and stay findable as its
//! descendants, which is what makes whole-tree kill work.

use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;
use std::time::Duration;

use lockbox_confine::raw::{self, CommandFilter};

use crate::tree;

/// What the shim does; `slots[i]` becomes descriptor `i` of the command.
pub(crate) struct Shim<'a> {
    pub slots: Vec<RawFd>,
    pub report: RawFd,
    pub argv: &'a [String],
    pub cwd: Option<&'a str>,
    pub env_clear: bool,
    pub env: &'a [(String, String)],
    pub controlling_tty: bool,
    /// Stacked on the shim (and so on the command) before anything else.
    pub filter: &'a CommandFilter,
}

/// Runs the shim in the forked child. Never returns.
pub(crate) fn run(shim: Shim<'_>) -> ! {
    let code = match setup_and_wait(&shim) {
        Ok(()) => 0,
        Err(()) => 127,
    };
    raw::exit(code)
}

fn setup_and_wait(shim: &Shim<'_>) -> Result<(), ()> {
    // First, so that no code of the command ever runs without it; the shim itself needs
    // no openat2. On failure the command is not started (its start reports the errno).
    if let Err(e) = shim.filter.install() {
        let _ = raw::write_all(shim.report, &(-e.0).to_le_bytes());
        return Err(());
    }
    let _ = rustix::process::setsid();
    let _ = raw::set_child_subreaper();
    // Put the slots in place: first above every target, then onto 0..n.
    let n = shim.slots.len() as RawFd;
    let high: Vec<RawFd> = shim
        .slots
        .iter()
        .map(|&fd| raw::dup_above(fd, 100))
        .collect::<Result<_, _>>()
        .map_err(drop)?;
    let report = raw::dup_above(shim.report, 100).map_err(drop)?;
    for (i, &fd) in high.iter().enumerate() {
        raw::dup2(fd, i as RawFd).map_err(drop)?;
    }
    raw::dup2(report, n).map_err(drop)?;
    raw::set_cloexec(n).map_err(drop)?;
    let report = n;
    // Nothing of the agent (its socket, other commands' pipes) may stay open here.
    raw::close_range((n + 1) as u32, u32::MAX);
    if shim.controlling_tty {
        let _ = rustix::process::ioctl_tiocsctty(std::io::stdin());
    }
    let mut cmd = Command::new(&shim.argv[0]);
    cmd.args(&shim.argv[1..]);
    if shim.env_clear {
        cmd.env_clear();
    }
    cmd.envs(shim.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = shim.cwd {
        cmd.current_dir(cwd);
    }
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
            let _ = raw::write_all(report, &(-errno).to_le_bytes());
            let _ = writeln!(
                std::io::stderr(),
                "lockbox: cannot run {:?}: {e}",
                shim.argv[0]
            );
            return Err(());
        }
    };
    let main = child.id() as i32;
    raw::write_all(report, &main.to_le_bytes()).map_err(drop)?;
    // Our copies of the command's descriptors would keep its pipes from reaching EOF.
    if let Ok(null) = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            let _ = raw::dup2(null.as_raw_fd(), fd);
        }
    }
    for fd in 3..n {
        raw::close(fd);
    }
    let status = wait_for(main);
    // The command is done: nothing it started outlives it.
    let me = rustix::process::getpid().as_raw_nonzero().get();
    loop {
        tree::kill_tree(me, 0, false, Duration::from_secs(5));
        match rustix::process::wait(rustix::process::WaitOptions::NOHANG) {
            Ok(Some(_)) => continue,
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => break, // ECHILD: nothing left
        }
    }
    let (code, signal) = match status {
        Some(s) => (
            s.exit_status().unwrap_or(-1),
            s.terminating_signal().unwrap_or(0),
        ),
        None => (-1, 0),
    };
    let mut record = [0u8; 8];
    record[..4].copy_from_slice(&code.to_le_bytes());
    record[4..].copy_from_slice(&signal.to_le_bytes());
    let _ = raw::write_all(report, &record);
    Ok(())
}

/// Reaps children until `main` has ended; returns its status.
fn wait_for(main: i32) -> Option<rustix::process::WaitStatus> {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get() == main => return Some(status),
            Ok(_) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
    }
}
