//! Snapshots: immutable, named copies of a sandbox's upper layer, stacked on their parent's.
//!
//! A sandbox sees the workdir through an overlay whose lower is the workdir (or, for a fork,
//! the layers of the snapshot it came from, then the workdir) and whose upper is its
//! branch's `upper/`. [`SnapshotStore::capture`] copies that upper, overlay marks included
//! (whiteouts, opaque directories), into a new *layer*: what the sandbox sees then is the
//! snapshot's layer over its parent's layers over the workdir — [`SnapshotStore::layers`],
//! top first, exactly an overlayfs `lowerdir=` list. A fork is an overlay with those layers
//! and the workdir as its lower and a fresh upper: it costs a mount, not a copy.
//!
//! The capture copies (`copy_file_range`: blocks are shared where the filesystem can reflink,
//! btrfs and xfs) and never hard-links, because a running sandbox changes files of its upper
//! in place. The caller pauses the sandbox's processes while it runs, so the copy is one
//! instant of the upper. Processes' memory is not part of a snapshot (that needs
//! `CAP_CHECKPOINT_RESTORE`); the record's `context` is where a front end keeps what it can
//! restore (session cwd and variables) and could later name a process checkpoint.
//!
//! On disk, `STATE/snapshots/<id>/{layer/, meta.json, users/}`:
//! - **atomic publish**: a snapshot is made under `.new/<pid>-<id>/`, its layer and record
//!   made durable (`syncfs`), then renamed into place. A crash leaves no half-made snapshot
//!   visible; [`SnapshotStore::open`] sweeps what dead creators left, and any snapshot
//!   directory without its `meta.json` (a removal a crash interrupted: `meta.json` goes first);
//! - **in use**: a fork ([`crate::Branch::create_fork`]: its record names the layers) uses
//!   a snapshot as long as its branch exists, kept or running; anything else reading a
//!   snapshot's layers holds it under a name ([`SnapshotStore::hold`]).
//!   [`SnapshotStore::delete`] refuses a snapshot that is used, held, or that another
//!   snapshot stacks on ([`CowError::SnapshotInUse`]). Changes to the store
//!   (publish, hold, delete) are serialised by an `flock` on `snapshots/.lock`.

use std::ffi::OsStr;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::beneath;
use crate::durable::fsync_dir;
use crate::id::check_id;
use crate::{CowError, Timestamp};

/// Version of a snapshot's `meta.json`.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
const META: &str = "meta.json";
const LAYER: &str = "layer";
const USERS: &str = "users";
const SCRATCH: &str = "scratch";
const UNFINISHED: &str = ".new";
const LOCK: &str = ".lock";

/// The key a branch's context sets to `true` while the branch is a *spare*: a fork made
/// ahead by a pool, which no one uses yet. A spare keeps no snapshot from being deleted
/// (it is removed with it), and a runtime opening the state directory removes those a dead
/// one left; handing one out rewrites its context without the key.
pub const SPARE: &str = "spare";

/// Whether a branch's context marks it a spare ([`SPARE`]).
pub fn is_spare(context: &serde_json::Value) -> bool {
    context.get(SPARE).and_then(serde_json::Value::as_bool) == Some(true)
}

/// The name of a hold this process takes for `what` (`<pid>-<kind>-<what>`): swept by the
/// next [`SnapshotStore::open`] once this process is gone.
pub fn process_hold(kind: &str, what: &str) -> String {
    format!("{}-{kind}-{what}", std::process::id())
}

/// The id of a snapshot: like a [`crate::BranchId`], 1–64 bytes of `[A-Za-z0-9._-]`, not
/// starting with `.`. Also the name of a hold ([`SnapshotStore::hold`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SnapshotId(String);

impl SnapshotId {
    /// Checks `s` and wraps it.
    pub fn parse(s: &str) -> Result<SnapshotId, CowError> {
        check_id(s).map_err(|reason| CowError::InvalidSnapshotId {
            id: s.to_owned(),
            reason,
        })?;
        Ok(SnapshotId(s.to_owned()))
    }

