//! Durable records of the transaction store: the transaction record (`record.json`) and the
//! write-ahead-log intent (`intent.json`).
//!
//! On disk both are `{"format_version": 1, "kind": "...", "checksum": "crc32:XXXXXXXX",
//! "record": {...}}`, the checksum being a CRC-32 of the canonical JSON of `record` (sorted
//! keys), written temp file + fsync + rename + fsync of the directory. A record that fails
//! to parse, has another version or kind, or whose checksum does not match is refused as a
//! whole: a torn write can never be mistaken for a valid one.

use std::path::{Path, PathBuf};

use lockbox_cow::{CommitPlan, CommitReport, Timestamp};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::{StageResult, TxnError, TxnId};

/// The format version of every record this crate writes.
pub const RECORD_FORMAT_VERSION: u32 = 1;

/// The file name of the transaction record.
pub(crate) const RECORD_FILE: &str = "record.json";
/// The file name of the WAL intent: its durable presence is the commit point.
pub(crate) const INTENT_FILE: &str = "intent.json";

/// Where a transaction is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnState {
    /// Stages are running (or the owner died while they were).
    Running,
    /// Every stage ran; the layers are kept until `commit` or `abort`.
    Prepared,
    /// The commit point passed (the intent is durable); applying to the workdir.
    Committing,
    /// Applied to the workdir.
    Committed,
    /// Rolled back; the workdir was never touched.
    Aborted,
}

impl TxnState {
    /// The lowercase name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Running => "running",
            TxnState::Prepared => "prepared",
            TxnState::Committing => "committing",
            TxnState::Committed => "committed",
            TxnState::Aborted => "aborted",
        }
    }
}

/// What kind of group of sandboxes a transaction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxnKind {
    /// Sequential stages (read-committed).
    Pipeline,
    /// Parallel sources on snapshots, then a consumer.
    Gather,
}

/// The durable description of a transaction (`STATE/txns/<id>/record.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxnRecord {
    /// The id (also the directory name).
    pub id: TxnId,
    /// Pipeline or gather.
    pub kind: TxnKind,
    /// The workdir, canonical.
    #[serde(with = "lockbox_policy::name::json")]
    pub workdir: PathBuf,
    /// Where the transaction is in its life.
    pub state: TxnState,
    /// The optimistic-concurrency reference: ctime the kernel gave the transaction's fresh
    /// `base/` directory when it began. A workdir entry with a ctime `>=` this changed since.
    pub base_ctime: Timestamp,
    /// The process that runs the transaction (for detecting a dead owner).
    pub owner_pid: u32,
    /// Every stage's result so far.
    pub stages: Vec<StageResult>,
    /// What the commit did, once committed.
    pub report: Option<CommitReport>,
    /// The caller's key, for a transaction run under [`TxnId::for_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Why it aborted, when known (a failed stage, conflicts, a dry run, the caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_reason: Option<crate::AbortReason>,
    /// A value the caller recorded with the commit ([`crate::PreparedTxn::commit_recording`]),
    /// durable before the commit point: a journaled step's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// Prepared but not kept ([`crate::PreparedTxn::keep`]): it belongs to its owner process,
    /// and recovery aborts it once that process is gone (as dropping it would have).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// The write-ahead-log intent: everything needed to redo the apply after a crash, and the
/// transaction's record as of the commit point (its state `committing`), so that recovery
/// can finish the transaction whatever became of its (lazily written) record file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    /// The transaction.
    pub id: TxnId,
    /// The workdir the plan applies to.
    #[serde(with = "lockbox_policy::name::json")]
    pub workdir: PathBuf,
    /// The staged plan (staging directory `.lockbox-commit-<id>` in the workdir).
    pub plan: CommitPlan,
    /// The record at the commit point (absent in intents written by earlier versions of
    /// lockbox, which made the record file durable at `committing` instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<TxnRecord>,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    format_version: u32,
    kind: String,
    checksum: String,
    record: serde_json::Value,
}

