//! Starting a confined command and supervising it: [`Spawn`] builds a sandbox, [`Gated`]
//! waits for its go, [`Running`] supervises one command to its [`Outcome`].
//!
//! A `Running` is two values: the sandbox (its init, report socket, plan, limits and
//! network supervisor), which lives as long as the init, and the current command's run
//! (its records, timing and counters), which a sequence replaces for each command.

use crate::child::{self, Prepared};
use crate::dirmove;
use crate::error::{explain_clone_error, NetUpdateError, SetupError};
use crate::landlock;
use crate::limits::{self, LimitMechanisms, LimitPlan};
use crate::netfilter;
use crate::plan::{self, cstring, SetupPlan};
use crate::report::{Go, Record, Step, RECORD_LEN};
use crate::resolve;
use crate::seccomp;
use crate::sys::CStringArray;
use crate::sys::{self, Errno, Forked};
use lockbox_netsup::{self as netsup, NetReport, NetRules, PassOn, Supervisor};
use lockbox_policy::{Net, Policy, DEFAULT_PATH};
use rustix::event::{PollFd, PollFlags, Timespec};
use serde::Serialize;
use std::borrow::Cow;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::FromRawFd;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicI32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stack size of the command child until it execs (it runs a few small functions).
const COMMAND_STACK: usize = 256 * 1024;

/// Stack size of the init's set-up helper (a few syscalls).
const HELPER_STACK: usize = 64 * 1024;
/// Stack of an init that shares its caller's memory until its lean exec
/// (`clone_sharing_memory`); pages it does not touch cost nothing.
const INIT_STACK: usize = 1024 * 1024;
/// Stack of the go-between that clones an init into a copy of a root template.
const GO_BETWEEN_STACK: usize = 64 * 1024;

/// What confines a running sandbox, for reports and `lockbox check`.
#[derive(Debug, Clone, Serialize)]
pub struct Enforcement {
    /// Namespaces the sandbox lives in.
    pub namespaces: Vec<&'static str>,
    /// The uid inside: the caller's, mapped to itself; in an image root, 0 (or the
    /// image's user, see [`crate::ImageRoot::ids`]).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Landlock ABI in force, `None` when the kernel has no Landlock.
    pub landlock_abi: Option<u32>,
    /// Number of syscall rules of the seccomp filter.
    pub seccomp_denied_syscalls: usize,
    /// `no_new_privs` is set and every capability is dropped.
    pub no_new_privs: bool,
    /// How each requested limit is enforced.
    pub limits: LimitMechanisms,
    /// The most the sandbox may hold of the caller's per-user kernel quotas.
    pub user_quotas: Box<crate::quotas::UserQuotas>,
    /// How the network policy is enforced.
    pub network: NetEnforcement,
}

/// How a sandbox's network policy is enforced (JSON: `"none"`, `"host"`, `"allow_list"`,
/// `"deny_list"`; `lockbox check` prints the [`Display`](std::fmt::Display) sentence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetEnforcement {
    /// An own network namespace with loopback only (`--net none`).
    #[serde(rename = "none")]
    LoopbackOnly,
    /// The host's network namespace (`--net host`).
    Host,
    /// An own namespace; the supervisor installs host sockets for the destinations a
    /// seccomp user notification shows are allowed (`--net-allow`).
    AllowList,
    /// As [`NetEnforcement::AllowList`], for every destination not denied (`--net-deny`).
    DenyList,
}

impl NetEnforcement {
    /// How `net` is enforced.
    pub fn of(net: &Net) -> NetEnforcement {
        match net {
            Net::None => NetEnforcement::LoopbackOnly,
            Net::Host => NetEnforcement::Host,
            Net::Allow(_) => NetEnforcement::AllowList,
            Net::Deny(_) => NetEnforcement::DenyList,
        }
    }
}

impl std::fmt::Display for NetEnforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SUPERVISED: &str =
            "(own namespace; seccomp user notification, host sockets installed by the supervisor)";
        match self {
            NetEnforcement::LoopbackOnly => f.write_str("none (loopback only)"),
            NetEnforcement::Host => f.write_str("host"),
            NetEnforcement::AllowList => write!(f, "allow-list {SUPERVISED}"),
            NetEnforcement::DenyList => write!(f, "deny-list {SUPERVISED}"),
        }
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
    /// Could not be executed (`errno`: ENOENT = not found).
    ExecFailed(i32),
}

/// The result of a sandboxed command.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// How the command ended.
    pub status: Status,
    /// Stopped because the timeout expired.
    pub timed_out: bool,
    /// Killed by the memory cgroup's OOM killer.
    pub oom_killed: bool,
    /// Wall-clock time from spawn to the end of the sandbox.
    pub wall: Duration,
    /// User + system CPU time of every process that was reaped in the sandbox.
    pub cpu: Duration,
    /// Peak memory in bytes, and what measured it.
    pub peak_memory: Option<(u64, &'static str)>,
    /// What confined it.
    pub enforcement: Enforcement,
    /// What the network supervisor saw (`--net-allow` / `--net-deny` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net: Option<Box<NetReport>>,
    /// The bounded (tmpfs) upper layers of overlays with `max_size`, still mounted, for the
    /// caller to copy into their `upper` directories (see [`UpperMount::upper`]).
    #[serde(skip)]
    pub upper_mounts: Vec<UpperMount>,
}

/// A detached mount of a bounded upper tmpfs, alive while this value is.
#[derive(Debug, Clone)]
pub struct UpperMount {
    /// Index of the overlay in `Policy::fs.overlays`.
    pub overlay: usize,
    mount: std::sync::Arc<OwnedFd>,
}

impl UpperMount {
    /// Path of the upper layer (readable by this process while `self` lives).
    pub fn upper(&self) -> std::path::PathBuf {
        format!("/proc/self/fd/{}/upper", self.mount.as_raw_fd()).into()
    }
}

impl Outcome {
    /// The exit code `lockbox run` uses: the command's own; 128+N for signal N; 124 on
    /// timeout; 126 not executable; 127 not found.
    pub fn exit_code(&self) -> i32 {
        if self.timed_out {
            return 124;
        }
        match self.status {
            Status::Exited(code) => code,
            Status::Signaled(sig) => 128 + sig,
            Status::ExecFailed(libc::ENOENT) => 127,
            Status::ExecFailed(_) => 126,
        }
    }
}

/// What [`Running::wait`] saw first.
#[derive(Debug)]
pub enum Waited {
    /// The sandbox ended.
    Exited(Outcome),
    /// The deadline passed; the sandbox still runs.
    Deadline,
    /// The extra descriptor became readable; the sandbox still runs.
    Extra,
}

/// A sandbox running a command. Dropping it kills everything in the sandbox.
#[derive(Debug)]
pub struct Running {
    sandbox: Sandbox,
    run: Run,
}

/// A long-lived sandbox whose command's outcome nobody will read ([`Running::park`]): it
/// holds no descriptor of the caller's. Dropping it kills everything in the sandbox.
#[derive(Debug)]
pub struct Parked {
    sandbox: Sandbox,
}

/// A started sandbox waiting for its go ([`Spawn::gated`], [`Running::next`]). Dropping it
/// kills the waiting sandbox.
#[derive(Debug)]
pub struct Gated {
    sandbox: Sandbox,
    /// The command the go runs (its index in the sequence).
    step: usize,
    /// CPU time of the commands before it.
    cpu_before: u64,
}

/// Why [`Running::stop`] stops a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The caller asked (a signal, a cancelled session).
    Requested,
    /// Its time is up: the outcome says `timed_out` (exit code 124).
    Timeout,
}

/// What lives as long as the sandbox's init: across the commands of a sequence.
#[derive(Debug)]
struct Sandbox {
    pid: libc::pid_t,
    /// `None` once parked ([`Running::park`]); [`Sandbox::pidfd`] opens it again.
    pidfd: Option<OwnedFd>,
    /// `None` once parked: nothing is read from the init any more.
    report: Option<OwnedFd>,
    plan: SetupPlan,
    /// Each command's program, for messages (one per command of a sequence).
    programs: Vec<String>,
    limits: LimitPlan,
    enforcement: Enforcement,
    net: Option<Supervisor>,
    /// Makes directories of a writable overlay movable (see `dirmove`); stops with the
    /// sandbox.
    renames: Option<dirmove::Supervisor>,
    /// The init has been waited for.
    reaped: bool,
    /// The init reported its last command's status and exits by itself.
    exiting: bool,
    /// Dropping starts a thread to reap an init still exiting (see
    /// [`Running::drop_before_exit`]).
    reap_in_background: bool,
}

/// One command, from its start (or go) to its outcome.
#[derive(Debug)]
struct Run {
    /// Index of the command in the sequence (0 otherwise).
    step: usize,
    started: Instant,
    failure: Option<Record>,
    status: Option<Record>,
    usage: Option<(u64, u32)>,
    upper_mounts: Vec<UpperMount>,
    timed_out: bool,
    /// The outcome has been produced.
    done: bool,
    /// CPU time and OOM kills counted before this command.
    cpu_before: u64,
    oom_kills_before: u64,
}

impl Run {
    fn new(step: usize, started: Instant, cpu_before: u64, oom_kills_before: u64) -> Run {
        Run {
            step,
            started,
            failure: None,
            status: None,
            usage: None,
            upper_mounts: Vec::new(),
            timed_out: false,
            done: false,
            cpu_before,
            oom_kills_before,
        }
    }
}

/// Per-sandbox standard input, output and error. `None` keeps the caller's descriptor (for a
/// [`Spawn::sequence`]: `/dev/null`; at a [`Gated::release`]: what the sandbox has).
#[derive(Debug, Default)]
pub struct Stdio {
    /// Becomes descriptor 0 in the sandbox.
    pub stdin: Option<OwnedFd>,
    /// Becomes descriptor 1 in the sandbox.
    pub stdout: Option<OwnedFd>,
    /// Becomes descriptor 2 in the sandbox.
    pub stderr: Option<OwnedFd>,
}