    /// A fresh id, `s` then the same parts as [`crate::BranchId::generate`].
    pub fn generate() -> SnapshotId {
        SnapshotId(format!("s{}", &crate::BranchId::generate().as_str()[1..]))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for SnapshotId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SnapshotId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for SnapshotId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for SnapshotId {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl PartialEq<&str> for SnapshotId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for SnapshotId {
    type Err = CowError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SnapshotId::parse(s)
    }
}

impl<'de> Deserialize<'de> for SnapshotId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SnapshotId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What a new snapshot records besides its files.
#[derive(Debug, Clone)]
pub struct NewSnapshot {
    /// A name for people (any text; not unique).
    pub name: Option<String>,
    /// The snapshot the captured upper lies on (the sandbox was forked from it), if any.
    pub parent: Option<SnapshotId>,
    /// The workdir below all the layers.
    pub workdir: PathBuf,
    /// The stale-base reference of the sandbox's branch: forks inherit it, so a change made
    /// to the workdir since the first sandbox of the chain began makes their commits stale.
    pub base_ctime: Timestamp,
    /// The caller's record (policy, sessions' cwd and variables), stored as-is.
    pub context: serde_json::Value,
    /// Other trees to keep beside the layer, by name (a sandbox's `/tmp`): copied with
    /// [`crate::copy_tree`], read back with [`SnapshotStore::scratch`]. Names are ids.
    pub scratch: Vec<(String, PathBuf)>,
    /// Bounds of all the store's snapshots together, this one included.
    pub limits: SnapshotLimits,
}

/// Bounds of what a store's snapshots hold together on disk. The walk that copies a new
/// snapshot stops at the first entry beyond them (nothing of it is kept), so a sandbox
/// that made millions of entries is refused after the bound's worth, not after copying them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// What they cost at most, in bytes: each entry's blocks (a directory at least one)
    /// plus an inode (see [`crate::entry_cost`]).
    pub max_bytes: Option<u64>,
    /// How many entries (inodes) they hold at most.
    pub max_entries: Option<u64>,
}

/// Which of the [`SnapshotLimits`] a snapshot would cross.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotLimit {
    /// [`SnapshotLimits::max_bytes`].
    Bytes,
    /// [`SnapshotLimits::max_entries`].
    Entries,
}

impl std::fmt::Display for SnapshotLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SnapshotLimit::Bytes => "bytes",
            SnapshotLimit::Entries => "entries",
        })
    }
}

/// What the snapshots of a store hold together ([`SnapshotStore::usage`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotUsage {
    /// Their cost in bytes (as [`SnapshotMeta::bytes`]).
    pub bytes: u64,
    /// Their entries.
    pub entries: u64,
}

/// A published snapshot's record (`meta.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// [`SNAPSHOT_FORMAT_VERSION`].
    pub format_version: u32,
    /// Its id.
    pub id: SnapshotId,
    /// Its name, if given.
    pub name: Option<String>,
    /// The snapshot its layer lies on.
    pub parent: Option<SnapshotId>,
    /// The workdir below all the layers.
    pub workdir: PathBuf,
    /// See [`NewSnapshot::base_ctime`].
    pub base_ctime: Timestamp,
    /// When it was taken (wall clock).
    pub created: Timestamp,
    /// What its own layer (not its parents') and kept trees cost on disk, in bytes: each
    /// entry's blocks (a directory at least one) plus an inode ([`crate::entry_cost`]).
    /// Snapshots taken by earlier versions counted file data only.
    pub bytes: u64,
    /// Entries in its own layer and kept trees.
    pub entries: u64,
    /// The caller's record.
    pub context: serde_json::Value,
}

/// The snapshots under one state directory.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    dir: PathBuf,
}

