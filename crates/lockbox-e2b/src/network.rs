//! E2B's network options: create's `allow_internet_access` and `network` mapped onto a
//! lockbox network policy ([`network_policy`]), and `PUT /sandboxes/{id}/network`
//! replacing a running sandbox's egress rules ([`update_network`]).

use crate::control::{bad, known, runtime_error, Body};
use crate::{E2b, E2bError};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use lockbox_policy::{Net, NetSpec};
use serde::Deserialize;
use serde_json::Value;

/// `PUT /sandboxes/{id}/network` (E2B's `SandboxNetworkUpdateConfig`): replaces the
/// running sandbox's egress rules, as create's `network` maps them ([`network_policy`]);
/// a field left out is cleared (`{}`: everything allowed again, as by default). 204 once in
/// force; 404 for an unknown sandbox; 400 naming a bad or unsupported field; 409 for a
/// change the sandbox cannot take (started without a network list, a paused sandbox, an
/// allow-list naming hosts in a sandbox that started with a deny-list).
pub(crate) async fn update_network(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<NetworkUpdate>,
) -> Result<StatusCode, E2bError> {
    let sandbox = known(&e2b, &id)?;
    let config = NetworkConfig {
        allow_out: body.allow_out,
        deny_out: body.deny_out,
        dns_servers: body.dns_servers,
        rules: body.rules,
        egress_proxy: body.egress_proxy,
        ..NetworkConfig::default()
    };
    let net = network_policy(body.allow_internet_access, Some(&config), "")?;
    // Not while it is paused, resumed or killed.
    let _life = sandbox.lifecycle.lock().await;
    let sandbox = known(&e2b, &id)?;
    if sandbox.paused.is_some() {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{id}\" is paused: resume it (connect) before changing its network"),
        ));
    }
    let internet = !matches!(net, Net::None);
    e2b.runtime
        .replace_network(sandbox.instance_id(&id), net)
        .await
        .map_err(|e| match e.code() {
            lockbox_policy::ErrorCode::NotSupported => {
                E2bError::new(StatusCode::CONFLICT, e.to_string())
            }
            _ => runtime_error(&e),
        })?;
    e2b.registry.update(&id, |s| s.internet = internet);
    sandbox.log("network replaced");
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `PUT /sandboxes/{id}/network` (E2B's `SandboxNetworkUpdateConfig`; its
/// `allow_internet_access` is spelled so in E2B's spec, unlike `NewSandbox`'s fields).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkUpdate {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    /// Sent by newer SDKs (e2b 2.63's `dns_servers`), not in the spec's update schema yet.
    dns_servers: Option<Vec<String>>,
    rules: Option<Value>,
    egress_proxy: Option<Value>,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
}

/// `network` of `NewSandbox` (E2B's `SandboxNetworkConfig`). `allowPublicTraffic` is
/// accepted either way and not read: a lockbox sandbox's ports never take public traffic
/// (the interpreter's needs the sandbox's token, exposed ports the server's or a port's own
/// key), which is what `false` asks for.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkConfig {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    mask_request_host: Option<String>,
    rules: Option<Value>,
    dns_servers: Option<Vec<String>>,
    egress_proxy: Option<Value>,
    https_ports: Option<Vec<u16>>,
}

