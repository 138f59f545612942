//! Images leaving the store and coming back: [`Store::save`] writes an OCI archive (an OCI
//! image layout in a tar, what `skopeo copy oci-archive:FILE` reads) or a `docker save`
//! archive; [`Store::load_archive`] reads either back; a push (`Store::push`) sends the
//! same blobs to a registry.
//!
//! What leaves is the image as it was pulled: its manifest and config bytes unchanged (so
//! their digests, the image's id, are the same on the other host), and each layer's stored
//! blob. Layers are kept unpacked; a layer whose blob the store does not have (a layer a
//! build made, whose blob is its uncompressed tar stream) is written again from its
//! directory with the one layer tar writer (`layer_tar`), and its sha256 must be its
//! recorded diff id: a mismatch is an error, never a silently different image.

use crate::digest::{Digest, HashingReader};
use crate::error::ImageError;
use crate::oci::{self, Descriptor, OCI_INDEX, OCI_MANIFEST};
use crate::reference::{Reference, Source};
use crate::store::{flock, unique, Store};
use crate::{Image, PullOptions};
use rustix::fs::FlockOperation;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The index annotation that carries an image's full name (as `docker save` writes it).
pub const IMAGE_NAME_ANNOTATION: &str = "io.containerd.image.name";
/// The index annotation that carries a tag (as skopeo and `docker save` write it).
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// An OCI image config's media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// The two archive formats `save` writes and `load` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArchiveFormat {
    /// A tar of an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`).
    OciArchive,
    /// A `docker save` archive (`manifest.json`, the config, uncompressed layer tars).
    DockerArchive,
}

impl std::str::FromStr for ArchiveFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "oci-archive" | "oci" => Ok(ArchiveFormat::OciArchive),
            "docker-archive" | "docker" => Ok(ArchiveFormat::DockerArchive),
            other => Err(format!("{other:?}: expected oci-archive or docker-archive")),
        }
    }
}

impl std::fmt::Display for ArchiveFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ArchiveFormat::OciArchive => "oci-archive",
            ArchiveFormat::DockerArchive => "docker-archive",
        })
    }
}

/// What [`Store::save`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Saved {
    /// The image's id (its config's digest).
    pub id: String,
    /// The manifest's digest (none in a `docker save` archive, which has no manifest).
    pub manifest: Option<String>,
    /// The archive's format.
    pub format: ArchiveFormat,
    /// The file written.
    pub path: PathBuf,
    /// The names written into it.
    pub names: Vec<String>,
    /// Layers written again from their unpacked directories (the store had no blob).
    pub layers_regenerated: usize,
    /// The archive's size.
    pub bytes: u64,
}

/// One layer of an image leaving the store.
#[derive(Debug, Clone)]
pub(crate) struct ExportLayer {
    /// Its descriptor in the manifest.
    pub desc: Descriptor,
    /// Its uncompressed digest.
    pub diff_id: Digest,
    /// Its stored blob, if the store has it.
    pub blob: Option<PathBuf>,
    /// Its unpacked directory.
    pub dir: PathBuf,
}

/// An image leaving the store: its documents and layers.
#[derive(Debug, Clone)]
pub(crate) struct Export {
    pub image: Image,
    pub manifest: Vec<u8>,
    pub manifest_digest: Digest,
    pub manifest_media_type: String,
    pub config: Vec<u8>,
    pub config_digest: Digest,
    pub layers: Vec<ExportLayer>,
}

