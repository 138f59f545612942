//! Resolving a [`Source`] to the documents of one image: its manifest (if any), its config
//! and its layer descriptors, and where their blobs can be read from (a registry, an OCI
//! layout directory, or the files of an unpacked `docker save` archive).

use crate::digest::Digest;
use crate::error::ImageError;
use crate::oci::{self, Descriptor, Parsed};
use crate::reference::Source;
use crate::registry::Registry;
use crate::{Platform, PullOptions};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where a resolved image's blobs are read from.
#[derive(Debug)]
pub enum BlobFrom {
    /// A registry repository.
    Registry(Registry),
    /// An OCI layout directory (`blobs/sha256/<hex>`).
    Layout(PathBuf),
    /// A `docker save` archive unpacked in a work directory: file per digest.
    Files(PathBuf, HashMap<Digest, PathBuf>),
}

/// One image, resolved.
#[derive(Debug)]
pub struct Resolved {
    /// The manifest's bytes and digest (none for a legacy `docker save` archive).
    pub manifest: Option<(Vec<u8>, Digest)>,
    /// The config's bytes, verified against `config_digest`.
    pub config: Vec<u8>,
    /// The config's digest: the image's id.
    pub config_digest: Digest,
    /// The layers, base first.
    pub layers: Vec<Descriptor>,
    /// Names the image gets in the store besides the source's own.
    pub extra_names: Vec<String>,
    /// Names an archive's index gives its image (`io.containerd.image.name`, as `docker
    /// save` and `lockbox image save` write it): used by `load` only.
    pub annotated_names: Vec<String>,
    /// Where the layers' blobs are.
    pub from: BlobFrom,
}

/// Resolves `source`; `work` is a private directory archives may be unpacked into.
pub async fn resolve(
    source: &Source,
    opts: &PullOptions,
    work: &Path,
) -> Result<Resolved, ImageError> {
    let limit = opts.max_document_bytes;
    match source {
        Source::Registry(r) => {
            let registry = Registry::new(
                r,
                &opts.insecure_registries,
                opts.auth_file.as_deref(),
                &opts.tls,
            )?;
            let what = r.to_string();
            let (mut bytes, mut digest) = registry
                .manifest(&r.manifest_ref(), r.digest.as_ref(), limit)
                .await?;
            for _ in 0..4 {
                match oci::parse_document(&bytes, &format!("manifest of {what}"))? {
                    Parsed::Index(list) => {
                        let pick = pick_platform(&list, &opts.platform, &what)?;
                        (bytes, digest) = registry
                            .manifest(pick.digest.as_str(), Some(&pick.digest), limit)
                            .await?;
                    }
                    Parsed::Manifest { config, layers } => {
                        check_size(&config, limit, &what)?;
                        let cfg = registry.blob_bytes(&config.digest, limit).await?;
                        return Ok(Resolved {
                            manifest: Some((bytes, digest)),
                            config: cfg,
                            config_digest: config.digest,
                            layers,
                            extra_names: Vec::new(),
                            annotated_names: Vec::new(),
                            from: BlobFrom::Registry(registry),
                        });
                    }
                }
            }
            Err(ImageError::BadManifest {
                what,
                reason: "indexes nested more than 4 deep".into(),
            })
        }
        Source::OciDir { dir, tag } => from_layout(dir, tag.as_deref(), opts, &source.name()),
        Source::OciArchive(file) => {
            let dir = work.join("archive");
            extract(file, &dir)?;
            from_layout(&dir, None, opts, &source.name())
        }
        Source::DockerArchive(file) => {
            let dir = work.join("archive");
            extract(file, &dir)?;
            from_docker_archive(&dir, limit, &source.name())
        }
    }
}

fn check_size(d: &Descriptor, limit: u64, what: &str) -> Result<(), ImageError> {
    if d.size > limit {
        return Err(ImageError::TooLarge {
            what: format!("config of {what} ({} bytes)", d.size),
            limit,
        });
    }
    Ok(())
}

