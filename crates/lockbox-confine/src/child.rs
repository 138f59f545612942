//! The two processes lockbox starts inside the new namespaces.
//!
//! **The init** (pid 1 of the sandbox's pid namespace) is the clone child. It runs these
//! steps, one function each, and reports a failure as a fixed-size [`Record`]. First of
//! all it arms its death signal ([`die_with_parent`]), so that from the clone on a dead
//! supervisor means a dead sandbox (issue 32: armed late, in step 11, a sandbox whose
//! lockbox was killed during its set-up ran on unsupervised, writing into its branch). Then:
//!
//! 0. install the caller's per-sandbox stdio (if any) as descriptors 0, 1, 2, wipe the
//!    caller's command line and environment from our copy of its memory (`proctitle`: the
//!    command would read them in `/proc/1/cmdline`), and close every other descriptor of
//!    the caller's;
//! 1. join the limit cgroups (v1), through descriptors the parent opened;
//! 2. write `setgroups`, `uid_map`, `gid_map`: the caller's ids map to themselves (to 0 in
//!    an image sandbox); then
//!    start a helper process for the slow kernel work, done alongside steps 3 to 7: the
//!    sandbox's network namespace (see [`start_helper`]);
//! 3. enter a new cgroup namespace (after joining, so the sandbox sees its cgroup as `/`);
//! 4. make every mount private, so nothing we do propagates to the host;
//! 5. capture the granted host trees with `open_tree` (read-only ones made read-only,
//!    recursively, while still detached) — before the stage hides `/tmp`;
//! 6. mount the stage (a tmpfs) over `/tmp` and build the root on it ([`SetupPlan::ops`])
//!    up to `Op::EnterRoot` (for an image root: the image's overlay, and lockbox's `/dev`,
//!    `/proc` and `/etc` files captured to be attached inside it, see `plan::image_stage`);
//!    the namespace's own per-user limits (`quotas`) are written through the new `/proc`
//!    (`Op::LimitUserQuotas`);
//! 7. `pivot_root` into the stage (an image root: into the image's overlay);
//! 8. set the hostname; wait for the helper and enter the network namespace it made; detach
//!    the old root (unmounting waits for an RCU grace period, which lasts while the helper
//!    is in the kernel on the other CPU);
//! 9. carry out the ops after `Op::EnterRoot`: lockbox's scaffolding goes, the copy-on-write
//!    views are mounted (a gated sandbox first waits at `Op::Gate` for the supervisor's
//!    go); then make `/` read-only (not an image root, whose writes go to its own upper);
//! 10. create the Landlock ruleset with the plan's rules (paths now as seen inside);
//! 11. become non-dumpable (no ptrace, no /proc/1 access from the command), close every descriptor not needed, route signals to a signalfd;
//! 12. start the command (vfork-style: the child shares the init's memory until it execs, so
//!     no page tables are copied), then reap zombies and forward signals until it exits;
//!     then kill and reap everything left, report usage and the status, and exit. A
//!     long-lived sandbox's init ([`crate::Spawn::agent`]) first re-executes itself small
//!     and does this part there (`lean_init`): it would otherwise hold a copy of its
//!     caller's address space for the sandbox's life.
//!
//! Such an init is not even a fork: it shares its caller's memory until that exec
//! ([`init_entry_shared`], [`Prepared::shares_caller_memory`]), the caller's thread
//! suspended meanwhile, so that no page tables are copied. It then skips what would change
//! the caller's memory map, which is the caller's own: the wipe of step 0 and the
//! non-dumpability of step 11 (the lean init does both for itself).
//!
//! A sequence sandbox ([`crate::Spawn::sequence`]) does not exit after its first command:
//! while a command runs, the init enters a fresh IPC namespace for the next; once it is over
//! (and everything it left is killed and reaped), the init replaces the stdio by
//! `/dev/null`, reports, carries out the next command's ops ([`crate::plan::StepPlan`]:
//! fresh scratch; the views stay) and forks its process; and so on until the last command,
//! after which it exits as above. The Landlock ruleset is kept for all the commands.
//!
//! A pre-armed sandbox ([`crate::Spawn::armed`]) does not know its command at the clone:
//! once set up, the init starts its command child at once, sharing its memory (vfork-style:
//! the init is suspended until the child execs), which confines itself as a sequence's
//! later command does and waits for the go; the go brings the stdio and a sealed memfd with
//! argv, environment and exec candidates, which the child reads into room made for it
//! before the clone ([`ArmedRoom`]) and executes (`armed`). The init then supervises it as
//! any command; after its report, it waits for the supervisor to close the report socket
//! before it exits ([`Prepared::linger`]).
//!
//! **The command child** resets signals, sets rlimits, hands over passed descriptors,
//! starts a session of its own if asked ([`crate::Spawn::own_session`]), changes directory, sets `no_new_privs`, drops all capabilities, enforces Landlock,
//! installs seccomp (last, so the filter need not allow setup) and executes the command.
//! The later commands of a sequence do the same in another order, ready before the
//! supervisor's go, which brings their stdio: capabilities, seccomp, Landlock, the
//! directory, then they wait for the go.
//!
//! Nothing here allocates, locks, logs or panics: the parent may be multi-threaded, and after
//! `clone` only the calling thread exists, possibly with a lock held by a vanished thread.
//! Everything is prepared by the parent in [`Prepared`].
//!
//! **Descriptors** are numbers here (`RawFd`; `sys`'s module doc says why), and every one
//! in the init's table is the init's alone: the `clone3` that made it shares no descriptor
//! table (no `CLONE_FILES`), and the parent's `OwnedFd`s, copied into its memory by the
//! clone, are never used or dropped in it (nothing here returns: the init and the command
//! child end in `_exit` or `execve`). The helper shares the init's table but closes only
//! what it opened; the command child has a copy of its own. So closing or replacing a
//! descriptor (`sys::close`, `sys::dup2`, `sys::close_range`, all `unsafe fn`) is sound
//! once nothing here uses its number again, which each `// SAFETY:` comment at such a call
//! says.

use crate::plan::{Op, SetupPlan};
use crate::report::{Go, NetHandover, NetTaken, Record, Step, RECORD_LEN};
use crate::sys::{self, CStringArray, Errno, SigSet};
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Everything the init and the command child need, computed before the clone.
#[derive(Debug)]
pub struct Prepared {
    pub(crate) plan: SetupPlan,
    pub(crate) uid_map: Vec<u8>,
    pub(crate) gid_map: Vec<u8>,
    pub(crate) cgroup_procs: Vec<RawFd>,
    pub(crate) new_cgroup_ns: bool,
    pub(crate) hostname: Vec<u8>,
    /// The kernel's slow work, done by a helper process alongside the root's set-up
    /// ([`start_helper`]); `helper_stack` is its stack.
    pub(crate) helper: Alongside,
    pub(crate) helper_stack: Vec<u8>,
    pub(crate) landlock: Option<(u32, Vec<u8>)>,
    pub(crate) seccomp: Vec<seccompiler::sock_filter>,
    /// The network filter and the socket its listener is announced on (see `netsup`).
    pub(crate) net: Option<(Vec<seccompiler::sock_filter>, RawFd)>,
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    pub(crate) pass_fds: Vec<RawFd>,
    /// Descriptors the init keeps (sorted): stdio, the report pipe, pass_fds, cgroup fds.
    pub(crate) keep_fds: Vec<RawFd>,
    pub(crate) report_fd: RawFd,
    /// A pidfd of the supervisor process, which [`die_with_parent`] checks and closes.
    pub(crate) parent: RawFd,
    /// Descriptors to install as 0, 1, 2 (`-1`: keep the caller's); all `>= 3`.
    pub(crate) stdio: [RawFd; 3],
    /// The command starts a session of its own ([`crate::Spawn::own_session`]).
    pub(crate) own_session: bool,
    /// The command, or the commands of a sequence (one per step, see
    /// [`SetupPlan::steps`]).
    pub(crate) commands: Vec<Command>,
    pub(crate) envp: CStringArray,
    pub(crate) last_cap: u32,
    /// Scratch space for captured source descriptors, one slot per plan source.
    pub(crate) source_fds: Vec<RawFd>,
    /// Stack of the command child, which starts sharing the init's memory.
    pub(crate) command_stack: Vec<u8>,
    /// The caller's memory layout, whose argument and environment areas the init wipes.
    pub(crate) layout: crate::proctitle::Layout,
    /// [`crate::proctitle::TITLE`] on the heap: `/proc/PID/cmdline` reads only anonymous
    /// memory.
    pub(crate) title: Vec<u8>,
    /// (path, value) of the user namespace's own limits of per-user quotas (see `quotas`),
    /// written at `Op::LimitUserQuotas`.
    pub(crate) user_sysctls: Vec<(CString, Vec<u8>)>,
    /// How a single-command sandbox's init re-executes itself once its command runs
    /// (long-lived sandboxes, [`crate::lean_init`]); `None`: it stays as cloned.
    pub(crate) lean: Option<crate::lean_init::LeanExec>,
    /// The init shares its caller's memory until it executes its lean self (cloned by
    /// [`init_entry_shared`] rather than forked): it leaves what the memory map carries
    /// (the caller's command line, its dumpability) alone, and ends if that exec fails.
    pub(crate) shares_caller_memory: bool,
    /// A pre-armed sandbox ([`crate::Spawn::armed`]): its command child confines itself and
    /// waits for a go that brings the command; this is its room for the command and
    /// pointers into it (see `armed`). `None`: the command is in `commands`.
    pub(crate) armed: Option<ArmedRoom>,
    /// Once it has reported the command's end, the init waits for the supervisor to close
    /// the report socket before it exits (a pre-armed sandbox without cgroups, whose
    /// supervisor does not wait for the init's end). Its exit tears the namespaces down,
    /// 0.2 ms or more of a core; a report wakes the supervisor "sync", on the reporting
    /// init's own core, which that teardown would hold while the supervisor waits (on a
    /// small machine, the handed-over run's caller waits with it). The supervisor closes it
    /// once its caller has the answer.
    pub(crate) linger: bool,
    /// The root is a copy of a template's (`crate::template`): the init is cloned into it
    /// by a go-between ([`go_between`]) and mounts only the sandbox's own filesystems.
    pub(crate) template: Option<FromTemplate>,
}

