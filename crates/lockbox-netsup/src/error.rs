//! What can go wrong starting the supervisor.

use crate::sys::Errno;

/// Why the supervisor could not be started. `lockbox-confine` turns each into its
/// `SetupError` of the same name and message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kernel feature the supervisor needs is missing or disabled.
    #[error("{feature} {problem} (needed for {needed_for})")]
    FeatureMissing {
        /// The feature.
        feature: &'static str,
        /// What is wrong with it, e.g. "is not available (Linux 5.9 or newer is required)".
        problem: String,
        /// What lockbox uses it for.
        needed_for: &'static str,
    },
    /// A socket, thread or capability call failed while starting the supervisor.
    #[error("{what}: {errno}")]
    Supervise {
        /// What lockbox was doing.
        what: &'static str,
        /// The errno.
        errno: Errno,
    },
}

/// Why [`Supervisor::replace`](crate::Supervisor::replace) refused a list (the list in
/// force stays).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplaceError {
    /// An allow-list naming hosts, for a sandbox whose resolver is not lockbox's.
    #[error(
        "an allow-list naming hosts ({}) needs lockbox's resolver, which only a sandbox started with an allow-list has (this one uses the host's resolver); list addresses or CIDR blocks only",
        names.join(", ")
    )]
    NoResolver {
        /// The specs naming hosts.
        names: Vec<String>,
    },
    /// The sandbox's TLS is intercepted for some names (credentials).
    #[error("the network list of a sandbox whose TLS lockbox intercepts (credentials, --http-auth/--http-allow) is fixed when it starts")]
    Intercepted,
}