impl Stdio {
    /// Raw numbers for the init, each `>= 3` (a source below 3 is duplicated upward, so the
    /// init's `dup2` onto 0..=2 never overwrites a source it still needs). The returned
    /// descriptors must stay open until the clone.
    fn prepare(self) -> Result<([RawFd; 3], Vec<OwnedFd>), SetupError> {
        let mut raw = [-1; 3];
        let mut held = Vec::new();
        for (i, fd) in [self.stdin, self.stdout, self.stderr]
            .into_iter()
            .enumerate()
        {
            let Some(fd) = fd else { continue };
            // `try_clone` is `F_DUPFD_CLOEXEC` with a minimum of 3.
            let fd = if fd.as_raw_fd() < 3 {
                fd.try_clone().map_err(|source| SetupError::Path {
                    path: format!("fd {}", fd.as_raw_fd()).into(),
                    what: "redirecting stdio to",
                    source,
                })?
            } else {
                fd
            };
            raw[i] = fd.as_raw_fd();
            held.push(fd);
        }
        Ok((raw, held))
    }
}

/// Builds a sandbox: what it runs ([`Spawn::command`], [`Spawn::agent`],
/// [`Spawn::sequence`]), its stdio ([`Spawn::stdio`]), then [`Spawn::start`] for a sandbox
/// whose command runs at once, or [`Spawn::gated`] for one that waits for its go.
///
/// ```no_run
/// use lockbox_confine::{Spawn, Waited};
/// let policy = lockbox_policy::Policy::default();
/// let argv = ["true".into()];
/// let mut running = Spawn::command(&policy, &argv).start()?;
/// if let Waited::Exited(outcome) = running.wait(None, None)? {
///     assert_eq!(outcome.exit_code(), 0);
/// }
/// # Ok::<(), lockbox_confine::SetupError>(())
/// ```
///
/// The sandbox's init has a parent-death signal (SIGKILL), which the kernel ties to the
/// *thread* that starts it: a sandbox meant to outlive the calling thread (a thread pool's
/// worker) must be started from a thread that lives as long (see `lockbox-runtime`).
#[derive(Debug)]
#[must_use = "a Spawn does nothing until started"]
pub struct Spawn<'a> {
    policy: &'a Policy,
    program: Program<'a>,
    stdio: Stdio,
    net: NetHooks,
    own_session: bool,
    image: Option<resolve::ImageRoot>,
    lean_init: bool,
    root_template: bool,
    caller_cwd: Option<&'a Path>,
}

/// Who the network supervisor reports to ([`Spawn::audit`]), asks ([`Spawn::ask`]) and
/// hands intercepted connections to ([`Spawn::interceptor`]).
#[derive(Debug, Default)]
struct NetHooks {
    audit: Option<netsup::AuditSink>,
    ask: Option<netsup::Approvals>,
    interceptor: Option<Arc<dyn netsup::Interceptor>>,
}

/// What a sandbox runs.
#[derive(Debug, Clone, Copy)]
enum Program<'a> {
    /// One command.
    Command(&'a [OsString]),
    /// Several commands, one after another.
    Sequence(&'a [Vec<OsString>]),
    /// The host executable `exe`, bound into the sandbox, with arguments `args`.
    Agent { exe: &'a Path, args: &'a [OsString] },
    /// A command given at the go ([`Spawn::armed`]).
    Armed,
}

impl<'a> Spawn<'a> {
    /// A sandbox that runs `argv` confined by `policy`.
    pub fn command(policy: &'a Policy, argv: &'a [OsString]) -> Spawn<'a> {
        Spawn {
            policy,
            program: Program::Command(argv),
            stdio: Stdio::default(),
            net: NetHooks::default(),
            own_session: false,
            image: None,
            lean_init: false,
            root_template: false,
            caller_cwd: None,
        }
    }

    /// One sandbox that runs `commands` one after another — a pipeline's stages, say —
    /// as if each had a sandbox of its own but for the set-up, which is paid once
    /// (namespaces, root, views, network namespace).
    ///
    /// The policy's views are mounted when the first command is released and stay for all
    /// of them, so a command reads what the commands before it wrote, in the same upper
    /// layers. Between two commands the init kills and reaps everything the previous one
    /// left, gives the next one a fresh `/tmp` and `/dev/shm` (the sandbox's own tmpfs
    /// mounts, if used) and a fresh IPC namespace; the next command then waits for its go.
    /// What the commands share: the views, the network namespace (loopback), the hostname,
    /// the cgroup and pid namespaces, and limits enforced by a cgroup, which count the
    /// sandbox as a whole.
    ///
    /// Each command's stdio is what its [`Gated::release`] gives, else what
    /// [`Spawn::stdio`] gave, else `/dev/null`. Once [`Running::wait`] has a command's
    /// outcome, [`Running::next`] gives the gated sandbox of the command after it. More
    /// than one command is refused for policies that [`sequence_unsupported`] names.
    pub fn sequence(policy: &'a Policy, commands: &'a [Vec<OsString>]) -> Spawn<'a> {
        Spawn {
            policy,
            program: Program::Sequence(commands),
            stdio: Stdio::default(),
            net: NetHooks::default(),
            own_session: false,
            image: None,
            lean_init: false,
            root_template: false,
            caller_cwd: None,
        }
    }

    /// A sandbox that runs the host executable `exe` (bound read-only at
    /// [`crate::AGENT_PATH`], a path of lockbox's own `/dev`, whatever the policy
    /// grants) with arguments `args`: how `lockbox-runtime` starts its in-sandbox agent.
    ///
    /// The agent is the one command whose seccomp filter allows `openat2` (its file
    /// operations resolve paths with `RESOLVE_BENEATH`/`RESOLVE_IN_ROOT`); `exe` must be a
    /// binary that calls `lockbox_agent::main_if_agent`, which stacks a filter answering
    /// `openat2` with `ENOSYS` ([`crate::agent_sys::CommandFilter`]) on every command it starts,
    /// and makes itself non-dumpable so that no command can ptrace it into making the call.
    pub fn agent(policy: &'a Policy, exe: &'a Path, args: &'a [OsString]) -> Spawn<'a> {
        Spawn {
            policy,
            program: Program::Agent { exe, args },
            stdio: Stdio::default(),
            net: NetHooks::default(),
            own_session: false,
            image: None,
            lean_init: false,
            root_template: false,
            caller_cwd: None,
        }
    }

    /// A sandbox built and confined up to its command, which it learns only at its go
    /// ([`Armed::release`]): a pre-armed start. Everything a direct start does before the
    /// exec is done ahead — namespaces, the root, the views, Landlock, seccomp, the
    /// directory — by the init and a command child that waits for the go; the go brings
    /// the stdio and the command ([`crate::ArmedCommand`]: argv, environment), and the wait is
    /// then only an `execve`. Its stdio until then is `/dev/null`, and it names no
    /// terminal inside (a caller whose stdio is a terminal starts directly). Not for
    /// policies that [`armed_unsupported`] names.
    pub fn armed(policy: &'a Policy) -> Spawn<'a> {
        Spawn {
            policy,
            program: Program::Armed,
            stdio: Stdio::default(),
            net: NetHooks::default(),
            own_session: false,
            image: None,
            lean_init: false,
            root_template: false,
            caller_cwd: None,
        }
    }

    /// Resolves the policy as if the caller's current directory were `dir`: the default
    /// working directory inside when it is visible there (a helper that arms sandboxes for
    /// other processes, see [`Spawn::armed`]).
    pub fn caller_cwd(self, dir: &'a Path) -> Spawn<'a> {
        Spawn {
            caller_cwd: Some(dir),
            ..self
        }
    }

    /// The sandbox's stdin, stdout and stderr (see [`Stdio`]); the descriptors are closed
    /// in the caller once the sandbox has started.
    pub fn stdio(self, stdio: Stdio) -> Spawn<'a> {
        Spawn { stdio, ..self }
    }

    /// Sends an event per decision of the network supervisor (`--net-allow`/`--net-deny`
    /// only; see [`NetEvent`](lockbox_netsup::NetEvent)) to `sink`, which is never waited on.
    pub fn audit(mut self, sink: netsup::AuditSink) -> Spawn<'a> {
        self.net.audit = Some(sink);
        self
    }

    /// Under an allow-list (`--net-allow`; ignored otherwise), asks `desk` about each
    /// unlisted destination or name instead of refusing it (`--net-ask`): the call waits
    /// for a [`Verdict`](lockbox_netsup::Verdict) or the desk's timeout. See
    /// [`Approvals`](lockbox_netsup::Approvals).
    pub fn ask(mut self, desk: netsup::Approvals) -> Spawn<'a> {
        self.net.ask = Some(desk);
        self
    }

    /// Hands the TLS connections `interceptor` claims to it instead of relaying them
    /// (credentials lockbox sets on requests: see [`lockbox_netsup::Interceptor`]). Needs an
    /// allow-list and lockbox's own `/etc` (the default reads, `/etc` not granted itself):
    /// the sandbox's view of the system trust store gets the interceptor's CA
    /// ([`lockbox_netsup::trust_files`]).
    pub fn interceptor(mut self, interceptor: Arc<dyn netsup::Interceptor>) -> Spawn<'a> {
        self.net.interceptor = Some(interceptor);
        self
    }

    /// An agent's sandbox ([`Spawn::agent`]; ignored otherwise) whose init, once the agent
    /// runs, re-executes the agent's executable as a small init of its own, so that it holds
    /// none of the caller's memory for the sandbox's life (see [`crate::main_if_init`]).
    /// Only for an executable whose `main` calls [`crate::main_if_init`] first thing
    /// (`lockbox-agent`'s `main_if_agent` does); any other would run with [`crate::INIT_ARG`]
    /// and the init's numbers as its arguments.
    pub fn lean_init(self) -> Spawn<'a> {
        Spawn {
            lean_init: true,
            ..self
        }
    }

    /// Copies the sandbox's root from a template built once per plan in this process,
    /// instead of building it (see the `template` module): for a process that starts many
    /// sandboxes of one policy (the server). A root the template cannot serve (an image
    /// root, copy-on-write views, a gated or pre-armed sandbox, a sequence) is built as
    /// before, as is every root when `LOCKBOX_ROOT_TEMPLATES=0` is set. The template's
    /// namespaces stay for the process's life.
    pub fn root_template(self) -> Spawn<'a> {
        Spawn {
            root_template: true,
            ..self
        }
    }

    /// Runs the command in a session of its own, away from the caller's terminal: no signal
    /// the caller's terminal sends reaches it (the caller forwards what it should), `/dev/tty`
    /// inside is not the caller's terminal, and the first terminal on its stdio (a
    /// pseudo-terminal the caller relays, say) becomes its controlling terminal, unless it is
    /// already another session's. What `lockbox run --net-ask` needs: the terminal it asks
    /// on must be out of the sandbox's reach.
    pub fn own_session(self) -> Spawn<'a> {
        Spawn {
            own_session: true,
            ..self
        }
    }

    /// Runs the sandbox on an image's root instead of the host's userland (issue 29): its
    /// `/` is an overlay of `root`'s layers (read-only, mounted, never copied) with a
    /// writable layer of the sandbox's own on a tmpfs bounded like `/tmp` (the policy's
    /// memory limit, else half of RAM; its writes vanish with the sandbox). The policy's
    /// default reads are left out; lockbox still provides `/dev`, `/proc`, `/tmp` and
    /// `/etc/hostname`, `/etc/hosts` (and `/etc/resolv.conf` where the network mode has
    /// one), bound over the image's; every grant and view is mounted at its own path.
    ///
    /// Inside, the caller is uid 0 and gid 0 (its user namespace maps the caller's ids to
    /// 0, so the image's files, the caller's on the host, are root's; or the ids of
    /// [`ImageRoot::ids`](crate::ImageRoot::ids)), and the chown and
    /// set*id calls succeed without doing anything (seccomp answers them with 0, as
    /// Charliecloud's `--force=seccomp`): installers that chown files or drop to another
    /// user keep going, as root. Capabilities stay dropped and `no_new_privs` set; files
    /// written into a grant or view stay the caller's on the host. See docs/security.md,
    /// "Image roots". The image's `Env`, `WorkingDir` and command are the caller's to
    /// apply (the policy's environment and `cwd`, which may be a directory of the image).
    ///
    /// Needs overlayfs's `userxattr` (Linux 5.11). A missing layer, a layer that is not a
    /// directory or more than [`crate::MAX_IMAGE_LAYERS`] layers fail [`Spawn::start`].
    pub fn image_root(self, root: resolve::ImageRoot) -> Spawn<'a> {
        Spawn {
            image: Some(root),
            ..self
        }
    }

    /// Starts the sandbox and its (first) command. Returns as soon as the sandbox init
    /// runs; setup failures inside the namespaces are reported by [`Running::wait`].
    pub fn start(self) -> Result<Running, SetupError> {
        if let Program::Sequence(_) = self.program {
            return self.gated()?.release(Stdio::default());
        }
        let (sandbox, started) = launch(self, Start::Now)?;
        Ok(Running {
            run: Run::new(0, started, 0, 0),
            sandbox,
        })
    }

    /// Starts the sandbox, which stops short of its command: it sets up the namespaces, the
    /// root and captures every layer, then waits, before mounting its copy-on-write views,
    /// until [`Gated::release`] says go. What the sandbox sees of a view's layers is thus
    /// fixed at the go, not at the start: a pipeline starts stage N+1's sandbox while stage
    /// N still writes the layer N+1 will read, and only pays the rest of the setup
    /// (mounting the view, Landlock, the exec) once stage N is done.
    pub fn gated(self) -> Result<Gated, SetupError> {
        let (sandbox, _) = launch(self, Start::Gated)?;
        Ok(Gated {
            sandbox,
            step: 0,
            cpu_before: 0,
        })
    }

    /// Starts the sandbox held at the same gate as [`Spawn::gated`], with the stdio it was
    /// given for good (its terminal named inside as [`Spawn::start`] does): the caller
    /// learns the init's pid and records it before anything of the sandbox can write into
    /// its copy-on-write views (a branch's `sandbox_init`, issue 32), then [`Held::go`]s.
    pub fn held(self) -> Result<Held, SetupError> {
        let (sandbox, _) = launch(self, Start::Held)?;
        Ok(Held(Gated {
            sandbox,
            step: 0,
            cpu_before: 0,
        }))
    }

    /// Starts a [`Spawn::armed`] sandbox, which waits for [`Armed::release`]. Refuses any
    /// other program.
    pub fn arm(self) -> Result<Armed, SetupError> {
        if !matches!(self.program, Program::Armed) {
            return Err(SetupError::Sequence {
                reason: "only a sandbox made with Spawn::armed is armed",
            });
        }
        if let Some(reason) = armed_unsupported(self.policy) {
            return Err(SetupError::Sequence { reason });
        }
        let (sandbox, _) = launch(self, Start::Armed)?;
        Ok(Armed(Gated {
            sandbox,
            step: 0,
            cpu_before: 0,
        }))
    }
}

