//! The seccomp filter: a deny list of syscalls an unprivileged sandbox never needs and
//! that widen the kernel's attack surface or escape the other walls.
//!
//! Each entry of [`denied`] says why, and so does each entry of [`REVIEWED_ALLOWED`] (calls a
//! reader would expect denied, and every call since Linux 5.1). Denied calls fail with
//! `EPERM` (so programs see a clear error); `clone3` and `openat2` fail with `ENOSYS`
//! because their arguments live in memory a filter cannot read, and libc then falls back to
//! `clone` and `openat`, whose arguments we can check. The one exception is the runtime's
//! agent ([`Openat2::Agent`]), which resolves paths with `openat2` and stacks
//! [`openat2_enosys`] on every command it starts. On x86_64,
//! x32-ABI and 32-bit entry points kill the process: a deny list keyed on 64-bit numbers
//! would not see them.
//!
//! The filter is built with `seccompiler` before the clone and installed last, right before
//! `execve`, so it need not allow any setup step.

use crate::error::SetupError;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;
use syscalls::Sysno;

/// A denied syscall and why.
#[derive(Debug, Clone, Copy)]
pub struct Denied {
    /// Syscall name.
    pub name: &'static str,
    /// Syscall number on this architecture.
    pub nr: i64,
    /// Only when the arguments match (documented in `why`); `None` means always.
    pub when: Option<When>,
    /// Why it is denied.
    pub why: &'static str,
}

/// Argument conditions for a conditional denial.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// Flags argument `arg` has `CLONE_NEWUSER` set.
    NewUserNs {
        /// Argument index.
        arg: u8,
    },
    /// ioctl request (argument 1, compared as the kernel's 32-bit int) equals this.
    IoctlRequest(u64),
    /// personality(2) with anything but the harmless values.
    PersonalityChange,
    /// Mode argument `arg` has the setuid or setgid bit.
    SetIdMode {
        /// Argument index.
        arg: u8,
    },
}

macro_rules! deny {
    ($name:ident, $why:expr) => {
        Denied {
            name: stringify!($name),
            nr: Sysno::$name.id() as i64,
            when: None,
            why: $why,
        }
    };
    ($name:ident if $when:expr, $why:expr) => {
        Denied {
            name: stringify!($name),
            nr: Sysno::$name.id() as i64,
            when: Some($when),
            why: $why,
        }
    };
}

const SETID_WHY: &str = "a setuid or setgid file written into a writable grant runs with the sandbox caller's identity (root's, for a root caller) when anyone on the host executes it";

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