/// A writer that hashes what passes into the writer it wraps.
struct HashingWriter<W> {
    inner: W,
    hasher: sha2::Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The OCI media type of a layer blob, from its first bytes.
fn sniff_layer_media_type(path: &Path) -> String {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let head = &head[..n];
    if head.starts_with(&[0x1f, 0x8b]) {
        "application/vnd.oci.image.layer.v1.tar+gzip".into()
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "application/vnd.oci.image.layer.v1.tar+zstd".into()
    } else {
        crate::BUILT_LAYER_MEDIA_TYPE.into()
    }
}

impl Store {
    /// The image `reference_or_id` as it leaves the store: its manifest as pulled when the
    /// store has it and every layer's blob, else an OCI manifest made for it (the same
    /// config, so the same id).
    pub(crate) fn export(&self, reference_or_id: &str) -> Result<Export, ImageError> {
        let image = self
            .get(reference_or_id)?
            .ok_or_else(|| ImageError::NotFound(reference_or_id.to_owned()))?;
        let id = Digest::parse(&image.id)?;
        let record = self
            .read_record(&id)?
            .ok_or_else(|| ImageError::NotFound(reference_or_id.to_owned()))?;
        let config_path = self.blob_path(&id);
        let config = std::fs::read(&config_path).map_err(|e| ImageError::Damaged {
            path: config_path.clone(),
            reason: format!("the config of image {id} cannot be read: {e}"),
        })?;
        if Digest::of(&config) != id {
            return Err(ImageError::Damaged {
                path: config_path,
                reason: format!("the config blob is not image {id}'s"),
            });
        }
        let mut layers = Vec::new();
        let mut every_blob = true;
        for l in &record.layers {
            let dir = self
                .layer_path(&l.diff_id)
                .ok_or_else(|| ImageError::Damaged {
                    path: self.layer_dir(&l.diff_id),
                    reason: format!("layer {} of image {id} is missing", l.diff_id),
                })?;
            let blob = self.blob_path(&l.blob);
            if blob.exists() {
                layers.push(ExportLayer {
                    desc: Descriptor {
                        media_type: l.media_type.clone(),
                        digest: l.blob.clone(),
                        size: l.size,
                        platform: None,
                        annotations: Default::default(),
                    },
                    diff_id: l.diff_id.clone(),
                    blob: Some(blob),
                    dir,
                });
            } else {
                every_blob = false;
                let meta = self
                    .layer_meta(&l.diff_id)?
                    .ok_or_else(|| ImageError::Damaged {
                        path: self.layer_dir(&l.diff_id),
                        reason: format!("layer {} has no record", l.diff_id),
                    })?;
                layers.push(ExportLayer {
                    desc: Descriptor {
                        media_type: crate::BUILT_LAYER_MEDIA_TYPE.into(),
                        digest: l.diff_id.clone(),
                        size: meta.unpacked_bytes,
                        platform: None,
                        annotations: Default::default(),
                    },
                    diff_id: l.diff_id.clone(),
                    blob: None,
                    dir,
                });
            }
        }
        if let (Some(m), true) = (&record.manifest, every_blob) {
            if let Ok(bytes) = std::fs::read(self.blob_path(m)) {
                if &Digest::of(&bytes) == m {
                    let doc: oci::Document =
                        serde_json::from_slice(&bytes).map_err(|e| ImageError::Damaged {
                            path: self.blob_path(m),
                            reason: e.to_string(),
                        })?;
                    return Ok(Export {
                        image,
                        manifest_digest: m.clone(),
                        manifest_media_type: doc.media_type.unwrap_or_else(|| OCI_MANIFEST.into()),
                        manifest: bytes,
                        config,
                        config_digest: id,
                        layers,
                    });
                }
            }
        }
        // No manifest as pulled (a built image, a `docker save` archive's, or a blob gone):
        // an OCI manifest made from the record. Deterministic: the same image gives the
        // same manifest on every save and push.
        for l in &mut layers {
            if let Some(b) = &l.blob {
                if l.desc.media_type.starts_with("application/vnd.docker.")
                    || l.desc.media_type.is_empty()
                {
                    l.desc.media_type = sniff_layer_media_type(b);
                }
            }
        }
        let doc = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": id, "size": config.len()},
            "layers": layers.iter().map(|l| serde_json::json!({
                "mediaType": l.desc.media_type, "digest": l.desc.digest, "size": l.desc.size,
            })).collect::<Vec<_>>(),
        });
        let manifest = serde_json::to_vec(&doc)
            .map_err(|e| ImageError::io("encode", self.path(), std::io::Error::other(e)))?;
        Ok(Export {
            image,
            manifest_digest: Digest::of(&manifest),
            manifest_media_type: OCI_MANIFEST.into(),
            manifest,
            config,
            config_digest: id,
            layers,
        })
    }

    /// Writes layer `l`'s blob to the new file `dest`, verified against its digest: the
    /// stored blob, or its tar stream written again from its unpacked directory (then its
    /// sha256 must be its diff id).
    pub(crate) fn layer_blob_to(&self, l: &ExportLayer, dest: &Path) -> Result<(), ImageError> {
        let out =
            std::fs::File::create(dest).map_err(|e| ImageError::io("create a blob", dest, e))?;
        let (digest, what) = match &l.blob {
            Some(blob) => {
                let f = std::fs::File::open(blob)
                    .map_err(|e| ImageError::io("open a blob", blob, e))?;
                let mut r = HashingReader::new(f);
                let mut out = out;
                std::io::copy(&mut r, &mut out)
                    .map_err(|e| ImageError::io("copy a blob", dest, e))?;
                out.sync_all()
                    .map_err(|e| ImageError::io("fsync a blob", dest, e))?;
                (
                    Digest::from_hasher(r.hasher),
                    format!("stored blob {} of layer {}", l.desc.digest, l.diff_id),
                )
            }
            None => {
                let w = HashingWriter {
                    inner: std::io::BufWriter::new(out),
                    hasher: sha2::Sha256::default(),
                };
                let w = crate::layer_tar::write_layer_tar(&l.dir, w)?;
                let file = w
                    .inner
                    .into_inner()
                    .map_err(|e| ImageError::io("write a blob", dest, e.into_error()))?;
                file.sync_all()
                    .map_err(|e| ImageError::io("fsync a blob", dest, e))?;
                (
                    Digest::from_hasher(w.hasher),
                    format!(
                        "layer {}: its tar stream written again from {} (the store has no blob \
                         of it, and a layer unpacked from another tool's tar is not reproduced \
                         byte for byte; pull the image again to get its blob)",
                        l.diff_id,
                        l.dir.display()
                    ),
                )
            }
        };
        if digest != l.desc.digest {
            let _ = std::fs::remove_file(dest);
            return Err(ImageError::DigestMismatch {
                what,
                expected: l.desc.digest.to_string(),
                actual: digest.to_string(),
            });
        }
        Ok(())
    }

    /// Writes layer `l`'s uncompressed tar stream to `dest`, verified against its diff id.
    fn layer_tar_to(&self, l: &ExportLayer, dest: &Path) -> Result<(), ImageError> {
        let Some(blob) = &l.blob else {
            // No blob: the regenerated stream is the uncompressed one (digest = diff id).
            return self.layer_blob_to(l, dest);
        };
        let f = std::fs::File::open(blob).map_err(|e| ImageError::io("open a blob", blob, e))?;
        let what = l.diff_id.to_string();
        let mut r = HashingReader::new(crate::store::decompressed(
            std::io::BufReader::with_capacity(1 << 16, f),
            &what,
        )?);
        let mut out =
            std::fs::File::create(dest).map_err(|e| ImageError::io("create a layer", dest, e))?;
        std::io::copy(&mut r, &mut out).map_err(|e| ImageError::BadLayer {
            layer: l.desc.digest.to_string(),
            reason: format!("decompressing: {e}"),
        })?;
        out.sync_all()
            .map_err(|e| ImageError::io("fsync a layer", dest, e))?;
        let actual = Digest::from_hasher(r.hasher);
        if actual != l.diff_id {
            let _ = std::fs::remove_file(dest);
            return Err(ImageError::DigestMismatch {
                what: format!("layer {}: decompressed blob {}", l.diff_id, l.desc.digest),
                expected: l.diff_id.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }

    /// Writes image `reference_or_id` to the archive `out` in `format`. The file appears
    /// only when complete (written beside it under a temporary name, then renamed).
    pub fn save(
        &self,
        reference_or_id: &str,
        format: ArchiveFormat,
        out: &Path,
    ) -> Result<Saved, ImageError> {
        // Shared: no rm or prune removes a layer while it is being written.
        let _shared = flock(&self.path().join("store.lock"), FlockOperation::LockShared)?;
        let export = self.export(reference_or_id)?;
        let work = self.work()?;
        let names = names_for(reference_or_id, &export.image);
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let file_name = out
            .file_name()
            .ok_or_else(|| {
                ImageError::io(
                    "write the archive",
                    out,
                    std::io::Error::other("not a file name"),
                )
            })?
            .to_string_lossy()
            .into_owned();
        let tmp = parent.join(format!(".{file_name}.{}.tmp", unique()));
        let result = (|| {
            let f = std::fs::File::create(&tmp)
                .map_err(|e| ImageError::io("create the archive", &tmp, e))?;
            let mut b = tar::Builder::new(std::io::BufWriter::new(f));
            let regenerated = match format {
                ArchiveFormat::OciArchive => self.write_oci(&mut b, &export, &names, &work.dir)?,
                ArchiveFormat::DockerArchive => {
                    self.write_docker(&mut b, &export, &names, &work.dir)?
                }
            };
            let w = b
                .into_inner()
                .map_err(|e| ImageError::io("write the archive", &tmp, e))?;
            let f = w
                .into_inner()
                .map_err(|e| ImageError::io("write the archive", &tmp, e.into_error()))?;
            f.sync_all()
                .map_err(|e| ImageError::io("fsync the archive", &tmp, e))?;
            std::fs::rename(&tmp, out).map_err(|e| ImageError::io("write the archive", out, e))?;
            Ok(regenerated)
        })();
        let regenerated = match result {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let bytes = std::fs::metadata(out).map_or(0, |m| m.len());
        Ok(Saved {
            id: export.image.id.clone(),
            manifest: (format == ArchiveFormat::OciArchive)
                .then(|| export.manifest_digest.to_string()),
            format,
            path: std::path::absolute(out).unwrap_or_else(|_| out.to_owned()),
            names,
            layers_regenerated: regenerated,
            bytes,
        })
    }

    fn write_oci<W: Write>(
        &self,
        b: &mut tar::Builder<W>,
        export: &Export,
        names: &[String],
        work: &Path,
    ) -> Result<usize, ImageError> {
        let mut index_entry = serde_json::json!({
            "mediaType": export.manifest_media_type,
            "digest": export.manifest_digest,
            "size": export.manifest.len(),
        });
        if let Some(name) = names.first() {
            let mut ann = serde_json::Map::new();
            ann.insert(IMAGE_NAME_ANNOTATION.into(), name.clone().into());
            if let Ok(r) = Reference::parse(name) {
                if let Some(t) = r.tag {
                    ann.insert(REF_NAME_ANNOTATION.into(), t.into());
                }
            }
            index_entry["annotations"] = serde_json::Value::Object(ann);
        }
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [index_entry],
        }))
        .map_err(|e| ImageError::io("encode", work, std::io::Error::other(e)))?;
        add_dir(b, "blobs/")?;
        add_dir(b, "blobs/sha256/")?;
        add_bytes(b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        add_bytes(b, "index.json", &index)?;
        add_bytes(
            b,
            &format!("blobs/sha256/{}", export.manifest_digest.hex()),
            &export.manifest,
        )?;
        add_bytes(
            b,
            &format!("blobs/sha256/{}", export.config_digest.hex()),
            &export.config,
        )?;
        let mut written = std::collections::BTreeSet::new();
        written.insert(export.manifest_digest.clone());
        written.insert(export.config_digest.clone());
        let mut regenerated = 0;
        for l in &export.layers {
            if !written.insert(l.desc.digest.clone()) {
                continue;
            }
            let tmp = work.join(format!("blob-{}", l.desc.digest.hex()));
            self.layer_blob_to(l, &tmp)?;
            if l.blob.is_none() {
                regenerated += 1;
            }
            add_file(b, &format!("blobs/sha256/{}", l.desc.digest.hex()), &tmp)?;
            let _ = std::fs::remove_file(&tmp);
        }
        Ok(regenerated)
    }

    fn write_docker<W: Write>(
        &self,
        b: &mut tar::Builder<W>,
        export: &Export,
        names: &[String],
        work: &Path,
    ) -> Result<usize, ImageError> {
        let config_name = format!("blobs/sha256/{}", export.config_digest.hex());
        let layer_names: Vec<String> = export
            .layers
            .iter()
            .map(|l| format!("blobs/sha256/{}", l.diff_id.hex()))
            .collect();
        let tags: Vec<&String> = names
            .iter()
            .filter(|n| Reference::parse(n).is_ok_and(|r| r.tag.is_some()))
            .collect();
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name, "RepoTags": tags, "Layers": layer_names,
        }]))
        .map_err(|e| ImageError::io("encode", work, std::io::Error::other(e)))?;
        add_dir(b, "blobs/")?;
        add_dir(b, "blobs/sha256/")?;
        add_bytes(b, "manifest.json", &manifest)?;
        add_bytes(b, &config_name, &export.config)?;
        let mut written = std::collections::BTreeSet::new();
        let mut regenerated = 0;
        for (l, name) in export.layers.iter().zip(&layer_names) {
            if !written.insert(l.diff_id.clone()) {
                continue;
            }
            let tmp = work.join(format!("layer-{}", l.diff_id.hex()));
            self.layer_tar_to(l, &tmp)?;
            if l.blob.is_none() {
                regenerated += 1;
            }
            add_file(b, name, &tmp)?;
            let _ = std::fs::remove_file(&tmp);
        }
        Ok(regenerated)
    }

    /// Loads the archive `file` (an OCI archive or a `docker save` archive; which one is
    /// found from its contents) into the store. The image keeps its manifest and config as
    /// they are in the archive (so its id), and the names the archive gives it; an archive
    /// that names nothing is named by its path (`oci-archive:/abs/file`).
    pub async fn load_archive(&self, file: &Path, opts: &PullOptions) -> Result<Image, ImageError> {
        let format = archive_format(file)?;
        let source = match format {
            ArchiveFormat::OciArchive => Source::OciArchive(file.to_owned()),
            ArchiveFormat::DockerArchive => Source::DockerArchive(file.to_owned()),
        };
        self.pull_source(&source, opts, true).await
    }
}

