//! Credentials that never enter a long-lived sandbox (see `lockbox_intercept`): a spec's
//! interception rules ([`SandboxSpec::http`]) checked against its allow-list and given
//! their credentials when the sandbox is created ([`resolve`]); the interceptor each of its
//! instances starts ([`start`]).
//!
//! The values come from the runtime's registry ([`RuntimeConfig::credentials`], read once by
//! `lockbox serve --credential`) or from an in-process caller ([`SandboxSpec::credentials`]);
//! an API request only names them through rules, so no client can have lockbox read a
//! variable or a file of its choosing and send it to a host of its choosing.

use crate::error::RuntimeError;
use crate::types::{RuntimeConfig, SandboxSpec};
use lockbox_intercept::{Credentials, Interceptor};
use lockbox_netsup::AuditSink;
use lockbox_policy::{Grant, Net, Policy, Proto};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The credentials a runtime's sandboxes pick from, and the CA file trusted for their real
/// servers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    credentials: Credentials,
    upstream_ca: Option<PathBuf>,
}

impl Registry {
    pub(crate) fn of(config: &RuntimeConfig) -> Registry {
        Registry {
            credentials: config.credentials.clone(),
            upstream_ca: config.upstream_ca.clone(),
        }
    }

    pub(crate) fn define(&mut self, more: Credentials, upstream_ca: Option<PathBuf>) {
        self.credentials.extend(more);
        if upstream_ca.is_some() {
            self.upstream_ca = upstream_ca;
        }
    }
}

/// Checks `spec`'s rules and credentials against its policy and keeps in it only the
/// credentials its rules name (the spec's own first, then the registry's). `files`: those
/// the registry's credentials were read from. Errors name the field: `http_auth`,
/// `http_allow`, `credentials`, `fs_readable`, `fs_writable`.
pub(crate) fn resolve(
    spec: &mut SandboxSpec,
    registry: &Registry,
    files: &[PathBuf],
) -> Result<(), RuntimeError> {
    check_paths(spec, files)?;
    if spec.http.is_empty() {
        if let Some(name) = spec.credentials.names().next() {
            return Err(RuntimeError::invalid(
                "credentials",
                format!("credential {name}: no http_auth rule uses it"),
            ));
        }
        return Ok(());
    }
    let Net::Allow(allowed) = &spec.policy.net else {
        return Err(RuntimeError::invalid(
            field_of(spec, ""),
            "http_auth/http_allow intercept hosts of a network allow-list: it needs net allow with HOST:443",
        ));
    };
    for host in spec.http.hosts() {
        let by_name = allowed
            .iter()
            .any(|s| s.proto != Some(Proto::Udp) && s.matches_name(host));
        if !by_name {
            return Err(RuntimeError::invalid(
                field_of(spec, host),
                format!("host {host} is not allowed by name by net allow (add {host}:443)"),
            ));
        }
    }
    spec.credentials = spec
        .credentials
        .pick(&spec.http, &registry.credentials)
        .map_err(|e| RuntimeError::invalid("http_auth", e))?;
    if spec.upstream_ca.is_none() {
        spec.upstream_ca.clone_from(&registry.upstream_ca);
    }
    Ok(())
}

/// The body field that brought `host` in: `http_auth` if an auth rule names it.
fn field_of(spec: &SandboxSpec, host: &str) -> &'static str {
    if spec.http.allow.iter().any(|r| r.host == host) && spec.http.auth_for(host).is_none() {
        "http_allow"
    } else {
        "http_auth"
    }
}

/// Refuses a sandbox that would see a file one of the registry's credentials is read from:
/// through a grant of its policy, its workdir, or the default reads.
fn check_paths(spec: &SandboxSpec, files: &[PathBuf]) -> Result<(), RuntimeError> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let workdir = spec.workdir.as_deref().map(canonical);
    for file in files {
        let (field, through) = match spec.policy.fs.grant_showing(file) {
            Some(g @ Grant::Read(_)) => ("fs_readable", g.to_string()),
            Some(g @ Grant::Write(_)) => ("fs_writable", g.to_string()),
            Some(g @ Grant::Overlay(_)) => ("fs_readable", g.to_string()),
            Some(g @ Grant::DefaultRead(_)) => ("default_reads", g.to_string()),
            None => match &workdir {
                Some(d) if file.starts_with(d) => {
                    ("workdir", format!("the workdir {}", d.display()))
                }
                _ => continue,
            },
        };
        return Err(RuntimeError::invalid(
            field,
            format!("{through} holds a file a credential of this server is read from"),
        ));
    }
    Ok(())
}