/// Every denied syscall, with the reason. `docs/security.md` is generated from the same
/// reasons.
pub fn denied() -> Vec<Denied> {
    #[allow(unused_mut)]
    let mut list = vec![
        deny!(
            mount,
            "changes the mount tree after setup (the root is fixed once built)"
        ),
        deny!(umount2, "could uncover what lockbox's mounts hide"),
        deny!(pivot_root, "changes the root after setup"),
        deny!(
            chroot,
            "changes the root; a classic step in escapes from nested roots"
        ),
        deny!(open_tree, "new mount API: same power as mount"),
        deny!(move_mount, "new mount API: same power as mount"),
        deny!(fsopen, "new mount API: creates filesystems"),
        deny!(fsconfig, "new mount API: configures filesystems"),
        deny!(fsmount, "new mount API: same power as mount"),
        deny!(fspick, "new mount API: reconfigures existing mounts"),
        deny!(
            open_tree_attr,
            "new mount API: open_tree with mount attributes (Linux 6.15)"
        ),
        deny!(mount_setattr, "could make read-only mounts writable"),
        deny!(
            setns,
            "joins other namespaces through inherited or /proc descriptors"
        ),
        deny!(unshare if When::NewUserNs { arg: 0 }, "a new user namespace regains every capability and re-exposes kernel attack surface (most kernel privilege escalations start here)"),
        deny!(clone if When::NewUserNs { arg: 0 }, "same as unshare(CLONE_NEWUSER)"),
        deny!(kexec_load, "replaces the running kernel"),
        deny!(kexec_file_load, "replaces the running kernel"),
        deny!(init_module, "loads kernel code"),
        deny!(finit_module, "loads kernel code"),
        deny!(delete_module, "unloads kernel code"),
        deny!(
            bpf,
            "eBPF programs and maps: large kernel attack surface, frequent CVEs"
        ),
        deny!(
            perf_event_open,
            "kernel profiling: side channels and a history of CVEs"
        ),
        deny!(
            keyctl,
            "kernel keyrings are not namespaced: reaches the host user's keys"
        ),
        deny!(add_key, "kernel keyrings are not namespaced"),
        deny!(request_key, "kernel keyrings are not namespaced"),
        deny!(
            userfaultfd,
            "lets an attacker pause the kernel mid-copy: a staple of race exploits"
        ),
        deny!(
            io_uring_setup,
            "io_uring bypasses seccomp for the operations it performs and has a long CVE record"
        ),
        deny!(io_uring_enter, "io_uring (see io_uring_setup)"),
        deny!(io_uring_register, "io_uring (see io_uring_setup)"),
        deny!(
            open_by_handle_at,
            "opens files by handle, bypassing path-based walls (the 'shocker' container escape)"
        ),
        deny!(
            name_to_handle_at,
            "companion of open_by_handle_at; leaks file handles"
        ),
        deny!(fchmod if When::SetIdMode { arg: 1 }, SETID_WHY),
        deny!(fchmodat if When::SetIdMode { arg: 2 }, SETID_WHY),
        deny!(fchmodat2 if When::SetIdMode { arg: 2 }, SETID_WHY),
        deny!(openat if When::SetIdMode { arg: 3 }, SETID_WHY),
        deny!(mknodat if When::SetIdMode { arg: 2 }, SETID_WHY),
        deny!(ioctl if When::IoctlRequest(TIOCSTI), "TIOCSTI pushes keystrokes into a shared terminal: commands run outside the sandbox"),
        deny!(ioctl if When::IoctlRequest(TIOCLINUX), "TIOCLINUX can read and inject console contents"),
        deny!(personality if When::PersonalityChange, "personality flags such as READ_IMPLIES_EXEC or ADDR_NO_RANDOMIZE weaken exploit mitigations"),
        deny!(acct, "process accounting is host-wide"),
        deny!(swapon, "host-wide memory configuration"),
        deny!(swapoff, "host-wide memory configuration"),
        deny!(reboot, "host-wide"),
        deny!(settimeofday, "the clock is host-wide"),
        deny!(clock_settime, "the clock is host-wide"),
        deny!(clock_adjtime, "the clock is host-wide"),
        deny!(adjtimex, "the clock is host-wide"),
        deny!(
            syslog,
            "the kernel log leaks host information and addresses"
        ),
        deny!(quotactl, "filesystem quotas are host-wide"),
        deny!(quotactl_fd, "filesystem quotas are host-wide (see quotactl)"),
        deny!(lookup_dcookie, "kernel profiling interface"),
        deny!(fanotify_init, "filesystem-wide monitoring"),
        deny!(
            vhangup,
            "hangs up the terminal, which may be shared with the caller"
        ),
        deny!(mbind, "NUMA policy can degrade the host"),
        deny!(set_mempolicy, "NUMA policy can degrade the host"),
        deny!(
            set_mempolicy_home_node,
            "NUMA policy can degrade the host (see mbind)"
        ),
        deny!(
            migrate_pages,
            "moves other processes' memory between NUMA nodes"
        ),
        deny!(
            move_pages,
            "moves other processes' memory between NUMA nodes"
        ),
        deny!(
            kcmp,
            "compares kernel objects: leaks kernel pointer ordering"
        ),
        deny!(
            process_vm_writev,
            "writes another process's memory; debuggers use ptrace instead"
        ),
        deny!(
            memfd_secret,
            "secret memory disables hibernation host-wide while it exists and hides pages from the kernel; nothing sandboxed needs it"
        ),
        deny!(
            cachestat,
            "page-cache residency of files shared with the host (/usr, /etc) is a side channel on what the host runs"
        ),
        deny!(
            lsm_set_self_attr,
            "changes the process's LSM labels; the /proc/self/attr route is read-only under Landlock"
        ),
    ];
    #[cfg(target_arch = "x86_64")]
    list.extend([
        deny!(chmod if When::SetIdMode { arg: 1 }, SETID_WHY),
        deny!(open if When::SetIdMode { arg: 2 }, SETID_WHY),
        deny!(creat if When::SetIdMode { arg: 1 }, SETID_WHY),
        deny!(mknod if When::SetIdMode { arg: 1 }, SETID_WHY),
        deny!(iopl, "raw I/O port access"),
        deny!(ioperm, "raw I/O port access"),
        deny!(uselib, "obsolete loader interface"),
        deny!(ustat, "obsolete; leaks filesystem information"),
        deny!(sysfs, "obsolete"),
        deny!(_sysctl, "obsolete sysctl interface"),
        deny!(nfsservctl, "obsolete NFS server control"),
        deny!(
            modify_ldt,
            "16-bit segments for DOS/Win16 emulators only; a recurring source of kernel bugs"
        ),
    ]);
    list
}

/// A syscall reviewed and deliberately left allowed, and why.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    /// Syscall name.
    pub name: &'static str,
    /// Syscall number on this architecture.
    pub nr: i64,
    /// Why it stays allowed.
    pub why: &'static str,
}

/// An [`Allowed`] entry for `call`.
const fn allowed(call: Sysno, why: &'static str) -> Allowed {
    Allowed {
        name: call.name(),
        nr: call.id() as i64,
        why,
    }
}

