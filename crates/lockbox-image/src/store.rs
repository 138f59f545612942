//! The image store: files plus locks, no daemon.
//!
//! ```text
//! <state-dir>/images/
//!   store.lock                 shared by pulls and holds, exclusive for rm / prune
//!   refs.lock, refs.json       names -> image ids (read-modify-write under refs.lock)
//!   blobs/sha256/<hex>         verified blobs: manifests, configs, compressed layers
//!   layers/<diff-id hex>/      one unpacked layer, shared by every image that has it:
//!     root/                    the overlayfs lower directory
//!     layer.json               what the unpack did (setuid stripped, devices skipped)
//!   images/<id hex>.json       one image: config, layer list, source
//!   images/<id hex>.used       its mtime: last pulled or held (least-recently-used pruning)
//!   holds/<id hex>/<holder>    who uses an image (rm refuses while any is there)
//!   locks/<diff-id hex>.lock   one pull at a time downloads and unpacks a layer
//!   tmp/<n>.lock, tmp/<n>/     a pull's work directory, locked while it lives
//! ```
//!
//! Everything is made under `tmp/` and renamed into place only once complete and verified;
//! [`Store::open`] removes work directories whose lock no live process holds (a killed pull).

use crate::digest::{Digest, HashingReader};
use crate::error::ImageError;
use crate::oci::{ConfigFile, Descriptor};
use crate::source::{self, BlobFrom};
use crate::unpack::{remove_tree, UnpackReport};
use crate::{Image, ImageConfig, ImageSummary, LayerInfo, PruneOptions, PruneReport, PullOptions};
use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

const FORMAT: u32 = 1;

/// The content-addressed image store of one state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// `images/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    pub format: u32,
    pub id: Digest,
    pub manifest: Option<Digest>,
    pub source: String,
    pub platform: String,
    pub created: Option<String>,
    pub pulled_at: u64,
    pub config: ImageConfig,
    /// Base first, as in the config's `rootfs.diff_ids`.
    pub layers: Vec<LayerRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LayerRecord {
    pub diff_id: Digest,
    pub blob: Digest,
    pub media_type: String,
    pub size: u64,
}

/// `layers/<hex>/layer.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LayerMeta {
    pub format: u32,
    pub diff_id: Digest,
    pub blob: Digest,
    pub unpacked_bytes: u64,
    pub report: UnpackReport,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Refs {
    format: u32,
    refs: BTreeMap<String, Digest>,
}

/// A held `flock`; released on drop (and by the kernel when the process dies).
#[derive(Debug)]
pub(crate) struct Flock(OwnedFd);

pub(crate) fn flock(path: &Path, op: FlockOperation) -> Result<Flock, ImageError> {
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .map_err(|e| ImageError::io("open a lock file", path, e.into()))?;
    rustix::fs::flock(&fd, op).map_err(|e| ImageError::io("lock", path, e.into()))?;
    Ok(Flock(fd))
}

async fn flock_async(path: PathBuf, op: FlockOperation) -> Result<Flock, ImageError> {
    tokio::task::spawn_blocking(move || flock(&path, op))
        .await
        .map_err(|e| ImageError::io("lock", PathBuf::new(), std::io::Error::other(e.to_string())))?
}

/// A pull's private work directory under `tmp/`, removed on drop.
#[derive(Debug)]
pub(crate) struct Work {
    pub(crate) dir: PathBuf,
    lock_path: PathBuf,
    _lock: Flock,
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = remove_tree(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes `bytes` to `path` atomically: a temp file beside it, fsync, rename, fsync of the
/// directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        unique()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| ImageError::io("write a record", path, e))
}

pub(crate) fn fsync_dir(dir: &Path) -> Result<(), ImageError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| ImageError::io("fsync a directory", dir, e))
}

pub(crate) fn unique() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    format!(
        "{}-{}",
        std::process::id(),
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

fn is_hex64(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A (decompressed) layer or archive stream: gzip and zstd are recognised by their magic
/// numbers, anything else is read as a plain tar.
pub(crate) fn decompressed<'a, R: BufRead + 'a>(
    mut r: R,
    what: &str,
) -> Result<Box<dyn Read + 'a>, ImageError> {
    let head = r.fill_buf().map_err(|e| ImageError::BadLayer {
        layer: what.to_owned(),
        reason: e.to_string(),
    })?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(r)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let d = zstd::stream::read::Decoder::with_buffer(r).map_err(|e| ImageError::BadLayer {
            layer: what.to_owned(),
            reason: format!("zstd: {e}"),
        })?;
        Ok(Box::new(d))
    } else {
        Ok(Box::new(r))
    }
}