/// The interceptor of one instance of a sandbox whose spec went through [`resolve`] (a CA
/// of its own), and its CA's bundle named to the sandbox's TLS clients in `policy`'s
/// environment; `None` without rules.
pub(crate) fn start(
    spec: &SandboxSpec,
    policy: &mut Policy,
    audit: Option<AuditSink>,
) -> Result<Option<Arc<Interceptor>>, RuntimeError> {
    if spec.http.is_empty() {
        return Ok(None);
    }
    let upstream_ca: Option<&Path> = spec.upstream_ca.as_deref();
    let interceptor = Interceptor::start(
        spec.http.clone(),
        spec.credentials.clone(),
        upstream_ca,
        audit,
    )
    .map_err(|e| {
        if e.is_usage() {
            RuntimeError::invalid("upstream_ca", e)
        } else {
            RuntimeError::SetupFailed(e.to_string())
        }
    })?;
    lockbox_intercept::trust_env(&mut policy.env);
    Ok(Some(Arc::new(interceptor)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lockbox_intercept::{CredentialSpec, HttpRules};

    fn config(dir: &Path) -> RuntimeConfig {
        let specs: Vec<CredentialSpec> =
            vec!["API=env:A".parse().unwrap(), "OTHER=env:B".parse().unwrap()];
        let mut config = RuntimeConfig::new(dir);
        config.credentials =
            Credentials::read_all(&specs, |v| Some(format!("value-of-{v}").into())).unwrap();
        config.credential_files = vec![dir.join("keys/api.key")];
        config
    }

    fn spec(allow: &[&str], auth: &[&str], allow_rules: &[&str]) -> SandboxSpec {
        let mut spec = SandboxSpec::default();
        spec.policy.net = Net::Allow(allow.iter().map(|a| a.parse().unwrap()).collect());
        spec.http = HttpRules::new(
            auth.iter().map(|a| a.parse().unwrap()).collect(),
            allow_rules.iter().map(|a| a.parse().unwrap()).collect(),
        )
        .unwrap();
        spec
    }

    fn run(spec: &mut SandboxSpec, config: &RuntimeConfig) -> Result<(), RuntimeError> {
        resolve(spec, &Registry::of(config), &config.credential_files)
    }

    fn field(e: RuntimeError) -> String {
        match e {
            RuntimeError::InvalidRequest { field, message } => format!("{field}: {message}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sandbox_gets_only_the_registry_credentials_its_rules_name() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut ok = spec(&["api.x.org:443"], &["api.x.org bearer API"], &[]);
        run(&mut ok, &config).unwrap();
        assert_eq!(ok.credentials.names().collect::<Vec<_>>(), ["API"]);
    }

    #[test]
    fn unknown_credentials_unlisted_hosts_and_credential_files_are_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let e = field(
            run(
                &mut spec(&["api.x.org:443"], &["api.x.org bearer NOPE"], &[]),
                &config,
            )
            .unwrap_err(),
        );
        assert!(e.starts_with("http_auth: ") && e.contains("NOPE"), "{e}");
        let e = field(
            run(
                &mut spec(&["other.org:443"], &["api.x.org bearer API"], &[]),
                &config,
            )
            .unwrap_err(),
        );
        assert!(
            e.starts_with("http_auth: ") && e.contains("api.x.org"),
            "{e}"
        );
        let e = field(
            run(
                &mut spec(&["other.org:443"], &[], &["GET api.x.org/v1"]),
                &config,
            )
            .unwrap_err(),
        );
        assert!(e.starts_with("http_allow: "), "{e}");
        let mut host_net = spec(&[], &["api.x.org bearer API"], &[]);
        host_net.policy.net = Net::Host;
        let e = field(run(&mut host_net, &config).unwrap_err());
        assert!(e.starts_with("http_auth: "), "{e}");
        let mut reads_keys = SandboxSpec::default();
        reads_keys.policy.fs.read.push(dir.path().join("keys"));
        let e = field(run(&mut reads_keys, &config).unwrap_err());
        assert!(e.starts_with("fs_readable: "), "{e}");
        let mut in_workdir = SandboxSpec {
            workdir: Some(dir.path().to_owned()),
            ..SandboxSpec::default()
        };
        in_workdir.policy.fs.default_reads = false;
        let e = field(run(&mut in_workdir, &config).unwrap_err());
        assert!(e.starts_with("workdir: "), "{e}");
        let mut under_etc = config.clone();
        under_etc.credential_files = vec!["/etc/hostname".into()];
        let e = field(run(&mut SandboxSpec::default(), &under_etc).unwrap_err());
        assert!(
            e.starts_with("default_reads: ") && e.contains("/etc"),
            "{e}"
        );
    }
}