/// E2B's "all traffic" destination.
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The lockbox network policy of E2B's `allow_internet_access` and `network`: the
/// internet (the host's network, not its loopback) by default; none with
/// `allow_internet_access: false`; a deny-list for `denyOut`; an allow-list for
/// `denyOut: ["0.0.0.0/0"]` plus `allowOut`. Destinations are lockbox's net specs (IP,
/// CIDR, host name, `*.domain`, with an optional `:port`).
///
/// `prefix` is what the fields' names start with in errors: `network.` on create, nothing
/// in `PUT .../network`'s body.
pub(crate) fn network_policy(
    allow_internet: Option<bool>,
    network: Option<&NetworkConfig>,
    prefix: &str,
) -> Result<Net, E2bError> {
    let Some(network) = network else {
        return Ok(if allow_internet == Some(false) {
            Net::None
        } else {
            Net::Deny(Vec::new())
        });
    };
    let unsupported = [
        ("rules", network.rules.is_some()),
        ("dnsServers", network.dns_servers.is_some()),
        ("egressProxy", network.egress_proxy.is_some()),
        ("maskRequestHost", network.mask_request_host.is_some()),
        ("httpsPorts", network.https_ports.is_some()),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, given)| *given) {
        return Err(bad(format!(
            "{prefix}{field}: not supported by lockbox's E2B API (see docs/e2b.md)"
        )));
    }
    let specs = |field: &str, list: &[String]| -> Result<Vec<NetSpec>, E2bError> {
        list.iter()
            .map(|s| {
                // E2B's entries name no port (every port): lockbox's specs do ("HOST:*").
                NetSpec::parse(s)
                    .or_else(|e| {
                        NetSpec::parse(&format!("{s}:*"))
                            .or_else(|_| NetSpec::parse(&format!("[{s}]:*")))
                            .map_err(|_| e)
                    })
                    .map_err(|e| bad(format!("{prefix}{field}: {s:?}: {e}")))
            })
            .collect()
    };
    let deny = network.deny_out.as_deref().unwrap_or_default();
    let allow = network.allow_out.as_deref().unwrap_or_default();
    let deny_all = deny.iter().any(|d| d == ALL_TRAFFIC);
    if allow_internet == Some(false) || deny_all {
        if deny.iter().any(|d| d != ALL_TRAFFIC) {
            return Err(bad(format!(
                "{prefix}denyOut: with all traffic denied, other entries mean nothing; list only \"0.0.0.0/0\""
            )));
        }
        if allow.is_empty() {
            return Ok(Net::None);
        }
        return Ok(Net::Allow(specs("allowOut", allow)?));
    }
    if !allow.is_empty() && !deny.is_empty() {
        return Err(bad(format!(
            "{prefix}allowOut: exceptions to a deny-list are not supported by lockbox; deny \"0.0.0.0/0\" and list what to allow, or list only what to deny"
        )));
    }
    if deny.is_empty() {
        // Everything is allowed already: allowOut alone changes nothing, as on E2B.
        return Ok(Net::Deny(Vec::new()));
    }
    Ok(Net::Deny(specs("denyOut", deny)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_network_options_map_onto_lockbox_policies_or_name_the_field() {
        assert!(matches!(network_policy(None, None, "network."), Ok(Net::Deny(d)) if d.is_empty()));
        assert!(matches!(
            network_policy(Some(false), None, "network."),
            Ok(Net::None)
        ));
        let allow = NetworkConfig {
            allow_out: Some(vec!["example.com".into()]),
            deny_out: Some(vec![ALL_TRAFFIC.into()]),
            ..NetworkConfig::default()
        };
        let got = network_policy(None, Some(&allow), "network.");
        assert!(
            matches!(&got, Ok(Net::Allow(a)) if a.len() == 1),
            "{:?}",
            got.as_ref().err().map(|e| &e.message)
        );
        let cidrs = NetworkConfig {
            allow_out: None,
            deny_out: Some(vec![
                "10.0.0.0/8".into(),
                "2001:db8::/32".into(),
                "1.2.3.4:443".into(),
            ]),
            ..NetworkConfig::default()
        };
        assert!(
            matches!(network_policy(None, Some(&cidrs), "network."), Ok(Net::Deny(d)) if d.len() == 3)
        );
        let mixed = NetworkConfig {
            deny_out: Some(vec!["10.0.0.0/8".into()]),
            ..allow
        };
        let err = network_policy(None, Some(&mixed), "network.").unwrap_err();
        assert!(
            err.message.starts_with("network.allowOut"),
            "{}",
            err.message
        );
        // The update's body names its fields without the prefix.
        let err = network_policy(None, Some(&mixed), "").unwrap_err();
        assert!(err.message.starts_with("allowOut"), "{}", err.message);
        // `{}` on update: everything allowed again; allow_internet_access false: none.
        let empty = NetworkConfig::default();
        assert!(matches!(network_policy(None, Some(&empty), ""), Ok(Net::Deny(d)) if d.is_empty()));
        assert!(matches!(
            network_policy(Some(false), Some(&empty), ""),
            Ok(Net::None)
        ));
    }
}
