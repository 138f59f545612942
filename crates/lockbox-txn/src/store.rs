//! The durable transaction store: `STATE/txns/<id>/`, one directory per transaction.
//!
//! ```text
//! STATE/txns/<id>/record.json       TxnRecord, versioned and checksummed
//! STATE/txns/<id>/base/             empty; its ctime is the optimistic-concurrency base
//!                                   (`lockbox_cow::stamp_base`, the rule branches use)
//! STATE/txns/<id>/layers/<n>/upper  the upper layer of the pipeline unit that begins with stage n
//!                                   (or of gather source n), until prepared
//! STATE/txns/<id>/layers/<n>/work   its overlayfs work directory (removed after the stage)
//! STATE/txns/<id>/merged/           the union of all layers, flattened (what commit applies)
//! STATE/txns/<id>/out/<n>           a stage's stdout, spilled beyond the memory bound
//! STATE/txns/<id>/intent.json       the WAL intent: empty until the commit writes it in place; durable = the commit point
//! STATE/txns/<id>/inputs/<name>     a gather source's stdout, for the consumer
//! STATE/txns/.live/<id>              its workdir's path: the transaction may still need recovery
//! STATE/txns/.live/.complete         empty: `.live` is complete (written once)
//! STATE/txns/.new/<pid>-<id>/        a transaction being created, renamed to `<id>` once whole
//! ```
//!
//! A transaction's directory is built aside in `.new/` (base, empty intent, record) and
//! renamed into place, so a kill during creation leaves no `txns/<id>` without a record:
//! only a leftover in `.new/`, which recovery removes once its creator is gone
//! ([`sweep_unfinished`]).
//!
//! `.live` holds one marker per transaction from its creation until it is committed or
//! aborted and its data is gone, so the recovery sweep that every command touching a workdir
//! runs reads those few records, not every transaction the state directory ever ran.

use std::fs::{self, DirBuilder};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lockbox_cow::Timestamp;

use crate::record::{self, Durability, TxnKind, TxnRecord, TxnState, RECORD_FILE};
use crate::{TxnError, TxnId};

/// The directory holding every transaction of a state directory.
pub fn txns_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("txns")
}

/// The markers of transactions that may still need recovery (see the module doc).
const LIVE: &str = ".live";

fn live_dir(state_dir: &Path) -> PathBuf {
    txns_dir(state_dir).join(LIVE)
}

/// Transactions being created (see the module doc).
const UNFINISHED: &str = ".new";

/// Removes what creators that died left in `.new/` (a kill during [`TxnDir::begin`]); the
/// directories removed. Their `.live` markers are retired by recovery like any marker
/// without a record.
pub(crate) fn sweep_unfinished(state_dir: &Path) -> Result<Vec<PathBuf>, TxnError> {
    let dir = txns_dir(state_dir).join(UNFINISHED);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(TxnError::Store { path: dir, source }),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let path = entry.map_err(store_err(&dir))?.path();
        let pid = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !crate::commit::owner_alive(pid)) {
            remove_tree(&path)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// True if transaction `id` has a `.live` marker (it may still need recovery).
pub(crate) fn is_live(state_dir: &Path, id: &TxnId) -> bool {
    live_dir(state_dir).join(id.as_str()).exists()
}

/// True while a live process builds transaction `id` aside (see [`TxnDir::begin`]): its
/// marker exists before its directory does.
pub(crate) fn being_created(state_dir: &Path, id: &TxnId) -> bool {
    let Ok(entries) = fs::read_dir(txns_dir(state_dir).join(UNFINISHED)) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let Some((pid, of)) = name.to_str().and_then(|n| n.split_once('-')) else {
            return false;
        };
        of == id.as_str() && pid.parse::<u32>().is_ok_and(crate::commit::owner_alive)
    })
}

/// True if the transaction directory `dir` holds no record file at all: a creation by an
/// earlier version of lockbox (which made the directory before its record) or a removal
/// that was cut short. Nothing in it can be needed unless it has a valid intent.
pub(crate) fn half_made(dir: &Path, id: &TxnId) -> bool {
    !dir.join(RECORD_FILE).exists() && record::intent_in(dir, id).is_none()
}