/// What an init whose root is a copy of a template's needs (see `crate::template`).
#[derive(Debug)]
pub(crate) struct FromTemplate {
    /// The template's user and mount namespaces, which the go-between joins before the
    /// clone, so that the init's are a child of the one and a copy of the other.
    pub(crate) user_ns: RawFd,
    pub(crate) mount_ns: RawFd,
    /// The host's `/proc` (`O_PATH`): until the init mounts its own, the copy's `/proc` is
    /// the template's, which does not show the init. Closed once the set-up helper has it.
    pub(crate) host_proc: RawFd,
    /// What the init carries out in its copy, from `/`: indices into the plan's ops
    /// ([`crate::plan::TemplateSplit::instance`]).
    pub(crate) instance: Vec<usize>,
}

/// Where the command child of a pre-armed sandbox puts the command the go brings: made
/// before the clone (the child may not allocate), in the init's memory, which the child
/// shares until its `execve`. Untouched pages cost nothing (`bytes` is a mapping of its
/// own: an allocator's reused memory would be zeroed at every arming).
#[derive(Debug)]
pub struct ArmedRoom {
    /// The command's bytes ([`crate::armed::MAX_BYTES`] at most).
    pub(crate) bytes: sys::AnonMap,
    /// Pointers into `bytes`: exec candidates, argv, environment.
    pub(crate) pointers: Vec<*const libc::c_char>,
}

/// One command to execute: its argv and where `execve` looks for it, in order.
#[derive(Debug)]
pub struct Command {
    pub(crate) exec_candidates: Vec<CString>,
    pub(crate) argv: CStringArray,
}

/// Signals the init forwards to the command (and `SIGCHLD` for reaping).
pub(crate) const FORWARDED: [libc::c_int; 7] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// What the helper of [`start_helper`] does, and what it leaves for the init in the memory
/// they share.
#[derive(Debug, Default)]
pub(crate) struct Alongside {
    /// Make the sandbox's own network namespace, with loopback up.
    pub(crate) netns: bool,
    /// In it, bind the sockets of lockbox's resolver ([`lockbox_netsup::DNS_ADDR`]:53), which the
    /// command child hands to the network supervisor with its filter.
    pub(crate) dns: bool,
    /// Those sockets (UDP, TCP listener) in the table they share (`-1` until made).
    dns_fds: [AtomicI32; 2],
    /// The host's `/proc` (`O_PATH`), opened by the init before the helper starts: the
    /// helper's paths resolve under it, whatever the init has mounted or pivoted meanwhile.
    proc_fd: AtomicI32,
    /// The network namespace, as a descriptor in the table they share (`-1` until made).
    netns_fd: AtomicI32,
    /// The step that failed (as a [`Step`] number), the index of its item, its errno.
    failed_step: AtomicU32,
    failed_index: AtomicU32,
    errno: AtomicI32,
}

impl Alongside {
    /// The helper's job: make a network namespace if `netns`.
    pub(crate) fn new(netns: bool, dns: bool) -> Alongside {
        Alongside {
            netns,
            dns: netns && dns,
            dns_fds: [AtomicI32::new(-1), AtomicI32::new(-1)],
            ..Default::default()
        }
    }

    /// The resolver's sockets the helper made: (UDP, TCP), `-1` for none.
    pub(crate) fn dns_fds(&self) -> (RawFd, RawFd) {
        (
            self.dns_fds[0].load(Ordering::Acquire),
            self.dns_fds[1].load(Ordering::Acquire),
        )
    }

    /// Whether there is anything to do (no helper is started otherwise).
    pub(crate) fn needed(&self) -> bool {
        self.netns
    }
}

struct Fail {
    step: Step,
    errno: Errno,
    index: u32,
}

fn at(step: Step) -> impl Fn(Errno) -> Fail {
    move |errno| Fail {
        step,
        errno,
        index: 0,
    }
}

fn at_index(step: Step, index: usize) -> impl Fn(Errno) -> Fail {
    move |errno| Fail {
        step,
        errno,
        index: index as u32,
    }
}

fn report(fd: RawFd, record: Record) {
    // A failed report cannot be reported; the parent then sees the init die silently.
    let _ = sys::write_all(fd, &record.encode());
}

/// The init's entry point (step numbers as in the module doc). Never returns.
///
/// A sequence sandbox ([`SetupPlan::steps`]) runs its commands one after another: after
/// each but the last, the init reports its status, renews scratch and starts the next
/// command's process on the same views (see [`start_next`]); that process waits for the go
/// itself.
pub fn init_main(p: &mut Prepared) -> ! {
    if let Err(fail) = die_with_parent(p) {
        fail_exit(p, fail)
    }
    let (signal_fd, ruleset) = match setup(p) {
        Ok(ready) => ready,
        Err(fail) => fail_exit(p, fail),
    };
    let mut step = 0;
    let mut start = match p.armed.is_some() {
        false => Start::Spawn(ruleset),
        true => match start_armed(p, ruleset) {
            Ok(pid) => Start::Started(pid),
            Err(fail) => fail_exit(p, fail),
        },
    };
    loop {
        let status = run_command(p, step, signal_fd.as_fd(), start);
        if step == p.plan.steps.len() {
            finish(p, status)
        }
        if let Err(fail) = end_step(p, status) {
            fail_exit(p, fail)
        }
        step += 1;
        start = match start_next(p, step, signal_fd.as_fd(), ruleset) {
            Ok(pid) => Start::Started(pid),
            Err(fail) => fail_exit(p, fail),
        };
    }
}

/// The init of [`init_main`], cloned sharing its caller's memory (`sys::spawn_vfork_into`).
pub(crate) struct SharedInit {
    /// The caller's, suspended until the init executes or exits.
    pub(crate) prepared: *mut Prepared,
    pub(crate) adopt: Option<crate::own_table::Adopt>,
}

/// Entry of an init cloned with `CLONE_VM | CLONE_VFORK` (the caller's thread suspended
/// until it executes its lean self, with every signal blocked): the caller's signal
/// handlers go first (they would run in its memory), then as [`init_main`].
pub(crate) fn init_entry_shared(start: &SharedInit) -> ! {
    sys::reset_signal_handlers();
    if let Some(adopt) = &start.adopt {
        if crate::own_table::adopt(adopt).is_err() {
            sys::exit(125)
        }
    }
    // SAFETY: the caller made `prepared` from its `&mut Prepared` and does not touch it
    // until we have exec'd or exited (CLONE_VFORK suspends it): ours alone meanwhile.
    init_main(unsafe { &mut *start.prepared })
}

/// What the first process of a root template needs (see `crate::template`).
#[derive(Debug)]
pub(crate) struct TemplateBuild {
    /// The template's part of the plan ([`crate::plan::TemplateSplit::shared`]).
    pub(crate) plan: SetupPlan,
    /// Scratch space for captured source descriptors, one slot per plan source.
    pub(crate) source_fds: Vec<RawFd>,
    pub(crate) uid_map: Vec<u8>,
    pub(crate) gid_map: Vec<u8>,
    /// Where it reports: `Record::Exited(0)` once the root is built, or what failed.
    pub(crate) report_fd: RawFd,
}

/// Where the first process of a root template finds its [`TemplateBuild`]: the
/// supervisor's, whose memory it shares, left alone by the supervisor until it is reaped.
pub(crate) struct TemplateStart {
    pub(crate) build: *mut TemplateBuild,
}

/// The first process of a root template, cloned into new user, mount and pid namespaces
/// sharing the supervisor's memory (every signal blocked, never unblocked): builds the
/// template's root as an init builds a sandbox's (steps 2 and 4 to 9, the shared part of
/// the plan, `/` made read-only), reports, and waits for the supervisor, which keeps the
/// namespaces, to kill it. It dies with the supervisor's thread. Like the init, it neither
/// allocates nor locks, and writes only its stack and the `TemplateBuild`.
pub(crate) fn template_main(start: &TemplateStart) -> ! {
    // SAFETY: the supervisor leaves `build` alone until it has reaped us (see `TemplateStart`).
    let t = unsafe { &mut *start.build };
    let record = match build_template(t) {
        Ok(()) => Record::Exited(0),
        Err(fail) => Record::Failed {
            step: fail.step,
            errno: fail.errno.0,
            index: fail.index,
        },
    };
    report(t.report_fd, record);
    loop {
        sys::pause();
    }
}

fn build_template(t: &mut TemplateBuild) -> Result<(), Fail> {
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(at(Step::SetDeathSignal))?;
    sys::write_file(c"/proc/self/setgroups", b"deny", 0).map_err(at(Step::WriteSetgroups))?;
    sys::write_file(c"/proc/self/uid_map", &t.uid_map, 0).map_err(at(Step::WriteUidMap))?;
    sys::write_file(c"/proc/self/gid_map", &t.gid_map, 0).map_err(at(Step::WriteGidMap))?;
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(at(Step::MakeMountsPrivate))?;
    capture(&t.plan, &mut t.source_fds)?;
    let root_at = t.plan.enter_root_at().unwrap_or(t.plan.ops.len());
    mount_stage()?;
    for (i, op) in t.plan.ops.iter().enumerate() {
        if i == root_at {
            sys::pivot_root_here().map_err(at(Step::PivotRoot))?;
            detach_old_root()?;
            continue;
        }
        apply(op, &mut t.source_fds, t.report_fd).map_err(at_index(Step::Mount, i))?;
    }
    set_readonly(c"/", false).map_err(at(Step::RemountRootReadonly))
}