/// Why `policy` cannot be pre-armed ([`Spawn::armed`]), if so: what a direct start sets up
/// per command with the caller — a network list (its supervisor reports to the caller),
/// passed descriptors, copy-on-write views and bounded layers (their upper layers are the
/// caller's branch).
pub fn armed_unsupported(policy: &Policy) -> Option<&'static str> {
    if matches!(policy.net, Net::Allow(_) | Net::Deny(_)) {
        return Some("a network allow- or deny-list has a supervisor of the caller's");
    }
    if !policy.pass_fds.is_empty() {
        return Some("passed descriptors are the caller's");
    }
    if !policy.fs.overlays.is_empty() {
        return Some("copy-on-write views are set up per run");
    }
    if policy.image.is_some() {
        return Some("an image root is prepared per run");
    }
    None
}

/// A sandbox started with [`Spawn::arm`], waiting for its command. Dropping it kills the
/// waiting sandbox.
#[derive(Debug)]
pub struct Armed(Gated);

impl Armed {
    /// The pid of the waiting sandbox's init, as seen by the caller.
    pub fn pid(&self) -> libc::pid_t {
        self.0.pid()
    }

    /// Whether the sandbox has ended while waiting (its set-up failed, or it was killed):
    /// a release would only report that.
    pub fn ended(&self) -> bool {
        let Some(pidfd) = &self.0.sandbox.pidfd else {
            return true;
        };
        let mut fds = [libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        sys::poll(&mut fds, 0).is_ok_and(|n| n > 0)
    }

    /// Lets the sandbox run `command` with `stdio` (a descriptor not given stays
    /// `/dev/null`). The returned [`Running`] measures its wall time from now; a set-up
    /// failure, or a command that cannot be executed, is reported by [`Running::wait`] as a
    /// direct start reports it.
    pub fn release(
        mut self,
        stdio: Stdio,
        command: &crate::ArmedCommand,
    ) -> Result<Running, SetupError> {
        self.0.sandbox.programs = vec![command.program().to_owned()];
        self.0.go(stdio, Some(command.fd()))
    }
}

/// How [`launch`] starts the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Straight on to its command.
    Now,
    /// Waiting at its gate for a go that may replace its stdio ([`Spawn::gated`]).
    Gated,
    /// Waiting at its gate for a go that keeps its stdio ([`Spawn::held`]).
    Held,
    /// Confined, waiting for a go that brings the command ([`Spawn::arm`]).
    Armed,
}

/// A sandbox started with [`Spawn::held`], waiting before its views are mounted. Dropping it
/// kills the waiting sandbox.
#[derive(Debug)]
pub struct Held(Gated);

impl Held {
    /// The pid of the waiting sandbox's init, as seen by the caller. It cannot be reused
    /// while the returned value (or the [`Running`] that follows) lives: the init is the
    /// caller's child, reaped only by them.
    pub fn pid(&self) -> libc::pid_t {
        self.0.pid()
    }

    /// Lets the sandbox go on to its command, with the stdio it was started with.
    pub fn go(self) -> Result<Running, SetupError> {
        self.0.release(Stdio::default())
    }
}

impl Gated {
    /// The pid of the waiting sandbox's init, as seen by the caller.
    pub fn pid(&self) -> libc::pid_t {
        self.sandbox.pid
    }

    /// Lets the sandbox go on. Each descriptor of `stdio` that is given becomes the
    /// command's 0, 1 or 2, replacing what the sandbox was started with. The returned
    /// [`Running`] measures its wall time from now. A sandbox that failed while waiting
    /// reports that failure from [`Running::wait`].
    pub fn release(self, stdio: Stdio) -> Result<Running, SetupError> {
        self.go(stdio, None)
    }

    /// Sends the go with `stdio` and, to a pre-armed sandbox, its `command`.
    fn go(self, stdio: Stdio, command: Option<BorrowedFd<'_>>) -> Result<Running, SetupError> {
        let given = [&stdio.stdin, &stdio.stdout, &stdio.stderr];
        let go = Go {
            stdio: given.map(Option::is_some),
            command: command.is_some(),
        };
        let fds: Vec<BorrowedFd<'_>> = given
            .into_iter()
            .flatten()
            .map(|fd| fd.as_fd())
            .chain(command)
            .collect();
        let sent = match &self.sandbox.report {
            Some(report) => sys::send_with_fds(report.as_fd(), &go.encode(), &fds),
            None => Err(Errno(libc::EPIPE)),
        };
        match sent {
            // The init is gone: `wait` tells why.
            Ok(()) | Err(Errno(libc::EPIPE | libc::ECONNRESET)) => {}
            Err(errno) => {
                return Err(SetupError::Supervise {
                    what: "releasing the gated sandbox",
                    errno,
                })
            }
        }
        let oom_kills = self.sandbox.oom_kills();
        Ok(Running {
            run: Run::new(self.step, Instant::now(), self.cpu_before, oom_kills),
            sandbox: self.sandbox,
        })
    }
}

/// The agent's executable on the host, which must be a regular file.
fn agent_host(exe: &Path) -> Result<std::path::PathBuf, SetupError> {
    let host = std::fs::canonicalize(exe).map_err(|source| SetupError::Path {
        path: exe.to_owned(),
        what: "binding the agent",
        source,
    })?;
    if !host.is_file() {
        return Err(SetupError::Path {
            path: host,
            what: "binding the agent",
            source: std::io::Error::other("not a regular file"),
        });
    }
    Ok(host)
}

fn dev_null() -> Result<OwnedFd, SetupError> {
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|source| SetupError::Path {
            path: "/dev/null".into(),
            what: "opening",
            source,
        })
}

/// Why `policy` cannot run several commands in one sandbox ([`Spawn::sequence`]), if so:
/// a network list (its supervisor serves one command's filter), passed descriptors (the
/// first command would take them), or a bounded upper layer (handed to lockbox once, for
/// one command's outcome).
pub fn sequence_unsupported(policy: &Policy) -> Option<&'static str> {
    if matches!(policy.net, Net::Allow(_) | Net::Deny(_)) {
        return Some("a network allow- or deny-list is enforced for one command only");
    }
    if !policy.pass_fds.is_empty() {
        return Some("passed descriptors can only go to one command");
    }
    let bounded =
        |o: &lockbox_policy::Overlay| o.upper.as_ref().is_some_and(|u| u.max_size.is_some());
    if policy.fs.overlays.iter().any(bounded) {
        return Some("a bounded upper layer (max_size) serves one command only");
    }
    None
}