impl SnapshotStore {
    /// Opens (creating) `STATE/snapshots/`, and sweeps what a crash left: unfinished
    /// snapshots of dead creators and snapshot directories without a record.
    pub fn open(state_dir: &Path) -> Result<SnapshotStore, CowError> {
        let dir = state_dir.join("snapshots");
        let err = |source| CowError::StateDir {
            path: dir.clone(),
            source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join(UNFINISHED))
            .map_err(err)?;
        let store = SnapshotStore { dir };
        store.sweep()?;
        Ok(store)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Copies the upper layer `upper` (its processes paused by the caller) into a new
    /// snapshot and publishes it. `parent`, if given, must exist; it is held while the copy
    /// runs, so it cannot be deleted meanwhile.
    pub fn capture(&self, upper: &Path, new: NewSnapshot) -> Result<SnapshotMeta, CowError> {
        self.capture_then(upper, new, || {})
    }

    /// [`SnapshotStore::capture`], calling `copied` as soon as everything is copied, before
    /// the copy is made durable and published: the caller resumes the sandbox's processes
    /// there, so their pause lasts the copy only, not the `syncfs` (which flushes whatever
    /// else the filesystem has dirty too). The snapshot is still one instant: it was taken
    /// whole while they were paused.
    pub fn capture_then(
        &self,
        upper: &Path,
        new: NewSnapshot,
        copied: impl FnOnce(),
    ) -> Result<SnapshotMeta, CowError> {
        let id = SnapshotId::generate();
        if let Some(parent) = &new.parent {
            self.hold(parent, &process_hold("capture", id.as_str()))?;
        }
        let made = self.capture_as(upper, &id, new.clone(), copied);
        if let Some(parent) = &new.parent {
            // The child now stacks on the parent, which protects it from then on.
            let _ = self.release(parent, &process_hold("capture", id.as_str()));
        }
        made
    }

    fn capture_as(
        &self,
        upper: &Path,
        id: &SnapshotId,
        new: NewSnapshot,
        copied: impl FnOnce(),
    ) -> Result<SnapshotMeta, CowError> {
        let unfinished = self.dir.join(UNFINISHED);
        let aside_name = format!("{}-{}", std::process::id(), id);
        let aside = unfinished.join(&aside_name);
        let made = (|| {
            let layer = aside.join(LAYER);
            private_dir(&aside)?;
            private_dir(&layer)?;
            private_dir(&aside.join(USERS))?;
            let used = self.usage()?;
            let room = |max: Option<u64>, used: u64| max.map(|m| m.saturating_sub(used));
            let mut tally = crate::layers::Tally::within((
                room(new.limits.max_bytes, used.bytes),
                room(new.limits.max_entries, used.entries),
            ));
            crate::layers::capture(upper, &layer, &mut tally)?;
            for (name, tree) in &new.scratch {
                check_id(name).map_err(|reason| CowError::InvalidSnapshotId {
                    id: name.clone(),
                    reason,
                })?;
                let kept = aside.join(SCRATCH);
                if !kept.exists() {
                    private_dir(&kept)?;
                }
                private_dir(&kept.join(name))?;
                crate::layers::copy_tree_counted(tree, &kept.join(name), &mut tally)?;
            }
            // The layer's root carries the view's root attributes, as the upper's does.
            let upper_mode = fs::metadata(upper)
                .map_err(|source| CowError::ReadUpper {
                    path: upper.to_owned(),
                    source,
                })?
                .mode();
            copied();
            fs::set_permissions(
                &layer,
                std::os::unix::fs::PermissionsExt::from_mode(upper_mode & 0o7777),
            )
            .map_err(|source| CowError::Snapshot {
                path: layer.clone(),
                source,
            })?;
            let meta = SnapshotMeta {
                format_version: SNAPSHOT_FORMAT_VERSION,
                id: id.clone(),
                name: new.name,
                parent: new.parent,
                workdir: new.workdir,
                base_ctime: new.base_ctime,
                created: now(),
                bytes: tally.bytes,
                entries: tally.entries,
                context: new.context,
            };
            let json = serde_json::to_vec_pretty(&meta).map_err(|e| CowError::Snapshot {
                path: aside.join(META),
                source: io::Error::other(e),
            })?;
            fs::write(aside.join(META), json).map_err(|source| CowError::Snapshot {
                path: aside.join(META),
                source,
            })?;
            // One syncfs makes the layer's data, its entries and the record durable before
            // the rename publishes them.
            let sync =
                File::open(&aside).and_then(|f| rustix::fs::syncfs(&f).map_err(io::Error::from));
            sync.map_err(|source| CowError::Snapshot {
                path: aside.clone(),
                source,
            })?;
            let _lock = self.lock()?;
            // Another snapshot may have been published while this one was copied.
            let used = self.usage()?;
            let over = |max: Option<u64>, used: u64, this: u64| {
                max.is_some_and(|m| used.saturating_add(this) > m)
            };
            for (limit, max, used, this) in [
                (
                    SnapshotLimit::Bytes,
                    new.limits.max_bytes,
                    used.bytes,
                    meta.bytes,
                ),
                (
                    SnapshotLimit::Entries,
                    new.limits.max_entries,
                    used.entries,
                    meta.entries,
                ),
            ] {
                if over(max, used, this) {
                    return Err(CowError::SnapshotLimit {
                        limit,
                        path: upper.to_owned(),
                    });
                }
            }
            let dst = self.dir.join(id.as_str());
            fs::rename(&aside, &dst).map_err(|source| CowError::Snapshot {
                path: dst.clone(),
                source,
            })?;
            fsync_dir(&self.dir).map_err(|source| CowError::Snapshot {
                path: self.dir.clone(),
                source,
            })?;
            Ok(meta)
        })();
        if made.is_err() {
            let _ = remove_entry(&unfinished, OsStr::new(&aside_name));
        }
        made
    }

    /// Starts receiving snapshot `id` from elsewhere (another node's copy of it): its
    /// layer and kept trees are made by the caller in the directories the
    /// [`IncomingSnapshot`] gives, under `.new/` (swept like a half-made capture if this
    /// process dies), and published by [`IncomingSnapshot::publish`]; dropped unpublished,
    /// it is removed.
    pub fn incoming(&self, id: &SnapshotId) -> Result<IncomingSnapshot, CowError> {
        let aside = self.dir.join(UNFINISHED).join(format!(
            "{}-{}-{}",
            std::process::id(),
            next_incoming(),
            id
        ));
        private_dir(&aside)?;
        let incoming = IncomingSnapshot {
            store: self.clone(),
            id: id.clone(),
            aside,
            published: false,
        };
        private_dir(&incoming.aside.join(LAYER))?;
        private_dir(&incoming.aside.join(USERS))?;
        Ok(incoming)
    }

    /// The record of snapshot `id`.
    pub fn get(&self, id: &SnapshotId) -> Result<SnapshotMeta, CowError> {
        let path = self.dir.join(id.as_str()).join(META);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CowError::SnapshotNotFound { id: id.to_string() })
            }
            Err(source) => return Err(CowError::Snapshot { path, source }),
        };
        let meta: SnapshotMeta =
            serde_json::from_slice(&bytes).map_err(|e| CowError::Snapshot {
                path: path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            })?;
        if meta.format_version != SNAPSHOT_FORMAT_VERSION || &meta.id != id {
            return Err(CowError::Snapshot {
                path,
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "format {} id {} (this lockbox reads format {SNAPSHOT_FORMAT_VERSION})",
                        meta.format_version, meta.id
                    ),
                ),
            });
        }
        Ok(meta)
    }

    /// Every published snapshot, oldest first.
    pub fn list(&self) -> Result<Vec<SnapshotMeta>, CowError> {
        let mut out = Vec::new();
        for id in self.ids()? {
            match self.get(&id) {
                Ok(m) => out.push(m),
                // Deleted meanwhile.
                Err(CowError::SnapshotNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok(out)
    }

    /// The layers a view of snapshot `id` stacks over its workdir, top first (its own layer,
    /// its parent's, ...): an overlayfs `lowerdir=` list, to which the workdir is appended.
    pub fn layers(&self, id: &SnapshotId) -> Result<Vec<PathBuf>, CowError> {
        let mut out = Vec::new();
        let mut next = Some(id.clone());
        while let Some(id) = next {
            let meta = self.get(&id)?;
            out.push(self.dir.join(id.as_str()).join(LAYER));
            next = meta.parent;
            if out.len() > MAX_DEPTH {
                return Err(CowError::Snapshot {
                    path: self.dir.join(id.as_str()),
                    source: io::Error::other(format!(
                        "more than {MAX_DEPTH} snapshots stacked (or a cycle)"
                    )),
                });
            }
        }
        Ok(out)
    }

    /// The tree kept beside snapshot `id`'s layer under `name` ([`NewSnapshot::scratch`]),
    /// if it kept one.
    pub fn scratch(&self, id: &SnapshotId, name: &str) -> Option<PathBuf> {
        check_id(name).ok()?;
        let path = self.dir.join(id.as_str()).join(SCRATCH).join(name);
        path.is_dir().then_some(path)
    }

    /// The files snapshot `id` shows over its workdir, as one upper layer to read (for
    /// [`crate::diff_views`]): its own layer, or its layers flattened by linking into the
    /// store's scratch directory, which the [`crate::View`] removes when dropped (and
    /// [`SnapshotStore::open`] if this process dies first).
    pub fn view(&self, id: &SnapshotId) -> Result<crate::View, CowError> {
        let layers = self.layers(id)?;
        let scratch = self.dir.join(UNFINISHED);
        DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&scratch)
            .map_err(|source| CowError::Snapshot {
                path: scratch.clone(),
                source,
            })?;
        let (top, below) = layers
            .split_first()
            .ok_or_else(|| CowError::SnapshotNotFound { id: id.to_string() })?;
        // Named `<pid>-<n>`: what a dead process left is swept like a half-made snapshot.
        crate::View::in_dir(&scratch, "", top.clone(), below)
    }

    /// Holds snapshot `id` under the name `user`. A name made by [`process_hold`]
    /// (`<pid>-...`) is this process's: once the process is gone, the next
    /// [`SnapshotStore::open`] drops it, so a killed holder does not pin a snapshot forever.
    /// Holds under the name `user` (e.g. a fork's branch id): it cannot be
    /// deleted until every hold is released. Holding twice under one name is one hold.
    pub fn hold(&self, id: &SnapshotId, user: &str) -> Result<(), CowError> {
        check_id(user).map_err(|reason| CowError::InvalidSnapshotId {
            id: user.to_owned(),
            reason,
        })?;
        let _lock = self.lock()?;
        self.get(id)?;
        let path = self.dir.join(id.as_str()).join(USERS).join(user);
        File::create(&path)
            .and_then(|_| fsync_dir(&self.dir.join(id.as_str()).join(USERS)))
            .map_err(|source| CowError::Snapshot { path, source })
    }

    /// Releases the hold `user` on `id` (nothing if there is none, or no snapshot).
    pub fn release(&self, id: &SnapshotId, user: &str) -> Result<(), CowError> {
        if check_id(user).is_err() {
            return Ok(());
        }
        let _lock = self.lock()?;
        let path = self.dir.join(id.as_str()).join(USERS).join(user);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(CowError::Snapshot { path, source: e })
            }
            _ => Ok(()),
        }
    }

    /// The names holding `id`, sorted.
    pub fn holders(&self, id: &SnapshotId) -> Result<Vec<String>, CowError> {
        let dir = self.dir.join(id.as_str()).join(USERS);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.get(id)?;
                return Ok(Vec::new());
            }
            Err(source) => return Err(CowError::Snapshot { path: dir, source }),
        };
        let mut out: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Deletes snapshot `id`: refused ([`CowError::SnapshotInUse`]) while it is held or
    /// another snapshot stacks on it. The record goes first, so an interrupted removal leaves
    /// a directory the next [`SnapshotStore::open`] sweeps, never a snapshot with part of
    /// its layer.
    pub fn delete(&self, id: &SnapshotId) -> Result<(), CowError> {
        let _lock = self.lock()?;
        self.get(id)?;
        let mut holders = self.holders(id)?;
        let (spares, forks): (Vec<_>, Vec<_>) =
            self.fork_branches(id)?.into_iter().partition(|f| f.2);
        holders.extend(forks.into_iter().map(|f| f.1));
        let children: Vec<String> = self
            .list()?
            .into_iter()
            .filter(|m| m.parent.as_ref() == Some(id))
            .map(|m| m.id.to_string())
            .collect();
        if !holders.is_empty() || !children.is_empty() {
            return Err(CowError::SnapshotInUse {
                id: id.to_string(),
                holders,
                children,
            });
        }
        self.remove(id.as_str())?;
        // Spare forks go with it: nobody was using them (their owner, if alive, finds the
        // snapshot gone before it would hand one out).
        if let Some(state_dir) = self.dir.parent() {
            for (branch, _, _) in spares {
                let _ = crate::branch::abort_id(state_dir, &branch);
            }
        }
        Ok(())
    }

    /// The branches (forks, running or kept) whose view stacks on `id`'s layer: their ids,
    /// each with the sandbox it belongs to when its record says (`BRANCH (sandbox ID)`).
    /// Spare forks ([`is_spare`]) are not listed: they keep nothing from being deleted.
    pub fn forks(&self, id: &SnapshotId) -> Result<Vec<String>, CowError> {
        Ok(self
            .fork_branches(id)?
            .into_iter()
            .filter(|f| !f.2)
            .map(|f| f.1)
            .collect())
    }

    /// Every branch over `id`'s layer: its id, its label for [`SnapshotStore::forks`], and
    /// whether it is a spare.
    fn fork_branches(
        &self,
        id: &SnapshotId,
    ) -> Result<Vec<(crate::BranchId, String, bool)>, CowError> {
        let Some(state_dir) = self.dir.parent() else {
            return Ok(Vec::new());
        };
        let layer = self.dir.join(id.as_str()).join(LAYER);
        Ok(crate::branch::list(state_dir)?
            .into_iter()
            .filter_map(|b| {
                let meta = b.meta.as_ref().ok()?;
                if !meta.layers.contains(&layer) {
                    return None;
                }
                let label = match meta.context.get("sandbox").and_then(|s| s.as_str()) {
                    Some(sandbox) => format!("{} (sandbox {sandbox})", b.id),
                    None => b.id.to_string(),
                };
                let spare = is_spare(&meta.context);
                Some((b.id, label, spare))
            })
            .collect())
    }

    /// What all snapshots hold together (for the [`SnapshotLimits`]).
    pub fn usage(&self) -> Result<SnapshotUsage, CowError> {
        Ok(self
            .list()?
            .iter()
            .fold(SnapshotUsage::default(), |u, m| SnapshotUsage {
                bytes: u.bytes.saturating_add(m.bytes),
                entries: u.entries.saturating_add(m.entries),
            }))
    }

    fn remove(&self, name: &str) -> Result<(), CowError> {
        let dir = self.dir.join(name);
        let err = |source| CowError::Snapshot {
            path: dir.clone(),
            source,
        };
        match fs::remove_file(dir.join(META)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(err(e)),
            _ => {}
        }
        remove_entry(&self.dir, OsStr::new(name)).map_err(err)?;
        fsync_dir(&self.dir).map_err(err)
    }

    fn ids(&self) -> Result<Vec<SnapshotId>, CowError> {
        let entries = fs::read_dir(&self.dir).map_err(|source| CowError::StateDir {
            path: self.dir.clone(),
            source,
        })?;
        Ok(entries
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| SnapshotId::parse(n).ok())
            })
            .collect())
    }

    fn sweep(&self) -> Result<(), CowError> {
        let _lock = self.lock()?;
        let unfinished = self.dir.join(UNFINISHED);
        if let Ok(entries) = fs::read_dir(&unfinished) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                if crate::branch::left_by_dead_creator(&name) {
                    let _ = remove_entry(&unfinished, &name);
                }
            }
        }
        for id in self.ids()? {
            if !self.dir.join(id.as_str()).join(META).exists() {
                self.remove(id.as_str())?;
                continue;
            }
            // Holds of processes that died holding them (see `process_hold`).
            let users = self.dir.join(id.as_str()).join(USERS);
            if let Ok(entries) = fs::read_dir(&users) {
                for entry in entries.flatten() {
                    if crate::branch::left_by_dead_creator(&entry.file_name()) {
                        let _ = fs::remove_file(entry.path());
                    }
                }
            }
        }
        Ok(())
    }

    fn lock(&self) -> Result<File, CowError> {
        let path = self.dir.join(LOCK);
        let err = |source| CowError::Snapshot {
            path: path.clone(),
            source,
        };
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(err)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| err(e.into()))?;
        Ok(file)
    }
}