/// Removes the `.live` marker of transaction `id`: recovery no longer looks at it. Not
/// fsynced: a marker that comes back costs recovery one record read.
pub(crate) fn retire(state_dir: &Path, id: &TxnId) -> Result<(), TxnError> {
    let marker = live_dir(state_dir).join(id.as_str());
    match fs::remove_file(&marker) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TxnError::Store {
            path: marker,
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The workdir a transaction's `.live` marker names (markers written before they named one
/// are empty: `None`).
pub(crate) fn marker_workdir(state_dir: &Path, id: &TxnId) -> Option<PathBuf> {
    let bytes = fs::read(live_dir(state_dir).join(id.as_str())).ok()?;
    let path = PathBuf::from(std::ffi::OsString::from_vec(bytes));
    path.is_absolute().then_some(path)
}

/// The ids of the transactions that may still need recovery. A store written before `.live`
/// existed gets its markers now, from one full scan.
pub(crate) fn live(state_dir: &Path) -> Result<Vec<TxnId>, TxnError> {
    if !txns_dir(state_dir).is_dir() {
        return Ok(Vec::new());
    }
    ensure_live(state_dir)?;
    let dir = live_dir(state_dir);
    let entries = fs::read_dir(&dir).map_err(store_err(&dir))?;
    let mut ids: Vec<TxnId> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| TxnId::parse(n).ok()))
        .collect();
    ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Ok(ids)
}

/// Written once `.live` holds a marker for every transaction that may need recovery.
const LIVE_COMPLETE: &str = ".complete";

/// Makes sure `.live` is complete. The directory is only ever created in place (never
/// renamed over: a rename replacing an empty `.live` would make a concurrent marker creation
/// fail), and filled idempotently, so any number of threads and processes may race here. A
/// marker added for a transaction that finishes meanwhile costs recovery one record read.
fn ensure_live(state_dir: &Path) -> Result<(), TxnError> {
    let dir = live_dir(state_dir);
    if dir.join(LIVE_COMPLETE).exists() {
        return Ok(());
    }
    match DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(TxnError::Store {
                path: dir,
                source: e,
            })
        }
        _ => {}
    }
    let txns = txns_dir(state_dir);
    for listed in list(state_dir)? {
        let ListedTxn::Ok(r) = listed else { continue };
        let txn = txns.join(r.id.as_str());
        let finished = matches!(r.state, TxnState::Committed | TxnState::Aborted)
            && ["layers", "merged", crate::record::INTENT_FILE]
                .iter()
                .all(|n| !txn.join(n).exists());
        if !finished {
            let marker = dir.join(r.id.as_str());
            fs::File::create(&marker).map_err(store_err(&marker))?;
        }
    }
    lockbox_cow::fsync_dir(&dir).map_err(store_err(&dir))?;
    lockbox_cow::fsync_dir(&txns).map_err(store_err(&txns))?;
    let complete = dir.join(LIVE_COMPLETE);
    fs::File::create(&complete).map_err(store_err(&complete))?;
    lockbox_cow::fsync_dir(&dir).map_err(store_err(&dir))
}

fn store_err(path: &Path) -> impl Fn(std::io::Error) -> TxnError + '_ {
    move |source| TxnError::Store {
        path: path.to_owned(),
        source,
    }
}

/// An open transaction directory and its record.
#[derive(Debug)]
pub(crate) struct TxnDir {
    pub(crate) state_dir: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) record: TxnRecord,
    /// Makes the new directory and `.live` marker durable while the stages run (see
    /// [`TxnDir::make_durable`]); `None` once joined, or for an opened transaction.
    entries_synced: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// The directory and `.live` marker are known to be durable.
    entries_durable: bool,
    /// Removes a tree this transaction no longer needs while it goes on (see
    /// [`TxnDir::remove_meanwhile`]); joined before the transaction's data is discarded.
    removing: Option<std::thread::JoinHandle<Result<(), TxnError>>>,
    /// Later stale-base references than the record's `base_ctime` for some paths, sorted by
    /// path (a gather of running sandboxes' branches: each path is checked against the
    /// reference of the branch it comes from). Not in the record: opened again, the
    /// transaction checks every path against `base_ctime`, which refuses more, never less.
    pub(crate) rebased: Vec<lockbox_cow::Rebased>,
}