/// Starts the sandbox of `program`; `start`: whether its first command waits for a go. Returns
/// it with the time of the clone.
fn launch(spawn: Spawn<'_>, start: Start) -> Result<(Sandbox, Instant), SetupError> {
    let gated = matches!(start, Start::Gated | Start::Held);
    let Spawn {
        policy,
        program,
        mut stdio,
        net,
        own_session,
        image,
        lean_init,
        root_template,
        caller_cwd,
    } = spawn;
    let (argv, later, helper, lean) = match program {
        Program::Command(argv) => (Cow::Borrowed(argv), &[][..], None, None),
        Program::Sequence(commands) => {
            let (first, later) = commands.split_first().ok_or(SetupError::Sequence {
                reason: "no command given",
            })?;
            if let Some(reason) = sequence_unsupported(policy).filter(|_| !later.is_empty()) {
                return Err(SetupError::Sequence { reason });
            }
            for fd in [&mut stdio.stdin, &mut stdio.stdout, &mut stdio.stderr] {
                if fd.is_none() {
                    *fd = Some(dev_null()?);
                }
            }
            (Cow::Borrowed(first.as_slice()), later, None, None)
        }
        Program::Agent { exe, args } => {
            let host = agent_host(exe)?;
            // On an image root, the host's loader and libraries come along (`loader`).
            let loader = match &image {
                Some(_) => crate::loader::of(&host)?,
                None => None,
            };
            let mut argv = Vec::new();
            if loader.is_some() {
                argv.extend([
                    OsString::from(crate::loader::LOADER_PATH),
                    "--library-path".into(),
                    crate::loader::LIB_DIR.into(),
                ]);
            }
            argv.push(OsString::from(plan::HELPER_PATH));
            // Once the agent runs, the init may re-execute the agent's executable as itself.
            let lean = lean_init.then(|| {
                crate::lean_init::LeanExec::new(
                    exec_candidates(&argv[0], DEFAULT_PATH),
                    argv.iter().map(|a| cstring(a.as_bytes())).collect(),
                )
            });
            argv.extend_from_slice(args);
            (Cow::Owned(argv), &[][..], Some((host, loader)), lean)
        }
        Program::Armed => {
            for fd in [&mut stdio.stdin, &mut stdio.stdout, &mut stdio.stderr] {
                *fd = Some(dev_null()?);
            }
            (Cow::Owned(Vec::new()), &[][..], None, None)
        }
    };
    let armed = matches!(program, Program::Armed);
    let argv = &*argv;
    policy.validate()?;
    let (stdio_fds, stdio_held) = stdio.prepare()?;
    if (argv.is_empty() && !armed) || later.iter().any(Vec::is_empty) {
        return Err(no_command());
    }
    let caller_cwd = match caller_cwd {
        Some(dir) => Some(dir.to_owned()),
        None => std::env::current_dir().ok(),
    };
    if image.is_some() {
        overlay_userxattr()?;
    }
    let mut resolved = resolve::resolve_with(policy, image.as_ref(), caller_cwd.as_deref())?;
    let image_root = resolved.image.is_some();
    let agent = helper.is_some();
    if let Some((host, loader)) = helper {
        resolved.helper = Some(host);
        resolved.helper_loader = loader;
    }
    if let Some(interceptor) = &net.interceptor {
        add_trust(&mut resolved, interceptor.as_ref())?;
    }
    // Only where the command itself holds the stdio: the agent of a long-lived sandbox keeps
    // the server's stdout and stderr from its children (naming the server's terminal would
    // hand it to them), and a gated sandbox gets its stdio only at the release (a held one
    // keeps what it starts with).
    if !agent && !matches!(start, Start::Gated | Start::Armed) {
        resolved.terminal = resolve::terminal(&stdio_fds);
    }
    for overlay in &resolved.overlays {
        clear_volatile_mark(overlay.upper.as_ref())?;
    }
    let image_upper = resolved.image.as_ref().and_then(|i| i.upper.as_ref());
    clear_volatile_mark(image_upper)?;
    // Set-id modes are allowed only where nobody but the caller can reach them (see
    // `seccomp::SetIdModes`): an image build's layer on the host must be private as well.
    let private = resolve::private_writes(policy)
        && image_upper.is_none_or(|u| resolve::private_to_caller(&u.parent));
    let set_id = match (private, image_root) {
        (false, _) => seccomp::SetIdModes::Refused,
        (true, false) => seccomp::SetIdModes::GroupOnly,
        (true, true) => seccomp::SetIdModes::Allowed,
    };
    let plan = if gated {
        plan::build_sequence(&resolved, later.len())
    } else {
        plan::build(&resolved)
    };
    let landlock_abi = landlock::abi_version();
    let limits = limits::prepare(&policy.limits, Path::new("/sys/fs/cgroup"))?;
    let (host_uid, host_gid) = sys::ids();
    // An image's files are root's inside (see `Spawn::image_root`).
    let (uid, gid) = match &image {
        Some(image) => image.ids,
        None => (host_uid, host_gid),
    };
    check_pass_fds(&policy.pass_fds)?;
    let env = policy.env.build(|k| std::env::var(k).ok());
    let path_var = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let (report_rd, report_wr) = report_channel()?;
    let (supervisor, net_child) = start_net_supervisor(&resolved, net)?;
    let renames_wanted = renames_supervised(&resolved);
    let (renames, rename_child) = match net_child {
        None if renames_wanted => start_rename_supervisor()?,
        _ => (None, None),
    };
    let notify = match (net_child, rename_child) {
        (Some(fd), _) => Some((netfilter::filter(renames_wanted), fd)),
        (None, Some(fd)) => Some((dirmove::filter(), fd)),
        (None, None) => None,
    };
    let cgroup_fds = limits
        .cgroups
        .as_ref()
        .map(|c| c.procs_fds())
        .unwrap_or_default();
    // The init checks that we are still alive once it has armed its death signal.
    let parent = sys::pidfd_of_self().map_err(|errno| SetupError::Supervise {
        what: "opening the supervisor's own pidfd",
        errno,
    })?;
    let mut keep: Vec<RawFd> = vec![0, 1, 2, report_wr.as_raw_fd()];
    keep.extend(notify.as_ref().map(|(_, fd)| fd.as_raw_fd()));
    keep.extend(&cgroup_fds);
    keep.extend(&policy.pass_fds);
    // A lean init checks the supervisor is alive after its exec too.
    if lean.is_some() {
        keep.push(parent.as_raw_fd());
    }
    keep.sort_unstable();
    keep.dedup();
    let mut pass_fds = policy.pass_fds.clone();
    pass_fds.sort_unstable();
    let enforcement = Enforcement {
        namespaces: namespaces(&policy.net),
        uid,
        gid,
        landlock_abi,
        seccomp_denied_syscalls: seccomp::denied().len(),
        no_new_privs: true,
        limits: limits.mechanisms.clone(),
        user_quotas: Box::new(limits.user_quotas.clone()),
        network: NetEnforcement::of(&policy.net),
    };
    let layout = crate::proctitle::Layout::of_self()?;
    let helper_job = child::Alongside::new(
        policy.net.own_namespace(),
        matches!(policy.net, lockbox_policy::Net::Allow(_)),
    );
    let mut prepared = Prepared {
        title: crate::proctitle::TITLE.to_vec(),
        layout,
        source_fds: vec![-1; plan.sources.len()],
        command_stack: vec![0; COMMAND_STACK],
        plan,
        uid_map: format!("{uid} {host_uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {host_gid} 1\n").into_bytes(),
        cgroup_procs: cgroup_fds,
        new_cgroup_ns: Path::new("/proc/self/ns/cgroup").exists(),
        hostname: policy.hostname.as_bytes().to_vec(),
        helper_stack: if helper_job.needed() {
            vec![0; HELPER_STACK]
        } else {
            Vec::new()
        },
        helper: helper_job,
        landlock: landlock_abi.map(|abi| (abi, landlock::ruleset_attr(abi))),
        // Only the agent resolves paths with openat2; it denies it again to what it runs.
        seccomp: seccomp::build(
            if agent {
                seccomp::Openat2::Agent
            } else {
                seccomp::Openat2::Enosys
            },
            !policy.net.own_namespace(),
            set_id,
            if image_root {
                seccomp::Ids::ImageRoot
            } else {
                seccomp::Ids::Caller
            },
        )?,
        net: notify
            .as_ref()
            .map(|(filter, fd)| (filter.clone(), fd.as_raw_fd())),
        rlimits: limits.rlimits.clone(),
        pass_fds,
        keep_fds: keep,
        report_fd: report_wr.as_raw_fd(),
        parent: parent.as_raw_fd(),
        stdio: stdio_fds,
        own_session,
        commands: std::iter::once(argv)
            .filter(|_| !armed)
            .chain(later.iter().map(Vec::as_slice))
            .map(|argv| command(argv, path_var))
            .collect::<Result<_, _>>()?,
        envp: CStringArray::new(
            env.iter()
                .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
                .collect(),
        ),
        last_cap: last_cap(),
        user_sysctls: limits.user_sysctls.clone(),
        // Only an init that executes its lean self right after starting its command, with
        // no go to wait for (which would hold the caller's thread).
        shares_caller_memory: lean.is_some() && !gated && !armed && later.is_empty(),
        lean,
        armed: if armed {
            Some(child::ArmedRoom {
                bytes: sys::AnonMap::new(crate::armed::MAX_BYTES).map_err(|errno| {
                    SetupError::Supervise {
                        what: "reserving room for a pre-armed command",
                        errno,
                    }
                })?,
                pointers: vec![std::ptr::null(); crate::armed::MAX_STRINGS + 2],
            })
        } else {
            None
        },
        linger: armed && limits.cgroups.is_none(),
        template: None,
    };
    let template = match root_template && !gated && !armed && later.is_empty() {
        true => use_template(&mut prepared, uid, gid),
        false => None,
    };

    // What the init uses of ours: moved through the reserved slots when this process has
    // them, so that the clone need not copy our whole descriptor table (`own_table`).
    let mut needed = prepared.keep_fds.clone();
    needed.extend(prepared.stdio.iter().filter(|&&fd| fd >= 0));
    needed.push(prepared.parent);
    needed.extend(template.as_ref().map(|t| t.host_proc.as_raw_fd()));
    let lease = crate::own_table::lease(&needed);
    let flags = match &lease {
        Some(_) => CLONE_FLAGS | libc::CLONE_FILES as u64,
        None => CLONE_FLAGS,
    };
    let (lease, adopt) = lease.unzip();
    let started = Instant::now();
    let (from_template, adopt) = match &template {
        Some(using) => {
            let (cloned, adopt) = clone_from_template(&mut prepared, adopt, flags);
            match cloned {
                Ok(forked) => (Some(Ok(forked)), adopt),
                Err(TemplateError::Clone(errno)) => (Some(Err(errno)), adopt),
                Err(Unused(errno)) => {
                    tracing::warn!(
                        errno = errno.0,
                        "cloning into a root template's copy failed: building roots from now on"
                    );
                    crate::template::give_up();
                    prepared.template = None;
                    (prepared.uid_map, prepared.gid_map) = using.maps.clone();
                    (None, adopt)
                }
            }
        }
        None => (None, adopt),
    };
    drop(template);
    let cloned = if let Some(cloned) = from_template {
        cloned.map(|forked| (forked, None))
    } else if prepared.shares_caller_memory {
        clone_sharing_memory(&mut prepared, adopt, flags)
    } else {
        tracing::debug!(flags, "clone3 into new namespaces");
        // SAFETY: the child runs `child::init_main`, which makes only async-signal-safe calls
        // (nothing there allocates, locks or logs) and ends in `execve` or `_exit`. With
        // CLONE_FILES its first act is to take a table of its own (`own_table::adopt`),
        // before it opens, closes or duplicates anything.
        unsafe { sys::clone3_fork(flags) }.map(|forked| (forked, adopt))
    };
    match cloned {
        Err(errno) => Err(explain_clone_error(errno)),
        Ok((Forked::Child, adopt)) => {
            if let Some(adopt) = &adopt {
                if crate::own_table::adopt(adopt).is_err() {
                    // Nothing can be reported yet: the report pipe may not be in place.
                    sys::exit(125)
                }
            }
            child::init_main(&mut prepared)
        }
        Ok((Forked::Parent { pid, pidfd }, _)) => {
            if let Some(lease) = lease {
                lease.release(pidfd.as_fd());
            }
            // The init has its own copies now.
            drop((report_wr, stdio_held, notify, parent));
            let mut limits = limits;
            if let Some(c) = limits.cgroups.as_mut() {
                c.release_fds();
            }
            let sandbox = Sandbox {
                pid,
                pidfd: Some(pidfd),
                report: Some(report_rd),
                plan: prepared.plan,
                programs: std::iter::once(argv)
                    .chain(later.iter().map(Vec::as_slice))
                    .map(|argv| argv.first().map(|p| p.to_string_lossy().into_owned()))
                    .map(Option::unwrap_or_default)
                    .collect(),
                limits,
                enforcement,
                net: supervisor,
                renames,
                reaped: false,
                exiting: false,
                reap_in_background: true,
            };
            Ok((sandbox, started))
        }
    }
}

