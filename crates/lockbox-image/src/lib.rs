//! OCI images without a daemon: references and local sources, a small registry client, a
//! content-addressed store under lockbox's state directory, and an unprivileged layer
//! unpack whose every write is resolved beneath the layer's root.
//!
//! A pulled [`Image`] is a stack of read-only layer directories in overlayfs format
//! ([`Image::layers`], top first), shared by every image that has the same layer, plus the
//! config a sandbox runs with ([`ImageConfig`]). `lockbox-confine` mounts the layers as the
//! lowers of a sandbox's root; nothing is copied.
//!
//! ## Why a registry client of our own
//!
//! The pull side of the distribution protocol is three requests (manifest, blob, token), and
//! lockbox needs bounds that `oci-client` does not give: manifests, indexes, configs and
//! tokens are read up to [`PullOptions::max_document_bytes`] and refused beyond; at most
//! [`registry::MAX_REDIRECTS`] redirects, never from https to http; plain http only for
//! loopback registries or those named in [`PullOptions::insecure_registries`]. `oci-client`
//! would also bring a second major of reqwest (0.13), chrono, regex, strum and several
//! proc-macro crates into the build. See [`registry`].
//!
//! ## What is verified
//!
//! Every blob's sha256 and size against its descriptor as it streams into a temp file, before
//! it is renamed into the store; a manifest against its pinned digest or the registry's
//! `Docker-Content-Digest`; every layer's uncompressed stream against the config's
//! `rootfs.diff_ids`. See docs/images.md.

mod archive;
pub mod artifact;
pub mod build;
mod digest;
pub mod dockerfile;
mod error;
mod layer_tar;
pub mod oci;
mod push;
mod reference;
pub mod registry;
mod sandbox;
mod source;
mod store;
mod transfer;
mod unpack;

pub use archive::{archive_format, ArchiveFormat, Saved};
pub use digest::Digest;
pub use error::ImageError;
pub use push::{PushOptions, Pushed};
pub use reference::{Reference, Source};
pub use sandbox::{apply, process_holder, ProcessImage, PullPolicy, DEFAULT_PATH};
pub use store::{BuildDir, Removed, Store, BUILT_LAYER_MEDIA_TYPE};
pub use transfer::{receive, sha256_hex, Outgoing, ReceiveError};
pub use unpack::{remove_tree, unpack, UnpackReport, OPAQUE_XATTR};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// One image in the store.
#[derive(Debug, Clone, Serialize)]
pub struct Image {
    /// The config's digest (`sha256:…`), as `docker images --no-trunc` shows it.
    pub id: String,
    /// The names it has in the store (`docker.io/library/busybox:1.36`, `oci:/abs/dir:tag`).
    pub references: Vec<String>,
    /// The unpacked layer directories (overlayfs lowers), TOP FIRST.
    pub layers: Vec<PathBuf>,
    /// What a sandbox of it runs with.
    pub config: ImageConfig,
    /// The manifest's digest (none for a legacy `docker save` archive).
    pub manifest: Option<String>,
    /// Where it was pulled from.
    pub source: String,
    /// `os/arch[/variant]`.
    pub platform: String,
    /// The config's `created` time, as written.
    pub created: Option<String>,
    /// When it was pulled (seconds since the epoch).
    pub pulled_at: u64,
    /// Each layer, top first (the same order as `layers`).
    pub layer_info: Vec<LayerInfo>,
    /// Who holds it (sandboxes, snapshots): `rm` refuses while any does.
    pub holders: Vec<String>,
}

/// One layer of an image.
#[derive(Debug, Clone, Serialize)]
pub struct LayerInfo {
    /// The uncompressed content's digest.
    pub diff_id: String,
    /// The (compressed) blob's digest.
    pub blob: String,
    /// The blob's media type.
    pub media_type: String,
    /// The blob's size.
    pub size: u64,
    /// The uncompressed tar stream's size.
    pub unpacked_bytes: u64,
    /// The unpacked directory.
    pub path: PathBuf,
    /// Entries whose setuid/setgid bits were stripped.
    pub setid_stripped: Vec<String>,
    /// Entries not unpacked (device nodes, FIFOs).
    pub skipped: Vec<String>,
}

/// The part of an image's config a sandbox runs with.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageConfig {
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    /// The working directory.
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`.
    pub user: Option<String>,
    /// The entrypoint.
    pub entrypoint: Option<Vec<String>>,
    /// The default command (arguments of the entrypoint, if any).
    pub cmd: Option<Vec<String>>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Exposed ports (`80/tcp`).
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    /// The stop signal.
    #[serde(default)]
    pub stop_signal: Option<String>,
}

/// One line of `lockbox image ls`.
#[derive(Debug, Clone, Serialize)]
pub struct ImageSummary {
    /// The image's id.
    pub id: String,
    /// Its names.
    pub references: Vec<String>,
    /// How many layers.
    pub layers: usize,
    /// The layers' uncompressed size (shared layers counted in every image).
    pub unpacked_bytes: u64,
    /// The config's `created`.
    pub created: Option<String>,
    /// When it was pulled.
    pub pulled_at: u64,
    /// Who holds it.
    pub holders: Vec<String>,
}

/// A platform, `os/arch[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// `amd64`, `arm64`, ...
    pub architecture: String,
    /// `v7`, `v8`, ... if given.
    pub variant: Option<String>,
}