impl TxnDir {
    /// Creates the directory of a new transaction over `workdir`, in state `Running`, under
    /// a fresh id or the id of `key` (replacing an earlier attempt that did not commit).
    pub(crate) fn begin(
        state_dir: &Path,
        workdir: &Path,
        kind: TxnKind,
        key: Option<&str>,
    ) -> Result<TxnDir, TxnError> {
        let workdir = fs::canonicalize(workdir).map_err(store_err(workdir))?;
        let txns = txns_dir(state_dir);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&txns)
            .map_err(store_err(&txns))?;
        // Canonical from here on: layer paths go into sandbox policies, which want them
        // absolute.
        let state_dir = fs::canonicalize(state_dir).map_err(store_err(state_dir))?;
        let txns = txns_dir(&state_dir);
        let real = txns.clone();
        if real.starts_with(&workdir) || workdir.starts_with(&real) {
            return Err(TxnError::Usage {
                reason: format!(
                    "state directory {} and workdir {} overlap",
                    state_dir.display(),
                    workdir.display()
                ),
            });
        }
        let id = match key {
            Some(key) => {
                let id = TxnId::for_key(key);
                replace_earlier_attempt(&state_dir, &id)?;
                id
            }
            None => TxnId::generate(),
        };
        ensure_live(&state_dir)?;
        let marker = live_dir(&state_dir).join(id.as_str());
        let dir = txns.join(id.as_str());
        let unfinished = txns.join(UNFINISHED);
        let aside = unfinished.join(format!("{}-{}", std::process::id(), id.as_str()));
        let record = TxnRecord {
            id,
            kind,
            workdir,
            state: TxnState::Running,
            base_ctime: Timestamp { secs: 0, nanos: 0 },
            owner_pid: std::process::id(),
            stages: Vec::new(),
            report: None,
            key: key.map(str::to_owned),
            abort_reason: None,
            value: None,
            held: false,
        };
        // Built aside, then marked live, then renamed into place. The marker names the
        // workdir: after a crash, recovery finds a commit's staging directory through it
        // even if the (lazily written) record was lost. Written while the aside directory
        // exists, so that recovery can tell a creation in progress from one a kill cut
        // short ([`being_created`]).
        let made = build_aside(&aside, record).and_then(|record| {
            fs::write(&marker, record.workdir.as_os_str().as_encoded_bytes())
                .map_err(store_err(&marker))?;
            rename_noreplace(&aside, &dir).map_err(store_err(&dir))?;
            Ok(record)
        });
        let record = match made {
            Ok(record) => record,
            Err(e) => {
                // Best effort: the error that matters is `e`. A marker written is retired by
                // recovery (it may also be a keyed rival's, which won the rename).
                let _ = remove_tree(&aside);
                return Err(e);
            }
        };
        // The syncs wait on the disk, not the CPU: they overlap the stages.
        let (live, synced, marked, own) = (live_dir(&state_dir), txns.clone(), marker, dir.clone());
        let entries_synced = std::thread::Builder::new()
            .name("lockbox-txn-sync".into())
            .spawn(move || {
                fs::File::open(&marked)?.sync_all()?;
                lockbox_cow::fsync_dir(&live)?;
                lockbox_cow::fsync_dir(&synced)?;
                lockbox_cow::fsync_dir(&own)
            })
            .ok();
        let txn = TxnDir {
            state_dir,
            dir,
            record,
            entries_synced,
            entries_durable: false,
            removing: None,
            rebased: Vec::new(),
        };
        Ok(txn)
    }

    /// Opens an existing transaction.
    pub(crate) fn open(state_dir: &Path, id: &TxnId) -> Result<TxnDir, TxnError> {
        let state_dir = &fs::canonicalize(state_dir).map_err(|_| TxnError::NotFound {
            id: id.clone(),
            state_dir: state_dir.to_owned(),
        })?;
        let dir = txns_dir(state_dir).join(id.as_str());
        let record: Option<TxnRecord> = record::read(&dir.join(RECORD_FILE), "txn")?;
        let record = record.ok_or_else(|| TxnError::NotFound {
            id: id.clone(),
            state_dir: state_dir.to_owned(),
        })?;
        Ok(TxnDir {
            entries_synced: None,
            // Whoever left it to be opened made it durable (kept, or committing).
            entries_durable: true,
            removing: None,
            rebased: Vec::new(),
            state_dir: state_dir.to_owned(),
            dir,
            record,
        })
    }

    /// The transaction of `record`, whose record file was lost (recovery restores it from
    /// the intent).
    pub(crate) fn restore(state_dir: &Path, record: TxnRecord) -> Result<TxnDir, TxnError> {
        let state_dir = fs::canonicalize(state_dir).map_err(store_err(state_dir))?;
        Ok(TxnDir {
            dir: txns_dir(&state_dir).join(record.id.as_str()),
            state_dir,
            record,
            entries_synced: None,
            entries_durable: true,
            removing: None,
            rebased: Vec::new(),
        })
    }

    pub(crate) fn id(&self) -> &TxnId {
        &self.record.id
    }

    pub(crate) fn workdir(&self) -> &Path {
        &self.record.workdir
    }

    /// Writes the record durably.
    pub(crate) fn save(&self) -> Result<(), TxnError> {
        record::write(
            &self.dir,
            RECORD_FILE,
            "txn",
            &self.record,
            Durability::Durable,
        )
    }

    /// Writes the record without waiting for the disk: for the states recovery treats the
    /// same whether or not they survive a crash (running, and prepared in a process that
    /// commits or aborts it itself — both are aborted once their owner is gone).
    pub(crate) fn save_lazily(&self) -> Result<(), TxnError> {
        record::write(
            &self.dir,
            RECORD_FILE,
            "txn",
            &self.record,
            Durability::Lazy,
        )
    }

    /// Makes the transaction's existence durable (its directory and `.live` marker), then
    /// its record: required before it outlives this process.
    pub(crate) fn make_durable(&mut self) -> Result<(), TxnError> {
        self.make_entries_durable()?;
        self.save()
    }

    /// Makes the transaction's directory, its entries (the empty intent among them) and its
    /// `.live` marker (with its workdir) durable: required before a commit stages anything
    /// in the workdir.
    pub(crate) fn make_entries_durable(&mut self) -> Result<(), TxnError> {
        if self.entries_durable {
            return Ok(());
        }
        let synced = self.entries_synced.take().map(|h| h.join());
        if !matches!(synced, Some(Ok(Ok(())))) {
            let marker = live_dir(&self.state_dir).join(self.id().as_str());
            // A marker from before markers named their workdir is empty: it gets the name.
            fs::write(&marker, self.record.workdir.as_os_str().as_encoded_bytes())
                .and_then(|()| fs::File::open(&marker)?.sync_all())
                .map_err(store_err(&marker))?;
            let txns = txns_dir(&self.state_dir);
            let live = live_dir(&self.state_dir);
            lockbox_cow::fsync_dir(&live).map_err(store_err(&live))?;
            lockbox_cow::fsync_dir(&txns).map_err(store_err(&txns))?;
            lockbox_cow::fsync_dir(&self.dir).map_err(store_err(&self.dir))?;
        }
        self.entries_durable = true;
        Ok(())
    }

    pub(crate) fn set_state(&mut self, state: TxnState) -> Result<(), TxnError> {
        self.record.state = state;
        self.save()
    }

    /// Removes the `.live` marker of a transaction that is committed or aborted and whose
    /// data is gone (see [`retire`]).
    pub(crate) fn retire(&self) -> Result<(), TxnError> {
        retire(&self.state_dir, self.id())
    }

    /// Creates `layers/<n>/{upper,work}` (upper with the workdir's mode: the overlay's root
    /// takes its attributes from the upper root).
    pub(crate) fn new_layer(&self, n: usize) -> Result<(PathBuf, PathBuf), TxnError> {
        let layer = self.layer_dir(n);
        let (upper, work) = (layer.join("upper"), layer.join("work"));
        let mode = fs::metadata(self.workdir())
            .map_err(store_err(self.workdir()))?
            .mode();
        remove_tree(&layer)?;
        for p in [&upper, &work] {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(p)
                .map_err(store_err(p))?;
        }
        fs::set_permissions(&upper, fs::Permissions::from_mode(mode & 0o7777))
            .map_err(store_err(&upper))?;
        Ok((upper, work))
    }

    /// The upper directory of layer `n` ([`TxnDir::new_layer`]).
    pub(crate) fn layer_upper(&self, n: usize) -> PathBuf {
        self.layer_dir(n).join("upper")
    }

    fn layer_dir(&self, n: usize) -> PathBuf {
        self.dir.join("layers").join(n.to_string())
    }

    pub(crate) fn merged_dir(&self) -> PathBuf {
        self.dir.join("merged")
    }

    pub(crate) fn out_dir(&self) -> PathBuf {
        self.dir.join("out")
    }

    /// Removes `tree` on a thread of its own: a commit spends most of its time waiting for
    /// the disk, and the removal (after prepare, of the layers flattened into `merged/`)
    /// needs the CPU. [`TxnDir::settle`] waits for it.
    pub(crate) fn remove_meanwhile(&mut self, tree: PathBuf) {
        let spawned = std::thread::Builder::new()
            .name("lockbox-txn-rm".into())
            .spawn({
                let tree = tree.clone();
                move || remove_tree(&tree)
            });
        // Without a thread, `discard_data` removes it.
        if let Ok(handle) = spawned {
            self.removing = Some(handle);
        }
    }

    /// Waits for a removal started by [`TxnDir::remove_meanwhile`].
    pub(crate) fn settle(&mut self) -> Result<(), TxnError> {
        match self.removing.take().map(|h| h.join()) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(TxnError::Usage {
                reason: "the thread removing the transaction's layers panicked".into(),
            }),
            None => Ok(()),
        }
    }

    /// Removes the layers, the merged view and spilled output (after commit or abort).
    pub(crate) fn discard_data(&mut self) -> Result<(), TxnError> {
        // A failed background removal is retried below.
        let _ = self.settle();
        for name in ["layers", "merged", "out", "inputs"] {
            remove_tree(&self.dir.join(name))?;
        }
        Ok(())
    }
}