/// Clones the init of a long-lived sandbox sharing our memory until it executes its lean
/// self (`lean_init`), our thread suspended meanwhile: a fork would copy the page tables
/// of all of our memory, and the exec tear them down, at a cost that grows with the
/// caller (a server holding 10,000 sandboxes maps about 380 MB). Every signal is blocked
/// in this thread until then, so that none runs a handler of ours in the init; the init
/// resets them (`child::init_entry_shared`). Where the kernel refuses the clone, the init
/// is forked as usual. Returns as `sys::clone3_fork` does (never [`Forked::Child`] but in
/// that fallback), with `adopt` if the child is yet to use it.
fn clone_sharing_memory(
    prepared: &mut child::Prepared,
    adopt: Option<crate::own_table::Adopt>,
    flags: u64,
) -> Result<(Forked, Option<crate::own_table::Adopt>), sys::Errno> {
    let mut stack = vec![0u8; INIT_STACK];
    let all = sys::SigSet::full();
    let saved = sys::sigprocmask(libc::SIG_SETMASK, &all)?;
    let start = child::SharedInit {
        prepared: prepared as *mut child::Prepared,
        adopt,
    };
    tracing::debug!(
        flags,
        "clone into new namespaces, sharing memory until the lean exec"
    );
    // SAFETY: the child runs `child::init_entry_shared` on `stack`: as for the fork below,
    // only async-signal-safe calls, ending in `execve` or `_exit`; besides, it resets our
    // signal handlers before it unblocks any, writes nothing of ours but `prepared` (which
    // we leave alone until it has exec'd or exited: we are suspended) and its stack, and
    // changes nothing the memory map carries (`Prepared::shares_caller_memory`). The
    // namespace flags fit the C int of clone(2).
    let cloned = unsafe {
        sys::spawn_vfork_into(
            &mut stack,
            child::init_entry_shared,
            &start,
            flags as libc::c_int,
        )
    };
    let _ = sys::sigprocmask(libc::SIG_SETMASK, &saved);
    let adopt = start.adopt;
    match cloned {
        Ok((pid, pidfd)) => Ok((Forked::Parent { pid, pidfd }, None)),
        Err(errno) => {
            tracing::debug!(
                errno = errno.0,
                "clone sharing memory refused: forking the init"
            );
            prepared.shares_caller_memory = false;
            // SAFETY: as in `launch`.
            unsafe { sys::clone3_fork(flags) }.map(|forked| (forked, adopt))
        }
    }
}

/// What [`launch`] keeps of a root template until the clone.
struct TemplateUse {
    /// Held for its namespaces, which the go-between joins.
    _template: Arc<crate::template::Template>,
    /// The host's `/proc`, for the init (`child::FromTemplate::host_proc`).
    host_proc: OwnedFd,
    /// The ids' maps to ours, for building the root instead.
    maps: (Vec<u8>, Vec<u8>),
}

/// Makes `prepared` a sandbox whose root is copied from its plan's template, if the plan
/// has one (`template::for_plan`) and templates are on: the sandbox's ids then map to the
/// template's, which map to ours.
fn use_template(
    prepared: &mut child::Prepared,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> Option<TemplateUse> {
    if !crate::template::enabled() {
        return None;
    }
    let template = crate::template::for_plan(&prepared.plan, &prepared.uid_map, &prepared.gid_map)?;
    let host_proc = match sys::open(c"/proc", libc::O_PATH | libc::O_DIRECTORY, 0) {
        // SAFETY: just opened, ours alone.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(errno) => {
            tracing::warn!(errno = errno.0, "opening /proc: building the root");
            return None;
        }
    };
    let maps = (
        std::mem::replace(
            &mut prepared.uid_map,
            format!("{uid} {uid} 1\n").into_bytes(),
        ),
        std::mem::replace(
            &mut prepared.gid_map,
            format!("{gid} {gid} 1\n").into_bytes(),
        ),
    );
    prepared.template = Some(child::FromTemplate {
        user_ns: template.user_ns(),
        mount_ns: template.mount_ns(),
        host_proc: host_proc.as_raw_fd(),
        instance: template.instance.clone(),
    });
    Some(TemplateUse {
        _template: template,
        host_proc,
        maps,
    })
}

/// Clones the init into a copy of its template's root (`Prepared::template`), through a
/// go-between that shares our memory and descriptor table (`child::go_between`), every
/// signal blocked in this thread meanwhile (as in [`clone_sharing_memory`]). The init is
/// our child (`CLONE_PARENT`), cloned sharing our memory as `clone_sharing_memory` would
/// if `prepared.shares_caller_memory`, else forked. Gives `adopt` back if nothing used
/// it (for building the root instead).
fn clone_from_template(
    prepared: &mut child::Prepared,
    adopt: Option<crate::own_table::Adopt>,
    flags: u64,
) -> (
    Result<Forked, TemplateError>,
    Option<crate::own_table::Adopt>,
) {
    let Some((user_ns, mount_ns)) = prepared.template.as_ref().map(|t| (t.user_ns, t.mount_ns))
    else {
        return (Err(Unused(sys::Errno(libc::EINVAL))), adopt);
    };
    let mut init_stack = match prepared.shares_caller_memory {
        true => vec![0u8; INIT_STACK],
        false => Vec::new(),
    };
    let mut stack = vec![0u8; GO_BETWEEN_STACK];
    let between = child::GoBetween {
        user_ns,
        mount_ns,
        flags,
        shared: prepared
            .shares_caller_memory
            .then_some((init_stack.as_mut_ptr(), init_stack.len())),
        init: child::SharedInit {
            prepared: prepared as *mut child::Prepared,
            adopt,
        },
        pid: AtomicI32::new(-1),
        pidfd: AtomicI32::new(-1),
        join_errno: AtomicI32::new(0),
        clone_errno: AtomicI32::new(0),
    };
    let all = sys::SigSet::full();
    let saved = match sys::sigprocmask(libc::SIG_SETMASK, &all) {
        Ok(saved) => saved,
        Err(errno) => return (Err(Unused(errno)), between.init.adopt),
    };
    tracing::debug!(flags, "clone into a copy of a root template");
    // SAFETY: the go-between runs `child::go_between` on `stack`: only async-signal-safe
    // calls, no allocation; it writes nothing of ours but the atomics of `between` (and,
    // through the init it may fork or clone, what `launch`'s clones may), closes nothing of
    // ours and ends in `exit`. We are suspended until it exits, every signal blocked, so
    // `stack`, `init_stack`, `between` and `prepared` outlive its use of them.
    let spawned =
        unsafe { sys::spawn_vfork_sharing_table(&mut stack, child::go_between, &between) };
    let _ = sys::sigprocmask(libc::SIG_SETMASK, &saved);
    drop(init_stack);
    let child::GoBetween {
        pid,
        pidfd,
        join_errno,
        clone_errno,
        init,
        ..
    } = between;
    let go_between = match spawned {
        Ok(go_between) => go_between,
        Err(errno) => return (Err(Unused(errno)), init.adopt),
    };
    // It has exited (or we would still be suspended); a process that reaps every child
    // may have reaped it already.
    let _ = sys::wait4(go_between);
    let (pid, pidfd) = (pid.into_inner(), pidfd.into_inner());
    match (join_errno.into_inner(), clone_errno.into_inner()) {
        (0, 0) if pid > 0 && pidfd >= 0 => (
            Ok(Forked::Parent {
                pid,
                // SAFETY: the init's clone made it in the table we share with the
                // go-between, for us alone.
                pidfd: unsafe { OwnedFd::from_raw_fd(pidfd) },
            }),
            None,
        ),
        (0, 0) => (Err(Unused(sys::Errno(libc::ECHILD))), init.adopt),
        // Out of processes, memory or namespaces: so would a root built here be.
        (0, errno @ (libc::EAGAIN | libc::ENOMEM | libc::ENOSPC | libc::EUSERS)) => {
            (Err(TemplateError::Clone(sys::Errno(errno))), init.adopt)
        }
        (0, errno) | (errno, _) => (Err(Unused(sys::Errno(errno))), init.adopt),
    }
}

