//! Unprivileged confinement: the only crate of lockbox that talks to the kernel about
//! isolation.
//!
//! [`Spawn`] starts a command in new user, mount, pid, net, ipc, uts and cgroup namespaces,
//! on a root built from a [`lockbox_policy::Policy`], behind Landlock and a seccomp filter,
//! with no capabilities and `no_new_privs`, under resource limits — at once, or gated until
//! [`Gated::release`] — and [`Running`] supervises it (wait with deadline, signal, stop with
//! grace) and yields an [`Outcome`]. [`run`] does all of it with the policy's timeout.
//! [`probe`] reports what the kernel supports.
//!
//! How it fits together: `resolve` reads the host paths a policy names, `plan` turns them
//! into a [`SetupPlan`] (pure data, printed by `lockbox check --explain`), `child` carries
//! the plan out in the new namespaces without allocating, and `report` carries failures
//! back as fixed-size records. A long-lived sandbox's init then re-executes itself small
//! (`lean_init`: [`main_if_init`]), so that it holds none of its caller's memory. The system calls are in `sys`, split by topic; those whose
//! safety depends on their caller (closing or replacing a descriptor, `clone` and `fork`)
//! are `unsafe fn`, called from `child`, `spawn` and [`agent_sys`] in `unsafe` blocks
//! that say why the call is sound. [`agent_sys`] gives the in-sandbox agent
//! (`lockbox-agent`) the few system calls it needs as a safe API that is sound whatever its
//! caller does, and
//! [`proc_stat`] parses `/proc/PID/stat` for every process-tree walk.
//!
//! Not here: the network supervisor of a sandbox with a network list (`lockbox-netsup`,
//! which [`Spawn`] starts; the filter that hands it the calls is here), the agent that
//! serves a long-lived sandbox from inside and its protocol (`lockbox-agent`), copy-on-write workspaces (`lockbox-cow`), long-lived sandboxes and
//! sessions (`lockbox-runtime`), and command-line parsing (`lockbox-cli`).
//!
//! ```no_run
//! use lockbox_policy::Policy;
//! let outcome = lockbox_confine::run(&Policy::default(), &["true".into()]).unwrap();
//! assert_eq!(outcome.exit_code(), 0);
//! ```
#![deny(missing_docs)]
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod agent_sys;
mod armed;
mod bpf;
#[allow(unsafe_code)]
mod child;
mod dirmove;
mod error;
mod freeze;
mod landlock;
#[allow(unsafe_code)]
mod lean_init;
mod limits;
mod loader;
mod netfilter;
#[allow(unsafe_code)]
mod own_table;
mod plan;
mod probe;
pub mod proc_stat;
mod proctitle;
mod quotas;
mod report;
mod resolve;
mod sched;
mod seccomp;
mod signals;
#[allow(unsafe_code)]
mod spawn;
#[allow(unsafe_code)]
mod sys;
#[allow(unsafe_code)]
mod sysnet;
#[allow(unsafe_code)]
mod template;
mod usage;
#[allow(unsafe_code)]
mod wiped;
#[allow(unsafe_code)]
mod zeroed;

pub use crate::armed::ArmedCommand;
pub use crate::error::{NetUpdateError, SetupError};
pub use crate::freeze::{freeze_tree, Frozen};
pub use crate::landlock::RuleAccess;
pub use crate::lean_init::{main_if_init, INIT_ARG};
pub use crate::limits::{LimitMechanisms, Mechanism};
pub use crate::own_table::reserve as reserve_spawn_slots;
pub use crate::plan::{Op, SetupPlan, StepPlan};
pub use crate::probe::{probe, Feature, KernelSupport};
pub use crate::proctitle::TITLE as INIT_TITLE;
pub use crate::quotas::{UserQuotas, SHARE_DIVISOR};
pub use crate::resolve::{
    resolve, resolve_with, Access, ImageRoot, Resolved, ResolvedImage, ResolvedOverlay,
    ResolvedUpper, RootUpper, MAX_IMAGE_LAYERS,
};
pub use crate::sched::{scheduling, Scheduling};
pub use crate::seccomp::{
    denied as denied_syscalls, Allowed, Denied, RefusedFamily, When, ID_NO_OPS,
    REFUSED_FAMILIES as REFUSED_SOCKET_FAMILIES, REVIEWED_ALLOWED as REVIEWED_ALLOWED_SYSCALLS,
};
pub use crate::signals::{
    ignored_signals, unignore_signals, ReceivedSignal, Signals, INHERITED_IGNORES,
};
pub use crate::spawn::{
    armed_unsupported, namespaces, run, sequence_unsupported, Armed, Enforcement, Gated, Held,
    NetEnforcement, Outcome, Parked, Running, Spawn, Status, Stdio, StopReason, UpperMount, Waited,
};
pub use crate::usage::{tree_usage, TreeUsage};
pub use crate::wiped::{wipe, WipedOnFork};
pub use crate::zeroed::ZeroOnFree;

/// Where [`Spawn::agent`] makes the agent executable visible inside the sandbox (a path of
/// lockbox's own `/dev`, bound read-only whatever the policy grants).
pub const AGENT_PATH: &str = plan::HELPER_PATH;

use lockbox_netsup::DNS_ADDR;

/// Builds the setup plan for `policy` as `lockbox run` would (for `lockbox check --explain`).
pub fn explain(policy: &lockbox_policy::Policy) -> Result<SetupPlan, SetupError> {
    policy.validate()?;
    let cwd = std::env::current_dir().ok();
    Ok(plan::build(&resolve::resolve(policy, cwd.as_deref())?))
}

/// [`explain`] for a sandbox on an image root ([`Spawn::image_root`]).
pub fn explain_image(
    policy: &lockbox_policy::Policy,
    image: &ImageRoot,
) -> Result<SetupPlan, SetupError> {
    policy.validate()?;
    let cwd = std::env::current_dir().ok();
    Ok(plan::build(&resolve::resolve_with(
        policy,
        Some(image),
        cwd.as_deref(),
    )?))
}