/// Fills the directory `aside` of a new transaction: `base/` (stamped: the record's
/// `base_ctime`), the empty intent and the record, written lazily: until the transaction
/// touches the workdir (`committing`, see [`TxnDir::make_durable`]) or is kept, losing it in
/// a crash loses nothing.
fn build_aside(aside: &Path, mut record: TxnRecord) -> Result<TxnRecord, TxnError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(aside)
        .map_err(store_err(aside))?;
    let base = aside.join("base");
    fs::create_dir(&base).map_err(store_err(&base))?;
    // Empty until the commit writes it in place (see `record::Durability::InPlace`).
    let intent = aside.join(crate::record::INTENT_FILE);
    fs::File::create(&intent).map_err(store_err(&intent))?;
    record.base_ctime = lockbox_cow::stamp_base(&base).map_err(store_err(&base))?;
    record::write(aside, RECORD_FILE, "txn", &record, Durability::Lazy)?;
    Ok(record)
}

/// `rename(from, to)` that fails with `EEXIST` rather than replace an empty directory `to`
/// (filesystems without `RENAME_NOREPLACE` get a plain rename: `from` is never empty, so it
/// cannot replace a directory that holds anything).
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let cwd = rustix::fs::CWD;
    match rustix::fs::renameat_with(cwd, from, cwd, to, rustix::fs::RenameFlags::NOREPLACE) {
        Err(rustix::io::Errno::INVAL) => fs::rename(from, to),
        r => Ok(r?),
    }
}

