//! [`ImageError`]: how a pull, an unpack or a store operation fails. Each variant names the
//! step and the reference, digest, path or entry it failed on.

use std::path::PathBuf;

/// An image operation's failure.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The reference (or local source) cannot be parsed.
    #[error("image reference {reference:?}: {reason}")]
    BadReference {
        /// What was given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `--platform` is not `os/arch[/variant]`.
    #[error("--platform {0:?}: expected os/arch[/variant], e.g. linux/amd64 or linux/arm/v7")]
    BadPlatform(String),
    /// No image has this reference or id in the store.
    #[error("no image {0:?} in the store (see `lockbox image ls`)")]
    NotFound(String),
    /// A short id matches more than one image.
    #[error("image id prefix {prefix:?} is ambiguous: it matches {matches}")]
    Ambiguous {
        /// The prefix given.
        prefix: String,
        /// The ids it matches, comma-separated.
        matches: String,
    },
    /// `rm` of an image that a sandbox or snapshot holds.
    #[error("image {id} is in use by {}: not removed", holders.join(", "))]
    Held {
        /// The image's id.
        id: String,
        /// Who holds it (sandbox or snapshot names).
        holders: Vec<String>,
    },
    /// The image's config cannot be run as it is (an unknown `User`, no command).
    #[error("image {image}: {reason}")]
    BadConfig {
        /// The image's id.
        image: String,
        /// What is wrong.
        reason: String,
    },
    /// A holder name that cannot be a file name.
    #[error("holder name {0:?}: must be 1-200 characters of [A-Za-z0-9._-], not . or ..")]
    BadHolder(String),
    /// The registry (or the network to it) failed.
    #[error("registry {registry}: {step}: {reason}")]
    Registry {
        /// The registry host.
        registry: String,
        /// What was being fetched (`manifest busybox:1.36`, `blob sha256:…`, `token`).
        step: String,
        /// What went wrong.
        reason: String,
    },
    /// The registry wants credentials and none (or wrong ones) were given.
    #[error("registry {registry}: authentication failed ({reason}); credentials are read from $REGISTRY_AUTH_FILE, else ~/.docker/config.json")]
    Unauthorized {
        /// The registry host.
        registry: String,
        /// What the registry answered.
        reason: String,
    },
    /// A manifest, index or config larger than the bound.
    #[error("{what}: larger than the {limit}-byte bound")]
    TooLarge {
        /// What was being read.
        what: String,
        /// The bound.
        limit: u64,
    },
    /// Content whose sha256 is not the digest that names it.
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was verified (`blob sha256:…`, `layer 2 (diff id)`).
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// A blob shorter or longer than its descriptor says.
    #[error("{what}: {actual} bytes, but its descriptor says {expected}")]
    SizeMismatch {
        /// What was read.
        what: String,
        /// The size in the descriptor.
        expected: u64,
        /// The bytes received (or the first count beyond the size).
        actual: u64,
    },
    /// A digest string that is not `sha256:` and 64 lower-case hex digits.
    #[error("digest {0:?}: only sha256 digests (sha256:<64 hex digits>) are supported")]
    BadDigest(String),
    /// A manifest, index or config that cannot be used.
    #[error("{what}: {reason}")]
    BadManifest {
        /// Which document.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An index without a manifest for the wanted platform.
    #[error("{reference}: no image for platform {platform} (it has: {available})")]
    NoPlatform {
        /// The reference.
        reference: String,
        /// The wanted platform.
        platform: String,
        /// The platforms it has.
        available: String,
    },
    /// A layer that cannot be unpacked safely; nothing of it is kept.
    #[error("layer {layer}: entry {entry:?}: {reason}")]
    HostileEntry {
        /// The layer's digest.
        layer: String,
        /// The tar entry's name.
        entry: String,
        /// Why it is refused.
        reason: String,
    },
    /// A layer stream that is not a (compressed) tar archive, or is cut short.
    #[error("layer {layer}: {reason}")]
    BadLayer {
        /// The layer's digest.
        layer: String,
        /// What is wrong.
        reason: String,
    },
    /// An unpacked layer beyond the bound (a decompression bomb, or just too big).
    #[error("layer {layer}: unpacks to more than {limit} bytes (--max-layer-size); refused")]
    LayerTooLarge {
        /// The layer's digest.
        layer: String,
        /// The bound.
        limit: u64,
    },
    /// A store file or directory could not be read or written.
    #[error("image store {}: {step}: {source}", path.display())]
    Io {
        /// What was being done.
        step: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A CA certificate file (`--ca-cert`, `certs.d`) that holds no usable certificate.
    #[error("CA certificate {}: {reason}", path.display())]
    BadCaCert {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A store record that cannot be parsed.
    #[error("image store {}: damaged record: {reason}", path.display())]
    Damaged {
        /// The record's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl ImageError {
    /// The `lockbox image` exit code for this error: 2 a bad reference, flag or unknown
    /// image; 5 the image is in use; 4 the store could not be read or written; 1 the pull
    /// failed (registry, network, digest, a hostile or damaged layer).
    pub fn exit_code(&self) -> u8 {
        match self {
            ImageError::BadReference { .. }
            | ImageError::BadPlatform(_)
            | ImageError::NotFound(_)
            | ImageError::Ambiguous { .. }
            | ImageError::BadHolder(_)
            | ImageError::BadDigest(_)
            | ImageError::BadCaCert { .. } => 2,
            ImageError::Held { .. } => 5,
            ImageError::Io { .. } | ImageError::Damaged { .. } => 4,
            _ => 1,
        }
    }

    /// The stable error code (`lockbox-codes`) of this error.
    pub fn code(&self) -> lockbox_codes::ErrorCode {
        use lockbox_codes::ErrorCode as C;
        match self {
            ImageError::BadReference { .. }
            | ImageError::BadPlatform(_)
            | ImageError::Ambiguous { .. }
            | ImageError::BadHolder(_)
            | ImageError::BadDigest(_)
            | ImageError::BadCaCert { .. } => C::BadReference,
            ImageError::NotFound(_) => C::ImageNotFound,
            ImageError::Held { .. } => C::ImageInUse,
            ImageError::NoPlatform { .. } => C::NoPlatform,
            ImageError::Registry { .. } => C::RegistryFailed,
            ImageError::Unauthorized { .. } => C::RegistryAuth,
            ImageError::DigestMismatch { .. } | ImageError::SizeMismatch { .. } => {
                C::DigestMismatch
            }
            ImageError::TooLarge { .. }
            | ImageError::BadManifest { .. }
            | ImageError::HostileEntry { .. }
            | ImageError::BadLayer { .. }
            | ImageError::LayerTooLarge { .. }
            | ImageError::BadConfig { .. } => C::BadImage,
            ImageError::Io { .. } | ImageError::Damaged { .. } => C::ImageStore,
        }
    }

    /// An I/O error of `step` on `path`.
    pub(crate) fn io(step: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ImageError::Io {
            step,
            path: path.into(),
            source,
        }
    }
}