/// The index entry for `platform` (or the host's).
fn pick_platform<'a>(
    list: &'a [Descriptor],
    platform: &Platform,
    what: &str,
) -> Result<&'a Descriptor, ImageError> {
    list.iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| platform.matches(&p.os, &p.architecture, p.variant.as_deref()))
        })
        .ok_or_else(|| ImageError::NoPlatform {
            reference: what.to_owned(),
            platform: platform.to_string(),
            available: list
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .filter(|p| p.os != "unknown")
                .map(|p| match &p.variant {
                    Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                    None => format!("{}/{}", p.os, p.architecture),
                })
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Opens `rel` beneath `root` (symlinks allowed only if they stay beneath it).
pub fn open_beneath(root: &Path, rel: &Path) -> Result<std::fs::File, ImageError> {
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ImageError::io("open a directory", root, e.into()))?;
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| ImageError::io("open a file", root.join(rel), e.into()))?;
    Ok(std::fs::File::from(fd))
}

/// Reads a whole small file beneath `root`, at most `limit` bytes.
fn read_small(root: &Path, rel: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    let f = open_beneath(root, rel)?;
    let mut out = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| ImageError::io("read a file", root.join(rel), e))?;
    if out.len() as u64 > limit {
        return Err(ImageError::TooLarge {
            what: root.join(rel).display().to_string(),
            limit,
        });
    }
    Ok(out)
}

fn blob_rel(d: &Digest) -> PathBuf {
    PathBuf::from("blobs/sha256").join(d.hex())
}