/// Makes way for a keyed transaction `id`: an earlier attempt that never reached its commit
/// (aborted, or running/prepared by a process that is gone, or a damaged record) is removed.
fn replace_earlier_attempt(state_dir: &Path, id: &TxnId) -> Result<(), TxnError> {
    let dir = txns_dir(state_dir).join(id.as_str());
    if !dir.exists() {
        return Ok(());
    }
    let refuse = |state: TxnState, operation| {
        Err(TxnError::WrongState {
            id: id.clone(),
            state: state.name(),
            operation,
        })
    };
    // Past its commit point (whatever its record file says): recovery finishes it.
    if record::intent_in(&dir, id).is_some() {
        return refuse(
            TxnState::Committing,
            "run it again before recovery finishes it",
        );
    }
    if let Ok(Some(r)) = record::read::<TxnRecord>(&dir.join(RECORD_FILE), "txn") {
        let live = crate::commit::owner_alive(r.owner_pid);
        match r.state {
            TxnState::Committed => return refuse(r.state, "run it again under the same key"),
            TxnState::Committing => {
                return refuse(r.state, "run it again before recovery finishes it")
            }
            TxnState::Running | TxnState::Prepared if live => {
                return refuse(r.state, "run it again while its owner process lives")
            }
            TxnState::Running | TxnState::Prepared | TxnState::Aborted => {}
        }
    }
    remove_tree(&dir)?;
    lockbox_cow::fsync_dir(&txns_dir(state_dir)).map_err(store_err(state_dir))?;
    match fs::remove_file(live_dir(state_dir).join(id.as_str())) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TxnError::Store {
            path: live_dir(state_dir),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Removes a tree, including directories of mode 000 (overlayfs's `work/work`), which their
/// owner may chmod without privilege. A missing tree is not an error.
pub(crate) fn remove_tree(path: &Path) -> Result<(), TxnError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(TxnError::Store {
                path: path.to_owned(),
                source,
            })
        }
        Ok(_) => {}
    }
    if fs::remove_dir_all(path).is_ok() {
        return Ok(());
    }
    make_accessible(path);
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TxnError::Store {
            path: path.to_owned(),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn make_accessible(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            make_accessible(&entry.path());
        }
    }
}

