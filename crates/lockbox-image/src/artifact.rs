//! Directories in overlayfs format (a snapshot's layer, the trees kept beside it) moved as
//! one OCI artifact: an OCI image layout in a tar stream whose manifest comes first, so
//! that a receiver checks the manifest against the digest it was given before it reads
//! anything else, and then every blob against the manifest as it streams in.
//!
//! ```text
//! oci-layout                       {"imageLayoutVersion": "1.0.0"}
//! blobs/sha256/<manifest>          the manifest: its sha256 is the artifact's digest
//! blobs/sha256/<config>            the caller's record (JSON), of the config media type
//! blobs/sha256/<tree>...           each tree as a layer tar stream (`.wh.` whiteouts,
//!                                  `.wh..wh..opq` opaque directories), titled by its name
//! index.json                       names the manifest (the layout's entry point)
//! ```
//!
//! The trees are written as tar streams twice: once to hash them (the manifest needs each
//! digest and size before its own), once to send. Their writer (`layer_tar`) gives the
//! same bytes for the same directory, so nothing is spooled to disk; a tree that changed
//! in between (it must not: the callers send immutable snapshots) gives a blob the
//! receiver refuses. The receiver unpacks each tree as it streams, with a pull's checks
//! (`unpack`: nothing written through a symlink or outside the directory), and fails on
//! the first blob whose digest or size is not the manifest's; the caller throws away what
//! it unpacked (the directories it handed out) and uses nothing before
//! [`receive`] returned `Ok`.

use crate::digest::HashingReader;
use crate::error::ImageError;
use crate::layer_tar::{write_layer_tar, HashingSink};
use crate::oci::{Descriptor, OCI_INDEX, OCI_MANIFEST};
use crate::Digest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The media type of each tree's blob: an uncompressed OCI layer.
pub const TREE_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation that names a tree (OCI's own, as `oras` names files).
pub const TITLE: &str = "org.opencontainers.image.title";
/// The largest manifest, config or index read (as for a pull).
pub const MAX_DOCUMENT: u64 = 4 * 1024 * 1024;
const LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// One directory of an artifact, by name.
#[derive(Debug, Clone)]
pub struct ArtifactTree {
    /// Its name in the manifest (the layer's [`TITLE`]).
    pub name: String,
    /// The directory (overlayfs format: 0:0 character devices are whiteouts).
    pub dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Manifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: String,
    #[serde(rename = "artifactType")]
    artifact_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// An artifact ready to be written: its manifest made, each tree hashed.
#[derive(Debug)]
pub struct Artifact {
    manifest: Vec<u8>,
    digest: Digest,
    config: Vec<u8>,
    config_digest: Digest,
    trees: Vec<(ArtifactTree, Descriptor)>,
}

impl Artifact {
    /// Hashes each tree's tar stream and makes the manifest: `artifact_type` its
    /// `artifactType`, `config` the config blob (of `config_media_type`).
    pub fn plan(
        artifact_type: &str,
        config_media_type: &str,
        config: Vec<u8>,
        trees: Vec<ArtifactTree>,
    ) -> Result<Artifact, ImageError> {
        let mut layers = Vec::with_capacity(trees.len());
        let mut planned = Vec::with_capacity(trees.len());
        for tree in trees {
            let sink = write_layer_tar(
                &tree.dir,
                HashingSink {
                    hasher: sha2::Sha256::default(),
                    count: 0,
                },
            )?;
            let desc = Descriptor {
                media_type: TREE_MEDIA_TYPE.to_owned(),
                digest: Digest::from_hasher(sink.hasher),
                size: sink.count,
                platform: None,
                annotations: BTreeMap::from([(TITLE.to_owned(), tree.name.clone())]),
            };
            layers.push(desc.clone());
            planned.push((tree, desc));
        }
        let config_digest = Digest::of(&config);
        let manifest = Manifest {
            schema_version: 2,
            media_type: OCI_MANIFEST.to_owned(),
            artifact_type: artifact_type.to_owned(),
            config: Descriptor {
                media_type: config_media_type.to_owned(),
                digest: config_digest.clone(),
                size: config.len() as u64,
                platform: None,
                annotations: BTreeMap::new(),
            },
            layers,
        };
        let manifest = serde_json::to_vec(&manifest).map_err(|e| ImageError::BadManifest {
            what: "an artifact's manifest".into(),
            reason: e.to_string(),
        })?;
        Ok(Artifact {
            digest: Digest::of(&manifest),
            manifest,
            config,
            config_digest,
            trees: planned,
        })
    }

    /// The manifest's digest: what names the artifact, and what a receiver checks.
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// Writes the artifact to `out` (see the module doc for its layout).
    pub fn write<W: Write>(&self, out: W) -> Result<W, ImageError> {
        let mut out = Counting {
            inner: out,
            count: 0,
        };
        put(&mut out, "oci-layout", LAYOUT)?;
        put(&mut out, &blob_name(&self.digest), &self.manifest)?;
        put(&mut out, &blob_name(&self.config_digest), &self.config)?;
        for (tree, desc) in &self.trees {
            let name = blob_name(&desc.digest);
            out.write_all(header(&name, desc.size)?.as_bytes())
                .map_err(|e| write_err(&name, e))?;
            let start = out.count;
            let mut out2 = write_layer_tar(&tree.dir, out)?;
            let written = out2.count - start;
            if written != desc.size {
                return Err(ImageError::SizeMismatch {
                    what: format!("tree {} ({}) written again", tree.name, tree.dir.display()),
                    expected: desc.size,
                    actual: written,
                });
            }
            pad(&mut out2, written, &name)?;
            out = out2;
        }
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [{
                "mediaType": OCI_MANIFEST,
                "digest": self.digest,
                "size": self.manifest.len(),
            }],
        });
        put(&mut out, "index.json", index.to_string().as_bytes())?;
        out.write_all(&[0u8; 1024])
            .map_err(|e| write_err("the end of the archive", e))?;
        out.flush()
            .map_err(|e| write_err("the end of the archive", e))?;
        Ok(out.inner)
    }
}