/// A reader that fails once more than `left` bytes pass (a decompression bomb).
struct Bounded<R> {
    inner: R,
    left: u64,
    exceeded: bool,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.exceeded = true;
            return Err(std::io::Error::other("beyond the layer size bound"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Unpacks the blob at `blob` into `dest/root` and verifies the uncompressed stream's digest
/// against `diff_id`; writes `dest/layer.json`.
fn unpack_layer(
    blob: &Path,
    blob_digest: &Digest,
    diff_id: &Digest,
    dest: &Path,
    limit: u64,
) -> Result<LayerMeta, ImageError> {
    let name = blob_digest.to_string();
    let root = dest.join("root");
    std::fs::create_dir_all(&root)
        .map_err(|e| ImageError::io("create a layer directory", &root, e))?;
    let f = std::fs::File::open(blob).map_err(|e| ImageError::io("open a blob", blob, e))?;
    let stream = decompressed(std::io::BufReader::with_capacity(1 << 16, f), &name)?;
    let mut bounded = Bounded {
        inner: HashingReader::new(stream),
        left: limit,
        exceeded: false,
    };
    let result = crate::unpack::unpack(&mut bounded, &root, &name).and_then(|report| {
        // The rest of the stream (tar's end blocks, padding) is part of the diff id.
        std::io::copy(&mut bounded, &mut std::io::sink()).map_err(|e| ImageError::BadLayer {
            layer: name.clone(),
            reason: format!("after the archive's end: {e}"),
        })?;
        Ok(report)
    });
    if bounded.exceeded {
        return Err(ImageError::LayerTooLarge { layer: name, limit });
    }
    let report = result?;
    let actual = Digest::from_hasher(bounded.inner.hasher.clone());
    if &actual != diff_id {
        return Err(ImageError::DigestMismatch {
            what: format!("layer {name}: uncompressed content (diff id)"),
            expected: diff_id.to_string(),
            actual: actual.to_string(),
        });
    }
    let meta = LayerMeta {
        format: FORMAT,
        diff_id: diff_id.clone(),
        blob: blob_digest.clone(),
        unpacked_bytes: bounded.inner.count,
        report,
    };
    let json = serde_json::to_vec_pretty(&meta)
        .map_err(|e| ImageError::io("encode", dest, std::io::Error::other(e)))?;
    write_atomic(&dest.join("layer.json"), &json)?;
    Ok(meta)
}

/// Counters of a pull, shown on a terminal.
#[derive(Debug, Default)]
struct Progress {
    bytes: AtomicU64,
    total: AtomicU64,
    layers_done: AtomicUsize,
    layers: AtomicUsize,
}

impl Store {
    /// Opens (creating) the store at `dir` and removes what killed pulls left behind.
    pub fn open(dir: &Path) -> Result<Store, ImageError> {
        for sub in ["blobs/sha256", "layers", "images", "holds", "locks", "tmp"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(|e| ImageError::io("create the store", &p, e))?;
        }
        let store = Store {
            root: dir.to_owned(),
        };
        store.recover()?;
        Ok(store)
    }

    /// The store of a lockbox state directory: `<state-dir>/images`.
    pub fn in_state_dir(state_dir: &Path) -> Result<Store, ImageError> {
        Store::open(&state_dir.join("images"))
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    fn recover(&self) -> Result<(), ImageError> {
        let tmp = self.root.join("tmp");
        let rd = std::fs::read_dir(&tmp).map_err(|e| ImageError::io("list", &tmp, e))?;
        let mut locked = BTreeSet::new();
        let mut entries = Vec::new();
        for e in rd.flatten() {
            entries.push(e.file_name().to_string_lossy().into_owned());
        }
        for name in &entries {
            if let Some(base) = name.strip_suffix(".lock") {
                let lock = tmp.join(name);
                match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
                    Ok(_held) => {
                        tracing::debug!(work = base, "removing a dead pull's work directory");
                        let _ = remove_tree(&tmp.join(base));
                        let _ = std::fs::remove_file(&lock);
                    }
                    Err(_) => {
                        locked.insert(base.to_owned());
                    }
                }
            }
        }
        // A work directory is made after its lock is taken: one without a lock is dead.
        for name in &entries {
            if !name.ends_with(".lock")
                && !locked.contains(name)
                && !entries.contains(&format!("{name}.lock"))
            {
                let _ = remove_tree(&tmp.join(name));
            }
        }
        Ok(())
    }

    pub(crate) fn work(&self) -> Result<Work, ImageError> {
        let name = unique();
        let lock_path = self.root.join("tmp").join(format!("{name}.lock"));
        let lock = flock(&lock_path, FlockOperation::LockExclusive)?;
        // A recovery may have taken the lock between our open and our flock (it saw a lock
        // no one held) and removed the file: then ours is on an unlinked inode. Never make
        // the work directory unless the lock file is still the one we hold.
        let held =
            rustix::fs::fstat(&lock.0).map_err(|e| ImageError::io("lock", &lock_path, e.into()))?;
        match rustix::fs::stat(&lock_path) {
            Ok(st) if st.st_ino == held.st_ino && st.st_dev == held.st_dev => {}
            _ => return self.work(),
        }
        let dir = self.root.join("tmp").join(&name);
        std::fs::create_dir(&dir)
            .map_err(|e| ImageError::io("create a work directory", &dir, e))?;
        Ok(Work {
            dir,
            lock_path,
            _lock: lock,
        })
    }

    pub(crate) fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    pub(crate) fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers").join(diff_id.hex())
    }

    fn record_path(&self, id: &Digest) -> PathBuf {
        self.root.join("images").join(format!("{}.json", id.hex()))
    }

    fn put_blob(&self, d: &Digest, bytes: &[u8]) -> Result<(), ImageError> {
        let p = self.blob_path(d);
        if p.exists() {
            return Ok(());
        }
        write_atomic(&p, bytes)
    }

    /// Pulls `reference` (a registry reference or a local source) into the store and returns
    /// the image. Layers already in the store are neither downloaded nor unpacked again.
    pub async fn pull(&self, reference: &str, opts: &PullOptions) -> Result<Image, ImageError> {
        let source = crate::reference::Source::parse(reference)?;
        self.pull_source(&source, opts, false).await
    }

    /// Pulls `source`. A `load` names the image by what the archive says (its tags), and by
    /// the archive's path only when it says nothing.
    pub(crate) async fn pull_source(
        &self,
        source: &crate::reference::Source,
        opts: &PullOptions,
        load: bool,
    ) -> Result<Image, ImageError> {
        let _shared = flock_async(self.root.join("store.lock"), FlockOperation::LockShared).await?;
        let work = self.work()?;
        let resolved = source::resolve(source, opts, &work.dir).await?;
        let what = source.name();
        let config: ConfigFile =
            serde_json::from_slice(&resolved.config).map_err(|e| ImageError::BadManifest {
                what: format!("config of {what}"),
                reason: e.to_string(),
            })?;
        if opts.exact_platform
            && !opts
                .platform
                .matches(&config.os, &config.architecture, config.variant.as_deref())
        {
            // A single-platform image of another platform than the one asked for.
            return Err(ImageError::NoPlatform {
                reference: what,
                platform: opts.platform.to_string(),
                available: match &config.variant {
                    Some(v) => format!("{}/{}/{v}", config.os, config.architecture),
                    None => format!("{}/{}", config.os, config.architecture),
                },
            });
        }
        if config.rootfs.diff_ids.len() != resolved.layers.len() {
            return Err(ImageError::BadManifest {
                what: what.clone(),
                reason: format!(
                    "the manifest lists {} layers, the config {} diff ids",
                    resolved.layers.len(),
                    config.rootfs.diff_ids.len()
                ),
            });
        }
        for l in &resolved.layers {
            if l.size > opts.max_layer_bytes {
                return Err(ImageError::LayerTooLarge {
                    layer: l.digest.to_string(),
                    limit: opts.max_layer_bytes,
                });
            }
            if l.media_type.contains("foreign") || l.media_type.contains("nondistributable") {
                tracing::debug!(digest = %l.digest, "a foreign layer: fetched like any other");
            }
        }
        let progress = Arc::new(Progress::default());
        progress
            .layers
            .store(resolved.layers.len(), Ordering::Relaxed);
        progress.total.store(
            resolved.layers.iter().map(|l| l.size).sum(),
            Ordering::Relaxed,
        );
        let ticker = opts.progress.then(|| {
            let p = progress.clone();
            let name = what.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    show(&name, &p);
                }
            })
        });
        let sem = tokio::sync::Semaphore::new(opts.parallel.max(1));
        let jobs = resolved
            .layers
            .iter()
            .zip(&config.rootfs.diff_ids)
            .map(|(desc, diff_id)| {
                let sem = &sem;
                let from = &resolved.from;
                let work = &work.dir;
                let progress = &progress;
                async move {
                    let _permit = sem.acquire().await.map_err(|e| {
                        ImageError::io("schedule", PathBuf::new(), std::io::Error::other(e))
                    })?;
                    let r = self
                        .ensure_layer(from, desc, diff_id, work, opts, progress)
                        .await;
                    progress.layers_done.fetch_add(1, Ordering::Relaxed);
                    r
                }
            });
        let result = futures_util::future::try_join_all(jobs).await;
        if let Some(t) = ticker {
            t.abort();
            show(&what, &progress);
            crate::eprint_line("");
        }
        result?;
        self.put_blob(&resolved.config_digest, &resolved.config)?;
        if let Some((bytes, d)) = &resolved.manifest {
            self.put_blob(d, bytes)?;
        }
        let run = config.config.clone().unwrap_or_default();
        let record = ImageRecord {
            format: FORMAT,
            id: resolved.config_digest.clone(),
            manifest: resolved.manifest.as_ref().map(|(_, d)| d.clone()),
            source: what.clone(),
            platform: match &config.variant {
                Some(v) => format!("{}/{}/{v}", config.os, config.architecture),
                None => format!("{}/{}", config.os, config.architecture),
            },
            created: config.created.clone(),
            pulled_at: now(),
            config: ImageConfig {
                env: run.env.unwrap_or_default(),
                working_dir: run.working_dir.filter(|w| !w.is_empty()),
                user: run.user.filter(|u| !u.is_empty()),
                entrypoint: run.entrypoint,
                cmd: run.cmd,
                labels: run.labels.unwrap_or_default(),
                exposed_ports: run
                    .exposed_ports
                    .map(|p| p.into_keys().collect())
                    .unwrap_or_default(),
                stop_signal: run.stop_signal,
            },
            layers: resolved
                .layers
                .iter()
                .zip(&config.rootfs.diff_ids)
                .map(|(d, diff_id)| LayerRecord {
                    diff_id: diff_id.clone(),
                    blob: d.digest.clone(),
                    media_type: d.media_type.clone(),
                    size: d.size,
                })
                .collect(),
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| {
            ImageError::io(
                "encode",
                self.record_path(&record.id),
                std::io::Error::other(e),
            )
        })?;
        write_atomic(&self.record_path(&record.id), &json)?;
        let mut names = if load { Vec::new() } else { vec![what.clone()] };
        names.extend(resolved.extra_names.iter().cloned());
        if load {
            names.extend(resolved.annotated_names.iter().cloned());
            if names.is_empty() {
                names.push(what);
            }
        }
        self.set_refs(&names, &record.id)?;
        self.touch_used(&record.id);
        drop(work);
        self.load(&record.id)
    }

    /// Makes sure layer `diff_id` is unpacked in the store (downloading its blob if needed),
    /// once even when several pulls want it at the same time.
    async fn ensure_layer(
        &self,
        from: &BlobFrom,
        desc: &Descriptor,
        diff_id: &Digest,
        work: &Path,
        opts: &PullOptions,
        progress: &Progress,
    ) -> Result<(), ImageError> {
        let _lock = flock_async(
            self.root
                .join("locks")
                .join(format!("{}.lock", diff_id.hex())),
            FlockOperation::LockExclusive,
        )
        .await?;
        let dest = self.layer_dir(diff_id);
        if dest.join("layer.json").exists() {
            progress.bytes.fetch_add(desc.size, Ordering::Relaxed);
            return Ok(());
        }
        let blob = self.blob_path(&desc.digest);
        if !blob.exists() {
            let tmp = work.join(format!("blob-{}", desc.digest.hex()));
            match from {
                BlobFrom::Registry(r) => {
                    r.blob_to_file(&desc.digest, desc.size, &tmp, &progress.bytes)
                        .await?
                }
                BlobFrom::Layout(dir) => copy_verified(
                    dir,
                    &PathBuf::from("blobs/sha256").join(desc.digest.hex()),
                    desc,
                    &tmp,
                    &progress.bytes,
                )?,
                BlobFrom::Files(dir, files) => {
                    let rel = files.get(&desc.digest).cloned().unwrap_or_default();
                    copy_verified(dir, &rel, desc, &tmp, &progress.bytes)?
                }
            }
            std::fs::rename(&tmp, &blob).map_err(|e| ImageError::io("store a blob", &blob, e))?;
            fsync_dir(&self.root.join("blobs/sha256"))?;
        } else {
            progress.bytes.fetch_add(desc.size, Ordering::Relaxed);
        }
        let staging = work.join(format!("layer-{}", diff_id.hex()));
        let (b, bd, di, st, limit) = (
            blob.clone(),
            desc.digest.clone(),
            diff_id.clone(),
            staging.clone(),
            opts.max_layer_bytes,
        );
        let unpacked = tokio::task::spawn_blocking(move || unpack_layer(&b, &bd, &di, &st, limit))
            .await
            .map_err(|e| {
                ImageError::io(
                    "unpack",
                    staging.clone(),
                    std::io::Error::other(e.to_string()),
                )
            })?;
        if let Err(e) = unpacked {
            let _ = remove_tree(&staging);
            return Err(e);
        }
        std::fs::rename(&staging, &dest).map_err(|e| ImageError::io("store a layer", &dest, e))?;
        fsync_dir(&self.root.join("layers"))?;
        Ok(())
    }

    fn read_refs(&self) -> Result<Refs, ImageError> {
        let p = self.root.join("refs.json");
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| ImageError::Damaged {
                path: p,
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Refs {
                format: FORMAT,
                refs: BTreeMap::new(),
            }),
            Err(e) => Err(ImageError::io("read", p, e)),
        }
    }

    fn write_refs(&self, refs: &Refs) -> Result<(), ImageError> {
        let p = self.root.join("refs.json");
        let json = serde_json::to_vec_pretty(refs)
            .map_err(|e| ImageError::io("encode", &p, std::io::Error::other(e)))?;
        write_atomic(&p, &json)
    }

    fn set_refs(&self, names: &[String], id: &Digest) -> Result<(), ImageError> {
        let _l = flock(&self.root.join("refs.lock"), FlockOperation::LockExclusive)?;
        let mut refs = self.read_refs()?;
        refs.format = FORMAT;
        for n in names {
            refs.refs.insert(n.clone(), id.clone());
        }
        self.write_refs(&refs)
    }

    pub(crate) fn read_record(&self, id: &Digest) -> Result<Option<ImageRecord>, ImageError> {
        let p = self.record_path(id);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| ImageError::Damaged {
                    path: p,
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::io("read", p, e)),
        }
    }

    fn records(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let dir = self.root.join("images");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir)
            .map_err(|e| ImageError::io("list", &dir, e))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(hex) = name.strip_suffix(".json").filter(|h| is_hex64(h)) {
                let id = Digest::parse(&format!("sha256:{hex}"))?;
                if let Some(r) = self.read_record(&id)? {
                    out.push(r);
                }
            }
        }
        out.sort_by(|a, b| b.pulled_at.cmp(&a.pulled_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    pub(crate) fn layer_meta(&self, diff_id: &Digest) -> Result<Option<LayerMeta>, ImageError> {
        let p = self.layer_dir(diff_id).join("layer.json");
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| ImageError::Damaged {
                    path: p,
                    reason: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::io("read", p, e)),
        }
    }

    fn load(&self, id: &Digest) -> Result<Image, ImageError> {
        let record = self
            .read_record(id)?
            .ok_or_else(|| ImageError::NotFound(id.to_string()))?;
        self.image_of(record, &self.read_refs()?)
    }

    fn image_of(&self, record: ImageRecord, refs: &Refs) -> Result<Image, ImageError> {
        let mut layers = Vec::new();
        let mut infos = Vec::new();
        for l in &record.layers {
            let meta = self
                .layer_meta(&l.diff_id)?
                .ok_or_else(|| ImageError::Damaged {
                    path: self.layer_dir(&l.diff_id),
                    reason: format!("layer {} of image {} is missing", l.diff_id, record.id),
                })?;
            infos.push(LayerInfo {
                diff_id: l.diff_id.to_string(),
                blob: l.blob.to_string(),
                media_type: l.media_type.clone(),
                size: l.size,
                unpacked_bytes: meta.unpacked_bytes,
                path: self.layer_dir(&l.diff_id).join("root"),
                setid_stripped: meta.report.setid_stripped,
                skipped: meta.report.skipped,
            });
            layers.push(self.layer_dir(&l.diff_id).join("root"));
        }
        layers.reverse();
        infos.reverse();
        Ok(Image {
            id: record.id.to_string(),
            references: refs
                .refs
                .iter()
                .filter(|(_, v)| **v == record.id)
                .map(|(k, _)| k.clone())
                .collect(),
            layers,
            config: record.config,
            manifest: record.manifest.map(|d| d.to_string()),
            source: record.source,
            platform: record.platform,
            created: record.created,
            pulled_at: record.pulled_at,
            layer_info: infos,
            holders: self.holders_of(&record.id)?,
        })
    }

    /// Resolves a reference (as given to pull, normalised), a full id or a unique id prefix
    /// (at least 4 hex digits).
    pub(crate) fn resolve(
        &self,
        reference_or_id: &str,
    ) -> Result<Option<(Digest, Option<String>)>, ImageError> {
        let refs = self.read_refs()?;
        if let Some(id) = refs.refs.get(reference_or_id) {
            return Ok(Some((id.clone(), Some(reference_or_id.to_owned()))));
        }
        if let Ok(source) = crate::reference::Source::parse(reference_or_id) {
            let name = source.name();
            if let Some(id) = refs.refs.get(&name) {
                return Ok(Some((id.clone(), Some(name))));
            }
        }
        let hex = reference_or_id
            .strip_prefix("sha256:")
            .unwrap_or(reference_or_id);
        if hex.len() >= 4
            && hex.len() <= 64
            && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            let matches: Vec<Digest> = self
                .records()?
                .into_iter()
                .map(|r| r.id)
                .filter(|id| id.hex().starts_with(hex))
                .collect();
            return match matches.as_slice() {
                [] => Ok(None),
                [one] => Ok(Some((one.clone(), None))),
                many => Err(ImageError::Ambiguous {
                    prefix: reference_or_id.to_owned(),
                    matches: many
                        .iter()
                        .map(|d| d.short().to_owned())
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
            };
        }
        Ok(None)
    }

    /// Names image `id` (an image id, as [`Image::id`] gives it) `name` as well (normalised
    /// as references are), moving `name` off any image it named before.
    pub fn tag(&self, id: &str, name: &str) -> Result<(), ImageError> {
        let digest = Digest::parse(id).map_err(|_| ImageError::NotFound(id.to_owned()))?;
        if self.read_record(&digest)?.is_none() {
            return Err(ImageError::NotFound(id.to_owned()));
        }
        let name = crate::reference::Source::parse(name)?.name();
        self.set_refs(&[name], &digest)
    }

    /// The image `reference_or_id` names, if it is in the store.
    pub fn get(&self, reference_or_id: &str) -> Result<Option<Image>, ImageError> {
        match self.resolve(reference_or_id)? {
            Some((id, _)) => match self.read_record(&id)? {
                Some(r) => Ok(Some(self.image_of(r, &self.read_refs()?)?)),
                None => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// Every image, most recently pulled first.
    pub fn list(&self) -> Result<Vec<ImageSummary>, ImageError> {
        let refs = self.read_refs()?;
        let mut out = Vec::new();
        for r in self.records()? {
            let mut bytes = 0;
            for l in &r.layers {
                bytes += self.layer_meta(&l.diff_id)?.map_or(0, |m| m.unpacked_bytes);
            }
            out.push(ImageSummary {
                id: r.id.to_string(),
                references: refs
                    .refs
                    .iter()
                    .filter(|(_, v)| **v == r.id)
                    .map(|(k, _)| k.clone())
                    .collect(),
                layers: r.layers.len(),
                unpacked_bytes: bytes,
                created: r.created.clone(),
                pulled_at: r.pulled_at,
                holders: self.holders_of(&r.id)?,
            });
        }
        Ok(out)
    }

    fn holds_dir(&self, id: &Digest) -> PathBuf {
        self.root.join("holds").join(id.hex())
    }

    fn holders_of(&self, id: &Digest) -> Result<Vec<String>, ImageError> {
        let dir = self.holds_dir(id);
        let mut out = Vec::new();
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with('.') {
                        continue;
                    }
                    // The hold of a process that is gone (a killed `lockbox run`) ends with it.
                    if crate::sandbox::is_stale_holder(&n) {
                        let _ = std::fs::remove_file(e.path());
                        continue;
                    }
                    out.push(n);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ImageError::io("list holders", dir, e)),
        }
        out.sort();
        Ok(out)
    }

    /// Marks the image `reference_or_id` as used by `holder` (a sandbox or snapshot name):
    /// `rm` and `prune` leave it alone until [`Store::release`]. A hold is a file, so it
    /// survives crashes; whoever holds must release.
    pub fn hold(&self, reference_or_id: &str, holder: &str) -> Result<Image, ImageError> {
        check_holder(holder)?;
        let _shared = flock(&self.root.join("store.lock"), FlockOperation::LockShared)?;
        let (id, _) = self
            .resolve(reference_or_id)?
            .ok_or_else(|| ImageError::NotFound(reference_or_id.to_owned()))?;
        let dir = self.holds_dir(&id);
        std::fs::create_dir_all(&dir).map_err(|e| ImageError::io("create a hold", &dir, e))?;
        let record = format!("{{\"holder\":{:?},\"since\":{}}}\n", holder, now());
        if crate::sandbox::is_process_holder(holder) {
            // A process's hold ends with the process, which a crash of the machine ends
            // too: it need not survive one (no fsync: a run's start pays nothing for it).
            let path = dir.join(holder);
            std::fs::write(&path, record).map_err(|e| ImageError::io("write a hold", &path, e))?;
        } else {
            write_atomic(&dir.join(holder), record.as_bytes())?;
        }
        self.touch_used(&id);
        self.load(&id)
    }

    /// Removes `holder`'s hold on image `id` (nothing if there is none).
    pub fn release(&self, id: &str, holder: &str) -> Result<(), ImageError> {
        check_holder(holder)?;
        let id = Digest::parse(id)?;
        let dir = self.holds_dir(&id);
        match std::fs::remove_file(dir.join(holder)) {
            Ok(()) => {
                let _ = std::fs::remove_dir(&dir);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::io("release a hold", dir.join(holder), e)),
        }
    }

    /// Removes a reference, or (given an id, or the image's last reference) the image.
    /// Refused, with the holders named, while a sandbox or snapshot holds the image.
    /// Returns what was removed.
    pub fn remove(&self, reference_or_id: &str) -> Result<Removed, ImageError> {
        let _excl = flock(&self.root.join("store.lock"), FlockOperation::LockExclusive)?;
        let _refs_lock = flock(&self.root.join("refs.lock"), FlockOperation::LockExclusive)?;
        let (id, name) = self
            .resolve(reference_or_id)?
            .ok_or_else(|| ImageError::NotFound(reference_or_id.to_owned()))?;
        let mut refs = self.read_refs()?;
        let names: Vec<String> = refs
            .refs
            .iter()
            .filter(|(_, v)| **v == id)
            .map(|(k, _)| k.clone())
            .collect();
        let untag_only = name.as_ref().is_some_and(|_| names.len() > 1);
        if untag_only {
            if let Some(n) = &name {
                refs.refs.remove(n);
            }
            self.write_refs(&refs)?;
            return Ok(Removed {
                id: id.to_string(),
                references: name.into_iter().collect(),
                image_deleted: false,
                freed_bytes: 0,
            });
        }
        let holders = self.holders_of(&id)?;
        if !holders.is_empty() {
            return Err(ImageError::Held {
                id: id.to_string(),
                holders,
            });
        }
        for n in &names {
            refs.refs.remove(n);
        }
        self.write_refs(&refs)?;
        let _ = std::fs::remove_file(self.used_path(&id));
        let p = self.record_path(&id);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ImageError::io("remove an image record", p, e)),
        }
        let gc = self.collect_garbage()?;
        Ok(Removed {
            id: id.to_string(),
            references: names,
            image_deleted: true,
            freed_bytes: gc.bytes_freed,
        })
    }

    /// Removes images nothing names (or, with `all`, every image no one holds), then every
    /// layer and blob no remaining image uses.
    pub fn prune(&self, opts: &PruneOptions) -> Result<PruneReport, ImageError> {
        let _excl = flock(&self.root.join("store.lock"), FlockOperation::LockExclusive)?;
        let _refs_lock = flock(&self.root.join("refs.lock"), FlockOperation::LockExclusive)?;
        let mut refs = self.read_refs()?;
        let mut removed = Vec::new();
        for r in self.records()? {
            let named = refs.refs.values().any(|v| *v == r.id);
            if (named && !opts.all) || !self.holders_of(&r.id)?.is_empty() {
                continue;
            }
            refs.refs.retain(|_, v| *v != r.id);
            let p = self.record_path(&r.id);
            std::fs::remove_file(&p).map_err(|e| ImageError::io("remove an image record", p, e))?;
            let _ = std::fs::remove_file(self.used_path(&r.id));
            removed.push(r.id.to_string());
        }
        self.write_refs(&refs)?;
        let mut report = self.collect_garbage()?;
        report.images_removed = removed;
        Ok(report)
    }

    fn used_path(&self, id: &Digest) -> PathBuf {
        self.root.join("images").join(format!("{}.used", id.hex()))
    }

    /// Records that image `id` was used now (a pull or a hold), for least-recently-used
    /// pruning. Best effort: a failure only makes the image look older.
    pub(crate) fn touch_used(&self, id: &Digest) {
        if let Ok(f) = std::fs::File::create(self.used_path(id)) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }

    fn last_used(&self, r: &ImageRecord) -> std::time::SystemTime {
        let pulled = std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.pulled_at);
        std::fs::metadata(self.used_path(&r.id))
            .and_then(|m| m.modified())
            .map_or(pulled, |t| t.max(pulled))
    }

    /// The bytes the store takes: unpacked layers (their tar streams' size) and blobs.
    pub fn usage(&self) -> Result<u64, ImageError> {
        let mut total = 0;
        let layers = self.root.join("layers");
        for e in std::fs::read_dir(&layers)
            .map_err(|e| ImageError::io("list", &layers, e))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if is_hex64(&n) {
                let d = Digest::parse(&format!("sha256:{n}"))?;
                total += self.layer_meta(&d)?.map_or(0, |m| m.unpacked_bytes);
            }
        }
        let blobs = self.root.join("blobs/sha256");
        for e in std::fs::read_dir(&blobs)
            .map_err(|e| ImageError::io("list", &blobs, e))?
            .flatten()
        {
            total += e.metadata().map_or(0, |m| m.len());
        }
        Ok(total)
    }

    /// Removes the least recently used images (pulled or held longest ago) that no one holds,
    /// other than those named in `keep` (ids), until the store takes at most `max_bytes`
    /// ([`Store::usage`]); then what only they used. Stops when nothing more can go.
    pub fn shrink_to(&self, max_bytes: u64, keep: &[&str]) -> Result<PruneReport, ImageError> {
        let _excl = flock(&self.root.join("store.lock"), FlockOperation::LockExclusive)?;
        let _refs_lock = flock(&self.root.join("refs.lock"), FlockOperation::LockExclusive)?;
        let mut report = PruneReport::default();
        while self.usage()? > max_bytes {
            let mut candidates = Vec::new();
            for r in self.records()? {
                if keep.contains(&r.id.as_str()) || !self.holders_of(&r.id)?.is_empty() {
                    continue;
                }
                candidates.push((self.last_used(&r), r.id));
            }
            candidates.sort();
            let Some((_, id)) = candidates.into_iter().next() else {
                break;
            };
            let mut refs = self.read_refs()?;
            refs.refs.retain(|_, v| *v != id);
            self.write_refs(&refs)?;
            let p = self.record_path(&id);
            std::fs::remove_file(&p).map_err(|e| ImageError::io("remove an image record", p, e))?;
            let _ = std::fs::remove_file(self.used_path(&id));
            let gc = self.collect_garbage()?;
            report.images_removed.push(id.to_string());
            report.layers_removed += gc.layers_removed;
            report.blobs_removed += gc.blobs_removed;
            report.bytes_freed += gc.bytes_freed;
        }
        Ok(report)
    }

    /// Removes layers and blobs no image record uses. Called with the store locked
    /// exclusively (no pull is between unpacking a layer and recording its image).
    fn collect_garbage(&self) -> Result<PruneReport, ImageError> {
        let mut keep_layers = BTreeSet::new();
        let mut keep_blobs = BTreeSet::new();
        for r in self.records()? {
            keep_blobs.insert(r.id.hex().to_owned());
            if let Some(m) = &r.manifest {
                keep_blobs.insert(m.hex().to_owned());
            }
            for l in &r.layers {
                keep_layers.insert(l.diff_id.hex().to_owned());
                keep_blobs.insert(l.blob.hex().to_owned());
            }
        }
        let mut report = PruneReport::default();
        let layers = self.root.join("layers");
        for e in std::fs::read_dir(&layers)
            .map_err(|e| ImageError::io("list", &layers, e))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if is_hex64(&n) && !keep_layers.contains(&n) {
                let d = Digest::parse(&format!("sha256:{n}"))?;
                report.bytes_freed += self
                    .layer_meta(&d)
                    .ok()
                    .flatten()
                    .map_or(0, |m| m.unpacked_bytes);
                remove_tree(&e.path())
                    .map_err(|err| ImageError::io("remove a layer", e.path(), err))?;
                report.layers_removed += 1;
            }
        }
        let blobs = self.root.join("blobs/sha256");
        for e in std::fs::read_dir(&blobs)
            .map_err(|e| ImageError::io("list", &blobs, e))?
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if is_hex64(&n) && !keep_blobs.contains(&n) {
                report.bytes_freed += e.metadata().map_or(0, |m| m.len());
                std::fs::remove_file(e.path())
                    .map_err(|err| ImageError::io("remove a blob", e.path(), err))?;
                report.blobs_removed += 1;
            }
        }
        Ok(report)
    }
}