/// What the go-between of a sandbox whose root is a template's copy needs: the init's
/// start, and room for what the clone gave (read by the supervisor once it has exited).
pub(crate) struct GoBetween {
    pub(crate) user_ns: RawFd,
    pub(crate) mount_ns: RawFd,
    /// Namespace flags for the init's clone (`CLONE_FILES` maybe), `CLONE_PARENT` added.
    pub(crate) flags: u64,
    /// The init shares the caller's memory (`Prepared::shares_caller_memory`): cloned on
    /// `init_stack` with `init`, which the caller keeps alive; else forked.
    pub(crate) shared: Option<(*mut u8, usize)>,
    pub(crate) init: SharedInit,
    pub(crate) pid: AtomicI32,
    pub(crate) pidfd: AtomicI32,
    /// What joining the template's namespaces failed with (0: nothing).
    pub(crate) join_errno: AtomicI32,
    /// What the init's clone failed with (0: nothing).
    pub(crate) clone_errno: AtomicI32,
}

/// The go-between ([`GoBetween`]), cloned sharing the supervisor's memory and descriptor
/// table (the supervisor suspended until it exits): joins the template's user and mount
/// namespaces, which a multi-threaded supervisor cannot, and clones the init from there
/// as the supervisor's own child (`CLONE_PARENT`), into namespaces that are a child of the
/// template's user namespace and a copy of its mount namespace: the copy's root is the
/// template's, entered without `pivot_root` (whose `chroot_fs_refs` visits every task of
/// the host). Its pid and pidfd, or what failed, are left in `g`.
pub(crate) fn go_between(g: &GoBetween) -> ! {
    let joined = sys::setns(g.user_ns, libc::CLONE_NEWUSER)
        .and_then(|()| sys::setns(g.mount_ns, libc::CLONE_NEWNS));
    if let Err(errno) = joined {
        g.join_errno.store(errno.0, Ordering::Release);
        sys::exit(1)
    }
    let cloned = clone_init(g);
    match cloned {
        Ok((pid, pidfd)) => {
            g.pid.store(pid, Ordering::Relaxed);
            g.pidfd.store(pidfd, Ordering::Release);
            sys::exit(0)
        }
        Err(errno) => {
            g.clone_errno.store(errno.0, Ordering::Release);
            sys::exit(1)
        }
    }
}

/// The go-between's clone of the init (see [`go_between`]): its pid and pidfd.
fn clone_init(g: &GoBetween) -> Result<(libc::pid_t, RawFd), Errno> {
    let flags = g.flags | libc::CLONE_PARENT as u64;
    match g.shared {
        Some((stack, len)) => {
            // SAFETY: the supervisor made `stack` for the init and, suspended until we
            // exit, leaves it alone; we are suspended in turn until the init has
            // exec'd or exited. The rest as in the supervisor's
            // `clone_sharing_memory`, whose promises hold for us: we share its
            // memory and have every signal blocked.
            let stack = unsafe { std::slice::from_raw_parts_mut(stack, len) };
            // SAFETY: as above.
            unsafe {
                sys::spawn_vfork_into(stack, init_entry_shared, &g.init, flags as libc::c_int)
            }
            .map(|(pid, pidfd)| (pid, pidfd.into_raw_fd()))
        }
        None => {
            // SAFETY: the child runs `init_main`, as a forked init does (see the
            // supervisor's `launch`).
            match unsafe { sys::clone3_fork(flags) }? {
                sys::Forked::Child => {
                    if let Some(adopt) = &g.init.adopt {
                        if crate::own_table::adopt(adopt).is_err() {
                            sys::exit(125)
                        }
                    }
                    // SAFETY: the child's own copy of the supervisor's `prepared`.
                    init_main(unsafe { &mut *g.init.prepared })
                }
                sys::Forked::Parent { pid, pidfd } => Ok((pid, pidfd.into_raw_fd())),
            }
        }
    }
}

/// How [`run_command`] gets its command going.
enum Start {
    /// Spawn it (vfork), confined by this Landlock ruleset.
    Spawn(Option<RawFd>),
    /// Already forked by [`start_next`].
    Started(libc::pid_t),
}

fn fail_exit(p: &Prepared, fail: Fail) -> ! {
    report(
        p.report_fd,
        Record::Failed {
            step: fail.step,
            errno: fail.errno.0,
            index: fail.index,
        },
    );
    sys::exit(125)
}

/// Arms `PR_SET_PDEATHSIG(SIGKILL)`: when the supervisor dies, the kernel kills the init,
/// and with it (pid 1 of the sandbox's pid namespace) every process of the sandbox. It
/// fires when the *thread* that cloned us exits, so long-lived sandboxes are cloned from a
/// thread that lives as long as its process (one of the runtime's spawner threads).
///
/// A supervisor that died between the clone and the prctl armed nothing (prctl(2)), so its
/// pidfd, readable once every thread of it is gone, is checked after: the usual `getppid()`
/// check cannot work here, the parent being outside our pid namespace (it reads 0).
fn die_with_parent(p: &Prepared) -> Result<(), Fail> {
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(at(Step::SetDeathSignal))?;
    let mut parent = [libc::pollfd {
        fd: p.parent,
        events: libc::POLLIN,
        revents: 0,
    }];
    let gone = sys::poll(&mut parent, 0).map_err(at(Step::SetDeathSignal))? > 0;
    // A lean init checks again after its exec (the pidfd is then among `keep_fds`).
    if p.lean.is_none() {
        // SAFETY: `p.parent` is the init's copy of the supervisor's pidfd (see Descriptors
        // in the module doc), used only by the poll above.
        unsafe { sys::close(p.parent) };
    }
    if gone {
        // Nobody is left to report to.
        sys::exit(125)
    }
    Ok(())
}

fn setup(p: &mut Prepared) -> Result<(OwnedFd, Option<RawFd>), Fail> {
    if p.template.is_some() {
        return setup_from_template(p);
    }
    redirect_stdio(p)?; // 0
    hide_command_line(p)?;

    // Nothing of the caller's is needed from here on: dropping it now (step 11 closes what
    // setup opened) matters for a gated sandbox, which may wait long while holding copies
    // of the caller's pipes (the previous pipeline stage's stdin, say).
    close_other_fds(&p.keep_fds, None, &[], &[]);
    join_cgroups(p)?; // 1
    map_ids(p)?; // 2
    let helper = start_helper(p)?; // the network namespace, until step 8
    if p.new_cgroup_ns {
        sys::unshare(libc::CLONE_NEWCGROUP).map_err(at(Step::UnshareCgroup))?; // 3
    }
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(at(Step::MakeMountsPrivate))?; // 4
    capture_sources(p)?; // 5

    // The root is built on the stage up to `Op::EnterRoot`; the rest, views included (a
    // gated sandbox waits at `Op::Gate` among them), inside it.
    let root_at = p.plan.enter_root_at().unwrap_or(p.plan.ops.len());
    mount_stage()?; // 6
    apply_ops(p, 0, root_at)?;
    sys::pivot_root_here().map_err(at(Step::PivotRoot))?; // 7
    sys::sethostname(&p.hostname).map_err(at(Step::SetHostname))?; // 8
    if let Some(helper) = helper {
        join_helper(p, helper)?;
    }
    // Unmounting waits for an RCU grace period, which lasts while the helper is in the
    // kernel on the other CPU: hence after it is done.
    detach_old_root()?;
    apply_ops(p, root_at + 1, p.plan.ops.len())?; // 9
    if !p.plan.root_writable {
        set_readonly(c"/", false).map_err(at(Step::RemountRootReadonly))?;
    }
    let ruleset = landlock_ruleset(p, &p.plan.rules)?; // 10
    let signal_fd = harden_init(p, ruleset)?; // 11
    Ok((signal_fd, ruleset))
}

/// [`setup`] of a sandbox whose root is a copy of a template's, already read-only and
/// entered (the go-between cloned the init into it): steps 3 to 9 are the sandbox's own
/// mounts alone ([`FromTemplate::instance`]). Ids and the helper go through the host's
/// `/proc`, the copy's being the template's until the sandbox's own is mounted.
fn setup_from_template(p: &mut Prepared) -> Result<(OwnedFd, Option<RawFd>), Fail> {
    let Some(host_proc) = p.template.as_ref().map(|t| t.host_proc) else {
        return Err(at(Step::MakeMountsPrivate)(Errno(libc::EINVAL)));
    };
    redirect_stdio(p)?; // 0
    hide_command_line(p)?;
    close_other_fds(&p.keep_fds, None, &[], &[host_proc]);
    join_cgroups(p)?; // 1
    map_ids_at(p, host_proc)?; // 2
    let helper = start_helper(p)?;
    // SAFETY: `host_proc` is the init's (its caller's copy, see Descriptors in the module
    // doc); the helper has its own descriptor of it, and nothing here uses it again.
    unsafe { sys::close(host_proc) };
    if p.new_cgroup_ns {
        sys::unshare(libc::CLONE_NEWCGROUP).map_err(at(Step::UnshareCgroup))?; // 3
    }
    let instance = p
        .template
        .as_mut()
        .map(|t| std::mem::take(&mut t.instance))
        .unwrap_or_default();
    for &i in &instance {
        apply_ops(p, i, i + 1)?; // 6
    }
    sys::sethostname(&p.hostname).map_err(at(Step::SetHostname))?; // 8
    if let Some(helper) = helper {
        join_helper(p, helper)?;
    }
    let ruleset = landlock_ruleset(p, &p.plan.rules)?; // 10
    let signal_fd = harden_init(p, ruleset)?; // 11
    Ok((signal_fd, ruleset))
}

