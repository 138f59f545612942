//! The per-sandbox certificate authority: made when the sandbox starts, its key kept in
//! lockbox's memory only (never written to disk), name-constrained to the intercepted
//! hosts, and a leaf certificate per server name, made when first asked and cached.

use crate::error::Error;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The CA of one sandbox.
pub struct Authority {
    cert: Certificate,
    key: KeyPair,
    pem: String,
    hosts: Vec<String>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// A new CA whose certificates are only valid for `hosts` (and names below them: X.509
    /// name constraints, which a client checks).
    pub fn new(hosts: &[&str]) -> Result<Authority, Error> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "lockbox sandbox CA (this sandbox only)");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "lockbox");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts
                .iter()
                .map(|h| GeneralSubtree::DnsName((*h).to_owned()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let pem = cert.pem();
        Ok(Authority {
            cert,
            key,
            pem,
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            leaves: Mutex::default(),
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The leaf certificate and key for `name` (one of the hosts), made once.
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, Error> {
        if let Some(leaf) = self.leaves.lock().ok().and_then(|l| l.get(name).cloned()) {
            return Ok(leaf);
        }
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = rustls::crypto::ring::sign::any_supported_type(&der)?;
        let leaf = Arc::new(CertifiedKey::new(vec![cert.der().clone()], signing));
        if let Ok(mut leaves) = self.leaves.lock() {
            leaves.insert(name.to_owned(), leaf.clone());
        }
        Ok(leaf)
    }
}

/// Answers each TLS handshake of the sandbox with the leaf of its server name.
#[derive(Debug)]
pub(crate) struct Resolver(pub(crate) Arc<Authority>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello
            .server_name()?
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if !self.0.hosts.contains(&name) {
            return None;
        }
        match self.0.leaf(&name) {
            Ok(leaf) => Some(leaf),
            Err(e) => {
                tracing::warn!(name, error = %e, "making a leaf certificate");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_pem_and_leaves_are_cached_per_name() {
        let ca = Authority::new(&["api.example.org"]).unwrap();
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let a = ca.leaf("api.example.org").unwrap();
        let b = ca.leaf("api.example.org").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