fn checksum(value: &serde_json::Value) -> Result<String, serde_json::Error> {
    Ok(format!(
        "crc32:{:08x}",
        lockbox_cow::crc32(&serde_json::to_vec(value)?)
    ))
}

/// Whether a record write waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsynced (file and directory) before returning: survives a crash.
    Durable,
    /// Replaced atomically but not fsynced: a crash may bring back the previous record.
    /// Only for states recovery handles either way (see [`crate::store::TxnDir::save`]).
    Lazy,
    /// Written over the existing file (whose directory entry is durable) and
    /// `fdatasync`ed: one flush instead of two, and no new inode. A crash mid-write leaves
    /// a torn file, which fails its checksum: only for a record whose torn form means "not
    /// written" (the intent). Without the file, as [`Durability::Durable`].
    InPlace,
}

/// Writes `record` as `dir/name`.
pub(crate) fn write<T: Serialize>(
    dir: &Path,
    name: &str,
    kind: &str,
    record: &T,
    durability: Durability,
) -> Result<(), TxnError> {
    let path = dir.join(name);
    let err = |source| TxnError::WriteRecord {
        path: path.clone(),
        source,
    };
    let bytes = (|| {
        let value = serde_json::to_value(record)?;
        serde_json::to_vec_pretty(&Envelope {
            format_version: RECORD_FORMAT_VERSION,
            kind: kind.to_owned(),
            checksum: checksum(&value)?,
            record: value,
        })
    })()
    .map_err(|e| err(e.into()))?;
    match durability {
        Durability::Durable => lockbox_cow::write_atomic(dir, name, &bytes),
        Durability::Lazy => lockbox_cow::write_replace(dir, name, &bytes),
        Durability::InPlace => match std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
        {
            Ok(mut f) => std::io::Write::write_all(&mut f, &bytes).and_then(|()| f.sync_data()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                lockbox_cow::write_atomic(dir, name, &bytes)
            }
            Err(e) => Err(e),
        },
    }
    .map_err(err)
}

/// Reads and verifies `path`; `Ok(None)` if it does not exist.
pub(crate) fn read<T: DeserializeOwned>(path: &Path, kind: &str) -> Result<Option<T>, TxnError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TxnError::ReadRecord {
                path: path.to_owned(),
                source,
            })
        }
    };
    decode(path, &bytes, kind).map(Some)
}

/// Decodes and verifies the bytes of a record of `kind`; `path` only names it in errors.
fn decode<T: DeserializeOwned>(path: &Path, bytes: &[u8], kind: &str) -> Result<T, TxnError> {
    let corrupt = |reason: String| TxnError::CorruptRecord {
        path: path.to_owned(),
        reason,
    };
    let env: Envelope = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if env.format_version != RECORD_FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {} (this lockbox reads {RECORD_FORMAT_VERSION})",
            env.format_version
        )));
    }
    if env.kind != kind {
        return Err(corrupt(format!("a {} record, expected {kind}", env.kind)));
    }
    let sum = checksum(&env.record).map_err(|e| corrupt(e.to_string()))?;
    if sum != env.checksum {
        return Err(corrupt(format!(
            "checksum mismatch: recorded {}, computed {sum}",
            env.checksum
        )));
    }
    serde_json::from_value(env.record).map_err(|e| corrupt(e.to_string()))
}

impl TxnRecord {
    /// Decodes and verifies the bytes of a transaction's record file (`path` only names it
    /// in errors). Any damage is [`TxnError::CorruptRecord`], never a panic (fuzzed:
    /// `fuzz/fuzz_targets/txn_record.rs`).
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<TxnRecord, TxnError> {
        decode(path, bytes, "txn")
    }

