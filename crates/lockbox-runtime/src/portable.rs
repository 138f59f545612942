//! Snapshots moved between state directories (a fleet's nodes, docs/fleet.md): a snapshot
//! leaves as an OCI artifact ([`lockbox_image::artifact`]: its record as the config, its
//! layer and kept `/tmp` as layer tar streams, named by the manifest's sha256) and comes in
//! verified against that digest, blob by blob, before it is published in the receiving
//! store. It keeps its id there, so the same id forks on either node.
//!
//! What moves: the snapshot's own layer, its kept `/tmp`, and its record (name, parent,
//! the spec and sessions a fork starts with, the stale-base time). Not its parent's layer
//! (the parent moves first, as a snapshot of its own) and not its workdir: a snapshot is
//! the sandbox's changes over a host directory, which the receiving node must have at the
//! same path. The one exception is a workdir inside the sending state directory (E2B's
//! `STATE/e2b-workdir`, empty and never written): the receiver's own counterpart is used.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use lockbox_cow::{IncomingSnapshot, Received, SnapshotId, SnapshotMeta, SnapshotStore};
use lockbox_image::artifact::{Artifact, ArtifactSink, ArtifactTree};
use lockbox_image::{Digest, ImageError};
use serde::{Deserialize, Serialize};

use crate::types::SnapshotInfo;
use crate::{Runtime, RuntimeError};

/// The `artifactType` of a snapshot's artifact.
pub const SNAPSHOT_ARTIFACT_TYPE: &str = "application/vnd.lockbox.snapshot.v1";
/// The media type of its config (the snapshot's record).
pub const SNAPSHOT_CONFIG_TYPE: &str = "application/vnd.lockbox.snapshot.config.v1+json";
/// The name of the snapshot's layer in the artifact.
const LAYER: &str = "layer";
/// The name of its kept `/tmp` (as in the snapshot store).
const TMP: &str = "tmp";

/// The config of a snapshot's artifact.
#[derive(Serialize, Deserialize)]
struct Record {
    /// The snapshot's record as the sending store has it (`bytes` and `entries` are
    /// counted again by the receiver).
    snapshot: SnapshotMeta,
    /// The mode of the layer's root: the view's root directory's.
    layer_mode: u32,
    /// The workdir's path inside the sending state directory, when it lies there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state_workdir: Option<PathBuf>,
}

/// A snapshot ready to be sent ([`Runtime::export_snapshot`]): held in its store (no
/// delete removes it) until dropped.
#[derive(Debug)]
pub struct SnapshotExport {
    artifact: Artifact,
    id: SnapshotId,
    _held: Held,
}

impl SnapshotExport {
    /// The artifact's digest (`sha256:…`, its manifest's): what the receiver checks.
    pub fn digest(&self) -> &str {
        self.artifact.digest().as_str()
    }

    /// Writes the artifact to `out` (blocking: the layer is read as it is written).
    pub fn write_to<W: Write>(&self, out: W) -> Result<W, RuntimeError> {
        self.artifact
            .write(out)
            .map_err(|source| RuntimeError::SnapshotTransfer {
                id: self.id.to_string(),
                source,
            })
    }
}

/// What [`Runtime::import_snapshot`] did.
#[derive(Debug, Clone)]
pub struct ImportedSnapshot {
    /// The snapshot, as this store has it.
    pub info: SnapshotInfo,
    /// Whether it was received now (`false`: the store had it already, nothing was read).
    pub received: bool,
}

impl Runtime {
    /// Makes snapshot `id` ready to be sent to another state directory: hashes its layer
    /// and kept `/tmp` as tar streams (read once here, once more when written).
    pub async fn export_snapshot(&self, id: &str) -> Result<SnapshotExport, RuntimeError> {
        let id = crate::snapshots::parse_id(id)?;
        let store = self.inner.snapshots.clone();
        let state_dir = self.state_dir();
        tokio::task::spawn_blocking(move || export(store, id, &state_dir))
            .await
            .map_err(RuntimeError::Task)?
    }