/// Syscalls whose allowance is a decision, not an oversight: every syscall numbered from
/// 424 (Linux 5.1) up is either here or in [`denied`] (a unit test checks the running kernel
/// has no other), plus older calls a reader would expect to see denied.
pub const REVIEWED_ALLOWED: &[Allowed] = &[
    allowed(Sysno::ptrace, "debuggers and strace work inside; Landlock limits tracing to the sandbox's own processes, the init and the runtime's agent are non-dumpable, and host processes are not in the pid namespace"),
    allowed(Sysno::process_vm_readv, "same access check as ptrace (PTRACE_MODE_ATTACH), so the same walls apply"),
    allowed(Sysno::kill, "the pid namespace hides host processes; Landlock's signal scope refuses signals to processes outside the sandbox (including through the shared process group, kill(0, ...))"),
    allowed(Sysno::sethostname, "the sandbox has its own UTS namespace and no capability (EPERM anyway)"),
    allowed(Sysno::pidfd_send_signal, "as kill: pid namespace plus Landlock signal scope"),
    allowed(Sysno::pidfd_open, "only names processes visible in the sandbox's pid namespace"),
    allowed(Sysno::close_range, "closes the caller's own descriptors"),
    allowed(Sysno::pidfd_getfd, "needs PTRACE_MODE_ATTACH on the target: only the sandbox's own, dumpable processes (not the init, not the runtime's agent)"),
    allowed(Sysno::faccessat2, "as faccessat"),
    allowed(Sysno::process_madvise, "needs PTRACE_MODE_READ on the target (the sandbox's own processes) and CAP_SYS_NICE for the destructive advice"),
    allowed(Sysno::epoll_pwait2, "as epoll_pwait"),
    allowed(Sysno::landlock_create_ruleset, "Landlock can only add restrictions"),
    allowed(Sysno::landlock_add_rule, "Landlock can only add restrictions"),
    allowed(Sysno::landlock_restrict_self, "Landlock can only add restrictions"),
    allowed(Sysno::process_mrelease, "only reaps a process that is already being killed and that the caller could signal"),
    allowed(Sysno::futex_waitv, "futexes on the caller's own memory (Wine, games)"),
    allowed(Sysno::fchmodat2, "as fchmodat, including its denial of setuid/setgid modes (see the deny list)"),
    allowed(Sysno::map_shadow_stack, "user shadow stacks are an exploit mitigation for the caller itself"),
    allowed(Sysno::futex_wake, "futexes on the caller's own memory"),
    allowed(Sysno::futex_wait, "futexes on the caller's own memory"),
    allowed(Sysno::futex_requeue, "futexes on the caller's own memory"),
    allowed(Sysno::statmount, "describes mounts of the sandbox's own mount namespace (as /proc/self/mountinfo does); other namespaces need CAP_SYS_ADMIN over them"),
    allowed(Sysno::listmount, "as statmount; newer libmount (findmnt, mount) uses it"),
    allowed(Sysno::lsm_get_self_attr, "reads the caller's own LSM labels"),
    allowed(Sysno::lsm_list_modules, "lists the active LSMs (also in /sys/kernel/security/lsm)"),
    allowed(Sysno::mseal, "seals the caller's own mappings: an exploit mitigation"),
    allowed(Sysno::setxattrat, "as setxattr: read-only mounts refuse it; user.* only without capabilities"),
    allowed(Sysno::getxattrat, "as getxattr"),
    allowed(Sysno::listxattrat, "as listxattr"),
    allowed(Sysno::removexattrat, "as removexattr"),
    allowed(Sysno::file_getattr, "as the FS_IOC_FSGETXATTR ioctl"),
    allowed(Sysno::file_setattr, "as the FS_IOC_FSSETXATTR ioctl: read-only mounts refuse it, immutable flags need CAP_LINUX_IMMUTABLE"),
];

/// `personality(2)` values that stay allowed: PER_LINUX, PER_LINUX32, UNAME26 variants, and
/// the query 0xffffffff (Docker's default profile allows the same).
const PERSONALITY_ALLOWED: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The rules (any of which denies) for a conditional denial; `set_id` says which mode bits
/// are refused (see [`build`]).
fn rules_for(
    when: When,
    set_id: SetIdModes,
) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let conditions = match when {
        When::NewUserNs { arg } => vec![SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
            libc::CLONE_NEWUSER as u64,
        )?],
        When::IoctlRequest(req) => vec![SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            req,
        )?],
        When::SetIdMode { arg } => {
            let bits: &[libc::mode_t] = match set_id {
                SetIdModes::Refused => &[libc::S_ISUID, libc::S_ISGID],
                SetIdModes::GroupOnly => &[libc::S_ISUID],
                SetIdModes::Allowed => &[],
            };
            return bits
                .iter()
                .copied()
                .map(|bit| {
                    SeccompRule::new(vec![SeccompCondition::new(
                        arg,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::MaskedEq(u64::from(bit)),
                        u64::from(bit),
                    )?])
                })
                .collect();
        }
        When::PersonalityChange => PERSONALITY_ALLOWED
            .iter()
            .map(|v| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *v))
            .collect::<Result<_, _>>()?,
    };
    Ok(vec![SeccompRule::new(conditions)?])
}