/// Starts a helper process for the set-up's slow kernel work, if there is any: making the
/// sandbox's network namespace with loopback up (the kernel registers the namespace's
/// devices and sysctls: ~0.5 ms, as long as the whole root). It runs on another CPU while the init builds the root: it shares the init's
/// memory and descriptor table, leaves a descriptor of the network namespace (or what
/// failed) in [`Alongside`] and exits; [`join_helper`] waits for it and enters the
/// namespace. It is the sandbox's pid 2, so the command comes after it.
fn start_helper(p: &mut Prepared) -> Result<Option<libc::pid_t>, Fail> {
    if !p.helper.needed() {
        return Ok(None);
    }
    p.helper.netns_fd.store(-1, Ordering::Relaxed);
    let proc_fd = match &p.template {
        Some(t) => sys::open_at(t.host_proc, c".", libc::O_PATH | libc::O_DIRECTORY),
        None => sys::open(c"/proc", libc::O_PATH | libc::O_DIRECTORY, 0),
    }
    .map_err(at(Step::Helper))?;
    p.helper.proc_fd.store(proc_fd, Ordering::Relaxed);
    // SAFETY: `helper_main` makes only async-signal-safe calls, writes only its own stack and
    // the atomics of `p.helper`, closes only what it opened, and ends in `exit`, well within
    // `HELPER_STACK`; `p.helper_stack` and `p.helper` are left alone until `join_helper` has
    // reaped it, and every other way out of `setup` is `fail_exit`, which frees nothing (the
    // helper keeps the memory it shares alive).
    unsafe { sys::spawn_alongside(&mut p.helper_stack, helper_main, &p.helper) }
        .map(Some)
        .map_err(at(Step::Helper))
}

/// The helper of [`start_helper`]. Like the init, it neither allocates nor locks.
fn helper_main(job: &Alongside) -> ! {
    match helper_work(job) {
        Ok(()) => sys::exit(0),
        Err(fail) => {
            job.failed_step.store(fail.step as u32, Ordering::Relaxed);
            job.failed_index.store(fail.index, Ordering::Relaxed);
            job.errno.store(fail.errno.0, Ordering::Release);
            sys::exit(1)
        }
    }
}

fn helper_work(job: &Alongside) -> Result<(), Fail> {
    let proc_fd = job.proc_fd.load(Ordering::Relaxed);
    if job.netns {
        sys::unshare(libc::CLONE_NEWNET).map_err(at(Step::NetNamespace))?;
        sys::loopback_up().map_err(at(Step::LoopbackUp))?;
        if job.dns {
            // An IPv4 address besides 127.0.0.1, which glibc's AI_ADDRCONFIG ignores.
            sys::loopback_alias(crate::DNS_ADDR).map_err(at(Step::DnsSockets))?;
            let (udp, tcp) = sys::dns_sockets(crate::DNS_ADDR).map_err(at(Step::DnsSockets))?;
            job.dns_fds[0].store(udp, Ordering::Release);
            job.dns_fds[1].store(tcp, Ordering::Release);
        }
        let fd = sys::open_at(proc_fd, c"self/ns/net", libc::O_RDONLY)
            .map_err(at(Step::NetNamespace))?;
        job.netns_fd.store(fd, Ordering::Release);
    }
    Ok(())
}

/// Writes the user namespace's own limits of per-user quotas through the procfs mounted at
/// `proc` (relative to the current directory). Written in the sandbox's user namespace
/// (the kernel picks the writer's), so that the caller keeps the rest of its per-user
/// quotas; needs CAP_SYS_RESOURCE there, which the init holds until step 11, whoever the
/// caller is.
fn limit_user_quotas(proc: &CStr, sysctls: &[(CString, Vec<u8>)]) -> Result<(), Fail> {
    if sysctls.is_empty() {
        return Ok(());
    }
    let proc_fd =
        sys::open(proc, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(at(Step::LimitUserQuota))?;
    let mut result = Ok(());
    for (i, (path, value)) in sysctls.iter().enumerate() {
        let written = under_proc(path)
            .ok_or(Errno(libc::EINVAL))
            .and_then(|rel| sys::open_at(proc_fd, rel, libc::O_WRONLY))
            .and_then(|fd| {
                let written = sys::write_all(fd, value);
                // SAFETY: `fd` was opened just above and is not used after.
                unsafe { sys::close(fd) };
                written
            });
        if let Err(e) = written {
            result = Err(at_index(Step::LimitUserQuota, i)(e));
            break;
        }
    }
    // SAFETY: `proc_fd` was opened above and is not used after.
    unsafe { sys::close(proc_fd) };
    result
}

/// `path` relative to `/proc/`, if it is below it.
fn under_proc(path: &CStr) -> Option<&CStr> {
    let rel = path.to_bytes_with_nul().strip_prefix(b"/proc/")?;
    CStr::from_bytes_with_nul(rel).ok()
}

/// Waits for the helper of [`start_helper`], reports what failed in it, and enters the
/// network namespace it made.
fn join_helper(p: &Prepared, helper: libc::pid_t) -> Result<(), Fail> {
    let (status, _) = sys::wait4(helper).map_err(at(Step::Helper))?;
    let job = &p.helper;
    // SAFETY: the helper, the only other user of `proc_fd` (opened by `start_helper`), was
    // reaped above.
    unsafe { sys::close(job.proc_fd.load(Ordering::Relaxed)) };
    let errno = job.errno.load(Ordering::Acquire);
    if errno != 0 {
        let code = job.failed_step.load(Ordering::Relaxed);
        return Err(Fail {
            step: Step::from_code(code).unwrap_or(Step::Helper),
            errno: Errno(errno),
            index: job.failed_index.load(Ordering::Relaxed),
        });
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        // Killed before it could say why (the OOM killer, say).
        return Err(at(Step::Helper)(Errno(libc::ECHILD)));
    }
    if job.netns {
        let fd = job.netns_fd.load(Ordering::Acquire);
        let joined = sys::setns(fd, libc::CLONE_NEWNET).map_err(at(Step::NetNamespace));
        // SAFETY: `fd` was opened by the helper (reaped above) for the init, and is used only
        // by the setns above.
        unsafe { sys::close(fd) };
        joined?;
    }
    Ok(())
}

/// Installs the caller's per-sandbox stdio as 0/1/2. The sources are `>= 3` (ensured by the
/// parent), so no dup2 clobbers a later source; the originals are closed right after.
fn redirect_stdio(p: &Prepared) -> Result<(), Fail> {
    for (target, &fd) in p.stdio.iter().enumerate() {
        if fd >= 0 {
            // SAFETY: 0, 1 and 2 are the init's (see Descriptors in the module doc); replacing
            // what they were is the point.
            unsafe { sys::dup2(fd, target as RawFd) }.map_err(at(Step::RedirectStdio))?;
        }
    }
    Ok(())
}

/// Forgets the caller's command line and environment (see `proctitle`): wipes both areas
/// in our copy of the caller's memory, with the title at the start of the first, then,
/// where the kernel allows, points `/proc/1/cmdline` at the title alone.
fn hide_command_line(p: &Prepared) -> Result<(), Fail> {
    let name = CStr::from_bytes_with_nul(&p.title)
        .map_err(|_| Errno(libc::EINVAL))
        .map_err(at(Step::HideCommandLine))?;
    sys::set_name(name).map_err(at(Step::HideCommandLine))?;
    // The caller's memory itself: nothing of it is ours to change, and the exec of the
    // lean init (before anything but the agent runs in the sandbox) replaces both areas.
    if p.shares_caller_memory {
        return Ok(());
    }
    sys::wipe_exec_strings(&p.layout, &p.title);
    // Cosmetic (the NUL padding goes): kernels without CONFIG_CHECKPOINT_RESTORE refuse it,
    // and the wipe above already removed everything of the caller's.
    // SAFETY: `with_title` keeps `start_brk`, and `brk` is the current break: the heap stays
    // where it is.
    let _ = unsafe { sys::set_mm_map(&p.layout.with_title(&p.title, sys::current_brk())) };
    Ok(())
}

fn join_cgroups(p: &Prepared) -> Result<(), Fail> {
    for &fd in &p.cgroup_procs {
        sys::write_all(fd, b"0\n").map_err(at(Step::JoinCgroup))?;
        // SAFETY: `fd` is the init's copy of a `cgroup.procs` the parent opened for it, used
        // only by the write above.
        unsafe { sys::close(fd) };
    }
    Ok(())
}

fn map_ids(p: &Prepared) -> Result<(), Fail> {
    sys::write_file(c"/proc/self/setgroups", b"deny", 0).map_err(at(Step::WriteSetgroups))?;
    sys::write_file(c"/proc/self/uid_map", &p.uid_map, 0).map_err(at(Step::WriteUidMap))?;
    sys::write_file(c"/proc/self/gid_map", &p.gid_map, 0).map_err(at(Step::WriteGidMap))
}

/// [`map_ids`] through `proc`, a descriptor of the host's `/proc`.
fn map_ids_at(p: &Prepared, proc: RawFd) -> Result<(), Fail> {
    let write = |name: &CStr, data: &[u8], step: Step| {
        let fd = sys::open_at(proc, name, libc::O_WRONLY).map_err(at(step))?;
        let written = sys::write_all(fd, data).map_err(at(step));
        // SAFETY: `fd` was opened just above and is not used after.
        unsafe { sys::close(fd) };
        written
    };
    write(c"self/setgroups", b"deny", Step::WriteSetgroups)?;
    write(c"self/uid_map", &p.uid_map, Step::WriteUidMap)?;
    write(c"self/gid_map", &p.gid_map, Step::WriteGidMap)
}

fn capture_sources(p: &mut Prepared) -> Result<(), Fail> {
    capture(&p.plan, &mut p.source_fds)
}

fn capture(plan: &SetupPlan, source_fds: &mut [RawFd]) -> Result<(), Fail> {
    for (i, source) in plan.sources.iter().enumerate() {
        if source.staged {
            continue; // an `Op::Capture` takes it from the stage
        }
        let fd = sys::open_tree_clone(&source.host).map_err(at_index(Step::CaptureSource, i))?;
        source_fds[i] = fd;
        if source.readonly {
            sys::mount_set_readonly(fd, true).map_err(at_index(Step::CaptureSource, i))?;
        }
    }
    Ok(())
}

fn mount_stage() -> Result<(), Fail> {
    sys::mount(
        Some(c"lockbox"),
        c"/tmp",
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"mode=0755"),
    )
    .map_err(at(Step::MountStage))?;
    sys::chdir(c"/tmp").map_err(at(Step::MountStage))
}

