//! The OCI and Docker v2 documents a pull reads: indexes / manifest lists, manifests and
//! image configs. Only the fields lockbox uses; unknown ones are ignored.

use crate::error::ImageError;
use crate::Digest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// What a manifest request accepts, most specific first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// A content descriptor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A descriptor's platform.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlatformSpec {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An index or a manifest: told apart by media type or by which list it has.
#[derive(Debug, Clone, Deserialize)]
pub struct Document {
    #[serde(rename = "schemaVersion", default)]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Option<Vec<Descriptor>>,
}

/// A document, classified.
#[derive(Debug)]
pub enum Parsed {
    Index(Vec<Descriptor>),
    Manifest {
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

/// Parses a manifest or index; `what` names it in errors.
pub fn parse_document(bytes: &[u8], what: &str) -> Result<Parsed, ImageError> {
    let bad = |reason: String| ImageError::BadManifest {
        what: what.to_owned(),
        reason,
    };
    let doc: Document =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not a manifest or index: {e}")))?;
    if doc.schema_version != 2 {
        return Err(bad(format!(
            "schemaVersion {} (only 2 is supported; Docker schema 1 is long deprecated)",
            doc.schema_version
        )));
    }
    match (doc.manifests, doc.config, doc.layers) {
        (Some(list), None, _) => Ok(Parsed::Index(list)),
        (None, Some(config), Some(layers)) => Ok(Parsed::Manifest { config, layers }),
        _ => Err(bad(format!(
            "neither an index (manifests) nor a manifest (config and layers); media type {:?}",
            doc.media_type.unwrap_or_default()
        ))),
    }
}

/// The image config document (`application/vnd.oci.image.config.v1+json`).
#[derive(Debug, Clone, Deserialize)]
pub struct ConfigFile {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub config: Option<RunConfig>,
    pub rootfs: RootFs,
}

/// The part of the config a container runs with (`config` in the document).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "Labels", default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "ExposedPorts", default)]
    pub exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(rename = "StopSignal", default)]
    pub stop_signal: Option<String>,
}

/// The layers' uncompressed digests, in order (base first).
#[derive(Debug, Clone, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}