#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// Whether the filter lets `openat2` through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Openat2 {
    /// `ENOSYS`, like `clone3`: every plain command (`lockbox run`, transaction stages).
    Enosys,
    /// Allowed: only for the runtime's in-sandbox agent, which resolves file paths with
    /// `openat2` (never with `O_CREAT`) and installs [`openat2_enosys`] in every command it
    /// starts before the command's code runs.
    Agent,
}

/// A socket family refused by `socket(2)` with `EAFNOSUPPORT` (the answer of a kernel
/// without it, so programs fall back as they would there), and why.
#[derive(Debug, Clone, Copy)]
pub struct RefusedFamily {
    /// `AF_*` name.
    pub name: &'static str,
    /// Its number.
    pub family: u32,
    /// Refused under `--net host` too.
    pub with_net_host: bool,
    /// Why.
    pub why: &'static str,
}

/// Socket families the filter refuses. Checked from `docs/security.md`.
pub const REFUSED_FAMILIES: [RefusedFamily; 2] = [
    RefusedFamily {
        name: "AF_VSOCK",
        family: libc::AF_VSOCK as u32,
        with_net_host: false,
        why: "vsock is not network-namespaced: on a VM it reaches the hypervisor and its host services, and on a host the VMs' (refused unless --net host, which gives the host's reach anyway)",
    },
    RefusedFamily {
        name: "AF_ALG",
        family: libc::AF_ALG as u32,
        with_net_host: true,
        why: "the kernel crypto API is shared by the whole host and has a record of privilege escalations; nothing sandboxed needs it (OpenSSL and libkcapi users fall back to user-space crypto)",
    },
];

/// Which set-user-id and set-group-id modes the filter lets through (the `chmod` family,
/// and files created with such a mode: `openat`, `mknodat`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetIdModes {
    /// Neither bit: something the sandbox writes is reachable on the host by others, where a
    /// setuid or setgid file of the caller's would run with the caller's ids.
    Refused,
    /// The set-group-id bit (`chmod g+s dir`, `mkdir -m 2775`): a plain sandbox whose every
    /// host write is private to the caller ([`crate::resolve::private_writes`]). A set-gid
    /// file there gives nobody anything, and a commit drops the bit from files (a directory
    /// keeps it, which only sets the group of new entries to the caller's own).
    GroupOnly,
    /// Both bits: an image root whose every host write is private to the caller. Package
    /// managers set them (`dpkg` unpacking `passwd`'s `/usr/bin/passwd`); they do nothing there:
    /// every mount of an image sandbox is `nosuid`, `no_new_privs` is set, a file on the host
    /// (a kept upper layer, a view's branch) lies below a directory only the caller may
    /// enter, and a commit of a view drops both bits (lockbox-cow's `file_mode`).
    Allowed,
}

impl SetIdModes {
    /// The mode bits refused.
    fn refused(self) -> u32 {
        match self {
            SetIdModes::Refused => libc::S_ISUID | libc::S_ISGID,
            SetIdModes::GroupOnly => libc::S_ISUID,
            SetIdModes::Allowed => 0,
        }
    }
}

/// Builds the BPF program. `net_host`: the sandbox shares the host's network (`--net host`).
/// `set_id`: the set-id modes allowed, which the spawner decides from where the sandbox's
/// writes can land on the host ([`SetIdModes`]).
pub fn build(
    openat2: Openat2,
    net_host: bool,
    set_id: SetIdModes,
    ids: Ids,
) -> Result<BpfProgram, SetupError> {
    let mut program = program(openat2, net_host, set_id, true)?;
    if ids == Ids::ImageRoot {
        // Right after the prologue (the accumulator holds the syscall number there): none
        // of these calls is on the deny list.
        let at = prologue(&enosys_calls(openat2)).len();
        program.splice(at..at, ids_no_ops());
    }
    Ok(program)
}

/// Who the sandbox is to its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// The caller's uid and gid, mapped to themselves: a plain sandbox.
    Caller,
    /// uid 0 and gid 0 of the sandbox's user namespace (the caller's ids mapped to 0), in
    /// an image root: [`ID_NO_OPS`] succeed without doing anything.
    ImageRoot,
}