/// Carries out ops `from..to` of the plan. Their paths are relative to the current
/// directory: the stage before `pivot_root`, the same tree as `/` after it.
fn apply_ops(p: &mut Prepared, from: usize, to: usize) -> Result<(), Fail> {
    for i in from..to {
        match &p.plan.ops[i] {
            Op::LimitUserQuotas { proc } => limit_user_quotas(proc, &p.user_sysctls)?,
            op => apply(op, &mut p.source_fds, p.report_fd).map_err(at_index(Step::Mount, i))?,
        }
    }
    Ok(())
}

/// Between two commands of a sequence: the previous command's stdio goes (its readers see
/// the end), replaced by `/dev/null` so that no descriptor opened later lands on 0..=2;
/// then its usage and status are reported.
fn end_step(p: &Prepared, status: Record) -> Result<(), Fail> {
    let null = sys::open(c"/dev/null", libc::O_RDWR, 0).map_err(at(Step::RedirectStdio))?;
    for target in 0..3 {
        if null != target {
            // SAFETY: 0, 1 and 2 are the init's (see Descriptors in the module doc); replacing
            // the previous command's stdio is the point.
            unsafe { sys::dup2(null, target) }.map_err(at(Step::RedirectStdio))?;
        }
    }
    if null > 2 {
        // SAFETY: `null` was opened above, copied onto 0..=2 and is not used after.
        unsafe { sys::close(null) };
    }
    let (cpu_us, max_rss_kb) = sys::children_usage();
    report(p.report_fd, Record::Usage { cpu_us, max_rss_kb });
    report(p.report_fd, status);
    Ok(())
}

/// Starts command `step` (>= 1) of a sequence: carries out the step's ops (fresh scratch),
/// then forks the command's process, which confines itself (capabilities, `no_new_privs`,
/// seccomp, Landlock by `ruleset`) and waits for the supervisor's go. Signals that arrived
/// for the previous command are dropped. A failure of the ops is reported against the
/// step's ops.
fn start_next(
    p: &mut Prepared,
    step: usize,
    signal_fd: BorrowedFd<'_>,
    ruleset: Option<RawFd>,
) -> Result<libc::pid_t, Fail> {
    while let Ok(Some(_)) = sys::read_signalfd(signal_fd) {}
    for i in 0..p.plan.steps[step - 1].ops.len() {
        apply(
            &p.plan.steps[step - 1].ops[i],
            &mut p.source_fds,
            p.report_fd,
        )
        .map_err(at_index(Step::Mount, i))?;
    }
    // A raw clone, not libc's fork: the init is a copy of a multi-threaded process, whose
    // vanished threads may hold the locks fork(3) takes.
    // SAFETY: the child runs `preforked_main`, which, like everything here, makes only
    // async-signal-safe calls and ends in `execve` or `_exit`.
    match unsafe { sys::clone3_fork(0) }.map_err(at(Step::ForkCommand))? {
        sys::Forked::Child => preforked_main(p, step, ruleset),
        sys::Forked::Parent { pid, pidfd } => {
            drop(pidfd);
            Ok(pid)
        }
    }
}

/// Starts the command child of a pre-armed sandbox, which confines itself and waits for the
/// go that brings its command ([`armed_main`]), and returns its pid once it has executed
/// it (or exited).
///
/// The child shares the init's memory until its `execve` (`CLONE_VM | CLONE_VFORK`, as a
/// direct start's command child): a fork's copy of the init's address space — the
/// caller's, a few MB — would be torn down by that `execve`, between the go and the
/// command, while the caller waits. The init is suspended meanwhile; until the go it has
/// nothing to do but die with its supervisor (`SIGKILL` reaches it while suspended), and a
/// child that fails or is killed before its exec resumes it.
fn start_armed(p: &mut Prepared, ruleset: Option<RawFd>) -> Result<libc::pid_t, Fail> {
    let mut stack = std::mem::take(&mut p.command_stack);
    let start = ArmedStart {
        prepared: p,
        ruleset,
    };
    // SAFETY: `armed_entry` runs `armed_main`, which makes only async-signal-safe calls (no
    // allocation, no lock), writes nothing of ours but its own stack, errno and the room
    // kept for it (`Prepared::armed`, which the init does not use), fits in `COMMAND_STACK`
    // and ends in `execve` or `exit`; we are suspended until then, so `stack` and `start`
    // outlive its use of them.
    let spawned = unsafe { sys::spawn_vfork(&mut stack, armed_entry, &start) };
    p.command_stack = stack;
    if let Some(fd) = ruleset {
        // SAFETY: the command child had its own copy; a single-command sandbox's init does
        // not use it again.
        unsafe { sys::close(fd) };
    }
    spawned.map_err(at(Step::ForkCommand))
}

/// What the command child of a pre-armed sandbox needs: the init's [`Prepared`] (the
/// init is suspended while the child uses it) and its Landlock ruleset.
struct ArmedStart {
    prepared: *mut Prepared,
    ruleset: Option<RawFd>,
}

fn armed_entry(start: &ArmedStart) -> ! {
    // SAFETY: `prepared` is the init's, which is suspended until this child executes or
    // exits (`start_armed`): nothing else uses it meanwhile.
    let p = unsafe { &mut *start.prepared };
    armed_main(p, start.ruleset)
}

/// The command child of a pre-armed sandbox: confined as a sequence's later command is
/// ([`preforked_main`]), it waits for the go, which brings its stdio and its command (argv,
/// environment, exec candidates: see `armed`), and executes it.
fn armed_main(p: &mut Prepared, ruleset: Option<RawFd>) -> ! {
    confine_before_go(p, ruleset);
    let payload = match await_go(p.report_fd) {
        Ok(Some(fd)) => fd,
        // A go without a command.
        Ok(None) => command_fail(p, Step::Exec, Errno(libc::EPROTO), 0),
        // The supervisor gave up on the sandbox.
        Err(Errno(libc::ECANCELED)) => sys::exit(125),
        Err(e) => command_fail(p, Step::RedirectStdio, e, 0),
    };
    let Some(room) = p.armed.as_mut() else {
        command_fail(p, Step::Exec, Errno(libc::EPROTO), 0)
    };
    let read = sys::read_sealed(payload, room.bytes.as_mut_slice());
    // SAFETY: the payload was received by `await_go` for us alone and is read above.
    unsafe { sys::close(payload) };
    let len = match read {
        Ok(len) => len,
        Err(e) => command_fail(p, Step::Exec, e, 0),
    };
    let ArmedRoom { pointers, bytes } = room;
    let Some(at) = crate::armed::decode(&bytes.as_mut_slice()[..len], pointers) else {
        command_fail(p, Step::Exec, Errno(libc::EPROTO), 0)
    };
    let mut error = Errno(libc::ENOENT);
    for i in 0..at.candidates {
        // SAFETY: `decode` pointed every slot used here into `bytes`, which stays as it is
        // until the exec: the candidates are C strings, argv and the environment
        // NULL-terminated arrays of them.
        let e = unsafe {
            sys::execve_raw(
                pointers[i],
                pointers[at.argv..].as_ptr(),
                pointers[at.env..].as_ptr(),
            )
        };
        if e.0 != libc::ENOENT && e.0 != libc::ENOTDIR {
            error = e;
            if e.0 != libc::EACCES {
                command_fail(p, Step::Exec, e, i);
            }
        }
    }
    command_fail(p, Step::Exec, error, 0)
}

/// [`Op::OwnBootId`]: a random version 4 UUID, formatted as the kernel's `boot_id` (on the
/// stack: nothing is allocated after the clone), bound over `path` from `scratch`.
fn own_boot_id(scratch: &std::ffi::CStr, path: &std::ffi::CStr) -> Result<(), Errno> {
    match sys::open(path, libc::O_PATH, 0) {
        Err(Errno(libc::ENOENT)) => return Ok(()),
        Err(e) => return Err(e),
        // SAFETY: `fd` was opened just above, only to see whether `path` exists.
        Ok(fd) => unsafe { sys::close(fd) },
    }
    let mut raw = [0u8; 16];
    sys::random_bytes(&mut raw)?;
    raw[6] = (raw[6] & 0x0f) | 0x40;
    raw[8] = (raw[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 37];
    let mut at = 0;
    for (i, byte) in raw.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text[at] = b'-';
            at += 1;
        }
        text[at] = HEX[usize::from(byte >> 4)];
        text[at + 1] = HEX[usize::from(byte & 0x0f)];
        at += 2;
    }
    text[at] = b'\n';
    sys::write_file(scratch, &text, 0o444)?;
    let covered = sys::open_tree_clone(scratch).and_then(|fd| {
        let moved = sys::move_mount_to(fd, path);
        // SAFETY: `fd` was opened above and is not used after.
        unsafe { sys::close(fd) };
        moved
    });
    // The bind keeps the file; its name goes either way.
    let removed = sys::unlink(scratch);
    covered.and(removed)
}