/// Why [`clone_from_template`] made no init.
enum TemplateError {
    /// The template could not be used (its namespaces not joined, the clone refused): the
    /// root is built instead, and templates are off from then on.
    Unused(sys::Errno),
    /// The init's clone failed as any would here (out of processes, say).
    Clone(sys::Errno),
}
use TemplateError::Unused;

/// Refuses an image root on a kernel whose overlayfs lacks `userxattr` (Linux 5.11): an
/// unprivileged overlay mount takes no other kind of xattr, and the layers' opaque
/// directories are marked with `user.overlay.opaque`.
fn overlay_userxattr() -> Result<(), SetupError> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim();
    if kernel_version(release) < (5, 11) {
        return Err(SetupError::FeatureMissing {
            feature: "overlayfs userxattr",
            problem: format!("is not in this kernel ({release}; Linux 5.11 or newer has it)"),
            needed_for: "an image root (its layers' whiteouts and opaque directories)",
        });
    }
    Ok(())
}

/// (major, minor) of a kernel release string (`6.1.0-18-amd64`); (0, 0) if unreadable.
fn kernel_version(release: &str) -> (u32, u32) {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The command `argv` as the child executes it.
fn command(argv: &[OsString], path_var: &str) -> Result<child::Command, SetupError> {
    let program = argv.first().ok_or_else(no_command)?;
    Ok(child::Command {
        exec_candidates: exec_candidates(program, path_var),
        argv: CStringArray::new(argv.iter().map(|a| cstring(a.as_bytes())).collect()),
    })
}

/// Views are mounted `volatile` (see `plan`): overlayfs then refuses a later mount of the
/// same upper and work directories until the mark it leaves in the work directory is gone.
/// The work directory is overlayfs's scratch space, and what the upper holds is as durable
/// as its user made it (a kept branch is synced), so lockbox removes the mark.
fn clear_volatile_mark(upper: Option<&resolve::ResolvedUpper>) -> Result<(), SetupError> {
    let Some(upper) = upper.filter(|u| u.bound.is_none()) else {
        return Ok(());
    };
    let mark = upper
        .parent
        .join(&upper.work_name)
        .join("work/incompat/volatile");
    match std::fs::remove_dir_all(&mark) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SetupError::Path {
            path: mark,
            what: "clearing overlayfs's volatile mark",
            source: e,
        }),
        _ => Ok(()),
    }
}

pub(crate) fn no_command() -> SetupError {
    SetupError::Path {
        path: "".into(),
        what: "running",
        source: std::io::Error::other("no command given"),
    }
}

/// Every descriptor to hand in must be open in the caller.
fn check_pass_fds(fds: &[RawFd]) -> Result<(), SetupError> {
    match fds
        .iter()
        .find(|fd| !Path::new(&format!("/proc/self/fd/{fd}")).exists())
    {
        Some(fd) => Err(SetupError::Path {
            path: format!("fd {fd}").into(),
            what: "passing",
            source: std::io::Error::from_raw_os_error(libc::EBADF),
        }),
        None => Ok(()),
    }
}

/// The report socket: (our non-blocking read end, the init's write end).
fn report_channel() -> Result<(OwnedFd, OwnedFd), SetupError> {
    let err = |errno| SetupError::Supervise {
        what: "creating the report socket",
        errno,
    };
    let (rd, wr) = sys::seqpacket_pair().map_err(err)?;
    // Records are read as they come; the init may still be exiting after the last one.
    sys::set_nonblocking(rd.as_fd()).map_err(err)?;
    Ok((rd, wr))
}

/// For a network list: checks the kernel, starts the supervisor thread, and returns it
/// with the child's end of the socket the command announces its filter on.
fn start_net_supervisor(
    resolved: &resolve::Resolved,
    net: NetHooks,
) -> Result<(Option<Supervisor>, Option<OwnedFd>), SetupError> {
    let Some((kind, rules)) = resolved.net_rules.clone() else {
        return Ok((None, None));
    };
    let host_cookie = netsup::probe()?;
    let (ours, theirs) = sys::seqpacket_pair().map_err(|errno| SetupError::Supervise {
        what: "creating the network supervisor socket",
        errno,
    })?;
    let rules = NetRules {
        list: netsup::NetList {
            kind,
            rules,
            names: resolved.net_names.clone(),
        },
        hosts_file: resolved.net_hosts_file.clone(),
        interceptor: net.interceptor,
        // Under a network list the renames (when the filter hands them over) come here: as
        // unprivileged, this thread keeps no capability to move entries with.
        pass_on: Some(PassOn {
            wants: dirmove::is_rename,
            handle: |listener, notif| dirmove::handle(listener, notif, false),
        }),
    };
    let supervisor = netsup::start(rules, net.audit, net.ask, host_cookie, ours)?;
    Ok((Some(supervisor), Some(theirs)))
}

/// Whether directory renames go to a supervisor (`dirmove`): in a sandbox with a writable
/// overlay view. A view with a `writable` scope is left alone: rebuilding a directory
/// outside the scope, for a call Landlock then refuses, would be a write outside it.
fn renames_supervised(resolved: &resolve::Resolved) -> bool {
    let views = || resolved.overlays.iter().filter(|o| o.upper.is_some());
    views().next().is_some() && views().all(|o| o.writable.is_none())
}

/// Starts the directory rename supervisor (when no network supervisor takes the calls) and
/// returns it with the child's end of the socket the command announces its filter on.
fn start_rename_supervisor() -> Result<(Option<dirmove::Supervisor>, Option<OwnedFd>), SetupError> {
    let (ours, theirs) = sys::seqpacket_pair().map_err(|errno| SetupError::Supervise {
        what: "creating the rename supervisor socket",
        errno,
    })?;
    Ok((Some(dirmove::start(ours)?), Some(theirs)))
}

/// Puts the interceptor's CA into the sandbox's view of the system trust store (files of
/// lockbox's own `/etc`, an overlay whose top layer lives in the sandbox's memory: the
/// host's trust store is never written).
fn add_trust(
    resolved: &mut resolve::Resolved,
    interceptor: &dyn netsup::Interceptor,
) -> Result<(), SetupError> {
    if !matches!(
        resolved.net_rules,
        Some((lockbox_policy::ListKind::Allow, _))
    ) {
        return Err(SetupError::Intercept {
            reason:
                "intercepted names must be allowed by name in a network allow-list (--net-allow)",
        });
    }
    if resolved.etc_hidden.is_none() {
        return Err(SetupError::Intercept {
            reason: "the sandbox must see lockbox's own /etc (the default reads, /etc not granted itself) to trust lockbox's CA",
        });
    }
    let files = netsup::trust_files(interceptor.ca_pem(), Path::new("/etc"));
    for (name, data) in files {
        resolved.etc_files.retain(|(n, _)| *n != name);
        resolved.etc_files.push((name, data));
    }
    Ok(())
}

/// The namespaces a new sandbox is cloned into. The cgroup namespace is entered later,
/// after joining the cgroups; an own network namespace is made by the init's helper,
/// alongside the root's set-up (`child::start_helper`).
const CLONE_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// Runs `argv` to completion under `policy`, enforcing its timeout.
pub fn run(policy: &Policy, argv: &[OsString]) -> Result<Outcome, SetupError> {
    let mut running = Spawn::command(policy, argv).start()?;
    let deadline = policy.timeout.map(|t| running.run.started + t);
    match running.wait(deadline, None)? {
        Waited::Exited(outcome) => Ok(outcome),
        Waited::Deadline | Waited::Extra => running.stop(policy.kill_grace, StopReason::Timeout),
    }
}

impl Running {
    /// The pid of the sandbox's init, as seen by the caller.
    pub fn pid(&self) -> libc::pid_t {
        self.sandbox.pid
    }

    /// Pauses every process of the sandbox until the result is dropped (see
    /// [`crate::freeze_tree`]).
    pub fn freeze(&self, timeout: std::time::Duration) -> std::io::Result<crate::Frozen> {
        self.sandbox.freeze(timeout)
    }

    /// What the sandbox's processes use now (see [`crate::tree_usage`]).
    pub fn usage(&self) -> std::io::Result<crate::TreeUsage> {
        self.sandbox.usage()
    }

    /// Puts `net`'s list in force in the running sandbox (see [`Parked::replace_net`]).
    pub fn replace_net(&self, net: &Net) -> Result<lockbox_netsup::NetList, NetUpdateError> {
        self.sandbox.replace_net(net)
    }

    /// Lets go of the two descriptors that follow the command to its outcome, the init's
    /// pidfd and its report socket, for a long-lived sandbox whose outcome nobody reads: a
    /// server holding thousands of sandboxes would otherwise spend two of its descriptors
    /// on each (issue 34). What the init reports from now on is lost; stopping the sandbox
    /// ([`Parked::stop`], or dropping it) still kills every process in it and reaps the
    /// init.
    pub fn park(self) -> Parked {
        let Running {
            mut sandbox,
            run: _,
        } = self;
        sandbox.pidfd = None;
        sandbox.report = None;
        Parked { sandbox }
    }

    /// Drops the sandbox like `drop`, but for a caller about to exit (the CLI): an init
    /// still exiting is left to the kernel (its zombie goes to the caller's own reaper when
    /// the caller exits) instead of a thread started to reap it, ~0.1 ms of a short run.
    pub fn drop_before_exit(mut self) {
        self.sandbox.reap_in_background = false;
    }

    /// Drops the sandbox like `drop`, but waits on this thread for its init to be gone
    /// (reaped) instead of starting a thread to reap it: for a caller with a thread of its
    /// own for the sandbox, and nothing else to do (the pre-arm helper's).
    pub fn drop_and_reap(mut self) {
        let sandbox = &mut self.sandbox;
        if sandbox.reaped {
            return;
        }
        sandbox.let_go();
        if sys::wait4(sandbox.pid).is_ok() {
            sandbox.reaped = true;
        }
    }

    /// The directory the command starts in, inside the sandbox.
    pub fn cwd(&self) -> &Path {
        Path::new(OsStr::from_bytes(self.sandbox.plan.cwd.as_bytes()))
    }