/// One entry of [`list`]: a readable record, or the reason it is not.
#[derive(Debug)]
pub enum ListedTxn {
    /// A valid record.
    Ok(TxnRecord),
    /// A directory whose record is missing (creation interrupted) or damaged.
    Damaged {
        /// The directory.
        dir: PathBuf,
        /// Why it cannot be read.
        error: TxnError,
    },
}

/// Every transaction in the store, sorted by id (works across processes). A transaction
/// past its commit point but not finished (its commit was interrupted; recovery finishes it)
/// is listed in state `committing`, with the record its intent carries.
pub fn list(state_dir: &Path) -> Result<Vec<ListedTxn>, TxnError> {
    let txns = txns_dir(state_dir);
    let entries = match fs::read_dir(&txns) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(TxnError::Store { path: txns, source }),
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs
        .into_iter()
        .map(|dir| {
            let read = record::read::<TxnRecord>(&dir.join(RECORD_FILE), "txn");
            let finished =
                matches!(&read, Ok(Some(r)) if matches!(r.state, TxnState::Committed | TxnState::Aborted));
            let pending = dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| TxnId::parse(n).ok())
                .filter(|_| !finished)
                .and_then(|id| record::intent_in(&dir, &id));
            match (pending, read) {
                (Some(intent), Ok(Some(r))) => ListedTxn::Ok(intent.record.unwrap_or(TxnRecord {
                    state: TxnState::Committing,
                    ..r
                })),
                (
                    Some(crate::record::Intent {
                        record: Some(r), ..
                    }),
                    _,
                ) => ListedTxn::Ok(r),
                (_, Ok(Some(r))) => ListedTxn::Ok(r),
                (_, Ok(None)) => ListedTxn::Damaged {
                    error: TxnError::CorruptRecord {
                        path: dir.join(RECORD_FILE),
                        reason: "missing (a creation or removal was cut short)".into(),
                    },
                    dir,
                },
                (_, Err(error)) => ListedTxn::Damaged { dir, error },
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Set by [`sigkill_during_begin_leaves_nothing_half_made`] for the child it runs.
    const BEGIN_LOOP_ENV: &str = "LOCKBOX_TXN_TEST_BEGIN_LOOP";

    #[test]
    fn helper_begin_until_killed() {
        let Ok(spec) = std::env::var(BEGIN_LOOP_ENV) else {
            return;
        };
        let (state, work) = spec.split_once('\n').unwrap();
        loop {
            TxnDir::begin(Path::new(state), Path::new(work), TxnKind::Pipeline, None).unwrap();
        }
    }

    /// Issue 15: a SIGKILL early in a transaction left `txns/<id>` without a record, listed
    /// as damaged forever. A process that does nothing but begin transactions is killed at
    /// many moments: no transaction is ever listed half-made, and recovery leaves nothing
    /// behind but finished records.
    #[test]
    fn sigkill_during_begin_leaves_nothing_half_made() {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let tmp = tempfile::tempdir_in(base).unwrap();
        let (state, work) = (tmp.path().join("state"), tmp.path().join("work"));
        fs::create_dir_all(&work).unwrap();
        for delay_ms in [3u64, 5, 7, 11, 13, 17, 19, 23, 29, 31] {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "store::tests::helper_begin_until_killed"])
                .env(
                    BEGIN_LOOP_ENV,
                    format!("{}\n{}", state.display(), work.display()),
                )
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let damaged = |listed: Vec<ListedTxn>| -> Vec<PathBuf> {
            listed
                .into_iter()
                .filter_map(|t| match t {
                    ListedTxn::Damaged { dir, .. } => Some(dir),
                    ListedTxn::Ok(_) => None,
                })
                .collect()
        };
        let listed = list(&state).unwrap();
        let begun = listed.len();
        let half_made = damaged(listed);
        assert!(
            half_made.is_empty(),
            "{} of {begun} half-made: {half_made:?}",
            half_made.len()
        );
        let report = crate::recover(&state, None).unwrap();
        assert!(report.damaged.is_empty(), "{report:?}");
        assert!(damaged(list(&state).unwrap()).is_empty());
        assert_eq!(
            fs::read_dir(txns_dir(&state).join(UNFINISHED))
                .unwrap()
                .count(),
            0
        );
        let live: Vec<_> = fs::read_dir(live_dir(&state))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(live, [LIVE_COMPLETE], "every marker retired");
        eprintln!(
            "{begun} transactions begun, {} recovered",
            report.abandoned.len()
        );
    }
}
