//! Why a sandbox could not be set up. Every such failure makes `lockbox run` exit 125.

use crate::report::Step;
use crate::sys::Errno;
use lockbox_policy::ErrorCode;
use std::path::PathBuf;

/// A sandbox that could not be set up, with the step, path or kernel feature at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The policy itself is invalid.
    #[error(transparent)]
    Policy(#[from] lockbox_policy::PolicyError),
    /// A host path named by the policy is unusable.
    #[error("{what} {path}: {source}")]
    Path {
        /// The path.
        path: PathBuf,
        /// What lockbox was doing with it.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A kernel feature lockbox needs is missing or disabled.
    #[error("{feature} {problem} (needed for {needed_for})")]
    FeatureMissing {
        /// The feature.
        feature: &'static str,
        /// What is wrong with it, e.g. "is disabled (sysctl user.max_user_namespaces=0)".
        problem: String,
        /// What lockbox uses it for.
        needed_for: &'static str,
    },
    /// A hostname of a network list could not be resolved at sandbox start.
    #[error("resolving network spec {spec:?}: {source}")]
    NetName {
        /// The spec naming the host.
        spec: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The clone into new namespaces failed for another reason.
    #[error("creating the sandbox namespaces: {0}")]
    Clone(Errno),
    /// A step inside the new namespaces failed.
    #[error("{step}{detail}: {errno}")]
    Step {
        /// The step, described.
        step: &'static str,
        /// The path or mount involved, if any (with a leading space).
        detail: String,
        /// The errno.
        errno: Errno,
        /// The step code.
        code: Step,
    },
    /// The sandbox init died before reporting (killed from outside, or a bug).
    #[error("the sandbox init died during setup ({0})")]
    InitDied(String),
    /// The seccomp filter could not be built.
    #[error("building the seccomp filter: {0}")]
    Seccomp(String),
    /// Setting up cgroup limits failed.
    #[error("cgroup {path}: {what}: {source}")]
    Cgroup {
        /// The cgroup file or directory.
        path: PathBuf,
        /// What lockbox was doing.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Several commands cannot share one sandbox ([`crate::Spawn::sequence`]).
    #[error("cannot run the commands in one sandbox: {reason}")]
    Sequence {
        /// Why not.
        reason: &'static str,
    },
    /// A sandbox whose connections lockbox intercepts ([`crate::Spawn::interceptor`]) lacks
    /// what interception needs.
    #[error("cannot intercept the sandbox's connections: {reason}")]
    Intercept {
        /// Why not.
        reason: &'static str,
    },
    /// A pipe, signalfd or wait failed in the supervising process.
    #[error("{what}: {errno}")]
    Supervise {
        /// What lockbox was doing.
        what: &'static str,
        /// The errno.
        errno: Errno,
    },
}

impl SetupError {
    /// A stable identifier for machines.
    pub fn code(&self) -> ErrorCode {
        match self {
            SetupError::Policy(e) => e.code(),
            SetupError::Path { .. } => ErrorCode::BadPath,
            SetupError::FeatureMissing { .. } => ErrorCode::FeatureMissing,
            SetupError::NetName { .. } => ErrorCode::NetNameUnresolved,
            SetupError::Clone(_) => ErrorCode::CloneFailed,
            SetupError::Step { .. } => ErrorCode::SetupStepFailed,
            SetupError::InitDied(_) => ErrorCode::InitDied,
            SetupError::Seccomp(_) => ErrorCode::SeccompBuildFailed,
            SetupError::Cgroup { .. } => ErrorCode::CgroupFailed,
            SetupError::Sequence { .. } => ErrorCode::SequenceUnsupported,
            SetupError::Supervise { .. } => ErrorCode::SuperviseFailed,
            SetupError::Intercept { .. } => ErrorCode::InvalidPolicy,
        }
    }

    /// A hint for the user, where there is one.
    pub fn hint(&self) -> Option<String> {
        match self {
            SetupError::Step {
                code: Step::Mount | Step::CaptureSource,
                errno: Errno(libc::EPERM),
                ..
            } => Some("this often means /proc or /sys is partly hidden on the host (e.g. inside a container); run `lockbox check`".into()),
            SetupError::Step { code: Step::Chdir, .. } => {
                Some("the working directory must be inside a granted path; grant it with -r/-w or pick one with --cwd".into())
            }
            SetupError::FeatureMissing { .. } => Some("run `lockbox check` to see what this kernel supports".into()),
            SetupError::Clone(Errno(libc::EAGAIN))
            | SetupError::Step {
                code: Step::Helper,
                errno: Errno(libc::EAGAIN),
                ..
            } => Some(
                "no more processes: this user's RLIMIT_NPROC (ulimit -u, unless root) or the \
                 kernel's pid_max or threads-max is reached; stop sandboxes or processes, or \
                 raise the limit"
                    .into(),
            ),
            _ => None,
        }
    }
}

/// Turns a failed clone's errno into the missing feature, as bubblewrap does.
pub fn explain_clone_error(errno: Errno) -> SetupError {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).ok();
    let needed_for = "confining without privilege";
    match errno.0 {
        libc::EPERM | libc::EACCES | libc::ENOSPC => {
            if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
                return SetupError::FeatureMissing {
                    feature: "user namespaces",
                    problem: "are disabled (sysctl user.max_user_namespaces=0)".into(),
                    needed_for,
                };
            }
            if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
                return SetupError::FeatureMissing {
                    feature: "user namespaces",
                    problem: "are disabled for unprivileged users (sysctl kernel.unprivileged_userns_clone=0)".into(),
                    needed_for,
                };
            }
            if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
                == Some("1")
            {
                return SetupError::FeatureMissing {
                    feature: "user namespaces",
                    problem: "are restricted by AppArmor (sysctl kernel.apparmor_restrict_unprivileged_userns=1)".into(),
                    needed_for,
                };
            }
            if errno.0 == libc::ENOSPC {
                return SetupError::FeatureMissing {
                    feature: "namespaces",
                    problem: "hit a max_*_namespaces limit (see /proc/sys/user/)".into(),
                    needed_for,
                };
            }
            SetupError::Clone(errno)
        }
        libc::ENOSYS => SetupError::FeatureMissing {
            feature: "clone3",
            problem: "is not available (Linux 5.3 or newer is required)".into(),
            needed_for: "starting the sandbox",
        },
        libc::EINVAL => SetupError::FeatureMissing {
            feature: "namespaces",
            problem: "are not all supported by this kernel (user, mount, pid, net, ipc, uts)"
                .into(),
            needed_for,
        },
        _ => SetupError::Clone(errno),
    }
}