    /// What confines this sandbox.
    pub fn enforcement(&self) -> &Enforcement {
        &self.sandbox.enforcement
    }

    /// Sends `sig` to the sandbox. The init forwards it to the command; SIGTERM goes to
    /// every process in the sandbox.
    pub fn signal(&self, sig: libc::c_int) -> Result<(), SetupError> {
        self.sandbox.signal(sig)
    }

    /// Waits until the sandbox ends, `deadline` passes or `extra` becomes readable.
    /// `Err` means the sandbox could not be set up.
    pub fn wait(
        &mut self,
        deadline: Option<Instant>,
        extra: Option<BorrowedFd<'_>>,
    ) -> Result<Waited, SetupError> {
        // A hung-up socket polls readable forever: once the init's end is closed (it is
        // dying) and drained, only the pidfd can tell us more. Polling the report past that
        // spun a core through the kernel's teardown of the namespaces (issue 21: ~7 ms of
        // CPU per stopped sandbox, taken from the next sandbox's start on a small machine).
        let mut report_open = self.sandbox.report.is_some();
        if self.sandbox.pidfd.is_none() {
            self.sandbox.pidfd = Some(self.sandbox.open_pidfd()?);
        }
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Waited::Deadline);
                    }
                    // Too far off to say: no deadline.
                    Timespec::try_from(left).ok()
                }
            };
            let sandbox = &self.sandbox;
            let Some(pidfd) = sandbox.pidfd.as_ref().map(AsFd::as_fd) else {
                return Err(SetupError::InitDied("its pidfd is gone".into()));
            };
            let report = sandbox.report.as_ref().map(AsFd::as_fd);
            let mut fds = [
                PollFd::from_borrowed_fd(pidfd, PollFlags::IN),
                // Once hung up (or never held: parked), the report's slot watches the pidfd.
                PollFd::from_borrowed_fd(
                    report.filter(|_| report_open).unwrap_or(pidfd),
                    PollFlags::IN,
                ),
                PollFd::from_borrowed_fd(extra.unwrap_or(pidfd), PollFlags::IN),
            ];
            let fds = &mut fds[..if extra.is_some() { 3 } else { 2 }];
            match rustix::event::poll(fds, timeout.as_ref()) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(SetupError::Supervise {
                        what: "waiting for the sandbox",
                        errno: Errno(e.raw_os_error()),
                    })
                }
                Ok(_) => {}
            }
            let ready = |i: usize| fds.get(i).is_some_and(|fd| !fd.revents().is_empty());
            let (init_exited, reported, extra_ready) =
                (ready(0), report_open && ready(1), ready(2));
            let hung_up = fds[1].revents().intersects(PollFlags::HUP | PollFlags::ERR);
            if reported {
                self.run.read_records(self.sandbox.report.as_ref());
                // The init reports the status only after reaping every process, so the
                // sandbox (or the command of a sequence) is over; its namespaces are torn
                // down while we go on. With cgroups we wait for that, to read their
                // counters and remove them — unless more commands follow.
                if self.run.status.is_some()
                    && (self.sandbox.limits.cgroups.is_none() || !self.is_last())
                {
                    return self.finish(None).map(Waited::Exited);
                }
                // Records still queued after a status are read once the init is reaped.
                report_open = !hung_up;
            }
            if init_exited {
                let (status, usage) =
                    sys::wait4(self.sandbox.pid).map_err(|errno| SetupError::Supervise {
                        what: "reaping the sandbox init",
                        errno,
                    })?;
                self.sandbox.reaped = true;
                // The init has exited, so the socket is at EOF after whatever it wrote.
                self.run.read_records(self.sandbox.report.as_ref());
                let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
                self.run.usage.get_or_insert((
                    tv(usage.ru_utime) + tv(usage.ru_stime),
                    usage.ru_maxrss.max(0) as u32,
                ));
                return self.finish(Some(status)).map(Waited::Exited);
            }
            if extra_ready {
                return Ok(Waited::Extra);
            }
        }
    }

    /// Stops the sandbox: SIGTERM to every process in it, SIGKILL after `grace`. The
    /// outcome says why it was stopped.
    pub fn stop(&mut self, grace: Duration, reason: StopReason) -> Result<Outcome, SetupError> {
        self.run.timed_out |= reason == StopReason::Timeout;
        let _ = self.signal(libc::SIGTERM);
        if let Waited::Exited(outcome) = self.wait(Some(Instant::now() + grace), None)? {
            return Ok(outcome);
        }
        // Killing pid 1 of the namespace kills every process in it.
        let _ = self.signal(libc::SIGKILL);
        match self.wait(None, None)? {
            Waited::Exited(outcome) => Ok(outcome),
            Waited::Deadline | Waited::Extra => {
                Err(SetupError::InitDied("did not exit after SIGKILL".into()))
            }
        }
    }

    /// After the outcome of a command of a [`Spawn::sequence`] sandbox: the sandbox, its
    /// next command waiting for the go, or `None` if no command follows or the sandbox has
    /// ended (killed after a stop's grace). A sandbox that failed between two commands
    /// reports it from the next command's [`Running::wait`].
    pub fn next(self) -> Option<Gated> {
        let Running { sandbox, run } = self;
        if !run.done || sandbox.reaped || run.step + 1 >= sandbox.programs.len() {
            return None;
        }
        Some(Gated {
            step: run.step + 1,
            cpu_before: run.usage.map_or(run.cpu_before, |(cpu, _)| cpu),
            sandbox,
        })
    }

    /// Whether the current command is the sandbox's last.
    fn is_last(&self) -> bool {
        self.run.step + 1 >= self.sandbox.programs.len()
    }

    /// Builds the outcome from the records (and the init's wait status, once reaped).
    /// In a sequence, of the current command: its CPU time and OOM kills; the peak memory
    /// is the sandbox's so far.
    fn finish(&mut self, init_status: Option<libc::c_int>) -> Result<Outcome, SetupError> {
        let last = self.is_last();
        let (sandbox, run) = (&mut self.sandbox, &mut self.run);
        run.done = true;
        sandbox.exiting = last;
        let wall = run.started.elapsed();
        let oom_killed = sandbox.oom_kills() > run.oom_kills_before;
        let (cpu_us, max_rss_kb) = run.usage.unwrap_or_default();
        let cpu_us = cpu_us.saturating_sub(run.cpu_before);
        let peak_memory = match sandbox
            .limits
            .cgroups
            .as_ref()
            .and_then(|c| c.peak_memory())
        {
            Some(bytes) => Some((bytes, "cgroup")),
            None if max_rss_kb > 0 => Some((u64::from(max_rss_kb) * 1024, "max-rss")),
            None => None,
        };
        // A sequence whose init lives on keeps its cgroups for the next command.
        if last || init_status.is_some() {
            if let Some(c) = sandbox.limits.cgroups.as_mut() {
                c.remove();
            }
        }
        let killed_by = init_status
            .filter(|s| libc::WIFSIGNALED(*s))
            .map(|s| libc::WTERMSIG(s));
        let status = match (run.failure, run.status, killed_by) {
            (
                Some(Record::Failed {
                    step: Step::Exec,
                    errno,
                    ..
                }),
                _,
                _,
            ) => Status::ExecFailed(errno),
            (Some(Record::Failed { step, errno, index }), _, _) => {
                return Err(sandbox.setup_error(run.step, step, Errno(errno), index as usize))
            }
            (_, Some(Record::Exited(code)), _) => Status::Exited(code),
            (_, Some(Record::Signaled(sig)), _) => Status::Signaled(sig),
            // Killed from outside before the command ended: after the stop's grace period,
            // or by the OOM killer, which may pick any process of the sandbox.
            _ if oom_killed => Status::Signaled(libc::SIGKILL),
            (_, _, Some(sig)) => Status::Signaled(sig),
            _ => {
                return Err(SetupError::InitDied(format!(
                    "exit status {}",
                    init_status.map_or(-1, |s| libc::WEXITSTATUS(s))
                )))
            }
        };
        // After its last command nothing of the sandbox is left to rename anything.
        if last {
            drop(sandbox.renames.take());
        }
        Ok(Outcome {
            status,
            timed_out: run.timed_out,
            oom_killed,
            wall,
            cpu: Duration::from_micros(cpu_us),
            peak_memory,
            enforcement: sandbox.enforcement.clone(),
            net: sandbox.net.take().map(|s| Box::new(s.finish())),
            upper_mounts: std::mem::take(&mut run.upper_mounts),
        })
    }
}

impl Parked {
    /// The pid of the sandbox's init, as seen by the caller. It cannot name another process
    /// while this value lives: the init is the caller's child, reaped only by it.
    pub fn pid(&self) -> libc::pid_t {
        self.sandbox.pid
    }

    /// Pauses every process of the sandbox until the result is dropped (see
    /// [`crate::freeze_tree`]).
    pub fn freeze(&self, timeout: std::time::Duration) -> std::io::Result<crate::Frozen> {
        self.sandbox.freeze(timeout)
    }

    /// What the sandbox's processes use now (see [`crate::tree_usage`]).
    pub fn usage(&self) -> std::io::Result<crate::TreeUsage> {
        self.sandbox.usage()
    }

    /// Puts `net`'s list in force in the running sandbox, resolved as at the start (a
    /// deny-list's names are resolved now; the sandbox's `/etc/hosts`, which pinned the
    /// first list's names, is not rewritten): see [`lockbox_netsup::Supervisor::replace`]
    /// for what changes and what stays. Only a sandbox started with a list has a supervisor
    /// to take another. [`Net::None`] becomes an allow-list of nothing (the sandbox's own
    /// loopback only, as without a network); [`Net::Host`] cannot be had without a restart
    /// (the sandbox keeps its own network namespace). Returns the list now in force.
    pub fn replace_net(&self, net: &Net) -> Result<lockbox_netsup::NetList, NetUpdateError> {
        self.sandbox.replace_net(net)
    }