    /// Receives snapshot `id` from `input`, an artifact [`Runtime::export_snapshot`] made,
    /// whose digest must be `digest`. Blocking (run it off the async workers). Nothing is
    /// published unless every blob matched; what was unpacked is removed otherwise (and by
    /// the next runtime to open the state directory, if this process dies). A snapshot the
    /// store has already is not read again.
    pub fn import_snapshot(
        &self,
        id: &str,
        digest: &str,
        input: impl Read,
    ) -> Result<ImportedSnapshot, RuntimeError> {
        let id = crate::snapshots::parse_id(id)?;
        let digest = Digest::parse(digest).map_err(|e| RuntimeError::invalid("digest", e))?;
        let store = &self.inner.snapshots;
        match store.get(&id) {
            Ok(had) => {
                return Ok(ImportedSnapshot {
                    info: crate::snapshots::info(had),
                    received: false,
                })
            }
            Err(lockbox_cow::CowError::SnapshotNotFound { .. }) => {}
            Err(e) => return Err(RuntimeError::Branch(e)),
        }
        let limits = lockbox_cow::SnapshotLimits {
            max_bytes: self.inner.config.max_snapshot_bytes,
            max_entries: self.inner.config.max_snapshot_entries,
        };
        // The stream is bounded by the room the store has left (a layer's tar stream is never
        // larger than what its entries cost on disk, plus the documents): an artifact beyond
        // it stops there instead of filling the disk before the publish would refuse it.
        let room = match limits.max_bytes {
            Some(max) => {
                let used = store.usage().map_err(RuntimeError::Branch)?.bytes;
                Some(max.saturating_sub(used).saturating_add(ARTIFACT_SLACK))
            }
            None => None,
        };
        let beyond = std::cell::Cell::new(false);
        let input = Bounded {
            inner: input,
            left: room,
            beyond: &beyond,
        };
        let mut sink = Incoming {
            incoming: store.incoming(&id).map_err(RuntimeError::Branch)?,
            store,
            id: &id,
            state_dir: self.state_dir(),
            record: None,
        };
        lockbox_image::artifact::receive(
            input,
            &digest,
            SNAPSHOT_ARTIFACT_TYPE,
            SNAPSHOT_CONFIG_TYPE,
            &mut sink,
        )
        .map_err(|r| match r {
            _ if beyond.get() => crate::snapshots::limit_error(
                lockbox_cow::CowError::SnapshotLimit {
                    limit: lockbox_cow::SnapshotLimit::Bytes,
                    path: store.dir().join(".new"),
                },
                limits,
            ),
            Refusal::Artifact(source) => RuntimeError::SnapshotTransfer {
                id: id.to_string(),
                source,
            },
            Refusal::Node(e) => e,
        })?;
        let Some((meta, layer_mode)) = sink.record else {
            return Err(RuntimeError::internal(
                "an artifact received without its config",
            ));
        };
        let published = sink
            .incoming
            .publish(meta, layer_mode, limits)
            .map_err(|e| crate::snapshots::limit_error(e, limits))?;
        let (meta, received) = match published {
            Received::Published(m) => (m, true),
            Received::AlreadyHad(m) => (m, false),
        };
        tracing::debug!(snapshot = %meta.id, received, bytes = meta.bytes, "snapshot imported");
        Ok(ImportedSnapshot {
            info: crate::snapshots::info(meta),
            received,
        })
    }
}

fn export(
    store: SnapshotStore,
    id: SnapshotId,
    state_dir: &Path,
) -> Result<SnapshotExport, RuntimeError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let hold = lockbox_cow::process_hold("export", &n.to_string());
    store.hold(&id, &hold).map_err(RuntimeError::Branch)?;
    let held = Held {
        store: store.clone(),
        id: id.clone(),
        hold,
    };
    let mut meta = store.get(&id).map_err(RuntimeError::Branch)?;
    // Counted again by each receiver (what its disk holds): left out, so the artifact of a
    // snapshot is the same whichever node sends it.
    meta.bytes = 0;
    meta.entries = 0;
    let layer = store
        .layers(&id)
        .map_err(RuntimeError::Branch)?
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::internal(format!("snapshot {id} has no layer")))?;
    let layer_mode = std::fs::symlink_metadata(&layer)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .map_err(RuntimeError::os("reading a snapshot layer's mode"))?;
    let mut trees = vec![ArtifactTree {
        name: LAYER.into(),
        dir: layer,
    }];
    if let Some(tmp) = store.scratch(&id, TMP) {
        trees.push(ArtifactTree {
            name: TMP.into(),
            dir: tmp,
        });
    }
    let record = Record {
        state_workdir: meta
            .workdir
            .strip_prefix(state_dir)
            .ok()
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(Path::to_owned),
        snapshot: meta,
        layer_mode,
    };
    let config = serde_json::to_vec(&record).map_err(RuntimeError::json("a snapshot's record"))?;
    let artifact = Artifact::plan(SNAPSHOT_ARTIFACT_TYPE, SNAPSHOT_CONFIG_TYPE, config, trees)
        .map_err(|source| RuntimeError::SnapshotTransfer {
            id: id.to_string(),
            source,
        })?;
    Ok(SnapshotExport {
        artifact,
        id,
        _held: held,
    })
}