/// Calls an image sandbox makes succeed as no-ops (`SECCOMP_RET_ERRNO` with errno 0 returns
/// 0, as Charliecloud's `--force=seccomp` does): its user namespace maps one uid and one
/// gid, so the ownership a package manager sets (`chown _apt`, `chown 1000:1000`) and the
/// user it switches to (`setuid(100)`) cannot exist; failing would stop the install, while
/// succeeding leaves every file and process root's, which is what the sandbox shows anyway.
/// Nothing is gained: no capability is kept, `no_new_privs` stays set, and the files stay
/// the caller's on the host. (`setfsuid`/`setfsgid` return the previous id, 0, too.)
pub const ID_NO_OPS: &[(&str, i64)] = &[
    #[cfg(target_arch = "x86_64")]
    ("chown", libc::SYS_chown),
    #[cfg(target_arch = "x86_64")]
    ("lchown", libc::SYS_lchown),
    ("fchown", libc::SYS_fchown),
    ("fchownat", libc::SYS_fchownat),
    ("setuid", libc::SYS_setuid),
    ("setgid", libc::SYS_setgid),
    ("setreuid", libc::SYS_setreuid),
    ("setregid", libc::SYS_setregid),
    ("setresuid", libc::SYS_setresuid),
    ("setresgid", libc::SYS_setresgid),
    ("setgroups", libc::SYS_setgroups),
    ("setfsuid", libc::SYS_setfsuid),
    ("setfsgid", libc::SYS_setfsgid),
];

/// The block answering [`ID_NO_OPS`] with 0; falls through otherwise.
fn ids_no_ops() -> BpfProgram {
    use crate::bpf::{ins, JEQ_K, RET_ERRNO, RET_K};
    ID_NO_OPS
        .iter()
        .flat_map(|&(_, nr)| [ins(JEQ_K, 0, 1, nr as u32), ins(RET_K, 0, 0, RET_ERRNO)])
        .collect()
}

/// The calls the prologue answers `ENOSYS`.
fn enosys_calls(openat2: Openat2) -> Vec<i64> {
    ENOSYS_CALLS
        .into_iter()
        .map(|(_, nr)| nr)
        .filter(|&nr| !(openat2 == Openat2::Agent && nr == libc::SYS_openat2))
        .collect()
}

/// [`build`], or (`search` false, for tests, which check that both decide the same) the
/// plain form: seccompiler's chain of every rule.
///
/// The filter: the [`prologue`] (architecture, ENOSYS calls), the socket families, then a
/// binary search over the denied calls ([`crate::bpf::dispatch`]): an unconditional denial
/// returns `EPERM` at once, a conditional one jumps to a short block of its conditions
/// ([`conditional`]), and every other call is allowed (421 instructions with seccompiler's
/// chain for the conditional calls, 300 with the blocks; see docs/benchmarks.md). A short filter is cheap to
/// install (the kernel translates, JIT-compiles and emulates it for each syscall number
/// every time a sandbox command starts) and to run.
fn program(
    openat2: Openat2,
    net_host: bool,
    set_id: SetIdModes,
    search: bool,
) -> Result<BpfProgram, SetupError> {
    // Each denied call, and when it is denied (no condition: always).
    let mut conditions: BTreeMap<i64, Vec<When>> = BTreeMap::new();
    let allowed_modes =
        |d: &Denied| set_id.refused() == 0 && matches!(d.when, Some(When::SetIdMode { .. }));
    for d in denied().into_iter().filter(|d| !allowed_modes(d)) {
        conditions.entry(d.nr).or_default().extend(d.when);
    }
    let mut program = prologue(&enosys_calls(openat2));
    let families: Vec<u32> = REFUSED_FAMILIES
        .iter()
        .filter(|f| f.with_net_host || !net_host)
        .map(|f| f.family)
        .collect();
    program.extend(refuse_families(&families));
    if search {
        use crate::bpf::{Found, RET_ALLOW};
        let mut blocks = Vec::new();
        let sorted: Vec<(u32, Found)> = conditions
            .iter()
            .map(|(&nr, whens)| {
                let found = if whens.is_empty() {
                    Found::Return(DENY)
                } else {
                    blocks.push(conditional(whens, set_id));
                    Found::Block(blocks.len() - 1)
                };
                (nr as u32, found)
            })
            .collect();
        program.extend(crate::bpf::dispatch(&sorted, RET_ALLOW, &blocks));
    } else {
        program.extend(chain(&conditions, set_id)?);
    }
    Ok(program)
}

/// `EPERM`, the answer of a denied call.
const DENY: u32 = crate::bpf::RET_ERRNO | libc::EPERM as u32;