impl Platform {
    /// Parses `os/arch[/variant]`.
    pub fn parse(text: &str) -> Result<Platform, ImageError> {
        let parts: Vec<&str> = text.split('/').collect();
        let ok =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: (*os).into(),
                architecture: (*arch).into(),
                variant: None,
            }),
            [os, arch, v] if ok(os) && ok(arch) && ok(v) => Ok(Platform {
                os: (*os).into(),
                architecture: (*arch).into(),
                variant: Some((*v).into()),
            }),
            _ => Err(ImageError::BadPlatform(text.to_owned())),
        }
    }

    /// The host's platform in OCI's names (`linux/amd64` on x86_64).
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            "loongarch64" => "loong64",
            other => other,
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// Whether an index entry of `os/arch/variant` is this platform (any variant when
    /// none is asked for).
    pub fn matches(&self, os: &str, arch: &str, variant: Option<&str>) -> bool {
        self.os == os
            && self.architecture == arch
            && (self.variant.is_none() || self.variant.as_deref() == variant)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The platform to pick from an index (default: the host's).
    pub platform: Platform,
    /// Refuse an image that is not for `platform` (a single-platform image of another one)
    /// rather than take it (the default, as Docker does without `--platform`). Set by
    /// `--platform` and `FROM --platform`.
    pub exact_platform: bool,
    /// Registries that may be reached over plain http (loopback ones always may).
    pub insecure_registries: Vec<String>,
    /// The largest manifest, index, config or token answer read (default 4 MiB).
    pub max_document_bytes: u64,
    /// The largest layer, compressed or unpacked (default 32 GiB): a decompression bomb
    /// stops here.
    pub max_layer_bytes: u64,
    /// Layers downloaded and unpacked at once (default 3).
    pub parallel: usize,
    /// Show a progress line on stderr (the CLI sets it when stderr is a terminal).
    pub progress: bool,
    /// The credentials file (containers-auth.json / docker config.json format); default
    /// `$REGISTRY_AUTH_FILE`, else `~/.docker/config.json`.
    pub auth_file: Option<PathBuf>,
    /// Which registry certificates are trusted besides the system's roots.
    pub tls: Tls,
}

/// Trust for registries spoken to over https: the system's roots, plus the CA
/// certificates given here. A registry that has any (from either list) is spoken to over
/// https even on loopback (which is plain http otherwise), unless `--insecure-registry`
/// names it.
#[derive(Debug, Clone)]
pub struct Tls {
    /// PEM files of CA certificates trusted for every registry (`--ca-cert FILE`).
    pub ca_certs: Vec<PathBuf>,
    /// Directories in the containers `certs.d` layout: `DIR/HOST[:PORT]/*.crt` are CA
    /// certificates (PEM) trusted for that registry. Default: `~/.config/containers/certs.d`
    /// (`$XDG_CONFIG_HOME`), `/etc/containers/certs.d`, `/etc/docker/certs.d`.
    pub certs_dirs: Vec<PathBuf>,
}

impl Default for Tls {
    fn default() -> Self {
        let mut certs_dirs: Vec<PathBuf> = dirs::config_dir()
            .map(|c| c.join("containers/certs.d"))
            .into_iter()
            .collect();
        certs_dirs.push("/etc/containers/certs.d".into());
        certs_dirs.push("/etc/docker/certs.d".into());
        Tls {
            ca_certs: Vec::new(),
            certs_dirs,
        }
    }
}

/// The default bound on manifests, indexes, configs and token answers.
pub const DEFAULT_MAX_DOCUMENT_BYTES: u64 = 4 << 20;
/// The default bound on the store (`--max-store`, `$LOCKBOX_MAX_STORE`): after a pull, the
/// least recently used images no one holds are removed until the store takes at most this
/// (they can be pulled again). 0: no bound.
pub const DEFAULT_MAX_STORE: u64 = 20 << 30;
/// The default bound on one layer.
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 32 << 30;

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            platform: Platform::host(),
            exact_platform: false,
            insecure_registries: Vec::new(),
            max_document_bytes: DEFAULT_MAX_DOCUMENT_BYTES,
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
            parallel: 3,
            progress: false,
            auth_file: None,
            tls: Tls::default(),
        }
    }
}

/// What `prune` removes.
#[derive(Debug, Clone, Default)]
pub struct PruneOptions {
    /// Every image no one holds, not only those without a name.
    pub all: bool,
}

/// What `prune` removed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// The images' ids.
    pub images_removed: Vec<String>,
    /// Unpacked layers removed.
    pub layers_removed: u64,
    /// Blobs removed.
    pub blobs_removed: u64,
    /// Bytes freed.
    pub bytes_freed: u64,
}

/// Rewrites the progress line on stderr (only called when the caller asked for progress).
fn eprint_progress(line: &str) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "\r\x1b[2K{line}");
    let _ = e.flush();
}

fn eprint_line(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