/// What [`Store::remove`] did.
#[derive(Debug, Clone, Serialize)]
pub struct Removed {
    /// The image's id.
    pub id: String,
    /// The references removed.
    pub references: Vec<String>,
    /// Whether the image itself was deleted (else only a reference of it).
    pub image_deleted: bool,
    /// Bytes of layers and blobs freed.
    pub freed_bytes: u64,
}

fn check_holder(h: &str) -> Result<(), ImageError> {
    let ok = !h.is_empty()
        && h.len() <= 200
        && h != "."
        && h != ".."
        && !h.starts_with('.')
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ImageError::BadHolder(h.to_owned()))
    }
}

/// Copies a local blob beneath `dir` to `dest`, verifying its size and digest.
fn copy_verified(
    dir: &Path,
    rel: &Path,
    desc: &Descriptor,
    dest: &Path,
    progress: &AtomicU64,
) -> Result<(), ImageError> {
    let what = format!("{}: blob {}", dir.display(), desc.digest);
    let f = source::open_beneath(dir, rel)?;
    let mut h = HashingReader::new(f.take(desc.size + 1));
    let mut out =
        std::fs::File::create(dest).map_err(|e| ImageError::io("create a blob copy", dest, e))?;
    std::io::copy(&mut h, &mut out).map_err(|e| ImageError::io("copy a blob", dir.join(rel), e))?;
    progress.fetch_add(h.count, Ordering::Relaxed);
    if h.count != desc.size {
        return Err(ImageError::SizeMismatch {
            what,
            expected: desc.size,
            actual: h.count,
        });
    }
    let actual = Digest::from_hasher(h.hasher);
    if actual != desc.digest {
        return Err(ImageError::DigestMismatch {
            what,
            expected: desc.digest.to_string(),
            actual: actual.to_string(),
        });
    }
    out.sync_all()
        .map_err(|e| ImageError::io("fsync a blob copy", dest, e))
}