/// What receives an artifact's parts ([`receive`]).
pub trait ArtifactSink {
    /// Its errors: an image error (a digest mismatch, a bad layer) or the sink's own.
    type Error: From<ImageError>;
    /// The config, verified against the manifest: before any tree is read, so the sink
    /// can refuse the artifact without reading it all.
    fn config(&mut self, config: &[u8]) -> Result<(), Self::Error>;
    /// An empty directory to unpack the tree named `name` into.
    fn tree_dir(&mut self, name: &str) -> Result<PathBuf, Self::Error>;
}

/// Reads an artifact from `input`: its manifest must have the digest `expected` and the
/// `artifact_type`, its config `config_media_type`; every blob must have the digest and
/// size the manifest gives it. The config goes to `sink`, each tree is unpacked into the
/// directory `sink` gives for it. On an error, what was unpacked is the caller's to remove.
pub fn receive<S: ArtifactSink>(
    input: impl Read,
    expected: &Digest,
    artifact_type: &str,
    config_media_type: &str,
    sink: &mut S,
) -> Result<(), S::Error> {
    let mut archive = tar::Archive::new(input);
    let mut entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar: {e}")))?;
    let mut layout = next(&mut entries, "oci-layout")?;
    expect_name(&layout, "oci-layout")?;
    read_document(&mut layout, "oci-layout")?;
    drop(layout);

    let mut entry = next(&mut entries, "the manifest")?;
    let manifest = read_document(&mut entry, "the manifest")?;
    let got = Digest::of(&manifest);
    if got != *expected {
        return Err(ImageError::DigestMismatch {
            what: "the artifact's manifest".into(),
            expected: expected.to_string(),
            actual: got.to_string(),
        }
        .into());
    }
    expect_name(&entry, &blob_name(expected))?;
    drop(entry);
    let manifest: Manifest = serde_json::from_slice(&manifest)
        .map_err(|e| bad(format!("its manifest does not read: {e}")))?;
    if manifest.artifact_type != artifact_type || manifest.config.media_type != config_media_type {
        return Err(bad(format!(
            "an artifact of type {} (config {}), not {artifact_type} (config {config_media_type})",
            manifest.artifact_type, manifest.config.media_type
        ))
        .into());
    }

    let mut entry = next(&mut entries, "the config")?;
    let config = read_blob(&mut entry, &manifest.config, "the config")?;
    drop(entry);
    sink.config(&config)?;

    for desc in &manifest.layers {
        let name = desc
            .annotations
            .get(TITLE)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad(format!("layer {} has no {TITLE}", desc.digest)))?;
        if desc.media_type != TREE_MEDIA_TYPE {
            return Err(bad(format!("tree {name}: media type {}", desc.media_type)).into());
        }
        let what = format!("tree {name}");
        let mut entry = next(&mut entries, &what)?;
        expect_name(&entry, &blob_name(&desc.digest))?;
        if entry.header().size().unwrap_or(u64::MAX) != desc.size {
            return Err(ImageError::SizeMismatch {
                what,
                expected: desc.size,
                actual: entry.header().size().unwrap_or(0),
            }
            .into());
        }
        let dir = sink.tree_dir(name)?;
        let mut reader = HashingReader::new(&mut entry);
        let unpacked = crate::unpack(&mut reader, &dir, &what);
        // The rest of the blob (a tar's padding) is hashed too, and a tampered blob is
        // named as such even when its tampering broke the unpack first.
        let drained = std::io::copy(&mut reader, &mut std::io::sink());
        let got = Digest::from_hasher(reader.hasher);
        if reader.count != desc.size {
            return Err(ImageError::SizeMismatch {
                what,
                expected: desc.size,
                actual: reader.count,
            }
            .into());
        }
        if got != desc.digest {
            return Err(ImageError::DigestMismatch {
                what,
                expected: desc.digest.to_string(),
                actual: got.to_string(),
            }
            .into());
        }
        unpacked?;
        drained.map_err(|e| bad(format!("reading {what}: {e}")))?;
    }

    let mut index = next(&mut entries, "index.json")?;
    expect_name(&index, "index.json")?;
    read_document(&mut index, "index.json")?;
    drop(index);
    match entries.next() {
        None => Ok(()),
        Some(Err(e)) => Err(bad(format!("reading it after index.json: {e}")).into()),
        Some(Ok(e)) => Err(bad(format!(
            "an entry after index.json: {}",
            String::from_utf8_lossy(&e.path_bytes())
        ))
        .into()),
    }
}

