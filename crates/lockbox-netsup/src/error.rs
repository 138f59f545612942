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