fn apply(op: &Op, source_fds: &mut [RawFd], report_fd: RawFd) -> Result<(), Errno> {
    match op {
        Op::Mkdir { path, mode } => {
            sys::mkdir_exist_ok(path, *mode)?;
            // Best effort: an existing directory (inside a read-only bind) keeps its mode.
            let _ = sys::chmod(path, *mode);
            Ok(())
        }
        Op::Touch { path } => {
            let fd = sys::open(path, libc::O_WRONLY | libc::O_CREAT, 0o644)?;
            // SAFETY: `fd` was opened just above and is not used after.
            unsafe { sys::close(fd) };
            Ok(())
        }
        Op::Symlink { target, path } => sys::symlink_exist_ok(target, path),
        Op::WriteFile { path, data } => sys::write_file(path, data, 0o644),
        Op::Whiteout { path } => sys::mknod_whiteout(path),
        Op::Attach { source, target } => {
            let Some(slot) = source_fds.get_mut(*source) else {
                return Err(Errno(libc::EBADF));
            };
            // Each captured source is attached once; the slot no longer names a descriptor.
            let fd = std::mem::replace(slot, -1);
            let result = sys::move_mount_to(fd, target);
            // SAFETY: `fd` was taken out of its slot above (which now says -1), so nothing else
            // uses or closes it.
            unsafe { sys::close(fd) };
            result
        }
        Op::Mount {
            source,
            target,
            fstype,
            flags,
            data,
        } => sys::mount(Some(source), target, Some(fstype), *flags, Some(data)),
        Op::HandOver { path, overlay } => {
            let fd = sys::open_tree_clone(path)?;
            let record = Record::Upper {
                overlay: *overlay as u32,
            };
            // SAFETY: `report_fd` is the init's end of the report socket, open until the init
            // exits; `fd` was opened just above.
            let result = unsafe { sys::send_with_fd(report_fd, &record.encode(), fd) };
            // SAFETY: `fd` was opened above and is not used after (the supervisor has its own
            // copy).
            unsafe { sys::close(fd) };
            result
        }
        Op::CoverReadonly { path, optional } => match sys::open_tree_clone(path) {
            Err(Errno(libc::ENOENT)) if *optional => Ok(()),
            Err(e) => Err(e),
            Ok(fd) => {
                let result =
                    sys::mount_set_readonly(fd, true).and_then(|()| sys::move_mount_to(fd, path));
                // SAFETY: `fd` was opened above and is not used after.
                unsafe { sys::close(fd) };
                result
            }
        },
        Op::OwnBootId { scratch, path } => own_boot_id(scratch, path),
        Op::CoverWith { with, path } => {
            match sys::open(path, libc::O_PATH, 0) {
                Err(Errno(libc::ENOENT)) => return Ok(()),
                Err(e) => return Err(e),
                // SAFETY: `fd` was opened just above, only to see whether `path` exists.
                Ok(fd) => unsafe { sys::close(fd) },
            }
            let fd = sys::open_tree_clone(with)?;
            let result = sys::move_mount_to(fd, path);
            // SAFETY: `fd` was opened above and is not used after.
            unsafe { sys::close(fd) };
            result
        }
        Op::SetReadonly { path } => set_readonly(path, false),
        Op::Umount { path } => sys::umount_detach(path),
        Op::Renew {
            target,
            mode,
            mount,
        } => {
            if sys::is_empty_dir_with_mode(target, *mode)? {
                return Ok(());
            }
            sys::umount_detach(target)?;
            apply(mount, source_fds, report_fd)
        }
        Op::Rmdir { path } => sys::rmdir(path),
        // Carried out by `apply_ops`, which has the values; no later step has one.
        Op::LimitUserQuotas { .. } => Err(Errno(libc::EINVAL)),
        Op::Gate => match await_go(report_fd)? {
            None => Ok(()),
            Some(fd) => {
                // A command only a pre-armed sandbox takes: refused.
                // SAFETY: received by `await_go` for us alone, not used after.
                unsafe { sys::close(fd) };
                Err(Errno(libc::EPROTO))
            }
        },
        Op::Capture { path, source } => {
            let Some(slot) = source_fds.get_mut(*source) else {
                return Err(Errno(libc::EBADF));
            };
            *slot = sys::open_tree_clone(path)?;
            Ok(())
        }
        Op::ChangeDir { path } => sys::chdir(path),
        // Carried out by `setup` itself, which stops there.
        Op::EnterRoot => Ok(()),
    }
}

/// Blocks until the supervisor says go on the report socket. The go ([`Go`]) carries the
/// command's new stdio: the descriptors sent along replace 0, 1, 2 where it says so; and,
/// for a pre-armed sandbox, the command, whose descriptor is returned. The supervisor
/// closing its end (it gave up on this sandbox) cancels.
fn await_go(report_fd: RawFd) -> Result<Option<RawFd>, Errno> {
    let mut buf = [0u8; RECORD_LEN];
    let mut fds = [-1; sys::MAX_FDS];
    let (len, count) = loop {
        // SAFETY: `report_fd` is the init's end of the report socket, open until the init
        // exits.
        match unsafe { sys::recv_with_fds(report_fd, &mut buf, &mut fds) } {
            Err(Errno(libc::EINTR)) => continue,
            other => break other?,
        }
    };
    if len == 0 {
        return Err(Errno(libc::ECANCELED));
    }
    let go = Go::decode(&buf).filter(|_| len == RECORD_LEN);
    let mut result = go.map(drop).ok_or(Errno(libc::EPROTO));
    let mut received = fds[..count].iter();
    let replaced = go.map_or([false; 3], |go| go.stdio);
    for (target, _) in (0..).zip(replaced).filter(|(_, replace)| *replace) {
        if let Some(&fd) = received.next() {
            // SAFETY: 0, 1 and 2 are the init's (see Descriptors in the module doc); the go
            // replaces them on purpose.
            result = result.and(unsafe { sys::dup2(fd, target) });
        }
    }
    // The command's descriptor is the one after the stdio's, if the go says it is there.
    let command = go
        .filter(|go| go.command)
        .and_then(|_| received.next().copied());
    for &fd in fds[..count].iter().filter(|&&fd| Some(fd) != command) {
        // SAFETY: the descriptors received above are ours alone (recvmsg made them), copied
        // where they go, and not used after (the command's is kept for the caller).
        unsafe { sys::close(fd) };
    }
    match (result, command) {
        (Ok(()), command) => Ok(command),
        (Err(e), command) => {
            if let Some(fd) = command {
                // SAFETY: received above, not handed out on this error.
                unsafe { sys::close(fd) };
            }
            Err(e)
        }
    }
}

fn set_readonly(path: &CStr, recursive: bool) -> Result<(), Errno> {
    let fd = sys::open(path, libc::O_PATH | libc::O_DIRECTORY, 0)?;
    let result = sys::mount_set_readonly(fd, recursive);
    // SAFETY: `fd` was opened above and is not used after.
    unsafe { sys::close(fd) };
    result
}

/// After `pivot_root(".", ".")`, which stacks the old root on the new one: detaching it
/// leaves only the new root (pivot_root(2), "NOTES"). No directory for the old root is
/// needed.
fn detach_old_root() -> Result<(), Fail> {
    sys::umount_detach(c".").map_err(at(Step::PivotRoot))?;
    sys::chdir(c"/").map_err(at(Step::PivotRoot))
}

fn landlock_ruleset(p: &Prepared, rules: &[crate::plan::Rule]) -> Result<Option<RawFd>, Fail> {
    let Some((abi, attr)) = &p.landlock else {
        return Ok(None);
    };
    let ruleset = sys::landlock_create_ruleset(Some(attr), 0).map_err(at(Step::LandlockRuleset))?;
    for (i, rule) in rules.iter().enumerate() {
        let fd = sys::open(&rule.path, libc::O_PATH, 0).map_err(at_index(Step::LandlockRule, i))?;
        let result = sys::landlock_add_path_rule(ruleset, fd, rule.access.bits(*abi));
        // SAFETY: `fd` was opened above and is not used after.
        unsafe { sys::close(fd) };
        result.map_err(at_index(Step::LandlockRule, i))?;
    }
    Ok(Some(ruleset))
}

fn harden_init(p: &Prepared, ruleset: Option<RawFd>) -> Result<OwnedFd, Fail> {
    // Dumpability belongs to the memory map: sharing the caller's, the init would make the
    // caller non-dumpable. The lean init makes itself so first thing after its exec.
    if !p.shares_caller_memory {
        sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(at(Step::SetDumpable))?;
    }
    // The resolver's sockets stay until the command hands them to the supervisor.
    let (udp, tcp) = p.helper.dns_fds();
    close_other_fds(&p.keep_fds, ruleset, &p.source_fds, &[udp, tcp]);
    let mut signals = [0; FORWARDED.len() + 1];
    signals[..FORWARDED.len()].copy_from_slice(&FORWARDED);
    signals[FORWARDED.len()] = libc::SIGCHLD;
    let set = SigSet::of(&signals);
    sys::sigprocmask(libc::SIG_SETMASK, &set).map_err(at(Step::BlockSignals))?;
    sys::signalfd(&set).map_err(at(Step::BlockSignals))
}

