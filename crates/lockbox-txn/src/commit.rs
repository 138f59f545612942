//! The commit protocol and recovery.
//!
//! Commit (under the workdir lock):
//! 1. make the transaction's directory and `.live` marker durable (the marker names the
//!    workdir; the syncs ran on a thread during the stages);
//! 2. **stage**: validate the flattened union against the workdir (optimistic base check),
//!    copy every new file and symlink into `WORKDIR/.lockbox-commit-<id>/`, make them
//!    durable ([`lockbox_cow::stage_upper`]);
//! 3. **intent**: write the checksummed [`Intent`] — the plan, and the record as of the
//!    commit point — to `intent.json`, durable: *the commit point*;
//! 4. **apply** by renames, then directory metadata, make it durable, remove staging
//!    ([`lockbox_cow::apply_staged`], redo-safe, and a no-op once staging is gone);
//! 5. record state `committed` (durable), remove the intent and the layers.
//!
//! Until the commit point the record file is written lazily (a crash may lose or tear it):
//! nothing in it is needed to roll back. A crash before 3 leaves at most a staging directory:
//! recovery removes it (found through the record, or the marker if the record is gone) and
//! aborts the transaction. A crash after 3 leaves a valid intent: recovery redoes 4 and 5,
//! restoring the record from the intent (roll forward). A torn intent fails its checksum
//! and counts as absent: the intent is written in full before the commit point, so a torn
//! one can only exist before it.

use std::path::{Path, PathBuf};

use lockbox_cow::{CommitOptions, CommitReport};

use crate::lock;
use crate::record::{self, Durability, Intent, TxnState, INTENT_FILE};
use crate::store::{self, ListedTxn, TxnDir};
use crate::{TxnError, TxnId};

/// Commits a prepared transaction (its `merged/` holds the union of its layers).
/// `force` skips the optimistic base check.
pub(crate) fn commit(
    txn: &mut TxnDir,
    holding_lock: bool,
    force: bool,
) -> Result<CommitReport, TxnError> {
    let _lock = if holding_lock {
        None
    } else {
        Some(lock::acquire(&txn.state_dir, txn.workdir(), None)?)
    };
    recover_locked(&txn.state_dir, txn.workdir(), Some(txn.id()))?;
    // A kept transaction whose commit (from another process) a crash interrupted: past its
    // commit point, finish that commit; before it, drop what it staged and start over.
    if let Some(intent) = read_intent(&txn.state_dir, txn.id()) {
        roll_forward(txn, Some(&intent))?;
        return Ok(txn.record.report.clone().unwrap_or_default());
    }
    discard_staging(txn.workdir(), txn.id())?;
    txn.make_entries_durable()?;
    let key = txn.id().as_str().to_owned();
    let staged = lockbox_cow::stage_upper_rebased(
        &txn.merged_dir(),
        txn.workdir(),
        &key,
        (!force).then_some((txn.record.base_ctime, txn.rebased.as_slice())),
        &CommitOptions::default(),
    );
    let (plan, report) = match staged {
        Ok(s) => s,
        Err(e) => {
            roll_back(txn)?;
            return Err(e.into());
        }
    };
    txn.record.state = TxnState::Committing;
    let intent = Intent {
        id: txn.id().clone(),
        workdir: txn.workdir().to_owned(),
        plan,
        record: Some(txn.record.clone()),
    };
    if let Err(e) = record::write(
        &txn.dir,
        INTENT_FILE,
        "intent",
        &intent,
        Durability::InPlace,
    ) {
        roll_back(txn)?;
        return Err(e);
    }
    // The commit point has passed: from here on, failures are finished by recovery.
    lockbox_cow::apply_staged(txn.workdir(), &key, &intent.plan).map_err(|source| {
        TxnError::Apply {
            id: txn.id().clone(),
            source,
        }
    })?;
    mark_committed(txn, Some(report.clone()))?;
    Ok(report)
}

fn mark_committed(txn: &mut TxnDir, report: Option<CommitReport>) -> Result<(), TxnError> {
    if report.is_some() {
        txn.record.report = report;
    }
    txn.set_state(TxnState::Committed)?;
    // Not synced: an intent that comes back next to a `committed` record is only removed
    // again by recovery.
    remove_intent(txn, false)?;
    txn.discard_data()?;
    txn.retire()
}