/// A snapshot being received ([`SnapshotStore::incoming`]).
#[derive(Debug)]
pub struct IncomingSnapshot {
    store: SnapshotStore,
    id: SnapshotId,
    aside: PathBuf,
    published: bool,
}

/// What [`IncomingSnapshot::publish`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// The snapshot is new to this store.
    Published(SnapshotMeta),
    /// The store had it already (another receive of it finished first): the one it has.
    AlreadyHad(SnapshotMeta),
}

impl IncomingSnapshot {
    /// The (empty) directory its layer is made in.
    pub fn layer_dir(&self) -> PathBuf {
        self.aside.join(LAYER)
    }

    /// A new (empty) directory for the tree kept under `name` ([`NewSnapshot::scratch`]).
    pub fn scratch_dir(&self, name: &str) -> Result<PathBuf, CowError> {
        check_id(name).map_err(|reason| CowError::InvalidSnapshotId {
            id: name.to_owned(),
            reason,
        })?;
        let kept = self.aside.join(SCRATCH);
        for dir in [kept.clone(), kept.join(name)] {
            match DirBuilder::new().mode(0o700).create(&dir) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir == kept => {}
                r => r.map_err(|source| CowError::Snapshot {
                    path: dir.clone(),
                    source,
                })?,
            }
        }
        Ok(kept.join(name))
    }

    /// Publishes the snapshot with the record `meta` (its id must be this one's; `bytes`
    /// and `entries` are counted here, as this store's disk holds them), under the
    /// `limits` of the store. Its parent, if it names one, must be in the store. A store
    /// that has the snapshot already keeps its own ([`Received::AlreadyHad`]).
    pub fn publish(
        mut self,
        mut meta: SnapshotMeta,
        layer_mode: u32,
        limits: SnapshotLimits,
    ) -> Result<Received, CowError> {
        if meta.id != self.id || meta.format_version != SNAPSHOT_FORMAT_VERSION {
            return Err(CowError::Snapshot {
                path: self.aside.join(META),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a record of snapshot {} format {} for snapshot {} (this lockbox reads format {SNAPSHOT_FORMAT_VERSION})",
                        meta.id, meta.format_version, self.id
                    ),
                ),
            });
        }
        let err = |path: &Path| {
            let path = path.to_owned();
            move |source| CowError::Snapshot { path, source }
        };
        let layer = self.layer_dir();
        fs::set_permissions(
            &layer,
            std::os::unix::fs::PermissionsExt::from_mode(layer_mode & 0o7777),
        )
        .map_err(err(&layer))?;
        let (bytes, entries) = tally_tree(&self.aside)?;
        meta.bytes = bytes;
        meta.entries = entries;
        let json = serde_json::to_vec_pretty(&meta).map_err(|e| CowError::Snapshot {
            path: self.aside.join(META),
            source: io::Error::other(e),
        })?;
        fs::write(self.aside.join(META), json).map_err(err(&self.aside.join(META)))?;
        let sync =
            File::open(&self.aside).and_then(|f| rustix::fs::syncfs(&f).map_err(io::Error::from));
        sync.map_err(err(&self.aside))?;
        let _lock = self.store.lock()?;
        match self.store.get(&self.id) {
            Ok(had) => return Ok(Received::AlreadyHad(had)),
            Err(CowError::SnapshotNotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        if let Some(parent) = &meta.parent {
            self.store.get(parent)?;
        }
        let used = self.store.usage()?;
        for (limit, max, used, this) in [
            (SnapshotLimit::Bytes, limits.max_bytes, used.bytes, bytes),
            (
                SnapshotLimit::Entries,
                limits.max_entries,
                used.entries,
                entries,
            ),
        ] {
            if max.is_some_and(|m| used.saturating_add(this) > m) {
                return Err(CowError::SnapshotLimit {
                    limit,
                    path: self.aside.clone(),
                });
            }
        }
        let dst = self.store.dir.join(self.id.as_str());
        fs::rename(&self.aside, &dst).map_err(err(&dst))?;
        self.published = true;
        fsync_dir(&self.store.dir).map_err(err(&self.store.dir))?;
        Ok(Received::Published(meta))
    }
}