/// The next entry of the archive, which must be `what`.
fn next<'a, R: Read>(
    entries: &mut tar::Entries<'a, R>,
    what: &str,
) -> Result<tar::Entry<'a, R>, ImageError> {
    match entries.next() {
        Some(Ok(entry)) => Ok(entry),
        Some(Err(e)) => Err(bad(format!("reading it before {what}: {e}"))),
        None => Err(bad(format!("it ends before {what} (cut short?)"))),
    }
}

fn bad(reason: String) -> ImageError {
    ImageError::BadManifest {
        what: "the artifact".into(),
        reason,
    }
}

fn blob_name(d: &Digest) -> String {
    format!("blobs/sha256/{}", d.hex())
}

fn expect_name<R: Read>(entry: &tar::Entry<'_, R>, name: &str) -> Result<(), ImageError> {
    let got = entry.path_bytes();
    if &got[..] != name.as_bytes() {
        return Err(bad(format!(
            "{:?} where {name} was expected",
            String::from_utf8_lossy(&got)
        )));
    }
    Ok(())
}

fn read_document<R: Read>(entry: &mut R, what: &str) -> Result<Vec<u8>, ImageError> {
    let mut data = Vec::new();
    entry
        .take(MAX_DOCUMENT + 1)
        .read_to_end(&mut data)
        .map_err(|e| bad(format!("reading {what}: {e}")))?;
    if data.len() as u64 > MAX_DOCUMENT {
        return Err(ImageError::TooLarge {
            what: what.to_owned(),
            limit: MAX_DOCUMENT,
        });
    }
    Ok(data)
}

fn read_blob<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    desc: &Descriptor,
    what: &str,
) -> Result<Vec<u8>, ImageError> {
    expect_name(entry, &blob_name(&desc.digest))?;
    let data = read_document(entry, what)?;
    if data.len() as u64 != desc.size {
        return Err(ImageError::SizeMismatch {
            what: what.to_owned(),
            expected: desc.size,
            actual: data.len() as u64,
        });
    }
    let got = Digest::of(&data);
    if got != desc.digest {
        return Err(ImageError::DigestMismatch {
            what: what.to_owned(),
            expected: desc.digest.to_string(),
            actual: got.to_string(),
        });
    }
    Ok(data)
}

fn header(name: &str, size: u64) -> Result<tar::Header, ImageError> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).map_err(|e| write_err(name, e))?;
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h.set_cksum();
    Ok(h)
}

fn put<W: Write>(out: &mut Counting<W>, name: &str, data: &[u8]) -> Result<(), ImageError> {
    out.write_all(header(name, data.len() as u64)?.as_bytes())
        .and_then(|()| out.write_all(data))
        .map_err(|e| write_err(name, e))?;
    pad(out, data.len() as u64, name)
}