    /// Stops the sandbox as [`Running::stop`] does — SIGTERM to every process in it,
    /// SIGKILL after `grace` — and reaps its init. There is no outcome to tell: the init's
    /// report went unread.
    pub fn stop(self, grace: Duration) -> Result<(), SetupError> {
        let mut running = Running {
            run: Run::new(0, Instant::now(), 0, 0),
            sandbox: self.sandbox,
        };
        match running.stop(grace, StopReason::Requested) {
            // Without its report, an init that exited by itself reads as one that died.
            Ok(_) | Err(SetupError::InitDied(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Run {
    /// Reads the records the sandbox has sent so far, up to this command's status.
    fn read_records(&mut self, report: Option<&OwnedFd>) {
        let Some(report) = report.map(AsFd::as_fd) else {
            return;
        };
        let mut buf = [0u8; RECORD_LEN];
        while let Ok((RECORD_LEN, fd)) = sys::recv_with_fd(report, &mut buf) {
            match Record::decode(&buf) {
                Some(Record::Upper { overlay }) => {
                    if let Some(mount) = fd {
                        self.upper_mounts.push(UpperMount {
                            overlay: overlay as usize,
                            mount: std::sync::Arc::new(mount),
                        });
                    }
                }
                Some(r @ Record::Failed { .. }) => {
                    self.failure.get_or_insert(r);
                }
                Some(Record::Usage { cpu_us, max_rss_kb }) => {
                    self.usage = Some((cpu_us, max_rss_kb))
                }
                Some(r) => {
                    // What follows a status belongs to the next command of a sequence.
                    self.status = Some(r);
                    return;
                }
                None => {}
            }
        }
    }
}

impl Sandbox {
    fn freeze(&self, timeout: std::time::Duration) -> std::io::Result<crate::Frozen> {
        crate::freeze_tree(self.pid, timeout)
    }

    fn usage(&self) -> std::io::Result<crate::TreeUsage> {
        crate::tree_usage(self.pid)
    }

    fn replace_net(&self, net: &Net) -> Result<lockbox_netsup::NetList, NetUpdateError> {
        let supervisor = self.net.as_ref().ok_or(NetUpdateError::NoSupervisor)?;
        let list = match net {
            Net::Host => return Err(NetUpdateError::HostNetwork),
            Net::None => lockbox_netsup::NetList {
                kind: lockbox_policy::ListKind::Allow,
                rules: Vec::new(),
                names: Vec::new(),
            },
            Net::Allow(_) | Net::Deny(_) => resolve::net_list(net)
                .map_err(NetUpdateError::Resolve)?
                .ok_or(NetUpdateError::HostNetwork)?,
        };
        supervisor.replace(list.clone())?;
        Ok(list)
    }

    fn signal(&self, sig: libc::c_int) -> Result<(), SetupError> {
        let opened;
        let pidfd = match &self.pidfd {
            Some(fd) => fd.as_fd(),
            None => {
                opened = self.open_pidfd()?;
                opened.as_fd()
            }
        };
        sys::pidfd_send_signal(pidfd, sig).map_err(|errno| SetupError::Supervise {
            what: "signalling the sandbox",
            errno,
        })
    }

    /// A new pidfd of the init (parked, it holds none). Opening it by pid is safe while the
    /// init is not reaped: it is this process's child, reaped only here, so its pid (a
    /// zombie's, at worst) cannot name another process.
    fn open_pidfd(&self) -> Result<OwnedFd, SetupError> {
        let pid = rustix::process::Pid::from_raw(self.pid).filter(|_| !self.reaped);
        pid.ok_or(rustix::io::Errno::SRCH)
            .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()))
            .map_err(|e| SetupError::Supervise {
                what: "opening the sandbox init's pidfd",
                errno: Errno(e.raw_os_error()),
            })
    }

    /// How many processes of the sandbox the OOM killer has killed so far (cgroup only).
    fn oom_kills(&self) -> u64 {
        self.limits.cgroups.as_ref().map_or(0, |c| c.oom_kills())
    }

    /// The ops of command `command` ([`SetupPlan::steps`] for a sequence's later ones).
    fn ops(&self, command: usize) -> &[crate::plan::Op] {
        match command {
            0 => &self.plan.ops,
            n => self.plan.steps.get(n - 1).map_or(&[], |s| &s.ops),
        }
    }

    /// The error of setup `step` of command `command`.
    fn setup_error(&self, command: usize, step: Step, errno: Errno, index: usize) -> SetupError {
        let detail = match step {
            Step::CaptureSource => self
                .plan
                .sources
                .get(index)
                .map(|s| format!(" {}", s.host.to_string_lossy())),
            Step::Mount => self.ops(command).get(index).map(|op| format!(" ({op})")),
            Step::LandlockRule => self
                .plan
                .rules
                .get(index)
                .map(|r| format!(" {}", r.path.to_string_lossy())),
            Step::Chdir => Some(format!(" {}", self.plan.cwd.to_string_lossy())),
            Step::LimitUserQuota => self
                .limits
                .user_sysctls
                .get(index)
                .map(|(path, _)| format!(" {}", path.to_string_lossy())),
            Step::Exec => self.programs.get(command).map(|p| format!(" {p}")),
            _ => None,
        };
        if step == Step::Mount && errno.0 == libc::EINVAL {
            if let Some(crate::plan::Op::Mount { fstype, .. }) = self.ops(command).get(index) {
                if fstype.as_bytes() == b"overlay" {
                    return SetupError::FeatureMissing {
                        feature: "overlayfs in user namespaces",
                        // EINVAL is both "too old" and "a layer holds a file bind mount".
                        problem: "refused the mount (Linux 5.11 or newer is required, and no file may be bind-mounted inside a layer, as Docker does with /etc/hosts)".into(),
                        needed_for: "hiding the secrets of /etc (or use --no-default-reads)",
                    };
                }
            }
        }
        if matches!(step, Step::CaptureSource) && errno.0 == libc::ENOSYS {
            return SetupError::FeatureMissing {
                feature: "the new mount API (open_tree, mount_setattr)",
                problem: "is not available (Linux 5.12 or newer is required)".into(),
                needed_for: "building the sandbox root",
            };
        }
        SetupError::Step {
            step: step.describe(),
            detail: detail.unwrap_or_default(),
            errno,
            code: step,
        }
    }
}

impl Sandbox {
    /// Ends an unreaped sandbox without waiting for it: closes the report socket (an init
    /// that lingers after its report, a pre-armed sandbox's, exits once it is closed) and
    /// kills one that is not exiting by itself — gated, running, or between two commands
    /// of a sequence (waiting for a go that will not come). Killing pid 1 of the namespace
    /// kills every process in it.
    fn let_go(&mut self) {
        self.report = None;
        if !self.exiting {
            let _ = self.signal(libc::SIGKILL);
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.let_go();
        if sys::try_reap(self.pid) || !self.reap_in_background {
            return;
        }
        // The init is exiting (the kernel is tearing its namespaces down); reap it without
        // making the caller wait. If the process exits first, the zombie goes to its reaper.
        let pid = self.pid;
        let reaper = std::thread::Builder::new()
            .name("lockbox-reap".into())
            .spawn(move || sys::wait4(pid));
        if reaper.is_err() {
            let _ = sys::wait4(pid);
        }
    }
}

/// Namespaces a sandbox gets under `net`.
pub fn namespaces(net: &Net) -> Vec<&'static str> {
    let mut ns = vec!["user", "mount", "pid", "ipc", "uts"];
    if net.own_namespace() {
        ns.push("net");
    }
    if Path::new("/proc/self/ns/cgroup").exists() {
        ns.push("cgroup");
    }
    ns
}

/// Where `execve` looks for `program`, in order (as execvp does with `PATH`).
pub(crate) fn exec_candidates(program: &OsStr, path_var: &str) -> Vec<CString> {
    if program.as_bytes().contains(&b'/') {
        return vec![cstring(program.as_bytes())];
    }
    path_var
        .split(':')
        .map(|dir| if dir.is_empty() { "." } else { dir })
        .map(|dir| {
            let mut bytes = dir.as_bytes().to_vec();
            bytes.push(b'/');
            bytes.extend_from_slice(program.as_bytes());
            cstring(&bytes)
        })
        .collect()
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_root_needs_linux_5_11_for_overlay_userxattr() {
        assert!(kernel_version("5.10.0-28-amd64") < (5, 11));
        assert!(kernel_version("5.11.0") >= (5, 11));
        assert!(kernel_version("6.18.44-fc-v669") >= (5, 11));
        assert!(kernel_version("") < (5, 11));
    }

    #[test]
    fn exec_candidates_follow_path_order() {
        let c = exec_candidates(OsStr::new("ls"), "/usr/local/bin:/usr/bin");
        assert_eq!(
            c,
            vec![c"/usr/local/bin/ls".to_owned(), c"/usr/bin/ls".to_owned()]
        );
        let c = exec_candidates(OsStr::new("./run.sh"), "/usr/bin");
        assert_eq!(c, vec![c"./run.sh".to_owned()]);
    }

    #[test]
    fn the_network_enforcement_is_named_as_the_net_mode_and_explained_in_prose() {
        let json = |n: NetEnforcement| serde_json::to_value(n).unwrap_or_default();
        assert_eq!(json(NetEnforcement::of(&Net::None)), "none");
        assert_eq!(json(NetEnforcement::of(&Net::Host)), "host");
        assert_eq!(json(NetEnforcement::of(&Net::Allow(vec![]))), "allow_list");
        assert_eq!(json(NetEnforcement::of(&Net::Deny(vec![]))), "deny_list");
        // What `lockbox check` prints.
        assert_eq!(
            NetEnforcement::LoopbackOnly.to_string(),
            "none (loopback only)"
        );
        assert!(NetEnforcement::DenyList
            .to_string()
            .starts_with("deny-list (own namespace; seccomp user notification"));
    }

    #[test]
    fn exit_codes_follow_the_conventions() {
        let outcome = |status, timed_out| Outcome {
            status,
            timed_out,
            oom_killed: false,
            wall: Duration::ZERO,
            cpu: Duration::ZERO,
            peak_memory: None,
            enforcement: Enforcement {
                namespaces: vec![],
                uid: 0,
                gid: 0,
                landlock_abi: None,
                seccomp_denied_syscalls: 0,
                no_new_privs: true,
                limits: LimitMechanisms::default(),
                user_quotas: Box::default(),
                network: NetEnforcement::LoopbackOnly,
            },
            net: None,
            upper_mounts: Vec::new(),
        };
        assert_eq!(outcome(Status::Exited(3), false).exit_code(), 3);
        assert_eq!(outcome(Status::Signaled(9), false).exit_code(), 137);
        assert_eq!(outcome(Status::Signaled(15), true).exit_code(), 124);
        assert_eq!(
            outcome(Status::ExecFailed(libc::ENOENT), false).exit_code(),
            127
        );
        assert_eq!(
            outcome(Status::ExecFailed(libc::EACCES), false).exit_code(),
            126
        );
    }
}