fn show(name: &str, p: &Progress) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    crate::eprint_progress(&format!(
        "{name}: {}/{} layers, {:.1}/{:.1} MiB",
        p.layers_done.load(Ordering::Relaxed),
        p.layers.load(Ordering::Relaxed),
        mib(p.bytes.load(Ordering::Relaxed)),
        mib(p.total.load(Ordering::Relaxed)),
    ));
}

/// A directory for a build's scratch work under the store's `tmp/` (so its layers can be
/// renamed into `layers/`), removed when dropped; a crashed build's is removed by the next
/// open of the store.
#[derive(Debug)]
pub struct BuildDir {
    work: Work,
    _shared: Flock,
}

impl BuildDir {
    /// The directory.
    pub fn path(&self) -> &Path {
        &self.work.dir
    }
}

/// The media type of a layer the store made itself (its blob is the uncompressed tar stream,
/// which is not kept: it is written again, from the layer directory, when needed).
pub const BUILT_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

impl Store {
    /// A scratch directory for a build. It also holds the store shared, so no `prune` or
    /// `rm` removes the layers a build has made before its image is recorded.
    pub fn build_dir(&self) -> Result<BuildDir, ImageError> {
        let shared = flock(&self.root.join("store.lock"), FlockOperation::LockShared)?;
        Ok(BuildDir {
            work: self.work()?,
            _shared: shared,
        })
    }