fn pad<W: Write>(out: &mut W, size: u64, name: &str) -> Result<(), ImageError> {
    let rest = (512 - size % 512) % 512;
    out.write_all(&[0u8; 512][..rest as usize])
        .map_err(|e| write_err(name, e))
}

fn write_err(name: &str, e: std::io::Error) -> ImageError {
    ImageError::io("write an artifact", Path::new(name), e)
}

/// A writer that counts what passes into the writer it wraps.
struct Counting<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dirs {
        root: PathBuf,
        config: Vec<u8>,
        trees: Vec<String>,
    }

    impl ArtifactSink for Dirs {
        type Error = ImageError;
        fn config(&mut self, config: &[u8]) -> Result<(), ImageError> {
            self.config = config.to_vec();
            Ok(())
        }
        fn tree_dir(&mut self, name: &str) -> Result<PathBuf, ImageError> {
            let dir = self.root.join(name);
            std::fs::create_dir(&dir).map_err(|e| ImageError::io("mkdir", &dir, e))?;
            self.trees.push(name.to_owned());
            Ok(dir)
        }
    }

    fn sample() -> (tempfile::TempDir, Artifact, Vec<u8>) {
        let d = tempfile::tempdir().unwrap();
        let layer = d.path().join("layer");
        std::fs::create_dir_all(layer.join("sub")).unwrap();
        std::fs::write(layer.join("sub/f"), "hello").unwrap();
        let tmp = d.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("t"), vec![7u8; 3000]).unwrap();
        let trees = vec![
            ArtifactTree {
                name: "layer".into(),
                dir: layer,
            },
            ArtifactTree {
                name: "tmp".into(),
                dir: tmp,
            },
        ];
        let a = Artifact::plan("t/a", "t/c", b"{\"x\":1}".to_vec(), trees).unwrap();
        let bytes = a.write(Vec::new()).unwrap();
        (d, a, bytes)
    }

    fn take(bytes: &[u8], digest: &Digest) -> (tempfile::TempDir, Result<Dirs, ImageError>) {
        let d = tempfile::tempdir().unwrap();
        let mut sink = Dirs {
            root: d.path().to_owned(),
            config: Vec::new(),
            trees: Vec::new(),
        };
        let r = receive(bytes, digest, "t/a", "t/c", &mut sink).map(|()| sink);
        (d, r)
    }

    /// The archive is the same twice, an OCI layout other tools read (tar entries in the
    /// layout's names), and reads back to the same config and trees.
    #[test]
    fn an_artifact_reads_back_to_its_config_and_trees_and_is_stable() {
        let (_d, a, bytes) = sample();
        assert_eq!(bytes, a.write(Vec::new()).unwrap());
        let names: Vec<String> = tar::Archive::new(&bytes[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names.first().map(String::as_str), Some("oci-layout"));
        assert_eq!(names.last().map(String::as_str), Some("index.json"));
        assert_eq!(names[1], format!("blobs/sha256/{}", a.digest().hex()));
        let (d, got) = take(&bytes, a.digest());
        let got = got.unwrap();
        assert_eq!(got.config, b"{\"x\":1}");
        assert_eq!(got.trees, ["layer", "tmp"]);
        assert_eq!(
            std::fs::read_to_string(d.path().join("layer/sub/f")).unwrap(),
            "hello"
        );
        assert_eq!(std::fs::read(d.path().join("tmp/t")).unwrap(), [7u8; 3000]);
    }

    /// Another digest, any byte changed, or the stream cut anywhere: refused, with the
    /// digest or size mismatch named when a blob's bytes are wrong.
    #[test]
    fn a_tampered_or_cut_artifact_is_refused() {
        let (_d, a, bytes) = sample();
        let other = Digest::of(b"other");
        let (_, r) = take(&bytes, &other);
        assert!(r.is_err());
        // A byte of the tmp tree's file content changed.
        let at = bytes
            .windows(8)
            .position(|w| w == [7u8; 8])
            .expect("the tmp tree's content");
        let mut tampered = bytes.clone();
        tampered[at + 100] = 8;
        let (_, r) = take(&tampered, a.digest());
        let e = r.err().unwrap();
        assert!(
            matches!(e, ImageError::DigestMismatch { ref what, .. } if what == "tree tmp"),
            "{e}"
        );
        for cut in [0, 100, 600, at + 10, bytes.len() - 1100] {
            let (_, r) = take(&bytes[..cut], a.digest());
            assert!(r.is_err(), "cut at {cut}");
        }
    }
}
