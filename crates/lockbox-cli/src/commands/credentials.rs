//! `lockbox run`'s credentials (`--credential`, `--http-auth`, `--http-allow`,
//! `--upstream-ca`): checked against the policy, read once, and the interceptor that uses
//! them started (see `lockbox_intercept`).

use crate::cli::RunArgs;
use crate::error::CliError;
use lockbox_intercept::{CredentialSource, Credentials, HttpRules, Interceptor};
use lockbox_netsup::AuditSink;
use lockbox_policy::{Net, Policy, Proto};
use std::sync::Arc;

/// Starts the sandbox's interceptor, if the flags ask for one, and points the sandbox's TLS
/// clients at the trust bundle with its CA. Usage errors (exit 2) name the flag, the host,
/// the credential or its source, never a credential's value.
pub fn start(
    args: &RunArgs,
    policy: &mut Policy,
    audit: Option<AuditSink>,
) -> Result<Option<Arc<Interceptor>>, CliError> {
    if args.http_auth.is_empty() && args.http_allow.is_empty() {
        if let Some(c) = args.credential.first() {
            return Err(CliError::usage(format!(
                "--credential {}: no --http-auth rule uses it",
                c.name
            )));
        }
        if args.upstream_ca.is_some() {
            return Err(CliError::usage(
                "--upstream-ca is for the servers of --http-auth/--http-allow hosts: give one",
            ));
        }
        return Ok(None);
    }
    let rules =
        HttpRules::new(args.http_auth.clone(), args.http_allow.clone()).map_err(CliError::usage)?;
    let Net::Allow(specs) = &policy.net else {
        return Err(CliError::usage(
            "--http-auth/--http-allow intercept hosts of a network allow-list: add --net-allow HOST:443",
        ));
    };
    for host in rules.hosts() {
        let allowed = specs
            .iter()
            .any(|s| s.proto != Some(Proto::Udp) && s.matches_name(host));
        if !allowed {
            return Err(CliError::usage(format!(
                "--http-auth/--http-allow host {host} is not allowed by name by --net-allow"
            ))
            .hint(format!("add --net-allow {host}:443")));
        }
    }
    for spec in &args.credential {
        if let CredentialSource::File(path) = &spec.source {
            let file = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            let workdir = args
                .workspace
                .workdir
                .as_deref()
                .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.to_owned()))
                .filter(|d| file.starts_with(d));
            let shown = match workdir {
                Some(d) => Some(format!("--workdir {}", d.display())),
                None => policy.fs.grant_showing(&file).map(|g| g.to_string()),
            };
            if let Some(grant) = shown {
                return Err(CliError::usage(format!(
                    "--credential {}: its file {} is readable inside the sandbox (through {grant}); a credential never enters it",
                    spec.name,
                    path.display()
                ))
                .hint("keep the file outside the sandbox's view (e.g. under /root or /var/lib), or use env:VAR"));
            }
        }
        if let CredentialSource::Env(var) = &spec.source {
            if policy.env.pass.contains(var) || policy.env.set.contains_key(var) {
                return Err(CliError::usage(format!(
                    "--credential {}: its variable {var} would be given to the sandbox (--env-pass/--env); a credential never enters it",
                    spec.name
                )));
            }
        }
    }
    let credentials = Credentials::load(&args.credential, &rules, |var| std::env::var_os(var))
        .map_err(CliError::usage)?;
    let interceptor = Interceptor::start(rules, credentials, args.upstream_ca.as_deref(), audit)
        .map_err(|e| {
            let code = if e.is_usage() { 2 } else { 125 };
            CliError::new(code, e)
        })?;
    lockbox_intercept::trust_env(&mut policy.env);
    Ok(Some(Arc::new(interceptor)))
}
