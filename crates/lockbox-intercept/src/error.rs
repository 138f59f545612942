//! Why interception could not be set up.

use std::path::PathBuf;

/// A rule, a credential or the interceptor's set-up that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A flag's rule could not be parsed.
    #[error("{flag} {rule:?}: {reason}")]
    BadRule {
        /// The flag (`--http-auth`...).
        flag: &'static str,
        /// The rule as given.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A credential could not be read, or is not used as it should be.
    #[error("credential {name}: {reason}")]
    Credential {
        /// The credential's name (never its value).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The file of extra upstream CAs could not be used.
    #[error("upstream CA file {path}: {reason}")]
    UpstreamCa {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The per-sandbox CA or a certificate could not be made.
    #[error("making the sandbox's CA certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused a configuration.
    #[error("configuring TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The interceptor's thread or runtime could not be started.
    #[error("starting the interceptor: {0}")]
    Start(std::io::Error),
}

impl Error {
    /// Whether the caller's input is at fault (a usage error), not the machine.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::BadRule { .. } | Error::Credential { .. } | Error::UpstreamCa { .. }
        )
    }
}