    /// The unpacked directory of layer `diff_id`, if the store has it.
    pub fn layer_path(&self, diff_id: &Digest) -> Option<PathBuf> {
        let d = self.layer_dir(diff_id);
        d.join("layer.json").exists().then(|| d.join("root"))
    }

    /// Adds the directory `dir` (in overlayfs format, under a [`BuildDir`]) as a layer and
    /// returns its diff id: the sha256 of its OCI tar stream (see `layer_tar`). The directory
    /// is moved into the store, or removed when the store has that layer already.
    pub fn add_layer_dir(&self, dir: &Path) -> Result<Digest, ImageError> {
        let sink = crate::layer_tar::HashingSink {
            hasher: sha2::Sha256::default(),
            count: 0,
        };
        let sink = crate::layer_tar::write_layer_tar(dir, sink)?;
        let diff_id = Digest::from_hasher(sink.hasher);
        let _lock = flock(
            &self
                .root
                .join("locks")
                .join(format!("{}.lock", diff_id.hex())),
            FlockOperation::LockExclusive,
        )?;
        let dest = self.layer_dir(&diff_id);
        if dest.join("layer.json").exists() {
            remove_tree(dir).map_err(|e| ImageError::io("remove a duplicate layer", dir, e))?;
            return Ok(diff_id);
        }
        let _ = remove_tree(&dest);
        let staging = dir.with_file_name(format!("layer-{}-{}", diff_id.hex(), unique()));
        std::fs::create_dir(&staging)
            .map_err(|e| ImageError::io("create a layer directory", &staging, e))?;
        let root = staging.join("root");
        std::fs::rename(dir, &root).map_err(|e| ImageError::io("store a layer", &root, e))?;
        let meta = LayerMeta {
            format: FORMAT,
            diff_id: diff_id.clone(),
            blob: diff_id.clone(),
            unpacked_bytes: sink.count,
            report: UnpackReport::default(),
        };
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| ImageError::io("encode", &staging, std::io::Error::other(e)))?;
        write_atomic(&staging.join("layer.json"), &json)?;
        std::fs::rename(&staging, &dest).map_err(|e| ImageError::io("store a layer", &dest, e))?;
        fsync_dir(&self.root.join("layers"))?;
        Ok(diff_id)
    }

    /// Records an image of `layers` (diff ids of layers in the store, BASE FIRST) and
    /// `config`, named `names` (normalised as references are), and returns it. Its id is the
    /// digest of the OCI config document written for it (kept as a blob).
    pub fn add_image(
        &self,
        config: &ImageConfig,
        layers: &[Digest],
        names: &[String],
        source: &str,
    ) -> Result<Image, ImageError> {
        self.add_image_for(&crate::Platform::host(), config, layers, names, source)
    }

    /// [`Store::add_image`] of an image for `platform` (a build `FROM --platform=...`).
    pub fn add_image_for(
        &self,
        platform: &crate::Platform,
        config: &ImageConfig,
        layers: &[Digest],
        names: &[String],
        source: &str,
    ) -> Result<Image, ImageError> {
        let mut normalised = Vec::new();
        for n in names {
            normalised.push(crate::reference::Source::parse(n)?.name());
        }
        let mut records = Vec::new();
        for d in layers {
            let meta = self.layer_meta(d)?.ok_or_else(|| ImageError::Damaged {
                path: self.layer_dir(d),
                reason: format!("layer {d} is not in the store"),
            })?;
            records.push(LayerRecord {
                diff_id: d.clone(),
                blob: meta.blob,
                media_type: BUILT_LAYER_MEDIA_TYPE.into(),
                size: meta.unpacked_bytes,
            });
        }
        let mut run = serde_json::Map::new();
        let mut put = |k: &str, v: serde_json::Value| {
            if !v.is_null() {
                run.insert(k.into(), v);
            }
        };
        put("Env", serde_json::json!(config.env));
        put("WorkingDir", serde_json::json!(config.working_dir));
        put("User", serde_json::json!(config.user));
        put("Entrypoint", serde_json::json!(config.entrypoint));
        put("Cmd", serde_json::json!(config.cmd));
        put("Labels", serde_json::json!(config.labels));
        let ports: serde_json::Map<String, serde_json::Value> = config
            .exposed_ports
            .iter()
            .map(|p| (p.clone(), serde_json::json!({})))
            .collect();
        put("ExposedPorts", serde_json::Value::Object(ports));
        put("StopSignal", serde_json::json!(config.stop_signal));
        let mut doc = serde_json::json!({
            "architecture": platform.architecture,
            "os": platform.os,
            "config": run,
            "rootfs": {
                "type": "layers",
                "diff_ids": layers.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            },
        });
        if let Some(v) = &platform.variant {
            doc["variant"] = serde_json::json!(v);
        }
        let bytes = serde_json::to_vec(&doc)
            .map_err(|e| ImageError::io("encode", self.path(), std::io::Error::other(e)))?;
        let id = Digest::of(&bytes);
        self.put_blob(&id, &bytes)?;
        let record = ImageRecord {
            format: FORMAT,
            id: id.clone(),
            manifest: None,
            source: source.to_owned(),
            platform: platform.to_string(),
            created: None,
            pulled_at: now(),
            config: config.clone(),
            layers: records,
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| {
            ImageError::io("encode", self.record_path(&id), std::io::Error::other(e))
        })?;
        write_atomic(&self.record_path(&id), &json)?;
        self.set_refs(&normalised, &id)?;
        self.touch_used(&id);
        self.load(&id)
    }

    /// The build cache's entry `key` (a layer's diff id, or `empty` for a step that made no
    /// layer), if any and its layer is still in the store.
    pub fn cache_get(&self, key: &Digest) -> Option<Option<Digest>> {
        let p = self.root.join("cache").join(key.hex());
        let text = std::fs::read_to_string(p).ok()?;
        let text = text.trim();
        if text == "empty" {
            return Some(None);
        }
        let d = Digest::parse(text).ok()?;
        self.layer_path(&d)?;
        Some(Some(d))
    }

    /// Records the build cache's entry `key`.
    pub fn cache_put(&self, key: &Digest, layer: Option<&Digest>) -> Result<(), ImageError> {
        let dir = self.root.join("cache");
        std::fs::create_dir_all(&dir).map_err(|e| ImageError::io("create", &dir, e))?;
        let text = layer.map_or_else(|| "empty".to_owned(), |d| d.to_string());
        write_atomic(&dir.join(key.hex()), text.as_bytes())
    }
}