fn remove_intent(txn: &TxnDir, durably: bool) -> Result<(), TxnError> {
    let path = txn.dir.join(INTENT_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(TxnError::WriteRecord { path, source: e })
        }
        _ => {}
    }
    if !durably {
        return Ok(());
    }
    lockbox_cow::fsync_dir(&txn.dir).map_err(|source| TxnError::WriteRecord {
        path: txn.dir.clone(),
        source,
    })
}

/// Rolls back a commit that did not reach (or undoes a failed write of) its commit point:
/// the intent goes first (durably), then the staging directory ([`abort`]), so a crash in
/// between can never leave an intent without its staged data.
fn roll_back(txn: &mut TxnDir) -> Result<(), TxnError> {
    remove_intent(txn, true)?;
    abort(txn)
}

/// Marks a transaction that did not reach its commit point aborted and frees its data,
/// the staging directory a commit may have left in the workdir included.
pub(crate) fn abort(txn: &mut TxnDir) -> Result<(), TxnError> {
    txn.record.state = TxnState::Aborted;
    txn.save()?;
    // A torn intent (a crash while writing it) is no intent; it goes with the rest.
    remove_intent(txn, false)?;
    discard_staging(txn.workdir(), txn.id())?;
    txn.discard_data()?;
    txn.retire()
}

/// What [`recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    /// Interrupted after the commit point: applied.
    pub rolled_forward: Vec<TxnId>,
    /// Interrupted before the commit point: staging removed, aborted.
    pub rolled_back: Vec<TxnId>,
    /// Running when their owner died: aborted (they never touched the workdir).
    pub abandoned: Vec<TxnId>,
    /// Kept transactions whose commit was interrupted before its commit point: what it
    /// staged is removed, they are still prepared (commit them again, or abort them).
    pub left_prepared: Vec<TxnId>,
    /// What a crash left half-made (a creation or removal cut short: a directory without a
    /// record or intent): removed.
    #[serde(with = "lockbox_policy::name::json::vec")]
    pub removed: Vec<PathBuf>,
    /// Directories whose record is unreadable (torn by a power loss, damaged, or of another
    /// version): left alone; `lockbox txn abort ID` ([`crate::remove_damaged`]) removes
    /// one.
    #[serde(with = "lockbox_policy::name::json::vec")]
    pub damaged: Vec<PathBuf>,
}

/// Finishes or rolls back every interrupted transaction in `state_dir` (only those over
/// `workdir`, if given): after the commit point → roll forward; before → roll back (remove
/// staging). Transactions that are prepared, or running in a live process, are left alone.
/// What branch commits killed while staging left is removed too
/// ([`lockbox_cow::sweep_branch_staging`]).
pub fn recover(state_dir: &Path, workdir: Option<&Path>) -> Result<RecoveryReport, TxnError> {
    let filter = match workdir {
        Some(w) => Some(std::fs::canonicalize(w).map_err(|source| TxnError::Store {
            path: w.to_owned(),
            source,
        })?),
        None => None,
    };
    let mut report = RecoveryReport {
        removed: store::sweep_unfinished(state_dir)?,
        ..RecoveryReport::default()
    };
    // The workdirs of the transactions that may need recovery: their record's, or, where
    // the record was lost, their intent's or marker's.
    let mut workdirs: Vec<PathBuf> = Vec::new();
    for id in store::live(state_dir)? {
        let w = match TxnDir::open(state_dir, &id) {
            Ok(txn) => Some(txn.record.workdir),
            Err(_) => read_intent(state_dir, &id)
                .map(|i| i.workdir)
                .or_else(|| store::marker_workdir(state_dir, &id)),
        };
        match w {
            Some(w) if filter.as_ref().is_none_or(|f| *f == w) && !workdirs.contains(&w) => {
                workdirs.push(w);
            }
            Some(_) => {}
            // An empty marker and no directory: a kill between creating the marker and
            // writing it. Checked in this order: a creator renames its directory into place
            // after writing the marker.
            None if !store::being_created(state_dir, &id)
                && !store::txns_dir(state_dir).join(id.as_str()).exists() =>
            {
                store::retire(state_dir, &id)?;
            }
            None => {}
        }
    }
    // And those where a branch commit killed while staging left its staging.
    for branch in lockbox_cow::list(state_dir)? {
        let Ok(meta) = branch.meta else { continue };
        let w = meta.workdir;
        if filter.as_ref().is_none_or(|f| *f == w)
            && !workdirs.contains(&w)
            && lockbox_cow::staging_keys(&w)
                .iter()
                .any(|key| key.starts_with(branch.id.as_str()))
        {
            workdirs.push(w);
        }
    }
    for w in workdirs {
        let _lock = lock::acquire(state_dir, &w, None)?;
        let one = recover_locked(state_dir, &w, None)?;
        report.rolled_forward.extend(one.rolled_forward);
        report.rolled_back.extend(one.rolled_back);
        report.abandoned.extend(one.abandoned);
        report.left_prepared.extend(one.left_prepared);
        report.removed.extend(one.removed);
    }
    for listed in store::list(state_dir)? {
        let ListedTxn::Damaged { dir, .. } = listed else {
            continue;
        };
        // Without a record, intent or marker, nothing refers to it (its staging, if it
        // ever had one, went with its marker).
        let id = dir.file_name().and_then(|n| n.to_str()).map(TxnId::parse);
        match id {
            Some(Ok(id)) if store::half_made(&dir, &id) && !store::is_live(state_dir, &id) => {
                store::remove_tree(&dir)?;
                report.removed.push(dir);
            }
            _ => report.damaged.push(dir),
        }
    }
    Ok(report)
}