/// The names an image leaves with: the reference asked for when it is a registry
/// reference, then the image's other registry names.
fn names_for(asked: &str, image: &Image) -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(Source::Registry(r)) = Source::parse(asked) {
        let n = r.to_string();
        if image.references.contains(&n) {
            names.push(n);
        }
    }
    for r in &image.references {
        if !names.contains(r) && matches!(Source::parse(r), Ok(Source::Registry(_))) {
            names.push(r.clone());
        }
    }
    names
}

/// Which archive `file` is: an OCI archive (it has `index.json`) or a `docker save` one
/// (`manifest.json`). A `docker save` of Docker 25 or later has both; it is read as the OCI
/// archive it also is.
pub fn archive_format(file: &Path) -> Result<ArchiveFormat, ImageError> {
    let f = std::fs::File::open(file).map_err(|e| ImageError::io("open the archive", file, e))?;
    let what = file.display().to_string();
    let reader = crate::store::decompressed(std::io::BufReader::new(f), &what)?;
    let mut archive = tar::Archive::new(reader);
    let bad = |reason: String| ImageError::BadManifest {
        what: what.clone(),
        reason,
    };
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    let (mut oci, mut docker) = (false, false);
    for e in entries {
        let e = e.map_err(|e| bad(format!("not a tar archive: {e}")))?;
        let path = e.path_bytes();
        let name = path.strip_prefix(b"./").unwrap_or(&path);
        match name {
            b"index.json" => oci = true,
            b"manifest.json" => docker = true,
            _ => {}
        }
    }
    match (oci, docker) {
        (true, _) => Ok(ArchiveFormat::OciArchive),
        (false, true) => Ok(ArchiveFormat::DockerArchive),
        _ => Err(bad(
            "neither an OCI archive (no index.json) nor a `docker save` archive (no manifest.json)"
                .into(),
        )),
    }
}

fn entry_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

fn tar_err(name: &str, e: std::io::Error) -> ImageError {
    ImageError::io("write the archive", PathBuf::from(name), e)
}

fn add_dir<W: Write>(b: &mut tar::Builder<W>, name: &str) -> Result<(), ImageError> {
    let mut h = entry_header(tar::EntryType::Directory, 0o755, 0);
    b.append_data(&mut h, name, std::io::empty())
        .map_err(|e| tar_err(name, e))
}

fn add_bytes<W: Write>(b: &mut tar::Builder<W>, name: &str, data: &[u8]) -> Result<(), ImageError> {
    let mut h = entry_header(tar::EntryType::Regular, 0o644, data.len() as u64);
    b.append_data(&mut h, name, data)
        .map_err(|e| tar_err(name, e))
}

fn add_file<W: Write>(b: &mut tar::Builder<W>, name: &str, path: &Path) -> Result<(), ImageError> {
    let f = std::fs::File::open(path).map_err(|e| ImageError::io("open a blob", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| ImageError::io("stat a blob", path, e))?
        .len();
    let mut h = entry_header(tar::EntryType::Regular, 0o644, len);
    b.append_data(&mut h, name, f).map_err(|e| tar_err(name, e))
}