    /// The exit code the transaction's command returned (or would return now) and what it
    /// means, in words: what `lockbox txn list|show --json` and the HTTP API show as
    /// `exit_code` and `meaning`.
    pub fn verdict(&self) -> (u8, String) {
        let failed = self
            .stages
            .iter()
            .enumerate()
            .find_map(|(i, s)| crate::AbortReason::of_stage(i, s));
        match (self.state, self.abort_reason.clone(), failed) {
            (TxnState::Committed, _, _) => (0, "committed".into()),
            (TxnState::Prepared, _, _) => (
                0,
                "prepared: finish it with `lockbox txn commit|abort ID`".into(),
            ),
            (TxnState::Running, _, _) => (
                0,
                "running (or its process died: see `lockbox txn recover`)".into(),
            ),
            (TxnState::Committing, _, _) => (
                4,
                "interrupted during its commit: `lockbox txn recover` finishes or rolls it back"
                    .into(),
            ),
            (TxnState::Aborted, Some(reason), _) | (TxnState::Aborted, None, Some(reason)) => {
                (reason.exit_code(), reason.explain())
            }
            (TxnState::Aborted, None, None) => (
                4,
                "aborted before its commit point: the commit was refused (stale base, busy \
                 workdir, bad change) or its process died"
                    .into(),
            ),
        }
    }
}

/// The valid intent of transaction `id` in its directory `dir`, if it has one: an empty
/// (not yet written), torn or foreign `intent.json` is none.
pub(crate) fn intent_in(dir: &Path, id: &TxnId) -> Option<Intent> {
    read::<Intent>(&dir.join(INTENT_FILE), "intent")
        .ok()
        .flatten()
        .filter(|i| i.id == *id)
}

impl Intent {
    /// Decodes and verifies the bytes of a commit intent (the WAL record), like
    /// [`TxnRecord::decode`].
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<Intent, TxnError> {
        decode(path, bytes, "intent")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tampered_or_torn_record_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let intent = Intent {
            id: TxnId::generate(),
            workdir: "/w".into(),
            plan: CommitPlan::default(),
            record: None,
        };
        write(
            dir.path(),
            INTENT_FILE,
            "intent",
            &intent,
            Durability::Durable,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join(INTENT_FILE);
        let back: Option<Intent> = read(&path, "intent").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, Some(intent));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, text.replace("/w", "/x")).unwrap_or_else(|e| panic!("{e}"));
        assert!(read::<Intent>(&path, "intent").is_err());
        std::fs::write(&path, &text.as_bytes()[..text.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
        assert!(read::<Intent>(&path, "intent").is_err());
        assert!(read::<Intent>(&dir.path().join("none"), "intent")
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none());
    }

    /// Issue 15: the WAL replays the intent, so every name in it must come back exactly,
    /// whatever its bytes (serde's own form of a path failed on non-UTF-8: exit 4).
    #[test]
    fn an_intent_with_names_that_are_not_utf8_round_trips_exactly() {
        use lockbox_cow::{PlanDir, PlanOp};
        use std::os::unix::ffi::OsStrExt;
        let name = |b: &[u8]| PathBuf::from(std::ffi::OsStr::from_bytes(b));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let intent = Intent {
            id: TxnId::generate(),
            workdir: name(b"/w/\xff\xfe"),
            plan: CommitPlan {
                ops: vec![
                    PlanOp::Place {
                        path: name(b"caf\xe9.txt"),
                        seq: 1,
                    },
                    PlanOp::MakeDir {
                        path: name(b"d\n\x1b[2K"),
                    },
                    PlanOp::Delete {
                        path: name(b"x/\x80"),
                    },
                ],
                dirs: vec![PlanDir {
                    path: name(b"d\n\x1b[2K"),
                    mode: 0o755,
                    times: [(1, 2), (3, 4)],
                }],
            },
            record: None,
        };
        write(
            dir.path(),
            INTENT_FILE,
            "intent",
            &intent,
            Durability::Durable,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let back: Option<Intent> =
            read(&dir.path().join(INTENT_FILE), "intent").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, Some(intent));
    }
}
