//! Credentials that never enter a lockbox sandbox.
//!
//! A sandbox's code may use an API key without ever being able to read it: lockbox holds
//! the key ([`Credentials`], read once from lockbox's own environment or a file), and for the
//! hosts [`HttpRules`] name it terminates the sandbox's TLS connections itself
//! ([`Interceptor`]): with a per-sandbox CA made at start (its key only in lockbox's memory)
//! that the sandbox's view of the system trust store holds, it reads each request, checks
//! its method and path, sets the real header and sends it on over TLS to the real server,
//! whose certificate it verifies.
//!
//! The relay of name-allowed connections in `lockbox-confine` (its `netsup::relay`) hands
//! the connections over through [`lockbox_netsup::Interceptor`], which [`Interceptor`]
//! implements; [`lockbox_confine::Spawn::interceptor`] takes it.
//!
//! Not here: the network supervisor, DNS and the SNI checks (`lockbox-confine`), flags
//! (`lockbox-cli`).
//!
//! ```
//! use lockbox_intercept::{AuthRule, Credentials, CredentialSpec, HttpRules};
//! let rules = HttpRules::new(
//!     vec!["api.example.org bearer API".parse::<AuthRule>().unwrap()],
//!     vec!["GET api.example.org/v1/models".parse().unwrap()],
//! )
//! .unwrap();
//! let specs = ["API=env:API_KEY".parse::<CredentialSpec>().unwrap()];
//! let creds = Credentials::load(&specs, &rules, |_| Some("sk-123".into())).unwrap();
//! assert!(rules.check("GET", "api.example.org", "/v1/models/x").is_ok());
//! assert!(rules.check("POST", "api.example.org", "/v1/models").is_err());
//! # drop(creds);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod ca;
mod error;
mod proxy;
mod rules;
mod secret;

pub use crate::ca::Authority;
pub use crate::error::Error;
pub use crate::proxy::{Interceptor, HANDSHAKE};
pub use crate::rules::{
    canonical_path, AllowRule, AuthRule, AuthScheme, CredentialSource, CredentialSpec, HttpRules,
    Refusal,
};
pub use crate::secret::{Credentials, Secret, MAX_SECRET};

/// Variables that point the sandbox's TLS clients at the bundle holding lockbox's CA
/// ([`lockbox_netsup::SANDBOX_BUNDLE`]): OpenSSL and Python's `ssl`, Python `requests`
/// (which otherwise uses certifi's own bundle), curl, Node.
pub const TRUST_ENV: [&str; 4] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];

/// Points [`TRUST_ENV`] at the sandbox's bundle in `env`, unless the caller set one itself.
pub fn trust_env(env: &mut lockbox_policy::EnvPolicy) {
    for var in TRUST_ENV {
        env.set
            .entry(var.to_owned())
            .or_insert_with(|| lockbox_netsup::SANDBOX_BUNDLE.to_owned());
    }
}