/// Removes transaction `id` whose record cannot be read (`lockbox txn abort ID` of a
/// transaction [`crate::list`] shows as damaged): the staging directory it may have left in
/// its workdir (found through its `.live` marker; under the workdir's lock), then its
/// directory. Refused for a readable record (abort it as usual) and past the commit point (a
/// valid intent: [`recover`] finishes that commit).
pub fn remove_damaged(state_dir: &Path, id: &TxnId) -> Result<(), TxnError> {
    let dir = store::txns_dir(state_dir).join(id.as_str());
    let not_found = || TxnError::NotFound {
        id: id.clone(),
        state_dir: state_dir.to_owned(),
    };
    if !dir.is_dir() {
        return Err(not_found());
    }
    let refuse = |state, operation| TxnError::WrongState {
        id: id.clone(),
        state,
        operation,
    };
    if let Ok(Some(r)) = record::read::<crate::TxnRecord>(&dir.join(record::RECORD_FILE), "txn") {
        return Err(refuse(
            r.state.name(),
            "remove it as damaged (its record is readable)",
        ));
    }
    if read_intent(state_dir, id).is_some() {
        return Err(refuse(
            "committing",
            "remove it: it passed its commit point (`lockbox txn recover` finishes it)",
        ));
    }
    if let Some(workdir) = store::marker_workdir(state_dir, id).filter(|w| w.is_dir()) {
        let _lock = lock::acquire(state_dir, &workdir, None)?;
        discard_staging(&workdir, id)?;
    }
    store::remove_tree(&dir)?;
    lockbox_cow::fsync_dir(&store::txns_dir(state_dir)).map_err(|source| TxnError::Store {
        path: store::txns_dir(state_dir),
        source,
    })?;
    store::retire(state_dir, id)
}

/// Removes the staging directory transaction `id` may have left in `workdir` (a workdir
/// that is gone holds none); whether there was one.
fn discard_staging(workdir: &Path, id: &TxnId) -> Result<bool, TxnError> {
    if !lockbox_cow::staging_exists(workdir, id.as_str()) {
        return Ok(false);
    }
    lockbox_cow::discard_staging(workdir, id.as_str())?;
    Ok(true)
}

/// The valid intent of transaction `id`, if it has one.
fn read_intent(state_dir: &Path, id: &TxnId) -> Option<Intent> {
    record::intent_in(&store::txns_dir(state_dir).join(id.as_str()), id)
}

/// The sweep a command that touches `workdir` runs first: finishes or rolls back the
/// workdir's interrupted transactions (as [`recover`]). If its lock is held, a live
/// transaction or branch commit is at work there — it recovers the workdir itself before its
/// commit — and the sweep is skipped: `Ok(None)`.
pub fn recover_workdir(
    state_dir: &Path,
    workdir: &Path,
) -> Result<Option<RecoveryReport>, TxnError> {
    if !store::txns_dir(state_dir).is_dir() && lockbox_cow::staging_keys(workdir).is_empty() {
        return Ok(Some(RecoveryReport::default()));
    }
    let workdir = std::fs::canonicalize(workdir).map_err(|source| TxnError::Store {
        path: workdir.to_owned(),
        source,
    })?;
    let lock =
        lockbox_cow::WorkdirLock::acquire_within(state_dir, &workdir, std::time::Duration::ZERO)?;
    match lock {
        Some(_held) => recover_locked(state_dir, &workdir, None).map(Some),
        None => Ok(None),
    }
}