impl Drop for IncomingSnapshot {
    fn drop(&mut self) {
        if !self.published {
            if let Some(name) = self.aside.file_name() {
                let _ = remove_entry(&self.store.dir.join(UNFINISHED), name);
            }
        }
    }
}

/// What the entries under `root` cost a snapshot, and how many there are (`root` itself
/// not counted), as [`crate::entry_cost`] counts them. Nothing is followed.
fn tally_tree(root: &Path) -> Result<(u64, u64), CowError> {
    let mut bytes = 0u64;
    let mut entries = 0u64;
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        let err = |source| CowError::Snapshot {
            path: dir.clone(),
            source,
        };
        for entry in fs::read_dir(&dir).map_err(err)? {
            let path = entry.map_err(err)?.path();
            let st = rustix::fs::lstat(&path).map_err(|e| CowError::Snapshot {
                path: path.clone(),
                source: e.into(),
            })?;
            // The holds directory is the store's, not the snapshot's.
            if path.parent() == Some(root) && path.file_name() == Some(OsStr::new(USERS)) {
                continue;
            }
            bytes = bytes.saturating_add(crate::entry_cost(&st));
            entries += 1;
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory {
                dirs.push(path);
            }
        }
    }
    Ok((bytes, entries))
}

/// A counter that keeps two receives of one snapshot in this process apart.
fn next_incoming() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Removes `parent/name`, a whole tree, never following a symlink.
fn remove_entry(parent: &Path, name: &OsStr) -> io::Result<()> {
    let fd = beneath::open_root(parent)?;
    beneath::remove_tree_at(std::os::fd::AsFd::as_fd(&fd), name)
}

/// Most snapshots stacked on one another (overlayfs takes at most 500 lower layers; a
/// deeper chain would first be flattened).
pub const MAX_DEPTH: usize = 128;

fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i64::from(d.subsec_nanos()),
    }
}

/// Makes the directory `p`, readable by its owner only (a snapshot's parts before they are
/// published).
fn private_dir(p: &Path) -> Result<(), CowError> {
    DirBuilder::new()
        .mode(0o700)
        .create(p)
        .map_err(|source| CowError::Snapshot {
            path: p.to_owned(),
            source,
        })
}
