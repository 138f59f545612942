//! The per-command shim: a forked child of the agent that becomes a session leader and a
//! child subreaper, starts the command, reports its pid, waits for it, then kills whatever
//! the command left behind and reports its status. Because it is a subreaper, orphans of the
//! command (double forks, `setsid` daemons) reparent to it and stay findable as its
//! descendants, which is what makes whole-tree kill work.
//!
//! A session's shell needs no shim beside it: it *becomes* the shim ([`Shim::in_place`]).
//! The forked child does the shim's set-up (filter, session, subreaper) and executes the
//! shell in place, which keeps being a subreaper (`PR_SET_CHILD_SUBREAPER` holds across
//! `execve`), so the orphans of its commands stay its descendants. The agent follows it
//! with a pidfd and ends what it leaves behind (`Agent::end_orphans`). An idle sandbox then
//! holds three processes — init, agent, shell — not four: 10,000 sandboxes fit under the
//! default `pid_max` of 32,768 (issue 34).

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use lockbox_confine::agent_sys::{self, CommandFds, CommandFilter};

use crate::tree;

/// What the shim does, in a child forked by [`agent_sys::fork_command`], which has already
/// put the command's descriptors in place (`slots[i]` as descriptor `i`).
pub(crate) struct Shim<'a> {
    pub argv: &'a [String],
    pub cwd: Option<&'a str>,
    pub env_clear: bool,
    pub env: &'a [(String, String)],
    pub controlling_tty: bool,
    /// Stacked on the shim (and so on the command) before anything else.
    pub filter: &'a CommandFilter,
    /// Execute the command in place of the shim: nothing goes on the report if it starts
    /// (the report closes on exec), only the errno if it cannot.
    pub in_place: bool,
}

/// Runs the shim in the forked child. Never returns.
pub(crate) fn run(shim: Shim<'_>, fds: CommandFds) -> ! {
    let code = match setup_and_wait(&shim, fds) {
        Ok(()) => 0,
        Err(()) => 127,
    };
    agent_sys::exit(code)
}

fn setup_and_wait(shim: &Shim<'_>, mut fds: CommandFds) -> Result<(), ()> {
    // First, so that no code of the command ever runs without it; the shim itself needs
    // no openat2. On failure the command is not started (its start reports the errno).
    if let Err(e) = shim.filter.install() {
        let _ = agent_sys::write_all(fds.report(), &(-e.0).to_le_bytes());
        return Err(());
    }
    let _ = rustix::process::setsid();
    let _ = agent_sys::set_child_subreaper();
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
    if shim.in_place {
        use std::os::unix::process::CommandExt;
        // Returns only if the command could not be executed.
        let e = cmd.exec();
        cannot_run(&fds, &shim.argv[0], &e);
        return Err(());
    }
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            cannot_run(&fds, &shim.argv[0], &e);
            return Err(());
        }
    };
    let main = child.id() as i32;
    agent_sys::write_all(fds.report(), &main.to_le_bytes()).map_err(drop)?;
    // Our copies of the command's descriptors would keep its pipes from reaching EOF.
    let _ = fds.release_slots();
    let status = wait_for(main);
    // The command is done: nothing it started outlives it.
    end_leftovers();
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
    let _ = agent_sys::write_all(fds.report(), &record);
    Ok(())
}

/// Tells the agent (the errno on the report) and the command's stderr that `program` could
/// not be started.
fn cannot_run(fds: &CommandFds, program: &str, e: &std::io::Error) {
    let errno = e.raw_os_error().unwrap_or(libc::ENOENT);
    let _ = agent_sys::write_all(fds.report(), &(-errno).to_le_bytes());
    let _ = writeln!(std::io::stderr(), "lockbox: cannot run {program:?}: {e}");
}

/// Kills and reaps whatever the command left behind, until the shim has no child.
///
/// The shim's children are asked first: with none left (the usual case: the command
/// started nothing that outlived it) there is nothing to walk `/proc` for, because every
/// descendant of the shim descends from a child of it. Orphans reparent to the shim (a
/// subreaper) before their parent's exit can be reaped, so after `main` was reaped its
/// survivors are already children here (`PR_SET_CHILD_SUBREAPER` in prctl(2)). Issue 30:
/// the walk reads every `/proc/PID/stat` of the sandbox, on every command's exit.
fn end_leftovers() {
    use rustix::process::{wait, WaitOptions};
    let me = rustix::process::getpid().as_raw_nonzero().get();
    loop {
        match wait(WaitOptions::NOHANG) {
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(_) => return, // ECHILD: nothing left
        }
        // Something is alive below the shim: kill it all, then reap.
        tree::kill_tree(me, 0, false, Duration::from_secs(5));
        match wait(WaitOptions::NOHANG) {
            Ok(Some(_)) => {}
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return,
        }
    }
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
