//! A long-lived sandbox's init, re-executed small once its command runs.
//!
//! A forked init (`clone3` without `CLONE_VM`) starts with a copy of the caller's address
//! space, and the kernel's page tables for it. Under `lockbox serve`
//! that is the whole server, which grows with every sandbox it holds, so each new
//! sandbox's init carried more: the page tables of N sandboxes grew as N² (issue 34: 3.9 GB
//! of page tables at 2,250 sandboxes). Once a single-command sandbox's command is running,
//! the init needs nothing of its caller's memory: it only forwards signals, reaps, and
//! reports how the command ended. So the init of a sandbox started with
//! [`Spawn::agent`](crate::Spawn::agent) and [`Spawn::lean_init`](crate::Spawn::lean_init)
//! — whose executable is bound inside the sandbox and dispatches [`main_if_init`] —
//! executes that same executable with [`INIT_ARG`], the command's pid and the descriptors it
//! still needs ([`exec`]), and goes on there ([`main_if_init`]): an idle sandbox then costs
//! what its own processes use. Its caller's
//! memory (credentials included: see `wiped`, `zeroed`) is gone with the exec, too. Such an
//! init is no longer forked at all: it shares its caller's memory until this exec, the
//! caller's thread suspended (`spawn::clone_sharing_memory`), so that no page tables are
//! copied only to be torn down here.
//!
//! What carries over `execve`: the pid (so the supervisor's pidfd, the branch's record of
//! the init and the sandbox's pid 1 stay as they were), the namespaces and cgroups, the
//! blocked signals and those pending (so the signalfd goes on), the death signal (no set-id
//! or capability change here: the executable is a plain file), and the usage of reaped
//! children. What does not: dumpability, which the new image makes non-dumpable first
//! thing. Between the exec and that, the command cannot trace the init: Landlock confines
//! ptrace to the command's own domain, which the init is not in.
//!
//! If the exec fails (the executable is gone, say), a forked init goes on as it was cloned:
//! only the memory saving is lost. An init that shares its caller's memory until this exec
//! (`Prepared::shares_caller_memory`, the usual case) cannot: it reports the failure and
//! ends the sandbox.

use crate::sys::{self, CStringArray};
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

/// The first argument (`argv[1]`, after the executable) that makes a binary a sandbox's
/// re-executed init; [`main_if_init`] answers it.
pub const INIT_ARG: &str = "__lockbox_init";

/// Numbers after [`INIT_ARG`]: the command's pid, the signalfd, the report channel, the
/// supervisor's pidfd.
const NUMBERS: usize = 4;

/// The re-executed init's executable and arguments, prepared before the clone.
#[derive(Debug)]
pub(crate) struct LeanExec {
    pub(crate) exec_candidates: Vec<CString>,
    /// `prefix`, [`INIT_ARG`], then [`NUMBERS`] numbers set in the init.
    pub(crate) argv: CStringArray,
    /// Empty: nothing of the sandbox's environment is the init's business.
    pub(crate) envp: CStringArray,
}

impl LeanExec {
    /// Runs `exec_candidates` (the first that exists) with `prefix` (the executable as argv[0],
    /// and what comes before it when a loader runs it), then [`INIT_ARG`] and the numbers.
    pub(crate) fn new(exec_candidates: Vec<CString>, prefix: Vec<CString>) -> LeanExec {
        let mut items = prefix;
        items.push(CString::from(c"__lockbox_init"));
        LeanExec {
            exec_candidates,
            argv: CStringArray::with_numbers(items, NUMBERS),
            envp: CStringArray::new(Vec::new()),
        }
    }
}