pub(crate) fn owner_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// Recovery of one workdir's transactions; the caller holds its lock, so no live commit
/// runs on it (a staging directory of a transaction without a valid intent is a leftover).
/// `skip` is the caller's own transaction.
fn recover_locked(
    state_dir: &Path,
    workdir: &Path,
    skip: Option<&TxnId>,
) -> Result<RecoveryReport, TxnError> {
    let mut report = RecoveryReport {
        removed: store::sweep_unfinished(state_dir)?,
        ..RecoveryReport::default()
    };
    // Branch commits killed while staging (issue 32: left in the workdir for good).
    report
        .removed
        .extend(lockbox_cow::sweep_branch_staging(state_dir, workdir)?);
    for id in store::live(state_dir)? {
        if Some(&id) == skip {
            continue;
        }
        let intent = read_intent(state_dir, &id).filter(|i| i.workdir == workdir);
        let mut txn = match TxnDir::open(state_dir, &id) {
            Ok(txn) if txn.record.workdir == workdir => txn,
            Ok(_) => continue,
            Err(_) => {
                // The record was lost (a crash tore its lazy write, or creation was cut
                // short). Past the commit point the intent holds it; before, only staging
                // may be left, and the marker says where.
                if let Some(record) = intent.as_ref().and_then(|i| i.record.clone()) {
                    let mut txn = TxnDir::restore(state_dir, record)?;
                    roll_forward(&mut txn, intent.as_ref())?;
                    report.rolled_forward.push(id);
                } else if match store::marker_workdir(state_dir, &id) {
                    Some(marked) => marked == workdir,
                    // Empty: a kill between creating the marker and writing it (or a marker
                    // of an earlier version). Without its directory it guards nothing.
                    None => !store::txns_dir(state_dir).join(id.as_str()).exists(),
                } {
                    // A creation in progress has its marker before its directory (checked
                    // again after: it may have been renamed into place meanwhile).
                    if store::being_created(state_dir, &id) || TxnDir::open(state_dir, &id).is_ok()
                    {
                        continue;
                    }
                    discard_staging(workdir, &id)?;
                    let dir = store::txns_dir(state_dir).join(id.as_str());
                    if dir.exists() && store::half_made(&dir, &id) {
                        store::remove_tree(&dir)?;
                        report.removed.push(dir);
                    }
                    store::retire(state_dir, &id)?;
                }
                continue;
            }
        };
        let owner_pid = txn.record.owner_pid;
        match txn.record.state {
            TxnState::Running | TxnState::Prepared | TxnState::Committing if intent.is_some() => {
                roll_forward(&mut txn, intent.as_ref())?;
                report.rolled_forward.push(id);
            }
            // Committing without an intent: written by an earlier version of lockbox, which
            // recorded `committing` before staging.
            TxnState::Committing => {
                roll_back(&mut txn)?;
                report.rolled_back.push(id);
            }
            // A prepared transaction that was not kept belonged to its process: gone with
            // it, like a dropped one.
            TxnState::Running if !owner_alive(owner_pid) => {
                abort(&mut txn)?;
                report.abandoned.push(id);
            }
            TxnState::Prepared if txn.record.held && !owner_alive(owner_pid) => {
                abort(&mut txn)?;
                report.abandoned.push(id);
            }
            TxnState::Committed | TxnState::Aborted => {
                // Leftovers of a cleanup that a crash interrupted.
                remove_intent(&txn, false)?;
                discard_staging(workdir, &id)?;
                txn.discard_data()?;
                txn.retire()?;
            }
            // Alive, or kept: a commit that did not reach its commit point may have left
            // staging (nobody commits now: we hold the lock).
            TxnState::Running | TxnState::Prepared => {
                if discard_staging(workdir, &id)? {
                    report.left_prepared.push(id);
                }
            }
        }
    }
    Ok(report)
}

/// Finishes a transaction interrupted after its commit point: redoes the apply (a no-op if
/// it was done), records it committed with the record the intent carries.
fn roll_forward(txn: &mut TxnDir, intent: Option<&Intent>) -> Result<(), TxnError> {
    let Some(intent) = intent else {
        return Ok(());
    };
    lockbox_cow::apply_staged(&intent.workdir, txn.id().as_str(), &intent.plan).map_err(
        |source| TxnError::Apply {
            id: txn.id().clone(),
            source,
        },
    )?;
    if let Some(record) = &intent.record {
        txn.record = record.clone();
    }
    mark_committed(txn, None)
}

