//! Image references (`busybox`, `docker.io/library/busybox:1.36`, `host:5000/repo@sha256:…`)
//! and local sources (`oci:DIR[:TAG]`, `oci-archive:FILE`, `docker-archive:FILE`).

use crate::error::ImageError;
use crate::Digest;
use std::fmt;
use std::path::PathBuf;

/// Docker Hub's name in references, and the host its API is served from.
pub const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A registry reference, normalised as Docker does: the registry defaults to docker.io,
/// a one-component Docker Hub name gets `library/`, and the tag defaults to `latest`
/// unless a digest is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry host, with its port if any (`docker.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// Repository path (`library/busybox`).
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Manifest digest, if pinned.
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses a reference as `docker pull` reads it.
    pub fn parse(text: &str) -> Result<Reference, ImageError> {
        let bad = |reason: &str| ImageError::BadReference {
            reference: text.to_owned(),
            reason: reason.to_owned(),
        };
        if text.is_empty() || text.len() > 4096 {
            return Err(bad("empty or longer than 4096 characters"));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((r, d)) => (r, Some(Digest::parse(d)?)),
            None => (text, None),
        };
        // A tag is after the last ':' that follows the last '/' (a port's ':' comes before one).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(tag) = tag {
            let ok = !tag.is_empty()
                && tag.len() <= 128
                && tag
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
                && !tag.starts_with(['.', '-']);
            if !ok {
                return Err(bad(
                    "a tag is 1-128 characters of [A-Za-z0-9_.-], not starting with . or -",
                ));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_owned(), path.to_owned())
            }
            _ => (DOCKER_HUB.to_owned(), name.to_owned()),
        };
        let registry = if matches!(
            registry.as_str(),
            "index.docker.io" | "registry-1.docker.io"
        ) {
            DOCKER_HUB.to_owned()
        } else {
            registry
        };
        if registry.is_empty()
            || !registry
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        {
            return Err(bad(
                "the registry host has characters other than letters, digits, . - : [ ]",
            ));
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.chars().all(|ch| {
                    ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-')
                })
                && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
                && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
        };
        if !repository.split('/').all(component_ok) {
            return Err(bad(
                "a repository name is lower-case letters, digits and . _ - between slashes",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, None) => Some("latest".to_owned()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host (and port) to connect to: Docker Hub's API lives elsewhere than its name.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What to ask the manifest endpoint for: the digest when pinned, else the tag.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_owned(),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A registry.
    Registry(Reference),
    /// An OCI image layout directory, optionally one tag of it (`org.opencontainers.image.ref.name`).
    OciDir {
        /// The layout's directory.
        dir: PathBuf,
        /// The tag, if given.
        tag: Option<String>,
    },
    /// A tar archive of an OCI image layout.
    OciArchive(PathBuf),
    /// A `docker save` archive.
    DockerArchive(PathBuf),
}

impl Source {
    /// Parses `oci:DIR[:TAG]`, `oci-archive:FILE`, `docker-archive:FILE`, or a registry
    /// reference (optionally written `docker://REF`, as skopeo does).
    pub fn parse(text: &str) -> Result<Source, ImageError> {
        let empty = |kind: &str| ImageError::BadReference {
            reference: text.to_owned(),
            reason: format!("{kind}: needs a path after the colon"),
        };
        if let Some(rest) = text.strip_prefix("oci:") {
            // DIR:TAG: the tag is after the last ':' if what follows has no '/'.
            let (dir, tag) = match rest.rsplit_once(':') {
                Some((d, t)) if !t.contains('/') && !d.is_empty() => (d, Some(t.to_owned())),
                _ => (rest, None),
            };
            if dir.is_empty() {
                return Err(empty("oci"));
            }
            return Ok(Source::OciDir {
                dir: PathBuf::from(dir),
                tag,
            });
        }
        if let Some(rest) = text.strip_prefix("oci-archive:") {
            if rest.is_empty() {
                return Err(empty("oci-archive"));
            }
            return Ok(Source::OciArchive(PathBuf::from(rest)));
        }
        if let Some(rest) = text.strip_prefix("docker-archive:") {
            if rest.is_empty() {
                return Err(empty("docker-archive"));
            }
            return Ok(Source::DockerArchive(PathBuf::from(rest)));
        }
        let reference = text.strip_prefix("docker://").unwrap_or(text);
        Ok(Source::Registry(Reference::parse(reference)?))
    }

    /// How the store names an image from this source: the normalised registry reference,
    /// or the local source with its path made absolute.
    pub fn name(&self) -> String {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        match self {
            Source::Registry(r) => r.to_string(),
            Source::OciDir { dir, tag } => match tag {
                Some(t) => format!("oci:{}:{t}", abs(dir).display()),
                None => format!("oci:{}", abs(dir).display()),
            },
            Source::OciArchive(p) => format!("oci-archive:{}", abs(p).display()),
            Source::DockerArchive(p) => format!("docker-archive:{}", abs(p).display()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn short_names_are_docker_hub_library_latest() {
        let r = Reference::parse("busybox").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/busybox:latest");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        let r = Reference::parse("docker.io/library/busybox:1.36").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/busybox:1.36");
        let r = Reference::parse("someone/tool:v2").unwrap();
        assert_eq!(r.to_string(), "docker.io/someone/tool:v2");
    }

    #[test]
    fn host_port_and_digest_references() {
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("127.0.0.1:5000/team/app@{d}")).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/app");
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), d);
        let r = Reference::parse("localhost/app:1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.tag.as_deref()),
            ("localhost", Some("1"))
        );
    }

    #[test]
    fn malformed_references_name_what_is_wrong() {
        for bad in [
            "",
            "UPPER/case",
            "busybox:",
            "a//b",
            "busybox@sha256:12",
            "x:-tag",
        ] {
            let e = Reference::parse(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    ImageError::BadReference { .. } | ImageError::BadDigest(_)
                ),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn local_sources() {
        assert_eq!(
            Source::parse("oci:/x/lay:v1").unwrap(),
            Source::OciDir {
                dir: "/x/lay".into(),
                tag: Some("v1".into())
            }
        );
        assert_eq!(
            Source::parse("oci:/x/lay").unwrap(),
            Source::OciDir {
                dir: "/x/lay".into(),
                tag: None
            }
        );
        assert_eq!(
            Source::parse("docker-archive:a.tar").unwrap(),
            Source::DockerArchive("a.tar".into())
        );
        assert!(Source::parse("oci-archive:").is_err());
    }
}