/// Closes every descriptor but `keep` (sorted), the Landlock ruleset and the captured
/// sources still to be attached (by the later commands of a sequence) and `own` (lockbox's
/// resolver sockets), so nothing of the caller's leaks into the sandbox.
pub(crate) fn close_other_fds(
    keep: &[RawFd],
    ruleset: Option<RawFd>,
    sources: &[RawFd],
    own: &[RawFd],
) {
    let kept = || {
        keep.iter()
            .chain(ruleset.iter())
            .chain(sources.iter())
            .chain(own.iter())
            .copied()
    };
    for (first, last) in gaps(kept) {
        // SAFETY: every descriptor not kept is the init's (see Descriptors in the module
        // doc), and the init uses no descriptor but those its callers list as kept.
        unsafe { sys::close_range(first, last) };
    }
}

/// The ranges of descriptors that are not among `kept()` (any order, repeats and negatives
/// allowed), in order, the last up to `u32::MAX`; without allocating. It visits the kept
/// descriptors, not every number up to the highest: under a busy server the init holds its
/// caller's numbers, about 12,600 with 10,000 sandboxes live.
fn gaps<I: Iterator<Item = RawFd>>(kept: impl Fn() -> I) -> impl Iterator<Item = (u32, u32)> {
    let mut next = Some(0u32);
    std::iter::from_fn(move || loop {
        let from = next?;
        let fd = kept()
            .filter_map(|fd| u32::try_from(fd).ok())
            .filter(|&fd| fd >= from)
            .min();
        next = fd.and_then(|fd| fd.checked_add(1));
        match fd {
            None => return Some((from, u32::MAX)),
            Some(fd) if fd > from => return Some((from, fd - 1)),
            Some(_) => {}
        }
    })
}

/// What the command child needs.
struct CommandStart<'a> {
    prepared: &'a Prepared,
    command: &'a Command,
    ruleset: Option<RawFd>,
}

fn command_entry(start: &CommandStart<'_>) -> ! {
    command_main(start.prepared, start.command, start.ruleset)
}

/// Starts command number `step` (or takes the one [`start_next`] started) and forwards
/// signals to it until it exits ([`supervise`]), and returns its status.
fn run_command(p: &mut Prepared, step: usize, signal_fd: BorrowedFd<'_>, start: Start) -> Record {
    let command = match start {
        Start::Started(pid) => pid,
        Start::Spawn(ruleset) => {
            // The command child shares the init's memory until it execs; the signalfd it
            // inherits is close-on-exec.
            let mut stack = std::mem::take(&mut p.command_stack);
            let spawned = match p.commands.get(step) {
                Some(command) => {
                    let start = CommandStart {
                        prepared: p,
                        command,
                        ruleset,
                    };
                    // SAFETY: `command_entry` runs `command_main`, which makes only
                    // async-signal-safe calls, writes nothing of ours but its own stack (and
                    // errno), fits in `COMMAND_STACK` and ends in `execve` or `exit`; we are
                    // suspended until then.
                    unsafe { sys::spawn_vfork(&mut stack, command_entry, &start) }
                }
                None => Err(Errno(libc::ENOENT)),
            };
            p.command_stack = stack;
            // A sequence's later commands are confined by the same ruleset.
            if let (Some(fd), true) = (ruleset, p.plan.steps.is_empty()) {
                // SAFETY: the command child has its own copy of the ruleset; in a
                // single-command sandbox the init does not use it again.
                unsafe { sys::close(fd) };
            }
            match spawned {
                Ok(pid) => pid,
                Err(errno) => fail_exit(
                    p,
                    Fail {
                        step: Step::ForkCommand,
                        errno,
                        index: 0,
                    },
                ),
            }
        }
    };
    if step == 0 {
        for &fd in &p.pass_fds {
            // SAFETY: the command has its own copies of the passed descriptors; the init does
            // not use them.
            unsafe { sys::close(fd) };
        }
    }
    // Each command of a sequence hands its filter's listener over (renames only: a
    // network list serves one command).
    if step == p.plan.steps.len() {
        if let Some((_, fd)) = &p.net {
            // SAFETY: the (last) command child has its own copy; the init does not use this
            // one.
            unsafe { sys::close(*fd) };
        }
    }
    if step == 0 {
        // The resolver's sockets are the supervisor's (the command handed them over).
        let (udp, tcp) = p.helper.dns_fds();
        for fd in [udp, tcp] {
            if fd >= 0 {
                // SAFETY: the command child handed its own copies over; the init does not use
                // these.
                unsafe { sys::close(fd) };
            }
        }
    }
    // The next command of a sequence gets an IPC namespace of its own (no System V object
    // or POSIX message queue of this one's): entered now, while this command runs and the
    // init has nothing else to do; the command keeps the one it was started in.
    if step < p.plan.steps.len() {
        if let Err(errno) = sys::unshare(libc::CLONE_NEWIPC) {
            fail_exit(
                p,
                Fail {
                    step: Step::UnshareIpc,
                    errno,
                    index: 0,
                },
            )
        }
    }
    // A single-command sandbox's init has nothing of its caller's left to use: it becomes a
    // small process of its own (see `lean_init`); if the exec fails, it goes on as it is.
    if step == 0 && p.plan.steps.is_empty() {
        if let Some(lean) = p.lean.as_mut() {
            let errno =
                crate::lean_init::exec(lean, command, signal_fd.as_raw_fd(), p.report_fd, p.parent);
            // Sharing the caller's memory (its thread suspended until we exec), the init
            // cannot go on as it is: it ends the sandbox (the command with it) instead.
            if p.shares_caller_memory {
                fail_exit(
                    p,
                    Fail {
                        step: Step::LeanExec,
                        errno,
                        index: 0,
                    },
                )
            }
        }
    }
    supervise(command, signal_fd)
}