/// The block [`crate::bpf::dispatch`] jumps to for a call denied under conditions: `EPERM`
/// when any of `whens` holds, else allowed. Every condition reads the low 32 bits of one
/// argument, which is what each needs: the kernel reads an ioctl request, a mode and a
/// personality as 32-bit ints, and `CLONE_NEWUSER` is a low bit of the flags.
fn conditional(whens: &[When], set_id: SetIdModes) -> BpfProgram {
    use crate::bpf::{ins, JEQ_K, JSET_K, LD_W_ABS, RET_ALLOW, RET_K};
    // seccomp_data.args[n], low half on a little-endian machine.
    let low = |arg: u8| 16 + 8 * u32::from(arg);
    let deny = || ins(RET_K, 0, 0, DENY);
    let mut block = Vec::new();
    for &when in whens {
        // Each check falls through to the next one when its condition does not hold.
        match when {
            When::NewUserNs { arg } => block.extend([
                ins(LD_W_ABS, 0, 0, low(arg)),
                ins(JSET_K, 0, 1, libc::CLONE_NEWUSER as u32),
                deny(),
            ]),
            When::IoctlRequest(req) => block.extend([
                ins(LD_W_ABS, 0, 0, low(1)),
                ins(JEQ_K, 0, 1, req as u32),
                deny(),
            ]),
            When::SetIdMode { arg } => {
                block.extend([
                    ins(LD_W_ABS, 0, 0, low(arg)),
                    ins(JSET_K, 0, 1, set_id.refused()),
                    deny(),
                ]);
            }
            When::PersonalityChange => {
                block.push(ins(LD_W_ABS, 0, 0, low(0)));
                let n = PERSONALITY_ALLOWED.len();
                for (i, allowed) in PERSONALITY_ALLOWED.iter().enumerate() {
                    // Allowed: jump over the comparisons left and the denial.
                    block.push(ins(JEQ_K, (n - i) as u8, 0, *allowed as u32));
                }
                block.push(deny());
            }
        }
    }
    block.push(ins(RET_K, 0, 0, RET_ALLOW));
    block
}

/// seccompiler's chain of every rule, one after another: the plain form of the filter,
/// which the tests hold the binary search and its blocks to.
fn chain(
    conditions: &BTreeMap<i64, Vec<When>>,
    set_id: SetIdModes,
) -> Result<BpfProgram, SetupError> {
    let err = |e: &dyn std::fmt::Display| SetupError::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (&nr, whens) in conditions {
        let entry = rules.entry(nr).or_default();
        for &when in whens {
            entry.extend(rules_for(when, set_id).map_err(|e| err(&e))?);
        }
    }
    #[cfg(target_arch = "x86_64")]
    let arch = seccompiler::TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    let arch = seccompiler::TargetArch::aarch64;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| err(&e))?;
    filter.try_into().map_err(|e| err(&e))
}

/// `socket(family, ...)` answers `EAFNOSUPPORT` for `families`. Runs after [`prologue`]
/// (the accumulator holds the syscall number, and still does after this block).
fn refuse_families(families: &[u32]) -> BpfProgram {
    use crate::bpf::{ins, JEQ_K, LD_W_ABS, RET_ERRNO, RET_K};
    // seccomp_data.args[0], low half on a little-endian machine: the kernel reads the
    // family as an int.
    const ARG0_LOW: u32 = 16;
    let skip = (2 * families.len() + 2) as u8;
    let mut program = vec![
        ins(JEQ_K, 0, skip, libc::SYS_socket as u32),
        ins(LD_W_ABS, 0, 0, ARG0_LOW),
    ];
    for &family in families {
        program.push(ins(JEQ_K, 0, 1, family));
        program.push(ins(RET_K, 0, 0, RET_ERRNO | libc::EAFNOSUPPORT as u32));
    }
    program.push(ins(LD_W_ABS, 0, 0, 0));
    program
}

/// The filter the agent stacks on each command it starts (in the command's shim, before
/// `execve`): `openat2` answers `ENOSYS`, everything else is left to the base filter. The
/// kernel runs every filter of the chain and the strictest answer wins, so a command of
/// the agent is held exactly like a `lockbox run` command, and so is anything it executes
/// (the agent binary included).
pub fn openat2_enosys() -> BpfProgram {
    let mut program = prologue(&[libc::SYS_openat2]);
    program.push(crate::bpf::ins(
        crate::bpf::RET_K,
        0,
        0,
        crate::bpf::RET_ALLOW,
    ));
    program
}

/// Syscalls answered `ENOSYS` before the deny list: their arguments live in memory a filter
/// cannot read (clone3's flags, openat2's mode), and callers fall back to the older call
/// (clone, openat), whose arguments the list checks.
pub const ENOSYS_CALLS: [(&str, i64); 2] =
    [("clone3", libc::SYS_clone3), ("openat2", libc::SYS_openat2)];