impl From<lockbox_netsup::Error> for SetupError {
    fn from(e: lockbox_netsup::Error) -> SetupError {
        match e {
            lockbox_netsup::Error::FeatureMissing {
                feature,
                problem,
                needed_for,
            } => SetupError::FeatureMissing {
                feature,
                problem,
                needed_for,
            },
            lockbox_netsup::Error::Supervise { what, errno } => SetupError::Supervise {
                what,
                errno: errno.into(),
            },
        }
    }
}

/// Why a running sandbox's network list was not replaced (`Running::replace_net`); the list
/// in force stays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetUpdateError {
    /// The sandbox has no network supervisor: it was started without a network or with the
    /// host's network, which are fixed for its life.
    #[error("the sandbox was started without a network list (no network, or the host's network): its network is fixed for its life")]
    NoSupervisor,
    /// The host's network asked of a sandbox with its own network namespace.
    #[error("a sandbox started with a network list keeps its own network namespace: it cannot switch to the host's network")]
    HostNetwork,
    /// A name of the new deny-list did not resolve.
    #[error("resolving the new network list: {0}")]
    Resolve(#[source] SetupError),
    /// The supervisor refused the list.
    #[error(transparent)]
    Refused(#[from] lockbox_netsup::ReplaceError),
}

impl NetUpdateError {
    /// The stable code: `NET_NAME_UNRESOLVED` for a name that did not resolve,
    /// `NOT_SUPPORTED` for a change this sandbox cannot take.
    pub fn code(&self) -> ErrorCode {
        match self {
            NetUpdateError::Resolve(e) => e.code(),
            NetUpdateError::NoSupervisor
            | NetUpdateError::HostNetwork
            | NetUpdateError::Refused(_) => ErrorCode::NotSupported,
        }
    }
}
