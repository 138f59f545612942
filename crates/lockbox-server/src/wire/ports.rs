//! Exposed ports.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A port exposed ([`lockbox_runtime::PortInfo`]).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Port)]
pub struct PortInfo {
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// The API's proxy to it (bearer token only: never a browser page on the API's origin).
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    pub host_address: Option<String>,
    /// The port's own origin on the ports listener (`http://8000-sb-....localhost:7071`),
    /// when the server has one (`--ports-listen`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    pub origin: Option<String>,
    /// `origin` + `/__lockbox/open?key=...`: opened in a browser, it sets the port's access
    /// cookie on that origin and goes on to `/`. A capability: whoever has it reaches the port.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, required = false)]
    pub open_url: Option<String>,
}

/// `POST /v1/sandboxes/{id}/ports`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    /// The port inside the sandbox (1-65535).
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u32,
    /// Also listen on a host loopback port.
    #[serde(default)]
    pub host_loopback: bool,
}

/// `GET ports`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PortList {
    /// The exposed ports.
    pub ports: Vec<PortInfo>,
}