/// Runs before seccompiler's program: kill on a foreign architecture (32-bit entry) or an
/// x32 syscall number, and `ENOSYS` for the calls in `enosys`.
fn prologue(enosys: &[i64]) -> BpfProgram {
    use crate::bpf::{ins, JEQ_K, JGE_K, LD_W_ABS, RET_ERRNO, RET_K, RET_KILL_PROCESS};
    const ARCH_OFFSET: u32 = 4;
    const NR_OFFSET: u32 = 0;
    let mut program = vec![
        ins(LD_W_ABS, 0, 0, ARCH_OFFSET),
        ins(JEQ_K, 1, 0, AUDIT_ARCH),
        ins(RET_K, 0, 0, RET_KILL_PROCESS),
        ins(LD_W_ABS, 0, 0, NR_OFFSET),
        // x32 syscalls are the x86_64 numbers with bit 30 set (__X32_SYSCALL_BIT).
        ins(JGE_K, 0, 1, 0x4000_0000),
        ins(RET_K, 0, 0, RET_KILL_PROCESS),
    ];
    for &nr in enosys {
        program.push(ins(JEQ_K, 0, 1, nr as u32));
        program.push(ins(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32));
    }
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_builds_and_fits_the_kernel_limit() {
        for (openat2, host) in [(Openat2::Enosys, false), (Openat2::Agent, true)] {
            let program = build(openat2, host, SetIdModes::Refused, Ids::Caller).unwrap();
            assert!(program.len() < 4096, "{} instructions", program.len());
            // Every command pays for translating and JIT-compiling it when it starts: the
            // conditional calls are short blocks, not seccompiler's chain (421 then).
            assert!(program.len() <= 320, "{} instructions", program.len());
        }
    }

    /// Runs a classic BPF seccomp program on (nr, args) as the kernel would, for the
    /// instructions lockbox's filters use.
    /// Returns the action and how many instructions ran.
    fn run(program: &[seccompiler::sock_filter], nr: u32, args: [u64; 6]) -> (u32, usize) {
        let word = |offset: u32| -> u32 {
            match offset {
                0 => nr,
                4 => AUDIT_ARCH,
                8 | 12 => 0, // instruction pointer
                o => {
                    let arg = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
            }
        };
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let i = &program[pc];
            pc += 1;
            steps += 1;
            let jump = |cond: bool| if cond { i.jt as usize } else { i.jf as usize };
            match i.code {
                0x20 => a = word(i.k),            // LD W ABS
                0x54 => a &= i.k,                 // ALU AND K
                0x05 => pc += i.k as usize,       // JA
                0x15 => pc += jump(a == i.k),     // JEQ K
                0x25 => pc += jump(a > i.k),      // JGT K
                0x35 => pc += jump(a >= i.k),     // JGE K
                0x45 => pc += jump(a & i.k != 0), // JSET K
                0x06 => return (i.k, steps),      // RET K
                code => panic!("instruction {code:#x} not emulated"),
            }
        }
    }

    #[test]
    fn the_binary_search_decides_every_call_as_the_chain_does() {
        let set_id = u64::from(libc::S_ISUID | libc::S_ISGID);
        let set_gid = u64::from(libc::S_ISGID);
        // The blocks read the low half of an argument, as seccompiler's 32-bit comparisons
        // do: values with bits in the high half only must be decided alike.
        let high = 0xffff_ffff_0000_0000u64;
        let mut arg_sets = vec![
            [0u64; 6],
            [u64::MAX; 6],
            [set_id; 6],
            [set_gid; 6],
            [high; 6],
            [high | set_gid; 6],
            [0x0040000; 6], // ADDR_NO_RANDOMIZE
        ];
        for i in 0..6 {
            let mut args = [0u64; 6];
            args[i] = libc::CLONE_NEWUSER as u64;
            arg_sets.push(args);
        }
        for d in denied() {
            if let Some(When::IoctlRequest(req)) = d.when {
                arg_sets.push([0, req, 0, 0, 0, 0]);
            }
        }
        for v in PERSONALITY_ALLOWED {
            arg_sets.push([v, 0, 0, 0, 0, 0]);
        }
        for f in REFUSED_FAMILIES {
            arg_sets.push([u64::from(f.family), 0, 0, 0, 0, 0]);
        }
        for (openat2, host, set_id) in [
            (Openat2::Enosys, false, SetIdModes::Refused),
            (Openat2::Agent, true, SetIdModes::Refused),
            (Openat2::Enosys, false, SetIdModes::GroupOnly),
            (Openat2::Enosys, false, SetIdModes::Allowed),
        ] {
            let fast = program(openat2, host, set_id, true).unwrap();
            let chain = program(openat2, host, set_id, false).unwrap();
            for nr in (0..1024).chain([0x4000_0000, u32::MAX]) {
                for args in &arg_sets {
                    assert_eq!(
                        run(&fast, nr, *args).0,
                        run(&chain, nr, *args).0,
                        "syscall {nr} with {args:x?}"
                    );
                }
            }
            // What an allowed call walks (and the kernel emulates for each syscall number
            // when the filter is installed): a few dozen instructions, not the chain.
            let (action, steps) = run(&fast, libc::SYS_read as u32, [0; 6]);
            assert_eq!(action, crate::bpf::RET_ALLOW);
            assert!(steps <= 40, "{steps} instructions for read(2)");
        }
    }

    #[test]
    fn setuid_and_setgid_modes_are_refused_allowed_for_the_group_or_allowed_as_decided() {
        let suid = u64::from(libc::S_ISUID | 0o755);
        let sgid = u64::from(libc::S_ISGID | 0o755);
        let deny = DENY;
        let allow = crate::bpf::RET_ALLOW;
        for (set_id, expect_suid, expect_sgid) in [
            (SetIdModes::Refused, deny, deny),
            (SetIdModes::GroupOnly, deny, allow),
            (SetIdModes::Allowed, allow, allow),
        ] {
            let filter = build(Openat2::Enosys, false, set_id, Ids::ImageRoot).unwrap();
            let fchmod = |mode| run(&filter, libc::SYS_fchmod as u32, [3, mode, 0, 0, 0, 0]).0;
            let fchmodat = |mode| run(&filter, libc::SYS_fchmodat as u32, [3, 0, mode, 0, 0, 0]).0;
            assert_eq!(fchmod(suid), expect_suid, "{set_id:?}");
            assert_eq!(fchmodat(suid), expect_suid, "{set_id:?}");
            assert_eq!(fchmod(sgid), expect_sgid, "{set_id:?}");
            assert_eq!(fchmod(0o755), allow, "{set_id:?}");
            // The rest of the deny list stays.
            assert_eq!(run(&filter, libc::SYS_mount as u32, [0; 6]).0, deny);
        }
    }

    #[test]
    fn an_image_root_answers_the_id_calls_with_0_and_decides_everything_else_as_a_plain_one() {
        for (openat2, host) in [(Openat2::Enosys, false), (Openat2::Agent, true)] {
            let plain = build(openat2, host, SetIdModes::Refused, Ids::Caller).unwrap();
            let image = build(openat2, host, SetIdModes::Refused, Ids::ImageRoot).unwrap();
            assert!(image.len() <= 350, "{} instructions", image.len());
            let no_op = crate::bpf::RET_ERRNO; // errno 0: the call returns 0
            for nr in (0..1024).chain([0x4000_0000, u32::MAX]) {
                let args = [0x1234u64, 0x5678, 0, 0, 0, 0];
                let expected = if ID_NO_OPS.iter().any(|&(_, n)| n as u32 == nr) {
                    assert_eq!(run(&plain, nr, args).0, crate::bpf::RET_ALLOW, "{nr}");
                    no_op
                } else {
                    run(&plain, nr, args).0
                };
                assert_eq!(run(&image, nr, args).0, expected, "syscall {nr}");
            }
        }
    }

    #[test]
    fn every_denial_has_a_reason_and_no_duplicates() {
        let list = denied();
        for d in &list {
            assert!(!d.why.is_empty(), "{}", d.name);
        }
        let mut unconditional: Vec<_> = list
            .iter()
            .filter(|d| d.when.is_none())
            .map(|d| d.nr)
            .collect();
        let n = unconditional.len();
        unconditional.sort();
        unconditional.dedup();
        assert_eq!(unconditional.len(), n);
    }
}