/// In the init, once `command` runs: closes every descriptor but the sandbox's stdio,
/// `signal_fd`, `report_fd` and `parent` (the supervisor's pidfd), and executes the lean
/// init with their numbers. Returns only if that failed, with why (a forked init then goes
/// on as it is). Allocates nothing (see `child`).
pub(crate) fn exec(
    lean: &mut LeanExec,
    command: libc::pid_t,
    signal_fd: RawFd,
    report_fd: RawFd,
    parent: RawFd,
) -> sys::Errno {
    let mut keep = [0, 1, 2, signal_fd, report_fd, parent];
    keep.sort_unstable();
    // What else is open (the cgroup descriptors the init joined with) is done with.
    crate::child::close_other_fds(&keep, None, &[], &[]);
    // The lean init gets what it keeps at the lowest numbers free (the originals, numbered
    // as in the caller, close at the exec), so that its descriptor table can be made small
    // there (`agent_sys::shrink_descriptor_table`). If the exec fails, the init goes on with
    // the originals.
    let mut passed = [signal_fd, report_fd, parent];
    for fd in passed.iter_mut() {
        match sys::dup_above(*fd, 3) {
            Ok(low)
                if low < *fd
                    && sys::clear_cloexec(low).is_ok()
                    && sys::set_cloexec(*fd).is_ok() =>
            {
                *fd = low;
            }
            Ok(low) => {
                // SAFETY: `low` is the copy just made here, which nothing else knows of.
                unsafe { sys::close(low) };
                if let Err(e) = sys::clear_cloexec(*fd) {
                    return e;
                }
            }
            Err(e) => return e,
        }
    }
    let [signal_fd, report_fd, parent] = passed;
    for (i, n) in [command, signal_fd, report_fd, parent]
        .into_iter()
        .enumerate()
    {
        lean.argv.set_number(i, n);
    }
    let mut error = sys::Errno(libc::ENOENT);
    for candidate in &lean.exec_candidates {
        let e = sys::execve(candidate, &lean.argv, &lean.envp);
        if e.0 != libc::ENOENT && e.0 != libc::ENOTDIR {
            error = e;
        }
    }
    error
}

/// If `argv[1]` is [`INIT_ARG`], this process is a sandbox's re-executed init: it forwards
/// signals to the command and reaps until the command exits, kills what is left, reports,
/// and exits the process; otherwise returns at once. Call it first thing in `main` of an
/// executable run as a sandbox agent (`lockbox-agent`'s `main_if_agent` does).
pub fn main_if_init() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(INIT_ARG)) {
        return;
    }
    // Made non-dumpable again first thing (see the module doc): an exec resets it.
    let _ = sys::prctl(libc::PR_SET_DUMPABLE, 0);
    let numbers: Vec<i32> = args
        .map_while(|a| a.to_str().and_then(|s| s.parse().ok()))
        .collect();
    let [command, signal_fd, report_fd, parent] = numbers[..] else {
        eprintln!("lockbox: {INIT_ARG} is internal: it is a sandbox's init");
        std::process::exit(2);
    };
    show_title();
    // Its table was its caller's, as large as the caller's highest descriptor.
    let _ = crate::agent_sys::shrink_descriptor_table();
    // Copies of the descriptors named: whoever might own the originals in this process
    // keeps them (they close when it exits).
    let (Some(signal_fd), Some(report_fd), Some(parent)) = (
        crate::agent_sys::inherited_fd(signal_fd),
        crate::agent_sys::inherited_fd(report_fd),
        crate::agent_sys::inherited_fd(parent),
    ) else {
        eprintln!("lockbox: {INIT_ARG}: a descriptor it names is not open");
        std::process::exit(2);
    };
    run(command, &signal_fd, &report_fd, parent)
}

/// Shows the init as the cloned one did (`child::hide_command_line`): `lockbox-init` in
/// `/proc/1/cmdline` and `comm`, not the executable's path and numbers.
fn show_title() {
    let Ok(layout) = crate::proctitle::Layout::of_self() else {
        return;
    };
    // `/proc/PID/cmdline` reads only anonymous memory; kept for the life of the process.
    let title: &'static [u8] = Vec::leak(crate::proctitle::TITLE.to_vec());
    sys::wipe_exec_strings(&layout, title);
    let _ = sys::set_name(c"lockbox-init");
    // SAFETY: `with_title` keeps `start_brk`, and `brk` is the current break: the heap stays
    // where it is (this process has one thread).
    let _ = unsafe { sys::set_mm_map(&layout.with_title(title, sys::current_brk())) };
}

fn run(command: libc::pid_t, signal_fd: &OwnedFd, report_fd: &OwnedFd, parent: OwnedFd) -> ! {
    // The death signal survives the exec; armed again all the same, and the supervisor
    // checked after, as the cloned init did (`child::die_with_parent`).
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    let mut polled = [libc::pollfd {
        fd: parent.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    if sys::poll(&mut polled, 0).unwrap_or(0) > 0 {
        // Nobody is left to report to; exiting kills every process of the sandbox.
        sys::exit(125)
    }
    drop(parent);
    let status = crate::child::supervise(command, signal_fd.as_fd());
    // The sandbox's stdio goes before the status (as `child::finish` does): the
    // supervisor then sees its end no later than the status.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
    crate::child::report_end(report_fd.as_raw_fd(), status, false)
}