#[cfg(test)]
mod tests {
    //! Recovery from each state a crash can leave, built by hand (the SIGKILL torture test
    //! in `tests/it/crash.rs` reaches them at random).
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::record::TxnKind;

    struct Fixture {
        _tmp: tempfile::TempDir,
        state: PathBuf,
        work: PathBuf,
        txn: TxnDir,
    }

    /// A prepared transaction whose merged layer adds `new` and replaces `old`.
    fn prepared() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let (state, work) = (tmp.path().join("state"), tmp.path().join("work"));
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("old"), "old").unwrap();
        let mut txn = TxnDir::begin(&state, &work, TxnKind::Pipeline, None).unwrap();
        let merged = txn.merged_dir();
        std::fs::create_dir(&merged).unwrap();
        std::fs::write(merged.join("new"), "new").unwrap();
        std::fs::write(merged.join("old"), "replaced").unwrap();
        txn.set_state(TxnState::Prepared).unwrap();
        let work = std::fs::canonicalize(work).unwrap();
        Fixture {
            _tmp: tmp,
            state,
            work,
            txn,
        }
    }

    /// Stages and (optionally) writes the intent, as a commit killed right after would. The
    /// owner is gone and had not kept it (a process that died committing).
    fn crash_after_staging(f: &mut Fixture, intent: bool) {
        f.txn.record.owner_pid = u32::MAX;
        f.txn.record.held = true;
        f.txn.set_state(TxnState::Prepared).unwrap();
        let id = f.txn.id().as_str().to_owned();
        let (plan, _) = lockbox_cow::stage_upper(
            &f.txn.merged_dir(),
            &f.work,
            &id,
            None,
            &CommitOptions::default(),
        )
        .unwrap();
        if intent {
            let mut record = f.txn.record.clone();
            record.state = TxnState::Committing;
            let intent = Intent {
                id: f.txn.id().clone(),
                workdir: f.work.clone(),
                plan,
                record: Some(record),
            };
            record::write(
                &f.txn.dir,
                INTENT_FILE,
                "intent",
                &intent,
                Durability::Durable,
            )
            .unwrap();
        }
    }

    fn state_of(f: &Fixture) -> TxnState {
        TxnDir::open(&f.state, f.txn.id()).unwrap().record.state
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn staged_but_no_intent_rolls_back() {
        let mut f = prepared();
        crash_after_staging(&mut f, false);
        assert_eq!(names(&f.work).len(), 2, "staging exists");
        let report = recover(&f.state, Some(&f.work)).unwrap();
        assert_eq!(report.abandoned, [f.txn.id().clone()]);
        assert_eq!(names(&f.work), ["old"]);
        assert_eq!(std::fs::read_to_string(f.work.join("old")).unwrap(), "old");
        assert_eq!(state_of(&f), TxnState::Aborted);
    }

    #[test]
    fn a_torn_intent_counts_as_absent_and_rolls_back() {
        let mut f = prepared();
        crash_after_staging(&mut f, true);
        let path = f.txn.dir.join(INTENT_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let report = recover(&f.state, None).unwrap();
        assert_eq!(report.abandoned.len(), 1);
        assert_eq!(names(&f.work), ["old"]);
        assert!(!path.exists());
    }

    #[test]
    fn a_durable_intent_rolls_forward() {
        let mut f = prepared();
        crash_after_staging(&mut f, true);
        let report = recover(&f.state, Some(&f.work)).unwrap();
        assert_eq!(report.rolled_forward, [f.txn.id().clone()]);
        assert_eq!(names(&f.work), ["new", "old"]);
        assert_eq!(
            std::fs::read_to_string(f.work.join("old")).unwrap(),
            "replaced"
        );
        assert_eq!(state_of(&f), TxnState::Committed);
        assert!(!f.txn.dir.join(INTENT_FILE).exists());
        // Recovering again changes nothing.
        assert_eq!(recover(&f.state, None).unwrap(), RecoveryReport::default());
    }

    #[test]
    fn a_lost_record_past_the_commit_point_is_restored_from_the_intent() {
        let mut f = prepared();
        f.txn.record.value = Some(serde_json::json!({"step": "result"}));
        crash_after_staging(&mut f, true);
        // A power loss tore the record's last lazy write.
        std::fs::write(f.txn.dir.join(crate::record::RECORD_FILE), b"{\"torn").unwrap();
        let report = recover(&f.state, None).unwrap();
        assert_eq!(report.rolled_forward, [f.txn.id().clone()]);
        assert_eq!(names(&f.work), ["new", "old"]);
        let back = TxnDir::open(&f.state, f.txn.id()).unwrap().record;
        assert_eq!(back.state, TxnState::Committed);
        assert_eq!(back.value, Some(serde_json::json!({"step": "result"})));
        assert_eq!(names(&f.state.join("txns/.live")), [".complete"]);
    }

    #[test]
    fn a_lost_record_before_the_commit_point_leaves_no_staging_behind() {
        let mut f = prepared();
        crash_after_staging(&mut f, false);
        std::fs::remove_file(f.txn.dir.join(crate::record::RECORD_FILE)).unwrap();
        // Found through the marker, which names the workdir.
        recover_workdir(&f.state, &f.work).unwrap();
        assert_eq!(names(&f.work), ["old"]);
        assert_eq!(names(&f.state.join("txns/.live")), [".complete"]);
    }

    #[test]
    fn a_kept_transaction_loses_the_staging_of_a_failed_commit_but_stays_prepared() {
        let mut f = prepared();
        crash_after_staging(&mut f, false);
        f.txn.record.held = false;
        f.txn.set_state(TxnState::Prepared).unwrap();
        let report = recover(&f.state, None).unwrap();
        assert_eq!(report.left_prepared, [f.txn.id().clone()]);
        assert_eq!(names(&f.work), ["old"]);
        assert_eq!(state_of(&f), TxnState::Prepared);
        // And it still commits.
        let mut txn = TxnDir::open(&f.state, f.txn.id()).unwrap();
        commit(&mut txn, false, true).unwrap();
        assert_eq!(names(&f.work), ["new", "old"]);
    }

    #[test]
    fn an_interrupted_commit_of_a_kept_transaction_is_listed_committing_and_finished() {
        let mut f = prepared();
        crash_after_staging(&mut f, true);
        f.txn.record.held = false;
        f.txn.record.owner_pid = std::process::id();
        f.txn.set_state(TxnState::Prepared).unwrap();
        let listed = store::list(&f.state).unwrap();
        assert!(
            matches!(&listed[..], [ListedTxn::Ok(r)] if r.state == TxnState::Committing),
            "{listed:?}"
        );
        // Committing it again (another process resuming it) finishes the first commit.
        let mut txn = TxnDir::open(&f.state, f.txn.id()).unwrap();
        commit(&mut txn, false, false).unwrap();
        assert_eq!(names(&f.work), ["new", "old"]);
        assert_eq!(state_of(&f), TxnState::Committed);
    }

    #[test]
    fn committing_without_an_intent_from_an_earlier_version_rolls_back() {
        let mut f = prepared();
        crash_after_staging(&mut f, false);
        f.txn.set_state(TxnState::Committing).unwrap();
        let report = recover(&f.state, None).unwrap();
        assert_eq!(report.rolled_back, [f.txn.id().clone()]);
        assert_eq!(names(&f.work), ["old"]);
        assert_eq!(state_of(&f), TxnState::Aborted);
    }

    #[test]
    fn a_running_transaction_of_a_dead_owner_is_abandoned_but_a_prepared_one_is_kept() {
        let mut f = prepared();
        f.txn.record.owner_pid = u32::MAX;
        f.txn.set_state(TxnState::Prepared).unwrap();
        assert_eq!(recover(&f.state, None).unwrap(), RecoveryReport::default());
        f.txn.set_state(TxnState::Running).unwrap();
        let report = recover(&f.state, None).unwrap();
        assert_eq!(report.abandoned, [f.txn.id().clone()]);
        assert_eq!(state_of(&f), TxnState::Aborted);
        assert!(!f.txn.merged_dir().exists());
        assert_eq!(names(&f.work), ["old"]);
        // Finished: recovery no longer has to read its record.
        assert_eq!(names(&f.state.join("txns/.live")), [".complete"]);
    }

    #[test]
    fn a_prepared_transaction_held_by_a_dead_process_is_aborted() {
        let mut f = prepared();
        f.txn.record.owner_pid = u32::MAX;
        f.txn.record.held = true;
        f.txn.set_state(TxnState::Prepared).unwrap();
        let report = recover(&f.state, Some(&f.work)).unwrap();
        assert_eq!(report.abandoned, [f.txn.id().clone()]);
        assert_eq!(state_of(&f), TxnState::Aborted);
        assert_eq!(names(&f.work), ["old"]);
    }

    #[test]
    fn a_store_from_before_live_markers_is_indexed_then_recovered() {
        let mut f = prepared();
        crash_after_staging(&mut f, true);
        // The layout of earlier versions: no `.live`.
        std::fs::remove_dir_all(f.state.join("txns/.live")).unwrap();
        let report = recover_workdir(&f.state, &f.work).unwrap().unwrap();
        assert_eq!(report.rolled_forward, [f.txn.id().clone()]);
        assert_eq!(names(&f.work), ["new", "old"]);
        assert_eq!(names(&f.state.join("txns/.live")), [".complete"]);
        assert_eq!(
            names(&f.state.join("txns")),
            [".live", ".new", f.txn.id().as_str()]
        );
    }

    /// A state dir and workdir, and the `.live` marker a transaction `id` writes before
    /// its directory is renamed into place.
    fn store_with_marker(id: &str) -> (tempfile::TempDir, PathBuf, PathBuf, TxnId) {
        let tmp = tempfile::tempdir().unwrap();
        let (state, work) = (tmp.path().join("state"), tmp.path().join("work"));
        std::fs::create_dir_all(&work).unwrap();
        let work = std::fs::canonicalize(work).unwrap();
        // A finished transaction makes the store (and `.live`).
        let mut other = TxnDir::begin(&state, &work, TxnKind::Pipeline, None).unwrap();
        abort(&mut other).unwrap();
        let id = TxnId::parse(id).unwrap();
        std::fs::write(
            state.join("txns/.live").join(id.as_str()),
            work.as_os_str().as_encoded_bytes(),
        )
        .unwrap();
        (tmp, state, work, id)
    }

    fn damaged(state: &Path) -> Vec<PathBuf> {
        store::list(state)
            .unwrap()
            .into_iter()
            .filter_map(|t| match t {
                ListedTxn::Damaged { dir, .. } => Some(dir),
                ListedTxn::Ok(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_creation_killed_before_its_rename_leaves_nothing_recovery_keeps() {
        // What a SIGKILL during `TxnDir::begin` leaves now: the aside directory of a dead
        // creator (base, empty intent, maybe the record) and its marker.
        let (_tmp, state, work, id) = store_with_marker("t1-dead");
        let aside = state.join("txns/.new").join(format!("{}-{id}", u32::MAX));
        std::fs::create_dir_all(aside.join("base")).unwrap();
        std::fs::write(aside.join(INTENT_FILE), b"").unwrap();
        assert!(damaged(&state).is_empty(), "never listed");
        let report = recover_workdir(&state, &work).unwrap().unwrap();
        assert_eq!(report.removed, [aside]);
        assert!(names(&state.join("txns/.new")).is_empty());
        assert_eq!(names(&state.join("txns/.live")), [".complete"]);
    }

    #[test]
    fn a_creation_killed_while_writing_its_marker_leaves_nothing_recovery_keeps() {
        // A kill between creating the marker and writing the workdir into it: an empty
        // marker, and the aside directory of a dead creator.
        let (_tmp, state, work, id) = store_with_marker("t1-empty");
        std::fs::write(state.join("txns/.live").join(id.as_str()), b"").unwrap();
        let aside = state.join("txns/.new").join(format!("{}-{id}", u32::MAX));
        std::fs::create_dir_all(aside.join("base")).unwrap();
        recover_workdir(&state, &work).unwrap().unwrap();
        assert!(names(&state.join("txns/.new")).is_empty());
        assert_eq!(names(&state.join("txns/.live")), [".complete"]);
        // And by the full recovery, which finds no workdir to visit for it.
        std::fs::write(state.join("txns/.live").join(id.as_str()), b"").unwrap();
        recover(&state, None).unwrap();
        assert_eq!(names(&state.join("txns/.live")), [".complete"]);
    }

    #[test]
    fn a_creation_in_progress_is_left_alone_by_recovery() {
        let (_tmp, state, work, id) = store_with_marker("t1-alive");
        let aside = state
            .join("txns/.new")
            .join(format!("{}-{id}", std::process::id()));
        std::fs::create_dir_all(aside.join("base")).unwrap();
        let report = recover(&state, None).unwrap();
        assert_eq!(report, RecoveryReport::default());
        recover_workdir(&state, &work).unwrap().unwrap();
        assert!(aside.is_dir());
        assert_eq!(names(&state.join("txns/.live")), [".complete", id.as_str()]);
    }

    #[test]
    fn a_directory_without_a_record_is_removed_by_recovery() {
        // What a kill during creation left before creation was atomic (the directory was made
        // before its record), with and without its marker.
        let (_tmp, state, work, id) = store_with_marker("t1-old");
        let dir = state.join("txns").join(id.as_str());
        std::fs::create_dir_all(dir.join("base")).unwrap();
        std::fs::write(dir.join(INTENT_FILE), b"").unwrap();
        assert_eq!(damaged(&state), std::slice::from_ref(&dir));
        let report = recover_workdir(&state, &work).unwrap().unwrap();
        assert_eq!(report.removed, std::slice::from_ref(&dir));
        assert!(damaged(&state).is_empty());
        assert_eq!(names(&state.join("txns/.live")), [".complete"]);
        // An earlier recovery retired its marker: `recover` finds it by listing.
        std::fs::create_dir_all(dir.join("base")).unwrap();
        let report = recover(&state, None).unwrap();
        assert_eq!((report.removed, report.damaged), (vec![dir], vec![]));
        assert!(damaged(&state).is_empty());
    }

    #[test]
    fn a_torn_record_is_listed_damaged_until_removed_with_its_staging() {
        let mut f = prepared();
        crash_after_staging(&mut f, false);
        // A power loss tore the lazily written record; the marker names the workdir.
        std::fs::write(f.txn.dir.join(crate::record::RECORD_FILE), b"{\"torn").unwrap();
        let report = recover(&f.state, None).unwrap();
        assert_eq!(report.damaged, [f.txn.dir.clone()]);
        assert_eq!(damaged(&f.state), [f.txn.dir.clone()]);
        remove_damaged(&f.state, f.txn.id()).unwrap();
        assert!(damaged(&f.state).is_empty());
        assert_eq!(names(&f.work), ["old"], "its staging went too");
        assert_eq!(names(&f.state.join("txns/.live")), [".complete"]);
        let again = remove_damaged(&f.state, f.txn.id()).unwrap_err();
        assert_eq!(again.code(), "TXN_NOT_FOUND");
    }

    #[test]
    fn remove_damaged_refuses_a_readable_record_and_a_commit_past_its_point() {
        let mut f = prepared();
        let e = remove_damaged(&f.state, f.txn.id()).unwrap_err();
        assert_eq!(e.code(), "TXN_WRONG_STATE", "{e}");
        crash_after_staging(&mut f, true);
        std::fs::write(f.txn.dir.join(crate::record::RECORD_FILE), b"{\"torn").unwrap();
        let e = remove_damaged(&f.state, f.txn.id()).unwrap_err();
        assert_eq!(e.code(), "TXN_WRONG_STATE", "{e}");
        assert_eq!(recover(&f.state, None).unwrap().rolled_forward.len(), 1);
    }

    /// Issue 32: what a branch commit killed while staging left in the workdir stayed there
    /// for good (`txn recover` and later commands left it). Recovery removes it, whether
    /// asked for every workdir or run as the sweep of one; staging it cannot tie to one of
    /// its own branches is left alone.
    #[test]
    fn issue_32_recovery_removes_a_branch_commits_leftover_staging() {
        for whole in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let (state, work) = (tmp.path().join("state"), tmp.path().join("work"));
            std::fs::create_dir_all(&work).unwrap();
            let work = std::fs::canonicalize(work).unwrap();
            let branch = lockbox_cow::Branch::create(&state, &work, serde_json::json!({})).unwrap();
            let prefix = lockbox_cow::STAGING_PREFIX;
            for key in [branch.id().to_string(), format!("{}-part", branch.id())] {
                std::fs::create_dir_all(work.join(format!("{prefix}{key}/d"))).unwrap();
                std::fs::write(work.join(format!("{prefix}{key}/d/f")), "staged").unwrap();
            }
            let foreign = work.join(format!("{prefix}b0-0-0"));
            std::fs::create_dir(&foreign).unwrap();
            let report = if whole {
                recover(&state, None).unwrap()
            } else {
                recover_workdir(&state, &work).unwrap().unwrap()
            };
            assert_eq!(report.removed.len(), 2, "{report:?}");
            assert_eq!(lockbox_cow::staging_keys(&work), ["b0-0-0"]);
            assert!(foreign.is_dir());
        }
    }
}