#[cfg(test)]
mod review_tests {
    use super::*;

    /// First syscall number of the generic table (Linux 5.1).
    const FIRST_GENERIC: i64 = 424;

    fn classified(nr: i64) -> bool {
        ENOSYS_CALLS.iter().any(|&(_, n)| n == nr)
            || denied().iter().any(|d| d.nr == nr)
            || REVIEWED_ALLOWED.iter().any(|a| a.nr == nr)
    }

    #[test]
    fn every_syscall_of_this_kernel_from_424_up_was_reviewed() {
        // A syscall this kernel implements answers something other than ENOSYS; called
        // with every argument -1 (a bad descriptor, a bad pointer, bad flags) it fails
        // before doing anything.
        for nr in FIRST_GENERIC..FIRST_GENERIC + 128 {
            if classified(nr) {
                continue;
            }
            assert!(
                !crate::sys::syscall_exists(nr),
                "syscall {nr} exists on this kernel but is neither denied nor in REVIEWED_ALLOWED: review it (seccomp.rs, docs/security.md)"
            );
        }
    }

    #[test]
    fn no_syscall_is_both_denied_and_allowed() {
        for a in REVIEWED_ALLOWED {
            let denied_always = denied()
                .iter()
                .any(|d| d.name == a.name && d.when.is_none());
            assert!(!denied_always, "{}", a.name);
        }
    }
}

#[cfg(test)]
mod doc_tests {
    #[test]
    fn security_doc_lists_every_denied_syscall() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/security.md"
        ))
        .unwrap();
        for d in super::denied() {
            assert!(
                doc.contains(&format!("| `{}` |", d.name)),
                "docs/security.md lacks {}",
                d.name
            );
        }
        for f in super::REFUSED_FAMILIES {
            assert!(
                doc.contains(&format!("| `{}` | `EAFNOSUPPORT` |", f.name)),
                "docs/security.md lacks the socket family {}",
                f.name
            );
        }
        for (name, _) in super::ID_NO_OPS {
            assert!(
                doc.contains(&format!("`{name}`")) && doc.contains("## Image roots"),
                "docs/security.md, \"Image roots\", lacks the no-op {name}"
            );
        }
        for (name, _) in super::ENOSYS_CALLS {
            assert!(
                doc.contains(&format!("| `{name}` | `ENOSYS` |")),
                "docs/security.md lacks the ENOSYS row of {name}"
            );
        }
        for a in super::REVIEWED_ALLOWED {
            assert!(
                doc.contains(&format!("| `{}` | allowed |", a.name)),
                "docs/security.md lacks the allowed {}",
                a.name
            );
        }
    }
}