/// What an artifact may hold beyond its trees' cost: the manifest, config and index (4 MiB
/// each at most) and the tar framing.
const ARTIFACT_SLACK: u64 = 16 * 1024 * 1024;

/// A reader that fails past `left` bytes, and says so in `beyond`.
struct Bounded<'a, R> {
    inner: R,
    left: Option<u64>,
    beyond: &'a std::cell::Cell<bool>,
}

impl<R: Read> Read for Bounded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(left) = self.left else {
            return self.inner.read(buf);
        };
        if left == 0 {
            // One byte more than the bound: the stream goes on past it.
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? == 0 {
                return Ok(0);
            }
            self.beyond.set(true);
            return Err(std::io::Error::other(
                "the artifact is larger than the room this store's snapshots have left",
            ));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left = Some(left - n as u64);
        Ok(n)
    }
}

/// A hold on a snapshot, released when dropped.
#[derive(Debug)]
struct Held {
    store: SnapshotStore,
    id: SnapshotId,
    hold: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.store.release(&self.id, &self.hold);
    }
}

/// Where a received artifact's parts go: the snapshot's directories under `.new/`.
struct Incoming<'a> {
    incoming: IncomingSnapshot,
    store: &'a SnapshotStore,
    id: &'a SnapshotId,
    state_dir: PathBuf,
    record: Option<(SnapshotMeta, u32)>,
}

impl ArtifactSink for Incoming<'_> {
    type Error = Refusal;

    fn config(&mut self, config: &[u8]) -> Result<(), Refusal> {
        let record: Record = serde_json::from_slice(config).map_err(|e| {
            self.transfer(ImageError::BadManifest {
                what: "the snapshot's record".into(),
                reason: e.to_string(),
            })
        })?;
        let mut meta = record.snapshot;
        if meta.id != *self.id {
            return Err(Refusal::Node(RuntimeError::invalid(
                "id",
                format!("the artifact is of snapshot {}, not {}", meta.id, self.id),
            )));
        }
        if let Some(parent) = &meta.parent {
            // Refused before its layer is read: the parent moves first.
            self.store.get(parent).map_err(|_| {
                Refusal::Node(RuntimeError::invalid(
                    "parent",
                    format!(
                        "snapshot {} lies on snapshot {parent}, which this node does not have: send that one first",
                        self.id
                    ),
                ))
            })?;
        }
        if let Some(rel) = &record.state_workdir {
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(self.transfer(ImageError::BadManifest {
                    what: "the snapshot's record".into(),
                    reason: format!("state_workdir {} is not a relative path", rel.display()),
                }));
            }
            meta.workdir = self.state_dir.join(rel);
            if rel == Path::new("e2b-workdir") {
                // E2B's workdir is empty and never written: this node's is the same.
                std::fs::create_dir_all(&meta.workdir)
                    .map_err(RuntimeError::os("making E2B's workdir"))
                    .map_err(Refusal::Node)?;
            }
        }
        if !meta.workdir.is_dir() {
            return Err(Refusal::Node(RuntimeError::invalid(
                "workdir",
                format!(
                    "snapshot {} lies over the workdir {}, which is not a directory on this node \
                     (a snapshot moves without its workdir)",
                    self.id,
                    meta.workdir.display()
                ),
            )));
        }
        self.record = Some((meta, record.layer_mode));
        Ok(())
    }

    fn tree_dir(&mut self, name: &str) -> Result<PathBuf, Refusal> {
        match name {
            LAYER => Ok(self.incoming.layer_dir()),
            TMP => Ok(self
                .incoming
                .scratch_dir(TMP)
                .map_err(RuntimeError::Branch)?),
            other => Err(self.transfer(ImageError::BadManifest {
                what: "the snapshot's artifact".into(),
                reason: format!("a tree named {other:?} (a snapshot has `layer` and `tmp`)"),
            })),
        }
    }
}

impl Incoming<'_> {
    fn transfer(&self, source: ImageError) -> Refusal {
        Refusal::Artifact(source)
    }
}

/// Why a receive stopped: the artifact (named by the snapshot's id once mapped), or this
/// node.
enum Refusal {
    Artifact(ImageError),
    Node(RuntimeError),
}

impl From<ImageError> for Refusal {
    fn from(e: ImageError) -> Refusal {
        Refusal::Artifact(e)
    }
}

impl From<RuntimeError> for Refusal {
    fn from(e: RuntimeError) -> Refusal {
        Refusal::Node(e)
    }
}
