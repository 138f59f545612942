//! How a sandbox's spec is kept on disk: the `spec` column of `sandboxes.sqlite` and the
//! `spec` of a snapshot record's context, both JSON read back by later runtimes (a restart
//! lists the sandboxes; a fork of an old snapshot starts with its policy).
//!
//! This is the one serde of the runtime's own types, and it is private on purpose: it is
//! the runtime's file format, not the API (`lockbox-server`'s `wire` module is that). The
//! field names are those records have always had; change them only with a reader of the
//! old ones.
//!
//! A spec's interception rules (`http_auth`, `http_allow`) are kept as their texts, which
//! name credentials but never hold their values (nor does any other field): a runtime
//! reading a record back (a fork of a snapshot, a restarted server) resolves the names
//! against its own credentials again (`credentials::resolve`), and refuses to start the
//! sandbox when it lacks one.

use crate::types::{OnExit, SandboxSpec};
use lockbox_intercept::HttpRules;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// [`SandboxSpec`] as its records hold it.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecRecord {
    #[serde(default)]
    policy: lockbox_policy::Policy,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "lockbox_policy::name::json::option"
    )]
    workdir: Option<PathBuf>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "lockbox_policy::name::json::option"
    )]
    workdir_at: Option<PathBuf>,
    #[serde(default)]
    on_exit: OnExitRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    idle_timeout_ms: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from_snapshot: Option<lockbox_cow::SnapshotId>,
    /// Approvals' timeout (`net_ask`), if on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    net_ask_timeout_ms: Option<u64>,
    /// `http_auth` rules, as `--http-auth` takes them (credential names, no values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    http_auth: Vec<String>,
    /// `http_allow` rules, as `--http-allow` takes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    http_allow: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OnExitRecord {
    #[default]
    Keep,
    Commit,
    Abort,
}

/// `spec` as its records write it.
pub(crate) fn spec_json(spec: &SandboxSpec) -> serde_json::Value {
    let record = SpecRecord {
        policy: spec.policy.clone(),
        workdir: spec.workdir.clone(),
        workdir_at: spec.workdir_at.clone(),
        on_exit: match spec.on_exit {
            OnExit::Keep => OnExitRecord::Keep,
            OnExit::Commit => OnExitRecord::Commit,
            OnExit::Abort => OnExitRecord::Abort,
        },
        idle_timeout_ms: spec
            .idle_timeout
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        labels: spec.labels.clone(),
        from_snapshot: spec.from_snapshot.clone(),
        net_ask_timeout_ms: spec
            .net_ask
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        http_auth: spec.http.auth.iter().map(ToString::to_string).collect(),
        http_allow: spec.http.allow.iter().map(ToString::to_string).collect(),
    };
    serde_json::to_value(record).unwrap_or_default()
}

/// The spec a record holds; `None` if it is not one this version reads. Its rules name
/// credentials its [`SandboxSpec::credentials`] does not hold: `credentials::resolve` finds
/// them again.
pub(crate) fn spec_from_json(value: serde_json::Value) -> Option<SandboxSpec> {
    let r: SpecRecord = serde_json::from_value(value).ok()?;
    let http = HttpRules::new(
        r.http_auth
            .iter()
            .map(|t| t.parse())
            .collect::<Result<_, _>>()
            .ok()?,
        r.http_allow
            .iter()
            .map(|t| t.parse())
            .collect::<Result<_, _>>()
            .ok()?,
    )
    .ok()?;
    Some(SandboxSpec {
        policy: r.policy,
        workdir: r.workdir,
        workdir_at: r.workdir_at,
        on_exit: match r.on_exit {
            OnExitRecord::Keep => OnExit::Keep,
            OnExitRecord::Commit => OnExit::Commit,
            OnExitRecord::Abort => OnExit::Abort,
        },
        idle_timeout: r.idle_timeout_ms.map(Duration::from_millis),
        labels: r.labels,
        from_snapshot: r.from_snapshot,
        net_ask: r.net_ask_timeout_ms.map(Duration::from_millis),
        http,
        // Not recorded: the values (found again by name), and the upstream CA file (the
        // reading runtime's own, `RuntimeConfig::upstream_ca`).
        ..SandboxSpec::default()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_spec_reads_back_as_written_in_the_records_field_names() {
        let mut spec = SandboxSpec {
            workdir: Some(PathBuf::from("/w")),
            on_exit: OnExit::Abort,
            idle_timeout: Some(Duration::from_millis(1500)),
            net_ask: Some(Duration::from_secs(2)),
            ..SandboxSpec::default()
        };
        spec.labels.insert("a".into(), "b".into());
        let json = spec_json(&spec);
        assert_eq!(json["workdir"], "/w");
        assert_eq!(json["on_exit"], "abort");
        assert_eq!(json["idle_timeout_ms"], 1500);
        assert_eq!(json["labels"]["a"], "b");
        assert!(json.get("from_snapshot").is_none());
        assert_eq!(json["net_ask_timeout_ms"], 2000);
        let back = spec_from_json(json).unwrap();
        assert_eq!(back.workdir, spec.workdir);
        assert_eq!(back.on_exit, OnExit::Abort);
        assert_eq!(back.idle_timeout, spec.idle_timeout);
        assert_eq!(back.labels, spec.labels);
        assert_eq!(back.net_ask, spec.net_ask);
        assert!(spec_from_json(serde_json::json!({ "unknown": 1 })).is_none());
    }

    #[test]
    fn interception_rules_are_recorded_by_credential_name_and_never_with_a_value() {
        use lockbox_intercept::{CredentialSpec, Credentials};
        let specs: Vec<CredentialSpec> = vec!["API=env:A".parse().unwrap()];
        let mut spec = SandboxSpec {
            http: HttpRules::new(
                vec!["api.example.org header X-Api-Key API".parse().unwrap()],
                vec!["GET api.example.org/v1/models".parse().unwrap()],
            )
            .unwrap(),
            credentials: Credentials::read_all(&specs, |_| Some("sk-never-recorded".into()))
                .unwrap(),
            upstream_ca: Some(PathBuf::from("/ca.pem")),
            ..SandboxSpec::default()
        };
        spec.policy.net = lockbox_policy::Net::Allow(vec!["api.example.org:443".parse().unwrap()]);
        let json = spec_json(&spec);
        assert_eq!(
            json["http_auth"],
            serde_json::json!(["api.example.org header x-api-key API"])
        );
        assert_eq!(
            json["http_allow"],
            serde_json::json!(["GET api.example.org/v1/models"])
        );
        assert!(!json.to_string().contains("sk-never-recorded"), "{json}");
        let back = spec_from_json(json).unwrap();
        assert_eq!(back.http, spec.http);
        assert!(back.credentials.is_empty());
        assert_eq!(back.upstream_ca, None);
        // A record of an older version has no rules: no interception.
        let old = spec_from_json(serde_json::json!({ "on_exit": "keep" })).unwrap();
        assert!(old.http.is_empty());
        // Rules this version cannot read make the record unreadable, not rule-less.
        assert!(spec_from_json(serde_json::json!({ "http_auth": ["nonsense"] })).is_none());
    }
}