/// A blob of an OCI layout, verified.
fn layout_blob(dir: &Path, d: &Descriptor, limit: u64) -> Result<Vec<u8>, ImageError> {
    let bytes = read_small(dir, &blob_rel(&d.digest), limit)?;
    let actual = Digest::of(&bytes);
    if actual != d.digest {
        return Err(ImageError::DigestMismatch {
            what: format!("{}: blob {}", dir.display(), d.digest),
            expected: d.digest.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(bytes)
}

fn from_layout(
    dir: &Path,
    tag: Option<&str>,
    opts: &PullOptions,
    what: &str,
) -> Result<Resolved, ImageError> {
    let limit = opts.max_document_bytes;
    let index = read_small(dir, Path::new("index.json"), limit)?;
    let list = match oci::parse_document(&index, &format!("{}/index.json", dir.display()))? {
        Parsed::Index(list) => list,
        Parsed::Manifest { .. } => {
            return Err(ImageError::BadManifest {
                what: format!("{}/index.json", dir.display()),
                reason: "not an index".into(),
            })
        }
    };
    let name_of = |d: &Descriptor| {
        d.annotations
            .get("org.opencontainers.image.ref.name")
            .cloned()
    };
    let chosen = match tag {
        Some(t) => list
            .iter()
            .find(|d| name_of(d).as_deref() == Some(t))
            .ok_or_else(|| ImageError::BadReference {
                reference: what.to_owned(),
                reason: format!(
                    "no manifest tagged {t:?} in its index.json (tags: {})",
                    list.iter()
                        .filter_map(name_of)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?,
        None if list.len() == 1 => &list[0],
        None => match list
            .iter()
            .find(|d| d.platform.is_some() || d.media_type.contains("index"))
        {
            // Several entries: they may be one image's platforms.
            Some(_) => pick_platform(&list, &opts.platform, what)?,
            None => {
                return Err(ImageError::BadReference {
                    reference: what.to_owned(),
                    reason: format!(
                        "its index.json has {} manifests; name one as oci:DIR:TAG (tags: {})",
                        list.len(),
                        list.iter()
                            .filter_map(name_of)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
            }
        },
    };
    let annotated: Vec<String> = chosen
        .annotations
        .get(crate::archive::IMAGE_NAME_ANNOTATION)
        .and_then(|n| crate::reference::Reference::parse(n).ok())
        .map(|r| r.to_string())
        .into_iter()
        .collect();
    let mut desc = chosen.clone();
    for _ in 0..4 {
        let bytes = layout_blob(dir, &desc, limit)?;
        match oci::parse_document(&bytes, &format!("{what}: manifest {}", desc.digest))? {
            Parsed::Index(list) => desc = pick_platform(&list, &opts.platform, what)?.clone(),
            Parsed::Manifest { config, layers } => {
                check_size(&config, limit, what)?;
                let cfg = layout_blob(dir, &config, limit)?;
                return Ok(Resolved {
                    manifest: Some((bytes, desc.digest)),
                    config: cfg,
                    config_digest: config.digest,
                    layers,
                    extra_names: Vec::new(),
                    annotated_names: annotated.clone(),
                    from: BlobFrom::Layout(dir.to_owned()),
                });
            }
        }
    }
    Err(ImageError::BadManifest {
        what: what.to_owned(),
        reason: "indexes nested more than 4 deep".into(),
    })
}

#[derive(serde::Deserialize)]
struct DockerManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn from_docker_archive(dir: &Path, limit: u64, what: &str) -> Result<Resolved, ImageError> {
    let bytes = read_small(dir, Path::new("manifest.json"), limit)?;
    let entries: Vec<DockerManifestEntry> =
        serde_json::from_slice(&bytes).map_err(|e| ImageError::BadManifest {
            what: format!("{what}: manifest.json"),
            reason: e.to_string(),
        })?;
    let entry = match entries.as_slice() {
        [one] => one,
        [] => {
            return Err(ImageError::BadManifest {
                what: format!("{what}: manifest.json"),
                reason: "no image in it".into(),
            })
        }
        _ => {
            return Err(ImageError::BadManifest {
                what: format!("{what}: manifest.json"),
                reason: format!(
                    "{} images in one archive; only single-image archives are supported",
                    entries.len()
                ),
            })
        }
    };
    let config = read_small(dir, Path::new(&entry.config), limit)?;
    let config_digest = Digest::of(&config);
    let mut files = HashMap::new();
    let mut layers = Vec::new();
    for rel in &entry.layers {
        let mut f = open_beneath(dir, Path::new(rel))?;
        let mut h = crate::digest::HashingReader::new(&mut f);
        std::io::copy(&mut h, &mut std::io::sink())
            .map_err(|e| ImageError::io("read a layer", dir.join(rel), e))?;
        let size = h.count;
        let digest = Digest::from_hasher(h.hasher);
        files.insert(digest.clone(), PathBuf::from(rel));
        layers.push(Descriptor {
            media_type: "application/vnd.docker.image.rootfs.diff.tar".into(),
            digest,
            size,
            platform: None,
            annotations: Default::default(),
        });
    }
    let mut extra_names = Vec::new();
    for t in entry.repo_tags.iter().flatten() {
        if let Ok(r) = crate::reference::Reference::parse(t) {
            extra_names.push(r.to_string());
        }
    }
    Ok(Resolved {
        manifest: None,
        config,
        config_digest,
        layers,
        extra_names,
        annotated_names: Vec::new(),
        from: BlobFrom::Files(dir.to_owned(), files),
    })
}

/// Unpacks an archive (OCI layout or `docker save`) into `dir` with the same confined
/// unpack as layers: nothing lands outside it.
fn extract(file: &Path, dir: &Path) -> Result<(), ImageError> {
    std::fs::create_dir(dir).map_err(|e| ImageError::io("create a work directory", dir, e))?;
    let f = std::fs::File::open(file).map_err(|e| ImageError::io("open the archive", file, e))?;
    let reader =
        crate::store::decompressed(std::io::BufReader::new(f), &file.display().to_string())?;
    crate::unpack::unpack(reader, dir, &file.display().to_string())?;
    Ok(())
}