/// Forwards signals to `command` until it exits; then kills and reaps every process left
/// (daemons included) and returns its status.
pub(crate) fn supervise(command: libc::pid_t, signal_fd: BorrowedFd<'_>) -> Record {
    loop {
        let mut fds = [libc::pollfd {
            fd: signal_fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let _ = sys::poll(&mut fds, -1);
        while let Ok(Some((sig, code, sender))) = sys::read_signalfd(signal_fd) {
            if sig == libc::SIGCHLD {
                continue;
            }
            forward(command, sig, code, sender);
        }
        while let Ok(Some((pid, status))) = sys::reap_any() {
            if pid == command {
                if children_left() {
                    let _ = sys::kill(-1, libc::SIGKILL);
                    // Until ECHILD: nothing is left.
                    while let Ok(_) | Err(Errno(libc::EINTR)) = sys::wait_any() {}
                }
                return if libc::WIFSIGNALED(status) {
                    Record::Signaled(libc::WTERMSIG(status))
                } else {
                    Record::Exited(libc::WEXITSTATUS(status))
                };
            }
        }
    }
}

/// Whether a process of the sandbox is left, reaping those that have exited. Every one
/// descends from the init (orphans are reparented to it), so with no child left none is,
/// and `kill(-1)` — which walks every process of the host — can be skipped.
fn children_left() -> bool {
    loop {
        match sys::reap_any() {
            Ok(Some(_)) | Err(Errno(libc::EINTR)) => continue,
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// Ends the sandbox once its (last) command has ended and nothing of it is left: report
/// usage and the command's status, exit. Reporting only after the last process is reaped
/// lets the supervisor return without waiting for the kernel to tear the namespaces down,
/// while keeping the promise that nothing of the sandbox still runs.
fn finish(p: &Prepared, status: Record) -> ! {
    // Our copies of the sandbox's stdio go before the status: a supervisor reading the
    // command's output through pipes then sees their end no later than the status, rather
    // than when the kernel gets round to closing an exiting namespace init's files.
    for fd in (0..3).filter(|&fd| fd != p.report_fd) {
        // SAFETY: 0, 1 and 2 are the init's copies of the sandbox's stdio (see Descriptors in
        // the module doc), not used after; `report_fd`, which is, is skipped.
        unsafe { sys::close(fd) };
    }
    report_end(p.report_fd, status, p.linger)
}

/// Reports the usage of the sandbox's processes and the command's `status` on `report_fd`,
/// and exits (see [`finish`]) — with `linger`, once the supervisor has closed its end of
/// `report_fd` ([`Prepared::linger`]).
pub(crate) fn report_end(report_fd: RawFd, status: Record, linger: bool) -> ! {
    let (cpu_us, max_rss_kb) = sys::children_usage();
    report(report_fd, Record::Usage { cpu_us, max_rss_kb });
    report(report_fd, status);
    if linger {
        let mut end = [libc::pollfd {
            fd: report_fd,
            events: libc::POLLRDHUP,
            revents: 0,
        }];
        // Any other error: exit now, as without `linger`.
        while let Err(Errno(libc::EINTR)) = sys::poll(&mut end, -1) {}
    }
    sys::exit(0)
}

/// Forwards a signal the init received. A signal from outside the sandbox (sender pid 0 as
/// seen from inside) that is SIGTERM stops the whole sandbox: every process gets it, so a
/// daemon that left the command's process group is asked to stop too. Other signals go to
/// the command — unless the terminal sent them (`SI_KERNEL`): the terminal already signals
/// the command's whole foreground process group, and forwarding would deliver twice.
fn forward(command: libc::pid_t, sig: libc::c_int, code: i32, sender: u32) {
    if code == libc::SI_KERNEL {
        return;
    }
    if sig == libc::SIGTERM && sender == 0 {
        let _ = sys::kill(-1, libc::SIGTERM);
    } else {
        let _ = sys::kill(command, sig);
    }
}

/// Installs the network filter and lets the supervisor take its listener: we announce the
/// listener's number in a [`NetHandover`] with `write` (the filter intercepts `sendmsg`, so
/// no `SCM_RIGHTS`), the supervisor copies it with `pidfd_getfd` (our pid arrives as
/// `SCM_CREDENTIALS`) and answers [`NetTaken`]. Until then we are made dumpable, so an unprivileged supervisor may
/// copy it; the shared memory is the suspended init's, which is made non-dumpable again.
fn hand_over_net_filter(
    filter: &[seccompiler::sock_filter],
    fd: RawFd,
    (dns_udp, dns_tcp): (RawFd, RawFd),
) -> Result<(), (Step, Errno)> {
    let listener = crate::sysnet::seccomp_listener(filter).map_err(|e| (Step::NetFilter, e))?;
    let handover = NetHandover {
        listener,
        dns_udp,
        dns_tcp,
    };
    // Dumpable while the supervisor takes the listener (with pidfd_getfd), then as before:
    // not dumpable as a forked init's copy, and as the caller is when this child shares
    // the caller's memory (dumpability belongs to the memory map).
    let was = sys::prctl(libc::PR_GET_DUMPABLE, 0).unwrap_or(0);
    let handed = sys::prctl(libc::PR_SET_DUMPABLE, 1)
        .and_then(|_| sys::write_all(fd, &handover.encode()))
        .and_then(|()| {
            let mut taken = [0u8; RECORD_LEN];
            match sys::read(fd, &mut taken)? {
                RECORD_LEN if NetTaken::decode(&taken).is_some() => Ok(()),
                _ => Err(Errno(libc::ECONNRESET)),
            }
        });
    let _ = sys::prctl(libc::PR_SET_DUMPABLE, was as libc::c_ulong);
    // SAFETY: `listener` was made above; the supervisor has taken its own copy (or failed to)
    // and this process does not use it again.
    unsafe { sys::close(listener) };
    // SAFETY: `fd` is this command child's copy of the handover socket, not used after.
    unsafe { sys::close(fd) };
    for dns in [dns_udp, dns_tcp] {
        if dns >= 0 {
            // SAFETY: this command child's copies of the resolver's sockets, handed over above
            // and not used after.
            unsafe { sys::close(dns) };
        }
    }
    handed.map_err(|e| (Step::NetHandover, e))
}

/// Reports a failure of the command child's `step` and exits (127/126 for exec failures,
/// 125 for the rest).
fn command_fail(p: &Prepared, step: Step, errno: Errno, index: usize) -> ! {
    report(
        p.report_fd,
        Record::Failed {
            step,
            errno: errno.0,
            index: index as u32,
        },
    );
    sys::exit(if step == Step::Exec {
        if errno.0 == libc::ENOENT {
            127
        } else {
            126
        }
    } else {
        125
    })
}

/// The start of every command child: default signals, rlimits, passed descriptors.
fn command_basics(p: &Prepared) {
    sys::reset_runtime_signals();
    if let Err(e) = sys::sigprocmask(libc::SIG_SETMASK, &SigSet::empty()) {
        command_fail(p, Step::BlockSignals, e, 0);
    }
    for (i, &(resource, soft, hard)) in p.rlimits.iter().enumerate() {
        if let Err(e) = sys::set_rlimit(resource, soft, hard) {
            command_fail(p, Step::SetRlimit, e, i);
        }
    }
    for (i, &fd) in p.pass_fds.iter().enumerate() {
        if let Err(e) = sys::clear_cloexec(fd) {
            command_fail(p, Step::PassFd, e, i);
        }
    }
}

/// A session of the command's own ([`crate::Spawn::own_session`]), whose controlling
/// terminal is the first terminal on its stdio — unless that one is already another
/// session's (`EPERM`): it then stays a plain descriptor, and the session has none.
fn start_session(p: &Prepared) {
    if let Err(e) = sys::setsid() {
        command_fail(p, Step::NewSession, e, 0);
    }
    if let Some(fd) = (0..3).find(|&fd| sys::is_terminal(fd)) {
        match sys::set_controlling_terminal(fd) {
            Ok(()) | Err(Errno(libc::EPERM)) => {}
            Err(e) => command_fail(p, Step::NewSession, e, fd as usize),
        }
    }
}

/// `no_new_privs`, then every capability dropped.
fn drop_privileges(p: &Prepared) {
    if let Err(e) = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1) {
        command_fail(p, Step::NoNewPrivs, e, 0);
    }
    if let Err(e) = sys::drop_all_capabilities(p.last_cap) {
        command_fail(p, Step::DropCapabilities, e, 0);
    }
}

fn command_main(p: &Prepared, command: &Command, ruleset: Option<RawFd>) -> ! {
    command_basics(p);
    if p.own_session {
        start_session(p);
    }
    if let Err(e) = sys::chdir(&p.plan.cwd) {
        command_fail(p, Step::Chdir, e, 0);
    }
    drop_privileges(p);
    if let Some(fd) = ruleset {
        if let Err(e) = sys::landlock_restrict_self(fd) {
            command_fail(p, Step::LandlockRestrict, e, 0);
        }
        // SAFETY: this command child's copy of the ruleset, not used after
        // `landlock_restrict_self`.
        unsafe { sys::close(fd) };
    }
    if let Some((filter, fd)) = &p.net {
        if let Err((step, e)) = hand_over_net_filter(filter, *fd, p.helper.dns_fds()) {
            command_fail(p, step, e, 0);
        }
    }
    if let Err(e) = sys::seccomp_set_filter(&p.seccomp) {
        command_fail(p, Step::SeccompFilter, e, 0);
    }
    execute(p, command)
}

/// Command `step` (>= 1) of a sequence, forked by [`start_next`]: confines itself, waits for
/// the supervisor's go with its stdio, executes. (Sequences have no network list and no
/// passed descriptors; the filter they may hand over is the rename supervisor's.)
fn preforked_main(p: &Prepared, step: usize, ruleset: Option<RawFd>) -> ! {
    confine_before_go(p, ruleset);
    match await_go(p.report_fd) {
        Ok(None) => {}
        Ok(Some(fd)) => {
            // A command only a pre-armed sandbox takes: refused (its descriptor goes).
            // SAFETY: received by `await_go` for us alone, not used after.
            unsafe { sys::close(fd) };
            command_fail(p, Step::Exec, Errno(libc::EPROTO), 0)
        }
        // The supervisor gave up on the sandbox.
        Err(Errno(libc::ECANCELED)) => sys::exit(125),
        Err(e) => command_fail(p, Step::RedirectStdio, e, 0),
    }
    match p.commands.get(step) {
        Some(command) => execute(p, command),
        None => command_fail(p, Step::Exec, Errno(libc::ENOENT), 0),
    }
}

/// What a command forked ahead of its go does first (a sequence's later command, a
/// pre-armed sandbox's): confines itself fully and enters its directory.
fn confine_before_go(p: &Prepared, ruleset: Option<RawFd>) {
    command_basics(p);
    drop_privileges(p);
    if let Some((filter, fd)) = &p.net {
        if let Err((step, e)) = hand_over_net_filter(filter, *fd, p.helper.dns_fds()) {
            command_fail(p, step, e, 0);
        }
    }
    if let Err(e) = sys::seccomp_set_filter(&p.seccomp) {
        command_fail(p, Step::SeccompFilter, e, 0);
    }
    if let Some(fd) = ruleset {
        if let Err(e) = sys::landlock_restrict_self(fd) {
            command_fail(p, Step::LandlockRestrict, e, 0);
        }
        // SAFETY: this command child's copy of the ruleset, not used after
        // `landlock_restrict_self`.
        unsafe { sys::close(fd) };
    }
    if let Err(e) = sys::chdir(&p.plan.cwd) {
        command_fail(p, Step::Chdir, e, 0);
    }
}

/// Like execvp: tries each PATH candidate, remembers the most telling error.
fn execute(p: &Prepared, command: &Command) -> ! {
    let mut error = Errno(libc::ENOENT);
    for (i, candidate) in command.exec_candidates.iter().enumerate() {
        let e = sys::execve(candidate, &command.argv, &p.envp);
        if e.0 != libc::ENOENT && e.0 != libc::ENOTDIR {
            error = e;
            if e.0 != libc::EACCES {
                command_fail(p, Step::Exec, e, i);
            }
        }
    }
    command_fail(p, Step::Exec, error, 0)
}

#[cfg(test)]
mod tests {
    use super::gaps;
    use proptest::prelude::*;

    #[test]
    fn gaps_close_everything_around_the_kept_descriptors() {
        let kept = [12_600, 0, 2, 1, 12_601, -1, 2];
        let ranges: Vec<_> = gaps(|| kept.iter().copied()).collect();
        assert_eq!(
            ranges,
            [(3, 12_599), (12_602, u32::MAX)],
            "stdio and the two high descriptors stay; all else is closed"
        );
        assert_eq!(gaps(|| [].into_iter()).collect::<Vec<_>>(), [(0, u32::MAX)]);
    }

    proptest! {
        #[test]
        fn gaps_cover_exactly_what_is_not_kept(kept in proptest::collection::vec(-2i32..300, 0..12)) {
            let ranges: Vec<_> = gaps(|| kept.iter().copied()).collect();
            let closed = |fd: u32| ranges.iter().any(|&(a, b)| a <= fd && fd <= b);
            for fd in 0..400u32 {
                let is_kept = kept.contains(&(fd as i32));
                prop_assert_eq!(closed(fd), !is_kept, "descriptor {}", fd);
            }
            prop_assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "in order, apart: {:?}", ranges);
            prop_assert_eq!(ranges.last().map(|r| r.1), Some(u32::MAX));
        }
    }
}
