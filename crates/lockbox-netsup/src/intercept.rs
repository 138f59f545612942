//! The hook for connections lockbox terminates itself (credentials that never enter the
//! sandbox: `--http-auth`, `--http-allow`).
//!
//! The relay ([`super::relay`]) reads a name-allowed connection's first flight. When the TLS
//! server name it asks for is one an [`Interceptor`] claims ([`Interceptor::intercepts`]), the
//! relay does not splice: it hands the [`Intercepted`] connection over (the sandbox's end, the
//! first flight already read, the upstream socket the supervisor connected to an address this
//! sandbox's DNS answers allowed, the server name). What happens next (TLS with a per-sandbox
//! CA, the HTTP rules, the credential, the upstream TLS) is the interceptor's: the
//! `lockbox-intercept` crate. Plain HTTP to an intercepted name is refused by the relay, so
//! the rules cannot be sidestepped by leaving TLS out.
//!
//! The connection keeps its relay slot ([`super::RELAY_SLOTS`]) until the interceptor drops
//! it, so intercepted connections are bounded like relayed ones.
//!
//! The interceptor's CA certificate goes into the sandbox's view of the system trust store:
//! [`trust_files`] makes the files of lockbox's `/etc` that carry it.

use super::relay::Ticket;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;

/// What terminates the connections of some server names instead of the relay splicing them.
pub trait Interceptor: Send + Sync + std::fmt::Debug {
    /// Whether TLS connections asking for `name` (lower case, no trailing dot) on `port` are
    /// this interceptor's.
    fn intercepts(&self, name: &str, port: u16) -> bool;
    /// Takes a connection; never blocks (it queues the connection for its own thread).
    /// Dropping it closes both sockets.
    fn take(&self, conn: Intercepted);
    /// The PEM certificate of the CA the sandbox must trust for intercepted names.
    fn ca_pem(&self) -> &str;
}

/// A TLS connection of the sandbox whose server name an [`Interceptor`] claims.
#[derive(Debug)]
pub struct Intercepted {
    /// Our end of the pair whose other end the sandbox holds (non-blocking).
    pub client: OwnedFd,
    /// What the client sent first (its ClientHello), already read from `client`.
    pub first_flight: Vec<u8>,
    /// A host socket connected, or still connecting, to `dest` (non-blocking): the address
    /// the sandbox connected to, allowed by this sandbox's DNS answers.
    pub upstream: OwnedFd,
    /// Where `upstream` goes.
    pub dest: SocketAddr,
    /// The server name of the ClientHello, lower case, without a trailing dot.
    pub sni: String,
    /// The process that connected, as the caller of lockbox sees it.
    pub pid: Option<u32>,
    /// Its command line.
    pub command: Option<String>,
    /// The relay slot: keep it as long as the connection lives.
    pub slot: RelaySlot,
}

/// A relayed connection's place among the sandbox's [`super::RELAY_SLOTS`], given back
/// when dropped.
#[derive(Debug)]
pub struct RelaySlot(
    /// Held, not read: dropped with the connection, it frees the slot.
    #[allow(dead_code)]
    pub(super) Option<Ticket>,
);

impl RelaySlot {
    /// A slot counted against no sandbox's budget: for a connection handed to an
    /// [`Interceptor`] from outside a sandbox's relay (the interceptor's own tests).
    pub fn unbounded() -> RelaySlot {
        RelaySlot(None)
    }
}

/// Places a trust bundle is read from on common distributions, relative to `/etc`
/// (Debian/Ubuntu/Alpine/Arch, Fedora/RHEL, openSUSE, Alpine/LibreSSL).
pub const TRUST_BUNDLES: [&str; 5] = [
    "ssl/certs/ca-certificates.crt",
    "pki/tls/certs/ca-bundle.crt",
    "pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "ssl/ca-bundle.pem",
    "ssl/cert.pem",
];

/// The sandbox's path of the bundle with lockbox's CA that `SSL_CERT_FILE` and the like name.
pub const SANDBOX_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The files of the sandbox's `/etc` (relative paths, contents) that carry `ca_pem`: each of
/// [`TRUST_BUNDLES`] the host has, as the host's bundle followed by `ca_pem`, and always
/// [`SANDBOX_BUNDLE`] (the first host bundle found plus `ca_pem`, or `ca_pem` alone). Reads
/// the host's bundles; writes nothing.
pub fn trust_files(ca_pem: &str, etc: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut first: Option<Vec<u8>> = None;
    for rel in TRUST_BUNDLES {
        let Ok(mut data) = std::fs::read(etc.join(rel)) else {
            continue;
        };
        if !data.is_empty() && !data.ends_with(b"\n") {
            data.push(b'\n');
        }
        first.get_or_insert_with(|| data.clone());
        data.extend_from_slice(ca_pem.as_bytes());
        files.push((rel.to_owned(), data));
    }
    let main = SANDBOX_BUNDLE.trim_start_matches("/etc/");
    if !files.iter().any(|(rel, _)| rel == main) {
        let mut data = first.unwrap_or_default();
        data.extend_from_slice(ca_pem.as_bytes());
        files.push((main.to_owned(), data));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_files_append_the_ca_to_every_bundle_the_host_has() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pki/tls/certs")).unwrap();
        std::fs::write(dir.path().join("pki/tls/certs/ca-bundle.crt"), "HOST").unwrap();
        let files = trust_files("CA\n", dir.path());
        assert_eq!(
            files,
            vec![
                (
                    "pki/tls/certs/ca-bundle.crt".to_owned(),
                    b"HOST\nCA\n".to_vec()
                ),
                (
                    "ssl/certs/ca-certificates.crt".to_owned(),
                    b"HOST\nCA\n".to_vec()
                ),
            ]
        );
    }

    #[test]
    fn trust_files_without_a_host_bundle_hold_the_ca_alone() {
        let dir = tempfile::tempdir().unwrap();
        let files = trust_files("CA\n", dir.path());
        assert_eq!(
            files,
            vec![("ssl/certs/ca-certificates.crt".to_owned(), b"CA\n".to_vec())]
        );
    }
}
